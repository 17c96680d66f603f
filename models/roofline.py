"""Computed serving profiles: one replica of a model on ``tp`` GPUs, from first principles.

A :class:`ComputedProfile` is built by :func:`computed_profile` from a GPU
(:class:`~fleetopt.models.hardware.HardwareSpec`), an LLM (:class:`~fleetopt.models.hardware.ModelSpec`)
and a serving configuration (tensor-parallel degree, dtype, KV layout, ...). It
satisfies :class:`fleetopt.models.profiles.ServingProfile`, so everything that takes a
calibrated profile takes a computed one.

An iteration with decode sequences at contexts :math:`x_s` and prefill chunks of
:math:`c_j` tokens at prefix :math:`p_j` takes

.. math::

    t = W + h \\left(\\sum_s x_s + \\sum_j p_j\\right) + g \\, n_{dec}
        + \\sum_j \\left[a \\, c_j + b \\left((p_j + c_j)^2 - p_j^2\\right)\\right],
    \\qquad h = H / B_{cal}

with, per GPU of the ``tp``,

.. math::

    W = \\frac{P_s \\, b_w}{tp \\, \\beta \\eta_{bw}} + \\ell c, \\quad
    H = \\frac{B_{cal} \\, k_{scan}}{\\beta \\eta_{bw}}, \\quad
    g = \\frac{2 P_{mm}}{tp \\, F \\eta_{flop}}, \\quad
    a = \\frac{2 P_{mm}^{pf}}{tp \\, F \\eta_{flop}}, \\quad
    b = \\frac{2 \\ell h_q d}{tp \\, F_{16} \\eta_{attn}}

:math:`P_s` the weights streamed per decode iteration, :math:`P_{mm}` (:math:`P_{mm}^{pf}`) the
weights a decode (prefill) token is multiplied through (:func:`matmul_params`), :math:`b_w` bytes per
weight, :math:`\\beta` peak memory bandwidth, :math:`F` dense tensor FLOP/s at the dtype
(:func:`peak_flops_per_s`), :math:`F_{16}` at 16 bit, :math:`\\eta_{bw}, \\eta_{flop}, \\eta_{attn}` the
sustained fractions (:class:`~fleetopt.models.hardware.RooflineDefaults`), :math:`\\ell` layers,
:math:`c` a per-layer constant, :math:`B_{cal}` the calibration context, :math:`k_{scan}` the KV bytes
per token one GPU scans, :math:`h_q` query heads of dimension :math:`d`. A decode step of :math:`n`
sequences at context :math:`L` is :math:`W + h n L + g n`; a :math:`P`-token prompt alone in one
chunk is :math:`W + a P + b P^2`. Concurrency is limited by the KV cache left after the weights and
by ``max_num_seqs``, never by a compute ridge: :math:`n / t` grows with :math:`n` at every context.

Under the ``physical`` convention a replica of ``tp`` > 1 GPUs also pays its tensor-parallel all-reduces
(:func:`tp_allreduce_s_per_token`, :func:`tp_allreduce_latency_s`): two per layer, each of the iteration's
tokens x hidden x activation bytes, by a ring over the node's link. Their per-token part joins :math:`g`
and :math:`a`, their per-call latency joins :math:`W`; a mixture-of-experts model adds its per-layer
dispatch overhead (:func:`moe_dispatch_s`) to :math:`W`. The queueing models and the simulator read only
:math:`W, h, g, a, b`, so they need nothing more.

Two conventions (``defaults.convention``): ``physical`` (above, the default; efficiencies checked
against ``data/measurements/``) and ``seeds``, the reference tool's recipe the 1/W-law paper's Tables 2
and 5 were computed with (:math:`\\eta_{bw}` = 0.80, :math:`g = a = b = 0`, the ridge-batch cap,
the catalogue's power curves, official parameter counts streamed). See ``docs/profiles.md``.

References
----------
.. [1] "The 1/W Law" seed paper, section 2.1, 3.2, 5.2, Tables 2 and 5, Appendix A.
.. [2] vllm-sr-sim (vllm-project/semantic-router, ``src/fleet-sim``): profile builder
   and computed profile, the source of the seeds' recipe's constants (Apache-2.0).
.. [3] T. Dao, "FlashAttention-2", arXiv:2307.08691 (2023); J. Shah et al., "FlashAttention-3",
   arXiv:2407.08608 (2024): causal attention FLOPs and the ~35 % H100 utilisation of FlashAttention-2.
.. [4] ``data/measurements/README.md``: Llama-3.1-8B bf16 on one H100-SXM, decode, prefill and power.
.. [5] M. Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
   Parallelism", arXiv:1909.08053 (2019), section 3: two all-reduces per transformer layer in the forward pass.
.. [6] P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
   J. Parallel Distrib. Comput. 69(2), 2009; NVIDIA nccl-tests ``doc/PERFORMANCE.md``: a ring all-reduce moves
   :math:`2 (n-1)/n` of the message over each GPU's link (NCCL's "bus bandwidth" factor).
.. [7] D. Lepikhin et al., "GShard", arXiv:2006.16668 (2020): a dispatch and a combine all-to-all per MoE layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload
from collections.abc import Mapping

import numpy as np

from fleetopt.models.hardware import HardwareSpec, ModelSpec, RooflineDefaults
from fleetopt.models.power import ActivityPower, PowerCurve

__all__ = [
    "ComputedProfile",
    "MoELatencyTable",
    "computed_profile",
    "weight_bytes_per_gpu",
    "kv_bytes_per_token_per_gpu",
    "kv_budget_bytes",
    "kv_capacity_tokens",
    "peak_flops_per_s",
    "matmul_params",
    "decode_compute_s_per_seq",
    "prefill_compute_s_per_token",
    "causal_attention_s_per_token_sq",
    "ridge_batch",
    "tp_link_bandwidth_bytes_per_s",
    "tp_allreduce_s_per_token",
    "tp_allreduce_latency_s",
    "moe_dispatch_s",
    "moe_table_key",
    "activity_power_per_gpu_w",
    "busy_power_per_gpu_w",
    "WEIGHT_BYTES_BY_DTYPE",
    "KV_BYTES_BY_DTYPE",
    "KV_LAYOUTS",
    "MOE_W_METHODS",
]

WEIGHT_BYTES_BY_DTYPE = {"fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int4": 0.5}
"""Bytes per weight for each supported weight dtype."""

KV_BYTES_BY_DTYPE = {"fp16": 2, "bf16": 2, "fp8": 1, "int4": 2}
"""Bytes per KV-cache element implied by the weight dtype.

fp8 serving stores an fp8 KV cache (the paper's DeepSeek-V3 fp8 row does); int4
is weight-only quantisation (W4A16: GPTQ/AWQ), whose KV cache stays 16-bit.
Override with ``kv_dtype``.
"""

KV_LAYOUTS = ("sharded", "replicated")
MOE_W_METHODS = ("active-params", "layer-table")

_BYTES_PER_GB = 1e9  # only for the human-readable note


@dataclass(frozen=True)
class ComputedProfile:
    """One replica (``tp`` GPUs) serving one model, with roofline constants.

    Satisfies :class:`fleetopt.models.profiles.ServingProfile`. Units are SI and in the
    field names; ``*_per_gpu`` fields describe one of the ``tp`` GPUs.

    .. math::

        n_{slots}(B) = \\min\\left(\\left\\lfloor \\frac{M_{kv}}
        {k_{cap} \\, b \\, \\lceil B / b \\rceil} \\right\\rfloor, \\; n_{cap}\\right)

    with :math:`M_{kv}` = ``kv_budget_bytes`` (per GPU; 0 slots when it is not
    positive), :math:`k_{cap}` = ``kv_bytes_per_token_per_gpu`` (the capacity
    figure of the chosen ``kv_layout``), :math:`b` = ``blk_size_tokens`` (only
    whole blocks are allocated) and :math:`n_{cap}` = ``concurrency_cap_seqs``
    (no cap when None).

    Attributes
    ----------
    name, model_name : str
        ``HARDWARE/MODEL/tpN/DTYPE`` (plus non-default options, ``moe-<method>`` for a MoE and
        ``seeds`` under the seeds' convention) and the model's name.
    W_s, H_s : float
        Iteration constants in seconds (see :mod:`fleetopt.models.roofline`).
    g_s, prefill_a_s, prefill_b_s : float
        Per decode sequence (s), per prompt token (s) and per prompt token squared (s); 0 under
        the seeds' convention.
    calibration_ctx_tokens, chunk_tokens, blk_size_tokens : int
        Context at which ``H_s`` is stated, prefill chunk and KV block size (tokens).
    cost_usd_per_hr : float
        Price of the whole replica: ``tp`` GPU-hours per hour.
    gpus_per_replica : int
        ``tp``.
    power : PowerCurve
        Power of the whole replica (``tp`` GPUs) versus sequences in flight: the busy-power rule at
        the calibration context (``physical``) or the catalogue curve (``seeds``).
    latency_quality : str
        ``"roofline"``.
    hardware_name, dtype, kv_dtype, kv_layout, moe_w : str
        The configuration the profile was built from (``moe_w`` is ``"dense"`` for a dense model).
    convention : str
        ``physical`` or ``seeds`` (:class:`~fleetopt.models.hardware.RooflineDefaults`).
    tp : int
        Tensor-parallel degree.
    bandwidth_efficiency, flop_efficiency, attention_flop_efficiency : float
        The sustained fractions the constants were computed with.
    weight_bytes_per_gpu : float
        Resident weight bytes on each GPU.
    weight_stream_s : float
        ``W_s`` without the per-layer constant (the memory-bound part of an iteration).
    kv_budget_bytes : int
        KV-cache bytes per GPU; negative when the weights do not fit (then 0 slots).
    kv_bytes_per_token_per_gpu : float
        KV bytes one token occupies in one GPU's budget under ``kv_layout``.
    kv_scan_bytes_per_token_per_gpu : float
        KV bytes one GPU reads per token per iteration (always TP-sharded; sets ``H_s``).
    concurrency_cap_seqs : int or None
        ``max_num_seqs`` when given; else None (``physical``: only the KV cache limits) or the
        ridge batch (``seeds``, :func:`ridge_batch`).
    peak_flops_per_s : float
        Dense tensor FLOP/s of one GPU at the compute dtype.
    flops_per_seq_per_gpu : float
        Weight FLOPs per decoded token per GPU, :math:`2 P_{mm} / tp` (``seeds``: :math:`2 P_a / tp`).
    tdp_w : float
        Board power of one GPU.
    tdp_idle_fraction, tdp_nominal_fraction : float
        TDP fractions of :func:`activity_power_per_gpu_w`.
    streaming_power_fraction : float
        Floor of :func:`busy_power_per_gpu_w` as a fraction of ``tdp_w``.
    activity_power : ActivityPower or None
        ``physical``: power of the replica for any iteration from its weight / KV-scan / compute
        times (:func:`busy_power_per_gpu_w`); None under ``seeds``.
    note : str
        Why the profile holds no sequence, when it does not; empty otherwise.
    tp_allreduce_s_per_token, tp_allreduce_latency_s : float
        The tensor-parallel all-reduce of one iteration: seconds per token in the iteration (included in
        ``g_s`` and ``prefill_a_s``) and its fixed latency (included in ``W_s``); 0 at ``tp`` = 1 and under
        ``seeds`` (:func:`tp_allreduce_s_per_token`, :func:`tp_allreduce_latency_s`).
    moe_dispatch_s : float
        A mixture-of-experts model's routing overhead per iteration (included in ``W_s``; 0 for a dense
        model and under ``seeds``; :func:`moe_dispatch_s`).
    link_bandwidth_bytes_per_s : float or None
        The link the all-reduce runs over (:func:`tp_link_bandwidth_bytes_per_s`); None at ``tp`` = 1.
    """

    name: str
    model_name: str
    W_s: float
    H_s: float
    calibration_ctx_tokens: int
    chunk_tokens: int
    blk_size_tokens: int
    cost_usd_per_hr: float
    gpus_per_replica: int
    power: PowerCurve
    latency_quality: str
    hardware_name: str
    tp: int
    dtype: str
    kv_dtype: str
    kv_layout: str
    moe_w: str
    weight_bytes_per_gpu: float
    weight_stream_s: float
    kv_budget_bytes: int
    kv_bytes_per_token_per_gpu: float
    kv_scan_bytes_per_token_per_gpu: float
    concurrency_cap_seqs: int | None
    peak_flops_per_s: float
    flops_per_seq_per_gpu: float
    tdp_w: float
    tdp_idle_fraction: float
    tdp_nominal_fraction: float
    note: str = ""
    g_s: float = 0.0
    prefill_a_s: float = 0.0
    prefill_b_s: float = 0.0
    convention: str = "physical"
    bandwidth_efficiency: float = 0.0
    flop_efficiency: float = 0.0
    attention_flop_efficiency: float = 0.0
    streaming_power_fraction: float = 0.0
    activity_power: ActivityPower | None = None
    """Power of the replica for any iteration from its time components (``physical``); None (``seeds``)."""
    tp_allreduce_s_per_token: float = 0.0
    tp_allreduce_latency_s: float = 0.0
    moe_dispatch_s: float = 0.0
    link_bandwidth_bytes_per_s: float | None = None

    @property
    def physical_gpus_per_replica(self) -> int:
        """Physical GPUs of one replica: its ``tp`` (a computed replica is priced and counted per GPU too)."""
        return self.tp

    @property
    def kv_block_bytes(self) -> int:
        """Bytes of one KV block of ``blk_size_tokens`` tokens on one GPU."""
        return int(math.ceil(self.kv_bytes_per_token_per_gpu * self.blk_size_tokens))

    @property
    def total_kv_blocks(self) -> int:
        """Whole KV blocks that fit in the budget (0 when the weights do not fit)."""
        return max(0, self.kv_budget_bytes) // self.kv_block_bytes

    def kv_slots(self, ctx_tokens):
        """Sequences of ``ctx_tokens`` whose KV blocks fit, ignoring the concurrency cap (array-aware)."""
        ctx = np.asarray(ctx_tokens, dtype=np.int64)
        if np.any(ctx < 1):
            raise ValueError("ctx_tokens must be >= 1")
        blocks_per_seq = -(-ctx // self.blk_size_tokens)
        out = self.total_kv_blocks // blocks_per_seq
        return out if out.ndim else int(out)

    @overload
    def n_slots(self, ctx_tokens: float) -> int: ...
    @overload
    def n_slots(self, ctx_tokens: np.ndarray) -> np.ndarray: ...
    def n_slots(self, ctx_tokens: float | np.ndarray) -> int | np.ndarray:
        """Sequences held at context window ``ctx_tokens``: KV limit, capped by ``concurrency_cap_seqs``
        (array-aware)."""
        out = np.asarray(self.kv_slots(ctx_tokens))
        if self.concurrency_cap_seqs is not None:
            out = np.minimum(out, self.concurrency_cap_seqs)
        return out if out.ndim else int(out)


@dataclass(frozen=True)
class MoELatencyTable:
    """Per-MoE-layer latency versus tokens in the batch, measured on a reference GPU.

    On a GPU of bandwidth :math:`\\beta` the latency of one layer at :math:`x`
    tokens is

    .. math:: \\tau(x) = \\tau_{ref}(x) \\left(\\frac{\\beta_{ref}}{\\beta}\\right)^{\\gamma}

    with :math:`\\tau_{ref}` interpolated piecewise linearly in tokens and clamped
    to the end points, :math:`\\gamma` < 1 standing for a kernel that is only
    partly memory-bound.

    Parameters
    ----------
    curves : tuple of (key, dtype_bytes, points)
        ``key`` is :func:`moe_table_key` (routed experts, experts per token, hidden
        size, expert FFN width); ``points`` are ``(tokens, latency_ms)`` pairs in
        increasing tokens.
    reference_bandwidth_bytes_per_s : float
        Peak memory bandwidth of the reference GPU (H100-SXM: 3.35e12).
    bandwidth_exponent : float
        :math:`\\gamma` (0.7 in the catalogue).
    decode_reference_tokens : int
        Tokens at which the table is read for a decode iteration (8).

    Examples
    --------
    >>> t = MoELatencyTable.from_mapping({(128, 8, 2048, 768): {2.0: ((1, 0.072), (8, 0.240))}}, 3.35e12, 0.7, 8)
    >>> round(t.layer_latency_s((128, 8, 2048, 768), 2.0, 8, 3.35e12) * 1e3, 3)
    0.24
    """

    curves: tuple[tuple[tuple[int, ...], float, tuple[tuple[float, float], ...]], ...]   # key: moe_table_key
    reference_bandwidth_bytes_per_s: float
    bandwidth_exponent: float
    decode_reference_tokens: int

    def __post_init__(self) -> None:
        for key, dtype_bytes, points in self.curves:
            tokens = [p[0] for p in points]
            if len(points) < 1 or tokens != sorted(tokens) or any(ms <= 0 for _, ms in points):
                raise ValueError(f"MoE latency table {key} at {dtype_bytes} B: points must be sorted "
                                 f"by tokens with positive latencies; got {points}")
        if self.reference_bandwidth_bytes_per_s <= 0 or self.decode_reference_tokens < 1:
            raise ValueError("MoE latency table: reference bandwidth must be > 0 and decode tokens >= 1")

    @classmethod
    def from_mapping(cls, tables: Mapping, reference_bandwidth_bytes_per_s: float,
                     bandwidth_exponent: float, decode_reference_tokens: int) -> MoELatencyTable:
        """Build from ``{key: {dtype_bytes: [(tokens, ms), ...]}}`` (the catalogue's layout)."""
        curves = tuple(
            (tuple(int(k) for k in key), float(dtype_bytes), tuple((float(t), float(ms)) for t, ms in points))
            for key, by_dtype in sorted(tables.items())
            for dtype_bytes, points in sorted(by_dtype.items())
        )
        return cls(curves, float(reference_bandwidth_bytes_per_s), float(bandwidth_exponent),
                   int(decode_reference_tokens))

    def layer_latency_s(self, key, dtype_bytes: float, tokens: float, bandwidth_bytes_per_s: float) -> float:
        """Latency in seconds of one MoE layer at ``tokens`` on a GPU of the given bandwidth.

        Raises ``ValueError`` naming the known configurations when ``(key, dtype_bytes)``
        is not tabulated (no silent fallback).
        """
        for k, d, points in self.curves:
            if k == tuple(key) and d == float(dtype_bytes):
                xs, ms = zip(*points)
                scale = (self.reference_bandwidth_bytes_per_s / bandwidth_bytes_per_s) ** self.bandwidth_exponent
                return float(np.interp(tokens, xs, ms)) * scale / 1000.0
        known = ", ".join(f"{'/'.join(map(str, k))}@{d}B" for k, d, _ in self.curves)
        raise ValueError(f"no MoE layer latency for expert config {'/'.join(map(str, key))} at "
                         f"{dtype_bytes} bytes per weight; known: {known}")


def moe_table_key(model: ModelSpec) -> tuple[int, int, int, int]:
    """Key of ``model`` in a :class:`MoELatencyTable`: (experts, experts/token, hidden, expert FFN)."""
    if model.moe is None:
        raise ValueError(f"model {model.name!r} is dense; it has no MoE latency-table key")
    m = model.moe
    return (m.routed_experts, m.experts_per_token, model.hidden_size, m.expert_intermediate_size)


def weight_bytes_per_gpu(model: ModelSpec, dtype: str, tp: int) -> float:
    """Resident weight bytes on each GPU, :math:`P \\, b_w / tp`.

    :math:`P` is ``model.params``, the official count (every matrix, embedding and
    untied LM head, norms). All experts of a MoE are resident.
    """
    return model.params * WEIGHT_BYTES_BY_DTYPE[dtype] / tp


def _kv_shards(model: ModelSpec, tp: int) -> int:
    """GPUs a token's KV is split over: min(tp, kv_heads) for GQA/MHA, 1 for MLA (latent replicated)."""
    return 1 if model.attention == "MLA" else min(tp, model.kv_heads)


def kv_bytes_per_token_per_gpu(model: ModelSpec, kv_dtype: str, tp: int, kv_layout: str = "sharded") -> float:
    """KV-cache bytes one token occupies on one GPU.

    .. math::

        k = \\frac{k_{16} \\, b_{kv} / 2}{s}, \\qquad
        s = \\begin{cases} \\min(tp, h_{kv}) & \\text{GQA/MHA, sharded} \\\\
                           1 & \\text{MLA, or layout replicated} \\end{cases}

    with :math:`k_{16}` = ``model.kv_bytes_per_token_fp16`` (whole model) and
    :math:`h_{kv}` the KV heads. Under ``sharded`` (what vLLM does) each rank
    holds its KV heads; with ``tp > kv_heads`` heads are replicated, so no GPU
    holds less than one head. An MLA latent is needed by every rank and is
    replicated. ``replicated`` charges every GPU the whole-model figure: the
    convention of the paper's Tables 2 and 5, kept to reproduce them.

    Examples
    --------
    >>> from fleetopt.models.hardware import ModelSpec
    >>> m = ModelSpec("70B", "dense", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 1, 1, 327680)
    >>> kv_bytes_per_token_per_gpu(m, "fp16", 8), kv_bytes_per_token_per_gpu(m, "fp16", 8, "replicated")
    (40960.0, 327680.0)
    """
    whole = model.kv_bytes_per_token_fp16 * KV_BYTES_BY_DTYPE[kv_dtype] / 2.0
    return whole if kv_layout == "replicated" else whole / _kv_shards(model, tp)


def _kv_cache_bytes(memory_bytes: float, weights_bytes: float, reserve_bytes: float,
                    gpu_memory_utilization: float) -> float:
    """The memory left to the KV cache, :math:`u M - M_w - r` (:func:`kv_capacity_tokens`); may be negative."""
    return gpu_memory_utilization * memory_bytes - weights_bytes - reserve_bytes


def kv_budget_bytes(hardware: HardwareSpec, weight_bytes: float, tp: int, gpu_memory_utilization: float,
                    defaults: RooflineDefaults) -> int:
    """KV-cache bytes per GPU, :math:`\\lfloor u \\, M - w - r_{nccl}(tp) \\rfloor`; may be negative.

    :math:`u` is the memory utilisation (vLLM's ``--gpu-memory-utilization``),
    :math:`M` the capacity, :math:`w` the resident weight bytes per GPU and
    :math:`r_{nccl}` the NCCL workspace (``defaults.nccl_bytes``): the convention of
    :func:`kv_capacity_tokens`, per GPU, which reproduces the paper's KV budgets
    (156 GB on B200, 60 GB on H100 for 70B TP=8).
    """
    return math.floor(_kv_cache_bytes(hardware.memory_bytes, weight_bytes, defaults.nccl_bytes(tp),
                                      gpu_memory_utilization))


def kv_capacity_tokens(memory_bytes: float, weights_bytes: float, kv_bytes_per_token: float, *,
                       gpu_memory_utilization: float, reserve_bytes: float) -> int:
    """KV-cache tokens that fit in what is left of the memory share after the weights and the NCCL workspace.

    .. math:: N_{kv} = \\left\\lfloor \\frac{u\\,M - M_w - r}{k} \\right\\rfloor,
              \\qquad k = 2 \\cdot \\ell \\cdot h_{kv} \\cdot d \\cdot s

    with :math:`M` the memory, :math:`u` = ``gpu_memory_utilization`` (vLLM's ``--gpu-memory-utilization``,
    the share weights + KV may use), :math:`M_w` the weights, :math:`r` = ``reserve_bytes`` the NCCL workspace
    and :math:`k` the KV bytes per token (K and V, :math:`\\ell` layers, :math:`h_{kv}` KV heads of dimension
    :math:`d`, :math:`s` bytes per element), all for the same scope: one GPU (:func:`kv_budget_bytes`,
    :math:`r = r_{nccl}(tp)`) or one replica of ``tp`` GPUs (the measured profiles,
    :math:`r = tp \\cdot r_{nccl}(tp)`; the same tokens for a sharded cache). The reserve is
    ``RooflineDefaults.nccl_bytes``: the catalogue's ``memory_reserves.nccl_bytes_by_tp``, the profile builder of
    vllm-sr-sim (0 at TP=1, 342 MiB per GPU at TP=2, 392 MiB at TP=4 and 8): vLLM's memory profiling counts
    the NCCL buffers of a tensor-parallel group as memory the KV cache cannot use. Activation workspace and CUDA
    graphs are neglected (vLLM reserves them inside :math:`u\\,M`; on an H100 with an 8B model about 1-2 GB,
    under 3 % of the KV).

    Examples
    --------
    Llama-3.1-8B (32 layers, 8 KV heads of 128, bf16: 131,072 bytes per token) at TP=1 on 79.18 GiB with
    15.01 GB of weights: (0.9 x 79.18 x 2^30 - 15.01e9 - 0) / 131072 = 469,261.9, i.e. 469,261 tokens.

    >>> kv_capacity_tokens(79.18 * 2**30, 15.01e9, 2 * 32 * 8 * 128 * 2, gpu_memory_utilization=0.9,
    ...                    reserve_bytes=0)
    469261
    """
    return int(math.floor(_kv_cache_bytes(memory_bytes, weights_bytes, reserve_bytes, gpu_memory_utilization)
                          / kv_bytes_per_token))


def peak_flops_per_s(hardware: HardwareSpec, dtype: str) -> float:
    """Dense tensor FLOP/s of one GPU for the dtype the matmuls run in.

    fp16/bf16 and int4 weight-only (dequantised to 16-bit) use the FP16 rate,
    fp8 the FP8 rate. Raises ``ValueError`` naming the GPU when it has no FP8.
    """
    if dtype != "fp8":
        return hardware.fp16_dense_tflops * 1e12
    if hardware.fp8_dense_tflops is None:
        raise ValueError(f"dtype 'fp8' is not supported on {hardware.name}: it has no FP8 tensor cores")
    return hardware.fp8_dense_tflops * 1e12


def matmul_params(model: ModelSpec, *, prefill: bool = False) -> int:
    """Weights one token is multiplied through (and a decode step streams), whole model.

    .. math::

        P_{mm} = P_a - [\\text{untied}] \\, V D, \\qquad P_{mm}^{pf} = P_{mm} - V D

    with :math:`P_a` = ``model.active_params`` (official count: embedding, every projection, the
    active experts, an untied LM head, norms), :math:`V` the vocabulary and :math:`D` the hidden size.
    The input-embedding table is *gathered* (one row per token), neither multiplied nor streamed;
    when it is tied to the LM head it is counted once in :math:`P_a`, as the LM head, and nothing is
    taken off. Attention projections (q, k, v, o), MLP or active experts, shared experts and routers
    and the LM head all count for a decode token. A prefill token skips the LM head
    (:math:`P_{mm}^{pf}`): an engine computes logits only at the positions it samples, the last
    prompt token (2 V D FLOP once per prompt, left out).

    Examples
    --------
    Llama-3.1-8B: 8,030,261,248 - 128,256 x 4,096 = 7,504,924,672; prefill 6,979,588,096.

    >>> from fleetopt.models.hardware import ModelSpec
    >>> m = ModelSpec("8B", "dense", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 8030261248, 8030261248, 131072)
    >>> matmul_params(m), matmul_params(m, prefill=True)
    (7504924672, 6979588096)
    """
    table = model.vocab_size * model.hidden_size
    decode = model.active_params - (0 if model.tied_embeddings else table)
    return decode - table if prefill else decode


def decode_compute_s_per_seq(hardware: HardwareSpec, model: ModelSpec, dtype: str, tp: int,
                             defaults: RooflineDefaults) -> float:
    """Per-sequence decode compute :math:`g`: one token through the weight matmuls on one GPU.

    .. math:: g = \\frac{2 P_{mm} / tp}{F(\\text{dtype}) \\, \\eta_{flop}}

    (:func:`matmul_params`, :func:`peak_flops_per_s`; tensor parallelism splits every matmul, the
    vocab-parallel LM head included). It is added to the memory-bound part, not overlapped with it:
    the measured H100 decode grid fits :math:`W + h n L + g n` within 10 % and :math:`W + h n L`
    alone only within 22 % (``data/measurements/README.md``).
    """
    return 2.0 * matmul_params(model) / tp / (peak_flops_per_s(hardware, dtype) * defaults.flop_efficiency)


def prefill_compute_s_per_token(hardware: HardwareSpec, model: ModelSpec, dtype: str, tp: int,
                                defaults: RooflineDefaults) -> float:
    """Per-prompt-token prefill compute :math:`a`: the weight matmuls of one prompt token on one GPU.

    .. math:: a = \\frac{2 P_{mm}^{pf} / tp}{F(\\text{dtype}) \\, \\eta_{flop}}

    The same matmuls as :func:`decode_compute_s_per_seq` without the LM head (:func:`matmul_params`).
    """
    flops = 2.0 * matmul_params(model, prefill=True) / tp
    return flops / (peak_flops_per_s(hardware, dtype) * defaults.flop_efficiency)


def causal_attention_s_per_token_sq(hardware: HardwareSpec, model: ModelSpec, tp: int,
                                    defaults: RooflineDefaults) -> float:
    """Causal-attention compute :math:`b` of prefill, seconds per token squared on one GPU.

    .. math:: b = \\frac{2 \\, \\ell \\, h_q \\, d / tp}{F_{16} \\, \\eta_{attn}}

    Derivation: in each of the :math:`\\ell` layers a (query, key) pair costs :math:`2d` FLOP per
    query head for :math:`q k^T` and :math:`2d` for the weighted sum of :math:`v`, so
    :math:`4 h_q d / tp` FLOP on one GPU (the :math:`h_q` heads are split over ``tp``). Causally, query
    :math:`i` sees keys :math:`1..i`: a chunk of :math:`c` tokens after a prefix of :math:`p` has
    :math:`\\sum_{i=p+1}^{p+c} i = ((p+c)^2 - p^2 + c)/2` pairs, so it costs
    :math:`4 \\ell h_q d / tp \\cdot ((p+c)^2 - p^2)/2 = b F_{16} \\eta_{attn} ((p+c)^2 - p^2)` FLOP and a
    whole prompt (:math:`p = 0, c = P`) :math:`b P^2`. The linear remainder (:math:`c/2` pairs,
    :math:`2 \\ell h_q d c / tp` FLOP) is below 0.01 % of :math:`a c` and dropped. Attention runs at
    16 bit whatever the weight dtype (an fp8 KV cache is dequantised), hence the FP16 rate
    :math:`F_{16}`. For MLA (DeepSeek-V3) :math:`d` is ``model.head_dim``, an approximation of the
    expanded form's 192-wide :math:`q k^T` and 128-wide :math:`v`.

    Examples
    --------
    Llama-3.1-8B on H100 (989 TFLOPS), TP=1, 0.35: 2 x 32 x 32 x 128 / (989e12 x 0.35) = 7.57e-10 s
    (the measured fit is 7.4e-10).
    """
    flops_per_token_sq = 2.0 * model.layers * model.attention_heads * model.head_dim / tp
    return flops_per_token_sq / (hardware.fp16_dense_tflops * 1e12 * defaults.attention_flop_efficiency)


def tp_link_bandwidth_bytes_per_s(hardware: HardwareSpec) -> float | None:
    """The per-direction bandwidth of the link a tensor-parallel group of one node all-reduces over.

    NVLink where the catalogue lists it (``nvlink_bandwidth_bytes_per_s``), else PCIe
    (``pcie_bandwidth_bytes_per_s``, a card without NVLink), else None. A tensor-parallel degree of at most 8
    (what an instance accepts) stays within one node, so the inter-node link is never used.
    """
    if hardware.nvlink_bandwidth_bytes_per_s is not None:
        return hardware.nvlink_bandwidth_bytes_per_s
    return hardware.pcie_bandwidth_bytes_per_s


def tp_allreduce_s_per_token(hardware: HardwareSpec, model: ModelSpec, tp: int, defaults: RooflineDefaults) -> float:
    """Tensor-parallel all-reduce time per token in the iteration, seconds (the per-token part).

    .. math::

        r = 2 \\ell \\cdot \\frac{2 (tp - 1)}{tp} \\cdot \\frac{D \\, b_{act}}{B_{link}}

    Megatron-LM's tensor parallelism [5]_ all-reduces the activations twice per layer (after the
    attention output projection and after the MLP's down projection), each message :math:`D \\, b_{act}`
    bytes per token (:math:`D` the hidden size, :math:`b_{act}` = ``defaults.activation_bytes``). A ring
    all-reduce sends and receives :math:`2 (tp - 1)/tp` of the message over each GPU's link [6]_ of
    per-direction bandwidth :math:`B_{link}` (:func:`tp_link_bandwidth_bytes_per_s`). Adds to the per-decode-
    sequence :math:`g` (one token per sequence) and to the per-prompt-token :math:`a` (one per prompt token of a
    chunk); it is not overlapped with compute (vLLM runs them in sequence). The latency of each call is
    :func:`tp_allreduce_latency_s`. 0 at ``tp`` = 1.

    Raises ``ValueError`` when ``tp`` > 1 and the catalogue gives the GPU no link bandwidth.

    Examples
    --------
    Llama-3.1-70B (80 layers, hidden 8,192) at TP=8 over 450 GB/s NVLink: 160 x 1.75 x 16,384 B / 450e9 B/s
    = 10.19 us per token.

    >>> from fleetopt.models.hardware import HardwareSpec, ModelSpec, RooflineDefaults
    >>> h = HardwareSpec("H", (), 1, 3.35e12, 989.0, None, 700.0, 1.0, None, nvlink_bandwidth_bytes_per_s=450e9)
    >>> m = ModelSpec("70B", "dense", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 1, 1, 327680)
    >>> round(tp_allreduce_s_per_token(h, m, 8, RooflineDefaults()) * 1e6, 2), tp_allreduce_s_per_token(h, m, 1,
    ...                                                                                 RooflineDefaults())
    (10.19, 0.0)
    """
    if tp <= 1:
        return 0.0
    link = tp_link_bandwidth_bytes_per_s(hardware)
    if link is None:
        raise ValueError(f"tp={tp} on {hardware.name}: the catalogue gives no link bandwidth for the tensor-parallel "
                         "all-reduce (nvlink_bandwidth_bytes_per_s or pcie_bandwidth_bytes_per_s)")
    message_bytes = model.hidden_size * defaults.activation_bytes
    return 2.0 * model.layers * (2.0 * (tp - 1) / tp) * message_bytes / link


def tp_allreduce_latency_s(model: ModelSpec, tp: int, defaults: RooflineDefaults) -> float:
    """Fixed latency of an iteration's tensor-parallel all-reduces, seconds: :math:`2 \\ell \\alpha` (0 at tp = 1).

    Two all-reduces per layer [5]_, each paying the collective's start-up latency :math:`\\alpha` =
    ``defaults.p2p_latency_s`` once (the :math:`\\alpha` of the alpha-beta cost model of [6]_; small decode
    messages are latency-bound: vLLM's one-shot custom all-reduce and NCCL's low-latency protocols take
    about 10 us on an 8-GPU NVLink node). Adds to :math:`W`.

    Examples
    --------
    >>> from fleetopt.models.hardware import ModelSpec, RooflineDefaults
    >>> m = ModelSpec("70B", "dense", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 1, 1, 327680)
    >>> d = RooflineDefaults()
    >>> round(tp_allreduce_latency_s(m, 8, d) * 1e3, 3), tp_allreduce_latency_s(m, 1, d)
    (1.6, 0.0)
    """
    return 0.0 if tp <= 1 else 2.0 * model.layers * defaults.p2p_latency_s


def moe_dispatch_s(model: ModelSpec, defaults: RooflineDefaults) -> float:
    """A mixture-of-experts model's routing overhead per iteration, seconds: :math:`\\ell \\tau_d` (0 if dense).

    Each MoE layer routes the batch's tokens to their experts and back (a dispatch and a combine, the two
    all-to-alls of GShard [7]_; on one GPU or under tensor-parallel experts, the gate's top-k, the token
    permutation and its inverse), a cost the active-parameter streaming time leaves out: that time alone is
    an upper bound on throughput (the 1/W paper, Table 2). :math:`\\tau_d` = ``defaults.moe_dispatch_s_per_layer``
    (20 us: two exchanges of at least one GPU-to-GPU latency each); every layer is charged (DeepSeek-V3's three
    dense layers included). Adds to :math:`W` under the physical convention.

    Examples
    --------
    Qwen3-30B-A3B (48 layers): 48 x 20 us = 0.96 ms per iteration.
    """
    return model.layers * defaults.moe_dispatch_s_per_layer if model.is_moe else 0.0


def ridge_batch(peak_flops: float, weight_stream_s: float, active_params: int, tp: int) -> int:
    """The seeds' concurrency cap: the largest batch whose weight matmuls fit in the weight streaming time.

    Each sequence costs :math:`2 P_a / tp` weight FLOPs per GPU per iteration;
    the iteration stays memory-bound while that compute fits in the weight
    streaming time :math:`W_{stream}`:

    .. math::

        n_{ridge} = \\left\\lfloor \\frac{F \\, W_{stream}}{2 P_a / tp} \\right\\rfloor
        = \\left\\lfloor \\frac{F \\, b_w}{2 \\beta \\eta} \\right\\rfloor
        \\quad (\\text{when } W_{stream} = P_a b_w / (tp \\, \\beta \\eta))

    i.e. the GPU's ridge point (FLOP per byte) times bytes per weight over 2:
    369 for fp16 on an H100 (989e12 x 2 / (2 x 2.68e12)). Used only under the seeds'
    convention, whose iteration ``W + H n`` has no compute term. It is not a physical limit: it
    ignores the KV scan (at 4K context an iteration at the ridge is still memory-bound), it gives a
    GPU with more bandwidth fewer slots (H200 257 against H100 353 for Llama-3.1-70B TP=8 at 4K) and
    int4 a quarter of fp16's (92). The ``physical`` convention has no compute cap.

    Examples
    --------
    >>> ridge_batch(989e12, 17.5e9 / 2.68e12, 8_750_000_000, 1)
    369
    """
    return max(1, math.floor(peak_flops * weight_stream_s / (2.0 * active_params / tp)))


def _moe_layer_table_stream_s(hardware: HardwareSpec, model: ModelSpec, dtype: str, tp: int,
                              table: MoELatencyTable, defaults: RooflineDefaults) -> float:
    """Decode time of a MoE without the per-layer constant, from the per-layer latency table.

    .. math::

        W_{stream} = \\ell \\, \\tau(x_{dec}) +
        \\frac{\\ell (2 h_q + 2 h_{kv}) d \\, D \\, b_w}{tp \\, \\beta \\eta}

    :math:`\\tau(x_{dec})` is the table read at ``decode_reference_tokens`` and
    scaled to the GPU (not divided by tp, as the catalogue composes it); the
    second term streams the attention projections (q and o: :math:`h_q d D`
    each; k and v: :math:`h_{kv} d D` each, :math:`D` the hidden size). Every
    layer is charged the MoE table (DeepSeek-V3's 3 dense layers included); for
    MLA the projection count from the heads is an approximation.
    """
    bw = hardware.memory_bandwidth_bytes_per_s
    tau_s = table.layer_latency_s(moe_table_key(model), WEIGHT_BYTES_BY_DTYPE[dtype],
                                  table.decode_reference_tokens, bw)
    attn_params = model.layers * 2 * (model.attention_heads + model.kv_heads) * model.head_dim * model.hidden_size
    attn_s = attn_params * WEIGHT_BYTES_BY_DTYPE[dtype] / tp / (bw * defaults.bandwidth_efficiency)
    return model.layers * tau_s + attn_s


def _weight_stream_s(hardware: HardwareSpec, model: ModelSpec, dtype: str, tp: int, moe_w: str,
                     moe_table: MoELatencyTable | None, defaults: RooflineDefaults) -> float:
    """Memory-bound part of :math:`W`: streamed weight bytes over sustained bandwidth.

    Streamed weights :math:`P_s`: :func:`matmul_params` (``physical``: the input-embedding table is
    gathered, not streamed) or the official ``active_params`` (``seeds``).
    """
    if model.is_moe and moe_w == "layer-table" and moe_table is not None:   # _config_problems: never None here
        return _moe_layer_table_stream_s(hardware, model, dtype, tp, moe_table, defaults)
    streamed = model.active_params if defaults.convention == "seeds" else matmul_params(model)
    streamed_bytes = streamed * WEIGHT_BYTES_BY_DTYPE[dtype] / tp
    return streamed_bytes / (hardware.memory_bandwidth_bytes_per_s * defaults.bandwidth_efficiency)


def _busy_power_curve(hardware: HardwareSpec, W_s: float, h_s_per_token: float, g_s: float,
                      ctx_tokens: int, defaults: RooflineDefaults) -> PowerCurve:
    """:func:`busy_power_per_gpu_w` at a fixed context, written as one GPU's logistic curve.

    With every sequence at context :math:`L`, the busy share
    :math:`a(n) = (hL+g) n / (W + (hL+g) n) = 1 / (1 + e^{-\\ln 2 (\\log_2 n - x_0)})`, so

    .. math::

        P(n) = T f_s + T (1 - f_s) \\, a(n) : \\quad
        P_{idle} = f_s T, \\; P_{nom} = T, \\; k = \\ln 2, \\; x_0 = \\log_2 \\frac{W}{hL + g}

    exactly (the paper's projection rule :math:`x_0 = \\log_2(W/H)` is this with :math:`g = 0`, at
    :math:`L = B_{cal}`, but with :math:`k = 1` and 0.43/0.86 TDP). Quality ``projected``.
    """
    x0 = math.log2(W_s / (h_s_per_token * ctx_tokens + g_s))
    return PowerCurve(defaults.streaming_power_fraction * hardware.tdp_w, hardware.tdp_w, math.log(2.0), x0,
                      "projected")


def _replica_power(hardware: HardwareSpec, tp: int, W_s: float, H_s: float, g_s: float, ctx_tokens: int,
                   defaults: RooflineDefaults) -> PowerCurve:
    """Power curve of the replica (tp GPUs).

    ``physical``: :func:`_busy_power_curve` at the calibration context. ``seeds``: the catalogue
    curve of one GPU scaled by tp, or where the catalogue has none the paper's projection rule
    (section 2.1, Appendix A): idle = 0.43 TDP, nominal = 0.86 TDP, k = 1,
    :math:`x_0 = \\log_2(W/H)` with :math:`H` at the calibration context (quality ``projected``).
    """
    if defaults.convention == "physical":
        return _busy_power_curve(hardware, W_s, H_s / ctx_tokens, g_s, ctx_tokens, defaults).scaled(tp)
    curve = hardware.power
    if curve is None:
        curve = PowerCurve(defaults.tdp_idle_fraction * hardware.tdp_w, defaults.tdp_nominal_fraction * hardware.tdp_w,
                           1.0, math.log2(W_s / H_s), "projected")
    return curve.scaled(tp)


def _config_problems(hardware: HardwareSpec, model: ModelSpec, tp: int, dtype: str, kv_dtype: str,
                     utilization: float, max_num_seqs: int | None, kv_layout: str, chunk_tokens: int,
                     blk_size_tokens: int, calibration_ctx_tokens: int, moe_w: str,
                     moe_table: MoELatencyTable | None) -> list[str]:
    """Every problem with a serving configuration, one line each (empty when valid)."""
    problems = []
    if not (isinstance(tp, int) and tp >= 1):
        problems.append(f"tp must be an integer >= 1; got {tp!r}")
    elif model.attention_heads % tp:
        problems.append(f"tp={tp} does not divide the {model.attention_heads} attention heads of {model.name}")
    if dtype not in WEIGHT_BYTES_BY_DTYPE:
        problems.append(f"dtype must be one of {tuple(WEIGHT_BYTES_BY_DTYPE)}; got {dtype!r}")
    if kv_dtype not in ("fp16", "bf16", "fp8"):
        problems.append(f"kv_dtype must be one of ('fp16', 'bf16', 'fp8'); got {kv_dtype!r}")
    if not 0.0 < utilization <= 1.0:
        problems.append(f"gpu_memory_utilization must be in (0, 1]; got {utilization!r}")
    if max_num_seqs is not None and not max_num_seqs >= 1:
        problems.append(f"max_num_seqs must be >= 1 or None; got {max_num_seqs!r}")
    if kv_layout not in KV_LAYOUTS:
        problems.append(f"kv_layout must be one of {KV_LAYOUTS}; got {kv_layout!r}")
    for label, value in (("chunk_tokens", chunk_tokens), ("blk_size_tokens", blk_size_tokens),
                         ("calibration_ctx_tokens", calibration_ctx_tokens)):
        if not value >= 1:
            problems.append(f"{label} must be >= 1; got {value!r}")
    if moe_w not in MOE_W_METHODS:
        problems.append(f"moe_w must be one of {MOE_W_METHODS}; got {moe_w!r}")
    elif model.is_moe and moe_w == "layer-table" and moe_table is None:
        problems.append("moe_w='layer-table' needs moe_table (e.g. Catalog.moe_latency_table)")
    return problems


def _profile_name(hardware: HardwareSpec, model: ModelSpec, tp: int, dtype: str, kv_dtype: str,
                  kv_layout: str, moe_w: str, convention: str) -> str:
    """``HARDWARE/MODEL/tpN/DTYPE`` plus the options that change the numbers.

    A MoE always says which weight-streaming method applies (``moe-active-params`` or
    ``moe-layer-table``), and a profile built under the seeds' convention ends in ``seeds``.
    """
    parts = [hardware.name, model.name, f"tp{tp}", dtype]
    if kv_dtype != _default_kv_dtype(dtype):
        parts.append(f"kv-{kv_dtype}")
    if kv_layout != "sharded":
        parts.append(f"kv-{kv_layout}")
    if model.is_moe:
        parts.append(f"moe-{moe_w}")
    if convention != "physical":
        parts.append(convention)
    return "/".join(parts)


def _default_kv_dtype(dtype: str) -> str:
    return {"fp8": "fp8", "bf16": "bf16"}.get(dtype, "fp16")


def _empty_note(budget: int, weights: float, hardware: HardwareSpec, u: float, tp: int,
                defaults: RooflineDefaults) -> str:
    if budget > 0:
        return ""
    gb = _BYTES_PER_GB
    return (f"no KV cache: {u:g} x {hardware.memory_bytes / gb:.1f} GB - weights {weights / gb:.1f} GB per GPU "
            f"- NCCL {defaults.nccl_bytes(tp) / gb:.2f} GB = {budget / gb:.1f} GB on {hardware.name}")


def computed_profile(hardware: HardwareSpec, model: ModelSpec, *, tp: int = 1, dtype: str = "fp16",
                     kv_dtype: str | None = None, gpu_memory_utilization: float | None = None,
                     max_num_seqs: int | None = None, kv_layout: str = "sharded", chunk_tokens: int = 512,
                     blk_size_tokens: int = 16, calibration_ctx_tokens: int = 8192,
                     moe_w: str = "active-params", moe_table: MoELatencyTable | None = None,
                     defaults: RooflineDefaults) -> ComputedProfile:
    """The roofline profile of one replica of ``model`` on ``tp`` GPUs of type ``hardware``.

    Parameters
    ----------
    hardware, model : HardwareSpec, ModelSpec
        Catalogue records.
    tp : int, default 1
        Tensor-parallel degree = GPUs per replica; must divide the attention heads.
    dtype : {"fp16", "bf16", "fp8", "int4"}, default "fp16"
        Weight dtype. fp8 needs FP8 tensor cores (not A10G/A100).
    kv_dtype : {"fp16", "bf16", "fp8"}, optional
        KV-cache dtype; default :data:`KV_BYTES_BY_DTYPE` of ``dtype`` (fp8 for fp8, else 16-bit).
    gpu_memory_utilization : float, optional
        Fraction of memory for weights + KV; default ``defaults.gpu_memory_utilization`` (0.90).
    max_num_seqs : int, optional
        Concurrency cap (vLLM's ``--max-num-seqs``). Default: none beyond the KV cache (``physical``),
        the ridge batch (``seeds``, :func:`ridge_batch`).
    kv_layout : {"sharded", "replicated"}, default "sharded"
        KV capacity convention (:func:`kv_bytes_per_token_per_gpu`). ``replicated``
        reproduces the paper's Tables 2 and 5; it changes only the capacity, never ``H_s``.
    chunk_tokens, blk_size_tokens : int, default 512, 16
        Prefill chunk and KV block (tokens).
    calibration_ctx_tokens : int, default 8192
        Context at which ``H_s`` is stated (only the product ``H_s / calibration_ctx_tokens`` matters
        for latency) and at which ``power`` is written as a curve of the batch.
    moe_w : {"active-params", "layer-table"}, default "active-params"
        How a MoE's weight-streaming time is computed; ignored for dense models.
    moe_table : MoELatencyTable, optional
        Required with ``moe_w="layer-table"``.
    defaults : RooflineDefaults
        Efficiencies, per-layer latency, memory reserves, power fractions and the convention
        (``defaults.seeds_convention()`` for the paper's Tables 2 and 5).

    Returns
    -------
    ComputedProfile

    Raises
    ------
    ValueError
        Listing every invalid argument, or naming the GPU when fp8 is not supported.

    Notes
    -----
    .. math::

        W = W_{stream} + \\ell c, \\quad
        W_{stream} = \\frac{P_s b_w}{tp \\, \\beta \\eta_{bw}}, \\quad
        H = \\frac{B_{cal} \\, k_{scan}}{\\beta \\eta_{bw}}, \\quad
        M_{kv} = \\lfloor u M - P b_w / tp - r_{nccl}(tp) \\rfloor

    and ``g_s``, ``prefill_a_s``, ``prefill_b_s`` from :func:`decode_compute_s_per_seq`,
    :func:`prefill_compute_s_per_token`, :func:`causal_attention_s_per_token_sq` (0 under ``seeds``).
    Under ``physical``, a replica of ``tp`` > 1 adds its all-reduce: :func:`tp_allreduce_s_per_token` to ``g_s``
    and ``prefill_a_s``, :func:`tp_allreduce_latency_s` to ``W_s``; a MoE adds :func:`moe_dispatch_s` to ``W_s``
    (the seeds' convention, which reproduces the paper's tables, has neither).
    :math:`P_s` is :func:`matmul_params` (``physical``: the active weights less the gathered embedding
    table) or ``model.active_params`` (``seeds``: the official count, embedding included, which puts
    :math:`W` above the paper's by vocab x hidden x :math:`b_w`/tp: +1.5 % for Llama-3.1-70B, +7 % for
    8B). For a MoE, active parameters are the paper's "active-parameter weight streaming", an upper
    bound on throughput (all-to-all dispatch and the experts a large batch touches are ignored); with
    ``moe_w="layer-table"`` :math:`W_{stream}` is :func:`MoELatencyTable.layer_latency_s` plus
    attention streaming. :math:`k_{scan}` is the TP-sharded KV bytes per token per GPU under *both*
    layouts: every GPU scans only its own heads (this is what reproduces the tok/s column of Table 2,
    2,716 tok/s for 70B on H100). Resident weights use the official ``model.params``.

    The replica costs ``tp`` GPU-hours per hour. Power: ``physical``, the busy-power rule
    (:func:`busy_power_per_gpu_w`, ``activity_power`` for any iteration, ``power`` as a curve of the
    batch at the calibration context); ``seeds``, ``tp`` times the catalogue curve. Quality labels:
    latency ``roofline``; power ``projected`` (physical) or as catalogued (seeds).

    Examples
    --------
    At TP=8 the physical convention streams 69,503,033,344 x 2 / 8 bytes at 0.75 x 3.35 TB/s (6.916 ms), adds
    80 layers x 3 us (0.24 ms) and 2 x 80 all-reduce latencies of 10 us (1.6 ms): W = 8.76 ms; per sequence the
    matmuls, 2 x 69,503,033,344 / 8 / (989e12 x 0.60) = 29.28 us, plus the all-reduce, 160 x (2 x 7/8) x 8,192 x 2 B
    / 450e9 B/s = 10.19 us: g = 39.48 us (without the all-reduce, 7.16 ms and 29.28 us).

    >>> from fleetopt.models.hardware import HardwareSpec, ModelSpec, RooflineDefaults
    >>> from fleetopt.models.power import PowerCurve
    >>> h100 = HardwareSpec("H100", (), 85899345920, 3.35e12, 989.0, 1978.0, 700.0, 4.02,
    ...                     PowerCurve(300.0, 600.0, 1.0, 4.2, "measured"), nvlink_bandwidth_bytes_per_s=450e9)
    >>> m70 = ModelSpec("70B", "dense", 80, 8192, 64, 8, 128, 28672, 128256, 131072,
    ...                 70553706496, 70553706496, 327680)
    >>> p = computed_profile(h100, m70, tp=8, defaults=RooflineDefaults())
    >>> round(p.W_s * 1e3, 2), round(p.g_s * 1e6, 2), p.n_slots(8192), p.gpus_per_replica, p.cost_usd_per_hr
    (8.76, 39.48, 176, 8, 32.16)
    >>> round((p.W_s - p.tp_allreduce_latency_s) * 1e3, 2), round((p.g_s - p.tp_allreduce_s_per_token) * 1e6, 2)
    (7.16, 29.28)
    >>> seeds = computed_profile(h100, m70, tp=8, kv_layout="replicated",
    ...                          defaults=RooflineDefaults().seeds_convention())
    >>> round(seeds.W_s * 1e3, 2), seeds.g_s, seeds.n_slots(8192), seeds.name
    (6.82, 0.0, 22, 'H100/70B/tp8/fp16/kv-replicated/seeds')
    """
    kv_dtype = _default_kv_dtype(dtype) if kv_dtype is None else kv_dtype
    u = defaults.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    problems = _config_problems(hardware, model, tp, dtype, kv_dtype, u, max_num_seqs, kv_layout, chunk_tokens,
                                blk_size_tokens, calibration_ctx_tokens, moe_w, moe_table)
    if problems:
        raise ValueError(f"invalid serving configuration for {model.name} on {hardware.name}: "
                         + "; ".join(problems))
    physical = defaults.convention == "physical"
    flops = peak_flops_per_s(hardware, dtype)
    weights = weight_bytes_per_gpu(model, dtype, tp)
    stream_s = _weight_stream_s(hardware, model, dtype, tp, moe_w, moe_table, defaults)
    W_s = stream_s + model.layers * defaults.per_layer_latency_s
    link = ar_token_s = ar_latency_s = dispatch_s = 0.0
    if physical:
        link = tp_link_bandwidth_bytes_per_s(hardware) if tp > 1 else None
        ar_token_s = tp_allreduce_s_per_token(hardware, model, tp, defaults)
        ar_latency_s = tp_allreduce_latency_s(model, tp, defaults)
        dispatch_s = moe_dispatch_s(model, defaults)
        W_s += ar_latency_s + dispatch_s
    scan = kv_bytes_per_token_per_gpu(model, kv_dtype, tp, "sharded")
    h_s_per_token = scan / (hardware.memory_bandwidth_bytes_per_s * defaults.bandwidth_efficiency)
    H_s = calibration_ctx_tokens * h_s_per_token
    budget = kv_budget_bytes(hardware, weights, tp, u, defaults)
    if physical:
        g_s = decode_compute_s_per_seq(hardware, model, dtype, tp, defaults) + ar_token_s
        a_s = prefill_compute_s_per_token(hardware, model, dtype, tp, defaults) + ar_token_s
        b_s = causal_attention_s_per_token_sq(hardware, model, tp, defaults)
        cap = max_num_seqs
        flops_per_seq = 2.0 * matmul_params(model) / tp
        activity = ActivityPower(idle_w=tp * defaults.idle_power_fraction * hardware.tdp_w,
                                 limit_w=tp * hardware.tdp_w,
                                 weights_w=tp * defaults.streaming_power_fraction * hardware.tdp_w,
                                 kv_w=tp * hardware.tdp_w, compute_w=tp * hardware.tdp_w, quality="projected")
    else:
        g_s = a_s = b_s = 0.0
        cap = max_num_seqs if max_num_seqs is not None else ridge_batch(flops, stream_s, model.active_params, tp)
        flops_per_seq = 2.0 * model.active_params / tp
        activity = None
    return ComputedProfile(
        name=_profile_name(hardware, model, tp, dtype, kv_dtype, kv_layout, moe_w, defaults.convention),
        model_name=model.name, W_s=W_s, H_s=H_s, calibration_ctx_tokens=calibration_ctx_tokens,
        chunk_tokens=chunk_tokens, blk_size_tokens=blk_size_tokens,
        cost_usd_per_hr=tp * hardware.usd_per_gpu_hour, gpus_per_replica=tp,
        power=_replica_power(hardware, tp, W_s, H_s, g_s, calibration_ctx_tokens, defaults),
        latency_quality="roofline",
        hardware_name=hardware.name, tp=tp, dtype=dtype, kv_dtype=kv_dtype, kv_layout=kv_layout,
        moe_w=moe_w if model.is_moe else "dense", weight_bytes_per_gpu=weights, weight_stream_s=stream_s,
        kv_budget_bytes=budget, kv_bytes_per_token_per_gpu=kv_bytes_per_token_per_gpu(model, kv_dtype, tp, kv_layout),
        kv_scan_bytes_per_token_per_gpu=scan, concurrency_cap_seqs=None if cap is None else int(cap),
        peak_flops_per_s=flops, flops_per_seq_per_gpu=flops_per_seq, tdp_w=hardware.tdp_w,
        tdp_idle_fraction=defaults.tdp_idle_fraction, tdp_nominal_fraction=defaults.tdp_nominal_fraction,
        note=_empty_note(budget, weights, hardware, u, tp, defaults),
        g_s=g_s, prefill_a_s=a_s, prefill_b_s=b_s, convention=defaults.convention,
        bandwidth_efficiency=defaults.bandwidth_efficiency, flop_efficiency=defaults.flop_efficiency,
        attention_flop_efficiency=defaults.attention_flop_efficiency,
        streaming_power_fraction=defaults.streaming_power_fraction, activity_power=activity,
        tp_allreduce_s_per_token=ar_token_s, tp_allreduce_latency_s=ar_latency_s, moe_dispatch_s=dispatch_s,
        link_bandwidth_bytes_per_s=link or None,
    )


def busy_power_per_gpu_w(profile: ComputedProfile, n_active, seq_tokens):
    """Power of one GPU of a replica running decode steps of ``n_active`` sequences at ``seq_tokens`` (array-aware).

    The busy-power rule of the ``physical`` convention:

    .. math::

        P = T \\left(f_s \\frac{W}{t} + \\frac{t - W}{t}\\right)
          = T \\left(f_s + (1 - f_s)\\left(1 - \\frac{W}{t}\\right)\\right), \\qquad
        t = W + h n L + g n

    :math:`T` the board power limit (``tdp_w``), :math:`f_s` = ``streaming_power_fraction`` (0.60): a GPU
    that only streams weights draws :math:`f_s T`, and the share of the iteration spent scanning KV or
    computing runs at the board limit. It is ``profile.activity_power`` (an
    :class:`~fleetopt.models.power.ActivityPower` with weights at :math:`f_s T`, KV scan and compute at
    :math:`T`), which covers prefill chunks too, evaluated on a decode step; ``profile.power`` is the same
    rule at the calibration context as a curve of :math:`n`. On the measured H100 Llama-3.1-8B grid
    (``data/measurements/``) it is within -15 % / +3 % of the 18 board readings and within 10 % of the five
    at full KV occupancy (645-710 W).

    Only weight streaming (:math:`n = 0`) draws :math:`f_s T` (420 W on a 700 W H100); a KV scan as long
    as :math:`W` draws halfway between :math:`f_s T` and :math:`T` (560 W). Raises ``ValueError`` for a
    profile built under the seeds' convention (it has no activity power; use ``profile.power`` or
    :func:`activity_power_per_gpu_w`).
    """
    if profile.activity_power is None:
        raise ValueError(f"profile {profile.name}: busy power needs the physical convention; "
                         "use profile.power or activity_power_per_gpu_w")
    n = np.asarray(n_active, dtype=float)
    L = np.asarray(seq_tokens, dtype=float)
    weights_s = np.full(np.broadcast(n, L).shape, profile.W_s)
    kv_s = profile.H_s / profile.calibration_ctx_tokens * n * L
    compute_s = profile.g_s * n * np.ones_like(L)
    out = np.asarray(profile.activity_power.iteration_power_w(weights_s, kv_s, compute_s)) / profile.gpus_per_replica
    return out if out.ndim else float(out)


def activity_power_per_gpu_w(profile: ComputedProfile, n_active, mean_seq_tokens):
    """Power of one GPU of a replica under the activity rule behind the paper's Tables 2 and 5 (array-aware).

    .. math::

        P = T \\left(f_{idle} + (f_{nom} - f_{idle}) \\min(1, a_{kv} + a_{c})\\right), \\quad
        a_{kv} = \\frac{n H \\bar L / B_{cal}}{t}, \\quad
        a_{c} = \\frac{n \\, 2 P_a / tp}{t \\, F}, \\quad
        t = W + H \\frac{\\bar L}{B_{cal}} n

    :math:`T` is the GPU's TDP, :math:`f_{idle}, f_{nom}` = 0.43, 0.86,
    :math:`a_{kv}` the KV-scan share of the iteration, :math:`a_c` the share of
    peak tensor FLOP/s :math:`F` spent on weight matmuls. It is the reference
    tool's computed-profile power (its ``power_at_concurrency``; it uses the FP16
    rate for :math:`F` whatever the dtype, we use the dtype's rate) and, on a profile
    built under the seeds' convention, gives Table 5's P column (367 / 422 / 619 / 755 W)
    within 1%. Its nominal 0.86 TDP is below what a busy GPU draws (645-710 W of 700 W
    on the measured H100, ``data/measurements/``); for physical power use
    :func:`busy_power_per_gpu_w`. It is not a :class:`~fleetopt.models.power.PowerCurve`
    (it depends on :math:`\\bar L` too), so it is offered beside ``profile.power``, not in
    place of it. Multiply by ``profile.gpus_per_replica`` for the replica.
    """
    n = np.asarray(n_active, dtype=float)
    kv_s = profile.H_s * (np.asarray(mean_seq_tokens, dtype=float) / profile.calibration_ctx_tokens) * n
    t = profile.W_s + kv_s
    activity = np.minimum(1.0, kv_s / t + n * profile.flops_per_seq_per_gpu / (t * profile.peak_flops_per_s))
    span = profile.tdp_nominal_fraction - profile.tdp_idle_fraction
    out = profile.tdp_w * (profile.tdp_idle_fraction + span * activity)
    return out if out.ndim else float(out)
