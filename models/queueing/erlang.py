"""Queueing formulas: Erlang-C, waiting-time tails, P99 TTFT and minimum replicas.

Each KV-cache slot is a server of an M/G/c queue: a pool of :math:`N` replicas
with :math:`n` slots each has :math:`c = Nn` servers; with arrival rate
:math:`\\lambda` and mean slot-holding time :math:`E[S]` the offered load is
:math:`a = \\lambda E[S]` Erlangs and the utilisation :math:`\\rho = a/c`.

The probability of waiting is the Erlang-C formula, computed through the
Erlang-B value in log space from the Poisson pmf and cdf,

.. math::

    B(c, a) = \\frac{a^c / c!}{\\sum_{k=0}^{c} a^k/k!} = \\frac{\\mathrm{pmf}(c; a)}{\\mathrm{cdf}(c; a)},
    \\qquad C(c, a) = \\frac{B}{1 - \\rho(1 - B)}

(exact and stable for :math:`c` up to :math:`10^6` and beyond; no loop over
:math:`c`). The waiting time has an atom :math:`1 - C` at zero and, by the
Kimura-style M/G/c approximation used in the seeds, an exponential tail

.. math::

    P(W_q > x) = C\\, e^{-\\theta x}, \\qquad \\theta = \\frac{2 (c\\mu - \\lambda)}{1 + c_s^2},
    \\quad \\mu = 1/E[S]

so :math:`W_{99} = \\ln(C/q)/\\theta` when :math:`C > q` and 0 otherwise, with
:math:`q = 0.01` the tail mass above the 99th percentile
(:data:`fleetopt.models.units.P99_TAIL`; :func:`wait_p99_from_tail_s`).

Time to first token is wait plus prefill. Two models (``ttft_model``):

* ``mean-prefill`` (the seeds' convention): :math:`T_{99} = W_{99} + E[T_{pf}]`;
* ``tail``: the true 99th percentile of :math:`W_q + T_{pf}` with the segment's
  own prefill distribution (atoms :math:`p_k` at :math:`\\tau_k`):

  .. math::

      P(T > t) = \\sum_k p_k \\left[ \\tau_k > t \\; ? \\; 1 : \\min(1, C e^{-\\theta (t - \\tau_k)}) \\right]

References
----------
.. [1] A. K. Erlang; L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975, Ch. 3.
.. [2] T. Kimura, "Approximations for multi-server queues: system interpolations",
       Queueing Systems 17 (1994) 347-382.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetopt.models.numerics import bisect_boundary, special
from fleetopt.models.units import P99, P99_TAIL

__all__ = [
    "erlang_c", "wait_decay_rate", "wait_exceed_prob", "wait_p99_from_tail_s", "wait_p99_s", "ttft_exceed_prob",
    "ttft_miss_prob", "ttft_p99_s", "prefill_p99_s", "min_replicas", "utilization_floor", "max_load_erlangs",
    "miss_coefficients", "Sizing", "TTFT_MODELS",
]

TTFT_MODELS = ("tail", "mean-prefill")
_MAX_REPLICAS = 10**7


def erlang_c(servers, offered_load):
    """Probability of waiting :math:`C(c, a)` in an M/M/c queue (array-aware).

    Returns 1 where :math:`a \\ge c` (unstable) and 0 where :math:`a = 0`.

    Examples
    --------
    >>> round(float(erlang_c(1, 0.5)), 12)          # C(1, a) = rho
    0.5
    >>> round(float(erlang_c(2, 1.0)), 12)          # M/M/2 at a = 1: exactly 1/3
    0.333333333333
    """
    c = np.asarray(servers, dtype=float)
    a = np.asarray(offered_load, dtype=float)
    if np.any(c < 1) or np.any(c != np.floor(c)):
        raise ValueError("servers must be whole numbers >= 1")
    if np.any(a < 0):
        raise ValueError("offered_load must be >= 0")
    c, a = np.broadcast_arrays(c, a)
    out = np.ones(c.shape)
    stable = a < c
    pos = stable & (a > 0)
    out[stable & (a == 0)] = 0.0
    cs, as_ = c[pos], a[pos]
    log_pmf = special.xlogy(cs, as_) - as_ - special.gammaln(cs + 1.0)
    log_cdf = np.log(special.gammaincc(cs + 1.0, as_))  # P(Poisson(a) <= c)
    B = np.exp(log_pmf - log_cdf)
    rho = as_ / cs
    out[pos] = B / (1.0 - rho * (1.0 - B))
    return out if out.ndim else float(out)


def wait_decay_rate(servers, arrival_rate, mean_service_s, cv2):
    """Tail decay rate :math:`\\theta = 2(c\\mu - \\lambda)/(1 + c_s^2)` in 1/s (<= 0 when unstable)."""
    c = np.asarray(servers, dtype=float)
    return 2.0 * (c / np.asarray(mean_service_s, dtype=float) - np.asarray(arrival_rate, dtype=float)) / (
        1.0 + np.asarray(cv2, dtype=float))


def _wait_tail(servers, arrival_rate, mean_service_s, cv2):
    lam = np.asarray(arrival_rate, dtype=float)
    es = np.asarray(mean_service_s, dtype=float)
    c = np.asarray(servers, dtype=float)
    a = np.where(lam > 0, lam * np.nan_to_num(es, nan=0.0), 0.0)
    none = c < 1  # a pool without servers cannot serve its traffic
    C = erlang_c(np.where(none, 1.0, c), np.where(none, 0.0, a))
    theta = wait_decay_rate(c, lam, np.where(lam > 0, es, 1.0), cv2)
    unstable = (a >= c) & (lam > 0)
    return np.asarray(C, dtype=float), np.asarray(theta, dtype=float), np.asarray(unstable)


def wait_exceed_prob(x_s, C, theta):
    """Probability that the queueing wait exceeds ``x_s``, :math:`P(W_q > x)`, from its tail (array-aware).

    Parameters
    ----------
    x_s : array_like
        The wait in seconds (any sign).
    C : array_like
        Probability of waiting, :math:`C = P(W_q > 0)` (:func:`erlang_c`).
    theta : array_like
        Decay rate of the tail in 1/s (:func:`wait_decay_rate`); :math:`\\theta \\le 0` means unstable.

    Returns
    -------
    numpy.ndarray
        :math:`P(W_q > x)`, broadcast over the three arguments.

    Notes
    -----
    The wait has an atom :math:`1 - C` at zero and an exponential tail,

    .. math::

        P(W_q > x) = \\begin{cases} \\min(1, C e^{-\\theta x}) & x \\ge 0,\\ \\theta > 0 \\\\
                     1 & x < 0 \\text{ or } \\theta \\le 0 \\end{cases}

    (:math:`\\theta \\le 0`: unstable, the wait grows without bound), exact for M/M/c
    (:math:`\\theta = c\\mu - \\lambda`) [1]_ and Kimura's approximation for M/G/c [2]_
    (module docstring).

    References
    ----------
    .. [1] L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975, Ch. 3 (M/M/1 and M/M/c waiting times).
    .. [2] T. Kimura, "Approximations for multi-server queues: system interpolations",
           Queueing Systems 17 (1994) 347-382.

    Examples
    --------
    M/M/1 with :math:`\\lambda = 0.5`, :math:`\\mu = 1`:
    :math:`P(W_q > 2) = \\rho e^{-(\\mu - \\lambda) 2} = 0.5 e^{-1} = 0.18394`.

    >>> round(float(wait_exceed_prob(2.0, 0.5, 0.5)), 5), float(wait_exceed_prob(-1.0, 0.5, 0.5))
    (0.18394, 1.0)
    """
    x = np.asarray(x_s, dtype=float)
    C = np.asarray(C, dtype=float)
    theta = np.asarray(theta, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        tail = np.minimum(1.0, C * np.exp(-theta * x))
    return np.where(x >= 0, np.where(theta > 0, tail, 1.0), 1.0)


def wait_p99_from_tail_s(C, theta):
    """99th percentile of the queueing wait from its tail, :math:`W_{99} = \\ln(C/q)/\\theta` (array-aware).

    Parameters
    ----------
    C : array_like
        Probability of waiting (:func:`erlang_c`).
    theta : array_like
        Decay rate of the tail in 1/s (:func:`wait_decay_rate`).

    Returns
    -------
    float or numpy.ndarray
        :math:`W_{99}` in seconds: 0 where :math:`C \\le q` (at least 99 % of requests do not wait) and
        ``inf`` where :math:`C > q` and :math:`\\theta \\le 0` (unstable); a float for scalar input.

    Notes
    -----
    With :math:`P(W_q > x) = C e^{-\\theta x}` (:func:`wait_exceed_prob`) and :math:`q` the tail mass above
    the 99th percentile (:data:`fleetopt.models.units.P99_TAIL`, 0.01), solving :math:`P(W_q > W_{99}) = q`:

    .. math::

        W_{99} = \\begin{cases} \\ln(C/q)/\\theta & C > q \\\\ 0 & C \\le q \\end{cases}

    For M/M/1 (:math:`C = \\rho`, :math:`\\theta = \\mu - \\lambda`) this is
    :math:`\\ln(\\rho/0.01)/(\\mu - \\lambda)` [1]_.

    References
    ----------
    .. [1] L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975, Ch. 3 (M/M/1 and M/M/c waiting times).

    Examples
    --------
    >>> round(wait_p99_from_tail_s(0.5, 0.5), 6)     # M/M/1, lambda = 0.5, mu = 1: ln(50)/0.5
    7.824046
    >>> wait_p99_from_tail_s(0.005, 0.5), wait_p99_from_tail_s(0.5, 0.0)
    (0.0, inf)
    """
    C = np.asarray(C, dtype=float)
    theta = np.asarray(theta, dtype=float)
    stable = theta > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        w = np.log(np.maximum(C, P99_TAIL) / P99_TAIL) / np.where(stable, theta, 1.0)
    w = np.where(C > P99_TAIL, np.where(stable, w, np.inf), 0.0)
    return w if w.ndim else float(w)


def wait_p99_s(servers, arrival_rate, mean_service_s, cv2):
    """99th percentile of the queueing wait, :math:`\\ln(C/0.01)/\\theta` (0 if C <= 1 %, inf if unstable).

    :func:`wait_p99_from_tail_s` at :math:`C = C(c, \\lambda E[S])` and
    :math:`\\theta = 2(c\\mu - \\lambda)/(1 + c_s^2)`.

    Examples
    --------
    >>> round(float(wait_p99_s(1, 0.5, 1.0, 1.0)), 6)   # M/M/1: ln(50)/(1 - 0.5)
    7.824046
    """
    C, theta, unstable = _wait_tail(servers, arrival_rate, mean_service_s, cv2)
    w = np.where(unstable, np.inf, wait_p99_from_tail_s(C, theta))
    return w if w.ndim else float(w)


def ttft_exceed_prob(t_s, C, theta, prefill_times_s, prefill_probs):
    """:math:`P(T > t)` for wait tail (C, theta) and prefill atoms (rows: segments).

    ``C``, ``theta`` and ``t_s`` have shape (S,), ``prefill_probs`` (S, K),
    ``prefill_times_s`` (K,) or (S, K).
    """
    t = np.asarray(t_s, dtype=float)[..., None]
    tau = np.asarray(prefill_times_s, dtype=float)
    term = wait_exceed_prob(t - tau, np.asarray(C)[..., None], np.asarray(theta)[..., None])
    return np.sum(np.asarray(prefill_probs) * term, axis=-1)


def ttft_p99_s(servers, arrival_rate, mean_service_s, cv2, prefill_times_s, prefill_probs,
               mean_prefill_s, model: str = "tail"):
    """P99 time to first token in seconds under ``model`` (array over segments; inf if unstable)."""
    if model not in TTFT_MODELS:
        raise ValueError(f"ttft_model must be one of {TTFT_MODELS}; got {model!r}")
    if model == "mean-prefill":
        return np.asarray(wait_p99_s(servers, arrival_rate, mean_service_s, cv2)) + np.asarray(mean_prefill_s)
    C, theta, unstable = _wait_tail(servers, arrival_rate, mean_service_s, cv2)
    C, theta = np.atleast_1d(C), np.atleast_1d(theta)
    probs = np.atleast_2d(prefill_probs)
    tau = np.broadcast_to(np.asarray(prefill_times_s, dtype=float), probs.shape)
    has = probs > 0
    tau_max = np.max(np.where(has, tau, 0.0), axis=-1)
    w99 = np.asarray(wait_p99_from_tail_s(C, theta))   # inf where unstable
    # P(T > t) <= q at t = max prefill + W99; the P99 is the smallest t where the exceedance drops to q
    hi = tau_max + np.where(np.isfinite(w99), w99, 0.0) + 1e-9
    _, hi = bisect_boundary(lambda t: ttft_exceed_prob(t, C, theta, tau, probs) > P99_TAIL, np.zeros_like(tau_max), hi)
    return np.where(np.atleast_1d(unstable) | ~np.isfinite(w99), np.inf, hi)


def ttft_miss_prob(t_s, servers, arrival_rate, mean_service_s, cv2, prefill_times_s, prefill_probs, mean_prefill_s,
                   model: str = "tail"):
    """:math:`P(T > t)` under ``model`` (array over segments; 1 where unstable).

    ``tail``: the mixture over prefill atoms (:func:`ttft_exceed_prob`).
    ``mean-prefill``: the seeds' convention read as a distribution,
    :math:`P(T > t) = P(W_q > t - E[T_{pf}])`, so that its 99th percentile is
    exactly :math:`W_{99} + E[T_{pf}]`.
    """
    if model not in TTFT_MODELS:
        raise ValueError(f"ttft_model must be one of {TTFT_MODELS}; got {model!r}")
    C, theta, unstable = _wait_tail(servers, arrival_rate, mean_service_s, cv2)
    C, theta = np.atleast_1d(C), np.atleast_1d(theta)
    t = np.broadcast_to(np.asarray(t_s, dtype=float), C.shape)
    if model == "mean-prefill":
        p = wait_exceed_prob(t - np.broadcast_to(np.asarray(mean_prefill_s, dtype=float), C.shape), C, theta)
    else:
        probs = np.atleast_2d(prefill_probs)
        p = ttft_exceed_prob(t, C, theta, np.broadcast_to(np.asarray(prefill_times_s, dtype=float), probs.shape), probs)
    return np.where(np.atleast_1d(unstable), 1.0, p)


def prefill_p99_s(prefill_times_s, prefill_probs) -> float:
    """99th percentile of a prefill time given as atoms (:math:`\\tau_k` with probabilities :math:`p_k`).

    .. math:: T_{pf,99} = \\min \\{ \\tau_k : \\textstyle\\sum_{j \\le k} p_j \\ge 0.99 \\}

    Parameters
    ----------
    prefill_times_s : array_like
        Atom positions :math:`\\tau_k` in seconds, ascending, shape (K,).
    prefill_probs : array_like
        Atom probabilities :math:`p_k`, shape (K,) (one segment).

    Returns
    -------
    float
        The P99 prefill time in seconds (the last atom if the probabilities add up to less than 0.99).

    Notes
    -----
    The cumulative sum is compared with :math:`0.99 - 10^{-12}`, so that round-off in a sum that is
    0.99 in exact arithmetic does not move the percentile one atom up.

    Examples
    --------
    >>> prefill_p99_s([0.1, 0.2, 0.3], [0.5, 0.49, 0.01])
    0.2
    """
    cum = np.cumsum(np.asarray(prefill_probs, dtype=float))
    k = int(np.searchsorted(cum, P99 - 1e-12))
    return float(np.asarray(prefill_times_s, dtype=float)[min(k, len(cum) - 1)])


@dataclass(frozen=True, eq=False)
class Sizing:
    """Minimum replica counts (arrays over candidates).

    ``replicas`` is 0 where ``feasible`` is False; ``reason`` then says why
    (``prefill`` - the prefill alone breaks the SLO at any count; ``cap`` - the
    search cap was reached).
    """

    replicas: np.ndarray
    feasible: np.ndarray
    reason: np.ndarray
    bound_by_utilization: np.ndarray


def _slo_ok(N, lam, es, cv2, n, slo_s, tau, probs, mean_pf, model):
    c = N * n
    C, theta, unstable = _wait_tail(c, lam, es, cv2)
    if model == "mean-prefill":
        return ~unstable & (wait_p99_from_tail_s(C, theta) + mean_pf <= slo_s * (1 + 1e-12))
    return ~unstable & (ttft_exceed_prob(np.broadcast_to(slo_s, C.shape), C, theta, tau, probs)
                        <= P99_TAIL * (1 + 1e-12))


def utilization_floor(arrival_rate, mean_service_s, slots_per_replica, rho_max: float = 0.85,
                      min_count: int = 1) -> np.ndarray:
    """The utilisation floor :math:`N_\\rho = \\max(\\lceil \\lambda E[S] / (n \\rho_{max}) \\rceil, N_{min})`
    (array-aware; a pool without slots counts one per replica): the count :func:`min_replicas` searches from,
    so a lower bound on every count it returns.

    >>> utilization_floor([10.0, 0.0], [1.7, 1.0], 4, 0.85).tolist()
    [5.0, 1.0]
    """
    lam = np.atleast_1d(np.asarray(arrival_rate, dtype=float))
    a = lam * np.nan_to_num(np.asarray(mean_service_s, dtype=float), nan=0.0)
    n = np.broadcast_to(np.asarray(slots_per_replica, dtype=float), lam.shape)
    return np.maximum(np.ceil(a / (np.where(n < 1, 1.0, n) * rho_max) * (1 - 1e-12)), min_count)


def min_replicas(arrival_rate, mean_service_s, cv2, slots_per_replica, slo_s, prefill_times_s, prefill_probs,
                 mean_prefill_s, rho_max: float = 0.85, model: str = "tail", min_count: int = 1) -> Sizing:
    """Smallest replica count meeting the P99-TTFT SLO and utilisation :math:`\\rho \\le \\rho_{max}`.

    .. math::

        N^* = \\min\\{N \\ge N_\\rho : T_{99}(N) \\le T_{SLO}\\}, \\quad
        N_\\rho = \\lceil \\lambda E[S] / (n \\rho_{max}) \\rceil

    :math:`T_{99}(N)` decreases in :math:`N`, so the search doubles then bisects,
    vectorized over candidates. Candidates whose prefill alone breaks the SLO
    (as :math:`N \\to \\infty`) are infeasible. A segment without traffic needs
    ``min_count`` replicas.
    """
    if model not in TTFT_MODELS:
        raise ValueError(f"ttft_model must be one of {TTFT_MODELS}; got {model!r}")
    if not 0.0 < rho_max <= 1.0:
        raise ValueError(f"rho_max must lie in (0, 1]; got {rho_max}")
    lam = np.atleast_1d(np.asarray(arrival_rate, dtype=float))
    es = np.atleast_1d(np.nan_to_num(np.asarray(mean_service_s, dtype=float), nan=0.0))
    cv2 = np.broadcast_to(np.nan_to_num(np.asarray(cv2, dtype=float), nan=0.0), lam.shape)
    n = np.broadcast_to(np.asarray(slots_per_replica, dtype=float), lam.shape)
    slo = np.broadcast_to(np.asarray(slo_s, dtype=float), lam.shape)
    probs = np.nan_to_num(np.atleast_2d(prefill_probs), nan=0.0)
    tau = np.broadcast_to(np.asarray(prefill_times_s, dtype=float), probs.shape)
    mean_pf = np.broadcast_to(np.nan_to_num(np.asarray(mean_prefill_s, dtype=float), nan=0.0), lam.shape)
    idle = lam <= 0
    no_slots = n < 1
    n_safe = np.where(no_slots, 1.0, n)
    N_rho = utilization_floor(lam, es, n, rho_max, min_count)
    # feasibility at N -> infinity: C -> 0, so only prefill remains
    if model == "mean-prefill":
        limit_ok = mean_pf <= slo * (1 + 1e-12)
    else:
        limit_ok = np.sum(np.where(tau >= slo[:, None], probs, 0.0), axis=-1) < P99_TAIL
    active = ~idle & ~no_slots & limit_ok
    args = (lam, es, cv2, n_safe, slo, tau, probs, mean_pf, model)
    hi = N_rho.copy()
    ok_hi = _slo_ok(hi, *args) | ~active
    while np.any(~ok_hi & (hi < _MAX_REPLICAS)):
        hi = np.where(ok_hi, hi, np.minimum(hi * 2, _MAX_REPLICAS))
        ok_hi = ok_hi | _slo_ok(hi, *args)
    capped = ~ok_hi
    lo = np.where(hi > N_rho, np.floor(hi / 2), N_rho - 1)  # lo fails (or is below N_rho), hi passes
    lo = np.maximum(lo, N_rho - 1)
    while np.any(hi - lo > 1):
        mid = np.floor((lo + hi) / 2)
        move = hi - lo > 1
        ok = _slo_ok(np.maximum(mid, 1), *args)
        hi = np.where(move & ok, mid, hi)
        lo = np.where(move & ~ok, mid, lo)
    feasible = (active & ~capped) | idle
    replicas = np.where(idle, min_count, np.where(feasible, hi, 0)).astype(np.int64)
    reason = np.where(feasible, "", np.where(no_slots, "no-slots", np.where(~limit_ok, "prefill", "cap")))
    return Sizing(replicas, feasible, reason, feasible & ~idle & (replicas == N_rho))


def max_load_erlangs(servers, mean_service_s, cv2, prefill_times_s, prefill_probs, mean_prefill_s, *, slo_s: float,
                     rho_max: float, model: str = "tail") -> np.ndarray:
    """Largest offered load (Erlangs) that ``servers`` servers carry while meeting the P99-TTFT SLO (array-aware).

    The inverse of the sizing question: for a fixed server count :math:`c` and a fixed service mix
    (:math:`E[S]`, :math:`c_s^2`, prefill atoms), the largest load meeting the tail target and the
    utilisation cap.

    Parameters
    ----------
    servers : array_like
        Server (KV-slot) counts :math:`c`, shape (S,).
    mean_service_s, cv2, mean_prefill_s : array_like
        Mean slot-holding time :math:`E[S]` (s, > 0), its squared coefficient of variation and the mean
        prefill time (s); broadcast to shape (S,).
    prefill_times_s, prefill_probs : array_like
        Prefill atoms :math:`\\tau_k` (s), shape (K,), and their probabilities, shape (K,) or (S, K).
    slo_s : float
        The P99 TTFT target :math:`T_{SLO}` in seconds.
    rho_max : float
        Utilisation cap :math:`\\rho_{max}` in (0, 1].
    model : str
        TTFT model, one of :data:`TTFT_MODELS` (see :func:`ttft_miss_prob`).

    Returns
    -------
    numpy.ndarray
        :math:`A^*(c)` in Erlangs, shape (S,): 0 where no positive load meets the target.

    Raises
    ------
    ValueError
        If ``rho_max`` is outside (0, 1], a mean service time is not > 0, or ``model`` is unknown.

    Notes
    -----
    With :math:`\\lambda = a / E[S]` and :math:`q = 0.01` (:data:`fleetopt.models.units.P99_TAIL`),

    .. math::

        A^*(c) = \\max \\{ a \\in [0, \\rho_{max} c] : P(T > T_{SLO} \\mid c, \\lambda = a/E[S]) \\le q \\}

    where :math:`P(T > t)` is :func:`ttft_miss_prob` (Erlang-C :math:`C(c, a)` with the tail decay
    :math:`\\theta = 2(c - a)/(E[S](1 + c_s^2))`). :math:`C` grows and :math:`\\theta` shrinks with
    :math:`a`, so the miss probability increases in :math:`a`, the feasible loads form an interval
    :math:`[0, A^*]` and :math:`A^*` is found by bisection (:func:`fleetopt.models.numerics.bisect_boundary`)
    to float resolution. For M/M/1 (:math:`c = 1`, :math:`c_s^2 = 1`, no prefill) the condition reads
    :math:`\\rho e^{-\\mu (1 - \\rho) T_{SLO}} \\le q` [1]_.

    References
    ----------
    .. [1] L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975, Ch. 3 (M/M/1 and M/M/c waiting times).

    Examples
    --------
    A server with a 1 s mean service time and a 10 s target carries about 0.5919 Erlangs
    (:math:`\\rho e^{-10(1 - \\rho)} = 0.01`); a long target is capped by :math:`\\rho_{max}`:

    >>> round(float(max_load_erlangs([1.0], 1.0, 1.0, [0.0], [1.0], 0.0, slo_s=10.0, rho_max=0.85)[0]), 4)
    0.5919
    >>> max_load_erlangs([1.0, 4.0], 1.0, 1.0, [0.0], [1.0], 0.0, slo_s=1e3, rho_max=0.85).tolist()
    [0.85, 3.4]
    """
    if model not in TTFT_MODELS:
        raise ValueError(f"ttft_model must be one of {TTFT_MODELS}; got {model!r}")
    if not 0.0 < rho_max <= 1.0:
        raise ValueError(f"rho_max must lie in (0, 1]; got {rho_max}")
    c = np.atleast_1d(np.asarray(servers, dtype=float))
    es = np.broadcast_to(np.asarray(mean_service_s, dtype=float), c.shape)
    if np.any(~(es > 0)):
        raise ValueError("mean_service_s must be > 0")
    cv2 = np.broadcast_to(np.asarray(cv2, dtype=float), c.shape)
    mean_pf = np.broadcast_to(np.asarray(mean_prefill_s, dtype=float), c.shape)
    tau = np.asarray(prefill_times_s, dtype=float)
    probs = np.asarray(prefill_probs, dtype=float)
    probs = np.broadcast_to(probs, c.shape + probs.shape[-1:])

    def meets(a):
        miss = ttft_miss_prob(slo_s, c, a / es, es, cv2, tau, probs, mean_pf, model)
        return np.where(a > 0, miss <= P99_TAIL, True)

    hi = rho_max * c
    lo = np.where(meets(hi), hi, 0.0)
    lo, _ = bisect_boundary(meets, lo, hi)
    return lo


def miss_coefficients(segment_prefill_probs, segment_mean_prefill_s, prefill_times_s, C: float, theta: float,
                      slo_s: float, model: str = "tail") -> np.ndarray:
    """Per-segment SLO coefficients :math:`\\sigma_k` of a pool at one operating point :math:`(C, \\theta)`.

    A pool whose routed rates :math:`g_k` (req/s from segment :math:`k`) satisfy
    :math:`\\sum_k \\sigma_k g_k \\le 0` meets the P99-TTFT SLO at that operating point; this is the
    coefficient of :func:`fleetopt.solvers.split.slo_rule`.

    Parameters
    ----------
    segment_prefill_probs : array_like
        Prefill-atom probabilities of each segment, shape (S, K') (columns beyond ``len(prefill_times_s)``
        are ignored).
    segment_mean_prefill_s : array_like
        Mean prefill time of each segment in seconds, shape (S,).
    prefill_times_s : array_like
        Prefill atoms :math:`\\tau_j` in seconds, shape (K,).
    C, theta : float
        Probability of waiting and tail decay rate (1/s, > 0) at the operating point.
    slo_s : float
        The P99 TTFT target in seconds.
    model : str
        ``tail`` or ``mean-prefill`` (:data:`TTFT_MODELS`).

    Returns
    -------
    numpy.ndarray
        :math:`\\sigma_k`, shape (S,).

    Notes
    -----
    With :math:`q = 0.01` (:data:`fleetopt.models.units.P99_TAIL`), :math:`p_{kj}` segment :math:`k`'s
    prefill probabilities and :math:`P(W_q > x)` from :func:`wait_exceed_prob`:

    .. math::

        \\sigma_k = \\sum_j p_{kj} P(W_q > T_{SLO} - \\tau_j \\mid C, \\theta) - q \\quad \\text{(tail)}, \\qquad
        \\sigma_k = E[T_{pf,k}] + W_{99}(C, \\theta) - T_{SLO} \\quad \\text{(mean-prefill)}

    so the first is the segment's miss probability over its budget and the second its mean-prefill
    P99 over the target (:func:`wait_p99_from_tail_s`). The traffic-weighted sum is then the pool's
    miss probability minus :math:`q` (tail) or the rate-weighted mean-prefill margin.

    Examples
    --------
    Tail model, one segment, all prefill at 0 s: the M/M/1 wait tail minus 0.01,
    :math:`0.5 e^{-0.5 \\cdot 2} - 0.01 = 0.17394`; mean-prefill: :math:`0.1 + \\ln(50)/0.5 - 2`.

    >>> round(float(miss_coefficients([[1.0]], [0.0], [0.0], 0.5, 0.5, 2.0)[0]), 5)
    0.17394
    >>> round(float(miss_coefficients([[1.0]], [0.1], [0.0], 0.5, 0.5, 2.0, "mean-prefill")[0]), 6)
    5.924046
    """
    if model not in TTFT_MODELS:
        raise ValueError(f"ttft_model must be one of {TTFT_MODELS}; got {model!r}")
    if model == "mean-prefill":
        return np.asarray(segment_mean_prefill_s, dtype=float) + wait_p99_from_tail_s(C, theta) - slo_s
    tau = np.asarray(prefill_times_s, dtype=float)
    probs = np.asarray(segment_prefill_probs, dtype=float)
    wait_tail = wait_exceed_prob(slo_s - tau, C, theta)
    return probs[:, :len(tau)] @ wait_tail[:probs.shape[1]] - P99_TAIL
