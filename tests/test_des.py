"""The discrete-event simulator against queueing theory, hand-computed iterations and a step-by-step reference.

Statistical checks use independent replications spawned from one SeedSequence
and compare with closed forms inside a confidence interval; no seeded digits
are pinned. Every simulation run here also passes :func:`assert_books_balance`
(Little's law within 1 % and every request accounted for).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
import pytest

from fleetopt.models.power import PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.queueing.erlang import erlang_c
from fleetopt.models.service import iteration_latency_s, prefill_time_s, service_time_s
from fleetopt.models.workload import LengthDistribution, RequestTrace
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.state import CapChange, SimPool
from fleetopt.solvers.des.engine import simulate
from fleetopt.solvers.des.metrics import (
    batch_means_ci,
    e2e_s,
    littles_law,
    percentile,
    quantile_ci,
    replicate,
    replications_ci,
    steady_mask,
    summarize,
    tpot_s,
    ttft_s,
    wait_s,
)
from fleetopt.solvers.des.routing import (
    LengthRouter,
    RandomRouter,
    Requests,
    RoundRobin,
    SplitRouter,
    poisson_arrivals,
    poisson_requests,
    replay_trace,
    sample_lengths,
)

# A profile whose KV cache holds any batch used below (slot counts up to 4096 at a 4K window).
TOY = CalibratedProfile("toy", "toy", 0.004, 0.00032, 8192, 1024, 16, 1 << 20, 4096, 1.0, 1,
                        PowerCurve(100.0, 200.0, 1.0, 3.0, "none"))
ONE_POOL = LengthRouter([0, 1 << 20], ["p"])


def assert_books_balance(res) -> None:
    """Little's law per pool within 1 % and outcomes that add up to the number of requests."""
    L, lam_w = littles_law(res)
    np.testing.assert_allclose(L, lam_w, rtol=0.01, atol=1e-9)
    n = len(res.arrival_at_s)
    assert res.count(Outcome.COMPLETED) + res.count(Outcome.UNFINISHED) + res.count(Outcome.REJECTED) == n
    done = res.outcome == Outcome.COMPLETED
    assert np.all(np.isfinite(res.end_at_s[done])) and np.all(np.isnan(res.end_at_s[~done]))
    assert np.all(res.start_at_s[done] >= res.arrival_at_s[done])
    assert np.all(res.first_token_at_s[done] >= res.start_at_s[done])
    assert np.all(res.end_at_s[done] >= res.first_token_at_s[done])


def mmc_pool(c: int) -> SimPool:
    return SimPool("p", TOY, 1, c, 4096)


def exp_requests(rng, lam: float, n: int, service) -> Requests:
    return Requests(poisson_arrivals(lam, n, rng), np.ones(n, int), np.ones(n, int), service)


# --- slot mode: exact sample paths and queueing theory -------------------------------------------------------


def test_slot_pool_queue_is_the_fcfs_multiserver_recursion():
    rng = np.random.default_rng(np.random.SeedSequence(11))
    n, c = 3000, 3
    req = exp_requests(rng, 2.7, n, rng.gamma(0.5, 2.0, n))
    res = simulate([SimPool("p", TOY, 1, c, 4096)], req, ONE_POOL, mode="slot")
    free_at = [0.0] * c          # Kiefer-Wolfowitz: start = max(arrival, earliest free server)
    start = np.empty(n)
    for i in range(n):
        start[i] = max(req.arrival_at_s[i], free_at[0])
        heapq.heapreplace(free_at, start[i] + req.service_s[i])
    np.testing.assert_array_equal(res.start_at_s, start)
    np.testing.assert_array_equal(res.end_at_s, start + req.service_s)
    # the first token comes after the prefill, or at the end when the given service time is shorter
    np.testing.assert_allclose(res.first_token_at_s, start + np.minimum(prefill_time_s(TOY, 1), req.service_s),
                               rtol=1e-12)
    assert_books_balance(res)


def test_slot_replica_queues_with_round_robin_are_independent_fcfs_queues():
    rng = np.random.default_rng(np.random.SeedSequence(12))
    n, R, c = 2000, 3, 2
    req = exp_requests(rng, 4.0, n, rng.exponential(1.2, n))
    res = simulate([SimPool("p", TOY, R, c, 4096)], req, ONE_POOL, mode="slot", queue="replica",
                   dispatch=RoundRobin())
    np.testing.assert_array_equal(res.replica, np.arange(n) % R)
    for r in range(R):
        idx = np.flatnonzero(np.arange(n) % R == r)
        free_at = [0.0] * c
        for i in idx:
            s = max(req.arrival_at_s[i], free_at[0])
            heapq.heapreplace(free_at, s + req.service_s[i])
            assert res.start_at_s[i] == s
    assert_books_balance(res)


def test_slot_service_time_is_the_analytic_service_time(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(13))
    req = poisson_requests(azure.truncated(4096)[0], 5.0, 500, rng)
    res = simulate([SimPool("p", h100, 2, None, 4096)], req, ONE_POOL, mode="slot")
    np.testing.assert_allclose(res.end_at_s - res.start_at_s,
                               service_time_s(h100, 4096, req.prompt_tokens, req.output_tokens), rtol=1e-9)
    np.testing.assert_allclose(res.first_token_at_s - res.start_at_s, prefill_time_s(h100, req.prompt_tokens),
                               rtol=1e-9)
    assert_books_balance(res)


# Requests per replication (the first 20 % are discarded as warm-up); rho = 0.95 relaxes slowly.
MMC_REQUESTS = {0.5: 10_000, 0.8: 20_000, 0.95: 60_000}
MMC_REPLICATIONS = 10
# 36 comparisons share this file: a 95 % interval would miss by chance about twice per run, so the
# tolerance is the 99.9 % replication interval, and never tighter than 3 % of the theoretical value.
MMC_CONFIDENCE = 0.999
PROB_RESOLUTION = 1e-3  # tail probabilities below 0.1 % are not resolved by runs of this length


@pytest.mark.parametrize("rho", [0.5, 0.8, pytest.param(0.95, marks=pytest.mark.slow)])  # 0.95: 60k-180k requests
@pytest.mark.parametrize("c", [1, 4, 32, 256])
def test_mmc_wait_tail_and_p99_match_erlang_c(c, rho):
    """M/M/c with pool-level FCFS: P(W > t) = C e^{-(c mu - lambda) t} exactly, mu = 1."""
    lam = rho * c
    n = MMC_REQUESTS[rho] * (3 if (c, rho) == (1, 0.95) else 1)
    C = erlang_c(c, lam)
    theta = c - lam
    w99 = math.log(C / 0.01) / theta if C > 0.01 else 0.0

    def run(rng):
        res = simulate([mmc_pool(c)], exp_requests(rng, lam, n, rng.exponential(1.0, n)), ONE_POOL, mode="slot")
        assert_books_balance(res)
        return wait_s(res)[steady_mask(res, 0.2, by="requests")]

    waits = replicate(run, 1000 + c, MMC_REPLICATIONS).results
    for t in (math.log(2) / theta, math.log(10) / theta):
        est = replications_ci([np.mean(w > t) for w in waits], MMC_CONFIDENCE)
        exact = C * math.exp(-theta * t)
        assert abs(est.value - exact) <= max(est.half_width, 0.03 * exact, PROB_RESOLUTION), (t, est, exact)
    q = quantile_ci(waits, 99, MMC_CONFIDENCE)
    assert q.low - 0.03 * w99 <= w99 <= q.high + 0.03 * w99, (q, w99)
    if w99 == 0.0:
        assert q.value == 0.0


def test_md1_mean_wait_is_pollaczek_khinchine():
    rho, n = 0.8, 40_000
    lam = rho  # deterministic service of 1 s

    def run(rng):
        res = simulate([mmc_pool(1)], exp_requests(rng, lam, n, np.ones(n)), ONE_POOL, mode="slot")
        assert_books_balance(res)
        return float(np.mean(wait_s(res)[steady_mask(res, 0.2, by="requests")]))

    est = replications_ci(replicate(run, 21, 10).results, 0.99)
    exact = rho**2 / (2 * lam * (1 - rho))
    assert abs(est.value - exact) <= max(est.half_width, 0.03 * exact), (est, exact)


# --- iteration mode -----------------------------------------------------------------------------------------


def test_iteration_single_request_by_hand(h100):
    # W = 4 ms, H = 0.32 ms at B_cal = 8192, chunk 1024; l_in = 2500 -> 3 chunks, l_out = 100.
    W, h = 0.004, 0.00032 / 8192
    req = Requests(np.array([1.5]), np.array([2500]), np.array([100]))
    res = simulate([SimPool("p", h100, 1, None, 4096)], req, ONE_POOL, mode="iteration")
    # prefill iterations start with 0, 1024, 2048 tokens in the KV cache: t(1, x) = W + h x
    ttft = 3 * W + h * (0 + 1024 + 2048)
    assert ttft == pytest.approx(sum(float(iteration_latency_s(h100, 1, x)) for x in (0, 1024, 2048)), rel=1e-12)
    # 100 decode iterations start with 2500, 2501, ..., 2599 tokens
    decode = 100 * W + h * (100 * 2500 + 99 * 100 / 2)
    assert res.start_at_s[0] == 1.5
    assert res.first_token_at_s[0] - 1.5 == pytest.approx(ttft, rel=1e-12)
    assert res.end_at_s[0] - res.first_token_at_s[0] == pytest.approx(decode, rel=1e-12)
    # 3 + 100 iterations in all, each at least W and at most t(1, 2600)
    assert 103 * W < res.end_at_s[0] - 1.5 < 103 * float(iteration_latency_s(h100, 1, 2600))
    # power: P(1) while serving, idle power before; the window is [0, end]
    busy = res.end_at_s[0] - 1.5
    assert res.replica_energy_j[0] == pytest.approx(h100.power.power_w(1) * busy + h100.power.power_w(0) * 1.5)
    assert tpot_s(res)[0] == pytest.approx(decode / 99, rel=1e-12)
    assert_books_balance(res)


def test_iteration_arrival_joins_at_the_next_boundary(h100):
    W, h = 0.004, 0.00032 / 8192
    # A: 1 chunk then 50 decodes, alone from t = 0. B arrives during A's third decode iteration.
    boundaries = np.cumsum([W] + [W + h * (1000 + d) for d in range(50)])
    arrive_b = (boundaries[2] + boundaries[3]) / 2
    req = Requests(np.array([0.0, arrive_b]), np.array([1000, 10]), np.array([50, 5]))
    res = simulate([SimPool("p", h100, 1, None, 4096)], req, ONE_POOL, mode="iteration")
    assert res.start_at_s[1] == pytest.approx(boundaries[3], rel=1e-12)
    # B's only prefill iteration shares the batch with A (contexts 1003 and 0)
    assert res.first_token_at_s[1] == pytest.approx(boundaries[3] + W + h * 1003, rel=1e-12)
    assert_books_balance(res)


def assert_replicas_match(res, req, R: int, reference) -> None:
    """Round-robin dispatch over ``R`` replicas: replica ``r`` serves requests ``r, r + R, ...``, so each replica's
    (start, first token, end) columns must equal ``reference(idx)``'s for its request indices ``idx``."""
    n = len(req)
    for r in range(R):
        idx = np.flatnonzero(np.arange(n) % R == r)
        for got, want in zip((res.start_at_s, res.first_token_at_s, res.end_at_s), reference(idx)):
            np.testing.assert_allclose(got[idx], want, rtol=1e-9)


def step_reference(arrival, l_in, l_out, W, h, chunk, cap, changes=()):
    """One replica, one iteration at a time: the definition the closed-form engine must reproduce.

    ``changes``: ``(at_s, cap)`` pairs; a boundary at ``t`` admits up to the cap of the last change at or before
    ``t`` (running sequences are never preempted for a cap)."""
    n = len(arrival)
    start, first, end = (np.full(n, np.nan) for _ in range(3))
    t, nxt, waiting, running = 0.0, 0, deque(), []
    while nxt < n or waiting or running:
        if not running and not waiting:
            t = max(t, arrival[nxt])
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        cap_t = cap
        for at, c in changes:
            if at <= t:
                cap_t = c
        while waiting and len(running) < cap_t:
            i = waiting.popleft()
            start[i] = t
            k = math.ceil(l_in[i] / chunk)
            if k == 0:
                first[i] = t
            running.append([i, k, 0, 0])          # request, chunks left, tokens decoded, context
        t += W + h * sum(s[3] for s in running)
        still = []
        for s in running:
            i = s[0]
            if s[1] > 0:
                s[1] -= 1
                s[3] += chunk
                if s[1] == 0:
                    s[3] = l_in[i]
                    first[i] = t
                    if l_out[i] == 0:
                        end[i] = t
                        continue
            else:
                s[2] += 1
                s[3] += 1
                if s[2] == l_out[i]:
                    end[i] = t
                    continue
            still.append(s)
        running = still
    return start, first, end


@pytest.mark.parametrize("cap", [1, 3, 16])
def test_iteration_closed_form_matches_step_by_step_reference(cap):
    profile = CalibratedProfile("small", "toy", 0.01, 0.004, 512, 64, 16, 1 << 16, 512, 1.0, 1,
                                PowerCurve(50.0, 100.0, 1.0, 2.0, "none"))
    rng = np.random.default_rng(np.random.SeedSequence(31 + cap))
    n, R = 600, 2
    l_in = rng.integers(0, 300, n)
    l_out = rng.integers(0, 40, n)
    l_out[l_in == 0] = np.maximum(l_out[l_in == 0], 1)
    req = Requests(poisson_arrivals(12.0, n, rng), l_in, l_out)
    res = simulate([SimPool("p", profile, R, cap, 512)], req, ONE_POOL, mode="iteration", dispatch=RoundRobin())
    W, h = 0.01, 0.004 / 512
    assert_replicas_match(res, req, R, lambda idx: step_reference(req.arrival_at_s[idx], l_in[idx], l_out[idx], W,
                                                                  h, 64, cap))
    assert np.any(wait_s(res) > 0)   # the batch cap made requests wait
    assert_books_balance(res)


@pytest.mark.parametrize("changes", [((0.0, 2),), ((5.0, 1), (9.0, 6)), ((3.0, 8), (4.0, 2), (4.0, 3))])
def test_cap_changes_match_the_step_by_step_reference(changes):
    # A lowered cap drains the batch (no preemption), a raised one admits at the next boundary: the engine's
    # event-to-event jumps must reproduce the iteration-by-iteration definition with the cap read at each boundary.
    profile = CalibratedProfile("small", "toy", 0.01, 0.004, 512, 64, 16, 1 << 16, 512, 1.0, 1,
                                PowerCurve(50.0, 100.0, 1.0, 2.0, "none"))
    rng = np.random.default_rng(np.random.SeedSequence(57))
    n, R, cap = 500, 2, 8
    l_in = rng.integers(0, 300, n)
    l_out = rng.integers(1, 40, n)
    req = Requests(poisson_arrivals(40.0, n, rng), l_in, l_out)
    res = simulate([SimPool("p", profile, R, cap, 512)], req, ONE_POOL, mode="iteration", dispatch=RoundRobin(),
                   cap_changes=[CapChange(at, "p", c) for at, c in changes])
    W, h = 0.01, 0.004 / 512
    assert_replicas_match(res, req, R, lambda idx: step_reference(req.arrival_at_s[idx], l_in[idx], l_out[idx], W,
                                                                  h, 64, cap, changes))
    assert_books_balance(res)


def test_cap_change_at_zero_is_the_pool_configured_with_that_cap(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(43))
    req = poisson_requests(azure.truncated(4096)[0], 30.0, 3000, rng)
    fixed = simulate([SimPool("p", h100, 3, 6, 4096)], req, ONE_POOL)
    changed = simulate([SimPool("p", h100, 3, None, 4096)], req, ONE_POOL, cap_changes=[CapChange(0.0, "p", 6)])
    for col in ("start_at_s", "first_token_at_s", "end_at_s", "replica"):
        np.testing.assert_array_equal(getattr(fixed, col), getattr(changed, col))
    np.testing.assert_array_equal(fixed.pool_mean_power_w, changed.pool_mean_power_w)


def test_lowered_cap_keeps_the_past_and_drains_without_preemption(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(47))
    req = poisson_requests(azure.truncated(4096)[0], 60.0, 6000, rng)
    pool, t0, n = SimPool("p", h100, 2, None, 4096), 40.0, 4
    base = simulate([pool], req, ONE_POOL)
    cut = simulate([pool], req, ONE_POOL, cap_changes=[CapChange(t0, "p", n)])
    before = base.start_at_s < t0
    np.testing.assert_array_equal(base.start_at_s[before], cut.start_at_s[before])    # the past is untouched
    np.testing.assert_array_equal(base.replica[before], cut.replica[before])
    # nobody admitted before t0 is preempted: each is still served, once, without a gap in its record
    assert np.all(np.isfinite(cut.end_at_s[before]))
    # after the change an admission happens only into a batch below the new cap
    for r in range(2):
        mine = cut.replica == r
        s, e = cut.start_at_s[mine], cut.end_at_s[mine]
        for at in np.unique(s[s >= t0]):
            assert np.sum((s <= at) & (e > at)) <= n
    assert np.any(base.start_at_s[~before] < cut.start_at_s[~before])                # the cap made them wait


def test_cap_changes_are_checked():
    pool = SimPool("p", TOY, 1, 4, 4096)
    req = Requests(np.array([0.0]), np.array([10]), np.array([5]), np.array([1.0]))
    with pytest.raises(ValueError, match="mode='iteration'"):
        simulate([pool], req, ONE_POOL, mode="slot", cap_changes=[CapChange(1.0, "p", 2)])
    req = Requests(np.array([0.0]), np.array([10]), np.array([5]))
    with pytest.raises(ValueError, match="unknown pool 'q'"):
        simulate([pool], req, ONE_POOL, cap_changes=[CapChange(1.0, "q", 2)])
    with pytest.raises(ValueError, match="above the pool's configured 4"):
        simulate([pool], req, ONE_POOL, cap_changes=[CapChange(1.0, "p", 5)])
    for bad in (dict(at_s=-1.0, max_num_seqs=2), dict(at_s=math.inf, max_num_seqs=2), dict(at_s=1.0, max_num_seqs=0),
                dict(at_s=1.0, max_num_seqs=2.5)):
        with pytest.raises(ValueError, match="cap change of pool 'p'"):
            CapChange(pool="p", **bad)


def test_iteration_batch_never_exceeds_the_cap_under_overload(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(41))
    req = poisson_requests(azure.truncated(4096)[0], 40.0, 4000, rng)
    res = simulate([SimPool("p", h100, 2, 8, 4096)], req, ONE_POOL, mode="iteration", horizon_s=60.0)
    assert np.all(res.replica_mean_batch <= 8.0)
    assert np.all(res.replica_mean_batch > 7.0)       # saturated
    assert res.count(Outcome.UNFINISHED) > 0 and res.count(Outcome.COMPLETED) > 0
    assert np.all(np.isnan(res.end_at_s[res.outcome == Outcome.UNFINISHED]))
    assert_books_balance(res)


def test_iteration_light_load_p99_ttft_near_the_analytic_tail_model(h100, azure):
    from fleetopt.models.fleet import PoolPlan, ServiceLevel, evaluate_fleet

    dist = azure.truncated(8192)[0]
    lam, replicas = 5.0, 4
    analytic = evaluate_fleet([PoolPlan(0, 8192, "H100", h100, replicas=replicas)], dist, lam,
                              ServiceLevel(1.0)).pools[0]
    pools = [SimPool("p", h100, replicas, None, 8192)]

    def run(rng):
        res = simulate(pools, poisson_requests(dist, lam, 10_000, rng), ONE_POOL, mode="iteration")
        assert_books_balance(res)
        return ttft_s(res)[steady_mask(res, 0.1) & (res.outcome == Outcome.COMPLETED)]

    q = quantile_ci(replicate(run, 51, 3).results, 99)
    assert q.value == pytest.approx(analytic.ttft_p99_ms / 1000.0, rel=0.20)


# --- bookkeeping, routing and determinism --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["slot", "iteration"])
@pytest.mark.parametrize("horizon_s", [None, 30.0])
def test_two_pools_conservation_littles_law_and_rejections(mode, horizon_s, h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(61))
    base = poisson_requests(azure.truncated(8192)[0], 60.0, 3000, rng)
    output = base.output_tokens.copy()
    output[[5, 17]] += 9000      # longer than the long pool's 8192-token window: that pool rejects them
    output[30] += 20000          # beyond every router boundary: no pool takes it
    req = Requests(base.arrival_at_s, base.prompt_tokens, output)
    long = req.total_tokens > 8192
    pools = [SimPool("short", h100, 2, None, 4096), SimPool("long", h100, 3, None, 8192)]
    router = LengthRouter([0, 4096, 16384], ["short", "long"])
    res = simulate(pools, req, router, mode=mode, horizon_s=horizon_s, warmup_s=5.0)
    assert_books_balance(res)
    np.testing.assert_array_equal(res.outcome == Outcome.REJECTED, long)
    np.testing.assert_array_equal(res.pool, np.where(req.total_tokens > 16384, -1, (req.total_tokens > 4096)))
    if horizon_s is None:
        assert res.count(Outcome.UNFINISHED) == 0
        plain = simulate(pools, req, router, mode=mode)
        done = plain.outcome == Outcome.COMPLETED
        for p in range(2):  # drained from t = 0: L = (n / T) x mean sojourn
            sel = done & (plain.pool == p)
            assert plain.pool_mean_in_system[p] == pytest.approx(
                sel.sum() / plain.window_end_s * np.mean(e2e_s(plain)[sel]), rel=0.01)
    else:
        assert res.count(Outcome.UNFINISHED) > 0
        assert np.all(res.first_token_at_s[np.isfinite(res.first_token_at_s)] <= horizon_s)
    rec = res.record(30)
    assert rec.outcome is Outcome.REJECTED and rec.start_at_s is None and rec.pool is None
    assert res.record(5).pool == 1 and res.record(5).end_at_s is None
    assert 0 < res.pool_utilization[0] < 1 and np.all(res.pool_mean_power_w > 0)


def _run_random(rng, mode):
    dist = LengthDistribution.from_cdf([(512, 0.5), (4096, 1.0)])
    req = poisson_requests(dist, 30.0, 2000, rng)
    router = RandomRouter({"a": 1.0, "b": 2.0}, rng)
    pools = [SimPool("a", TOY, 2, 64, 4096), SimPool("b", TOY, 3, 64, 4096)]
    return simulate(pools, req, router, mode=mode)


@pytest.mark.parametrize("mode", ["slot", "iteration"])
def test_same_seed_same_arrays_other_seed_differs(mode):
    a, b, c = (_run_random(np.random.default_rng(np.random.SeedSequence(s)), mode) for s in (7, 7, 8))
    for name in ("arrival_at_s", "start_at_s", "first_token_at_s", "end_at_s", "pool", "replica", "outcome",
                 "replica_energy_j", "pool_mean_in_system"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert not np.array_equal(a.end_at_s, c.end_at_s, equal_nan=True)
    assert_books_balance(a)


def test_routers_follow_their_definitions():
    rng = np.random.default_rng(np.random.SeedSequence(71))
    lr = LengthRouter([0, 100, 200], ["x", "y"])
    assert lr.route(np.array([50, 50, 150, 0]), np.array([50, 51, 50, 0])).tolist() == [0, 1, 1, -1]
    merged = LengthRouter([0, 100, 200, 300], ["x", "y", "x"])
    assert merged.pool_names == ("x", "y")
    assert merged.route(np.array([250]), np.array([0])).tolist() == [0]
    n = 200_000
    share = np.bincount(RandomRouter({"a": 1.0, "b": 0.0, "c": 3.0}, rng).route(np.ones(n), np.ones(n)),
                        minlength=3) / n
    np.testing.assert_allclose(share, [0.25, 0.0, 0.75], atol=0.005)
    sr = SplitRouter([0, 100, 200], ["p", "q"], [[1.0, 0.0], [1.0, 1.0]], rng)
    tot = rng.integers(1, 200, n)
    got = sr.route(tot, np.zeros(n, int))
    assert np.all(got[tot <= 100] == 0)
    assert np.mean(got[tot > 100]) == pytest.approx(0.5, abs=0.01)


def test_invalid_input_raises_naming_the_field():
    req = Requests(np.array([0.0]), np.array([10]), np.array([10]))
    pool = SimPool("p", TOY, 1, 4, 4096)
    with pytest.raises(ValueError, match="mode"):
        simulate([pool], req, ONE_POOL, mode="fluid")
    with pytest.raises(ValueError, match="unknown pools"):
        simulate([pool], req, LengthRouter([0, 10], ["nope"]))
    with pytest.raises(ValueError, match="service_s"):
        simulate([pool], Requests(np.array([0.0]), np.array([1]), np.array([1]), np.array([1.0])), ONE_POOL)
    with pytest.raises(ValueError, match="max_num_seqs"):
        SimPool("p", TOY, 1, 10**6, 4096)
    with pytest.raises(ValueError, match=r"arrival_at_s\[1\]"):
        Requests(np.array([1.0, 0.5]), np.array([1, 1]), np.array([1, 1]))
    with pytest.raises(ValueError, match="queue"):
        simulate([pool], req, ONE_POOL, mode="iteration", queue="pool")


def test_request_streams(azure):
    rng = np.random.default_rng(np.random.SeedSequence(81))
    t = poisson_arrivals(50.0, 100_000, rng)
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(50.0, rel=0.02)
    prompt, output = sample_lengths(azure, 50_000, rng)
    total = prompt + output
    assert prompt.min() >= 1 and output.min() >= 1
    assert total.max() <= 16384 and np.mean(total) == pytest.approx(azure.mean_tokens, rel=0.02)
    assert np.mean(prompt) / np.mean(total) == pytest.approx(0.8, abs=0.01)
    trace = RequestTrace(np.array([10.0, 11.0, 13.0, 14.0]), np.array([5, 6, 7, 8]), np.array([1, 2, 3, 4]))
    rep = replay_trace(trace, rate_req_per_s=1.5)   # own rate: 3 gaps in 4 s
    np.testing.assert_allclose(rep.arrival_at_s, [0.0, 0.5, 1.5, 2.0])
    p, o = sample_lengths(trace, 1000, rng)
    assert set(zip(p.tolist(), o.tolist())) <= {(5, 1), (6, 2), (7, 3), (8, 4)}


def test_metrics_helpers():
    assert float(percentile([3.0, 1.0, 2.0, 4.0], 50)) == 2.0
    with pytest.raises(ValueError):
        percentile([1.0, np.nan], 50)
    rng = np.random.default_rng(np.random.SeedSequence(91))
    groups = [rng.exponential(1.0, 20_000) for _ in range(10)]
    q = quantile_ci(groups, 99, 0.999)
    assert q.low <= math.log(100) <= q.high and q.high - q.low < 0.5
    b = batch_means_ci(np.concatenate(groups), 99, 20, 0.999)
    assert b.low <= math.log(100) <= b.high
    rng2 = np.random.default_rng(np.random.SeedSequence(92))
    res = simulate([SimPool("p", TOY, 1, 2, 4096)], exp_requests(rng2, 1.0, 5000, rng2.exponential(1.0, 5000)),
                   ONE_POOL, mode="slot", horizon_s=4000.0)
    s = summarize(res, steady_mask(res, 0.1), ttft_slo_s=1.0)
    assert s.n_requests == s.n_completed + s.n_unfinished + s.n_rejected
    assert s.ttft.p50_s <= s.ttft.p90_s <= s.ttft.p99_s
    assert 0.0 < s.slo_attainment < 1.0
    assert_books_balance(res)


@pytest.mark.parametrize("mode", ["iteration", "slot"])
def test_arrivals_streamed_in_chunks_give_the_same_run(h100, azure, monkeypatch, mode):
    """The engine reads arrivals a chunk at a time; the chunk size must not change a single bit of the result.

    Small chunks put chunk boundaries everywhere, including chunks with no accepted request (rejected
    lengths) and a horizon in the middle of a chunk.
    """
    import fleetopt.solvers.des.engine as des

    rng = np.random.default_rng(np.random.SeedSequence(77))
    req = poisson_requests(azure, 60.0, 3000, rng)
    router = LengthRouter([0, 1024, 4096], ["short", "long"])     # longer requests are rejected
    pools = [SimPool("short", h100, 2, None, 1024), SimPool("long", h100, 2, None, 4096)]
    fields = ("arrival_at_s", "start_at_s", "first_token_at_s", "end_at_s", "prompt_tokens", "output_tokens",
              "pool", "replica", "outcome", "pool_mean_in_system", "pool_busy_slot_s", "replica_mean_batch",
              "replica_energy_j")
    for horizon in (None, 30.0):
        runs = []
        for chunk in (des._CHUNK, 1, 7, 64):
            monkeypatch.setattr(des, "_CHUNK", chunk)
            runs.append(simulate(pools, req, router, mode=mode, horizon_s=horizon))
        base = runs[0]
        assert base.count(Outcome.REJECTED) > 0
        for res in runs[1:]:
            assert res.events == base.events and res.window_end_s == base.window_end_s
            for f in fields:
                a, b = getattr(base, f), getattr(res, f)
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True), f
        for f in fields:
            assert not getattr(base, f).flags.writeable
        assert base.start_at_s.dtype == np.float64 and base.replica.dtype == np.int64
        assert_books_balance(base)


# --- KV blocks and preemption (overcommitted pools, iteration mode) --------------------------------------------


def kv_profile(blocks: int, blk: int = 4, chunk: int = 4) -> CalibratedProfile:
    # W = 1 s, h = H / B_cal = 1/64 s per token: every time below is a dyadic rational, exact in floating point
    return CalibratedProfile("kv", "toy", 1.0, 1.0, 64, chunk, blk, blocks, 1 << 12, 1.0, 1,
                             PowerCurve(50.0, 100.0, 1.0, 2.0, "none"))


def test_overcommit_is_opt_in_and_iteration_only():
    prof = kv_profile(4)                      # a 16-token window needs 4 blocks: one sequence
    with pytest.raises(ValueError, match="max_num_seqs"):
        SimPool("p", prof, 1, 2, 16)
    pool = SimPool("p", prof, 1, 2, 16, allow_overcommit=True)
    assert pool.overcommitted and not SimPool("p", prof, 1, 1, 16, allow_overcommit=True).overcommitted
    req = Requests(np.array([0.0]), np.array([4]), np.array([5]))
    with pytest.raises(ValueError, match="slot"):
        simulate([pool], req, ONE_POOL, mode="slot")


def test_preemption_by_hand():
    # 4 blocks of 4 tokens, chunk 4, two sequences allowed (one fits a 16-token window): A and B arrive at 0
    # with l_in = 4, l_out = 5. A sequence holds ceil(KV tokens after its step / 4) blocks.
    W, h = 1.0, 1.0 / 64
    pool = SimPool("p", kv_profile(4), 1, 2, 16, allow_overcommit=True)
    req = Requests(np.array([0.0, 0.0]), np.array([4, 4]), np.array([5, 5]))
    res = simulate([pool], req, ONE_POOL, mode="iteration")
    # iteration 0: both prefill (1 block each), contexts 0 + 0; both first tokens at t1
    t1 = W
    # iterations 1-4: both decode at contexts 4..7 (2 blocks each: 4 in use, the budget)
    t5 = t1 + sum(W + h * 2 * x for x in range(4, 8))
    # at t5 A's decode at context 8 needs a 3rd block: none free, so B (admitted last) is preempted after
    # 4 decode steps; iteration 5: A alone at context 8, and A completes (1 prefill + 5 decodes)
    t6 = t5 + W + h * 8
    # B is readmitted at t6 and recomputes its 4 + 4 = 8 tokens in two chunks (contexts 0, 4), then its
    # last decode step at context 8
    t9 = t6 + (W + h * 0) + (W + h * 4) + (W + h * 8)
    assert (t1, t5, t6, t9) == (1.0, 5.6875, 6.8125, 10.0)
    assert res.end_at_s.tolist() == [t6, t9]
    assert res.first_token_at_s.tolist() == [t1, t1]      # B keeps the first token it already produced
    assert res.start_at_s.tolist() == [0.0, 0.0]           # and its first admission
    assert res.preemptions.tolist() == [1] and res.replica_preemptions.tolist() == [1]
    assert_books_balance(res)
    # with blocks to spare nobody is preempted: both complete after 6 iterations
    roomy = simulate([SimPool("p", kv_profile(8), 1, 2, 16, allow_overcommit=True)], req, ONE_POOL)
    assert roomy.end_at_s.tolist() == [t5 + W + h * 16] * 2 and roomy.preemptions.tolist() == [0]


def step_reference_kv(arrival, l_in, l_out, W, h, chunk, cap, blk, budget, g=0.0, terms=None, parts=None):
    """:func:`step_reference` with KV blocks: admission needs the first step's blocks, a step needing a block
    when none is free preempts the most recently admitted sequence (recompute), no admissions in that step.

    Compute terms: a decode step costs ``g`` more, prefill chunk j of a prompt of L tokens ``alpha + beta j`` with
    ``(alpha, beta) = terms(L)`` (L the prefill as it is now: a recompute prefills the prompt and the tokens
    decoded). ``parts``, if given, accumulates the run's weights, KV-scan and compute seconds."""
    n = len(arrival)
    start, first, end = (np.full(n, np.nan) for _ in range(3))
    L, lo = [int(x) for x in l_in], [int(x) for x in l_out]
    t, nxt, waiting, running, used, preemptions = 0.0, 0, deque(), [], 0, 0

    def need(s):                      # s = [request, step, chunks, blocks held]
        i, j, k = s[0], s[1], s[2]
        return -(-min((j + 1) * chunk, L[i]) // blk) if j < k else -(-(L[i] + j - k + 1) // blk)

    while nxt < n or waiting or running:
        if not running and not waiting:
            t = max(t, arrival[nxt])
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        preempted = False
        for s in list(running):       # oldest first
            if s not in running:
                continue
            want = need(s) - s[3]
            while budget - used < want:
                v = running.pop()
                used -= v[3]
                preemptions += 1
                preempted = True
                if v[1] >= v[2]:      # decoded d steps: recompute l_in + d tokens, d fewer left
                    d = v[1] - v[2]
                    L[v[0]] += d
                    lo[v[0]] -= d
                waiting.appendleft(v[0])
                if v is s:
                    break
            if s in running:
                used += want
                s[3] += want
        if not preempted:
            while waiting and len(running) < cap:
                i = waiting[0]
                s = [i, 0, -(-L[i] // chunk), 0]
                nb = need(s)
                if budget - used < nb:
                    break
                waiting.popleft()
                s[3] = nb
                used += nb
                if math.isnan(start[i]):
                    start[i] = t
                running.append(s)
        assert used == sum(s[3] for s in running) <= budget
        kv = h * sum(s[1] * chunk if s[1] < s[2] else L[s[0]] + s[1] - s[2] for s in running)
        comp = 0.0
        for s in running:
            if s[1] >= s[2]:
                comp += g
            elif terms is not None:
                a, b = terms(L[s[0]])
                comp += a + b * s[1]
        t += W + kv + comp
        if parts is not None and running:
            parts[0] += W
            parts[1] += kv
            parts[2] += comp
        still = []
        for s in running:
            s[1] += 1
            i = s[0]
            if s[1] == s[2] and math.isnan(first[i]):
                first[i] = t
            if s[1] == s[2] + lo[i]:
                end[i] = t
                used -= s[3]
                continue
            still.append(s)
        running = still
    return start, first, end, preemptions


@pytest.mark.parametrize("cap,blocks,blk,chunk,lam", [
    (4, 40, 16, 64, 4.0), (6, 30, 16, 16, 4.0), (3, 40, 8, 20, 4.0),
    # blocks to spare most of the time, so crossings are settled in bulk between rare shortages
    (12, 120, 16, 64, 30.0), (32, 200, 16, 64, 60.0)])
@pytest.mark.parametrize("with_probe", [True, False])   # the probe settles every crossing: the run without it too
def test_preemption_matches_step_by_step_reference(cap, blocks, blk, chunk, lam, with_probe, monkeypatch):
    import fleetopt.solvers.des.kv as des_kv

    window = 256
    profile = CalibratedProfile("kv", "toy", 0.01, 0.004, 512, chunk, blk, blocks, 512, 1.0, 1,
                                PowerCurve(50.0, 100.0, 1.0, 2.0, "none"))
    seen = []

    def probe(r, used, budget, held, needed):     # block conservation, checked at every block change
        assert used == sum(held) <= budget and held == needed
        seen.append(used)

    if with_probe:
        monkeypatch.setattr(des_kv, "_block_probe", probe)
    rng = np.random.default_rng(np.random.SeedSequence(97 + cap))
    n, R = 500, 2
    l_in = rng.integers(1, 160, n)
    l_out = rng.integers(1, 96, n)
    req = Requests(poisson_arrivals(lam, n, rng), l_in, l_out)
    pool = SimPool("p", profile, R, cap, window, allow_overcommit=True)
    assert pool.overcommitted
    res = simulate([pool], req, ONE_POOL, mode="iteration", dispatch=RoundRobin())
    W, h = 0.01, 0.004 / 512
    total = 0
    for r in range(R):
        idx = np.flatnonzero(np.arange(n) % R == r)
        *ref, pre = step_reference_kv(req.arrival_at_s[idx], l_in[idx], l_out[idx], W, h, chunk, cap, blk, blocks)
        for got, want in zip((res.start_at_s, res.first_token_at_s, res.end_at_s), ref):
            np.testing.assert_allclose(got[idx], want, rtol=1e-9)
        assert res.replica_preemptions[r] == pre
        total += pre
    assert res.preemptions.tolist() == [total] and total > 0
    assert not with_probe or (seen and max(seen) <= blocks)
    assert res.count(Outcome.COMPLETED) == n
    assert_books_balance(res)


@pytest.mark.parametrize("cap,blocks,blk,chunk", [(4, 40, 16, 64), (6, 30, 16, 16)])
def test_preemption_with_compute_terms_and_activity_power_matches_the_reference(cap, blocks, blk, chunk):
    # The per-sequence decode compute g, the prefill compute a P + b P^2 split over the chunks (a recompute pays
    # for its longer prefill) and the activity power's energy, under KV preemption.
    from dataclasses import replace

    from fleetopt.models.power import ActivityPower
    from fleetopt.models.service import prefill_compute_terms

    window = 256
    base = CalibratedProfile("kv", "toy", 0.01, 0.004, 512, chunk, blk, blocks, 512, 1.0, 1,
                             PowerCurve(50.0, 100.0, 1.0, 2.0, "none"), g_s=2e-4, prefill_a_s=3e-5, prefill_b_s=4e-8)
    profile = replace(base, power=ActivityPower(idle_w=70.0, limit_w=1e6, weights_w=400.0, kv_w=700.0,
                                                compute_w=800.0))
    rng = np.random.default_rng(np.random.SeedSequence(197 + cap))
    n = 300
    l_in = rng.integers(1, 160, n)
    l_out = rng.integers(1, 96, n)
    req = Requests(poisson_arrivals(3.0, n, rng), l_in, l_out)
    res = simulate([SimPool("p", profile, 1, cap, window, allow_overcommit=True)], req, ONE_POOL)

    def terms(tokens):
        a, b = prefill_compute_terms(profile, tokens)
        return float(a), float(b)

    parts = [0.0, 0.0, 0.0]
    *ref, pre = step_reference_kv(req.arrival_at_s, l_in, l_out, 0.01, 0.004 / 512, chunk, cap, blk, blocks,
                                  g=2e-4, terms=terms, parts=parts)
    for got, want in zip((res.start_at_s, res.first_token_at_s, res.end_at_s), ref):
        np.testing.assert_allclose(got, want, rtol=1e-9)
    assert res.preemptions.tolist() == [pre] and pre > 0
    idle = float(np.nanmax(ref[2])) - sum(parts)
    assert res.replica_energy_j[0] == pytest.approx(70.0 * idle + 400.0 * parts[0] + 700.0 * parts[1]
                                                    + 800.0 * parts[2], rel=1e-9)
    assert_books_balance(res)


@pytest.mark.parametrize("horizon_s", [None, 40.0])
def test_preemption_keeps_books_balanced_under_overload(h100, azure, horizon_s):
    rng = np.random.default_rng(np.random.SeedSequence(43))
    req = poisson_requests(azure.truncated(8192)[0], 40.0, 3000, rng)
    slots = int(h100.n_slots(8192))
    pools = [SimPool("p", h100, 1, 3 * slots, 8192, allow_overcommit=True)]
    res = simulate(pools, req, ONE_POOL, mode="iteration", horizon_s=horizon_s, warmup_s=2.0)
    assert res.preemptions[0] > 0
    assert np.all(res.replica_mean_batch <= 3 * slots)
    assert_books_balance(res)


@pytest.mark.parametrize("mode", ["slot", "iteration"])
def test_no_preemption_without_overcommit(mode, h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(45))
    req = poisson_requests(azure.truncated(8192)[0], 60.0, 3000, rng)
    pools = [SimPool("short", h100, 2, None, 4096), SimPool("long", h100, 3, None, 8192, allow_overcommit=True)]
    res = simulate(pools, req, LengthRouter([0, 4096, 8192], ["short", "long"]), mode=mode)
    assert res.preemptions.tolist() == [0, 0] and res.replica_preemptions.tolist() == [0] * 5
    assert_books_balance(res)
