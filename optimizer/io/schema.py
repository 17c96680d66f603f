"""The raw structure of an instance file, and the one-line problems it produces.

This is pass 1 of instance checking (see :mod:`fleetopt.optimizer.io.instance`): pydantic
models with ``extra="forbid"`` and strict types check keys, types and ranges at
every level. Each pydantic error becomes one line
``<file>: <field>: <what is wrong>; <what is allowed>``, collected in a
:class:`Problems` that the later passes add to.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from fleetopt.optimizer.errors import InstanceError, format_problem

__all__ = [
    "Problems",
    "show_value",
    "allowed_keys",
    "structure_problems",
    "validate_section",
    "pydantic_field_path",
    "pydantic_message",
    "RawWorkload",
    "RawSlo",
    "RawGpu",
    "RawPools",
    "RawCompress",
    "RawEnergy",
    "RawConstraints",
    "RawInstance",
    "RawSemantic",
    "DEFAULT_MAX_UTILIZATION",
    "MAX_CONTEXT_LIMIT_TOKENS",
    "MAX_NUM_SEQS_LIMIT",
    "MIN_MAX_UTILIZATION",
    "MIN_AVAILABILITY",
    "MAX_COST_PER_HR",
    "TP_DEGREES",
    "GPU_DTYPES",
    "gpu_choices",
]

DEFAULT_MAX_UTILIZATION = 0.85
"""Per-replica utilization cap used when ``constraints.max_utilization`` is absent."""

MAX_CONTEXT_LIMIT_TOKENS = 2**30
"""Largest ``pools.max_context`` (and ``chunk``) accepted: far beyond any model, safe for int64 arithmetic."""

MAX_NUM_SEQS_LIMIT = 2**20
"""Largest ``max_num_seqs`` accepted (a concurrency cap, far beyond any engine)."""

MIN_MAX_UTILIZATION = 0.05
"""Least ``constraints.max_utilization``: a cap below 5 % provisions every pool at 20 times its load, which no
operator means (a percentage written as a share, 0.0085 for 85 %, is the likely slip); the model's plans would be
absurd rather than wrong."""

MIN_AVAILABILITY = 0.5
"""Least ``gpus[].availability``: counts are inflated by :math:`1/A`, so a GPU up less than half the time would
more than double its pools; such a part is broken, not a planning input (the sampled-availability simulation
covers degraded fleets)."""

MAX_COST_PER_HR = 1e6
"""Largest ``gpus[].cost_per_hr`` ($/hr per priced GPU): far above any rental price, and small enough that the
fleet's cost stays within the MIP solver's numeric range (HiGHS treats costs from 1e20 as infinite)."""


# --------------------------------------------------------------------------------------------
# Problem collection
# --------------------------------------------------------------------------------------------


class Problems:
    """Collects ``file: field: message`` lines for one instance."""

    def __init__(self, path) -> None:
        self.path = path
        self.lines: list[str] = []

    def add(self, field: str, message: str) -> None:
        self.lines.append(format_problem(self.path, field, message))

    def raise_if_any(self) -> None:
        if self.lines:
            raise InstanceError(self.lines)


def show_value(value: Any, *, spell_lists: bool = False) -> str:
    """A short description of a given value for messages.

    Mappings and sequences are named by kind (``a mapping``, ``a list``), except
    that with ``spell_lists`` a ``list`` is shown in full.

    Examples
    --------
    >>> show_value(None), show_value(True), show_value([1]), show_value([1], spell_lists=True)
    ('null', 'true', 'a list', '[1]')
    """
    if spell_lists and isinstance(value, list):
        return repr(value)
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


# --------------------------------------------------------------------------------------------
# Raw structure (pass 1)
# --------------------------------------------------------------------------------------------

_PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_Fraction = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
_OpenFraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
_PositiveInt = Annotated[int, Field(ge=1)]
_Utilization = Annotated[float, Field(ge=MIN_MAX_UTILIZATION, le=1, allow_inf_nan=False)]
_Availability = Annotated[float, Field(ge=MIN_AVAILABILITY, le=1, allow_inf_nan=False)]
_GpuPrice = Annotated[float, Field(gt=0, le=MAX_COST_PER_HR, allow_inf_nan=False)]
_RANGES: dict[tuple[str, ...], str] = {
    ("constraints", "max_utilization"): (f"allowed: {MIN_MAX_UTILIZATION:g} to 1 "
                                         "(a share of capacity, not a percentage)"),
    ("gpus", "availability"): f"allowed: {MIN_AVAILABILITY:g} to 1 (the share of time a GPU is up)",
    ("gpus", "cost_per_hr"): f"allowed: above 0, up to {MAX_COST_PER_HR:,.0f} $/hr per GPU",
}
"""The full range of a field with two bounds, named when a value falls outside either."""
_ContextTokens = Annotated[int, Field(ge=1, le=MAX_CONTEXT_LIMIT_TOKENS)]
_GpuName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]


class _Raw(BaseModel):
    """Base of every section: unknown keys and loose types are errors."""

    # protected_namespaces=(): fields named model_* (model_name, model_config_file) are ours; pydantic before 2.10
    # warns on them
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class RawMixtureComponent(_Raw):
    """One lognormal component of a synthetic workload (total tokens)."""

    weight: _PositiveFloat
    median_tokens: _PositiveFloat
    sigma: _PositiveFloat


class RawSynthetic(_Raw):
    """``workload.synthetic``: a lognormal mixture of total lengths, tabulated up to ``max_tokens``."""

    mixture: Annotated[list[RawMixtureComponent], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=2, le=MAX_CONTEXT_LIMIT_TOKENS)] = 131072
    points: Annotated[int, Field(ge=2, le=4096)] = 256


class RawWorkload(_Raw):
    """``workload``: a ``cdf``, a ``trace`` or a ``synthetic`` mixture (checked in pass 2), arrival rate in req/s,
    prompt share."""

    cdf: Any = None
    trace: str | None = None
    synthetic: RawSynthetic | None = None
    arrival_rate: _PositiveFloat | None = None
    input_fraction: _OpenFraction | None = None


class RawSlo(_Raw):
    """``slo``: P99 latency targets in ms, the TTFT model and its scope."""

    ttft_p99_ms: _PositiveFloat
    tpot_p99_ms: _PositiveFloat | None = None
    ttft_model: Literal["batched", "tail", "mean-prefill"] = "batched"
    scope: Literal["pool", "fleet"] = "pool"
    ttft_margin: Annotated[float, Field(ge=0, lt=0.5, allow_inf_nan=False)] | None = None
    """Share of ``ttft_p99_ms`` an analytic plan keeps free: candidates are sized to
    ``ttft_p99_ms * (1 - ttft_margin)`` and judged against ``ttft_p99_ms`` (None: the model's default,
    :data:`fleetopt.optimizer.io.instance.DEFAULT_TTFT_MARGIN`)."""


TP_DEGREES = (1, 2, 4, 8)
"""Tensor-parallel degrees a ``gpus`` entry may give (``tp``): one node's GPUs."""
GPU_DTYPES = ("fp16", "bf16", "fp8", "int4")
"""Weight dtypes a ``gpus`` entry may give (``dtype``)."""


class _GpuChoiceError(ValueError):
    """A ``gpus`` entry's ``tp``/``dtype`` value or list is not allowed; the message is the whole problem."""


def _choice(allowed: tuple, what: str, noun: str):
    """A validator of ``tp``/``dtype``: one allowed value or a non-empty list of distinct ones (candidate
    configurations, :func:`gpu_choices`); a list comes back as a tuple."""
    spelled = ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"

    def ok(v) -> bool:
        return not isinstance(v, bool) and type(v) is type(allowed[0]) and v in allowed

    def check(value):
        if value is None:
            return None
        if isinstance(value, list):
            if not value:
                raise _GpuChoiceError(f"the list is empty; give {what} ({spelled}) or a list of them")
            bad = [v for v in value if not ok(v)]
            if bad:
                raise _GpuChoiceError(f"{show_value(bad[0])} in the list is not allowed; choose among {spelled}")
            dup = [v for i, v in enumerate(value) if v in value[:i]]
            if dup:
                raise _GpuChoiceError(f"{show_value(dup[0])} is listed twice; list each {noun} once")
            return tuple(value)
        if not ok(value):
            raise _GpuChoiceError(f"{show_value(value)} is not allowed; choose {spelled}, or a list of them to "
                                  "let the planner choose")
        return value

    return check


_Tp = Annotated[Any, AfterValidator(_choice(TP_DEGREES, "a tensor-parallel degree", "degree"))]
_Dtype = Annotated[Any, AfterValidator(_choice(GPU_DTYPES, "a weight dtype", "dtype"))]


def gpu_choices(raw: RawGpu) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
    """The tensor-parallel degrees and dtypes a computed ``gpus`` entry lets the planner choose among, and whether
    it names a list (so its configurations are expanded and named ``NAME/tpT/DTYPE``): an absent ``tp`` is 1, an
    absent ``dtype`` fp16, and a one-element list is a single value.

    Examples
    --------
    >>> gpu_choices(RawGpu(name="h", hardware="H100", model="m", tp=[2, 4], dtype="fp8"))
    ((2, 4), ('fp8',), True)
    >>> gpu_choices(RawGpu(name="h", hardware="H100", model="m", tp=[8]))
    ((8,), ('fp16',), False)
    """
    tps = raw.tp if isinstance(raw.tp, tuple) else (raw.tp or 1,)
    dtypes = raw.dtype if isinstance(raw.dtype, tuple) else (raw.dtype or "fp16",)
    return tps, dtypes, len(tps) * len(dtypes) > 1


class RawGpu(_Raw):
    """One ``gpus`` entry: a calibrated ``profile``, a ``profile_file`` (a fitted profile YAML, relative to the
    instance file) or ``hardware`` + ``model`` (a catalogue model) or ``hardware`` + ``model_config`` (a Hugging
    Face config.json, relative to the instance file) with a serving config."""

    name: _GpuName
    profile: str | None = None
    profile_file: str | None = None
    hardware: str | None = None
    model: str | None = None
    model_config_file: str | None = Field(default=None, alias="model_config")
    """``model_config`` in the file (pydantic reserves the attribute name ``model_config``)."""
    tp: _Tp = None
    """A tensor-parallel degree (1, 2, 4, 8) or a list of them: each combination with ``dtype`` that fits is a
    candidate configuration (:func:`gpu_choices`, :mod:`fleetopt.optimizer.io.gpu_options`)."""
    dtype: _Dtype = None
    """A weight dtype (fp16, bf16, fp8, int4) or a list of them (see ``tp``)."""
    memory_utilization: _Fraction | None = None
    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_NUM_SEQS_LIMIT)] | None = None
    kv_layout: Literal["sharded", "replicated"] | None = None
    moe_w: Literal["active-params", "layer-table"] | None = None
    """How a mixture-of-experts model streams weights per iteration: only the active experts' parameters (the 1/W
    paper's Table 2, an upper bound on speed) or the catalogue's per-layer latency table (every expert a batch
    touches); ``docs/profiles.md``."""
    chunk: _ContextTokens | None = None
    max_count: _PositiveInt | None = None
    min_count: Annotated[int, Field(ge=0)] = 0
    availability: _Availability = 1.0
    cost_per_hr: _GpuPrice | None = None
    min_pools: Annotated[int, Field(ge=0)] = 0
    max_pools: _PositiveInt | None = None


class RawCompress(_Raw):
    """``pools.compress``: compress-and-route; a pool of window B may also take requests up to gamma x B."""

    gammas: Annotated[list[Annotated[float, Field(gt=1, allow_inf_nan=False)]], Field(min_length=1)]
    success_probability: _Fraction = 1.0


class RawEnergy(_Raw):
    """``energy``: what a kWh costs at the meter and the facility's PUE (for the cost+power objective)."""

    usd_per_kwh: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    pue: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.0


class RawKVTransfer(_Raw):
    """``pools.kv_transfer``: how a disaggregated pair's prompt KV cache reaches its decode pool
    (:class:`fleetopt.models.queueing.disagg.KVTransfer`). ``bandwidth`` (fleetopt's own): latency plus the prompt's
    KV bytes over the link, by default the hardware catalogue's per-GPU link times the replica's GPUs (``link``:
    ``network`` between nodes, ``nvlink`` within one); ``seed-factor`` (the reference scenarios' convention): the
    prefill part of TTFT times ``factor``."""

    model: Literal["bandwidth", "seed-factor"] = "bandwidth"
    factor: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.8
    bandwidth_gb_per_s: _PositiveFloat | None = None
    """Replica-to-replica bandwidth in GB/s (1e9 bytes/s), overriding the catalogue's link figures."""
    latency_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    kv_bytes_per_token: _PositiveFloat | None = None
    """KV bytes of one token for the whole replica (default: the computed profile's; a calibrated one has none)."""
    link: Literal["network", "nvlink"] = "network"


class RawPools(_Raw):
    """``pools``: how many pools, the context window in tokens, boundaries and routing, and whether length
    segments may be served by disaggregated prefill/decode pairs (``disaggregation``: ``none``, ``allow``, ``only``)."""

    max_pools: _PositiveInt = 1
    max_context: _ContextTokens
    boundaries: Any = "auto"
    routing: Literal["length", "split"] = "length"
    compress: RawCompress | None = None
    disaggregation: Literal["none", "allow", "only"] = "none"
    kv_transfer: RawKVTransfer | None = None
    pd_sizing: Literal["model", "reference"] = "model"
    """How pairs are sized: ``model`` (fleetopt's stations, :mod:`fleetopt.models.queueing.disagg`) or ``reference``
    (the reference tool's throughput matching, :func:`fleetopt.models.queueing.disagg.reference_disagg`; for
    reproducing its Puzzle 7 only)."""


class RawConstraints(_Raw):
    """``constraints``: fleet-wide limits (power in kW, cost in $/hr); absent means no limit."""

    max_utilization: _Utilization = DEFAULT_MAX_UTILIZATION
    max_power_kw: _PositiveFloat | None = None
    max_cost_per_hr: _PositiveFloat | None = None
    max_total_gpus: _PositiveInt | None = None


_Share = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class RawSemantic(_Raw):
    """``semantic``: multi-model (semantic) routing. A classifier sends a share of the traffic (or of each length
    segment) to ``small_model`` and the rest to ``large_model``; pools serve one model each, the options of a
    model being those whose profile serves it. ``share`` fixes the rule: a number (every length) or
    ``{edges: [e_1, ...], shares: [a_1, ...]}`` (share ``a_k`` of the requests of total length in
    :math:`(e_{k-1}, e_k]`, one share more than edges; :class:`fleetopt.models.semantic.ShareRule`); ``shares`` lists
    candidate rules, each one of those, the planner chooses among (a decision); ``min_large_share`` asks that at
    least this share of all requests reach the large model (docs/multi_model.md). ``share`` and ``shares`` are
    checked in pass 2 (:mod:`fleetopt.optimizer.io.instance`)."""

    small_model: str
    large_model: str
    share: Any = None
    shares: Any = None
    min_large_share: _Share | None = None


class RawInstance(_Raw):
    """The whole instance file."""

    name: str | None = None
    description: str | None = None
    workload: RawWorkload
    slo: RawSlo
    gpus: Annotated[list[RawGpu], Field(min_length=1)]
    pools: RawPools
    constraints: RawConstraints = Field(default_factory=RawConstraints)
    energy: RawEnergy | None = None
    objective: Literal["cost", "power", "tok_per_watt", "cost+power"] = "cost"
    allow_mixed_models: bool = False
    """Let the GPU options serve different models (a plan then compares their costs as if they served the same
    one); without it such an instance is rejected (:mod:`fleetopt.optimizer.io.instance`)."""
    semantic: RawSemantic | None = None
    """Multi-model (semantic) routing: a small and a large model, the classifier's share (or candidate shares)
    and an optional quality floor (:class:`RawSemantic`); implies ``allow_mixed_models``."""


_SECTION_MODELS: dict[tuple[str, ...], type[_Raw]] = {
    (): RawInstance,
    ("workload",): RawWorkload,
    ("workload", "synthetic"): RawSynthetic,
    ("slo",): RawSlo,
    ("gpus",): RawGpu,
    ("pools",): RawPools,
    ("pools", "compress"): RawCompress,
    ("pools", "kv_transfer"): RawKVTransfer,
    ("constraints",): RawConstraints,
    ("energy",): RawEnergy,
    ("semantic",): RawSemantic,
}


# --------------------------------------------------------------------------------------------
# Pydantic errors as one-line problems
# --------------------------------------------------------------------------------------------


def _field_path(loc: Sequence) -> str:
    """``('gpus', 1, 'profile')`` -> ``gpus[1].profile``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def allowed_keys(loc: Sequence) -> str:
    """The keys the section at ``loc`` allows (list indices are skipped), comma-separated."""
    names = tuple(p for p in loc if isinstance(p, str))
    model = _SECTION_MODELS.get(names)
    return ", ".join(f.alias or n for n, f in model.model_fields.items()) if model else ""


def _pydantic_message(error: Mapping[str, Any], allowed: Callable[[Sequence], str] = allowed_keys) -> str:
    """One pydantic error as ``<what is wrong>; <what is allowed>`` (``allowed(loc)``: the keys the mapping at
    ``loc`` takes, comma-separated; empty when unknown)."""
    kind, given, ctx, loc = error["type"], error.get("input"), error.get("ctx") or {}, error["loc"]
    if kind == "missing":
        return "missing; this key is required"
    if kind == "extra_forbidden":
        return f"unknown key; allowed: {allowed(loc[:-1])}"
    if kind == "literal_error":
        return f"{show_value(given)} is not allowed; choose {ctx['expected'].replace(chr(39), '')}"
    if kind in ("model_type", "dict_type"):
        keys = allowed(loc)
        return f"expected a mapping{' with keys ' + keys if keys else ''}; got {show_value(given)}"
    if kind == "value_error" and isinstance(ctx.get("error"), _GpuChoiceError):   # a gpus entry's tp/dtype
        return str(ctx["error"])
    if kind == "list_type":
        return f"expected a list; got {show_value(given)}"
    if kind == "too_short":
        return f"the list is empty; give at least {ctx.get('min_length', 1)} entry"
    if kind in ("float_type", "int_type") and isinstance(given, str) and _numeric_text(given):
        return f"{show_value(given)} is text to YAML, not a number; {_yaml_number_hint(given)}"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return f"{show_value(given)} is not an integer; give a whole number"
    if kind in ("float_type", "float_parsing"):
        return f"{show_value(given)} is not a number; give a number"
    if kind == "finite_number":
        return f"{show_value(given)} is not finite; give a finite number"
    if kind == "string_type":
        return f"{show_value(given)} is not a string; give text"
    if kind == "string_too_short":
        return "empty; give text"
    if kind == "string_too_long":
        return f"too long; at most {ctx.get('max_length')} characters"
    if kind == "too_long":
        return f"too many entries; at most {ctx.get('max_length')}"
    if kind == "string_pattern_mismatch":
        return f"{show_value(given)} is not a valid name; use only letters, digits, '_', '.' and '-'"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        limit = limit if isinstance(limit, int) else f"{limit:g}"
        span = _RANGES.get(tuple(p for p in loc if isinstance(p, str)))
        return f"{show_value(given)} is out of range; must be {bounds[kind]} {limit}" + (f"; {span}" if span else "")
    return f"{error['msg']}; got {show_value(given)}"


def pydantic_field_path(loc: Sequence) -> str:
    """A pydantic error location as a field path, e.g. ``('gpus', 1, 'profile')`` -> ``gpus[1].profile`` (for other
    files read with pydantic, such as profile files: :mod:`fleetopt.optimizer.io.profile_file`)."""
    return _field_path(loc)


def _numeric_text(text: str) -> bool:
    """Whether ``text`` is a finite number in exponent form, which YAML 1.1 reads as text unless the exponent is
    signed and the mantissa has a point (``5e2``, ``5.3e12``); a number quoted on purpose (``"8"``) is not."""
    try:
        return "e" in text.lower() and math.isfinite(float(text))
    except ValueError:
        return False


_EXPONENT_RE = re.compile(r"^\s*(?P<sign>[+-]?)(?P<whole>\d*)(?:\.(?P<fraction>\d*))?[eE](?P<esign>[+-]?)"
                          r"(?P<exponent>\d+)\s*$")


def _yaml_number_hint(text: str) -> str:
    """How to write ``text`` (a number in exponent form) so that YAML 1.1 reads a number: a point in the
    mantissa and a signed exponent, or the number in full when it is whole.

    Examples
    --------
    >>> _yaml_number_hint("1e+7")
    'YAML reads an exponent only after a decimal point and with a sign: write 1.0e+7 or 10000000'
    >>> _yaml_number_hint("5.3e12")[-30:], _yaml_number_hint(".5e-3")[-12:]
    ('write 5.3e+12 or 5300000000000', 'write 0.5e-3')
    """
    m = _EXPONENT_RE.match(text)
    if m is None or not (m["whole"] or m["fraction"]):
        return "write it with a point and a signed exponent (5.3e+12) or in full (5300000000000)"
    spelled = f"{m['sign']}{m['whole'] or '0'}.{m['fraction'] or '0'}e{m['esign'] or '+'}{m['exponent']}"
    value = float(text)
    full = f" or {int(value)}" if value.is_integer() and abs(value) < 1e18 else ""
    return f"YAML reads an exponent only after a decimal point and with a sign: write {spelled}{full}"


def pydantic_message(error: Mapping[str, Any], allowed: Callable[[Sequence], str] | None = None) -> str:
    """One pydantic error as ``<what is wrong>; <what is allowed>`` (the instance's wording, for other files;
    ``allowed(loc)`` names the keys of the file's own sections, default the instance's)."""
    return _pydantic_message(error, allowed_keys if allowed is None else allowed)


def structure_problems(data: dict, problems: Problems) -> None:
    """Pass 1 over the whole mapping: every key, type and range error."""
    try:
        RawInstance.model_validate(data)
    except ValidationError as err:
        for error in err.errors(include_url=False):
            problems.add(_field_path(error["loc"]), _pydantic_message(error))


_RawT = TypeVar("_RawT", bound="_Raw")


def validate_section(model: type[_RawT], value: Any) -> _RawT | None:
    """``model`` validated from ``value``, or None when it has structural errors (already reported)."""
    try:
        return model.model_validate(value)
    except ValidationError:
        return None
