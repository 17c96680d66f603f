"""Exception hierarchy and the CLI exit codes it maps to."""

from __future__ import annotations

__all__ = ["FleetoptError", "InstanceError", "InfeasibleError", "SolverError", "EXIT_CODES"]

EXIT_CODES = {"ok": 0, "invalid_input": 2, "infeasible": 3, "time_limit": 4}
"""Documented exit codes of the ``fleetopt`` command."""


class FleetoptError(Exception):
    """Base class of every error fleetopt raises on purpose."""

    exit_code = 1


class InstanceError(FleetoptError):
    """Invalid input. ``problems`` holds one line per problem: ``file: field: what is wrong``."""

    exit_code = EXIT_CODES["invalid_input"]

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))

    @classmethod
    def at(cls, path, field: str, message: str) -> "InstanceError":
        return cls(format_problem(path, field, message))


def format_problem(path, field: str, message: str) -> str:
    """The one-line error format: ``<file>: <field>: <message>`` (parts omitted when empty)."""
    parts = [str(p) for p in (path, field) if p not in (None, "")]
    return ": ".join(parts + [message])


class InfeasibleError(FleetoptError):
    """No plan satisfies the instance; the message names the binding requirement."""

    exit_code = EXIT_CODES["infeasible"]


class SolverError(FleetoptError):
    """The solver failed or stopped without a plan."""

    exit_code = EXIT_CODES["time_limit"]
