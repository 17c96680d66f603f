"""``solve --verify-top N --trim``: lowering a verified plan's replica counts by simulation.

The search is checked against verdicts whose answer is known (a rule on the simulated counts and seed), so
the bisection, the pool order, the confirmation and the back-off are tested exactly; then on the Puzzle-2
fleet under vLLM's paged admission, where the analytic (whole-window slot) sizing is known to be generous.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from optimizer import api
from optimizer.cli import main
from optimizer.sim_engine import EngineOptions
from optimizer.solve import SolveOptions, solve_instance
from optimizer.trim import MAX_BACKOFFS, trim_plan
from optimizer.verify import verify


@pytest.fixture(scope="module")
def quick_plan(repo_root):
    inst = api.load(repo_root / "instances" / "lmsys_a100.yaml")     # the Puzzle-1 plan: 5 + 3 A100 units
    return inst, solve_instance(inst, SolveOptions()).plans[0]


def _counts(sim) -> tuple[int, ...]:
    return tuple(p.replicas for p in sim.pools)


def test_bisection_finds_the_least_counts_of_a_monotone_rule(quick_plan):
    inst, plan = quick_plan
    verified = tuple(p.replicas for p in plan.fleet.pools)
    need = tuple(max(1, n - 1) for n in verified)
    trim = trim_plan(inst, plan, lambda sim: all(c >= q for c, q in zip(_counts(sim), need)),
                     simulate_options={"requests": 500, "replications": 1})
    assert trim.verified_counts == verified
    assert trim.counts == need and trim.confirmed
    # every trial of pool k bisects [1, n_k]: at most ceil(log2(n_k)) trials each, one confirmation
    bisect = [s for s in trim.steps if s.pool >= 0]
    assert len(bisect) <= sum((n - 1).bit_length() for n in verified)
    assert [s.pool for s in trim.steps if s.pool < 0] == [-1]
    # the most expensive replica is trimmed first
    first = bisect[0].pool
    assert plan.fleet.pools[first].cost_per_hr / plan.fleet.pools[first].replicas == max(
        p.cost_per_hr / p.replicas for p in plan.fleet.pools)
    per_replica = [p.cost_per_hr / p.replicas for p in plan.fleet.pools]
    assert trim.cost_per_hr == pytest.approx(sum(n * c for n, c in zip(need, per_replica)))


def test_a_missed_confirmation_backs_off_one_replica_per_trimmed_pool(quick_plan):
    inst, plan = quick_plan
    verified = tuple(p.replicas for p in plan.fleet.pools)
    assert min(verified) >= 3
    # the search seed (0) accepts one replica everywhere; the independent seed (1) wants two fewer than verified
    want = tuple(n - 2 for n in verified)

    def passes(sim):
        return sim.seed == 0 or all(c >= q for c, q in zip(_counts(sim), want))

    trim = trim_plan(inst, plan, passes, simulate_options={"requests": 500, "replications": 1})
    confirmations = [s.counts for s in trim.steps if s.pool < 0]
    # 1 everywhere misses, then one replica back per trimmed pool each time, until every pool reaches want
    assert confirmations == [tuple(min(1 + k, v) for v in verified) for k in range(len(confirmations))]
    assert len(confirmations) == max(want)
    assert trim.counts == tuple(min(max(want), v) for v in verified) and trim.confirmed


def test_no_backoff_passes_keeps_the_verified_plan(quick_plan):
    inst, plan = quick_plan
    trim = trim_plan(inst, plan, lambda sim: sim.seed == 0, simulate_options={"requests": 500, "replications": 1})
    assert trim.counts == trim.verified_counts and not trim.confirmed and trim.savings == 0.0


def test_paged_admission_trims_the_puzzle2_fleet(repo_root):
    inst = api.load(repo_root / "instances" / "agent_h100.yaml")
    rep, v = verify(inst, SolveOptions(method="mip"), top=1, seed=0, trim=True,
                    simulate_options={"requests": 6_000, "replications": 2, "engine": EngineOptions(kv="paged")})
    t = v.trim
    assert v.verified and t is not None and t.confirmed
    assert all(n <= m for n, m in zip(t.counts, t.verified_counts)) and t.savings > 0.1
    # what the trim reports is its own simulation of the trimmed counts, run with the paged engine
    assert _counts(t.sim) == t.counts and t.sim.engine.kv == "paged"
    assert t.sim.slo_met and t.confirmation.slo_met


def test_cli_trim(repo_root, tmp_path):
    path = repo_root / "instances" / "quickstart.yaml"
    r = CliRunner().invoke(main, ["solve", str(path), "--trim"])
    assert r.exit_code == 2 and "--trim" in r.output and len(r.output.strip().splitlines()) == 1
    out = tmp_path / "v.json"
    r = CliRunner().invoke(main, ["solve", str(path), "--verify-top", "1", "--trim", "--sim-requests", "5000",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())["verification"]["trim"]
    assert d["source"] == "simulated" and d["cost_per_hr"] <= d["verified_cost_per_hr"]
    assert [p["replicas"] for p in d["pools"]] == [int(x.split("x")[1]) for x in d["fleet"].split(",")]
    assert "trim (simulated" in r.output
    if d["cost_per_hr"] < d["verified_cost_per_hr"]:
        assert f"--fleet '{d['fleet']}'" in r.output and "--seed 2" in r.output
