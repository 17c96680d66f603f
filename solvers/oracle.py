"""Exact references for the fleet MIP: a shortest path (separable problems) and brute-force enumeration.

For a separable problem (only the tiling and the pool count bind) the
optimum is a shortest path from :math:`b_0` to :math:`b_M` with at most
:math:`K` edges in the boundary DAG whose edge :math:`(i, j)` weighs the best
choice for segment :math:`(b_i, b_j]`. The hop limit is enforced by layering:
node :math:`(k, h)` means "at :math:`b_k` after :math:`h` pools".
"""

from __future__ import annotations

import itertools
import time

import networkx as nx
import numpy as np

from .problem import FleetProblem

__all__ = ["shortest_fleet", "enumerate_fleets", "fleet_is_feasible", "NoFleetError"]


class NoFleetError(nx.NetworkXNoPath):
    """No fleet satisfies the problem."""


def _best_choice_per_segment(problem: FleetProblem) -> dict[tuple[int, int], tuple[float, int, int]]:
    """Per segment, the choice with the least (objective, physical GPUs, index)."""
    w = problem.choice_objective()
    best: dict[tuple[int, int], tuple[float, int, int]] = {}
    for c in range(problem.n_choices):
        p = problem.choice_pool[c]
        key = (int(problem.pool_i[p]), int(problem.pool_j[p]))
        cand = (float(w[c]), int(problem.choice_gpus[c]), c)
        if key not in best or cand < best[key]:
            best[key] = cand
    return best


def segment_graph(problem: FleetProblem) -> nx.DiGraph:
    """The layered boundary DAG. Edge attributes: ``objective``, ``gpus``, ``pools`` (1) and ``choice``."""
    g = nx.DiGraph()
    last = problem.n_boundaries - 1
    for (i, j), (w, gpus, c) in _best_choice_per_segment(problem).items():
        for h in range(problem.max_pools):
            g.add_edge((i, h), (j, h + 1), objective=w, gpus=float(gpus), pools=1.0, choice=c)
    for h in range(1, problem.max_pools + 1):
        if g.has_node((last, h)):
            g.add_edge((last, h), "end", objective=0.0, gpus=0.0, pools=0.0, choice=None)
    return g


def _tight_subgraph(g: nx.DiGraph, weight: str) -> nx.DiGraph:
    """Edges on some shortest (0,0) -> end path for ``weight``."""
    src = nx.single_source_dijkstra_path_length(g, (0, 0), weight=weight)
    dst = nx.single_source_dijkstra_path_length(g.reverse(copy=False), "end", weight=weight)
    best = src["end"]
    tol = 1e-9 * max(1.0, abs(best))
    keep = [(u, v) for u, v, w in g.edges(data=weight)
            if u in src and v in dst and src[u] + w + dst[v] <= best + tol]
    return g.edge_subgraph(keep)


def shortest_fleet(problem: FleetProblem) -> tuple[float, tuple[int, ...]]:
    """Optimal objective and choices of a separable problem, ties broken by fewest GPUs then pools.

    Three Dijkstra passes on the layered DAG, each restricted to the edges
    that lie on a shortest path of the previous criterion.
    """
    if not problem.separable:
        raise ValueError("shortest_fleet needs a separable problem (no inventory, budget, power or fleet-SLO limits)")
    g = segment_graph(problem)
    if not g.has_node((0, 0)) or not g.has_node("end") or not nx.has_path(g, (0, 0), "end"):
        raise NoFleetError(f"no tiling of the length range with at most {problem.max_pools} feasible pools")
    length = nx.shortest_path_length(g, (0, 0), "end", weight="objective")
    for weight in ("objective", "gpus"):
        g = _tight_subgraph(g, weight)
    path = nx.shortest_path(g, (0, 0), "end", weight="pools")
    choices = tuple(sorted(g.edges[u, v]["choice"] for u, v in zip(path, path[1:]) if v != "end"))
    return float(length), choices


def fleet_is_feasible(problem: FleetProblem, choices) -> bool:
    """Check every constraint family of the MIP in plain Python (tiling, counts, inventories, caps)."""
    ch = np.asarray(list(choices), dtype=int)
    pools = problem.choice_pool[ch]
    if len(set(pools.tolist())) != len(pools) or len(ch) > problem.max_pools or len(ch) == 0:
        return False
    segs = sorted(zip(problem.pool_i[pools].tolist(), problem.pool_j[pools].tolist()))
    at = 0
    for i, j in segs:
        if i != at:
            return False
        at = j
    if at != problem.n_boundaries - 1:
        return False
    gpus = problem.choice_gpus[ch]
    for g, cap in enumerate(problem.gpu_max_gpus):
        used = gpus[problem.pool_gpu[pools] == g].sum()
        if (cap is not None and used > cap) or used < problem.gpu_min_gpus[g]:
            return False
    checks = ((problem.max_total_gpus, gpus.sum()), (problem.max_cost_per_hr, problem.choice_cost_per_hr[ch].sum()),
              (problem.max_power_w, problem.choice_power_w[ch].sum()),
              (problem.max_miss_rate, problem.choice_miss_rate[ch].sum()))
    return all(cap is None or value <= cap * (1 + 1e-9) + 1e-12 for cap, value in checks)


def enumerate_fleets(problem: FleetProblem, time_limit_s: float | None = None) -> tuple[float, tuple[int, ...]] | None:
    """Brute force: every tiling with at most K pools x every choice per pool. Exponential; for tests.

    Returns the optimum (objective, choices) or None when nothing is feasible; raises
    ``TimeoutError`` when ``time_limit_s`` runs out first.
    """
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    w = problem.choice_objective()
    by_segment: dict[tuple[int, int], list[int]] = {}
    for c in range(problem.n_choices):
        p = problem.choice_pool[c]
        by_segment.setdefault((int(problem.pool_i[p]), int(problem.pool_j[p])), []).append(c)
    last = problem.n_boundaries - 1
    best: tuple[float, tuple[int, ...]] | None = None
    for k in range(1, problem.max_pools + 1):
        for cuts in itertools.combinations(range(1, last), k - 1):
            edges = list(zip((0,) + cuts, cuts + (last,)))
            options = [by_segment.get(e, []) for e in edges]
            if any(not o for o in options):
                continue
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"enumeration exceeded {time_limit_s} s")
            for combo in itertools.product(*options):
                value = float(w[list(combo)].sum())
                if (best is None or value < best[0] - 1e-12) and fleet_is_feasible(problem, combo):
                    best = (value, tuple(sorted(combo)))
    return best
