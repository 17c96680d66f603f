"""Answers that say what is true: an instance no candidate can serve is infeasible (exit 3, with its reason), not
an unknown solver stop; inputs no operator means are refused at validation; a plan's claims name what they are
about and claim no saving for a fleet that misses; ``max_count`` counts what the README says it counts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main


def run(*args):
    res = CliRunner().invoke(main, [*map(str, args), "--json", "-"])
    assert "Traceback" not in res.output and "internal error" not in res.output
    return res, (json.loads(res.stdout) if res.stdout.strip() else None)


# --- no candidate survives sizing: a proof of infeasibility, whatever the method ----------------------------------


@pytest.mark.parametrize("method", ["mip", "auto"])
@pytest.mark.parametrize("override,reason", [
    # the 70B-class unit's P99 prefill of a 65,536-token request alone takes 20 ms on an H100: no count serves it
    ("slo.ttft_p99_ms=1", "prefill alone on an idle replica"),
    ("slo.ttft_p99_ms=3", "prefill alone on an idle replica"),
    # one sequence decodes in milliseconds per token: a 1 us TPOT cannot hold at any batch size
    ("slo.tpot_p99_ms=0.001", "above the 0.001 ms TPOT SLO"),
])
def test_no_surviving_candidate_is_infeasible(repo_root, method, override, reason):
    res, r = run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--method", method, "--set",
                 override)
    assert res.exit_code == 3
    assert r["status"] == "infeasible" and r["pools"] is None
    assert "no configuration serves" in r["explanation"] and reason in r["explanation"]


def test_split_routing_without_a_candidate_is_infeasible(repo_root):
    res, r = run("solve", repo_root / "tests" / "data" / "agent_split_units.yaml", "--set", "slo.ttft_p99_ms=1")
    assert res.exit_code == 3
    assert r["status"] == "infeasible" and "prefill alone on an idle replica" in r["explanation"]


# --- inputs no operator means: refused with the field and its range ----------------------------------------------


@pytest.mark.parametrize("override,field,allowed", [
    ("constraints.max_utilization=1.0e-9", "constraints.max_utilization", "0.05 to 1"),
    ("constraints.max_utilization=0.04", "constraints.max_utilization", "0.05 to 1"),
    ("gpus.0.availability=1.0e-9", "gpus[0].availability", "0.5 to 1"),
    ("gpus.1.availability=0.49", "gpus[1].availability", "0.5 to 1"),
    ("gpus.0.cost_per_hr=1.0e+300", "gpus[0].cost_per_hr", "up to 1,000,000 $/hr per GPU"),
])
def test_implausible_inputs_are_refused(repo_root, override, field, allowed):
    res = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), "--set",
                                    override])
    assert res.exit_code == 2
    (line,) = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert field.split(".")[-1] in line and allowed in line and "out of range" in line


@pytest.mark.parametrize("override", ["constraints.max_utilization=0.05", "gpus.0.availability=0.5",
                                      "gpus.0.cost_per_hr=1000000"])
def test_the_range_ends_are_accepted(repo_root, override):
    from fleetopt.optimizer import api

    api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", [override])


def test_the_price_ceiling_solves_to_optimality(repo_root):
    """Both options at the ceiling: the cheapest fleet is the one with the fewest priced GPUs, found and proven."""
    args = ["solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--method", "mip",
            "--set", "gpus.0.cost_per_hr=1000000", "--set", "gpus.1.cost_per_hr=1000000"]
    res, r = run(*args)
    assert res.exit_code == 0 and r["status"] == "optimal"
    assert r["cost_per_hr"] == pytest.approx(1e6 * r["total_gpus"])


# --- claims: no saving for a fleet that misses; each names the quantity it is about ------------------------------

QUICK = "0-3072:h100x1,3072-65536:h100x3"
"""The quickstart's cost optimum: it meets the SLO within every limit."""
OVERLOADED = "0-3072:h100x1,3072-65536:h100x1"
"""One replica for the long pool: its offered load is about twice its capacity."""


def evaluate(repo_root, fleet, *extra):
    res = CliRunner().invoke(main, ["evaluate", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"),
                                    "--fleet", fleet,
                                    "--format", "plain", *extra])
    _, data = run("evaluate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet", fleet, *extra)
    assert res.exit_code == (0 if data["feasible"] else 5)  # 5: the fleet misses its SLO or breaks a limit
    (claim,) = [x for x in res.output.splitlines() if x.startswith(f"fleet {fleet}:")]
    return claim, res.output, data


def test_a_fleet_that_misses_claims_no_saving(repo_root):
    claim, _, data = evaluate(repo_root, OVERLOADED)
    assert data["slo_met"] is False and data["feasible"] is False
    assert data["cost_per_hr"] < data["baseline"]["cost_per_hr"]  # cheaper, but it does not do the job
    assert "no saving is claimed" in claim and "misses the SLO" in claim and "saves" not in claim


def test_a_fleet_that_meets_its_slo_claims_its_cost_saving(repo_root):
    claim, _, data = evaluate(repo_root, QUICK)
    assert data["feasible"] is True
    share = 1 - data["cost_per_hr"] / data["baseline"]["cost_per_hr"]
    assert f"saves {share:.1%} of cost against the homogeneous baseline" in claim


def test_an_overloaded_pool_shows_its_load_not_inf(repo_root):
    _, text, data = evaluate(repo_root, OVERLOADED)
    long = data["pools"][1]
    # an unstable queue: no finite utilisation, a flag, and the offered load over capacity (above 1)
    assert long["utilization"] is None and long["overloaded"] is True and 1 < long["capacity_load"] < 1e6
    assert data["pools"][0]["overloaded"] is False and 0 < data["pools"][0]["utilization"] < 1
    row = [x for x in text.splitlines() if x.lstrip().startswith("3,072-65,536")]
    assert any(f"{long['capacity_load']:.2f} overloaded" in x for x in row)
    assert not any(" inf " in x.split("h100", 1)[-1].split("overloaded")[0] for x in row)


@pytest.mark.parametrize("objective", ["power", "tok_per_watt"])
def test_a_power_solve_claims_its_saving_on_power(repo_root, objective):
    args = ["solve", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), "--objective", objective]
    text = CliRunner().invoke(main, args, env={"COLUMNS": "1000"}).output   # the claim on one line, unwrapped
    _, r = run(*args)
    share = 1 - r["power_kw"] / r["baseline"]["power_kw"]
    (line,) = [x for x in text.splitlines() if x.startswith("homogeneous baseline (analytic)")]
    assert f"plan 1 saves {share:.1%} of power against the homogeneous baseline" in line
    assert "of cost" not in line  # the cost comparison is named as cost, never as a saving of the objective
    cost = r["cost_per_hr"] / r["baseline"]["cost_per_hr"] - 1
    assert f"its cost is {abs(cost):.1%} {'above' if cost > 0 else 'below'} the baseline's" in line


# --- max_count: GPUs as the option prices them (README) -----------------------------------------------------------

ONE_OPTION = """name: one-option
workload: {{cdf: {cdf}, arrival_rate: 100}}
slo: {{ttft_p99_ms: 500}}
gpus:
  - {gpu}
pools: {{max_pools: 2, max_context: 8192}}
"""
SEED_UNIT = "{name: h100, profile: H100-80GB}"
"""The seeds' calibrated unit: one replica is a TP=8 server of 8 physical GPUs, priced as one."""
TP8 = "{name: h100, hardware: H100-SXM-80GB, model: Llama-3.1-70B, tp: 8}"
"""A computed TP=8 option: one replica is 8 physical GPUs, priced as 8."""


@pytest.fixture
def one_option(tmp_path, repo_root):
    def write(gpu: str):
        path = tmp_path / "one.yaml"
        path.write_text(ONE_OPTION.format(cdf=repo_root / "data" / "workloads" / "lmsys_cdf.json", gpu=gpu))
        return path
    return write


def test_max_count_of_a_computed_tp8_option_counts_physical_gpus(one_option):
    path = one_option(TP8)
    _, free = run("solve", path)
    assert free["total_replicas"] > 2 and free["physical_gpus"] == 8 * free["total_replicas"]
    # 16 physical GPUs are two 8-GPU replicas: fewer than the optimum needs
    res, r = run("solve", path, "--set", "gpus.0.max_count=16")
    assert res.exit_code == 3 and r["status"] == "infeasible"
    assert "max_count 16) hold 16 GPUs, below the" in r["explanation"]
    res, r = run("solve", path, "--set", f"gpus.0.max_count={free['physical_gpus']}")
    assert res.exit_code == 0 and r["total_replicas"] == free["total_replicas"]


def test_max_count_of_a_seed_unit_counts_its_replicas_and_validate_says_so(one_option):
    path = one_option(SEED_UNIT)
    _, free = run("solve", path)
    n = free["total_replicas"]
    assert n >= 2 and free["physical_gpus"] == 8 * n
    # max_count n admits n servers of 8 GPUs (8n physical GPUs); n - 1 does not
    res, r = run("solve", path, "--set", f"gpus.0.max_count={n}")
    assert res.exit_code == 0 and r["total_replicas"] == n and r["physical_gpus"] == 8 * n
    res, r = run("solve", path, "--set", f"gpus.0.max_count={n - 1}")
    assert res.exit_code == 3 and r["status"] == "infeasible"
    _, summary = run("validate", path, "--set", f"gpus.0.max_count={n}")
    assert any(f"max_count {n} allows {n} replicas = {8 * n} physical GPUs" in w for w in summary["warnings"])
