"""The per-iteration and per-request time model (the seeds' conventions).

A replica runs continuous batching. One iteration with :math:`n` sequences of
mean length :math:`L` tokens takes

.. math:: t(n, L) = W + H \\frac{L}{B_{cal}} n

(:math:`W`: weight streaming and fixed per-layer cost; :math:`H`: KV scan of one
sequence at the calibration context :math:`B_{cal}`). A request of
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

from fleetopt.models.profiles import ServingProfile, quality_label

__all__ = ["iteration_latency_s", "iteration_coefficients", "service_time_s", "prefill_time_s", "ContextPoint", "context_point",
           "tpot_bound_s", "tpot_batch_cap"]


def iteration_latency_s(profile: ServingProfile, n_active, seq_tokens):
    """Iteration time :math:`t(n, L)` in seconds (array-aware)."""
    n = np.asarray(n_active, dtype=float)
    L = np.asarray(seq_tokens, dtype=float)
    return profile.W_s + profile.H_s * (L / profile.calibration_ctx_tokens) * n


def iteration_coefficients(profile: ServingProfile) -> tuple[float, float]:
    """Intercept :math:`W` (s) and per-token slope :math:`h` (s/token) of the iteration time.

    An iteration over sequences whose contexts (KV tokens at its start) are :math:`x_1, \\dots, x_n` takes

    .. math:: t = W + h \\sum_s x_s, \\qquad h = H / B_{cal}

    which is :func:`iteration_latency_s` read as a function of the total context :math:`n \\bar x`. The
    simulator (:mod:`fleetopt.solvers.des.engine`) and the batched analytic model
    (:mod:`fleetopt.models.batched`) both take the iteration time from here. Raises ``ValueError`` if
    :func:`iteration_latency_s` is not affine in :math:`n \\bar x`.

    Examples
    --------
    The seeds' H100 unit: :math:`W` = 4 ms and :math:`H` = 0.32 ms per sequence at 8,192 tokens of context.

    >>> import types
    >>> unit = types.SimpleNamespace(W_s=0.004, H_s=0.00032, calibration_ctx_tokens=8192)
    >>> W, h = iteration_coefficients(unit)
    >>> (W, round(h * 8192, 12))
    (0.004, 0.00032)
    """
    ctx = float(profile.calibration_ctx_tokens)
    W = float(iteration_latency_s(profile, 0, 0.0))
    h = (float(iteration_latency_s(profile, 1, ctx)) - W) / ctx
    probe = float(iteration_latency_s(profile, 37, 0.3 * ctx))
    if not math.isclose(probe, W + h * 37 * 0.3 * ctx, rel_tol=1e-9):
        raise ValueError(f"profile {profile.name}: iteration latency is not affine in n x mean context")
    return W, h


def tpot_bound_s(profile: ServingProfile, batch, window_tokens):
    """Upper bound on the time per output token: one iteration with ``batch`` sequences at full context.

    .. math:: \\mathrm{TPOT} \\le t(n, B) = W + H \\frac{B}{B_{cal}} n

    Every sequence in a pool of window :math:`B` holds at most :math:`B` tokens,
    so no decode iteration of :math:`n` sequences takes longer.
    """
    return iteration_latency_s(profile, batch, window_tokens)


def tpot_batch_cap(profile: ServingProfile, window_tokens, tpot_s: float):
    """Largest batch cap (max_num_seqs) whose :func:`tpot_bound_s` meets ``tpot_s`` (0: none; array-aware).

    .. math:: n_{max} = \\left\\lfloor \\frac{T_{tpot} - W}{H B / B_{cal}} \\right\\rfloor
    """
    B = np.asarray(window_tokens, dtype=float)
    per_seq = profile.H_s * B / profile.calibration_ctx_tokens
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
                            float(profile.power.power_w(0)), 0.0, _quality(profile))
    t = float(iteration_latency_s(profile, n, seq))
    tok_s = n / t
    p = float(profile.power.power_w(n))
    return ContextPoint(profile.name, profile.model_name, int(ctx_tokens), n, t * 1000.0, tok_s, p, tok_s / p,
                        _quality(profile))


def _quality(profile: ServingProfile) -> str:
    return quality_label(profile)
