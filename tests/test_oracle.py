"""The path-search oracle (`solvers/oracle.py`) against two independent references on random separable problems.

- A layered graph searched by networkx: node ``(b, h)`` is boundary ``b`` after ``h`` pools, and four Dijkstra
  passes (objective, then GPUs, then pools, then power), each kept to the edges on a shortest path of the previous
  criterion, give the lexicographic optimum (the search the oracle ran before its dynamic programming, with the
  last criterion added).
- Brute force over every tiling and every choice of every segment, ordered by (objective, GPUs, pools, power).

Weights are small integers, so fleets tie often and every tie-break is exercised.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from fleetopt.solvers.oracle import NoFleetError, shortest_fleet
from fleetopt.solvers.problem import FleetProblem


def _random_problem(seed: int) -> FleetProblem:
    """Boundaries 0..n-1; each segment (i, j) has a pool on a random option with 0-3 replica choices whose cost,
    GPUs and power are small integers (many ties); the objective is cost."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    pi, pj, pg, cp, cn, cg, cc, cw = ([] for _ in range(8))
    for i in range(n - 1):
        for j in range(i + 1, n):
            if rng.random() < 0.25 and j - i > 1:
                continue
            p = len(pi)
            pi.append(i), pj.append(j), pg.append(int(rng.integers(0, 2)))
            for _ in range(int(rng.integers(0, 4))):
                cp.append(p), cn.append(int(rng.integers(1, 5)))
                cost = int(rng.integers(1, 4))
                cg.append(cost if rng.random() < 0.7 else int(rng.integers(1, 4))), cc.append(float(cost))
                cw.append(float(rng.integers(1, 40)) * 50.0)
    a = lambda x, t=float: np.asarray(x, dtype=t)  # noqa: E731
    return FleetProblem(
        boundaries=np.arange(n, dtype=float) * 100, gpu_names=("g0", "g1"), pool_i=a(pi, int), pool_j=a(pj, int),
        pool_gpu=a(pg, int), pool_arrival_rate=np.ones(len(pi)), choice_pool=a(cp, int), choice_replicas=a(cn, int),
        choice_gpus=a(cg, int), choice_cost_per_hr=a(cc), choice_power_w=a(cw),
        choice_miss_rate=np.zeros(len(cp)), max_pools=int(rng.integers(1, n)), gpu_max_gpus=(None, None),
        gpu_min_gpus=(0, 0))


KEYS = ("objective", "gpus", "pools", "power")


def _networkx_reference(problem: FleetProblem) -> tuple[float, int, int, float] | None:
    """(objective, GPUs, pools, power) of the lexicographic optimum by four Dijkstra passes on the layered
    graph."""
    g = nx.DiGraph()
    w = problem.choice_objective()
    for c in range(problem.n_choices):
        p = problem.choice_pool[c]
        i, j = int(problem.pool_i[p]), int(problem.pool_j[p])
        for h in range(problem.max_pools):
            edge = {"objective": float(w[c]), "gpus": float(problem.choice_gpus[c]), "pools": 1.0,
                    "power": float(problem.choice_power_w[c])}
            old = g.get_edge_data((i, h), (j, h + 1))
            if old is None or [edge[k] for k in KEYS] < [old[k] for k in KEYS]:
                g.add_edge((i, h), (j, h + 1), **edge)
    last = len(problem.boundaries) - 1
    for h in range(1, problem.max_pools + 1):
        if g.has_node((last, h)):
            g.add_edge((last, h), "end", **dict.fromkeys(KEYS, 0.0))
    if not g.has_node((0, 0)) or not g.has_node("end") or not nx.has_path(g, (0, 0), "end"):
        return None
    for weight in KEYS[:-1]:
        src = nx.single_source_dijkstra_path_length(g, (0, 0), weight=weight)
        dst = nx.single_source_dijkstra_path_length(g.reverse(copy=False), "end", weight=weight)
        best = src["end"]
        keep = [(u, v) for u, v, x in g.edges(data=weight)
                if u in src and v in dst and src[u] + x + dst[v] <= best + 1e-9 * max(1.0, abs(best))]
        g = g.edge_subgraph(keep).copy()
    path = nx.shortest_path(g, (0, 0), "end", weight="power")
    edges = [g.edges[u, v] for u, v in zip(path, path[1:]) if v != "end"]
    return (sum(e["objective"] for e in edges), int(sum(e["gpus"] for e in edges)), len(edges),
            sum(e["power"] for e in edges))


def _brute_force(problem: FleetProblem) -> tuple[float, int, int, float] | None:
    """(objective, GPUs, pools, power) of the least fleet over every tiling and every choice per segment."""
    w = problem.choice_objective()
    last = len(problem.boundaries) - 1
    by_segment: dict[tuple[int, int], list[int]] = {}
    for c in range(problem.n_choices):
        p = problem.choice_pool[c]
        by_segment.setdefault((int(problem.pool_i[p]), int(problem.pool_j[p])), []).append(c)
    best = None
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, last), k)
                                              for k in range(problem.max_pools)):
        nodes = (0, *cuts, last)
        segments = list(zip(nodes, nodes[1:]))
        for combo in itertools.product(*(by_segment.get(s, []) for s in segments)):
            key = (float(w[list(combo)].sum()), int(problem.choice_gpus[list(combo)].sum()), len(combo),
                   float(problem.choice_power_w[list(combo)].sum()))
            best = key if best is None else min(best, key)
    return best


@pytest.mark.parametrize("seed", range(300))
def test_oracle_equals_the_layered_dijkstra_and_brute_force(seed):
    problem = _random_problem(seed)
    ref = _networkx_reference(problem)
    assert ref == _brute_force(problem)       # the two references agree with each other first
    if ref is None:
        with pytest.raises(NoFleetError, match="no tiling of the length range with at most"):
            shortest_fleet(problem)
        return
    value, choices = shortest_fleet(problem)
    got = (value, int(problem.choice_gpus[list(choices)].sum()), len(choices),
           float(problem.choice_power_w[list(choices)].sum()))
    assert got == ref
    assert value == float(problem.choice_objective()[list(choices)].sum())   # the chosen fleet's own objective
    pools = sorted((int(problem.pool_i[problem.choice_pool[c]]), int(problem.pool_j[problem.choice_pool[c]]))
                   for c in choices)
    assert pools[0][0] == 0 and pools[-1][1] == len(problem.boundaries) - 1
    assert all(a[1] == b[0] for a, b in zip(pools, pools[1:]))         # a tiling of the whole range


def _two_tied_tilings(objective: str, low_first: bool) -> FleetProblem:
    """Boundaries 0..3 and two tilings of two pools each, equal in objective and GPUs: (0,1)+(1,3), which the
    node order meets first, and (0,2)+(2,3); one of them at 1 kW (or $2/hr under the power objective), the other
    at 3 kW (or $6/hr), ``low_first`` saying which; the other figure is equal."""
    low, high = [0.5, 0.5], [1.5, 1.5]
    split = low + high if low_first else high + low
    cost, power = (split, [1.0] * 4) if objective == "power" else ([1.0] * 4, split)
    a = lambda x, t=float: np.asarray(x, dtype=t)  # noqa: E731
    return FleetProblem(
        boundaries=np.arange(4, dtype=float) * 100, gpu_names=("g0",), pool_i=a([0, 1, 0, 2], int),
        pool_j=a([1, 3, 2, 3], int), pool_gpu=a([0, 0, 0, 0], int), pool_arrival_rate=np.ones(4),
        choice_pool=a([0, 1, 2, 3], int), choice_replicas=a([1, 1, 1, 1], int), choice_gpus=a([2, 2, 2, 2], int),
        choice_cost_per_hr=a(cost) * 2, choice_power_w=a(power) * 1000, choice_miss_rate=np.zeros(4), max_pools=2,
        gpu_max_gpus=(None,), gpu_min_gpus=(0,), objective=objective)


@pytest.mark.parametrize("low_first", [True, False])
@pytest.mark.parametrize("objective", ["cost", "power"])
def test_fleets_equal_in_objective_gpus_and_pools_go_to_the_lesser_other_figure(objective, low_first):
    """The last tie-break: under the cost objective the fleet that draws less, under the power objective the one
    that costs less, in the oracle and in the MIP alike, whichever the search meets first (before it, the MIP
    returned whichever fleet HiGHS met first)."""
    from fleetopt.solvers.mip import solve as solve_mip

    problem = _two_tied_tilings(objective, low_first)
    expected = (0, 1) if low_first else (2, 3)
    assert shortest_fleet(problem)[1] == expected
    res = solve_mip(problem)
    assert res.best.choices == expected and res.tie_break == "proven"
