"""One home per formula: the P99 constants, the W99 tail, the bisection, the load inverse, the SLO
coefficients and the power line, each against a closed form or an independent computation.

Expected values come from textbook formulas written out here (Erlang C as a finite sum, the M/M/1
wait tail :math:`P(W > t) = \\rho e^{-(\\mu - \\lambda) t}`, the logistic power curve) and roots found
with :func:`scipy.optimize.brentq`, never from the functions under test.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq

from fleetopt.models.fleet import ServiceLevel, fleet_ttft_p99_s
from fleetopt.models.numerics import MAX_HALVINGS, bisect_boundary
from fleetopt.models.power import PowerCurve, pool_power_secant
from fleetopt.models.queueing.erlang import (max_load_erlangs, miss_coefficients, prefill_p99_s, ttft_p99_s,
                                             wait_exceed_prob, wait_p99_from_tail_s, wait_p99_s)
from fleetopt.models.units import P99, P99_TAIL
from fleetopt.models.workload import LengthDistribution

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- independent closed forms

def erlang_c_sum(c: int, a: float) -> float:
    """Textbook Erlang C, :math:`\\frac{a^c/c! \\cdot c/(c-a)}{\\sum_{k<c} a^k/k! + a^c/c! \\cdot c/(c-a)}`."""
    terms = sum(a**k / math.factorial(k) for k in range(c))
    last = a**c / math.factorial(c) * c / (c - a)
    return last / (terms + last)


def ttft_miss_closed(t: float, c: int, a: float, es: float, cv2: float, tau, probs) -> float:
    """:math:`P(W + T_{pf} > t)` with :math:`P(W > x) = C e^{-\\theta x}`,
    :math:`\\theta = 2(c - a)/(E[S](1 + c_s^2))`."""
    C = erlang_c_sum(c, a)
    theta = 2.0 * (c - a) / (es * (1.0 + cv2))
    return sum(p * (1.0 if tk > t else min(1.0, C * math.exp(-theta * (t - tk)))) for tk, p in zip(tau, probs))


def logistic_w(b: float, idle: float, nominal: float, k: float, x0: float) -> float:
    """:math:`P(b) = P_{idle} + (P_{nom} - P_{idle})/(1 + e^{-k(\\log_2 b - x_0)})`, :math:`P(0) = P_{idle}`."""
    return idle if b == 0 else idle + (nominal - idle) / (1.0 + math.exp(-k * (math.log2(b) - x0)))


# ---------------------------------------------------------------- the P99 constants

def test_p99_constants():
    assert P99 == 0.99
    assert P99_TAIL == 0.01
    assert P99 + P99_TAIL == 1.0
    # the tail mass above the 99th percentile of a unit exponential, exp(-q99) with q99 = ln 100
    assert math.exp(-math.log(100.0)) == pytest.approx(P99_TAIL, rel=1e-15)


def _float_constants(path: Path) -> list[tuple[int, float]]:
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and type(node.value) is float and node.value in (0.01, 0.99)]


@pytest.mark.parametrize("path", sorted((REPO / "models").glob("*.py"))
                         + [REPO / "optimizer/plan/candidates.py", REPO / "optimizer/plan/split_candidates.py"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_p99_literals_live_only_in_units(path):
    """Code (not docstrings) spells the P99 and its tail only in ``models/units.py``."""
    if path.name == "units.py":
        assert [v for _, v in _float_constants(path)] == [0.01]
    else:
        assert _float_constants(path) == [], f"{path.name}: import P99 / P99_TAIL from fleetopt.models.units"


# ---------------------------------------------------------------- W99 and the wait tail

@pytest.mark.parametrize("lam", [0.05, 0.2, 0.5, 0.8, 0.95, 0.999])
@pytest.mark.parametrize("mu", [0.5, 1.0, 40.0])
def test_w99_matches_mm1_closed_form(lam, mu):
    lam = lam * mu
    rho = lam / mu
    expected = math.log(rho / 0.01) / (mu - lam) if rho > 0.01 else 0.0
    assert wait_p99_from_tail_s(rho, mu - lam) == pytest.approx(expected, rel=1e-13)
    # the same through the M/M/1 queue (c = 1, cv2 = 1: theta = mu - lambda, C = rho)
    assert wait_p99_s(1, lam, 1.0 / mu, 1.0) == pytest.approx(expected, rel=1e-12)
    # and it is the 0.99 quantile: P(W > W99) = rho exp(-(mu - lambda) W99) = 0.01
    assert rho * math.exp(-(mu - lam) * expected) == pytest.approx(0.01, rel=1e-12)


@pytest.mark.parametrize("c, rho, cv2", [(2, 0.7, 1.0), (5, 0.9, 0.5), (16, 0.95, 2.0)])
def test_w99_matches_mgc_closed_form(c, rho, cv2):
    es = 2.0
    a = rho * c
    C = erlang_c_sum(c, a)
    theta = 2.0 * (c / es - a / es) / (1.0 + cv2)
    expected = math.log(C / 0.01) / theta
    assert wait_p99_s(c, a / es, es, cv2) == pytest.approx(expected, rel=1e-11)


def test_w99_conventions():
    assert wait_p99_from_tail_s(0.01, 1.0) == 0.0          # C <= 1 %: at least 99 % do not wait
    assert wait_p99_from_tail_s(0.0, -1.0) == 0.0
    assert wait_p99_from_tail_s(0.5, 0.0) == math.inf      # unstable
    assert wait_p99_from_tail_s(0.5, -2.0) == math.inf
    out = wait_p99_from_tail_s(np.array([0.5, 0.005, 0.5]), np.array([0.5, 0.5, -1.0]))
    assert out.tolist() == [math.log(50.0) / 0.5, 0.0, math.inf]
    assert wait_p99_s(1, 1.0, 1.0, 1.0) == math.inf        # rho = 1


@pytest.mark.parametrize("t", [0.0, 0.5, 3.0, 20.0])
def test_wait_exceed_prob_matches_mm1(t):
    lam, mu = 0.6, 1.0
    assert wait_exceed_prob(t, lam / mu, mu - lam) == pytest.approx(lam / mu * math.exp(-(mu - lam) * t), rel=1e-14)
    assert wait_exceed_prob(-t - 1e-9, lam / mu, mu - lam) == 1.0
    assert wait_exceed_prob(t, 0.5, 0.0) == 1.0


# ---------------------------------------------------------------- the bisection

def test_bisection_finds_sqrt2_to_the_last_bit():
    lo, hi = bisect_boundary(lambda x: x * x < 2.0, 1.0, 2.0)
    assert float(hi) == math.sqrt(2.0)                       # the correctly rounded root
    assert float(lo) == math.nextafter(math.sqrt(2.0), 0.0)  # adjacent float below


def test_bisection_is_elementwise_and_exact_on_many_roots():
    targets = np.array([2.0, 3.0, 5.0, 10.0, 1e6, 1e-6])
    lo, hi = bisect_boundary(lambda x: x * x < targets, np.zeros(6), np.full(6, 2e3))
    # hi is the smallest float whose (rounded) square reaches t, lo the float just below it, both within
    # one unit in the last place of the correctly rounded sqrt(t)
    assert np.all(hi * hi >= targets) and np.all(lo * lo < targets) and np.all(np.nextafter(hi, 0.0) == lo)
    assert np.all(np.abs(hi - np.sqrt(targets)) <= np.spacing(np.sqrt(targets)))


def test_bisection_ends_and_guard():
    lo, hi = bisect_boundary(lambda x: x < 0.0, 0.0, 1.0)       # root at the lower end
    assert float(hi) == 0.0 and float(lo) == 0.0
    lo, hi = bisect_boundary(lambda x: x < 5.0, 0.0, 1.0)       # root beyond the upper end
    assert float(hi) == 1.0 and float(lo) >= math.nextafter(1.0, 0.0)
    lo, hi = bisect_boundary(lambda x: x < 0.5, 3.0, 3.0)       # degenerate bracket
    assert (float(lo), float(hi)) == (3.0, 3.0)
    with pytest.raises(RuntimeError):
        bisect_boundary(lambda x: x * x < 2.0, 1.0, 2.0, max_halvings=10)
    assert MAX_HALVINGS >= 1024 + 1074


def test_bisection_is_the_limit_of_any_long_fixed_count_loop():
    """The answer does not depend on a count: a plain 3000-step loop ends on the same floats."""
    def g(x):   # e^x - 3x decreases on [0, ln 3] and crosses zero near 0.619
        return np.exp(x) - 3.0 * x > 0.0

    lo, hi = np.array([0.0]), np.array([0.7])
    for _ in range(3000):
        mid = (lo + hi) / 2.0
        b = g(mid)
        lo, hi = np.where(b, mid, lo), np.where(b, hi, mid)
    got = bisect_boundary(g, 0.0, 0.7)
    assert float(got[0]) == float(lo[0]) and float(got[1]) == float(hi[0])
    assert float(hi[0]) == pytest.approx(brentq(lambda x: math.exp(x) - 3 * x, 0.0, 0.7, xtol=1e-16), rel=1e-15)


def test_quantile_matches_piecewise_uniform_closed_form():
    d = LengthDistribution.from_cdf([(100, 0.5), (300, 1.0)])
    q = np.array([0.0, 0.1, 0.25, 0.5, 0.6, 0.9, 1.0])
    expected = np.where(q <= 0.5, 200.0 * q, 100.0 + 400.0 * (q - 0.5))
    np.testing.assert_allclose(d.quantile(q), expected, rtol=1e-15, atol=0.0)


# ---------------------------------------------------------------- P99 TTFT through the bisection

@pytest.mark.parametrize("tau", [0.0, 0.3, 2.0])
def test_ttft_p99_tail_single_atom_is_prefill_plus_w99(tau):
    lam, mu = 0.7, 1.0
    expected = tau + math.log(lam / mu / 0.01) / (mu - lam)
    got = ttft_p99_s(1, lam, 1.0 / mu, 1.0, np.array([tau]), np.array([[1.0]]), np.array([tau]), model="tail")
    assert float(got[0]) == pytest.approx(expected, rel=1e-13)


def test_fleet_p99_of_two_mm1_pools_solves_the_mixture():
    # pool 1: lambda = 0.6, mu = 1; pool 2: lambda = 1.5, mu = 2 (rates 0.6 and 1.5 req/s, no prefill)
    pools = [(1, 0.6, 1.0, 1.0, np.array([0.0]), np.array([[1.0]]), np.array([0.0])),
             (1, 1.5, 0.5, 1.0, np.array([0.0]), np.array([[1.0]]), np.array([0.0]))]
    total = 0.6 + 1.5

    def mixture(t):
        return (0.6 * 0.6 * math.exp(-0.4 * t) + 1.5 * 0.75 * math.exp(-0.5 * t)) / total - 0.01

    expected = brentq(mixture, 0.0, 100.0, xtol=1e-15, rtol=1e-15)
    for model in ("tail", "mean-prefill"):
        assert fleet_ttft_p99_s(pools, ServiceLevel(1.0, model)) == pytest.approx(expected, rel=1e-12)


def test_prefill_p99_of_atoms():
    tau = [0.0, 0.1, 0.2, 0.3]
    assert prefill_p99_s(tau, [0.5, 0.4, 0.09, 0.01]) == 0.2                # 0.99 reached at the third atom
    assert prefill_p99_s(tau, [0.5, 0.4, 0.08, 0.02]) == 0.3
    assert prefill_p99_s(tau, [0.99, 0.0, 0.0, 0.01]) == 0.0
    assert prefill_p99_s(tau, [0.3, 0.3, 0.3, 0.0]) == 0.3                  # mass short of 0.99: the last atom


# ---------------------------------------------------------------- the load inverse

@pytest.mark.parametrize("slo_s", [3.0, 10.0, 25.0])
@pytest.mark.parametrize("mu", [1.0, 4.0])
def test_max_load_mm1_matches_closed_form(slo_s, mu):
    """c = 1, cv2 = 1, no prefill: rho exp(-mu (1 - rho) T) = 0.01 (M/M/1 wait tail)."""
    rho = brentq(lambda r: r * math.exp(-mu * (1.0 - r) * slo_s) - 0.01, 1e-9, 1.0 - 1e-12, xtol=1e-16, rtol=1e-15)
    rho = min(rho, 0.85)
    for model in ("tail", "mean-prefill"):
        got = max_load_erlangs([1.0], 1.0 / mu, 1.0, [0.0], [1.0], 0.0, slo_s=slo_s, rho_max=0.85, model=model)
        assert float(got[0]) == pytest.approx(rho, rel=1e-12)


@pytest.mark.parametrize("c, cv2, slo_s", [(2, 1.0, 2.0), (4, 0.5, 1.5), (8, 2.0, 1.0), (16, 1.0, 0.6)])
def test_max_load_mgc_with_prefill_matches_brute_force(c, cv2, slo_s):
    """Erlang C as a finite sum, the exponential tail and the prefill mixture, inverted with brentq."""
    es = 1.0
    tau = [0.0, 0.1, 0.25]
    probs = [0.6, 0.3, 0.1]
    mean_pf = float(np.dot(tau, probs))
    a_star = brentq(lambda a: ttft_miss_closed(slo_s, c, a, es, cv2, tau, probs) - 0.01, 1e-9, c * (1 - 1e-9),
                    xtol=1e-15, rtol=1e-15)
    got = max_load_erlangs([float(c)], es, cv2, tau, probs, mean_pf, slo_s=slo_s, rho_max=1.0, model="tail")
    assert float(got[0]) == pytest.approx(a_star, rel=1e-9)
    # mean-prefill: the wait tail alone against T - E[T_pf]
    a_mp = brentq(lambda a: ttft_miss_closed(slo_s - mean_pf, c, a, es, cv2, [0.0], [1.0]) - 0.01, 1e-9,
                  c * (1 - 1e-9), xtol=1e-15, rtol=1e-15)
    got = max_load_erlangs([float(c)], es, cv2, tau, probs, mean_pf, slo_s=slo_s, rho_max=1.0, model="mean-prefill")
    assert float(got[0]) == pytest.approx(a_mp, rel=1e-9)


def test_max_load_caps_and_infeasible():
    # a generous target: the utilisation cap binds exactly
    got = max_load_erlangs([1.0, 3.0, 10.0], 1.0, 1.0, [0.0], [1.0], 0.0, slo_s=1e4, rho_max=0.8)
    assert got.tolist() == [0.8, 0.8 * 3.0, 0.8 * 10.0]
    # half of the requests need 2 s of prefill against a 1 s target: no load meets it
    got = max_load_erlangs([4.0], 1.0, 1.0, [0.0, 2.0], [0.5, 0.5], 1.0, slo_s=1.0, rho_max=0.85)
    assert got.tolist() == [0.0]
    # more servers carry more
    got = max_load_erlangs(np.arange(1.0, 30.0), 1.0, 1.0, [0.0, 0.1], [0.9, 0.1], 0.01, slo_s=0.8, rho_max=1.0)
    assert np.all(np.diff(got) > 0)
    with pytest.raises(ValueError, match="rho_max"):
        max_load_erlangs([1.0], 1.0, 1.0, [0.0], [1.0], 0.0, slo_s=1.0, rho_max=1.5)
    with pytest.raises(ValueError, match="mean_service_s"):
        max_load_erlangs([1.0], 0.0, 1.0, [0.0], [1.0], 0.0, slo_s=1.0, rho_max=0.85)
    with pytest.raises(ValueError, match="ttft_model"):
        max_load_erlangs([1.0], 1.0, 1.0, [0.0], [1.0], 0.0, slo_s=1.0, rho_max=0.85, model="p99")


# ---------------------------------------------------------------- SLO coefficients

def test_miss_coefficients_tail_by_hand():
    C, theta, slo = 0.3, 2.0, 1.0
    probs = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
    tau = np.array([0.0, 0.5, 1.5])          # the third atom alone exceeds the target
    expected = [0.5 * C * math.exp(-2.0) + 0.5 * C * math.exp(-1.0) - 0.01,
                C * math.exp(-2.0) - 0.01,
                0.5 * C * math.exp(-1.0) + 0.5 * 1.0 - 0.01]
    got = miss_coefficients(probs, probs @ tau, tau, C, theta, slo, "tail")
    np.testing.assert_allclose(got, expected, rtol=1e-14)


def test_miss_coefficients_mean_prefill_by_hand():
    pf = np.array([0.05, 0.2])
    got = miss_coefficients(np.ones((2, 1)), pf, [0.0], 0.4, 3.0, 1.0, "mean-prefill")
    np.testing.assert_allclose(got, pf + math.log(0.4 / 0.01) / 3.0 - 1.0, rtol=1e-14)
    got = miss_coefficients(np.ones((2, 1)), pf, [0.0], 0.004, 3.0, 1.0, "mean-prefill")   # C <= 1 %: no wait
    np.testing.assert_allclose(got, pf - 1.0, rtol=1e-14)


# ---------------------------------------------------------------- the power line

def test_power_secant_by_hand_on_a_three_point_grid():
    """Curve 100 -> 300 W, k = 1, x0 = 1; one replica, A = 2 Erlangs, grid 0, 1, 2.

    h = (100, 100 + 200/(1 + e), 200); slope = h(2) - h(1) = 100 - 200/(1 + e) = 100 tanh(1/2);
    the gap at 0 is h(0) - h(2) + 2 s = 100 - 400/(1 + e) < 0, the others 0, so the raise is the
    largest change of the gap, 400/(1 + e) - 100, and the base h(2) - 2 s + raise = 800/(1 + e) - 100.
    """
    e = math.e
    curve = PowerCurve(100.0, 300.0, 1.0, 1.0)
    assert curve.power_w(1.0) == pytest.approx(logistic_w(1.0, 100.0, 300.0, 1.0, 1.0), rel=1e-15)
    base, slope, raise_w = pool_power_secant(curve, 1, 2.0, 64, grid=3)
    assert slope == pytest.approx(100.0 * math.tanh(0.5), rel=1e-13)
    assert raise_w == pytest.approx(400.0 / (1.0 + e) - 100.0, rel=1e-12)
    assert base == pytest.approx(800.0 / (1.0 + e) - 100.0, rel=1e-13)


@pytest.mark.parametrize("replicas, load, cap", [(1, 0.5, 64), (2, 30.0, 64), (4, 100.0, 32), (3, 500.0, 128),
                                                 (8, 7.0, 256)])
def test_power_secant_lies_above_the_pool_power(replicas, load, cap):
    """The line over-estimates h(a) = N P(min(a/N, n)) everywhere on [0, A] (a grid 50 x finer)."""
    idle, nominal, k, x0 = 280.0, 700.0, 1.3, 4.5
    base, slope, raise_w = pool_power_secant(PowerCurve(idle, nominal, k, x0), replicas, load, cap)
    a = np.linspace(0.0, load, 100_001)
    h = np.array([replicas * logistic_w(min(x / replicas, cap), idle, nominal, k, x0) for x in a])
    assert np.all(base + slope * a >= h - 1e-9)
    assert raise_w >= 0.0
    # and it is tight at the operating point: within the raise of h(A)
    assert base + slope * load == pytest.approx(h[-1] + raise_w, rel=1e-12)


def test_power_secant_idle_and_checks():
    curve = PowerCurve(300.0, 600.0, 1.0, 4.2)
    assert pool_power_secant(curve, 5, 0.0, 64) == (1500.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="replicas"):
        pool_power_secant(curve, 0, 1.0, 64)
