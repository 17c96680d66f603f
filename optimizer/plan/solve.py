"""``fleetopt solve``: instance -> candidates -> oracle or MIP -> exact re-evaluation -> report.

The report's :class:`SolveStatus` comes from the solver's
:class:`~fleetopt.solvers.outcome.Termination` through one table, :data:`STATUS`; a solve that ends
without a plan becomes a typed error only in :func:`require_plan`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import numbers
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from fleetopt.models.fleet import DecodeStage, FleetResult, PoolPlan
from fleetopt.models.units import P99_TAIL
from fleetopt.solvers.outcome import Termination
from fleetopt.solvers.problem import FleetProblem, GpuUse
from fleetopt.solvers.result import Solution, SolveResult

from fleetopt.optimizer.plan.candidates import (Candidates, Deadline, WindowCut, bounded_sizing,
                                                generate_candidates, prune_dominated, restrict)
from fleetopt.optimizer.plan.evaluate import baseline, evaluate_plans
from fleetopt.optimizer.errors import (InfeasibleError, InstanceError, SolveInterruptedError, SolverError,
                                       SolverLimitError)
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.split_candidates import SplitRouting

if TYPE_CHECKING:
    from fleetopt.optimizer.plan.semantic import SemanticPlan

__all__ = ["SolveOptions", "SolveStatus", "STATUS", "Plan", "SolveReport", "SplitRouting", "WindowCut",
           "build_problem", "solve_instance", "require_plan", "METHODS", "MIP_FLOOR_S", "POOL_COLUMNS", "pool_row",
           "table_frame", "table_html", "FRAMES_EXTRA"]

METHODS = ("auto", "mip", "oracle")
"""Values of :attr:`SolveOptions.method`."""

ORACLE_NAME = "exact path search"
"""The solver a separable solve names (:func:`fleetopt.solvers.oracle.shortest_fleet`: dynamic programming over the
boundary DAG)."""

MIP_FLOOR_S = 0.05
"""Least time limit handed to the MIP when ``time_limit_s`` is (nearly) spent by candidate building: enough for
HiGHS's presolve and first heuristics to find an incumbent among the candidates built, so a time-limited solve
overruns its limit by at most about this much plus the model build and the plans' re-evaluation."""


class SolveStatus(enum.StrEnum):
    """What a solve concluded: the report's ``status`` and the JSON's (a ``str``, so ``status == "optimal"``
    holds). A plan always exits 0; without one, :func:`require_plan` raises the error whose exit code is given
    (:mod:`fleetopt.optimizer.errors`)."""

    OPTIMAL = "optimal"
    """Proven optimal within ``mip_gap`` (the oracle is exact). Split routing: optimal for the split MIP with its
    operating points and SLO cuts, every pool of every plan passing the re-evaluation at its routed mix (not a
    proof over every routing the batched model accepts; docs/formulation.md, "Split routing")."""
    TIME_LIMIT = "time_limit"
    """Stopped at ``time_limit_s``: the plans are the incumbent (``mip_gap`` says how far from proven);
    without one, :class:`~fleetopt.optimizer.errors.SolverLimitError` (exit 4)."""
    ITERATION_LIMIT = "iteration_limit"
    """Stopped at an iteration, node or solution-count limit of the solver: as ``time_limit``, and without a
    plan the same exit code 4. Split routing: also when the SLO-cut rounds end (:data:`SPLIT_CUT_ROUNDS`) with a
    pool that misses its SLO or the utilisation cap in the re-evaluation; the explanation names the pools."""
    INTERRUPTED = "interrupted"
    """The solve was interrupted: the plans are the incumbent; without one,
    :class:`~fleetopt.optimizer.errors.SolveInterruptedError` (exit 130)."""
    INFEASIBLE = "infeasible"
    """Proven: no plan satisfies the instance; ``explanation`` names the binding requirement
    (:class:`~fleetopt.optimizer.errors.InfeasibleError`, exit 3)."""
    ERROR = "error"
    """The solver failed, or reported what cannot hold for these models (unbounded, an objective limit
    fleetopt never sets); without a plan :class:`~fleetopt.optimizer.errors.SolverError` (exit 1)."""
    UNKNOWN = "unknown"
    """The solver gave no reason, or one fleetopt does not know; without a plan
    :class:`~fleetopt.optimizer.errors.SolverError` (exit 1)."""


STATUS = MappingProxyType({
    Termination.OPTIMAL: SolveStatus.OPTIMAL,
    Termination.TIME_LIMIT: SolveStatus.TIME_LIMIT,
    Termination.ITERATION_LIMIT: SolveStatus.ITERATION_LIMIT,
    Termination.INTERRUPTED: SolveStatus.INTERRUPTED,
    Termination.INFEASIBLE: SolveStatus.INFEASIBLE,
    # every objective is a sum of non-negative $/hr and kW terms over bounded or non-negative variables, so it
    # is bounded below by 0: "infeasible or unbounded" can only be infeasible, and "unbounded" is a fault
    Termination.INFEASIBLE_OR_UNBOUNDED: SolveStatus.INFEASIBLE,
    Termination.UNBOUNDED: SolveStatus.ERROR,
    Termination.OBJECTIVE_LIMIT: SolveStatus.ERROR,  # fleetopt sets no objective bound or target
    Termination.ERROR: SolveStatus.ERROR,
    Termination.UNKNOWN: SolveStatus.UNKNOWN,
})
"""The solver's :class:`~fleetopt.solvers.outcome.Termination` -> the report's :class:`SolveStatus`, one entry
per member (``tests/test_solver_outcomes.py`` checks it)."""

_NO_PLAN_ERROR = MappingProxyType({
    SolveStatus.INFEASIBLE: InfeasibleError,
    SolveStatus.TIME_LIMIT: SolverLimitError,
    SolveStatus.ITERATION_LIMIT: SolverLimitError,
    SolveStatus.INTERRUPTED: SolveInterruptedError,
    SolveStatus.OPTIMAL: SolverError,  # proven optimal without a plan cannot happen: a fault
    SolveStatus.ERROR: SolverError,
    SolveStatus.UNKNOWN: SolverError,
})
"""The error :func:`require_plan` raises for a report without a plan, by status."""


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SolveOptions:
    """How to solve; checked when built (a bad value raises :class:`ValueError` naming every field at fault).

    Examples
    --------
    >>> SolveOptions(method="bogus")
    Traceback (most recent call last):
    ...
    ValueError: SolveOptions: method: 'bogus' is not one of 'auto', 'mip', 'oracle'
    """

    top: int = 1
    """Distinct fleets to return, best first (an integer >= 1)."""
    time_limit_s: float | None = None
    """Wall-time limit of the whole solve in seconds (> 0; None or inf: none): candidate building stops at it
    (``Candidates.unsized_gpus``), the MIP gets what is left (at least :data:`MIP_FLOOR_S`), and the LP bound and
    the baseline are skipped once it has passed."""
    mip_gap: float = 0.0
    """Relative MIP gap at which HiGHS stops, :math:`|ub - lb| / |ub|` (0 to 1)."""
    threads: int | None = None
    """Solver threads (>= 1; None: HiGHS's default)."""
    verbose: bool = False
    """Show the HiGHS log (True, or a list of streams as Pyomo's ``tee`` takes)."""
    method: str = "auto"
    """``auto`` (graph oracle when the problem is separable, else MIP), ``mip`` or ``oracle``."""
    min_replicas: tuple = ()
    """Cuts from verification: ``((lo, hi, gpu), n)`` pairs, a pool's least replica count."""
    forbidden: tuple = ()
    """Cuts from verification: ``(lo, hi, gpu)`` pools the plan may not use."""
    window_cuts: tuple[WindowCut, ...] = ()
    """Cuts from verification: every pool on a GPU with a window, starting at or below a boundary, needs at least
    a factor times its analytic minimum count (:class:`fleetopt.optimizer.plan.candidates.WindowCut`)."""
    compute_baseline: bool = True
    """Evaluate the homogeneous baseline for the report (a sweep of many scenarios that never shows it skips it:
    about 40 % of a small solve)."""
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False, compare=False)
    """The clock ``time_limit_s`` is measured on (seconds; a test passes a fake one)."""

    def __post_init__(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method: {self.method!r} is not one of {', '.join(map(repr, METHODS))}")
        if not (_is_int(self.top) and self.top >= 1):
            problems.append(f"top: {self.top!r} is not an integer >= 1")
        if self.time_limit_s is not None and not (_is_real(self.time_limit_s) and self.time_limit_s > 0):
            problems.append(f"time_limit_s: {self.time_limit_s!r} is not a number of seconds > 0 (None: no limit)")
        if not (_is_real(self.mip_gap) and 0 <= self.mip_gap <= 1):
            problems.append(f"mip_gap: {self.mip_gap!r} is not a number from 0 to 1")
        if self.threads is not None and not (_is_int(self.threads) and self.threads >= 1):
            problems.append(f"threads: {self.threads!r} is not an integer >= 1 (None: the solver's default)")
        if problems:
            raise ValueError("SolveOptions: " + "; ".join(problems))

    @property
    def has_cuts(self) -> bool:
        return bool(self.min_replicas or self.forbidden or self.window_cuts)


@dataclass(frozen=True)
class Plan:
    """One fleet: the solver's objective and the exact analytic re-evaluation of its pools."""

    rank: int
    objective: float
    fleet: FleetResult
    routing: SplitRouting | None = None
    """Split routing: the rate of every elementary segment sent to each pool (columns in ``fleet.pools``
    order); None under length routing (each pool serves its own range)."""
    semantic: SemanticPlan | None = None
    """Multi-model (semantic) routing: the rule, each pool's model class and per-class totals
    (:class:`fleetopt.optimizer.plan.semantic.SemanticPlan`); None for one model class."""


@dataclass(frozen=True)
class SolveReport:
    instance: Instance
    status: SolveStatus
    """What the solve concluded (:class:`SolveStatus`; a ``str``)."""
    method: str  # oracle | mip
    plans: tuple[Plan, ...]
    baseline: FleetResult | None
    explanation: str
    solve_seconds: float
    mip_gap: float | None
    bound: float | None
    solver: str
    candidates_generated: int
    candidates_feasible: int
    candidates_after_pruning: int
    dropped_reasons: tuple[str, ...]
    power_error_w: float = 0.0
    """Split routing: largest over-estimate of one pool's power in the MIP (reported plans are re-evaluated)."""
    lp_bound: float | None = None
    """Objective of the MIP's LP relaxation (the root bound before cuts); None when the oracle solved it."""
    candidates_left_unsized: int = 0
    """Candidates never sized: a feasible one of the same segment rules them out by their floors
    (:func:`fleetopt.optimizer.plan.candidates.bounded_sizing`); counted in ``candidates_generated``, in neither
    ``candidates_feasible`` nor the dropped ones."""

    @property
    def best(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    def rows(self) -> list[dict]:
        """One row per pool of every plan (``rank`` first), the analytic figures of :data:`POOL_COLUMNS`."""
        return [{"rank": p.rank, **pool_row(pool)} for p in self.plans for pool in p.fleet.pools]

    def to_frame(self):
        """:meth:`rows` as a ``pandas.DataFrame`` (the optional extra ``fleetopt[frames]``)."""
        return table_frame(self.rows(), ["rank", *POOL_COLUMNS])

    def _repr_html_(self) -> str:
        gap = "-" if self.mip_gap is None else f"{self.mip_gap:.2%}"
        best = self.best
        head = (f"{self.instance.name}: {self.status} ({self.method}, {self.solver}; gap {gap}; "
                f"{self.solve_seconds:.2f} s)")
        if best is not None:
            head += f"; plan 1: ${best.fleet.cost_per_hr:,.2f}/hr, {best.fleet.power_kw:,.1f} kW (analytic)"
        return table_html(head, self.rows(), ["rank", *POOL_COLUMNS], self.explanation)


def build_problem(instance: Instance, c: Candidates) -> FleetProblem:
    """The MIP input of an instance's (pruned) candidates and their replica choices."""
    cons = instance.constraints
    # The MIP's GPU index is the inventory (a gpus entry): the configurations of an entry with tp/dtype lists share
    # its max_count/min_count/max_pools/min_pools; an entry of one configuration is its own option, as before.
    # Anything else indexed by GPU here (pool_gpu, a choice's GPU use) must go through inventory_of_options() too.
    inventories = instance.gpu_inventories()
    gpu_max = tuple(g.max_count for g in inventories)
    gpu_min = tuple(g.min_count for g in inventories)
    fleet_scope = instance.slo.scope == "fleet"
    return FleetProblem(
        boundaries=c.boundaries, gpu_names=tuple(g.name for g in inventories), pool_i=c.i, pool_j=c.j,
        pool_gpu=instance.inventory_of_options()[c.gpu],
        pool_arrival_rate=c.arrival_rate, choice_pool=c.choice_pool, choice_replicas=c.choice_replicas,
        choice_gpus=c.choice_gpus, choice_cost_per_hr=c.choice_cost_per_hr, choice_power_w=c.choice_power_w,
        choice_miss_rate=c.choice_miss_rate,
        max_miss_rate=P99_TAIL * instance.workload.arrival_rate_req_per_s if fleet_scope else None,
        max_pools=instance.pools.max_pools, gpu_max_gpus=gpu_max,
        pool_from_node=c.from_node, pool_to_node=c.to_node, n_nodes=len(c.boundaries) * len(c.gammas),
        sink_node=(len(c.boundaries) - 1) * len(c.gammas),
        gpu_min_pools=tuple(g.min_pools for g in inventories),
        gpu_max_pools=tuple(g.max_pools for g in inventories),
        energy_usd_per_kwh=instance.energy_usd_per_kwh or 0.0, pue=instance.pue,
        gpu_min_gpus=gpu_min, max_total_gpus=cons.max_total_gpus, max_cost_per_hr=cons.max_cost_per_hr,
        max_power_w=None if cons.max_power_kw is None else cons.max_power_kw * 1000.0,
        objective=instance.objective, labels=tuple(c.label(p) for p in range(len(c))),
        choice_gpu_use=_gpu_use(instance, c) if c.is_pair.any() else None,
    )


def _gpu_use(instance: Instance, c: Candidates) -> GpuUse:
    """The GPUs each choice takes from each inventory: an aggregated pool's all from its option's, a
    disaggregated pair's prefill GPUs from its prefill option's and decode GPUs from its decode option's (one entry
    when both are one inventory)."""
    entry = instance.inventory_of_options()
    assert c.decode_gpu is not None and c.choice_decode_gpus is not None    # Candidates.__post_init__ fills them
    pool = c.choice_pool
    pair = c.is_pair[pool]
    prefill = entry[c.gpu[pool]]
    decode = np.where(pair, entry[np.maximum(c.decode_gpu[pool], 0)], prefill)
    dg = np.where(pair, c.choice_decode_gpus, 0)
    pg = c.choice_gpus - dg
    choice = np.arange(c.n_choices)
    split = pair & (decode != prefill)
    # same inventory (or aggregated): one entry of all the GPUs; two inventories: one entry each
    ch = np.concatenate([choice, choice[split]])
    opt = np.concatenate([prefill, decode[split]])
    gpus = np.concatenate([np.where(split, pg, c.choice_gpus), dg[split]])
    live = gpus > 0
    return GpuUse(choice=ch[live], option=opt[live], gpus=gpus[live].astype(np.int64))


def _prune(instance: Instance, c: Candidates, top: int) -> Candidates:
    # a choice may stand in for another only on an option without inventory or pool-count limits (or its own),
    # and no option with a lower bound may lose choices
    inventories, entry_of = instance.gpu_inventories(), instance.inventory_of_options()
    unlimited = np.array([inventories[k].max_count is None and inventories[k].max_pools is None for k in entry_of])
    protected = np.array([bool(inventories[k].min_count) or bool(inventories[k].min_pools) for k in entry_of])
    return prune_dominated(c, unlimited, protected, top)


REPORT_CACHE_SIZE = 8
"""Most solve reports :func:`solve_instance` keeps for a repeated solve of the same instance and options."""

_REPORTS: OrderedDict[bytes, SolveReport] = OrderedDict()


def _report_key(instance: Instance, options: SolveOptions) -> bytes | None:
    """The content key of a solve: a SHA-256 of the pickled instance and the options that shape the answer; None
    (no caching) with a time limit (the answer depends on the clock), with ``verbose`` (the user asked to see the
    solver run) or for anything that does not pickle.

    Pickling writes every field's value (a length distribution's arrays byte by byte, floats exactly), so two
    instances with one key hold the same content; an instance loaded again from the same file hits, one with any
    field changed misses. Dictionaries pickle in insertion order: equal content built in another order only misses.
    """
    if options.verbose or (options.time_limit_s is not None and math.isfinite(options.time_limit_s)):
        return None
    # every option but the clock (time is excluded above) shapes the answer: a field added later is keyed too
    fields = tuple((f.name, getattr(options, f.name)) for f in dataclasses.fields(options) if f.name != "clock")
    try:
        blob = pickle.dumps((instance, fields), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:   # noqa: BLE001 - an unpicklable field: solve without the cache
        return None
    return hashlib.sha256(blob).digest()


def clear_report_cache() -> None:
    """Forget every cached solve report (:func:`solve_instance`)."""
    _REPORTS.clear()


def solve_instance(instance: Instance, options: SolveOptions = SolveOptions()) -> SolveReport:
    """Find the optimal fleet(s) of ``instance`` and re-evaluate them exactly.

    A solve without a time limit is deterministic in the instance's content and the options: the last
    :data:`REPORT_CACHE_SIZE` reports are kept under :func:`_report_key`, and a repeated solve (a notebook's
    second call, the same instance loaded again) returns the kept report with this call's ``instance`` and
    ``solve_seconds``. An instance with any field changed is solved afresh. The report's plans are shared between
    the calls: treat them as read-only."""
    t0 = time.perf_counter()
    key = _report_key(instance, options)
    if key is not None and key in _REPORTS:
        _REPORTS.move_to_end(key)
        return dataclasses.replace(_REPORTS[key], instance=instance, solve_seconds=time.perf_counter() - t0)
    report = _solve_instance(instance, options)
    if key is not None:
        _REPORTS[key] = report
        while len(_REPORTS) > REPORT_CACHE_SIZE:
            _REPORTS.popitem(last=False)
    return report


def _solve_instance(instance: Instance, options: SolveOptions) -> SolveReport:
    if instance.pools.routing == "split":
        return _solve_split(instance, options)
    if instance.semantic is not None:   # one tiling per model class (fleetopt.optimizer.plan.semantic)
        return _solve_semantic(instance, options)
    t0 = time.perf_counter()
    deadline = Deadline.after(options.time_limit_s, options.clock)
    # the candidates `top` others of their segment rule out need no sizing (bounded_sizing says which)
    bounded = None if deadline is not None or options.has_cuts else bounded_sizing(instance, options.top,
                                                                                  options.method)
    allc = generate_candidates(instance, deadline, bounded=bounded, top=options.top)
    if options.has_cuts:
        allc = restrict(allc, instance, dict(options.min_replicas), set(options.forbidden), options.window_cuts)
    cands = _prune(instance, allc, options.top)
    problem = build_problem(instance, cands)
    assert bounded != "cost" or problem.separable, "the cost bound needs the oracle's problem (bounded_sizing)"
    if options.method == "oracle" and not (problem.separable and options.top == 1):
        raise InstanceError("--method: the graph oracle solves only instances without inventory, budget, power "
                            "or GPU-count limits, with --top 1; use --method mip or auto")
    use_oracle = options.method == "oracle" or (options.method == "auto" and problem.separable and options.top == 1)
    cut = bool(allc.unsized_gpus)
    if not cut and allc.uncovered() is not None:
        result = _no_tiling(allc)  # proven before any solve; HiGHS reports an empty model as "unknown"
    elif use_oracle:
        result = _oracle(problem)
    else:
        from fleetopt.solvers.mip import solve as solve_mip   # HiGHS only on the MIP path (Pyomo for branching)

        result = solve_mip(problem, top=options.top, time_limit_s=_mip_time_limit_s(deadline),
                           mip_gap=options.mip_gap, threads=options.threads, verbose=options.verbose,
                           relaxation=not cut)
    plans = tuple(Plan(k + 1, s.objective, evaluate_plans(instance, _pool_plans(instance, cands, s.choices)))
                  for k, s in enumerate(result.solutions))
    late = deadline is not None and deadline.passed()
    root = result.lp_bound if not use_oracle and plans and not cut and not late else None
    status = STATUS[result.termination]
    explanation = ""
    if cut:  # a subset of the candidates: neither its optimum nor its infeasibility says anything about the whole
        status = SolveStatus.TIME_LIMIT
        assert options.time_limit_s is not None     # candidates are cut short only when a time limit passes
        explanation = _cut_note(instance, allc, options.time_limit_s, bool(plans))
    elif not plans:
        from fleetopt.optimizer.plan.explain import explain_infeasible, explain_stop

        explanation = (explain_infeasible(instance, allc, problem, result) if status is SolveStatus.INFEASIBLE
                       else explain_stop(result))
    skip_baseline = late and options.compute_baseline
    if skip_baseline:
        explanation = "; ".join(x for x in (explanation, f"the {options.time_limit_s:g} s time limit had passed: "
                                            "the homogeneous baseline was not computed") if x)
    return SolveReport(
        instance=instance, status=status, method="oracle" if use_oracle else "mip", plans=plans,
        baseline=(baseline(instance, unsized_on_full_range(instance, allc))
                  if options.compute_baseline and not skip_baseline else None),
        explanation=explanation, solve_seconds=time.perf_counter() - t0,
        mip_gap=None if cut else result.rel_gap, bound=None if cut else result.bound, solver=result.solver,
        candidates_generated=allc.generated, candidates_feasible=len(allc), candidates_after_pruning=len(cands),
        dropped_reasons=tuple(f"{d.lo_tokens:,}-{d.hi_tokens:,} on {d.gpu}: {d.reason}" for d in allc.dropped),
        lp_bound=root, candidates_left_unsized=allc.left_unsized,
    )


def unsized_on_full_range(instance: Instance, c: Candidates) -> frozenset[str]:
    """The GPU options bounded sizing left unsized on the whole range :math:`(0, B_{max}]`: none is the homogeneous
    baseline (:func:`fleetopt.optimizer.plan.evaluate.baseline`). A feasible candidate of that segment on an option
    free of limits costs less than each of them can, and under the dominance rule draws and takes no more, so its
    one-pool fleet meets the SLO and breaks no limit that theirs does not, at a lower cost
    (:func:`fleetopt.optimizer.plan.candidates.bounded_sizing`). Empty when every candidate was sized."""
    if not c.left_unsized or c.unsized_gpus:
        return frozenset()
    top = len(c.boundaries) - 1
    whole = (c.i == 0) & (c.j == top) & (c.state_in == 0) & (c.state_out == 0) & ~c.is_pair
    seen = {c.gpu_names[g] for g in c.gpu[whole]}
    seen |= {d.gpu for d in c.dropped if d.lo_tokens == 0 and d.hi_tokens == int(c.boundaries[-1])}
    return frozenset(g.name for g in instance.gpus) - seen


def _mip_time_limit_s(deadline: Deadline | None) -> float | None:
    """The MIP's share of the solve's time limit: what is left of it, at least :data:`MIP_FLOOR_S`."""
    return None if deadline is None else max(deadline.remaining_s(), MIP_FLOOR_S)


def _cut_note(instance: Instance, c: Candidates, time_limit_s: float, found: bool) -> str:
    """The explanation of a solve whose candidate building the time limit cut short."""
    sized = sum(g.name not in c.unsized_gpus for g in instance.gpus)   # "(disaggregated pairs)" is no option
    head = (f"time limit: the {time_limit_s:g} s limit passed while candidates were built; {sized} of "
            f"{len(instance.gpus)} GPU options sized, not sized: {', '.join(c.unsized_gpus)}")
    if found:
        return head + "; the plan is the best among the candidates built, with no bound on the full problem"
    return head + "; no plan among the candidates built, and the instance may still be feasible; raise --time-limit"


def _solve_split(instance: Instance, options: SolveOptions) -> SolveReport:
    """Split routing: the split MIP with SLO cuts (:func:`_split_cut_loop`), then the exact re-evaluation of each
    plan's routed mixes. The status is never ``optimal`` for a plan with a pool that misses its SLO or the
    utilisation cap in that re-evaluation (``iteration_limit`` then, the explanation naming the pools)."""
    from fleetopt.optimizer.plan.split_candidates import build_split_problem, decode_split_plan, restrict_split

    if options.method == "oracle":
        raise InstanceError("--method: the graph oracle solves length routing only; split routing needs the MIP")
    t0 = time.perf_counter()
    deadline = Deadline.after(options.time_limit_s, options.clock)
    model = build_split_problem(instance)
    if options.has_cuts:
        model = restrict_split(model, instance, dict(options.min_replicas), set(options.forbidden),
                               options.window_cuts)
    unserved = _unserved_segment(model.problem)
    if unserved is not None:  # proven before any solve (and an empty split model is no model for Pyomo)
        b = model.boundaries
        result, plans = SolveResult(Termination.INFEASIBLE, (), None, None, 0.0, "candidate sizing (no solve needed)",
                                    {}, f"no candidate pool serves {int(b[unserved]):,}-{int(b[unserved + 1]):,}-"
                                    "token requests at any replica count"), []
        cuts, rounds, uncut = [], 0, False
    else:
        result, plans, cuts, rounds, uncut = _split_cut_loop(instance, model, options, deadline)
    decoded = tuple(Plan(k + 1, p.objective, *decode_split_plan(instance, model, p.choices, p.link_rate))
                    for k, p in enumerate(plans))
    from fleetopt.optimizer.plan.explain import explain_stop

    status = STATUS[result.termination]
    explanation = ""
    missing = [f"plan {p.rank} pool {pool.min_tokens:,}-{pool.max_tokens:,} on {pool.gpu}" for p in decoded
               for pool in p.fleet.pools if not (pool.slo_met and pool.utilization_ok)]
    if missing and status is SolveStatus.OPTIMAL:  # never "optimal" for a plan that misses in the re-evaluation
        status = SolveStatus.ITERATION_LIMIT
    if missing:
        explanation = (f"split routing: after {rounds} solve(s) and {len(cuts)} SLO cut(s) "
                       + ("(stopped at the round limit or a solver limit with a cut still to add) " if uncut
                          else "(no cut separates it) ")
                       + "the re-evaluation still misses the SLO or the utilisation cap in " + ", ".join(missing))
    elif cuts and decoded:
        explanation = (f"split routing: {len(cuts)} SLO cut(s) from the {instance.slo.ttft_model} TTFT model in "
                       f"{rounds} solves; optimal within the MIP's operating points and these cuts (a cut keeps every "
                       "carried mix where the carried set is convex, checked numerically, not proven)")
    if not decoded and unserved is not None:
        from fleetopt.optimizer.plan.explain import explain_infeasible

        length = generate_candidates(instance)  # the same pools under length routing name the binding reason
        explanation = (explain_infeasible(instance, length, None, result) if length.uncovered() is not None
                       else result.message)
    elif not decoded:
        explanation = (f"no split-routing plan satisfies the instance (solver: {result.message})"
                       if status is SolveStatus.INFEASIBLE else explain_stop(result))
        if cuts:
            explanation += (f"; with {len(cuts)} SLO cut(s) from the {instance.slo.ttft_model} TTFT model (valid "
                            "where the carried set of routed rates is convex, not proven)")
    return SolveReport(
        instance=instance, status=status, method="mip (split routing)", plans=decoded,
        baseline=baseline(instance) if options.compute_baseline else None,
        explanation=explanation, solve_seconds=time.perf_counter() - t0, mip_gap=result.rel_gap, bound=result.bound,
        solver=result.solver, candidates_generated=model.generated, candidates_feasible=len(model.problem.pool_gpu),
        candidates_after_pruning=len(model.problem.pool_gpu), dropped_reasons=model.dropped,
        power_error_w=model.problem.power_error_w)


SPLIT_CUT_ROUNDS = 12
"""Most solves of the split MIP between which SLO cuts are added (:func:`_split_cut_loop`)."""


def _split_cut_loop(instance: Instance, model, options: SolveOptions, deadline: Deadline | None):
    r"""Solve the split MIP, re-evaluate each plan's pools at their routed mixes under the instance's TTFT model
    and, while one does not carry its mix, add a cut for that (pool, count)
    (:func:`fleetopt.optimizer.plan.split_candidates.slo_cut`) and solve again, at most :data:`SPLIT_CUT_ROUNDS`
    times. Returns the last solve's result and plans, the cuts, the solves made and whether cuts were still being
    added when the rounds ran out. Ends early when a solve is not proven optimal (its plans are the incumbent)."""

    from fleetopt.solvers.split import solve_split

    from fleetopt.optimizer.plan.split_candidates import slo_cut

    cuts: list = []
    for rounds in range(1, SPLIT_CUT_ROUNDS + 1):
        problem = dataclasses.replace(model.problem, slo_cuts=tuple(cuts))
        result, plans = solve_split(problem, top=options.top, time_limit_s=_mip_time_limit_s(deadline),
                                    mip_gap=options.mip_gap, threads=options.threads, verbose=options.verbose)
        new = [(c, w) for p in plans for c in p.choices
               if (w := slo_cut(instance, model, c, p.link_rate)) is not None]
        if not new or result.termination is not Termination.OPTIMAL or rounds == SPLIT_CUT_ROUNDS:
            return result, plans, cuts, rounds, bool(new)
        cuts += new
    raise AssertionError("unreachable")


_UNPROVEN = (SolveStatus.TIME_LIMIT, SolveStatus.ITERATION_LIMIT, SolveStatus.INTERRUPTED, SolveStatus.ERROR,
             SolveStatus.UNKNOWN)
"""Statuses that leave a semantic rule's optimum unproven: the semantic solve reports the first of them."""


def _solve_semantic(instance: Instance, options: SolveOptions) -> SolveReport:
    """Multi-model (semantic) routing: one MIP (or graph oracle) per admissible share rule, each with one tiling
    per model class (:func:`fleetopt.optimizer.plan.semantic.build_semantic_problem`); the cheapest plans over all
    rules kept, ties to the larger large-model share. Exact: a plan runs one rule, so the joint problem's feasible
    set is the disjoint union of the rules' and its optimum (and its ``top`` best) the best of theirs
    (docs/formulation.md, "Several tilings"). Each plan is re-evaluated over all requests
    (:func:`fleetopt.optimizer.plan.semantic.evaluate_semantic`); the baseline is the large model alone."""
    from fleetopt.optimizer.plan import semantic as sem

    spec = instance.semantic
    assert spec is not None
    if options.has_cuts:
        raise InstanceError("semantic: verification cuts are not supported for semantic routing; solve without them")
    t0 = time.perf_counter()
    deadline = Deadline.after(options.time_limit_s, options.clock)
    found, tried, results, statuses, cuts, methods, dropped = [], [], [], [], [], set(), []
    generated = feasible = after = 0
    for k, (rule, label, large) in enumerate(zip(spec.rules, spec.labels, spec.large_shares)):
        parts = sem.class_parts(instance, rule, deadline, prune=lambda sub, c: _prune(sub, c, options.top))
        generated += sum(p.candidates.generated for p in parts)
        feasible += sum(p.feasible for p in parts)
        after += sum(len(p.candidates) for p in parts)
        dropped += [f"{p.role} (share {label}) {d.lo_tokens:,}-{d.hi_tokens:,} on {d.gpu}: {d.reason}"
                    for p in parts for d in p.candidates.dropped]
        problem = sem.build_semantic_problem(instance, parts)
        if options.method == "oracle" and not (problem.separable and options.top == 1):
            raise InstanceError("--method: the graph oracle solves a semantic instance only without inventory, "
                                "budget, power or GPU-count limits, with --top 1; use --method mip or auto")
        use_oracle = options.method == "oracle" or (options.method == "auto" and problem.separable
                                                    and options.top == 1)
        uncovered = [(p, seg) for p, seg in ((p, p.candidates.uncovered()) for p in parts) if seg is not None]
        cut = [f"{p.role}: {', '.join(p.candidates.unsized_gpus)}" for p in parts if p.candidates.unsized_gpus]
        if cut:     # the time limit passed while candidates were built: a subset, proving neither optimum nor not
            cuts.append(f"share {label} ({'; '.join(cut)} not sized)")
        if uncovered and cut:
            result = SolveResult(Termination.TIME_LIMIT, (), None, None, 0.0, "candidate sizing (cut short)", {},
                                 "the time limit passed while candidates were built")
        elif uncovered:    # proven before any solve: this class's lengths cannot be tiled
            p, seg = uncovered[0]
            b = p.candidates.boundaries
            result = SolveResult(Termination.INFEASIBLE, (), None, None, 0.0, "candidate sizing (no solve needed)", {},
                                 f"no candidate of the {p.role} model ({p.model}) serves "
                                 f"{int(b[seg]):,}-{int(b[seg + 1]):,}-token requests")
        elif use_oracle:
            result = _oracle(problem)
        else:
            from fleetopt.solvers.mip import solve as solve_mip

            result = solve_mip(problem, top=options.top, time_limit_s=_mip_time_limit_s(deadline),
                               mip_gap=options.mip_gap, threads=options.threads, verbose=options.verbose)
        methods.add("oracle" if use_oracle else "mip")
        results.append(result)
        statuses.append(SolveStatus.TIME_LIMIT if cut else STATUS[result.termination])
        best = result.best
        tried.append(sem.ShareOutcome(label, large, str(statuses[-1]), None if best is None else best.objective))
        found += [(s.objective, -large, k, s.choices, parts) for s in result.solutions]
    found.sort(key=lambda f: f[:3])
    plans = []
    for rank, (objective, _, k, choices, parts) in enumerate(found[:options.top], start=1):
        per_class = sem.split_choices(parts, choices)
        fleet = sem.evaluate_semantic(instance, [(p.traffic, _pool_plans(p.instance, p.candidates, mine))
                                                 for p, mine in zip(parts, per_class)])
        plans.append(Plan(rank, objective, fleet,
                          semantic=sem.semantic_plan(instance, k, parts, per_class, fleet, tuple(tried))))
    stopped = [st for st in statuses if st in _UNPROVEN]
    status = stopped[0] if stopped else SolveStatus.OPTIMAL if plans else SolveStatus.INFEASIBLE
    why: dict[str, list[str]] = {}       # each reason once, with the shares it holds for
    for t, r, st in zip(tried, results, statuses):
        why.setdefault(r.message if r.solver.startswith("candidate sizing") else
                       "no fleet of the two models' pools meets the instance's limits (pools.max_pools, GPU counts, "
                       "power, budget, fleet SLO)" if st is SolveStatus.INFEASIBLE else r.message or str(st),
                       []).append(t.label)
    explanation = "" if plans else "no semantic plan at any share: " + "; ".join(
        f"share{'s' * (len(labels) > 1)} {', '.join(labels)}: {text}" for text, labels in why.items())
    if cuts:
        explanation = "; ".join(x for x in (explanation, f"time limit: the {options.time_limit_s:g} s limit passed "
                                            "while candidates were built, " + ", ".join(cuts) + "; a plan is the "
                                            "best among the candidates built") if x)
    chosen = results[found[0][2]] if found else results[0]
    return SolveReport(
        instance=instance, status=status, method="+".join(sorted(methods)) + " (semantic)", plans=tuple(plans),
        baseline=baseline(sem.large_model_instance(instance)) if options.compute_baseline else None,
        explanation=explanation, solve_seconds=time.perf_counter() - t0, mip_gap=chosen.rel_gap, bound=chosen.bound,
        solver=chosen.solver, candidates_generated=generated, candidates_feasible=feasible,
        candidates_after_pruning=after, dropped_reasons=tuple(dropped))


def require_plan(report: SolveReport) -> SolveReport:
    """``report`` when it holds a plan; otherwise the typed error of its status (:data:`_NO_PLAN_ERROR`).

    A time or iteration limit, or an interrupt, with an incumbent is a result and returns. The error's
    message is the report's explanation and its ``exit_code`` is the documented one
    (:mod:`fleetopt.optimizer.errors`).

    Raises
    ------
    InfeasibleError
        Status ``infeasible`` (exit 3).
    SolverLimitError
        Status ``time_limit`` or ``iteration_limit`` (exit 4).
    SolveInterruptedError
        Status ``interrupted`` (exit 130).
    SolverError
        Status ``error`` or ``unknown`` (exit 1).
    """
    if report.plans:
        return report
    status = SolveStatus(report.status)
    message = f"no plan ({status}): {report.explanation}" if report.explanation else f"no plan ({status})"
    error = _NO_PLAN_ERROR[status]
    raise error(message) if error is InfeasibleError else error(message, status)


def _unserved_segment(problem) -> int | None:
    """Split routing: the highest elementary segment with traffic that no pool with a replica choice may serve
    (None: every one has such a pool)."""
    served = np.zeros(len(problem.segment_rate), dtype=bool)
    live = np.isin(problem.link_pool, problem.choice_pool)
    served[problem.link_segment[live]] = True
    left = np.flatnonzero(~served & (np.asarray(problem.segment_rate) > 0))
    return int(left[-1]) if left.size else None


def _no_tiling(c: Candidates) -> SolveResult:
    """The proof of infeasibility that needs no solver: a length range no candidate serves
    (:meth:`~fleetopt.optimizer.plan.candidates.Candidates.uncovered`), so no plan tiles the context."""
    k = c.uncovered()
    assert k is not None                            # called only for candidates with an uncovered range
    b = c.boundaries
    return SolveResult(Termination.INFEASIBLE, (), None, None, 0.0, "candidate sizing (no solve needed)", {},
                       f"no candidate serves {int(b[k]):,}-{int(b[k + 1]):,}-token requests")


def _oracle(problem: FleetProblem) -> SolveResult:
    from fleetopt.solvers.oracle import NoFleetError, shortest_fleet

    t0 = time.perf_counter()
    try:
        value, choices = shortest_fleet(problem)
    except NoFleetError as err:
        return SolveResult(Termination.INFEASIBLE, (), None, None, time.perf_counter() - t0, ORACLE_NAME, {},
                           str(err))
    return SolveResult(Termination.OPTIMAL, (Solution(choices, value),), value, 0.0, time.perf_counter() - t0,
                       ORACLE_NAME if problem.n_commodities == 1 else
                       "exact path search per model class, combined under the pool count", {})


def _pool_plans(instance: Instance, c: Candidates, choices) -> list[PoolPlan]:
    b = c.boundaries
    # Candidates.__post_init__ fills the pair fields
    assert c.decode_gpu is not None and c.decode_cap is not None and c.choice_decode_replicas is not None
    out = []
    for ch in sorted(choices, key=lambda ch: c.i[c.choice_pool[ch]]):
        p = c.choice_pool[ch]
        opt = instance.gpus[c.gpu[p]]
        if c.is_pair[p]:
            dec = instance.gpus[c.decode_gpu[p]]
            out.append(PoolPlan(int(b[c.i[p]]), int(b[c.j[p]]), opt.name, opt.profile, int(c.choice_replicas[ch]),
                                opt.availability,
                                decode=DecodeStage(gpu=dec.name, profile=dec.profile,
                                                   replicas=int(c.choice_decode_replicas[ch]),
                                                   max_num_seqs=int(c.decode_cap[p]) or None,
                                                   availability=dec.availability),
                                transfer=instance.pools.transfer(opt.name, dec.name)))
            continue
        out.append(PoolPlan(int(b[c.i[p]]), int(b[c.j[p]]), opt.name, opt.profile, int(c.choice_replicas[ch]),
                            opt.availability, c.gammas[c.state_out[p]], int(c.cap[p])))
    return out


# --------------------------------------------------------------------------------------------
# Notebook views of the reports (tables as pandas frames and HTML)
# --------------------------------------------------------------------------------------------

POOL_COLUMNS = ("min_tokens", "max_tokens", "gpu", "replicas", "gpus", "arrival_rate", "utilization", "ttft_p99_ms",
                "power_w", "cost_per_hr", "slo_met")
"""The analytic pool figures a notebook table shows (names and units as in the JSON contract: req/s, ms, W, $/hr)."""

FRAMES_EXTRA = "frames"
"""The optional extra that brings pandas: ``pip install "fleetopt[frames]"``."""


def pool_row(pool) -> dict:
    """The :data:`POOL_COLUMNS` of one analytic pool (``fleetopt.models.fleet.PoolResult``)."""
    return {k: getattr(pool, k) for k in POOL_COLUMNS}


def table_frame(rows: list[dict], columns):
    """``rows`` as a ``pandas.DataFrame`` with ``columns`` in order (pandas is imported here, on first use).

    Raises
    ------
    ImportError
        When pandas is not installed; the message names the extra that installs it.
    """
    try:
        import pandas
    except ImportError as err:
        raise ImportError(f"to_frame() needs pandas: pip install \"fleetopt[{FRAMES_EXTRA}]\" "
                          f"(the optional extra {FRAMES_EXTRA!r})") from err
    return pandas.DataFrame(rows, columns=list(columns))


def _cell(value) -> str:
    import html

    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "-" if value != value else f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return html.escape(str(value))


def table_html(caption: str, rows: list[dict], columns, note: str = "") -> str:
    """A self-contained HTML table (no scripts, styles or links): ``caption``, a header of ``columns``, one line
    per row, then ``note`` (escaped) when given."""
    import html

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in columns) + "</tr>" for r in rows)
    tail = f"<p>{html.escape(note)}</p>" if note else ""
    return (f"<div><table><caption>{html.escape(caption)}</caption><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{tail}</div>")
