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

import numpy as np

__all__ = ["PowerCurve", "pool_power_secant"]

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

    def power_w(self, batch):
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

    def scaled(self, factor: float) -> "PowerCurve":
        """The same curve for ``factor`` identical GPUs working in lockstep (TP)."""
        return PowerCurve(self.idle_w * factor, self.nominal_w * factor, self.k, self.x0, self.quality)


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
