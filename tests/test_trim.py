"""``solve --verify-top N --trim``: lowering a verified plan's replica counts by simulation.

The search is checked against verdicts whose answer is known (a rule on the simulated counts and seed), so
the bisection, the pool order, the confirmation and the back-off are tested exactly; then on the Puzzle-2
fleet under vLLM's paged admission, where the analytic (whole-window slot) sizing is known to be generous.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.plan.evaluate import evaluate, parse_fleet
from fleetopt.optimizer.plan.solve import Plan, SolveOptions, solve_instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.trim import MAX_BACKOFFS, _least_passing, trim_plan, work_floors


@pytest.fixture(scope="module")
def roomy_plan(repo_root):
    """The Puzzle-1 instance with a generous 12 + 8 A100 plan (the solver's is 5 + 3): room to trim."""
    inst = api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml")
    fleet = evaluate(inst, parse_fleet("0-8192:a100x12,8192-65536:a100x8", inst)).result
    return inst, Plan(1, fleet.cost_per_hr, fleet)


FAST = SimOptions(requests=500, replications=1)


def _counts(sim) -> tuple[int, ...]:
    return tuple(p.replicas for p in sim.pools)


def _floors(inst, plan) -> tuple[int, ...]:
    """Least counts that keep up with each pool's context work: under length routing the trim's only floor
    (the analytic load floor no longer binds; the simulation decides)."""
    from fleetopt.optimizer.simulation.simulate import plans_from_fleet

    return tuple(work_floors(inst, plans_from_fleet(inst, plan.fleet)))


@pytest.mark.slow
def test_bisection_finds_the_least_counts_of_a_monotone_rule(roomy_plan):
    inst, plan = roomy_plan
    need = (7, 5)
    assert all(n > f for n, f in zip(need, _floors(inst, plan)))
    trim = trim_plan(inst, plan, lambda sim: all(c >= q for c, q in zip(_counts(sim), need)),
                     options=FAST, relaxation_spans=0)
    assert trim.verified_counts == (12, 8) and trim.counts == trim.up_counts == need and trim.confirmed
    search = [s for s in trim.steps if s.pool >= 0]
    assert len(search) <= sum(2 * (n - f).bit_length() + 1 for n, f in zip((12, 8), _floors(inst, plan)))
    assert [s.pool for s in trim.steps if s.pool < 0] == [-1]
    assert trim.cost_per_hr == pytest.approx(sum(need) * plan.fleet.pools[0].cost_per_hr / 12)


def test_least_passing_search_finds_the_answer_in_logarithmic_trials():
    for hi in range(1, 40):
        for floor in range(1, hi + 1):
            for answer in range(floor, hi + 1):
                calls = []
                assert _least_passing(lambda n, calls=calls, answer=answer: calls.append(n) or n >= answer,
                                      hi, floor) == answer
                assert len(calls) <= 2 * (hi - floor).bit_length() + 1
                assert all(n >= answer - (hi - answer) - 1 for n in calls)    # never far below the answer


def test_counts_never_go_below_the_context_work_floor(roomy_plan):
    inst, plan = roomy_plan
    trim = trim_plan(inst, plan, lambda sim: True, options=FAST, relaxation_spans=0)
    assert trim.counts == _floors(inst, plan)


@pytest.mark.slow
def test_a_missed_confirmation_backs_off_one_replica_per_trimmed_pool(roomy_plan):
    inst, plan = roomy_plan
    floors, want = _floors(inst, plan), (4, 4)

    def passes(sim):      # the search seed (0) accepts anything; the independent seed (1) wants `want`
        return sim.seed == 0 or all(c >= q for c, q in zip(_counts(sim), want))

    trim = trim_plan(inst, plan, passes, options=FAST, relaxation_spans=0)
    confirmations = [s.counts for s in trim.steps if s.pool < 0]
    backoffs = max(w - f for w, f in zip(want, floors))
    assert confirmations == [tuple(min(f + k, v) for f, v in zip(floors, (12, 8))) for k in range(backoffs + 1)]
    assert trim.counts == want and trim.confirmed
    assert len(confirmations) <= MAX_BACKOFFS + 1


def test_no_backoff_passes_keeps_the_verified_plan(roomy_plan):
    inst, plan = roomy_plan
    trim = trim_plan(inst, plan, lambda sim: sim.seed == 0, options=FAST, relaxation_spans=0)
    assert trim.counts == trim.verified_counts and not trim.confirmed and trim.savings == 0.0


def test_availability_and_min_count_survive_the_trim(repo_root):
    """Trimmed counts are replicas that must be up: bought as ceil(n / A), and a GPU's min_count holds."""
    inst = api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml",
                    ["gpus.a100.availability=0.5", "gpus.a100.min_count=16"])
    fleet = evaluate(inst, parse_fleet("0-8192:a100x12,8192-65536:a100x8", inst)).result
    trim = trim_plan(inst, Plan(1, fleet.cost_per_hr, fleet), lambda sim: True, options=FAST,
                     relaxation_spans=0)
    up = trim.up_counts
    bought = [min(v, math.ceil(u / 0.5)) for u, v in zip(up, trim.verified_counts)]
    gpus = inst.gpu("a100").profile.gpus_per_replica
    assert sum(trim.counts) * gpus >= 16 and all(c >= b for c, b in zip(trim.counts, bought))
    assert sum(bought) * gpus < 16 < sum(trim.counts) * gpus + gpus     # min_count bound, and only just


@pytest.mark.slow
def test_trials_run_long_enough_to_see_an_overloaded_pool(repo_root):
    """ref_1w_table3_azure's B200 short pool: a few thousand requests end before an overloaded pool's queue builds up,
    so the trials are lengthened; no trimmed pool is left above its load floor's utilisation."""
    inst = api.load(repo_root / "instances" / "ref_1w_table3_azure.yaml")
    plan = solve_instance(inst, SolveOptions()).plans[0]
    trim = trim_plan(inst, plan, lambda sim: sim.slo_met, SimOptions(requests=3000, replications=2))
    assert trim.requests_per_trial > 3000
    for p, n in zip(plan.fleet.pools, trim.counts):
        assert p.arrival_rate * p.mean_service_s / (n * p.max_num_seqs) <= inst.constraints.max_utilization + 1e-9


@pytest.mark.slow
def test_cli_trim(repo_root, tmp_path):
    path = repo_root / "instances" / "ref_puzzle2_agent_h100.yaml"
    r = CliRunner().invoke(main, ["solve", str(path), "--trim"])
    assert r.exit_code == 2 and "--trim" in r.output and len(r.output.strip().splitlines()) == 1
    out = tmp_path / "v.json"
    r = CliRunner().invoke(main, ["solve", str(path), "--set", "slo.ttft_p99_ms=1100", "--set",
                                  "slo.ttft_model=mean-prefill", "--verify-top", "1", "--trim",
                                  "--sim-kv", "paged", "--sim-requests", "4000", "--sim-replications", "1",
                                  "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())["verification"]["trim"]
    assert d["source"] == "simulated" and d["cost_per_hr"] < d["verified_cost_per_hr"]
    inst = api.load(path, ["slo.ttft_p99_ms=1100", "slo.ttft_model=mean-prefill"])
    assert [p["replicas"] for p in d["pools"]] == [q[3] for q in parse_fleet(d["fleet"], inst).pools]
    assert [p["replicas_up"] for p in d["pools"]] == [q[3] for q in parse_fleet(d["fleet_simulated"], inst).pools]
    # Puzzle 2 under vLLM's paged admission: whole-window slots over-size it, so the trim saves real money
    assert d["savings"] > 0.1 and d["confirmed"] and all(p["replicas"] <= p["replicas_verified"] for p in d["pools"])
    assert "trim (simulated" in r.output
    (check,) = [x for x in r.output.splitlines() if x.startswith("check the trimmed plan")]
    assert "--set 'slo.ttft_p99_ms=1100'" in check and "--kv paged" in check
    assert f"--fleet '{d['fleet_simulated']}'" in check


def test_context_work_is_what_the_engine_charges(repo_root):
    """The work floor's X is exactly the context the engine bills: a request alone on a replica takes
    S = (m + l_out) W + h X (fleetopt.solvers.des.engine), so X from the simulated service times equals the formula,
    and the
    floor is floor(0.95 lambda h E[X]) + 1 with E[X] over the pool's requests."""
    from fleetopt.models.fleet import PoolPlan
    from fleetopt.solvers.des.state import SimPool
    from fleetopt.solvers.des.engine import simulate
    from fleetopt.solvers.des.routing import LengthRouter, Requests, sample_lengths

    inst = api.load(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml")
    prof = inst.gpu("h100").profile
    lin, lout = sample_lengths(inst.workload.lengths, 300, np.random.default_rng(7), inst.workload.input_fraction)
    keep = lin + lout <= 65536
    lin, lout = lin[keep], lout[keep]
    arrivals = np.arange(len(lin)) * 1e4                       # far apart: every request runs alone
    res = simulate([SimPool("p", prof, 1, None, 65536)], Requests(arrivals, lin, lout),
                   LengthRouter([0, 65536], ["p"]))
    c, W, h = prof.chunk_tokens, prof.W_s, prof.H_s / prof.calibration_ctx_tokens
    m = -(-lin // c)
    x_engine = ((res.end_at_s - res.start_at_s) - (m + lout) * W) / h
    x_formula = c * m * (m - 1) / 2 + lout * lin + lout * (lout - 1) / 2
    assert np.allclose(x_engine, x_formula, rtol=1e-7, atol=1.0)        # float round-off of times at 1e6 s

    pool = PoolPlan(0, 65536, "h100", prof, 24)
    lam_h_ex = inst.workload.arrival_rate_req_per_s * h * _work_mean(inst, c)
    assert work_floors(inst, [pool]) == [int(0.95 * lam_h_ex) + 1]


def _work_mean(inst, c: int) -> float:
    """E[X] over the whole workload, from an independent sample (another seed, more requests)."""
    from fleetopt.solvers.des.routing import sample_lengths

    lin, lout = sample_lengths(inst.workload.lengths, 1_000_000, np.random.default_rng(99),
                               inst.workload.input_fraction)
    lin, lout = lin.astype(float), lout.astype(float)
    m = np.ceil(lin / c)
    x = c * m * (m - 1) / 2 + lout * lin + lout * (lout - 1) / 2
    return float(np.mean(np.where(lin + lout <= 65536, x, 0.0)))
