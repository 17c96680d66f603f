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
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import singledispatch
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetopt.models.profiles import ServingProfile, quality_label
from fleetopt.models.queueing.batched import mean_activity_power_w, mean_power_w, mean_prefill_s, operating_point
from fleetopt.models.queueing.batched import _nodes, batched_miss_grid, batched_miss_prob, batched_ttft_p99_s
from fleetopt.models.numerics import bisect_boundary, bisect_level, unique
from fleetopt.models.queueing.erlang import prefill_p99_s, ttft_miss_prob, ttft_p99_s
from fleetopt.models.segments import compressed_band, raw_between, segment_basis, stats_from_raw
from fleetopt.models.power import ActivityPower
from fleetopt.models.service import decode_power_curve, tpot_batch_cap, tpot_bound_s
from fleetopt.models.queueing.ttft import BatchedModel, SlotModel, TTFTModel, ttft_model
from fleetopt.models.units import HOURS_PER_YEAR, MS_PER_S, P99_TAIL
from fleetopt.models.workload import LengthDistribution, RequestTrace

if TYPE_CHECKING:   # the disaggregated pairs' model loads with the first pair (_phase_traffic, _evaluate_pair)
    from fleetopt.models.queueing.disagg import KVTransfer, PhaseTraffic

__all__ = ["PoolPlan", "DecodeStage", "PHASES", "PoolResult", "FleetResult", "ServiceLevel", "evaluate_fleet",
           "evaluate_traffic", "sizing_target_s", "inflate_for_availability"]

AVAILABILITY_SLACK = 1e-9
""":func:`inflate_for_availability` rounds :math:`N / A` up only when it exceeds an integer by more than this."""


def inflate_for_availability(replicas, availability: float):
    r"""Replicas to deploy so that ``replicas`` are up while a share :math:`1 - A` of them is down:
    :math:`\lceil N / A \rceil` (array-aware; an ``int`` for a scalar).

    With :math:`M` deployed and each up with probability :math:`A`, :math:`A M` are up on average; the least whole
    :math:`M` with :math:`A M \ge N` is the ceiling. A ratio within :data:`AVAILABILITY_SLACK` above an integer
    is that integer: :math:`N / A` computed in floating point can land a rounding error above an exact quotient
    (21 / 0.7 gives 30.000000000000004), which must not buy a replica more. ``replicas`` 0 stays 0.

    >>> inflate_for_availability(7, 0.99), inflate_for_availability(10, 1.0), inflate_for_availability(21, 0.7)
    (8, 10, 30)
    """
    n = np.ceil(np.asarray(replicas, dtype=float) / availability - AVAILABILITY_SLACK).astype(np.int64)
    return int(n) if n.ndim == 0 else n


def sizing_target_s(ttft_p99_s: float, margin: float) -> float:
    """The P99 TTFT a pool's least count aims at: :math:`(1 - m)\\, T_{SLO}`, the SLO less a margin :math:`m` for
    the model's error and a simulation's resolution (``docs/models.md``, "The sizing margin").

    >>> sizing_target_s(0.5, 0.03)
    0.485
    """
    return ttft_p99_s * (1.0 - margin)


@dataclass(frozen=True)
class ServiceLevel:
    """What a fleet must deliver: P99 TTFT under a TTFT model, and the utilisation cap."""

    ttft_p99_s: float
    ttft_model: str = "batched"
    max_utilization: float = 0.85
    scope: str = "pool"
    """``pool``: every pool meets the P99 on its own requests; ``fleet``: the P99 over all requests."""
    tpot_p99_s: float | None = None
    """Time per output token bound each pool must meet (None: no TPOT SLO)."""
    ttft_margin: float = 0.0
    """Share of ``ttft_p99_s`` a pool sized here (``PoolPlan.replicas`` None) keeps free: it is sized to
    :attr:`ttft_sizing_s` and judged against ``ttft_p99_s``."""

    @property
    def model(self) -> TTFTModel:
        """The implementation of ``ttft_model`` (:func:`fleetopt.models.queueing.ttft.ttft_model`)."""
        return ttft_model(self.ttft_model)

    @property
    def ttft_sizing_s(self) -> float:
        """The P99 TTFT a pool's minimum count aims at (:func:`sizing_target_s`)."""
        return sizing_target_s(self.ttft_p99_s, self.ttft_margin)


@dataclass(frozen=True)
class PoolPlan:
    """A pool to evaluate; ``replicas=None`` sizes it to its minimum count."""

    lo_tokens: int
    hi_tokens: int
    gpu: str
    profile: ServingProfile
    replicas: int | None = None
    availability: float = 1.0
    compress_gamma: float = 1.0
    """Compress-and-route: the pool also takes requests in :math:`(hi, \\gamma \\cdot hi]`, prompt-compressed to
    fit its window, with the fleet's success probability (the rest stay with the pool above)."""
    max_num_seqs: int | None = None
    """Batch cap per replica (None: the profile's slots; with a TPOT SLO, the largest cap meeting it)."""
    decode: DecodeStage | None = None
    """Disaggregated prefill/decode: the decode pool of the pair. None: an aggregated pool (every replica both
    prefills and decodes). When set, ``gpu``, ``profile``, ``replicas`` and ``availability`` describe the
    prefill pool, ``max_num_seqs`` is ignored (the decode stage carries its own cap) and ``compress_gamma``
    must be 1."""
    transfer: KVTransfer | None = None
    """The KV hand-off of a disaggregated pair (:class:`fleetopt.models.queueing.disagg.KVTransfer`); required
    with ``decode``."""

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases the pool's rows report: ``("both",)``, or ``("prefill", "decode")`` for a pair."""
        return ("both",) if self.decode is None else PAIR_PHASES


PHASES = ("both", "prefill", "decode")
"""What a pool's replicas do: ``both`` (aggregated: prefill and decode on every replica), ``prefill`` or
``decode`` (the two pools of a disaggregated pair, which serve the same length segment)."""
PAIR_PHASES = ("prefill", "decode")


@dataclass(frozen=True, kw_only=True)
class DecodeStage:
    """The decode pool of a disaggregated prefill/decode pair (:attr:`PoolPlan.decode`).

    ``replicas=None`` sizes it to its minimum count (:class:`fleetopt.models.queueing.disagg.DecodeStation`);
    ``max_num_seqs=None``: the profile's KV slots at the window, less where the TPOT SLO asks.
    """

    gpu: str
    profile: ServingProfile
    replicas: int | None = None
    max_num_seqs: int | None = None
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
    slo_miss_prob: float
    """:math:`P(T > T_{SLO})` for this pool's requests."""
    compress_gamma: float = 1.0
    """Compress-and-route factor: the pool also serves compressed requests up to this multiple of its window."""
    max_num_seqs: int = 0
    """The batch cap the pool runs with (= ``n_slots``)."""
    tpot_p99_ms: float = 0.0
    """Upper bound on the time per output token: one iteration at the batch cap with full contexts."""
    capacity_load: float = math.nan
    """Offered load over the pool's throughput with every batch place taken (the batched model's
    :math:`\\rho_f`; the slot models' utilisation, whose slots are charged a full batch). ``max_utilization``
    caps it: it is the pool's headroom against saturation. NaN: not computed."""
    relaxation_s: float = 0.0
    """Time scale over which the pool's occupancy forgets its start (s): :math:`E[S](1 + c_s^2)` for the slot
    models; for the batched model :math:`R (1 + c_I^2) / (1 - x)`, the context feedback slowing the relaxation
    (:mod:`fleetopt.models.queueing.batched`). Simulations warm up and run for multiples of it."""
    phase: str = "both"
    """What the pool's replicas do (:data:`PHASES`). A disaggregated pair is two rows over the same segment,
    ``prefill`` first: the prefill row carries the arrival rate, the TTFT figures (wait + prefill + KV transfer)
    and the miss probability; the decode row carries the output tokens, the TPOT figures and ``arrival_rate``
    equal to the prefill row's (each request passes both), and is left out of fleet-wide rate sums
    (:func:`summarize`)."""


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
    ttft_p99_ms: float
    """P99 TTFT over all requests of the fleet (the mixture of the pools)."""
    slo_miss_share: float
    """Share of all requests whose TTFT exceeds the SLO."""
    scope: str = "pool"


def evaluate_fleet(pools: list[PoolPlan], workload: LengthDistribution | RequestTrace, arrival_rate: float,
                   level: ServiceLevel, input_fraction: float = 0.8, compress_success: float = 1.0,
                   fleet_p99: bool = True) -> FleetResult:
    """Evaluate (and where asked, size) every pool analytically.

    ``pools`` must tile :math:`(0, B_{max}]` in order; the workload must not
    extend beyond :math:`B_{max}` (truncate it first). With compress-and-route
    (``compress_gamma > 1``) pool :math:`p` serves its own range less the share
    ``compress_success`` of :math:`(lo_p, \\gamma_{p-1} lo_p]` compressed into the
    pool below, plus that share of :math:`(hi_p, \\gamma_p hi_p]` compressed to
    :math:`hi_p`; a band must end within the next pool, and the top pool has none. Without ``fleet_p99`` the
    fleet-wide P99 (a root of the pools' mixture, :func:`fleet_ttft_p99_s`) is left NaN: a caller that reads
    only the pools and the totals saves its bisection.
    """
    raws = _pool_traffic_cached(pools, workload, input_fraction, compress_success)
    phases = [None if p.decode is None else _phase_traffic(p, workload, arrival_rate, input_fraction)
              for p in pools]
    return evaluate_traffic(raws, pools, arrival_rate, level, fleet_p99, phases)


def _phase_traffic(plan: PoolPlan, workload, arrival_rate: float, input_fraction: float) -> PhaseTraffic:
    """The requests of a pair's segment as a discrete law (:class:`fleetopt.models.queueing.disagg.PhaseTraffic`)."""
    from fleetopt.models.queueing.disagg import PhaseTraffic

    if plan.compress_gamma != 1.0:
        raise ValueError(f"pool {plan.lo_tokens}-{plan.hi_tokens}: a disaggregated pair takes no compressed band "
                         "(compress_gamma must be 1)")
    if isinstance(workload, RequestTrace):
        return PhaseTraffic.from_trace(workload, plan.lo_tokens, plan.hi_tokens, arrival_rate)
    return PhaseTraffic.from_distribution(workload, plan.lo_tokens, plan.hi_tokens, arrival_rate,
                                          input_fraction=input_fraction, chunk_tokens=(plan.profile.chunk_tokens,))


def evaluate_traffic(raws: list, pools: list[PoolPlan], arrival_rate: float, level: ServiceLevel,
                     fleet_p99: bool = True, phase_traffic: list | None = None) -> FleetResult:
    """Evaluate pools whose traffic is given as raw moment sums (:class:`fleetopt.models.segments.RawSums`).

    This is the entry point for routings other than length tiling (e.g. split routing, where a pool
    receives a weighted mix of elementary segments). ``fleet_p99``: as in :func:`evaluate_fleet`. A disaggregated
    pair (``PoolPlan.decode``) reads its segment's requests from ``phase_traffic[k]``
    (:class:`~fleetopt.models.queueing.disagg.PhaseTraffic`, :func:`evaluate_fleet` builds it) and gives two rows,
    prefill then decode (:func:`_evaluate_pair`).
    """
    evaluated = []
    for k, (raw, p) in enumerate(zip(raws, pools)):
        if p.decode is None:
            evaluated.append(_evaluate_pool(raw, p, arrival_rate, level))
            continue
        traffic = None if phase_traffic is None else phase_traffic[k]
        if traffic is None:
            raise ValueError(f"pool {p.lo_tokens}-{p.hi_tokens}: a disaggregated pair needs its segment's requests "
                             "(phase_traffic; evaluate_fleet builds them)")
        pre, dec = _evaluate_pair(traffic, p, level)
        evaluated.extend((pre, dec))
    results = [r for r, _ in evaluated]
    if not fleet_p99:
        p99 = math.nan
    else:
        live = [(r, tail) for r, tail in evaluated if r.arrival_rate > 0 and r.phase != "decode"]
        p99 = _mixture_p99_s([r.arrival_rate for r, _ in live], [miss for _, (miss, _) in live],
                             [p99_s for _, (_, p99_s) in live])
    return summarize(results, p99, level)


TRAFFIC_CACHE_SIZE = 8
"""Tilings whose pools' traffic :func:`_pool_traffic_cached` keeps (a solve evaluates its plan, then a what-if
scenario's binding trial the same windows at other counts)."""
_TRAFFIC: OrderedDict[tuple, list] = OrderedDict()


def _pool_traffic_cached(pools: list[PoolPlan], workload, input_fraction: float, p_c: float) -> list:
    """The raw traffic sums of :func:`_pool_traffic`, kept for the last :data:`TRAFFIC_CACHE_SIZE` tilings.

    They depend on the workload (a frozen object, keyed by identity: the key holds it, so its identity is not
    reused while cached), the input fraction, the compression success and each pool's window, compression factor
    and chunk size, not on its GPU or counts; the sums are frozen (:class:`fleetopt.models.segments.RawSums`),
    so a hit hands out the same objects the miss computed."""
    key = (workload, float(input_fraction), float(p_c),
           tuple((p.lo_tokens, p.hi_tokens, float(p.compress_gamma), p.profile.chunk_tokens) for p in pools))
    raws = _kept(_TRAFFIC, key)
    if raws is None:
        raws = _keep(_TRAFFIC, key, _pool_traffic(pools, workload, input_fraction, p_c)[0], TRAFFIC_CACHE_SIZE)
    return list(raws)


_LOCK = threading.Lock()
"""Guards the kept values' maps: a Dask worker runs tasks in threads of one process."""


def _kept(cache: OrderedDict, key):
    """``cache[key]`` marked as just used, or None."""
    with _LOCK:
        value = cache.get(key)
        if value is not None:
            cache.move_to_end(key)
        return value


def _keep(cache: OrderedDict, key, value, size: int):
    """Store ``value`` under ``key``, dropping the least recently used beyond ``size`` entries; returns ``value``."""
    with _LOCK:
        cache[key] = value
        while len(cache) > size:
            cache.popitem(last=False)
    return value


def _pool_traffic(pools: list[PoolPlan], workload, input_fraction: float, p_c: float):
    """Raw traffic sums of every pool (see :func:`evaluate_fleet`)."""
    if not pools:
        raise ValueError("a fleet needs at least one pool")
    if not 0.0 <= p_c <= 1.0:
        raise ValueError(f"compress_success must lie in [0, 1]; got {p_c}")
    edges = [pools[0].lo_tokens]
    for p in pools:
        if p.lo_tokens != edges[-1] or p.hi_tokens <= p.lo_tokens:
            raise ValueError(f"pools must tile the length range in order; {p.lo_tokens}-{p.hi_tokens} does not "
                             f"follow {edges[-1]}")
        edges.append(p.hi_tokens)
    if edges[0] != 0:
        raise ValueError("the first pool must start at 0 tokens")
    tops = []
    for k, p in enumerate(pools):
        if p.compress_gamma < 1.0:
            raise ValueError(f"compress_gamma must be >= 1; pool {p.lo_tokens}-{p.hi_tokens} has {p.compress_gamma}")
        if p.compress_gamma > 1.0:
            if k == len(pools) - 1:
                raise ValueError("the top pool has no pool above it to take compressed requests from")
            top = p.compress_gamma * p.hi_tokens
            if top > pools[k + 1].hi_tokens:
                raise ValueError(f"the compression band of pool {p.lo_tokens}-{p.hi_tokens} ends at {top:g} tokens, "
                                 f"beyond the next pool's {pools[k + 1].hi_tokens}")
            tops.append(top)
    grid = unique(np.asarray(edges + tops, dtype=float))
    index = {float(x): n for n, x in enumerate(grid)}
    bases = {c: segment_basis(workload, grid, c, input_fraction)
             for c in sorted({p.profile.chunk_tokens for p in pools})}
    raws = []
    for k, p in enumerate(pools):
        basis = bases[p.profile.chunk_tokens]
        lo, hi = index[float(p.lo_tokens)], index[float(p.hi_tokens)]
        gamma_below = pools[k - 1].compress_gamma if k > 0 else 1.0
        if gamma_below > 1.0 and p_c > 0:
            mid = index[float(gamma_below * p.lo_tokens)]
            raw = raw_between(basis, lo, mid).scaled([1.0 - p_c]) + raw_between(basis, mid, hi)
        else:
            raw = raw_between(basis, lo, hi)
        if p.compress_gamma > 1.0 and p_c > 0:
            raw = raw + compressed_band(workload, p.hi_tokens, p.compress_gamma, p.profile.chunk_tokens,
                                        input_fraction).scaled([p_c])
        raws.append(raw)
    return raws, grid


def fleet_ttft_p99_s(queues: list[tuple], level: ServiceLevel) -> float:
    r"""99th percentile of TTFT over all requests: solve :math:`\sum_p \lambda_p P_p(T > t) = q \sum_p \lambda_p`.

    ``queues`` holds, per pool, the arguments of :func:`fleetopt.models.queueing.erlang.ttft_miss_prob` after ``t``
    (servers, rate, E[S], cv2, prefill times, prefill probabilities, mean prefill); :math:`q = 0.01`
    (:data:`fleetopt.models.units.P99_TAIL`). The mixture's miss probability decreases in :math:`t`, and the
    largest pool P99 bounds the root from above, so the root is bisected on :math:`[0, \max_p T_{99,p}]`
    (:func:`fleetopt.models.numerics.bisect_boundary`); ``inf`` when the fleet misses even there.
    """
    live = [q for q in queues if q[1] > 0]
    return _mixture_p99_s([q[1] for q in live], [lambda t, q=q: float(ttft_miss_prob(t, *q, model=level.ttft_model)[0])
                                                 for q in live],
                          [float(np.atleast_1d(ttft_p99_s(*q, model=level.ttft_model))[0]) for q in live])


def _mixture_p99_s(rates: list[float], misses: list, p99s: list[float]) -> float:
    """Root of :math:`\\sum_p \\lambda_p P_p(T > t) = q \\sum_p \\lambda_p` on :math:`[0, \\max_p T_{99,p}]`
    (:func:`fleet_ttft_p99_s`); ``misses[p](t)`` is pool :math:`p`'s :math:`P(T > t)`. With one pool the root is that
    pool's own P99, ``p99s[0]``, returned as it is."""
    if not rates:
        return 0.0
    if len(rates) == 1:
        return float(p99s[0])
    total = sum(rates)

    def miss(t):
        return sum(r * m(t) for r, m in zip(rates, misses)) / total

    hi = max(p99s)
    if not np.isfinite(hi) or miss(hi) > P99_TAIL + 1e-12:
        return math.inf
    if all(callable(getattr(m, "grid", None)) for m in misses):   # many times per call, the same root
        def miss_grid(t: np.ndarray) -> np.ndarray:
            return np.asarray(sum(r * m.grid(t) for r, m in zip(rates, misses)) / total)

        _, hi = bisect_level(miss_grid, P99_TAIL, 0.0, hi)
    else:
        _, hi = bisect_boundary(lambda t: miss(float(t)) > P99_TAIL, 0.0, hi)
    return float(hi)


def summarize(results: list[PoolResult], fleet_p99_s: float = math.nan,
              level: ServiceLevel | None = None) -> FleetResult:
    """Fleet totals of evaluated pools; feasibility follows the SLO scope of ``level``."""
    cost = sum(r.cost_per_hr for r in results)
    power_w = sum(r.power_w for r in results)
    out = sum(r.output_tok_per_s for r in results)
    scope = "pool" if level is None else level.scope
    entry = [r for r in results if r.phase != "decode"]   # each request counted once: at its first pool
    total = sum(r.arrival_rate for r in entry)
    miss_share = sum(r.arrival_rate * r.slo_miss_prob for r in entry) / total if total > 0 else 0.0
    if scope == "fleet":
        slo_met = miss_share <= P99_TAIL * (1 + 1e-9) and all(r.utilization < 1.0 for r in results)
    else:
        slo_met = all(r.slo_met for r in results)
    return FleetResult(
        pools=tuple(results),
        cost_per_hr=cost,
        cost_per_year=cost * HOURS_PER_YEAR,
        total_replicas=sum(r.replicas for r in results),
        total_gpus=sum(r.gpus for r in results),
        power_kw=power_w / 1000.0,
        tok_per_watt=out / power_w if power_w > 0 else 0.0,
        slo_met=slo_met,
        feasible=slo_met and all(r.utilization_ok for r in results),
        ttft_p99_ms=fleet_p99_s * MS_PER_S,
        slo_miss_share=miss_share,
        scope=scope,
    )


def _evaluate_pool(raw, plan: PoolPlan, arrival_rate: float, level: ServiceLevel):
    """One pool's result and, for the fleet-wide P99, its miss function :math:`t \\mapsto P(T > t)` and its P99
    TTFT in seconds (:func:`_evaluate_under`)."""
    full = int(plan.profile.n_slots(plan.hi_tokens))
    cap = full if plan.max_num_seqs is None else min(full, int(plan.max_num_seqs))
    if plan.max_num_seqs is None and level.tpot_p99_s is not None:
        cap = min(cap, int(tpot_batch_cap(plan.profile, plan.hi_tokens, level.tpot_p99_s)))
    s = _segment_stats(raw, plan, cap)
    tpot = float(tpot_bound_s(plan.profile, max(cap, 1), plan.hi_tokens))
    tpot_ok = level.tpot_p99_s is None or (cap >= 1 and tpot <= level.tpot_p99_s * (1 + 1e-12))
    lam = float(arrival_rate * s.rate_share[0])
    return _evaluate_under(level.model, s, plan, lam, cap, full, tpot, tpot_ok, level)


STATS_CACHE_SIZE = 32
"""Pools whose segment statistics :func:`_segment_stats` keeps (with :func:`_pool_traffic_cached`'s sums, the plan's
pools read back when a what-if binding trial evaluates them at other counts)."""
_STATS: OrderedDict[tuple, tuple] = OrderedDict()
_BATCHED: OrderedDict[tuple, Any] = OrderedDict()
"""The batched model's traffic of the pools :data:`_STATS` holds, by their statistics, rate and cap."""


def _segment_stats(raw, plan: PoolPlan, cap: int):
    """:func:`fleetopt.models.segments.stats_from_raw` of a pool's traffic at its window and batch cap, kept for the
    last :data:`STATS_CACHE_SIZE` pools: they depend on the sums (frozen, keyed by identity), the window, the
    profile (by identity, held by the entry) and the cap, not on the replicas."""
    key = (raw, plan.lo_tokens, plan.hi_tokens, id(plan.profile), cap)
    hit = _kept(_STATS, key)
    if hit is not None and hit[0] is plan.profile:
        return hit[1]
    s = stats_from_raw(raw, [plan.lo_tokens], [plan.hi_tokens], plan.profile, n_slots=[cap])
    return _keep(_STATS, key, (plan.profile, s), STATS_CACHE_SIZE)[1]


@singledispatch
def _evaluate_under(model: TTFTModel, s, plan: PoolPlan, lam: float, cap: int, full: int, tpot: float,
                    tpot_ok: bool, level: ServiceLevel) -> tuple[PoolResult, tuple[Callable[[float], float], float]]:
    """One pool under ``model`` (:func:`_evaluate_pool`): one registered implementation per kind of model."""
    raise NotImplementedError(f"no pool evaluation for the TTFT model {model!r}")


def _replicas(model: TTFTModel, traffic, plan: PoolPlan, level: ServiceLevel) -> int:
    """The plan's count, or with ``replicas`` None the least count meeting the first target of
    :func:`_sizing_targets` any count meets, inflated for availability (:func:`inflate_for_availability`).

    When no count meets the SLO the utilisation cap alone sizes the pool, so that its cost is still meaningful;
    it is then reported as missing the SLO with its reason."""
    if plan.replicas is not None:
        return int(plan.replicas)
    for target in _sizing_targets(level):
        z = model.min_replicas(traffic, target, level.max_utilization)
        if z.feasible[0]:
            break
    return int(inflate_for_availability(int(z.replicas[0]), plan.availability))


@_evaluate_under.register
def _evaluate_pool_slots(model: SlotModel, s, plan: PoolPlan, lam: float, cap: int, full: int, tpot: float,
                         tpot_ok: bool, level: ServiceLevel):
    """One pool under a slot model (:class:`fleetopt.models.queueing.ttft.SlotModel`)."""
    n = int(s.n_slots[0])
    traffic = model.traffic(s, [lam])
    sized = plan.replicas is None
    replicas = _replicas(model, traffic, plan, level)
    es = float(s.mean_service_s[0]) if lam > 0 else 0.0
    servers = replicas * n
    ttft = float(model.p99_ttft_s(traffic, [replicas])[0]) if lam > 0 else 0.0
    miss = float(model.miss_probability(level.ttft_p99_s, traffic, [replicas])[0]) if lam > 0 else 0.0
    pf99 = prefill_p99_s(s.prefill_times_s, s.prefill_probs[0]) if lam > 0 else 0.0
    util = lam * es / servers if servers > 0 else (0.0 if lam == 0 else math.inf)
    floor = float(model.prefill_floor_s(traffic)[0]) if lam > 0 else 0.0
    batch = lam * es / replicas if replicas > 0 else 0.0
    curve = decode_power_curve(plan.profile, plan.hi_tokens / 2)
    power = replicas * float(curve.power_w(min(batch, n))) if replicas > 0 else 0.0
    out_tps = lam * float(np.nan_to_num(s.mean_output_tokens[0]))
    slo_met = bool(ttft <= level.ttft_p99_s * (1 + 1e-12))
    util_ok = bool(util <= level.max_utilization * (1 + 1e-12))
    return PoolResult(
        capacity_load=util,
        relaxation_s=es * (1.0 + float(np.nan_to_num(s.cv2_service[0]))) if lam > 0 else 0.0,
        slo_miss_prob=miss,
        compress_gamma=plan.compress_gamma,
        max_num_seqs=cap,
        tpot_p99_ms=tpot * MS_PER_S,
        min_tokens=plan.lo_tokens, max_tokens=plan.hi_tokens, gpu=plan.gpu, profile=plan.profile.name,
        model=plan.profile.model_name, quality=quality_label(plan.profile), replicas=replicas,
        gpus=replicas * plan.profile.gpus_per_replica, sized=sized, n_slots=full, arrival_rate=lam,
        routing_share=float(s.rate_share[0]), utilization=util, ttft_p99_ms=ttft * MS_PER_S,
        prefill_p99_ms=pf99 * MS_PER_S, mean_prefill_ms=float(np.nan_to_num(s.mean_prefill_s[0])) * MS_PER_S,
        mean_service_s=es, cv2_service=float(np.nan_to_num(s.cv2_service[0])), mean_batch=batch,
        power_w=power, output_tok_per_s=out_tps, tok_per_watt=out_tps / power if power > 0 else 0.0,
        cost_per_hr=replicas * plan.profile.cost_usd_per_hr, slo_met=slo_met and util < 1.0 and tpot_ok,
        utilization_ok=util_ok,
        miss_reason=(_miss_reason(full, lam, util, ttft, floor, level) if cap >= 1 or full < 1 else "")
        or ("" if tpot_ok or level.tpot_p99_s is None
            else f"TPOT bound {tpot * MS_PER_S:,.1f} ms at batch cap {max(cap, 1)} "
                 f"exceeds the {level.tpot_p99_s * MS_PER_S:,.0f} ms SLO"),
    ), (_first(model.miss_function(traffic, [replicas])), ttft)


def _sizing_targets(level: ServiceLevel) -> tuple[float, ...]:
    """The P99 TTFTs a pool of unknown count is sized to, in turn, until one is met: the sizing target, the SLO
    itself (a margin no count can keep), then none (the utilisation cap alone)."""
    return (level.ttft_sizing_s, *((level.ttft_p99_s,) if level.ttft_margin else ()), math.inf)


def _first(miss_of):
    """A one-pool miss function as a scalar one."""
    return lambda t: float(miss_of(t)[0])


@_evaluate_under.register
def _evaluate_pool_batched(model: BatchedModel, s, plan: PoolPlan, lam: float, cap: int, full: int, tpot: float,
                           tpot_ok: bool, level: ServiceLevel):
    """One pool under the batched replica model (:mod:`fleetopt.models.queueing.batched`)."""
    key = (s, lam, max(cap, 0))       # the statistics are frozen and kept (_segment_stats): keyed by identity
    traffic = _kept(_BATCHED, key)
    if traffic is None:
        traffic = _keep(_BATCHED, key, model.traffic(s, [lam], cap=[max(cap, 0)]), STATS_CACHE_SIZE)
    sized = plan.replicas is None
    replicas = _replicas(model, traffic, plan, level)
    live = lam > 0 and replicas > 0 and cap >= 1
    op = operating_point(traffic, [replicas])
    nodes = _nodes(traffic, op) if live else None    # what every miss probability at these replicas shares
    # one miss function for the SLO's miss share and the fleet's P99
    miss_of = _first(model.miss_function(traffic, [replicas])) if nodes is None else _BatchedMiss(traffic, op, nodes)
    if live:
        ttft = float(batched_ttft_p99_s(traffic, [replicas], op, nodes)[0])
        miss = miss_of(level.ttft_p99_s)
        pf99 = float(model.prefill_floor_s(traffic)[0])
        mean_pf = float(mean_prefill_s(traffic, op)[0])
        util = float(op.utilization[0]) if op.stable[0] else math.inf
        batch = float(min(op.mean_batch[0], cap)) if op.stable[0] else float(cap)
        curve = decode_power_curve(plan.profile, plan.hi_tokens / 2)
        if not op.stable[0]:
            power = replicas * float(curve.power_w(cap))
        elif isinstance(plan.profile.power, ActivityPower):
            power = replicas * float(mean_activity_power_w(plan.profile.power, traffic, op)[0])
        else:
            power = replicas * float(mean_power_w(curve.power_w, op, [cap])[0])
    else:
        ttft = 0.0 if lam == 0 else math.inf
        miss = 0.0 if lam == 0 else 1.0
        pf99 = mean_pf = 0.0
        util = 0.0 if lam == 0 else math.inf
        batch = 0.0
        power = (replicas * float(decode_power_curve(plan.profile, plan.hi_tokens / 2).power_w(0))
                 if replicas > 0 else 0.0)
    # served output: the whole offered rate when stable (an unstable pool's tok/W would describe load it drops)
    out_tps = lam * float(np.nan_to_num(s.mean_output_tokens[0])) if math.isfinite(util) else 0.0
    es = float(op.residence_s[0]) if live and op.stable[0] else 0.0
    slo_met = bool(ttft <= level.ttft_p99_s * (1 + 1e-12))
    load = float(op.full_load[0]) if live else (0.0 if lam == 0 else math.inf)
    util_ok = bool(load <= level.max_utilization * (1 + 1e-12))
    result = PoolResult(capacity_load=load,
        slo_miss_prob=miss, compress_gamma=plan.compress_gamma, max_num_seqs=cap, tpot_p99_ms=tpot * MS_PER_S,
        min_tokens=plan.lo_tokens, max_tokens=plan.hi_tokens, gpu=plan.gpu, profile=plan.profile.name,
        model=plan.profile.model_name, quality=quality_label(plan.profile), replicas=replicas,
        gpus=replicas * plan.profile.gpus_per_replica, sized=sized, n_slots=full, arrival_rate=lam,
        routing_share=float(s.rate_share[0]), utilization=util, ttft_p99_ms=ttft * MS_PER_S,
        prefill_p99_ms=pf99 * MS_PER_S, mean_prefill_ms=mean_pf * MS_PER_S, mean_service_s=es,
        cv2_service=float(traffic.cv2_iterations[0]), mean_batch=batch, power_w=power, output_tok_per_s=out_tps,
        tok_per_watt=out_tps / power if power > 0 else 0.0, cost_per_hr=replicas * plan.profile.cost_usd_per_hr,
        slo_met=slo_met and util < 1.0 and tpot_ok, utilization_ok=util_ok,
        miss_reason=(_miss_reason(full, lam, util, ttft, pf99, level, load) if cap >= 1 or full < 1 else "")
        or ("" if tpot_ok or level.tpot_p99_s is None
            else f"TPOT bound {tpot * MS_PER_S:,.1f} ms at batch cap {max(cap, 1)} "
                 f"exceeds the {level.tpot_p99_s * MS_PER_S:,.0f} ms SLO"))
    if live and op.stable[0]:
        result = replace(result, relaxation_s=float(op.residence_s[0] * (1.0 + traffic.cv2_iterations[0])
                                                     / (1.0 - op.context_load[0])))
    return result, (miss_of, ttft)


@dataclass(frozen=True, eq=False)
class _BatchedMiss:
    r"""A batched pool's :math:`t \mapsto P(T > t)` (:func:`fleetopt.models.queueing.batched.batched_miss_prob`) at
    its operating point, with :meth:`grid` for many times at once (:func:`_mixture_p99_s`)."""

    traffic: Any
    op: Any
    nodes: tuple

    def __call__(self, t: float) -> float:
        return float(batched_miss_prob(t, self.traffic, self.op.replicas, self.op, self.nodes)[0])

    def grid(self, t: np.ndarray) -> np.ndarray:
        """:math:`P(T > t)` at every element of ``t``, each to the last bit as :meth:`__call__` gives it."""
        t = np.asarray(t, dtype=float)
        return batched_miss_grid(t.reshape(1, -1), self.traffic, self.op, self.nodes).reshape(t.shape)


def _miss_reason(n, lam, util, ttft, prefill_floor_s, level: ServiceLevel, load: float | None = None) -> str:
    """Why a pool misses; ``prefill_floor_s`` is the model's prefill figure (:meth:`TTFTModel.prefill_floor_s`),
    ``load`` its capacity load where it differs from the utilisation (batched model)."""
    load = util if load is None else load
    slo_ms = level.ttft_p99_s * MS_PER_S
    if n < 1:
        return "no KV slot: the context window does not fit this GPU's KV cache"
    if lam > 0 and util >= 1.0:
        if not math.isfinite(load):
            return "overloaded: no replica serves its traffic"
        return f"overloaded: runs at {load:.2f} of its capacity, the queue grows without bound"
    if ttft <= level.ttft_p99_s * (1 + 1e-12):
        if load > level.max_utilization * (1 + 1e-12):
            what = "utilisation" if load == util else "full-batch load"
            return f"{what} {load:.2f} above the cap {level.max_utilization:.2f}"
        return ""
    return (level.model.pool_miss_reason(prefill_floor_s, level.ttft_p99_s)
            or f"queueing: P99 TTFT {ttft * MS_PER_S:,.0f} ms > SLO {slo_ms:,.0f} ms with these replicas")


def _evaluate_pair(traffic: PhaseTraffic, plan: PoolPlan, level: ServiceLevel):
    """A disaggregated prefill/decode pair (:mod:`fleetopt.models.queueing.disagg`) as its two rows, each with
    (for the fleet-wide P99) its miss function and P99 TTFT: the prefill row's are the pair's TTFT
    (wait + prefill + KV transfer), the decode row's are unused (it is left out of the mixture).

    Counts: the plan's, or with ``replicas`` None each station's least count
    (:meth:`~fleetopt.models.queueing.disagg.PrefillStation.min_replicas` at the sizing target, then the SLO, then the
    utilisation cap alone; :meth:`~fleetopt.models.queueing.disagg.DecodeStation.min_replicas`, else 0), inflated
    for each phase's availability. The verdict is :func:`~fleetopt.models.queueing.disagg.evaluate_pair`'s against
    the SLOs themselves: the prefill row meets its SLO when P99 TTFT and its utilisation do, the decode row when
    the TPOT bound, its utilisation and the slot wait do.
    """
    from fleetopt.models.queueing.disagg import DecodeStation, PrefillStation, evaluate_pair

    if plan.transfer is None:
        raise ValueError(f"pool {plan.lo_tokens}-{plan.hi_tokens}: a disaggregated pair needs its KV transfer")
    d = plan.decode
    assert d is not None
    pre = PrefillStation.from_profile(plan.profile, traffic, plan.transfer)
    dec = DecodeStation.from_profile(d.profile, traffic, window_tokens=plan.hi_tokens, tpot_slo_s=level.tpot_p99_s,
                                     max_num_seqs=d.max_num_seqs)
    rho = level.max_utilization
    if plan.replicas is None:
        z = None
        for t in _sizing_targets(level):
            z = pre.min_replicas(t, rho_max=rho)
            if z.feasible[0]:
                break
        n_p = int(inflate_for_availability(int(z.replicas[0]) if z is not None and z.feasible[0] else 0,
                                           plan.availability))
    else:
        n_p = int(plan.replicas)
    if d.replicas is None:
        zd = dec.min_replicas(rho_max=rho, wait_prob_max=P99_TAIL)
        n_d = int(inflate_for_availability(int(zd.replicas[0]), d.availability)) if zd.feasible[0] else 0
    else:
        n_d = int(d.replicas)
    r = evaluate_pair(pre, dec, n_p, n_d, ttft_slo_s=level.ttft_p99_s, tpot_slo_s=level.tpot_p99_s, rho_max=rho,
                      wait_prob_max=P99_TAIL, lo_tokens=plan.lo_tokens, hi_tokens=plan.hi_tokens)
    lam = traffic.arrival_rate
    problems = r.reason.split("; ") if r.reason else []
    pre_why = "; ".join(x for x in problems if x.startswith("prefill"))
    dec_why = "; ".join(x for x in problems if x.startswith("decode"))
    pre_ok = not pre_why and math.isfinite(r.prefill_utilization) and r.prefill_utilization < 1.0
    dec_ok = not dec_why and (math.isfinite(r.decode_utilization) or dec.output_tok_per_s <= 0)
    pre_util_ok = lam <= 0 or r.prefill_utilization <= rho * (1 + 1e-12)
    dec_util_ok = dec.output_tok_per_s <= 0 or r.decode_utilization <= rho * (1 + 1e-12)
    common: dict[str, Any] = dict(min_tokens=plan.lo_tokens, max_tokens=plan.hi_tokens, arrival_rate=lam,
                                  routing_share=traffic.rate_share, sized=plan.replicas is None, compress_gamma=1.0,
                                  tpot_p99_ms=r.tpot_bound_s * MS_PER_S)
    floor = pre.ttft_floor_s if lam > 0 else 0.0
    p_slots = int(plan.profile.n_slots(plan.hi_tokens))
    prefill_row = PoolResult(
        gpu=plan.gpu, profile=plan.profile.name, model=plan.profile.model_name, quality=quality_label(plan.profile),
        replicas=n_p, gpus=r.prefill_gpus, n_slots=p_slots, utilization=r.prefill_utilization,
        ttft_p99_ms=(r.p99_ttft_s if lam > 0 else 0.0) * MS_PER_S, prefill_p99_ms=floor * MS_PER_S,
        mean_prefill_ms=pre.mean_service_s * MS_PER_S, mean_service_s=pre.mean_service_s,
        cv2_service=pre.cv2_service, mean_batch=min(r.prefill_utilization, 1.0) if lam > 0 else 0.0,
        power_w=r.prefill_power_w, output_tok_per_s=0.0, tok_per_watt=0.0,
        cost_per_hr=n_p * plan.profile.cost_usd_per_hr, slo_met=bool(pre_ok), utilization_ok=bool(pre_util_ok),
        miss_reason=pre_why, slo_miss_prob=(r.ttft_miss_prob if lam > 0 else 0.0), max_num_seqs=1,
        capacity_load=r.prefill_utilization,
        relaxation_s=pre.mean_service_s * (1.0 + pre.cv2_service) if lam > 0 else 0.0, phase="prefill", **common)
    out_tps = dec.output_tok_per_s if math.isfinite(r.decode_utilization) else 0.0
    decode_row = PoolResult(
        gpu=d.gpu, profile=d.profile.name, model=d.profile.model_name, quality=quality_label(d.profile),
        replicas=n_d, gpus=r.decode_gpus, n_slots=dec.kv_slots, utilization=r.decode_utilization,
        ttft_p99_ms=0.0, prefill_p99_ms=0.0, mean_prefill_ms=0.0,
        mean_service_s=float(dec.mean_residence_s(n_d)) if n_d > 0 and math.isfinite(r.mean_tpot_s) else 0.0,
        cv2_service=dec.cv2_output, mean_batch=r.decode_mean_batch if math.isfinite(r.decode_mean_batch) else dec.cap,
        power_w=r.decode_power_w, output_tok_per_s=out_tps,
        tok_per_watt=out_tps / r.decode_power_w if r.decode_power_w > 0 else 0.0,
        cost_per_hr=n_d * d.profile.cost_usd_per_hr, slo_met=bool(dec_ok), utilization_ok=bool(dec_util_ok),
        miss_reason=dec_why, slo_miss_prob=0.0, max_num_seqs=dec.cap, capacity_load=r.decode_utilization,
        relaxation_s=float(dec.mean_residence_s(n_d)) if n_d > 0 and math.isfinite(r.mean_tpot_s) else 0.0,
        phase="decode", **common)
    p99 = r.p99_ttft_s if lam > 0 else 0.0
    miss = pre.miss_function(n_p) if n_p > 0 else (lambda t: 1.0)
    return ((prefill_row, (lambda t: float(np.asarray(miss(t)).ravel()[0]), p99)),
            (decode_row, (lambda t: 0.0, 0.0)))
