r"""Exact second-order moments of a continuous-batching replica's count, without a batch cap: a reference for
the batched model's occupancy dispersion (:func:`fleetopt.models.queueing.batched.occupancy_dispersion`).

On the clock of iterations a replica without a cap is a linear Hawkes process. Iteration :math:`n` takes
:math:`t_n = W + \sum_i w_i(n - n_i)`, the fixed part plus the work of every running request :math:`i`, which
arrived during iteration :math:`n_i`, joined at the next boundary and adds :math:`w_i(s)` to its :math:`s`-th
iteration, :math:`s = 1, \dots, I_i` (:func:`fleetopt.models.service.iteration_work_s`). Poisson arrivals of rate
:math:`\lambda` bring a Poisson number of mean :math:`\lambda t_n` requests during iteration :math:`n`. So the
arrivals are immigrants of mean :math:`\nu = \lambda W` an iteration, each of which begets children at lag
:math:`s` with mean :math:`\lambda w_i(s)`, and the count of running requests is the linear functional
:math:`J_n = \sum_i g_i(n - n_i)`, :math:`g_i(s) = 1\{1 \le s \le I_i\}`. Nothing here is approximated: prefill
stalls (the lumps of a prompt's compute), unequal requests and the growth of a request's context over its life
are all in the marks :math:`w_i`.

The cluster that an immigrant starts is a Galton-Watson tree; with :math:`\hat g_i, \hat w_i` the transforms
:math:`\sum_s g_i(s) e^{-\mathrm{i}\omega s}` (likewise :math:`w_i`) and the expectations over the request mix

.. math::

    G = E[\hat g], \quad \hat W = E[\hat w], \quad R = E|\hat g|^2, \quad Q = E[\overline{\hat g}\, \hat w],
    \quad P = E|\hat w|^2, \qquad x = \lambda E[Y] = \lambda \hat W(0) < 1

the transform :math:`\hat Y` of a cluster's count profile satisfies :math:`\hat Y = \hat g + \sum_c
e^{-\mathrm{i}\omega s_c} \hat Y_c` over the root's children, so that

.. math::

    A = E[\hat Y] = \frac{G}{1 - \lambda \hat W}, \qquad
    B = E|\hat Y|^2 = \frac{R + 2 \operatorname{Re}(\lambda Q A) + \lambda^2 P |A|^2}{1 - x},

and (Campbell's theorem for the Poisson clusters, Parseval's for the profile)

.. math:: E[J] = \nu A(0) = \frac{\lambda W E[I]}{1 - x}, \qquad
          \mathrm{Var}[J] = \frac{\nu}{2\pi} \int_{-\pi}^{\pi} B(\omega)\, d\omega

(Hawkes and Oakes [1]_ for the cluster representation; the recursion is that of a marked branching process).
The integral is a discrete Fourier transform of :math:`L` points, :math:`L` a power of two long against a
cluster (:func:`replica_count_moments`), so :math:`\mathrm{Var}[J]` is exact up to the clusters that outlast
:math:`L` iterations.

**What an arrival sees.** An arrival sees the count of the iteration it arrives in, and an iteration is met in
proportion to its length: Poisson arrivals see time averages, and those are *not* the averages over iterations
above (a long iteration, a prefill stall, holds more requests and is met more often). Arrivals are the points of
the Hawkes process, so what they see is its Palm law: the stationary count plus the arrival's *relatives*, the
members of its own cluster running in its iteration, independent of the rest (Slivnyak-Mecke for a Poisson
cluster process). The arrival's line of ancestors is a terminating renewal process: a step back reaches a parent
of mark :math:`M` at lag :math:`s` with density :math:`\lambda p(M) w_M(s)` (total mass :math:`x`). Ancestor
:math:`k`, at lag :math:`u_k`, is still running if :math:`u_k \le I_{M_k}`, and its other children are Poisson
with intensity :math:`\lambda w_{M_k}`, so given the line its contribution :math:`Z_k` is independent of the
others with mean and variance

.. math::

    a_M(u) = g_M(u) + \lambda (w_M * m)(u), \qquad b_M(u) = \lambda (w_M * v)(u),

where :math:`m` and :math:`v` are a cluster's mean and second-moment count profiles,
:math:`m = \bar g + \lambda \bar w * m` and :math:`v = E_M[a_M^2] + \lambda \bar w * v`. With
:math:`\rho = \sum_{k \ge 0} (\lambda \bar w)^{*k}` the line's renewal measure,
:math:`A_1(u) = \lambda E_M \sum_s w_M(s)\, a_M(u + s)` and :math:`h(u) = \sum_{v \ge 0} \rho(v) A_1(u + v)`
(the mean the line contributes from lag :math:`u` back),

.. math::

    E[J_{rel}] = h(0), \qquad
    E[J_{rel}^2] = \sum_u \rho(u)\, \lambda E_M \sum_s w_M(s) \bigl(a_M^2 + 2 a_M h + b_M\bigr)(u + s),

and an arrival sees mean :math:`E[J] + E[J_{rel}]` and variance :math:`\mathrm{Var}[J] + \mathrm{Var}[J_{rel}]`.
Every term is a convolution or correlation of a request's profile with a pool-wide one, a few transforms a
request. (Earlier arrivals of the same iteration, not yet joined, are not counted.)

The same pool with every request's work spread evenly over its life at the mean rate
:math:`\bar y = E[Y]/E[I]` (:math:`\hat w = \bar y \hat g`) is a symmetric queue whose count seen by arrivals is
the batched model's chain (its variance agrees with the chain's closed form within the iterations' discreteness, a
few per cent); the ratio of the two arrival-seen variances is the *dispersion* :math:`F` that
:func:`fleetopt.models.queueing.batched.occupancy_dispersion` estimates in closed form (``docs/models.md``, "The count's
exact second moment").

References
----------
.. [1] A. G. Hawkes and D. Oakes, "A cluster process representation of a self-exciting process", Journal of
       Applied Probability 11 (1974) 493-503.
.. [2] D. J. Daley and D. Vere-Jones, *An Introduction to the Theory of Point Processes*, vol. II, 2nd ed.
       (Springer, 2008), section 13.1 (Palm distributions; that of a Poisson cluster process).
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

import numpy as np

__all__ = ["CountMoments", "replica_count_moments"]

_BATCH_BYTES = 1 << 25
"""Memory of one batch of transformed work profiles (the marks are transformed in batches of this size)."""


@dataclass(frozen=True)
class CountMoments:
    """A replica's count of running requests, on the clock of iterations and as arrivals see it
    (:func:`replica_count_moments`)."""

    mean: float
    """:math:`E[J] = \\lambda W E[I] / (1 - x)` over iterations."""
    variance: float
    """:math:`\\mathrm{Var}[J]` over iterations."""
    arrival_mean: float
    """The mean count an arrival sees (the time average): :math:`E[J] + E[J_{rel}]`."""
    arrival_variance: float
    """The variance of the count an arrival sees: :math:`\\mathrm{Var}[J] + \\mathrm{Var}[J_{rel}]`."""
    equal_variance: float
    """:math:`\\mathrm{Var}[J]` over iterations with every request's work spread evenly at
    :math:`\\bar y = E[Y]/E[I]` an iteration."""
    equal_arrival_variance: float
    """The variance an arrival sees with the work spread evenly: the batched model's chain."""
    context_load: float
    """:math:`x = \\lambda E[Y]`."""
    points: int
    """:math:`L`, the points of the discrete Fourier transforms."""

    @property
    def dispersion(self) -> float:
        """:math:`F`: the variance an arrival sees over the chain's (the same with the work spread evenly)."""
        return self.arrival_variance / self.equal_arrival_variance

    @property
    def iteration_dispersion(self) -> float:
        """The same ratio over iterations."""
        return self.variance / self.equal_variance


def replica_count_moments(work_profiles: Sequence[np.ndarray], arrival_rate_per_s: float, W_s: float,
                          weights=None, *, spans: float = 16.0, max_points: int = 1 << 22) -> CountMoments:
    """Exact moments of an uncapped replica's count of running requests (module docstring).

    Parameters
    ----------
    work_profiles : sequence of 1-D arrays
        Per request of the mix, the seconds it adds to each of its iterations
        (:func:`fleetopt.models.service.iteration_work_s`); its length is the request's iteration count
        :math:`I \\ge 1`.
    arrival_rate_per_s : float
        :math:`\\lambda`, Poisson arrivals into the replica.
    W_s : float
        :math:`W > 0`, the iteration's fixed part.
    weights : array or None
        Probabilities of the requests (None: equal).
    spans : float
        The transforms' length :math:`L` is the least power of two of at least twice the longest life plus this
        many mean cluster lives :math:`E[I]/(1 - x)`.
    max_points : int
        Upper limit on :math:`L` (:class:`ValueError` beyond).

    Raises
    ------
    ValueError
        For an empty mix, a profile of no iteration, :math:`W \\le 0`, :math:`\\lambda \\le 0`, or
        :math:`x \\ge 1` (no stationary count).

    Examples
    --------
    Without context work the count is Poisson (an :math:`M/G/\\infty` queue on the clock of iterations), and an
    arrival sees it as it is (its relatives add nothing):

    >>> m = replica_count_moments([np.zeros(10), np.zeros(30)], 2.0, 0.01)
    >>> [round(v, 9) for v in (m.mean, m.variance, m.arrival_mean, m.arrival_variance)], m.dispersion
    ([0.4, 0.4, 0.4, 0.4], 1.0)
    """
    marks = [np.asarray(w, dtype=float) for w in work_profiles]
    if not marks:
        raise ValueError("work_profiles: empty")
    if min(len(w) for w in marks) < 1:
        raise ValueError("work_profiles: every request runs at least one iteration")
    lam, W = float(arrival_rate_per_s), float(W_s)
    if not (lam > 0 and W > 0):
        raise ValueError(f"arrival_rate_per_s {lam} and W_s {W} must be > 0")
    p = np.full(len(marks), 1.0 / len(marks)) if weights is None else np.asarray(weights, dtype=float)
    p = p / p.sum()
    lives = np.array([len(w) for w in marks], dtype=float)
    work = np.array([w.sum() for w in marks])
    EI, EY = float(p @ lives), float(p @ work)
    x = lam * EY
    if not x < 1.0:
        raise ValueError(f"context load x = {x:.4f} >= 1: the replica has no stationary count")
    need = 2.0 * lives.max() + spans * EI / (1.0 - x)
    L = 1 << int(np.ceil(np.log2(max(need, 2.0))))
    if L > max_points:
        raise ValueError(f"the transforms need {L} points, more than max_points {max_points}")
    mean, var, seen_mean, seen_var = _moments(marks, p, lam, W, L)
    ybar = EY / EI
    _, eq_var, _, eq_seen_var = _moments([np.full(len(w), ybar) for w in marks], p, lam, W, L)
    return CountMoments(mean, var, seen_mean, seen_var, eq_var, eq_seen_var, x, L)


def _batches(marks, p, L: int):
    """The requests in batches: (weights, presence profiles, transforms of the work profiles)."""
    size = max(1, _BATCH_BYTES // (16 * L))
    for lo in range(0, len(marks), size):
        part = marks[lo:lo + size]
        wa, ga = np.zeros((len(part), L)), np.zeros((len(part), L))
        for i, w in enumerate(part):
            wa[i, 1:1 + len(w)] = w
            ga[i, 1:1 + len(w)] = 1.0
        yield p[lo:lo + size, None], ga, np.fft.rfft(wa, axis=1)


def _moments(marks, p, lam: float, W: float, L: int) -> tuple[float, float, float, float]:
    """(mean, variance) over iterations and as arrivals see them (module docstring), by transforms of ``L``
    points; convolutions and correlations are circular, exact while the profiles fit in ``L``."""
    n = L // 2 + 1
    Wh, Gh, Q = (np.zeros(n, dtype=complex) for _ in range(3))
    R, P = np.zeros(n), np.zeros(n)
    for q, ga, wf in _batches(marks, p, L):
        gf = np.fft.rfft(ga, axis=1)
        Wh += (q * wf).sum(axis=0)
        Gh += (q * gf).sum(axis=0)
        Q += (q * np.conj(gf) * wf).sum(axis=0)
        R += (q * np.abs(gf) ** 2).sum(axis=0)
        P += (q * np.abs(wf) ** 2).sum(axis=0)
    x = lam * Wh[0].real
    D = 1.0 - lam * Wh
    A = Gh / D                                          # a cluster's mean count profile, transformed
    B = (R + 2.0 * np.real(lam * Q * A) + lam * lam * P * np.abs(A) ** 2) / (1.0 - x)
    nu = lam * W
    var = nu * (B[0] + B[-1] + 2.0 * B[1:-1].sum()) / L     # Parseval over the full circle
    # what an arrival sees: its line of ancestors and their other children's subtrees. A_1's transform is
    # lam E[conj(w^) a^] with a^ = g^ + lam w^ A, i.e. lam (conj(Q) + lam P A), so h needs no pass over the requests
    A1 = lam * np.fft.irfft(np.conj(Q) + lam * P * A, L)
    h = np.fft.irfft(np.conj(1.0 / D) * np.fft.rfft(A1), L)
    a2, acc2, acc3 = np.zeros(L), np.zeros(n, dtype=complex), np.zeros(n, dtype=complex)
    for q, ga, wf in _batches(marks, p, L):
        a = ga + lam * np.fft.irfft(wf * A, L, axis=1)      # a_M(u)
        a2 += (q * a * a).sum(axis=0)
        acc2 += (q * np.conj(wf) * np.fft.rfft(a * a, axis=1)).sum(axis=0)
        acc3 += (q * np.conj(wf) * np.fft.rfft(a * h[None, :], axis=1)).sum(axis=0)
    vh = np.fft.rfft(a2) / D                            # a cluster's second-moment count profile
    rho = np.fft.irfft(1.0 / D, L)
    line = lam * np.fft.irfft(acc2 + 2.0 * acc3 + lam * P * vh, L)
    rel_mean, rel_sq = float(h[0]), float(rho @ line)
    mean = nu * float(np.real(A[0]))
    return mean, float(var), mean + rel_mean, float(var) + rel_sq - rel_mean * rel_mean
