"""Analytic evaluation of a fleet: pools of replicas, each serving a length segment.

For a pool :math:`p` serving :math:`(lo_p, hi_p]` with :math:`N_p` replicas of
:math:`n_p` slots, arrival rate :math:`\\lambda_p`, mean slot time
:math:`E[S]_p` and mean output :math:`E[l_{out}]_p`:

.. math::

    \\rho_p = \\frac{\\lambda_p E[S]_p}{N_p n_p}, \\qquad
    \\bar b_p = \\frac{\\lambda_p E[S]_p}{N_p} \\;\\text{(Little's law)}, \\qquad
    P_p = N_p \\, P(\\bar b_p)

    \\mathrm{tok/W}_{fleet} = \\frac{\\sum_p \\lambda_p E[l_{out}]_p}{\\sum_p N_p P(\\bar b_p)}

(the 1/W paper's Eq. 4). Cost is :math:`\\sum_p N_p \\cdot` price per replica.
Every number here is *analytic*; the report layer labels it so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .profiles import ServingProfile, quality_label
from .queueing import min_replicas, ttft_p99_s
from .segments import segment_basis, segment_stats
from .units import HOURS_PER_YEAR, MS_PER_S
from .workload import LengthDistribution, RequestTrace

__all__ = ["PoolPlan", "PoolResult", "FleetResult", "ServiceLevel", "evaluate_fleet"]


@dataclass(frozen=True)
class ServiceLevel:
    """What a fleet must deliver: P99 TTFT under a TTFT model, and the utilisation cap."""

    ttft_p99_s: float
    ttft_model: str = "tail"
    max_utilization: float = 0.85


@dataclass(frozen=True)
class PoolPlan:
    """A pool to evaluate; ``replicas=None`` sizes it to its minimum count."""

    lo_tokens: int
    hi_tokens: int
    gpu: str
    profile: ServingProfile
    replicas: int | None = None
    availability: float = 1.0


@dataclass(frozen=True)
class PoolResult:
    min_tokens: int
    max_tokens: int
    gpu: str
    profile: str
    model: str
    quality: str
    replicas: int
    gpus: int
    sized: bool
    n_slots: int
    arrival_rate: float
    routing_share: float
    utilization: float
    ttft_p99_ms: float
    prefill_p99_ms: float
    mean_prefill_ms: float
    mean_service_s: float
    cv2_service: float
    mean_batch: float
    power_w: float
    output_tok_per_s: float
    tok_per_watt: float
    cost_per_hr: float
    slo_met: bool
    utilization_ok: bool
    miss_reason: str


@dataclass(frozen=True)
class FleetResult:
    pools: tuple[PoolResult, ...]
    cost_per_hr: float
    cost_per_year: float
    total_replicas: int
    total_gpus: int
    power_kw: float
    tok_per_watt: float
    slo_met: bool
    feasible: bool


def _bases(workload, boundaries, chunks, input_fraction):
    return {c: segment_basis(workload, boundaries, c, input_fraction) for c in sorted(set(chunks))}


def evaluate_fleet(pools: list[PoolPlan], workload: LengthDistribution | RequestTrace, arrival_rate: float,
                   level: ServiceLevel, input_fraction: float = 0.8) -> FleetResult:
    """Evaluate (and where asked, size) every pool analytically.

    ``pools`` must tile :math:`(0, B_{max}]` in order; the workload must not
    extend beyond :math:`B_{max}` (truncate it first).
    """
    if not pools:
        raise ValueError("a fleet needs at least one pool")
    edges = [pools[0].lo_tokens]
    for p in pools:
        if p.lo_tokens != edges[-1] or p.hi_tokens <= p.lo_tokens:
            raise ValueError(f"pools must tile the length range in order; {p.lo_tokens}-{p.hi_tokens} does not follow {edges[-1]}")
        edges.append(p.hi_tokens)
    if edges[0] != 0:
        raise ValueError("the first pool must start at 0 tokens")
    boundaries = np.asarray(edges, dtype=float)
    bases = _bases(workload, boundaries, [p.profile.chunk_tokens for p in pools], input_fraction)
    results = [_evaluate_pool(k, p, bases[p.profile.chunk_tokens], arrival_rate, level) for k, p in enumerate(pools)]
    return summarize(results)


def summarize(results: list[PoolResult]) -> FleetResult:
    """Fleet totals of evaluated pools."""
    cost = sum(r.cost_per_hr for r in results)
    power_w = sum(r.power_w for r in results)
    out = sum(r.output_tok_per_s for r in results)
    return FleetResult(
        pools=tuple(results),
        cost_per_hr=cost,
        cost_per_year=cost * HOURS_PER_YEAR,
        total_replicas=sum(r.replicas for r in results),
        total_gpus=sum(r.gpus for r in results),
        power_kw=power_w / 1000.0,
        tok_per_watt=out / power_w if power_w > 0 else 0.0,
        slo_met=all(r.slo_met for r in results),
        feasible=all(r.slo_met and r.utilization_ok for r in results),
    )


def _evaluate_pool(k: int, plan: PoolPlan, basis, arrival_rate: float, level: ServiceLevel) -> PoolResult:
    s = segment_stats(basis, [k], [k + 1], plan.profile)
    lam = float(arrival_rate * s.rate_share[0])
    n = int(s.n_slots[0])
    args = (lam, s.mean_service_s, s.cv2_service)
    sized = plan.replicas is None
    if sized:
        z = min_replicas(*args, n, level.ttft_p99_s, s.prefill_times_s, s.prefill_probs, s.mean_prefill_s,
                         level.max_utilization, level.ttft_model)
        if not z.feasible[0]:
            # No count meets the SLO: size by the utilisation cap alone so the cost is still meaningful;
            # the pool is reported as missing the SLO with its reason.
            z = min_replicas(*args, n, math.inf, s.prefill_times_s, s.prefill_probs, s.mean_prefill_s,
                             level.max_utilization, level.ttft_model)
        base = int(z.replicas[0])
        replicas = math.ceil(base / plan.availability - 1e-9) if base > 0 else 0
    else:
        replicas = int(plan.replicas)
    es = float(s.mean_service_s[0]) if lam > 0 else 0.0
    servers = replicas * n
    ttft = float(np.atleast_1d(ttft_p99_s(servers, lam, es if lam > 0 else 1.0, s.cv2_service, s.prefill_times_s,
                                          s.prefill_probs, s.mean_prefill_s, level.ttft_model))[0]) if lam > 0 else 0.0
    pf99 = _prefill_p99_s(s) if lam > 0 else 0.0
    util = lam * es / servers if servers > 0 else (0.0 if lam == 0 else math.inf)
    batch = lam * es / replicas if replicas > 0 else 0.0
    power = replicas * float(plan.profile.power.power_w(min(batch, n))) if replicas > 0 else 0.0
    out_tps = lam * float(np.nan_to_num(s.mean_output_tokens[0]))
    slo_met = bool(ttft <= level.ttft_p99_s * (1 + 1e-12))
    util_ok = bool(util <= level.max_utilization * (1 + 1e-12))
    return PoolResult(
        min_tokens=plan.lo_tokens, max_tokens=plan.hi_tokens, gpu=plan.gpu, profile=plan.profile.name,
        model=plan.profile.model_name, quality=quality_label(plan.profile), replicas=replicas,
        gpus=replicas * plan.profile.gpus_per_replica, sized=sized, n_slots=n, arrival_rate=lam,
        routing_share=float(s.rate_share[0]), utilization=util, ttft_p99_ms=ttft * MS_PER_S,
        prefill_p99_ms=pf99 * MS_PER_S, mean_prefill_ms=float(np.nan_to_num(s.mean_prefill_s[0])) * MS_PER_S,
        mean_service_s=es, cv2_service=float(np.nan_to_num(s.cv2_service[0])), mean_batch=batch,
        power_w=power, output_tok_per_s=out_tps, tok_per_watt=out_tps / power if power > 0 else 0.0,
        cost_per_hr=replicas * plan.profile.cost_usd_per_hr, slo_met=slo_met and util < 1.0,
        utilization_ok=util_ok,
        miss_reason=_miss_reason(n, lam, util, ttft, pf99, float(np.nan_to_num(s.mean_prefill_s[0])), level),
    )


def _prefill_p99_s(s) -> float:
    cum = np.cumsum(s.prefill_probs[0])
    k = int(np.searchsorted(cum, 0.99 - 1e-12))
    return float(s.prefill_times_s[min(k, len(cum) - 1)])


def _miss_reason(n, lam, util, ttft, pf99, mean_pf, level: ServiceLevel) -> str:
    slo_ms = level.ttft_p99_s * MS_PER_S
    if n < 1:
        return "no KV slot: the context window does not fit this GPU's KV cache"
    if lam > 0 and util >= 1.0:
        return f"overloaded: utilisation {util:.2f} >= 1, the queue grows without bound"
    if ttft <= level.ttft_p99_s * (1 + 1e-12):
        if util > level.max_utilization * (1 + 1e-12):
            return f"utilisation {util:.2f} above the cap {level.max_utilization:.2f}"
        return ""
    if level.ttft_model == "tail" and pf99 >= level.ttft_p99_s:
        return (f"prefill of its longest prompts: P99 prefill alone is {pf99 * MS_PER_S:,.0f} ms "
                f"> SLO {slo_ms:,.0f} ms at any replica count")
    if level.ttft_model == "mean-prefill" and mean_pf >= level.ttft_p99_s:
        return f"mean prefill {mean_pf * MS_PER_S:,.0f} ms alone exceeds the SLO {slo_ms:,.0f} ms"
    return f"queueing: P99 TTFT {ttft * MS_PER_S:,.0f} ms > SLO {slo_ms:,.0f} ms with these replicas"
