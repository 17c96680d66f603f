"""Exact segment statistics against brute-force numerical integration and trace sums."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate

from fleetopt.models.segments import segment_basis, segment_stats
from fleetopt.models.service import prefill_time_s, service_time_s
from fleetopt.models.workload import LengthDistribution, RequestTrace


@pytest.fixture(scope="module")
def dist():
    return LengthDistribution.from_cdf([(64, 0.1), (512, 0.5), (1000, 0.7), (4096, 0.95), (20000, 1.0)])


def _quad(d, profile, lo, hi, funcs, f=0.8):
    """The mass of (lo, hi] and the integrals of each ``funcs[i](L)`` against the density there, piece by piece
    with adaptive quadrature (breakpoints where the chunk count changes)."""
    m0, out = 0.0, [0.0] * len(funcs)
    for a, b, p in zip(d.lo_tokens, d.hi_tokens, d.prob):
        u, v = max(a, lo), min(b, hi)
        if v <= u:
            continue
        dens = p / (b - a)
        pts = np.arange(np.ceil(f * u / profile.chunk_tokens), np.floor(f * v / profile.chunk_tokens) + 1)
        brk = [x for x in pts * profile.chunk_tokens / f if u < x < v]
        kw = {"points": brk or None, "limit": 500, "epsabs": 0, "epsrel": 1e-11}
        m0 += dens * (v - u)
        out = [acc + dens * integrate.quad(g, u, v, **kw)[0] for acc, g in zip(out, funcs)]
    return m0, out


def _brute(d, profile, lo, hi, f=0.8):
    """Integrate S, S^2 and prefill over (lo, hi] piece by piece with adaptive quadrature."""
    S = lambda L: float(service_time_s(profile, hi, f * L, (1 - f) * L))  # noqa: E731
    m0, (m1, m2, pf) = _quad(d, profile, lo, hi, [S, lambda L: S(L) ** 2,
                                                  lambda L: float(prefill_time_s(profile, f * L))], f)
    return m0, m1 / m0, m2 / m1**2 * m0 - 1, pf / m0


@pytest.mark.parametrize("profile_name", ["A10G", "A100-80GB", "H100-80GB"])
@pytest.mark.parametrize("lo,hi", [(0, 20000), (0, 512), (512, 4096), (1000, 20000), (300, 700)])
def test_cdf_segment_moments_are_exact(catalog, dist, profile_name, lo, hi):
    p = catalog.profiles[profile_name]
    b = np.unique([0, lo, hi, 20000])
    basis = segment_basis(dist, b, p.chunk_tokens, 0.8)
    i, j = int(np.searchsorted(b, lo)), int(np.searchsorted(b, hi))
    s = segment_stats(basis, [i], [j], p)
    mass, mean, cv2, pf = _brute(dist, p, lo, hi)
    assert s.rate_share[0] == pytest.approx(mass, rel=1e-12)
    assert s.mean_service_s[0] == pytest.approx(mean, rel=1e-9)
    assert s.cv2_service[0] == pytest.approx(cv2, rel=1e-7)
    assert s.mean_prefill_s[0] == pytest.approx(pf, rel=1e-9)
    assert s.prefill_probs[0].sum() == pytest.approx(1.0, rel=1e-12)
    assert s.prefill_probs[0] @ s.prefill_times_s == pytest.approx(pf, rel=1e-9)


def test_segments_are_additive(catalog, dist):
    p = catalog.profiles["A100-80GB"]
    b = np.array([0, 512, 4096, 20000])
    basis = segment_basis(dist, b, p.chunk_tokens, 0.8)
    whole = basis.between("A", 0, 3)
    assert whole == pytest.approx(basis.between("A", 0, 1) + basis.between("A", 1, 2) + basis.between("A", 2, 3))


def _random_trace(seed, n, max_prompt, max_out):
    """A trace of ``n`` requests with uniform prompt and output counts (and its two count arrays)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, max_prompt, n)
    out = rng.integers(1, max_out, n)
    return RequestTrace(np.cumsum(rng.exponential(0.1, n)), prompt, out), prompt, out


def test_trace_segments_equal_direct_sums(catalog):
    t, prompt, out = _random_trace(7, 5000, 6000, 800)
    p = catalog.profiles["H100-80GB"]
    b = np.array([0, 2048, 8192])
    s = segment_stats(segment_basis(t, b, p.chunk_tokens), [0, 1], [1, 2], p)
    for k, (lo, hi) in enumerate([(0, 2048), (2048, 8192)]):
        sel = (prompt + out > lo) & (prompt + out <= hi)
        S = service_time_s(p, hi, prompt[sel], out[sel])
        assert s.rate_share[k] == pytest.approx(sel.mean())
        assert s.mean_service_s[k] == pytest.approx(S.mean(), rel=1e-12)
        assert s.cv2_service[k] == pytest.approx(S.var() / S.mean() ** 2, rel=1e-9)
        assert s.mean_prefill_s[k] == pytest.approx(prefill_time_s(p, prompt[sel]).mean(), rel=1e-12)
        assert s.mean_output_tokens[k] == pytest.approx(out[sel].mean())


def test_truncation_moves_mass_to_an_atom(dist):
    t, share = dist.truncated(4096)
    assert share == pytest.approx(0.05)
    assert t.cdf(4096) == pytest.approx(1.0) and t.cdf(4095.999) == pytest.approx(0.95, abs=1e-6)


@pytest.mark.parametrize("points,phrase", [
    ([(100, 0.5), (50, 1.0)], "increase strictly"),
    ([(100, 0.6), (200, 0.5), (300, 1.0)], "must not decrease"),
    ([(100, 0.5), (200, 0.9)], "end at cumulative fraction 1"),
    ([(0, 0.5), (200, 1.0)], "must be > 0"),
    ([(100, 1.5), (200, 1.0)], "[0, 1]"),
])
def test_bad_cdfs_are_rejected(points, phrase):
    with pytest.raises(ValueError, match=phrase.replace("[", r"\[").replace("]", r"\]")):
        LengthDistribution.from_cdf(points)


@pytest.mark.parametrize("window,gamma", [(512, 1.5), (1000, 2.0), (4096, 3.0)])
def test_compressed_band_is_exact(catalog, dist, window, gamma):
    """Requests in (B, gamma B] with the prompt cut to B - l_out, output kept, served at length B."""
    from fleetopt.models.segments import compressed_band, stats_from_raw

    p = catalog.profiles["A100-80GB"]
    s = stats_from_raw(compressed_band(dist, window, gamma, p.chunk_tokens, 0.8), [window], [window], p)
    m0 = m1 = m2 = pf = 0.0
    for a, b, pr in zip(dist.lo_tokens, dist.hi_tokens, dist.prob):
        u, v = max(a, window), min(b, gamma * window)
        if v <= u:
            continue
        dens = pr / (b - a)
        S = lambda L: float(service_time_s(p, window, window - 0.2 * L, 0.2 * L))  # noqa: E731
        pre = lambda L: float(prefill_time_s(p, window - 0.2 * L))  # noqa: E731
        m0 += dens * (v - u)
        m1 += dens * integrate.quad(S, u, v, limit=500, epsrel=1e-11)[0]
        m2 += dens * integrate.quad(lambda L, S=S: S(L) ** 2, u, v, limit=500, epsrel=1e-11)[0]
        pf += dens * integrate.quad(pre, u, v, limit=500, epsrel=1e-11)[0]
    assert s.rate_share[0] == pytest.approx(m0, rel=1e-12)
    assert s.mean_service_s[0] == pytest.approx(m1 / m0, rel=1e-8)
    assert s.cv2_service[0] == pytest.approx(m2 / m1 ** 2 * m0 - 1, rel=1e-6, abs=1e-10)
    assert s.mean_prefill_s[0] == pytest.approx(pf / m0, rel=1e-8)
    assert s.mean_total_tokens[0] == pytest.approx(window)


def test_compress_and_route_conserves_traffic(catalog, dist):
    from fleetopt.models.fleet import PoolPlan, ServiceLevel, evaluate_fleet

    p = catalog.profiles["H100-80GB"]
    for p_c in (0.0, 0.4, 1.0):
        r = evaluate_fleet([PoolPlan(0, 1000, "h", p, compress_gamma=2.0),
                            PoolPlan(1000, 4096, "h", p, compress_gamma=1.5),
                            PoolPlan(4096, 20000, "h", p)], dist, 50.0, ServiceLevel(1.0), 0.8, p_c)
        assert sum(x.routing_share for x in r.pools) == pytest.approx(1.0, rel=1e-12)
        moved = p_c * (float(dist.cdf(2000)) - float(dist.cdf(1000)))
        assert r.pools[0].routing_share == pytest.approx(float(dist.cdf(1000)) + moved, rel=1e-12)
    with pytest.raises(ValueError, match="beyond the next pool"):
        evaluate_fleet([PoolPlan(0, 1000, "h", p, compress_gamma=3.0), PoolPlan(1000, 2000, "h", p),
                        PoolPlan(2000, 20000, "h", p)], dist, 50.0, ServiceLevel(1.0))


def test_lognormal_mixture_workload_matches_scipy():
    from scipy.stats import lognorm

    d = LengthDistribution.from_lognormal_mixture([0.3, 0.7], [800.0, 6000.0], [0.5, 0.9], max_tokens=65536, points=512)
    grid = d.breakpoints
    cut = 0.3 * lognorm.cdf(65536, 0.5, scale=800) + 0.7 * lognorm.cdf(65536, 0.9, scale=6000)
    expected = (0.3 * lognorm.cdf(grid, 0.5, scale=800) + 0.7 * lognorm.cdf(grid, 0.9, scale=6000)) / cut
    np.testing.assert_allclose(d.cdf(grid), expected, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="one entry per component"):
        LengthDistribution.from_lognormal_mixture([1.0], [800.0, 900.0], [0.5], 4096)


def _whole_work(profile, prompt, out):
    """A request's iterations I and whole time-work Y, summed iteration by iteration (no closed form)."""
    from fleetopt.models.service import compute_coefficients, iteration_coefficients
    _, h = iteration_coefficients(profile)
    g, a, b = compute_coefficients(profile)
    c = profile.chunk_tokens
    I, Y = [], []
    for p_in, p_out in zip(prompt, out):
        k = int(np.ceil(p_in / c))
        u = p_in / k
        chunks = sum(h * j * c + a * u + b * ((j + 1) ** 2 - j ** 2) * u * u for j in range(k))
        decodes = sum(h * (p_in + d) + g for d in range(int(p_out)))
        I.append(k + p_out)
        Y.append(chunks + decodes)
    return np.array(I, dtype=float), np.array(Y)


@pytest.mark.parametrize("compute", [False, True])
def test_whole_work_moments_equal_direct_sums(catalog, compute):
    """E[Y^2] and E[IY] of a trace segment against per-request sums over iterations (with and without the
    compute terms of the iteration)."""
    from dataclasses import replace
    t, prompt, out = _random_trace(11, 400, 5000, 300)
    p = catalog.profiles["H100-80GB"]
    if compute:
        p = replace(p, g_s=2e-5, prefill_a_s=3e-5, prefill_b_s=1e-9)
    b = np.array([0, 2048, 8192])
    s = segment_stats(segment_basis(t, b, p.chunk_tokens), [0, 1], [1, 2], p)
    for k, (lo, hi) in enumerate([(0, 2048), (2048, 8192)]):
        sel = (prompt + out > lo) & (prompt + out <= hi)
        I, Y = _whole_work(p, prompt[sel], out[sel])
        assert s.mean_time_work[k] == pytest.approx(Y.mean(), rel=1e-9)
        assert s.mean_time_work_total_sq[k] == pytest.approx(np.mean(Y * Y), rel=1e-9)
        assert s.mean_iterations_time_work[k] == pytest.approx(np.mean(I * Y), rel=1e-9)
        # the work beyond the prompt's compute: the same sums with the prompt terms a, b set to 0
        _, Yd = _whole_work(replace(p, prefill_a_s=0.0, prefill_b_s=0.0), prompt[sel], out[sel])
        assert s.mean_decode_work_sq[k] == pytest.approx(np.mean(Yd * Yd), rel=1e-9)
        assert s.mean_iterations_decode_work[k] == pytest.approx(np.mean(I * Yd), rel=1e-9)
        if compute:
            assert not np.allclose(Yd, Y)


def test_whole_work_moments_of_a_cdf_are_exact(catalog, dist):
    """The CDF basis integrates Y^2 and IY exactly: against adaptive quadrature of the closed forms."""
    from fleetopt.models.segments import context_work
    from fleetopt.models.service import iteration_coefficients
    p = catalog.profiles["A100-80GB"]
    _, h = iteration_coefficients(p)
    lo, hi, f = 512, 4096, 0.8
    b = np.array([0, lo, hi, 20000])
    s = segment_stats(segment_basis(dist, b, p.chunk_tokens, f), [1], [2], p)

    def y(L):
        l_in = f * L
        return h * float(context_work(l_in, (1 - f) * L, p.chunk_tokens)[0])

    def it(L):
        return np.ceil(f * L / p.chunk_tokens) + (1 - f) * L

    m0, (m2, miy) = _quad(dist, p, lo, hi, [lambda L: y(L) ** 2, lambda L: it(L) * y(L)], f)
    assert s.mean_time_work_total_sq[0] == pytest.approx(m2 / m0, rel=1e-8)
    assert s.mean_iterations_time_work[0] == pytest.approx(miy / m0, rel=1e-8)


def test_trace_spectra_are_the_requests_transforms(catalog):
    """The count's transforms a trace segment carries are the mean of its requests' own (request_spectra, one
    request at a time), and a profile combines them into G (the presence) and W-hat (the work) whose values at the
    lowest frequency are E[I] and E[Y]."""
    from fleetopt.models.queueing.dispersion import OMEGA, request_spectra
    from fleetopt.models.segments import raw_between

    t, prompt, out = _random_trace(11, 3000, 6000, 800)
    p = catalog.profiles["H100-80GB"]
    b = np.array([0, 2048, 8192])
    basis = segment_basis(t, b, p.chunk_tokens)
    raw = raw_between(basis, [0, 1], [1, 2])
    for k, (lo, hi) in enumerate([(0, 2048), (2048, 8192)]):
        sel = (prompt + out > lo) & (prompt + out <= hi)
        direct = sum(request_spectra([np.ceil(u / p.chunk_tokens)], [u], [v], p.chunk_tokens)[0]
                     for u, v in zip(prompt[sel], out[sel])) / len(prompt)
        np.testing.assert_allclose(raw.spectra[k], direct, rtol=1e-9, atol=1e-9 * np.abs(direct).max())
    s = segment_stats(basis, [0, 1], [1, 2], p)
    G, Wh = s.count_spectra[:, 0, 0], s.count_spectra[:, 2, 0]
    assert OMEGA[0] <= 1e-6
    np.testing.assert_allclose(G.real, s.mean_iterations, rtol=1e-5)
    np.testing.assert_allclose(Wh.real, s.mean_time_work, rtol=1e-5)


def _dense_dispersion(stats, profile, L, w, l_in, l_out, load):
    """The batched model's F of one segment at a context load (one replica): with the basis's transforms, and with
    those of a dense midpoint sum over the lengths ``L`` of weights ``w`` in their place."""
    from dataclasses import replace

    from fleetopt.models.queueing.batched import BatchedTraffic, occupancy_dispersion
    from fleetopt.models.queueing.dispersion import binned_spectra, combine_spectra
    from fleetopt.models.service import compute_coefficients, iteration_coefficients

    spectra = binned_spectra(np.zeros(len(L), dtype=np.int64), 1, w, np.ceil(l_in / profile.chunk_tokens), l_in,
                             l_out, profile.chunk_tokens) / w.sum()
    parts = combine_spectra(spectra, iteration_coefficients(profile)[1], *compute_coefficients(profile))
    dense = replace(stats, count_spectra=np.stack(parts, axis=1))
    lam = load / float(stats.mean_time_work[0])
    return tuple(float(occupancy_dispersion(BatchedTraffic.from_stats(st, lam), 1)[0][0]) for st in (stats, dense))


def test_cdf_spectra_add_and_give_the_dense_sums_dispersion(catalog, dist):
    """The transforms are not polynomials in the length, so the basis's Gauss-Legendre nodes do not integrate them
    exactly (up to 2.4 % of a quantity's largest value at mid frequencies on the short segment). What the model
    takes from them, F, is the one a half-token midpoint sum over the density gives, within 1e-3 (measured 2e-4
    at most on three workloads, three profiles and four windows); segments add."""
    from fleetopt.models.segments import raw_between

    p = catalog.profiles["A100-80GB"]
    b = np.array([0, 512, 4096, 20000])
    basis = segment_basis(dist, b, p.chunk_tokens, 0.8)
    raw = raw_between(basis, [0, 1, 2, 0], [1, 2, 3, 3])
    np.testing.assert_allclose(raw.spectra[3], raw.spectra[:3].sum(axis=0), rtol=1e-12, atol=1e-12)
    for k, (lo, hi) in enumerate([(0, 512), (512, 4096), (4096, 20000)]):
        s = segment_stats(basis, k, k + 1, p)
        L = np.arange(lo + 0.25, hi, 0.5)
        w = dist.cdf(L + 0.25) - dist.cdf(L - 0.25)
        for load in (0.5, 0.8):
            got, want = _dense_dispersion(s, p, L, w, 0.8 * L, 0.2 * L, load)
            assert got == pytest.approx(want, rel=1e-3), (lo, hi, load, got, want)
            assert want > 1.01                      # unequal requests: the dispersion is not trivially 1


@pytest.mark.parametrize("window,gamma", [(1000, 2.0), (4096, 3.0)])
def test_compressed_band_spectra_are_the_compressed_requests(catalog, dist, window, gamma):
    """A compressed band's F is that of its requests with the prompt cut to B - l_out (a half-token midpoint sum
    over the band), within 1e-3."""
    from fleetopt.models.segments import compressed_band, stats_from_raw

    p = catalog.profiles["A100-80GB"]
    s = stats_from_raw(compressed_band(dist, window, gamma, p.chunk_tokens, 0.8), [window], [window], p)
    L = np.arange(window + 0.25, gamma * window, 0.5)
    w = dist.cdf(L + 0.25) - dist.cdf(L - 0.25)
    for load in (0.5, 0.8):
        got, want = _dense_dispersion(s, p, L, w, window - 0.2 * L, 0.2 * L, load)
        assert got == pytest.approx(want, rel=1e-3), (load, got, want)
