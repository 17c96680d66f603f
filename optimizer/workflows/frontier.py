r"""Exact trade-off curves (``fleetopt pareto --axes cost,AXIS``): least cost against power, P99 TTFT or pools.

Every point is an optimal plan of an *ordinary solve of a modified instance*: the instance re-loaded from its file
with ``--set`` overrides (:mod:`fleetopt.optimizer.io.overrides`) that bound the second axis, and solved by the
solve pipeline (candidates, pruning, :func:`fleetopt.optimizer.plan.solve.build_problem`, the graph oracle when
the problem is separable, else the MIP, then the exact analytic re-evaluation). Only whole-plan optima enter, so
the curve is exact by construction (the :math:`\varepsilon`-constraint method [1]_):

.. math:: C(\varepsilon) = \min\{\mathrm{cost}(x) : x \text{ feasible},\ a(x) \le \varepsilon\}

for the second axis :math:`a`:

* ``power``: the fleet's analytic power (kW), bounded by ``constraints.max_power_kw = ε``;
* ``pools``: the number of pools of the plan, bounded by ``pools.max_pools = ε`` (1 .. ``max_pools``);
* ``ttft``: the worst analytic P99 TTFT over the plan's pools (ms), bounded by ``slo.ttft_p99_ms = ε`` under a
  pool-scope SLO. Each candidate is sized to its least count meeting the SLO, and a pool's P99 falls as its count
  grows, so a plan with any counts whose worst P99 is :math:`W` costs at least the plan sized to SLO :math:`W`:
  the re-solve at :math:`\varepsilon = W` is exact over all counts.

Sweeps (:func:`frontier`)
-------------------------
*Consecutive* (the default; ``ttft`` and ``pools`` always): start at the least-cost plan (second axis
:math:`a_0`), then :math:`\varepsilon_{k+1} = a_k - \delta` (:data:`AXES` gives :math:`\delta`: 1 mW, a relative
:math:`10^{-7}` of the P99, one pool) until no plan is feasible or ``points`` points were found. Every
non-dominated point whose axis value is not within :math:`\delta` of another's is found: for a non-dominated
:math:`(C^*, a^*)` take the last :math:`\varepsilon_k \ge a^*`; its optimum has :math:`C_k \le C^*` and
:math:`a_k < a^* + \delta`, hence equals it. Points a later one dominates (same cost, lower axis) are removed
with :func:`fleetopt.optimizer.workflows.split_table.dominates`.

*Evenly spaced caps* (``power`` with ``points`` given): :math:`\varepsilon_k = a_0 - k (a_0 - a_{min})/(N - 1)`,
:math:`k = 0..N-1`, from the least-cost plan's power :math:`a_0` down to the least power :math:`a_{min}` (a
solve with ``objective=power``). Each cap is solved lexicographically, least cost :math:`C_k` and then least
power at cost :math:`\le C_k (1 + 10^{-9})` (``objective=power`` and ``constraints.max_cost_per_hr``), so every
point is non-dominated; a cap at or above the previous point's power gives that point again and is not solved.

What the re-solves share. A ``ttft`` sweep (batched model) solves on lazily sized candidates
(:class:`~fleetopt.optimizer.plan.candidates.TighteningCandidates`): every candidate keeps the count it had
under the looser SLO, a lower bound, until it is sized at the new one. Each re-solve sizes the candidates that
decided the last point, prunes, sizes the pruned table's (pruning again while a count moves), solves, and
solves again if a chosen candidate's count was not exact; the optimum of this relaxation with exact counts is
the optimum. Other sweeps share one :class:`~fleetopt.optimizer.plan.candidates.SizingCache` (the candidates'
SLO-independent inputs). Points are evaluated without the fleet-wide P99, which no axis reads. On the stress
instance the 20-point cost,ttft curve (36 re-solves, one optimisation each) went from about 51 s to about 17 s.

Recommended point (:func:`recommended_index`) and the knee (:func:`knee_index`)
-------------------------------------------------------------------------------
Every point is judged on the instance itself, not on the variant that found it: its plan is re-evaluated at its
counts under the instance's own SLO (P99 TTFT, the TPOT bound if the instance gives one, under the instance's
``slo.scope``) and its limits (:func:`fleetopt.optimizer.plan.evaluate.limit_violations`: inventories, GPU,
power and budget caps, the utilisation cap). The **recommended** point is the cheapest point that meets that SLO
and breaks no limit (ties: the lower axis value); :attr:`Frontier.recommended_reason` says so in words ("cheapest
point meeting P99 TTFT <= 500 ms"). When no point does, none is recommended and the reason says why.

The **knee** is a labelled alternative, not the recommendation: from the axis-optimal end :math:`(C_0, a_0)` (the
least axis value, the dearest point), the point :math:`k` that saves the most per unit of the axis given up:

.. math:: k^* = \arg\max_{k \ne 0} \frac{C_0 - C_k}{a_k - a_0}

(ties: the cheaper). With one point it is that point. The homogeneous baseline (one pool on one GPU option sized
to its minimum, :func:`fleetopt.optimizer.plan.evaluate.baseline`) is reported next to the curve with its own
axis value and whether a frontier point dominates it. Every number is analytic.

Parallel re-solves (``--workers N``, ``--scheduler ADDRESS``)
-----------------------------------------------------------
Each point is a solve of its own instance, but *which* caps the sweep solves depends on the points before
them: a consecutive sweep's next cap is one step below the last point, and the evenly spaced caps skip a cap the
previous point already satisfies. So the sweeps stay in their serial order and the executor
(:mod:`fleetopt.optimizer.workflows.executor`) solves *ahead*: when the sweep asks for a unit (one solve, or one
cap's lexicographic pair) that is not solved yet, that unit and the next ones the sweep would ask for if no
cap were skipped go out as one batch, as many as the backend runs at once. The sweep then takes the results in
its own order and a unit it does not ask for is dropped, so the points are the serial ones, bit for bit,
however they were run (each solve is deterministic, and a worker solves the same modified instance). What can be
solved ahead:

* ``power`` with ``points`` (evenly spaced caps): the grid is known; the next caps of the grid;
* ``pools``: the integer caps below the requested one (each point's pools at least one fewer);
* ``power`` and ``ttft`` consecutive: nothing (the next cap is a step below the last point's value, unknown
  until it is solved), so these run in this process whatever the backend.

Local processes start with ``spawn`` (:mod:`fleetopt.optimizer.workflows.executor`): this process has run HiGHS
by then, and a child forked from it could wait forever on HiGHS's inherited thread pool.
``solves`` counts the solves the curve rests on (the same for every backend); ``solves_unused`` the solves made
ahead and dropped. The least-cost solve, the start and least-power solves of the even grid and the baseline run
in this process.

References
----------
.. [1] Y. Haimes, L. Lasdon, D. Wismer, "On a bicriterion formulation of the problems of integrated system
   identification and system optimization", IEEE Trans. Systems, Man and Cybernetics 1(3), 1971, pp. 296-297.
.. [2] K. Miettinen, *Nonlinear Multiobjective Optimization*, Kluwer 1999, sec. 3.2 (the epsilon-constraint
   method; lexicographic solves make every point Pareto optimal).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from fleetopt.models.fleet import FleetResult
from fleetopt.models.profiles import replica_unit
from fleetopt.models.queueing.ttft import ttft_model
from fleetopt.models.units import MS_PER_S
from fleetopt.solvers.mip import solve as solve_mip
from fleetopt.solvers.oracle import NoFleetError, shortest_fleet
from fleetopt.solvers.outcome import Termination

from fleetopt.optimizer.errors import InstanceError, SolverError
from fleetopt.optimizer.io.instance import Instance, load_instance
from fleetopt.optimizer.output.contract import SCHEMA_VERSION, build, envelope, physical_gpus
from fleetopt.optimizer.output.contract.workflows import FRONTIER_DOCUMENTS, FRONTIER_POINTS
from fleetopt.optimizer.plan.candidates import Candidates, SizingCache, TighteningCandidates, generate_candidates
from fleetopt.optimizer.plan.evaluate import baseline, evaluate_plans, fleet_spec, limit_violations, pool_plans_of
from fleetopt.optimizer.plan.solve import _pool_plans, _prune, build_problem
from fleetopt.optimizer.workflows.executor import Backend, Task, open_session
from fleetopt.optimizer.workflows.split_table import dominates

__all__ = ["SCHEMA_VERSION", "CSV_COLUMNS", "AXES", "MAX_POINTS", "Axis", "FrontierPoint", "Frontier",
           "parse_axes", "frontier", "knee_index", "recommended_index", "slo_text", "axis_value", "bench_frontier"]

MAX_POINTS = 100
"""Most points a consecutive sweep returns when ``points`` is not given (the JSON says when it stopped there)."""
CSV_COLUMNS = ("rank", "cost_per_hr", "cost_per_year", "axis_value", "axis_unit", "total_gpus", "pools",
               "power_kw", "worst_ttft_p99_ms", "recommended", "constraint", "fleet", "slo_met", "knee")
"""Columns of :meth:`Frontier.to_csv`, in order."""
_COST_REL = 1e-9
"""Lexicographic second stage: the cost cap is the first stage's cost times (1 + this)."""
_SAME_REL = 1e-9
"""Two points whose coordinates agree to this relative tolerance are the same point."""


@dataclass(frozen=True)
class Axis:
    """A second axis: its name, unit, the ``--set`` path that bounds it and the sweep's decrement."""

    name: str
    unit: str
    set_path: str
    delta_abs: float
    delta_rel: float

    def next_cap(self, value: float) -> float:
        """The next consecutive cap below ``value``: :math:`a - \\max(\\delta_{abs}, \\delta_{rel} a)`."""
        return value - max(self.delta_abs, self.delta_rel * abs(value))


AXES = {
    "power": Axis("power", "kW", "constraints.max_power_kw", 1e-6, 0.0),
    "ttft": Axis("ttft", "ms", "slo.ttft_p99_ms", 0.0, 1e-7),
    "pools": Axis("pools", "pools", "pools.max_pools", 1.0, 0.0),
}
"""The second axes ``--axes cost,AXIS`` takes."""


def parse_axes(text: str, field: str = "--axes") -> Axis:
    """``"cost,power"`` -> the power :class:`Axis` (the first axis is always ``cost``).

    Examples
    --------
    >>> parse_axes("cost,pools").name
    'pools'
    >>> parse_axes("cost,bogus")
    Traceback (most recent call last):
    ...
    fleetopt.optimizer.errors.InstanceError: --axes: 'cost,bogus' is not one of cost,power, cost,ttft, cost,pools
    """
    allowed = ", ".join(f"cost,{a}" for a in AXES)
    parts = [p.strip().lower() for p in str(text).split(",")]
    if len(parts) != 2 or parts[0] != "cost" or parts[1] not in AXES:
        raise InstanceError(f"{field}: {text!r} is not one of {allowed}")
    return AXES[parts[1]]


def axis_value(axis: Axis, fleet: FleetResult) -> float:
    """The fleet's value on ``axis``: power (kW), the worst P99 TTFT over pools with traffic (ms), or pools."""
    if axis.name == "power":
        return float(fleet.power_kw)
    if axis.name == "pools":
        return float(len(fleet.pools))
    live = [p.ttft_p99_ms for p in fleet.pools if p.routing_share > 0]
    return float(max(live)) if live else 0.0


@dataclass(frozen=True)
class FrontierPoint:
    """One optimal plan of the curve (module docstring); costs in US$, power in kW, times in ms."""

    fleet: str
    cost_per_hr: float
    cost_per_year: float
    axis_value: float
    total_gpus: int
    pools: int
    power_kw: float
    worst_ttft_p99_ms: float
    constraint: str
    """The ``--set`` override of the solve that found it (``fleetopt solve INSTANCE --set ...`` reproduces it)."""
    slo_met: bool = True
    """The plan meets the *instance's own* SLO (P99 TTFT, TPOT if given, in its scope), re-evaluated at its counts
    (module docstring, "Recommended point")."""
    violations: tuple[str, ...] = ()
    """Every limit of the instance the plan breaks (:func:`fleetopt.optimizer.plan.evaluate.limit_violations`)."""
    worst_tpot_p99_ms: float = 0.0
    """The largest P99 TPOT bound over the pools with traffic (ms)."""
    slo_miss_share: float = 0.0
    """Share of all requests whose TTFT exceeds the instance's SLO (what a fleet-scope SLO bounds by 1 %)."""
    physical_gpus: int = 0
    """Physical GPUs of the plan's pools (:func:`fleetopt.optimizer.output.figures.physical_gpus`): the headline
    count; :attr:`total_gpus` counts the GPUs as the options price them."""

    def to_json(self, axis: Axis, **values) -> dict:
        """Built by the model of ``axis``' points (:data:`fleetopt.optimizer.output.contract.workflows.FRONTIER_POINTS`)
        from these fields: the value on the axis is ``axis_value`` and also sits under the axis' name (on the
        pools axis that key is ``pools``, the pool count); ``values``: ``rank``, ``recommended``, ``knee``."""
        at_axis = {} if axis.name == "pools" else {axis.name: self.axis_value}
        return build(FRONTIER_POINTS[axis.name], self, **at_axis, axis_unit=axis.unit, **values)


@dataclass(frozen=True)
class Frontier:
    """The exact cost trade-off curve of one instance against one axis (module docstring)."""

    instance: str
    axis: Axis
    sweep: str
    """``consecutive`` or ``evenly spaced caps``."""
    points: tuple[FrontierPoint, ...]
    """Non-dominated, by increasing cost (decreasing axis value)."""
    recommended: int | None
    """Index into :attr:`points` of the cheapest point meeting the instance's SLO within its limits
    (:func:`recommended_index`); None when no point does."""
    baseline: FrontierPoint | None
    baseline_dominated: bool | None
    solves: int
    seconds: float
    truncated: bool
    """A consecutive sweep stopped at its point limit before the curve's end."""
    overrides: tuple[str, ...] = ()
    solves_unused: int = 0
    """Solves made ahead on the backend's workers that the sweep did not ask for (module docstring)."""
    backend: str = "serial (this process)"
    recommended_reason: str = ""
    """Why :attr:`recommended` is recommended, or why no point is ("cheapest point meeting P99 TTFT <= 500 ms")."""
    knee: int | None = None
    """Index into :attr:`points` of the knee (:func:`knee_index`), shown as a labelled alternative."""
    slo_ttft_p99_ms: float = math.nan
    """The instance's P99 TTFT SLO (ms) every point is judged on."""
    slo_tpot_p99_ms: float | None = None
    """The instance's P99 TPOT SLO (ms); None without one."""
    slo: str = ""
    """The instance's SLO in words (:func:`slo_text`)."""

    def to_json(self) -> dict:
        """The document of the JSON contract (:class:`fleetopt.optimizer.output.contract.workflows.FrontierDocument`,
        ``schema_version`` :data:`~fleetopt.optimizer.output.contract.SCHEMA_VERSION`). ``recommended`` and
        ``recommended_index`` are the same index (the cheapest point meeting the instance's SLO within its
        limits); ``knee_index`` is the alternative."""
        return build(
            FRONTIER_DOCUMENTS[self.axis.name], self, **envelope(f"pareto --axes cost,{self.axis.name}", self.instance),
            source="analytic; each point an optimal re-solve", axes=["cost", self.axis.name], axis_unit=self.axis.unit,
            points=[p.to_json(self.axis, rank=k + 1, recommended=k == self.recommended, knee=k == self.knee)
                    for k, p in enumerate(self.points)],
            recommended_index=self.recommended,
            recommendation_rule="the cheapest point that meets the instance's own SLO and breaks none of its limits "
                                "(ties: the lower axis value)",
            knee_index=self.knee,
            knee_rule="max (C_axis_opt - C_k) / (a_k - a_axis_opt): most saved per unit of the axis given up, from "
                      "the axis-optimal point",
            baseline=None if self.baseline is None else self.baseline.to_json(self.axis, rank=0, recommended=False,
                                                                               knee=False),
            solve_seconds=self.seconds, overrides=list(self.overrides))

    def to_csv(self) -> str:
        """The points as CSV (:data:`CSV_COLUMNS`)."""
        lines = [",".join(CSV_COLUMNS)]
        for k, p in enumerate(self.points):
            row = {"rank": k + 1, "cost_per_hr": repr(p.cost_per_hr), "cost_per_year": repr(p.cost_per_year),
                   "axis_value": repr(p.axis_value), "axis_unit": self.axis.unit, "total_gpus": p.total_gpus,
                   "pools": p.pools, "power_kw": repr(p.power_kw), "worst_ttft_p99_ms": repr(p.worst_ttft_p99_ms),
                   "recommended": "true" if k == self.recommended else "false", "constraint": p.constraint,
                   "fleet": f'"{p.fleet}"', "slo_met": "true" if p.slo_met else "false",
                   "knee": "true" if k == self.knee else "false"}
            lines.append(",".join(str(row[c]) for c in CSV_COLUMNS))
        return "\n".join(lines) + "\n"


def slo_text(instance: Instance) -> str:
    """The instance's SLO in words: ``P99 TTFT <= 500 ms``, then the scope and the TPOT bound when they apply.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> slo_text(NS(slo=NS(ttft_p99_s=0.5, tpot_p99_s=None, scope="pool")))
    'P99 TTFT <= 500 ms'
    >>> slo_text(NS(slo=NS(ttft_p99_s=0.5, tpot_p99_s=0.05, scope="fleet")))
    'P99 TTFT <= 500 ms over all requests, P99 TPOT <= 50 ms'
    """
    s = instance.slo
    text = f"P99 TTFT <= {s.ttft_p99_s * MS_PER_S:g} ms" + (" over all requests" if s.scope == "fleet" else "")
    return text + ("" if s.tpot_p99_s is None else f", P99 TPOT <= {s.tpot_p99_s * MS_PER_S:g} ms")


def recommended_index(points, slo: str = "the SLO") -> tuple[int | None, str]:
    """The cheapest of ``points`` (:class:`FrontierPoint`) that meets the instance's SLO (``slo_met``) and breaks
    none of its limits (``violations``), ties to the lower axis value, with the reason in words (``slo``: the SLO
    as :func:`slo_text` writes it). ``(None, why)`` when no point qualifies.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> pts = [NS(cost_per_hr=10.0, axis_value=5.0, slo_met=False, violations=()),
    ...        NS(cost_per_hr=12.0, axis_value=2.0, slo_met=True, violations=()),
    ...        NS(cost_per_hr=20.0, axis_value=1.0, slo_met=True, violations=())]
    >>> recommended_index(pts, "P99 TTFT <= 500 ms")
    (1, 'cheapest point meeting P99 TTFT <= 500 ms')
    >>> recommended_index(pts[:1], "P99 TTFT <= 500 ms")
    (None, 'no point meets P99 TTFT <= 500 ms: none recommended')
    """
    ok = [k for k, p in enumerate(points) if p.slo_met and not p.violations]
    within = " within the instance's limits" if any(p.violations for p in points) else ""
    if not ok:
        return None, f"no point meets {slo}{within}: none recommended"
    best = min(ok, key=lambda k: (points[k].cost_per_hr, points[k].axis_value))
    return best, f"cheapest point meeting {slo}{within}"


def knee_index(points) -> int | None:
    """The knee of ``points`` (``(cost, axis)`` pairs, non-dominated, cost increasing), a labelled alternative
    to the recommended point: module docstring. None for no points.

    Examples
    --------
    >>> knee_index([(10.0, 5.0), (12.0, 2.0), (20.0, 1.0)])
    1
    """
    if not points:
        return None
    end = min(range(len(points)), key=lambda k: (points[k][1], points[k][0]))
    best, best_key = end, None
    for k, (c, a) in enumerate(points):
        if k == end or not a > points[end][1]:
            continue
        key = ((points[end][0] - c) / (a - points[end][1]), -c)
        if best_key is None or key > best_key:
            best, best_key = k, key
    return best


# --------------------------------------------------------------------------------------------
# One point: an ordinary solve of a modified instance
# --------------------------------------------------------------------------------------------


def _variant(instance: Instance, settings: dict) -> Instance:
    """``instance`` re-loaded from its file with its own overrides and ``settings`` as ``--set PATH=VALUE``."""
    if instance.path is None:
        raise InstanceError("pareto --axes: the instance must come from a file (each point re-loads it with --set "
                            "overrides)")
    extra = tuple(f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}" for k, v in settings.items())
    return load_instance(instance.path, tuple(instance.overrides) + extra)


class _Solver:
    """Solves variants of one instance; candidates are generated once per SLO (nothing else they read changes)."""

    def __init__(self, instance: Instance, threads: int | None, time_limit_s: float | None, tightening: bool = False):
        self.instance = instance
        self.threads = threads
        self.time_limit_s = time_limit_s
        self.solves = 0
        self._cands: dict[float, Candidates] = {}
        self._evals: dict[str, FleetResult] = {}
        self._sizing = SizingCache()
        self.tightening = tightening
        """Solve on :class:`TighteningCandidates` (a ``ttft`` sweep: every solve's SLO is no looser than the last)."""
        self._lazy: TighteningCandidates | None = None
        self._last_ids = np.zeros(0, dtype=np.int64)

    def candidates(self, inst: Instance) -> Candidates:
        key = inst.slo.ttft_sizing_s
        if key not in self._cands:
            self._cands[key] = _prune(inst, generate_candidates(inst, cache=self._sizing), 1)
        return self._cands[key]

    def solve(self, settings: dict) -> tuple[Instance, FleetResult] | None:
        """The optimal plan of the variant, exactly re-evaluated; None when it is proven infeasible."""
        inst = _variant(self.instance, settings)
        self.solves += 1
        if self.tightening:
            got = self._solve_tightening(inst, settings)
            if got is None:
                return None
            cands, choices = got
        else:
            cands = self.candidates(inst)
            choices = self._optimum(inst, cands, settings)
            if choices is None:
                return None
        plans = _pool_plans(inst, cands, choices)
        key = repr([(p.lo_tokens, p.hi_tokens, p.gpu, p.replicas, p.compress_gamma, p.max_num_seqs) for p in plans])
        if key not in self._evals:
            self._evals[key] = evaluate_plans(inst, plans, fleet_p99=False)  # a point reads pools and totals
        return inst, self._evals[key]

    def _optimum(self, inst: Instance, cands: Candidates, settings: dict) -> tuple[int, ...] | None:
        """An optimal choice set of ``cands`` (graph oracle if separable, else the MIP); None if infeasible."""
        problem = build_problem(inst, cands)
        if problem.separable:
            try:
                return tuple(shortest_fleet(problem)[1])
            except NoFleetError:
                return None
        result = solve_mip(problem, time_limit_s=self.time_limit_s, threads=self.threads, tie_break=False)
        if result.termination in (Termination.INFEASIBLE, Termination.INFEASIBLE_OR_UNBOUNDED):
            return None
        if result.termination is not Termination.OPTIMAL or result.best is None:
            raise SolverError(f"pareto --axes: the solve with {settings} ended {result.termination.value} "
                              "without a proven optimum; the frontier would not be exact (raise --time-limit)")
        return tuple(result.best.choices)

    def _solve_tightening(self, inst: Instance, settings: dict):
        """A ``ttft`` sweep's solve on lazily sized candidates (:class:`TighteningCandidates`): solve the table
        (lower-bound counts, a relaxation), size the chosen candidates exactly, and solve again until none
        changed. The last pruned table's candidates are sized first: they are the ones that may matter, and sizing
        them before pruning saves most re-prunings."""
        if self._lazy is None:
            self._lazy = TighteningCandidates(inst)
        self._lazy.tighten(inst.slo.ttft_sizing_s)
        self._lazy.verify(self._last_ids)     # the candidates that mattered last time first: fewer re-prunings
        while True:
            table, ids = self._lazy.table()
            cands = _prune(inst, table, 1)
            self._last_ids = self._lazy.ids_of(table, ids, cands, np.arange(len(cands)))
            if not self._lazy.verify(self._last_ids):
                continue    # counts moved: prune again before solving
            choices = self._optimum(inst, cands, settings)
            if choices is None:
                return None
            chosen = self._lazy.ids_of(table, ids, cands, cands.choice_pool[list(choices)])
            if self._lazy.verify(chosen):
                return cands, choices


def _run_unit(solver: _Solver, axis: Axis, unit: tuple) -> tuple[Instance, FleetResult] | None:
    """One unit of a sweep on ``solver``: ``("solve", settings)`` -> :meth:`_Solver.solve`; ``("lex", cap)`` -> the
    lexicographic optimum at ``cap`` (:func:`_lexicographic`), None when the cap is infeasible."""
    if unit[0] == "solve":
        return solver.solve(dict(unit[1]))
    cap = {axis.set_path: unit[1]}
    got = solver.solve({"objective": "cost", **cap})
    return None if got is None else _lexicographic(solver, axis, got, cap)


def _unit_task(instance: Instance, threads: int | None, time_limit_s: float | None, candidates: dict,
               axis_name: str, unit: tuple) -> tuple:
    """A unit on a worker (:class:`fleetopt.optimizer.workflows.executor.Task`): ``(result, solves)``, on a fresh
    solver that starts from this process's candidates (``candidates``, by SLO)."""
    solver = _Solver(instance, threads, time_limit_s)
    solver._cands.update(candidates)
    return _run_unit(solver, AXES[axis_name], unit), solver.solves


class _Ahead:
    """The units of a sweep, solved in this process or ahead on an executor session (module docstring, "Parallel
    re-solves"). ``predict(unit)`` lists the units the sweep may ask for next, in its order."""

    def __init__(self, solver: _Solver, axis: Axis, session, predict: Callable[[tuple], list]):
        self.solver, self.axis, self.session, self.predict = solver, axis, session, predict
        self._done: dict[tuple, tuple] = {}

    @property
    def unused(self) -> int:
        return sum(n for _, n in self._done.values())

    def get(self, unit: tuple) -> tuple[Instance, FleetResult] | None:
        if unit not in self._done:
            session = self.session
            ahead = [] if session is None else [u for u in self.predict(unit) if u not in self._done]
            if session is None or not ahead:
                return _run_unit(self.solver, self.axis, unit)
            batch = [unit] + ahead[:session.slots - 1]
            s = self.solver
            tasks = [Task(str(k), _unit_task, (s.instance, s.threads, s.time_limit_s, dict(s._cands), self.axis.name,
                                               u)) for k, u in enumerate(batch)]
            for key, got in session.iter_results(tasks):
                self._done[batch[int(key)]] = got
        result, solves = self._done.pop(unit)
        self.solver.solves += solves
        return result


def _judged(instance: Instance, inst: Instance, fleet: FleetResult) -> FleetResult:
    """``fleet``, solved on the variant ``inst``, as the instance itself judges it: re-evaluated at its counts
    and batch caps under ``instance``'s SLO when the variant's differs (a ``ttft`` cap), else as it is."""
    if inst.slo == instance.slo:
        return fleet
    return evaluate_plans(instance, pool_plans_of(instance, fleet.pools), fleet_p99=False)


def _point(axis: Axis, instance: Instance, inst: Instance, fleet: FleetResult, constraint: str) -> FrontierPoint:
    """A point of the curve from ``fleet`` (solved on the variant ``inst`` of ``instance``), judged on
    ``instance``'s own SLO and limits (:func:`_judged`, :func:`limit_violations`)."""
    live = [p for p in fleet.pools if p.routing_share > 0]
    own = _judged(instance, inst, fleet)
    return FrontierPoint(fleet_spec(inst, fleet) or "", float(fleet.cost_per_hr), float(fleet.cost_per_year),
                         axis_value(axis, fleet), int(fleet.total_gpus), len(fleet.pools), float(fleet.power_kw),
                         float(max(p.ttft_p99_ms for p in live)) if live else 0.0, constraint,
                         bool(own.slo_met), limit_violations(instance, own),
                         float(max(p.tpot_p99_ms for p in live)) if live else 0.0, float(own.slo_miss_share),
                         physical_gpus(fleet, {g.name: replica_unit(g.profile) for g in inst.gpus}))


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= _SAME_REL * max(1.0, abs(a), abs(b))


def _non_dominated(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Drop dominated points and repeats; sort by cost (:func:`dominates`, coordinates compared to
    :data:`_SAME_REL`)."""
    def key(p):
        return (round(p.cost_per_hr, 9), round(p.axis_value, 9))

    unique = {}
    for p in points:
        unique.setdefault(key(p), p)
    pts = list(unique.values())
    kept = [p for p in pts if not any(dominates(key(q), key(p)) for q in pts if q is not p)]
    return sorted(kept, key=lambda p: (p.cost_per_hr, p.axis_value))


def _cap_text(axis: Axis, cap: float) -> str:
    return f"{axis.set_path}={int(cap)}" if axis.name == "pools" else f"{axis.set_path}={cap!r}"


def frontier(instance: Instance, axis: Axis | str, *, points: int | None = None, threads: int | None = None,
             time_limit_s: float | None = None, backend: Backend = Backend(),  # noqa: B008 frozen dataclass default
             on_step: Callable[[str], None] | None = None) -> Frontier:
    """The exact trade-off curve of ``instance``'s least cost against ``axis`` (module docstring).

    Parameters
    ----------
    instance : Instance
        Loaded from a file (each point re-loads it with ``--set`` overrides); length routing. Its objective is
        replaced by ``cost``; its own limits stay.
    axis : Axis or str
        ``power``, ``ttft`` or ``pools`` (:data:`AXES`).
    points : int, optional
        ``power``: that many evenly spaced caps (>= 2); ``ttft``/``pools``: at most that many consecutive points.
        None: the consecutive sweep, at most :data:`MAX_POINTS` points.
    backend : Backend
        Where the re-solves that can be solved ahead run (module docstring, "Parallel re-solves"); the curve is
        the same on every backend.
    on_step : callable, optional
        ``on_step(message)`` after each point's solve, in the sweep's order (one line: its cap and result).

    Raises
    ------
    InstanceError
        A bad axis or ``points``, split routing, a fleet-scope SLO with ``ttft``, an instance without a file.
    InfeasibleError
        No plan satisfies the instance at all (the least-cost solve).
    """
    from fleetopt.optimizer.errors import InfeasibleError

    axis = AXES[axis] if isinstance(axis, str) else axis
    if points is not None and (not isinstance(points, int) or points < (2 if axis.name == "power" else 1)):
        raise InstanceError(f"--points: {points!r} is not a whole number >= {2 if axis.name == 'power' else 1}")
    if instance.pools.routing != "length":
        raise InstanceError("pools.routing: pareto --axes solves length routing only (give --set pools.routing=length)")
    if axis.name == "ttft" and instance.slo.scope != "pool":
        raise InstanceError("slo.scope: the cost,ttft frontier bounds every pool's P99 TTFT, which needs slo.scope "
                            "pool (give --set slo.scope=pool)")
    t0 = time.perf_counter()
    step = on_step if on_step is not None else (lambda message: None)
    with open_session(backend) as session:
        solver = _Solver(instance, threads, time_limit_s,
                         tightening=axis.name == "ttft" and ttft_model(instance.slo.ttft_model).warm_start
                         and instance.pools.disaggregation == "none")   # lazy sizing knows aggregated pools only
        base = {"objective": "cost"}
        first = solver.solve(base)
        if first is None:
            raise InfeasibleError(f"{instance.name}: no plan satisfies the instance (fleetopt solve explains why)")
        found = [_point(axis, instance, *first, "objective=cost")]
        step(_step_text(axis, 1, found[0]))
        truncated = False
        parallel = session if session.slots > 1 else None
        if axis.name == "power" and points is not None:
            found, unused = _even_caps(solver, axis, first, points, parallel, step)
            sweep = "evenly spaced caps"
        else:
            def unit(c):
                return ("solve", tuple(sorted({**base, axis.set_path: int(c) if axis.name == "pools"
                                               else float(c)}.items())))

            def predict(u):      # pools: every integer cap below; power, ttft: unknown (module docstring)
                c = dict(u[1])[axis.set_path]
                return [unit(k) for k in range(int(c) - 1, 0, -1)] if axis.name == "pools" else []

            ahead = _Ahead(solver, axis, parallel, predict)
            limit = MAX_POINTS if points is None else points
            cap = axis.next_cap(found[0].axis_value)
            while True:
                if len(_non_dominated(found)) >= limit:
                    truncated = True
                    break
                if axis.name == "pools" and cap < 1:
                    break
                text = _cap_text(axis, cap)
                got = ahead.get(unit(cap))
                if got is None:
                    step(f"{axis.name} frontier: {text} is infeasible: the curve ends")
                    break
                p = _point(axis, instance, *got, text)
                found.append(p)
                step(_step_text(axis, len(found), p))
                cap = min(axis.next_cap(cap), axis.next_cap(p.axis_value))
            sweep = "consecutive"
            unused = ahead.unused
    kept = _non_dominated(found)
    if truncated and len(kept) > limit:
        kept = kept[:limit]
    knee = knee_index([(p.cost_per_hr, p.axis_value) for p in kept])
    chosen, reason = recommended_index(kept, slo_text(instance))
    b = baseline(instance)
    bp = None if b is None else _point(axis, instance, instance, b, "homogeneous baseline")
    dominated = None if bp is None else any(
        dominates((p.cost_per_hr, p.axis_value), (bp.cost_per_hr, bp.axis_value))
        or (_same(p.cost_per_hr, bp.cost_per_hr) and _same(p.axis_value, bp.axis_value)) for p in kept)
    return Frontier(instance.name, axis, sweep, tuple(kept), chosen, bp, dominated, solver.solves,
                    time.perf_counter() - t0, truncated, tuple(instance.overrides), unused, backend.label,
                    reason, knee, instance.slo.ttft_p99_s * MS_PER_S,
                    None if instance.slo.tpot_p99_s is None else instance.slo.tpot_p99_s * MS_PER_S,
                    slo_text(instance))


def _step_text(axis: Axis, k: int, p: FrontierPoint) -> str:
    return (f"{axis.name} frontier: point {k} ({p.constraint}): ${p.cost_per_hr:,.2f}/hr, "
            f"{p.axis_value:,.6g} {axis.unit}")


def _lexicographic(solver: _Solver, axis: Axis, got: tuple[Instance, FleetResult],
                   cap: dict) -> tuple[Instance, FleetResult]:
    """Second stage: the least power among plans costing at most the first stage's optimum (within
    :data:`_COST_REL`) and within the same cap."""
    c = got[1].cost_per_hr
    budget = c * (1 + _COST_REL)
    own = solver.instance.constraints.max_cost_per_hr
    if own is not None:
        budget = min(budget, own)
    lex = solver.solve({"objective": "power", **cap, "constraints.max_cost_per_hr": float(budget)})
    return lex if lex is not None and lex[1].cost_per_hr <= budget else got


def _even_caps(solver: _Solver, axis: Axis, first: tuple[Instance, FleetResult], n: int, session=None,
               step: Callable[[str], None] = lambda message: None) -> tuple[list[FrontierPoint], int]:
    """The evenly spaced power caps (module docstring), each solved lexicographically (least cost, then least
    power at that cost); the grid's caps solved ahead on ``session`` (module docstring, "Parallel re-solves").
    Returns the points and the solves made ahead and not used."""
    start = _point(axis, solver.instance, *_lexicographic(solver, axis, first, {}), "objective=cost")
    low = solver.solve({"objective": "power"})
    assert low is not None                          # the cost optimum's variant is feasible, so is its least power
    p_min = axis_value(axis, low[1])
    caps = [float(max(cap, p_min)) for cap in np.linspace(start.axis_value, p_min, n)[1:]]
    ahead = _Ahead(solver, axis, session, lambda u: [("lex", c) for c in caps[caps.index(u[1]) + 1:]])
    out, last = [start], start
    for cap in caps:
        if last.axis_value <= cap:
            continue  # the previous point satisfies this cap: it is this cap's lexicographic optimum too
        got = ahead.get(("lex", cap))
        if got is None:  # only the least-power cap can fail, by the solver's feasibility tolerance
            continue
        last = _point(axis, solver.instance, *got, _cap_text(axis, cap))
        out.append(last)
        step(_step_text(axis, len(out), last))
    return out, ahead.unused


def bench_frontier(path: str = "instances/ref_units_stress_60x8.yaml", points: int = 20, threads: int | None = None,
                   axis: str = "power") -> dict:
    """Time a ``points``-point cost,``axis`` frontier of ``path`` (target: under 20 s on 2 cores)."""
    inst = load_instance(path)
    t0 = time.perf_counter()
    f = frontier(inst, axis, points=points, threads=threads)
    wall = time.perf_counter() - t0
    return {"instance": path, "points_requested": points, "points": len(f.points), "solves": f.solves,
            "wall_s": wall, "costs_per_hr": [p.cost_per_hr for p in f.points],
            "power_kw": [p.axis_value for p in f.points]}
