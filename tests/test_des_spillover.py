"""Spillover routing (a live router): the engine moves a request to the next pool up at its arrival.

Checked against a hand-built slot-mode run where each decision can be read off
the queue, against plain length routing when the bound is never reached, and on
a realistic overloaded fleet (books, windows, tail latency, determinism).
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetopt.models.power import PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.state import SimPool
from fleetopt.solvers.des.engine import simulate
from fleetopt.solvers.des.metrics import percentile, steady_mask, ttft_s
from fleetopt.solvers.des.routers import SpilloverRouter
from fleetopt.solvers.des.routing import LengthRouter, LiveRouter, Requests, poisson_requests
from tests.test_des import TOY, assert_books_balance

FIELDS = ("arrival_at_s", "start_at_s", "first_token_at_s", "end_at_s", "prompt_tokens", "output_tokens", "pool",
          "replica", "outcome", "pool_mean_in_system", "pool_busy_slot_s", "replica_mean_batch", "replica_energy_j",
          "preemptions", "spilled")


def fleet(h100, budget=None, overcommit=False):
    """A short pool too small for its traffic under a long pool with room to spare (H100, 0-4K and 4K-8K)."""
    slots = int(h100.n_slots(8192))
    long = (SimPool("long", h100, 3, 2 * slots, 8192, allow_overcommit=True) if overcommit
            else SimPool("long", h100, 3, None, 8192, max_batched_tokens=budget))
    return [SimPool("short", h100, 1, None, 4096, max_batched_tokens=budget), long]


def overload(azure, n=12_000, seed=91):
    return poisson_requests(azure.truncated(8192)[0], 60.0, n, np.random.default_rng(np.random.SeedSequence(seed)))


def test_spillover_router_states_its_targets():
    r = SpilloverRouter([0, 100, 200, 400], ["a", "b", "c"], 3)
    assert isinstance(r, LiveRouter) and not isinstance(LengthRouter([0, 1], ["a"]), LiveRouter)
    assert r.spill_to == (1, 2, -1) and r.spill_bound == 3
    assert r.route(np.array([50, 150, 300, 500]), np.array([0, 0, 0, 0])).tolist() == [0, 1, 2, -1]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="bound"):
            SpilloverRouter([0, 100, 200], ["a", "b"], bad)
    with pytest.raises(ValueError, match="distinct"):
        SpilloverRouter([0, 100, 200], ["a", "a"], 1)


@pytest.mark.parametrize("queue", ["pool", "replica"])
def test_spillover_by_hand(queue):
    # short: 1 slot; long: 4 slots; every service lasts 1 s; bound 1 (spill when 2 or more wait in short)
    pools = [SimPool("short", TOY, 1, 1, 4096), SimPool("long", TOY, 1, 4, 8192)]
    router = SpilloverRouter([0, 4096, 8192], ["short", "long"], 1)
    arrival = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 1.0, 1.5, 1.5])
    total = np.array([100, 100, 100, 100, 100, 100, 5000, 100])     # request 6 is long: the top pool never spills
    req = Requests(arrival, total - 10, np.full(8, 10), np.ones(8))
    res = simulate(pools, req, router, mode="slot", queue=queue)
    # 0 starts at once; 1 and 2 wait (0, then 1 waiting: not above the bound); 3 and 4 see 2 waiting: spill.
    # At 1.0 request 0 ends first (events before arrivals), 1 starts, so 5 sees 1 waiting and stays; 7 sees
    # 2 and 5 waiting and spills. The long pool has a free slot for everything sent to it.
    assert res.pool.tolist() == [0, 0, 0, 1, 1, 0, 1, 1]
    assert res.start_at_s.tolist() == [0.0, 1.0, 2.0, 0.3, 0.4, 3.0, 1.5, 1.5]
    np.testing.assert_allclose(res.end_at_s, res.start_at_s + 1.0)
    assert res.spilled.tolist() == [3, 0] and not res.spilled.flags.writeable
    assert_books_balance(res)
    # without spillover the short pool serves its seven requests one after another
    plain = simulate(pools, req, LengthRouter([0, 4096, 8192], ["short", "long"]), mode="slot", queue=queue)
    assert plain.start_at_s[plain.pool == 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert plain.spilled.tolist() == [0, 0]


@pytest.mark.parametrize("mode", ["slot", "iteration"])
def test_a_bound_never_reached_is_length_routing(h100, azure, mode):
    req = overload(azure, 6000)
    pools = fleet(h100)
    a = simulate(pools, req, LengthRouter([0, 4096, 8192], ["short", "long"]), mode=mode, horizon_s=60.0)
    b = simulate(pools, req, SpilloverRouter([0, 4096, 8192], ["short", "long"], 10**9), mode=mode, horizon_s=60.0)
    assert a.events == b.events and a.window_end_s == b.window_end_s
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f


@pytest.mark.parametrize("mode,budget,overcommit", [("slot", None, False), ("iteration", None, False),
                                                    ("iteration", 512, False), ("iteration", None, True)])
@pytest.mark.parametrize("horizon_s", [None, 80.0])
def test_spillover_keeps_books_and_windows(h100, azure, mode, budget, overcommit, horizon_s):
    req = overload(azure, 6000)
    pools = fleet(h100, budget, overcommit)
    res = simulate(pools, req, SpilloverRouter([0, 4096, 8192], ["short", "long"], 4), mode=mode,
                   horizon_s=horizon_s, warmup_s=5.0)
    assert_books_balance(res)
    assert res.spilled[0] > 0 and res.spilled[1] == 0
    served = res.outcome != Outcome.REJECTED
    window = np.array([p.window_tokens for p in pools])
    assert np.all(req.total_tokens[served] <= window[res.pool[served]])
    # a spilled request is a short-segment request served by the long pool, and no other kind moved
    moved = (req.total_tokens <= 4096) & (res.pool == 1)
    assert moved.sum() == res.spilled[0] and np.all(res.pool[req.total_tokens > 4096] == 1)


def test_a_short_window_is_never_a_spill_target(h100, azure):
    # the "long" pool's own window (2048) is shorter than the short segment's top (4096): only requests of at
    # most 2048 tokens may spill into it; the others stay in their pool however long its queue
    pools = [SimPool("short", h100, 1, None, 4096), SimPool("long", h100, 3, None, 2048)]
    req = overload(azure, 6000)
    res = simulate(pools, req, SpilloverRouter([0, 4096, 8192], ["short", "long"], 0), mode="slot")
    assert res.spilled[0] > 0
    short = req.total_tokens <= 4096
    assert np.all(req.total_tokens[short & (res.pool == 1)] <= 2048)
    assert np.any(short & (req.total_tokens > 2048) & (res.pool == 0) & (res.start_at_s > res.arrival_at_s))
    assert_books_balance(res)


@pytest.mark.parametrize("mode", ["slot", "iteration"])
def test_spillover_lowers_the_overloaded_pool_tail(h100, azure, mode):
    req = overload(azure)
    pools = fleet(h100)
    short = req.total_tokens <= 4096
    p99 = []
    for router in (LengthRouter([0, 4096, 8192], ["short", "long"]),
                   SpilloverRouter([0, 4096, 8192], ["short", "long"], 8)):
        res = simulate(pools, req, router, mode=mode, horizon_s=180.0, warmup_s=20.0)
        assert_books_balance(res)
        done = (res.outcome == Outcome.COMPLETED) & steady_mask(res, 0.1) & short
        p99.append(float(percentile(ttft_s(res)[done], 99)))
    assert p99[1] < 0.5 * p99[0], p99


@pytest.mark.parametrize("mode", ["slot", "iteration"])
def test_same_seed_same_arrays(h100, azure, mode):
    router = SpilloverRouter([0, 4096, 8192], ["short", "long"], 4)
    a, b, c = (simulate(fleet(h100), overload(azure, 4000, seed), router, mode=mode) for seed in (5, 5, 6))
    for f in FIELDS:
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
    assert a.spilled[0] > 0 and not np.array_equal(a.end_at_s, c.end_at_s)


def test_a_request_deferred_to_an_event_boundary_is_not_queued():
    """Budgeted and overcommitted replicas hold an arrival whose joining boundary is an event until that event's
    admissions (the plain path admits it at the same boundary): a live router must not count it as waiting.
    Request 0 runs alone (W = H = 1 s per iteration); requests 1 and 2 arrive during its first iterations with
    places, tokens and blocks to spare, so none of them waits and none spills at bound 0."""
    toy = CalibratedProfile("toy", "m", 1.0, 1.0, 64, 8, 4, 24, 1 << 12, 1.0, 1,
                            PowerCurve(50.0, 100.0, 1.0, 2.0, "none"))
    req = Requests(np.array([0.0, 0.5, 0.6]), np.array([8, 2, 2]), np.array([1, 1, 1]))
    router = SpilloverRouter([0, 32, 64], ["a", "b"], 0)
    big = SimPool("b", toy, 1, 1, 64)
    runs = {"plain": SimPool("a", toy, 1, 3, 32),
            "budget": SimPool("a", toy, 1, 3, 32, max_batched_tokens=10),
            "overcommit": SimPool("a", toy, 1, 4, 32, allow_overcommit=True)}
    assert runs["budget"].budget_binds and runs["overcommit"].overcommitted
    starts = {}
    for name, pool in runs.items():
        res = simulate([pool, big], req, router)
        assert res.pool.tolist() == [0, 0, 0] and res.spilled.tolist() == [0, 0], name
        starts[name] = res.start_at_s.tolist()
    assert starts["budget"] == starts["overcommit"] == starts["plain"]
