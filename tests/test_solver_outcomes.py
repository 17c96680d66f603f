"""Solver outcomes: every Pyomo termination condition has a fleetopt meaning, every meaning a report status,
every status without a plan its typed error and documented exit code; real HiGHS solves that stop at a limit
or prove infeasibility say so; SolveOptions rejects values it would otherwise misread."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition

from fleetopt.optimizer.api import load
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import (EXIT_CODES, FleetoptError, InfeasibleError, SolveInterruptedError,
                                       SolverError, SolverLimitError)
from fleetopt.optimizer.plan.candidates import generate_candidates
from fleetopt.optimizer.plan.solve import (STATUS, SolveOptions, SolveStatus, build_problem, require_plan,
                                           solve_instance)
from fleetopt.solvers import mip
from fleetopt.solvers.outcome import TERMINATION, Termination, outcome_of, relative_gap, termination_of

# ------------------------------------------------------------------ the tables


def test_every_pyomo_termination_condition_is_mapped_explicitly():
    assert set(TERMINATION) == set(TerminationCondition)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a condition that fell through to the default would warn
        mapped = {c: termination_of(c) for c in TerminationCondition}
    assert all(isinstance(t, Termination) for t in mapped.values())
    # no relabelling: a limit is the limit it is, and only a proof is called infeasible
    assert mapped[TerminationCondition.convergenceCriteriaSatisfied] is Termination.OPTIMAL
    assert mapped[TerminationCondition.maxTimeLimit] is Termination.TIME_LIMIT
    assert mapped[TerminationCondition.iterationLimit] is Termination.ITERATION_LIMIT
    assert mapped[TerminationCondition.interrupted] is Termination.INTERRUPTED
    assert mapped[TerminationCondition.objectiveLimit] is Termination.OBJECTIVE_LIMIT
    assert mapped[TerminationCondition.provenInfeasible] is Termination.INFEASIBLE
    assert mapped[TerminationCondition.infeasibleOrUnbounded] is Termination.INFEASIBLE_OR_UNBOUNDED
    assert mapped[TerminationCondition.unbounded] is Termination.UNBOUNDED
    assert [c for c, t in mapped.items() if t is Termination.INFEASIBLE] == [TerminationCondition.provenInfeasible]
    assert [c for c, t in mapped.items() if t is Termination.UNKNOWN] == [TerminationCondition.unknown]


def test_an_unknown_condition_is_unknown_with_a_warning():
    class Future(enum.Enum):
        quantumLimit = 99

    with pytest.warns(RuntimeWarning, match="quantumLimit"):
        assert termination_of(Future.quantumLimit) is Termination.UNKNOWN
    with pytest.warns(RuntimeWarning, match="unrecognised solver termination"):
        assert termination_of(object()) is Termination.UNKNOWN
    results = SimpleNamespace(termination_condition=Future.quantumLimit, solution_status=SolutionStatus.feasible,
                              incumbent_objective=12.0, objective_bound=10.0)
    with pytest.warns(RuntimeWarning, match="quantumLimit"):
        out = outcome_of(results)
    assert out.termination is Termination.UNKNOWN and out.condition == "quantumLimit"
    assert out.has_solution and out.objective == 12.0 and out.rel_gap == pytest.approx(2 / 12)


def test_a_claimed_optimum_without_a_solution_is_an_error():
    results = SimpleNamespace(termination_condition=TerminationCondition.convergenceCriteriaSatisfied,
                              solution_status=SolutionStatus.noSolution, incumbent_objective=None,
                              objective_bound=None)
    out = outcome_of(results)
    assert out.termination is Termination.ERROR and out.condition == "convergenceCriteriaSatisfied"
    assert not out.has_solution and out.rel_gap is None


def test_relative_gap_is_highs_definition():
    assert relative_gap(10.0, 9.0) == pytest.approx(0.1)
    assert relative_gap(-10.0, -11.0) == pytest.approx(0.1)
    assert relative_gap(0.0, 0.0) == 0.0
    assert relative_gap(None, 1.0) is None and relative_gap(1.0, None) is None
    assert relative_gap(1.0, -math.inf) is None


def test_every_termination_has_one_report_status():
    assert set(STATUS) == set(Termination)
    assert STATUS[Termination.ITERATION_LIMIT] is SolveStatus.ITERATION_LIMIT
    assert STATUS[Termination.INTERRUPTED] is SolveStatus.INTERRUPTED
    assert STATUS[Termination.UNKNOWN] is SolveStatus.UNKNOWN
    # the JSON contract keeps its strings
    assert [s.value for s in (SolveStatus.OPTIMAL, SolveStatus.TIME_LIMIT, SolveStatus.INFEASIBLE,
                              SolveStatus.ERROR)] == ["optimal", "time_limit", "infeasible", "error"]
    assert SolveStatus.OPTIMAL == "optimal" and json.dumps(SolveStatus.TIME_LIMIT) == '"time_limit"'


NO_PLAN = {  # status -> (error, documented exit code)
    SolveStatus.INFEASIBLE: (InfeasibleError, 3),
    SolveStatus.TIME_LIMIT: (SolverLimitError, 4),
    SolveStatus.ITERATION_LIMIT: (SolverLimitError, 4),
    SolveStatus.INTERRUPTED: (SolveInterruptedError, 130),
    SolveStatus.ERROR: (SolverError, 1),
    SolveStatus.UNKNOWN: (SolverError, 1),
    SolveStatus.OPTIMAL: (SolverError, 1),
}


@pytest.mark.parametrize("status", list(SolveStatus))
def test_no_plan_raises_the_typed_error_of_its_status(status):
    error, code = NO_PLAN[status]
    with pytest.raises(error) as info:
        require_plan(SimpleNamespace(plans=(), status=status, explanation="why"))
    assert type(info.value) is error and info.value.exit_code == code and "why" in str(info.value)
    assert code in EXIT_CODES.values()
    # plain strings (a report read back from JSON) work too
    with pytest.raises(error):
        require_plan(SimpleNamespace(plans=(), status=status.value, explanation=""))
    # a plan is a result whatever the status (a limit with an incumbent is not an error)
    with_plan = SimpleNamespace(plans=("plan",), status=status, explanation="")
    assert require_plan(with_plan) is with_plan


def test_solver_errors_share_one_base():
    for error in (InfeasibleError, SolverError, SolverLimitError, SolveInterruptedError):
        assert issubclass(error, FleetoptError)
    assert issubclass(SolverLimitError, SolverError) and issubclass(SolveInterruptedError, SolverError)
    assert SolverLimitError("x", SolveStatus.ITERATION_LIMIT).status == "iteration_limit"


# ------------------------------------------------------------------ SolveOptions


def test_bogus_method_is_rejected():
    with pytest.raises(ValueError, match=r"method: 'bogus' is not one of 'auto', 'mip', 'oracle'"):
        SolveOptions(method="bogus")


@pytest.mark.parametrize("field,value", [
    ("top", 0), ("top", -1), ("top", 1.5), ("top", True),
    ("time_limit_s", 0), ("time_limit_s", -1.0), ("time_limit_s", math.nan), ("time_limit_s", "10"),
    ("mip_gap", -0.01), ("mip_gap", 1.5), ("mip_gap", math.nan), ("mip_gap", None),
    ("threads", 0), ("threads", 2.0),
])
def test_bad_solve_options_name_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"{field}: {repr(value).replace('(', '.').replace(')', '.')}"):
        SolveOptions(**{field: value})


def test_solve_options_report_every_problem_at_once_and_accept_good_values():
    with pytest.raises(ValueError) as info:
        SolveOptions(method="MIP", top=0, mip_gap=2)
    assert all(f in str(info.value) for f in ("method: 'MIP'", "top: 0", "mip_gap: 2"))
    SolveOptions(top=np.int64(3), time_limit_s=math.inf, mip_gap=1, threads=4, method="oracle")
    SolveOptions(time_limit_s=0.5, threads=None, verbose=[])


# ------------------------------------------------------------------ real HiGHS solves


@pytest.fixture(scope="module")
def stress(repo_root):
    # the slot model's larger counts make the power cap bind, so HiGHS needs nodes beyond the root (the
    # iteration-limit tests need an unsolved root); under the batched default the first incumbent is optimal
    inst = load(repo_root / "instances" / "ref_units_stress_60x8.yaml", ["slo.ttft_model=tail"])
    return inst, build_problem(inst, generate_candidates(inst))


def test_time_limit_without_incumbent_is_reported_as_such(stress):
    inst, _ = stress
    rep = solve_instance(inst, SolveOptions(method="mip", time_limit_s=1e-6))
    assert rep.status is SolveStatus.TIME_LIMIT and not rep.plans
    assert "time limit" in rep.explanation and "may still be feasible" in rep.explanation
    with pytest.raises(SolverLimitError) as info:
        require_plan(rep)
    assert info.value.exit_code == EXIT_CODES["time_limit"] == 4


def test_time_limit_exit_code_through_the_cli(repo_root):
    res = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "ref_units_stress_60x8.yaml"),
                                    "--time-limit", "1e-6", "--json", "-"])
    assert "Traceback" not in res.output
    r = json.loads(res.stdout)
    assert res.exit_code == 4 and r["status"] == "time_limit" and r["pools"] is None
    assert "time limit" in r["explanation"]


def _pyomo_highs(model, **solver_options):
    """A direct HiGHS solve of ``model`` with extra HiGHS options (node or solution limits fleetopt does not set)."""
    solver, opts = mip._highs(None, 0.0, None, False)
    opts["solver_options"] = {**opts["solver_options"], **solver_options}
    return outcome_of(solver.solve(model, **opts))


@pytest.mark.slow
def test_iteration_limits_are_iteration_limits(stress):
    """HiGHS's node limit (``kIterationLimit``) and improving-solution limit (``kSolutionLimit``) both come through
    Pyomo as ``iterationLimit``: reported as ITERATION_LIMIT, never as a time limit, with the incumbent if any."""
    _, problem = stress
    none = _pyomo_highs(mip.build_model(problem), mip_max_nodes=0)
    assert none.termination is Termination.ITERATION_LIMIT and none.condition == "iterationLimit"
    assert not none.has_solution and none.objective is None and none.rel_gap is None
    assert STATUS[none.termination] is SolveStatus.ITERATION_LIMIT
    first = _pyomo_highs(mip.build_model(problem), mip_max_improving_sols=1)
    assert first.termination is Termination.ITERATION_LIMIT and first.has_solution
    assert first.objective is not None and first.bound is not None and first.bound <= first.objective + 1e-9
    assert first.rel_gap == pytest.approx(relative_gap(first.objective, first.bound))


def test_a_limit_with_an_incumbent_is_a_result(repo_root):
    rep = solve_instance(load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"), SolveOptions(method="mip"))
    assert rep.status is SolveStatus.OPTIMAL and rep.plans
    for status in (SolveStatus.TIME_LIMIT, SolveStatus.ITERATION_LIMIT, SolveStatus.INTERRUPTED):
        limited = dataclasses.replace(rep, status=status)
        assert require_plan(limited) is limited


def test_a_limit_does_not_outlive_its_solve(stress):
    """Pyomo's HiGHS interface is persistent: a re-solve without a limit must not inherit the last one."""
    _, problem = stress
    model = mip.build_model(problem)
    solver, limited = mip._highs(1e-6, 0.0, None, False)
    assert outcome_of(solver.solve(model, **limited)).termination is Termination.TIME_LIMIT
    _, free = mip._highs(None, 0.0, None, False)
    assert outcome_of(solver.solve(model, **free)).termination is Termination.OPTIMAL


@pytest.mark.parametrize("instance,override,method", [
    ("instances/ref_puzzle1_lmsys_a100.yaml", "constraints.max_power_kw=1.5", "mip"),
    ("tests/data/agent_split_units.yaml", "constraints.max_total_gpus=1", "mip (split routing)"),
])
def test_infeasible_instances_raise_and_exit_3(repo_root, instance, override, method):
    path = repo_root / instance
    rep = solve_instance(load(path, [override]))
    assert rep.status is SolveStatus.INFEASIBLE and rep.method == method and not rep.plans and rep.explanation
    with pytest.raises(InfeasibleError) as info:
        require_plan(rep)
    assert info.value.exit_code == 3 and rep.explanation in str(info.value)
    res = CliRunner().invoke(main, ["solve", str(path), "--set", override, "--json", "-"])
    assert res.exit_code == EXIT_CODES["infeasible"] == 3 and "Traceback" not in res.output
    r = json.loads(res.stdout)
    assert r["status"] == "infeasible" and r["explanation"] == rep.explanation and r["pools"] is None
