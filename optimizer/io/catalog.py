"""Load the shipped catalogue (GPUs, LLMs, calibrated profiles) into model records.

The data files live in the repository's ``data/`` folder, which installs as
``fleetopt/data`` beside ``fleetopt/optimizer``: the same relative path in a
checkout and in a wheel, so :func:`data_dir` needs no search and the package
never reads anything outside itself at run time.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from fleetopt.models.hardware import HardwareSpec, ModelSpec, MoESpec, RooflineDefaults
from fleetopt.models.power import PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.roofline import MoELatencyTable

__all__ = ["Catalog", "data_dir", "load_catalog", "catalog_documents", "catalog_listing", "CATALOG_FILES",
           "CATALOG_KINDS", "CATALOG_UNITS", "BUILTIN_WORKLOADS"]

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

    @property
    def moe_latency_table(self) -> MoELatencyTable:
        """The MoE per-layer latency table as a record for :func:`fleetopt.models.roofline.computed_profile`."""
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
    )


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


def _profile(name: str, d: dict) -> CalibratedProfile:
    quality = d.get("quality", {})
    latency_q = "projected" if "projected" in str(quality.get("latency", "")) else "calibrated"
    power_q = str(quality.get("power", "projected")).split()[0]
    per_gpu = d.get("cost_per_hr_per_gpu_equivalent")
    return CalibratedProfile(
        name=name,
        model_name=_PROFILE_MODELS.get(name, "unspecified"),
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
        power=_power(d["power"], power_q),
        latency_quality=latency_q,
        source=str(d.get("source", "")),
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
def load_catalog() -> Catalog:
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
    """What the catalogue holds, by kind, with provenance (``source``, quality labels) and :data:`CATALOG_UNITS`.

    Numbers are the catalogue files' own (``data/catalog/*.yaml``); profiles as loaded (per-GPU-equivalent
    price for the projected B200).
    """
    unknown = [k for k in kinds if k not in CATALOG_KINDS]
    if unknown:
        raise ValueError(f"unknown catalogue kind {unknown[0]!r}; known: {', '.join(CATALOG_KINDS)}")
    docs, catalog = catalog_documents(), load_catalog()
    out = {"files": {k: f"data/catalog/{CATALOG_FILES[k]}" for k in kinds},
           "units": {k: CATALOG_UNITS[k] for k in kinds}}
    if "hardware" in kinds:
        out["hardware"] = [_hardware_row(n, d) for n, d in docs["hardware"]["gpus"].items()]
    if "models" in kinds:
        out["models"] = [_model_row(n, d) for n, d in docs["models"]["models"].items()]
    if "profiles" in kinds:
        out["profiles"] = [_profile_row(n, d, catalog.profiles[n]) for n, d in docs["profiles"]["profiles"].items()]
    return out
