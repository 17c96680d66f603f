r"""Disaggregated prefill/decode (P/D) pairs in a simulated plan: their analytic rows and their simulator.

A plan's pool may be a P/D pair (:class:`fleetopt.models.fleet.PoolPlan` with ``decode`` and ``transfer``): a
prefill pool (the PoolPlan's own GPU and replicas) and a decode pool (``decode``) serving one length segment
:math:`(lo, hi]`, joined by a KV transfer. The analytic evaluation reports it as two rows over the segment,
``phase`` ``prefill`` then ``decode`` (:class:`fleetopt.models.fleet.PoolResult`); the simulator runs it with
:func:`fleetopt.solvers.des.disagg.simulate_disaggregated` on the requests the router sends to the segment.

What the simulation of a pair holds to the analytic stations
-------------------------------------------------------------
* **Prefill queue.** ``prefill_queue="pool"``: one FIFO queue over the :math:`N_p` prefill replicas, one prompt
  at a time per replica, each prompt's prefill alone :math:`S_p`
  (:func:`~fleetopt.models.queueing.disagg.prefill_service_s`): the M/G/c queue of
  :class:`~fleetopt.models.queueing.disagg.PrefillStation`. The simulator's ``dispatch``,
  ``mode`` and engine options (``kv``, token budget) apply to aggregated pools only.
* **KV transfer.** Request :math:`i` moves its prompt's KV cache in :math:`T_x(l_{in,i}, S_{p,i})`
  (:meth:`~fleetopt.models.queueing.disagg.KVTransfer.time_s`, the plan's ``transfer``): the bandwidth model
  from the prompt alone, the reference's seed factor :math:`(\phi - 1) S_{p,i}` from the request's own prefill
  time, the time :func:`prefill_service_s` gives for its prompt on the prefill profile (the pool-queue station
  serves exactly that long, so it is the station's own record).
* **Decode.** At most the decode row's ``max_num_seqs`` sequences per decode replica (KV slots at the window, less
  where the TPOT SLO asks), one slot queue for the pool.
* **Availability.** Every replica of a pair is up (``engine.availability="sampled"`` draws aggregated pools only).

Until the analytic evaluation of pairs (:func:`fleetopt.models.fleet.evaluate_fleet`) reports them, the rows of a
pair are built here from the stations (:func:`pair_rows`; :func:`analytic_fleet` uses whichever is there).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetopt.models.fleet import FleetResult, PoolPlan, PoolResult, ServiceLevel, inflate_for_availability, summarize
from fleetopt.models.profiles import quality_label
from fleetopt.models.units import MS_PER_S
from fleetopt.models.workload import RequestTrace

if TYPE_CHECKING:   # the stations and the simulator's pair load with the first pair (a plan without pairs skips them)
    from fleetopt.models.queueing.disagg import DecodeStation, KVTransfer, PhaseTraffic, PrefillStation
    from fleetopt.solvers.des.disagg import DisaggPair

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.evaluate import evaluate_plans, service_level

__all__ = ["PAIR_NOTE", "is_pair_row", "has_pairs", "pair_traffic", "pair_stations", "pair_rows", "analytic_fleet",
           "unit_rows", "disagg_pair", "transfer_times", "pair_name"]

PAIR_NOTE = ("P/D pairs: each pair's prefill pool keeps one FIFO queue, one prompt at a time per replica (the analytic "
             "station's M/G/c), the KV transfer of each request follows the plan's transfer model, and its decode "
             "pool admits up to its batch cap with one slot queue; TTFT = prefill wait + prefill + transfer (prefill "
             "row), TPOT from the decode pool (decode row); dispatch, mode, kv, token budget and sampled availability "
             "apply to aggregated pools only")


def is_pair_row(row: PoolResult) -> bool:
    """Whether an evaluated row is one phase of a P/D pair (``phase`` ``prefill`` or ``decode``)."""
    return getattr(row, "phase", "both") != "both"


def has_pairs(pools) -> bool:
    """Whether a plan (PoolPlans) holds a P/D pair."""
    return any(getattr(p, "decode", None) is not None for p in pools)


def pair_name(lo: int, hi: int, prefill_gpu: str, decode_gpu: str) -> str:
    """A pair's name as the simulator's router knows it: ``LO-HI:PREFILL+DECODE``."""
    return f"{lo}-{hi}:{prefill_gpu}+{decode_gpu}"


def pair_traffic(instance: Instance, lo: int, hi: int, chunk_tokens: int) -> PhaseTraffic:
    """The requests of the instance's workload whose total length lies in :math:`(lo, hi]`, as the stations read
    them (:class:`~fleetopt.models.queueing.disagg.PhaseTraffic`; chunk cuts at ``chunk_tokens``)."""
    from fleetopt.models.queueing.disagg import PhaseTraffic

    w = instance.workload
    if isinstance(w.lengths, RequestTrace):
        return PhaseTraffic.from_trace(w.lengths, lo, hi, w.arrival_rate_req_per_s)
    return PhaseTraffic.from_distribution(w.lengths, lo, hi, w.arrival_rate_req_per_s,
                                          input_fraction=w.input_fraction, chunk_tokens=(chunk_tokens,))


def _transfer(plan: PoolPlan) -> KVTransfer:
    if plan.transfer is None:
        raise InstanceError(f"--fleet: the P/D pair {plan.lo_tokens}-{plan.hi_tokens} has no KV transfer "
                            "(PoolPlan.transfer); give one (pools.kv_transfer)")
    return plan.transfer


def pair_stations(instance: Instance, plan: PoolPlan, level: ServiceLevel) -> tuple[PrefillStation, DecodeStation]:
    """The analytic prefill and decode stations of a pair plan on its segment's traffic."""
    from fleetopt.models.queueing.disagg import DecodeStation, PrefillStation

    d = plan.decode
    if d is None:
        raise ValueError("pair_stations: the pool is no P/D pair (PoolPlan.decode is None)")
    traffic = pair_traffic(instance, plan.lo_tokens, plan.hi_tokens, int(plan.profile.chunk_tokens))
    pre = PrefillStation.from_profile(plan.profile, traffic, _transfer(plan))
    dec = DecodeStation.from_profile(d.profile, traffic, window_tokens=plan.hi_tokens, tpot_slo_s=level.tpot_p99_s,
                                     max_num_seqs=d.max_num_seqs)
    return pre, dec


def pair_rows(instance: Instance, plan: PoolPlan, level: ServiceLevel) -> tuple[PoolResult, PoolResult]:
    r"""The prefill and decode rows of a pair plan from the analytic stations
    (:func:`fleetopt.models.queueing.disagg.evaluate_pair`), the record contract of
    :class:`fleetopt.models.fleet.PoolResult` (``phase``; the prefill row carries the TTFT figures and the miss
    probability, the decode row the output tokens and the TPOT bound, both the segment's arrival rate).

    Counts given (``replicas``, ``decode.replicas``) are kept; None sizes the phase to its least count
    (:meth:`PrefillStation.min_replicas` at the sizing target, :meth:`DecodeStation.min_replicas` at the
    utilisation cap), inflated for availability. Relaxation times (the warm-up floor's scale): prefill
    :math:`E[S_p](1 + c_s^2)/(1 - \rho_p)`, decode :math:`E[l_{out}]\,\bar t\,(1 + c_{out}^2)`.
    """
    from fleetopt.models.queueing.disagg import evaluate_pair

    pre, dec = pair_stations(instance, plan, level)
    d = plan.decode
    assert d is not None   # a pair plan: its decode stage is read right below
    if plan.replicas is None:
        s = pre.min_replicas(level.ttft_p99_s, rho_max=level.max_utilization,
                             margin=level.ttft_margin)
        n_p = int(inflate_for_availability(int(s.replicas[0]), plan.availability))
    else:
        n_p = int(plan.replicas)
    if d.replicas is None:
        s = dec.min_replicas(rho_max=level.max_utilization)
        n_d = int(inflate_for_availability(int(s.replicas[0]), d.availability))
    else:
        n_d = int(d.replicas)
    res = evaluate_pair(pre, dec, n_p, n_d, ttft_slo_s=level.ttft_p99_s, tpot_slo_s=level.tpot_p99_s,
                        rho_max=level.max_utilization, lo_tokens=plan.lo_tokens, hi_tokens=plan.hi_tokens)
    why = [r for r in res.reason.split("; ") if r]
    lam = pre.arrival_rate
    rho_p, rho_d = res.prefill_utilization, res.decode_utilization
    es = pre.mean_service_s
    share = lam / instance.workload.arrival_rate_req_per_s if instance.workload.arrival_rate_req_per_s > 0 else 0.0
    common: dict[str, Any] = dict(min_tokens=plan.lo_tokens, max_tokens=plan.hi_tokens, sized=False, arrival_rate=lam,
                  routing_share=share)
    p_ok = res.p99_ttft_s <= level.ttft_p99_s * (1 + 1e-12) and rho_p < 1.0
    prefill = PoolResult(
        **common, gpu=plan.gpu, profile=plan.profile.name, model=plan.profile.model_name,
        quality=quality_label(plan.profile), replicas=n_p, gpus=res.prefill_gpus, n_slots=1, max_num_seqs=1,
        utilization=rho_p, capacity_load=rho_p, ttft_p99_ms=res.p99_ttft_s * MS_PER_S,
        prefill_p99_ms=pre.ttft_floor_s * MS_PER_S, mean_prefill_ms=es * MS_PER_S, mean_service_s=es,
        cv2_service=pre.cv2_service, mean_batch=min(rho_p, 1.0), power_w=res.prefill_power_w, output_tok_per_s=0.0,
        tok_per_watt=0.0, cost_per_hr=n_p * plan.profile.cost_usd_per_hr, slo_met=bool(p_ok),
        utilization_ok=bool(rho_p <= level.max_utilization * (1 + 1e-12)),
        miss_reason="; ".join(r for r in why if r.startswith("prefill")), slo_miss_prob=res.ttft_miss_prob,
        tpot_p99_ms=0.0, phase="prefill",
        relaxation_s=es * (1.0 + pre.cv2_service) / (1.0 - rho_p) if lam > 0 and rho_p < 1 else 0.0)
    d_ok = not any(r.startswith("decode") and "utilisation" not in r for r in why) and rho_d < 1.0
    t_bar = res.mean_tpot_s
    decode = PoolResult(
        **common, gpu=d.gpu, profile=d.profile.name, model=d.profile.model_name, quality=quality_label(d.profile),
        replicas=n_d, gpus=res.decode_gpus, n_slots=dec.kv_slots, max_num_seqs=dec.cap, utilization=rho_d,
        capacity_load=rho_d, ttft_p99_ms=0.0, prefill_p99_ms=0.0, mean_prefill_ms=0.0,
        mean_service_s=dec.mean_output_tokens * t_bar if math.isfinite(t_bar) else 0.0, cv2_service=dec.cv2_output,
        mean_batch=res.decode_mean_batch, power_w=res.decode_power_w, output_tok_per_s=res.output_tok_per_s,
        tok_per_watt=res.output_tok_per_s / res.decode_power_w if res.decode_power_w > 0 else 0.0,
        cost_per_hr=n_d * d.profile.cost_usd_per_hr, slo_met=bool(d_ok),
        utilization_ok=bool(rho_d <= level.max_utilization * (1 + 1e-12)),
        miss_reason="; ".join(r for r in why if r.startswith("decode")), slo_miss_prob=0.0,
        tpot_p99_ms=res.tpot_bound_s * MS_PER_S, phase="decode",
        relaxation_s=(dec.mean_output_tokens * t_bar * (1.0 + dec.cv2_output)
                      if lam > 0 and math.isfinite(t_bar) else 0.0))
    return prefill, decode


def unit_rows(pools, rows) -> list[tuple[int, ...]]:
    """The evaluated rows of each plan pool, in order: ``(k,)`` for an aggregated pool, ``(k, k + 1)`` for a pair
    (its prefill and decode rows). ``ValueError`` when the rows do not follow the plan's pools."""
    out, k = [], 0
    for p in pools:
        if getattr(p, "decode", None) is None:
            out.append((k,))
            k += 1
        else:
            if k + 1 >= len(rows) or (rows[k].phase, rows[k + 1].phase) != ("prefill", "decode"):
                raise ValueError(f"the evaluated rows do not hold pool {p.lo_tokens}-{p.hi_tokens}'s prefill and "
                                 "decode rows")
            out.append((k, k + 1))
            k += 2
    if k != len(rows):
        raise ValueError(f"the plan has {len(pools)} pools but its evaluation {len(rows)} rows")
    return out


def analytic_fleet(instance: Instance, pools: list[PoolPlan]) -> FleetResult:
    """The plan's analytic evaluation (:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`); where it does not
    report a pair as its two phase rows yet, the pair's rows come from :func:`pair_rows` (the fleet-wide P99 is
    then left NaN: the mixture over both kinds of pool is the evaluation's)."""
    level = service_level(instance)
    analytic = evaluate_plans(instance, list(pools))
    if not has_pairs(pools):
        return analytic
    try:
        unit_rows(pools, analytic.pools)
        return analytic
    except ValueError:
        pass
    if len(analytic.pools) != len(pools):
        raise ValueError(f"the plan has {len(pools)} pools but its evaluation {len(analytic.pools)} rows")
    rows: list[PoolResult] = []
    for plan, row in zip(pools, analytic.pools):
        rows.extend((row,) if plan.decode is None else pair_rows(instance, plan, level))
    return summarize(rows, math.nan, level)


def disagg_pair(plan: PoolPlan, prefill: PoolResult, decode: PoolResult) -> DisaggPair:
    """The simulator's pair for a pair plan at its evaluated counts and decode batch cap (pool-queue prefill,
    module docstring)."""
    from fleetopt.solvers.des.disagg import DisaggPair

    d = plan.decode
    assert d is not None   # a pair plan (has_pairs)
    return DisaggPair(prefill_profile=plan.profile, prefill_replicas=int(prefill.replicas), decode_profile=d.profile,
                      decode_replicas=int(decode.replicas), window_tokens=int(plan.hi_tokens),
                      decode_max_num_seqs=int(decode.max_num_seqs), prefill_queue="pool")


def transfer_times(plan: PoolPlan, prompt_tokens: np.ndarray) -> np.ndarray:
    """Each request's KV-transfer seconds: :meth:`KVTransfer.time_s` of its prompt and its prefill alone on the
    prefill profile (:func:`prefill_service_s`, the pool-queue station's service; module docstring)."""
    from fleetopt.models.queueing.disagg import prefill_service_s

    prompt = np.asarray(prompt_tokens)
    return np.asarray(_transfer(plan).time_s(prompt, prefill_service_s(plan.profile, prompt)), dtype=float)

