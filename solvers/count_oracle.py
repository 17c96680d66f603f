r"""Exact second-order moments of a continuous-batching replica's count, without a batch cap: a reference for
the batched model's occupancy dispersion (:func:`fleetopt.models.batched.occupancy_dispersion`).

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

The same pool with every request's work spread evenly over its life at the mean rate
:math:`\bar y = E[Y]/E[I]` (:math:`\hat w = \bar y \hat g`) has the variance the batched model's chain has on the
clock of iterations; the ratio of the two is the *dispersion* :math:`F` that
:func:`fleetopt.models.batched.occupancy_dispersion` estimates in closed form. The chain's law holds on the clock
of real time (where an arrival sees the time average), and this one on the clock of iterations; the ratio is what
carries over (``docs/models.md``, "The count's exact second moment").

References
----------
.. [1] A. G. Hawkes and D. Oakes, "A cluster process representation of a self-exciting process", Journal of
       Applied Probability 11 (1974) 493-503.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["CountMoments", "replica_count_moments"]

_BATCH_BYTES = 1 << 25
"""Memory of one batch of transformed work profiles (the marks are transformed in batches of this size)."""


@dataclass(frozen=True)
class CountMoments:
    """A replica's count of running requests on the clock of iterations (:func:`replica_count_moments`)."""

    mean: float
    """:math:`E[J] = \\lambda W E[I] / (1 - x)`."""
    variance: float
    """:math:`\\mathrm{Var}[J]` of the request mix as given."""
    equal_variance: float
    """:math:`\\mathrm{Var}[J]` with every request's work spread evenly at :math:`\\bar y = E[Y]/E[I]` an
    iteration (the batched model's chain)."""
    context_load: float
    """:math:`x = \\lambda E[Y]`."""
    points: int
    """:math:`L`, the points of the discrete Fourier transform."""

    @property
    def dispersion(self) -> float:
        """:math:`F = \\mathrm{Var}[J] / \\mathrm{Var}_{equal}[J]`."""
        return self.variance / self.equal_variance


def replica_count_moments(work_profiles: Sequence[np.ndarray], arrival_rate_per_s: float, W_s: float,
                          weights=None, *, spans: float = 16.0, max_points: int = 1 << 22) -> CountMoments:
    """Exact mean and variance of an uncapped replica's count of running requests (module docstring).

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
        The transform's length :math:`L` is the least power of two of at least twice the longest life plus this
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
    Without context work the count is Poisson (an :math:`M/G/\\infty` queue on the clock of iterations):

    >>> m = replica_count_moments([np.zeros(10), np.zeros(30)], 2.0, 0.01)
    >>> round(m.mean, 9), round(m.variance, 9), m.dispersion
    (0.4, 0.4, 1.0)
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
        raise ValueError(f"the transform needs {L} points, more than max_points {max_points}")
    G, Wh, Q = (np.zeros(L // 2 + 1, dtype=complex) for _ in range(3))
    R, P = np.zeros(L // 2 + 1), np.zeros(L // 2 + 1)
    batch = max(1, _BATCH_BYTES // (16 * L))
    for lo in range(0, len(marks), batch):
        part = marks[lo:lo + batch]
        wa, ga = np.zeros((len(part), L)), np.zeros((len(part), L))
        for i, w in enumerate(part):
            wa[i, 1:1 + len(w)] = w
            ga[i, 1:1 + len(w)] = 1.0
        wf, gf = np.fft.rfft(wa, axis=1), np.fft.rfft(ga, axis=1)
        q = p[lo:lo + batch, None]
        G += (q * gf).sum(axis=0)
        Wh += (q * wf).sum(axis=0)
        Q += (q * np.conj(gf) * wf).sum(axis=0)
        R += (q * np.abs(gf) ** 2).sum(axis=0)
        P += (q * np.abs(wf) ** 2).sum(axis=0)
    nu = lam * W
    ybar = EY / EI

    def variance(Wh, Q, P):
        A = G / (1.0 - lam * Wh)
        B = (R + 2.0 * np.real(lam * Q * A) + lam * lam * P * np.abs(A) ** 2) / (1.0 - x)
        # the full circle from the half spectrum of real profiles: 0 and pi once, the rest twice
        return nu * (B[0] + B[-1] + 2.0 * B[1:-1].sum()) / L

    var = variance(Wh, Q, P)
    equal = variance(ybar * G, ybar * R, ybar * ybar * R)
    return CountMoments(nu * EI / (1.0 - x), float(var), float(equal), x, L)
