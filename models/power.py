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

__all__ = ["PowerCurve"]

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
