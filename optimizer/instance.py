"""Load, validate and resolve instance files (YAML, JSON or TOML).

An *instance* says what to plan for: the workload (a length CDF or a request
trace, and an arrival rate), the latency SLO, the GPU options, how the context
range may be split into pools, fleet-wide constraints and the objective. A
minimal YAML instance::

    workload: {cdf: builtin:lmsys, arrival_rate: 100}
    slo: {ttft_p99_ms: 500}
    gpus:
      - {name: h100, profile: H100-80GB}
    pools: {max_pools: 2, max_context: 65536}

Input is checked here, once, in two passes:

1. *structure*: pydantic models (``extra="forbid"``, strict types) check keys,
   types and ranges at every level;
2. *meaning*: files are read, catalogue names are looked up, profiles are
   built, boundaries are resolved and cross-field rules are applied.

Every problem of both passes is collected, then one
:class:`~optimizer.errors.InstanceError` is raised with one line per problem,
``<file>: <field>: <what is wrong>; <what is allowed>``. Nothing outside this
module needs to re-check an :class:`Instance`.

Units: rates in requests per second, latencies in seconds inside (ms in the
file), lengths in tokens, counts of physical GPUs for ``max_count`` and
``min_count``.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.profiles import ServingProfile
from models.units import MS_PER_S
from models.workload import DEFAULT_INPUT_FRACTION, LengthDistribution, RequestTrace

from .catalog import BUILTIN_WORKLOADS, Catalog, data_dir, load_catalog
from .errors import InstanceError, format_problem

__all__ = [
    "Instance",
    "GpuOption",
    "WorkloadSpec",
    "SLO",
    "PoolsSpec",
    "Constraints",
    "load_instance",
    "instance_from_dict",
    "apply_overrides",
    "DEFAULT_MAX_UTILIZATION",
    "TRACE_COLUMNS",
    "default_grid_tokens",
]

DEFAULT_MAX_UTILIZATION = 0.85
"""Per-replica utilization cap used when ``constraints.max_utilization`` is absent."""

TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
"""Columns a trace CSV must have (extra columns are ignored)."""

SUFFIXES = (".yaml", ".yml", ".json", ".toml")
"""File extensions :func:`load_instance` reads."""

MAX_CONTEXT_LIMIT_TOKENS = 2**30
"""Largest ``pools.max_context`` (and ``chunk``) accepted: far beyond any model, safe for int64 arithmetic."""

MAX_NUM_SEQS_LIMIT = 2**20
"""Largest ``max_num_seqs`` accepted (a concurrency cap, far beyond any engine)."""

BUILTIN_PREFIX = "builtin:"
_GRID_START_TOKENS = 64
_COMPUTED_ONLY = ("tp", "dtype", "memory_utilization", "max_num_seqs", "kv_layout", "chunk")


# --------------------------------------------------------------------------------------------
# Resolved records (what the rest of fleetopt consumes)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuOption:
    """One GPU option the planner may buy.

    ``max_count`` and ``min_count`` count physical GPUs (a replica of ``profile``
    uses ``profile.gpus_per_replica`` of them); ``max_count`` None means unlimited.
    ``availability`` is the share of time a GPU is up, in (0, 1]. ``kind`` is
    ``"calibrated"`` or ``"computed"``.
    """

    name: str
    profile: ServingProfile
    max_count: int | None
    min_count: int
    availability: float
    kind: str


@dataclass(frozen=True)
class WorkloadSpec:
    """The request stream.

    ``lengths`` is already truncated to ``pools.max_context``; ``truncated_share``
    is the share of requests that were longer and got cut. ``source`` is
    ``builtin:NAME``, the resolved file path or ``inline``. For a trace,
    ``input_fraction`` is the trace's own prompt share of all tokens.
    """

    kind: str
    source: str
    lengths: LengthDistribution | RequestTrace
    truncated_share: float
    arrival_rate_req_per_s: float
    input_fraction: float


@dataclass(frozen=True)
class SLO:
    """Latency targets in seconds (P99), the TTFT model and its scope."""

    ttft_p99_s: float
    ttft_model: str
    scope: str
    tpot_p99_s: float | None


@dataclass(frozen=True)
class PoolsSpec:
    """Pool search space: ``boundaries`` starts with 0, ends with ``max_context_tokens``, increases strictly."""

    max_pools: int
    max_context_tokens: int
    boundaries: tuple[int, ...]
    routing: str


@dataclass(frozen=True)
class Constraints:
    """Fleet-wide limits; None means no limit."""

    max_utilization: float
    max_power_kw: float | None
    max_cost_per_hr: float | None
    max_total_gpus: int | None


@dataclass(frozen=True)
class Instance:
    """A validated, resolved instance."""

    path: Path | None
    name: str
    workload: WorkloadSpec
    slo: SLO
    gpus: tuple[GpuOption, ...]
    pools: PoolsSpec
    constraints: Constraints
    objective: str
    description: str = ""

    def gpu(self, name: str) -> GpuOption:
        """The GPU option called ``name`` (case-insensitive).

        Raises
        ------
        InstanceError
            When no option has that name; the message lists the known names.
        """
        for option in self.gpus:
            if option.name.lower() == name.strip().lower():
                return option
        known = ", ".join(g.name for g in self.gpus)
        raise InstanceError.at(self.path, "gpus", f"unknown gpu {name!r}; known: {known}")


# --------------------------------------------------------------------------------------------
# Raw structure (pass 1)
# --------------------------------------------------------------------------------------------

_PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
_OpenFraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
_PositiveInt = Annotated[int, Field(ge=1)]
_ContextTokens = Annotated[int, Field(ge=1, le=MAX_CONTEXT_LIMIT_TOKENS)]
_GpuName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]


class _Raw(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Workload(_Raw):
    cdf: Any = None
    trace: str | None = None
    arrival_rate: _PositiveFloat | None = None
    input_fraction: _OpenFraction | None = None


class _Slo(_Raw):
    ttft_p99_ms: _PositiveFloat
    tpot_p99_ms: _PositiveFloat | None = None
    ttft_model: Literal["tail", "mean-prefill"] = "tail"
    scope: Literal["pool", "fleet"] = "pool"


class _Gpu(_Raw):
    name: _GpuName
    profile: str | None = None
    hardware: str | None = None
    model: str | None = None
    tp: Literal[1, 2, 4, 8] | None = None
    dtype: Literal["fp16", "bf16", "fp8", "int4"] | None = None
    memory_utilization: _Fraction | None = None
    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_NUM_SEQS_LIMIT)] | None = None
    kv_layout: Literal["sharded", "replicated"] | None = None
    chunk: _ContextTokens | None = None
    max_count: _PositiveInt | None = None
    min_count: Annotated[int, Field(ge=0)] = 0
    availability: _Fraction = 1.0
    cost_per_hr: _PositiveFloat | None = None


class _Pools(_Raw):
    max_pools: _PositiveInt = 1
    max_context: _ContextTokens
    boundaries: Any = "auto"
    routing: Literal["length", "split"] = "length"


class _Constraints(_Raw):
    max_utilization: _Fraction = DEFAULT_MAX_UTILIZATION
    max_power_kw: _PositiveFloat | None = None
    max_cost_per_hr: _PositiveFloat | None = None
    max_total_gpus: _PositiveInt | None = None


class _InstanceRaw(_Raw):
    name: str | None = None
    description: str | None = None
    workload: _Workload
    slo: _Slo
    gpus: Annotated[list[_Gpu], Field(min_length=1)]
    pools: _Pools
    constraints: _Constraints = Field(default_factory=_Constraints)
    objective: Literal["cost", "power", "tok_per_watt"] = "cost"


_SECTION_MODELS: dict[tuple[str, ...], type[_Raw]] = {
    (): _InstanceRaw,
    ("workload",): _Workload,
    ("slo",): _Slo,
    ("gpus",): _Gpu,
    ("pools",): _Pools,
    ("constraints",): _Constraints,
}


# --------------------------------------------------------------------------------------------
# Problem collection and pydantic translation
# --------------------------------------------------------------------------------------------


class _Problems:
    """Collects ``file: field: message`` lines for one instance."""

    def __init__(self, path) -> None:
        self.path = path
        self.lines: list[str] = []

    def add(self, field: str, message: str) -> None:
        self.lines.append(format_problem(self.path, field, message))

    def raise_if_any(self) -> None:
        if self.lines:
            raise InstanceError(self.lines)


def _field_path(loc: Sequence) -> str:
    """``('gpus', 1, 'profile')`` -> ``gpus[1].profile``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _show(value: Any) -> str:
    """A short description of a given value for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed_keys(loc: Sequence) -> str:
    names = tuple(p for p in loc if isinstance(p, str))
    model = _SECTION_MODELS.get(names)
    return ", ".join(model.model_fields) if model else ""


def _pydantic_message(error: dict) -> str:
    """One pydantic error as ``<what is wrong>; <what is allowed>``."""
    kind, given, ctx, loc = error["type"], error.get("input"), error.get("ctx") or {}, error["loc"]
    if kind == "missing":
        return "missing; this key is required"
    if kind == "extra_forbidden":
        return f"unknown key; allowed: {_allowed_keys(loc[:-1])}"
    if kind == "literal_error":
        return f"{_show(given)} is not allowed; choose {ctx['expected'].replace(chr(39), '')}"
    if kind in ("model_type", "dict_type"):
        return f"expected a mapping with keys {_allowed_keys(loc)}; got {_show(given)}"
    if kind == "list_type":
        return f"expected a list; got {_show(given)}"
    if kind == "too_short":
        return f"the list is empty; give at least {ctx.get('min_length', 1)} entry"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return f"{_show(given)} is not an integer; give a whole number"
    if kind in ("float_type", "float_parsing"):
        return f"{_show(given)} is not a number; give a number"
    if kind == "finite_number":
        return f"{_show(given)} is not finite; give a finite number"
    if kind == "string_type":
        return f"{_show(given)} is not a string; give text"
    if kind == "string_pattern_mismatch":
        return f"{_show(given)} is not a valid name; use only letters, digits, '_', '.' and '-'"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        limit = limit if isinstance(limit, int) else f"{limit:g}"
        return f"{_show(given)} is out of range; must be {bounds[kind]} {limit}"
    return f"{error['msg']}; got {_show(given)}"


def _structure_problems(data: dict, problems: _Problems) -> None:
    """Pass 1 over the whole mapping: every key, type and range error."""
    try:
        _InstanceRaw.model_validate(data)
    except ValidationError as err:
        for error in err.errors(include_url=False):
            problems.add(_field_path(error["loc"]), _pydantic_message(error))


def _section(model: type[_Raw], value: Any):
    """``model`` validated from ``value``, or None when it has structural errors (already reported)."""
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------


class _UniqueKeyLoader(yaml.SafeLoader):
    """A safe YAML loader that rejects a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_message(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(err, "problem", None) or str(err)
    return f"YAML syntax error{where}: {what}; fix the file so it parses as YAML"


def _parse_text(text: str, suffix: str) -> tuple[Any, str | None]:
    """Parse ``text`` by file type; returns ``(data, None)`` or ``(None, message)``."""
    if suffix in (".yaml", ".yml"):
        try:
            return yaml.load(text, Loader=_UniqueKeyLoader), None
        except yaml.YAMLError as err:
            return None, _yaml_message(err)
    if suffix == ".json":
        try:
            return json.loads(text), None
        except json.JSONDecodeError as err:
            return None, (f"JSON syntax error at line {err.lineno}, column {err.colno}: {err.msg}; "
                          "fix the file so it parses as JSON")
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as err:
        return None, f"TOML syntax error: {err}; fix the file so it parses as TOML"


def _read_text(path: Path) -> tuple[str | None, str | None]:
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


def _read_instance_file(path: Path, problems: _Problems) -> Any:
    """The parsed content of an instance file, or None after reporting why it cannot be read."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        problems.add("", f"unknown file extension {path.suffix or '(none)'!r}; use {', '.join(SUFFIXES)}")
        return None
    text, reason = _read_text(path)
    if reason is not None:
        problems.add("", f"cannot read the instance file: {reason}; check the path")
        return None
    data, message = _parse_text(text, suffix)
    if message is not None:
        problems.add("", message)
    return data


# --------------------------------------------------------------------------------------------
# Overrides (--set PATH=VALUE)
# --------------------------------------------------------------------------------------------


def _split_override(text: str) -> tuple[list[str], Any] | str:
    """``"a.b=1"`` -> ``(["a", "b"], 1)``, or an error message."""
    if "=" not in text:
        return f"no '=' in {text!r}; write PATH=VALUE, e.g. gpus.h100.max_count=8"
    dotted, raw_value = text.split("=", 1)
    keys = [k.strip() for k in dotted.strip().split(".")]
    if not all(keys):
        return f"{dotted.strip()!r} is not a dotted path; write e.g. slo.ttft_p99_ms=400"
    try:
        return keys, yaml.safe_load(raw_value) if raw_value.strip() else None
    except yaml.YAMLError as err:
        return f"the value {raw_value!r} is not valid YAML ({getattr(err, 'problem', err)}); quote it"


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
        return f"no gpu named {key!r}; known: {', '.join(names)}"
    return f"{parent} has no item {key!r}; give an index from 0 to {len(items) - 1}"


def _set_path(data: dict, keys: list[str], value: Any) -> str | None:
    """Set ``value`` at ``keys`` in ``data`` (in place); returns an error message or None."""
    node: Any = data
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        where = ".".join(keys[:depth]) or "the top level"
        if isinstance(node, list):
            index = _list_item(node, key, keys[depth - 1] if depth else "")
            if isinstance(index, str):
                return index
            key = index
        elif isinstance(node, dict):
            if not last and key not in node:
                node[key] = {}
        else:
            return f"{where} is {_show(node)}, not a mapping or list; it has no key {key!r}"
        if last:
            node[key] = value
        else:
            node = node[key]
    return None


def apply_overrides(data: Mapping, overrides: Sequence[str], path=None) -> dict:
    """A deep copy of ``data`` with each ``PATH=VALUE`` override applied.

    The value is parsed as YAML, so ``8``, ``0.5``, ``true`` and ``[1, 2]`` keep
    their types. Items of ``gpus`` are addressed by their ``name``, items of
    other lists by index. A new key is allowed here; validation later rejects
    it if the schema does not know it.

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
    problems = _Problems(path)
    out = _apply_overrides(data, overrides, problems)
    problems.raise_if_any()
    return out


def _apply_overrides(data: Mapping, overrides: Sequence[str], problems: _Problems) -> dict:
    out = copy.deepcopy(dict(data))
    for text in overrides:
        parsed = _split_override(text)
        label = f"--set {text.split('=', 1)[0].strip()}"
        message = parsed if isinstance(parsed, str) else _set_path(out, *parsed)
        if message:
            problems.add(label, message)
    return out


# --------------------------------------------------------------------------------------------
# Workload (pass 2)
# --------------------------------------------------------------------------------------------


def _resolve_source(text: str, base_dir: Path, field: str, problems: _Problems) -> tuple[Path, str] | None:
    """``builtin:NAME`` or a path relative to ``base_dir`` -> ``(file, source label)``."""
    if text.strip().lower().startswith(BUILTIN_PREFIX):
        key = text.strip()[len(BUILTIN_PREFIX):].strip().lower()
        if key not in BUILTIN_WORKLOADS:
            known = ", ".join(BUILTIN_PREFIX + k for k in BUILTIN_WORKLOADS)
            problems.add(field, f"unknown builtin workload {text!r}; known: {known}")
            return None
        return data_dir() / BUILTIN_WORKLOADS[key], BUILTIN_PREFIX + key
    file = Path(text).expanduser()
    file = file if file.is_absolute() else base_dir / file
    return file, str(file)


def _unreadable(raw: str, file: Path, reason: str) -> str:
    return (f"cannot read {raw!r} (resolved to {file}): {reason}; "
            "give a path relative to the instance file, or builtin:NAME")


def _cdf_points(value: Any) -> tuple[list | None, str | None]:
    """The ``[tokens, fraction]`` list of a parsed CDF (bare list or ``{"cdf": [...]}``)."""
    if isinstance(value, Mapping):
        if "cdf" not in value:
            return None, f"a mapping without a 'cdf' key (keys: {', '.join(map(str, value))})"
        value = value["cdf"]
    if not isinstance(value, list) or not value:
        return None, f"{_show(value)} is not a non-empty list of [tokens, fraction] pairs"
    for i, entry in enumerate(value):
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in entry)
        if not ok:
            shown = repr(entry) if isinstance(entry, list) else _show(entry)
            return None, f"entry {i} is {shown}, not a [tokens, fraction] pair"
    return value, None


def _distribution(points: Any) -> tuple[LengthDistribution | None, str | None]:
    pairs, message = _cdf_points(points)
    if message:
        return None, message
    try:
        return LengthDistribution.from_cdf(pairs), None
    except ValueError as err:
        return None, str(err)


def _read_cdf_file(raw: str, file: Path) -> tuple[LengthDistribution | None, str | None]:
    """The distribution in a JSON CDF file, or ``(None, what is wrong)``."""
    if file.suffix.lower() == ".csv":
        return None, f"{raw!r} is a trace (CSV); give it as workload.trace, or give a JSON CDF here"
    text, reason = _read_text(file)
    if reason is not None:
        return None, _unreadable(raw, file, reason)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        return None, (f"{raw!r} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                      "a CDF file is a JSON list of [tokens, cumulative_fraction] pairs")
    dist, message = _distribution(parsed)
    if message:
        return None, f"{raw!r}: {message}; a CDF must be non-decreasing and end at 1"
    return dist, None


def _load_cdf(raw: Any, base_dir: Path, problems: _Problems) -> tuple[LengthDistribution, str] | None:
    """``(distribution, source)`` from an inline list, ``builtin:NAME`` or a JSON file."""
    field = "workload.cdf"
    if isinstance(raw, list):
        dist, message = _distribution(raw)
        if message:
            problems.add(field, f"inline CDF: {message}; give [[tokens, cumulative_fraction], ...] ending at 1")
        return (dist, "inline") if dist is not None else None
    if not isinstance(raw, str):
        problems.add(field, f"{_show(raw)} is not a CDF; give a JSON file path, builtin:NAME "
                            "or a list of [tokens, fraction] pairs")
        return None
    resolved = _resolve_source(raw, base_dir, field, problems)
    if resolved is None:
        return None
    dist, message = _read_cdf_file(raw, resolved[0])
    if message:
        problems.add(field, message)
        return None
    return dist, resolved[1]


def _parse_int_cell(cell: str) -> int | None:
    try:
        return int(cell)
    except ValueError:
        try:
            value = float(cell)
        except ValueError:
            return None
        return int(value) if value.is_integer() else None


def _parse_trace_rows(reader: csv.DictReader) -> tuple[list[tuple[float, int, int]], list[str]]:
    """Rows as ``(arrived_at_s, prompt, output)``; bad rows as messages naming the row."""
    rows, bad = [], []
    for number, row in enumerate(reader, start=1):
        cells = [(row.get(c) or "").strip() for c in TRACE_COLUMNS]
        try:
            arrived = float(cells[0])
        except ValueError:
            arrived = math.nan
        prompt, output = _parse_int_cell(cells[1]), _parse_int_cell(cells[2])
        if not math.isfinite(arrived) or arrived < 0:
            bad.append(f"row {number} (line {number + 1}): arrived_at {cells[0]!r} is not a number >= 0")
        elif prompt is None or prompt < 0 or output is None or output < 0:
            bad.append(f"row {number} (line {number + 1}): token counts {cells[1]!r}, {cells[2]!r} "
                       "are not whole numbers >= 0")
        else:
            rows.append((arrived, prompt, output))
    return rows, bad


def _read_trace(file: Path, raw: str) -> tuple[RequestTrace | None, str | None]:
    text, reason = _read_text(file)
    if reason is not None:
        return None, _unreadable(raw, file, reason)
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in TRACE_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        return None, (f"trace {raw!r} lacks column(s) {', '.join(missing)}; "
                      f"a trace CSV needs a header with {', '.join(TRACE_COLUMNS)}")
    try:
        rows, bad = _parse_trace_rows(reader)
    except csv.Error as err:
        return None, f"trace {raw!r} is not valid CSV ({err})"
    if bad:
        more = f" ({len(bad)} bad rows in all)" if len(bad) > 1 else ""
        return None, f"trace {raw!r}: {bad[0]}{more}; fix or remove the row"
    if not rows:
        return None, f"trace {raw!r} has no data rows; a trace needs at least one request"
    arrived, prompt, output = (np.asarray(col) for col in zip(*rows))
    try:
        return RequestTrace(arrived.astype(float), prompt.astype(np.int64), output.astype(np.int64)), None
    except ValueError as err:
        return None, f"trace {raw!r}: {err}"


def _load_trace(raw: str, base_dir: Path, problems: _Problems):
    """``(RequestTrace, source)`` from ``builtin:NAME`` or a CSV file."""
    field = "workload.trace"
    resolved = _resolve_source(raw, base_dir, field, problems)
    if resolved is None:
        return None
    file, source = resolved
    trace, message = _read_trace(file, raw)
    if message:
        problems.add(field, message)
        return None
    return trace, source


def _trace_rate(trace: RequestTrace, given: float | None, problems: _Problems) -> float | None:
    if given is not None:
        return given
    rate = trace.mean_rate_req_per_s
    if not (math.isfinite(rate) and rate > 0):
        problems.add("workload.arrival_rate", "the trace spans no time, so it has no mean rate; "
                                              "give arrival_rate (req/s)")
        return None
    return rate


class _LoadedWorkload(NamedTuple):
    """A workload read from its source, before truncation (``input_fraction`` None for a trace)."""

    kind: str
    source: str
    lengths: LengthDistribution | RequestTrace
    arrival_rate_req_per_s: float
    input_fraction: float | None


def _resolve_workload(raw: _Workload, base_dir: Path, problems: _Problems) -> _LoadedWorkload | None:
    """The workload a valid ``workload`` section describes, or None after reporting why not."""
    has_cdf, has_trace = raw.cdf is not None, raw.trace is not None
    if has_cdf == has_trace:
        which = "both cdf and trace are given" if has_cdf else "neither cdf nor trace is given"
        problems.add("workload", f"{which}; give exactly one of them")
        return None
    if has_trace:
        if raw.input_fraction is not None:
            problems.add("workload.input_fraction", "only applies to a cdf workload; a trace carries its own "
                                                    "prompt and output lengths, remove it")
        loaded = _load_trace(raw.trace, base_dir, problems)
        if loaded is None:
            return None
        trace, source = loaded
        rate = _trace_rate(trace, raw.arrival_rate, problems)
        return None if rate is None else _LoadedWorkload("trace", source, trace, rate, None)
    if raw.arrival_rate is None:
        problems.add("workload.arrival_rate", "missing; a cdf workload needs an arrival rate (req/s > 0)")
    loaded = _load_cdf(raw.cdf, base_dir, problems)
    if loaded is None or raw.arrival_rate is None:
        return None
    fraction = DEFAULT_INPUT_FRACTION if raw.input_fraction is None else raw.input_fraction
    return _LoadedWorkload("cdf", loaded[1], loaded[0], raw.arrival_rate, fraction)


def _workload_spec(loaded: _LoadedWorkload, max_context_tokens: int) -> WorkloadSpec:
    """Cut requests at the context window; a trace's input fraction is its own prompt share."""
    cut, share = loaded.lengths.truncated(max_context_tokens)
    fraction = loaded.input_fraction
    if isinstance(cut, RequestTrace):
        fraction = float(np.sum(cut.prompt_tokens) / np.sum(cut.total_tokens))
    return WorkloadSpec(loaded.kind, loaded.source, cut, share, loaded.arrival_rate_req_per_s, fraction)


# --------------------------------------------------------------------------------------------
# GPU options (pass 2)
# --------------------------------------------------------------------------------------------


def _lookup(catalog: Catalog, kind: str, name: str, field: str, problems: _Problems):
    try:
        return catalog.find(kind, name)
    except KeyError as err:
        problems.add(field, str(err.args[0]))
        return None


def _builder_field(message: str, prefix: str) -> str:
    """The gpu field a profile builder's ValueError is about (by the words it uses)."""
    text = message.lower()
    for word, field in (("fp8", "dtype"), ("int4", "dtype"), ("dtype", "dtype"),
                        ("memory_utilization", "memory_utilization"), ("max_num_seqs", "max_num_seqs"),
                        ("kv_layout", "kv_layout"), ("chunk", "chunk"), ("tp", "tp"),
                        ("tensor", "tp"), ("memory", "tp"), ("fit", "tp")):
        if re.search(rf"\b{word}", text):
            return f"{prefix}.{field}"
    return prefix


def _computed_profile(raw: _Gpu, catalog: Catalog, prefix: str, problems: _Problems):
    """A roofline profile for ``hardware`` x ``model`` under the entry's serving config."""
    hardware = _lookup(catalog, "hardware", raw.hardware, f"{prefix}.hardware", problems)
    model = _lookup(catalog, "models", raw.model, f"{prefix}.model", problems)
    if hardware is None or model is None:
        return None
    from models.roofline import computed_profile  # written alongside; imported only when needed

    options = {"gpu_memory_utilization": raw.memory_utilization, "max_num_seqs": raw.max_num_seqs,
               "kv_layout": raw.kv_layout, "chunk_tokens": raw.chunk}
    try:
        return computed_profile(hardware, model, tp=raw.tp or 1, dtype=raw.dtype or "fp16",
                                defaults=catalog.defaults, **{k: v for k, v in options.items() if v is not None})
    except ValueError as err:
        problems.add(_builder_field(str(err), prefix), f"{err}; change the serving config or the hardware")
        return None


def _gpu_kind(raw: _Gpu, prefix: str, problems: _Problems) -> str | None:
    """``calibrated`` or ``computed`` from which keys are given, or None after reporting."""
    computed = raw.hardware is not None or raw.model is not None
    if raw.profile is not None and computed:
        problems.add(prefix, "both profile and hardware/model are given; give either profile "
                             "(calibrated) or hardware + model (computed)")
        return None
    if raw.profile is not None:
        extra = [k for k in _COMPUTED_ONLY if getattr(raw, k) is not None]
        for key in extra:
            problems.add(f"{prefix}.{key}", "only applies to a computed profile (hardware + model); "
                                            "remove it or replace profile by hardware + model")
        return None if extra else "calibrated"
    if not computed:
        problems.add(prefix, "neither profile nor hardware + model is given; give one of them")
        return None
    for key in ("hardware", "model"):
        if getattr(raw, key) is None:
            problems.add(f"{prefix}.{key}", "missing; a computed profile needs both hardware and model")
    return "computed" if raw.hardware is not None and raw.model is not None else None


def _with_cost(profile, cost_usd_per_hr: float | None, prefix: str, problems: _Problems):
    if cost_usd_per_hr is None:
        return profile
    if not dataclasses.is_dataclass(profile):
        problems.add(f"{prefix}.cost_per_hr", "this profile's price cannot be overridden; remove cost_per_hr")
        return None
    return dataclasses.replace(profile, cost_usd_per_hr=float(cost_usd_per_hr))


def _count_problems(raw: _Gpu, profile, prefix: str, problems: _Problems) -> None:
    per_replica = int(getattr(profile, "gpus_per_replica", 1))
    if raw.max_count is not None and raw.max_count < per_replica:
        problems.add(f"{prefix}.max_count", f"{raw.max_count} GPUs cannot form one replica, which needs "
                                            f"{per_replica}; give max_count >= {per_replica} or omit it")
    if raw.max_count is not None and raw.min_count > raw.max_count:
        problems.add(f"{prefix}.min_count", f"{raw.min_count} exceeds max_count {raw.max_count}; "
                                            "give min_count <= max_count")


def _resolve_gpu(raw: _Gpu, index: int, catalog: Catalog, problems: _Problems) -> GpuOption | None:
    prefix = f"gpus[{index}]"
    kind = _gpu_kind(raw, prefix, problems)
    if kind == "calibrated":
        profile = _lookup(catalog, "profiles", raw.profile, f"{prefix}.profile", problems)
    elif kind == "computed":
        profile = _computed_profile(raw, catalog, prefix, problems)
    else:
        return None
    if profile is None:
        return None
    before = len(problems.lines)
    _count_problems(raw, profile, prefix, problems)
    profile = _with_cost(profile, raw.cost_per_hr, prefix, problems)
    if profile is None or len(problems.lines) > before:
        return None
    return GpuOption(raw.name, profile, raw.max_count, raw.min_count, raw.availability, kind)


def _duplicate_names(raws: list[_Gpu | None], problems: _Problems) -> None:
    first: dict[str, int] = {}
    for i, raw in enumerate(raws):
        if raw is None:
            continue
        key = raw.name.lower()
        if key in first:
            problems.add(f"gpus[{i}].name", f"duplicate name {raw.name!r} (also gpus[{first[key]}]); "
                                            "gpu names must be unique (case-insensitive)")
        else:
            first[key] = i


def _resolve_gpus(data: dict, problems: _Problems) -> list[GpuOption] | None:
    """Every GPU option, or None when any entry has a problem."""
    items = data.get("gpus")
    if not isinstance(items, list) or not items:
        return None
    raws = [_section(_Gpu, item) for item in items]
    _duplicate_names(raws, problems)
    catalog = load_catalog()
    options = [None if raw is None else _resolve_gpu(raw, i, catalog, problems) for i, raw in enumerate(raws)]
    return None if any(o is None for o in options) else options


def _largest_context_tokens(profile: ServingProfile, upper_tokens: int) -> int:
    """Largest context ``c <= upper_tokens`` with ``n_slots(c) >= 1`` (0 if none); n_slots falls with c."""
    lo, hi = 0, upper_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(profile.n_slots(mid)) >= 1:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _check_context_fits(options: list[GpuOption], max_context_tokens: int, problems: _Problems) -> None:
    if any(int(o.profile.n_slots(max_context_tokens)) >= 1 for o in options):
        return
    best = max(_largest_context_tokens(o.profile, max_context_tokens) for o in options)
    if best == 0:
        problems.add("pools.max_context", f"no listed GPU holds a {max_context_tokens}-token context, nor any "
                                          "context at all (n_slots(1) = 0 for every option: no room for a KV "
                                          "cache); add a GPU (or tp) with memory to spare")
        return
    problems.add("pools.max_context", f"no listed GPU holds a {max_context_tokens}-token context "
                                      f"(n_slots < 1 for every option); the largest any listed GPU holds is "
                                      f"{best} tokens; lower max_context or add a GPU that holds it")


# --------------------------------------------------------------------------------------------
# Pools (pass 2)
# --------------------------------------------------------------------------------------------


def default_grid_tokens(max_context_tokens: int) -> tuple[int, ...]:
    """Powers of two and 1.5x powers of two from 64, below ``max_context_tokens``.

    Examples
    --------
    >>> default_grid_tokens(1000)
    (64, 96, 128, 192, 256, 384, 512, 768)
    """
    grid, power = [], _GRID_START_TOKENS
    while power < max_context_tokens:
        grid += [t for t in (power, power * 3 // 2) if t < max_context_tokens]
        power *= 2
    return tuple(grid)


def _auto_boundaries(lengths, max_context_tokens: int) -> tuple[int, ...]:
    if isinstance(lengths, LengthDistribution):
        points = {int(round(t)) for t in lengths.breakpoints}
        return tuple(sorted(t for t in points if 0 < t < max_context_tokens))
    return default_grid_tokens(max_context_tokens)


def _explicit_boundaries(value: Any, max_context_tokens: int, problems: _Problems) -> tuple[int, ...] | None:
    field = "pools.boundaries"
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        shown = repr(value) if isinstance(value, list) else _show(value)
        problems.add(field, f"{shown} is not allowed; "
                            "give auto or a list of whole token counts")
        return None
    outside = [v for v in value if not 0 < v < max_context_tokens]
    if outside:
        problems.add(field, f"{outside[0]} is outside (0, {max_context_tokens}); give inner boundaries only "
                            "(0 and max_context are added)")
    steps = [i for i in range(1, len(value)) if value[i] <= value[i - 1]]
    if steps:
        i = steps[0]
        problems.add(field, f"not increasing: entry {i} ({value[i]}) follows {value[i - 1]}; "
                            "list boundaries in strictly increasing order")
    return None if outside or steps else tuple(value)


def _resolve_boundaries(raw: _Pools, lengths, problems: _Problems) -> tuple[int, ...] | None:
    value = raw.boundaries
    if isinstance(value, str) and value.strip().lower() == "auto":
        if lengths is None:
            return None
        inner = _auto_boundaries(lengths, raw.max_context)
    else:
        inner = _explicit_boundaries(value, raw.max_context, problems)
        if inner is None:
            return None
    return (0, *inner, raw.max_context)


# --------------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------------


def _slo(raw: _Slo) -> SLO:
    tpot = None if raw.tpot_p99_ms is None else raw.tpot_p99_ms / MS_PER_S
    return SLO(raw.ttft_p99_ms / MS_PER_S, raw.ttft_model, raw.scope, tpot)


def _constraints(raw: _Constraints) -> Constraints:
    return Constraints(raw.max_utilization, raw.max_power_kw, raw.max_cost_per_hr, raw.max_total_gpus)


def _resolve(data: dict, path: Path | None, problems: _Problems) -> Instance | None:
    """Both passes over a raw mapping; an :class:`Instance` when no problem was found."""
    _structure_problems(data, problems)
    base_dir = (path.parent if path is not None else Path.cwd()).absolute()
    workload_raw = _section(_Workload, data.get("workload"))
    workload = None if workload_raw is None else _resolve_workload(workload_raw, base_dir, problems)
    options = _resolve_gpus(data, problems)
    pools_raw = _section(_Pools, data.get("pools"))
    boundaries = None
    if pools_raw is not None:
        boundaries = _resolve_boundaries(pools_raw, None if workload is None else workload.lengths, problems)
        if options is not None:
            _check_context_fits(options, pools_raw.max_context, problems)
    if problems.lines:
        return None
    raw = _InstanceRaw.model_validate(data)
    return Instance(
        path=path,
        name=raw.name or (path.stem if path is not None else "instance"),
        workload=_workload_spec(workload, raw.pools.max_context),
        slo=_slo(raw.slo),
        gpus=tuple(options),
        pools=PoolsSpec(raw.pools.max_pools, raw.pools.max_context, boundaries, raw.pools.routing),
        constraints=_constraints(raw.constraints),
        objective=raw.objective,
        description=raw.description or "",
    )


def instance_from_dict(data: Mapping, path: str | Path | None = None, overrides: Sequence[str] = ()) -> Instance:
    """Validate and resolve an instance given as a mapping (e.g. from a notebook).

    Parameters
    ----------
    data : Mapping
        The instance as parsed from a file; it is not modified.
    path : str or Path, optional
        The file it came from: names the file in error lines, and relative
        workload paths resolve against its folder (the current folder if None).
    overrides : sequence of str
        ``PATH=VALUE`` strings applied before validation (see :func:`apply_overrides`).

    Returns
    -------
    Instance

    Raises
    ------
    InstanceError
        With every problem found, one line each.
    """
    problems = _Problems(path)
    path = None if path is None else Path(path)
    if not isinstance(data, Mapping):
        problems.add("", f"the top level must be a mapping of keys ({_allowed_keys(())}); got {_show(data)}")
        problems.raise_if_any()
    data = _apply_overrides(data, overrides, problems)
    instance = _resolve(data, path, problems)
    problems.raise_if_any()
    return instance


def load_instance(path: str | Path, overrides: Sequence[str] = ()) -> Instance:
    """Read, validate and resolve the instance file at ``path`` (never writes to it).

    Parameters
    ----------
    path : str or Path
        A ``.yaml``/``.yml``, ``.json`` or ``.toml`` file.
    overrides : sequence of str
        ``--set`` strings ``dotted.path=value`` applied before validation.

    Returns
    -------
    Instance

    Raises
    ------
    InstanceError
        With every problem found (unreadable file, syntax, unknown keys, wrong
        types or ranges, unknown names, bad workload files, ...), one line each,
        each starting with ``path`` as given.

    See Also
    --------
    instance_from_dict : the same from an already parsed mapping.
    """
    problems = _Problems(path)
    data = _read_instance_file(Path(path), problems)
    problems.raise_if_any()
    if data is None:
        problems.add("", f"the file is empty; the top level must be a mapping of keys ({_allowed_keys(())})")
        problems.raise_if_any()
    return instance_from_dict(data, path, overrides)
