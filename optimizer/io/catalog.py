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

__all__ = ["Catalog", "data_dir", "load_catalog", "BUILTIN_WORKLOADS"]

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


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    """Read the shipped catalogue once per process."""
    root = data_dir() / "catalog"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster start-up
    hw, md, pr = (yaml.load((root / f).read_text(), Loader=loader)
                  for f in ("hardware.yaml", "models.yaml", "calibrated_profiles.yaml"))
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
