"""Catalogue records: GPU hardware and LLM architectures.

These are plain frozen records; the package's data files are read into them by
:mod:`fleetopt.optimizer.io.catalog`. Units are in the field names (bytes, bytes/s, TFLOPS
as 1e12 FLOP/s dense, watts, US$ per hour).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fleetopt.models.power import PowerCurve

__all__ = ["HardwareSpec", "ModelSpec", "MoESpec", "RooflineDefaults", "ROOFLINE_CONVENTIONS",
           "SEEDS_BANDWIDTH_EFFICIENCY"]


ROOFLINE_CONVENTIONS = ("physical", "seeds")
"""How :func:`fleetopt.models.roofline.computed_profile` turns the constants into a profile (see
:class:`RooflineDefaults`)."""

SEEDS_BANDWIDTH_EFFICIENCY = 0.80
"""Sustained fraction of peak memory bandwidth in the seeds' convention: the reference tool's
(vllm-sr-sim ``hardware/spec.py``) constant, with which the 1/W-law paper computed its Tables 2 and 5."""


@dataclass(frozen=True)
class RooflineDefaults:
    """Global roofline constants (``data/catalog/hardware.yaml``, block ``defaults``).

    Attributes
    ----------
    bandwidth_efficiency : float
        :math:`\\eta_{bw}`, sustained fraction of peak memory bandwidth for weight streaming and the KV
        scan. Default 0.75: on the measured H100-SXM Llama-3.1-8B decode grid
        (``data/measurements/h100_llama31_8b_decode.csv``) weight streaming alone reaches 0.70 of
        3.35 TB/s (15.0 GB in 6.43 ms) and the KV scan 0.87 (131,072 B per token in 4.5e-8 s); 0.75 keeps
        every one of the 51 decode times within -10 % / +16 %.
    flop_efficiency : float
        :math:`\\eta_{flop}`, sustained fraction of the dense tensor FLOP/s of the weight matmuls (decode
        per-sequence term and prefill per-token term). Default 0.60: the same measurement's per-sequence
        decode slope (2.5e-5 s for 2 x 7.50e9 FLOP: 0.61) and prefill slope (26.5 us per token: 0.53-0.57).
    attention_flop_efficiency : float
        :math:`\\eta_{attn}`, the same for causal prefill attention. Default 0.35: FlashAttention-2 reaches
        about 35 % of H100 peak (Shah et al. 2024, FlashAttention-3, arXiv:2407.08608, abstract), and the
        measured quadratic prefill slope (7.4e-10 s per token squared) gives 0.36.
    per_layer_latency_s : float
        Constant cost per transformer layer per iteration (vllm-sr-sim: 3 us).
    gpu_memory_utilization : float
        Fraction of capacity for weights + KV (vLLM's default 0.90).
    nccl_bytes_by_tp : tuple of (tp, bytes)
        NCCL workspace per GPU (vllm-sr-sim).
    tdp_idle_fraction, tdp_nominal_fraction : float
        The 1/W-law paper's TDP-fraction power rule (0.43, 0.86; section 2.1): the fallback curve of
        the seeds' convention and :func:`fleetopt.models.roofline.activity_power_per_gpu_w`.
    streaming_power_fraction : float
        :math:`f_{s}`, fraction of the board power limit a GPU draws while an iteration only streams
        weights (the floor of the busy-power rule, :func:`fleetopt.models.roofline.busy_power_per_gpu_w`).
        Default 0.60: 429 W and 418 W at batch 1 and 2 (context 2,048) on a 700 W H100
        (``h100_llama31_8b_decode.csv``).
    idle_power_fraction : float
        Fraction of the board power limit a GPU draws with no iteration running (an empty replica).
        Default 0.10: 67.8 W on the 700 W H100 (``data/measurements/h100_llama31_8b_meta.json``).
    p2p_latency_s : float
        :math:`\\alpha`, the fixed latency of one collective call between GPUs of a node (the catalogue's
        ``p2p_latency_s``, 10 us: vllm-sr-sim's GPU-to-GPU base latency). Each tensor-parallel all-reduce pays it
        once (:func:`fleetopt.models.roofline.tp_allreduce_latency_s`), under the physical convention only.
    activation_bytes : float
        Bytes per activation element a tensor-parallel all-reduce moves (2: vLLM reduces in the model's 16-bit
        activation dtype, also under fp8 or int4 weights).
    moe_dispatch_s_per_layer : float
        Fixed cost per MoE layer per iteration of routing a batch's tokens to their experts and back (one
        dispatch and one combine: two all-to-all-like exchanges, GShard's pattern), added to ``W`` of a
        mixture-of-experts model under the physical convention
        (:func:`fleetopt.models.roofline.moe_dispatch_s`). Default 20 us = 2 x ``p2p_latency_s``: each
        exchange costs at least one GPU-to-GPU latency; ``docs/profiles.md`` shows its effect.
    convention : {"physical", "seeds"}
        ``physical`` (default): the iteration model with the compute terms ``g_s``, ``prefill_a_s``,
        ``prefill_b_s``, no compute cap on concurrency, the busy-power rule. ``seeds``: the reference
        tool's recipe the paper's Tables 2 and 5 were computed with: no compute terms, the ridge-batch
        cap, the catalogue's power curves (:meth:`seeds_convention`).
    """

    bandwidth_efficiency: float = 0.75
    flop_efficiency: float = 0.60
    attention_flop_efficiency: float = 0.35
    per_layer_latency_s: float = 3.0e-6
    gpu_memory_utilization: float = 0.90
    nccl_bytes_by_tp: tuple[tuple[int, int], ...] = ((1, 0), (2, 358612992), (4, 411041792), (8, 411041792))
    tdp_idle_fraction: float = 0.43
    tdp_nominal_fraction: float = 0.86
    streaming_power_fraction: float = 0.60
    idle_power_fraction: float = 0.10
    convention: str = "physical"
    p2p_latency_s: float = 10.0e-6
    activation_bytes: float = 2.0
    moe_dispatch_s_per_layer: float = 20.0e-6

    def __post_init__(self) -> None:
        problems = [f"{name} must be in (0, 1]; got {getattr(self, name)!r}"
                    for name in ("bandwidth_efficiency", "flop_efficiency", "attention_flop_efficiency",
                                 "gpu_memory_utilization", "streaming_power_fraction", "idle_power_fraction")
                    if not 0.0 < getattr(self, name) <= 1.0]
        problems += [f"{name} must be >= 0 and finite; got {getattr(self, name)!r}"
                     for name in ("p2p_latency_s", "moe_dispatch_s_per_layer")
                     if not 0.0 <= getattr(self, name) < float("inf")]
        if not self.activation_bytes > 0:
            problems.append(f"activation_bytes must be > 0; got {self.activation_bytes!r}")
        if self.convention not in ROOFLINE_CONVENTIONS:
            problems.append(f"convention must be one of {ROOFLINE_CONVENTIONS}; got {self.convention!r}")
        if problems:
            raise ValueError("roofline defaults: " + "; ".join(problems))

    def seeds_convention(self) -> RooflineDefaults:
        """These constants under the seeds' convention (bandwidth efficiency 0.80, no compute terms).

        The 1/W-law paper's Tables 2 and 5 reproduce only this way: its roofline is
        :math:`t = W + H n` with :math:`\\eta_{bw}` = :data:`SEEDS_BANDWIDTH_EFFICIENCY`, a ridge-batch
        concurrency cap and, for power, the catalogue curves (or its activity rule).
        """
        return replace(self, bandwidth_efficiency=SEEDS_BANDWIDTH_EFFICIENCY, convention="seeds")

    def nccl_bytes(self, tp: int) -> int:
        """NCCL workspace per GPU at tensor-parallel degree ``tp`` (TP=8 value beyond the table)."""
        table = dict(self.nccl_bytes_by_tp)
        if tp in table:
            return table[tp]
        return table[max(table)]


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU type.

    The link bandwidths are per direction, per GPU, in bytes/s, None where the catalogue gives none:
    ``nvlink_bandwidth_bytes_per_s`` between GPUs of one node (NVLink/NVSwitch), ``pcie_bandwidth_bytes_per_s``
    its host link (the intra-node path of a card without NVLink), ``inter_node_bandwidth_bytes_per_s`` between
    nodes. :func:`fleetopt.models.roofline.tp_link_bandwidth_bytes_per_s` picks the tensor-parallel link.
    """

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
    nvlink_bandwidth_bytes_per_s: float | None = None
    inter_node_bandwidth_bytes_per_s: float | None = None
    pcie_bandwidth_bytes_per_s: float | None = None


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
    tied_embeddings: bool = False
    """Whether the LM head is the input-embedding table (``config.json`` ``tie_word_embeddings``)."""

    @property
    def is_moe(self) -> bool:
        return self.moe is not None
