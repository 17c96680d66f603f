"""The fleet MIP (Pyomo model, solved by HiGHS).

Sets
----
NODES     path nodes :math:`v` (a boundary, and with compress-and-route a compression state); source 0, or with
          several commodities :math:`k` (model classes) a source :math:`s_k` and a sink :math:`t_k` each, every
          commodity on its own range of nodes
POOLS     candidate pools :math:`p = (i_p, j_p, g_p)`, :math:`g_p` the primary GPU option
CHOICES   replica choices :math:`c` of the pools (:math:`p(c)` their pool)
GPUS      GPU options :math:`g`; choice :math:`c` takes :math:`G_{cg}` physical GPUs of option :math:`g`
          (:math:`\\sum_g G_{cg} = G_c`; by default all :math:`G_c` of :math:`g_{p(c)}`), and *uses* :math:`g`,
          :math:`c \\in C_g`, when :math:`G_{cg} > 0` (a prefill/decode pair uses two options)
GROUPS    inventory groups :math:`k`: options :math:`O_k` that share one physical inventory

Variables
---------
:math:`z_c \\in \\{0, 1\\}`: choice :math:`c` is built. Pool :math:`p` is used,
:math:`x_p = \\sum_{c \\in p} z_c`, with :math:`n_p = \\sum_{c \\in p} n_c z_c` replicas.

Objective
---------
:math:`\\min \\sum_c w_c z_c` with :math:`w_c` the choice's $/hr, kW or
$/hr + energy price x PUE x kW (:meth:`FleetProblem.choice_objective`).
The objective stays in $/hr or kW so coefficients are of order one.

Each constraint family is a ``*_rule`` below whose docstring is its math.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, NamedTuple

import numpy as np

from fleetopt.solvers.pyomo_env import Highs, NoReducedCostsError, pyo
from fleetopt.solvers.outcome import Outcome, Termination, outcome_of, relative_gap
from fleetopt.solvers.problem import FleetProblem
from fleetopt.solvers.result import Solution, SolveResult

__all__ = ["build_model", "solve", "SolveResult", "Solution", "lp_bound"]


# ---------------------------------------------------------------- model

def build_model(problem: FleetProblem) -> pyo.ConcreteModel:
    """The Pyomo model of ``problem`` (pure: no solver is called)."""
    m = pyo.ConcreteModel(name="fleet")
    m.problem = problem
    assert problem.n_nodes is not None     # FleetProblem.__post_init__ fills it
    m.NODES = pyo.RangeSet(0, problem.n_nodes - 1)
    m.POOLS = pyo.RangeSet(0, problem.n_pools - 1)
    m.CHOICES = pyo.RangeSet(0, problem.n_choices - 1)
    m.GPUS = pyo.RangeSet(0, len(problem.gpu_names) - 1)
    m.GROUPS = pyo.RangeSet(0, len(problem.inventory_groups) - 1)
    m.z = pyo.Var(m.CHOICES, within=pyo.Binary)
    _index(m, problem)
    m.tiling = pyo.Constraint(m.NODES, rule=tiling_rule)
    m.one_count = pyo.Constraint(m.POOLS, rule=one_count_rule)
    m.max_pools = pyo.Constraint(rule=max_pools_rule)
    m.gpu_inventory = pyo.Constraint(m.GPUS, rule=gpu_inventory_rule)
    m.gpu_minimum = pyo.Constraint(m.GPUS, rule=gpu_minimum_rule)
    m.gpu_pool_count = pyo.Constraint(m.GPUS, rule=gpu_pool_count_rule)
    m.inventory_group = pyo.Constraint(m.GROUPS, rule=inventory_group_rule)
    m.total_gpus = pyo.Constraint(rule=total_gpus_rule)
    m.budget = pyo.Constraint(rule=budget_rule)
    m.power_cap = pyo.Constraint(rule=power_cap_rule)
    m.fleet_slo = pyo.Constraint(rule=fleet_slo_rule)
    weights = problem.choice_objective()
    # Pyomo's inferred types: an indexed Var's item does not multiply, a RangeSet does not iterate
    m.objective = pyo.Objective(expr=pyo.quicksum(float(weights[c]) * m.z[c]  # pyright: ignore[reportOperatorIssue]
                                                  for c in m.CHOICES))  # pyright: ignore[reportGeneralTypeIssues]
    m.cuts = pyo.ConstraintList()
    return m


def _index(m, problem: FleetProblem) -> None:
    """Precomputed index lists so every rule is a single sparse sum."""
    cp = problem.choice_pool
    # FleetProblem.__post_init__ fills the node arrays
    assert problem.pool_from_node is not None and problem.pool_to_node is not None and problem.n_nodes is not None
    starts = problem.pool_from_node[cp]
    ends = problem.pool_to_node[cp]
    m._leaving = [np.flatnonzero(starts == v) for v in range(problem.n_nodes)]
    m._entering = [np.flatnonzero(ends == v) for v in range(problem.n_nodes)]
    order = np.argsort(cp, kind="stable")
    bounds = np.searchsorted(cp[order], np.arange(problem.n_pools + 1))
    m._of_pool = [order[bounds[p]:bounds[p + 1]] for p in range(problem.n_pools)]
    # per option g: the choices C_g that use it and their G_cg
    m._of_gpu = problem.gpu_use_by_option
    m._of_group = [_group_use(problem, grp.options) for grp in problem.inventory_groups]
    m._sources, m._sinks = frozenset(problem.sources or ()), frozenset(problem.sinks or ())


def _group_use(problem: FleetProblem, options) -> tuple[np.ndarray, np.ndarray]:
    """The choices that use any of ``options`` and their GPUs summed over those options."""
    use = problem.gpu_use
    mine = np.isin(use.option, np.asarray(options))
    choices, at = np.unique(use.choice[mine], return_inverse=True)
    return choices, np.bincount(at, weights=use.gpus[mine], minlength=len(choices)).astype(np.int64)


def tiling_rule(m, k):
    """Chosen pools tile :math:`(b_0, b_M]` exactly once: one path from the source to the sink.

    .. math::

        \\sum_{c:\\, \\mathrm{tail}(p(c)) = v} z_c - \\sum_{c:\\, \\mathrm{head}(p(c)) = v} z_c =
        \\begin{cases} 1 & v = \\text{source} \\\\ -1 & v = \\text{sink} \\\\ 0 & \\text{otherwise} \\end{cases}
        \\qquad \\forall v \\in \\mathrm{NODES}

    With compress-and-route a node also carries the compression factor of the
    pool that ends there, so consecutive pools agree on who serves the band.

    With several commodities (``FleetProblem.sources``/``sinks``: the model classes of semantic routing) the
    right-hand side is 1 at every source :math:`s_k` and -1 at every sink :math:`t_k`: no pool joins two
    commodities' node ranges, so the rows split into one path per commodity, each tiling its class's lengths
    once with its own pools (a multi-commodity path on disjoint graphs, coupled only by the shared rows below).
    """
    rhs = 1 if k in m._sources else (-1 if k in m._sinks else 0)
    out = pyo.quicksum(m.z[int(c)] for c in m._leaving[k])
    inn = pyo.quicksum(m.z[int(c)] for c in m._entering[k])
    if len(m._leaving[k]) == 0 and len(m._entering[k]) == 0:
        return pyo.Constraint.Feasible if rhs == 0 else pyo.Constraint.Infeasible
    return out - inn == rhs


def one_count_rule(m, p):
    """A pool is built with at most one replica count: :math:`x_p = \\sum_{c \\in p} z_c \\le 1`."""
    idx = m._of_pool[p]
    if len(idx) <= 1:
        return pyo.Constraint.Skip
    return _le(pyo.quicksum(m.z[int(c)] for c in idx), 1)


def max_pools_rule(m):
    """At most :math:`K` pools over all commodities: :math:`\\sum_c z_c \\le K`."""
    if m.problem.max_pools >= m.problem.max_path_pools:  # a path never has more pools than segments
        return pyo.Constraint.Skip
    return _le(pyo.quicksum(m.z[c] for c in m.CHOICES), m.problem.max_pools)


def _le(lhs, rhs):
    """``lhs <= rhs``, or Feasible/Infeasible when ``lhs`` has no variable (an empty sum)."""
    if isinstance(lhs, (int, float)):
        return pyo.Constraint.Feasible if lhs <= rhs else pyo.Constraint.Infeasible
    return lhs <= rhs


def _ge(lhs, rhs):
    if isinstance(lhs, (int, float)):
        return pyo.Constraint.Feasible if lhs >= rhs else pyo.Constraint.Infeasible
    return lhs >= rhs


def _gpus(m, idx, gpus):
    """:math:`\\sum_{e} G_e z_{c_e}` over choices ``idx`` taking ``gpus`` GPUs each."""
    return pyo.quicksum(int(n) * m.z[int(c)] for c, n in zip(idx, gpus))


def _between(expr, low, high):
    """``low <= expr <= high`` (``high`` None: no upper bound), or Feasible/Infeasible for an empty sum or
    crossed bounds."""
    if high is not None and low > high:
        return pyo.Constraint.Infeasible
    if isinstance(expr, (int, float)):
        ok = expr >= low and (high is None or expr <= high)
        return pyo.Constraint.Feasible if ok else pyo.Constraint.Infeasible
    return (low, expr, high)


def gpu_inventory_rule(m, g):
    """Inventory of GPU option :math:`g` in physical GPUs: :math:`\\sum_{c \\in C_g} G_{cg} z_c \\le \\bar G_g`."""
    cap = m.problem.gpu_max_gpus[g]
    if cap is None:
        return pyo.Constraint.Skip
    return _le(_gpus(m, *m._of_gpu[g]), cap)


def gpu_minimum_rule(m, g):
    """Committed GPUs of option :math:`g`: :math:`\\sum_{c \\in C_g} G_{cg} z_c \\ge \\underline G_g`."""
    low = m.problem.gpu_min_gpus[g]
    if not low:
        return pyo.Constraint.Skip
    return _ge(_gpus(m, *m._of_gpu[g]), low)


def gpu_pool_count_rule(m, g):
    """Pools per GPU option: :math:`\\underline K_g \\le \\sum_{c \\in C_g} z_c \\le \\bar K_g`.

    A pool counts once toward every option it uses: a prefill/decode pair on A100 prefill and H100 decode
    is one A100 pool and one H100 pool (and one pool toward :math:`K`).
    """
    low, high = m.problem.gpu_min_pools[g], m.problem.gpu_max_pools[g]
    if not low and high is None:
        return pyo.Constraint.Skip
    return _between(pyo.quicksum(m.z[int(c)] for c in m._of_gpu[g][0]), low, high)


def inventory_group_rule(m, k):
    """Options sharing one physical inventory (the TP/dtype configurations of one hardware entry):

    .. math:: \\underline G_k \\le \\sum_c \\Bigl(\\sum_{g \\in O_k} G_{cg}\\Bigr) z_c \\le \\bar G_k
    """
    grp = m.problem.inventory_groups[k]
    if grp.max_gpus is None and not grp.min_gpus:
        return pyo.Constraint.Skip
    return _between(_gpus(m, *m._of_group[k]), grp.min_gpus, grp.max_gpus)


def total_gpus_rule(m):
    """Fleet size: :math:`\\sum_c G_c z_c \\le G_{max}`."""
    cap = m.problem.max_total_gpus
    return pyo.Constraint.Skip if cap is None else _le(_gpus(m, range(m.problem.n_choices), m.problem.choice_gpus), cap)


def budget_rule(m):
    """Budget: :math:`\\sum_c \\kappa_c z_c \\le \\$_{max}` ($/hr)."""
    cap = m.problem.max_cost_per_hr
    cost = m.problem.choice_cost_per_hr
    return pyo.Constraint.Skip if cap is None else _le(pyo.quicksum(float(cost[c]) * m.z[c] for c in m.CHOICES), cap)


def power_cap_rule(m):
    """Power cap: :math:`\\sum_c \\pi_c z_c \\le P_{max}` (kW, with :math:`\\pi_c` in kW)."""
    cap = m.problem.max_power_w
    pw = m.problem.choice_power_w
    if cap is None:
        return pyo.Constraint.Skip
    return _le(pyo.quicksum(float(pw[c]) / 1000.0 * m.z[c] for c in m.CHOICES), cap / 1000.0)


def fleet_slo_rule(m):
    """Fleet-scope SLO: requests missing the TTFT SLO stay within 1 % of all:
    :math:`\\sum_c m_c z_c \\le 0.01 \\Lambda`.
    """
    cap = m.problem.max_miss_rate
    miss = m.problem.choice_miss_rate
    if cap is None:
        return pyo.Constraint.Skip
    return _le(pyo.quicksum(float(miss[c]) * m.z[c] for c in m.CHOICES), cap)


def add_no_good_cut(m, chosen: tuple[int, ...]) -> None:
    """Exclude one fleet: :math:`\\sum_{c \\in S} (1 - z_c) + \\sum_{c \\notin S} z_c \\ge 1`."""
    s = set(chosen)
    m.cuts.add(pyo.quicksum(1 - m.z[c] for c in s) + pyo.quicksum(m.z[c] for c in m.CHOICES if c not in s) >= 1)


# ---------------------------------------------------------------- solve

def _highs(time_limit_s: float | None, mip_gap: float, threads: int | None, verbose: bool, presolve: str = "off"):
    # Presolve is off for the path MIP: on a path network plus a few knapsack rows HiGHS's probing
    # costs several times the branch-and-bound it saves (0.39 s of 0.67 s on the stress benchmark).
    # The split-routing MIP (continuous flows) gains from it and turns it on.
    # The time limit and solve_relaxation are always set (inf: none; False: the MIP): Pyomo's HiGHS interface is
    # persistent and keeps the last value it was given, so a re-solve would inherit the tie-break's budget or the
    # root relaxation's solve_relaxation.
    opts = {"tee": verbose, "rel_gap": mip_gap, "load_solutions": False,
            "raise_exception_on_nonoptimal_result": False,
            "solver_options": {"presolve": presolve, "solve_relaxation": False},
            "time_limit": math.inf if time_limit_s is None else time_limit_s}
    if threads is not None:
        opts["threads"] = threads
    return Highs(), opts


_HIGHS_LOCK = threading.Lock()
"""HiGHS solves in one process run one at a time: Pyomo's HiGHS interface captures the process's stdout and stderr
file descriptors around each solve, and two threads doing so at once (a Dask worker with several threads) break
each other's capture ("TeeStream: deadlock observed"). Processes, the way to solve in parallel, are unaffected."""


_SCHEDULER_THREADS: list = []
"""The ``threads`` of this process's last HiGHS solve, as a one-element list (empty before the first)."""


def _highs_solve(solver, m, opts):
    with _HIGHS_LOCK:
        threads = opts.get("threads")
        if _SCHEDULER_THREADS and _SCHEDULER_THREADS[0] != threads:
            # HiGHS starts one thread pool per process on its first solve and refuses a later solve that asks
            # for another size (it ends "unknown", without a solution): start a new pool for the new size.
            import highspy  # loaded by Pyomo's HiGHS interface already; imported here only to reach the pool

            highspy.Highs.resetGlobalScheduler(True)
        _SCHEDULER_THREADS[:] = [threads]
        return solver.solve(m, **opts)


def _solve_once(m, solver, opts) -> tuple[Outcome, tuple[int, ...]]:
    """One HiGHS solve of ``m``: its :class:`~fleetopt.solvers.outcome.Outcome` and the chosen choices (if any)."""
    res = _highs_solve(solver, m, opts)
    out = outcome_of(res)
    chosen = ()
    if out.has_solution:
        res.solution_loader.load_vars()     # pyo.value raises on an unset value: it never returns None here
        chosen = tuple(int(c) for c in m.CHOICES if pyo.value(m.z[c]) > 0.5)  # pyright: ignore[reportOptionalOperand]
    return out, chosen


def solve(problem: FleetProblem, *, top: int = 1, time_limit_s: float | None = None, mip_gap: float = 0.0,
          threads: int | None = None, verbose: bool = False, tie_break: bool = True,
          relaxation: bool = False) -> SolveResult:
    """Solve the fleet MIP with HiGHS; with ``top > 1`` return up to ``top`` distinct fleets (no-good cuts).

    The model's LP relaxation is solved first (:func:`_relaxed`); when its optimum is a fleet
    (:func:`_integral_optimum`), that fleet is optimal and no branch and bound runs (HiGHS's own MIP search would
    start from that same root). With ``relaxation`` and a solution, ``lp_bound`` is the relaxation's objective
    (:func:`lp_bound`).

    With ``tie_break`` and a proven optimum, ties are broken lexicographically: among fleets within 1e-9 of the
    optimum, fewest physical GPUs, then fewest pools, then least power (least cost under a power objective)
    (:func:`_tie_break`). ``termination`` is that of the first solve; a limit with an incumbent returns the
    incumbent (a result, not an error).
    """
    t0 = time.perf_counter()
    m = build_model(problem)
    solver, opts = _highs(time_limit_s, mip_gap, threads, verbose)
    name = f"highs {'.'.join(map(str, solver.version()))}"
    options = {"time_limit_s": time_limit_s, "mip_gap": mip_gap, "threads": threads, "top": top}
    weights = problem.choice_objective()
    root = _relaxed(m, solver, opts)
    chosen = _integral_optimum(problem, root, weights)
    if chosen is not None:      # the relaxation's optimum is a fleet: optimal, no branch and bound needed
        value = float(weights[list(chosen)].sum())
        out = Outcome(Termination.OPTIMAL, root.condition, True, value, root.objective,
                      relative_gap(value, root.objective))
    else:
        out, chosen = _solve_once(m, solver, opts)
    if not out.has_solution:
        return SolveResult(out.termination, (), None, None, time.perf_counter() - t0, name, options,
                           out.condition, condition=out.condition)
    tie = "skipped"
    if tie_break and out.termination is Termination.OPTIMAL:
        budget = max(0.5, time.perf_counter() - t0)
        if time_limit_s is not None:
            budget = max(0.05, min(budget, time_limit_s - (time.perf_counter() - t0)))
        free = _could_be_optimal(root, float(weights[list(chosen)].sum()))
        chosen, proven = _tie_break(problem, opts, chosen, weights, budget, free)
        tie = "proven" if proven else "best-effort"
    solutions = [Solution(chosen, float(weights[list(chosen)].sum()))]
    while len(solutions) < top:
        add_no_good_cut(m, solutions[-1].choices)
        nxt_out, nxt = _solve_once(m, solver, opts)
        if not nxt_out.has_solution:
            break
        solutions.append(Solution(nxt, float(weights[list(nxt)].sum())))
    return SolveResult(out.termination, tuple(solutions), out.bound, out.rel_gap, time.perf_counter() - t0, name,
                       options, tie_break=tie, condition=out.condition,
                       lp_bound=root.objective if relaxation else None)


def _tie_break(problem, opts, chosen, weights, budget_s: float, free: np.ndarray | None = None):
    r"""Among primary-optimal fleets, fewest physical GPUs, then fewest pools, then the least last-tie weight
    :math:`v_c` (:meth:`~fleetopt.solvers.problem.FleetProblem.choice_last_tie`: kW under a cost objective, $/hr
    under a power one), in one solve:

    .. math:: \min \sum_c \Bigl((K + 1) G_c + 1 + \frac{v_c}{V}\Bigr) z_c \quad \text{s.t.} \quad
              \sum_c w_c z_c \le w^* (1 + 10^{-9}), \qquad V = 2 K \max_c v_c.

    Pools number at most :math:`K`, so the integer weights order GPUs before pools exactly, and a fleet's
    :math:`\sum v_c / V \le 1/2` orders the fleets equal in both by :math:`\sum v_c` without reaching the next
    integer. Without the last criterion the fleet reported among those equal in objective, GPUs and pools was
    whichever HiGHS met first (on the stress instance, 50.41 kW of two 576 $/hr fleets, the other 50.29 kW). The
    solve gets ``budget_s``; any incumbent it returns is still primary-optimal, so a timeout only leaves the
    tie-break unproven. Returns the choices and whether the tie-break was proven.

    The solve is over the choices ``free`` marks (a boolean per choice, :func:`_could_be_optimal`: those that may
    be in a primary-optimal fleet) and the chosen ones, on a model of their own
    (:meth:`~fleetopt.solvers.problem.FleetProblem.with_choices`): every other choice is in no fleet the
    constraint admits. On the stress instance 100 of 3,076 choices stay and the tie-break takes 0.025 s instead of
    0.075 s (a model of 100 choices built and solved, against the whole model's update and solve).
    """
    best = float(weights[list(chosen)].sum())
    keep = np.ones(len(weights), dtype=bool) if free is None else free.copy()
    keep[list(chosen)] = True
    kept = np.flatnonzero(keep)
    last = problem.choice_last_tie()
    scale = 2.0 * problem.max_pools * float(last.max(initial=0.0))
    coef = (problem.max_pools + 1) * problem.choice_gpus.astype(float) + 1.0 + (last / scale if scale > 0 else 0.0)
    m: Any = build_model(problem.with_choices(kept))   # (its components typed as Pyomo's base Component)
    m.objective.deactivate()
    m.fix_primary = pyo.Constraint(expr=m.objective.expr <= best + 1e-9 * max(1.0, abs(best)))
    m.tie = pyo.Objective(expr=pyo.quicksum(float(coef[c]) * m.z[k]  # pyright: ignore[reportOperatorIssue]
                                            for k, c in enumerate(kept.tolist())))
    out, cand = _solve_once(m, Highs(), dict(opts, time_limit=budget_s))
    if out.has_solution:
        cand = tuple(int(kept[k]) for k in cand)
        if float(coef[list(cand)].sum()) <= float(coef[list(chosen)].sum()):
            chosen = cand
    return chosen, out.termination is Termination.OPTIMAL


class _Relaxation(NamedTuple):
    """The LP relaxation of a model: its optimum, the choices' values and reduced costs there (all None unless
    HiGHS proved it optimal; the reduced costs None without a dual solution) and the solver's own word."""

    objective: float | None
    values: np.ndarray | None
    reduced_costs: np.ndarray | None
    condition: str = ""


INTEGRALITY_TOL = 1e-6
"""How far from 0 or 1 a relaxation's value may lie and still be read as that integer (:func:`_integral_optimum`,
which then checks the rounded fleet exactly)."""


def _integral_optimum(problem: FleetProblem, root: _Relaxation, weights: np.ndarray) -> tuple[int, ...] | None:
    r"""The relaxation's optimum as a fleet, when it is one: every :math:`z_c` within :data:`INTEGRALITY_TOL` of
    0 or 1, the rounded fleet meeting every constraint (:func:`fleetopt.solvers.oracle.fleet_is_feasible`, in
    plain arithmetic: HiGHS's feasibility tolerance is not relied on) and its objective within :math:`10^{-9}` of
    the relaxation's. The relaxation bounds every fleet from below, so that fleet is optimal. None otherwise.

    The fleet MIP is a path network with a few knapsack rows, and its relaxation is often integral: every bundled
    instance solved by the MIP (stress: 3,076 choices, the relaxation 0.005 s where branch and bound took 0.05 s;
    large: 9,190 choices, 0.1 s saved)."""
    from fleetopt.solvers.oracle import fleet_is_feasible

    if root.objective is None or root.values is None:
        return None
    z = root.values
    if np.any(np.minimum(np.abs(z), np.abs(1.0 - z)) > INTEGRALITY_TOL):
        return None
    chosen = tuple(np.flatnonzero(z > 0.5).tolist())
    if not chosen or not fleet_is_feasible(problem, chosen):
        return None
    if float(weights[list(chosen)].sum()) > root.objective + 1e-9 * max(1.0, abs(root.objective)):
        return None
    return chosen


RC_MARGIN = 1e-6
"""Share of the optimum (of 1 where it is smaller) by which a choice's reduced-cost bound must exceed the optimum
before :func:`_could_be_optimal` rules the choice out: ten times HiGHS's default primal and dual feasibility
tolerances (1e-7), against which the bound is computed. On the bundled instances a reduced cost is either 0 (to
1e-12) or at least 0.02 $/hr, so the margin decides nothing there."""


def _could_be_optimal(root: _Relaxation, best: float) -> np.ndarray | None:
    r"""The choices that may be in a fleet of objective :math:`w^*` (``best``), by reduced-cost fixing.

    With the LP relaxation's optimum :math:`w_{LP}` and reduced costs :math:`d_c` (duals :math:`y`,
    :math:`d = w - A^\top y`), every integer-feasible fleet has :math:`w^\top z \ge w_{LP} + \sum_{d_c > 0} d_c
    z_c + \sum_{d_c < 0} |d_c| (1 - z_c)`, so a choice with :math:`w_{LP} + d_c > w^*` is in no fleet of objective
    :math:`w^*` (Nemhauser and Wolsey, *Integer and Combinatorial Optimization*, 1988, II.6.1). A choice is ruled
    out when that bound exceeds :math:`w^*` by more than :data:`RC_MARGIN`. None (every choice may) without a
    proven relaxation."""
    if root.objective is None or root.reduced_costs is None:
        return None
    margin = RC_MARGIN * max(1.0, abs(best))
    return root.objective + root.reduced_costs <= best + margin


def lp_bound(problem: FleetProblem) -> float | None:
    """Objective of the LP relaxation (the root bound before cuts): :math:`z_c \\in [0, 1]` for every choice, the
    rest of the model as built (HiGHS's ``solve_relaxation``; ``solve(..., relaxation=True)`` gives the same number
    from the model of its MIP solve)."""
    m = build_model(problem)
    solver, opts = _highs(None, 0.0, None, False)
    return _relaxed(m, solver, opts).objective


def _relaxed(m, solver, opts) -> _Relaxation:
    """The LP relaxation of the model ``solver`` holds (HiGHS's ``solve_relaxation``): its optimum, values and
    reduced costs, None unless HiGHS proves it optimal (a limit's incumbent bounds the LP's optimum from above,
    not below)."""
    res = _highs_solve(solver, m, dict(opts, solver_options=dict(opts["solver_options"], solve_relaxation=True)))
    out = outcome_of(res)
    if out.termination is not Termination.OPTIMAL:
        return _Relaxation(None, None, None, out.condition)
    res.solution_loader.load_vars()
    values = np.array([pyo.value(m.z[c]) for c in m.CHOICES], dtype=float)
    try:
        rc = res.solution_loader.get_reduced_costs()
    except NoReducedCostsError:     # HiGHS kept no dual solution: the optimum and values alone
        return _Relaxation(out.objective, values, None, out.condition)
    return _Relaxation(out.objective, values, np.array([rc[m.z[c]] for c in m.CHOICES], dtype=float), out.condition)
