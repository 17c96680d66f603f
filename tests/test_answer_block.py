"""One answer per screen (issue 31): ``solve``, ``solve --verify-top`` and ``evaluate`` end with one compact block
that fits 80 columns and 15 lines and holds the plan (bounds, GPU configuration, replicas, physical GPUs), $/yr,
$ per million output tokens, kW, tok/W, the physical GPUs, the SLO verdict with its source and the next
commands; model jargon only with ``--verbose``; a legend only when a row uses it; piped output honours COLUMNS
and wraps prose to it.

Each command runs as a user runs it (a subprocess, stdout a pipe, ``COLUMNS=80``); what the block must say is
read from the same run's ``--json`` file, and the physical GPUs from the instance (TP=8: eight per replica).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

QUICK = "instances/quickstart.yaml"
JARGON = ("birth-death", "two-moment")


def _run(repo_root, tmp_path, *args, columns: int = 80) -> tuple[str, dict]:
    """Run in a scratch folder that sees the repository's instances and data as the repository root does (the
    user's ``--json plan.json`` then lands there, and the block's commands name it as the user typed it)."""
    for name in ("instances", "data"):
        if not (tmp_path / name).exists():
            (tmp_path / name).symlink_to(repo_root / name)
    out = tmp_path / "plan.json"
    env = {**os.environ, "COLUMNS": str(columns)}
    res = subprocess.run([sys.executable, "-m", "fleetopt.optimizer.cli", *args, "--json", "plan.json"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert res.returncode in (0, 5), res.stderr
    return res.stdout, json.loads(out.read_text())


def _block(stdout: str) -> list[str]:
    """The answer block: the lines after the last blank line, starting with 'answer'."""
    lines = stdout.rstrip("\n").split("\n")
    start = max(k for k, x in enumerate(lines) if not x.strip()) + 1
    block = lines[start:]
    assert block[0].startswith("answer"), block
    return block


def _check_block(block: list[str], pools: list[dict], fleet: dict, tmp_path) -> str:
    assert len(block) <= 15 and all(len(x) <= 80 for x in block), block
    text = "\n".join(block)
    for p in pools:                           # bounds, GPU option, configuration, replicas, physical GPUs
        row = re.compile(rf"^\s+{p['min_tokens']:,}-{p['max_tokens']:,}\s+{p['gpu']}\s+(.+?)\s+{p['replicas']}"
                         rf"\s+{8 * p['replicas']}$", re.M)
        m = row.search(text)
        assert m, (p, text)
        assert "TP8" in m.group(1) and "Llama-3.1-70B" in m.group(1), m.group(1)
    assert f"${fleet['cost_per_year']:,.0f}/yr" in text
    mtok = fleet["cost_per_hr"] / (3600 * sum(p["output_tok_per_s"] for p in pools)) * 1e6   # $/hr over Mtok/hr
    assert f"${mtok:,.2f}/Mtok" in text
    assert f"{fleet['power_kw']:,.2f} kW" in text and f"{fleet['tok_per_watt']:.2f} tok/W" in text
    assert f"{8 * sum(p['replicas'] for p in pools)} GPUs" in text
    return text


def test_solve_ends_with_the_answer_in_80_columns(repo_root, tmp_path):
    stdout, doc = _run(repo_root, tmp_path, "solve", QUICK)
    text = _check_block(_block(stdout), doc["pools"], doc, tmp_path)
    assert re.search(r"SLO P99 TTFT 500 ms: met \(analytic", text)
    assert "fleetopt export plan.json" in text and "fleetopt report plan.json" in text  # the run's own JSON
    assert not any(word in stdout for word in JARGON)
    # the sized mark's legend only where a row carries the mark (quickstart's solve sizes no pool alone)
    marked = re.search(r"│\s+\d+\*\s+│", stdout) is not None
    assert ("* = sized" in stdout) == marked
    # piped prose is wrapped to COLUMNS (tables are laid out narrow or split, never cut); a command to paste is
    # never wrapped
    assert max(len(x) for x in stdout.splitlines() if "fleetopt simulate" not in x) <= 80


def test_verbose_shows_what_the_model_rests_on(repo_root, tmp_path):
    stdout, _ = _run(repo_root, tmp_path, "solve", QUICK, "--verbose")
    assert all(word in stdout for word in JARGON)


@pytest.mark.slow
def test_verified_solve_ends_with_the_simulated_verdict(repo_root, tmp_path):
    stdout, doc = _run(repo_root, tmp_path, "solve", QUICK, "--verify-top", "3", "--sim-requests", "20000",
                       "--quiet")
    block = _block(stdout)
    v = doc["verification"]
    (chosen,) = [p for p in v["plans"] if (p["round"], p["rank"]) == (v["chosen_round"], v["chosen_rank"])]
    text = _check_block(block, doc["pools"], doc, tmp_path)
    low, high = chosen["ttft_p99_ci_ms"]
    assert (f"SLO P99 TTFT 500 ms: met (simulated, fleet P99 {chosen['ttft_p99_ms_sim']:,.1f} ms, 95% CI "
            f"{low:,.1f}-{high:,.1f};") in text.replace("\n    ", " ")
    assert high <= 500          # the ci-upper rule: met means the interval's upper end is within the SLO
    assert "fleetopt export plan.json" in text and "fleetopt report plan.json" in text


def test_evaluate_ends_with_the_answer(repo_root, tmp_path):
    stdout, doc = _run(repo_root, tmp_path, "evaluate", QUICK, "--fleet", "0-256:a100x1,256-65536:h100x4")
    fleet = doc["fleets"][0]
    text = _check_block(_block(stdout), fleet["pools"], fleet, tmp_path)
    assert "SLO P99 TTFT 500 ms: met (analytic" in text
    assert "fleetopt simulate instances/quickstart.yaml --json sim.json" in text and "fleetopt report" in text
    assert not any(word in stdout for word in JARGON)


def test_columns_is_honoured_when_piped(repo_root, tmp_path):
    stdout, _ = _run(repo_root, tmp_path, "solve", QUICK, columns=100)
    widths = [len(x) for x in stdout.splitlines() if "fleetopt simulate" not in x]
    assert max(widths) <= 100 and max(widths) > 80
