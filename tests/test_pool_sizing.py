"""Per-pool simulated sizing (``optimizer/simulation/pool_sizing.py``) and per-pool statistics.

Every fact is checked independently of the search: the least count is re-simulated directly (same seed) next to
the count below it, the cache is checked by counting simulations, the conditioned workload against the CDF.
The tests hold whichever analytic TTFT model is the default: they are about simulation verdicts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.models.fleet import PoolPlan
from fleetopt.models.workload import LengthDistribution
from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.simulation import simulate as simulate_module
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.pool_sizing import (
    PoolCandidate,
    PoolSizer,
    pool_instance,
    pool_misses,
    window_lengths,
)
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan
from fleetopt.optimizer.simulation.verify import analytic_minima, plan_verdict

P3 = """name: p3-mixed
workload: {cdf: builtin:azure, arrival_rate: 100}
slo: {ttft_p99_ms: 500}
gpus: [{name: a10g, profile: A10G}, {name: a100, profile: A100-80GB}, {name: h100, profile: H100-80GB}]
pools: {max_pools: 2, max_context: 8192, boundaries: auto}
allow_mixed_models: true
"""

# mean-prefill (P99 wait + mean prefill) calls a 60 ms SLO feasible; in simulation the longest prompts' prefill
# alone takes longer, at any replica count
PREFILL_BOUND = """name: lmsys-a100-64k
workload: {cdf: builtin:lmsys, arrival_rate: 20}
slo: {ttft_p99_ms: 60, ttft_model: mean-prefill}
gpus: [{name: a100, profile: A100-80GB}]
pools: {max_pools: 1, max_context: 65536}
"""

FAST = SimOptions(requests=20_000)


def _write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def p3(tmp_path_factory):
    return api.load(_write(tmp_path_factory.mktemp("p3"), P3, "p3"))


def _a10g_long(inst) -> tuple[PoolCandidate, int]:
    key = next(k for k in analytic_minima(inst) if k[:3] == (3072, 8192, "a10g"))
    return PoolCandidate(*key), analytic_minima(inst)[key]


def test_window_lengths_is_the_cdf_conditioned_on_the_window():
    d, _ = LengthDistribution.from_cdf([(100, 0.2), (1000, 0.7), (4000, 1.0)]).truncated(3000)  # atom at 3000
    w, share = window_lengths(d, 500, 3000)
    assert share == pytest.approx(float(d.cdf(3000) - d.cdf(500)))
    for x in (600, 999, 2500, 2999.5, 3000):
        assert float(w.cdf(x)) == pytest.approx(float((d.cdf(x) - d.cdf(500)) / share))
    assert float(w.cdf(500)) == 0.0 and float(w.cdf(3000)) == pytest.approx(1.0)
    assert window_lengths(d, 3000, 4000) == (None, 0.0)


def test_pool_instance_carries_only_the_windows_traffic(p3):
    inst, share = pool_instance(p3, 3072, 8192)
    lam = p3.workload.arrival_rate_req_per_s
    assert inst.workload.arrival_rate_req_per_s == pytest.approx(lam * share)
    assert inst.pools.boundaries == (0, 8192) and inst.pools.max_context_tokens == 8192
    assert share == pytest.approx(float(p3.workload.lengths.cdf(8192) - p3.workload.lengths.cdf(3072)))


def _direct(inst, cand: PoolCandidate, n: int, options: SimOptions):
    """The candidate alone at ``n`` replicas, simulated without the sizer (same construction, same seed)."""
    window, share = pool_instance(inst, cand.lo_tokens, cand.hi_tokens)
    g = window.gpu(cand.gpu)
    pools = [PoolPlan(0, cand.hi_tokens, g.name, g.profile, n, g.availability, 1.0, cand.max_num_seqs)]
    requests = max(math.ceil(options.requests * share), 100 * options.replications)
    return simulate_plan(window, pools, SimOptions(requests=requests, seed=options.seed)).pools[0]


@pytest.fixture(scope="module")
def sized(p3):
    """The A10G 3,072-8,192 candidate of the p3 example sized from one replica, every simulation counted."""
    cand, n_star = _a10g_long(p3)
    sizer = PoolSizer(p3, FAST, "ci-upper")
    calls = []
    real = sizer._simulate
    sizer._simulate = lambda c, n: calls.append((c, n)) or real(c, n)
    return sizer, cand, n_star, sizer.size(cand, 1, n_star), calls


def test_least_count_passes_and_the_count_below_misses(p3, sized):
    sizer, cand, _, sizing, _ = sized
    least = sizing.least_replicas
    assert sizing.feasible and least >= 2
    slo_ms = p3.slo.ttft_p99_s * 1000.0
    at, below = _direct(p3, cand, least, FAST), _direct(p3, cand, least - 1, FAST)
    assert not pool_misses(at, "ci-upper", slo_ms) and at.requests >= MIN_POOL_REQUESTS
    assert pool_misses(below, "ci-upper", slo_ms)
    assert at.ttft_p99_ms_sim == pytest.approx(sizer.verdicts[(cand, least)].ttft_p99_ms_sim)


def test_every_count_is_simulated_once(sized):
    sizer, cand, n_star, first, calls = sized
    counted = len(calls)
    assert counted == sizer.simulations == len(set(calls)) == len({v.replicas for v in first.trials})
    again = sizer.size(cand, 1, n_star)
    assert again.least_replicas == first.least_replicas and len(calls) == counted    # all from the cache
    assert all(v.source == "alone" for v in first.trials)


@pytest.mark.slow
def test_a_plan_miss_moves_the_search_above_it(p3):
    cand, n_star = _a10g_long(p3)
    sizer = PoolSizer(p3, FAST, "ci-upper")
    least = sizer.size(cand, 1, n_star).least_replicas

    class Missed:                          # a plan's simulation that missed in this pool at the least count
        ttft_p99_ms_sim, ttft_p99_ci_ms, requests = 600.0, (550.0, 650.0), 900

        class wait:
            p99_ms = 20.0

    sizer.record_miss(cand, least, Missed)
    assert sizer.size(cand, 1, n_star).least_replicas > least


@pytest.mark.slow
def test_a_pool_whose_prefill_alone_breaks_the_slo_is_infeasible(tmp_path, monkeypatch):
    from fleetopt.optimizer.simulation import pool_sizing

    monkeypatch.setattr(pool_sizing, "CAP_REPLICAS", 12)   # the bound shows by 12 replicas; keeps the test fast
    inst = api.load(_write(tmp_path, PREFILL_BOUND, "bound"))
    key = next(k for k in analytic_minima(inst) if k[:3] == (0, 65536, "a100"))
    sizing = PoolSizer(inst, SimOptions(requests=5_000), "ci-upper").size(PoolCandidate(*key), 1, 2)
    assert not sizing.feasible and sizing.cap_replicas == 12
    assert "prefill" in sizing.reason and "60 ms SLO" in sizing.reason
    assert sizing.trials[-1].replicas == 12 and not sizing.trials[-1].passed


@pytest.mark.slow
def test_cli_exits_3_with_the_reason_when_simulation_rules_out_every_pool(tmp_path):
    path = _write(tmp_path, PREFILL_BOUND, "bound")
    res = CliRunner().invoke(main, ["solve", str(path), "--verify-top", "2", "--sim-requests", "5000", "--json", "-"])
    assert res.exit_code == 3, res.output
    r = json.loads(res.stdout)
    v = r["verification"]
    assert r["verified"] is False and "0-65,536 tokens on a100" in v["reason"] and "prefill" in v["reason"]
    assert any(z["least_replicas"] is None and z["reason"] for z in v["pool_sizing"])


def test_a_pool_with_few_requests_is_flagged_never_ok(repo_root):
    inst = api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml")
    pools = plans_from_spec(inst, "0-8192:a100x6,8192-65536:a100x3")
    # spillover (a bound no queue reaches: length routing) gives a thin pool no dedicated run of its own requests
    # (simulate.py, "Thin pools"), so the top pool's verdict rests on the run's handful
    sim = simulate_plan(inst, pools, SimOptions(requests=5_000, router="spillover", spill_bound=10**6))
    top = sim.pools[1]
    assert 0 < top.requests < MIN_POOL_REQUESTS and top.too_few_requests and top.p99_source == "main run"
    assert sim.to_json()["pools"][1]["too_few_requests"] is True
    ok, failing, thin = plan_verdict(sim, inst, "ci-upper")
    assert not ok and ((8192, 65536, "a100") in thin or (8192, 65536, "a100") in failing)
    from rich.console import Console

    from fleetopt.optimizer.output.render import render_simulation

    c = Console(width=200, record=True)
    render_simulation(c, sim)
    row = next(line for line in c.export_text().splitlines() if line.lstrip("│ ").startswith("8,192-65,536"))
    assert "too few requests" in row and " met" not in row


@pytest.mark.slow
def test_precision_applies_to_every_pool_with_traffic(repo_root):
    inst = api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml")
    pools = plans_from_spec(inst, "0-8192:a100x6,8192-65536:a100x3")
    sim = simulate_plan(inst, pools, SimOptions(requests=5_000, precision=0.5, max_requests=80_000))
    assert sim.stopped_by in ("precision", "max_requests")
    if sim.stopped_by == "precision":
        for p in sim.pools:
            assert p.requests >= MIN_POOL_REQUESTS and not p.too_few_requests
            half = (p.ttft_p99_ci_ms[1] - p.ttft_p99_ci_ms[0]) / 2
            assert half <= 0.5 * p.ttft_p99_ms_sim or p.ttft_p99_ms_sim == math.inf
    assert sim.requests_simulated > 5_000   # the thin pool alone asked for more requests


def test_verification_converges_within_two_rounds_on_the_p3_example(p3):
    _, v = api.verify(p3, FAST, verify_top=3, max_rounds=2)
    assert v.verified and v.rounds <= 2 and v.chosen.passed
    assert all(not p.too_few_requests for p in v.chosen.sim.pools)
    seen = [(vp.round, vp.plan.fleet.pools) for vp in v.plans if not vp.cached]
    keys = [tuple((p.min_tokens, p.max_tokens, p.gpu, p.replicas) for p in pools) for _, pools in seen]
    assert len(keys) == len(set(keys))     # no plan simulated twice


@pytest.mark.slow
def test_verification_converges_when_the_analytic_model_is_optimistic(tmp_path):
    """Under mean-prefill the analytic A10G pools of the p3 example miss badly in simulation: the per-pool cuts
    still reach a verified plan within two rounds, and it passes again with another seed."""
    inst = api.load(_write(tmp_path, P3, "p3"), ["slo.ttft_model=mean-prefill"])
    _, v = api.verify(inst, FAST, verify_top=3, max_rounds=2)
    assert v.verified and v.rounds <= 2 and v.pool_simulations > 0
    again = simulate_module.simulate_solved_plan(inst, v.chosen.plan, SimOptions(requests=60_000, seed=11))
    assert plan_verdict(again, inst, "ci-upper")[0]
    for z in v.sizings:           # every cut rests on a passing count with a failing count below it
        if z.feasible:
            by_count = {t.replicas: t for t in z.trials}
            assert by_count[z.least_replicas].passed
            assert z.least_replicas - 1 not in by_count or not by_count[z.least_replicas - 1].passed


def test_conditioned_sampling_stays_in_the_window(p3):
    from fleetopt.solvers.des.routing import sample_lengths

    inst, _ = pool_instance(p3, 3072, 8192)
    lin, lout = sample_lengths(inst.workload.lengths, 20_000, np.random.default_rng(0), inst.workload.input_fraction)
    total = lin + lout
    assert total.min() > 3072 and total.max() <= 8192
