"""fleetopt solve --verify-top N: simulate the best plans, cut and re-solve until one meets the SLO."""

from __future__ import annotations

import json

from click.testing import CliRunner

from fleetopt.optimizer.cli import main


def solve(*args):
    res = CliRunner().invoke(main, ["solve", *map(str, args), "--json", "-"])
    assert "Traceback" not in res.output, res.output
    return res, (json.loads(res.stdout) if res.stdout.strip() else None)


def test_agent_fleet_is_verified_by_simulation(repo_root):
    res, r = solve(repo_root / "instances" / "agent_h100.yaml", "--verify-top", 2, "--sim-requests", 20000)
    assert res.exit_code == 0 and r["verified"] is True
    v = r["verification"]
    assert v["rule"] == "ci-upper" and v["chosen_round"] == 1 and len(v["plans"]) == 2
    assert v["options"]["requests"] == 20000 and v["options"]["router"] == "auto"   # the settings, as provenance
    passing = [p for p in v["plans"] if p["passed"]]
    chosen = next(p for p in v["plans"] if p["rank"] == v["chosen_rank"] and p["round"] == v["chosen_round"])
    assert chosen["passed"] and chosen["cost_per_hr"] == min(p["cost_per_hr"] for p in passing)
    assert r["cost_per_hr"] == chosen["cost_per_hr"]  # the headline is the verified plan
    for pool in chosen["pools"]:
        low, high = pool["ttft_p99_ci_ms"]
        assert low <= pool["ttft_p99_ms_sim"] <= high <= 1000.0 and pool["slo_met_sim"]
        assert pool["ttft_p99_ms_analytic"] > 0


def test_failed_plans_are_cut_and_resolved(repo_root):
    # at 45 ms the analytic plans sit at the edge; continuous batching slows prefill in simulation
    res, r = solve(repo_root / "instances" / "quickstart.yaml", "--set", "slo.ttft_p99_ms=45", "--verify-top", 2,
                   "--max-rounds", 4, "--sim-requests", 40000)
    assert res.exit_code == 0
    v = r["verification"]
    assert v["cuts"] and v["rounds"] >= 2
    first = [p for p in v["plans"] if p["round"] == 1]
    assert not any(p["passed"] for p in first)
    for p in v["plans"]:
        if not p["passed"]:
            assert any(not q["slo_met_sim"] for q in p["pools"])
    if r["verified"]:
        assert r["cost_per_hr"] >= min(p["cost_per_hr"] for p in first)


def test_verification_is_deterministic(repo_root):
    args = (repo_root / "instances" / "agent_h100.yaml", "--verify-top", 1, "--sim-requests", 10000, "--seed", 7)
    _, a = solve(*args)
    _, b = solve(*args)
    assert a["verification"] == b["verification"]
