"""``solve``'s ``candidates``: a bounded summary of the dropped candidates (schema 2.4), not one reason per candidate.

The reasons below are written by the test (the wording the sizing uses, ``LO-HI on GPU: why``), so every count is
counted here by hand; the real solve checks the summary against the report's own full list of reasons.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from fleetopt.optimizer.output.contract import DROPPED_LINES, validate_document
from fleetopt.optimizer.output.documents import dropped_summary

PREFILL = "P99 prefill alone on an idle replica is {ms:,} ms, above 485 ms (the 500 ms SLO less its 3 % margin)"
TPOT = "its P99 TPOT bound {ms} ms exceeds the 50 ms SLO at any batch"


def _reasons(options: dict[str, tuple[int, int]]) -> list[str]:
    """Per option ``(prefill drops, tpot drops)`` reasons, segments ``64 k``-``64 k + 64``, numbers varying."""
    out = []
    for gpu, (n_prefill, n_tpot) in options.items():
        out += [f"{64 * k:,}-{64 * k + 64:,} on {gpu}: " + PREFILL.format(ms=500 + k) for k in range(n_prefill)]
        out += [f"{64 * k:,}-{64 * k + 64:,} on {gpu}: " + TPOT.format(ms=51 + k) for k in range(n_tpot)]
    return out


def test_the_summary_counts_each_option_and_reason():
    reasons = _reasons({"a100": (5, 2), "h100": (1, 3), "b200": (0, 0)})
    s = dropped_summary(reasons)
    assert s["dropped_total"] == 11
    by = {o["gpu"]: o for o in s["dropped_by_option"]}
    assert list(by) == ["a100", "h100"]                             # order met; an option with none is absent
    assert (by["a100"]["dropped"], [r["count"] for r in by["a100"]["reasons"]], by["a100"]["other"]) == (7, [5, 2], 0)
    assert (by["h100"]["dropped"], [r["count"] for r in by["h100"]["reasons"]]) == (4, [3, 1])  # most frequent first
    # examples: each option's most frequent reason, then their second ones; each an original line
    assert s["dropped"] == [reasons[0], reasons[8], reasons[5], reasons[7]]
    assert all(r["example"] in reasons for o in by.values() for r in o["reasons"])


def test_the_summary_is_bounded_on_a_large_instance():
    """The size of the large instance's list (32,645 reasons over 16 options), with three kinds of reason on one
    option and more than three on another: at most DROPPED_LINES lines, three reasons per option, the rest in
    ``other``."""
    options = {f"opt{k}": (2000, 40) for k in range(16)}
    reasons = _reasons(options)
    reasons += [f"0-64 on opt0: {w} {k}" for w, n in (("alpha", 3), ("beta", 1), ("gamma", 1)) for k in range(n)]
    s = dropped_summary(reasons)
    assert s["dropped_total"] == len(reasons) == 16 * 2040 + 5
    assert len(s["dropped"]) == DROPPED_LINES
    assert sum(o["dropped"] for o in s["dropped_by_option"]) == len(reasons)
    opt0 = s["dropped_by_option"][0]
    assert [r["count"] for r in opt0["reasons"]] == [2000, 40, 3] and opt0["other"] == 2   # alpha; beta, gamma
    assert len(json.dumps(s)) < 10_000


def test_a_solve_summarises_its_dropped_candidates(repo_root: Path):
    """quickstart drops candidates on both options (a100 more often: its prefill is slower); the summary agrees
    with the report's full list, counted here."""
    from fleetopt.optimizer.io.instance import load_instance
    from fleetopt.optimizer.output.documents import solve_json
    from fleetopt.optimizer.output.writes import to_jsonable
    from fleetopt.optimizer.plan.solve import solve_instance

    report = solve_instance(load_instance(repo_root / "instances" / "quickstart.yaml"))
    doc = to_jsonable(solve_json(report))
    validate_document(doc)
    cand, full = doc["candidates"], report.dropped_reasons
    per_gpu = Counter(r.split(" on ", 1)[1].split(":", 1)[0] for r in full)
    # every candidate is feasible, dropped, or left unsized (bounded sizing: a cheaper feasible one serves its segment)
    assert cand["dropped_total"] == len(full) == cand["generated"] - cand["feasible"] - cand["left_unsized"]
    assert {o["gpu"]: o["dropped"] for o in cand["dropped_by_option"]} == dict(per_gpu)
    assert per_gpu["a100"] > per_gpu["h100"] > 0
    assert 0 < len(cand["dropped"]) <= DROPPED_LINES and set(cand["dropped"]) <= set(full)


def test_solve_verbose_names_each_options_drops():
    """``solve --verbose``: the total, then one line per option with its count and its most frequent reason."""
    from fleetopt.optimizer.output.render import dropped_lines

    reasons = _reasons({"a100": (5, 2), "h100": (0, 3)})
    assert dropped_lines(reasons) == [
        "dropped 10 candidates (no replica count meets the SLO):",
        f"  a100: 7 dropped, 5 of them like {reasons[0]}",
        f"  h100: 3 dropped, 3 of them like {reasons[7]}"]
    assert dropped_lines([]) == []
