"""A solver's answer: :class:`Solution` (one fleet) and :class:`SolveResult` (what the solver proved).

Kept apart from :mod:`fleetopt.solvers.mip` so that the graph oracle's path (and anything that only reads a
result) does not import Pyomo.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetopt.solvers.outcome import Termination

__all__ = ["Solution", "SolveResult"]


@dataclass(frozen=True)
class Solution:
    """One fleet: the chosen replica choices and its objective value."""

    choices: tuple[int, ...]
    objective: float


@dataclass(frozen=True)
class SolveResult:
    """What the solver proved. ``solutions`` are best first (several with ``top > 1``).

    ``termination`` is why the (first) solve stopped (:class:`fleetopt.solvers.outcome.Termination`); with a
    limit, ``solutions`` may still hold the incumbent. ``rel_gap`` is :math:`|ub - lb| / |ub|` as HiGHS
    defines it (None without an incumbent). ``condition`` is the solver interface's own word for why it
    stopped (a Pyomo ``TerminationCondition`` name; empty for the graph oracle).
    """

    termination: Termination
    solutions: tuple[Solution, ...]
    bound: float | None
    rel_gap: float | None
    wall_s: float
    solver: str
    options: dict
    message: str = ""
    tie_break: str = "skipped"
    """Lexicographic tie-break (fewest GPUs, then pools, then least power; least cost under a power objective):
    ``proven``, ``best-effort`` (budget ran out) or ``skipped``."""
    condition: str = ""
    lp_bound: float | None = None
    """The objective of the model's LP relaxation, when the solve was asked for it (the root bound before cuts)."""
    branched: bool = False
    """Whether the (first) fleet came from branch and bound; False when the LP relaxation's optimum was a fleet
    (:func:`fleetopt.solvers.mip.solve`) or another solver answered."""

    @property
    def best(self) -> Solution | None:
        return self.solutions[0] if self.solutions else None
