"""GPU options of an instance: each ``gpus`` entry resolved to a serving profile.

An entry names exactly one of: a calibrated ``profile`` from the catalogue, a
``profile_file`` (a profile YAML written by ``fleetopt profile fit``, resolved
relative to the instance file's folder: :mod:`fleetopt.optimizer.io.profile_file`),
or ``hardware`` + ``model`` (a catalogue model) or ``hardware`` + ``model_config`` (a Hugging Face
``config.json``, resolved relative to the instance file's folder: :mod:`fleetopt.optimizer.io.hf_config`)
with a serving config, from which a roofline profile is built. Catalogue names are looked up case-insensitively
and never replaced
by a default; a price override, the GPU counts and the context window are
checked against the profile.

A computed entry may list several ``tp`` and/or ``dtype`` values (:func:`~fleetopt.optimizer.io.schema.gpu_choices`):
each combination is a candidate configuration, built in the order ``tp`` x ``dtype`` as listed and named
``NAME/tpT/DTYPE`` (a ``/`` no user name holds, so the names never collide). A combination *fits* when the profile
builder accepts it (fp8 needs FP8 tensor cores, ``tp`` must divide the heads, ...), the weights leave room for a KV
cache (at least one KV block per GPU) and ``max_count`` holds one replica of ``tp`` GPUs; the others are kept as
:class:`Configuration` records with the reason, and when none fits the entry is one problem naming
``gpus[i].tp``/``dtype``. The entry's ``max_count``/``min_count``/``max_pools``/``min_pools`` bind the sum over its
configurations (:class:`fleetopt.optimizer.io.instance.GpuInventory`). Every problem is added to a
:class:`~fleetopt.optimizer.io.schema.Problems`; :mod:`fleetopt.optimizer.io.instance` turns the
result into :class:`~fleetopt.optimizer.io.instance.GpuOption` records.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import NamedTuple, cast

from fleetopt.models.profiles import ServingProfile

from fleetopt.optimizer.io.catalog import Catalog, instance_catalog
from fleetopt.optimizer.io.schema import Problems, RawGpu, gpu_choices, validate_section

__all__ = ["ResolvedGpu", "Configuration", "resolve_gpus", "check_context_fits", "configuration_name"]

_COMPUTED_ONLY = ("tp", "dtype", "memory_utilization", "max_num_seqs", "kv_layout", "chunk", "moe_w")
"""Keys that only apply to a computed (hardware + model) profile."""


class Configuration(NamedTuple):
    """One (``tp``, ``dtype``) combination of a computed ``gpus`` entry that lists several: the GPU option it
    became (``option``, None when it does not fit) or why it does not fit (``reason``, empty when it does)."""

    tp: int
    dtype: str
    option: str | None
    reason: str


class ResolvedGpu(NamedTuple):
    """A GPU option that passed every check: its ``gpus`` entry, profile and kind (``calibrated`` or ``computed``),
    its name (the entry's, or ``NAME/tpT/DTYPE`` for a configuration of an entry with lists), the entry's position
    in the file and, for an entry with lists, every configuration considered (empty otherwise)."""

    raw: RawGpu
    profile: ServingProfile
    kind: str
    name: str = ""
    index: int = 0
    configurations: tuple[Configuration, ...] = ()


def configuration_name(entry: str, tp: int, dtype: str) -> str:
    """The GPU option name of one configuration of an entry with lists.

    Examples
    --------
    >>> configuration_name("h100", 4, "fp8")
    'h100/tp4/fp8'
    """
    return f"{entry}/tp{tp}/{dtype}"


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


def _config_model(given: str, prefix: str, problems: Problems):
    """The :class:`~fleetopt.models.hardware.ModelSpec` of the entry's ``model_config`` file ``given``, or None after
    reporting each problem as ``gpus[i].model_config: 'GIVEN' (resolved to PATH): KEY: problem``."""
    from fleetopt.optimizer.io.hf_config import model_config_problems   # only an entry with model_config reads one

    file = _resolved_path(problems, given)
    model, lines = model_config_problems(file)
    for line in lines:
        problems.add(f"{prefix}.model_config", f"{given!r} (resolved to {file}): {line}")
    return model


class _Reasons(Problems):
    """A :class:`Problems` that keeps each message alone: why one configuration of an entry with lists does not fit."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.reasons: list[str] = []

    def add(self, field: str, message: str) -> None:
        super().add(field, message)
        self.reasons.append(message.removesuffix("; change the serving config or the hardware"))


def _computed_profiles(raw: RawGpu, catalog: Catalog, prefix: str, problems: Problems):
    """``[(tp, dtype, profile or None, reason)]`` for every configuration of a computed entry (one when it lists
    no more), or None after reporting a problem of the entry itself."""
    # _gpu_kind gives "computed" only with hardware, and with model or model_config
    assert raw.hardware is not None and (raw.model is not None or raw.model_config_file is not None)
    hardware = _lookup(catalog, "hardware", raw.hardware, f"{prefix}.hardware", problems)
    if raw.model_config_file is not None:
        model = _config_model(raw.model_config_file, prefix, problems)
    else:
        assert raw.model is not None
        model = _lookup(catalog, "models", raw.model, f"{prefix}.model", problems)
    if hardware is None or model is None:
        return None
    tps, dtypes, expanded = gpu_choices(raw)
    if not expanded:
        profile = _computed_profile(raw, catalog, prefix, problems, hardware, model, tps[0], dtypes[0])
        return None if profile is None else [(tps[0], dtypes[0], profile, "")]
    if raw.cost_per_hr is not None and len(tps) > 1:
        problems.add(f"{prefix}.cost_per_hr", "a replica price cannot apply to several tensor-parallel degrees "
                                              "(replicas of different sizes); remove cost_per_hr or give one tp")
        return None
    out = []
    for tp in tps:
        for dtype in dtypes:
            trial = _Reasons(problems.path)
            profile = _computed_profile(raw, catalog, prefix, trial, hardware, model, tp, dtype)
            reason = "; ".join(trial.reasons)
            if profile is not None and getattr(profile, "total_kv_blocks", 1) < 1:
                profile, reason = None, profile.note or "no room for a KV cache"
            if profile is not None and raw.max_count is not None and raw.max_count < tp:
                profile, reason = None, f"a replica needs {tp} GPUs, more than max_count {raw.max_count}"
            out.append((tp, dtype, profile, reason))
    if all(p is None for _, _, p, _ in out):
        why = "; ".join(f"tp{tp}/{dtype}: {reason}" for tp, dtype, _, reason in out)
        problems.add(f"{prefix}.tp", f"no combination of tp {list(tps)} and dtype {list(dtypes)} fits ({why}); "
                                     "list other tp/dtype values or another hardware")
        return None
    return out


def _computed_profile(raw: RawGpu, catalog: Catalog, prefix: str, problems: Problems, hardware, model, tp: int,
                      dtype: str):
    """A roofline profile for ``hardware`` x ``model`` (or ``model_config``) at ``tp`` and ``dtype`` under the
    entry's serving config, or None after reporting why not."""
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
        return computed_profile(hardware, model, tp=tp, dtype=dtype,
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
    if not dataclasses.is_dataclass(profile) or isinstance(profile, type):     # (a profile is an instance)
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
    from fleetopt.optimizer.io.profile_file import profile_file_problems   # only an entry with profile_file

    assert raw.profile_file is not None             # _gpu_kind gives "file" only with profile_file
    file = _resolved_path(problems, raw.profile_file)
    profile, lines = profile_file_problems(file)
    for line in lines:
        problems.add(f"{prefix}.profile_file", f"{raw.profile_file!r} (resolved to {file}): {line}")
    return profile


def _resolve_gpu(raw: RawGpu, index: int, catalog: Catalog, problems: Problems) -> list[ResolvedGpu] | None:
    """The GPU options of entry ``index``: one, or one per fitting configuration of an entry with lists."""
    prefix = f"gpus[{index}]"
    kind = _gpu_kind(raw, prefix, problems)
    if kind == "calibrated":
        assert raw.profile is not None              # _gpu_kind gives "calibrated" only with profile
        profile = _lookup(catalog, "profiles", raw.profile, f"{prefix}.profile", problems)
        built = None if profile is None else [(0, "", profile, "")]
    elif kind == "file":
        profile = _file_profile(raw, prefix, problems)
        kind = "calibrated"    # a CalibratedProfile like the catalogue's, with measured constants
        built = None if profile is None else [(0, "", profile, "")]
    elif kind == "computed":
        built = _computed_profiles(raw, catalog, prefix, problems)
    else:
        return None
    if built is None:
        return None
    expanded = len(built) > 1       # (a calibrated or file profile is one configuration; its tp 0 and dtype "" unused)
    configurations = tuple(Configuration(tp, dtype, None if p is None else configuration_name(raw.name, tp, dtype),
                                         reason) for tp, dtype, p, reason in built) if expanded else ()
    before = len(problems.lines)
    out = []
    for tp, dtype, profile, _ in built:
        if profile is None:
            continue
        if not expanded:
            _count_problems(raw, profile, prefix, problems)
        profile = _with_cost(profile, raw.cost_per_hr, prefix, problems)
        if profile is None:
            return None
        name = configuration_name(raw.name, tp, dtype) if expanded else raw.name
        # a catalogue, file or computed profile implements ServingProfile; its frozen fields are read-only, which
        # the protocol's plain attributes do not express
        out.append(ResolvedGpu(raw, cast(ServingProfile, profile), kind, name, index, configurations))
    if len(problems.lines) > before:
        return None
    if expanded and raw.max_count is not None and raw.min_count > raw.max_count:
        problems.add(f"{prefix}.min_count", f"{raw.min_count} exceeds max_count {raw.max_count}; "
                                            "give min_count <= max_count")
        return None
    return out


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
    """Every GPU option of the ``gpus`` entries (an entry with ``tp``/``dtype`` lists gives one per configuration that
    fits, in file order), or None when any entry has a problem.

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
    if any(o is None for o in options):
        return None
    return [r for entry in options for r in entry]   # pyright: ignore[reportOptionalIterable] (checked above)


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

