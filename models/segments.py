"""Exact service-time statistics of length segments, for any profile, vectorized.

A pool serves the requests whose total length lies in a segment
:math:`(b_i, b_j]` of a boundary grid :math:`0 = b_0 < b_1 < \\dots < b_M`, with
context window :math:`b_j`. By :mod:`models.service`, a request holds a slot for

.. math::

    S = A \\, (W + c L), \\qquad A = k + l_{out}, \\quad k = \\lceil l_{in}/\\mathrm{chunk} \\rceil,
    \\quad c = H \\, n_{slots}(b_j) / B_{cal}

so the segment's first two moments are linear in five *basis integrals*

.. math::

    E[S\\,1_{seg}] = W\\,\\Sigma_A + c\\,\\Sigma_{AL}, \\qquad
    E[S^2 1_{seg}] = W^2 \\Sigma_{A^2} + 2Wc\\,\\Sigma_{A^2L} + c^2 \\Sigma_{A^2L^2}

with :math:`\\Sigma_g = E[g(L)\\,1\\{b_i < L \\le b_j\\}]`. :func:`segment_basis`
computes prefix sums of these integrals over the grid once per prefill chunk
size, exactly: on each sub-interval where :math:`k` is constant the integrands
are polynomials of degree at most 4 in :math:`L`, which 3-point
Gauss-Legendre quadrature integrates exactly. Trace workloads sum the same
quantities over their requests. No sampling is involved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .profiles import ServingProfile
from .workload import LengthDistribution, RequestTrace

__all__ = ["SegmentBasis", "SegmentStats", "segment_basis", "segment_stats"]

_GL_X, _GL_W = np.polynomial.legendre.leggauss(3)
_NAMES = ("mass", "A", "AL", "A2", "A2L", "A2L2", "k", "out", "L")


@dataclass(frozen=True, eq=False)
class SegmentBasis:
    """Prefix sums (over the boundary grid) of the basis integrals for one chunk size.

    ``prefix[name][j]`` is the integral over :math:`(0, b_j]`;
    ``chunk_mass_prefix[j, k]`` the probability of :math:`L \\le b_j` with
    :math:`k` prefill chunks.
    """

    boundaries: np.ndarray
    chunk_tokens: int
    prefix: dict
    chunk_mass_prefix: np.ndarray

    def between(self, name: str, i, j):
        """Integral of basis ``name`` over :math:`(b_i, b_j]` (array-aware in i, j)."""
        p = self.prefix[name]
        return p[np.asarray(j)] - p[np.asarray(i)]


def _accumulate(boundaries, L_idx, weights, values: dict, k, k_max):
    """Sum weighted values into elementary intervals; return prefix sums."""
    m = len(boundaries)
    prefix = {}
    for name in _NAMES:
        v = weights if name == "mass" else weights * values[name]
        per = np.bincount(L_idx, weights=v, minlength=m)[:m]
        prefix[name] = np.cumsum(per)
    grid = np.zeros((m, k_max + 1))
    np.add.at(grid, (L_idx, k.astype(np.int64)), weights)
    return prefix, np.cumsum(grid, axis=0)


def _values(k, l_out, L):
    A = k + l_out
    return {"A": A, "AL": A * L, "A2": A * A, "A2L": A * A * L, "A2L2": A * A * L * L,
            "k": k, "out": l_out, "L": L}


def segment_basis(workload: LengthDistribution | RequestTrace, boundaries, chunk_tokens: int,
                  input_fraction: float = 0.8) -> SegmentBasis:
    """Prefix sums of the basis integrals on ``boundaries`` (must start at 0 and cover the workload).

    For a :class:`LengthDistribution`, :math:`l_{in} = fL`; for a trace, each
    request's own prompt and output counts are used (``input_fraction`` ignored).
    """
    b = np.asarray(boundaries, dtype=float)
    if b[0] != 0 or np.any(np.diff(b) <= 0):
        raise ValueError("boundaries must start at 0 and increase strictly")
    if isinstance(workload, RequestTrace):
        L = workload.total_tokens.astype(float)
        if L.max() > b[-1]:
            raise ValueError(f"the trace has requests of {L.max():g} tokens beyond the last boundary {b[-1]:g}")
        k = np.ceil(workload.prompt_tokens / chunk_tokens)
        w = np.full(len(L), 1.0 / len(L))
        idx = np.searchsorted(b, L, side="left")
        prefix, grid = _accumulate(b, idx, w, _values(k, workload.output_tokens.astype(float), L), k, int(k.max()))
        return SegmentBasis(b, chunk_tokens, prefix, grid)
    if not 0.0 < input_fraction < 1.0:
        raise ValueError(f"input_fraction must lie in (0, 1); got {input_fraction}")
    f = input_fraction
    d = workload
    if d.max_tokens > b[-1] * (1 + 1e-12):
        raise ValueError(f"the distribution reaches {d.max_tokens:g} tokens beyond the last boundary {b[-1]:g}")
    atom = d.hi_tokens <= d.lo_tokens
    pieces = ~atom & (d.prob > 0)
    top = float(b[-1])
    chunk_cuts = np.arange(1, int(np.ceil(f * top / chunk_tokens)) + 1) * chunk_tokens / f
    cuts = np.unique(np.concatenate((b, d.lo_tokens[pieces], d.hi_tokens[pieces], chunk_cuts[chunk_cuts < top])))
    u, v = cuts[:-1], cuts[1:]
    mid = (u + v) / 2.0
    # density of the piece each sub-interval lies in
    owner = np.searchsorted(d.hi_tokens[pieces], mid, side="left")
    inside = owner < pieces.sum()
    owner = np.minimum(owner, pieces.sum() - 1)
    plo, phi, pp = d.lo_tokens[pieces][owner], d.hi_tokens[pieces][owner], d.prob[pieces][owner]
    inside &= (mid > plo) & (mid < phi)
    dens = np.where(inside, pp / (phi - plo), 0.0)
    k_sub = np.ceil(f * mid / chunk_tokens)
    half = (v - u) / 2.0
    # Gauss-Legendre: nodes x_g in each sub-interval, weights w_g * half * density
    Lg = mid[:, None] + half[:, None] * _GL_X[None, :]
    wg = (half * dens)[:, None] * _GL_W[None, :]
    kg = np.broadcast_to(k_sub[:, None], Lg.shape)
    idx_sub = np.searchsorted(b, mid, side="left")
    idx = np.broadcast_to(idx_sub[:, None], Lg.shape)
    La = d.hi_tokens[atom & (d.prob > 0)]
    wa = d.prob[atom & (d.prob > 0)]
    ka = np.ceil(f * La / chunk_tokens)
    L_all = np.concatenate((Lg.ravel(), La))
    w_all = np.concatenate((wg.ravel(), wa))
    k_all = np.concatenate((kg.ravel(), ka))
    i_all = np.concatenate((idx.ravel(), np.searchsorted(b, La, side="left")))
    k_max = int(max(k_all.max(initial=0), 0))
    prefix, grid = _accumulate(b, i_all, w_all, _values(k_all, (1 - f) * L_all, L_all), k_all, k_max)
    return SegmentBasis(b, chunk_tokens, prefix, grid)


@dataclass(frozen=True, eq=False)
class SegmentStats:
    """Per-segment service statistics for one profile (arrays over segments).

    ``rate_share`` is the share of all requests in the segment;
    ``prefill_probs[s, k]`` the conditional probability of :math:`k` prefill
    chunks, each chunk taking ``prefill_chunk_s``.
    """

    lo_tokens: np.ndarray
    hi_tokens: np.ndarray
    n_slots: np.ndarray
    rate_share: np.ndarray
    mean_service_s: np.ndarray
    cv2_service: np.ndarray
    mean_prefill_s: np.ndarray
    mean_output_tokens: np.ndarray
    mean_total_tokens: np.ndarray
    prefill_chunk_s: float
    prefill_probs: np.ndarray

    @property
    def prefill_times_s(self) -> np.ndarray:
        """Prefill time of each chunk count :math:`k = 0, 1, \\dots` (columns of ``prefill_probs``)."""
        return np.arange(self.prefill_probs.shape[1]) * self.prefill_chunk_s


def segment_stats(basis: SegmentBasis, i, j, profile: ServingProfile) -> SegmentStats:
    """Statistics of segments :math:`(b_i, b_j]` served by ``profile`` at context window :math:`b_j`.

    Segments without traffic get zero share and NaN moments.
    """
    if basis.chunk_tokens != profile.chunk_tokens:
        raise ValueError(f"basis built for chunk {basis.chunk_tokens}, profile {profile.name} uses {profile.chunk_tokens}")
    i = np.atleast_1d(np.asarray(i, dtype=np.int64))
    j = np.atleast_1d(np.asarray(j, dtype=np.int64))
    if np.any(j <= i):
        raise ValueError("segments need i < j")
    hi = basis.boundaries[j]
    n = np.asarray(profile.n_slots(hi.astype(np.int64)), dtype=float)
    c = profile.H_s * n / profile.calibration_ctx_tokens
    W = profile.W_s
    g = {name: basis.between(name, i, j) for name in _NAMES}
    mass = g["mass"]
    with np.errstate(divide="ignore", invalid="ignore"):
        m1 = (W * g["A"] + c * g["AL"]) / mass
        m2 = (W * W * g["A2"] + 2 * W * c * g["A2L"] + c * c * g["A2L2"]) / mass
        cv2 = np.maximum(m2 / (m1 * m1) - 1.0, 0.0)
        probs = (basis.chunk_mass_prefix[j] - basis.chunk_mass_prefix[i]) / mass[:, None]
        out = g["out"] / mass
        tot = g["L"] / mass
        chunk_s = W + profile.H_s
        mean_pf = g["k"] / mass * chunk_s
    return SegmentStats(basis.boundaries[i], hi, n, mass, m1, cv2, mean_pf, out, tot, chunk_s,
                        np.clip(probs, 0.0, None))
