"""The batched replica model (models/queueing/batched.py) against closed forms, brute force and enumeration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fleetopt.models.queueing.batched import (BatchedTraffic, batched_miss_prob, batched_min_replicas,
                                              batched_ttft_p99_s, mean_power_w, operating_point, prefill_limit_s,
                                              waited_exceed_prob)
from fleetopt.models.power import PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.segments import context_work, segment_basis, segment_stats
from fleetopt.models.service import iteration_coefficients
from fleetopt.models.workload import LengthDistribution, RequestTrace
from fleetopt.models.units import P99_TAIL

GPU = CalibratedProfile("g", "m", 0.004, 0.00032, 8192, 256, 16, 65536, 256, 1.0, 1,
                        PowerCurve(300.0, 600.0, 1.0, 4.2, "measured"))


@given(st.integers(1, 5000), st.integers(1, 3000), st.sampled_from([16, 256, 512, 2048]))
@settings(max_examples=60, deadline=None)
def test_context_work_sums_the_contexts_each_iteration_starts_from(l_in, l_out, chunk):
    k = math.ceil(l_in / chunk)
    contexts = [j * chunk for j in range(k)] + [l_in + d for d in range(l_out)]
    X, X2 = context_work(l_in, l_out, chunk)
    assert float(X) == sum(contexts)
    assert float(X2) == sum(c * c for c in contexts)


def test_segment_context_sums_match_dense_integration():
    """The Gauss-Legendre basis of X and X2 against a midpoint rule on 2 million points of the CDF."""
    dist = LengthDistribution.from_cdf([(1000, 0.3), (5000, 0.8), (20000, 1.0)])   # uniform on (0, 1000] first
    b = np.array([0.0, 3000.0, 20000.0])
    basis = segment_basis(dist, b, GPU.chunk_tokens, 0.8)
    s = segment_stats(basis, [0, 1], [1, 2], GPU)
    L = np.linspace(0, 20000, 2_000_001)
    mid = (L[1:] + L[:-1]) / 2
    dens = np.where(mid <= 1000, 0.3 / 1000, np.where(mid <= 5000, 0.5 / 4000, 0.2 / 15000))
    w = dens * np.diff(L)
    X, X2 = context_work(0.8 * mid, 0.2 * mid, GPU.chunk_tokens)
    I = np.ceil(0.8 * mid / GPU.chunk_tokens) + 0.2 * mid
    for seg, (lo, hi) in enumerate(((0, 3000), (3000, 20000))):
        m = (mid > lo) & (mid <= hi)
        mass = w[m].sum()
        assert s.mean_context_work[seg] == pytest.approx((w[m] * X[m]).sum() / mass, rel=1e-5)
        assert s.mean_context_work_sq[seg] == pytest.approx((w[m] * X2[m]).sum() / mass, rel=1e-5)
        assert s.mean_iterations[seg] == pytest.approx((w[m] * I[m]).sum() / mass, rel=1e-5)


def test_trace_context_sums_are_the_requests_own():
    prompt = np.array([100, 3000, 700, 5000])
    out = np.array([50, 200, 10, 1])
    trace = RequestTrace(np.arange(4.0), prompt, out)
    s = segment_stats(segment_basis(trace, np.array([0.0, 10000.0]), GPU.chunk_tokens), [0], [1], GPU)
    X, X2 = context_work(prompt, out, GPU.chunk_tokens)
    assert s.mean_context_work[0] == pytest.approx(X.mean(), rel=1e-12)
    assert s.mean_context_work_sq[0] == pytest.approx(X2.mean(), rel=1e-12)


def _traffic(lam, cap=64, EI=300.0, cv2=0.5, EX=3e6, EX2=5e13, probs=(0.0, 0.5, 0.3, 0.2), W=0.004, h=4e-8):
    """Context-only traffic (contexts in tokens, slope h): the model's work is h X, its own prefill h c k(k-1)/2."""
    k = np.arange(len(probs), dtype=float)
    return BatchedTraffic(np.atleast_1d(np.asarray(lam, dtype=float)), np.array([float(cap)]), np.array([EI]),
                          np.array([cv2]), np.array([h * EX]), np.array([h * h * EX2]), np.array([probs], dtype=float),
                          np.array([h * 512 * k * (k - 1) / 2]), W)


def _chain(lam, N, n, EI, EX, W, h, top=20_000):
    """The pool's birth-death chain by brute force: pi(j) from the rates, j up to ``top``."""
    xbar = EX / EI
    j = np.arange(1, top + 1, dtype=float)
    b = np.minimum(j, N * n)
    mu = b / (EI * (W + h * (b / N) * xbar))
    logpi = np.concatenate(([0.0], np.cumsum(np.log(lam / mu))))
    pi = np.exp(logpi - logpi.max())
    return pi / pi.sum()


@given(st.floats(0.5, 80.0), st.integers(1, 6), st.integers(1, 40), st.floats(20.0, 2000.0), st.floats(1e3, 3e6))
@settings(max_examples=80, deadline=None)
def test_occupancy_is_the_birth_death_chain_by_brute_force(lam, N, n, EI, EX):
    """Idle and full probabilities, running batch and the busy state's batch moments against the chain's
    stationary law computed state by state (rates lambda and min(j, Nn) / (E[I] t(min(j, Nn) / N)))."""
    W, h = 0.004, 4e-8
    t = _traffic(lam, cap=n, EI=EI, EX=EX, EX2=EX * EX, W=W, h=h)
    op = operating_point(t, N)
    x = lam * h * EX / N
    rho_f = x + lam * EI * W / (N * n)
    assert op.context_load[0] == pytest.approx(x, rel=1e-12) and op.full_load[0] == pytest.approx(rho_f, rel=1e-12)
    if rho_f >= 0.97:            # too close to the limit for a truncated chain (and unstable beyond 1)
        assert op.stable[0] == (rho_f < 1)
        return
    pi = _chain(lam, N, n, EI, EX, W, h)
    j = np.arange(len(pi), dtype=float)
    m = N * n
    assert op.idle_prob[0] == pytest.approx(pi[j < N].sum(), abs=1e-9)
    assert op.full_prob[0] == pytest.approx(pi[j >= m].sum(), abs=1e-9)
    assert op.mean_batch[0] == pytest.approx((pi @ np.minimum(j, m)) / N, rel=1e-7, abs=1e-9)
    busy = (j >= N) & (j < m)
    if pi[busy].sum() > 1e-6:
        w = pi[busy] / pi[busy].sum()
        b = j[busy] / N
        mean_b = w @ b
        var_b = w @ (b - mean_b) ** 2
        xbar = h * EX / EI                      # the work (seconds) a running sequence brings per iteration
        assert op.busy_context_mean[0] == pytest.approx(mean_b * xbar, rel=1e-6)
        seq_var = h * h * EX * EX / EI - xbar ** 2      # E[Y2]/E[I] - xbar^2, the spread of one sequence
        assert op.busy_context_var[0] == pytest.approx(var_b * xbar ** 2 + mean_b * seq_var, rel=1e-5,
                                                       abs=1e-6 * xbar ** 2)
    assert op.utilization[0] == pytest.approx(op.mean_batch[0] / n, rel=1e-12)
    assert op.residence_s[0] == pytest.approx(op.mean_batch[0] * N / lam, rel=1e-12)   # Little's law


@given(st.floats(0.0, 3.0), st.floats(0.0, 2.0), st.floats(1e-3, 1.5), st.floats(0.05, 20.0))
@settings(max_examples=200, deadline=None)
def test_waited_tail_is_the_average_over_the_residual(t, a, b, theta):
    """E_U[P(W > t - a - U b)] for W ~ Exp(theta), by a 20,001-point midpoint rule over U."""
    u = (np.arange(20_001) + 0.5) / 20_001
    x = t - a - u * b
    direct = np.where(x < 0, 1.0, np.exp(-theta * np.maximum(x, 0.0))).mean()
    assert float(waited_exceed_prob(t, a, b, theta)) == pytest.approx(direct, abs=2e-4)


def _qna_wait_sf(x, theta, scv):
    """Survival function of Whitt's two-moment wait (mean 1/theta, squared coefficient of variation scv) from
    scipy.stats' exponential: shifted below scv = 1, a balanced-means mixture of two above."""
    from scipy import stats

    if scv <= 1.0:
        root = math.sqrt(scv)
        return stats.expon.sf(x, loc=(1.0 - root) / theta, scale=root / theta)
    p1 = 0.5 * (1.0 + math.sqrt((scv - 1.0) / (scv + 1.0)))
    return (p1 * stats.expon.sf(x, scale=1.0 / (2.0 * p1 * theta))
            + (1.0 - p1) * stats.expon.sf(x, scale=1.0 / (2.0 * (1.0 - p1) * theta)))


@given(st.floats(0.0, 3.0), st.floats(0.0, 2.0), st.floats(1e-3, 1.5), st.floats(0.05, 5000.0),
       st.floats(0.02, 20.0))
@settings(max_examples=200, deadline=None)
def test_two_moment_waited_tail_is_the_average_over_the_residual(t, a, b, theta, scv):
    """E_U[P(W > t - a - U b)] for the two-moment wait of mean 1/theta and squared coefficient of variation scv,
    by a 20,001-point midpoint rule over U."""
    u = (np.arange(20_001) + 0.5) / 20_001
    x = t - a - u * b
    direct = np.where(x < 0, 1.0, _qna_wait_sf(np.maximum(x, 0.0), theta, scv)).mean()
    assert float(waited_exceed_prob(t, a, b, theta, scv)) == pytest.approx(direct, abs=2e-4)


@pytest.mark.parametrize("t", [0.5, 1.2, 1.5, 1.9, 2.0, 2.4, 2.6, 3.0])
def test_waited_tail_of_a_deterministic_wait(t):
    """scv = 0: the wait is 1/theta exactly (to the floor's thousandth of its mean), so the average over U is the
    share of U with t - a - 1/theta < U b. Far below the start (a rate whose exponential would overflow) it is 1,
    never NaN."""
    a, b, theta = 1.0, 1.0, 2.0
    exact = 1.0 - min(max((t - a - 1.0 / theta) / b, 0.0), 1.0)
    assert float(waited_exceed_prob(t, a, b, theta, 0.0)) == pytest.approx(exact, abs=2e-3)
    assert float(waited_exceed_prob(t - 50.0, a, b, 1e4, 0.0)) == 1.0
    assert float(waited_exceed_prob(t - 50.0, a, b, 1e4, 5.0)) == 1.0


@pytest.mark.parametrize("scv", [0.05, 0.5, 1.0, 2.0, 20.0])
def test_two_moment_wait_has_its_mean_and_variation(scv):
    """The law _qna_wait_sf stands for has mean 1/theta and squared coefficient of variation scv (its moments by
    the trapezoid rule over its survival function: E[W] = int P(W > x) dx, E[W^2] = int 2x P(W > x) dx)."""
    from scipy.integrate import trapezoid

    theta = 2.0
    grid = np.linspace(0.0, 40.0 * (1.0 + scv) / theta, 400_001)
    sf = _qna_wait_sf(grid, theta, scv)
    mean = trapezoid(sf, grid)
    second = trapezoid(2.0 * grid * sf, grid)
    assert mean == pytest.approx(1.0 / theta, rel=1e-6)
    assert second / mean ** 2 - 1.0 == pytest.approx(scv, rel=1e-5)


def test_miss_probability_is_the_stated_mixture_by_direct_integration():
    """P(T > t) against the three-state mixture integrated independently: the exact gamma law of the context
    (scipy.stats, 4,000 quantiles) instead of the seven nodes, a fine grid over U, the wait's two-moment law in
    closed form per point (scipy.stats' exponential, _qna_wait_sf). The nodes are an approximation; measured
    within 0.01 % here, asserted within 1 %."""
    from scipy import stats

    # a sequence's context spread like the bundled workloads' (squared coefficient of variation 1: E[X2]/E[I] =
    # 2 xbar^2); the Wilson-Hilferty nodes lose accuracy for far more skewed laws (gamma shape below ~0.3)
    t_ = _traffic(30.0, cap=16, EX2=2 * 3e6 ** 2 / 300.0, probs=(0.0, 0.3, 0.3, 0.2, 0.2))
    N = 6
    op = operating_point(t_, N)
    assert op.stable[0] and op.full_prob[0] > 1e-4          # all three states carry weight
    W, h, c = t_.W_s, 4e-8, 512                             # _traffic's defaults
    q = (np.arange(4000) + 0.5) / 4000
    u = (np.arange(400) + 0.5) / 400

    def ctx(mean, var):
        return stats.gamma.ppf(q, mean * mean / var, scale=var / mean)

    C_busy = ctx(op.busy_context_mean[0], op.busy_context_var[0])
    C_full = ctx(op.full_context_mean[0], op.full_context_var[0])
    theta, scv = op.wait_decay[0], float(np.broadcast_to(op.wait_scv, (1,))[0])
    assert scv != 1.0                                       # the wait's shape is exercised, not the exponential
    t99 = float(batched_ttft_p99_s(t_, N)[0])
    for t in (0.5 * t99, 0.8 * t99, t99, 1.2 * t99):       # the body down to the 1 % tail
        total = 0.0
        for k, pk in enumerate(t_.chunk_probs[0]):
            if pk == 0:
                continue
            own = h * c * k * (k - 1) / 2
            idle = float(k * W + own > t)
            busy = np.mean((k + u[None, :]) * (W + C_busy[:, None]) + own > t)      # C in seconds of work
            x = t - ((k + u[None, :]) * (W + C_full[:, None]) + own)
            full = np.mean(np.where(x < 0, 1.0, _qna_wait_sf(np.maximum(x, 0.0), theta, scv)))
            p0, pf = op.idle_prob[0], op.full_prob[0]
            total += pk * (p0 * idle + (1 - p0 - pf) * busy + pf * full)
        got = float(batched_miss_prob(t, t_, N, op)[0])
        assert got == pytest.approx(total, rel=0.01, abs=1e-5), t


def test_light_load_ttft_is_the_idle_prefill():
    """At a vanishing rate every request finds an idle replica: TTFT = k W + h c k(k-1)/2 exactly."""
    t = _traffic(1e-9)
    limit = prefill_limit_s(t)
    assert limit[0].tolist() == pytest.approx([0.0, 0.004, 0.008 + 4e-8 * 512, 0.012 + 4e-8 * 512 * 3], rel=1e-12)
    p99 = float(batched_ttft_p99_s(t, 3)[0])
    assert p99 == pytest.approx(limit[0, 3], rel=1e-6)     # 20 % of requests have 3 chunks: the P99 is that atom


def test_miss_probability_falls_with_replicas_and_time():
    t = _traffic(20.0)
    counts = np.arange(1, 30)
    miss = np.array([float(batched_miss_prob(0.1, t, n)[0]) for n in counts])
    assert np.all(np.diff(miss) <= 1e-12)
    times = np.linspace(0.0, 0.5, 60)
    by_t = np.array([float(batched_miss_prob(x, t, 12)[0]) for x in times])
    assert np.all(np.diff(by_t) <= 1e-12)


@pytest.mark.parametrize("lam,slo", [(5.0, 0.05), (20.0, 0.1), (60.0, 0.2), (150.0, 0.5)])
def test_min_replicas_is_the_least_count_by_enumeration(lam, slo):
    t = _traffic(lam)
    z = batched_min_replicas(t, slo, 0.85)
    assert z.feasible[0]

    def ok(n):
        op = operating_point(t, n)
        return bool(op.stable[0] and op.full_load[0] <= 0.85 * (1 + 1e-12)
                    and batched_miss_prob(slo, t, n, op)[0] <= P99_TAIL * (1 + 1e-12))

    first = next(n for n in range(1, 10_000) if ok(n))
    assert int(z.replicas[0]) == first
    # the capacity cap alone, closed form: N >= lambda (h E[X] + E[I] W / n) / 0.85
    assert first >= math.ceil(lam * (4e-8 * 3e6 + 300.0 * 0.004 / 64) / 0.85 - 1e-9)


def test_min_replicas_infeasible_when_idle_prefill_breaks_the_slo():
    t = _traffic(5.0, probs=(0.0, 0.9, 0.0, 0.1))
    z = batched_min_replicas(t, 0.010, 0.85)          # 3 chunks take 12 ms + own context on an idle replica
    assert not z.feasible[0] and z.reason[0] == "prefill"


def test_mean_power_normal_limit_is_close_to_the_poisson_sum():
    """Above the exact-sum threshold the normal limit stands in for the Poisson law: against the sum."""
    from types import SimpleNamespace

    for m in (60.0, 200.0, 900.0):
        b = np.arange(0, 4000, dtype=float)
        logpmf = b * math.log(m) - m - np.array([math.lgamma(v + 1) for v in b])
        pmf = np.exp(logpmf)
        cap = 1000.0
        exact = float(pmf[b < cap] @ GPU.power.power_w(b[b < cap]) + pmf[b >= cap].sum() * GPU.power.power_w(cap))
        op = SimpleNamespace(mean_batch=np.array([m]))
        assert float(mean_power_w(GPU.power.power_w, op, cap)[0]) == pytest.approx(exact, rel=2e-3)


def test_mean_power_is_the_poisson_average_of_the_curve():
    t = _traffic(10.0, cap=8)
    op = operating_point(t, 2)
    m = float(op.mean_batch[0])
    b = np.arange(9)
    pmf = np.array([math.exp(-m) * m ** k / math.factorial(k) for k in b])
    pmf[-1] += 1 - pmf.sum()
    expected = float(pmf @ GPU.power.power_w(b.astype(float)))
    assert float(mean_power_w(GPU.power.power_w, op, 8)[0]) == pytest.approx(expected, rel=1e-12)


def test_iteration_coefficients_read_the_profile():
    W, h = iteration_coefficients(GPU)
    assert (W, h) == (pytest.approx(0.004), pytest.approx(0.00032 / 8192))


def _clustered_chain_law(lam, x, A, m, q, top=400):
    """Stationary law of the clustered occupancy chain, solved numerically from its generator on 0..top: clusters
    of geometric size (mean q) at rate lam/q, death rate lam*j/(A + x*j) below the cap m and lam*m/(A + x*m) at or
    above it."""
    p = 1.0 / q
    G = np.zeros((top + 1, top + 1))
    for i in range(top + 1):
        j = min(i, m)
        if i > 0:
            G[i, i - 1] = lam * j / (A + x * j)
        s = np.arange(1, top + 1 - i)
        G[i, i + s] += (lam / q) * p * (1.0 - p) ** (s - 1)
        G[i, i] = -G[i].sum()
    M = np.vstack([G.T, np.ones(top + 1)])
    b = np.zeros(top + 2)
    b[-1] = 1.0
    return np.linalg.lstsq(M, b, rcond=None)[0]


@pytest.mark.parametrize("x, A, m, q", [(0.6, 4.0, 20, 2.5), (0.3, 10.0, 40, 1.0), (0.85, 1.5, 30, 1.3)])
def test_clustered_count_is_the_chain_solved_state_by_state(x, A, m, q):
    """The compound count of operating_point, pi(j) = S_j - (1 - 1/q) S_{j-1} below the cap with S negative
    binomial (1 + A/(q xi), xi = 1 - (1 - x)/q) and the full share rho_f S_{m-1}/(1 - rho_f), against the chain's
    stationary law from its generator; without a cap its mean (q x + A)/(1 - x) and the variance of
    _cluster_variance (cluster_size inverts it)."""
    from fleetopt.models.queueing.batched import _cluster_variance, _nb_pmf, cluster_size

    lam = 3.0
    p = 1.0 / q
    xi = 1.0 - p * (1.0 - x)
    r = 1.0 + p * A / xi
    S = _nb_pmf(np.arange(m, dtype=float), r, xi)
    below = S - (1.0 - p) * np.concatenate([[0.0], S[:-1]])
    rho_f = x + A / m
    tail = rho_f * S[-1] / (1.0 - rho_f)
    Z = below.sum() + tail
    pi = _clustered_chain_law(lam, x, A, m, q)
    assert np.allclose(pi[:m], below / Z, rtol=1e-8, atol=1e-14)
    assert pi[m:].sum() == pytest.approx(tail / Z, rel=1e-8)
    free = _clustered_chain_law(lam, x, A, 10**9, q)
    j = np.arange(free.size)
    mean = free @ j
    assert mean == pytest.approx((q * x + A) / (1.0 - x), rel=1e-8)
    var = free @ (j - mean) ** 2
    assert var == pytest.approx(float(_cluster_variance(x, A, q)), rel=1e-8)
    F = var / ((A + x) / (1.0 - x) ** 2)                      # over the unclustered chain's variance
    assert float(cluster_size(x, A, F)) == pytest.approx(q, rel=1e-8)
