"""Simulation of semantic (multi-model) plans: the classifier's draws, the report's classes, verification, plan
files and the commands that refuse a semantic instance.

Hand facts: a request goes to the small class with probability alpha(L), independently of the others, so the
small class's count among n requests of one rule segment is Binomial(n, alpha); every bound below is the mean
+- 5 standard deviations (a false failure about once in 1.7 million runs)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.models.semantic import ShareRule
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.plan.solve import Plan, SolveOptions, solve_instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.plan_files import load_solved_plan
from fleetopt.optimizer.simulation.simulate import (SemanticRouter, _class_rng, plans_from_fleet, semantic_analytic,
                                                    semantic_routing, simulate_pools, simulate_solved_plan)
from fleetopt.optimizer.simulation.verify import judge_plan, verify
from fleetopt.solvers.des.routing import sample_lengths

EXAMPLE = "semantic_8b_70b"
SMALL_SIM = SimOptions(requests=4_000, replications=2, seed=3)


def _binomial_ok(count: int, n: int, p: float) -> bool:
    sd = math.sqrt(n * p * (1.0 - p))
    return abs(count - n * p) <= 5.0 * sd + 1e-9


@pytest.fixture(scope="module")
def example(repo_root):
    """The example instance sized to the SLO itself (as --verify-top sizes it) and its optimal plan."""
    inst = load_instance(str(repo_root / "instances" / f"{EXAMPLE}.yaml"))
    inst = replace(inst, slo=inst.slo.without_margin())
    report = solve_instance(inst, SolveOptions(top=2, compute_baseline=False))
    return inst, report.plans[0], report


# ---------------------------------------------------------------------------------------------------------------
# The classifier
# ---------------------------------------------------------------------------------------------------------------


def _lengths(inst, n: int, seed: int = 11):
    w = inst.workload
    return sample_lengths(w.lengths, n, np.random.default_rng(seed), w.input_fraction)


def test_constant_rule_share_is_binomial(example):
    """alpha = 0.3 everywhere: the small class's count among 100,000 requests is Binomial(100,000, 0.3), and each
    class's requests go to the pool of its own tiling whose window holds them."""
    inst, *_ = example
    prompt, output = _lengths(inst, 100_000)
    L = prompt + output
    # small: 0-2,048 and 2,048-8,192 (pools 0, 1); large: one pool 0-8,192 (pool 2)
    router = SemanticRouter(ShareRule.constant(0.3), [2048, 8192, 8192], ["small", "small", "large"],
                            ["s1", "s2", "l"], np.random.default_rng(5))
    to = router.route(prompt, output)
    small = to < 2
    assert _binomial_ok(int(small.sum()), len(L), 0.3)
    assert np.all(to >= 0)
    assert np.all(L[to == 0] <= 2048) and np.all(L[to == 1] > 2048)


def test_step_rule_share_per_segment_is_binomial(example):
    """alpha = 0.9 up to 1,024 tokens, 0.25 above: within each segment the small count is binomial with that
    segment's share (a request of exactly 1,024 tokens is in the lower segment)."""
    inst, *_ = example
    prompt, output = _lengths(inst, 100_000, seed=12)
    L = prompt + output
    router = SemanticRouter(ShareRule.step([1024], [0.9, 0.25]), [8192, 8192], ["small", "large"], ["s", "l"],
                            np.random.default_rng(6))
    small = router.route(prompt, output) == 0
    low = L <= 1024
    assert 1_000 < low.sum() < len(L) - 1_000        # both segments hold requests
    assert _binomial_ok(int(small[low].sum()), int(low.sum()), 0.9)
    assert _binomial_ok(int(small[~low].sum()), int((~low).sum()), 0.25)
    edge = SemanticRouter(ShareRule.step([1024], [1.0, 0.0]), [8192, 8192], ["small", "large"], ["s", "l"],
                          np.random.default_rng(0))
    assert edge.route(np.array([1000, 1000]), np.array([24, 25])).tolist() == [0, 1]


def test_class_draws_are_common_random_numbers():
    """The class stream comes from the replication's seed path, not from its draws: the same after other draws."""
    a, b = (np.random.default_rng(c) for c in np.random.SeedSequence(4).spawn(2))
    a2 = np.random.default_rng(np.random.SeedSequence(4).spawn(2)[0])
    a2.random(1000)                                  # the stream drawn before the router: nothing changes
    assert np.array_equal(_class_rng(a).random(50), _class_rng(a2).random(50))
    assert not np.array_equal(_class_rng(a).random(50), _class_rng(b).random(50))
    assert not np.array_equal(_class_rng(a).random(50), np.random.default_rng(
        np.random.SeedSequence(4).spawn(2)[0]).random(50))


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------


def test_report_rows_carry_roles_and_class_shares(example):
    """The plan's rows keep its order and roles; every measured request is in one class; the small class's
    measured share is Binomial(measured, pi_small) (share 0.4: pi_small = 0.4)."""
    inst, plan, _ = example
    sim = simulate_solved_plan(inst, plan, SMALL_SIM)
    assert [p.role for p in sim.pools] == list(plan.semantic.roles)
    assert [(p.min_tokens, p.max_tokens, p.gpu) for p in sim.pools] == \
        [(p.min_tokens, p.max_tokens, p.gpu) for p in plan.fleet.pools]
    doc = sim.to_json()
    assert [p["role"] for p in doc["pools"]] == list(plan.semantic.roles)
    cls = {c["role"]: c for c in doc["semantic"]["classes"]}
    assert doc["semantic"]["share"] == plan.semantic.share == "0.4"
    measured = cls["small"]["requests"] + cls["large"]["requests"]
    assert measured == sim.requests_measured == sum(p.requests for p in sim.pools)
    assert cls["small"]["rate_share"] == pytest.approx(0.4)
    assert _binomial_ok(cls["small"]["requests"], measured, 0.4)
    assert math.isfinite(sim.ttft_p99_ms) and 0 < sim.ttft_p99_ms


def test_simulation_is_deterministic_by_seed(example):
    """The same seed gives byte-identical JSON (the wall time aside); another seed another run."""
    inst, plan, _ = example

    def doc(seed):
        d = simulate_solved_plan(inst, plan, replace(SMALL_SIM, seed=seed)).to_json()
        d.pop("wall_seconds")
        return json.dumps(d, sort_keys=True, default=str)

    assert doc(3) == doc(3)
    assert doc(3) != doc(4)


def test_a_semantic_plan_needs_its_classes(example):
    """Without its classes the instance's pools are refused (one line naming the section); a class whose pools do
    not tile its range, and a router other than length, too."""
    inst, plan, _ = example
    pools = plans_from_fleet(inst, plan.fleet)
    sem = semantic_routing(inst, plan)
    with pytest.raises(InstanceError, match="semantic"):
        simulate_pools(inst, pools, None, SMALL_SIM)
    with pytest.raises(InstanceError, match="small class's pools must tile"):
        simulate_pools(inst, [replace(pools[0], lo_tokens=1024), pools[1]], None, SMALL_SIM, semantic=sem)
    with pytest.raises(InstanceError, match="--router"):
        simulate_pools(inst, pools, None, replace(SMALL_SIM, router="random"), semantic=sem)


# ---------------------------------------------------------------------------------------------------------------
# Plan files
# ---------------------------------------------------------------------------------------------------------------


def test_plan_file_round_trip(example, repo_root, tmp_path):
    """solve's JSON read back (simulate --plan): the pools, roles and rule come back, and the simulation equals the
    one of the solved plan; a solution without its semantic block gets its rule from its small pools' share."""
    from fleetopt.optimizer.output.documents import solve_json

    inst, plan, report = example
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(solve_json(report), default=str))
    solved = load_solved_plan(out, inst)
    assert solved.semantic.roles == plan.semantic.roles and solved.semantic.label == plan.semantic.share
    assert [(p.lo_tokens, p.hi_tokens, p.gpu, p.replicas) for p in solved.pools] == \
        [(p.min_tokens, p.max_tokens, p.gpu, p.replicas) for p in plan.fleet.pools]
    second = load_solved_plan(out, inst, rank=2)
    assert second.semantic.label == "0.4" and set(second.semantic.roles) == {"small", "large"}
    a = simulate_pools(inst, solved.pools, None, SMALL_SIM, semantic=solved.semantic).to_json()
    b = simulate_solved_plan(inst, plan, SMALL_SIM).to_json()
    for d in (a, b):
        d.pop("wall_seconds")
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    doc = json.loads(out.read_text())
    doc["pools"][0]["role"] = "large"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    path = str(repo_root / "instances" / f"{EXAMPLE}.yaml")
    res = CliRunner().invoke(main, ["simulate", path, "--plan", str(bad), "--requests", "2000"])
    assert res.exit_code == 2 and "pools[0].role" in res.output and len(res.output.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------------------
# Guards
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["evaluate", "{path}", "--fleet", "0-8192:h100-8bx6"],
    ["simulate", "{path}", "--fleet", "0-8192:h100-8bx6"],
    ["simulate", "{path}", "--fleet", "0-8192:h100-8bx6", "--routers", "length,random"],
    ["pareto", "{path}", "--split-table"],
    ["pareto", "{path}", "--axes", "cost,power"],
    ["headroom", "{path}", "--fleet", "0-8192:h100-70bx7"],
    ["headroom", "{path}", "--range", "50:100"],
    ["whatif", "{path}", "--sweep", "workload.arrival_rate=50,100"],
    ["gridflex", "{path}", "--fleet", "0-8192:h100-70bx7"],
], ids=lambda a: " ".join(a[:1] + a[2:3]))
def test_length_routed_commands_refuse_a_semantic_instance(repo_root, args):
    path = str(repo_root / "instances" / f"{EXAMPLE}.yaml")
    res = CliRunner().invoke(main, [a.format(path=path) for a in args])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "semantic section" in lines[0] and "Traceback" not in res.output


# ---------------------------------------------------------------------------------------------------------------
# Verification (slow: 100,000 requests per plan, the verification default)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_example_passes_verify_top_1(repo_root, tmp_path):
    """solve --verify-top 1 on the example: the planner's plan (share 0.4, 8B x6 and 70B x5) passes in round 1,
    every pool judged, exit 0; its JSON's verified plan rows carry their roles."""
    path = str(repo_root / "instances" / f"{EXAMPLE}.yaml")
    out = tmp_path / "v.json"
    res = CliRunner().invoke(main, ["solve", path, "--verify-top", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    v = doc["verification"]
    assert doc["verified"] is True and v["outcome"] == "pass" and v["rounds"] == 1
    assert [p["role"] for p in doc["pools"]] == ["small", "large"]
    assert doc["semantic"]["share"] == "0.4"


@pytest.mark.slow
def test_one_small_replica_fewer_fails(example, monkeypatch):
    """The small pool at 5 replicas instead of 6: the analytic model says it misses (P99 inf: the pool would run
    past its utilisation cap), and so does the simulation at the verification's 100,000 requests (its interval's
    lower end above 500 ms); verify keeps the analytic counts and stops after that round with one line."""
    inst, plan, _ = example
    pools = plans_from_fleet(inst, plan.fleet)
    sem = semantic_routing(inst, plan)
    fewer = [replace(pools[0], replicas=pools[0].replicas - 1), *pools[1:]]
    assert sem.roles[0] == "small" and pools[0].replicas == 6
    analytic = semantic_analytic(inst, fewer, sem)
    assert not analytic.pools[0].slo_met
    sim = simulate_pools(inst, fewer, None, SimOptions(requests=100_000), semantic=sem)
    verdict = judge_plan(sim, inst, "ci-upper")
    assert verdict.failing == ((0, 8192, "h100-8b"),)
    assert sim.pools[0].ttft_p99_ci_ms[0] > 500.0 and sim.pools[1].ttft_p99_ci_ms[1] <= 500.0

    bad = Plan(1, analytic.cost_per_hr, analytic, semantic=plan.semantic)
    real = solve_instance

    def solve_fewer(instance, options):
        got = real(instance, options)
        return replace(got, plans=(bad,))

    monkeypatch.setattr("fleetopt.optimizer.simulation.verify.solve_instance", solve_fewer)
    _, v = verify(inst, SolveOptions(compute_baseline=False), SimOptions(requests=100_000), top=1, max_rounds=3)
    assert v.chosen is None and v.rounds == 1 and v.solves == 1
    assert len(v.cuts) == 1 and "small-model pool 0-8,192 on h100-8b x5 misses" in v.cuts[0]
