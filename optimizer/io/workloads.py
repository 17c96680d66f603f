"""File input for instances: instance files, CDF JSON files, trace CSVs and ``builtin:`` names.

Everything that touches the file system while loading an instance lives here:

* instance files in YAML (a key given twice is an error), JSON or TOML, whose
  syntax errors name the line;
* the workload an instance's ``workload`` section names: a length CDF (a JSON
  file holding ``[[tokens, fraction], ...]`` or ``{"cdf": [...]}``, or the same
  list inline) or a request trace (a CSV with :data:`TRACE_COLUMNS`), given
  as a path relative to the instance file or as ``builtin:NAME``.

Each reader reports what is wrong through a
:class:`~fleetopt.optimizer.io.schema.Problems` and returns None instead of raising.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetopt.models.workload import DEFAULT_INPUT_FRACTION, LengthDistribution, RequestTrace

from fleetopt.optimizer.io.catalog import BUILTIN_WORKLOADS, data_dir
from fleetopt.optimizer.io.files import json_position, parse_text, read_text
from fleetopt.optimizer.io.schema import MAX_CONTEXT_LIMIT_TOKENS, Problems, RawWorkload, show_value

__all__ = ["read_instance_file", "load_workload", "LoadedWorkload", "TRACE_COLUMNS", "SUFFIXES", "BUILTIN_PREFIX"]

TRACE_COLUMNS = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
"""Columns a trace CSV must have (extra columns are ignored)."""

SUFFIXES = (".yaml", ".yml", ".json", ".toml")
"""File extensions :func:`~fleetopt.optimizer.io.instance.load_instance` reads."""

BUILTIN_PREFIX = "builtin:"
"""Prefix naming a workload shipped with the package (see :data:`fleetopt.optimizer.io.catalog.BUILTIN_WORKLOADS`)."""


# --------------------------------------------------------------------------------------------
# Instance files
# --------------------------------------------------------------------------------------------


def read_instance_file(path: Path, problems: Problems) -> Any:
    """The parsed content of an instance file, or None after reporting why it cannot be read."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        problems.add("", f"unknown file extension {path.suffix or '(none)'!r}; use {', '.join(SUFFIXES)}")
        return None
    text, reason = read_text(path)
    if reason is not None:
        problems.add("", f"cannot read the instance file: {reason}; check the path")
        return None
    assert text is not None                         # read_text gives the text exactly when no reason
    data, message = parse_text(text, suffix)
    if message is not None:
        problems.add("", message)
    return data


# --------------------------------------------------------------------------------------------
# Workload sources
# --------------------------------------------------------------------------------------------


def _resolve_source(text: str, base_dir: Path, field: str, problems: Problems) -> tuple[Path, str] | None:
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
        return None, f"{show_value(value)} is not a non-empty list of [tokens, fraction] pairs"
    for i, entry in enumerate(value):
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in entry)
        if not ok:
            return None, f"entry {i} is {show_value(entry, spell_lists=True)}, not a [tokens, fraction] pair"
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
    text, reason = read_text(file)
    if reason is not None:
        return None, _unreadable(raw, file, reason)
    assert text is not None                         # read_text gives the text exactly when no reason
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        return None, (f"{raw!r} is not valid JSON ({json_position(err)}); "
                      "a CDF file is a JSON list of [tokens, cumulative_fraction] pairs")
    dist, message = _distribution(parsed)
    if message:
        return None, f"{raw!r}: {message}; a CDF must be non-decreasing and end at 1"
    return dist, None


def _load_cdf(raw: Any, base_dir: Path, problems: Problems) -> tuple[LengthDistribution, str] | None:
    """``(distribution, source)`` from an inline list, ``builtin:NAME`` or a JSON file."""
    field = "workload.cdf"
    if isinstance(raw, list):
        dist, message = _distribution(raw)
        if message:
            problems.add(field, f"inline CDF: {message}; give [[tokens, cumulative_fraction], ...] ending at 1")
        return (dist, "inline") if dist is not None else None
    if not isinstance(raw, str):
        problems.add(field, f"{show_value(raw)} is not a CDF; give a JSON file path, builtin:NAME "
                            "or a list of [tokens, fraction] pairs")
        return None
    resolved = _resolve_source(raw, base_dir, field, problems)
    if resolved is None:
        return None
    dist, message = _read_cdf_file(raw, resolved[0])
    if message:
        problems.add(field, message)
        return None
    assert dist is not None                         # _read_cdf_file gives a distribution or a message
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
        elif prompt + output > MAX_CONTEXT_LIMIT_TOKENS:
            bad.append(f"row {number} (line {number + 1}): token counts {cells[1][:30]!r}, {cells[2][:30]!r} "
                       f"add up to more than {MAX_CONTEXT_LIMIT_TOKENS:,} tokens, the largest context fleetopt "
                       "reads")
        else:
            rows.append((arrived, prompt, output))
    return rows, bad


def _read_trace(file: Path, raw: str) -> tuple[RequestTrace | None, str | None]:
    text, reason = read_text(file)
    if reason is not None:
        return None, _unreadable(raw, file, reason)
    assert text is not None                         # read_text gives the text exactly when no reason
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


def _load_trace(raw: str, base_dir: Path, problems: Problems) -> tuple[RequestTrace, str] | None:
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
    assert trace is not None                        # _read_trace gives a trace or a message
    return trace, source


# --------------------------------------------------------------------------------------------
# The workload section
# --------------------------------------------------------------------------------------------


def _trace_rate(trace: RequestTrace, given: float | None, problems: Problems) -> float | None:
    if given is not None:
        return given
    rate = trace.mean_rate_req_per_s
    if not (math.isfinite(rate) and rate > 0):
        problems.add("workload.arrival_rate", "the trace spans no time, so it has no mean rate; "
                                              "give arrival_rate (req/s)")
        return None
    return rate


class LoadedWorkload(NamedTuple):
    """A workload read from its source, before truncation (``input_fraction`` None for a trace)."""

    kind: str
    source: str
    lengths: LengthDistribution | RequestTrace
    arrival_rate_req_per_s: float
    input_fraction: float | None


def _synthetic(raw: RawWorkload, problems: Problems) -> LoadedWorkload | None:
    """A lognormal-mixture workload (no file involved)."""
    syn = raw.synthetic
    assert syn is not None                          # load_workload calls this for a synthetic section only
    if raw.arrival_rate is None:
        problems.add("workload.arrival_rate", "missing; a synthetic workload needs an arrival rate (req/s > 0)")
        return None
    dist = LengthDistribution.from_lognormal_mixture([c.weight for c in syn.mixture],
                                                     [c.median_tokens for c in syn.mixture],
                                                     [c.sigma for c in syn.mixture], syn.max_tokens, syn.points)
    parts = ", ".join(f"{c.weight:g} x lognormal(median {c.median_tokens:g}, sigma {c.sigma:g})" for c in syn.mixture)
    fraction = DEFAULT_INPUT_FRACTION if raw.input_fraction is None else raw.input_fraction
    return LoadedWorkload("cdf", f"synthetic: {parts}", dist, raw.arrival_rate, fraction)


def load_workload(raw: RawWorkload, base_dir: Path, problems: Problems) -> LoadedWorkload | None:
    """The workload a structurally valid ``workload`` section describes, or None after reporting why not.

    Relative paths resolve against ``base_dir`` (the instance file's folder).
    """
    given = [k for k in ("cdf", "trace", "synthetic") if getattr(raw, k) is not None]
    if len(given) != 1:
        which = f"{' and '.join(given)} are given" if given else "none of cdf, trace or synthetic is given"
        problems.add("workload", f"{which}; give exactly one of them")
        return None
    if raw.synthetic is not None:
        return _synthetic(raw, problems)
    if raw.trace is not None:
        if raw.input_fraction is not None:
            problems.add("workload.input_fraction", "only applies to a cdf workload; a trace carries its own "
                                                    "prompt and output lengths, remove it")
        loaded = _load_trace(raw.trace, base_dir, problems)
        if loaded is None:
            return None
        trace, source = loaded
        rate = _trace_rate(trace, raw.arrival_rate, problems)
        return None if rate is None else LoadedWorkload("trace", source, trace, rate, None)
    if raw.arrival_rate is None:
        problems.add("workload.arrival_rate", "missing; a cdf workload needs an arrival rate (req/s > 0)")
    loaded = _load_cdf(raw.cdf, base_dir, problems)
    if loaded is None or raw.arrival_rate is None:
        return None
    fraction = DEFAULT_INPUT_FRACTION if raw.input_fraction is None else raw.input_fraction
    return LoadedWorkload("cdf", loaded[1], loaded[0], raw.arrival_rate, fraction)
