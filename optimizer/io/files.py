"""Reading and parsing the text files a user gives (instances, catalogue files, profile files, config.json): one
place for the I/O and syntax errors, each as one line that says what is wrong and where."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_text", "parse_text", "yaml_message", "json_position"]


def read_text(path: Path) -> tuple[str | None, str | None]:
    """The UTF-8 text of ``path``, or ``(None, why it cannot be read)``."""
    try:
        return path.read_bytes().decode("utf-8"), None
    except FileNotFoundError:
        return None, "no such file"
    except IsADirectoryError:
        return None, "it is a folder, not a file"
    except OSError as err:
        return None, str(err.strerror or err)
    except UnicodeDecodeError as err:
        return None, f"not UTF-8 text ({err.reason} at byte {err.start})"
    except ValueError:      # the operating system refuses the name itself (a NUL byte)
        return None, "not a usable file name (it contains a NUL byte)"


def json_position(err: json.JSONDecodeError) -> str:
    return f"line {err.lineno}, column {err.colno}: {err.msg}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects a key given twice in one mapping."""

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


def yaml_message(err: yaml.YAMLError) -> str:
    """One line: where and what (a reader error, e.g. a control character, has no mark but a byte position)."""
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
        try:
            return yaml.load(text, Loader=_UniqueKeyLoader), None
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
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as err:
        return None, f"TOML syntax error: {err}; fix the file so it parses as TOML"


