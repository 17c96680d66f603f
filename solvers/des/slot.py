"""Slot-mode handlers: every request holds one KV slot of its pool for its whole service time.

The model (the service time :math:`S`, the first-token instant, FCFS per pool
or per replica) is stated in :mod:`fleetopt.solvers.des.engine` ("Modes"); this module holds
the handlers of :func:`fleetopt.solvers.des.engine.simulate` with ``mode="slot"``.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from fleetopt.models.service import prefill_time_s, service_time_s

from fleetopt.solvers.des.routing import Dispatch, JoinShortestQueue, Requests
from fleetopt.solvers.des.state import SimPool, _State

__all__ = ["slot_station"]


def _slot_service_s(pool: SimPool, prompt, output) -> np.ndarray:
    """:math:`S = (\\lceil l_{in}/c \\rceil + l_{out})\\, t(n_{cap}, l_{in} + l_{out})`.

    :func:`fleetopt.models.service.service_time_s` with the pool's batch cap in place of
    :math:`n_{slots}(B)` (equal when ``max_num_seqs`` is left at its default).
    """
    return service_time_s(pool.profile, pool.window_tokens, prompt, output, batch_cap=pool.max_num_seqs)


def slot_station(st: _State, pools, requests: Requests, pool_of, accepted, queue: str, dispatch: Dispatch,
                 slot_freed):
    """Handlers of slot mode (FCFS per pool or per replica): ``arrive(now, i)``, ``serve(at, seq, kind, i)``,
    ``queued(p)`` (requests waiting for a slot of pool ``p``) and ``reroute(i, p)`` (request ``i`` goes to
    pool ``p`` instead: its service and prefill times are recomputed).

    ``st`` is the run's :class:`fleetopt.solvers.des.state._State` (heap, record columns, time integrals) and
    ``slot_freed`` the heap entries' event kind of a slot freed (``fleetopt.solvers.des.state.EventKind.SLOT_FREED``).
    """
    n = len(requests)
    service_a = np.zeros(n) if requests.service_s is None else requests.service_s.copy()
    prefill_a = np.zeros(n)
    for k, p in enumerate(pools):
        sel = accepted & (pool_of == k)
        l_in, l_out = requests.prompt_tokens[sel], requests.output_tokens[sel]
        if requests.service_s is None:
            service_a[sel] = _slot_service_s(p, l_in, l_out)
        prefill_a[sel] = prefill_time_s(p.profile, l_in)
    prefill_a = np.minimum(prefill_a, service_a)   # a given service time shorter than the prefill ends with it
    # memoryviews: fast scalar reads and writes in the event loop. (An ndarray is a buffer; numpy's stubs
    # say so for Python 3.12+ only, hence the ignores.)
    service: memoryview[float] = memoryview(np.ascontiguousarray(service_a))  # pyright: ignore[reportArgumentType]
    prefill: memoryview[float] = memoryview(np.ascontiguousarray(prefill_a))  # pyright: ignore[reportArgumentType]
    rpool: memoryview[int] = memoryview(np.ascontiguousarray(pool_of))  # pyright: ignore[reportArgumentType]
    heap, counter, push = st.heap, st.counter, heapq.heappush
    start, first, end, rep, busy, cap = st.start, st.first, st.end, st.rep, st.batch, st.cap
    batch_to, system_to = st.batch_to, st.system_to
    free = list(st.slots)
    pool_queue = [deque() for _ in pools]
    replica_queue = [deque() for _ in busy]
    outstanding, ranges = st.outstanding, st.ranges
    least_busy = JoinShortestQueue().bind(ranges, busy)   # pool queue: a free slot on the least busy replica

    def waiting_at(r: int) -> int:
        """Requests waiting for a slot of replica ``r`` (per-replica queues)."""
        return len(replica_queue[r])

    choose = dispatch.bind(ranges, outstanding, waiting_at)

    def begin(r: int, i: int, now: float) -> None:
        batch_to(r, now)
        busy[r] += 1
        start[i] = now
        first[i] = now + prefill[i]
        e = end[i] = now + service[i]
        rep[i] = r
        push(heap, (e, next(counter), slot_freed, i))

    def arrive_pool(now: float, i: int) -> None:
        p = rpool[i]
        system_to(p, now, 1)
        if free[p]:
            free[p] -= 1
            begin(least_busy(p), i, now)
        else:
            pool_queue[p].append(i)

    def serve_pool(at: float, seq: int, kind, i: int) -> None:
        r, p = rep[i], rpool[i]
        system_to(p, at, -1)
        batch_to(r, at)
        busy[r] -= 1
        q = pool_queue[p]
        if q:
            begin(r, q.popleft(), at)
        else:
            free[p] += 1

    def arrive_replica(now: float, i: int) -> None:
        p = rpool[i]
        system_to(p, now, 1)
        r = choose(p)
        outstanding[r] += 1
        if busy[r] < cap[r]:
            begin(r, i, now)
        else:
            rep[i] = r
            replica_queue[r].append(i)

    def serve_replica(at: float, seq: int, kind, i: int) -> None:
        r = rep[i]
        system_to(rpool[i], at, -1)
        batch_to(r, at)
        busy[r] -= 1
        outstanding[r] -= 1
        q = replica_queue[r]
        if q:
            begin(r, q.popleft(), at)

    def queued(p: int) -> int:
        if queue == "pool":
            return len(pool_queue[p])
        return sum(map(waiting_at, ranges[p]))

    def reroute(i: int, p: int) -> None:
        rpool[i] = p
        pool, l_in = pools[p], requests.prompt_tokens[i]
        s = service[i] if requests.service_s is not None else float(
            _slot_service_s(pool, l_in, requests.output_tokens[i]))
        service[i] = s
        prefill[i] = min(float(prefill_time_s(pool.profile, l_in)), s)

    if queue == "pool":
        return arrive_pool, serve_pool, queued, reroute
    return arrive_replica, serve_replica, queued, reroute
