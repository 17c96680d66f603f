"""Metrics of simulation runs: latencies, percentiles, SLO attainment, Little's law and confidence intervals.

Everything is computed with numpy from the columns of a
:class:`fleetopt.solvers.des.records.SimResult`; nothing here changes a run. Latencies of a
request (seconds):

.. math::

    \\mathrm{wait} = t_{start} - t_{arr}, \\quad \\mathrm{TTFT} = t_{first} - t_{arr}, \\quad
    \\mathrm{E2E} = t_{end} - t_{arr}, \\quad
    \\mathrm{TPOT} = \\frac{t_{end} - t_{first}}{l_{out} - 1} \\; (l_{out} > 1)

(TPOT is the benchmark definition, e.g. vLLM's ``benchmark_serving``; in
iteration mode the engine runs :math:`l_{out}` decode iterations after the
first token, as :math:`S` in :mod:`fleetopt.models.service` counts them, so there TPOT
is :math:`l_{out}/(l_{out}-1)` times the mean decode-iteration time).

Percentiles are taken over ``COMPLETED`` requests only; the summary counts the
unfinished and rejected ones beside them, so none disappears silently.
Confidence intervals use batch means within one run or independent
replications (:func:`replicate` spawns their generators from one
``numpy.random.SeedSequence``).

References
----------
.. [1] A. M. Law, *Simulation Modeling and Analysis*, 5th ed., McGraw-Hill 2015,
       ch. 9 (replication/deletion and batch means).
.. [2] J. D. C. Little, "A proof for the queuing formula L = lambda W", Oper. Res. 9 (1961) 383-387.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.solvers.des.records import Outcome, SimResult

__all__ = [
    "PERCENTILE_METHOD", "percentile", "wait_s", "ttft_s", "e2e_s", "tpot_s", "steady_mask", "slo_attainment",
    "Quantiles", "SimSummary", "summarize", "littles_law", "Estimate", "replications_ci", "quantile_ci",
    "batch_means_ci",
    "Replications", "replication_rngs", "replicate",
]

PERCENTILE_METHOD = "inverted_cdf"
"""numpy percentile method: the empirical quantile :math:`\\min\\{x : F_n(x) \\ge q\\}` (never interpolates)."""


def percentile(values, q):
    """The ``q``-th percentile (``q`` in percent) of finite ``values``, by :data:`PERCENTILE_METHOD`.

    .. math:: x_{(q)} = \\min\\{x : \\hat F_n(x) \\ge q/100\\}

    Raises ``ValueError`` for an empty sample or a NaN (filter with a mask first).

    Examples
    --------
    >>> float(percentile([1.0, 2.0, 3.0, 4.0], 50))
    2.0
    """
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        raise ValueError("percentile of an empty sample")
    if np.any(np.isnan(v)):
        raise ValueError("percentile: values contain NaN (requests without that time); select them out first")
    return np.percentile(v, q, method=PERCENTILE_METHOD)


def wait_s(result: SimResult) -> np.ndarray:
    """Queueing wait :math:`t_{start} - t_{arr}` of every request (NaN if it never started)."""
    return result.start_at_s - result.arrival_at_s


def ttft_s(result: SimResult) -> np.ndarray:
    """Time to first token :math:`t_{first} - t_{arr}` (NaN if no first token)."""
    return result.first_token_at_s - result.arrival_at_s


def e2e_s(result: SimResult) -> np.ndarray:
    """End-to-end latency :math:`t_{end} - t_{arr}` (NaN unless completed)."""
    return result.end_at_s - result.arrival_at_s


def tpot_s(result: SimResult) -> np.ndarray:
    """Time per output token :math:`(t_{end} - t_{first})/(l_{out} - 1)`; NaN if :math:`l_{out} \\le 1` or unknown."""
    out = result.output_tokens.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(out > 1, (result.end_at_s - result.first_token_at_s) / (out - 1), np.nan)


def steady_mask(result: SimResult, warmup: float = 0.1, by: str = "time") -> np.ndarray:
    """Requests kept after discarding a warm-up.

    ``by="time"``: drop arrivals before ``warmup`` x the run's end instant
    (``window_end_s``: the horizon, or the last event of a drained run);
    ``by="requests"``: drop the first ``warmup`` share of requests (in arrival order).
    """
    if not 0.0 <= warmup < 1.0:
        raise ValueError(f"warmup must lie in [0, 1); got {warmup}")
    n = len(result.arrival_at_s)
    if by == "time":
        return result.arrival_at_s >= warmup * result.window_end_s
    if by == "requests":
        return np.arange(n) >= int(np.floor(warmup * n))
    raise ValueError(f"by must be 'time' or 'requests'; got {by!r}")


def slo_attainment(result: SimResult, ttft_slo_s: float, mask=None) -> float:
    """Share of the requests in ``mask`` whose TTFT is at most ``ttft_slo_s``.

    Requests without a first token (unfinished or rejected) count as misses,
    so exclude the last ``ttft_slo_s`` before a horizon from ``mask`` if that
    would be unfair to them.
    """
    sel = np.ones(len(result.arrival_at_s), bool) if mask is None else np.asarray(mask, bool)
    if not sel.any():
        raise ValueError("slo_attainment: the mask selects no request")
    t = ttft_s(result)[sel]
    return float(np.mean(np.isfinite(t) & (t <= ttft_slo_s)))


@dataclass(frozen=True)
class Quantiles:
    """P50/P90/P99 of one latency in seconds (None when no request has it)."""

    p50_s: float | None
    p90_s: float | None
    p99_s: float | None


def _quantiles(values: np.ndarray) -> Quantiles:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return Quantiles(None, None, None)
    p = percentile(v, [50, 90, 99])
    return Quantiles(float(p[0]), float(p[1]), float(p[2]))


@dataclass(frozen=True)
class SimSummary:
    """Latency percentiles of the completed requests of a selection, with every outcome counted."""

    n_requests: int
    n_completed: int
    n_unfinished: int
    n_rejected: int
    ttft: Quantiles
    wait: Quantiles
    e2e: Quantiles
    tpot: Quantiles
    ttft_slo_s: float | None
    slo_attainment: float | None


def summarize(result: SimResult, mask=None, ttft_slo_s: float | None = None) -> SimSummary:
    """Summary of the requests in ``mask`` (all by default; see :func:`steady_mask` and ``result.pool == k``)."""
    sel = np.ones(len(result.arrival_at_s), bool) if mask is None else np.asarray(mask, bool)
    done = sel & (result.outcome == Outcome.COMPLETED)
    att = slo_attainment(result, ttft_slo_s, sel) if ttft_slo_s is not None and sel.any() else None
    return SimSummary(
        int(sel.sum()), int(done.sum()), int((sel & (result.outcome == Outcome.UNFINISHED)).sum()),
        int((sel & (result.outcome == Outcome.REJECTED)).sum()),
        _quantiles(ttft_s(result)[done]), _quantiles(wait_s(result)[done]), _quantiles(e2e_s(result)[done]),
        _quantiles(tpot_s(result)[done]), ttft_slo_s, att)


def littles_law(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """Both sides of Little's law per pool over the run's window :math:`[T_0, T_1]`.

    .. math::

        L = \\frac{1}{T_1 - T_0}\\int_{T_0}^{T_1} N(t)\\,dt, \\qquad
        \\lambda W = \\frac{n}{T_1 - T_0} \\cdot \\frac{1}{n}\\sum_i |[a_i, d_i] \\cap [T_0, T_1]|

    :math:`L` is the engine's own time integral, :math:`\\lambda W` comes from the
    request records (sojourns clipped to the window, :math:`d_i = T_1` if still
    in the system), so the two agree exactly on any window when the engine's
    bookkeeping is right; with a drained run and :math:`T_0 = 0` the right side
    is the plain arrival rate times the mean sojourn.

    Returns
    -------
    (L, lambda_W) : arrays over pools
    """
    t0, t1 = result.window_start_s, result.window_end_s
    inside = (result.outcome != Outcome.REJECTED) & (result.arrival_at_s <= t1)
    d = np.where(np.isnan(result.end_at_s), t1, result.end_at_s)
    clipped = np.clip(np.minimum(d, t1) - np.maximum(result.arrival_at_s, t0), 0.0, None)
    pool = np.where(inside, result.pool, len(result.pool_names))
    lam_w = np.bincount(pool, clipped, len(result.pool_names) + 1)[:-1] / (t1 - t0)
    return result.pool_mean_in_system, lam_w


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a two-sided confidence interval ``[low, high]`` from ``n`` batches or replications."""

    value: float
    low: float
    high: float
    confidence: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


def _t_quantile(p: float, df: int):
    """Quantile :math:`t_{df, p}` of Student's t with ``df`` degrees of freedom.

    ``scipy.special.stdtrit``, the function ``scipy.stats.t.ppf`` evaluates (so the same float), imported here
    rather than ``scipy.stats``, whose import costs about half a second of CPU on every simulation (and through
    :data:`fleetopt.models.numerics.special`, like every use of SciPy in the package).

    >>> round(float(_t_quantile(0.975, 4)), 4)
    2.7764
    """
    from fleetopt.models.numerics import special

    return special.stdtrit(df, p)


def _t_interval(samples: np.ndarray, confidence: float) -> Estimate:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence}")
    x = np.asarray(samples, dtype=float)
    if x.size < 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"a confidence interval needs >= 2 finite samples; got {x.tolist()}")
    m = float(x.mean())
    half = float(_t_quantile(0.5 + confidence / 2.0, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return Estimate(m, m - half, m + half, confidence, int(x.size))


def replications_ci(estimates, confidence: float = 0.95) -> Estimate:
    """Student-t interval over independent replications' estimates :math:`\\hat\\theta_1, \\dots, \\hat\\theta_R`.

    .. math:: \\bar\\theta \\pm t_{R-1, (1+\\gamma)/2}\\, s / \\sqrt{R}
    """
    return _t_interval(np.asarray(estimates, dtype=float), confidence)


def _inverted_cdf_index(levels, n: int) -> np.ndarray:
    """Indices into a sorted sample of ``n`` of its empirical quantiles at ``levels`` in [0, 1]
    (:data:`PERCENTILE_METHOD`: the smallest :math:`x_{(i)}` with :math:`i/n \\ge p`, i.e. :math:`i = \\lceil np
    \\rceil`, 1-based; the minimum at :math:`p = 0`). One sort and an index, where ``numpy.percentile`` with many
    levels partitions the sample once per level.

    >>> s = np.array([1.0, 2.0, 3.0, 4.0])
    >>> s[_inverted_cdf_index(np.array([0.0, 0.25, 0.26, 0.5, 1.0]), 4)].tolist()
    [1.0, 1.0, 2.0, 2.0, 4.0]
    """
    return np.clip(np.ceil(np.asarray(levels, dtype=float) * n).astype(np.int64) - 1, 0, n - 1)


def quantile_ci(groups, q: float = 99.0, confidence: float = 0.95) -> Estimate:
    """The ``q``-th percentile of pooled samples with an interval from independent groups (replications or batches).

    The estimate is the percentile of all groups pooled. The interval inverts
    the Student-t interval of the groups' empirical CDFs :math:`\\hat F_g`
    (:func:`replications_ci` applied to :math:`\\hat F_1(x), \\dots, \\hat F_G(x)`):

    .. math::

        x_{lo} = \\min\\{x : \\bar F(x) + \\delta(x) \\ge p\\}, \\qquad
        x_{hi} = \\min\\{x : \\bar F(x) - \\delta(x) \\ge p\\}, \\qquad
        \\delta(x) = t_{G-1,(1+\\gamma)/2}\\, s(x)/\\sqrt{G}

    with :math:`p = q/100`, searched over the pooled sample's values
    (:math:`x_{hi} = \\infty` when no value qualifies). Unlike the mean of the
    groups' own percentiles, this does not inherit the small-sample bias of a
    percentile of one short, correlated group.
    """
    gs = [np.sort(np.asarray(g, dtype=float)) for g in groups]
    if len(gs) < 2 or any(g.size == 0 for g in gs):
        raise ValueError("quantile_ci needs >= 2 non-empty groups")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1); got {confidence}")
    pooled = np.sort(np.concatenate(gs))
    value = float(percentile(pooled, q))                 # raises on NaN: the values below compare as numbers
    distinct = np.concatenate(([True], pooled[1:] != pooled[:-1]))     # np.unique of the sorted sample, no re-sort
    if np.count_nonzero(distinct) > 20_000:  # search a fine grid of the pooled quantiles instead of every value
        x = unique(pooled[_inverted_cdf_index(np.linspace(0.0, 100.0, 20_001) / 100.0, pooled.size)])
    else:
        x = pooled[distinct]
    F = np.array([np.searchsorted(g, x, side="right") / g.size for g in gs])
    t = _t_quantile(0.5 + confidence / 2.0, len(gs) - 1)
    mean, half = F.mean(axis=0), t * F.std(axis=0, ddof=1) / np.sqrt(len(gs))
    p = q / 100.0
    lo_ok, hi_ok = np.flatnonzero(mean + half >= p), np.flatnonzero(mean - half >= p)
    low = float(x[lo_ok[0]]) if lo_ok.size else float(x[-1])
    high = float(x[hi_ok[0]]) if hi_ok.size else float("inf")
    return Estimate(value, min(low, value), max(high, value), confidence, len(gs))


def batch_means_ci(values, q: float = 99.0, n_batches: int = 20, confidence: float = 0.95) -> Estimate:
    """Interval for the ``q``-th percentile of one run: :func:`quantile_ci` over contiguous batches.

    The time-ordered sample is cut into ``n_batches`` contiguous batches of
    (almost) equal size; they stand in for independent replications, which
    holds when a batch is long compared with the sample's correlation time.
    """
    v = np.asarray(values, dtype=float)
    if n_batches < 2:
        raise ValueError(f"n_batches must be >= 2; got {n_batches}")
    if v.size < n_batches:
        raise ValueError(f"{v.size} values cannot fill {n_batches} batches")
    return quantile_ci(np.array_split(v, n_batches), q, confidence)


@dataclass(frozen=True)
class Replications:
    """Independent runs and the seed their generators were spawned from (report it with the results)."""

    seed: int
    results: tuple


def replication_rngs(seed: int, n_replications: int) -> list[np.random.Generator]:
    """The generators of ``n_replications`` independent replications: one per child of
    ``numpy.random.SeedSequence(seed).spawn(n_replications)``, so each replication's draws depend on ``seed`` and
    its index alone (not on the others, nor on where or in which order they run)."""
    if n_replications < 1:
        raise ValueError(f"n_replications must be >= 1; got {n_replications}")
    return [np.random.default_rng(c) for c in np.random.SeedSequence(seed).spawn(n_replications)]


def replicate(run: Callable[[np.random.Generator], object], seed: int, n_replications: int,
              mapper: Callable = map) -> Replications:
    """Run ``run(rng)`` once per generator of :func:`replication_rngs` ``(seed, n_replications)``.

    ``run`` builds everything random (arrivals, lengths, routers) from the
    generator it is given, so replications are independent and reproducible.
    ``mapper(run, generators)`` runs them (the builtin ``map`` by default); any
    map that gives the results in the order of the generators, e.g. on other
    processes, gives the same :class:`Replications`.
    """
    return Replications(int(seed), tuple(mapper(run, replication_rngs(seed, n_replications))))
