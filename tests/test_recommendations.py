"""What ``pareto --axes``, ``pareto --split-table`` and ``headroom --fleet`` recommend or flag.

* ``pareto --axes``: the recommended point is the cheapest point that meets the instance's own SLO, established
  here from the points' own figures in the JSON (worst P99 TTFT against the file's SLO); the knee is reported as an
  alternative and checked against its closed form, max (C_0 - C_k) / (a_k - a_0) from the least-axis point.
* ``pareto --split-table``: a row's ``violations`` are checked against the cap given with ``--set`` (its power
  against the cap, read from the row itself), and the recommended row is the cheapest row meeting the SLO within it.
* ``headroom --fleet``: a fleet over a cap carries ``violations`` and exits 6 (``limits_broken``).
"""

from __future__ import annotations

import functools
import json

import click
import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.commands.workflows import headroom as headroom_cmd
from fleetopt.optimizer.commands.workflows import pareto as pareto_cmd
from fleetopt.optimizer.errors import EXIT_CODES


def _cli(command, args):
    """Run one of the workflow commands in-process, under a group as ``fleetopt`` wires it."""
    group = click.Group(commands={"pareto": pareto_cmd, "headroom": headroom_cmd})
    return CliRunner().invoke(group, [command.name, *map(str, args)])


def _slo_ms(path) -> float:
    """The instance file's own P99 TTFT SLO (ms), read from the YAML, not from fleetopt."""
    return float(yaml.safe_load(path.read_text())["slo"]["ttft_p99_ms"])


def _knee(points) -> int:
    """The knee by its closed form: from the least-axis point (C_0, a_0), argmax (C_0 - C_k) / (a_k - a_0)."""
    end = min(range(len(points)), key=lambda k: (points[k]["axis_value"], points[k]["cost_per_hr"]))
    c0, a0 = points[end]["cost_per_hr"], points[end]["axis_value"]
    return max((k for k in range(len(points)) if points[k]["axis_value"] > a0),
               key=lambda k: ((c0 - points[k]["cost_per_hr"]) / (points[k]["axis_value"] - a0),
                              -points[k]["cost_per_hr"]))


def _check_frontier_recommendation(path, tmp_path, extra=()):
    out = tmp_path / "f.json"
    res = _cli(pareto_cmd, [path, "--axes", "cost,ttft", *extra, "--json", out, "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    pts, slo = doc["points"], _slo_ms(path)
    meeting = [k for k, p in enumerate(pts) if p["worst_ttft_p99_ms"] <= slo and not p["violations"]]
    cheapest = min(meeting, key=lambda k: pts[k]["cost_per_hr"])
    assert doc["recommended_index"] == doc["recommended"] == cheapest
    assert [p["recommended"] for p in pts] == [k == cheapest for k in range(len(pts))]
    assert doc["recommended_reason"] == f"cheapest point meeting P99 TTFT <= {slo:g} ms"
    assert doc["knee_index"] == _knee(pts) != cheapest
    assert pts[doc["knee_index"]]["knee"] and sum(p["knee"] for p in pts) == 1
    assert "knee (alternative): point " + str(doc["knee_index"] + 1) in res.stdout
    assert f"recommended: point {cheapest + 1} (cheapest point meeting P99 TTFT <= {slo:g} ms)" in res.stdout
    return doc


def test_frontier_recommends_the_cheapest_point_meeting_the_slo_not_the_knee(repo_root, tmp_path):
    doc = _check_frontier_recommendation(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", tmp_path,
                                         ["--points", "3"])
    assert len(doc["points"]) == 3


@pytest.mark.slow
def test_lmsys_mixed_recommends_its_cheapest_point_meeting_500_ms(repo_root, tmp_path):
    doc = _check_frontier_recommendation(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", tmp_path)
    assert doc["points"][doc["recommended_index"]]["cost_per_year"] < doc["points"][doc["knee_index"]]["cost_per_year"]


# --------------------------------------------------------------------------------------------
# pareto --split-table: every row checked against the instance's limits
# --------------------------------------------------------------------------------------------

SPLIT = ["--boundaries", "1536,2048,4096"]
"""Three rows of ref_puzzle1_lmsys_a100 (default TTFT model): 1,536 and 2,048 meet the SLO at the same least cost
($19.89/hr,
9 A100s), 1,536 drawing more power; 4,096 misses the SLO, cheaper still."""


@functools.cache
def _evaluated_power_kw(path: str, fleet: str) -> float:
    """The row's fleet as ``fleetopt evaluate`` prices it on the instance file (the evaluate path, not the
    table; the cap does not change a fleet's power)."""
    from fleetopt.optimizer import api

    return api.evaluate_report(api.load(path), fleet).fleets[0][1].power_kw


@pytest.mark.parametrize("cap_kw", [2.8, 2.0])
def test_split_table_recommends_only_rows_within_a_power_cap(repo_root, tmp_path, cap_kw):
    path, out = repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", tmp_path / "t.json"
    res = _cli(pareto_cmd, [path, "--split-table", *SPLIT, "--set", f"constraints.max_power_kw={cap_kw}",
                            "--json", out])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    powers = [_evaluated_power_kw(str(path), r["fleet"]) for r in rows]
    for r, kw in zip(rows, powers):
        breaks = [v for v in r["violations"] if v.startswith("constraints.max_power_kw:")]
        assert bool(breaks) == (kw > cap_kw) and r["limits_ok"] == (not r["violations"]), (r, kw)
    ok = [k for k, r in enumerate(rows) if r["slo_met"] and powers[k] <= cap_kw]
    want = min(ok, key=lambda k: (rows[k]["cost_per_hr"], rows[k]["total_gpus"], rows[k]["boundary_tokens"]),
               default=None)
    assert doc["recommended"] == want
    if want is None:       # 2 kW: every row meeting the SLO draws more; nothing is recommended
        assert all(not r["limits_ok"] for r in rows if r["slo_met"])
        assert "nothing to recommend" in res.stdout
    else:                  # 2.8 kW: the least-cost row at the smaller boundary breaks the cap, so not it
        assert powers[want] <= cap_kw and rows[want]["boundary_tokens"] == 2048
        assert not rows[0]["limits_ok"] and rows[0]["cost_per_hr"] == rows[want]["cost_per_hr"]
    assert not rows[-1]["slo_met"] and doc["recommended"] != len(rows) - 1


def test_split_table_flags_an_inventory_cap_and_keeps_slo_met_about_the_slo(repo_root):
    from fleetopt.optimizer import api
    from fleetopt.optimizer.workflows.split_table import split_table

    inst = api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", ["gpus.a100.max_count=8"])
    t = split_table(inst, None, (1536, 2048, 4096))
    for r in t.rows:
        over = r.replicas_short + r.replicas_long > 8          # one GPU per A100 unit
        assert any(v.startswith("gpus.a100.max_count:") for v in r.violations) == over
        assert r.slo_met == all(ms <= 500 for ms in (r.ttft_p99_ms_short, r.ttft_p99_ms_long))
    within = [k for k, r in enumerate(t.rows) if r.replicas_short + r.replicas_long <= 8
              and max(r.ttft_p99_ms_short, r.ttft_p99_ms_long) <= 500]
    assert t.recommended == (min(within, key=lambda k: t.rows[k].cost_per_hr) if within else None) is None


# --------------------------------------------------------------------------------------------
# headroom --fleet: a fleet over a cap is flagged and exits 6
# --------------------------------------------------------------------------------------------

HEADROOM = ["--fleet", "0-65536:a100x13", "--set", "slo.ttft_model=mean-prefill"]
"""Thirteen A100 units in one pool on ref_puzzle1_lmsys_a100 (inventory 64, no other cap), 100 req/s: 13 x $2.21/hr."""
CAPS = {"gpus.a100.max_count": 12, "constraints.max_total_gpus": 12, "constraints.max_cost_per_hr": 28.0,
        "constraints.max_power_kw": 1.0}
"""Caps the fleet breaks: 13 GPUs > 12, $28.73/hr > $28, and far more than 1 kW."""


def test_headroom_flags_a_fleet_over_every_cap_and_exits_6(repo_root, tmp_path):
    out = tmp_path / "h.json"
    sets = [a for k, v in CAPS.items() for a in ("--set", f"{k}={v}")]
    res = _cli(headroom_cmd, [repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", *HEADROOM, *sets, "--json", out])
    assert res.exit_code == EXIT_CODES["limits_broken"] == 6, res.output
    doc = json.loads(out.read_text())
    assert sorted(v.split(":", 1)[0] for v in doc["violations"]) == sorted(CAPS) and not doc["limits_ok"]
    assert f"warning: at 100 req/s the fleet breaks {len(CAPS)} limit(s)" in res.stdout
    assert all(f"breaks {field}:" in res.stdout for field in CAPS)


def test_headroom_of_a_fleet_within_the_caps_exits_0_without_warning(repo_root, tmp_path):
    out = tmp_path / "h.json"
    res = _cli(headroom_cmd, [repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", *HEADROOM, "--json", out])
    doc = json.loads(out.read_text())
    assert res.exit_code == 0 and doc["violations"] == [] and doc["limits_ok"], res.output
    assert "warning" not in res.stdout
