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
from fleetopt.solvers.oracle import NoFleetError, enumerate_fleets, shortest_fleet
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


def _oracle_case(seed: int):
    classes, n_bounds, n_gpus, _ = _case(seed)
    k = int(np.random.default_rng(seed + 1000).integers(2, 2 * (n_bounds - 1) + 1))     # K binds or not
    limits = dict(max_pools=k, gpu_max=[None] * n_gpus)
    return classes, n_bounds, n_gpus, limits


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_oracle_couples_the_classes_by_the_pool_count_exactly(seed):
    """No limit row but K (binding or not): the oracle's exact-hop paths and their min-plus convolution equal the
    enumeration and the MIP, and its tie-break (fewest GPUs, then pools) the MIP's."""
    classes, n_bounds, n_gpus, limits = _oracle_case(seed)
    problem = _problem(classes, n_bounds, n_gpus, **limits)
    assert problem.separable
    expected = _enumerate(classes, n_bounds, **limits)
    mip = solve(problem).best
    if expected is None:        # K below the classes' fewest pools together
        assert mip is None
        with pytest.raises(NoFleetError):
            shortest_fleet(problem)
        return
    value, choices = shortest_fleet(problem)
    assert value == pytest.approx(expected, rel=1e-9) == mip.objective
    assert problem.choice_objective()[list(choices)].sum() == pytest.approx(value)
    assert len(choices) <= limits["max_pools"]
    key = lambda ch: (int(problem.choice_gpus[list(ch)].sum()), len(ch))  # noqa: E731
    assert key(choices) == key(mip.choices)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6, 60))
def test_oracle_couples_the_classes_by_the_pool_count_exactly_more(seed):
    test_oracle_couples_the_classes_by_the_pool_count_exactly(seed)


def test_pool_count_couples_the_classes():
    """K = 3 with one forced two-pool tiling in class 0: class 1 must then take one pool although its two-pool
    tiling is cheaper; with K slack each class takes its own best. The oracle and the MIP agree on both."""
    one = {(0, 1, 0): [(1, 1, 1.0, 100.0, 0.0)], (1, 2, 0): [(1, 1, 1.0, 100.0, 0.0)]}     # class 0: 2 pools, 2.0
    two = {(0, 1, 0): [(1, 1, 1.0, 100.0, 0.0)], (1, 2, 0): [(1, 1, 1.0, 100.0, 0.0)],
           (0, 2, 1): [(1, 1, 5.0, 100.0, 0.0)]}                                            # class 1: 2.0 or 5.0
    tight = _problem([one, two], 3, 2, max_pools=3, gpu_max=[None, None])
    assert tight.separable
    assert solve(tight).best.objective == pytest.approx(7.0) == shortest_fleet(tight)[0]
    with pytest.raises(NoFleetError):
        shortest_fleet(_problem([one, two], 3, 2, max_pools=2, gpu_max=[None, None]))
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


# ---------------------------------------------------------------- the planner on instances

from fleetopt.models.fleet import PoolPlan, evaluate_fleet  # noqa: E402
from fleetopt.models.profiles import served_model  # noqa: E402
from fleetopt.models.semantic import ShareRule, split_by_model  # noqa: E402
from fleetopt.optimizer.errors import InstanceError  # noqa: E402
from fleetopt.optimizer.io.instance import instance_from_dict  # noqa: E402
from fleetopt.optimizer.plan.evaluate import service_level  # noqa: E402
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance  # noqa: E402

GPUS = [{"name": "h100-8b", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-8B", "tp": 1, "dtype": "bf16"},
        {"name": "h100-70b", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-70B", "tp": 8, "dtype": "fp8"}]


def _instance(semantic=None, **extra):
    data = {"workload": {"cdf": "builtin:azure", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500},
            "gpus": GPUS, "pools": {"max_pools": 3, "max_context": 8192, "boundaries": [2048]},
            "semantic": {"small_model": "Llama-3.1-8B", "large_model": "Llama-3.1-70B", "share": 0.5}
            if semantic is None else semantic, **extra}
    return instance_from_dict(data, label="<test>")


def _semantic(**fields):
    return {"small_model": "Llama-3.1-8B", "large_model": "Llama-3.1-70B", **fields}


@pytest.fixture(scope="module")
def decided():
    return solve_instance(_instance(_semantic(shares=[0.0, 0.3, 0.6, 0.9], min_large_share=0.35)))


def test_share_decision_is_the_cheapest_admissible_share(decided):
    """The decision equals the least of separate solves at each fixed share meeting the floor (0.9 breaks it)."""
    sem = decided.best.semantic
    assert sem.dropped and sem.dropped[0].startswith("0.9")
    costs = {}
    for share in (0.0, 0.3, 0.6):
        fixed = solve_instance(_instance(_semantic(share=share)))
        costs[share] = fixed.best.objective
    cheapest = min(costs, key=lambda a: (costs[a], a))
    assert decided.best.objective == pytest.approx(costs[cheapest])
    assert sem.share == f"{cheapest:g}" and sem.large_share == pytest.approx(1 - cheapest)
    assert {t.label: t.objective for t in sem.tried} == pytest.approx({f"{a:g}": c for a, c in costs.items()})


def test_each_class_serves_its_own_model_and_tiles_alone(decided):
    plan = decided.best
    roles = plan.semantic.roles
    assert len(roles) == len(plan.fleet.pools)
    for role in ("small", "large"):
        mine = [p for p, r in zip(plan.fleet.pools, roles) if r == role]
        if not mine:
            continue
        model = "Llama-3.1-8B" if role == "small" else "Llama-3.1-70B"
        assert all(served_model(p.model) == model for p in mine)
        assert mine[0].min_tokens == 0 and mine[-1].max_tokens == 8192
        assert all(a.max_tokens == b.min_tokens for a, b in zip(mine, mine[1:]))


def test_evaluation_equals_each_class_alone():
    """Each pool's row equals evaluate_fleet on its class alone (its distribution at rate pi x Lambda); totals add;
    the fleet P99 lies between the classes' own (a mixture's quantile)."""
    inst = _instance(_semantic(share=0.5))
    plan = solve_instance(inst).best
    small, large = split_by_model(inst.workload.lengths, ShareRule.constant(0.5))
    level, rows, p99s = service_level(inst), [], []
    for traffic, role in ((small, "small"), (large, "large")):
        pools = [p for p, r in zip(plan.fleet.pools, plan.semantic.roles) if r == role]
        alone = evaluate_fleet([PoolPlan(p.min_tokens, p.max_tokens, p.gpu, inst.gpu(p.gpu).profile, p.replicas)
                                for p in pools], traffic.distribution,
                               inst.workload.arrival_rate_req_per_s * traffic.rate_share, level,
                               inst.workload.input_fraction)
        for got, want in zip(pools, alone.pools):
            assert got.arrival_rate == pytest.approx(want.arrival_rate, rel=1e-9)
            assert got.ttft_p99_ms == pytest.approx(want.ttft_p99_ms, rel=1e-9)
            assert got.power_w == pytest.approx(want.power_w, rel=1e-9)
        rows += list(alone.pools)
        p99s.append(alone.ttft_p99_ms)
    assert plan.fleet.cost_per_hr == pytest.approx(sum(r.cost_per_hr for r in rows))
    assert sum(p.arrival_rate for p in plan.fleet.pools) == pytest.approx(20.0)
    assert min(p99s) - 1e-6 <= plan.fleet.ttft_p99_ms <= max(p99s) + 1e-6
    assert plan.semantic.classes[0].rate_share == pytest.approx(0.5)


def test_share_zero_is_the_large_model_alone():
    """With no traffic to the small model the plan is the large model's own optimum (one class, one tiling)."""
    zero = solve_instance(_instance(_semantic(share=0.0)))
    alone = solve_instance(instance_from_dict(
        {"workload": {"cdf": "builtin:azure", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500}, "gpus": GPUS[1:],
         "pools": {"max_pools": 3, "max_context": 8192, "boundaries": [2048]}}))
    assert zero.best.objective == pytest.approx(alone.best.objective)
    assert set(zero.best.semantic.roles) == {"large"}


def test_shared_limit_binds_across_classes():
    """A GPU cap below the two classes' unconstrained GPUs forces a dearer (or no) plan; a pool count of 2 leaves
    one pool per class."""
    free = solve_instance(_instance(_semantic(share=0.5)))
    two = solve_instance(instance_from_dict(
        {"workload": {"cdf": "builtin:azure", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500}, "gpus": GPUS,
         "pools": {"max_pools": 2, "max_context": 8192, "boundaries": [2048]}, "semantic": _semantic(share=0.5)}))
    assert sorted(two.best.semantic.roles) == ["large", "small"]
    assert two.best.objective >= free.best.objective - 1e-9
    cap = free.best.fleet.total_gpus - 1
    capped = solve_instance(_instance(_semantic(share=0.5), constraints={"max_total_gpus": cap}))
    if capped.plans:
        assert capped.best.fleet.total_gpus <= cap
        assert capped.best.objective >= free.best.objective - 1e-9
    else:
        assert capped.status == "infeasible"


@pytest.mark.parametrize("semantic, field", [
    (_semantic(small_model="Llama-3.1-405B", share=0.5), "semantic.small_model"),
    (_semantic(large_model="Llama-3.1-8B", share=0.5), "semantic.large_model"),
    (_semantic(share=1.5), "semantic.share"),
    (_semantic(shares=[0.2, -0.1]), "semantic.shares[1]"),
    (_semantic(share={"edges": [2048], "shares": [0.5]}), "semantic.share.shares"),
    (_semantic(share={"edges": [4096, 2048], "shares": [0.5, 0.2, 0.1]}), "semantic.share.edges"),
    (_semantic(shares=[0.6, 0.8], min_large_share=0.5), "semantic.min_large_share"),
    (_semantic(share=0.5, shares=[0.5]), "semantic.share"),
    (_semantic(), "semantic.share"),
    (_semantic(share=0.5, min_large_share=2), "semantic.min_large_share"),
])
def test_bad_semantic_sections_are_one_line_errors(semantic, field):
    with pytest.raises(InstanceError) as err:
        _instance(semantic)
    lines = str(err.value).splitlines()
    assert len(lines) == 1 and f"{field}:" in lines[0], lines


def test_an_option_of_a_third_model_is_refused():
    gpus = GPUS + [{"name": "h100-405b", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-405B", "tp": 8,
                    "dtype": "fp8"}]
    with pytest.raises(InstanceError, match="h100-405b serves Llama-3.1-405B, neither"):
        instance_from_dict({"workload": {"cdf": "builtin:azure", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500},
                            "gpus": gpus, "pools": {"max_pools": 3, "max_context": 8192},
                            "semantic": _semantic(share=0.5)})


def test_the_exit_code():
    assert InstanceError("x").exit_code == 2       # --verify-top simulates semantic plans: test_semantic_simulation


def test_step_rule_large_share_by_hand():
    """A step rule's large-model share is the CDF's mass times each segment's 1 - share (azure: F(2048))."""
    inst = _instance(_semantic(share={"edges": [2048], "shares": [0.8, 0.0]}))
    f = float(inst.workload.lengths.cdf(2048.0))
    assert 0 < f < 1
    assert inst.semantic.large_shares[0] == pytest.approx(1 - 0.8 * f, rel=1e-9)
    plan = solve_instance(inst, SolveOptions(compute_baseline=False)).best
    assert plan.semantic.large_share == pytest.approx(inst.semantic.large_shares[0])
    small = [p for p, r in zip(plan.fleet.pools, plan.semantic.roles) if r == "small"]
    assert small and small[-1].max_tokens == 2048      # no small-model request above the edge: its pools end there
    assert sum(p.arrival_rate for p in small) == pytest.approx(20 * 0.8 * f, rel=1e-9)


def test_the_example_solves_with_per_model_pools(repo_root, tmp_path):
    """instances/semantic_8b_70b.yaml: exit 0, each JSON pool names its model and class, the chosen share meets
    the floor, the tok/W warning is there (--verify-top: tests/test_semantic_simulation.py)."""
    import json

    from click.testing import CliRunner

    from fleetopt.optimizer.cli import main

    path = str(repo_root / "instances" / "semantic_8b_70b.yaml")
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(main, ["solve", path, "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "their cost and tok/W compare different models' outputs" in res.output
    doc = json.loads(out.read_text())
    roles = {(p["role"], served_model(p["model"])) for p in doc["pools"]}
    assert roles == {("small", "Llama-3.1-8B"), ("large", "Llama-3.1-70B")}
    sem = doc["semantic"]
    assert sem["large_share"] >= 0.5 and [t["share"] for t in sem["shares_tried"]] == ["0", "0.2", "0.4"]
    assert sum(c["arrival_rate"] for c in sem["classes"]) == pytest.approx(100.0)
    assert doc["cost_per_hr"] == pytest.approx(sum(c["cost_per_hr"] for c in sem["classes"]))


def test_a_class_of_trace_lengths_is_based():
    """A trace's class is a distribution of atoms only (no density): its segment sums hold the atoms' masses."""
    from fleetopt.models.segments import raw_between, segment_basis
    from fleetopt.models.workload import LengthDistribution

    d = LengthDistribution(np.array([100.0, 300.0]), np.array([100.0, 300.0]), np.array([0.25, 0.75]))
    basis = segment_basis(d, [0.0, 200.0, 400.0], 512, 0.8)
    assert raw_between(basis, 0, 1).mass[0] == pytest.approx(0.25)
    assert raw_between(basis, 1, 2).mass[0] == pytest.approx(0.75)
    assert raw_between(basis, 0, 2).L[0] == pytest.approx(0.25 * 100 + 0.75 * 300)


def test_a_zero_one_rule_is_puzzle10s_length_router(repo_root):
    """Puzzle 10's router as a rule (every request <= 4,096 tokens to the A10G's 7B-class model, the rest to the
    H100 unit): the large class's pool is the length-routed fleet's long pool of `evaluate` (same requests, same
    window), to the replica, utilisation and P99."""
    from fleetopt.optimizer.io.instance import load_instance
    from fleetopt.optimizer.plan.evaluate import evaluate, parse_fleet

    sets = ["slo.ttft_model=mean-prefill", "pools.max_pools=3",
            "semantic={small_model: 7B-class model, large_model: Llama-3-70B-class, "
            "share: {edges: [4096], shares: [1.0, 0.0]}}"]
    inst = load_instance(repo_root / "instances" / "ref_puzzle10_azure.yaml", sets)
    plan = solve_instance(inst, SolveOptions(compute_baseline=False)).best
    large = [p for p, r in zip(plan.fleet.pools, plan.semantic.roles) if r == "large"]
    assert len(large) == 1 and large[0].max_tokens == 8192
    plain = load_instance(repo_root / "instances" / "ref_puzzle10_azure.yaml", sets[:1])
    long = evaluate(plain, parse_fleet("0-4096:a10g,4096-8192:h100", plain)).result.pools[1]
    assert large[0].replicas == long.replicas
    assert large[0].arrival_rate == pytest.approx(long.arrival_rate, rel=1e-9)
    assert large[0].utilization == pytest.approx(long.utilization, rel=1e-6)
    assert large[0].ttft_p99_ms == pytest.approx(long.ttft_p99_ms, rel=1e-6)


def test_infeasible_and_cut_short_semantic_solves():
    """No plan under a power cap no fleet meets: infeasible, one reason for every share. A time limit that passes
    while candidates are built: time_limit, never a claim of optimality or infeasibility."""
    inst = _instance(_semantic(shares=[0.2, 0.5]), constraints={"max_power_kw": 0.1})
    rep = solve_instance(inst, SolveOptions(compute_baseline=False))
    assert rep.status == "infeasible" and not rep.plans
    assert "shares 0.2, 0.5: no fleet of the two models' pools meets the instance's limits" in rep.explanation
    ticks = iter(range(10_000))
    rep = solve_instance(_instance(_semantic(shares=[0.2, 0.5])),
                         SolveOptions(compute_baseline=False, time_limit_s=0.5, clock=lambda: float(next(ticks))))
    assert rep.status == "time_limit" and "not sized" in rep.explanation
