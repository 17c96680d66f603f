"""What enters the simulator: request streams, routers between pools and dispatch within a pool.

Everything here is decided *before* the event loop of :mod:`fleetopt.solvers.des.engine` runs,
because arrivals are exogenous: the arrival instants and lengths of every
request, and the pool each request goes to. Only the replica a request joins
inside its pool may depend on the live state (join-shortest-queue), so that
choice is a small strategy (:class:`Dispatch`) the engine calls per arrival;
and a :class:`LiveRouter` (spillover) names, per pool, a pool that takes the
request instead when the first one's queue is long at its arrival, which the
engine decides from its live queues.

All randomness comes in through an explicit ``numpy.random.Generator``.

Request streams
---------------
* :func:`poisson_arrivals` - arrival instants of a Poisson process;
* :func:`sample_lengths` - prompt and output tokens from a
  :class:`fleetopt.models.workload.LengthDistribution` or a trace's own pairs;
* :func:`poisson_requests` - both at once;
* :func:`replay_trace` - a :class:`fleetopt.models.workload.RequestTrace` with its own
  timestamps, rescaled to a target mean rate.

Routers (:class:`Router`)
-------------------------
:class:`LengthRouter`, :class:`RandomRouter`, :class:`SplitRouter`; each maps
the request arrays to pool names, vectorized, and returns ``-1`` where no pool
takes a request (the simulator records those as ``REJECTED``).
:class:`LiveRouter` adds ``spill_to`` and ``spill_bound`` to a router
(:class:`fleetopt.solvers.des.routers.SpilloverRouter`); the router stays a plain
object that holds no state of the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from collections.abc import Callable, Sequence

import numpy as np

from fleetopt.models.workload import DEFAULT_INPUT_FRACTION, LengthDistribution, RequestTrace

__all__ = [
    "Requests", "poisson_arrivals", "sample_lengths", "poisson_requests", "replay_trace",
    "Router", "LiveRouter", "LengthRouter", "RandomRouter", "SplitRouter",
    "Dispatch", "JoinShortestQueue", "LeastQueue", "RoundRobin",
]


@dataclass(frozen=True, eq=False)
class Requests:
    """A request stream: plain arrays, one entry per request, in arrival order.

    Parameters
    ----------
    arrival_at_s : array of float
        Arrival instants in seconds, non-decreasing, finite and >= 0.
    prompt_tokens, output_tokens : array of int
        Tokens of each request, >= 0 each and >= 1 in total.
    service_s : array of float, optional
        Slot holding time :math:`S` of each request, for ``mode="slot"`` only
        (None: computed from the pool's profile, see :func:`fleetopt.solvers.des.engine.simulate`).
    """

    arrival_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    service_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        a = np.asarray(self.arrival_at_s, dtype=float)
        p = np.asarray(self.prompt_tokens)
        o = np.asarray(self.output_tokens)
        n = len(a)
        if a.ndim != 1 or p.shape != (n,) or o.shape != (n,):
            raise ValueError(f"requests: arrival_at_s, prompt_tokens and output_tokens must be 1-D arrays of one "
                             f"length; got shapes {a.shape}, {p.shape}, {o.shape}")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            i = int(np.flatnonzero(~np.isfinite(a) | (a < 0))[0])
            raise ValueError(f"requests: arrival_at_s[{i}] must be finite and >= 0; got {a[i]}")
        bad = np.flatnonzero(np.diff(a) < 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise ValueError(f"requests: arrival_at_s must not decrease; arrival_at_s[{i}] = {a[i]} < {a[i - 1]}")
        for name, v in (("prompt_tokens", p), ("output_tokens", o)):
            if n and (not np.all(np.equal(np.mod(v, 1), 0)) or np.any(v < 0)):
                i = int(np.flatnonzero((np.mod(v, 1) != 0) | (v < 0))[0])
                raise ValueError(f"requests: {name}[{i}] must be a whole number >= 0; got {v[i]}")
        if n and np.any(p + o < 1):
            i = int(np.flatnonzero(p + o < 1)[0])
            raise ValueError(f"requests: request {i} has no tokens at all")
        object.__setattr__(self, "arrival_at_s", a)
        object.__setattr__(self, "prompt_tokens", p.astype(np.int64))
        object.__setattr__(self, "output_tokens", o.astype(np.int64))
        if self.service_s is not None:
            s = np.asarray(self.service_s, dtype=float)
            if s.shape != (n,) or not np.all(np.isfinite(s)) or np.any(s <= 0):
                raise ValueError("requests: service_s must be one finite value > 0 per request")
            object.__setattr__(self, "service_s", s)

    def __len__(self) -> int:
        return len(self.arrival_at_s)

    @property
    def total_tokens(self) -> np.ndarray:
        """:math:`L = l_{in} + l_{out}` of every request."""
        return self.prompt_tokens + self.output_tokens


def poisson_arrivals(rate_req_per_s: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Arrival instants of a Poisson process of rate :math:`\\lambda`, from time 0.

    .. math:: t_i = \\sum_{j \\le i} E_j, \\qquad E_j \\sim \\mathrm{Exp}(\\lambda) \\text{ i.i.d.}

    Examples
    --------
    >>> t = poisson_arrivals(2.0, 4, np.random.default_rng(1))
    >>> t.shape, bool(np.all(np.diff(t) > 0))
    ((4,), True)
    """
    if not rate_req_per_s > 0 or not np.isfinite(rate_req_per_s):
        raise ValueError(f"rate_req_per_s must be finite and > 0; got {rate_req_per_s}")
    if n < 0:
        raise ValueError(f"n must be >= 0; got {n}")
    return np.cumsum(rng.exponential(1.0 / rate_req_per_s, size=n))


def sample_lengths(source: LengthDistribution | RequestTrace, n: int, rng: np.random.Generator,
                   input_fraction: float = DEFAULT_INPUT_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output tokens of ``n`` requests drawn i.i.d. from ``source``.

    For a :class:`~fleetopt.models.workload.LengthDistribution` of total length :math:`L`
    (continuous) with input fraction :math:`f`:

    .. math::

        \\tilde L = \\max(\\lceil L \\rceil, 2), \\quad
        l_{in} = \\min(\\max(\\mathrm{rint}(f \\tilde L), 1), \\tilde L - 1), \\quad
        l_{out} = \\tilde L - l_{in}

    (``rint`` rounds half to even), so both parts are whole numbers >= 1 and the
    total is :math:`\\lceil L \\rceil`: a length in :math:`(b_i, b_j]` with whole
    boundaries stays in that segment. For a :class:`~fleetopt.models.workload.RequestTrace`
    whole rows are drawn with replacement, keeping each request's own pair
    (``input_fraction`` unused).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0; got {n}")
    if isinstance(source, RequestTrace):
        rows = rng.integers(0, len(source.arrived_at_s), size=n)
        return (np.asarray(source.prompt_tokens)[rows].astype(np.int64),
                np.asarray(source.output_tokens)[rows].astype(np.int64))
    if not isinstance(source, LengthDistribution):
        raise TypeError(f"source must be a LengthDistribution or a RequestTrace; got {type(source).__name__}")
    if not 0.0 < input_fraction < 1.0:
        raise ValueError(f"input_fraction must lie in (0, 1); got {input_fraction}")
    total = np.maximum(np.ceil(source.sample(rng, n)), 2.0).astype(np.int64)
    prompt = np.clip(np.rint(input_fraction * total).astype(np.int64), 1, total - 1)
    return prompt, total - prompt


def poisson_requests(source: LengthDistribution | RequestTrace, rate_req_per_s: float, n: int,
                     rng: np.random.Generator, input_fraction: float = DEFAULT_INPUT_FRACTION) -> Requests:
    """``n`` Poisson arrivals of rate ``rate_req_per_s`` with lengths from ``source`` (:func:`sample_lengths`)."""
    arrival = poisson_arrivals(rate_req_per_s, n, rng)
    prompt, output = sample_lengths(source, n, rng, input_fraction)
    return Requests(arrival, prompt, output)


def replay_trace(trace: RequestTrace, rate_req_per_s: float | None = None) -> Requests:
    """The trace's own requests at its own instants, shifted to start at 0 and rescaled to a mean rate.

    .. math:: t'_i = (t_i - t_0)\\, \\frac{\\hat\\lambda}{\\lambda^*}, \\qquad
              \\hat\\lambda = \\frac{n - 1}{t_{n-1} - t_0}

    with :math:`\\lambda^*` = ``rate_req_per_s`` (None keeps the trace's own rate).
    Deterministic: no generator needed.
    """
    t = np.asarray(trace.arrived_at_s, dtype=float)
    t = t - t[0]
    if rate_req_per_s is not None:
        if not rate_req_per_s > 0 or not np.isfinite(rate_req_per_s):
            raise ValueError(f"rate_req_per_s must be finite and > 0; got {rate_req_per_s}")
        own = trace.mean_rate_req_per_s
        if not np.isfinite(own):
            raise ValueError("the trace has no mean rate to rescale (fewer than two distinct instants)")
        t = t * (own / rate_req_per_s)
    return Requests(t, np.asarray(trace.prompt_tokens), np.asarray(trace.output_tokens))


@runtime_checkable
class Router(Protocol):
    """Decides the pool of every request before the run.

    ``pool_names`` are the pools the router may send to;
    ``route(prompt_tokens, output_tokens)`` returns, per request, an index into
    ``pool_names`` or ``-1`` (no pool takes it).
    """

    pool_names: tuple[str, ...]

    def route(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray: ...


@runtime_checkable
class LiveRouter(Protocol):
    """A :class:`Router` whose choice may change at a request's arrival, from the live queues (spillover).

    ``route`` gives each request's *primary* pool before the run, as for any
    router. ``spill_to[k]`` is the index into ``pool_names`` of the pool that
    takes a request of primary pool ``k`` instead when, at its arrival, more
    than ``spill_bound`` requests wait in pool ``k`` (not yet admitted, over its
    replicas), or ``-1`` when pool ``k`` never spills. The engine applies it
    once per request (one hop), and only when the request fits the other pool's
    window (:mod:`fleetopt.solvers.des.engine`, "Live routing (spillover)").
    """

    pool_names: tuple[str, ...]
    spill_to: tuple[int, ...]
    spill_bound: int

    def route(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray: ...


def _names(pool_names) -> tuple[str, ...]:
    names = tuple(str(x) for x in pool_names)
    if not names:
        raise ValueError("pool_names must not be empty")
    return names


def _boundaries(boundaries, segments: int | None = None) -> np.ndarray:
    b = np.asarray(boundaries, dtype=float)
    if b.ndim != 1 or len(b) < 2 or b[0] < 0 or np.any(np.diff(b) <= 0) or not np.all(np.isfinite(b)):
        raise ValueError(f"boundaries must be >= 2 finite, increasing token counts >= 0; got {list(b)}")
    if segments is not None and len(b) - 1 != segments:
        raise ValueError(f"{len(b)} boundaries make {len(b) - 1} segments, but {segments} were given")
    return b


def _segment(b: np.ndarray, total) -> np.ndarray:
    """Index :math:`k` of the segment :math:`(b_k, b_{k+1}]` holding each total length; -1 outside."""
    L = np.asarray(total, dtype=float)
    k = np.searchsorted(b, L, side="left") - 1
    return np.where((L > b[0]) & (L <= b[-1]), k, -1)


class LengthRouter:
    """Route by total length: :math:`L = l_{in} + l_{out} \\in (b_k, b_{k+1}]` goes to ``pool_names[k]``.

    Parameters
    ----------
    boundaries : sequence of float
        :math:`b_0 < b_1 < \\dots < b_M` in tokens.
    pool_names : sequence of str
        :math:`M` names, one per segment; a name may repeat (one pool, several segments).

    Examples
    --------
    >>> r = LengthRouter([0, 4096, 8192], ["short", "long"])
    >>> r.route(np.array([100, 4000, 9000]), np.array([10, 96, 1])).tolist()
    [0, 0, -1]
    """

    def __init__(self, boundaries, pool_names) -> None:
        names = _names(pool_names)
        self.boundaries = _boundaries(boundaries, len(names))
        self.pool_names = tuple(dict.fromkeys(names))
        self._target = np.array([self.pool_names.index(x) for x in names], dtype=np.int64)

    def __repr__(self) -> str:
        return f"LengthRouter({self.boundaries.tolist()}, {list(self.pool_names)})"

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        k = _segment(self.boundaries, np.asarray(prompt_tokens) + np.asarray(output_tokens))
        return np.where(k >= 0, self._target[np.maximum(k, 0)], -1)


def _shares(shares, width: int, what: str) -> np.ndarray:
    w = np.asarray(shares, dtype=float)
    if w.shape[-1] != width or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"{what} must be {width} finite weights >= 0 per row; got {w.tolist()}")
    sums = w.sum(axis=-1)
    if np.any(sums <= 0):
        raise ValueError(f"{what}: every row needs a positive weight; got {w.tolist()}")
    return np.cumsum(w, axis=-1) / sums[..., None]


class RandomRouter:
    """Send each request to a pool at random, independently of its length.

    .. math:: P(\\text{pool } p) = w_p / \\sum_q w_q

    Parameters
    ----------
    shares : mapping of str to float
        Pool name to weight :math:`w_p \\ge 0`.
    rng : numpy.random.Generator
        Source of the draws; :meth:`route` consumes it (one uniform per request).
    """

    def __init__(self, shares: dict, rng: np.random.Generator) -> None:
        self.pool_names = _names(shares.keys())
        self._cum = _shares(list(shares.values()), len(self.pool_names), "shares")
        self.rng = rng

    def __repr__(self) -> str:
        return f"RandomRouter({dict(zip(self.pool_names, np.diff(self._cum, prepend=0.0).tolist()))})"

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        u = self.rng.random(len(np.asarray(prompt_tokens)))
        return np.minimum(np.searchsorted(self._cum, u, side="right"), len(self.pool_names) - 1)


class SplitRouter:
    """Split each length segment's traffic between pools with its own weights.

    A request of total length in :math:`(b_k, b_{k+1}]` goes to pool :math:`p`
    with probability :math:`w_{kp} / \\sum_q w_{kq}` (the weighted router of
    :mod:`fleetopt.solvers.split`); lengths outside :math:`(b_0, b_M]` get ``-1``.

    Parameters
    ----------
    boundaries : sequence of float
        :math:`M + 1` increasing boundaries in tokens.
    pool_names : sequence of str
        The pools (columns of ``shares``).
    shares : array of shape (M, len(pool_names))
        Weights :math:`w_{kp} \\ge 0`, each row with a positive sum.
    rng : numpy.random.Generator
        Source of the draws; :meth:`route` consumes one uniform per request.
    """

    def __init__(self, boundaries, pool_names, shares, rng: np.random.Generator) -> None:
        self.pool_names = _names(pool_names)
        w = np.atleast_2d(np.asarray(shares, dtype=float))
        self.boundaries = _boundaries(boundaries, w.shape[0])
        self._cum = _shares(w, len(self.pool_names), "shares")
        self.rng = rng

    def __repr__(self) -> str:
        return f"SplitRouter({self.boundaries.tolist()}, {list(self.pool_names)})"

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        k = _segment(self.boundaries, np.asarray(prompt_tokens) + np.asarray(output_tokens))
        u = self.rng.random(len(k))
        pick = np.sum(u[:, None] >= self._cum[np.maximum(k, 0)], axis=1)
        return np.where(k >= 0, np.minimum(pick, len(self.pool_names) - 1), -1)


@runtime_checkable
class Dispatch(Protocol):
    """Chooses the replica of a pool that an arriving request joins.

    ``bind(replicas, outstanding, waiting)`` is called once when a run starts,
    with the global replica indices of every pool (``replicas[p]``, a
    ``range``), the engine's live list of outstanding requests (running plus
    waiting) per replica, and ``waiting(r)``, the number of requests waiting
    at replica ``r`` (queued, not yet admitted to its batch or slots; what
    counts as waiting in each path is stated in :mod:`fleetopt.solvers.des.engine`,
    "Dispatch within a pool"). It returns ``choose(p) -> replica``, called
    once per arrival, before the request is counted anywhere.
    """

    name: str

    def bind(self, replicas: Sequence[range], outstanding: list,
             waiting: Callable[[int], int]) -> Callable[[int], int]: ...


class JoinShortestQueue:
    """Join the replica with the fewest outstanding requests (running plus waiting); ties go to the lowest index."""

    name = "jsq"

    def __repr__(self) -> str:
        return "JoinShortestQueue()"

    def bind(self, replicas: Sequence[range], outstanding: list,
             waiting: Callable[[int], int] | None = None) -> Callable[[int], int]:
        key = outstanding.__getitem__
        ranges = list(replicas)
        return lambda p: min(ranges[p], key=key)


class LeastQueue:
    """Join the replica with the fewest *waiting* requests; ties go to the lowest index.

    .. math:: r^* = \\min \\operatorname*{arg\\,min}_{r \\in R_p} q_r

    where :math:`R_p` are the replicas of the request's pool and :math:`q_r`
    the requests queued at replica :math:`r` and not yet admitted to its batch
    (``waiting(r)`` of :meth:`Dispatch.bind`). Running sequences do not count,
    so a replica with a long running batch and an empty queue ties with an idle
    one; unlike :class:`JoinShortestQueue` it does not see how loaded a replica
    is until its batch is full.

    Source: the in-pool dispatch of the reference tool, vllm-sr-sim
    (vllm-project/semantic-router ``src/fleet-sim``): a pool's default
    ``lb_strategy`` is ``"least_queue"`` (``PoolConfig`` in
    ``fleet_sim/core/fleet.py``), which sends a request to the instance with
    the fewest queued (not yet admitted) requests, the first such instance on
    a tie. Here ties go to the lowest global replica index, as for
    :class:`JoinShortestQueue`.
    """

    name = "least-queue"

    def __repr__(self) -> str:
        return "LeastQueue()"

    def bind(self, replicas: Sequence[range], outstanding: list,
             waiting: Callable[[int], int]) -> Callable[[int], int]:
        ranges = list(replicas)
        return lambda p: min(ranges[p], key=waiting)


class RoundRobin:
    """Cycle through a pool's replicas in index order, one arrival each."""

    name = "round-robin"

    def __repr__(self) -> str:
        return "RoundRobin()"

    def bind(self, replicas: Sequence[range], outstanding: list,
             waiting: Callable[[int], int] | None = None) -> Callable[[int], int]:
        ranges = list(replicas)
        turn = [0] * len(ranges)

        def choose(p: int) -> int:
            k = turn[p]
            turn[p] = k + 1
            r = ranges[p]
            return r.start + k % len(r)

        return choose
