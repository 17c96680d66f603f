"""The per-iteration and per-request time model (the seeds' conventions).

A replica runs continuous batching. One iteration with :math:`n` sequences of
mean length :math:`L` tokens takes

.. math:: t(n, L) = W + H \\frac{L}{B_{cal}} n + g\\, n

(:math:`W`: weight streaming and fixed per-layer cost; :math:`H`: KV scan of one
sequence at the calibration context :math:`B_{cal}`; :math:`g`: the per-sequence compute
of a decode step, 0 for the seeds' calibrated units). The iteration of the
continuous-batching replica, prefill chunks included, is :func:`iteration_terms`. A request of
:math:`l_{in}` prompt and :math:`l_{out}` output tokens in a pool whose context
window is :math:`B` holds one KV slot for

.. math:: S = \\left(\\lceil l_{in}/c \\rceil + l_{out}\\right) t(n_{slots}(B), l_{in} + l_{out})

(:math:`c` the prefill chunk) and its prefill takes

.. math:: T_{pf} = \\lceil l_{in}/c \\rceil \\, (W + H)

i.e. chunks at one sequence of calibration-context length - the convention
of the reference tool vllm-sr-sim, which the seeds' tables were computed with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetopt.models.power import ActivityPower
from fleetopt.models.profiles import ServingProfile, quality_label

__all__ = ["DecodePower", "decode_power_curve", "iteration_latency_s", "iteration_coefficients", "compute_coefficients",
           "prefill_compute_terms", "iteration_work_s", "service_time_s", "prefill_time_s", "ContextPoint",
           "context_point", "tpot_bound_s", "tpot_batch_cap"]


def iteration_latency_s(profile: ServingProfile, n_active, seq_tokens):
    """Iteration time :math:`t(n, L)` in seconds (array-aware)."""
    n = np.asarray(n_active, dtype=float)
    L = np.asarray(seq_tokens, dtype=float)
    return profile.W_s + (profile.H_s * (L / profile.calibration_ctx_tokens) + profile.g_s) * n


def compute_coefficients(profile: ServingProfile) -> tuple[float, float, float]:
    """Compute terms of the iteration: per decode sequence :math:`g`, per prompt token :math:`a`, per prompt token
    squared :math:`b` (seconds; all 0 for the seeds' calibrated units).

    An iteration whose decode sequences start from contexts :math:`x_s` and whose prefill chunks of :math:`c_j`
    tokens start at prefixes :math:`p_j` takes

    .. math::

        t = W + h \\Big(\\sum_s x_s + \\sum_j p_j\\Big) + g\\, n_{dec}
            + \\sum_j \\left(a\\, c_j + b \\left((p_j + c_j)^2 - p_j^2\\right)\\right)

    (:func:`iteration_coefficients` gives :math:`W, h`): a decode step reads the weights and the KV cache and
    computes one token per sequence; a prefill chunk computes its tokens (linear) and their causal attention
    over the prompt so far (quadratic), so a whole prompt of :math:`P` tokens costs :math:`aP + bP^2` of
    compute however it is chunked (measured on an H100: ``data/measurements/README.md``).

    **Chunking convention.** The simulator and the batched model split a prompt of :math:`P` tokens into its
    :math:`k = \\lceil P/c \\rceil` chunks *evenly* for the compute terms: chunk :math:`j = 0, \\dots, k-1`
    costs :math:`a P/k + b (P/k)^2 (2j + 1)`, which sums to :math:`aP + bP^2` exactly and grows by the same
    step each iteration, so the simulator's closed-form jump between events stays exact. The KV-scan term
    keeps the prefixes :math:`0, c, \\dots, (k-1)c` of full chunks (:func:`fleetopt.models.segments.context_work`).
    """
    return float(profile.g_s), float(profile.prefill_a_s), float(profile.prefill_b_s)


def prefill_compute_terms(profile: ServingProfile, prompt_tokens):
    """Per-chunk compute of a prompt under the even-chunk convention (:func:`compute_coefficients`):
    chunk :math:`j` costs :math:`\\alpha + \\beta j` seconds (array-aware; 0 for an empty prompt).

    .. math:: \\alpha = a \\frac{P}{k} + b \\frac{P^2}{k^2}, \\qquad \\beta = 2 b \\frac{P^2}{k^2},
              \\qquad \\sum_{j=0}^{k-1} (\\alpha + \\beta j) = aP + bP^2

    Examples
    --------
    >>> import types
    >>> p = types.SimpleNamespace(chunk_tokens=4, prefill_a_s=1.0, prefill_b_s=0.5)
    >>> alpha, beta = prefill_compute_terms(p, 8)       # two chunks of 4: 4 + 8 = 12, then 4 + 24 = 28
    >>> (float(alpha), float(beta), float(2 * alpha + beta))
    (12.0, 16.0, 40.0)
    """
    P = np.asarray(prompt_tokens, dtype=float)
    k = np.ceil(P / profile.chunk_tokens)
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(k > 0, P / np.where(k > 0, k, 1.0), 0.0)
    return profile.prefill_a_s * u + profile.prefill_b_s * u * u, 2.0 * profile.prefill_b_s * u * u


def iteration_work_s(profile: ServingProfile, prompt_tokens: int, output_tokens: int) -> np.ndarray:
    """The seconds one request adds to each iteration it runs in, beyond the fixed :math:`W`: its work profile
    :math:`w(1), \\dots, w(I)` over its :math:`I = k + l_{out}` iterations (:func:`iteration_coefficients`,
    :func:`compute_coefficients`; the simulator's iteration, :mod:`fleetopt.solvers.des.engine`).

    .. math::

        w(j + 1) = h\\, j c + \\alpha + \\beta j \\quad (j = 0, \\dots, k - 1), \\qquad
        w(k + 1 + d) = h (l_{in} + d) + g \\quad (d = 0, \\dots, l_{out} - 1)

    with :math:`c` the chunk, :math:`k = \\lceil l_{in}/c \\rceil` and the even-chunk compute
    :math:`\\alpha + \\beta j` of :func:`prefill_compute_terms`: a prefill chunk scans the prefix of the full
    chunks before it and computes its share of the prompt; a decode step scans the context so far and computes one
    token. Its sum is the request's time-work :math:`Y` and the sum of its squares :math:`Y_2`
    (:func:`fleetopt.models.segments.compute_work`).

    Examples
    --------
    >>> import types
    >>> p = types.SimpleNamespace(W_s=0.0, H_s=8.0, calibration_ctx_tokens=8, chunk_tokens=4, g_s=0.5,
    ...                           prefill_a_s=0.0, prefill_b_s=0.0)
    >>> [float(v) for v in iteration_work_s(p, 6, 2)]      # chunks at prefixes 0 and 4, decodes at 6 and 7
    [0.0, 4.0, 6.5, 7.5]
    """
    W, h = iteration_coefficients(profile)
    g, _, _ = compute_coefficients(profile)
    l_in, l_out = int(prompt_tokens), int(output_tokens)
    c = int(profile.chunk_tokens)
    k = -(-l_in // c) if l_in > 0 else 0
    j = np.arange(k, dtype=float)
    alpha, beta = prefill_compute_terms(profile, l_in)
    prefill = h * c * j + (float(alpha) + float(beta) * j if k else 0.0)
    decode = h * (l_in + np.arange(l_out, dtype=float)) + g
    return np.concatenate([prefill, decode])


@dataclass(frozen=True)
class DecodePower:
    """An activity power model read as a function of the batch alone: decode steps of :math:`b` sequences at a
    fixed context :math:`x` (:func:`decode_power_curve`).

    .. math:: P(b) = P_{act}(W,\\; b\\, h x,\\; b\\, g), \\qquad P(0) = P_{idle}
    """

    activity: ActivityPower
    weights_s: float
    kv_per_seq_s: float | np.ndarray      # an array: one value per context (power_w answers per context)
    compute_per_seq_s: float

    @property
    def quality(self) -> str:
        return self.activity.quality

    @property
    def idle_w(self) -> float:
        return self.activity.idle_w

    def power_w(self, batch: float | np.ndarray) -> float | np.ndarray:
        """Power in W at ``batch`` decoding sequences (array-aware)."""
        b = np.asarray(batch, dtype=float)
        out = np.where(b > 0, self.activity.iteration_power_w(self.weights_s + 0.0 * b, self.kv_per_seq_s * b,
                                                              self.compute_per_seq_s * b), self.activity.idle_w)
        return out if out.ndim else float(out)


def decode_power_curve(profile: ServingProfile, context_tokens: float | np.ndarray):
    """The profile's power as a function of the batch: its :class:`~fleetopt.models.power.PowerCurve`, or for an
    activity power model (:class:`~fleetopt.models.power.ActivityPower`) the power of decode steps at
    ``context_tokens`` of context per sequence (:class:`DecodePower`). For the places that know only a batch
    (slot models, power caps, the split MIP's power line, 1/W tables); the batched model and the simulator use
    the activity model itself."""
    power = profile.power
    if not isinstance(power, ActivityPower):
        return power
    W, h = iteration_coefficients(profile)
    return DecodePower(power, W, h * np.asarray(context_tokens, dtype=float), float(profile.g_s))


def iteration_coefficients(profile: ServingProfile) -> tuple[float, float]:
    """Intercept :math:`W` (s) and per-token slope :math:`h` (s/token) of the iteration time.

    An iteration over sequences whose contexts (KV tokens at its start) are :math:`x_1, \\dots, x_n` takes

    .. math:: t = W + h \\sum_s x_s, \\qquad h = H / B_{cal}

    which is :func:`iteration_latency_s` read as a function of the total context :math:`n \\bar x`. The
    simulator (:mod:`fleetopt.solvers.des.engine`) and the batched analytic model
    (:mod:`fleetopt.models.queueing.batched`) both take the iteration time from here. Raises ``ValueError`` if
    :func:`iteration_latency_s` is not affine in :math:`n \\bar x`.

    Examples
    --------
    The seeds' H100 unit: :math:`W` = 4 ms and :math:`H` = 0.32 ms per sequence at 8,192 tokens of context.

    >>> import types
    >>> unit = types.SimpleNamespace(W_s=0.004, H_s=0.00032, calibration_ctx_tokens=8192, g_s=0.0)
    >>> W, h = iteration_coefficients(unit)
    >>> (W, round(h * 8192, 12))
    (0.004, 0.00032)
    """
    ctx = float(profile.calibration_ctx_tokens)
    g = float(getattr(profile, "g_s", 0.0))
    W = float(iteration_latency_s(profile, 0, 0.0))
    h = (float(iteration_latency_s(profile, 1, ctx)) - W - g) / ctx
    probe = float(iteration_latency_s(profile, 37, 0.3 * ctx))
    if not math.isclose(probe, W + h * 37 * 0.3 * ctx + 37 * g, rel_tol=1e-9):
        raise ValueError(f"profile {profile.name}: iteration latency is not affine in n x mean context")
    return W, h


def tpot_bound_s(profile: ServingProfile, batch, window_tokens):
    """Upper bound on the time per output token: one iteration with ``batch`` sequences at full context.

    .. math:: \\mathrm{TPOT} \\le t(n, B) = W + H \\frac{B}{B_{cal}} n + g n

    Every sequence in a pool of window :math:`B` holds at most :math:`B` tokens,
    so no decode iteration of :math:`n` sequences takes longer.
    """
    return iteration_latency_s(profile, batch, window_tokens)


def tpot_batch_cap(profile: ServingProfile, window_tokens, tpot_s: float):
    """Largest batch cap (max_num_seqs) whose :func:`tpot_bound_s` meets ``tpot_s`` (0: none; array-aware).

    .. math:: n_{max} = \\left\\lfloor \\frac{T_{tpot} - W}{H B / B_{cal} + g} \\right\\rfloor
    """
    B = np.asarray(window_tokens, dtype=float)
    per_seq = profile.H_s * B / profile.calibration_ctx_tokens + profile.g_s
    cap = np.floor((tpot_s - profile.W_s) / per_seq * (1 + 1e-12))
    return np.maximum(cap, 0).astype(np.int64)


def prefill_chunks(profile: ServingProfile, prompt_tokens):
    """Number of prefill iterations :math:`\\lceil l_{in}/c \\rceil` (array-aware)."""
    return np.ceil(np.asarray(prompt_tokens, dtype=float) / profile.chunk_tokens)


def prefill_time_s(profile: ServingProfile, prompt_tokens):
    """Prefill time :math:`T_{pf}` in seconds (array-aware)."""
    return prefill_chunks(profile, prompt_tokens) * (profile.W_s + profile.H_s)


def service_time_s(profile: ServingProfile, ctx_tokens: int, prompt_tokens, output_tokens, batch_cap=None):
    """Slot holding time :math:`S` in seconds in a pool of context window ``ctx_tokens``.

    ``batch_cap`` (max_num_seqs) replaces :math:`n_{slots}(B)` in the iteration time when the pool runs
    fewer sequences than its KV cache holds.
    """
    l_in = np.asarray(prompt_tokens, dtype=float)
    l_out = np.asarray(output_tokens, dtype=float)
    n = profile.n_slots(ctx_tokens) if batch_cap is None else batch_cap
    return (prefill_chunks(profile, l_in) + l_out) * iteration_latency_s(profile, n, l_in + l_out)


@dataclass(frozen=True)
class ContextPoint:
    """One replica at full concurrency with a given context window (the 1/W-law table row)."""

    profile: str
    model: str
    context_tokens: int
    n_slots: int
    iter_latency_ms: float
    tok_per_s: float
    power_w: float
    tok_per_watt: float
    quality: str


def context_point(profile: ServingProfile, ctx_tokens: int, mean_seq_tokens: float | None = None) -> ContextPoint:
    """Decode throughput and tok/W of one replica filled to ``n_slots(ctx)``.

    .. math::

        \\mathrm{tok/W} = \\frac{n / t(n, \\bar L)}{P(n)}, \\quad n = n_{slots}(B),
        \\quad \\bar L = B/2 \\text{ (the paper's Table-1 convention)}

    Examples
    --------
    >>> from fleetopt.models.profiles import CalibratedProfile
    >>> from fleetopt.models.power import PowerCurve
    >>> h100 = CalibratedProfile("H100-80GB", "70B", 0.004, 0.00032, 8192, 1024, 16, 65536, 256, 4.02, 1,
    ...     PowerCurve(300, 600, 1.0, 4.2, "measured"))
    >>> p = context_point(h100, 4096)
    >>> (p.n_slots, round(p.power_w), round(p.tok_per_watt, 2))
    (256, 593, 17.62)
    """
    n = int(profile.n_slots(ctx_tokens))
    seq = ctx_tokens / 2.0 if mean_seq_tokens is None else float(mean_seq_tokens)
    if n < 1:
        return ContextPoint(profile.name, profile.model_name, int(ctx_tokens), 0, float("nan"), 0.0,
                            float(decode_power_curve(profile, seq).power_w(0)), 0.0, _quality(profile))
    t = float(iteration_latency_s(profile, n, seq))
    tok_s = n / t
    p = float(decode_power_curve(profile, seq).power_w(n))
    return ContextPoint(profile.name, profile.model_name, int(ctx_tokens), n, t * 1000.0, tok_s, p, tok_s / p,
                        _quality(profile))


def _quality(profile: ServingProfile) -> str:
    return quality_label(profile)
