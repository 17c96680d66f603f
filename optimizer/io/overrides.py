"""``--set PATH=VALUE`` overrides applied to a raw instance mapping before validation.

``PATH`` is dotted (``slo.ttft_p99_ms``); items of ``gpus`` are addressed by
their ``name``, items of other lists by index, either dotted (``gpus.0.profile``)
or in brackets as error lines print them (``gpus[0].profile``). ``VALUE`` is
parsed as YAML, so it keeps its type. A bad override is one problem line labelled
``--set PATH``, like every other input problem, and so is a problem that
validation finds in a value an override set (:func:`attributed_field`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from fleetopt.optimizer.io.schema import Problems, pydantic_field_path, show_value

__all__ = ["apply_overrides", "overridden_copy", "override_settings", "set_flags", "attributed_field"]

_SEGMENT_RE = re.compile(r"^(?P<key>[^\[\]]*)(?P<indices>(?:\[[^\[\]]*\])*)$")
"""One dotted segment of a path: a key, then any number of ``[index]`` suffixes (``gpus[0]``, ``gammas[1]``)."""


def _path_keys(dotted: str) -> list[str] | None:
    """``"gpus[0].profile"`` -> ``["gpus", "0", "profile"]`` (``"gpus.0.profile"`` alike); None when a segment
    is empty or its brackets do not pair.

    Examples
    --------
    >>> _path_keys("gpus[0].profile"), _path_keys("pools.compress.gammas[1]"), _path_keys("gpus[0")
    (['gpus', '0', 'profile'], ['pools', 'compress', 'gammas', '1'], None)
    """
    keys: list[str] = []
    for segment in dotted.strip().split("."):
        m = _SEGMENT_RE.match(segment.strip())
        if m is None:
            return None
        parts = [m["key"].strip()] if m["key"].strip() or not m["indices"] else []
        parts += [i.strip() for i in m["indices"][1:-1].split("][")] if m["indices"] else []
        if not parts or not all(parts):
            return None
        keys += parts
    return keys


def _split_override(text: str) -> tuple[list[str], Any] | str:
    """``"a.b=1"`` -> ``(["a", "b"], 1)``, or an error message."""
    if "=" not in text:
        return f"no '=' in {text!r}; write PATH=VALUE, e.g. gpus.h100.max_count=8"
    dotted, raw_value = text.split("=", 1)
    keys = _path_keys(dotted)
    if keys is None:
        return (f"{dotted.strip()!r} is not a dotted path; write e.g. slo.ttft_p99_ms=400, gpus.h100.max_count=8 "
                "or gpus[0].max_count=8")
    try:
        return keys, yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError as err:
        return f"the value {raw_value!r} is not valid YAML ({getattr(err, 'problem', err)}); quote it"
    except (ValueError, TypeError, OverflowError) as err:  # a scalar YAML cannot build, e.g. 2024-02-30
        return (f"YAML cannot build the value {raw_value.strip()!r} ({' '.join(str(err).split())}); give a number, "
                "or quote it as text")
    except RecursionError:
        return f"the value {raw_value[:20]!r}... is nested too deeply to read as YAML"


def _list_item(items: list, key: str, parent: str) -> int | str:
    """Index of ``key`` in ``items`` (gpus by name, other lists by index), or an error message."""
    if parent == "gpus":
        for i, item in enumerate(items):
            if isinstance(item, Mapping) and str(item.get("name", "")).lower() == key.lower():
                return i
    if key.isdigit() and int(key) < len(items):
        return int(key)
    if parent == "gpus":
        names = [str(g.get("name")) for g in items if isinstance(g, Mapping)]
        index = f" and no item {key} (give an index from 0 to {len(items) - 1})" if key.isdigit() else ""
        return f"no gpu named {key!r}{index}; known: {', '.join(names)}"
    return f"{parent} has no item {key!r}; give an index from 0 to {len(items) - 1}"


def _set_path(data: dict, keys: list[str], value: Any) -> str | tuple:
    """Set ``value`` at ``keys`` in ``data`` (in place); returns an error message, or the location it set
    (``("gpus", 0, "max_count")``: list items by index, as validation's field paths name them)."""
    node: Any = data
    loc: list = []
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        where = ".".join(keys[:depth]) or "the top level"
        if isinstance(node, list):
            index = _list_item(node, key, keys[depth - 1] if depth else "")
            if isinstance(index, str):
                return index
            step: int | str = index
        elif isinstance(node, dict):
            if not last and key not in node:
                node[key] = {}
            step = key
        else:
            return f"{where} is {show_value(node)}, not a mapping or list; it has no key {key!r}"
        loc.append(step)
        parent: Any = node          # the list (step an index) or the mapping (step a key) the branches above chose
        if last:
            parent[step] = value
        else:
            node = parent[step]
    return tuple(loc)


def override_settings(overrides: Sequence[str]) -> dict[str, Any]:
    """What a list of overrides sets: dotted path -> parsed value, the last one of a path winning.

    Two lists that set the same values on the same paths give equal dicts whatever their order or spacing
    (``a.b=1`` and ``a.b = 1.0`` agree, as YAML reads both as the number one). An override that does not
    parse is kept whole, keyed by its text.

    Examples
    --------
    >>> override_settings(["slo.ttft_p99_ms=250", "workload.arrival_rate = 300", "slo.ttft_p99_ms=400"])
    {'slo.ttft_p99_ms': 400, 'workload.arrival_rate': 300}
    """
    out: dict[str, Any] = {}
    for text in overrides:
        parsed = _split_override(str(text))
        if isinstance(parsed, str):
            out[str(text)] = str(text)
        else:
            out[".".join(parsed[0])] = parsed[1]
    return out


def set_flags(overrides: Sequence[str]) -> str:
    r"""The overrides as shell flags, each one single-quoted, so that a printed command carries them verbatim.

    Examples
    --------
    >>> set_flags(["workload.arrival_rate=300", "name=it's"])
    "--set 'workload.arrival_rate=300' --set 'name=it'\\''s'"
    >>> set_flags([])
    ''
    """
    return " ".join("--set '" + str(text).replace("'", "'\\''") + "'" for text in overrides)


def overridden_copy(data: Mapping, overrides: Sequence[str], problems: Problems,
                    fields: dict[str, str] | None = None) -> dict:
    """A deep copy of ``data`` with the overrides applied; each bad one is added to ``problems``.

    ``fields``, when given, receives each field an override set (as validation's problem lines name it:
    ``gpus[0].max_count``) and its flag (``--set gpus.h100.max_count``), the last override of a field
    winning: what :func:`attributed_field` needs to blame the flag for a bad value rather than the file."""
    out = copy.deepcopy(dict(data))
    for text in overrides:
        parsed = _split_override(text)
        label = f"--set {text.split('=', 1)[0].strip()}"
        result = parsed if isinstance(parsed, str) else _set_path(out, *parsed)
        if isinstance(result, str):
            problems.add(label, result)
        elif fields is not None:
            fields[pydantic_field_path(result)] = label
    return out


def attributed_field(field: str, fields: Mapping[str, str]) -> str:
    """The label of a problem at ``field``: the field itself, or the ``--set`` flag that set it (``--set
    workload.arrival_rate``), or that flag and the field when the flag set a section above it (``--set workload:
    workload.cdf``). ``fields`` is what :func:`overridden_copy` gathered.

    Examples
    --------
    >>> fields = {"workload.arrival_rate": "--set workload.arrival_rate", "gpus[0]": "--set gpus.a100"}
    >>> attributed_field("workload.arrival_rate", fields), attributed_field("gpus[0].profile", fields)
    ('--set workload.arrival_rate', '--set gpus.a100: gpus[0].profile')
    >>> attributed_field("slo.ttft_p99_ms", fields)
    'slo.ttft_p99_ms'
    """
    if field in fields:
        return fields[field]
    for at, label in fields.items():
        if at and field.startswith(at) and field[len(at)] in ".[":
            return f"{label}: {field}"
    return field


def apply_overrides(data: Mapping, overrides: Sequence[str], path=None) -> dict:
    """A deep copy of ``data`` with each ``PATH=VALUE`` override applied.

    The value is parsed as YAML, so ``8``, ``0.5``, ``true`` and ``[1, 2]`` keep
    their types. Items of ``gpus`` are addressed by their ``name``, items of
    other lists by index (``gpus.0.profile`` or ``gpus[0].profile``). A new key is allowed here; validation later
    rejects it if the schema does not know it.

    Raises
    ------
    InstanceError
        One line per override that has no ``=``, an empty path segment, a
        value that is not YAML, or a path that walks through a missing list
        item or a scalar.

    Examples
    --------
    >>> apply_overrides({"slo": {"ttft_p99_ms": 500}}, ["slo.ttft_p99_ms=250"])
    {'slo': {'ttft_p99_ms': 250}}
    """
    problems = Problems(path)
    out = overridden_copy(data, overrides, problems)
    problems.raise_if_any()
    return out
