"""Live routing in the engine: spill a request to another pool at its arrival when its pool's queue is long.

The semantics are in :mod:`fleetopt.solvers.des.engine` ("Live routing (spillover)"); the
router is a plain :class:`fleetopt.solvers.des.routing.LiveRouter`. This module turns
its ``spill_to`` into engine pool indices once, and wraps a station's arrival
handler so that runs without a live router keep the unwrapped handler and pay
nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fleetopt.solvers.des.routing import LiveRouter

__all__ = ["live_targets", "spill_arrivals"]


def live_targets(router: LiveRouter, names: list[str]) -> list[int]:
    """Per engine pool (``names``), the engine index of the pool it spills to, or -1.

    Raises
    ------
    ValueError
        When ``spill_to`` does not give one index in ``[-1, len(pool_names))``
        per router pool, names a pool's own index, or ``spill_bound`` is not a
        whole number >= 0.
    """
    own = list(router.pool_names)
    spill_to = list(router.spill_to)
    if len(set(own)) != len(own):
        raise ValueError(f"router {router!r}: a live router needs distinct pool_names; got {own}")
    if len(spill_to) != len(own) or any(isinstance(t, bool) or int(t) != t or not -1 <= t < len(own)
                                        or t == k for k, t in enumerate(spill_to)):
        raise ValueError(f"router {router!r}: spill_to must give one index in [-1, {len(own)}) per pool, "
                         f"not the pool's own; got {spill_to}")
    bound = router.spill_bound
    if isinstance(bound, bool) or int(bound) != bound or bound < 0:
        raise ValueError(f"router {router!r}: spill_bound must be a whole number >= 0; got {bound!r}")
    target = [-1] * len(names)
    for k, t in enumerate(spill_to):
        if t >= 0:
            target[names.index(own[k])] = names.index(own[int(t)])
    return target


def spill_arrivals(arrive: Callable[[float, int], None], queued: Callable[[int], int],
                   reroute: Callable[[int, int], None], pool_of: np.ndarray, spill_to: list[int], bound: int,
                   total_tokens: np.ndarray, window_tokens: list[int], spilled: list[int]):
    """A station's ``arrive(now, i)`` behind the spill decision.

    Request ``i`` of primary pool :math:`p` moves to pool :math:`q` =
    ``spill_to[p]`` when :math:`q \\ge 0`, ``queued(p) > bound`` and its
    :math:`l_{in} + l_{out}` fits :math:`q`'s window; then ``pool_of[i]`` (the
    result column) is set to :math:`q`, ``reroute(i, q)`` recomputes the
    station's per-request columns and ``spilled[p]`` counts it. One hop only.
    """
    # an ndarray is a buffer; numpy's stubs say so for Python 3.12+ only, hence the ignores
    rpool: memoryview[int] = memoryview(pool_of)  # pyright: ignore[reportArgumentType]
    total_a = np.ascontiguousarray(total_tokens, dtype=np.int64)
    total: memoryview[int] = memoryview(total_a)  # pyright: ignore[reportArgumentType]
    bound = int(bound)

    def arrive_live(now: float, i: int) -> None:
        p = rpool[i]
        q = spill_to[p]
        if q >= 0 and queued(p) > bound and total[i] <= window_tokens[q]:
            rpool[i] = q
            reroute(i, q)
            spilled[p] += 1
        arrive(now, i)

    return arrive_live
