"""Logistic power curve of a serving replica versus sequences in flight.

.. math::

    P(b) = P_{idle} + \\frac{P_{nom} - P_{idle}}{1 + e^{-k(\\log_2 b - x_0)}}

with :math:`b` the number of sequences in flight (the batch), :math:`P_{idle}` the
power with (almost) nothing running, :math:`P_{nom}` the saturation power, :math:`k`
the steepness and :math:`x_0` the half-saturation point in :math:`\\log_2` batch.
Source: the GPU-to-Grid logistic fit used by the 1/W-law paper (Eq. 1,
Appendix A) and the reference tool vllm-sr-sim.

For :math:`b \\to 0` the curve tends to :math:`P_{idle}`; :math:`P(0)` is defined as
:math:`P_{idle}` so that an idle replica draws idle power.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np

__all__ = ["PowerCurve", "ActivityPower", "pool_power_secant", "power_floor_w"]

QUALITIES = ("measured", "one-anchor", "projected", "none")


@dataclass(frozen=True)
class PowerCurve:
    """Power of one serving replica as a function of its batch.

    Parameters
    ----------
    idle_w, nominal_w : float
        Idle and saturation power of the replica in watts.
    k : float
        Logistic steepness (per doubling of the batch).
    x0 : float
        Half-saturation point, in log2 of the batch.
    quality : str
        One of ``measured``, ``one-anchor``, ``projected``, ``none``.

    Examples
    --------
    >>> h100 = PowerCurve(300.0, 600.0, 1.0, 4.2, "measured")
    >>> round(float(h100.power_w(128)), 1)
    582.8
    >>> h100.max_batch_under(500.0)
    29
    """

    idle_w: float
    nominal_w: float
    k: float
    x0: float
    quality: str = "projected"

    def __post_init__(self) -> None:
        if not (0.0 <= self.idle_w <= self.nominal_w):
            raise ValueError(
                f"power curve needs 0 <= idle_w <= nominal_w; got idle_w={self.idle_w}, "
                f"nominal_w={self.nominal_w}"
            )
        if self.k <= 0.0:
            raise ValueError(f"power curve steepness k must be > 0; got {self.k}")
        if self.quality not in QUALITIES:
            raise ValueError(f"power quality must be one of {QUALITIES}; got {self.quality!r}")

    @overload
    def power_w(self, batch: float) -> float: ...
    @overload
    def power_w(self, batch: np.ndarray) -> np.ndarray: ...
    def power_w(self, batch: float | np.ndarray) -> float | np.ndarray:
        """Power in watts at ``batch`` sequences in flight (array-aware, batch >= 0)."""
        b = np.asarray(batch, dtype=float)
        if np.any(b < 0):
            raise ValueError("batch must be >= 0")
        with np.errstate(divide="ignore"):
            x = np.log2(b)
        # exp(-k(x - x0)) overflows to inf for b -> 0, giving exactly idle_w
        with np.errstate(over="ignore"):
            frac = 1.0 / (1.0 + np.exp(-self.k * (x - self.x0)))
        out = self.idle_w + (self.nominal_w - self.idle_w) * frac
        return out if out.ndim else float(out)

    def batch_at_power(self, power_w: float) -> float:
        """Inverse of :meth:`power_w`: the (real) batch that draws ``power_w``.

        Returns 0 at or below idle power and ``inf`` at or above nominal power.

        .. math:: b = 2^{x_0 - \\ln((P_{nom} - P_{idle})/(P - P_{idle}) - 1)/k}
        """
        if power_w <= self.idle_w:
            return 0.0
        if power_w >= self.nominal_w:
            return float("inf")
        ratio = (self.nominal_w - self.idle_w) / (power_w - self.idle_w) - 1.0
        return float(2.0 ** (self.x0 - np.log(ratio) / self.k))

    def max_batch_under(self, power_w: float) -> int:
        """Largest whole batch whose power does not exceed ``power_w`` (0 if none)."""
        b = self.batch_at_power(power_w)
        if np.isinf(b):
            raise ValueError(
                f"a power budget of {power_w} W at or above nominal {self.nominal_w} W "
                "does not limit the batch"
            )
        n = int(np.floor(b))
        # guard the floor against rounding in the inverse
        while n > 0 and self.power_w(n) > power_w:
            n -= 1
        while self.power_w(n + 1) <= power_w:
            n += 1
        return n

    def scaled(self, factor: float) -> PowerCurve:
        """The same curve for ``factor`` identical GPUs working in lockstep (TP)."""
        return PowerCurve(self.idle_w * factor, self.nominal_w * factor, self.k, self.x0, self.quality)


@dataclass(frozen=True)
class ActivityPower:
    """Board power of one serving replica that follows what its iterations do (a measured profile's power).

    Parameters
    ----------
    idle_w : float
        Power of the replica with no work at all (no iteration running), W.
    limit_w : float
        Board power limit of the replica (the sum over its GPUs), W; no iteration draws more.
    weights_w, kv_w, compute_w : float
        Power while the replica streams weights, scans the KV cache and computes, W (>= 0). These are fitted
        intensities, not board readings: ``compute_w`` may exceed ``limit_w``, the cap then applies.
    quality : str
        One of ``measured``, ``one-anchor``, ``projected``, ``none`` (``measured`` for a fit to board power).

    Notes
    -----
    An iteration of the profile's iteration-time model (:mod:`fleetopt.models.service`) takes
    :math:`t = T_w + T_{kv} + T_c` with :math:`T_w = W` (weight streaming and fixed cost),
    :math:`T_{kv} = h \\sum x` (KV scan over the contexts in the batch) and :math:`T_c` the compute
    (:math:`g\\,n` per decode sequence plus the prefill terms :math:`a c + b((p+c)^2 - p^2)`). Its mean board
    power is the time-weighted mean of a power per component, capped at the board limit:

    .. math::

        P = \\min\\left(P_{lim},\\;
            \\frac{p_w T_w + p_{kv} T_{kv} + p_c T_c}{T_w + T_{kv} + T_c}\\right),
        \\qquad P = P_{idle} \\text{ when } T_w + T_{kv} + T_c = 0.

    A lightly loaded decode step is dominated by :math:`T_w` and draws about :math:`p_w`; long contexts
    shift the time to the KV scan (:math:`p_{kv}`); large batches and prefill are compute-bound and run
    into the board limit. Source: the NVML energy-counter measurements of a Llama-3.1-8B-shaped model on one
    H100-SXM (``data/measurements/README.md``; fit and errors in ``docs/profile_fit.md``): fitted by
    :func:`fleetopt.models.calibration.fit_activity_power`, this form is within 5.1 % of all 20 measured
    points (decode 417-710 W, prefill 681-687 W; median 1.7 %).

    Examples
    --------
    Weight streaming at 400 W for 6 ms, KV scan at 700 W for 3 ms and compute at 1,800 W for 1 ms:
    (400 x 6 + 700 x 3 + 1800 x 1) / 10 = 630 W; with 2 ms of KV and 2 ms of compute the mean would be
    740 W, capped at 700 W; no work draws idle power.

    >>> p = ActivityPower(idle_w=70.0, limit_w=700.0, weights_w=400.0, kv_w=700.0, compute_w=1800.0)
    >>> [round(float(x), 6) for x in p.iteration_power_w([0.006, 0.006, 0.0], [0.003, 0.002, 0.0],
    ...                                                  [0.001, 0.002, 0.0])]
    [630.0, 700.0, 70.0]
    """

    idle_w: float
    limit_w: float
    weights_w: float
    kv_w: float
    compute_w: float
    quality: str = "measured"

    def __post_init__(self) -> None:
        if not (0.0 <= self.idle_w <= self.limit_w) or not np.isfinite(self.limit_w):
            raise ValueError(f"activity power needs 0 <= idle_w <= limit_w < inf; got idle_w={self.idle_w}, "
                             f"limit_w={self.limit_w}")
        for name in ("weights_w", "kv_w", "compute_w"):
            value = getattr(self, name)
            if not (value >= 0.0 and np.isfinite(value)):
                raise ValueError(f"activity power {name} must be finite and >= 0; got {value}")
        if self.quality not in QUALITIES:
            raise ValueError(f"power quality must be one of {QUALITIES}; got {self.quality!r}")

    def iteration_power_w(self, weights_s, kv_s, compute_s):
        """Mean board power in W of an iteration whose time splits into ``weights_s`` + ``kv_s`` + ``compute_s``
        seconds (array-aware, broadcast; each >= 0); ``idle_w`` where all three are 0 (see the class Notes)."""
        w, kv, c = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (weights_s, kv_s, compute_s)))
        if np.any(w < 0) or np.any(kv < 0) or np.any(c < 0):
            raise ValueError("iteration_power_w needs weights_s, kv_s and compute_s >= 0")
        total = w + kv + c
        energy = self.weights_w * w + self.kv_w * kv + self.compute_w * c
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.where(total > 0, energy / np.where(total > 0, total, 1.0), self.idle_w)
        out = np.minimum(self.limit_w, mean)
        return out if out.ndim else float(out)

    def scaled(self, factor: float) -> ActivityPower:
        """The same power for ``factor`` identical GPUs working in lockstep (TP): every wattage times ``factor``."""
        return ActivityPower(self.idle_w * factor, self.limit_w * factor, self.weights_w * factor,
                             self.kv_w * factor, self.compute_w * factor, self.quality)


def pool_power_secant(curve: PowerCurve, replicas: int, load_max_erlangs: float, max_batch: int,
                      grid: int = 2049) -> tuple[float, float, float]:
    """A line above the power of a pool, linear in its load, on :math:`[0, A]` (the split MIP's power term).

    Parameters
    ----------
    curve : PowerCurve
        Power of one replica versus its batch.
    replicas : int
        Replica count :math:`N` (>= 1).
    load_max_erlangs : float
        The largest load :math:`A` of the pool in Erlangs (sequences in flight over all replicas).
    max_batch : int
        Batch cap :math:`n` per replica: a replica never runs more than :math:`n` sequences.
    grid : int, optional
        Number of grid points :math:`m` on :math:`[0, A]` (>= 2).

    Returns
    -------
    base_w : float
        The line's value at zero load, :math:`\\beta` (W).
    slope_w_per_erlang : float
        Its slope :math:`s` (W per Erlang).
    raise_w : float
        How far the line was raised above the tangent-like line through :math:`(A, h(A))`, :math:`r` (W).

    Notes
    -----
    The pool's power at load :math:`a` spread evenly over its replicas (Little's law gives the mean
    batch :math:`a/N`) is

    .. math::

        h(a) = N \\, P(\\min(a/N, n)), \\qquad a \\in [0, A].

    On the grid :math:`a_i = iA/(m - 1)` the slope is the backward difference at :math:`A` (the tangent
    there, to grid resolution), the gap of :math:`h` over the line through :math:`(A, h(A))` is
    :math:`g_i`, and the line is raised by the largest gap plus the largest change of the gap between
    neighbours (a margin for the points between the grid's):

    .. math::

        s = \\frac{h(a_{m-1}) - h(a_{m-2})}{a_{m-1} - a_{m-2}}, \\quad
        g_i = h(a_i) - h(A) - s (a_i - A), \\quad
        r = \\max\\bigl(0, \\max_i g_i + \\max_i |g_{i+1} - g_i|\\bigr), \\quad
        \\beta = h(A) - s A + r

    so that :math:`\\beta + s a \\ge h(a)` on :math:`[0, A]`. Power saturates, so :math:`h` is concave
    over most of the range and the tangent lies above it; the raise covers the convex start of the
    logistic curve. With :math:`A \\le 0` the pool is idle: :math:`\\beta = N P(0)`, :math:`s = r = 0`.

    Raises
    ------
    ValueError
        If ``replicas`` < 1 or ``grid`` < 2.

    Examples
    --------
    A flat curve (idle = nominal power) gives the flat line :math:`N P`:

    >>> pool_power_secant(PowerCurve(400.0, 400.0, 1.0, 4.0), 3, 10.0, 64)
    (1200.0, 0.0, 0.0)
    """
    if replicas < 1 or grid < 2:
        raise ValueError(f"pool_power_secant needs replicas >= 1 and grid >= 2; got replicas={replicas}, grid={grid}")
    if load_max_erlangs <= 0:
        return float(replicas * curve.power_w(0.0)), 0.0, 0.0
    a = np.linspace(0.0, load_max_erlangs, grid)
    h = replicas * curve.power_w(np.minimum(a / replicas, max_batch))
    slope = (h[-1] - h[-2]) / (a[-1] - a[-2])
    gap = h - (h[-1] + slope * (a - load_max_erlangs))
    raise_w = max(0.0, float(gap.max()) + float(np.abs(np.diff(gap)).max(initial=0.0)))
    return float(h[-1] - slope * load_max_erlangs + raise_w), float(slope), raise_w


def power_floor_w(power) -> float:
    """The least power one replica of a profile with power model ``power`` draws at any batch and occupancy (W).

    A :class:`PowerCurve` is a convex combination of its idle and nominal power at every batch (its logistic share
    lies in [0, 1]), so every mean of it, the batched model's and the slot models', is at least
    :math:`\\min(P_{idle}, P_{nom})`. An :class:`ActivityPower` model claims no floor here: 0.

    >>> power_floor_w(PowerCurve(300.0, 700.0, 1.0, 4.0, "projected"))
    300.0
    """
    if isinstance(power, PowerCurve):
        return float(min(power.idle_w, power.nominal_w))
    return 0.0
