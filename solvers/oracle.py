"""Exact references for the fleet MIP: a shortest path (separable problems) and brute-force enumeration.

For a separable problem (only the tiling and the pool count bind) the
optimum is a shortest path from :math:`b_0` to :math:`b_M` with at most
:math:`K` edges in the boundary DAG whose edge :math:`(i, j)` weighs the best
choice for segment :math:`(b_i, b_j]`. A pool's head node lies above its tail node, so the node order is
topological, and the best path with exactly :math:`h` pools, for every :math:`h \\le K`, is one pass of dynamic
programming over the nodes in that order (:func:`_exact_hops`).

An edge reads only each choice's objective weight, total physical GPUs :math:`G_c` and last-tie weight (the
tie-break: :meth:`~fleetopt.solvers.problem.FleetProblem.choice_last_tie`), never which GPU options the choice
takes them from: without per-option or inventory-group limits (what
``FleetProblem.separable`` requires) the options a choice uses change no constraint, so the search stays
exact for pools on several options (prefill/decode pairs) and for options in inventory groups.

With several commodities (the model classes of semantic routing: one path per class, each on its own range of
nodes, ``FleetProblem.sources``/``sinks``) the only row they share here is the pool count
:math:`\\sum_c z_c \\le K`. It is handled exactly: the best path of each commodity with exactly :math:`h` pools,
for every :math:`h \\le K`, then a min-plus convolution over the commodities (:func:`_coupled_by_pool_count`); one
commodity is the case with nothing to convolve.

The search runs in plain Python over at most (nodes x K) states: the layered graph and three Dijkstra passes this
module once built with networkx found the same optima (``tests/test_oracle.py`` keeps that search as the
independent reference), and importing networkx cost 0.12-0.16 s of every such solve on a 2-core machine, a quarter
of a small instance's whole run.
"""

from __future__ import annotations

import time

import numpy as np

from fleetopt.solvers.problem import FleetProblem

__all__ = ["shortest_fleet", "enumerate_fleets", "fleet_objectives", "fleet_is_feasible", "NoFleetError"]


class NoFleetError(Exception):
    """No fleet satisfies the problem (an outcome of the search, not bad input)."""


def _best_choice_per_segment(problem: FleetProblem) -> dict[tuple[int, int], tuple[float, int, float, int]]:
    """Per (tail node, head node), the choice with the least (objective, physical GPUs, last-tie weight, index)."""
    w, last = problem.choice_objective(), problem.choice_last_tie()
    assert problem.pool_from_node is not None and problem.pool_to_node is not None   # filled by __post_init__
    best: dict[tuple[int, int], tuple[float, int, float, int]] = {}
    for c in range(problem.n_choices):
        p = problem.choice_pool[c]
        key = (int(problem.pool_from_node[p]), int(problem.pool_to_node[p]))
        cand = (float(w[c]), int(problem.choice_gpus[c]), float(last[c]), c)
        if key not in best or cand < best[key]:
            best[key] = cand
    return best


def shortest_fleet(problem: FleetProblem) -> tuple[float, tuple[int, ...]]:
    """Optimal objective and choices of a separable problem (:func:`_coupled_by_pool_count`).

    Fleets within 1e-9 (relative) of the least objective are told apart by fewest physical GPUs, then fewest
    pools, then the least last-tie weight (power under a cost objective, cost under a power one): the MIP's
    tie-break (:func:`fleetopt.solvers.mip._tie_break`). The objective returned is the chosen fleet's own sum of
    weights.

    Raises
    ------
    ValueError
        ``problem`` is not separable.
    NoFleetError
        No tiling of a length range with at most :math:`K` feasible pools.
    """
    if not problem.separable:
        raise ValueError("shortest_fleet needs a separable problem (no inventory, budget, power or fleet-SLO limits)")
    return _coupled_by_pool_count(problem)


_Best = tuple[float, int, float, tuple[int, ...]]
"""A partial fleet: objective, physical GPUs, last-tie weight (:meth:`FleetProblem.choice_last_tie`), choices."""


def _better(a: _Best, b: _Best | None, last: bool = True) -> bool:
    """``a`` before ``b`` lexicographically: less objective (beyond round-off, 1e-9 relative), then fewer GPUs,
    then (with ``last``) a smaller last-tie weight (beyond round-off)."""
    if b is None:
        return True
    tol = 1e-9 * max(1.0, abs(b[0]))
    if a[0] < b[0] - tol:
        return True
    if a[0] > b[0] + tol or a[1] != b[1]:
        return a[0] <= b[0] + tol and a[1] < b[1]
    return last and a[2] < b[2] - 1e-9 * max(1.0, abs(b[2]))


def _exact_hops(problem: FleetProblem, k: int, edges: dict[int, list]) -> dict[int, _Best]:
    """Commodity ``k``: for each pool count :math:`h \\le K`, the best path from its source to its sink with
    exactly :math:`h` pools, by dynamic programming over its nodes in increasing order (a pool's head node is
    above its tail node, so the node order is topological)."""
    assert problem.sources is not None and problem.sinks is not None   # filled by __post_init__
    first, last = problem.sources[k], problem.sinks[k]
    table: dict[int, dict[int, _Best]] = {first: {0: (0.0, 0, 0.0, ())}}
    for v in range(first, last):
        here = table.get(v)
        if not here:
            continue
        for head, w, gpus, t, c in edges.get(v, ()):
            there = table.setdefault(head, {})
            for h, (obj, n, tie, chosen) in here.items():
                if h < problem.max_pools:
                    cand = (obj + w, n + gpus, tie + t, chosen + (c,))
                    if _better(cand, there.get(h + 1)):
                        there[h + 1] = cand
    return {h: best for h, best in table.get(last, {}).items() if h > 0}


def _coupled_by_pool_count(problem: FleetProblem) -> tuple[float, tuple[int, ...]]:
    """Several commodities sharing only the pool count :math:`K`, exactly.

    Per commodity :math:`k` and pool count :math:`h`, :math:`d_k(h)` is the best path with exactly :math:`h`
    pools (:func:`_exact_hops`, by (objective, GPUs, last-tie weight)). The paths are otherwise independent, and
    the three add over commodities (a lexicographic order is kept by addition), so the optimum is

    .. math:: \\min_{h_1 + \\dots + h_C \\le K} \\sum_k d_k(h_k),

    a min-plus convolution over the commodities (:math:`D_k(H) = \\min_h D_{k-1}(H - h) + d_k(h)`), ties broken
    by fewest GPUs, then fewest pools :math:`H`, then the least last-tie weight: the MIP's tie-break."""
    assert problem.pool_from_node is not None and problem.pool_to_node is not None   # filled by __post_init__
    edges: dict[int, list] = {}
    for (i, j), (w, gpus, t, c) in sorted(_best_choice_per_segment(problem).items()):   # in node order
        edges.setdefault(i, []).append((j, w, gpus, t, c))
    total: dict[int, _Best] = {0: (0.0, 0, 0.0, ())}
    for k in range(problem.n_commodities):
        hops = _exact_hops(problem, k, edges)
        if not hops:
            what = "the length range" + (f" of commodity {k}" if problem.n_commodities > 1 else "")
            raise NoFleetError(f"no tiling of {what} with at most {problem.max_pools} feasible pools")
        nxt: dict[int, _Best] = {}
        for H, (obj, n, tie, chosen) in total.items():
            for h, (o2, n2, t2, c2) in hops.items():
                if H + h <= problem.max_pools:
                    cand = (obj + o2, n + n2, tie + t2, chosen + c2)
                    if _better(cand, nxt.get(H + h)):
                        nxt[H + h] = cand
        if not nxt:
            raise NoFleetError(f"no tiling of every commodity's length range with at most {problem.max_pools} "
                               "feasible pools in all")
        total = nxt
    best: tuple[_Best, int] | None = None
    for H in sorted(total):     # pools before the last-tie weight: a tie in objective and GPUs keeps the smaller H
        if best is None or _better(total[H], best[0], last=False):
            best = (total[H], H)
    assert best is not None
    return float(best[0][0]), tuple(sorted(best[0][3]))


def fleet_is_feasible(problem: FleetProblem, choices) -> bool:
    """Check every constraint family of the MIP in plain Python (path, counts, inventories, groups, caps)."""
    ch = np.asarray(list(choices), dtype=int)
    # filled by FleetProblem.__post_init__
    assert problem.pool_from_node is not None and problem.pool_to_node is not None
    assert problem.gpu_min_pools is not None and problem.gpu_max_pools is not None
    pools = problem.choice_pool[ch]
    if len(set(pools.tolist())) != len(pools) or len(ch) > problem.max_pools or len(ch) == 0:
        return False
    edges = dict(zip(problem.pool_from_node[pools].tolist(), problem.pool_to_node[pools].tolist()))
    if len(edges) != len(pools):
        return False
    assert problem.sources is not None and problem.sinks is not None
    steps = 0
    for first, last in zip(problem.sources, problem.sinks):     # one path per commodity, together every pool
        at, start = first, steps
        while at in edges and steps - start <= len(pools):
            at, steps = edges[at], steps + 1
        if at != last:
            return False
    if steps != len(pools):
        return False
    gpus = problem.choice_gpus[ch]
    n_options = len(problem.gpu_names)
    use = problem.gpu_use
    built = np.isin(use.choice, ch)     # the entries G_cg of the built choices: a pool counts on each option it uses
    used = np.bincount(use.option[built], weights=use.gpus[built], minlength=n_options)
    pools_on = np.bincount(use.option[built], minlength=n_options)
    for g, cap in enumerate(problem.gpu_max_gpus):
        if (cap is not None and used[g] > cap) or used[g] < problem.gpu_min_gpus[g]:
            return False
        high = problem.gpu_max_pools[g]
        if pools_on[g] < problem.gpu_min_pools[g] or (high is not None and pools_on[g] > high):
            return False
    for grp in problem.inventory_groups:
        shared = used[list(grp.options)].sum()
        if (grp.max_gpus is not None and shared > grp.max_gpus) or shared < grp.min_gpus:
            return False
    checks = ((problem.max_total_gpus, gpus.sum()), (problem.max_cost_per_hr, problem.choice_cost_per_hr[ch].sum()),
              (problem.max_power_w, problem.choice_power_w[ch].sum()),
              (problem.max_miss_rate, problem.choice_miss_rate[ch].sum()))
    return all(cap is None or value <= cap * (1 + 1e-9) + 1e-12 for cap, value in checks)


def _walk_fleets(problem: FleetProblem, visit, time_limit_s: float | None = None) -> None:
    """Call ``visit(path)`` (a list of choices, read it before returning) for every source-to-sink path of at most
    K pools x every choice per pool (with several commodities, every combination of one path per commodity, K pools
    in all), feasible or not; ``TimeoutError`` when ``time_limit_s`` runs out first."""
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    from_node, to_node = problem.pool_from_node, problem.pool_to_node
    assert from_node is not None and to_node is not None   # filled by FleetProblem.__post_init__
    leaving: dict[int, list[int]] = {}
    for c in range(problem.n_choices):
        leaving.setdefault(int(from_node[problem.choice_pool[c]]), []).append(c)
    path: list[int] = []
    sources, sinks = problem.sources, problem.sinks
    assert sources is not None and sinks is not None   # filled by FleetProblem.__post_init__

    def walk(node: int, k: int) -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutError(f"enumeration exceeded {time_limit_s} s")
        if node == sinks[k]:
            if k + 1 < len(sources):        # this commodity's path is complete: start the next one's
                walk(sources[k + 1], k + 1)
            else:
                visit(path)
            return
        if len(path) == problem.max_pools:
            return
        for c in leaving.get(node, ()):
            path.append(c)
            walk(int(to_node[problem.choice_pool[c]]), k)
            path.pop()

    walk(sources[0], 0)


def enumerate_fleets(problem: FleetProblem, time_limit_s: float | None = None) -> tuple[float, tuple[int, ...]] | None:
    """Brute force over every fleet (:func:`_walk_fleets`). For tests.

    Returns the optimum (objective, choices) or None when nothing is feasible; raises
    ``TimeoutError`` when ``time_limit_s`` runs out first.
    """
    w = problem.choice_objective()
    best: list = [None]

    def visit(path: list[int]) -> None:
        value = float(w[path].sum())
        if (best[0] is None or value < best[0][0] - 1e-12) and fleet_is_feasible(problem, path):
            best[0] = (value, tuple(sorted(path)))

    _walk_fleets(problem, visit, time_limit_s)
    return best[0]


def fleet_objectives(problem: FleetProblem) -> list[float]:
    """Every feasible fleet's objective, least first (brute force, :func:`_walk_fleets`): the reference of
    ``solve --top N``'s runners-up. For tests."""
    w = problem.choice_objective()
    out: list[float] = []
    _walk_fleets(problem, lambda path: out.append(float(w[path].sum())) if fleet_is_feasible(problem, path) else None)
    return sorted(out)
