"""bisect_level: the bisection of f(x) > L replayed with f asked for many points per call, checked to the last bit
against bisect_boundary (the plain bisection, one point per call) on closed forms, on seeded monotone functions
with rounding-like flicker about their roots, at the ends, and on the batched model's P99 searches (a pool's, the
fleet mixture's), with the many-point miss function checked element by element against the one-point one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetopt.models import fleet as fleet_mod
from fleetopt.models.numerics import bisect_boundary, bisect_level
from fleetopt.models.queueing import batched


def _both(f, level, lo, hi):
    """The two brackets: bisect_level's, and bisect_boundary's with f evaluated one point per call."""
    new = bisect_level(f, level, lo, hi)
    old = bisect_boundary(lambda x: f(np.asarray(x, dtype=float).reshape(-1, 1)).reshape(np.shape(x)) > level, lo, hi)
    return new, old


def _identical(a, b) -> bool:
    return all(np.array_equal(u, v, equal_nan=True) and np.array_equal(np.signbit(u), np.signbit(v))
               for u, v in zip(a, b))


def test_square_root_of_two_to_the_last_bit():
    (lo, hi), _ = _both(lambda x: 2.0 - x * x, 0.0, 1.0, 2.0)
    assert float(hi) == math.sqrt(2.0) and float(lo) == math.nextafter(math.sqrt(2.0), 0.0)


@pytest.mark.parametrize("seed", range(40))
def test_same_bracket_as_the_bisection_with_flicker_about_the_root(seed):
    """exp(-x/s) (1 + eps sin(1e12 x)): monotone but for a flicker of relative size eps near the root, where the
    bisection's path depends on every point it tests; several elements of unrelated scales at once."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 5))
    scale = 10.0 ** rng.uniform(-3, 3, size)
    eps = float(rng.choice([0.0, 1e-15, 1e-13, 1e-10]))

    def f(x):
        return np.exp(-x / scale[:, None]) * (1.0 + eps * np.sin(x * 1e12))

    new, old = _both(f, 0.01, np.zeros(size), scale * rng.uniform(1e-3, 30.0, size))
    assert _identical(new, old)


@pytest.mark.parametrize("f, level, lo, hi", [
    (lambda x: np.where(x < 0.0, 1.0, 0.0), 0.5, 0.0, 1.0),     # the boundary at the lower end
    (lambda x: np.ones_like(x), 0.5, 0.0, 1.0),                  # beyond the upper end
    (lambda x: np.zeros_like(x), 0.5, 0.0, 1.0),                 # below the lower end: down through the subnormals
    (lambda x: np.where(x < 0.5, 1.0, 0.0), 0.5, 3.0, 3.0),     # a degenerate bracket
    (lambda x: 1e-5 - x, 0.0, -0.0, 0.0),                        # signed zeros
    (lambda x: 2.0 - x * x, 0.0, -np.inf, np.inf),               # a NaN midpoint
    (lambda x: np.where(np.isnan(x), 1.0, 2.0 - x * x), 0.0, np.nan, 2.0),
])
def test_same_bracket_at_the_ends(f, level, lo, hi):
    with np.errstate(invalid="ignore"):
        new, old = _both(f, level, lo, hi)
    assert _identical(new, old)


def test_guard_on_the_halvings():
    with pytest.raises(RuntimeError):
        bisect_level(lambda x: 2.0 - x * x, 0.0, 1.0, 2.0, max_halvings=10)


def test_few_calls_for_an_exponential_tail():
    calls = []

    def f(x):
        calls.append(x.shape)
        return np.exp(-x / 0.2)

    lo, hi = bisect_level(f, 0.01, 0.0, 5.0)
    assert len(calls) <= 4                       # the plain bisection calls f 56 times here
    assert float(hi) == float(bisect_boundary(lambda x: np.exp(-x / 0.2) > 0.01, 0.0, 5.0)[1])


# ---------------------------------------------------------------- the batched model's searches


@pytest.fixture(scope="module")
def pools():
    """(traffic, replicas) of every pool the batched P99 search sees while two shipped instances' fleets are
    evaluated: chat traffic on 70B units, and agent traffic with prefill compute (lumps, co-arrivals)."""
    from fleetopt.optimizer.io.instance import load_instance
    from fleetopt.optimizer.plan.evaluate import evaluate, parse_fleet

    seen = []
    real = fleet_mod.batched_ttft_p99_s

    def spy(traffic, replicas, op=None, nodes=None):
        seen.append((traffic, np.asarray(replicas, dtype=float)))
        return real(traffic, replicas, op, nodes)

    fleet_mod.batched_ttft_p99_s = spy
    try:
        for path, spec in (("instances/quickstart.yaml", "0-4096:a100x3,4096-65536:h100x4"),
                           ("instances/ref_puzzle2_agent_h100.yaml", "0-16384:h100x5,16384-65536:h100x9")):
            inst = load_instance(path)
            evaluate(inst, parse_fleet(spec, inst))
    finally:
        fleet_mod.batched_ttft_p99_s = real
    assert len(seen) >= 4
    return seen


def test_miss_grid_is_the_one_point_miss_to_the_last_bit(pools):
    rng = np.random.default_rng(7)
    for traffic, replicas in pools:
        op = batched.operating_point(traffic, replicas)
        nodes = batched._nodes(traffic, op)
        p99 = batched.batched_ttft_p99_s(traffic, replicas, op, nodes)
        scale = np.where(np.isfinite(p99) & (p99 > 0), p99, 1.0)[:, None]
        t = scale * np.concatenate([rng.uniform(0.0, 3.0, 24), 1.0 + rng.normal(0.0, 1e-9, 8)])[None, :]
        grid = batched.batched_miss_grid(t, traffic, op, nodes)
        one = np.stack([batched.batched_miss_prob(t[:, j], traffic, op.replicas, op, nodes)
                        for j in range(t.shape[1])], axis=1)
        assert np.array_equal(grid, one, equal_nan=True)


def test_pool_p99_is_the_plain_bisection_of_the_miss(pools, monkeypatch):
    got = [batched.batched_ttft_p99_s(t, r) for t, r in pools]

    def plain(f, level, lo, hi):
        return bisect_boundary(lambda x: f(np.asarray(x).reshape(-1, 1)).reshape(np.shape(x)) > level, lo, hi)

    monkeypatch.setattr(batched, "bisect_level", plain)
    want = [batched.batched_ttft_p99_s(t, r) for t, r in pools]
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert any(np.all(np.isfinite(a) & (a > 0)) for a in got)


def test_fleet_p99_is_the_plain_bisection_of_the_mixture(pools):
    misses = [fleet_mod._BatchedMiss(t, batched.operating_point(t, r), batched._nodes(t, batched.operating_point(t, r)))
              for t, r in pools if np.all(np.isfinite(batched.batched_ttft_p99_s(t, r)))]
    rates = [float(m.traffic.arrival_rate[0]) for m in misses]
    p99s = [float(batched.batched_ttft_p99_s(m.traffic, m.op.replicas)[0]) for m in misses]
    fast = fleet_mod._mixture_p99_s(rates, misses, p99s)
    plain = fleet_mod._mixture_p99_s(rates, [lambda t, m=m: m(t) for m in misses], p99s)   # no grid: bisection
    assert math.isfinite(fast) and fast == plain
