"""Dispatch within a pool: least-queue (the reference tool's rule) next to join-shortest-queue and round robin.

Least-queue picks the replica with the fewest *waiting* requests (queued, not yet admitted), ties to the
lowest index; join-shortest-queue the fewest outstanding (running plus waiting). The cases by hand show where
they differ; the rest checks that every path of the engine keeps its books and hands the policy a waiting
count that is consistent with the replica's state.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetopt.optimizer.simulation.options import DISPATCHES, SimOptions
from fleetopt.optimizer.simulation import simulate as pipeline
from fleetopt.solvers.des.engine import simulate
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.routing import (Dispatch, JoinShortestQueue, LeastQueue, Requests, RoundRobin,
                                          poisson_arrivals, poisson_requests)
from fleetopt.solvers.des.state import SimPool
from tests.test_des import ONE_POOL, TOY, assert_books_balance, kv_profile
from tests.test_des_budget import SMALL


class Spy:
    """Wraps a dispatch policy; at every choice checks the counts it is given against the replica's state."""

    def __init__(self, inner, cap: int, full_when_waiting: bool) -> None:
        self.inner, self.cap, self.full_when_waiting = inner, cap, full_when_waiting
        self.name = inner.name
        self.calls = 0
        self.seen_waiting = 0

    def bind(self, replicas, outstanding, waiting):
        choose = self.inner.bind(replicas, outstanding, waiting)
        ranges = list(replicas)

        def spy(p: int) -> int:
            self.calls += 1
            for r in ranges[p]:
                w = waiting(r)
                assert 0 <= w <= outstanding[r], (r, w, outstanding[r])
                assert outstanding[r] - w <= self.cap          # running never exceeds the batch cap
                if self.full_when_waiting and w:
                    assert outstanding[r] - w == self.cap      # FCFS: a request waits only behind a full batch
                self.seen_waiting += w
            return choose(p)

        return spy


def test_least_queue_is_a_dispatch_and_ties_go_to_the_lowest_index():
    assert isinstance(LeastQueue(), Dispatch) and LeastQueue().name == "least-queue"
    waiting = [2, 0, 0, 1, 1]
    outstanding = [5, 9, 3, 1, 4]
    lq = LeastQueue().bind([range(0, 3), range(3, 5)], outstanding, waiting.__getitem__)
    jsq = JoinShortestQueue().bind([range(0, 3), range(3, 5)], outstanding, waiting.__getitem__)
    assert lq(0) == 1 and lq(1) == 3            # ties (0, 0) and (1, 1): the lower index
    assert jsq(0) == 2 and jsq(1) == 3          # fewest outstanding
    waiting[1] = 1
    assert lq(0) == 2                           # live: the count is read at each choice


@pytest.mark.parametrize("mode", ["slot", "iteration"])
def test_a_long_running_batch_with_an_empty_queue_splits_the_two_rules(mode):
    """Two replicas of one sequence each. Request 0 (long) takes replica 0. Request 1: replica 0 runs one
    sequence and queues none, replica 1 is idle; least-queue sees two empty queues and takes the lower index
    (replica 0, where it waits), join-shortest-queue takes the idle replica 1. Request 2 then finds a queue on
    replica 0 (least-queue: replica 1) or two busy replicas with nothing queued (JSQ: the tie goes to 0)."""
    arrival = np.array([0.0, 1.0, 1.001])
    if mode == "slot":
        req = Requests(arrival, np.ones(3, int), np.ones(3, int), np.array([100.0, 1.0, 1.0]))
    else:
        req = Requests(arrival, np.array([16, 16, 16]), np.array([2000, 1, 1]))
    pool = [SimPool("p", TOY, 2, 1, 4096)]
    queue = "replica" if mode == "slot" else None
    lq = simulate(pool, req, ONE_POOL, mode=mode, queue=queue, dispatch=LeastQueue())
    jsq = simulate(pool, req, ONE_POOL, mode=mode, queue=queue, dispatch=JoinShortestQueue())
    assert lq.replica.tolist() == [0, 0, 1]
    assert jsq.replica.tolist() == [0, 1, 0]
    assert lq.start_at_s[1] >= lq.end_at_s[0]   # request 1 waited behind the long one
    assert jsq.start_at_s[1] <= 1.0 + 0.1       # ... or started at once on the idle replica
    for res in (lq, jsq):
        assert res.count(Outcome.COMPLETED) == 3


def _plain(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(61))
    req = poisson_requests(azure.truncated(8192)[0], 40.0, 3000, rng)
    return [SimPool("p", h100, 3, 8, 8192)], req, "iteration", None, 8, True


def _slot(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(62))
    req = Requests(poisson_arrivals(30.0, 3000, rng), np.ones(3000, int), np.ones(3000, int),
                   rng.exponential(0.5, 3000))
    return [SimPool("p", TOY, 4, 4, 4096)], req, "slot", "replica", 4, True


def _budget(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(63))
    n = 2000
    l_in = rng.integers(0, 300, n)
    l_out = rng.integers(1, 40, n)
    pool = SimPool("p", SMALL, 3, 6, 512, max_batched_tokens=80)
    assert pool.budget_binds
    return [pool], Requests(poisson_arrivals(9.0, n, rng), l_in, l_out), "iteration", None, 6, False


def _kv(h100, azure):
    rng = np.random.default_rng(np.random.SeedSequence(64))
    n = 1500
    profile = kv_profile(24, blk=4, chunk=8)
    pool = SimPool("p", profile, 3, 4, 64, allow_overcommit=True)
    assert pool.overcommitted
    req = Requests(poisson_arrivals(0.25, n, rng), rng.integers(1, 40, n), rng.integers(1, 24, n))
    return [pool], req, "iteration", None, 4, False


@pytest.mark.parametrize("case", [_plain, _slot, _budget, _kv], ids=["plain", "slot-replica", "budget", "kv"])
@pytest.mark.parametrize("policy", [LeastQueue, JoinShortestQueue, RoundRobin])
def test_every_path_keeps_its_books_and_a_consistent_waiting_count(h100, azure, case, policy):
    pools, req, mode, queue, cap, full_when_waiting = case(h100, azure)
    spy = Spy(policy(), cap, full_when_waiting)
    res = simulate(pools, req, ONE_POOL, mode=mode, queue=queue, dispatch=spy)
    assert spy.calls == len(req)                # one choice per accepted request
    assert len(res.outcome) == len(req) and res.count(Outcome.COMPLETED) == len(req)
    assert_books_balance(res)
    assert np.all((res.replica >= 0) & (res.replica < pools[0].replicas))
    if policy is LeastQueue:
        assert spy.seen_waiting > 0             # the cases do queue, so the count is exercised
    if case is _kv:
        assert res.preemptions.sum() > 0        # preempted sequences waited for readmission


@pytest.mark.parametrize("case", [_plain, _slot, _budget, _kv], ids=["plain", "slot-replica", "budget", "kv"])
def test_least_queue_is_deterministic(h100, azure, case):
    pools, req, mode, queue, _, _ = case(h100, azure)
    a = simulate(pools, req, ONE_POOL, mode=mode, queue=queue, dispatch=LeastQueue())
    b = simulate(pools, req, ONE_POOL, mode=mode, queue=queue, dispatch=LeastQueue())
    for f in ("start_at_s", "first_token_at_s", "end_at_s", "replica", "outcome", "replica_energy_j"):
        assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f


def test_every_dispatch_name_maps_to_its_policy():
    assert set(pipeline._DISPATCH) == set(DISPATCHES)
    assert all(pipeline._DISPATCH[x]().name == x for x in DISPATCHES)
    assert SimOptions(dispatch="least-queue").dispatch == "least-queue"
