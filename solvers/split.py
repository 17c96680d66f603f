"""Split routing: a weighted router divides each elementary segment's traffic between pools.

Sets
----
SEGMENTS  elementary segments :math:`k` (between consecutive boundaries), rate :math:`\\lambda_k`
POOLS     candidate pools :math:`p` (range :math:`(b_{i_p}, b_{j_p}]`, window :math:`b_{j_p}`, GPU option)
CHOICES   replica counts :math:`c` of the pools (:math:`n_c` replicas, GPUs, cost)
LINKS     pairs :math:`(k, p)` with :math:`i_p \\le k < j_p`: pool :math:`p` may serve segment :math:`k`

Variables
---------
:math:`z_c \\in \\{0,1\\}` (count :math:`c` built), :math:`g_{lc} \\ge 0` (req/s of link :math:`l = (k, p)`
routed to pool :math:`p` built with count :math:`c`; :math:`f_{kp} = \\sum_c g_{lc}`), :math:`\\pi_c \\ge 0`
(pool power, kW).

The SLO link between a pool's routed traffic and its replicas is one *operating point* per count
(:math:`A_c` Erlangs, residual :math:`R_p`), taken from the exact Erlang-C capacity curve at the
pool's nominal mix. Because :math:`C(c, a)` grows and :math:`\\theta = 2(c - a)/R` shrinks with the
load :math:`a` and the residual :math:`R = E[S^2]/E[S]`, the linear constraints below imply the
exact model's SLO for whatever mix the router sends (conservative); at the nominal mix and the
length-routing count they are tight, so split routing is never dearer than length routing.
That argument holds for the slot models; under the batched model the capacities are also bounded at the
nominal mix and the solve adds cuts (``SplitProblem.slo_cuts``, :func:`slo_cut_rule`) where a decoded plan's
pool does not carry its routed mix.
Power is over-estimated by a secant raised by its largest deviation (``power_error_w``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetopt.solvers.mip import Solution, SolveResult, _highs, _solve_once
from fleetopt.solvers.pyomo_env import pyo

__all__ = ["SplitProblem", "build_split_model", "slo_cut_rule", "solve_split"]


@dataclass(frozen=True, eq=False)
class SplitProblem:
    """Arrays of the split-routing MIP (see the module docstring for the symbols).

    ``link_*`` arrays have one entry per (segment, pool) link; ``slo_coef[c]`` holds, for choice
    ``c``, the SLO coefficient of each link of its pool (same order as ``links_of_pool``).
    """

    segment_rate: np.ndarray
    pool_gpu: np.ndarray
    gpu_names: tuple[str, ...]
    link_segment: np.ndarray
    link_pool: np.ndarray
    link_load: np.ndarray          # m1_kp: Erlangs per (req/s)
    link_residual: np.ndarray      # m2_kp - R_p m1_kp
    choice_pool: np.ndarray
    choice_replicas: np.ndarray
    choice_gpus: np.ndarray
    choice_cost_per_hr: np.ndarray
    choice_capacity: np.ndarray    # A_c (Erlangs)
    choice_power_base_w: np.ndarray
    choice_power_slope_w: np.ndarray  # W per Erlang
    slo_coef: tuple[np.ndarray, ...]
    max_pools: int
    gpu_max_gpus: tuple[int | None, ...]
    gpu_min_gpus: tuple[int, ...]
    max_total_gpus: int | None = None
    max_cost_per_hr: float | None = None
    max_power_w: float | None = None
    objective: str = "cost"
    energy_usd_per_kwh: float = 0.0
    pue: float = 1.0
    power_error_w: float = 0.0
    slo_cuts: tuple[tuple[int, np.ndarray], ...] = ()
    """Cuts from the exact re-evaluation (:func:`slo_cut_rule`): ``(c, w)`` adds
    :math:`\\sum_l w_l g_{lc} \\le z_c` to choice ``c``, ``w`` over its pool's links (order of ``links_of_pool``)."""

    @property
    def links_of_pool(self) -> list[np.ndarray]:
        order = np.argsort(self.link_pool, kind="stable")
        bounds = np.searchsorted(self.link_pool[order], np.arange(len(self.pool_gpu) + 1))
        return [order[bounds[p]:bounds[p + 1]] for p in range(len(self.pool_gpu))]


def build_split_model(problem: SplitProblem) -> pyo.ConcreteModel:
    """The split-routing MIP in disaggregated form: traffic is routed to a pool's *count* :math:`c`.

    Variables :math:`g_{lc} \\ge 0` carry the rate of link :math:`l = (k, p)` when pool :math:`p` is
    built with count :math:`c`; :math:`f_{kp} = \\sum_{c \\in p} g_{lc}`. Each count's rows hold
    only its own flow, so no big-M is needed and every count's disjunction is described by its
    convex hull (a tight LP relaxation).
    """
    m = pyo.ConcreteModel(name="split-fleet")
    m.problem = problem
    P = len(problem.pool_gpu)
    links_of_pool = problem.links_of_pool
    order = np.argsort(problem.choice_pool, kind="stable")
    bounds = np.searchsorted(problem.choice_pool[order], np.arange(P + 1))
    m._choices = [order[bounds[p]:bounds[p + 1]] for p in range(P)]
    pairs = [(int(l), int(c)) for p in range(P) for c in m._choices[p] for l in links_of_pool[p]]
    m._flows_of_choice = {}
    m._flows_of_segment = {}
    for n, (l, c) in enumerate(pairs):
        m._flows_of_choice.setdefault(c, []).append(n)
        m._flows_of_segment.setdefault(int(problem.link_segment[l]), []).append(n)
    m._pairs = pairs
    m._pos_in_pool = {int(l): k for p in range(P) for k, l in enumerate(links_of_pool[p])}
    m.SEGMENTS = pyo.RangeSet(0, len(problem.segment_rate) - 1)
    m.POOLS = pyo.RangeSet(0, P - 1)
    m.CHOICES = pyo.RangeSet(0, len(problem.choice_pool) - 1)
    m.FLOWS = pyo.RangeSet(0, len(pairs) - 1)
    m.GPUS = pyo.RangeSet(0, len(problem.gpu_names) - 1)
    m.z = pyo.Var(m.CHOICES, within=pyo.Binary)
    m.g = pyo.Var(m.FLOWS, within=pyo.NonNegativeReals)
    m.power_kw = pyo.Var(m.CHOICES, within=pyo.NonNegativeReals)
    gpu_of_choice = problem.pool_gpu[problem.choice_pool]
    m._of_gpu = [np.flatnonzero(gpu_of_choice == g) for g in range(len(problem.gpu_names))]
    m.coverage = pyo.Constraint(m.SEGMENTS, rule=coverage_rule)
    m.one_count = pyo.Constraint(m.POOLS, rule=one_count_rule)
    m.activation = pyo.Constraint(m.FLOWS, rule=activation_rule)
    m.offered_load = pyo.Constraint(m.CHOICES, rule=load_rule)
    m.residual = pyo.Constraint(m.CHOICES, rule=residual_rule)
    m.slo = pyo.Constraint(m.CHOICES, rule=slo_rule)
    m.power = pyo.Constraint(m.CHOICES, rule=power_rule)
    m.max_pools = pyo.Constraint(rule=lambda m: pyo.quicksum(m.z[c] for c in m.CHOICES) <= m.problem.max_pools)
    m.gpu_inventory = pyo.Constraint(m.GPUS, rule=gpu_inventory_rule)
    m.caps = pyo.ConstraintList()
    _caps(m)
    m.slo_cuts = pyo.ConstraintList()
    _slo_cuts(m)
    # Pyomo's inferred types: an indexed Var's item does not multiply, a RangeSet does not iterate
    cost = pyo.quicksum(float(problem.choice_cost_per_hr[c]) * m.z[c]  # pyright: ignore[reportOperatorIssue]
                        for c in m.CHOICES)  # pyright: ignore[reportGeneralTypeIssues]
    power = pyo.quicksum(m.power_kw[c] for c in m.CHOICES)  # pyright: ignore[reportGeneralTypeIssues]
    if problem.objective == "cost":
        m.objective = pyo.Objective(expr=cost + 1e-7 * power)  # power breaks ties only
    elif problem.objective in ("power", "tok_per_watt"):
        m.objective = pyo.Objective(expr=power)
    else:
        m.objective = pyo.Objective(expr=cost + problem.energy_usd_per_kwh * problem.pue * power)
    m.cuts = pyo.ConstraintList()
    return m


def _flow_sum(m, c, weights=None):
    flows = m._flows_of_choice.get(int(c), [])
    if weights is None:
        return pyo.quicksum(m.g[n] for n in flows), flows
    return pyo.quicksum(float(weights[m._pairs[n][0]]) * m.g[n] for n in flows), flows


def coverage_rule(m, k):
    """Every request is routed: :math:`\\sum_{(l, c):\\, \\mathrm{seg}(l) = k} g_{lc} = \\lambda_k`."""
    flows = m._flows_of_segment.get(int(k), [])
    rate = float(m.problem.segment_rate[k])
    if not flows:
        return pyo.Constraint.Feasible if rate <= 0 else pyo.Constraint.Infeasible
    return pyo.quicksum(m.g[n] for n in flows) == rate


def one_count_rule(m, p):
    """At most one replica count per pool: :math:`x_p = \\sum_{c \\in p} z_c \\le 1`."""
    idx = m._choices[p]
    if len(idx) <= 1:
        return pyo.Constraint.Skip
    return pyo.quicksum(m.z[int(c)] for c in idx) <= 1


def activation_rule(m, n):
    """Only the built count carries traffic: :math:`g_{lc} \\le \\lambda_{\\mathrm{seg}(l)} z_c`."""
    l, c = m._pairs[n]
    return m.g[n] <= float(m.problem.segment_rate[m.problem.link_segment[l]]) * m.z[c]


def load_rule(m, c):
    """Offered load within the count's operating point: :math:`\\sum_l m_{1,l} g_{lc} \\le A_c z_c`."""
    expr, flows = _flow_sum(m, c, m.problem.link_load)
    if not flows:
        return pyo.Constraint.Skip
    return expr <= float(m.problem.choice_capacity[c]) * m.z[c]


def residual_rule(m, c):
    """The routed mix is no heavier than the nominal one: :math:`\\sum_l (m_{2,l} - R_p m_{1,l}) g_{lc} \\le 0`."""
    expr, flows = _flow_sum(m, c, m.problem.link_residual)
    return pyo.Constraint.Skip if not flows else expr <= 0


def slo_rule(m, c):
    """P99 TTFT at the count's operating point, linear in the routed rates:

    .. math:: \\sum_l \\sigma_{lc} \\, g_{lc} \\le 0

    with :math:`\\sigma_{lc} = P(W + T_{pf,k} > T_{SLO} \\mid C_c, \\theta_c) - 0.01` (tail model) or
    :math:`\\sigma_{lc} = E[T_{pf,k}] + W_{99,c} - T_{SLO}` (mean-prefill model), :math:`k = \\mathrm{seg}(l)`.
    """
    flows = m._flows_of_choice.get(int(c), [])
    if not flows:
        return pyo.Constraint.Skip
    coef = m.problem.slo_coef[c]
    return pyo.quicksum(float(coef[m._pos_in_pool[m._pairs[n][0]]]) * m.g[n] for n in flows) <= 0


def slo_cut_rule(m, c, weights):
    """A cut from the exact re-evaluation of choice :math:`c`'s SLO (``SplitProblem.slo_cuts``):

    .. math:: \\sum_l w_l \\, g_{lc} \\le z_c

    :math:`w` is the gradient of the gauge of the set of routed rate vectors that :math:`n_c` replicas carry
    under the instance's TTFT model, at a mix they do not carry
    (:func:`fleetopt.optimizer.plan.split_candidates.slo_cut`)."""
    flows = m._flows_of_choice.get(int(c), [])
    return pyo.quicksum(float(weights[m._pos_in_pool[m._pairs[n][0]]]) * m.g[n] for n in flows) <= m.z[c]


def power_rule(m, c):
    """Pool power over-estimate at count :math:`c` (kW):
    :math:`\\pi_c \\ge \\beta_c z_c + s_c \\sum_l m_{1,l} g_{lc}`."""
    pr = m.problem
    expr, _ = _flow_sum(m, c, pr.link_load)
    return (m.power_kw[c] >= float(pr.choice_power_base_w[c]) / 1000.0 * m.z[c]
            + float(pr.choice_power_slope_w[c]) / 1000.0 * expr)


def gpu_inventory_rule(m, g):
    """Inventory and committed GPUs of option :math:`g` (physical GPUs)."""
    pr = m.problem
    expr = pyo.quicksum(int(pr.choice_gpus[c]) * m.z[int(c)] for c in m._of_gpu[g])
    low, high = pr.gpu_min_gpus[g], pr.gpu_max_gpus[g]
    if isinstance(expr, (int, float)):
        within = expr >= low and (high is None or expr <= high)
        return pyo.Constraint.Feasible if within else pyo.Constraint.Infeasible
    if not low and high is None:
        return pyo.Constraint.Skip
    return (low or None, expr, high)


def _slo_cuts(m) -> None:
    """Every cut of ``problem.slo_cuts`` (:func:`slo_cut_rule`) into ``m.slo_cuts``."""
    for c, weights in m.problem.slo_cuts:
        m.slo_cuts.add(slo_cut_rule(m, int(c), weights))


def _caps(m) -> None:
    """Fleet-wide caps: GPUs, budget ($/hr) and power (kW)."""
    pr = m.problem
    if pr.max_total_gpus is not None:
        m.caps.add(pyo.quicksum(int(pr.choice_gpus[c]) * m.z[c] for c in m.CHOICES) <= pr.max_total_gpus)
    if pr.max_cost_per_hr is not None:
        m.caps.add(pyo.quicksum(float(pr.choice_cost_per_hr[c]) * m.z[c] for c in m.CHOICES) <= pr.max_cost_per_hr)
    if pr.max_power_w is not None:
        m.caps.add(pyo.quicksum(m.power_kw[c] for c in m.CHOICES) <= pr.max_power_w / 1000.0)


@dataclass(frozen=True)
class SplitPlan:
    """A split-routing fleet: chosen counts and the routed rate of every link (req/s)."""

    choices: tuple[int, ...]
    link_rate: np.ndarray
    objective: float


def solve_split(problem: SplitProblem, *, top: int = 1, time_limit_s: float | None = None, mip_gap: float = 0.0,
                threads: int | None = None, verbose: bool = False) -> tuple[SolveResult, tuple[SplitPlan, ...]]:
    """Solve the split-routing MIP; returns what HiGHS proved and the plans (best first).

    The termination is read through the same table as the fleet MIP's
    (:func:`fleetopt.solvers.outcome.outcome_of`); a limit with an incumbent returns the incumbent.
    """
    t0 = time.perf_counter()
    m: Any = build_split_model(problem)     # Any: its components are run-time attributes (build_split_model)
    solver, opts = _highs(time_limit_s, mip_gap, threads, verbose, presolve="on")
    name = f"highs {'.'.join(map(str, solver.version()))}"
    options = {"time_limit_s": time_limit_s, "mip_gap": mip_gap, "threads": threads, "top": top}
    plans = []
    out, chosen = _solve_once(m, solver, opts)
    if not out.has_solution:
        return SolveResult(out.termination, (), None, None, time.perf_counter() - t0, name, options,
                           out.condition, condition=out.condition), ()
    while True:
        rates = np.zeros(len(problem.link_pool))
        for n, (l, _) in enumerate(m._pairs):
            rates[l] += max(0.0, pyo.value(m.g[n]))  # pyright: ignore[reportArgumentType]  # value raises, never None
        plans.append(SplitPlan(chosen, rates, float(pyo.value(m.objective))))  # pyright: ignore[reportArgumentType]
        if len(plans) >= top:
            break
        s = set(chosen)
        m.cuts.add(pyo.quicksum(1 - m.z[c] for c in s) + pyo.quicksum(m.z[c] for c in m.CHOICES if c not in s) >= 1)
        nxt, chosen = _solve_once(m, solver, opts)
        if not nxt.has_solution:
            break
    sols = tuple(Solution(p.choices, p.objective) for p in plans)
    return SolveResult(out.termination, sols, out.bound, out.rel_gap, time.perf_counter() - t0, name, options,
                       condition=out.condition), tuple(plans)
