"""Routers beyond :mod:`fleetopt.solvers.des.routing`: compress-and-route, and spillover.

Compress-and-route
------------------
A pool :math:`k` of window :math:`B_k` with compression factor
:math:`\\gamma_k > 1` also takes requests of total length
:math:`L \\in (B_k, \\gamma_k B_k]`: with probability :math:`p_c` the prompt
is compressed so that the request fits, keeping its output,

.. math:: l'_{in} = B_k - l_{out}, \\qquad l'_{in} + l_{out} = B_k

(:func:`fleetopt.models.segments.compressed_band` is the analytic counterpart); with
probability :math:`1 - p_c`, or when the output alone fills the window
(:math:`l_{out} \\ge B_k`), the request keeps its length and goes to the pool
above. Compression changes the requests themselves, not only their pool, so
:class:`CompressRouter` works in two steps: :meth:`CompressRouter.compress`
rewrites the stream (one uniform draw per request), then
:meth:`CompressRouter.route` routes it by length - a compressed request has
total length :math:`B_k`, which lies in pool :math:`k`'s segment.

Spillover
---------
A request of total length in :math:`(b_k, b_{k+1}]` has primary pool :math:`k`
(length routing). At its arrival, when more than a bound :math:`q_{max}` of
requests wait in pool :math:`k` (routed there, not yet admitted to a slot or
batch, summed over its replicas),

.. math:: Q_k(t^-) > q_{max} \\implies \\text{pool } k + 1

whose window :math:`B_{k+1} = b_{k+2} > b_{k+1}` is longer, so the request
fits it (when a pool's own window is shorter than its segment says, the engine
checks the fit and keeps a request that does not fit in its primary pool).
One hop only: pool :math:`k + 1`'s queue is not consulted, and the top pool
never spills. :class:`SpilloverRouter` is a
:class:`fleetopt.solvers.des.routing.LiveRouter`: it states ``spill_to`` and
``spill_bound`` and :mod:`fleetopt.solvers.des.engine` applies them from its live queues
("Live routing (spillover)" there).
"""

from __future__ import annotations

import numpy as np

from fleetopt.solvers.des.routing import LengthRouter, Requests

__all__ = ["CompressRouter", "SpilloverRouter"]


class CompressRouter:
    """Compress-and-route by total length (module docstring).

    Parameters
    ----------
    boundaries : sequence of float
        :math:`b_0 < b_1 < \\dots < b_M` in tokens; pool :math:`k` serves
        :math:`(b_k, b_{k+1}]` and has window :math:`B_k = b_{k+1}`.
    pool_names : sequence of str
        :math:`M` distinct names, one per segment.
    gammas : sequence of float
        :math:`\\gamma_k \\ge 1` per pool; a band must end within the next pool
        (:math:`\\gamma_k b_{k+1} \\le b_{k+2}`) and the top pool has none (1).
    success_probability : float
        :math:`p_c \\in [0, 1]`.
    rng : numpy.random.Generator
        Source of the draws; :meth:`compress` consumes one uniform per request.

    Examples
    --------
    >>> r = CompressRouter([0, 100, 400], ["s", "l"], [2.0, 1.0], 1.0, np.random.default_rng(0))
    >>> req = r.compress(Requests(np.zeros(3), np.array([50, 150, 300]), np.array([10, 30, 50])))
    >>> req.prompt_tokens.tolist(), r.route(req.prompt_tokens, req.output_tokens).tolist()
    ([50, 70, 300], [0, 0, 1])
    """

    def __init__(self, boundaries, pool_names, gammas, success_probability: float, rng: np.random.Generator) -> None:
        self._length = LengthRouter(boundaries, pool_names)
        if len(self._length.pool_names) != len(pool_names):
            raise ValueError(f"pool_names must be distinct; got {list(pool_names)}")
        self.pool_names = self._length.pool_names
        b = self._length.boundaries
        g = np.asarray(gammas, dtype=float)
        if g.shape != (len(b) - 1,) or not np.all(np.isfinite(g)) or np.any(g < 1.0):
            raise ValueError(f"gammas must be {len(b) - 1} finite factors >= 1; got {g.tolist()}")
        if g[-1] > 1.0:
            raise ValueError(f"the top pool has no pool above it to take compressed requests from; got gamma {g[-1]:g}")
        over = np.flatnonzero(g[:-1] * b[1:-1] > b[2:])
        if over.size:
            k = int(over[0])
            raise ValueError(f"the band of pool {k} ends at {g[k] * b[k + 1]:g} tokens, beyond the next pool's "
                             f"{b[k + 2]:g}")
        if not 0.0 <= success_probability <= 1.0:
            raise ValueError(f"success_probability must lie in [0, 1]; got {success_probability!r}")
        self.gammas = g
        self.success_probability = float(success_probability)
        self.rng = rng

    def __repr__(self) -> str:
        return (f"CompressRouter({self._length.boundaries.tolist()}, {list(self.pool_names)}, "
                f"gammas={self.gammas.tolist()}, p_c={self.success_probability:g})")

    def compressed(self, requests: Requests) -> np.ndarray:
        """Per request, the window it is compressed to (0 = not compressed); consumes one uniform per request."""
        b = self._length.boundaries
        L, out = requests.total_tokens, requests.output_tokens
        u = self.rng.random(len(requests))
        target = np.zeros(len(requests), dtype=np.int64)
        for k in np.flatnonzero(self.gammas > 1.0):
            B = b[k + 1]
            hit = (L > B) & (L <= self.gammas[k] * B) & (out < B) & (u < self.success_probability)
            target[hit] = int(B)
        return target

    def compress(self, requests: Requests) -> Requests:
        """The stream with every successfully compressed prompt cut to :math:`B_k - l_{out}` (outputs kept)."""
        target = self.compressed(requests)
        prompt = np.where(target > 0, target - requests.output_tokens, requests.prompt_tokens)
        return Requests(requests.arrival_at_s, prompt, requests.output_tokens, requests.service_s)

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        """Length routing of a stream already passed through :meth:`compress` (an uncompressed band request
        goes to the pool above, as a failed compression does)."""
        return self._length.route(prompt_tokens, output_tokens)


class SpilloverRouter:
    """Length routing with spillover to the next pool up when the first pool's queue is long (module docstring).

    Parameters
    ----------
    boundaries : sequence of float
        :math:`b_0 < b_1 < \\dots < b_M` in tokens; pool :math:`k` serves
        :math:`(b_k, b_{k+1}]`.
    pool_names : sequence of str
        :math:`M` distinct names, one per segment, shortest window first.
    bound : int
        :math:`q_{max} \\ge 0`: a request spills when more than this many requests
        wait in its primary pool at its arrival.

    Examples
    --------
    >>> r = SpilloverRouter([0, 100, 400], ["s", "l"], 8)
    >>> r.route(np.array([50, 150]), np.array([10, 30])).tolist(), r.spill_to, r.spill_bound
    ([0, 1], (1, -1), 8)
    """

    def __init__(self, boundaries, pool_names, bound: int) -> None:
        self._length = LengthRouter(boundaries, pool_names)
        self.pool_names = self._length.pool_names
        if len(self.pool_names) != len(self._length.boundaries) - 1:
            raise ValueError(f"pool_names must be distinct; got {list(pool_names)}")
        if isinstance(bound, bool) or not isinstance(bound, (int, np.integer)) or bound < 0:
            raise ValueError(f"bound must be a whole number >= 0; got {bound!r}")
        self.spill_bound = int(bound)
        self.spill_to = tuple(range(1, len(self.pool_names))) + (-1,)

    def __repr__(self) -> str:
        return f"SpilloverRouter({self._length.boundaries.tolist()}, {list(self.pool_names)}, bound={self.spill_bound})"

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        """Primary pools: length routing (the engine spills at arrival)."""
        return self._length.route(prompt_tokens, output_tokens)
