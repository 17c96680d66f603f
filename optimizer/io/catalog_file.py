"""User catalogue files: the user's own GPUs, models and calibrated profiles, checked like an instance.

A *catalogue file* (YAML or JSON) extends the shipped catalogue (``data/catalog/*.yaml``,
:mod:`fleetopt.optimizer.io.catalog`). It has up to three sections, each a list of entries::

    schema_version: 1                      # optional
    hardware:                              # fields of data/catalog/hardware.yaml (gpus: NAME: ...)
      - name: MI300X
        provenance: AMD MI300X datasheet; price from our cloud contract (2026-01)
        memory: {capacity_bytes: 206158430208}
        memory_bandwidth_bytes_per_s: 5.3e12
        fp16_dense_tflops: 1307.0
        tdp_w: 750
        price: {usd_per_gpu_hour: 3.50}
    models:                                # fields of data/catalog/models.yaml, or a config.json
      - {name: my-8b, config: models/my-8b/config.json, provenance: our fine-tune}
    profiles:                              # fields of data/catalog/calibrated_profiles.yaml
      - {name: H100-ours, provenance: ..., W: 0.004, H: 0.00032, ...}

An entry has the fields of the shipped file of its kind (same names, units and meaning; the loader reads the
same ones), plus ``name``, a required ``provenance`` (where its figures come from, shown by ``fleetopt catalog
list``) and ``replace`` (default false: a name or alias that is already in the catalogue is an error; true
replaces that entry). A calibrated profile may also say which ``model`` its constants stand for. A ``models``
entry may instead be ``{name, config, provenance}``: the architecture is read from a Hugging Face
``config.json`` (:mod:`fleetopt.optimizer.io.hf_config`), its path relative to the catalogue file.

This module checks the structure (pydantic, ``extra="forbid"``, strict types, ranges) and a few cross-field
rules, and returns :class:`CatalogEntry` records; :mod:`fleetopt.optimizer.io.catalog` builds the records and
merges them over the shipped catalogue. Every problem is one line ``FILE: catalog.SECTION[i].FIELD: problem``.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetopt.models.power import QUALITIES

from fleetopt.optimizer.errors import format_problem
from fleetopt.optimizer.io.files import parse_text, read_text
from fleetopt.optimizer.io.schema import MAX_CONTEXT_LIMIT_TOKENS, pydantic_field_path, pydantic_message, show_value

__all__ = ["CatalogEntry", "CatalogLines", "SECTIONS", "catalog_entries", "read_catalog_file",
           "RawCatalogFile", "RawCatalogHardware", "RawCatalogModel", "RawCatalogModelConfig", "RawCatalogProfile"]

SECTIONS = ("hardware", "models", "profiles")
"""The sections of a catalogue file, in the order they are merged."""

_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=100)]
_Alias = Annotated[str, Field(min_length=1, max_length=100)]
_Text = Annotated[str, Field(max_length=10_000)]
_Provenance = Annotated[str, Field(min_length=1, max_length=10_000)]


# Bounded numbers, spelled out so type checkers read them as types: an integer in [lo, hi], a finite float in (0, hi].
_Float1e16 = Annotated[float, Field(gt=0.0, le=1e16, allow_inf_nan=False)]
_Float1e3 = Annotated[float, Field(gt=0.0, le=1e3, allow_inf_nan=False)]
_Float1e6 = Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]
_Float1e7 = Annotated[float, Field(gt=0.0, le=1e7, allow_inf_nan=False)]
_Float2p20 = Annotated[float, Field(gt=0.0, le=2.0**20, allow_inf_nan=False)]
_Int0To100 = Annotated[int, Field(ge=0, le=100)]
_Int0To10k = Annotated[int, Field(ge=0, le=10_000)]
_Int0To2p16 = Annotated[int, Field(ge=0, le=2**16)]
_Int0To2p20 = Annotated[int, Field(ge=0, le=2**20)]
_Int0To2p24 = Annotated[int, Field(ge=0, le=2**24)]
_Int0To2p40 = Annotated[int, Field(ge=0, le=2**40)]
_Int1To10p15 = Annotated[int, Field(ge=1, le=10**15)]
_Int1To1024 = Annotated[int, Field(ge=1, le=1024)]
_Int1To10k = Annotated[int, Field(ge=1, le=10_000)]
_Int1To2p16 = Annotated[int, Field(ge=1, le=2**16)]
_Int1To2p20 = Annotated[int, Field(ge=1, le=2**20)]
_Int1To2p24 = Annotated[int, Field(ge=1, le=2**24)]
_Int1To2p40 = Annotated[int, Field(ge=1, le=2**40)]
_Int1To2p50 = Annotated[int, Field(ge=1, le=2**50)]
_Int1ToMaxContext = Annotated[int, Field(ge=1, le=MAX_CONTEXT_LIMIT_TOKENS)]


class _Raw(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Entry(_Raw):
    """What every entry has beyond its kind's fields."""

    name: _Name
    provenance: _Provenance
    """Where the figures come from (a datasheet, a measurement, a contract); shown by ``fleetopt catalog list``."""
    replace: bool = False
    """True: replace the catalogue's entry of that name or alias (else a name already there is an error)."""


# -- hardware (data/catalog/hardware.yaml, section gpus) ------------------------------------------------------


class _RawMemory(_Raw):
    capacity_bytes: _Int1To2p50
    type: _Text | None = None
    capacity_gib: _Float2p20 | None = None
    driver_visible_bytes: _Int1To2p50 | None = None
    capacity_note: _Text | None = None


class _RawPrice(_Raw):
    usd_per_gpu_hour: _Float1e6
    usd_per_8gpu_group_hour: _Float1e7 | None = None
    price_source: _Text | None = None


_Quality = Literal["measured", "one-anchor", "projected", "none"]
"""A power-model quality: :data:`fleetopt.models.power.QUALITIES` spelled out for the type checker."""
assert typing.get_args(_Quality) == QUALITIES, "_Quality must list models.power.QUALITIES"


class _RawPowerModel(_Raw):
    idle_w: _NonNegative
    nominal_w: _Float1e6
    logistic_k: _Float1e3
    logistic_x0: Annotated[float, Field(ge=-64, le=64, allow_inf_nan=False)]
    quality: _Quality = "projected"
    source: _Text | None = None
    measured_check: _Text | None = None


class RawCatalogHardware(_Entry):
    """A ``hardware`` entry: one GPU type (units: bytes, bytes/s, dense TFLOPS, W, US$ per GPU-hour)."""

    aliases: list[_Alias] = Field(default_factory=list, max_length=50)
    form_factor: _Text | None = None
    spec_source: _Text | None = None
    memory: _RawMemory
    memory_bandwidth_bytes_per_s: _Float1e16
    fp16_dense_tflops: _Float1e7
    fp16_note: _Text | None = None
    fp16_dense_tflops_alternatives: dict[str, _Float1e7] | None = None
    fp8_dense_tflops: _Float1e7 | None = None
    tdp_w: _Float1e6
    tdp_note: _Text | None = None
    tdp_w_alternative: _Float1e6 | None = None
    nvlink_bandwidth_bytes_per_s: _Float1e16 | None = None
    inter_node_bandwidth_bytes_per_s: _Float1e16 | None = None
    pcie_bandwidth_bytes_per_s: _Float1e16 | None = None
    sm_version: _Int1To10k | None = None
    gfd_product: _Text | None = None
    """The node label ``nvidia.com/gpu.product`` of GPU feature discovery (``fleetopt export``)."""
    price: _RawPrice
    power_model: _RawPowerModel | None = None
    power_model_quality: _Quality | None = None


# -- models (data/catalog/models.yaml, section models) ------------------------------------------------------


class _RawMoe(_Raw):
    routed_experts: _Int1To2p16
    experts_per_token: _Int1To2p16
    shared_experts: _Int0To2p16 = 0
    expert_intermediate_size: _Int1To2p24
    expert_groups: _Int1To2p16 | None = None
    groups_per_token: _Int1To2p16 | None = None


class _RawMla(_Raw):
    kv_lora_rank: _Int1To2p20
    q_lora_rank: _Int0To2p20 | None = None
    qk_nope_head_dim: _Int1To2p16
    qk_rope_head_dim: _Int0To2p16
    v_head_dim: _Int1To2p16


_Size = _Int1To2p24
_Params = _Int1To10p15


class RawCatalogModel(_Entry):
    """A ``models`` entry given by its architecture (the figures of ``data/catalog/models.yaml``)."""

    hf_id: _Text | None = None
    family: Literal["dense", "moe"]
    attention: Literal["GQA", "MHA", "MLA"] = "GQA"
    layers: _Int1To10k
    dense_layers: _Int0To10k | None = None
    moe_layers: _Int0To10k | None = None
    hidden_size: _Size
    attention_heads: _Int1To2p16
    kv_heads: _Int1To2p16 | None = None
    head_dim: _Int1To2p16 | None = None
    mla: _RawMla | None = None
    moe: _RawMoe | None = None
    intermediate_size: _Int0To2p24
    vocab_size: _Size
    max_position_embeddings: _Int1ToMaxContext
    tied_embeddings: bool = False
    multi_token_prediction_modules: _Int0To100 | None = None
    params_model_card_b: _Float1e6 | None = None
    active_params_model_card_b: _Float1e6 | None = None
    params_computed: _Params
    active_params_computed: _Params
    params_peer_formula: _Params | None = None
    active_params_peer_formula: _Params | None = None
    kv_bytes_per_token_fp16: _Int1To2p40
    kv_cache: dict[str, int] | None = None
    peer_catalog: dict[str, int] | None = None


class RawCatalogModelConfig(_Entry):
    """A ``models`` entry read from a Hugging Face ``config.json`` (path relative to the catalogue file)."""

    config: Annotated[str, Field(min_length=1, max_length=4096)]


# -- calibrated profiles (data/catalog/calibrated_profiles.yaml, section profiles) ------------------------


class _RawProfilePower(_Raw):
    idle_w: _NonNegative
    nominal_w: _Float1e6
    logistic_k: _Float1e3
    logistic_x0: Annotated[float, Field(ge=-64, le=64, allow_inf_nan=False)]


class _RawProfileQuality(_Raw):
    latency: _Text | None = None
    """Free text; ``projected`` in it marks the latency constants projected, else calibrated."""
    power: _Text | None = None
    """Free text starting with a power quality (measured, one-anchor, projected, none)."""


_Tokens = _Int1ToMaxContext


class RawCatalogProfile(_Entry):
    """A ``profiles`` entry: one calibrated serving unit (W, H in s; lengths in tokens; US$ per unit-hour; W)."""

    model: _Text | None = None
    """What the unit serves (e.g. ``Llama-3-70B-class (TP=8 unit)``); shown in reports, default unspecified."""
    physical_gpus_per_replica: _Int1To1024 | None = None
    """Physical GPUs the unit's constants describe (e.g. 8 for a TP=8 server priced as one GPU); default 1."""
    unit_note: _Text | None = None
    W: _Float1e3
    H: _Float1e3
    calibration_ctx: _Tokens
    chunk: _Tokens
    blk_size: _Int1To2p16
    total_kv_blks: _Int1To2p40
    max_slots: _Int1To2p20
    cost_per_hr: _Float1e7
    cost_basis: _Text | None = None
    cost_per_hr_per_gpu_equivalent: _Float1e6 | None = None
    power: _RawProfilePower
    quality: _RawProfileQuality | None = None
    source: _Text | None = None
    n_slots_at: dict[_Tokens, _Int0To2p40] | None = None
    """Optional check: the profile's concurrency at these contexts (tokens -> sequences)."""
    kv_budget_ratio_vs_h100: _Positive | None = None
    kv_budget_ratio_derivation: _Text | None = None


class RawCatalogFile(_Raw):
    """A catalogue file's top level (the entries are checked one by one, see :func:`catalog_entries`)."""

    schema_version: Literal[1] | None = None
    hardware: list[Any] = Field(default_factory=list)
    models: list[Any] = Field(default_factory=list)
    profiles: list[Any] = Field(default_factory=list)


_MODELS: dict[str, type[_Entry]] = {"hardware": RawCatalogHardware, "models": RawCatalogModel,
                                    "profiles": RawCatalogProfile}


# --------------------------------------------------------------------------------------------
# Problems and entries
# --------------------------------------------------------------------------------------------


def _printable(text: str) -> str:
    """``text`` with every unprintable character escaped, so that a problem stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


class CatalogLines:
    """Collects one-line problems ``FILE: field: message`` (unprintable characters escaped)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, file, field: str, message: str) -> None:
        self.lines.append(format_problem(_printable(str(file)) if file not in (None, "") else None,
                                         _printable(field), _printable(message)))


@dataclass(frozen=True)
class CatalogEntry:
    """One checked entry of a catalogue file.

    ``data`` holds the entry's fields as the shipped file of its kind spells them (``name``, ``provenance``,
    ``replace`` and ``config`` left out); ``file`` is the file as error lines and ``catalog list`` name it;
    ``config`` is the resolved ``config.json`` of a model given by one (None otherwise) and ``config_given``
    the path as written.
    """

    kind: str
    index: int
    name: str
    data: Mapping[str, Any]
    provenance: str
    replace: bool
    file: str
    config: Path | None = None
    config_given: str | None = None

    @property
    def field(self) -> str:
        """``catalog.KIND[i]``: the entry's place in error lines."""
        return f"catalog.{self.kind}[{self.index}]"


def _annotation_model(annotation) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``X | None``, ``Annotated[X, ...]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _annotation_model(arg)
        if found is not None:
            return found
    return None


def _allowed(model: type[BaseModel], loc) -> str:
    """The keys the (nested) section of ``model`` at ``loc`` allows, comma-separated."""
    for part in loc:
        if not isinstance(part, str):
            continue
        info = model.model_fields.get(part)
        inner = None if info is None else _annotation_model(info.annotation)
        if inner is None:
            return ""
        model = inner
    return ", ".join(model.model_fields)


def _message(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    """The instance's wording (:func:`fleetopt.optimizer.io.schema.pydantic_message`) with this file's keys."""
    return pydantic_message(error, lambda loc: _allowed(model, loc))


_ModelT = TypeVar("_ModelT", bound=BaseModel)


def _validated(model: type[_ModelT], value: Any, prefix: str, file, lines: CatalogLines) -> _ModelT | None:
    try:
        return model.model_validate(value)
    except ValidationError as err:
        for error in err.errors(include_url=False):
            where = pydantic_field_path(error["loc"])
            lines.add(file, f"{prefix}.{where}" if where else prefix, _message(model, error))
        return None


def _model_problems(raw: RawCatalogModel, prefix: str, file, lines: CatalogLines) -> None:
    """Cross-field rules of an architecture entry (what the loader would otherwise get wrong)."""
    if (raw.family == "moe") != (raw.moe is not None):
        lines.add(file, f"{prefix}.moe", "a moe block is required for family moe and not allowed for dense; "
                                         f"family is {raw.family}")
    kv_heads = raw.kv_heads or raw.attention_heads
    if raw.attention_heads % kv_heads:
        lines.add(file, f"{prefix}.kv_heads", f"{kv_heads} does not divide attention_heads {raw.attention_heads}")
    if raw.head_dim is None and raw.hidden_size % raw.attention_heads:
        lines.add(file, f"{prefix}.head_dim", f"missing, and hidden_size {raw.hidden_size} is not a multiple of "
                                              f"attention_heads {raw.attention_heads}; give head_dim")
    if raw.active_params_computed > raw.params_computed:
        lines.add(file, f"{prefix}.active_params_computed", f"{raw.active_params_computed} exceeds params_computed "
                                                            f"{raw.params_computed}")
    if raw.moe is not None and raw.moe.experts_per_token > raw.moe.routed_experts:
        lines.add(file, f"{prefix}.moe.experts_per_token", f"{raw.moe.experts_per_token} is more than the "
                                                           f"{raw.moe.routed_experts} routed_experts")


def _power_problems(block, prefix: str, file, lines: CatalogLines) -> None:
    if block is not None and block.idle_w > block.nominal_w:
        lines.add(file, f"{prefix}.idle_w", f"{block.idle_w:g} exceeds nominal_w {block.nominal_w:g}; "
                                            "give idle_w <= nominal_w")


def _profile_problems(raw: RawCatalogProfile, prefix: str, file, lines: CatalogLines) -> None:
    _power_problems(raw.power, f"{prefix}.power", file, lines)
    power_quality = raw.quality.power if raw.quality is not None else None
    if power_quality is not None and (power_quality.split() or [""])[0] not in QUALITIES:
        lines.add(file, f"{prefix}.quality.power", f"{show_value(power_quality)} does not start with a power "
                                                   f"quality; start it with one of {', '.join(QUALITIES)}")


def _entry(kind: str, index: int, value: Any, file, base_dir: Path, lines: CatalogLines) -> CatalogEntry | None:
    prefix = f"catalog.{kind}[{index}]"
    model = RawCatalogModelConfig if kind == "models" and isinstance(value, Mapping) and "config" in value \
        else _MODELS[kind]
    before = len(lines.lines)
    raw = _validated(model, value, prefix, file, lines)
    if raw is None:
        return None
    if isinstance(raw, RawCatalogModel):
        _model_problems(raw, prefix, file, lines)
    elif isinstance(raw, RawCatalogHardware):
        _power_problems(raw.power_model, f"{prefix}.power_model", file, lines)
    elif isinstance(raw, RawCatalogProfile):
        _profile_problems(raw, prefix, file, lines)
    if len(lines.lines) > before:
        return None
    data = raw.model_dump(exclude={"name", "provenance", "replace", "config"}, exclude_none=True)
    config = None
    if isinstance(raw, RawCatalogModelConfig):
        config = Path(raw.config).expanduser()
        config = config if config.is_absolute() else base_dir / config
    return CatalogEntry(kind, index, raw.name, data, raw.provenance, raw.replace, str(file), config,
                        getattr(raw, "config", None))


def catalog_entries(data: Any, file, base_dir: Path, lines: CatalogLines) -> list[CatalogEntry]:
    """Every valid entry of a parsed catalogue (a file's content, or an instance's inline ``catalog:``).

    Parameters
    ----------
    data : Any
        The parsed mapping.
    file : str or Path
        What error lines name as the file.
    base_dir : Path
        Where ``config`` paths of ``models`` entries resolve.
    lines : CatalogLines
        Receives one line per problem; an entry with a problem is left out.
    """
    if not isinstance(data, Mapping):
        lines.add(file, "catalog", f"expected a mapping with keys {', '.join(RawCatalogFile.model_fields)}; "
                                   f"got {show_value(data)}")
        return []
    top = _validated(RawCatalogFile, data, "catalog", file, lines)
    # the sections that are lists are checked even when another key is wrong (every problem in one pass)
    sections = {kind: getattr(top, kind) if top is not None else data.get(kind) for kind in SECTIONS}
    entries = []
    for kind in SECTIONS:
        section = sections[kind]
        if not isinstance(section, list):
            continue
        for index, value in enumerate(section):
            entry = _entry(kind, index, value, file, base_dir, lines)
            if entry is not None:
                entries.append(entry)
    return entries


def read_catalog_file(path: str | Path, lines: CatalogLines, label: str | None = None) -> list[CatalogEntry]:
    """The entries of the catalogue file at ``path`` (YAML or JSON); error lines name it as ``label`` (default:
    ``path`` as given)."""
    path = Path(path)
    file = label if label is not None else str(path)
    text, reason = read_text(path)
    if reason is not None:
        lines.add(file, "", f"cannot read the catalogue file: {reason}; check the path")
        return []
    assert text is not None                         # read_text gives the text exactly when no reason
    data, message = parse_text(text, ".json" if path.suffix.lower() == ".json" else ".yaml")
    if message is not None:
        lines.add(file, "", message)
        return []
    if data is None:
        lines.add(file, "", "the file is empty; give sections hardware, models and/or profiles")
        return []
    return catalog_entries(data, file, path.parent, lines)
