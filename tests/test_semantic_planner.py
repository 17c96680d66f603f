"""Multi-model (semantic) planning: the MIP with one tiling per model class, the share decision, the instance
section and its errors (docs/multi_model.md, docs/formulation.md).

The two-class MIP is checked against an enumeration written here, independently of the solvers: every tiling of
each class's boundaries, every option and replica choice per pool, the pair of fleets kept when it meets the
shared limits (inventories, power cap, total GPUs, fleet-scope misses and the pool count K)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fleetopt.solvers.mip import solve
from fleetopt.solvers.oracle import enumerate_fleets, shortest_fleet
from fleetopt.solvers.problem import FleetProblem


# ---------------------------------------------------------------- the two-class MIP against enumeration

def _tilings(m: int):
    """Every tiling of segments 0..m as a list of (i, j) boundary pairs."""
    if m == 0:
        yield []
        return
    for i in range(m):
        for rest in _tilings(i):
            yield rest + [(i, m)]


def _random_classes(rng, n_bounds: int, n_gpus: int, n_classes: int = 2):
    """Per class: pools {(i, j, g): [(replicas, gpus, cost, power, miss), ...]} on a random subset of segments."""
    classes = []
    for _ in range(n_classes):
        pools = {}
        for i in range(n_bounds - 1):
            for j in range(i + 1, n_bounds):
                for g in range(n_gpus):
                    if j == i + 1 and g == 0 or rng.random() < 0.7:      # every elementary segment has a pool
                        pools[(i, j, g)] = [(int(n), int(n * (1 + g)), float(rng.uniform(1, 10) * n),
                                             float(rng.uniform(100, 900) * n), float(rng.uniform(0, 2) / n))
                                            for n in sorted(set(rng.integers(1, 5, size=int(rng.integers(1, 3)))))]
        classes.append(pools)
    return classes


def _problem(classes, n_bounds: int, n_gpus: int, *, max_pools, gpu_max, max_power_w=None, max_total=None,
             max_miss=None) -> FleetProblem:
    """The merged problem: class k's nodes are k * n_bounds + boundary index."""
    pi, pj, pg, pfrom, pto, cp, cn, cg, cc, cw, cm = ([] for _ in range(11))
    for k, pools in enumerate(classes):
        off = k * n_bounds
        for (i, j, g), choices in pools.items():
            p = len(pi)
            pi.append(i), pj.append(j), pg.append(g), pfrom.append(off + i), pto.append(off + j)
            for n, gpus, cost, power, miss in choices:
                cp.append(p), cn.append(n), cg.append(gpus), cc.append(cost), cw.append(power), cm.append(miss)
    a = lambda x, t=float: np.asarray(x, dtype=t)  # noqa: E731
    return FleetProblem(
        boundaries=np.arange(n_bounds, dtype=float) * 100, gpu_names=tuple(f"g{g}" for g in range(n_gpus)),
        pool_i=a(pi, int), pool_j=a(pj, int), pool_gpu=a(pg, int), pool_arrival_rate=np.ones(len(pi)),
        choice_pool=a(cp, int), choice_replicas=a(cn, int), choice_gpus=a(cg, int), choice_cost_per_hr=a(cc),
        choice_power_w=a(cw), choice_miss_rate=a(cm), max_pools=max_pools, gpu_max_gpus=tuple(gpu_max),
        gpu_min_gpus=(0,) * n_gpus, pool_from_node=a(pfrom, int), pool_to_node=a(pto, int),
        n_nodes=len(classes) * n_bounds, sources=tuple(k * n_bounds for k in range(len(classes))),
        sinks=tuple(k * n_bounds + n_bounds - 1 for k in range(len(classes))), max_power_w=max_power_w,
        max_total_gpus=max_total, max_miss_rate=max_miss)


def _class_fleets(pools, n_bounds: int):
    """Every fleet of one class: (cost, gpus per option, pools, power, gpus, miss)."""
    out = []
    for tiling in _tilings(n_bounds - 1):
        per_seg = [[(g, ch) for (i, j, g), chs in pools.items() if (i, j) == seg for ch in chs] for seg in tiling]
        for combo in itertools.product(*per_seg):
            use = {}
            for g, (_, gpus, *_rest) in combo:
                use[g] = use.get(g, 0) + gpus
            out.append((sum(ch[2] for _, ch in combo), use, len(combo), sum(ch[3] for _, ch in combo),
                        sum(ch[1] for _, ch in combo), sum(ch[4] for _, ch in combo)))
    return out


def _enumerate(classes, n_bounds: int, *, max_pools, gpu_max, max_power_w=None, max_total=None, max_miss=None):
    """The least cost over every pair of class fleets meeting the shared limits (None: none does)."""
    best = None
    for fleets in itertools.product(*(_class_fleets(p, n_bounds) for p in classes)):
        use = {}
        for f in fleets:
            for g, n in f[1].items():
                use[g] = use.get(g, 0) + n
        if sum(f[2] for f in fleets) > max_pools:
            continue
        if any(cap is not None and use.get(g, 0) > cap for g, cap in enumerate(gpu_max)):
            continue
        if max_power_w is not None and sum(f[3] for f in fleets) > max_power_w:
            continue
        if max_total is not None and sum(f[4] for f in fleets) > max_total:
            continue
        if max_miss is not None and sum(f[5] for f in fleets) > max_miss:
            continue
        cost = sum(f[0] for f in fleets)
        best = cost if best is None or cost < best else best
    return best


def _case(seed: int):
    rng = np.random.default_rng(seed)
    n_bounds, n_gpus = int(rng.integers(3, 5)), 2
    classes = _random_classes(rng, n_bounds, n_gpus)
    limits = dict(max_pools=int(rng.integers(2, 2 * (n_bounds - 1) + 1)),
                  gpu_max=[None if rng.random() < 0.4 else int(rng.integers(2, 12)) for _ in range(n_gpus)],
                  max_power_w=None if rng.random() < 0.5 else float(rng.uniform(800, 4000)),
                  max_total=None if rng.random() < 0.6 else int(rng.integers(3, 16)),
                  max_miss=None if rng.random() < 0.6 else float(rng.uniform(0.5, 4)))
    return classes, n_bounds, n_gpus, limits


FAST_SEEDS = range(6)


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_two_class_mip_equals_enumeration(seed):
    classes, n_bounds, n_gpus, limits = _case(seed)
    problem = _problem(classes, n_bounds, n_gpus, **limits)
    expected = _enumerate(classes, n_bounds, **limits)
    got = solve(problem, tie_break=False)
    if expected is None:
        assert got.best is None
        assert enumerate_fleets(problem) is None
        return
    assert got.best is not None
    assert got.best.objective == pytest.approx(expected, rel=1e-9)
    assert enumerate_fleets(problem)[0] == pytest.approx(expected, rel=1e-9)
    if problem.separable:
        assert shortest_fleet(problem)[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 60))
def test_two_class_mip_equals_enumeration_more(seed):
    test_two_class_mip_equals_enumeration(seed)


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_oracle_sums_the_classes_when_nothing_couples_them(seed):
    """No shared limit and K slack: the oracle's sum of per-class shortest paths equals enumeration and the MIP."""
    classes, n_bounds, n_gpus, _ = _case(seed)
    limits = dict(max_pools=2 * (n_bounds - 1), gpu_max=[None] * n_gpus)
    problem = _problem(classes, n_bounds, n_gpus, **limits)
    assert problem.separable
    expected = _enumerate(classes, n_bounds, **limits)
    value, choices = shortest_fleet(problem)
    assert value == pytest.approx(expected, rel=1e-9) == solve(problem).best.objective
    assert problem.choice_objective()[list(choices)].sum() == pytest.approx(value)


def test_pool_count_couples_the_classes():
    """K = 2 with one forced two-pool tiling in class 0: class 1 must then take one pool although its two-pool
    tiling is cheaper; with K slack each class takes its own best and the oracle (their sum) applies."""
    one = {(0, 1, 0): [(1, 1, 1.0, 100.0, 0.0)], (1, 2, 0): [(1, 1, 1.0, 100.0, 0.0)]}     # class 0: 2 pools, 2.0
    two = {(0, 1, 0): [(1, 1, 1.0, 100.0, 0.0)], (1, 2, 0): [(1, 1, 1.0, 100.0, 0.0)],
           (0, 2, 1): [(1, 1, 5.0, 100.0, 0.0)]}                                            # class 1: 2.0 or 5.0
    tight = _problem([one, two], 3, 2, max_pools=3, gpu_max=[None, None])
    assert not tight.separable
    assert solve(tight).best.objective == pytest.approx(7.0)
    slack = _problem([one, two], 3, 2, max_pools=4, gpu_max=[None, None])
    assert slack.separable
    assert shortest_fleet(slack)[0] == pytest.approx(4.0) == solve(slack).best.objective
    assert len(shortest_fleet(slack)[1]) == 4


def test_one_commodity_by_default():
    classes, n_bounds, n_gpus, limits = _case(0)
    problem = _problem(classes[:1], n_bounds, n_gpus, **limits)
    assert problem.n_commodities == 1 and problem.sinks == (n_bounds - 1,)
    with pytest.raises(ValueError, match="distinct nodes"):
        _problem(classes, n_bounds, n_gpus, **limits).__class__(
            **{**_problem(classes, n_bounds, n_gpus, **limits).__dict__, "sources": (0, 0), "sinks": (1, 2)})
