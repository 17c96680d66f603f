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

so :math:`W_{99} = \\ln(C/0.01)/\\theta` when :math:`C > 0.01` and 0 otherwise.

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
from scipy import special

__all__ = [
    "erlang_c", "wait_decay_rate", "wait_p99_s", "ttft_exceed_prob", "ttft_miss_prob", "ttft_p99_s", "min_replicas",
    "Sizing", "TTFT_MODELS",
]

TTFT_MODELS = ("tail", "mean-prefill")
_Q = 0.01  # tail mass of the 99th percentile
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


def wait_p99_s(servers, arrival_rate, mean_service_s, cv2):
    """99th percentile of the queueing wait, :math:`\\ln(C/0.01)/\\theta` (0 if C <= 1 %, inf if unstable).

    Examples
    --------
    >>> round(float(wait_p99_s(1, 0.5, 1.0, 1.0)), 6)   # M/M/1: ln(50)/(1 - 0.5)
    7.824046
    """
    C, theta, unstable = _wait_tail(servers, arrival_rate, mean_service_s, cv2)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(C > _Q, np.log(np.maximum(C, _Q) / _Q) / theta, 0.0)
    w = np.where(unstable, np.inf, w)
    return w if w.ndim else float(w)


def ttft_exceed_prob(t_s, C, theta, prefill_times_s, prefill_probs):
    """:math:`P(T > t)` for wait tail (C, theta) and prefill atoms (rows: segments).

    ``C``, ``theta`` and ``t_s`` have shape (S,), ``prefill_probs`` (S, K),
    ``prefill_times_s`` (K,) or (S, K).
    """
    t = np.asarray(t_s, dtype=float)[..., None]
    tau = np.asarray(prefill_times_s, dtype=float)
    slack = t - tau
    with np.errstate(over="ignore", invalid="ignore"):
        tail = np.minimum(1.0, np.asarray(C)[..., None] * np.exp(-np.asarray(theta)[..., None] * slack))
    # P(W > x) = C e^{-theta x} for x >= 0 (the atom at 0 has mass 1 - C), and 1 for x < 0
    term = np.where(slack >= 0, np.where(np.asarray(theta)[..., None] > 0, tail, 1.0), 1.0)
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
    with np.errstate(divide="ignore", invalid="ignore"):
        w99 = np.where(C > _Q, np.log(np.maximum(C, _Q) / _Q) / np.where(theta > 0, theta, np.nan), 0.0)
    lo = np.zeros_like(tau_max)
    hi = tau_max + np.nan_to_num(w99, nan=0.0) + 1e-9
    for _ in range(64):
        mid = (lo + hi) / 2.0
        over = ttft_exceed_prob(mid, C, theta, tau, probs) > _Q
        lo = np.where(over, mid, lo)
        hi = np.where(over, hi, mid)
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
        slack = t - np.broadcast_to(np.asarray(mean_prefill_s, dtype=float), C.shape)
        with np.errstate(over="ignore", invalid="ignore"):
            p = np.where(slack >= 0, np.minimum(1.0, C * np.exp(-np.where(theta > 0, theta, 0.0) * slack)), 1.0)
        p = np.where(theta > 0, p, 1.0)
    else:
        probs = np.atleast_2d(prefill_probs)
        p = ttft_exceed_prob(t, C, theta, np.broadcast_to(np.asarray(prefill_times_s, dtype=float), probs.shape), probs)
    return np.where(np.atleast_1d(unstable), 1.0, p)


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
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.where(C > _Q, np.log(np.maximum(C, _Q) / _Q) / theta, 0.0)
        return ~unstable & (w + mean_pf <= slo_s * (1 + 1e-12))
    return ~unstable & (ttft_exceed_prob(np.broadcast_to(slo_s, C.shape), C, theta, tau, probs) <= _Q * (1 + 1e-12))


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
    a = lam * es
    n_safe = np.where(no_slots, 1.0, n)
    N_rho = np.maximum(np.ceil(a / (n_safe * rho_max) * (1 - 1e-12)), min_count)
    # feasibility at N -> infinity: C -> 0, so only prefill remains
    if model == "mean-prefill":
        limit_ok = mean_pf <= slo * (1 + 1e-12)
    else:
        limit_ok = np.sum(np.where(tau >= slo[:, None], probs, 0.0), axis=-1) < _Q
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
