"""fleetopt solve through the CLI: the JSON contract, --top, objectives, exit codes and explanations."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

CONTRACT = ("status", "objective", "cost_per_hr", "cost_per_year", "total_replicas", "total_gpus", "power_kw",
            "tok_per_watt", "pools", "baseline", "solve_seconds", "mip_gap", "solutions", "overrides")
POOL_KEYS = ("min_tokens", "max_tokens", "gpu", "replicas", "gpus", "arrival_rate", "utilization", "ttft_p99_ms",
             "power_w", "routing_share")


def solve(*args):
    res = CliRunner().invoke(main, ["solve", *map(str, args), "--json", "-"])
    assert "Traceback" not in res.output
    return res, (json.loads(res.stdout) if res.stdout.strip() else None)


def test_contract_and_seed_optimum(repo_root):
    res, r = solve(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", "--set", "slo.ttft_model=mean-prefill")
    assert res.exit_code == 0
    for key in CONTRACT:
        assert key in r
    for key in POOL_KEYS:
        assert key in r["pools"][0] and key in r["baseline"]["pools"][0]
    assert r["status"] == "optimal" and r["mip_gap"] == pytest.approx(0.0, abs=1e-9)
    assert r["cost_per_year"] == pytest.approx(8 * 2.21 * 8760) and r["total_replicas"] == 8
    assert sum(p["routing_share"] for p in r["pools"]) == pytest.approx(1.0)
    assert r["baseline"]["total_replicas"] in (13, 14) and r["cost_per_hr"] < r["baseline"]["cost_per_hr"]
    objective = dict(r["objective"])
    lp_bound = objective.pop("lp_bound")
    assert objective.pop("minimizes") == "fleet cost in $/hr"
    assert objective == {"name": "cost", "value": pytest.approx(8 * 2.21), "unit": "usd_per_hr",
                         "bound": pytest.approx(8 * 2.21)}
    assert 0 < lp_bound <= r["cost_per_hr"] + 1e-9  # the root relaxation bounds the optimum from below


@pytest.mark.parametrize("k", [3, 4])
def test_more_pools_never_worse_on_puzzle1(repo_root, k):
    _, two = solve(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml")
    _, more = solve(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", "--max-pools", k)
    assert more["cost_per_hr"] <= two["cost_per_hr"] + 1e-9


def test_top_three(repo_root):
    res, r = solve(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--top", 3)
    assert res.exit_code == 0 and len(r["solutions"]) == 3
    assert [s["rank"] for s in r["solutions"]] == [1, 2, 3]
    values = [s["objective"] for s in r["solutions"]]
    assert values == sorted(values)
    fleets = {json.dumps([(p["min_tokens"], p["gpu"], p["replicas"]) for p in s["pools"]]) for s in r["solutions"]}
    assert len(fleets) == 3


def test_power_objective_draws_no_more_power(repo_root):
    _, cost = solve(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml")
    _, power = solve(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--objective", "power")
    assert power["power_kw"] <= cost["power_kw"] + 1e-9
    assert power["objective"]["unit"] == "kw"


@pytest.mark.parametrize("overrides,phrase", [
    (["slo.ttft_p99_ms=40", "slo.ttft_model=tail"], "no configuration serves"),
    (["constraints.max_power_kw=1.5"], "the power cap of 1.50 kW is below the"),
    (["constraints.max_cost_per_hr=10"], "the budget of $10.00/hr is below the ${cost_per_hr:.2f}/hr minimum"),
    (["constraints.max_total_gpus=5"], "the limit of 5 GPUs is below the {total_gpus}-GPU minimum"),
])
def test_infeasible_instances_explain_themselves(repo_root, overrides, phrase):
    """The stated minimum is the unconstrained optimum's (one GPU type: the cheapest fleet has the fewest GPUs)."""
    args = [repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"]
    if "{" in phrase:
        _, free = solve(*args)
        phrase = phrase.format(**free)
    for o in overrides:
        args += ["--set", o]
    res, r = solve(*args)
    assert res.exit_code == 3
    assert r["status"] == "infeasible" and phrase in r["explanation"] and r["pools"] is None
    plain = CliRunner().invoke(main, ["solve", *map(str, args)])
    assert plain.exit_code == 3 and phrase in plain.output


def test_stated_power_minimum_is_the_real_minimum(repo_root):
    """The explanation's minimum must be achievable (a cap just above it is feasible) and binding."""
    import re

    inst = repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"
    _, r = solve(inst, "--set", "constraints.max_power_kw=1.5")
    low = float(re.search(r"below the ([0-9.]+) kW minimum", r["explanation"]).group(1))
    res, ok = solve(inst, "--set", f"constraints.max_power_kw={low + 0.01}")
    assert res.exit_code == 0 and ok["power_kw"] <= low + 0.01
    res, _ = solve(inst, "--set", f"constraints.max_power_kw={low - 0.01}")
    assert res.exit_code == 3


def test_prefill_explanation_names_each_gpu(repo_root):
    # under the tail model a pool's slowest 1 % may be slow, so only a very tight SLO leaves
    # the longest requests without any pool
    res, r = solve(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--set", "slo.ttft_p99_ms=8",
                   "--set", "slo.ttft_model=tail")
    assert res.exit_code == 3
    text = r["explanation"]
    assert "-65,536-token requests within 8 ms" in text and "h100 on 0-65,536: P99 prefill alone is" in text
    assert "a10g on" in text and "a100 on" in text


def test_limits_that_hold_alone_but_not_together(tmp_path):
    # cheapest fleet: $14.67/hr at 2.10 kW (H100 + A100); least power: 1.76 kW at $16.08/hr (all H100)
    inst = tmp_path / "joint.yaml"
    inst.write_text("""
workload: {cdf: builtin:lmsys, arrival_rate: 100}
slo: {ttft_p99_ms: 500, ttft_model: mean-prefill}
gpus: [{name: a100, profile: A100-80GB}, {name: h100, profile: H100-80GB}]
pools: {max_pools: 2, max_context: 65536}
constraints: {max_cost_per_hr: 15.0, max_power_kw: 1.9}
""")
    res, r = solve(inst)
    assert res.exit_code == 3 and "each limit can be met on its own, but not all together" in r["explanation"]
    assert "max_power_kw <= 1.9" in r["explanation"] and "max_cost_per_hr <= 15.0" in r["explanation"]


def test_exit_code_mapping():
    from types import SimpleNamespace

    from fleetopt.optimizer.api import exit_code

    def report(status, plans=()):
        return SimpleNamespace(plans=plans, status=status, explanation=None)

    assert exit_code(report("time_limit", plans=(1,))) == 0
    assert exit_code(report("interrupted", plans=(1,))) == 0
    assert exit_code(report("infeasible")) == 3
    assert exit_code(report("time_limit")) == 4
    assert exit_code(report("iteration_limit")) == 4
    assert exit_code(report("interrupted")) == 130
    assert exit_code(report("error")) == 1
    assert exit_code(report("unknown")) == 1


def test_oracle_method_refuses_coupled_instances(repo_root):
    res = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"), "--method",
                                    "oracle"])
    assert res.exit_code == 2 and "graph oracle" in res.stderr


def test_tpot_bound_and_caps(repo_root):
    from fleetopt.models.service import tpot_batch_cap, tpot_bound_s
    from fleetopt.optimizer.io.catalog import load_catalog

    h100 = load_catalog().profiles["H100-80GB"]
    # t(n, B) = W + H (B / 8192) n: at 4,096 tokens and 256 sequences, 4 + 0.32 x 0.5 x 256 = 44.96 ms
    assert float(tpot_bound_s(h100, 256, 4096)) == pytest.approx(0.04496)
    assert int(tpot_batch_cap(h100, 4096, 0.030)) == 162  # floor((30 - 4) / 0.16)
    res, r = solve(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--set", "slo.tpot_p99_ms=30")
    assert res.exit_code == 0
    assert all(p["tpot_p99_ms"] <= 30 and p["max_num_seqs"] <= p["n_slots"] for p in r["pools"])
    assert any(p["max_num_seqs"] < p["n_slots"] for p in r["pools"])  # the SLO binds
    res, r = solve(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--set", "slo.tpot_p99_ms=6")
    assert res.exit_code == 3 and "decodes in" in r["explanation"] and "TPOT SLO" in r["explanation"]


def test_cost_plus_power_objective(repo_root):
    base = repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml"
    _, cost = solve(base)
    _, power = solve(base, "--objective", "power")
    res, both = solve(base, "--objective", "cost+power", "--set", "energy.usd_per_kwh=0.5", "--set", "energy.pue=1.3")
    assert res.exit_code == 0
    assert both["objective"]["value"] == pytest.approx(both["cost_per_hr"] + 0.5 * 1.3 * both["power_kw"])
    assert cost["cost_per_hr"] <= both["cost_per_hr"] + 1e-9 and power["power_kw"] <= both["power_kw"] + 1e-9
