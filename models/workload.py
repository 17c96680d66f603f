"""Request workloads: length distributions (CDF tables) and request traces.

A :class:`LengthDistribution` is the distribution of a request's *total*
length :math:`L` (prompt plus output tokens) given as a CDF table
:math:`(t_i, F_i)`. Between breakpoints the length is uniform (the CDF is
interpolated linearly from :math:`(0, 0)`), so the distribution is a set of
*pieces*: uniform on :math:`(lo, hi]` with mass :math:`p`, or an atom at
:math:`hi` when :math:`lo = hi` (truncation creates one). With an input
fraction :math:`f` a request of length :math:`L` has :math:`l_{in} = fL`
prompt and :math:`l_{out} = (1-f)L` output tokens.

A :class:`RequestTrace` holds real requests with their own arrival instants,
prompt and output lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetopt.models.numerics import bisect_boundary, unique

__all__ = ["LengthDistribution", "RequestTrace", "DEFAULT_INPUT_FRACTION"]

DEFAULT_INPUT_FRACTION = 0.8
"""Share of a request's total tokens that is prompt, for CDF workloads (the seeds' convention)."""

_TOL = 1e-9


@dataclass(frozen=True, eq=False)
class LengthDistribution:
    """Piecewise-uniform total-length distribution, plus atoms (see module docstring).

    Examples
    --------
    >>> d = LengthDistribution.from_cdf([(100, 0.5), (300, 1.0)])
    >>> float(d.cdf(50)), float(d.cdf(200)), d.mean_tokens
    (0.25, 0.75, 125.0)
    """

    lo_tokens: np.ndarray
    hi_tokens: np.ndarray
    prob: np.ndarray

    @classmethod
    def from_cdf(cls, points) -> LengthDistribution:
        """Build from ``[(tokens, cumulative_fraction), ...]``.

        Raises ``ValueError`` naming the offending entry when tokens are not
        positive and strictly increasing, fractions leave [0, 1] or decrease,
        or the last fraction is not 1.
        """
        arr = np.asarray(points, dtype=float)
        if arr.ndim != 2 or arr.shape[1] != 2 or len(arr) == 0:
            raise ValueError("a CDF must be a non-empty list of [tokens, cumulative_fraction] pairs")
        t, F = arr[:, 0], arr[:, 1]
        if not np.all(np.isfinite(arr)):
            raise ValueError("CDF entries must be finite numbers")
        if t[0] <= 0:
            raise ValueError(f"CDF tokens must be > 0; entry 0 has {t[0]:g}")
        bad = np.flatnonzero(np.diff(t) <= 0)
        if bad.size:
            i = int(bad[0]) + 1
            raise ValueError(f"CDF tokens must increase strictly; entry {i} ({t[i]:g}) follows {t[i - 1]:g}")
        if np.any((F < -_TOL) | (F > 1 + _TOL)):
            i = int(np.flatnonzero((F < -_TOL) | (F > 1 + _TOL))[0])
            raise ValueError(f"CDF fractions must lie in [0, 1]; entry {i} has {F[i]:g}")
        bad = np.flatnonzero(np.diff(F) < -_TOL)
        if bad.size:
            i = int(bad[0]) + 1
            raise ValueError(f"CDF fractions must not decrease; entry {i} ({F[i]:g}) follows {F[i - 1]:g}")
        if abs(F[-1] - 1.0) > 1e-6:
            raise ValueError(f"CDF must end at cumulative fraction 1; the last entry has {F[-1]:g}")
        F = np.clip(np.maximum.accumulate(F), 0.0, 1.0)
        F[-1] = 1.0
        lo = np.concatenate(([0.0], t[:-1]))
        return cls(lo, t.copy(), np.diff(np.concatenate(([0.0], F))))

    @classmethod
    def from_lognormal_mixture(cls, weights, median_tokens, sigmas, max_tokens: float = 131072,
                               points: int = 256) -> LengthDistribution:
        """A synthetic workload: a mixture of lognormal total lengths, tabulated as a CDF.

        .. math::

            F(x) = \\frac{\\sum_i w_i \\Phi((\\ln x - \\ln m_i)/\\sigma_i)}
                        {\\sum_i w_i \\Phi((\\ln x_{max} - \\ln m_i)/\\sigma_i)}

        on ``points`` geometric breakpoints from 1 to ``max_tokens`` (the mixture is truncated
        there and renormalised). Between breakpoints the length is uniform, as for any CDF table,
        so every statistic downstream is exact for this table.

        Examples
        --------
        >>> d = LengthDistribution.from_lognormal_mixture([1.0], [1000.0], [0.5], max_tokens=65536)
        >>> round(float(d.cdf(1000.0)), 3)
        0.5
        """
        from fleetopt.models.numerics import special

        w = np.asarray(weights, dtype=float)
        m = np.asarray(median_tokens, dtype=float)
        s = np.asarray(sigmas, dtype=float)
        if not (len(w) == len(m) == len(s) >= 1):
            raise ValueError("weights, median_tokens and sigmas need one entry per component")
        if np.any(w <= 0) or np.any(m <= 0) or np.any(s <= 0):
            raise ValueError("mixture weights, medians and sigmas must be > 0")
        if max_tokens <= 1 or points < 2:
            raise ValueError("max_tokens must be > 1 and points >= 2")
        grid = unique(np.round(np.geomspace(1.0, float(max_tokens), points)))
        F = (w[None, :] * special.ndtr((np.log(grid)[:, None] - np.log(m)[None, :]) / s[None, :])).sum(axis=1)
        return cls.from_cdf(np.column_stack([grid, F / F[-1]]))

    @property
    def breakpoints(self) -> np.ndarray:
        """The CDF's own token breakpoints (piece ends), ascending and unique."""
        return unique(self.hi_tokens)

    @property
    def max_tokens(self) -> float:
        return float(self.hi_tokens[self.prob > 0].max())

    @property
    def mean_tokens(self) -> float:
        return float(np.sum(self.prob * (self.lo_tokens + self.hi_tokens) / 2.0))

    def cdf(self, x):
        """:math:`P(L \\le x)` (array-aware)."""
        x = np.asarray(x, dtype=float)[..., None]
        width = self.hi_tokens - self.lo_tokens
        atom = width <= 0
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(atom, (x >= self.hi_tokens).astype(float),
                            np.clip((x - self.lo_tokens) / np.where(atom, 1.0, width), 0.0, 1.0))
        return np.sum(self.prob * frac, axis=-1)

    def truncated(self, max_tokens: float) -> tuple[LengthDistribution, float]:
        """Requests longer than ``max_tokens`` are cut to ``max_tokens`` (an atom there).

        Returns the new distribution and the share of requests that were cut.
        """
        share = float(1.0 - self.cdf(max_tokens))
        keep = self.lo_tokens < max_tokens
        lo = self.lo_tokens[keep]
        hi = np.minimum(self.hi_tokens[keep], max_tokens)
        width = self.hi_tokens[keep] - self.lo_tokens[keep]
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(width > 0, (hi - lo) / np.where(width > 0, width, 1.0), 1.0)
        prob = self.prob[keep] * scale
        if share > 0:
            lo = np.append(lo, max_tokens)
            hi = np.append(hi, max_tokens)
            prob = np.append(prob, share)
        return LengthDistribution(lo, hi, prob), share

    def quantile(self, q):
        """Smallest :math:`x` with :math:`P(L \\le x) \\ge q` (array-aware; bisection on the CDF to float resolution).

        Examples
        --------
        >>> d = LengthDistribution.from_cdf([(100, 0.5), (300, 1.0)])
        >>> d.quantile([0.0, 0.25, 0.75]).tolist()
        [0.0, 50.0, 200.0]
        """
        q = np.asarray(q, dtype=float)
        _, hi = bisect_boundary(lambda x: self.cdf(x) < q, np.zeros_like(q), np.full_like(q, self.hi_tokens.max()))
        return hi

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` total lengths (float tokens) with the given generator."""
        idx = rng.choice(len(self.prob), size=size, p=self.prob / self.prob.sum())
        u = rng.random(size)
        return self.lo_tokens[idx] + u * (self.hi_tokens[idx] - self.lo_tokens[idx])


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """Recorded requests: arrival instants (s from the first), prompt and output tokens."""

    arrived_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrived_at_s)
        if n == 0:
            raise ValueError("a trace needs at least one request")
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("trace columns must have the same length")
        if np.any(np.diff(self.arrived_at_s) < 0):
            i = int(np.flatnonzero(np.diff(self.arrived_at_s) < 0)[0]) + 1
            raise ValueError(f"arrival instants must not decrease; row {i + 1} goes back in time")
        if np.any(self.prompt_tokens < 0) or np.any(self.output_tokens < 0):
            raise ValueError("token counts must be >= 0")
        if np.any(self.prompt_tokens + self.output_tokens <= 0):
            i = int(np.flatnonzero(self.prompt_tokens + self.output_tokens <= 0)[0])
            raise ValueError(f"row {i + 1} has no tokens at all")

    @property
    def total_tokens(self) -> np.ndarray:
        return self.prompt_tokens + self.output_tokens

    @property
    def duration_s(self) -> float:
        return float(self.arrived_at_s[-1] - self.arrived_at_s[0])

    @property
    def mean_rate_req_per_s(self) -> float:
        """Mean arrival rate: (n - 1) gaps over the span from first to last arrival."""
        n = len(self.arrived_at_s)
        return (n - 1) / self.duration_s if n > 1 and self.duration_s > 0 else float("nan")

    def truncated(self, max_tokens: float) -> tuple[RequestTrace, float]:
        """Cut requests longer than ``max_tokens``: the prompt is shortened first, then the output."""
        total = self.total_tokens
        over = total > max_tokens
        out = np.minimum(self.output_tokens, max_tokens)
        prompt = np.where(over, np.maximum(max_tokens - out, 0), self.prompt_tokens)
        return RequestTrace(self.arrived_at_s, prompt, out), float(np.mean(over))

    def length_distribution(self) -> LengthDistribution:
        """The trace's total lengths as an empirical distribution (one atom per distinct length)."""
        values, counts = np.unique(self.total_tokens.astype(float), return_counts=True)
        return LengthDistribution(values, values.copy(), counts / counts.sum())
