r"""The analytic model of a disaggregated prefill/decode (P/D) pair serving one length segment.

A P/D pair serves the requests whose total length lies in a segment :math:`(lo, hi]` (context window
:math:`hi`) on two pools joined by a KV transfer:

* a **prefill pool** of :math:`N_p` replicas (one GPU option) running prefill-only iterations, one prompt at a
  time (:class:`PrefillStation`);
* a **decode pool** of :math:`N_d` replicas (another, or the same, GPU option) running decode-only continuous
  batches, at most :math:`n` sequences per replica (KV slots at the window, TPOT cap; :class:`DecodeStation`);
* a **KV transfer** (:class:`KVTransfer`) that moves each prompt's KV cache from the prefill replica to a decode
  replica.

.. math::

    \mathrm{TTFT} = W_q + S_p(l_{in}) + T_x(l_{in}), \qquad \mathrm{TPOT} \le t(n, hi)

with :math:`W_q` the prefill queue's wait (M/G/c over the :math:`N_p` replicas, the tail of
:mod:`fleetopt.models.queueing.erlang`), :math:`S_p` the prompt's prefill alone on an idle replica
(:func:`prefill_service_s`), :math:`T_x` the transfer, and :math:`t(n, hi)` the decode iteration of a full
batch at the window (:func:`fleetopt.models.service.tpot_bound_s`, the convention of aggregated pools). A wait for
a decode slot delays the request's second token, so it belongs to TPOT, not TTFT; the decode pool is sized so
that at most ``wait_prob_max`` (1 %) of requests wait at all.

The traffic of a segment is a discrete law of (prompt, output) tokens (:class:`PhaseTraffic`). Every station
method is vectorised over replica counts (any array shape). :func:`size_pair` sizes a pair,
:func:`evaluate_pair` judges given counts (:class:`PairResult`), and :func:`reference_disagg` reproduces the
reference tool's ``disagg`` command (vllm-sr-sim; the capacity-planning scenarios' Puzzle 7), whose convention
differs (``docs/models.md``, "Disaggregated prefill/decode").

References
----------
.. [1] L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975, Ch. 3 and 5 (M/M/c, M/G/1, Pollaczek-Khinchine).
.. [2] T. Kimura, "Approximations for multi-server queues: system interpolations", Queueing Systems 17 (1994)
       347-382 (the M/G/c wait tail of :mod:`fleetopt.models.queueing.erlang`).
.. [3] J. D. C. Little, "A proof for the queuing formula L = lambda W", Operations Research 9 (1961).
.. [4] Y. Zhong et al., "DistServe: disaggregating prefill and decoding for goodput-optimized LLM serving",
       OSDI 2024 (prefill and decode on separate GPUs, the KV cache moved between them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import cast

import numpy as np

from fleetopt.models.numerics import special, unique
from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import ServingProfile
from fleetopt.models.queueing.batched import _EXACT_BELOW, _GH_W, _GH_X, OperatingPoint, mean_power_w
from fleetopt.models.queueing.erlang import (Sizing, erlang_c, min_replicas, prefill_p99_s, ttft_miss_prob,
                                             ttft_p99_s, wait_decay_rate)
from fleetopt.models.service import (DecodePower, compute_coefficients, decode_power_curve, iteration_coefficients,
                                     iteration_latency_s, service_time_s, tpot_batch_cap, tpot_bound_s)
from fleetopt.models.units import HOURS_PER_YEAR, MS_PER_S, P99, P99_TAIL
from fleetopt.models.workload import DEFAULT_INPUT_FRACTION, LengthDistribution, RequestTrace

__all__ = ["KV_TRANSFER_MODELS", "SEED_TTFT_FACTOR", "KVTransfer", "kv_bytes_per_token", "link_bandwidth_bytes_per_s",
           "PhaseTraffic", "prefill_components_s", "prefill_service_s", "PrefillStation", "DecodeStation",
           "stack_traffic", "stack_distribution", "PrefillStations", "DecodeStations",
           "PairResult", "evaluate_pair", "size_pair", "ReferencePoint", "ReferenceDisagg", "reference_disagg",
           "REFERENCE_PREFILL_DERATE", "REFERENCE_DECODE_DERATE", "REFERENCE_INPUT_SHARE"]

KV_TRANSFER_MODELS = ("bandwidth", "seed-factor")
SEED_TTFT_FACTOR = 1.8
"""The reference tool's TTFT correction for the KV transfer: TTFT = 1.8 x the prefill time (vllm-sr-sim
``optimizer/disagg.py``, ``BETA_TTFT``, after AIConfigurator's Algorithm 3)."""
REFERENCE_PREFILL_DERATE = 0.90
"""The reference's prefill throughput degradation from pipeline interference (``ALPHA_PRE``)."""
REFERENCE_DECODE_DERATE = 0.92
"""The reference's decode throughput degradation (``ALPHA_DEC``)."""
REFERENCE_INPUT_SHARE = 0.75
"""The reference ``disagg`` command's prompt share of the mean total length (its mean ISL; the output is the
other 0.25). fleetopt's CDF workloads use :data:`fleetopt.models.workload.DEFAULT_INPUT_FRACTION` (0.8)."""


def _cv2(probs: np.ndarray, values: np.ndarray) -> float:
    """Squared coefficient of variation :math:`E[X^2]/E[X]^2 - 1` of a discrete law (0 where the mean is 0;
    never below 0, which only rounding could give)."""
    m = float(probs @ values)
    return max(float(probs @ values**2) / (m * m) - 1.0, 0.0) if m > 0 else 0.0


# ----------------------------------------------------------------------------------------------- KV transfer


@dataclass(frozen=True, kw_only=True)
class KVTransfer:
    r"""How long a prompt's KV cache takes to reach the decode pool.

    ``model = "bandwidth"`` (fleetopt's own):

    .. math:: T_x(l_{in}) = \ell + l_{in} \, \kappa / B

    with :math:`\ell` = ``latency_s`` (the link's setup latency), :math:`\kappa` = ``kv_bytes_per_token`` (KV bytes of
    one token for the whole model, :func:`kv_bytes_per_token`) and :math:`B` = ``bandwidth_bytes_per_s`` (the
    replica-to-replica bandwidth, :func:`link_bandwidth_bytes_per_s`). The transfer delays the request; it does not
    occupy the prefill replica's compute (the copy runs on the copy engines / NICs while the next prompt
    computes, as NIXL/Mooncake transfers do).

    ``model = "seed-factor"`` (the reference's convention): the prefill part of TTFT is multiplied by
    ``factor`` (1.8), i.e. :math:`T_x = (\phi - 1) S_p(l_{in})`.

    Examples
    --------
    Llama-3.1-70B (327,680 KV bytes per token in 16 bits) over eight 50 GB/s links: a 1,000-token prompt moves
    327.68 MB in 0.82 ms, plus 10 us of latency.

    >>> x = KVTransfer(model="bandwidth", kv_bytes_per_token=327_680.0, bandwidth_bytes_per_s=8 * 50e9, latency_s=1e-5)
    >>> round(float(x.time_s(1000, 0.2)) * 1e3, 4)
    0.8292
    >>> round(float(KVTransfer(model="seed-factor").time_s(1000, 0.2)), 6)   # (1.8 - 1) x 0.2 s
    0.16
    """

    model: str
    kv_bytes_per_token: float = 0.0
    bandwidth_bytes_per_s: float = 0.0
    latency_s: float = 0.0
    factor: float = SEED_TTFT_FACTOR

    def __post_init__(self) -> None:
        if self.model not in KV_TRANSFER_MODELS:
            raise ValueError(f"kv_transfer model must be one of {KV_TRANSFER_MODELS}; got {self.model!r}")
        if self.model == "bandwidth":
            if not (self.kv_bytes_per_token > 0 and math.isfinite(self.kv_bytes_per_token)):
                raise ValueError(f"kv_transfer kv_bytes_per_token must be > 0; got {self.kv_bytes_per_token!r}")
            if not self.bandwidth_bytes_per_s > 0:
                raise ValueError(f"kv_transfer bandwidth_bytes_per_s must be > 0; got {self.bandwidth_bytes_per_s!r}")
            if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
                raise ValueError(f"kv_transfer latency_s must be >= 0; got {self.latency_s!r}")
        elif not (self.factor >= 1.0 and math.isfinite(self.factor)):
            raise ValueError(f"kv_transfer factor must be >= 1; got {self.factor!r}")

    def time_s(self, prompt_tokens, prefill_s):
        """:math:`T_x` in seconds of prompts of ``prompt_tokens`` whose prefill alone takes ``prefill_s``
        (array-aware, broadcast; 0 for an empty prompt)."""
        p = np.asarray(prompt_tokens, dtype=float)
        if self.model == "seed-factor":
            out = (self.factor - 1.0) * np.asarray(prefill_s, dtype=float) + 0.0 * p
        else:
            out = np.where(p > 0, self.latency_s + p * self.kv_bytes_per_token / self.bandwidth_bytes_per_s, 0.0)
            out = out + 0.0 * np.asarray(prefill_s, dtype=float)
        return np.array(out, dtype=float)


def kv_bytes_per_token(profile) -> float:
    r"""KV bytes of one token for the whole replica, :math:`\kappa`: what a prompt's transfer moves per token.

    .. math:: \kappa = k_{gpu} \cdot tp \quad (\text{sharded layout}), \qquad \kappa = k_{gpu} \quad (\text{replicated})

    from a computed profile's ``kv_bytes_per_token_per_gpu``
    (:func:`fleetopt.models.roofline.kv_bytes_per_token_per_gpu`) and its ``tp``. With more GPUs than KV heads
    a sharded layout replicates heads, and :math:`k_{gpu} \cdot tp` counts every copy: each rank sends its own
    copy over its own link in parallel, so with the aggregate bandwidth of :func:`link_bandwidth_bytes_per_s`
    (``tp`` links) the time is still one GPU's bytes over one link.
    A calibrated profile states no KV size per token: ``ValueError`` (pass ``kv_bytes_per_token`` to
    :class:`KVTransfer` directly).
    """
    per_gpu = getattr(profile, "kv_bytes_per_token_per_gpu", None)
    if per_gpu is None:
        raise ValueError(f"profile {profile.name}: no KV bytes per token (a calibrated profile); give the "
                         "kv_transfer's kv_bytes_per_token")
    tp = int(getattr(profile, "tp", profile.physical_gpus_per_replica))
    return float(per_gpu) * (tp if getattr(profile, "kv_layout", "sharded") == "sharded" else 1)


def link_bandwidth_bytes_per_s(*, same_node: bool, prefill_gpus: int, decode_gpus: int,
                               prefill_nvlink_bytes_per_s: float | None = None,
                               decode_nvlink_bytes_per_s: float | None = None,
                               prefill_network_bytes_per_s: float | None = None,
                               decode_network_bytes_per_s: float | None = None) -> float:
    r"""The replica-to-replica bandwidth :math:`B` of the KV transfer (bytes/s).

    .. math:: B = \min(g_p \, b_p, \; g_d \, b_d)

    with :math:`g` the physical GPUs of a replica (``tp``) and :math:`b` each GPU's per-direction link: NVLink when
    both phases sit in one node (``same_node``; the caller checks that :math:`g_p + g_d` GPUs fit in one), else
    the inter-node network (one NIC per GPU, as on DGX/HGX H100 nodes with a 400 Gb/s ConnectX-7 per GPU). Each
    rank sends its shard over its own link in parallel, so the slower side's aggregate bounds the transfer.
    Bandwidths come from the hardware catalogue (``nvlink_bandwidth_bytes_per_s``,
    ``inter_node_bandwidth_bytes_per_s``); a missing one is a ``ValueError``.

    Examples
    --------
    TP=8 H100 prefill to TP=8 A100 decode over 50 GB/s NICs, and within one node over NVLink (450 and 300 GB/s):

    >>> link_bandwidth_bytes_per_s(same_node=False, prefill_gpus=8, decode_gpus=8,
    ...                            prefill_network_bytes_per_s=50e9, decode_network_bytes_per_s=50e9)
    400000000000.0
    >>> link_bandwidth_bytes_per_s(same_node=True, prefill_gpus=4, decode_gpus=4,
    ...                            prefill_nvlink_bytes_per_s=450e9, decode_nvlink_bytes_per_s=300e9)
    1200000000000.0
    """
    kind = "nvlink" if same_node else "network"
    bp, bd = ((prefill_nvlink_bytes_per_s, decode_nvlink_bytes_per_s) if same_node
              else (prefill_network_bytes_per_s, decode_network_bytes_per_s))
    if bp is None or bd is None or not (bp > 0 and bd > 0):
        raise ValueError(f"the KV transfer needs both sides' {kind} bandwidth (> 0); got prefill {bp!r}, "
                         f"decode {bd!r}")
    if prefill_gpus < 1 or decode_gpus < 1:
        raise ValueError("prefill_gpus and decode_gpus must be >= 1")
    return float(min(prefill_gpus * bp, decode_gpus * bd))


# ----------------------------------------------------------------------------------------------- traffic

_GL_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _gauss_legendre(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    if nodes not in _GL_CACHE:
        _GL_CACHE[nodes] = np.polynomial.legendre.leggauss(nodes)
    return _GL_CACHE[nodes]


@dataclass(frozen=True, kw_only=True, eq=False)
class PhaseTraffic:
    r"""A segment's requests as a discrete law of (prompt, output) tokens, with their arrival rate.

    ``prompt_tokens``, ``output_tokens`` and ``probs`` have one entry per atom (shape (K,), probabilities summing
    to 1); ``arrival_rate`` is the segment's rate (req/s) and ``rate_share`` its share of the workload's requests.
    Build it with :meth:`from_distribution` (a CDF workload) or :meth:`from_trace`.
    """

    lo_tokens: float
    hi_tokens: float
    arrival_rate: float
    rate_share: float
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens", "probs"):
            object.__setattr__(self, name, np.atleast_1d(np.asarray(getattr(self, name), dtype=float)))
        k = len(self.probs)
        if k == 0 or len(self.prompt_tokens) != k or len(self.output_tokens) != k:
            raise ValueError("phase traffic needs at least one atom and one prompt and output per atom")
        if np.any(self.probs < 0) or abs(float(self.probs.sum()) - 1.0) > 1e-9:
            raise ValueError("phase traffic probabilities must be >= 0 and sum to 1")
        if np.any(self.prompt_tokens < 0) or np.any(self.output_tokens < 0):
            raise ValueError("phase traffic token counts must be >= 0")
        if not (self.arrival_rate >= 0 and math.isfinite(self.arrival_rate)):
            raise ValueError(f"phase traffic arrival_rate must be >= 0; got {self.arrival_rate!r}")
        if not self.hi_tokens > self.lo_tokens >= 0:
            raise ValueError(f"a segment needs 0 <= lo < hi; got ({self.lo_tokens}, {self.hi_tokens}]")

    @classmethod
    def from_distribution(cls, workload: LengthDistribution, lo_tokens: float, hi_tokens: float,
                          arrival_rate: float, *, input_fraction: float = DEFAULT_INPUT_FRACTION,
                          chunk_tokens=(), nodes: int = 3) -> PhaseTraffic:
        r"""The requests of a CDF workload of total rate ``arrival_rate`` whose length :math:`L` lies in
        :math:`(lo, hi]`, with :math:`l_{in} = fL` and :math:`l_{out} = (1 - f)L`.

        The law is piecewise uniform (:class:`~fleetopt.models.workload.LengthDistribution`); it is cut at the
        segment's ends, its own breakpoints and the lengths where the prompt crosses a multiple of each chunk in
        ``chunk_tokens`` (:math:`L = mc/f`), and each piece becomes ``nodes`` Gauss-Legendre atoms. Moments of a
        polynomial of degree up to :math:`2\,nodes - 1` in :math:`L` on a piece of constant chunk count are exact
        (the prefill time, the decode context sum :math:`X_d`); atoms of the law are kept as they are.

        Examples
        --------
        Uniform lengths on (0, 1000], the segment (0, 500] at 10 req/s: half the requests, mean 250 tokens.

        >>> d = LengthDistribution.from_cdf([(1000, 1.0)])
        >>> t = PhaseTraffic.from_distribution(d, 0, 500, 10.0)
        >>> round(t.arrival_rate, 12), round(t.mean_prompt_tokens + t.mean_output_tokens, 9)
        (5.0, 250.0)
        """
        if not 0.0 < input_fraction < 1.0:
            raise ValueError(f"input_fraction must lie in (0, 1); got {input_fraction}")
        if nodes < 1:
            raise ValueError("nodes must be >= 1")
        lo, hi, f = float(lo_tokens), float(hi_tokens), float(input_fraction)
        d = workload
        live = d.prob > 0
        pieces = live & (d.hi_tokens > d.lo_tokens)
        plo, phi, pp = d.lo_tokens[pieces], d.hi_tokens[pieces], d.prob[pieces]
        chunk_cuts = [np.arange(1, int(np.ceil(f * hi / c)) + 1) * c / f
                      for c in np.atleast_1d(np.asarray(chunk_tokens, dtype=float)) if c > 0]
        cuts = unique(np.concatenate([[lo, hi], plo, phi, *chunk_cuts]))
        cuts = cuts[(cuts >= lo) & (cuts <= hi)]
        u, v = cuts[:-1], cuts[1:]
        mid, half = (u + v) / 2.0, (v - u) / 2.0
        dens = ((mid[:, None] > plo) & (mid[:, None] < phi)) @ (pp / (phi - plo)) if len(pp) else np.zeros(len(mid))
        x, w = _gauss_legendre(nodes)
        L = (mid[:, None] + half[:, None] * x[None, :]).ravel()
        wt = ((half * dens)[:, None] * w[None, :]).ravel()
        atoms = live & (d.hi_tokens <= d.lo_tokens) & (d.hi_tokens > lo) & (d.hi_tokens <= hi)
        L = np.concatenate((L, d.hi_tokens[atoms]))
        wt = np.concatenate((wt, d.prob[atoms]))
        keep = wt > 0
        L, wt = L[keep], wt[keep]
        share = float(wt.sum())
        if share <= 0:
            return cls._empty(lo, hi)
        return cls(lo_tokens=lo, hi_tokens=hi, arrival_rate=float(arrival_rate) * share, rate_share=share,
                   prompt_tokens=f * L, output_tokens=(1.0 - f) * L, probs=wt / share)

    @classmethod
    def from_trace(cls, trace: RequestTrace, lo_tokens: float, hi_tokens: float,
                   arrival_rate: float | None = None) -> PhaseTraffic:
        """The trace's requests whose total length lies in :math:`(lo, hi]`, one atom per distinct (prompt, output)
        pair; the rate is ``arrival_rate`` (default: the trace's own mean rate) times their share."""
        total = trace.total_tokens
        sel = (total > lo_tokens) & (total <= hi_tokens)
        share = float(np.mean(sel))
        if share <= 0:
            return cls._empty(float(lo_tokens), float(hi_tokens))
        pairs, counts = np.unique(np.column_stack((trace.prompt_tokens[sel], trace.output_tokens[sel])).astype(float),
                                  axis=0, return_counts=True)
        rate = trace.mean_rate_req_per_s if arrival_rate is None else float(arrival_rate)
        return cls(lo_tokens=float(lo_tokens), hi_tokens=float(hi_tokens), arrival_rate=float(rate) * share,
                   rate_share=share, prompt_tokens=pairs[:, 0], output_tokens=pairs[:, 1],
                   probs=counts / counts.sum())

    @classmethod
    def _empty(cls, lo: float, hi: float) -> PhaseTraffic:
        """A segment without requests: one empty atom at rate 0 (its stations need ``min_count`` replicas)."""
        return cls(lo_tokens=lo, hi_tokens=hi, arrival_rate=0.0, rate_share=0.0, prompt_tokens=np.zeros(1),
                   output_tokens=np.zeros(1), probs=np.ones(1))

    @property
    def mean_prompt_tokens(self) -> float:
        return float(self.probs @ self.prompt_tokens)

    @property
    def mean_output_tokens(self) -> float:
        return float(self.probs @ self.output_tokens)

    @property
    def cv2_output(self) -> float:
        """Squared coefficient of variation of the output tokens (0 without output)."""
        return _cv2(self.probs, self.output_tokens)

    @property
    def decode_context_sum_tokens(self) -> np.ndarray:
        r""":math:`X_d = l_{out} l_{in} + l_{out}(l_{out} - 1)/2` per atom: the contexts a request's decode
        iterations start from, summed (:func:`fleetopt.models.segments.compute_work`'s :math:`X_d`)."""
        o = self.output_tokens
        return o * self.prompt_tokens + o * (o - 1.0) / 2.0

    @property
    def mean_decode_context_tokens(self) -> float:
        r"""The time-average context of a decode slot, :math:`\bar x = E[X_d] / E[l_{out}]`.

        A request's context grows from :math:`l_{in}` to :math:`l_{in} + l_{out} - 1` over its :math:`l_{out}`
        decode iterations; a slot spends one iteration per token, so the context an iteration sees, averaged over
        the slot's iterations, is the output-weighted mean :math:`E[X_d]/E[l_{out}]` (for one request
        :math:`l_{in} + (l_{out} - 1)/2`). 0 without output.
        """
        m = self.mean_output_tokens
        return float(self.probs @ self.decode_context_sum_tokens / m) if m > 0 else 0.0


# ----------------------------------------------------------------------------------------------- prefill


def prefill_components_s(profile: ServingProfile, prompt_tokens, chunk_tokens: int | None = None):
    r"""A prompt's prefill alone on an idle replica, split into weight streaming, KV scan and compute (seconds;
    array-aware).

    .. math::

        S_p = \underbrace{k W}_{\text{weights}} + \underbrace{h c \frac{k(k-1)}{2}}_{\text{KV scan}}
              + \underbrace{a\, l_{in} + b\, l_{in}^2}_{\text{compute}}, \qquad k = \lceil l_{in}/c \rceil

    the iteration-time model (:func:`fleetopt.models.service.compute_coefficients`): chunk :math:`j` scans the
    prefix :math:`jc` and computes its share of the prompt (even-chunk convention). It is the batched model's
    prefill on an idle replica (:func:`fleetopt.models.queueing.batched.prefill_limit_s`) and the simulator's.
    ``chunk_tokens`` overrides the profile's chunk (a prefill pool may run a larger per-iteration token budget).
    Returns ``(weights_s, kv_s, compute_s)``.

    Examples
    --------
    >>> import types
    >>> p = types.SimpleNamespace(W_s=0.01, H_s=8.0e-3, calibration_ctx_tokens=8192, g_s=0.0, chunk_tokens=512,
    ...                           prefill_a_s=1e-5, prefill_b_s=0.0, name="toy")
    >>> [round(float(x), 9) for x in prefill_components_s(p, 1200)]   # k = 3: 3 W, h 512 (0 + 1 + 2), 1200 a
    [0.03, 0.0015, 0.012]
    """
    W, h = iteration_coefficients(profile)
    _, a, b = compute_coefficients(profile)
    c = float(profile.chunk_tokens if chunk_tokens is None else chunk_tokens)
    if not c >= 1:
        raise ValueError(f"chunk_tokens must be >= 1; got {chunk_tokens!r}")
    P = np.asarray(prompt_tokens, dtype=float)
    k = np.ceil(P / c)
    return k * W, h * c * k * (k - 1.0) / 2.0, a * P + b * P * P


def prefill_service_s(profile: ServingProfile, prompt_tokens, chunk_tokens: int | None = None):
    """:math:`S_p`, a prompt's prefill alone on an idle replica (s; the sum of :func:`prefill_components_s`)."""
    w, kv, comp = prefill_components_s(profile, prompt_tokens, chunk_tokens)
    return w + kv + comp


def _replicas(replicas) -> np.ndarray:
    n = np.asarray(replicas, dtype=float)
    if np.any(n < 0) or np.any(n != np.floor(n)):
        raise ValueError("replica counts must be whole numbers >= 0")
    return n


@dataclass(frozen=True, kw_only=True, eq=False)
class PrefillStation:
    r"""A prefill pool: :math:`N_p` replicas each serving one prompt at a time, FIFO from one queue (M/G/c,
    :math:`c = N_p`).

    **One prompt at a time.** In the iteration-time model a prefill iteration carrying chunks :math:`c_j` costs
    :math:`W + \sum_j (h p_j + a c_j + b((p_j + c_j)^2 - p_j^2))`: only :math:`W` is shared, the compute adds up.
    A compute-bound replica therefore gains at most :math:`W / (W + a c)` of a chunk's time by running several
    prompts' chunks together, while every prompt in the iteration finishes later; and under vLLM's per-iteration
    token budget (``max_num_batched_tokens``) batching only fills a prompt's last, partial chunk. Serving prompts
    one at a time is conservative by at most that share (for the catalogue's roofline profiles at a 512-token chunk,
    :math:`W/(W + ac)` is 0.19-0.34; at 2,048 tokens 0.06-0.11). Profiles without compute terms (the seeds'
    calibrated units, whose constants describe decode iterations) have :math:`a = b = 0`: their prefill-only
    iterations are pure weight streaming, so this model is no faithful prefill model for them
    (:func:`reference_disagg` holds the reference's convention).

    **Queue.** Each prompt holds a replica for :math:`S_p` (:func:`prefill_service_s`), so the wait is the M/G/c wait
    of :mod:`fleetopt.models.queueing.erlang` with :math:`c = N_p`, offered load :math:`a = \lambda E[S_p]`:
    an atom :math:`1 - C(c, a)` at zero and the tail :math:`C e^{-\theta x}`,
    :math:`\theta = 2(c/E[S_p] - \lambda)/(1 + c_s^2)` (exact for M/M/c, Kimura's approximation otherwise; its mean
    :math:`C/\theta` is the Pollaczek-Khinchine mean for :math:`c = 1`). With the atoms :math:`\tau_k = S_{p,k} +
    T_{x,k}` of prefill plus transfer,

    .. math:: P(\mathrm{TTFT} > t) = \sum_k p_k \, P(W_q > t - \tau_k)

    (:func:`fleetopt.models.queueing.erlang.ttft_miss_prob`, ``tail``).

    Build it with :meth:`from_profile`; every method taking ``replicas`` broadcasts over an array of counts.
    """

    name: str
    arrival_rate: float
    prompt_tokens: np.ndarray
    probs: np.ndarray
    service_s: np.ndarray
    """:math:`S_p` per atom (s)."""
    transfer_s: np.ndarray
    """:math:`T_x` per atom (s)."""
    idle_power_w: float
    """Power of a replica without a prompt (W)."""
    busy_power_w: float
    """Mean power of a replica while it prefills (W)."""
    cost_usd_per_hr: float
    """Price of one replica."""
    gpus_per_replica: int
    physical_gpus_per_replica: int

    @classmethod
    def from_profile(cls, profile: ServingProfile, traffic: PhaseTraffic, transfer: KVTransfer, *,
                     chunk_tokens: int | None = None) -> PrefillStation:
        r"""The prefill pool of ``profile`` for ``traffic``, with ``transfer`` after each prompt.

        **Power.** A busy replica's mean power is the energy of its prefill iterations over their time. Under an
        activity power model (:class:`~fleetopt.models.power.ActivityPower`: a fitted profile's ``power``, a computed
        one's ``activity_power``) that is the power of the mean prompt's weight / KV-scan / compute seconds,
        capped at the board limit; under a power curve of the batch alone (the seeds' units) it is the curve at a
        batch of :math:`c` (a chunk computes as many tokens as :math:`c` decode sequences). An idle replica draws
        its idle power.
        """
        c = int(profile.chunk_tokens if chunk_tokens is None else chunk_tokens)
        w, kv, comp = prefill_components_s(profile, traffic.prompt_tokens, c)
        service = w + kv + comp
        transfer_s = transfer.time_s(traffic.prompt_tokens, service)
        power = profile.power
        activity = power if isinstance(power, ActivityPower) else getattr(profile, "activity_power", None)
        if isinstance(activity, ActivityPower):
            p = traffic.probs
            busy = float(activity.iteration_power_w(p @ w, p @ kv, p @ comp))
            idle = float(activity.idle_w)
        else:
            curve = cast(PowerCurve, power)
            busy, idle = float(curve.power_w(float(c))), float(curve.power_w(0.0))
        return cls(name=profile.name, arrival_rate=float(traffic.arrival_rate), prompt_tokens=traffic.prompt_tokens,
                   probs=traffic.probs, service_s=np.asarray(service, dtype=float), transfer_s=transfer_s,
                   idle_power_w=idle, busy_power_w=busy, cost_usd_per_hr=float(profile.cost_usd_per_hr),
                   gpus_per_replica=int(profile.gpus_per_replica),
                   physical_gpus_per_replica=int(profile.physical_gpus_per_replica))

    # ---- the service law
    @property
    def mean_service_s(self) -> float:
        """:math:`E[S_p]`."""
        return float(self.probs @ self.service_s)

    @property
    def cv2_service(self) -> float:
        """:math:`c_s^2 = E[S_p^2]/E[S_p]^2 - 1` (0 for an empty segment)."""
        return _cv2(self.probs, self.service_s)

    @property
    def ttft_atoms_s(self) -> np.ndarray:
        r""":math:`\tau_k = S_{p,k} + T_{x,k}`: TTFT of each atom without a wait."""
        return self.service_s + self.transfer_s

    @property
    def mean_transfer_s(self) -> float:
        return float(self.probs @ self.transfer_s)

    @property
    def offered_load_erlangs(self) -> float:
        r""":math:`a = \lambda E[S_p]`: busy replicas on average."""
        return self.arrival_rate * self.mean_service_s

    @property
    def ttft_floor_s(self) -> float:
        """The P99 of :math:`\\tau` (prefill plus transfer): the P99 TTFT as :math:`N_p \\to \\infty`."""
        order = np.argsort(self.ttft_atoms_s, kind="stable")
        return prefill_p99_s(self.ttft_atoms_s[order], self.probs[order])

    # ---- per replica count
    def _queue(self, replicas):
        n = _replicas(replicas)
        flat = np.maximum(n.ravel(), 1.0)
        es = self.mean_service_s if self.mean_service_s > 0 else 1.0
        probs = np.broadcast_to(self.probs, (flat.size, len(self.probs)))
        return n, flat, es, probs

    def utilization(self, replicas) -> np.ndarray:
        r""":math:`\rho = \lambda E[S_p] / N_p` (inf at 0 replicas with traffic)."""
        n = _replicas(replicas)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n > 0, self.offered_load_erlangs / np.where(n > 0, n, 1.0),
                            np.inf if self.offered_load_erlangs > 0 else 0.0)

    def wait_prob(self, replicas) -> np.ndarray:
        """:math:`C(N_p, \\lambda E[S_p])`, the share of prompts that queue (1 where unstable or no replica)."""
        n = _replicas(replicas)
        out = np.asarray(erlang_c(np.maximum(n, 1.0), np.broadcast_to(self.offered_load_erlangs, n.shape)), dtype=float)
        return np.where(n > 0, out, 1.0 if self.arrival_rate > 0 else 0.0)

    def mean_wait_s(self, replicas) -> np.ndarray:
        r""":math:`E[W_q] = C/\theta` (inf where unstable): for M/M/c the exact :math:`C/(c\mu - \lambda)`, for
        M/G/1 the Pollaczek-Khinchine mean :math:`\lambda E[S^2] / (2(1 - \rho))`."""
        n = _replicas(replicas)
        C = self.wait_prob(n)
        es = self.mean_service_s if self.mean_service_s > 0 else 1.0
        theta = np.asarray(wait_decay_rate(np.maximum(n, 1.0), self.arrival_rate, es, self.cv2_service), dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(theta > 0, C / np.where(theta > 0, theta, 1.0), np.inf)
        return np.where((C > 0) & (n > 0), out, np.where(n > 0, 0.0, np.inf if self.arrival_rate > 0 else 0.0))

    def mean_ttft_s(self, replicas) -> np.ndarray:
        """:math:`E[W_q] + E[S_p] + E[T_x]`."""
        return self.mean_wait_s(replicas) + self.mean_service_s + self.mean_transfer_s

    def mean_in_system(self, replicas) -> np.ndarray:
        """Prompts queued or in prefill on average, :math:`\\lambda (E[W_q] + E[S_p])` (Little's law)."""
        return self.arrival_rate * (self.mean_wait_s(replicas) + self.mean_service_s)

    def miss_probability(self, t_s, replicas) -> np.ndarray:
        r""":math:`P(\mathrm{TTFT} > t)` at each count (1 where unstable or, with traffic, without a replica), the
        quantity the fleet-scope SLO weighs by the rate and adds up over pools. ``t_s`` is a scalar."""
        n, flat, es, probs = self._queue(replicas)
        tau = self.ttft_atoms_s
        p = ttft_miss_prob(float(t_s), flat, self.arrival_rate, es, self.cv2_service, tau, probs,
                           self.probs @ tau, "tail")
        if self.arrival_rate > 0:
            p = np.where(n.ravel() > 0, p, 1.0)
        return p.reshape(n.shape)

    def miss_function(self, replicas):
        r""":math:`t \mapsto P(\mathrm{TTFT} > t)` at ``replicas`` (:meth:`miss_probability` with ``replicas`` fixed),
        for a search over :math:`t` such as the fleet-wide P99."""
        return lambda t_s: self.miss_probability(t_s, replicas)

    def p99_ttft_s(self, replicas) -> np.ndarray:
        """P99 TTFT at each count (s; inf where unstable or without a replica)."""
        n, flat, es, probs = self._queue(replicas)
        tau = self.ttft_atoms_s
        out = np.asarray(ttft_p99_s(flat, self.arrival_rate, es, self.cv2_service, tau, probs, self.probs @ tau,
                                    model="tail"), dtype=float)
        out = np.where(n.ravel() > 0, out, np.inf)
        return out.reshape(n.shape)

    def power_w(self, replicas) -> np.ndarray:
        r"""Pool power: :math:`N_p [(1 - u) P_{idle} + u P_{busy}]`, :math:`u = \min(\rho, 1)` (W)."""
        n = _replicas(replicas)
        u = np.minimum(self.utilization(n), 1.0)
        return n * ((1.0 - u) * self.idle_power_w + u * self.busy_power_w)

    def pool_cost_usd_per_hr(self, replicas) -> np.ndarray:
        return _replicas(replicas) * self.cost_usd_per_hr

    def min_replicas(self, slo_s: float, *, rho_max: float = 0.85, margin: float = 0.0, min_count: int = 1) -> Sizing:
        r"""The least :math:`N_p` with P99 TTFT at most :math:`(1 - m)\,T_{SLO}` and :math:`\rho \le \rho_{max}`
        (:func:`fleetopt.models.queueing.erlang.min_replicas`, ``tail``, one server per replica; ``margin``
        :math:`m` is the sizing margin, ``slo.ttft_margin``). Infeasible (``reason`` ``prefill``) where prefill plus
        transfer alone break the target at any count; a segment without traffic needs ``min_count``."""
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must lie in [0, 1); got {margin}")
        tau = self.ttft_atoms_s
        es = self.mean_service_s if self.mean_service_s > 0 else 1.0
        return min_replicas([self.arrival_rate], [es], [self.cv2_service], 1, [slo_s * (1.0 - margin)], tau,
                            self.probs[None, :], [float(self.probs @ tau)], rho_max, "tail", min_count)


# ----------------------------------------------------------------------------------------------- decode


@dataclass(frozen=True, kw_only=True, eq=False)
class DecodeStation:
    r"""A decode pool: :math:`N_d` replicas running decode-only continuous batches of at most :math:`n` sequences.

    A request arrives after its transfer and holds a slot for its :math:`l_{out}` decode iterations. An iteration
    of :math:`b` sequences whose contexts average :math:`\bar x` takes

    .. math:: t(b) = W + b\,(h \bar x + g)

    and with :math:`r = \lambda E[l_{out}] / N_d` output tokens per second per replica (join-the-shortest-queue
    spreads the requests evenly), the mean batch solves :math:`b = r\, t(b)` (Little's law over token slots):

    .. math::

        \bar b = \frac{r W}{1 - r (h \bar x + g)}, \qquad \bar t = \frac{W}{1 - r(h \bar x + g)},
        \qquad \text{stable iff } r (h \bar x + g) < 1

    with :math:`\bar x = E[X_d]/E[l_{out}]` the time-average context of a slot
    (:attr:`PhaseTraffic.mean_decode_context_tokens`); :math:`\bar t` is then the mean time per output token. The
    batch cap is :math:`n = \min(n_{slots}(hi), n_{TPOT})` (KV slots at the window,
    :func:`fleetopt.models.service.tpot_batch_cap`, and ``max_num_seqs``), and the TPOT bound is the iteration of
    :math:`n` sequences at the window, :func:`fleetopt.models.service.tpot_bound_s`, as for aggregated pools.

    **Slots.** When every one of the pool's :math:`N_d n` slots is taken each replica runs a full batch, and a
    slot is held for :math:`S_d = l_{out}\, t(n)`; an arrival then waits. The decode queue is a delay system, so
    the share that waits is Erlang C (not B: vLLM queues a request, it does not drop it),

    .. math:: P(\text{wait}) = C\left(N_d n, \; \lambda E[l_{out}]\, t(n)\right)

    conservative twice: :math:`t(n) \ge \bar t`, and Erlang C exceeds the loss probability B. The wait delays the
    second token (TPOT), not the first (TTFT).
    """

    name: str
    arrival_rate: float
    window_tokens: float
    weights_s: float
    """:math:`W`."""
    context_s_per_token: float
    """:math:`h`."""
    compute_s_per_seq: float
    """:math:`g`."""
    mean_output_tokens: float
    cv2_output: float
    mean_context_tokens: float
    r""":math:`\bar x`."""
    kv_slots: int
    """KV slots per replica at the window, :math:`n_{slots}(hi)`."""
    cap: int
    """Batch cap per replica, :math:`n` (0: none fits the KV cache or the TPOT SLO)."""
    tpot_bound_s: float
    """:math:`t(n, hi)` (at one sequence where :math:`n = 0`)."""
    power: PowerCurve | DecodePower
    """Power of a replica against its batch: ``power_w(batch)`` (:func:`fleetopt.models.service.decode_power_curve`
    at :math:`\\bar x`)."""
    cost_usd_per_hr: float
    gpus_per_replica: int
    physical_gpus_per_replica: int

    @classmethod
    def from_profile(cls, profile: ServingProfile, traffic: PhaseTraffic, *, window_tokens: float | None = None,
                     tpot_slo_s: float | None = None, max_num_seqs: int | None = None) -> DecodeStation:
        """The decode pool of ``profile`` for ``traffic`` at ``window_tokens`` (default the segment's ``hi``)."""
        window = float(traffic.hi_tokens if window_tokens is None else window_tokens)
        slots = int(profile.n_slots(int(window)))
        cap = slots if max_num_seqs is None else min(slots, int(max_num_seqs))
        if tpot_slo_s is not None:
            cap = min(cap, int(tpot_batch_cap(profile, window, tpot_slo_s)))
        W, h = iteration_coefficients(profile)
        g, _, _ = compute_coefficients(profile)
        xbar = traffic.mean_decode_context_tokens
        return cls(name=profile.name, arrival_rate=float(traffic.arrival_rate), window_tokens=window, weights_s=W,
                   context_s_per_token=h, compute_s_per_seq=g, mean_output_tokens=traffic.mean_output_tokens,
                   cv2_output=traffic.cv2_output, mean_context_tokens=xbar, kv_slots=slots, cap=max(cap, 0),
                   tpot_bound_s=float(tpot_bound_s(profile, max(cap, 1), window)),
                   power=decode_power_curve(profile, xbar), cost_usd_per_hr=float(profile.cost_usd_per_hr),
                   gpus_per_replica=int(profile.gpus_per_replica),
                   physical_gpus_per_replica=int(profile.physical_gpus_per_replica))

    @property
    def per_seq_s(self) -> float:
        r""":math:`h \bar x + g`: what one sequence adds to an iteration (s)."""
        return self.context_s_per_token * self.mean_context_tokens + self.compute_s_per_seq

    @property
    def output_tok_per_s(self) -> float:
        r""":math:`\lambda E[l_{out}]`."""
        return self.arrival_rate * self.mean_output_tokens

    def iteration_s(self, batch) -> np.ndarray:
        r""":math:`t(b) = W + b(h\bar x + g)` (array-aware)."""
        return self.weights_s + np.asarray(batch, dtype=float) * self.per_seq_s

    def token_rate_per_replica(self, replicas) -> np.ndarray:
        r""":math:`r = \lambda E[l_{out}] / N_d` (inf at 0 replicas with traffic)."""
        n = _replicas(replicas)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n > 0, self.output_tok_per_s / np.where(n > 0, n, 1.0),
                            np.inf if self.output_tok_per_s > 0 else 0.0)

    def stable(self, replicas) -> np.ndarray:
        r""":math:`r(h\bar x + g) < 1`."""
        return self.token_rate_per_replica(replicas) * self.per_seq_s < 1.0

    def mean_iteration_s(self, replicas) -> np.ndarray:
        r""":math:`\bar t = W / (1 - r(h\bar x + g))`, the mean time per output token (inf where unstable)."""
        r = self.token_rate_per_replica(replicas)
        load = r * self.per_seq_s
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(load < 1.0, self.weights_s / np.where(load < 1.0, 1.0 - load, 1.0), np.inf)

    def mean_batch(self, replicas) -> np.ndarray:
        r""":math:`\bar b = r \bar t`, sequences per replica (inf where unstable)."""
        r = self.token_rate_per_replica(replicas)
        t = self.mean_iteration_s(replicas)
        with np.errstate(invalid="ignore"):
            return np.where(np.isfinite(t), r * np.where(np.isfinite(t), t, 0.0), np.inf)

    def mean_residence_s(self, replicas) -> np.ndarray:
        r""":math:`E[l_{out}]\,\bar t`, a request's mean time in decode (Little: :math:`N_d \bar b = \lambda` times
        it)."""
        return self.mean_output_tokens * self.mean_iteration_s(replicas)

    def utilization(self, replicas) -> np.ndarray:
        r""":math:`\bar b / n`: the share of batch places in use (inf where unstable or :math:`n = 0`)."""
        b = self.mean_batch(replicas)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.cap > 0, b / max(self.cap, 1), np.where(b > 0, np.inf, 0.0))

    @property
    def full_slot_hold_s(self) -> float:
        r""":math:`E[S_d] = E[l_{out}]\, t(n)`: a slot's holding time in a full pool."""
        return self.mean_output_tokens * float(self.iteration_s(self.cap))

    def slot_wait_prob(self, replicas) -> np.ndarray:
        r""":math:`C(N_d n, \lambda E[l_{out}] t(n))`: the share of requests that find every slot taken (1 where
        the slots cannot carry the load)."""
        n = _replicas(replicas)
        servers = n * self.cap
        if self.arrival_rate <= 0:
            return np.zeros(n.shape)
        a = self.arrival_rate * self.full_slot_hold_s
        out = np.asarray(erlang_c(np.maximum(servers, 1.0), np.broadcast_to(a, n.shape)), dtype=float)
        return np.where(servers >= 1, out, 1.0)

    def mean_slot_wait_s(self, replicas) -> np.ndarray:
        r""":math:`C/\theta` with :math:`\theta = 2(N_d n / E[S_d] - \lambda)/(1 + c_s^2)` and :math:`c_s^2` of
        :math:`l_{out}` (the M/G/c mean wait of :mod:`fleetopt.models.queueing.erlang`; inf where unstable)."""
        n = _replicas(replicas)
        C = self.slot_wait_prob(n)
        hold = self.full_slot_hold_s if self.full_slot_hold_s > 0 else 1.0
        theta = np.asarray(wait_decay_rate(np.maximum(n * self.cap, 1.0), self.arrival_rate, hold, self.cv2_output))
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(theta > 0, C / np.where(theta > 0, theta, 1.0), np.inf)
        return np.where(C > 0, out, 0.0)

    def power_w(self, replicas) -> np.ndarray:
        r"""Pool power :math:`N_d\, E[P(\min(b, n))]` with the batch :math:`b` Poisson of mean :math:`\bar b`
        (:func:`fleetopt.models.queueing.batched.mean_power_w`, the aggregated pools' rule) on the profile's decode
        power at :math:`\bar x` (W; the cap's power where unstable)."""
        n = _replicas(replicas)
        b = np.minimum(self.mean_batch(n), float(max(self.cap, 1)))
        op = cast(OperatingPoint, _Batch(mean_batch=b.ravel()))
        per = mean_power_w(self.power.power_w, op, float(max(self.cap, 1)))
        return n * np.asarray(per).reshape(n.shape)

    def pool_cost_usd_per_hr(self, replicas) -> np.ndarray:
        return _replicas(replicas) * self.cost_usd_per_hr

    def min_replicas(self, *, rho_max: float = 0.85, wait_prob_max: float = P99_TAIL, min_count: int = 1) -> Sizing:
        r"""The least :math:`N_d` with :math:`\bar b \le \rho_{max} n` and :math:`P(\text{wait}) \le` ``wait_prob_max``.

        The utilisation bound has a closed form: with :math:`m = \rho_{max} n`,
        :math:`\bar b \le m \iff r\,(W + m(h\bar x + g)) \le m`, so

        .. math:: N_\rho = \left\lceil \lambda E[l_{out}]\, t(m) / m \right\rceil

        and the slot condition (decreasing in :math:`N_d`) is searched from there by doubling and bisection.
        ``reason``: ``no-slots`` (no sequence of the window fits the KV cache), ``tpot`` (one sequence at the window
        already breaks the TPOT SLO), ``cap`` (no count below :math:`10^7`).
        """
        if not 0.0 < rho_max <= 1.0:
            raise ValueError(f"rho_max must lie in (0, 1]; got {rho_max}")
        if not 0.0 < wait_prob_max <= 1.0:
            raise ValueError(f"wait_prob_max must lie in (0, 1]; got {wait_prob_max}")

        def sizing(n: int, ok: bool, reason: str, bound: bool = False) -> Sizing:
            return Sizing(np.array([n], dtype=np.int64), np.array([ok]), np.array([reason]), np.array([bound]))

        if self.cap < 1:
            return sizing(0, False, "no-slots" if self.kv_slots < 1 else "tpot")
        if self.output_tok_per_s <= 0:
            return sizing(min_count, True, "")
        m = rho_max * self.cap
        n_rho = max(math.ceil(self.output_tok_per_s * float(self.iteration_s(m)) / m * (1 - 1e-12)), min_count)

        def ok(n: int) -> bool:
            return bool(self.slot_wait_prob(n) <= wait_prob_max * (1 + 1e-12))

        hi = n_rho
        while not ok(hi):
            if hi >= _MAX_REPLICAS:
                return sizing(0, False, "cap")
            hi = min(2 * hi, _MAX_REPLICAS)
        lo = max(hi // 2, n_rho - 1) if hi > n_rho else n_rho - 1
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return sizing(hi, True, "", hi == n_rho)


_MAX_REPLICAS = 10**7


@dataclass(frozen=True)
class _Batch:
    """The one field of an operating point :func:`fleetopt.models.queueing.batched.mean_power_w` reads."""

    mean_batch: np.ndarray


# ----------------------------------------------------------------------------------------------- many segments


def stack_traffic(traffics) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The atoms of several segments' :class:`PhaseTraffic` as rows: ``(arrival_rate (S,), prompt_tokens (S, K),
    output_tokens (S, K), probs (S, K))``, each row padded with empty atoms (0 tokens, probability 0) to the
    longest; an empty atom adds nothing to any sum, mean or tail of the station models."""
    rows = list(traffics)
    k = max(len(t.probs) for t in rows)
    out = np.zeros((3, len(rows), k))
    for r, t in enumerate(rows):
        m = len(t.probs)
        out[0, r, :m], out[1, r, :m], out[2, r, :m] = t.prompt_tokens, t.output_tokens, t.probs
    return np.array([t.arrival_rate for t in rows], dtype=float), out[0], out[1], out[2]


def stack_distribution(workload: LengthDistribution, lo_tokens, hi_tokens, arrival_rate: float, *,
                       input_fraction: float = DEFAULT_INPUT_FRACTION, chunk_tokens=(), nodes: int = 3):
    r""":func:`stack_traffic` of :meth:`PhaseTraffic.from_distribution` for the segments
    :math:`(lo_s, hi_s]` (arrays ``lo_tokens``, ``hi_tokens``), the same atoms, built without a law per segment.

    A segment's cuts are its ends and the points of one global set :math:`G` (the law's piece edges and the
    chunk cuts :math:`mc/f`) strictly inside it, so its pieces are a head :math:`(lo, g)`, a run of :math:`G`'s
    consecutive pieces and a tail :math:`(g', hi)`: the run's atoms are computed once for all segments, the heads
    once per distinct :math:`lo` and the tails once per distinct :math:`hi`.
    """
    if not 0.0 < input_fraction < 1.0:
        raise ValueError(f"input_fraction must lie in (0, 1); got {input_fraction}")
    if nodes < 1:
        raise ValueError("nodes must be >= 1")
    lo_s, hi_s = np.asarray(lo_tokens, dtype=float), np.asarray(hi_tokens, dtype=float)
    f, d = float(input_fraction), workload
    live = d.prob > 0
    pieces = live & (d.hi_tokens > d.lo_tokens)
    plo, phi, pp = d.lo_tokens[pieces], d.hi_tokens[pieces], d.prob[pieces]
    top = float(hi_s.max()) if len(hi_s) else 0.0
    chunk_cuts = [np.arange(1, int(np.ceil(f * top / c)) + 1) * c / f
                  for c in np.atleast_1d(np.asarray(chunk_tokens, dtype=float)) if c > 0]
    G = unique(np.concatenate([plo, phi, *chunk_cuts]))
    x, w = _gauss_legendre(nodes)
    slope = pp / (phi - plo)

    def atoms(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Atoms of the pieces (u, v): ``(L, weight)``, shape (pieces, nodes), as from_distribution makes them."""
        mid, half = (u + v) / 2.0, (v - u) / 2.0
        dens = ((mid[:, None] > plo) & (mid[:, None] < phi)) @ slope if len(pp) else np.zeros(len(mid))
        return mid[:, None] + half[:, None] * x[None, :], (half * dens)[:, None] * w[None, :]

    run_L, run_w = atoms(G[:-1], G[1:])
    lows, highs = unique(lo_s), unique(hi_s)
    s_of = np.searchsorted(G, lows, side="right")
    e_of = np.searchsorted(G, highs, side="left")
    head = atoms(lows, G[np.minimum(s_of, len(G) - 1)]) if len(G) else None
    tail = atoms(G[np.maximum(e_of - 1, 0)], highs) if len(G) else None
    point = live & (d.hi_tokens <= d.lo_tokens)
    pL, pw = d.hi_tokens[point], d.prob[point]
    rows = []
    seg_a, seg_z = np.searchsorted(lows, lo_s).tolist(), np.searchsorted(highs, hi_s).tolist()
    for lo, hi, a, z in zip(lo_s.tolist(), hi_s.tolist(), seg_a, seg_z):
        s, e = int(s_of[a]), int(e_of[z])
        if e > s:                                   # then G has points: heads and tails exist
            assert head is not None and tail is not None
            Ls = [head[0][a], run_L[s:e - 1].ravel(), tail[0][z]]
            ws = [head[1][a], run_w[s:e - 1].ravel(), tail[1][z]]
        else:
            one_L, one_w = atoms(np.array([lo]), np.array([hi]))
            Ls, ws = [one_L[0]], [one_w[0]]
        here = (pL > lo) & (pL <= hi)
        L, wt = np.concatenate(Ls + [pL[here]]), np.concatenate(ws + [pw[here]])
        keep = wt > 0
        L, wt = L[keep], wt[keep]
        share = float(wt.sum())
        if share <= 0:
            rows.append((0.0, np.zeros(1), np.ones(1)))
        else:
            rows.append((float(arrival_rate) * share, L, wt / share))
    k = max(len(r[1]) for r in rows)
    out = np.zeros((3, len(rows), k))
    for r, (_, L, p) in enumerate(rows):
        out[0, r, :len(L)], out[1, r, :len(L)], out[2, r, :len(L)] = f * L, (1.0 - f) * L, p
    return np.array([r[0] for r in rows], dtype=float), out[0], out[1], out[2]


def _row_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a, b)


_SIZING_GROUPS = 6
"""Groups of rows :meth:`PrefillStations.min_replicas` sizes separately, by atom count (less padding per call)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class PrefillStations:
    r"""The prefill stations (:class:`PrefillStation`) of one profile for many segments at once: one row per
    segment, the same formulas as the single station, each over arrays (``arrival_rate`` (S,), atoms (S, K)).

    Build it with :meth:`from_profile` over :func:`stack_traffic`'s rows; :meth:`min_replicas` sizes every row in
    one call of :func:`fleetopt.models.queueing.erlang.min_replicas`.
    """

    arrival_rate: np.ndarray
    probs: np.ndarray
    service_s: np.ndarray
    transfer_s: np.ndarray
    idle_power_w: float
    busy_power_w: np.ndarray
    cost_usd_per_hr: float
    gpus_per_replica: int

    @classmethod
    def from_profile(cls, profile: ServingProfile, arrival_rate, prompt_tokens, probs, transfer: KVTransfer, *,
                     chunk_tokens: int | None = None) -> PrefillStations:
        """:meth:`PrefillStation.from_profile` row by row (its power rule included)."""
        c = int(profile.chunk_tokens if chunk_tokens is None else chunk_tokens)
        P, p = np.atleast_2d(np.asarray(prompt_tokens, dtype=float)), np.atleast_2d(np.asarray(probs, dtype=float))
        w, kv, comp = prefill_components_s(profile, P, c)
        service = w + kv + comp
        power = profile.power
        activity = power if isinstance(power, ActivityPower) else getattr(profile, "activity_power", None)
        if isinstance(activity, ActivityPower):
            busy = np.asarray(activity.iteration_power_w(_row_dot(p, w), _row_dot(p, kv), _row_dot(p, comp)),
                              dtype=float)
            idle = float(activity.idle_w)
        else:
            curve = cast(PowerCurve, power)
            busy, idle = np.full(len(P), float(curve.power_w(float(c)))), float(curve.power_w(0.0))
        return cls(arrival_rate=np.asarray(arrival_rate, dtype=float), probs=p, service_s=service,
                   transfer_s=np.asarray(transfer.time_s(P, service), dtype=float), idle_power_w=idle,
                   busy_power_w=np.atleast_1d(busy), cost_usd_per_hr=float(profile.cost_usd_per_hr),
                   gpus_per_replica=int(profile.gpus_per_replica))

    @property
    def mean_service_s(self) -> np.ndarray:
        return _row_dot(self.probs, self.service_s)

    @property
    def cv2_service(self) -> np.ndarray:
        m = self.mean_service_s
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(m > 0, np.maximum(_row_dot(self.probs, self.service_s**2) / (m * m) - 1.0, 0.0), 0.0)

    @property
    def ttft_atoms_s(self) -> np.ndarray:
        return self.service_s + self.transfer_s

    @property
    def offered_load_erlangs(self) -> np.ndarray:
        return self.arrival_rate * self.mean_service_s

    @property
    def ttft_floor_s(self) -> np.ndarray:
        """:attr:`PrefillStation.ttft_floor_s` per row (the P99 of prefill plus transfer)."""
        tau = self.ttft_atoms_s
        order = np.argsort(tau, axis=1, kind="stable")
        cum = np.cumsum(np.take_along_axis(self.probs, order, axis=1), axis=1)
        k = np.minimum(np.sum(cum < P99 - 1e-12, axis=1), tau.shape[1] - 1)
        return np.take_along_axis(np.take_along_axis(tau, order, axis=1), k[:, None], axis=1)[:, 0]

    def _es(self) -> np.ndarray:
        m = self.mean_service_s
        return np.where(m > 0, m, 1.0)

    def min_replicas(self, slo_s: float, *, rho_max: float = 0.85, margin: float = 0.0, min_count: int = 1) -> Sizing:
        """:meth:`PrefillStation.min_replicas` of every row."""
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must lie in [0, 1); got {margin}")
        tau, probs, es, cv2 = self.ttft_atoms_s, self.probs, self._es(), self.cv2_service
        mean_tau = _row_dot(probs, tau)
        S = len(self.arrival_rate)
        out = Sizing(np.zeros(S, dtype=np.int64), np.zeros(S, dtype=bool), np.full(S, "", dtype=object),
                     np.zeros(S, dtype=bool))
        # rows of similar atom counts together, each group cut to its own longest row (the padding is dead weight)
        width = probs.shape[1] - np.argmax(probs[:, ::-1] > 0, axis=1)
        order = np.argsort(width, kind="stable")
        for group in np.array_split(order, min(_SIZING_GROUPS, max(S, 1))):
            if not len(group):
                continue
            k = int(width[group].max())
            z = min_replicas(self.arrival_rate[group], es[group], cv2[group], 1,
                             np.full(len(group), slo_s * (1.0 - margin)), tau[group, :k], probs[group, :k],
                             mean_tau[group], rho_max, "tail", min_count)
            out.replicas[group], out.feasible[group], out.bound_by_utilization[group] = (
                z.replicas, z.feasible, z.bound_by_utilization)
            out.reason[group] = z.reason
        return Sizing(out.replicas, out.feasible, out.reason.astype(str), out.bound_by_utilization)

    def miss_probability(self, t_s: float, replicas, rows: np.ndarray | None = None) -> np.ndarray:
        """:meth:`PrefillStation.miss_probability` at ``replicas`` of shape (R, M) for the rows ``rows`` (R of
        them; all by default): :math:`P(\\mathrm{TTFT} > t)`, shape (R, M)."""
        rows = np.arange(len(self.arrival_rate)) if rows is None else np.asarray(rows)
        n = _replicas(replicas)
        lam = self.arrival_rate[rows][:, None]
        p_rows = self.probs[rows]
        k = max(int(np.max(p_rows.shape[1] - np.argmax(p_rows[:, ::-1] > 0, axis=1))), 1) if len(rows) else 1
        tau, probs = self.ttft_atoms_s[rows, :k][:, None, :], p_rows[:, None, :k]     # the rows' own atoms only
        p = ttft_miss_prob(float(t_s), np.maximum(n, 1.0), lam, self._es()[rows][:, None],
                           self.cv2_service[rows][:, None], tau, probs, 0.0, "tail")
        return np.where((lam > 0) & (n <= 0), 1.0, p)

    def power_w(self, replicas) -> np.ndarray:
        r""":meth:`PrefillStation.power_w`, ``replicas`` of shape (S,) or (S, M)."""
        n = _replicas(replicas)
        a = self.offered_load_erlangs.reshape((-1,) + (1,) * (n.ndim - 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = np.where(n > 0, a / np.where(n > 0, n, 1.0), np.where(a > 0, np.inf, 0.0))
        u = np.minimum(rho, 1.0)
        busy = self.busy_power_w.reshape(a.shape)
        return n * ((1.0 - u) * self.idle_power_w + u * busy)


@dataclass(frozen=True, kw_only=True, eq=False)
class DecodeStations:
    r"""The decode stations (:class:`DecodeStation`) of one profile for many segments at once (one row per
    segment; the same formulas over arrays). :meth:`min_replicas` takes the utilisation bound's closed form for
    every row and searches the slot condition (Erlang C) for all rows together."""

    arrival_rate: np.ndarray
    window_tokens: np.ndarray
    weights_s: float
    context_s_per_token: float
    compute_s_per_seq: float
    mean_output_tokens: np.ndarray
    cv2_output: np.ndarray
    mean_context_tokens: np.ndarray
    kv_slots: np.ndarray
    cap: np.ndarray
    tpot_bound_s: np.ndarray
    power: PowerCurve | ActivityPower
    cost_usd_per_hr: float
    gpus_per_replica: int

    @classmethod
    def from_profile(cls, profile: ServingProfile, arrival_rate, prompt_tokens, output_tokens, probs, *,
                     window_tokens, tpot_slo_s: float | None = None,
                     max_num_seqs: int | None = None) -> DecodeStations:
        """:meth:`DecodeStation.from_profile` row by row; ``window_tokens`` (S,) (few distinct values)."""
        window = np.asarray(window_tokens, dtype=float)
        P, O, p = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (prompt_tokens, output_tokens, probs))
        mo = _row_dot(p, O)
        xd = O * P + O * (O - 1.0) / 2.0
        with np.errstate(divide="ignore", invalid="ignore"):
            cv2 = np.where(mo > 0, _row_dot(p, O**2) / (mo * mo) - 1.0, 0.0)
            xbar = np.where(mo > 0, _row_dot(p, xd) / mo, 0.0)
        uniq, inv = np.unique(window, return_inverse=True)
        per = []
        for wdw in uniq.tolist():
            slots = int(profile.n_slots(int(wdw)))
            cap = slots if max_num_seqs is None else min(slots, int(max_num_seqs))
            if tpot_slo_s is not None:
                cap = min(cap, int(tpot_batch_cap(profile, wdw, tpot_slo_s)))
            per.append((slots, max(cap, 0), float(tpot_bound_s(profile, max(cap, 1), wdw))))
        slots_u, cap_u, bound_u = (np.array(x) for x in zip(*per))
        W, h = iteration_coefficients(profile)
        g, _, _ = compute_coefficients(profile)
        return cls(arrival_rate=np.asarray(arrival_rate, dtype=float), window_tokens=window, weights_s=W,
                   context_s_per_token=h, compute_s_per_seq=g, mean_output_tokens=mo, cv2_output=cv2,
                   mean_context_tokens=xbar, kv_slots=slots_u[inv].astype(np.int64), cap=cap_u[inv].astype(np.int64),
                   tpot_bound_s=bound_u[inv].astype(float), power=profile.power,
                   cost_usd_per_hr=float(profile.cost_usd_per_hr), gpus_per_replica=int(profile.gpus_per_replica))

    @property
    def per_seq_s(self) -> np.ndarray:
        return self.context_s_per_token * self.mean_context_tokens + self.compute_s_per_seq

    @property
    def output_tok_per_s(self) -> np.ndarray:
        return self.arrival_rate * self.mean_output_tokens

    def _slot_ok(self, n: np.ndarray, wait_prob_max: float) -> np.ndarray:
        """:meth:`DecodeStation.slot_wait_prob` at most ``wait_prob_max`` (rows with traffic and slots)."""
        hold = self.mean_output_tokens * (self.weights_s + self.cap * self.per_seq_s)
        a = self.arrival_rate * hold
        wait = np.asarray(erlang_c(np.maximum(n * self.cap, 1.0), a), dtype=float)
        wait = np.where(self.arrival_rate > 0, np.where(n * self.cap >= 1, wait, 1.0), 0.0)
        return wait <= wait_prob_max * (1 + 1e-12)

    def min_replicas(self, *, rho_max: float = 0.85, wait_prob_max: float = P99_TAIL, min_count: int = 1) -> Sizing:
        """:meth:`DecodeStation.min_replicas` of every row: the closed-form utilisation count :math:`N_\\rho`, then
        the least count from it whose slot wait is at most ``wait_prob_max``, by the same doubling and bisection
        (all rows at once)."""
        if not 0.0 < rho_max <= 1.0:
            raise ValueError(f"rho_max must lie in (0, 1]; got {rho_max}")
        if not 0.0 < wait_prob_max <= 1.0:
            raise ValueError(f"wait_prob_max must lie in (0, 1]; got {wait_prob_max}")
        S = len(self.arrival_rate)
        no_cap = self.cap < 1
        idle = ~no_cap & ~(self.output_tok_per_s > 0)
        active = ~no_cap & ~idle
        m = rho_max * np.where(no_cap, 1, self.cap)
        t_m = self.weights_s + m * self.per_seq_s
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            n_rho = np.maximum(np.ceil(np.where(active, self.output_tok_per_s * t_m / m * (1 - 1e-12), 0.0)),
                               min_count)
        hi = n_rho.copy()
        ok = self._slot_ok(hi, wait_prob_max) | ~active
        capped = np.zeros(S, dtype=bool)
        while True:
            grow = ~ok & ~capped
            capped |= grow & (hi >= _MAX_REPLICAS)
            grow &= ~capped
            if not grow.any():
                break
            hi = np.where(grow, np.minimum(2 * hi, _MAX_REPLICAS), hi)
            ok = ok | (grow & self._slot_ok(hi, wait_prob_max))
        lo = np.where(hi > n_rho, np.maximum(np.floor(hi / 2), n_rho - 1), n_rho - 1)
        search = active & ~capped
        while True:
            move = search & (hi - lo > 1)
            if not move.any():
                break
            mid = np.floor((lo + hi) / 2)
            good = self._slot_ok(mid, wait_prob_max)
            hi = np.where(move & good, mid, hi)
            lo = np.where(move & ~good, mid, lo)
        feasible = (active & ~capped) | idle
        replicas = np.where(idle, min_count, np.where(feasible, hi, 0)).astype(np.int64)
        reason = np.where(feasible, "", np.where(no_cap, np.where(self.kv_slots < 1, "no-slots", "tpot"), "cap"))
        return Sizing(replicas, feasible, reason, active & ~capped & (hi == n_rho))

    def mean_batch(self, replicas) -> np.ndarray:
        """:meth:`DecodeStation.mean_batch` per row, ``replicas`` (S,)."""
        n = _replicas(replicas)
        out = self.output_tok_per_s
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(n > 0, out / np.where(n > 0, n, 1.0), np.where(out > 0, np.inf, 0.0))
            load = r * self.per_seq_s
            t = np.where(load < 1.0, self.weights_s / np.where(load < 1.0, 1.0 - load, 1.0), np.inf)
            return np.where(np.isfinite(t), r * np.where(np.isfinite(t), t, 0.0), np.inf)

    def _power_of_batch(self, batch: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """A replica's power at ``batch`` (rows x batches) of the rows ``rows``: the profile's power curve, or
        its activity model at each row's mean context (:class:`fleetopt.models.service.DecodePower`)."""
        if not isinstance(self.power, ActivityPower):
            return np.asarray(self.power.power_w(batch), dtype=float)
        kv = (self.context_s_per_token * self.mean_context_tokens[rows])[:, None]
        b = np.asarray(batch, dtype=float)
        busy = self.power.iteration_power_w(self.weights_s + 0.0 * b, kv * b, self.compute_s_per_seq * b)
        return np.where(b > 0, busy, self.power.idle_w)

    def power_w(self, replicas) -> np.ndarray:
        """:meth:`DecodeStation.power_w` per row, ``replicas`` (S,): :math:`N_d E[P(\\min(b, n))]`, the batch
        Poisson of mean :math:`\\bar b` (:func:`fleetopt.models.queueing.batched.mean_power_w`'s rule)."""
        n = _replicas(replicas)
        capf = np.maximum(self.cap, 1).astype(float)
        m = np.minimum(self.mean_batch(n), capf)
        m = np.where(np.isfinite(m), m, capf)
        per = np.empty(m.shape)
        small = m < _EXACT_BELOW
        if small.any():
            rows = np.flatnonzero(small)
            ms, ns = m[rows][:, None], capf[rows]
            b = np.arange(int(3 * _EXACT_BELOW) + 1, dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                pmf = np.exp(special.xlogy(b[None, :], ms) - ms - special.gammaln(b + 1.0)[None, :])
            pmf = np.where(b[None, :] < ns[:, None], pmf, 0.0)
            rest = np.maximum(1.0 - pmf.sum(axis=1), 0.0)
            if isinstance(self.power, ActivityPower):
                at = _row_dot(pmf, self._power_of_batch(np.broadcast_to(b, pmf.shape), rows))
            else:
                at = pmf @ np.asarray(self.power.power_w(b), dtype=float)
            per[rows] = at + rest * self._power_of_batch(ns[:, None], rows)[:, 0]
        if (~small).any():
            rows = np.flatnonzero(~small)
            ml, nl = m[rows][:, None], capf[rows][:, None]
            bb = np.clip(ml + np.sqrt(ml) * _GH_X[None, :], 0.0, nl)
            per[rows] = self._power_of_batch(bb, rows) @ _GH_W
        return n * per


# ----------------------------------------------------------------------------------------------- the pair


@dataclass(frozen=True, kw_only=True)
class PairResult:
    """A P/D pair for one segment at given (or least) replica counts.

    Counts are replicas; ``*_gpus`` count what the limits and prices count (``gpus_per_replica``),
    ``*_physical_gpus`` the GPUs the replicas' constants describe. ``feasible`` is False with ``reason`` saying
    which condition fails (sized pairs then hold 0 replicas in the phase that has none).
    """

    lo_tokens: float
    hi_tokens: float
    prefill_profile: str
    decode_profile: str
    arrival_rate: float
    prefill_replicas: int
    decode_replicas: int
    prefill_gpus: int
    decode_gpus: int
    prefill_physical_gpus: int
    decode_physical_gpus: int
    cost_usd_per_hr: float
    power_w: float
    prefill_power_w: float
    decode_power_w: float
    output_tok_per_s: float
    p99_ttft_s: float
    mean_ttft_s: float
    ttft_miss_prob: float
    """:math:`P(\\mathrm{TTFT} > T_{SLO})` at the prefill count."""
    mean_transfer_s: float
    tpot_bound_s: float
    mean_tpot_s: float
    """The decode pool's mean iteration :math:`\\bar t`."""
    prefill_utilization: float
    decode_utilization: float
    decode_mean_batch: float
    decode_cap: int
    decode_slot_wait_prob: float
    feasible: bool
    reason: str

    @property
    def replicas(self) -> int:
        return self.prefill_replicas + self.decode_replicas

    @property
    def gpus(self) -> int:
        return self.prefill_gpus + self.decode_gpus

    @property
    def physical_gpus(self) -> int:
        return self.prefill_physical_gpus + self.decode_physical_gpus

    @property
    def cost_usd_per_yr(self) -> float:
        return self.cost_usd_per_hr * HOURS_PER_YEAR

    @property
    def tok_per_w(self) -> float:
        return self.output_tok_per_s / self.power_w if self.power_w > 0 else 0.0

    def to_json(self) -> dict:
        """The fields and the derived totals as a plain dict (floats, ints, strings, bools)."""
        out = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in asdict(self).items()}
        out.update(replicas=self.replicas, gpus=self.gpus, physical_gpus=self.physical_gpus,
                   cost_usd_per_yr=self.cost_usd_per_yr, tok_per_w=self.tok_per_w)
        return out


def _ms(x: float) -> str:
    return f"{x * MS_PER_S:,.0f} ms"


def evaluate_pair(prefill: PrefillStation, decode: DecodeStation, prefill_replicas: int, decode_replicas: int, *,
                  ttft_slo_s: float, tpot_slo_s: float | None = None, rho_max: float = 0.85,
                  wait_prob_max: float = P99_TAIL, lo_tokens: float = 0.0, hi_tokens: float | None = None,
                  reason: str = "") -> PairResult:
    """A pair at the given counts, judged against the SLOs themselves (no sizing margin): P99 TTFT, the TPOT
    bound, both utilisations and the decode slot wait. ``reason`` (a sizing failure) overrides the verdict."""
    Np, Nd = int(prefill_replicas), int(decode_replicas)
    p99 = float(prefill.p99_ttft_s(Np)) if Np > 0 else math.inf
    rho_p = float(prefill.utilization(Np))
    rho_d = float(decode.utilization(Nd)) if Nd > 0 else math.inf
    wait = float(decode.slot_wait_prob(Nd))
    problems = []
    if reason:
        problems.append(reason)
    else:
        if not p99 <= ttft_slo_s * (1 + 1e-12):
            problems.append(f"prefill: P99 TTFT {_ms(p99)} above the {_ms(ttft_slo_s)} SLO on {Np} replicas")
        if prefill.arrival_rate > 0 and not rho_p <= rho_max * (1 + 1e-12):
            problems.append(f"prefill: utilisation {rho_p:.2f} above {rho_max:g}")
        if tpot_slo_s is not None and not (decode.cap >= 1 and decode.tpot_bound_s <= tpot_slo_s * (1 + 1e-12)):
            problems.append(f"decode: TPOT bound {decode.tpot_bound_s * MS_PER_S:,.1f} ms above the "
                            f"{tpot_slo_s * MS_PER_S:,.4g} ms SLO")
        if decode.output_tok_per_s > 0 and not rho_d <= rho_max * (1 + 1e-12):
            problems.append(f"decode: utilisation {rho_d:.2f} above {rho_max:g}" if math.isfinite(rho_d)
                            else f"decode: {Nd} replicas cannot carry {decode.output_tok_per_s:,.0f} output tok/s")
        if decode.arrival_rate > 0 and not wait <= wait_prob_max * (1 + 1e-12):
            problems.append(f"decode: {wait:.1%} of requests wait for a slot (at most {wait_prob_max:.1%})")
    t_bar = float(decode.mean_iteration_s(Nd)) if Nd > 0 else math.inf
    pp, pd = float(prefill.power_w(Np)), float(decode.power_w(Nd))
    return PairResult(
        lo_tokens=float(lo_tokens), hi_tokens=float(decode.window_tokens if hi_tokens is None else hi_tokens),
        prefill_profile=prefill.name, decode_profile=decode.name, arrival_rate=prefill.arrival_rate,
        prefill_replicas=Np, decode_replicas=Nd, prefill_gpus=Np * prefill.gpus_per_replica,
        decode_gpus=Nd * decode.gpus_per_replica, prefill_physical_gpus=Np * prefill.physical_gpus_per_replica,
        decode_physical_gpus=Nd * decode.physical_gpus_per_replica,
        cost_usd_per_hr=Np * prefill.cost_usd_per_hr + Nd * decode.cost_usd_per_hr, power_w=pp + pd,
        prefill_power_w=pp, decode_power_w=pd, output_tok_per_s=decode.output_tok_per_s, p99_ttft_s=p99,
        mean_ttft_s=float(prefill.mean_ttft_s(Np)) if Np > 0 else math.inf,
        ttft_miss_prob=float(prefill.miss_probability(ttft_slo_s, Np)), mean_transfer_s=prefill.mean_transfer_s,
        tpot_bound_s=decode.tpot_bound_s, mean_tpot_s=t_bar, prefill_utilization=rho_p, decode_utilization=rho_d,
        decode_mean_batch=float(decode.mean_batch(Nd)) if Nd > 0 else math.inf, decode_cap=decode.cap,
        decode_slot_wait_prob=wait, feasible=not problems, reason="; ".join(problems))


def size_pair(prefill_profile: ServingProfile, decode_profile: ServingProfile, traffic: PhaseTraffic,
              transfer: KVTransfer, *, ttft_slo_s: float, tpot_slo_s: float | None = None, rho_max: float = 0.85,
              ttft_margin: float = 0.0, wait_prob_max: float = P99_TAIL, prefill_chunk_tokens: int | None = None,
              max_num_seqs: int | None = None, window_tokens: float | None = None) -> PairResult:
    r"""The least P/D pair for ``traffic``: :math:`N_p` from :meth:`PrefillStation.min_replicas` (P99 TTFT within
    :math:`(1 - m) T_{SLO}`, :math:`m` = ``ttft_margin``), :math:`N_d` from :meth:`DecodeStation.min_replicas`
    (utilisation and slot wait), each the least for its own phase (the phases share no resource, so the pair's
    least cost is the sum of the two least counts' prices), then :func:`evaluate_pair` at those counts.
    """
    pre = PrefillStation.from_profile(prefill_profile, traffic, transfer, chunk_tokens=prefill_chunk_tokens)
    dec = DecodeStation.from_profile(decode_profile, traffic, window_tokens=window_tokens, tpot_slo_s=tpot_slo_s,
                                     max_num_seqs=max_num_seqs)
    sp = pre.min_replicas(ttft_slo_s, rho_max=rho_max, margin=ttft_margin)
    sd = dec.min_replicas(rho_max=rho_max, wait_prob_max=wait_prob_max)
    reasons = []
    if not sp.feasible[0]:
        reasons.append({"prefill": f"prefill: P99 of prefill plus KV transfer alone is {_ms(pre.ttft_floor_s)}, above "
                                   f"the {_ms(ttft_slo_s * (1 - ttft_margin))} sizing target at any replica count",
                        }.get(str(sp.reason[0]), f"prefill: no count below {_MAX_REPLICAS:,} meets the target"))
    if not sd.feasible[0]:
        one = float(tpot_bound_s(decode_profile, 1, dec.window_tokens))
        reasons.append({"no-slots": f"decode: a replica holds no sequence of the {dec.window_tokens:,.0f}-token window",
                        "tpot": f"decode: one sequence at the {dec.window_tokens:,.0f}-token window decodes in "
                                f"{one * MS_PER_S:,.1f} ms per token, above the TPOT SLO",
                        }.get(str(sd.reason[0]), f"decode: no count below {_MAX_REPLICAS:,} carries the load"))
    return evaluate_pair(pre, dec, int(sp.replicas[0]), int(sd.replicas[0]), ttft_slo_s=ttft_slo_s,
                         tpot_slo_s=tpot_slo_s, rho_max=rho_max, wait_prob_max=wait_prob_max,
                         lo_tokens=traffic.lo_tokens, hi_tokens=traffic.hi_tokens, reason="; ".join(reasons))


# ----------------------------------------------------------------------------------------------- the reference


@dataclass(frozen=True, kw_only=True)
class ReferencePoint:
    """One (prefill, decode) worker count of the reference's sweep."""

    prefill_replicas: int
    decode_replicas: int
    rate_req_per_s: float
    """:math:`\\min(\\alpha_p N_p r_p, \\alpha_d N_d r_d)`."""
    ttft_s: float
    tpot_s: float
    cost_usd_per_hr: float
    gpus: int
    slo_met: bool

    @property
    def cost_usd_per_yr(self) -> float:
        return self.cost_usd_per_hr * HOURS_PER_YEAR


@dataclass(frozen=True, kw_only=True)
class ReferenceDisagg:
    """The reference ``disagg`` command's answer: its cheapest feasible point (None if none) and its inputs."""

    best: ReferencePoint | None
    feasible_points: int
    mean_input_tokens: int
    mean_output_tokens: int
    prefill_rate_per_replica: float
    """:math:`r_p`, req/s of one prefill worker before the derate."""
    decode_rate_per_replica: float
    """:math:`r_d`, req/s of one decode worker before the derate."""
    ttft_s: float
    tpot_s: float
    reason: str


def reference_disagg(prefill_profile: ServingProfile, decode_profile: ServingProfile, workload: LengthDistribution,
                     *, arrival_rate: float, ttft_slo_s: float, tpot_slo_s: float, window_tokens: int,
                     prefill_derate: float = REFERENCE_PREFILL_DERATE, decode_derate: float = REFERENCE_DECODE_DERATE,
                     ttft_factor: float = SEED_TTFT_FACTOR, input_share: float = REFERENCE_INPUT_SHARE,
                     mean_input_tokens: int | None = None, mean_output_tokens: int | None = None,
                     max_prefill: int = 32, max_decode: int = 64) -> ReferenceDisagg:
    r"""The reference tool's disaggregated sizing (vllm-sr-sim ``disagg``; the capacity-planning scenarios'
    Puzzle 7), restated: no queue, throughput matching with fixed derates.

    With the mean total length :math:`\bar L = \sum_i t_i (F_i - F_{i-1})` over the CDF's breakpoints (each
    breakpoint's mass at the breakpoint, the whole CDF), :math:`\bar l_{in} = \lfloor 0.75 \bar L \rfloor`,
    :math:`\bar l_{out} = \lfloor 0.25 \bar L \rfloor`, :math:`n = n_{slots}(B)` of each profile at the window
    :math:`B` and :math:`t(n) = W + H n` (an iteration of :math:`n` sequences at the calibration context):

    .. math::

        \mathrm{TTFT} = \phi \lceil \bar l_{in} / c_p \rceil \, t_p(n_p), \qquad \mathrm{TPOT} = t_d(n_d),

        r_p = \frac{n_p}{S_p(\bar l_{in}, 1)}, \quad r_d = \frac{n_d}{S_d(1, \bar l_{out})}, \qquad
        S(l_{in}, l_{out}) = (\lceil l_{in}/c \rceil + l_{out})\, \big(W + H \tfrac{l_{in} + l_{out}}{B_{cal}} n\big)

        R(N_p, N_d) = \min(\alpha_p N_p r_p, \; \alpha_d N_d r_d)

    (:math:`S` is :func:`fleetopt.models.service.service_time_s`). A point is feasible when TTFT and TPOT meet their
    SLOs and :math:`R \ge \lambda`; the answer is the cheapest over :math:`1 \le N_p \le 32`,
    :math:`1 \le N_d \le 64` (the first in :math:`(N_p, N_d)` order on a tie). :math:`\phi` = 1.8,
    :math:`\alpha_p` = 0.90 and :math:`\alpha_d` = 0.92 are the reference's constants.
    """
    mean_total = float(np.sum(workload.hi_tokens * workload.prob))
    isl = int(mean_total * input_share) if mean_input_tokens is None else int(mean_input_tokens)
    osl = int(mean_total * (1.0 - input_share)) if mean_output_tokens is None else int(mean_output_tokens)
    B = int(window_tokens)
    n_p, n_d = int(prefill_profile.n_slots(B)), int(decode_profile.n_slots(B))
    t_p = float(iteration_latency_s(prefill_profile, n_p, prefill_profile.calibration_ctx_tokens))
    t_d = float(iteration_latency_s(decode_profile, n_d, decode_profile.calibration_ctx_tokens))
    ttft = ttft_factor * math.ceil(isl / prefill_profile.chunk_tokens) * t_p
    tpot = t_d
    s_p = float(service_time_s(prefill_profile, B, isl, 1))
    s_d = float(service_time_s(decode_profile, B, 1, osl))
    r_p = n_p / s_p if s_p > 0 else 0.0
    r_d = n_d / s_d if s_d > 0 else 0.0
    Np, Nd = np.meshgrid(np.arange(1, max_prefill + 1), np.arange(1, max_decode + 1), indexing="ij")
    rate = np.minimum(prefill_derate * Np * r_p, decode_derate * Nd * r_d)
    cost = Np * prefill_profile.cost_usd_per_hr + Nd * decode_profile.cost_usd_per_hr
    slo_met = ttft <= ttft_slo_s and tpot <= tpot_slo_s
    ok = slo_met & (rate >= arrival_rate)

    def answer(best: ReferencePoint | None, reason: str) -> ReferenceDisagg:
        return ReferenceDisagg(best=best, feasible_points=int(ok.sum()), mean_input_tokens=isl, mean_output_tokens=osl,
                               prefill_rate_per_replica=r_p, decode_rate_per_replica=r_d, ttft_s=ttft, tpot_s=tpot,
                               reason=reason)

    if not ok.any():
        why = (f"TTFT {_ms(ttft)} / TPOT {tpot * MS_PER_S:,.0f} ms against {_ms(ttft_slo_s)} / "
               f"{tpot_slo_s * MS_PER_S:,.0f} ms" if not slo_met
               else f"at most {rate.max():,.1f} req/s within {max_prefill}P x {max_decode}D")
        return answer(None, why)
    i = int(np.argmin(np.where(ok, cost, np.inf)))
    a, b = np.unravel_index(i, cost.shape)
    best = ReferencePoint(prefill_replicas=int(Np[a, b]), decode_replicas=int(Nd[a, b]),
                          rate_req_per_s=float(rate[a, b]), ttft_s=ttft, tpot_s=tpot, cost_usd_per_hr=float(cost[a, b]),
                          gpus=int(Np[a, b] * prefill_profile.gpus_per_replica
                                   + Nd[a, b] * decode_profile.gpus_per_replica), slo_met=True)
    return answer(best, "")
