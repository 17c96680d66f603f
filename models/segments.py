"""Exact service-time statistics of length segments, for any profile, vectorized.

A pool serves the requests whose total length lies in a segment
:math:`(b_i, b_j]` of a boundary grid :math:`0 = b_0 < b_1 < \\dots < b_M`, with
context window :math:`b_j`. By :mod:`fleetopt.models.service`, a request holds a slot for

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

from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.queueing.dispersion import binned_spectra, combine_spectra
from fleetopt.models.profiles import ServingProfile
from fleetopt.models.service import compute_coefficients, iteration_coefficients
from fleetopt.models.workload import LengthDistribution, RequestTrace

__all__ = ["SegmentBasis", "SegmentStats", "RawSums", "segment_basis", "segment_stats", "raw_between",
           "compressed_band", "stats_from_raw", "context_work", "compute_work", "work_moments", "prompt_bin_tokens"]

_GL_X, _GL_W = np.polynomial.legendre.leggauss(3)
_NAMES = ("mass", "A", "AL", "A2", "A2L", "A2L2", "k", "out", "L", "X", "X2")
_COMPUTE_NAMES = ("Xd", "P1", "P2", "Q1", "Q2", "R11", "R12", "R22")
"""Sums the compute terms of the iteration need (:func:`compute_work`), in this order."""
_MOMENT_NAMES = ("XX", "Xo", "Xi", "Xii", "oo", "oi", "oii", "ii", "iii", "iiii", "AX", "Ao", "Ai", "Aii")
"""Products of a request's context sum :math:`X`, output :math:`o = l_{out}`, prompt :math:`i = l_{in}` and
iterations :math:`A = k + l_{out}` whose means give :math:`E[Y^2]` and :math:`E[IY]` of its whole time-work
:math:`Y = hX + g\\,o + a\\,i + b\\,i^2` (:func:`work_moments`); kept after the compute sums in ``compute``."""
_SUM_NAMES = _COMPUTE_NAMES + _MOMENT_NAMES


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
    prompt_bin_prefix: np.ndarray
    """``prompt_bin_prefix[j, q, p]``: the integral of :math:`l_{in}^p` (p = 0, 1, 2) over requests of
    :math:`L \\le b_j` whose prompt lies in bin :math:`q`, :math:`l_{in} \\in ((q-1)w, qw]` with
    :math:`w` = :func:`prompt_bin_tokens` (bin 0: no prompt): the prompt law at a resolution finer than a chunk,
    for the own-prefill compute of the TTFT mixture."""
    spectra_prefix: np.ndarray | None = None
    """``spectra_prefix[j]``: the sum of :func:`fleetopt.models.queueing.dispersion.request_spectra` over requests of
    :math:`L \\le b_j`, shape (len(boundaries), len(OMEGA), N_SPECTRA): the count's dispersion
    (:attr:`SegmentStats.count_spectra`)."""

    def between(self, name: str, i, j):
        """Integral of basis ``name`` over :math:`(b_i, b_j]` (array-aware in i, j)."""
        p = self.prefix[name]
        return p[np.asarray(j)] - p[np.asarray(i)]


_PROMPT_BIN = 256
"""Largest prompt-bin width in tokens (:func:`prompt_bin_tokens`)."""


def prompt_bin_tokens(chunk_tokens: int) -> int:
    """Width :math:`w` of the prompt bins: the chunk itself up to :data:`_PROMPT_BIN` tokens, else its largest
    divisor not above that, so every bin lies inside one chunk count (:math:`k` is constant on a bin).

    >>> [prompt_bin_tokens(c) for c in (64, 512, 1000, 8192)]
    [64, 256, 250, 256]
    """
    c = int(chunk_tokens)
    return c if c <= _PROMPT_BIN else next(d for d in range(_PROMPT_BIN, 0, -1) if c % d == 0)


def _accumulate(boundaries, L_idx, weights, values: dict, k, k_max, chunk_tokens):
    """Sum weighted values into elementary intervals; return prefix sums."""
    m = len(boundaries)
    prefix = {}
    for name in _NAMES + _SUM_NAMES:
        v = weights if name == "mass" else weights * values[name]
        per = np.bincount(L_idx, weights=v, minlength=m)[:m]
        prefix[name] = np.cumsum(per)
    grid = np.zeros((m, k_max + 1))
    ki = k.astype(np.int64)
    np.add.at(grid, (L_idx, ki), weights)
    q = _prompt_bin(values["P1"], chunk_tokens)
    prompt = np.zeros((m, k_max * (int(chunk_tokens) // prompt_bin_tokens(chunk_tokens)) + 1, 3))
    for p, v in enumerate((weights, weights * values["P1"], weights * values["P2"])):
        np.add.at(prompt, (L_idx, q, p), v)   # pyright: ignore[reportArgumentType]  # stubs: no index tuples
    spectra = binned_spectra(np.minimum(L_idx, m - 1), m, np.where(L_idx < m, weights, 0.0), k, values["P1"],
                             values["out"], chunk_tokens)
    return prefix, np.cumsum(grid, axis=0), np.cumsum(prompt, axis=0), np.cumsum(spectra, axis=0)


def _prompt_bin(l_in, chunk_tokens) -> np.ndarray:
    """Bin index :math:`\\lceil l_{in} / w \\rceil` of each prompt (:func:`prompt_bin_tokens`)."""
    return np.ceil(np.asarray(l_in, dtype=float) / prompt_bin_tokens(chunk_tokens) - 1e-9).astype(np.int64)


def context_work(prompt_tokens, output_tokens, chunk_tokens):
    """Context sums of one request over its iterations, :math:`X` and :math:`X_2` (array-aware).

    In continuous batching a request runs :math:`k = \\lceil l_{in}/c \\rceil` prefill iterations starting
    from contexts :math:`0, c, \\dots, (k-1)c` and :math:`l_{out}` decode iterations starting from
    :math:`l_{in}, \\dots, l_{in} + l_{out} - 1` (:mod:`fleetopt.solvers.des.engine`), so

    .. math::

        X = c\\frac{k(k-1)}{2} + l_{out} l_{in} + \\frac{l_{out}(l_{out}-1)}{2}, \\qquad
        X_2 = c^2 \\frac{(k-1)k(2k-1)}{6} + l_{out} l_{in}^2 + l_{in} l_{out}(l_{out}-1)
              + \\frac{(l_{out}-1) l_{out} (2 l_{out}-1)}{6}

    (:math:`X_2` sums the squared contexts). Both are polynomials in the lengths (degree 2 and 3), so
    Gauss-Legendre on pieces of constant :math:`k` integrates them exactly.

    Examples
    --------
    Two prefill chunks of 4 tokens (prompt 8) and 3 output tokens: contexts 0, 4 | 8, 9, 10.

    >>> [float(v) for v in context_work(8, 3, 4)]
    [31.0, 261.0]
    """
    l_in = np.asarray(prompt_tokens, dtype=float)
    return _work(np.ceil(l_in / chunk_tokens), l_in, np.asarray(output_tokens, dtype=float), chunk_tokens)


def _values(k, l_out, L, chunk_tokens):
    A = k + l_out
    X, X2 = _work(k, L - l_out, l_out, chunk_tokens)
    out = {"A": A, "AL": A * L, "A2": A * A, "A2L": A * A * L, "A2L2": A * A * L * L,
           "k": k, "out": l_out, "L": L, "X": X, "X2": X2}
    out.update(zip(_COMPUTE_NAMES, _compute(k, L - l_out, l_out, chunk_tokens)))
    out.update(zip(_MOMENT_NAMES, _products(A, X, L - l_out, l_out)))
    return out


def _products(A, X, l_in, l_out):
    """The products of :data:`_MOMENT_NAMES`, in that order."""
    i, o = l_in, l_out
    return (X * X, X * o, X * i, X * i * i, o * o, o * i, o * i * i, i * i, i * i * i, i * i * i * i,
            A * X, A * o, A * i, A * i * i)


def work_moments(sums, h, g=0.0, a=0.0, b=0.0):
    """:math:`(E[Y^2], E[IY])` from the means of the products of :data:`_MOMENT_NAMES` (last axis, in that order)
    for the time-work :math:`Y = hX + g\\,l_{out} + a\\,l_{in} + b\\,l_{in}^2` of :func:`compute_work` and the
    iterations :math:`I = k + l_{out}`:

    .. math::

        Y^2 = h^2 X^2 + g^2 o^2 + a^2 i^2 + b^2 i^4 + 2hg\\,Xo + 2ha\\,Xi + 2hb\\,Xi^2 + 2ga\\,oi + 2gb\\,oi^2
              + 2ab\\,i^3, \\qquad IY = h\\,AX + g\\,Ao + a\\,Ai + b\\,Ai^2.

    Each product is a polynomial of degree at most 4 in the length, so the basis integrates it exactly.

    Examples
    --------
    Prompt 8 in two chunks of 4, 3 outputs (contexts 0, 4 | 8, 9, 10: :math:`X = 31`, :math:`I = 5`); with
    :math:`h = 1` only, :math:`Y = 31`: :math:`(961, 155)`.

    >>> X = context_work(8, 3, 4)[0]
    >>> [float(v) for v in work_moments(np.array(_products(5.0, X, 8.0, 3.0)), 1.0)]
    [961.0, 155.0]
    """
    XX, Xo, Xi, Xii, oo, oi, oii, ii, iii, iiii, AX, Ao, Ai, Aii = np.moveaxis(np.asarray(sums, dtype=float), -1, 0)
    y2 = (h * h * XX + g * g * oo + a * a * ii + b * b * iiii + 2 * h * g * Xo + 2 * h * a * Xi + 2 * h * b * Xii
          + 2 * g * a * oi + 2 * g * b * oii + 2 * a * b * iii)
    return y2, h * AX + g * Ao + a * Ai + b * Aii


def compute_work(prompt_tokens, output_tokens, chunk_tokens):
    """The sums that the compute terms of the iteration add to a request's time-work (array-aware).

    With :math:`g, a, b` of :func:`fleetopt.models.service.compute_coefficients` and the even-chunk
    convention there (chunk :math:`j` of :math:`k` costs :math:`\\alpha + \\beta j`,
    :math:`\\alpha = a u + b v`, :math:`\\beta = 2 b v`, :math:`u = l_{in}/k`, :math:`v = u^2`), a request adds
    to the iterations it runs in the time-work

    .. math::

        Y = h X + g\\, l_{out} + a\\, l_{in} + b\\, l_{in}^2, \\qquad
        Y_2 = h^2 X_2 + 2hg X_d + 2ha Q_1 + 2hb Q_2 + g^2 l_{out} + a^2 R_{11} + 2ab R_{12} + b^2 R_{22}

    (:math:`Y_2` the sum of its per-iteration contributions squared; :math:`X, X_2` of :func:`context_work`)
    with the decode context sum :math:`X_d = l_{out} l_{in} + l_{out}(l_{out}-1)/2` and

    .. math::

        Q_1 = c\\, l_{in} \\frac{k-1}{2}, \\quad Q_2 = c\\, l_{in}^2 \\frac{(k-1)(4k+1)}{6k}, \\quad
        R_{11} = \\frac{l_{in}^2}{k}, \\quad R_{12} = \\frac{l_{in}^3}{k}, \\quad
        R_{22} = l_{in}^4 \\frac{4k^2 - 1}{3k^3}

    (from :math:`\\sum_j jc(\\alpha + \\beta j)` and :math:`\\sum_j (\\alpha + \\beta j)^2`). Returns
    :math:`(X_d, l_{in}, l_{in}^2, Q_1, Q_2, R_{11}, R_{12}, R_{22})`.

    Examples
    --------
    Prompt 8 in two chunks of 4, 3 outputs: decode contexts 8, 9, 10 sum to 27; with :math:`a = 1, b = 0` the
    chunks cost 4 each, so :math:`\\sum (\\alpha + \\beta j)^2 = 32 = R_{11}`.

    >>> [float(v) for v in compute_work(8, 3, 4)]
    [27.0, 8.0, 64.0, 16.0, 192.0, 32.0, 256.0, 2560.0]
    """
    l_in = np.asarray(prompt_tokens, dtype=float)
    return _compute(np.ceil(l_in / chunk_tokens), l_in, np.asarray(output_tokens, dtype=float), chunk_tokens)


def _compute(k, l_in, l_out, c):
    """:func:`compute_work` with the chunk count :math:`k` given."""
    c = float(c)
    ks = np.where(k > 0, k, 1.0)
    p2 = l_in * l_in
    Xd = l_out * l_in + l_out * (l_out - 1) / 2
    Q1 = c * l_in * (k - 1) / 2
    Q2 = np.where(k > 0, c * p2 * (k - 1) * (4 * k + 1) / (6 * ks), 0.0)
    R11 = np.where(k > 0, p2 / ks, 0.0)
    R12 = np.where(k > 0, p2 * l_in / ks, 0.0)
    R22 = np.where(k > 0, p2 * p2 * (4 * k * k - 1) / (3 * ks ** 3), 0.0)
    return Xd, l_in, p2, np.where(k > 0, Q1, 0.0), Q2, R11, R12, R22


def _work(k, l_in, l_out, c):
    """:func:`context_work` with the chunk count :math:`k` given (constant on a Gauss-Legendre piece)."""
    c = float(c)
    X = c * k * (k - 1) / 2 + l_out * l_in + l_out * (l_out - 1) / 2
    X2 = (c * c * (k - 1) * k * (2 * k - 1) / 6 + l_out * l_in * l_in + l_in * l_out * (l_out - 1)
          + (l_out - 1) * l_out * (2 * l_out - 1) / 6)
    return X, X2


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
        prefix, grid, prompt, spectra = _accumulate(b, idx, w, _values(k, workload.output_tokens.astype(float), L,
                                                                       chunk_tokens), k, int(k.max()), chunk_tokens)
        return SegmentBasis(b, chunk_tokens, prefix, grid, prompt, spectra)
    if not 0.0 < input_fraction < 1.0:
        raise ValueError(f"input_fraction must lie in (0, 1); got {input_fraction}")
    f = input_fraction
    d = workload
    if d.max_tokens > b[-1] * (1 + 1e-12):
        raise ValueError(f"the distribution reaches {d.max_tokens:g} tokens beyond the last boundary {b[-1]:g}")
    atom = d.hi_tokens <= d.lo_tokens
    pieces = ~atom & (d.prob > 0)
    top = float(b[-1])
    step = prompt_bin_tokens(chunk_tokens)           # chunk counts and prompt bins are constant between cuts
    chunk_cuts = np.arange(1, int(np.ceil(f * top / step)) + 1) * step / f
    cuts = unique(np.concatenate((b, d.lo_tokens[pieces], d.hi_tokens[pieces], chunk_cuts[chunk_cuts < top])))
    u, v = cuts[:-1], cuts[1:]
    mid = (u + v) / 2.0
    # density of the piece each sub-interval lies in
    dens = np.zeros(len(mid))
    if pieces.any():            # a distribution of atoms only (a trace's lengths) has no density anywhere
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
    values = _values(k_all, (1 - f) * L_all, L_all, chunk_tokens)
    prefix, grid, prompt, spectra = _accumulate(b, i_all, w_all, values, k_all, k_max, chunk_tokens)
    return SegmentBasis(b, chunk_tokens, prefix, grid, prompt, spectra)


@dataclass(frozen=True, eq=False)
class RawSums:
    """Unnormalised basis integrals of a traffic component (arrays over components).

    ``A`` .. ``A2L2`` are :math:`E[g(L) 1_{comp}]` for the basis functions of the
    module docstring, ``k_hist[:, k]`` the probability of :math:`k` prefill chunks,
    ``out`` and ``L`` the output and total tokens. Components add: a pool's
    traffic is a weighted sum of components (:meth:`scaled`, ``+``).
    """

    mass: np.ndarray
    A: np.ndarray
    AL: np.ndarray
    A2: np.ndarray
    A2L: np.ndarray
    A2L2: np.ndarray
    k: np.ndarray
    out: np.ndarray
    L: np.ndarray
    k_hist: np.ndarray
    X: np.ndarray
    """:math:`E[X 1_{comp}]`, the context a request's iterations start from, summed (:func:`context_work`)."""
    X2: np.ndarray
    """:math:`E[X_2 1_{comp}]`, the sum of those contexts squared."""
    compute: np.ndarray | None = None
    """Shape (S, 8): :math:`E[\\cdot\\, 1_{comp}]` of the sums of :func:`compute_work`; ``None`` reads as zeros
    (components built by hand for profiles without compute terms)."""
    prompt_bins: np.ndarray | None = None
    """Shape (S, Q, 3): mass, :math:`l_{in}` and :math:`l_{in}^2` of each prompt bin
    (:attr:`SegmentBasis.prompt_bin_prefix`);
    ``None`` reads as zeros."""
    spectra: np.ndarray | None = None
    """Shape (S, len(OMEGA), N_SPECTRA): :math:`E[\\cdot\\, 1_{comp}]` of the requests' transforms
    (:attr:`SegmentBasis.spectra_prefix`); ``None`` where unknown, and then in every sum it enters: the model
    falls back to the closed-form dispersion."""

    def _full(self) -> RawSums:
        """The same sums with ``compute`` and ``prompt_bins`` as arrays."""
        if self.compute is not None and self.prompt_bins is not None:
            return self
        S = self.k_hist.shape[0]
        return replace(self, compute=np.zeros((S, len(_SUM_NAMES))) if self.compute is None else self.compute,
                       prompt_bins=np.zeros((S, 1, 3)) if self.prompt_bins is None else self.prompt_bins)

    def take(self, idx) -> RawSums:
        """The components at ``idx`` (array of row indices)."""
        full = self._full()
        return RawSums(*(getattr(full, f)[idx] for f in _RAW_FIELDS),
                       spectra=None if self.spectra is None else self.spectra[idx])

    @staticmethod
    def stack(parts: list[RawSums]) -> RawSums:
        """Concatenate components (prefill histograms padded to a common width)."""
        parts = [p._full() for p in parts]
        width = {f: max(getattr(p, f).shape[1] for p in parts) for f in _HIST_FIELDS}
        known = [p.spectra for p in parts if p.spectra is not None]
        spectra = np.concatenate(known) if len(known) == len(parts) else None
        return RawSums(*(np.concatenate([_pad(getattr(p, f), width[f]) if f in _HIST_FIELDS else getattr(p, f)
                                         for p in parts]) for f in _RAW_FIELDS), spectra=spectra)

    def total(self) -> RawSums:
        """One component holding the sum of all components."""
        full = self._full()
        return RawSums(*(getattr(full, f).sum(axis=0)[None, ...] if f in _HIST_FIELDS + ("compute",)
                         else np.array([getattr(full, f).sum()]) for f in _RAW_FIELDS),
                       spectra=None if self.spectra is None else self.spectra.sum(axis=0)[None])

    def scaled(self, w) -> RawSums:
        w = np.asarray(w, dtype=float)
        full = self._full()
        shape = {"k_hist": w[:, None], "compute": w[:, None], "prompt_bins": w[:, None, None]}
        return RawSums(*(getattr(full, f) * shape.get(f, w) for f in _RAW_FIELDS),
                       spectra=None if self.spectra is None else self.spectra * w[:, None, None])

    def __add__(self, other: RawSums) -> RawSums:
        a, b = self._full(), other._full()
        width = {f: max(getattr(a, f).shape[1], getattr(b, f).shape[1]) for f in _HIST_FIELDS}
        spectra = None if a.spectra is None or b.spectra is None else a.spectra + b.spectra
        return RawSums(*(getattr(a, f) + getattr(b, f) if f not in _HIST_FIELDS
                         else _pad(getattr(a, f), width[f]) + _pad(getattr(b, f), width[f]) for f in _RAW_FIELDS),
                       spectra=spectra)


_RAW_FIELDS = ("mass", "A", "AL", "A2", "A2L", "A2L2", "k", "out", "L", "k_hist", "X", "X2", "compute", "prompt_bins")
_HIST_FIELDS = ("k_hist", "prompt_bins")


def _pad(a: np.ndarray, width: int) -> np.ndarray:
    if a.shape[1] == width:
        return a
    return np.pad(a, ((0, 0), (0, width - a.shape[1])) + ((0, 0),) * (a.ndim - 2))


def raw_between(basis: SegmentBasis, i, j) -> RawSums:
    """Raw sums of the traffic in :math:`(b_i, b_j]` (array-aware in i, j)."""
    i = np.atleast_1d(np.asarray(i, dtype=np.int64))
    j = np.atleast_1d(np.asarray(j, dtype=np.int64))
    fields = {name: basis.between(name, i, j) for name in _NAMES}
    hist = basis.chunk_mass_prefix[j] - basis.chunk_mass_prefix[i]
    compute = np.stack([basis.between(name, i, j) for name in _SUM_NAMES], axis=1)
    prompt = basis.prompt_bin_prefix[j] - basis.prompt_bin_prefix[i]
    spectra = None if basis.spectra_prefix is None else basis.spectra_prefix[j] - basis.spectra_prefix[i]
    return RawSums(fields["mass"], fields["A"], fields["AL"], fields["A2"], fields["A2L"], fields["A2L2"],
                   fields["k"], fields["out"], fields["L"], hist, fields["X"], fields["X2"], compute, prompt, spectra)


def compressed_band(workload: LengthDistribution | RequestTrace, window_tokens: float, gamma: float,
                    chunk_tokens: int, input_fraction: float = 0.8) -> RawSums:
    """Raw sums of the requests in :math:`(B, \\gamma B]` compressed to fit a window :math:`B`.

    Prompt compression shortens the prompt and keeps the output:
    :math:`l_{out}` unchanged, :math:`l'_{in} = B - l_{out}`, so every compressed
    request has total length :math:`B` (its service time uses :math:`L = B`).
    A trace request whose output alone fills the window cannot be compressed:
    such a band raises ``ValueError`` (for a CDF, :math:`\\gamma (1 - f) < 1` guarantees
    it never happens). Exact: Gauss-Legendre between
    the breakpoints of :math:`\\lceil l'_{in}/\\mathrm{chunk} \\rceil`.
    """
    B = float(window_tokens)
    top = gamma * B
    if isinstance(workload, RequestTrace):
        L = workload.total_tokens.astype(float)
        out = workload.output_tokens.astype(float)
        sel = (L > B) & (L <= top)
        if np.any(out[sel] >= B):
            raise ValueError(f"the trace has requests in ({B:g}, {top:g}] whose output alone fills the "
                             f"{B:g}-token window")
        w = np.full(int(sel.sum()), 1.0 / len(L))
        return _band_sums(w, out[sel], B, chunk_tokens)
    f = input_fraction
    if gamma * (1 - f) >= 1:
        raise ValueError(f"gamma {gamma} with input fraction {f}: outputs would fill the window; "
                         f"need gamma < {1 / (1 - f):g}")
    d = workload
    pieces = (d.hi_tokens > d.lo_tokens) & (d.prob > 0)
    # breakpoints of ceil((B - (1 - f) L) / chunk) inside (B, top]
    m = np.arange(np.floor((B - (1 - f) * top) / chunk_tokens), np.ceil(f * B / chunk_tokens) + 1)
    cuts = (B - m * chunk_tokens) / (1 - f)
    grid = unique(np.concatenate(([B, top], cuts[(cuts > B) & (cuts < top)],
                                  d.lo_tokens[pieces], d.hi_tokens[pieces])))
    grid = grid[(grid >= B) & (grid <= top)]
    u, v = grid[:-1], grid[1:]
    mid = (u + v) / 2
    own = np.searchsorted(d.hi_tokens[pieces], mid, side="left")
    own = np.minimum(own, max(pieces.sum() - 1, 0))
    lo, hi, p = d.lo_tokens[pieces][own], d.hi_tokens[pieces][own], d.prob[pieces][own]
    dens = np.where((mid > lo) & (mid < hi), p / np.where(hi > lo, hi - lo, 1.0), 0.0)
    half = (v - u) / 2
    Lg = (mid[:, None] + half[:, None] * _GL_X[None, :]).ravel()
    wg = ((half * dens)[:, None] * _GL_W[None, :]).ravel()
    atoms = (d.hi_tokens <= d.lo_tokens) & (d.prob > 0) & (d.hi_tokens > B) & (d.hi_tokens <= top)
    L_all = np.concatenate((Lg, d.hi_tokens[atoms]))
    w_all = np.concatenate((wg, d.prob[atoms]))
    return _band_sums(w_all, (1 - f) * L_all, B, chunk_tokens)


def _band_sums(weights, out_tokens, window: float, chunk_tokens: int) -> RawSums:
    k = np.ceil((window - out_tokens) / chunk_tokens)
    A = k + out_tokens
    k_max = int(k.max(initial=0))
    hist = np.bincount(k.astype(np.int64), weights=weights, minlength=k_max + 1)[None, :]
    one = lambda x: np.array([float(np.sum(weights * x))])  # noqa: E731
    X, X2 = _work(k, window - out_tokens, out_tokens, chunk_tokens)
    l_in = window - out_tokens
    compute = np.array([[float(np.sum(weights * v)) for v in _compute(k, l_in, out_tokens, chunk_tokens)
                         + _products(A, X, l_in, out_tokens)]])
    q = _prompt_bin(l_in, chunk_tokens)
    prompt = np.stack([np.bincount(q, weights=weights * l_in ** p, minlength=int(q.max(initial=0)) + 1)
                       for p in (0, 1, 2)], axis=1)[None, :, :]
    spectra = binned_spectra(np.zeros(len(k), dtype=np.int64), 1, weights, k, l_in, out_tokens, chunk_tokens)
    return RawSums(one(1.0), one(A), one(A * window), one(A * A), one(A * A * window), one(A * A * window * window),
                   one(k), one(out_tokens), one(np.full_like(A, window)), hist, one(X), one(X2), compute, prompt,
                   spectra)


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
    mean_iterations: np.ndarray
    """:math:`E[I]`, iterations a request runs, :math:`I = k + l_{out}`."""
    cv2_iterations: np.ndarray
    """Squared coefficient of variation of :math:`I`."""
    mean_context_work: np.ndarray
    """:math:`E[X]`, the contexts a request's iterations start from, summed (tokens; :func:`context_work`)."""
    mean_context_work_sq: np.ndarray
    """:math:`E[X_2]`, their squares summed (tokens squared)."""
    iteration_base_s: float
    """:math:`W`: the iteration time with no context (:func:`fleetopt.models.service.iteration_coefficients`)."""
    context_s_per_token: float
    """:math:`h`: the iteration time each token of context adds."""
    chunk_tokens: int
    mean_time_work: np.ndarray
    """:math:`E[Y]`: the seconds a request adds to the iterations it runs in (:func:`compute_work`; :math:`hE[X]`
    for a profile without compute terms)."""
    mean_time_work_sq: np.ndarray
    """:math:`E[Y_2]`: those per-iteration seconds squared, summed (s²)."""
    mean_prefill_compute_s: np.ndarray
    """:math:`E[a\\, l_{in} + b\\, l_{in}^2]`: the compute of a request's prompt (0 without prefill compute)."""
    ttft_probs: np.ndarray
    """Shape (S, Q): the prompt classes of the TTFT mixture (:mod:`fleetopt.models.queueing.batched`): the chunk counts
    (``prefill_probs``) for a profile without compute terms, else the prompt bins of
    :func:`prompt_bin_tokens` (finer than a chunk, so a long chunk's prompts are not charged their mean)."""
    ttft_chunks: np.ndarray
    """Shape (Q,): the chunk count :math:`k` of each class."""
    own_prefill_s: np.ndarray
    """Shape (S, Q): the seconds a request of each class adds to its own prefill iterations,
    :math:`\\omega = h c k(k-1)/2 + a E[l_{in}] + b E[l_{in}^2]` over the class."""
    mean_time_work_total_sq: np.ndarray | None = None
    """:math:`E[Y^2]` (s²): a request's whole time-work squared (:func:`work_moments`; ``None`` for sums built
    without the products)."""
    mean_iterations_time_work: np.ndarray | None = None
    """:math:`E[IY]` (s): its iterations times its time-work."""
    mean_prefill_compute_sq: np.ndarray | None = None
    """:math:`E[(a\\, l_{in} + b\\, l_{in}^2)^2]` (s²): the square of a prompt's compute."""
    mean_decode_work_sq: np.ndarray | None = None
    """:math:`E[Y_d^2]` (s²) of the work beyond the prompt's compute, :math:`Y_d = Y - a\\, l_{in} - b\\, l_{in}^2`
    (:func:`work_moments` with :math:`a = b = 0`)."""
    mean_iterations_decode_work: np.ndarray | None = None
    """:math:`E[I Y_d]` (s)."""
    count_spectra: np.ndarray | None = None
    """Shape (S, 5, len(OMEGA)), complex: :math:`(G, R, \\hat W, Q, P)` of
    :func:`fleetopt.models.queueing.dispersion.combine_spectra` for the segment's requests on this profile, from
    which the batched model takes the count's dispersion (``None`` for sums built without the transforms)."""

    @property
    def prefill_times_s(self) -> np.ndarray:
        """Prefill time of each chunk count :math:`k = 0, 1, \\dots` (columns of ``prefill_probs``)."""
        return np.arange(self.prefill_probs.shape[1]) * self.prefill_chunk_s


def segment_stats(basis: SegmentBasis, i, j, profile: ServingProfile) -> SegmentStats:
    """Statistics of segments :math:`(b_i, b_j]` served by ``profile`` at context window :math:`b_j`.

    Segments without traffic get zero share and NaN moments.
    """
    if basis.chunk_tokens != profile.chunk_tokens:
        raise ValueError(f"basis built for chunk {basis.chunk_tokens}, profile {profile.name} uses "
                         f"{profile.chunk_tokens}")
    i = np.atleast_1d(np.asarray(i, dtype=np.int64))
    j = np.atleast_1d(np.asarray(j, dtype=np.int64))
    if np.any(j <= i):
        raise ValueError("segments need i < j")
    return stats_from_raw(raw_between(basis, i, j), basis.boundaries[i], basis.boundaries[j], profile)


def stats_from_raw(raw: RawSums, lo_tokens, window_tokens, profile: ServingProfile, n_slots=None) -> SegmentStats:
    """Normalised statistics of traffic components (:class:`RawSums`) served at ``window_tokens``.

    .. math::

        E[S] = \\frac{W \\Sigma_A + c \\Sigma_{AL}}{\\Sigma_1}, \\quad
        E[S^2] = \\frac{W^2 \\Sigma_{A^2} + 2 W c \\Sigma_{A^2 L} + c^2 \\Sigma_{A^2 L^2}}{\\Sigma_1},
        \\quad c = H \\, n_{slots}(B) / B_{cal}

    ``n_slots`` overrides the profile's slots per replica (a batch cap below them).
    """
    hi = np.atleast_1d(np.asarray(window_tokens, dtype=float))
    n = np.asarray(profile.n_slots(hi.astype(np.int64)), dtype=float)
    if n_slots is not None:
        n = np.broadcast_to(np.asarray(n_slots, dtype=float), n.shape).copy()
    c = profile.H_s * n / profile.calibration_ctx_tokens
    W = profile.W_s + profile.g_s * n              # a full batch's per-sequence compute (0 for the seeds' units)
    mass = raw.mass
    with np.errstate(divide="ignore", invalid="ignore"):
        m1 = (W * raw.A + c * raw.AL) / mass
        m2 = (W * W * raw.A2 + 2 * W * c * raw.A2L + c * c * raw.A2L2) / mass
        cv2 = np.maximum(m2 / (m1 * m1) - 1.0, 0.0)
        probs = raw.k_hist / mass[:, None]
        out = raw.out / mass
        tot = raw.L / mass
        chunk_s = profile.W_s + profile.H_s
        mean_pf = raw.k / mass * chunk_s
        mean_it = raw.A / mass
        cv2_it = np.maximum(raw.A2 / mass / (mean_it * mean_it) - 1.0, 0.0)
        work, work2 = raw.X / mass, raw.X2 / mass
    w0, h0 = iteration_coefficients(profile)
    g, a, b = compute_coefficients(profile)
    c_tok = float(profile.chunk_tokens)
    k = np.arange(raw.k_hist.shape[1], dtype=float)
    own = np.broadcast_to(h0 * c_tok * k * (k - 1) / 2.0, raw.k_hist.shape)
    classes, class_k = probs, k
    prefill_compute = np.zeros(hi.shape)
    if a or b:                  # prompt bins: the own compute varies within a chunk count
        bins = raw._full().prompt_bins
        assert bins is not None     # _full fills it
        width = prompt_bin_tokens(profile.chunk_tokens)
        class_k = np.ceil(np.arange(bins.shape[1]) * width / c_tok)
        with np.errstate(divide="ignore", invalid="ignore"):
            classes = bins[..., 0] / mass[:, None]
            m = np.where(bins[..., 0] > 0, bins[..., 0], 1.0)
            mid = np.maximum(np.arange(bins.shape[1]) - 0.5, 0.0) * width    # an empty bin: its middle, so that
            own = (h0 * c_tok * class_k * (class_k - 1) / 2.0)[None, :] + np.where(  # omega rises with the bin
                bins[..., 0] > 0, (a * bins[..., 1] + b * bins[..., 2]) / m, (a * mid + b * mid * mid)[None, :])
    if raw.compute is not None and raw.compute.shape[1] == len(_SUM_NAMES):
        with np.errstate(divide="ignore", invalid="ignore"):
            means = raw.compute[:, len(_COMPUTE_NAMES):] / mass[:, None]
            y2, iy = work_moments(means, h0, g, a, b)
            wp2 = work_moments(means, 0.0, 0.0, a, b)[0]        # the prompt's compute alone, squared
            yd2, iyd = work_moments(means, h0, g)               # the work beyond it
    else:                   # sums built without the products: the model falls back to the iterations' spread
        y2 = iy = wp2 = yd2 = iyd = None
    if g or a or b:
        full = raw._full()
        assert full.compute is not None     # _full fills it
        Xd, P1, P2, Q1, Q2, R11, R12, R22 = full.compute.T[:len(_COMPUTE_NAMES)]
        with np.errstate(divide="ignore", invalid="ignore"):
            time_work = (h0 * raw.X + g * raw.out + a * P1 + b * P2) / mass
            time_work2 = (h0 * h0 * raw.X2 + 2 * h0 * g * Xd + 2 * h0 * a * Q1 + 2 * h0 * b * Q2 + g * g * raw.out
                          + a * a * R11 + 2 * a * b * R12 + b * b * R22) / mass
            # the slot models' prefill and iteration take the compute terms too
            prefill_compute = (a * P1 + b * P2) / mass
            mean_pf = mean_pf + prefill_compute
    else:
        time_work, time_work2 = h0 * work, h0 * h0 * work2
    spectra = None
    if raw.spectra is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            parts = combine_spectra(raw.spectra / mass[:, None, None], h0, g, a, b)
        spectra = np.stack(parts, axis=1)
    return SegmentStats(np.broadcast_to(np.asarray(lo_tokens, dtype=float), hi.shape), hi, n, mass, m1, cv2, mean_pf,
                        out, tot, chunk_s, np.clip(probs, 0.0, None), mean_it, cv2_it, work, work2, w0, h0,
                        int(profile.chunk_tokens), time_work, time_work2, np.nan_to_num(prefill_compute),
                        np.clip(np.nan_to_num(classes), 0.0, None),
                        class_k, np.array(own), y2, iy, wp2, yd2, iyd, spectra)
