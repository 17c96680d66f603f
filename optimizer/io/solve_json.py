"""One plan of a ``fleetopt solve --json`` file, read and checked once for every command that reads one back:
``export`` (:func:`fleetopt.optimizer.output.export.read_plan`) and ``simulate --plan``
(:func:`fleetopt.optimizer.simulation.plan_files.load_solved_plan`).

:func:`read_solve_plan` checks what every reader needs, in this order, each problem one
:class:`~fleetopt.optimizer.errors.InstanceError` line ``FILE: field: problem``:

1. the file is readable text and parses as JSON;
2. its ``command`` is ``solve``;
3. its ``instance`` is a name (a string; absent only in hand-written files, then the file's stem stands in),
   and, when the caller names the instance it loaded, that name;
4. the plan: without a rank, the plan at the top level (the selected one, the verified choice after
   ``--verify-top``), which must exist (``pools`` non-empty); with rank N, ``solutions[N-1]``, where
   ``solutions`` must be a list holding at least N entries and the entry a mapping;
5. the plan's ``pools`` are a non-empty list.

What the pools must hold is each reader's own business (export needs ``gpus`` and ``profile``, ``simulate``
needs the pools to fit the instance). :func:`json_kind` and :func:`whole_number` are the words and the whole
number test both readers use for a pool's fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.io.files import read_json

__all__ = ["SolvePlan", "read_solve_plan", "json_kind", "whole_number"]

_HINT = "write one with fleetopt solve INSTANCE --json FILE"


def json_kind(value: Any) -> str:
    """How a problem line names a JSON value: ``a mapping``, ``a list``, ``a string``, ``a boolean``, ``null``
    or ``the number 1.5``.

    >>> json_kind({}), json_kind(None), json_kind(1.5), json_kind(True)
    ('a mapping', 'null', 'the number 1.5', 'a boolean')
    """
    names = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), f"the number {value!r}" if isinstance(value, (int, float)) else repr(value))


def whole_number(value: Any, low: int, high: int) -> int | None:
    """``value`` as an int when it is a whole number in ``[low, high]`` (an integral float counts; a boolean, a
    fraction, inf and NaN do not), else None.

    >>> whole_number(2.0, 1, 9), whole_number(2.5, 1, 9), whole_number(True, 0, 9), whole_number(10, 1, 9)
    (2, None, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if low <= value <= high else None


@dataclass(frozen=True)
class SolvePlan:
    """One plan of a solve result as read: the whole document, the chosen plan's mapping and its pools (not yet
    checked one by one), and how problem lines name them."""

    path: Path
    document: dict
    instance: str
    """The instance the plan was solved for (the file's stem when the file does not say)."""
    plan: dict
    """The chosen plan: the document itself (the top-level plan) or ``solutions[rank-1]``."""
    pools: list
    field: str
    """Prefix of the plan's fields in problem lines: ``""`` or ``"solutions[N-1]."``."""
    label: str
    """The plan in words: ``the selected plan`` or ``plan N``."""
    rank: int | None

    def problem(self, field: str, message: str) -> InstanceError:
        """One ``FILE: field: message`` line about this file."""
        return InstanceError(format_problem(self.path, field, message))


def read_solve_plan(path: str | Path, rank: int | None = None, *, flag: str = "--rank",
                    instance: str | None = None) -> SolvePlan:
    """Plan ``rank`` (1-based index into ``solutions``; None: the plan at the top level) of the ``solve --json``
    file ``path``, checked as the module docstring says; ``flag`` names the rank's option in a problem line and
    ``instance``, when given, is the instance the plan must have been solved for."""
    path = Path(path)

    def fail(field: str, message: str) -> InstanceError:
        return InstanceError(format_problem(path, field, message))

    data, problem = read_json(path)
    if problem is not None:
        hint = "; give the JSON file 'fleetopt solve --json' wrote" if data is None and "cannot read" in problem else ""
        raise fail("", problem + hint)
    if not isinstance(data, dict) or data.get("command") != "solve":
        raise fail("command", f"not the JSON output of 'fleetopt solve' ({_HINT})")
    solved_for = data.get("instance", path.stem)
    if not isinstance(solved_for, str) or not solved_for.strip():
        raise fail("instance", f"{json_kind(solved_for)} is not allowed; give the name of the instance solved")
    if instance is not None and solved_for != instance:
        raise fail("instance", f"the plan was solved for instance '{solved_for}', not '{instance}'")
    if rank is None:
        plan, field, label = data, "", "the selected plan"
        if not data.get("pools"):
            raise fail("pools", f"the solve found no plan (status {data.get('status')!r})")
    else:
        solutions = data.get("solutions")
        if not isinstance(solutions, list):
            raise fail("solutions", f"must be a list of solutions; got {json_kind(solutions)}")
        if not 1 <= rank <= len(solutions):
            raise fail("solutions", f"{flag} {rank}: the file holds {len(solutions)} solution(s) "
                                    "(solve with --top N for more)")
        plan, field, label = solutions[rank - 1], f"solutions[{rank - 1}].", f"plan {rank}"
        if not isinstance(plan, dict):
            raise fail(field[:-1], f"must be a mapping with pools (and routing); got {json_kind(plan)}")
    pools = plan.get("pools")
    if not isinstance(pools, list) or not pools:
        got = "an empty list" if pools == [] else json_kind(pools)
        raise fail(f"{field}pools", f"must be a non-empty list of pools; got {got}")
    return SolvePlan(path, data, solved_for, plan, pools, field, label, rank)
