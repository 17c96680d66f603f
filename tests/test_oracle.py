"""The path-search oracle (`solvers/oracle.py`) against two independent references on random separable problems.

- A layered graph searched by networkx: node ``(b, h)`` is boundary ``b`` after ``h`` pools, and three Dijkstra
  passes (objective, then GPUs, then pools), each kept to the edges on a shortest path of the previous criterion,
  give the lexicographic optimum (the search the oracle ran before its dynamic programming).
- Brute force over every tiling and every choice of every segment, ordered by (objective, GPUs, pools).

Weights are small integers, so fleets tie often and the GPU and pool tie-breaks are exercised.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from fleetopt.solvers.oracle import NoFleetError, shortest_fleet
from fleetopt.solvers.problem import FleetProblem


def _random_problem(seed: int) -> FleetProblem:
    """Boundaries 0..n-1; each segment (i, j) has a pool on a random option with 0-3 replica choices whose cost
    and GPUs are small integers (many ties)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    pi, pj, pg, cp, cn, cg, cc = ([] for _ in range(7))
    for i in range(n - 1):
        for j in range(i + 1, n):
            if rng.random() < 0.25 and j - i > 1:
                continue
            p = len(pi)
            pi.append(i), pj.append(j), pg.append(int(rng.integers(0, 2)))
            for _ in range(int(rng.integers(0, 4))):
                cp.append(p), cn.append(int(rng.integers(1, 5)))
                cg.append(int(rng.integers(1, 6))), cc.append(float(rng.integers(1, 4)))
    a = lambda x, t=float: np.asarray(x, dtype=t)  # noqa: E731
    return FleetProblem(
        boundaries=np.arange(n, dtype=float) * 100, gpu_names=("g0", "g1"), pool_i=a(pi, int), pool_j=a(pj, int),
        pool_gpu=a(pg, int), pool_arrival_rate=np.ones(len(pi)), choice_pool=a(cp, int), choice_replicas=a(cn, int),
        choice_gpus=a(cg, int), choice_cost_per_hr=a(cc), choice_power_w=np.ones(len(cp)),
        choice_miss_rate=np.zeros(len(cp)), max_pools=int(rng.integers(1, n)), gpu_max_gpus=(None, None),
        gpu_min_gpus=(0, 0))


def _networkx_reference(problem: FleetProblem) -> tuple[float, int, int] | None:
    """(objective, GPUs, pools) of the lexicographic optimum by three Dijkstra passes on the layered graph."""
    g = nx.DiGraph()
    w = problem.choice_objective()
    for c in range(problem.n_choices):
        p = problem.choice_pool[c]
        i, j = int(problem.pool_i[p]), int(problem.pool_j[p])
        for h in range(problem.max_pools):
            edge = {"objective": float(w[c]), "gpus": float(problem.choice_gpus[c]), "pools": 1.0}
            old = g.get_edge_data((i, h), (j, h + 1))
            if old is None or (edge["objective"], edge["gpus"]) < (old["objective"], old["gpus"]):
                g.add_edge((i, h), (j, h + 1), **edge)
    last = len(problem.boundaries) - 1
    for h in range(1, problem.max_pools + 1):
        if g.has_node((last, h)):
            g.add_edge((last, h), "end", objective=0.0, gpus=0.0, pools=0.0)
    if not g.has_node((0, 0)) or not g.has_node("end") or not nx.has_path(g, (0, 0), "end"):
        return None
    for weight in ("objective", "gpus"):
        src = nx.single_source_dijkstra_path_length(g, (0, 0), weight=weight)
        dst = nx.single_source_dijkstra_path_length(g.reverse(copy=False), "end", weight=weight)
        best = src["end"]
        keep = [(u, v) for u, v, x in g.edges(data=weight)
                if u in src and v in dst and src[u] + x + dst[v] <= best + 1e-9 * max(1.0, abs(best))]
        g = g.edge_subgraph(keep).copy()
    path = nx.shortest_path(g, (0, 0), "end", weight="pools")
    edges = [g.edges[u, v] for u, v in zip(path, path[1:]) if v != "end"]
    return sum(e["objective"] for e in edges), int(sum(e["gpus"] for e in edges)), len(edges)


def _brute_force(problem: FleetProblem) -> tuple[float, int, int] | None:
    """(objective, GPUs, pools) of the least fleet over every tiling and every choice per segment."""
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
            key = (float(w[list(combo)].sum()), int(problem.choice_gpus[list(combo)].sum()), len(combo))
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
    got = (value, int(problem.choice_gpus[list(choices)].sum()), len(choices))
    assert got == ref
    assert value == float(problem.choice_objective()[list(choices)].sum())   # the chosen fleet's own objective
    pools = sorted((int(problem.pool_i[problem.choice_pool[c]]), int(problem.pool_j[problem.choice_pool[c]]))
                   for c in choices)
    assert pools[0][0] == 0 and pools[-1][1] == len(problem.boundaries) - 1
    assert all(a[1] == b[0] for a, b in zip(pools, pools[1:]))         # a tiling of the whole range
