"""The fleet MIP with pools on several GPU options and with inventory groups, against exhaustive enumeration.

A prefill/decode pair is one pool whose replica choices take GPUs from two options (prefill replicas on
one, decode replicas on the other); the TP/dtype configurations of one hardware entry are options that
share one physical inventory (an inventory group). The instances here are random toy problems built as
plain arrays, and the reference is written out in this file: every tiling of the length range into at
most ``K`` pools, times every replica choice of each pool, each constraint checked by hand from the
toy's own per-choice record of GPUs per option (not from ``FleetProblem``'s derived index).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest

from fleetopt.solvers.mip import Termination, solve as solve_mip
from fleetopt.solvers.oracle import enumerate_fleets, fleet_objectives, shortest_fleet
from fleetopt.solvers.problem import FleetProblem, GpuUse, InventoryGroup

ENERGY_USD_PER_KWH, PUE = 0.12, 1.3


@dataclass(frozen=True)
class ToyChoice:
    use: dict[int, int]
    """Physical GPUs taken from each GPU option (one entry for an aggregated pool, two for a P/D pair)."""
    cost_per_hr: float
    power_w: float
    miss_rate: float


@dataclass(frozen=True)
class ToyPool:
    i: int
    j: int
    primary: int
    choices: tuple[ToyChoice, ...]


@dataclass(frozen=True)
class Limits:
    max_pools: int
    gpu_max_gpus: tuple[int | None, ...]
    gpu_min_gpus: tuple[int, ...]
    gpu_max_pools: tuple[int | None, ...]
    gpu_min_pools: tuple[int, ...]
    groups: tuple[InventoryGroup, ...] = ()
    max_total_gpus: int | None = None
    max_cost_per_hr: float | None = None
    max_power_w: float | None = None
    max_miss_rate: float | None = None


def free_limits(n_options: int, max_pools: int) -> Limits:
    return Limits(max_pools, (None,) * n_options, (0,) * n_options, (None,) * n_options, (0,) * n_options)


# ------------------------------------------------------------------ the reference, by hand

def flat_choices(pools):
    return [ch for p in pools for ch in p.choices]


def all_fleets(n_segments: int, pools, max_pools: int):
    """Every tiling of (b_0, b_M] by at most ``max_pools`` pools x every choice per pool, as global choice ids."""
    first = np.cumsum([0] + [len(p.choices) for p in pools])
    leaving: dict[int, list[int]] = {}
    for k, p in enumerate(pools):
        leaving.setdefault(p.i, []).append(k)

    def tilings(node, acc):
        if node == n_segments:
            yield acc
            return
        if len(acc) == max_pools:
            return
        for k in leaving.get(node, ()):
            yield from tilings(pools[k].j, acc + [k])

    for tiling in tilings(0, []):
        for picks in itertools.product(*(range(len(pools[k].choices)) for k in tiling)):
            yield [int(first[k]) + pick for k, pick in zip(tiling, picks)]


def within(value, cap) -> bool:
    return cap is None or value <= cap * (1 + 1e-9) + 1e-12


def fleet_ok(choices, fleet, lim: Limits) -> bool:
    """Every constraint, from each choice's own GPUs per option: a pool counts on every option it uses."""
    gpus_on, pools_on = Counter(), Counter()
    for c in fleet:
        for g, n in choices[c].use.items():
            gpus_on[g] += n
            pools_on[g] += 1
    for g, cap in enumerate(lim.gpu_max_gpus):
        if not within(gpus_on[g], cap) or gpus_on[g] < lim.gpu_min_gpus[g]:
            return False
        if not within(pools_on[g], lim.gpu_max_pools[g]) or pools_on[g] < lim.gpu_min_pools[g]:
            return False
    for grp in lim.groups:
        shared = sum(gpus_on[g] for g in grp.options)
        if not within(shared, grp.max_gpus) or shared < grp.min_gpus:
            return False
    return (len(fleet) <= lim.max_pools and within(fleet_gpus(choices, fleet), lim.max_total_gpus)
            and within(sum(choices[c].cost_per_hr for c in fleet), lim.max_cost_per_hr)
            and within(sum(choices[c].power_w for c in fleet), lim.max_power_w)
            and within(sum(choices[c].miss_rate for c in fleet), lim.max_miss_rate))


def fleet_gpus(choices, fleet) -> int:
    return sum(sum(choices[c].use.values()) for c in fleet)


def fleet_value(choices, fleet, objective: str) -> float:
    cost = sum(choices[c].cost_per_hr for c in fleet)
    kw = sum(choices[c].power_w for c in fleet) / 1000.0
    return {"cost": cost, "power": kw, "cost+power": cost + ENERGY_USD_PER_KWH * PUE * kw}[objective]


def enumerate_all(n_segments, pools, lim: Limits, objective: str):
    """All feasible fleets as (value, GPUs, pools, sorted choices), best first; empty when none is feasible."""
    choices = flat_choices(pools)
    out = [(fleet_value(choices, f, objective), fleet_gpus(choices, f), len(f), tuple(sorted(f)))
           for f in all_fleets(n_segments, pools, lim.max_pools) if fleet_ok(choices, f, lim)]
    return sorted(out)


# ------------------------------------------------------------------ the problem under test

def to_problem(n_segments, pools, lim: Limits, objective: str, n_options: int, explicit_use: bool = True):
    choices = flat_choices(pools)
    entries = [(c, g, n) for c, ch in enumerate(choices) for g, n in sorted(ch.use.items())]
    use = GpuUse(choice=np.array([e[0] for e in entries]), option=np.array([e[1] for e in entries]),
                 gpus=np.array([e[2] for e in entries])) if explicit_use else None
    return FleetProblem(
        boundaries=np.arange(n_segments + 1) * 1024, gpu_names=tuple(f"g{g}" for g in range(n_options)),
        pool_i=np.array([p.i for p in pools]), pool_j=np.array([p.j for p in pools]),
        pool_gpu=np.array([p.primary for p in pools]), pool_arrival_rate=np.ones(len(pools)),
        choice_pool=np.array([k for k, p in enumerate(pools) for _ in p.choices]),
        choice_replicas=np.array([len(ch.use) for ch in choices]),     # not read by the solvers
        choice_gpus=np.array([sum(ch.use.values()) for ch in choices]),
        choice_cost_per_hr=np.array([ch.cost_per_hr for ch in choices]),
        choice_power_w=np.array([ch.power_w for ch in choices]),
        choice_miss_rate=np.array([ch.miss_rate for ch in choices]),
        max_pools=lim.max_pools, gpu_max_gpus=lim.gpu_max_gpus, gpu_min_gpus=lim.gpu_min_gpus,
        gpu_min_pools=lim.gpu_min_pools, gpu_max_pools=lim.gpu_max_pools, max_total_gpus=lim.max_total_gpus,
        max_cost_per_hr=lim.max_cost_per_hr, max_power_w=lim.max_power_w, max_miss_rate=lim.max_miss_rate,
        objective=objective, energy_usd_per_kwh=ENERGY_USD_PER_KWH, pue=PUE,
        choice_gpu_use=use, inventory_groups=lim.groups)


def assert_mip_matches(n_segments, pools, lim, objective, n_options, explicit_use=True):
    """The MIP's status, value, fleet and tie-break (fewest GPUs, then pools) against enumeration."""
    ref = enumerate_all(n_segments, pools, lim, objective)
    problem = to_problem(n_segments, pools, lim, objective, n_options, explicit_use)
    res = solve_mip(problem)
    if not ref:
        assert res.termination == Termination.INFEASIBLE and res.best is None
        return ref, problem
    assert res.termination == Termination.OPTIMAL
    best = ref[0][0]
    choices = flat_choices(pools)
    got = list(res.best.choices)
    assert tuple(sorted(got)) in {r[3] for r in ref}       # a tiling that meets every limit
    assert fleet_value(choices, got, objective) == pytest.approx(best, rel=1e-6, abs=1e-9)
    assert res.best.objective == pytest.approx(best, rel=1e-6, abs=1e-9)
    tol = 1e-9 * max(1.0, abs(best))
    ties = [r for r in ref if r[0] <= best + tol]
    if all(r[0] <= best + tol or r[0] > best + 1e-6 * max(1.0, abs(best)) for r in ref):  # no near-tie
        assert res.tie_break == "proven"
        assert (fleet_gpus(choices, got), len(got)) == min((r[1], r[2]) for r in ties)
    return ref, problem


# ------------------------------------------------------------------ random toy instances

def random_pools(rng, n_segments: int, n_options: int, pairs: bool, fleet_scope: bool, dense: bool = False):
    """Candidate pools on random segments: aggregated ones on one option, P/D pairs on two (prefill replicas'
    GPUs on one option, decode replicas' on another). Costs are integral so that ties occur."""
    gpus_per_replica = rng.choice([1, 2, 4, 8], n_options)
    usd_per_gpu_hr = rng.choice([1, 2, 3, 4, 6], n_options)
    w_per_gpu = rng.choice([250.0, 400.0, 700.0, 1000.0], n_options)
    pools = []

    def choice(use):
        gpus = {g: int(n) for g, n in use.items()}
        load = rng.uniform(0.4, 1.0)
        miss = float(rng.choice([0.0, rng.uniform(0.0, 2.0)])) if fleet_scope else 0.0
        return ToyChoice(gpus, float(sum(n * usd_per_gpu_hr[g] for g, n in gpus.items())),
                         float(sum(n * w_per_gpu[g] * load for g, n in gpus.items())), miss)

    for i in range(n_segments):
        for j in range(i + 1, n_segments + 1):
            n_cand = int(rng.integers(1 + dense, 4 + dense)) if j == i + 1 else int(rng.integers(0, 3))
            for _ in range(n_cand):
                counts = range(int(rng.integers(1, 4)))
                if pairs and rng.random() < 0.6:
                    pre, dec = (int(g) for g in rng.choice(n_options, 2, replace=False))
                    cs = [choice({pre: rng.integers(1, 3) * gpus_per_replica[pre],
                                  dec: rng.integers(1, 5) * gpus_per_replica[dec]}) for _ in counts]
                    pools.append(ToyPool(i, j, dec, tuple(cs)))
                else:
                    g = int(rng.integers(n_options))
                    cs = [choice({g: rng.integers(1, 7) * gpus_per_replica[g]}) for _ in counts]
                    pools.append(ToyPool(i, j, g, tuple(cs)))
    return pools


def random_toy(seed: int, pairs: bool = True, least_options: int = 2, dense: bool = False):
    rng = np.random.default_rng(seed)
    n_options = int(rng.integers(least_options, 5))
    n_segments = int(rng.integers(2, 6))
    fleet_scope = rng.random() < 0.3
    pools = random_pools(rng, n_segments, n_options, pairs, fleet_scope, dense)
    objective = str(rng.choice(["cost", "power", "cost+power"]))
    max_pools = int(rng.integers(1, n_segments + 1))
    return rng, n_segments, n_options, pools, objective, max_pools, fleet_scope


def usage(pools, fleet):
    """GPUs per option and pools per option of one fleet (by hand)."""
    gpus_on, pools_on = Counter(), Counter()
    for c in fleet:
        for g, n in flat_choices(pools)[c].use.items():
            gpus_on[g] += n
            pools_on[g] += 1
    return gpus_on, pools_on


def random_caps(rng, n_options, pools, objective, free, max_pools, fleet_scope, p=0.8) -> Limits:
    """Caps around the unconstrained optimum ``free`` so that each binds about half of the time."""
    choices = flat_choices(pools)
    gpus_on, _ = usage(pools, free)
    total = fleet_gpus(choices, free)
    cost = sum(choices[c].cost_per_hr for c in free)
    power = sum(choices[c].power_w for c in free)
    miss = sum(choices[c].miss_rate for c in free)
    roll = lambda q: rng.random() < q * p  # noqa: E731
    return Limits(
        max_pools=max_pools,
        gpu_max_gpus=tuple(int(rng.integers(gpus_on[g] // 2, gpus_on[g] + 3)) if roll(0.35) else None
                           for g in range(n_options)),
        gpu_min_gpus=tuple(int(rng.integers(1, gpus_on[g] + 3)) if roll(0.1) else 0 for g in range(n_options)),
        gpu_max_pools=tuple(int(rng.choice([0, 1, 1, 2])) if roll(0.2) else None for g in range(n_options)),
        gpu_min_pools=tuple(1 if roll(0.1) else 0 for g in range(n_options)),
        max_total_gpus=int(round(total * rng.uniform(0.8, 1.3))) if roll(0.25) else None,
        max_cost_per_hr=float(cost * rng.uniform(0.95, 1.5)) if roll(0.3) else None,
        max_power_w=float(power * rng.uniform(0.85, 1.3)) if roll(0.3) else None,
        max_miss_rate=float(miss * rng.uniform(0.9, 1.5)) if fleet_scope else None)


def seeds(values, fast: int) -> list:
    """The first ``fast`` seeds in the default set, the rest in the slow set."""
    return [s if i < fast else pytest.param(s, marks=pytest.mark.slow) for i, s in enumerate(values)]


# ------------------------------------------------------------------ tests

def multi_option_case(seed: int):
    """A random toy with P/D pairs, caps drawn around its unconstrained optimum, and that optimum's value."""
    rng, n_seg, n_opt, pools, objective, max_pools, fleet_scope = random_toy(seed, dense=True)
    free = enumerate_all(n_seg, pools, free_limits(n_opt, max_pools), objective)
    if not free:    # every one-segment pool exists, so one pool per segment tiles
        max_pools = n_seg
        free = enumerate_all(n_seg, pools, free_limits(n_opt, max_pools), objective)
    lim = random_caps(rng, n_opt, pools, objective, free[0][3], max_pools, fleet_scope)
    return n_seg, n_opt, pools, objective, lim, free[0][0]


@pytest.mark.parametrize("seed", seeds(range(300), fast=20))
def test_multi_option_pools_mip_equals_enumeration(seed):
    """P/D pairs beside aggregated pools under inventories, minimums, pool counts per option (a pair counts on
    both its options), fleet size, budget, power cap and (sometimes) a fleet-scope SLO."""
    n_seg, n_opt, pools, objective, lim, _ = multi_option_case(seed)
    assert_mip_matches(n_seg, pools, lim, objective, n_opt)


def test_multi_option_cases_reach_every_outcome():
    """The default set's multi-option cases (enumeration only) include infeasible ones, ones where the caps
    make the optimum dearer, and optima with a P/D pair (5, 4 and 7 of the 20 when written)."""
    outcomes = Counter()
    for seed in range(20):
        n_seg, _, pools, objective, lim, free_value = multi_option_case(seed)
        ref = enumerate_all(n_seg, pools, lim, objective)
        outcomes["infeasible" if not ref else "dearer" if ref[0][0] > free_value * (1 + 1e-9) else "same value"] += 1
        outcomes["with a pair"] += bool(ref) and any(len(flat_choices(pools)[c].use) == 2 for c in ref[0][3])
    assert outcomes["infeasible"] >= 3 and outcomes["dearer"] >= 3 and outcomes["with a pair"] >= 5, outcomes


@pytest.mark.parametrize("seed", seeds(range(500, 700), fast=20))
def test_graph_oracle_is_exact_for_multi_option_pools(seed):
    """Without per-option limits the problem is separable whatever options a choice uses: the shortest path
    equals enumeration (value and the fewest-GPUs-then-pools tie-break) and so does the MIP."""
    _, n_seg, n_opt, pools, objective, max_pools, _ = random_toy(seed)
    lim = free_limits(n_opt, max_pools)
    ref, problem = assert_mip_matches(n_seg, pools, lim, objective, n_opt)
    assert problem.separable
    if not ref:
        return
    value, choices = shortest_fleet(problem)
    assert value == pytest.approx(ref[0][0], rel=1e-9, abs=1e-12)
    toy = flat_choices(pools)
    best = ref[0][0]
    ties = [r for r in ref if r[0] <= best + 1e-9 * max(1.0, abs(best))]
    assert (fleet_gpus(toy, choices), len(choices)) == min((r[1], r[2]) for r in ties)


def group_case(seed: int):
    """A random toy with at least two pools allowed, per-option inventories at or above what its best fleet
    takes (sometimes a loose budget or power cap), that best fleet, and inventory groups that this fleet
    breaks: one over an option it uses (mostly its largest) and one more, capped 1-2 GPUs below what it
    takes from them; sometimes a second group over the other options with a minimum above what it takes
    from them."""
    rng, n_seg, n_opt, pools, objective, max_pools, fleet_scope = random_toy(seed, least_options=3, dense=True)
    max_pools = max(max_pools, min(2, n_seg))
    free = enumerate_all(n_seg, pools, free_limits(n_opt, max_pools), objective)
    if not free:    # every one-segment pool exists, so one pool per segment tiles
        max_pools = n_seg
        free = enumerate_all(n_seg, pools, free_limits(n_opt, max_pools), objective)
    choices = flat_choices(pools)
    gpus_on, _ = usage(pools, free[0][3])
    lim = replace(free_limits(n_opt, max_pools),
                  gpu_max_gpus=tuple(gpus_on[g] + int(rng.integers(0, 25)) if rng.random() < 0.5 else None
                                     for g in range(n_opt)),
                  max_cost_per_hr=(sum(choices[c].cost_per_hr for c in free[0][3]) * rng.uniform(1.1, 1.6)
                                   if rng.random() < 0.2 else None),
                  max_power_w=(sum(choices[c].power_w for c in free[0][3]) * rng.uniform(1.1, 1.6)
                               if rng.random() < 0.2 else None))
    no_groups = enumerate_all(n_seg, pools, lim, objective)
    fleet = no_groups[0][3]
    gpus_on, _ = usage(pools, fleet)
    used = sorted(g for g in gpus_on if gpus_on[g] > 0)
    members = {max(used, key=lambda g: gpus_on[g]) if rng.random() < 0.7 else int(rng.choice(used))}
    members.add(int(rng.choice([g for g in range(n_opt) if g not in members] or used)))
    members_t = tuple(sorted(members))
    shared = sum(gpus_on[g] for g in members_t)
    caps = tuple(max(cap if cap is not None else 0, gpus_on[g] + int(rng.integers(0, 3)))
                 if g in members and rng.random() < 0.7 else cap for g, cap in enumerate(lim.gpu_max_gpus))
    groups = [InventoryGroup(options=members_t, max_gpus=max(0, shared - int(rng.integers(1, 3))))]
    rest = tuple(g for g in range(n_opt) if g not in members)
    if len(rest) >= 1 and rng.random() < 0.25:
        groups.append(InventoryGroup(options=rest, min_gpus=sum(gpus_on[g] for g in rest) + int(rng.integers(1, 5))))
    lim = replace(lim, gpu_max_gpus=caps, groups=tuple(groups))
    return n_seg, n_opt, pools, objective, lim, fleet, no_groups[0][0]


@pytest.mark.parametrize("seed", seeds(range(1000, 1300), fast=20))
def test_inventory_groups_mip_equals_enumeration(seed):
    """Options sharing one inventory, the group binding where the per-option caps alone would allow more:
    MIP == enumeration, and the library's own enumerator (``oracle.enumerate_fleets``) agrees."""
    n_seg, n_opt, pools, objective, lim, fleet, _ = group_case(seed)
    choices = flat_choices(pools)
    assert fleet_ok(choices, fleet, replace(lim, groups=()))      # the per-option caps alone allow this fleet,
    assert not fleet_ok(choices, fleet, lim)                       # the groups do not: they bind
    ref, problem = assert_mip_matches(n_seg, pools, lim, objective, n_opt)
    assert not problem.separable
    lib = enumerate_fleets(problem)
    assert (lib is None) == (not ref)
    if ref:
        assert lib[0] == pytest.approx(ref[0][0], rel=1e-9, abs=1e-12)


def test_inventory_group_cases_reach_both_outcomes():
    """The default set's group cases (enumeration only) include infeasible ones and ones where the groups
    make the optimum dearer (11 and 9 of the 20 when written)."""
    outcomes = Counter()
    for seed in range(1000, 1020):
        n_seg, _, pools, objective, lim, _, before = group_case(seed)
        ref = enumerate_all(n_seg, pools, lim, objective)
        outcomes["infeasible" if not ref else "dearer" if ref[0][0] > before * (1 + 1e-9) else "same value"] += 1
    assert outcomes["infeasible"] >= 5 and outcomes["dearer"] >= 5, outcomes


@pytest.mark.parametrize("seed", range(2000, 2010))
def test_default_gpu_use_is_the_pool_option(seed):
    """Absent ``choice_gpu_use``, each choice takes its GPUs from its pool's option: the same answer as the
    explicit one-entry-per-choice description, and as enumeration, under random caps."""
    rng, n_seg, n_opt, pools, objective, max_pools, fleet_scope = random_toy(seed, pairs=False)
    free = enumerate_all(n_seg, pools, free_limits(n_opt, max_pools), objective)
    lim = free_limits(n_opt, max_pools) if not free else \
        random_caps(rng, n_opt, pools, objective, free[0][3], max_pools, fleet_scope)
    assert_mip_matches(n_seg, pools, lim, objective, n_opt, explicit_use=False)
    assert_mip_matches(n_seg, pools, lim, objective, n_opt, explicit_use=True)


# A hand-worked case: options a100 (0, $2/GPU-hr) and h100 (1, $4/GPU-hr), range (0, 8192] in two segments.
#   p0 (0, 2]  aggregated on h100, 6 GPUs                      $24
#   p1 (0, 2]  P/D pair: a100 prefill 1 GPU + h100 decode 3     $14
#   p2 (0, 1]  a100, 4 GPUs  +  p3 (1, 2]  h100, 2 GPUs         $8 + $8 = $16 (two pools)
def _hand_pools():
    c = lambda use, usd: (ToyChoice(use, usd, 100.0 * sum(use.values()), 0.0),)  # noqa: E731
    return [ToyPool(0, 2, 1, c({1: 6}, 24.0)), ToyPool(0, 2, 1, c({0: 1, 1: 3}, 14.0)),
            ToyPool(0, 1, 0, c({0: 4}, 8.0)), ToyPool(1, 2, 1, c({1: 2}, 8.0))]


@pytest.mark.parametrize("change,expected", [
    ({}, 14.0),                                                     # the pair
    ({"max_pools": 1}, 14.0),                                       # a pair is one pool toward K
    ({"gpu_max_pools": (0, None)}, 24.0),                           # the pair is an a100 pool too: barred
    ({"gpu_max_pools": (1, 1)}, 14.0),                              # one a100 pool and one h100 pool
    ({"gpu_min_pools": (0, 2)}, None),                              # no plan has two h100 pools
    ({"gpu_max_gpus": (None, 2)}, 16.0),                            # the pair's decode GPUs count on h100
    ({"gpu_max_gpus": (0, None)}, 24.0),                            # its prefill GPU counts on a100
    ({"gpu_min_gpus": (2, 0)}, 16.0),                               # two a100 GPUs: only p2 has them
    ({"gpu_max_gpus": (4, 3), "groups": (InventoryGroup((0, 1), max_gpus=4),)}, 14.0),
    ({"gpu_max_gpus": (4, 3), "groups": (InventoryGroup((0, 1), max_gpus=3),)}, None),  # caps alone allow $14
    ({"groups": (InventoryGroup((0, 1), min_gpus=5),)}, 16.0),      # 6 GPUs: p0 ($24) or p2 + p3 ($16)
    ({"groups": (InventoryGroup((0,), max_gpus=0), InventoryGroup((1,), min_gpus=1))}, 24.0),
])
def test_hand_worked_pair(change, expected):
    lim = replace(free_limits(2, 2), **change)
    ref, _ = assert_mip_matches(2, _hand_pools(), lim, "cost", 2)
    assert (ref[0][0] if ref else None) == expected


def test_bad_gpu_use_and_groups_are_refused():
    pools = _hand_pools()
    good = to_problem(2, pools, free_limits(2, 2), "cost", 2)
    use = good.choice_gpu_use
    with pytest.raises(ValueError, match="choice 1 takes 3 GPUs"):
        keep = [0, 2, 3, 4]     # drop the pair's prefill entry
        replace(good, choice_gpu_use=GpuUse(choice=use.choice[keep], option=use.option[keep], gpus=use.gpus[keep]))
    with pytest.raises(ValueError, match="appears twice"):
        replace(good, choice_gpu_use=GpuUse(choice=np.array([0, 0]), option=np.array([1, 1]), gpus=np.array([3, 3])))
    with pytest.raises(ValueError, match="at least one GPU"):
        replace(good, choice_gpu_use=GpuUse(choice=np.r_[use.choice, 0], option=np.r_[use.option, 0],
                                            gpus=np.r_[use.gpus, 0]))
    with pytest.raises(ValueError, match="options in 0..1"):
        replace(good, choice_gpu_use=GpuUse(choice=use.choice, option=use.option + 1, gpus=use.gpus))
    with pytest.raises(ValueError, match="inventory_groups"):
        replace(good, inventory_groups=(InventoryGroup((0, 2), max_gpus=3),))
    assert replace(good, inventory_groups=(InventoryGroup((0, 1)),)).separable      # no bound: still separable
    assert not replace(good, inventory_groups=(InventoryGroup((0, 1), min_gpus=1),)).separable


# ------------------------------------------------------------------ the tie-break's restricted model

@pytest.mark.parametrize("seed", seeds(range(3000, 3100), fast=15))
def test_with_choices_is_the_problem_with_the_others_at_zero(seed):
    """``FleetProblem.with_choices(keep)``: its feasible fleets, mapped back, are the full problem's feasible fleets
    that use kept choices only (by hand, P/D pairs and inventory groups included), and the MIP solves it to their
    optimum."""
    n_seg, n_opt, pools, objective, lim, _ = multi_option_case(seed)
    rng = np.random.default_rng(seed)
    problem = to_problem(n_seg, pools, lim, objective, n_opt)
    keep = np.flatnonzero(rng.random(problem.n_choices) < 0.7)
    ref = [r for r in enumerate_all(n_seg, pools, lim, objective) if set(r[3]) <= set(keep.tolist())]
    sub = problem.with_choices(keep)
    assert sub.n_choices == len(keep) and sub.n_pools == problem.n_pools
    assert fleet_objectives(sub) == pytest.approx(sorted(r[0] for r in ref), rel=1e-12, abs=1e-12)
    res = solve_mip(sub)
    if not ref:
        assert res.best is None
        return
    assert tuple(sorted(int(keep[c]) for c in res.best.choices)) in {r[3] for r in ref}
    assert res.best.objective == pytest.approx(ref[0][0], rel=1e-9, abs=1e-12)


def test_relaxation_shortcuts_are_exact():
    """The two uses of the LP relaxation, on the multi-option and inventory-group cases (caps around the free
    optimum, so the relaxation is at times fractional), against enumeration:
    :func:`fleetopt.solvers.mip._could_be_optimal` rules out only choices in no optimal fleet (every fleet within
    1e-9 of the optimum uses kept choices alone), and :func:`fleetopt.solvers.mip._integral_optimum` returns a
    fleet only when the relaxation's optimum is integral, and then an optimal one. Neither check is empty: of 50
    feasible cases 21 had a relaxation below the optimum when written and 28 an integral one, each returned as an
    optimal fleet; 86 % of the choices were ruled out."""
    from fleetopt.solvers import mip
    from fleetopt.solvers.formulation import formulation

    seen = Counter()
    cases = [multi_option_case(seed)[:5] for seed in range(40)] + [group_case(seed)[:5] for seed in range(1000, 1040)]
    for seed, (n_seg, n_opt, pools, objective, lim) in enumerate(cases):
        ref = enumerate_all(n_seg, pools, lim, objective)
        if not ref:
            continue
        problem = to_problem(n_seg, pools, lim, objective, n_opt)
        root = mip.relax(formulation(problem))
        best = ref[0][0]
        optimal = {r[3] for r in ref if r[0] <= best + 1e-9 * max(1.0, abs(best))}
        free = mip._could_be_optimal(root, best)
        assert free is not None
        for fleet in optimal:
            assert free[list(fleet)].all(), (seed, fleet)
        fleet = mip._integral_optimum(problem, root, problem.choice_objective())
        integral = bool(np.all(np.minimum(np.abs(root.values), np.abs(1.0 - root.values)) <= 1e-6))
        if fleet is not None:
            assert integral and tuple(sorted(fleet)) in optimal, (seed, fleet)
        seen["integral, returned"] += fleet is not None
        seen["integral"] += integral
        seen["cases"] += 1
        seen["fractional"] += root.objective < best - 1e-6 * max(1.0, abs(best))
        seen["ruled out"] += int((~free).sum())
        seen["kept"] += int(free.sum())
    assert seen["cases"] >= 40 and seen["fractional"] >= 10 and seen["ruled out"] >= 4 * seen["kept"], seen
    assert seen["integral, returned"] >= 20, seen


def test_the_relaxation_and_branch_and_bound_both_find_the_optimum():
    """A fleet read off the LP relaxation's integral optimum (HiGHS on the formulation's matrix, no Pyomo) and a
    fleet from branch and bound (the Pyomo model) both match enumeration in value, fleet and tie-break
    (:func:`assert_mip_matches`), and the default set's cases take both paths (28 and 22 of the 50 feasible ones,
    30 infeasible, when written)."""
    paths = Counter()
    cases = [multi_option_case(seed)[:5] for seed in range(40)] + [group_case(seed)[:5] for seed in range(1000, 1040)]
    for n_seg, n_opt, pools, objective, lim in cases:
        ref, problem = assert_mip_matches(n_seg, pools, lim, objective, n_opt)
        if ref:
            paths["branch and bound" if solve_mip(problem).branched else "relaxation"] += 1
    assert paths["relaxation"] >= 15 and paths["branch and bound"] >= 15, paths
