"""Load the shipped catalogue (GPUs, LLMs, calibrated profiles) into model records.

The data files live in the repository's ``data/`` folder, which installs as
``fleetopt/data`` beside ``fleetopt/optimizer``: the same relative path in a
checkout and in a wheel, so :func:`data_dir` needs no search and the package
never reads anything outside itself at run time. The example instances (``instances/``) install the same way
as ``fleetopt/instances`` (:func:`instances_dir`).

The user's own catalogue files (:mod:`fleetopt.optimizer.io.catalog_file`) extend the shipped one, in this
order: the files of ``--catalog FILE`` (the CLI enters :func:`catalog_files` for the command; within it
:func:`load_catalog` includes them), then an instance's own ``catalog:`` section (:func:`instance_catalog`). A
name or alias already present (shipped, or from an earlier file) is an error unless the new entry says
``replace: true``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import yaml

from fleetopt.models.hardware import HardwareSpec, ModelSpec, MoESpec, RooflineDefaults
from fleetopt.models.power import PowerCurve
from fleetopt.models.profiles import CalibratedProfile

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.schema import show_value

if TYPE_CHECKING:   # both load on first use: the user-file format (its pydantic models: 0.2 s) and the roofline
    from fleetopt.models.roofline import MoELatencyTable
    from fleetopt.optimizer.io.catalog_file import CatalogEntry, CatalogLines

__all__ = ["Catalog", "UserEntry", "data_dir", "instances_dir", "load_catalog", "bundled_catalog", "catalog_files",
           "active_catalog_files", "extend_catalog", "user_catalog", "instance_catalog", "catalog_documents",
           "catalog_listing", "CATALOG_FILES", "CATALOG_KINDS", "CATALOG_UNITS", "BUILTIN_WORKLOADS"]

CATALOG_FILES = {"hardware": "hardware.yaml", "models": "models.yaml", "profiles": "calibrated_profiles.yaml"}
"""The catalogue's YAML files (in ``data/catalog/``) by kind."""

BUILTIN_WORKLOADS = {
    "azure": "workloads/azure_cdf.json",
    "lmsys": "workloads/lmsys_cdf.json",
    "agent_heavy": "workloads/agent_heavy_cdf.json",
    "azure_conv_trace": "workloads/azure_conv_trace.csv",
}
"""Workloads shipped with the package, addressable as ``builtin:NAME`` in instance files."""

# What each calibrated profile's latency constants stand for (calibrated_profiles.yaml unit_note).
_PROFILE_MODELS = {
    "A10G": "7B-class model (1 GPU)",
    "A100-80GB": "Llama-3-70B-class (TP=8 unit)",
    "H100-80GB": "Llama-3-70B-class (TP=8 unit)",
    "B200-projected": "Llama-3-70B-class (TP=8 unit)",
}


def data_dir() -> Path:
    """Folder holding ``catalog/`` and ``workloads/`` (installed wheel or source checkout)."""
    folder = Path(__file__).resolve().parents[2] / "data"
    if not (folder / "catalog" / "hardware.yaml").is_file():
        raise FileNotFoundError(f"fleetopt data files not found in {folder}; the installation is incomplete")
    return folder


def instances_dir() -> Path:
    """Folder of the example instances (``instances/`` of a checkout, ``fleetopt/instances`` of a wheel)."""
    folder = Path(__file__).resolve().parents[2] / "instances"
    if not folder.is_dir():
        raise FileNotFoundError(f"fleetopt example instances not found in {folder}; the installation is incomplete")
    return folder


@dataclass(frozen=True)
class UserEntry:
    """An entry a user catalogue file added: its kind, name, the file and the provenance it gave, and its
    ``catalog list`` row."""

    kind: str
    name: str
    file: str
    provenance: str
    row: dict


@dataclass(frozen=True)
class Catalog:
    hardware: dict[str, HardwareSpec]
    models: dict[str, ModelSpec]
    profiles: dict[str, CalibratedProfile]
    defaults: RooflineDefaults
    moe_layer_tables: dict[tuple[int, int, int, int], dict[float, tuple[tuple[float, float], ...]]]
    moe_reference_bandwidth_bytes_per_s: float
    moe_bandwidth_exponent: float
    moe_decode_reference_tokens: int
    user_entries: tuple[UserEntry, ...] = field(default=())
    """The entries user catalogue files added (in order); empty for the shipped catalogue."""

    @property
    def moe_latency_table(self) -> MoELatencyTable:
        """The MoE per-layer latency table as a record for :func:`fleetopt.models.roofline.computed_profile`."""
        from fleetopt.models.roofline import MoELatencyTable   # the roofline loads with the first computed profile

        return MoELatencyTable.from_mapping(self.moe_layer_tables, self.moe_reference_bandwidth_bytes_per_s,
                                            self.moe_bandwidth_exponent, self.moe_decode_reference_tokens)

    def find(self, kind: str, name: str):
        """Look ``name`` up case-insensitively (aliases too) in ``kind`` (hardware|models|profiles).

        Raises ``KeyError`` with the known names when nothing matches; never falls back.
        """
        table = getattr(self, kind)
        key = name.strip().lower()
        for canonical, record in table.items():
            names = {canonical.lower()} | {a.lower() for a in getattr(record, "aliases", ())}
            if key in names:
                return record
        raise KeyError(f"unknown {kind[:-1] if kind != 'hardware' else 'hardware'} {name!r}; known: {', '.join(table)}")


def _power(block, quality: str | None = None) -> PowerCurve | None:
    if not block:
        return None
    return PowerCurve(float(block["idle_w"]), float(block["nominal_w"]), float(block["logistic_k"]),
                      float(block["logistic_x0"]), quality or block.get("quality", "projected"))


def _hardware(name: str, d: dict) -> HardwareSpec:
    return HardwareSpec(
        name=name,
        aliases=tuple(d.get("aliases", ())),
        memory_bytes=int(d["memory"]["capacity_bytes"]),
        memory_bandwidth_bytes_per_s=float(d["memory_bandwidth_bytes_per_s"]),
        fp16_dense_tflops=float(d["fp16_dense_tflops"]),
        fp8_dense_tflops=None if d.get("fp8_dense_tflops") is None else float(d["fp8_dense_tflops"]),
        tdp_w=float(d["tdp_w"]),
        usd_per_gpu_hour=float(d["price"]["usd_per_gpu_hour"]),
        power=_power(d.get("power_model")),
        spec_source=str(d.get("spec_source", "public")),
        nvlink_bandwidth_bytes_per_s=_optional_float(d.get("nvlink_bandwidth_bytes_per_s")),
        inter_node_bandwidth_bytes_per_s=_optional_float(d.get("inter_node_bandwidth_bytes_per_s")),
        pcie_bandwidth_bytes_per_s=_optional_float(d.get("pcie_bandwidth_bytes_per_s")),
    )


def _optional_float(value) -> float | None:
    return None if value is None else float(value)


def _model(name: str, d: dict) -> ModelSpec:
    moe = d.get("moe")
    return ModelSpec(
        name=name,
        family=d["family"],
        layers=int(d["layers"]),
        hidden_size=int(d["hidden_size"]),
        attention_heads=int(d["attention_heads"]),
        kv_heads=int(d.get("kv_heads", d["attention_heads"])),
        head_dim=int(d.get("head_dim", d["hidden_size"] // d["attention_heads"])),
        intermediate_size=int(d["intermediate_size"]),
        vocab_size=int(d["vocab_size"]),
        max_position_embeddings=int(d["max_position_embeddings"]),
        params=int(d["params_computed"]),
        active_params=int(d["active_params_computed"]),
        kv_bytes_per_token_fp16=int(d["kv_bytes_per_token_fp16"]),
        moe=None if not moe else MoESpec(int(moe["routed_experts"]), int(moe["experts_per_token"]),
                                         int(moe.get("shared_experts", 0)), int(moe["expert_intermediate_size"])),
        attention=str(d.get("attention", "GQA")),
        tied_embeddings=bool(d.get("tied_embeddings", False)),
    )


def _profile(name: str, d: dict, model_name: str | None = None, source: str | None = None) -> CalibratedProfile:
    quality = d.get("quality", {})
    latency_q = "projected" if "projected" in str(quality.get("latency", "")) else "calibrated"
    power_q = str(quality.get("power", "projected")).split()[0]
    per_gpu = d.get("cost_per_hr_per_gpu_equivalent")
    return CalibratedProfile(
        name=name,
        model_name=model_name or _PROFILE_MODELS.get(name, "unspecified"),
        W_s=float(d["W"]),
        H_s=float(d["H"]),
        calibration_ctx_tokens=int(d["calibration_ctx"]),
        chunk_tokens=int(d["chunk"]),
        blk_size_tokens=int(d["blk_size"]),
        total_kv_blocks=int(d["total_kv_blks"]),
        max_slots=int(d["max_slots"]),
        # One unit is billed as one GPU (the seeds' convention); the projected B200 lists a node
        # price, so its per-GPU equivalent is used to keep the units comparable.
        cost_usd_per_hr=float(per_gpu if per_gpu is not None else d["cost_per_hr"]),
        gpus_per_replica=1,
        # The physical GPUs the constants describe (8 for the seeds' TP=8 units counted as one GPU); default 1.
        physical_gpus_per_replica=int(d.get("physical_gpus_per_replica", 1)),
        # a profile's power block is required (catalog_file's _RawProfilePower), so it gives a curve
        power=cast(PowerCurve, _power(d["power"], power_q)),
        latency_quality=latency_q,
        source=str(d.get("source", "")) if source is None else source,
        note=str(d.get("unit_note", "")),
    )


def catalog_documents() -> dict[str, dict]:
    """The catalogue's YAML files as parsed, by kind (:data:`CATALOG_FILES`): a fresh copy on every call.

    For what the records leave out (provenance, quality notes, Hugging Face ids, peer figures): ``fleetopt
    catalog list`` shows them.
    """
    root = data_dir() / "catalog"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster start-up
    return {kind: yaml.load((root / f).read_text(), Loader=loader) for kind, f in CATALOG_FILES.items()}


@lru_cache(maxsize=1)
def bundled_catalog() -> Catalog:
    """Read the shipped catalogue once per process."""
    docs = catalog_documents()
    hw, md, pr = docs["hardware"], docs["models"], docs["profiles"]
    dd = hw["defaults"]
    reserves = dd["memory_reserves"]
    defaults = RooflineDefaults(
        bandwidth_efficiency=float(dd["bandwidth_efficiency"]),
        per_layer_latency_s=float(dd["per_layer_constant_latency_s"]),
        gpu_memory_utilization=float(reserves["gpu_memory_utilization"]),
        nccl_bytes_by_tp=tuple(sorted((int(k), int(v)) for k, v in reserves["nccl_bytes_by_tp"].items())),
        tdp_idle_fraction=float(dd["tdp_fraction_power_rule"]["idle_fraction_of_tdp"]),
        tdp_nominal_fraction=float(dd["tdp_fraction_power_rule"]["nominal_fraction_of_tdp"]),
        p2p_latency_s=float(dd["p2p_latency_s"]),
        activation_bytes=float(dd["tensor_parallel"]["activation_bytes"]),
        moe_dispatch_s_per_layer=float(dd["moe_dispatch_s_per_layer"]),
    )
    moe = pr["moe_layer_latency"]
    tables = {}
    for key, by_dtype in moe["tables"].items():
        k = tuple(int(x) for x in key.split("/"))
        tables[k] = {float(dt): tuple((float(t), float(ms)) for t, ms in pts) for dt, pts in by_dtype.items()}
    return Catalog(
        hardware={n: _hardware(n, d) for n, d in hw["gpus"].items()},
        models={n: _model(n, d) for n, d in md["models"].items()},
        profiles={n: _profile(n, d) for n, d in pr["profiles"].items()},
        defaults=defaults,
        moe_layer_tables=tables,
        moe_reference_bandwidth_bytes_per_s=float(moe["reference_bandwidth_bytes_per_s"]),
        moe_bandwidth_exponent=float(moe["bandwidth_scaling_exponent"]),
        moe_decode_reference_tokens=int(moe["decode_reference_tokens"]),
    )


# --------------------------------------------------------------------------------------------
# User catalogue files (format: fleetopt.optimizer.io.catalog_file)
# --------------------------------------------------------------------------------------------

_CATALOG_FILES: ContextVar[tuple[str, ...]] = ContextVar("fleetopt_catalog_files", default=())
"""The user catalogue files in effect (``--catalog FILE``), as given."""

_KIND_WORD = {"hardware": "hardware", "models": "model", "profiles": "profile"}


@contextmanager
def catalog_files(paths: Sequence[str | Path]) -> Iterator[None]:
    """Within the block, :func:`load_catalog` and every instance loaded include the user catalogue files
    ``paths`` (after those already in effect), in order: what ``--catalog FILE`` does for one command.

    Examples
    --------
    >>> with catalog_files([]):
    ...     load_catalog() is bundled_catalog()
    True
    """
    token = _CATALOG_FILES.set(_CATALOG_FILES.get() + tuple(str(p) for p in paths))
    try:
        yield
    finally:
        _CATALOG_FILES.reset(token)


def active_catalog_files() -> tuple[str, ...]:
    """The user catalogue files in effect (:func:`catalog_files`), as given."""
    return _CATALOG_FILES.get()


def load_catalog() -> Catalog:
    """The catalogue in effect: the shipped one (:func:`bundled_catalog`), extended by the user catalogue files of
    an active :func:`catalog_files` block.

    Raises
    ------
    InstanceError
        One line per problem of a user catalogue file in effect (``FILE: catalog.SECTION[i].FIELD: ...``).
    """
    catalog, lines = user_catalog(_CATALOG_FILES.get())
    if lines:
        raise InstanceError(list(lines))
    return catalog


def user_catalog(files: Sequence[str | Path]) -> tuple[Catalog, tuple[str, ...]]:
    """The shipped catalogue extended by ``files`` in order, and one line per problem (the catalogue is only
    meaningful when there is none)."""
    if not files:
        return bundled_catalog(), ()
    return _with_files(_file_keys(tuple(str(f) for f in files)))


def _file_keys(files: Sequence[str]) -> tuple:
    """``(as given, absolute path, (mtime, size))`` per file: a file edited between two loads is read again."""
    keys = []
    for given in files:
        path = Path(given).expanduser().absolute()
        try:
            stat = path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            stamp = None
        keys.append((given, str(path), stamp))
    return tuple(keys)


@lru_cache(maxsize=16)
def _with_files(keys: tuple) -> tuple[Catalog, tuple[str, ...]]:
    from fleetopt.optimizer.io.catalog_file import CatalogLines, read_catalog_file

    lines = CatalogLines()
    entries = [e for given, path, _ in keys for e in read_catalog_file(path, lines, label=given)]
    catalog = extend_catalog(bundled_catalog(), entries, lines)
    return catalog, tuple(lines.lines)


def _names(name: str, record) -> set[str]:
    """The lower-case names ``find`` matches for an entry: its name and its aliases."""
    return {name.lower()} | {a.lower() for a in getattr(record, "aliases", ())}


def _spec_document(spec: ModelSpec) -> dict:
    """A model built from a config.json as a ``models.yaml`` entry (the fields ``catalog list`` shows)."""
    doc = {"family": spec.family, "attention": spec.attention, "layers": spec.layers,
           "hidden_size": spec.hidden_size, "params_computed": spec.params,
           "active_params_computed": spec.active_params,
           "kv_bytes_per_token_fp16": spec.kv_bytes_per_token_fp16,
           "max_position_embeddings": spec.max_position_embeddings}
    if spec.moe is not None:
        doc["moe"] = {"routed_experts": spec.moe.routed_experts, "experts_per_token": spec.moe.experts_per_token}
    return doc


def _n_slots_problems(entry: CatalogEntry, profile: CalibratedProfile, lines: CatalogLines) -> bool:
    """Whether the entry's optional ``n_slots_at`` disagrees with its constants (each disagreement reported)."""
    bad = False
    for ctx_tokens, expected in dict(entry.data.get("n_slots_at", {})).items():
        got = int(profile.n_slots(ctx_tokens))
        if got != expected:
            lines.add(entry.file, f"{entry.field}.n_slots_at", f"{expected} sequences at {ctx_tokens} tokens, but "
                      f"max_slots, calibration_ctx, total_kv_blks and blk_size give {got}; correct it or remove it")
            bad = True
    return bad


def _user_record(entry: CatalogEntry, lines: CatalogLines):
    """The record of a checked entry (with its provenance), or None after reporting why it cannot be built."""
    d, note = dict(entry.data), f"user catalogue {entry.file}: {entry.provenance}"
    try:
        if entry.kind == "hardware":
            return _hardware(entry.name, {**d, "spec_source": d.get("spec_source", "user")})
        if entry.kind == "profiles":
            profile = _profile(entry.name, d, d.get("model"), f"{entry.provenance} (user catalogue {entry.file})")
            return None if _n_slots_problems(entry, profile, lines) else profile
        if entry.config is None:
            return replace(_model(entry.name, d), notes=(note,))
    except ValueError as err:
        lines.add(entry.file, entry.field, f"{err}")
        return None
    from fleetopt.optimizer.io.hf_config import model_config_problems   # only a user entry with a config file

    spec, problems = model_config_problems(entry.config, entry.name)
    for line in problems:
        lines.add(entry.file, f"{entry.field}.config", f"{entry.config_given!r} (resolved to {entry.config}): {line}")
    return None if spec is None else replace(spec, notes=(*spec.notes, note))


def _user_row(entry: CatalogEntry, record) -> dict:
    """The entry's ``catalog list`` row, its source marked as user-supplied."""
    if entry.kind == "hardware":
        row = _hardware_row(entry.name, dict(entry.data))
    elif entry.kind == "models":
        row = _model_row(entry.name, dict(entry.data) if entry.config is None else _spec_document(record))
    else:
        row = _profile_row(entry.name, dict(entry.data), record)
    return {**row, "source": f"user-supplied ({entry.file}): {entry.provenance}", "supplied_by": "user",
            "file": entry.file}


def extend_catalog(base: Catalog, entries: Sequence[CatalogEntry], lines: CatalogLines) -> Catalog:
    """``base`` with ``entries`` added in order.

    A name or alias already present (case-insensitive, as :meth:`Catalog.find` matches) is an error on
    ``catalog.KIND[i].name`` (or ``.aliases``) unless the entry says ``replace: true``, which removes the entry it
    collides with; ``replace: true`` with nothing to replace is an error too. An entry with a problem is left out
    and each problem added to ``lines``.
    """
    tables = {kind: dict(getattr(base, kind)) for kind in CATALOG_KINDS}
    added = list(base.user_entries)
    for entry in entries:
        record = _user_record(entry, lines)
        if record is None:
            continue
        table, word, new = tables[entry.kind], _KIND_WORD[entry.kind], _names(entry.name, record)
        hits = [name for name, other in table.items() if _names(name, other) & new]
        if hits and not entry.replace:
            name = hits[0]
            shared = sorted(_names(name, table[name]) & new)[0]
            where = next((f"from {u.file}" for u in added if (u.kind, u.name) == (entry.kind, name)),
                         f"shipped in data/catalog/{CATALOG_FILES[entry.kind]}")
            key = "name" if entry.name.lower() in _names(name, table[name]) else "aliases"
            lines.add(entry.file, f"{entry.field}.{key}", f"{shared!r} is already in the catalogue: {word} {name!r} "
                      f"({where}); choose another name, or add replace: true to this entry to replace that one")
            continue
        if entry.replace and not hits:
            lines.add(entry.file, f"{entry.field}.replace", f"true, but the catalogue has no {word} named "
                      f"{entry.name!r} (nor any of its aliases) to replace; remove replace or correct the name")
            continue
        for name in hits:
            del table[name]
        added = [u for u in added if not (u.kind == entry.kind and u.name in hits)]
        table[entry.name] = record
        added.append(UserEntry(entry.kind, entry.name, entry.file, entry.provenance, _user_row(entry, record)))
    return replace(base, hardware=tables["hardware"], models=tables["models"], profiles=tables["profiles"],
                   user_entries=tuple(added))


def _section_entries(section: Any, problems, lines: CatalogLines) -> list[CatalogEntry] | None:
    """The entries of an instance's ``catalog:`` value (an inline mapping, a path or a list of paths, relative to
    the instance file), or None after reporting a value of another kind."""
    from fleetopt.optimizer.io.catalog_file import catalog_entries, read_catalog_file

    instance_file = problems.path
    base = Path(instance_file).parent if instance_file not in (None, "") else Path.cwd()
    if isinstance(section, dict):
        return catalog_entries(section, instance_file, base, lines)
    given = [section] if isinstance(section, str) else section if isinstance(section, list) else None
    if given is None:
        problems.add("catalog", f"expected a catalogue (a mapping of hardware, models, profiles), the path of a "
                                f"catalogue file or a list of paths; got {show_value(section)}")
        return None
    entries = []
    for k, text in enumerate(given):
        if not isinstance(text, str) or not text.strip():
            problems.add(f"catalog[{k}]" if isinstance(section, list) else "catalog",
                         f"expected the path of a catalogue file; got {show_value(text)}")
            continue
        path = Path(text).expanduser()
        entries += read_catalog_file(path if path.is_absolute() else base / path, lines)
    return entries


def instance_catalog(section: Any, problems) -> Catalog | None:
    """The catalogue an instance's names resolve in: :func:`load_catalog`'s (the shipped catalogue and the files of
    an active :func:`catalog_files` block) extended by the instance's own ``catalog:`` value ``section`` (None:
    none).

    ``problems`` (a :class:`~fleetopt.optimizer.io.schema.Problems` of the instance file) receives one line per
    problem, each naming its own file: the instance for an inline section, the catalogue file otherwise. None
    when there is any.
    """
    catalog, file_lines = user_catalog(_CATALOG_FILES.get())
    problems.lines.extend(file_lines)
    if section is None or section == []:
        return None if file_lines else catalog
    from fleetopt.optimizer.io.catalog_file import CatalogLines

    lines = CatalogLines()
    before = len(problems.lines)
    entries = _section_entries(section, problems, lines)
    if entries is not None:
        catalog = extend_catalog(catalog, entries, lines)
    problems.lines.extend(lines.lines)
    return None if (file_lines or len(problems.lines) > before) else catalog


CATALOG_KINDS = ("hardware", "models", "profiles")
"""What ``fleetopt catalog list`` lists."""

CATALOG_UNITS = {
    "hardware": {"memory_bytes": "bytes (vendor GB read as GiB)", "memory_bandwidth_bytes_per_s": "bytes/s (peak)",
                 "fp16_dense_tflops": "1e12 FLOP/s, dense", "fp8_dense_tflops": "1e12 FLOP/s, dense",
                 "tdp_w": "W", "usd_per_gpu_hour": "US$ per GPU-hour"},
    "models": {"params_computed": "parameters (counted from the architecture)",
               "active_params_computed": "parameters per token", "params_model_card_b": "1e9 parameters (model card)",
               "kv_bytes_per_token_fp16": "bytes per token, whole model, 16-bit",
               "max_position_embeddings": "tokens"},
    "profiles": {"W_s": "s per iteration", "H_s": "s per iteration at calibration_ctx_tokens (per sequence)",
                 "calibration_ctx_tokens": "tokens", "max_slots": "sequences at calibration_ctx_tokens",
                 "total_kv_blocks": "blocks of blk_size_tokens", "cost_usd_per_hr": "US$ per unit-hour"},
}
"""Units of the listed numbers, by kind."""


def _hardware_row(name: str, d: dict) -> dict:
    power = d.get("power_model") or {}
    price = d.get("price") or {}
    return {"name": name, "aliases": list(d.get("aliases", ())),
            "memory_bytes": int(d["memory"]["capacity_bytes"]),
            "memory_bandwidth_bytes_per_s": float(d["memory_bandwidth_bytes_per_s"]),
            "fp16_dense_tflops": float(d["fp16_dense_tflops"]),
            "fp8_dense_tflops": None if d.get("fp8_dense_tflops") is None else float(d["fp8_dense_tflops"]),
            "tdp_w": float(d["tdp_w"]), "usd_per_gpu_hour": float(price["usd_per_gpu_hour"]),
            "power_quality": str(power.get("quality", "none")) if power else "none",
            "source": str(d.get("spec_source", "public")), "price_source": str(price.get("price_source", ""))}


def _model_row(name: str, d: dict) -> dict:
    moe = d.get("moe") or {}
    return {"name": name, "hf_id": d.get("hf_id"), "family": d["family"], "attention": str(d.get("attention", "GQA")),
            "layers": int(d["layers"]), "hidden_size": int(d["hidden_size"]),
            "routed_experts": moe.get("routed_experts"), "experts_per_token": moe.get("experts_per_token"),
            "params_computed": int(d["params_computed"]), "active_params_computed": int(d["active_params_computed"]),
            "params_model_card_b": d.get("params_model_card_b"),
            "kv_bytes_per_token_fp16": int(d["kv_bytes_per_token_fp16"]),
            "max_position_embeddings": int(d["max_position_embeddings"]),
            "source": "public config.json and technical reports; parameters counted by us (models.yaml)"}


def _profile_row(name: str, d: dict, record: CalibratedProfile) -> dict:
    quality = d.get("quality", {})
    return {"name": name, "model": record.model_name, "W_s": record.W_s, "H_s": record.H_s,
            "calibration_ctx_tokens": record.calibration_ctx_tokens, "max_slots": record.max_slots,
            "total_kv_blocks": record.total_kv_blocks, "cost_usd_per_hr": record.cost_usd_per_hr,
            "latency_quality": str(quality.get("latency", "")), "power_quality": str(quality.get("power", "")),
            "source": record.source, "note": record.note}


def catalog_listing(kinds: tuple[str, ...] = CATALOG_KINDS) -> dict:
    """What the catalogue in effect holds (:func:`load_catalog`), by kind, with provenance (``source``, quality
    labels) and :data:`CATALOG_UNITS`.

    Numbers are the catalogue files' own (``data/catalog/*.yaml``); profiles as loaded (per-GPU-equivalent
    price for the projected B200). Each row says whether it is ``supplied_by`` the package (``bundled``) or a
    user catalogue file (``user``; its ``source`` reads ``user-supplied (FILE): PROVENANCE``), and its ``file``;
    ``user_files`` lists the files in effect (only when there are any). A shipped entry a user file replaced is
    not listed.

    Raises
    ------
    InstanceError
        One line per problem of a user catalogue file in effect.
    """
    unknown = [k for k in kinds if k not in CATALOG_KINDS]
    if unknown:
        raise ValueError(f"unknown catalogue kind {unknown[0]!r}; known: {', '.join(CATALOG_KINDS)}")
    docs, catalog = catalog_documents(), load_catalog()
    out = {"files": {k: f"data/catalog/{CATALOG_FILES[k]}" for k in kinds},
           "units": {k: CATALOG_UNITS[k] for k in kinds}}
    if active_catalog_files():
        out["user_files"] = list(active_catalog_files())
    bundled = {"hardware": _hardware_row, "models": _model_row,
               "profiles": lambda n, d: _profile_row(n, d, catalog.profiles[n])}
    section = {"hardware": docs["hardware"]["gpus"], "models": docs["models"]["models"],
               "profiles": docs["profiles"]["profiles"]}
    users = {(u.kind, u.name) for u in catalog.user_entries}
    for kind in kinds:
        table = getattr(catalog, kind)
        out[kind] = [{**bundled[kind](n, d), "supplied_by": "bundled", "file": f"data/catalog/{CATALOG_FILES[kind]}"}
                     for n, d in section[kind].items() if n in table and (kind, n) not in users]
        out[kind] += [dict(u.row) for u in catalog.user_entries if u.kind == kind]
    return out
