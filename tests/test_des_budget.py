"""The shared per-iteration token budget (``SimPool.max_batched_tokens``) against a step-by-step reference.

The reference below allocates the budget explicitly, iteration by iteration, as
the module docstring of :mod:`fleetopt.solvers.des.engine` ("Token budget") states it; the
engine jumps from event to event in closed form and must land on the same
instants.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from fleetopt.models.power import PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.state import SimPool
from fleetopt.solvers.des.engine import simulate
from fleetopt.solvers.des.metrics import steady_mask, ttft_s
from fleetopt.solvers.des.routing import LengthRouter, Requests, RoundRobin, poisson_arrivals, poisson_requests
from tests.test_des import ONE_POOL, assert_books_balance, assert_replicas_match, kv_profile

SMALL = CalibratedProfile("small", "toy", 0.01, 0.004, 512, 64, 16, 1 << 16, 512, 1.0, 1,
                          PowerCurve(50.0, 100.0, 1.0, 2.0, "none"))


def step_reference_budget(arrival, l_in, l_out, W, h, chunk, cap, budget, g=0.0, a=0.0, b=0.0, parts=None):
    """One replica, one iteration at a time, with the token budget granted explicitly every iteration.

    A running sequence is [request, tokens in its KV cache]; it decodes once its prompt is in. Each
    iteration: decodes are granted one token each, then prefills (oldest admission first)
    min(chunk, prompt left, budget left); then waiting requests are admitted while a place and budget are
    left. The iteration lasts W + h x (KV tokens of the sequences granted tokens), and then every sequence
    adds its grant to its KV cache.

    Compute terms: a decode grant costs ``g`` more, a prefill grant of x tokens at prefix p costs
    ``a x + b ((p + x)^2 - p^2)``. ``parts``, if given, accumulates the weights, KV-scan and compute seconds.
    """
    n = len(arrival)
    start, first, end = (np.full(n, np.nan) for _ in range(3))
    t, nxt, waiting, running = 0.0, 0, deque(), []
    while nxt < n or waiting or running:
        if not running and not waiting:
            t = max(t, arrival[nxt])
        while nxt < n and arrival[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        grant = [1 if kv >= l_in[i] else 0 for i, kv in running]
        left = budget - sum(grant)
        for k, (i, kv) in enumerate(running):
            if kv < l_in[i]:
                grant[k] = min(chunk, l_in[i] - kv, left)
                left -= grant[k]
        while waiting and len(running) < cap and left > 0:
            i = waiting.popleft()
            start[i] = t
            if l_in[i] == 0:
                first[i] = t
            running.append([i, 0])
            grant.append(min(chunk, l_in[i], left) if l_in[i] else 1)
            left -= grant[-1]
        assert left >= 0
        kv_s = h * sum(kv for (i, kv), x in zip(running, grant) if x)
        comp = sum((g if kv >= l_in[i] else a * x + b * ((kv + x) ** 2 - kv ** 2))
                   for (i, kv), x in zip(running, grant) if x)
        t += W + kv_s + comp
        if parts is not None and running:
            parts[0] += W
            parts[1] += kv_s
            parts[2] += comp
        for s, x in zip(running, grant):
            i, before = s[0], s[1]
            s[1] += x
            if before < l_in[i] == s[1]:
                first[i] = t                        # this iteration wrote the last prompt token
            if s[1] == l_in[i] + l_out[i]:
                end[i] = t
        running = [s for s in running if s[1] < l_in[s[0]] + l_out[s[0]]]
    return start, first, end


@pytest.mark.parametrize("cap,budget", [(1, 1), (1, 40), (3, 3), (3, 100), (16, 16), (16, 150), (16, 16 * 64 - 1)])
def test_budget_matches_step_by_step_reference(cap, budget):
    rng = np.random.default_rng(np.random.SeedSequence([53, cap, budget]))
    n, R = 300, 2
    l_in = rng.integers(0, 300, n)
    l_out = rng.integers(0, 40, n)
    l_out[l_in == 0] = np.maximum(l_out[l_in == 0], 1)
    req = Requests(poisson_arrivals(6.0, n, rng), l_in, l_out)
    pool = SimPool("p", SMALL, R, cap, 512, max_batched_tokens=budget)
    assert pool.budget_binds
    res = simulate([pool], req, ONE_POOL, mode="iteration", dispatch=RoundRobin())
    W, h = 0.01, 0.004 / 512
    assert_replicas_match(res, req, R, lambda idx: step_reference_budget(req.arrival_at_s[idx], l_in[idx],
                                                                         l_out[idx], W, h, 64, cap, budget))
    assert res.count(Outcome.COMPLETED) == n
    assert_books_balance(res)


@pytest.mark.parametrize("cap,budget", [(3, 100), (16, 150), (16, 16 * 64 - 1)])
def test_budget_with_compute_terms_and_activity_power_matches_the_reference(cap, budget):
    # Each prefill piece pays its exact causal compute, a decode step g; energy by activity over the same spans.
    from dataclasses import replace

    from fleetopt.models.power import ActivityPower

    g, a, b = 2e-4, 3e-5, 4e-8
    profile = replace(SMALL, g_s=g, prefill_a_s=a, prefill_b_s=b,
                      power=ActivityPower(idle_w=70.0, limit_w=1e6, weights_w=400.0, kv_w=700.0, compute_w=800.0))
    rng = np.random.default_rng(np.random.SeedSequence(311 + cap + budget))
    n = 400
    l_in = rng.integers(0, 300, n)
    l_out = rng.integers(0, 40, n)
    l_out[l_in == 0] = np.maximum(l_out[l_in == 0], 1)
    req = Requests(poisson_arrivals(15.0, n, rng), l_in, l_out)
    pool = SimPool("p", profile, 1, cap, 512, max_batched_tokens=budget)
    assert pool.budget_binds
    res = simulate([pool], req, ONE_POOL, mode="iteration")
    parts = [0.0, 0.0, 0.0]
    ref = step_reference_budget(req.arrival_at_s, l_in, l_out, 0.01, 0.004 / 512, 64, cap, budget, g, a, b, parts)
    for got, want in zip((res.start_at_s, res.first_token_at_s, res.end_at_s), ref):
        np.testing.assert_allclose(got, want, rtol=1e-9)
    idle = float(np.nanmax(ref[2])) - sum(parts)
    assert res.replica_energy_j[0] == pytest.approx(70.0 * idle + 400.0 * parts[0] + 700.0 * parts[1]
                                                    + 800.0 * parts[2], rel=1e-9)
    assert_books_balance(res)


def test_reference_without_a_binding_budget_is_the_plain_reference():
    """The budgeted reference with budget cap x chunk is the plain one of test_des (a check of the reference)."""
    from tests.test_des import step_reference

    rng = np.random.default_rng(np.random.SeedSequence(54))
    n = 200
    l_in, l_out = rng.integers(0, 300, n), rng.integers(1, 40, n)
    arrival = poisson_arrivals(5.0, n, rng)
    for want, got in zip(step_reference(arrival, l_in, l_out, 0.01, 1e-5, 64, 4),
                         step_reference_budget(arrival, l_in, l_out, 0.01, 1e-5, 64, 4, 4 * 64)):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_budget_by_hand():
    # W = 1 s, h = 1/64 s per token of context: every instant below is a dyadic rational, exact in floating
    # point. Chunk c = 8, budget K = 10 tokens per iteration, up to 3 sequences (3 x 8 = 24 > 10: it binds).
    W, h = 1.0, 1.0 / 64
    pool = SimPool("p", kv_profile(1 << 12, blk=4, chunk=8), 1, 3, 64, max_batched_tokens=10)
    # A (l_in 12, l_out 2) and B (l_in 8, l_out 1) arrive at 0; C (l_in 4, l_out 1) at 0.5.
    req = Requests(np.array([0.0, 0.0, 0.5]), np.array([12, 8, 4]), np.array([2, 1, 1]))
    res = simulate([pool], req, ONE_POOL, mode="iteration")
    # iteration 0 at t = 0: A takes min(8, 12, 10) = 8 tokens, B the 2 left; contexts 0 + 0
    t1 = 0.0 + W + h * 0
    # iteration 1: A takes its last 4 tokens, B min(8, 6, 6) = 6: nothing left, so C (arrived at 0.5) waits
    # although a batch place is free; contexts A 8 + B 2
    t2 = t1 + W + h * (8 + 2)
    # both prefills end at t2 (first tokens). Iteration 2: A and B decode (1 token each) at contexts 12 and 8,
    # C is admitted into the 8 tokens left and prefills its 4 at context 0
    t3 = t2 + W + h * (12 + 8 + 0)
    # B completes at t3; C's first token. Iteration 3: A at context 13, C decodes at context 4; both complete
    t4 = t3 + W + h * (13 + 4)
    assert (t1, t2, t3, t4) == (1.0, 2.15625, 3.46875, 4.734375)
    assert res.start_at_s.tolist() == [0.0, 0.0, t2]
    assert res.first_token_at_s.tolist() == [t2, t2, t3]
    assert res.end_at_s.tolist() == [t4, t3, t4]
    assert_books_balance(res)
    # without a budget B's only chunk runs in iteration 0 and C joins at the first boundary after 0.5
    free = simulate([SimPool("p", kv_profile(1 << 12, blk=4, chunk=8), 1, 3, 64)], req, ONE_POOL)
    assert free.first_token_at_s.tolist()[1] == 1.0 and free.start_at_s.tolist()[2] == 1.0


@pytest.mark.parametrize("horizon_s", [None, 30.0])
def test_a_budget_that_cannot_bind_changes_nothing(h100, azure, horizon_s):
    rng = np.random.default_rng(np.random.SeedSequence(55))
    req = poisson_requests(azure.truncated(8192)[0], 60.0, 3000, rng)
    router = LengthRouter([0, 4096, 8192], ["short", "long"])
    plain = [SimPool("short", h100, 2, None, 4096), SimPool("long", h100, 3, 48, 8192)]
    roomy = [SimPool(p.name, p.profile, p.replicas, p.max_num_seqs, p.window_tokens,
                     max_batched_tokens=p.max_num_seqs * h100.chunk_tokens) for p in plain]
    assert not any(p.budget_binds for p in roomy)
    a = simulate(plain, req, router, horizon_s=horizon_s)
    b = simulate(roomy, req, router, horizon_s=horizon_s)
    assert a.events == b.events and a.window_end_s == b.window_end_s
    for f in ("start_at_s", "first_token_at_s", "end_at_s", "pool", "replica", "outcome", "pool_mean_in_system",
              "pool_busy_slot_s", "replica_mean_batch", "replica_energy_j"):
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f


@pytest.mark.parametrize("horizon_s", [None, 40.0])
def test_tight_budget_keeps_books_balanced_and_delays_first_tokens(h100, azure, horizon_s):
    rng = np.random.default_rng(np.random.SeedSequence(56))
    dist = azure.truncated(8192)[0]
    req = poisson_requests(dist, 25.0, 3000, rng)
    cap = int(h100.n_slots(8192))
    tight = [SimPool("p", h100, 2, None, 8192, max_batched_tokens=cap)]
    assert tight[0].budget_binds
    res = simulate(tight, req, ONE_POOL, horizon_s=horizon_s, warmup_s=2.0)
    assert_books_balance(res)
    assert np.all(res.replica_mean_batch <= cap)
    free = simulate([SimPool("p", h100, 2, None, 8192)], req, ONE_POOL, horizon_s=horizon_s, warmup_s=2.0)
    both = (res.outcome == Outcome.COMPLETED) & (free.outcome == Outcome.COMPLETED) & steady_mask(res, 0.1)
    # a budget of `cap` tokens prefills at most cap - n_dec tokens per iteration instead of 1024 per sequence
    assert np.median(ttft_s(res)[both]) > 1.5 * np.median(ttft_s(free)[both])


def test_budget_validation_names_the_pool_and_field():
    with pytest.raises(ValueError, match=r"pool p: max_batched_tokens .* >= max_num_seqs \(4\)"):
        SimPool("p", SMALL, 1, 4, 512, max_batched_tokens=3)
    with pytest.raises(ValueError, match="pool p: max_batched_tokens"):
        SimPool("p", SMALL, 1, 4, 512, max_batched_tokens=10.5)
    with pytest.raises(ValueError, match="pool p: max_batched_tokens"):
        SimPool("p", SMALL, 1, 4, 512, max_batched_tokens=True)
    with pytest.raises(ValueError, match="pool q: max_batched_tokens is not supported on an overcommitted pool"):
        SimPool("q", kv_profile(4), 1, 2, 16, allow_overcommit=True, max_batched_tokens=64)
    assert SimPool("q", kv_profile(8), 1, 2, 16, allow_overcommit=True, max_batched_tokens=64).max_batched_tokens == 64
    pool = SimPool("p", SMALL, 1, 4, 512, max_batched_tokens=4)
    assert pool.budget_binds and not SimPool("p", SMALL, 1, 4, 512, max_batched_tokens=256).budget_binds
    req = Requests(np.array([0.0]), np.array([10]), np.array([10]))
    with pytest.raises(ValueError, match="slot mode has no iterations"):
        simulate([pool], req, ONE_POOL, mode="slot")
