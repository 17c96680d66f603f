"""Writing results: JSON or text to a file (atomically) or stdout, never over a file the command read.

Where a write lands (:func:`write_bytes`):

=====================================  ==========================================================================
the target                             what happens
=====================================  ==========================================================================
``-``                                  standard output
a regular file, or no file yet         a temporary file in the same folder, then :func:`os.replace`: a reader
                                       never sees half a file. An existing file keeps its mode (and, for root,
                                       its owner); a new one gets ``mode`` less the umask (0644 for text, 0755
                                       for a script under the usual umask 022)
a symbolic link                        followed: the file it points at is replaced as above, the link stays
a character device, FIFO or socket     written through (``/dev/null``, ``/dev/stdout``, a shell's ``>(...)``):
                                       never replaced by a rename, which as root would turn ``/dev/null`` into a
                                       regular file
a folder, or a missing folder          refused: one :class:`~fleetopt.optimizer.errors.InstanceError` line
a file the command read                refused (:func:`fleetopt.optimizer.io.files.inputs_read`): the instance,
                                       its workload, catalogue, profile and config files, a plan or result
=====================================  ==========================================================================

:func:`check_target` runs the same checks (less the write) before a command's work, so a read-only folder or a
missing one is reported before a long solve or fit, not after it.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import cast

TEXT_MODE = 0o666
"""Mode of a new output file before the umask (0644 under umask 022)."""
SCRIPT_MODE = 0o777
"""Mode of a new executable script before the umask (0755 under umask 022)."""

__all__ = ["TEXT_MODE", "SCRIPT_MODE", "to_jsonable", "write_json", "write_document", "write_text", "write_bytes",
           "check_target"]


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


def write_json(data: dict, target: str, protect: tuple[Path | None, ...] = ()) -> None:
    """Write ``data`` as JSON to ``target`` ('-' = stdout) by :func:`write_bytes` (flag ``--json``)."""
    write_text(json.dumps(to_jsonable(data), indent=2, sort_keys=False, allow_nan=False) + "\n", target, "--json",
               protect)


def write_document(document: dict, target: str, protect: tuple[Path | None, ...] = ()) -> None:
    """Write a command's ``--json`` document like :func:`write_json`, checked first against the model its
    ``command`` names (:func:`fleetopt.optimizer.output.contract.check_document`): a document that drifts from
    ``fleetopt schema`` is never written."""
    from fleetopt.optimizer.output.contract import check_document

    data = cast("dict", to_jsonable(document))     # a dict comes back a dict
    check_document(data)
    write_text(json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n", target, "--json", protect)


def write_text(text: str, target: str | Path, flag: str = "-o", protect=(), mode: int = TEXT_MODE) -> None:
    """Write ``text`` (UTF-8) to ``target`` ('-' = stdout) by :func:`write_bytes`."""
    if str(target) == "-":
        sys.stdout.write(text)
        return
    write_bytes(text.encode("utf-8"), target, flag, protect, mode)


def _special(path: Path) -> bool:
    """Whether ``path`` (links followed) exists and is neither a regular file nor a folder."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))


def check_target(target: str | os.PathLike, flag: str = "-o", protect=()) -> Path:
    """Check that ``target`` can be written before the work that feeds it; returns the path a write replaces.

    A device, FIFO or socket (or a link to one) is written through and always passes. Otherwise the target (a
    link's target) must not be a folder, its folder must exist and be writable, and it must not be one of
    ``protect`` or a file the command has read (:func:`fleetopt.optimizer.io.files.inputs_read`).

    Raises
    ------
    InstanceError
        One line: ``FLAG: TARGET: what is wrong``.
    """
    from fleetopt.optimizer.errors import InstanceError
    from fleetopt.optimizer.io.files import inputs_read

    text = os.fspath(target)
    if "\0" in text:
        raise InstanceError(f"{flag}: {text!r}: not a usable file name (it contains a NUL byte)")
    path = Path(text)
    if _special(path):
        return path
    real = Path(os.path.realpath(path))
    if text.endswith(os.sep) or real.is_dir():
        raise InstanceError(f"{flag}: {text}: is a folder; give a file name" if real.is_dir()
                            else f"{flag}: {text}: folder {text} does not exist")
    read = inputs_read() | {Path(os.path.realpath(p)) for p in protect if p is not None}
    if real in read:
        raise InstanceError(f"{flag}: {text}: refusing to overwrite an input file of this command")
    folder = real.parent
    if not folder.is_dir():
        raise InstanceError(f"{flag}: {text}: folder {path.parent} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InstanceError(f"{flag}: {text}: folder {path.parent} is not writable")
    if real.exists() and not os.access(real, os.W_OK):
        raise InstanceError(f"{flag}: {text}: the file is not writable")
    return real


def write_bytes(data: bytes, target: str | Path, flag: str = "-o", protect=(), mode: int = TEXT_MODE) -> Path:
    """Write ``data`` to ``target`` as the module docstring's table says; returns the path written.

    Raises
    ------
    InstanceError
        One line naming ``flag`` and the target, for every refusal of :func:`check_target` and for an operating
        system error while writing (a full disk, a read-only file system).
    """
    from fleetopt.optimizer.errors import InstanceError

    if str(target) == "-":
        sys.stdout.buffer.write(data)
        return Path("-")
    path = check_target(target, flag, protect)
    try:
        if _special(path):
            with open(path, "wb") as f:     # no O_TRUNC on a device matters; a FIFO blocks until read, as a shell's
                f.write(data)
            return path
        _replace(path, data, mode)
    except OSError as err:
        raise InstanceError(f"{flag}: {target}: cannot write: {err.strerror or err}") from None
    return path


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a temporary file beside ``path`` (so the rename cannot cross file systems), give it the
    existing file's mode and owner (or ``mode`` less the umask), then rename it over ``path``; on any failure the
    temporary file is removed and ``path`` is untouched."""
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if old is not None:
            os.fchmod(fd, stat.S_IMODE(old.st_mode))
            if os.geteuid() == 0 and (old.st_uid, old.st_gid) != (0, 0):
                os.fchown(fd, old.st_uid, old.st_gid)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, mode & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
