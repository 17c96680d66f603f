"""Writing results: JSON to a file (atomically) or stdout, never over a user's input."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

FORMATS = ("table", "plain", "markdown", "csv")
"""Values of every command's ``--format``: ``table`` (boxed; a table wider than the terminal is split into
column groups that each repeat the row's key, or stacked one row per block when even that does not fit: a cell is
never cut), ``plain`` (aligned columns, no box, colour or markup, never wrapped), ``markdown`` (pipe tables) and
``csv`` (one CSV block per table, its title and every prose line as a ``#`` comment line)."""

__all__ = ["FORMATS", "to_jsonable", "write_json", "write_text"]


def to_jsonable(obj):
    """Replace non-finite floats with None (JSON has no inf/nan) and tuples with lists, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return to_jsonable(obj.item())
    return obj


def write_json(data: dict, target: str, protect: tuple[Path, ...] = ()) -> None:
    """Write ``data`` as JSON to ``target`` ('-' = stdout) atomically (temp file + rename).

    Refuses to overwrite any path in ``protect`` (the user's instance file).
    """
    write_text(json.dumps(to_jsonable(data), indent=2, sort_keys=False, allow_nan=False) + "\n", target, "--json",
               protect)


def write_text(text: str, target: str | Path, flag: str = "-o", protect=()) -> None:
    """Write ``text`` to ``target`` ('-' = stdout) atomically: a temp file in the same folder, then a rename.

    Refuses to overwrite any path in ``protect`` (the user's inputs: instance, workload, plan or measurement
    files) and needs the folder to exist; each refusal is one :class:`InstanceError` line naming ``flag``.
    """
    from fleetopt.optimizer.errors import InstanceError

    if str(target) == "-":
        sys.stdout.write(text)
        return
    path = Path(target)
    if any(path.resolve() == Path(p).resolve() for p in protect if p is not None):
        raise InstanceError(f"{flag}: {target}: refusing to overwrite an input file")
    if not path.parent.is_dir():
        raise InstanceError(f"{flag}: {target}: folder {path.parent} does not exist")
    if path.is_dir():
        raise InstanceError(f"{flag}: {target}: is a folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
