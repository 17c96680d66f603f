"""Why a solver call stopped, in fleetopt's words: one exhaustive table over Pyomo's termination conditions.

The MIPs are solved by HiGHS through Pyomo's solver interface (``pyomo.contrib.solver``, solver
``"highs"``), which reports two separate things: why the solver stopped
(:class:`~pyomo.contrib.solver.common.results.TerminationCondition`) and what it holds
(:class:`~pyomo.contrib.solver.common.results.SolutionStatus`). :data:`TERMINATION` maps every member
of the first to a :class:`Termination`; a condition the table does not list (one a later Pyomo adds)
becomes :attr:`Termination.UNKNOWN` with a :class:`RuntimeWarning`, never a guess. Whether a solution
exists is read from the solution status alone (:func:`outcome_of`), so a limit with an incumbent stays
a limit with an incumbent.

Both the fleet MIP (:mod:`fleetopt.solvers.mip`) and the split-routing MIP
(:mod:`fleetopt.solvers.split`) read their results through :func:`outcome_of`; only the pipeline
(:mod:`fleetopt.optimizer.plan.solve`) turns a termination into a report status, an error or an exit code.

Examples
--------
>>> from pyomo.contrib.solver.common.results import TerminationCondition
>>> termination_of(TerminationCondition.iterationLimit)
<Termination.ITERATION_LIMIT: 'iteration_limit'>
>>> relative_gap(10.0, 9.0)
0.1
"""

from __future__ import annotations

import enum
import math
import warnings
from dataclasses import dataclass
from types import MappingProxyType


__all__ = ["Termination", "TERMINATION", "termination_of", "Outcome", "outcome_of", "relative_gap"]  # noqa: F822


class Termination(enum.Enum):
    """Why a solver stopped. Only ``OPTIMAL``, ``INFEASIBLE`` and ``UNBOUNDED`` are proofs; a limit leaves the
    question open, whether or not the solver holds an incumbent."""

    OPTIMAL = "optimal"
    """Proven optimal within the requested relative gap."""
    TIME_LIMIT = "time_limit"
    """Stopped at the time limit."""
    ITERATION_LIMIT = "iteration_limit"
    """Stopped at an iteration, node or solution-count limit (HiGHS's ``kIterationLimit`` and ``kSolutionLimit``)."""
    OBJECTIVE_LIMIT = "objective_limit"
    """Stopped at an objective bound or target (fleetopt sets neither)."""
    INTERRUPTED = "interrupted"
    """Stopped by an interrupt (Ctrl-C or a callback)."""
    INFEASIBLE = "infeasible"
    """Proven infeasible."""
    INFEASIBLE_OR_UNBOUNDED = "infeasible_or_unbounded"
    """Infeasible or unbounded, not told apart (HiGHS's presolve can stop there)."""
    UNBOUNDED = "unbounded"
    """Proven unbounded."""
    ERROR = "error"
    """The solver failed without a conclusion: an error, a licensing problem, a stalled step (``minStepLength``),
    a point it could not make feasible without proof that none exists (``locallyInfeasible``), an empty model,
    or a claimed optimum without a solution."""
    UNKNOWN = "unknown"
    """The solver gave no reason (Pyomo's ``unknown``), or one this table does not know (with a warning)."""


def _tables() -> tuple[MappingProxyType, frozenset]:
    """:data:`TERMINATION` and the solution statuses that hold a solution, built on first use so that importing
    this module (the graph oracle's path, a report's status table) does not import Pyomo."""
    global _TABLES
    if _TABLES is None:
        from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition

        _TABLES = (MappingProxyType({
            TerminationCondition.convergenceCriteriaSatisfied: Termination.OPTIMAL,
            TerminationCondition.maxTimeLimit: Termination.TIME_LIMIT,
            TerminationCondition.iterationLimit: Termination.ITERATION_LIMIT,
            TerminationCondition.objectiveLimit: Termination.OBJECTIVE_LIMIT,
            TerminationCondition.minStepLength: Termination.ERROR,
            TerminationCondition.unbounded: Termination.UNBOUNDED,
            TerminationCondition.provenInfeasible: Termination.INFEASIBLE,
            TerminationCondition.locallyInfeasible: Termination.ERROR,
            TerminationCondition.infeasibleOrUnbounded: Termination.INFEASIBLE_OR_UNBOUNDED,
            TerminationCondition.error: Termination.ERROR,
            TerminationCondition.interrupted: Termination.INTERRUPTED,
            TerminationCondition.licensingProblems: Termination.ERROR,
            TerminationCondition.emptyModel: Termination.ERROR,
            TerminationCondition.unknown: Termination.UNKNOWN,
        }), frozenset({SolutionStatus.feasible, SolutionStatus.optimal}))
    return _TABLES


_TABLES: tuple[MappingProxyType, frozenset] | None = None


def __getattr__(name: str):
    """``TERMINATION``: Pyomo's termination condition -> fleetopt's, one entry per member
    (``tests/test_solver_outcomes.py`` checks that the table covers the enum); built on first access."""
    if name == "TERMINATION":
        return _tables()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def termination_of(condition) -> Termination:
    """fleetopt's :class:`Termination` of a Pyomo termination condition.

    Parameters
    ----------
    condition : TerminationCondition
        ``results.termination_condition`` of a ``pyomo.contrib.solver`` solve.

    Returns
    -------
    Termination
        The entry of :data:`TERMINATION`; :attr:`Termination.UNKNOWN` for a condition it does not list.

    Warns
    -----
    RuntimeWarning
        For a condition :data:`TERMINATION` does not list (named in the message).
    """
    try:
        return _tables()[0][condition]
    except (KeyError, TypeError):  # TypeError: an unhashable stand-in
        warnings.warn(f"unrecognised solver termination condition {condition!r}: reported as "
                      f"{Termination.UNKNOWN.value!r}", RuntimeWarning, stacklevel=2)
        return Termination.UNKNOWN


def relative_gap(incumbent: float | None, bound: float | None) -> float | None:
    """The relative MIP gap as HiGHS defines it, :math:`|ub - lb| / |ub|` (0 when both are 0).

    None when either side is missing or the bound is not finite.
    """
    if incumbent is None or bound is None or not math.isfinite(bound):
        return None
    if incumbent == 0:
        return 0.0 if bound == 0 else math.inf
    return abs(incumbent - bound) / abs(incumbent)


@dataclass(frozen=True)
class Outcome:
    """What one solver call proved.

    ``condition`` keeps the solver interface's own word (a Pyomo ``TerminationCondition`` name) next to
    fleetopt's ``termination``; ``has_solution`` comes from the solution status only. ``objective`` (the
    incumbent), ``bound`` and ``rel_gap`` (:func:`relative_gap`) are None when absent.
    """

    termination: Termination
    condition: str
    has_solution: bool
    objective: float | None
    bound: float | None
    rel_gap: float | None


def outcome_of(results) -> Outcome:
    """The :class:`Outcome` of a ``pyomo.contrib.solver`` ``Results``.

    A claimed optimum without a solution is a solver fault and becomes :attr:`Termination.ERROR`
    (``condition`` still says what the solver claimed).
    """
    cond = results.termination_condition
    termination = termination_of(cond)
    has_solution = results.solution_status in _tables()[1]
    if termination is Termination.OPTIMAL and not has_solution:
        termination = Termination.ERROR
    ub, lb = results.incumbent_objective, results.objective_bound
    return Outcome(termination, getattr(cond, "name", str(cond)), has_solution,
                   None if ub is None else float(ub), None if lb is None else float(lb), relative_gap(ub, lb))
