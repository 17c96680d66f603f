"""Reading and parsing the text files a user gives (instances, catalogue files, profile files, config.json): one
place for the I/O and syntax errors, each as one line that says what is wrong and where."""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import stat
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

# yaml and tomllib load with the first file parsed: every command imports this module (input_scope), --help too

__all__ = ["MAX_INPUT_BYTES", "read_bytes", "read_text", "parse_text", "yaml_message", "json_position",
           "input_scope", "inputs_read"]

MAX_INPUT_BYTES = 512 * 2**20
"""The largest input file read (512 MiB): a trace of ten million requests is under 300 MiB; past this a file is
not one a user meant to give (a disk image, a log)."""

_READ: contextvars.ContextVar[set[Path] | None] = contextvars.ContextVar("fleetopt_inputs_read", default=None)


@contextlib.contextmanager
def input_scope() -> Iterator[set[Path]]:
    """Within the block, every file :func:`read_bytes` reads is recorded (resolved), so that no output of the
    same command is written over it (:func:`fleetopt.optimizer.output.writes.check_target`). The command group opens
    one scope per command; outside a scope (a notebook calling the API) nothing is recorded."""
    token = _READ.set(set())
    try:
        yield _READ.get()   # type: ignore[misc]
    finally:
        _READ.reset(token)


def inputs_read() -> set[Path]:
    """The resolved paths read so far in the current :func:`input_scope` (empty outside one)."""
    return set(_READ.get() or ())


def read_bytes(path: Path, limit: int = MAX_INPUT_BYTES) -> tuple[bytes | None, str | None]:
    """The bytes of the regular file ``path``, or ``(None, why it cannot be read)``.

    Only a regular file (or a link to one) of at most ``limit`` bytes is read: a FIFO would block and a device
    such as ``/dev/zero`` never ends, so both are refused before a byte is read (the file is opened non-blocking,
    then checked with ``fstat``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, "no such file"
    except IsADirectoryError:
        return None, "it is a folder, not a file"
    except OSError as err:
        return None, str(err.strerror or err)
    except ValueError:      # the operating system refuses the name itself (a NUL byte)
        return None, "not a usable file name (it contains a NUL byte)"
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return None, "it is a folder, not a file"
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if (
                stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) else "a socket or other special file"
            return None, f"not a regular file ({kind}); give a file"
        if st.st_size > limit:
            return None, f"{st.st_size:,} bytes, over the {limit:,}-byte limit of an input file"
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as err:
        return None, str(err.strerror or err)
    finally:
        os.close(fd)
    if len(data) > limit:
        return None, f"over the {limit:,}-byte limit of an input file"
    read = _READ.get()
    if read is not None:
        read.add(Path(os.path.realpath(path)))
    return data, None


def read_text(path: Path) -> tuple[str | None, str | None]:
    """The UTF-8 text of the regular file ``path`` (:func:`read_bytes`), or ``(None, why it cannot be read)``."""
    data, reason = read_bytes(path)
    if data is None:
        return None, reason
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text ({err.reason} at byte {err.start})"


def read_json(path: Path) -> tuple[Any, str | None]:
    """The parsed JSON of the regular file ``path`` (:func:`read_text`), or ``(None, problem)`` with problem
    ``cannot read it: WHY``, ``JSON nested too deeply to read`` or ``not JSON (line N: MESSAGE)``: the reading of a
    result file fleetopt wrote (a solve's plan, a side of ``diff``)."""
    text, reason = read_text(path)
    if text is None:
        return None, f"cannot read it: {reason}"
    try:
        return json.loads(text), None
    except RecursionError:
        return None, "JSON nested too deeply to read"
    except json.JSONDecodeError as err:
        return None, f"not JSON (line {err.lineno}: {err.msg})"


def json_position(err: json.JSONDecodeError) -> str:
    return f"line {err.lineno}, column {err.colno}: {err.msg}"


@cache
def _unique_key_loader() -> type:
    """A safe YAML loader that rejects a key given twice in one mapping (the class is built on first use)."""
    import yaml

    class _UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)):
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r}", key_node.start_mark)
                    seen.add(key)  # a list or mapping key is not hashable: the base class rejects it
            return super().construct_mapping(node, deep=deep)

    return _UniqueKeyLoader


def yaml_message(err) -> str:
    """One line of a ``yaml.YAMLError``: where and what (a reader error, e.g. a control character, has no mark but a
    byte position)."""
    import yaml

    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    if isinstance(err, yaml.reader.ReaderError):
        where, what = f" at character {err.position}", f"unacceptable character {err.character!r}"
    else:
        what = getattr(err, "problem", None) or str(err)
    return f"YAML syntax error{where}: {' '.join(str(what).split())}; fix the file so it parses as YAML"


def parse_text(text: str, suffix: str) -> tuple[Any, str | None]:
    """Parse ``text`` by file type; returns ``(data, None)`` or ``(None, message)``."""
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.load(text, Loader=_unique_key_loader()), None
        except yaml.YAMLError as err:
            return None, yaml_message(err)
        except (ValueError, TypeError, OverflowError) as err:  # a scalar YAML cannot build, e.g. 2024-02-30
            return None, f"YAML value error: {' '.join(str(err).split())}; fix the file so it parses as YAML"
        except RecursionError:
            return None, "YAML nested too deeply to read; fix the file so it parses as YAML"
    if suffix == ".json":
        try:
            return json.loads(text), None
        except json.JSONDecodeError as err:
            return None, f"JSON syntax error at {json_position(err)}; fix the file so it parses as JSON"
        except RecursionError:
            return None, "JSON nested too deeply to read; fix the file so it parses as JSON"
    import tomllib

    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as err:
        return None, f"TOML syntax error: {err}; fix the file so it parses as TOML"


