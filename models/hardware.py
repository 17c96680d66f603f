"""Catalogue records: GPU hardware and LLM architectures.

These are plain frozen records; the package's data files are read into them by
:mod:`fleetopt.optimizer.io.catalog`. Units are in the field names (bytes, bytes/s, TFLOPS
as 1e12 FLOP/s dense, watts, US$ per hour).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetopt.models.power import PowerCurve

__all__ = ["HardwareSpec", "ModelSpec", "MoESpec", "RooflineDefaults"]


@dataclass(frozen=True)
class RooflineDefaults:
    """Global roofline constants (hardware.yaml ``defaults``)."""

    bandwidth_efficiency: float = 0.80
    per_layer_latency_s: float = 3.0e-6
    gpu_memory_utilization: float = 0.90
    nccl_bytes_by_tp: tuple[tuple[int, int], ...] = ((1, 0), (2, 358612992), (4, 411041792), (8, 411041792))
    tdp_idle_fraction: float = 0.43
    tdp_nominal_fraction: float = 0.86

    def nccl_bytes(self, tp: int) -> int:
        """NCCL workspace per GPU at tensor-parallel degree ``tp`` (TP=8 value beyond the table)."""
        table = dict(self.nccl_bytes_by_tp)
        if tp in table:
            return table[tp]
        return table[max(table)]


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU type."""

    name: str
    aliases: tuple[str, ...]
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    fp16_dense_tflops: float
    fp8_dense_tflops: float | None
    tdp_w: float
    usd_per_gpu_hour: float
    power: PowerCurve | None
    """Per-GPU logistic curve, or None where no source gives one."""
    spec_source: str = "public"


@dataclass(frozen=True)
class MoESpec:
    routed_experts: int
    experts_per_token: int
    shared_experts: int
    expert_intermediate_size: int


@dataclass(frozen=True)
class ModelSpec:
    """One LLM architecture (official config.json figures)."""

    name: str
    family: str  # dense | moe
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    params: int
    active_params: int
    kv_bytes_per_token_fp16: int
    """KV-cache bytes per token for the whole model at 16-bit."""
    moe: MoESpec | None = None
    attention: str = "GQA"
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_moe(self) -> bool:
        return self.moe is not None
