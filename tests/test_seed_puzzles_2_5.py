"""Seed Puzzles 2 and 5 under simulation (agent-heavy CDF, lambda = 20, SLO 1 s, H100 units).

The seed reports that the homogeneous 65,536-context fleet that analytics size (about 24 H100) misses the SLO
in its simulator (P99 1,052 ms) while a 4,096 / 65,536 split passes. fleetopt's simulator shows what
causes the miss: the analytic M/G/c model assumes work goes to a free KV slot anywhere in the pool, which
join-shortest-queue dispatch approximates; dispatch that ignores replica load (round robin) lets the
minutes-long agent requests pile up on unlucky replicas and the P99 explodes.
"""

from __future__ import annotations

import pytest

from fleetopt.optimizer import api
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan


@pytest.fixture(scope="module")
def agent(repo_root):
    return api.load(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml", ["slo.ttft_model=mean-prefill"])


def test_analytic_sizing_of_the_homogeneous_fleet(agent):
    r = api.evaluate_report(agent, "0-64k:h100").fleets[0][1]
    assert abs(r.total_replicas - 24) <= 1 and r.feasible  # the seed: about 24


SEEDS = (11, 12, 13)
"""Three independent seeds; each outcome must hold on every one with the margin its test states (measured on
the three: JSQ's P99 CI upper bound 259-283 ms, round robin's P99 24-31 s, the split's long pool 302-326 ms)."""
SLO_MS = 1000.0


@pytest.mark.slow
def test_load_blind_dispatch_reproduces_the_seed_miss(agent):
    """On every seed, join-shortest-queue meets the SLO with its P99 CI below half of it, and round robin misses
    it by more than ten times: the miss is a dispatch effect, not a matter of luck."""
    pools = plans_from_spec(agent, "0-64k:h100x24")
    for seed in SEEDS:
        jsq = simulate_plan(agent, pools, SimOptions(requests=60_000, seed=seed))
        rr = simulate_plan(agent, pools, SimOptions(requests=60_000, seed=seed, dispatch="round-robin"))
        assert jsq.slo_met and jsq.ttft_p99_ci_ms[1] <= 0.5 * SLO_MS, (seed, jsq.ttft_p99_ci_ms)
        assert not rr.slo_met and rr.ttft_p99_ms > 10 * SLO_MS, (seed, rr.ttft_p99_ms)


@pytest.mark.slow
def test_the_two_pool_plan_passes_in_simulation(agent):
    """On every seed the seed's 4,096 / 65,536 split passes, its long pool's P99 below 60 % of the SLO."""
    pools = plans_from_spec(agent, "0-4096:h100,4096-64k:h100")
    for seed in SEEDS:
        sim = simulate_plan(agent, pools, SimOptions(requests=60_000, seed=seed))
        assert sim.slo_met, seed
        short, long_ = sim.pools
        assert short.ttft_p99_ms_sim < long_.ttft_p99_ms_sim < 0.6 * SLO_MS, (seed, long_.ttft_p99_ms_sim)


def test_random_routing_rejects_what_a_short_window_cannot_hold(agent):
    """Random routing between a 4,096-token and a 65,536-token pool sends long prompts to a pool that
    cannot hold them: they are rejected and counted as misses (never silently served)."""
    sim = simulate_plan(agent, plans_from_spec(agent, "0-4096:h100x2,4096-64k:h100x23"),
                        SimOptions(requests=30_000, seed=5, router="random"))
    assert not sim.slo_met and sim.slo_attainment < 0.9


@pytest.mark.slow
def test_least_queue_dispatch_misses_the_slo_like_the_reference_tool(agent):
    """With the reference tool's own dispatch (fewest *waiting* requests, ties to the lowest index) the
    24-unit homogeneous fleet misses the SLO on every seed, as the seed's simulator reports (1,052 ms), though
    by more: measured P99 4,245-4,366 ms, CI lower bounds 4,093-4,257 ms, attainment 71.4-72.2 % on seeds 11-13.
    The bounds asserted (CI lower bound above twice the SLO, attainment below 80 %) leave about half the gap.
    The rule ignores running sequences: a replica with a full batch and an empty queue ties with an idle one
    and wins on its lower index, so a request waits there for a minutes-long agent request to finish."""
    pools = plans_from_spec(agent, "0-64k:h100x24")
    for seed in SEEDS:
        lq = simulate_plan(agent, pools, SimOptions(requests=60_000, seed=seed, dispatch="least-queue"))
        assert not lq.slo_met and lq.ttft_p99_ci_ms[0] > 2 * SLO_MS, (seed, lq.ttft_p99_ci_ms)
        assert lq.slo_attainment < 0.8, (seed, lq.slo_attainment)
