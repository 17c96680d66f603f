"""Exception hierarchy and the CLI exit codes it maps to.

Exit codes of the ``fleetopt`` command (:data:`EXIT_CODES`); each error class carries its own as ``exit_code``:

====  =================  ==============================================================================
code  key                meaning
====  =================  ==============================================================================
0     ``ok``             done; for ``solve``: a plan was found, proven optimal or the incumbent of a solve
                         that stopped early (time or iteration limit, interrupt) with its gap. A limit
                         with an incumbent is a result, not an error.
1     ``error``          an internal error, or a solve that ended without a plan because the solver
                         failed or stopped for a reason fleetopt cannot interpret (status ``error`` or
                         ``unknown``; :class:`SolverError`)
2     ``invalid_input``  invalid input (:class:`InstanceError`; click's usage-error code)
3     ``infeasible``     proven: no plan satisfies the instance (status ``infeasible``;
                         :class:`InfeasibleError`)
4     ``time_limit``     the solver stopped at a limit before it found a plan: a time limit (status
                         ``time_limit``) or an iteration, node or solution limit (status
                         ``iteration_limit``, which keeps the time-limit code); the instance may still
                         be feasible (:class:`SolverLimitError`)
5     ``slo_missed``     the fleet judged misses its SLO: ``evaluate`` (a given fleet misses its
                         analytic P99 TTFT, or TPOT, SLO; JSON ``slo_met: false``) and ``simulate``
                         (the simulated fleet misses it; JSON ``slo_met: false``). The output is
                         complete; the code lets a CI job gate on it
6     ``limits_broken``  ``evaluate``: a given fleet meets its SLO but breaks a limit of the
                         instance (GPU inventory ``max_count``/``min_count``, pool counts,
                         ``constraints.max_total_gpus``/``max_power_kw``/``max_cost_per_hr``/
                         ``max_utilization``); the JSON's ``violations`` names each (5 wins when both).
                         ``headroom --fleet``: the fleet breaks such a limit at the instance's rate
                         (JSON ``violations``, ``limits_ok: false``)
130   ``interrupted``    any command stopped by Ctrl-C (SIGINT; one line ``interrupted`` on stderr, local
                         workers stop too), or a solve interrupted before it found a plan (status
                         ``interrupted``; :class:`SolveInterruptedError`); 128 + SIGINT, the shell's code
141   ``broken_pipe``    the reader closed the output pipe early (``fleetopt solve ... | head -1``):
                         the command stops quietly, as a Unix tool SIGPIPE stops (128 + SIGPIPE)
====  =================  ==============================================================================

Only the pipeline turns a solve status into one of these errors
(:func:`fleetopt.optimizer.plan.solve.require_plan`); codes 5 and 6 judge a fleet, not a solve
(:func:`fleetopt.optimizer.api.fleet_exit_code`; ``headroom --fleet`` raises 6 itself,
:mod:`fleetopt.optimizer.commands.workflows`), and 141 and a Ctrl-C's 130 come from the command group
(:mod:`fleetopt.optimizer.cli`).
"""

from __future__ import annotations

__all__ = ["FleetoptError", "InstanceError", "InfeasibleError", "SolverError", "SolverLimitError",
           "SolveInterruptedError", "EXIT_CODES"]

EXIT_CODES = {"ok": 0, "error": 1, "invalid_input": 2, "infeasible": 3, "time_limit": 4, "slo_missed": 5,
              "limits_broken": 6, "interrupted": 130, "broken_pipe": 141}
"""Documented exit codes of the ``fleetopt`` command (see the module docstring)."""


class FleetoptError(Exception):
    """Base class of every error fleetopt raises on purpose."""

    exit_code = EXIT_CODES["error"]


class InstanceError(FleetoptError):
    """Invalid input. ``problems`` holds one line per problem: ``file: field: what is wrong``."""

    exit_code = EXIT_CODES["invalid_input"]

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    @classmethod
    def at(cls, path, field: str, message: str) -> InstanceError:
        return cls(format_problem(path, field, message))


def format_problem(path, field: str, message: str) -> str:
    """The one-line error format: ``<file>: <field>: <message>`` (parts omitted when empty)."""
    parts = [str(p) for p in (path, field) if p not in (None, "")]
    return ": ".join(parts + [message])


class InfeasibleError(FleetoptError):
    """Proven: no plan satisfies the instance; the message names the binding requirement."""

    exit_code = EXIT_CODES["infeasible"]


class SolverError(FleetoptError):
    """A solve ended without a plan and without a proof of infeasibility: the solver failed, or stopped for a
    reason fleetopt cannot interpret. ``status`` is the report's status (``error``, ``unknown``, ...)."""

    exit_code = EXIT_CODES["error"]

    def __init__(self, message: str, status: str = "error"):
        self.status = str(status)
        super().__init__(message)


class SolverLimitError(SolverError):
    """The solver stopped at a time, iteration, node or solution limit before it found a plan (the instance
    may still be feasible)."""

    exit_code = EXIT_CODES["time_limit"]


class SolveInterruptedError(SolverError):
    """The solve was interrupted before it found a plan."""

    exit_code = EXIT_CODES["interrupted"]
