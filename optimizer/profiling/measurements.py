"""Measured serving profiles: measurement files in, a fitted profile file out.

Measurement files (format in ``docs/profile_fit.md``; the shipped example is ``data/measurements/``):

* a *decode* CSV, recognised by its header (:data:`DECODE_COLUMNS`, optional :data:`DECODE_OPTIONAL`):
  one decode iteration of ``batch`` sequences all at ``context_tokens`` took ``iteration_s_median`` seconds;
* a *prefill* CSV (:data:`PREFILL_COLUMNS`, optional :data:`PREFILL_OPTIONAL`): one whole prompt of
  ``prompt_tokens`` took ``time_s_median`` seconds;
* an optional *meta* JSON (:data:`META_FIELDS`): idle power, board power limit, memory, weights and the
  model's shape.

Every row must name the same ``hardware`` (a catalogue GPU, aliases allowed), ``model``, ``dtype`` and ``tp``.
Problems are collected and raised as one :class:`~fleetopt.optimizer.errors.InstanceError` (exit code 2), one
line each: ``FILE: row N, column C: problem`` for a CSV (row N is line N of the file, the header is row 1) and
``FILE: field: problem`` for the JSON.

The profile built from a fit (:func:`build_profile`) is a
:class:`~fleetopt.models.profiles.CalibratedProfile` with ``latency_quality`` ``measured`` and an
:class:`~fleetopt.models.power.ActivityPower`; its serving constants follow vLLM's defaults
(:func:`vllm_batch_defaults`, :data:`GPU_MEMORY_UTILIZATION`, :data:`BLOCK_TOKENS`). It is written as a
profile YAML file (:func:`profile_document`, :func:`write_profile_file`; format version
:data:`PROFILE_FORMAT`) with its provenance: source files and their sha256, the fit date and the fit quality.
:func:`fleetopt.optimizer.io.profile_file.read_profile` reads one back (instances name it as
``gpus[i].profile_file``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from fleetopt.models.calibration import (DEFAULT_MAX_REL_ERROR, MIN_DECODE_POINTS, MIN_PREFILL_POINTS, DecodePoint,
                                         PrefillPoint, ProfileFit, fit_profile_coefficients)
from fleetopt.models.hardware import HardwareSpec
from fleetopt.models.power import ActivityPower
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.roofline import kv_capacity_tokens as roofline_kv_capacity_tokens

from fleetopt.optimizer.io.files import read_bytes
from fleetopt.optimizer.output.writes import write_text
from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.io.catalog import Catalog, load_catalog
from fleetopt.optimizer.io.profile_file import PROFILE_FORMAT

__all__ = ["DECODE_COLUMNS", "DECODE_OPTIONAL", "PREFILL_COLUMNS", "PREFILL_OPTIONAL", "META_FIELDS",
           "GPU_MEMORY_UTILIZATION", "BLOCK_TOKENS", "CALIBRATION_CTX_TOKENS", "PROFILE_FORMAT", "SourceFile",
           "Measurements", "read_measurements", "fit_measurements", "vllm_batch_defaults", "kv_capacity_tokens",
           "build_profile", "profile_document", "write_profile_file"]

DECODE_COLUMNS = ("hardware", "model", "dtype", "tp", "batch", "context_tokens", "iteration_s_median")
"""Columns a decode CSV must have."""
DECODE_OPTIONAL = ("iteration_s_min", "power_w")
"""Columns a decode CSV may have (an empty ``power_w`` cell: not measured). Other columns are ignored."""
PREFILL_COLUMNS = ("hardware", "model", "dtype", "tp", "prompt_tokens", "time_s_median")
"""Columns a prefill CSV must have."""
PREFILL_OPTIONAL = ("time_s_min", "power_w")
"""Columns a prefill CSV may have."""
META_FIELDS = ("hardware", "model", "dtype", "tp", "idle_power_w", "board_power_limit_w", "memory_gib",
               "weights_gb", "model_shape", "measured_on")
"""Fields of the meta JSON that the fit reads (all optional; others are kept out of the fit)."""

GPU_MEMORY_UTILIZATION = 0.9
"""Share of GPU memory the engine may use for weights and KV cache: vLLM's default ``gpu_memory_utilization``."""
BLOCK_TOKENS = 16
"""KV block size in tokens: vLLM's default ``block_size`` on CUDA."""
CALIBRATION_CTX_TOKENS = 8192
"""Context at which the profile states ``H_s`` (:math:`H = h \\cdot 8192`), as the catalogue's profiles do."""

_KV_BYTES_PER_ELEMENT = {"fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes per cached K or V element by dtype (the KV cache is kept in the model's dtype)."""
_BYTES_PER_GIB = 2**30
_BYTES_PER_GB = 1e9
_TP_VALUES = (1, 2, 4, 8)


def vllm_batch_defaults(memory_bytes: float, hardware_name: str) -> tuple[int, int]:
    """vLLM V1's default ``(max_num_batched_tokens, max_num_seqs)`` for its OpenAI server on one GPU.

    ``EngineArgs.get_batch_defaults`` (vllm/engine/arg_utils.py) uses 8,192 tokens and 1,024 sequences on GPUs
    with at least 70 GiB of memory other than the A100, and 2,048 and 256 elsewhere. The profile takes the
    token budget as its prefill chunk (``chunk_tokens``) and the sequence cap as ``max_slots``.

    Examples
    --------
    >>> vllm_batch_defaults(80 * 2**30, "H100-SXM-80GB"), vllm_batch_defaults(80 * 2**30, "A100-80GB")
    ((8192, 1024), (2048, 256))
    """
    if memory_bytes >= 70 * _BYTES_PER_GIB and "a100" not in hardware_name.lower():
        return 8192, 1024
    return 2048, 256


def kv_capacity_tokens(memory_bytes: float, weights_bytes: float, kv_bytes_per_token: float,
                       reserve_bytes: float, memory_utilization: float = GPU_MEMORY_UTILIZATION) -> int:
    """KV-cache tokens a replica holds: :func:`fleetopt.models.roofline.kv_capacity_tokens` (the one convention,
    computed profiles' included) of the replica's memory, weights and NCCL workspace ``reserve_bytes``
    (:attr:`Measurements.nccl_reserve_bytes`: ``tp`` x the catalogue's per-GPU reserve, 0 at TP=1), at vLLM's
    default ``memory_utilization``.

    Examples
    --------
    Llama-3.1-8B bf16 (131,072 bytes per token) at TP=1 on 79.18 GiB with 15.01 GB of weights, no reserve:
    (0.9 x 79.18 x 2^30 - 15.01e9) / 131072 = 469,261.9, i.e. 469,261 tokens.

    >>> kv_capacity_tokens(79.18 * 2**30, 15.01e9, 2 * 32 * 8 * 128 * 2, 0)
    469261
    """
    return roofline_kv_capacity_tokens(memory_bytes, weights_bytes, kv_bytes_per_token,
                                       gpu_memory_utilization=memory_utilization, reserve_bytes=reserve_bytes)


# --------------------------------------------------------------------------------------------
# Reading measurement files
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    """One measurement file: its path as given, kind (``decode``, ``prefill`` or ``meta``), sha256 and data rows."""

    path: str
    kind: str
    sha256: str
    rows: int


@dataclass(frozen=True)
class Measurements:
    """Everything the measurement files say, checked.

    ``idle_w`` is None without a meta ``idle_power_w``. ``limit_w``, ``memory_bytes`` and ``weights_bytes`` are
    for one replica (all ``tp`` GPUs); each comes from the meta file or, without one, from the catalogue (the
    ``*_source`` strings say which).
    """

    hardware: HardwareSpec
    model: str
    dtype: str
    tp: int
    decode: tuple[DecodePoint, ...]
    prefill: tuple[PrefillPoint, ...]
    sources: tuple[SourceFile, ...]
    idle_w: float | None
    limit_w: float
    memory_bytes: float
    weights_bytes: float
    kv_bytes_per_token: int
    measured_on: str | None
    value_sources: tuple[tuple[str, str], ...]
    """(quantity, where it came from) for idle_w, limit_w, memory_bytes, weights_bytes, kv_bytes_per_token."""
    nccl_reserve_bytes: float = 0.0
    """The replica's NCCL workspace: ``tp`` x the catalogue's per-GPU reserve at ``tp`` (0 at TP=1), which the
    KV cache cannot use (:func:`kv_capacity_tokens`)."""


class _Collector:
    """One-line problems for several files."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def cell(self, path, row: int, column: str | None, message: str) -> None:
        where = f"row {row}" + (f", column {column}" if column else "")
        self.lines.append(format_problem(path, where, message))

    def field(self, path, field: str, message: str) -> None:
        self.lines.append(format_problem(path, field, message))

    def raise_if_any(self) -> None:
        if self.lines:
            raise InstanceError(self.lines)


def _read_bytes(path: Path, problems: _Collector) -> bytes | None:
    data, reason = read_bytes(path)
    if data is None:
        problems.field(path, "", f"cannot read: {reason}" + ("; check the path" if reason == "no such file" else ""))
    return data


def _csv_kind(header: list[str]) -> str | None:
    names = set(header)
    decode = bool(names & {"batch", "context_tokens", "iteration_s_median"})
    prefill = bool(names & {"prompt_tokens", "time_s_median"})
    return "decode" if decode and not prefill else "prefill" if prefill and not decode else None


def _number(text: str, whole: bool) -> float | int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    if whole:
        return int(value) if value.is_integer() else None
    return value


class _Rows:
    """The data rows of one CSV with typed cell readers that report problems by row and column."""

    def __init__(self, path: Path, problems: _Collector) -> None:
        self.path, self.problems = path, problems

    def whole(self, row: int, column: str, text: str, low: int = 1) -> int | None:
        value = _number(text, whole=True)
        if value is None:
            self.problems.cell(self.path, row, column, f"{text.strip()!r} is not a whole number")
        elif value < low:
            self.problems.cell(self.path, row, column, f"{value} is out of range; must be >= {low}")
        else:
            return int(value)                       # (already whole: _number with whole=True)
        return None

    def positive(self, row: int, column: str, text: str, what: str, optional: bool = False) -> float | None:
        if optional and not text.strip():
            return None
        value = _number(text, whole=False)
        if value is None:
            self.problems.cell(self.path, row, column, f"{text.strip()!r} is not a number; give {what}")
        elif value <= 0:
            self.problems.cell(self.path, row, column, f"{value:g} is not > 0; give {what}")
        else:
            return value
        return None


@dataclass
class _Identity:
    """The hardware/model/dtype/tp every row and the meta file must share, with where each was first seen."""

    values: dict[str, tuple[Any, str]]

    def check(self, key: str, value: Any, where: str, report) -> None:
        if value is None:
            return
        if key not in self.values:
            self.values[key] = (value, where)
            return
        first, first_where = self.values[key]
        same = first.lower() == str(value).lower() if isinstance(first, str) else first == value
        if not same:
            report(f"{value!r} differs from {first!r} ({first_where}); one fit covers one {key}")


def _read_csv(path: Path, raw: bytes, identity: _Identity, catalog: Catalog, problems: _Collector):
    """Points of one CSV and its kind, or (None, None) after reporting."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        problems.field(path, "", f"not UTF-8 text ({err.reason} at byte {err.start})")
        return None, None, 0
    reader = csv.reader(io.StringIO(text, newline=""))
    header = [h.strip() for h in next(reader, [])]
    if not any(header):
        problems.cell(path, 1, None, "the file is empty; a measurement CSV starts with a header row")
        return None, None, 0
    kind = _csv_kind(header)
    if kind is None:
        problems.cell(path, 1, None, f"the header names neither a decode file ({', '.join(DECODE_COLUMNS)}) nor a "
                                     f"prefill file ({', '.join(PREFILL_COLUMNS)}); got {', '.join(header)}")
        return None, None, 0
    required = DECODE_COLUMNS if kind == "decode" else PREFILL_COLUMNS
    missing = [c for c in required if c not in header]
    for column in missing:
        problems.cell(path, 1, column, f"missing; a {kind} file needs columns {', '.join(required)}")
    if missing:
        return None, None, 0
    col = {name: header.index(name) for name in header}
    cells = _Rows(path, problems)
    points, before, count, row = [], len(problems.lines), 0, 1
    while True:
        lines_read = reader.line_num
        try:
            values = next(reader)
        except StopIteration:
            break
        except csv.Error as err:
            column = _overlong_column(text, lines_read, header)
            problems.cell(path, row + 1, column,
                          f"not a CSV row ({err})" if column is None else
                          f"the cell is longer than {csv.field_size_limit():,} characters, the most the csv reader "
                          "takes; a measurement cell holds one number")
            return None, kind, count
        row += 1
        if not any(v.strip() for v in values):
            continue
        count += 1
        if len(values) < len(header):
            values = values + [""] * (len(header) - len(values))
        get = {name: values[i] for name, i in col.items()}
        _check_identity(path, row, get, identity, catalog, problems)
        power = cells.positive(row, "power_w", get.get("power_w", ""), "the mean board power in W", optional=True)
        if kind == "decode":
            n = cells.whole(row, "batch", get["batch"])
            ctx = cells.whole(row, "context_tokens", get["context_tokens"])
            t = cells.positive(row, "iteration_s_median", get["iteration_s_median"], "the iteration time in seconds")
            if "iteration_s_min" in get and get["iteration_s_min"].strip():
                cells.positive(row, "iteration_s_min", get["iteration_s_min"], "the iteration time in seconds")
            if n is not None and ctx is not None and t is not None:
                points.append(DecodePoint(n, ctx, t, power))
        else:
            P = cells.whole(row, "prompt_tokens", get["prompt_tokens"])
            t = cells.positive(row, "time_s_median", get["time_s_median"], "the prefill time in seconds")
            if "time_s_min" in get and get["time_s_min"].strip():
                cells.positive(row, "time_s_min", get["time_s_min"], "the prefill time in seconds")
            if P is not None and t is not None:
                points.append(PrefillPoint(P, t, power))
    if len(problems.lines) > before:
        return None, kind, count
    need = MIN_DECODE_POINTS if kind == "decode" else MIN_PREFILL_POINTS
    time_col = required[-1]
    if count == 0:
        problems.cell(path, 2, time_col, f"no data rows; a {kind} file needs at least {need} points")
        return None, kind, 0
    if count == 1:
        problems.cell(path, 2, time_col, f"a single point is too few to fit; a {kind} file needs at least {need}")
        return None, kind, 1
    return points, kind, count


def _overlong_column(text: str, lines_read: int, header: list[str]) -> str | None:
    """The column of the first cell longer than the csv module's field limit in the record that starts after
    ``lines_read`` lines of ``text`` (None if there is none: the record failed otherwise)."""
    limit = csv.field_size_limit()
    start = sum(len(line) for line in text.splitlines(keepends=True)[:lines_read])
    column, length, quoted, i = 0, 0, False, start
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == '"' and text[i + 1:i + 2] == '"':
                length, i = length + 1, i + 1
            elif ch == '"':
                quoted = False
            else:
                length += 1
        elif ch == '"' and length == 0:
            quoted = True
        elif ch == ",":
            column, length = column + 1, 0
        elif ch in "\r\n":
            break
        else:
            length += 1
        if length > limit:
            return header[column] if column < len(header) else f"#{column + 1}"
        i += 1
    return None


def _check_identity(path: Path, row: int, get: dict, identity: _Identity, catalog: Catalog,
                    problems: _Collector) -> None:
    where = f"row {row} of {path}"
    name = get["hardware"].strip()
    try:
        hardware = catalog.find("hardware", name).name
    except KeyError as err:
        problems.cell(path, row, "hardware", f"{err.args[0]}; name a catalogue GPU (aliases allowed)")
        hardware = None
    identity.check("hardware", hardware, where, lambda m: problems.cell(path, row, "hardware", m))
    identity.check("model", get["model"].strip() or None, where, lambda m: problems.cell(path, row, "model", m))
    dtype = get["dtype"].strip().lower()
    if dtype not in _KV_BYTES_PER_ELEMENT:
        problems.cell(path, row, "dtype", f"{dtype!r} is not allowed; choose {', '.join(_KV_BYTES_PER_ELEMENT)}")
    else:
        identity.check("dtype", dtype, where, lambda m: problems.cell(path, row, "dtype", m))
    tp = _number(get["tp"], whole=True)
    if tp not in _TP_VALUES:
        problems.cell(path, row, "tp",
                      f"{get['tp'].strip()!r} is not allowed; choose {', '.join(map(str, _TP_VALUES))}")
    else:
        identity.check("tp", tp, where, lambda m: problems.cell(path, row, "tp", m))


def _read_meta(path: Path, raw: bytes, identity: _Identity, catalog: Catalog, problems: _Collector) -> dict:
    """The meta fields the fit reads, checked (numbers > 0, shape of whole numbers)."""
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        problems.field(path, "", f"not a JSON file: {err}")
        return {}
    if not isinstance(data, dict):
        problems.field(path, "", "the top level must be a JSON object with fields " + ", ".join(META_FIELDS))
        return {}
    data = {k: v for k, v in data.items() if v is not None}     # null: not read (the probe's unreadable fields)
    out: dict[str, Any] = {}
    for key in ("idle_power_w", "board_power_limit_w", "memory_gib", "weights_gb"):
        if key in data:
            value = data[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                problems.field(path, key, f"{value!r} is not a number > 0")
            else:
                out[key] = float(value)
    shape = data.get("model_shape")
    if shape is not None:
        if not isinstance(shape, dict):
            problems.field(path, "model_shape", "must be an object with layers, kv_heads, head_dim")
        else:
            for key in ("layers", "kv_heads", "head_dim"):
                value = shape.get(key)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    problems.field(path, f"model_shape.{key}", f"{value!r} is not a whole number >= 1")
                else:
                    out[key] = value
    where = str(path)
    if "hardware" in data:
        try:
            identity.check("hardware", catalog.find("hardware", str(data["hardware"])).name, where,
                           lambda m: problems.field(path, "hardware", m))
        except KeyError as err:
            problems.field(path, "hardware", f"{err.args[0]}; name a catalogue GPU (aliases allowed)")
    for key in ("model", "dtype"):
        if key in data:
            identity.check(key, str(data[key]).lower() if key == "dtype" else str(data[key]), where,
                           lambda m, key=key: problems.field(path, key, m))
    if "tp" in data:
        identity.check("tp", data["tp"], where, lambda m: problems.field(path, "tp", m))
    if "measured_on" in data:
        out["measured_on"] = str(data["measured_on"])
    return out


def read_measurements(paths: Sequence[str | Path]) -> Measurements:
    """Read and check decode and prefill CSVs and an optional meta JSON (module docstring).

    Raises
    ------
    InstanceError
        Every problem, one line each (``FILE: row N, column C: problem``); also when no decode file, fewer than
        :data:`~fleetopt.models.calibration.MIN_DECODE_POINTS` decode points, or more than one meta file is given.
    """
    problems, catalog = _Collector(), load_catalog()
    identity = _Identity({})
    decode, prefill, sources, meta = [], [], [], {}
    if not paths:
        raise InstanceError("MEASUREMENTS: no file given; give a decode CSV (and a prefill CSV and a meta JSON)")
    metas = [Path(p) for p in paths if Path(p).suffix.lower() == ".json"]
    if len(metas) > 1:
        problems.field(metas[1], "", f"a second meta JSON (the first is {metas[0]}); give at most one")
    for given in paths:
        path = Path(given)
        raw = _read_bytes(path, problems)
        if raw is None:
            continue
        digest = hashlib.sha256(raw).hexdigest()
        if path.suffix.lower() == ".json":
            if path == metas[0]:
                meta = _read_meta(path, raw, identity, catalog, problems)
                sources.append(SourceFile(str(given), "meta", digest, 0))
            continue
        points, kind, rows = _read_csv(path, raw, identity, catalog, problems)
        if points is not None:
            assert kind is not None                 # _read_csv gives points only with their file's kind
            (decode if kind == "decode" else prefill).extend(points)
            sources.append(SourceFile(str(given), kind, digest, rows))
    problems.raise_if_any()
    csvs = [s for s in sources if s.kind != "meta"]
    if not any(s.kind == "decode" for s in csvs):
        raise InstanceError(format_problem(paths[0], "", "no decode CSV among the files; the fit needs one "
                                                         f"(columns {', '.join(DECODE_COLUMNS)})"))
    if len(decode) < MIN_DECODE_POINTS:
        last = [s for s in csvs if s.kind == "decode"][-1]
        problems.cell(last.path, last.rows + 1, "iteration_s_median",
                      f"{len(decode)} decode points are too few; the fit needs at least {MIN_DECODE_POINTS}")
    problems.raise_if_any()
    return _resolve_measurements(identity, decode, prefill, sources, meta, catalog, paths)


def _resolve_measurements(identity: _Identity, decode, prefill, sources, meta: dict, catalog: Catalog,
                          paths) -> Measurements:
    """Replica-level quantities from the meta file, else from the catalogue (recorded in ``value_sources``)."""
    hardware = catalog.find("hardware", identity.values["hardware"][0])
    model, dtype, tp = (identity.values[k][0] for k in ("model", "dtype", "tp"))
    meta_file = next((s.path for s in sources if s.kind == "meta"), None)
    origin = {}

    def pick(key: str, meta_value, fallback, fallback_source: str):
        origin[key] = f"{meta_file} (meta)" if meta_value is not None else fallback_source
        return meta_value if meta_value is not None else fallback

    idle = pick("idle_w", None if "idle_power_w" not in meta else meta["idle_power_w"] * tp, None, "not given")
    limit = pick("limit_w", None if "board_power_limit_w" not in meta else meta["board_power_limit_w"] * tp,
                 hardware.tdp_w * tp, f"catalogue {hardware.name} tdp_w x tp")
    memory = pick("memory_bytes", None if "memory_gib" not in meta else meta["memory_gib"] * _BYTES_PER_GIB * tp,
                  hardware.memory_bytes * tp, f"catalogue {hardware.name} memory x tp")
    spec = None
    try:
        spec = catalog.find("models", model)
    except KeyError:
        pass
    element = _KV_BYTES_PER_ELEMENT[dtype]
    if "weights_gb" in meta:
        weights = pick("weights_bytes", meta["weights_gb"] * _BYTES_PER_GB, None, "")
    elif spec is not None:
        weights = pick("weights_bytes", None, spec.params * element, f"catalogue {spec.name} params x {element} bytes")
    else:
        weights = None
    if all(k in meta for k in ("layers", "kv_heads", "head_dim")):
        kv = pick("kv_bytes_per_token", 2 * meta["layers"] * meta["kv_heads"] * meta["head_dim"] * element, None, "")
    elif spec is not None:
        kv = pick("kv_bytes_per_token", None, 2 * spec.layers * spec.kv_heads * spec.head_dim * element,
                  f"catalogue {spec.name} shape")
    else:
        kv = None
    where = meta_file or paths[0]
    lines = []
    if weights is None or kv is None:
        lines.append(format_problem(where, "model_shape" if meta_file else "", f"model {model!r} is not in the "
                     "catalogue; give a meta JSON with weights_gb and model_shape (layers, kv_heads, head_dim)"))
    if any(p.power_w is not None for p in (*decode, *prefill)) and idle is None:
        lines.append(format_problem(where, "idle_power_w", "power_w is measured but the idle power is not; give a "
                                                           "meta JSON with idle_power_w (and board_power_limit_w)"))
    if lines:
        raise InstanceError(lines)
    assert weights is not None and kv is not None   # either missing raised above
    reserve = tp * catalog.defaults.nccl_bytes(tp)
    if kv_capacity_tokens(memory, weights, kv, reserve) < BLOCK_TOKENS:
        raise InstanceError(format_problem(where, "weights_gb", f"{weights / _BYTES_PER_GB:g} GB of weights leave no "
                                           f"room for a KV cache in {GPU_MEMORY_UTILIZATION:g} x "
                                           f"{memory / _BYTES_PER_GIB:g} GiB less {reserve / _BYTES_PER_GIB:g} GiB "
                                           "of NCCL workspace"))
    return Measurements(hardware, model, dtype, tp, tuple(decode), tuple(prefill), tuple(sources), idle, limit,
                        memory, weights, kv, meta.get("measured_on"), tuple(origin.items()), reserve)


def fit_measurements(m: Measurements, max_rel_error: float = DEFAULT_MAX_REL_ERROR) -> ProfileFit:
    """:func:`~fleetopt.models.calibration.fit_profile_coefficients` on the checked measurements."""
    return fit_profile_coefficients(m.decode, m.prefill, idle_w=m.idle_w, limit_w=m.limit_w,
                                    max_rel_error=max_rel_error)


# --------------------------------------------------------------------------------------------
# The profile and its file
# --------------------------------------------------------------------------------------------


def build_profile(m: Measurements, fit: ProfileFit, *, chunk_tokens: int | None = None, max_slots: int | None = None,
                  name: str | None = None) -> CalibratedProfile:
    """The measured profile of one replica (module docstring).

    ``chunk_tokens`` and ``max_slots`` default to :func:`vllm_batch_defaults` of one GPU. ``max_slots`` is the
    profile's concurrency cap at :data:`CALIBRATION_CTX_TOKENS` (it scales as 1/context:
    :class:`~fleetopt.models.profiles.CalibratedProfile`); with the KV capacity of
    :func:`kv_capacity_tokens` the KV cache is the tighter limit for an 8B model on an H100 at every context.
    Without a power fit the catalogue's logistic curve of the hardware (times ``tp``) is used.
    """
    default_chunk, default_slots = vllm_batch_defaults(m.memory_bytes / m.tp, m.hardware.name)
    tokens = kv_capacity_tokens(m.memory_bytes, m.weights_bytes, m.kv_bytes_per_token, m.nccl_reserve_bytes)
    power = fit.power
    if power is None:
        if m.hardware.power is None:
            raise InstanceError(format_problem(m.sources[0].path, "power_w", "no power fit (too few power_w cells) "
                                               f"and no catalogue power curve for {m.hardware.name}"))
        power = m.hardware.power.scaled(m.tp)
    it = fit.iteration
    return CalibratedProfile(
        name=name or f"{m.hardware.name}_{m.model}_tp{m.tp}",
        model_name=f"{m.model} ({m.dtype}, TP={m.tp})",
        W_s=it.W_s,
        H_s=it.h_s_per_token * CALIBRATION_CTX_TOKENS,
        calibration_ctx_tokens=CALIBRATION_CTX_TOKENS,
        chunk_tokens=int(chunk_tokens or default_chunk),
        blk_size_tokens=BLOCK_TOKENS,
        total_kv_blocks=tokens // BLOCK_TOKENS,
        max_slots=int(max_slots or default_slots),
        cost_usd_per_hr=m.hardware.usd_per_gpu_hour * m.tp,
        gpus_per_replica=m.tp,
        power=power,
        latency_quality="measured",
        source="fleetopt profile fit of " + ", ".join(s.path for s in m.sources),
        note=f"measured on {m.measured_on or 'an unstated date'}; fitted by fleetopt profile fit",
        g_s=it.g_s,
        prefill_a_s=it.prefill_a_s,
        prefill_b_s=it.prefill_b_s,
    )


def _sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (the profile file's precision)."""
    return float(f"{x:.{digits}g}")


def _power_block(power) -> dict:
    if isinstance(power, ActivityPower):
        return {"form": "activity", "quality": power.quality, "idle_w": _sig(power.idle_w),
                "limit_w": _sig(power.limit_w), "weights_w": _sig(power.weights_w), "kv_w": _sig(power.kv_w),
                "compute_w": _sig(power.compute_w)}
    return {"form": "logistic", "quality": power.quality, "idle_w": _sig(power.idle_w),
            "nominal_w": _sig(power.nominal_w), "logistic_k": _sig(power.k), "logistic_x0": _sig(power.x0)}


def _fit_quality(fit: ProfileFit) -> dict:
    return {s.kind: {"points": s.points, "median_abs_rel_error": _sig(s.median_abs_rel_error, 4),
                     "worst_abs_rel_error": _sig(s.worst_abs_rel_error, 4)} for s in fit.summaries}


def profile_document(m: Measurements, fit: ProfileFit, profile: CalibratedProfile, fitted_at: str) -> dict:
    """The profile YAML file's content (format in ``docs/profile_fit.md``), numbers to 6 significant digits."""
    try:
        version = metadata.version("fleetopt")
    except metadata.PackageNotFoundError:
        version = "unknown"
    it = fit.iteration
    return {
        "fleetopt_profile": PROFILE_FORMAT,
        "name": profile.name,
        "model_name": profile.model_name,
        "hardware": m.hardware.name,
        "model": m.model,
        "dtype": m.dtype,
        "tp": m.tp,
        "latency": {"quality": profile.latency_quality, "W_s": _sig(profile.W_s), "H_s": _sig(profile.H_s),
                    "calibration_ctx_tokens": profile.calibration_ctx_tokens, "g_s": _sig(profile.g_s),
                    "prefill_a_s": _sig(profile.prefill_a_s), "prefill_b_s": _sig(profile.prefill_b_s)},
        "serving": {"chunk_tokens": profile.chunk_tokens, "blk_size_tokens": profile.blk_size_tokens,
                    "total_kv_blocks": profile.total_kv_blocks, "max_slots": profile.max_slots,
                    "gpus_per_replica": profile.gpus_per_replica,
                    "cost_usd_per_hr": _sig(profile.cost_usd_per_hr)},
        "power": _power_block(profile.power),
        "provenance": {
            "fitted_at": fitted_at,
            "fitted_by": f"fleetopt {version} profile fit",
            "measured_on": m.measured_on,
            "method": ("time: Chebyshev LP, then relative least squares with every point within max_rel_error "
                       "(fleetopt.models.calibration); power: time-weighted component powers capped at limit_w, "
                       "relative least squares"),
            "max_rel_error": it.max_rel_error,
            "chebyshev_rel_error": _sig(it.chebyshev_rel_error, 4),
            "tolerance_met": it.tolerance_met,
            "h_s_per_token": _sig(it.h_s_per_token),
            "sources": [{"file": s.path, "kind": s.kind, "sha256": s.sha256, "rows": s.rows} for s in m.sources],
            "kv_capacity": {"memory_bytes": int(m.memory_bytes), "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
                            "weights_bytes": int(m.weights_bytes), "kv_bytes_per_token": m.kv_bytes_per_token,
                            "nccl_reserve_bytes": int(m.nccl_reserve_bytes),
                            "tokens": kv_capacity_tokens(m.memory_bytes, m.weights_bytes, m.kv_bytes_per_token,
                                                         m.nccl_reserve_bytes)},
            "value_sources": dict(m.value_sources),
            "serving_defaults": "chunk_tokens and max_slots: vLLM V1 OpenAI-server defaults max_num_batched_tokens "
                                "and max_num_seqs for this GPU unless given; blk_size_tokens: vLLM block_size 16; "
                                "cost: catalogue price per GPU-hour x tp",
            "fit_quality": _fit_quality(fit),
        },
    }


def write_profile_file(document: dict, target: str | Path, protect: Sequence[str | Path] = ()) -> None:
    """Write ``document`` as YAML to ``target`` atomically (temp file + rename); never over a path in ``protect``.

    Raises
    ------
    InstanceError
        ``target`` is one of ``protect`` (an input file) or its folder does not exist.
    """
    write_text("# fleetopt serving profile, written by `fleetopt profile fit`; format: docs/profile_fit.md\n"
               + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=110), target, "-o",
               protect)
