"""Erlang-C, waiting-time tails and minimum replicas against closed forms and invariants."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetopt.models.queueing.erlang import erlang_c, min_replicas, ttft_exceed_prob, ttft_p99_s, wait_p99_s


def erlang_c_exact(c: int, a: Fraction) -> float:
    """Textbook closed form in exact rational arithmetic."""
    terms = sum(a**k / math.factorial(k) for k in range(c))
    last = a**c / math.factorial(c) * c / (c - a)
    return float(last / (terms + last))


@pytest.mark.parametrize("c", [1, 2, 3, 5, 8, 13, 21, 40])
@pytest.mark.parametrize("rho", [Fraction(1, 10), Fraction(1, 2), Fraction(4, 5), Fraction(19, 20), Fraction(99, 100)])
def test_erlang_c_matches_closed_form(c, rho):
    a = rho * c
    assert erlang_c(c, float(a)) == pytest.approx(erlang_c_exact(c, a), rel=1e-12, abs=1e-15)


def test_erlang_c_single_server_is_rho():
    rho = np.linspace(0.01, 0.99, 99)
    np.testing.assert_allclose(erlang_c(np.ones_like(rho), rho), rho, rtol=1e-13)


def test_erlang_c_published_value():
    # Kleinrock-style table value: M/M/10 at a = 8 Erlangs waits with probability 0.40918
    assert erlang_c(10, 8.0) == pytest.approx(0.4091801508, rel=1e-9)


def test_erlang_c_large_systems_finite_and_vectorized():
    c = np.array([1e3, 1e4, 1e5, 1e6, 1e6, 1e6])
    a = np.array([990.0, 9_950.0, 99_800.0, 999_000.0, 998_000.0, 900_000.0])
    out = erlang_c(c, a)
    assert np.all(np.isfinite(out)) and np.all((out >= 0) & (out <= 1))
    # square-root staffing: C depends on beta = (c - a)/sqrt(a) through the Halfin-Whitt limit
    beta = (c[3] - a[3]) / math.sqrt(a[3])
    from scipy.stats import norm

    hw = 1.0 / (1.0 + beta * norm.cdf(beta) / norm.pdf(beta))
    assert out[3] == pytest.approx(hw, rel=0.01)
    assert out[5] < 1e-300 or out[5] == 0.0
    assert out[4] < out[3]


def test_erlang_c_edges():
    assert erlang_c(5, 0.0) == 0.0
    assert erlang_c(5, 5.0) == 1.0 and erlang_c(5, 7.5) == 1.0
    with pytest.raises(ValueError):
        erlang_c(0, 1.0)
    with pytest.raises(ValueError):
        erlang_c(2, -1.0)


@settings(max_examples=200, deadline=None)
@given(c=st.integers(1, 5000), rho=st.floats(0.01, 0.999))
def test_erlang_c_monotone_in_servers(c, rho):
    a = rho * c
    assert 0.0 <= erlang_c(c + 1, a) <= erlang_c(c, a) <= 1.0


def test_mm1_wait_quantile():
    # M/M/1: P(Wq > t) = rho exp(-(mu - lambda) t); Kimura with cv2 = 1 is exact here
    lam, mu = 0.8, 1.0
    expected = math.log(0.8 / 0.01) / (mu - lam)
    assert wait_p99_s(1, lam, 1 / mu, 1.0) == pytest.approx(expected, rel=1e-12)
    assert wait_p99_s(1, 1.2, 1.0, 1.0) == math.inf


def test_tail_ttft_reduces_to_wait_plus_constant_prefill():
    # a single prefill atom: P99(W + tau) = W99 + tau
    c, lam, es, cv2, tau = 64, 50.0, 1.0, 2.0, 0.12
    w99 = wait_p99_s(c, lam, es, cv2)
    probs = np.zeros((1, 4))
    probs[0, 3] = 1.0
    t = ttft_p99_s(c, lam, es, cv2, np.array([0, 0.04, 0.08, tau]), probs, tau, "tail")
    assert t[0] == pytest.approx(w99 + tau, abs=1e-9)


def test_tail_ttft_exceed_probability_definition():
    C, theta = np.array([0.3]), np.array([2.0])
    tau = np.array([0.0, 1.0])
    probs = np.array([[0.5, 0.5]])
    # t = 0.5: first atom waits > 0.5 with C e^{-1}; second atom's prefill alone exceeds t
    assert ttft_exceed_prob(np.array([0.5]), C, theta, tau, probs)[0] == pytest.approx(
        0.5 * 0.3 * math.exp(-1.0) + 0.5)


def _sizing(lam, slo=0.5, rho=0.85, model="tail", es=2.0, cv2=3.0, n=16):
    tau = np.arange(5) * 0.05
    probs = np.array([[0.1, 0.4, 0.3, 0.15, 0.05]])
    return min_replicas(np.atleast_1d(lam), es, cv2, n, slo, tau, np.repeat(probs, np.size(lam), 0),
                        float((probs @ tau)[0]), rho, model)


def test_min_replicas_is_minimal():
    for model in ("tail", "mean-prefill"):
        lam = np.array([0.5, 10.0, 80.0, 400.0, 3000.0])
        z = _sizing(lam, model=model)
        assert z.feasible.all()
        tau = np.arange(5) * 0.05
        probs = np.repeat([[0.1, 0.4, 0.3, 0.15, 0.05]], len(lam), 0)
        for k, N in enumerate(z.replicas):
            t_at = ttft_p99_s(N * 16, lam[k], 2.0, 3.0, tau, probs[k], float(probs[k] @ tau), model)
            assert np.atleast_1d(t_at)[0] <= 0.5 + 1e-9 and lam[k] * 2.0 / (N * 16) <= 0.85 + 1e-12
            if N > 1:
                t_less = ttft_p99_s((N - 1) * 16, lam[k], 2.0, 3.0, tau, probs[k], float(probs[k] @ tau), model)
                assert np.atleast_1d(t_less)[0] > 0.5 or lam[k] * 2.0 / ((N - 1) * 16) > 0.85


def test_min_replicas_infeasible_when_prefill_breaks_slo():
    z = _sizing(np.array([10.0]), slo=0.15)  # 20 % of requests need >= 0.15 s of prefill
    assert not z.feasible[0] and z.replicas[0] == 0 and z.reason[0] == "prefill"
    z = _sizing(np.array([10.0]), slo=0.15, model="mean-prefill")  # mean prefill 0.0775 s < 0.15 s
    assert z.feasible[0]


@settings(max_examples=60, deadline=None)
@given(lam=st.floats(0.1, 2000.0), extra=st.floats(0.0, 500.0), slo=st.floats(0.25, 5.0), dslo=st.floats(0.0, 3.0))
def test_monotonicity_properties(lam, extra, slo, dslo):
    for model in ("tail", "mean-prefill"):
        base = _sizing(np.array([lam]), slo=slo, model=model).replicas[0]
        assert _sizing(np.array([lam + extra]), slo=slo, model=model).replicas[0] >= base  # more load
        assert _sizing(np.array([lam]), slo=slo + dslo, model=model).replicas[0] <= base  # looser SLO
