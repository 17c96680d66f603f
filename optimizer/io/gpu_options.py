"""GPU options of an instance: each ``gpus`` entry resolved to a serving profile.

An entry names exactly one of: a calibrated ``profile`` from the catalogue, a
``profile_file`` (a profile YAML written by ``fleetopt profile fit``, resolved
relative to the instance file's folder: :mod:`fleetopt.optimizer.io.profile_file`),
or ``hardware`` + ``model`` (a catalogue model) or ``hardware`` + ``model_config`` (a Hugging Face
``config.json``, resolved relative to the instance file's folder: :mod:`fleetopt.optimizer.io.hf_config`)
with a serving config, from which a roofline profile is built. Catalogue names are looked up case-insensitively
and never replaced
by a default; a price override, the GPU counts and the context window are
checked against the profile. Every problem is added to a
:class:`~fleetopt.optimizer.io.schema.Problems`; :mod:`fleetopt.optimizer.io.instance` turns the
result into :class:`~fleetopt.optimizer.io.instance.GpuOption` records.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import NamedTuple

from fleetopt.models.profiles import ServingProfile

from fleetopt.optimizer.io.catalog import Catalog, instance_catalog
from fleetopt.optimizer.io.hf_config import model_config_problems
from fleetopt.optimizer.io.profile_file import profile_file_problems
from fleetopt.optimizer.io.schema import Problems, RawGpu, validate_section

__all__ = ["ResolvedGpu", "resolve_gpus", "check_context_fits"]

_COMPUTED_ONLY = ("tp", "dtype", "memory_utilization", "max_num_seqs", "kv_layout", "chunk", "moe_w")
"""Keys that only apply to a computed (hardware + model) profile."""


class ResolvedGpu(NamedTuple):
    """A ``gpus`` entry that passed every check, with its profile and kind (``calibrated`` or ``computed``)."""

    raw: RawGpu
    profile: ServingProfile
    kind: str


def _lookup(catalog: Catalog, kind: str, name: str, field: str, problems: Problems):
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


def _resolved_path(problems: Problems, given: str) -> Path:
    """``given`` relative to the instance file's folder (the current folder when there is no file)."""
    base = Path(problems.path).parent if problems.path not in (None, "") else Path.cwd()
    file = Path(given).expanduser()
    return file if file.is_absolute() else base / file


def _config_model(raw: RawGpu, prefix: str, problems: Problems):
    """The :class:`~fleetopt.models.hardware.ModelSpec` of the entry's ``model_config`` file, or None after
    reporting each problem as ``gpus[i].model_config: 'GIVEN' (resolved to PATH): KEY: problem``."""
    file = _resolved_path(problems, raw.model_config_file)
    model, lines = model_config_problems(file)
    for line in lines:
        problems.add(f"{prefix}.model_config", f"{raw.model_config_file!r} (resolved to {file}): {line}")
    return model


def _computed_profile(raw: RawGpu, catalog: Catalog, prefix: str, problems: Problems):
    """A roofline profile for ``hardware`` x ``model`` (or ``model_config``) under the entry's serving config."""
    hardware = _lookup(catalog, "hardware", raw.hardware, f"{prefix}.hardware", problems)
    model = (_config_model(raw, prefix, problems) if raw.model_config_file is not None
             else _lookup(catalog, "models", raw.model, f"{prefix}.model", problems))
    if hardware is None or model is None:
        return None
    from fleetopt.models.roofline import computed_profile  # written alongside; imported only when needed

    options = {"gpu_memory_utilization": raw.memory_utilization, "max_num_seqs": raw.max_num_seqs,
               "kv_layout": raw.kv_layout, "chunk_tokens": raw.chunk, "moe_w": raw.moe_w}
    if raw.moe_w == "layer-table":
        if not model.is_moe:
            problems.add(f"{prefix}.moe_w",
                         f"'layer-table' applies to a mixture-of-experts model; {model.name} is dense")
            return None
        options["moe_table"] = catalog.moe_latency_table
    try:
        return computed_profile(hardware, model, tp=raw.tp or 1, dtype=raw.dtype or "fp16",
                                defaults=catalog.defaults, **{k: v for k, v in options.items() if v is not None})
    except ValueError as err:
        problems.add(_builder_field(str(err), prefix), f"{err}; change the serving config or the hardware")
        return None


def _gpu_kind(raw: RawGpu, prefix: str, problems: Problems) -> str | None:
    """``calibrated``, ``file`` or ``computed`` from which keys are given, or None after reporting."""
    computed = raw.hardware is not None or raw.model is not None or raw.model_config_file is not None
    given = [key for key, present in (("profile", raw.profile is not None),
                                      ("profile_file", raw.profile_file is not None),
                                      ("hardware/model", computed)) if present]
    if len(given) > 1:
        both = "both " + " and ".join(given) if len(given) == 2 else "all of " + ", ".join(given)
        problems.add(prefix, f"{both} are given; give exactly one of profile (calibrated), "
                             "profile_file (a fitted profile file) or hardware + model (computed)")
        return None
    if raw.profile is not None or raw.profile_file is not None:
        key = "profile" if raw.profile is not None else "profile_file"
        extra = [k for k in _COMPUTED_ONLY if getattr(raw, k) is not None]
        for name in extra:
            problems.add(f"{prefix}.{name}", "only applies to a computed profile (hardware + model); "
                                             f"remove it or replace {key} by hardware + model")
        return None if extra else ("calibrated" if key == "profile" else "file")
    if not computed:
        problems.add(prefix, "neither profile nor hardware + model is given (nor profile_file, nor "
                             "hardware + model_config); give one of them")
        return None
    if raw.model is not None and raw.model_config_file is not None:
        problems.add(prefix, "both model and model_config are given; give exactly one of model (a catalogue "
                             "model) or model_config (a Hugging Face config.json) with hardware")
        return None
    if raw.hardware is None:
        problems.add(f"{prefix}.hardware", "missing; a computed profile needs both hardware and model "
                                           "(or model_config)")
    if raw.model is None and raw.model_config_file is None:
        problems.add(f"{prefix}.model", "missing; a computed profile needs both hardware and model "
                                        "(or model_config, a Hugging Face config.json)")
        return None
    return "computed" if raw.hardware is not None else None


def _with_cost(profile, cost_usd_per_hr: float | None, prefix: str, problems: Problems):
    if cost_usd_per_hr is None:
        return profile
    if not dataclasses.is_dataclass(profile):
        problems.add(f"{prefix}.cost_per_hr", "this profile's price cannot be overridden; remove cost_per_hr")
        return None
    return dataclasses.replace(profile, cost_usd_per_hr=float(cost_usd_per_hr))


def _count_problems(raw: RawGpu, profile, prefix: str, problems: Problems) -> None:
    per_replica = int(getattr(profile, "gpus_per_replica", 1))
    if raw.max_count is not None and raw.max_count < per_replica:
        problems.add(f"{prefix}.max_count", f"{raw.max_count} GPUs cannot form one replica, which needs "
                                            f"{per_replica}; give max_count >= {per_replica} or omit it")
    if raw.max_count is not None and raw.min_count > raw.max_count:
        problems.add(f"{prefix}.min_count", f"{raw.min_count} exceeds max_count {raw.max_count}; "
                                            "give min_count <= max_count")


def _file_profile(raw: RawGpu, prefix: str, problems: Problems):
    """The profile in ``profile_file``, resolved against the instance file's folder (the current one without)."""
    file = _resolved_path(problems, raw.profile_file)
    profile, lines = profile_file_problems(file)
    for line in lines:
        problems.add(f"{prefix}.profile_file", f"{raw.profile_file!r} (resolved to {file}): {line}")
    return profile


def _resolve_gpu(raw: RawGpu, index: int, catalog: Catalog, problems: Problems) -> ResolvedGpu | None:
    prefix = f"gpus[{index}]"
    kind = _gpu_kind(raw, prefix, problems)
    if kind == "calibrated":
        profile = _lookup(catalog, "profiles", raw.profile, f"{prefix}.profile", problems)
    elif kind == "file":
        profile = _file_profile(raw, prefix, problems)
        kind = "calibrated"    # a CalibratedProfile like the catalogue's, with measured constants
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
    return ResolvedGpu(raw, profile, kind)


def _duplicate_names(raws: list[RawGpu | None], problems: Problems) -> None:
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


def resolve_gpus(data: dict, problems: Problems, catalog_section=None) -> list[ResolvedGpu] | None:
    """Every ``gpus`` entry with its profile, or None when any entry has a problem.

    Names resolve in the catalogue in effect (the shipped one and any ``--catalog`` files) extended by the
    instance's own ``catalog:`` value ``catalog_section`` (:func:`fleetopt.optimizer.io.catalog.instance_catalog`);
    a problem of those files is reported and the entries are not resolved.
    """
    catalog = instance_catalog(catalog_section, problems)
    items = data.get("gpus")
    if catalog is None or not isinstance(items, list) or not items:
        return None
    raws = [validate_section(RawGpu, item) for item in items]
    _duplicate_names(raws, problems)
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


def check_context_fits(profiles: list[ServingProfile], max_context_tokens: int, problems: Problems) -> None:
    """Report ``pools.max_context`` when no profile holds even one request of that length."""
    if any(int(p.n_slots(max_context_tokens)) >= 1 for p in profiles):
        return
    best = max(_largest_context_tokens(p, max_context_tokens) for p in profiles)
    if best == 0:
        problems.add("pools.max_context", f"no listed GPU holds a {max_context_tokens}-token context, nor any "
                                          "context at all (n_slots(1) = 0 for every option: no room for a KV "
                                          "cache); add a GPU (or tp) with memory to spare")
        return
    problems.add("pools.max_context", f"no listed GPU holds a {max_context_tokens}-token context "
                                      f"(n_slots < 1 for every option); the largest any listed GPU holds is "
                                      f"{best} tokens; lower max_context or add a GPU that holds it")

