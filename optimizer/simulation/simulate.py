r"""``fleetopt simulate``: a fleet plan -> the discrete-event simulator -> a report with confidence intervals.

:func:`simulate_plan` is the one pipeline function the CLI and the plan
verifier call. It evaluates the plan analytically (sizing pools given without
a replica count, as ``evaluate`` does), builds the same pools for
:func:`fleetopt.solvers.des.engine.simulate` (replicas and batch cap ``max_num_seqs`` from the
analytic evaluation), draws the request stream of the instance's workload,
runs independent replications and reports, per pool and for the fleet, the
simulated latencies next to the analytic numbers.

This module holds the pipeline (options and plan checked at the edge, the
replications, the stopping rule); the report records and their assembly from
the replications are in :mod:`fleetopt.optimizer.simulation.records`; the CLI's table and
progress bar (:func:`fleetopt.optimizer.output.render.render_simulation`,
:func:`fleetopt.optimizer.commands.progress.progress_bar`) sit above this stage.

Measurement protocol
--------------------
Each replication generates ``n`` requests and runs until the last arrival
:math:`T` (the horizon). Arrivals before the warm-up instant

.. math:: T_w = \min\left(\max\left(wT,\; 2 \max_p \tau_p\right),\; T/2\right)

are discarded (:math:`w` = ``warmup_share``; :math:`\tau_p` the pool's relaxation time from its analytic
evaluation, ``PoolResult.relaxation_s``: :math:`E[S_p^2]/E[S_p] = E[S_p](1 + c_{s,p}^2)` under the slot
models, and that scale stretched by :math:`1/(1 - x_p)` under the batched model, whose iterations slow down
as the batch fills). The floor bounds the start-up
transient: a pool started empty lacks :math:`\lambda E[(S - t)^+]` busy slots
at :math:`t` (M/G/:math:`\infty`), and :math:`(s - t)^+ \le s^2/(4t)` gives
at most 1/8 of its load at :math:`t = 2E[S^2]/E[S]`. Long-tailed service times
(a long-context pool) can make the floor exceed half the span; then
:math:`T/2` is used and a note says that pool's utilisation and power are low
estimates (raise ``requests`` or lower ``replications``). Arrivals in the
last :math:`T_c = \min(\max(cT, 10\, T_{SLO}), T/4)` (:data:`COOLDOWN_SHARE`
:math:`c`, :data:`COOLDOWN_SLOS`) keep the load on while the measured requests
finish, so a measured request still waiting at the horizon has waited at
least ten TTFT SLOs (unless the span is too short for that). The *measured*
requests arrive in :math:`[T_w, T - T_c]`; time averages (utilisation, batch,
power) cover :math:`[T_w, T]`.

* A measured request without a first token at the horizon (still queued, or
  rejected by its router) counts as :math:`+\infty` in the TTFT and wait
  percentiles and as an SLO miss: it waited at least :math:`T_c`.
* TPOT and E2E percentiles cover the *completed* measured requests only (a
  very long request may still be decoding at the horizon); ``unfinished``
  counts the others.
* The P99 TTFT interval (95 %) comes from independent replications
  (:func:`fleetopt.solvers.des.metrics.quantile_ci`, generators spawned from one
  ``SeedSequence`` by :func:`fleetopt.solvers.des.metrics.replicate`), or from batch
  means of one run (:func:`fleetopt.solvers.des.metrics.batch_means_ci`, 20 batches)
  when there is one replication or the arrivals replay a trace (a replay is
  deterministic, so its replications would be copies).
* ``slo_met`` requires the *upper* bound of the interval to meet the SLO (and
  the TPOT interval's upper bound, when the instance sets a TPOT SLO), per pool
  or over the fleet as ``slo.scope`` says; ``slo_met_point`` uses the point
  estimates.
* Power is the engine's exact integral of each replica's power curve over its
  simulated batch; energy per output token is the fleet's energy over the
  window divided by the output tokens of the requests completed in it.
* Preemptions: the engine's count of KV-cache preemptions (recompute), per
  pool summed over the replications (:mod:`fleetopt.solvers.des.engine`, "KV blocks and
  preemption"). A pool whose ``max_num_seqs`` is at most ``n_slots`` of its
  window never runs out of KV blocks, so it reports 0.
* All replicas are up: availability (``gpus[].availability``) is not
  simulated, as the analytic evaluation of fixed counts does not derate them,
  unless ``engine.availability="sampled"`` draws the replicas up per
  replication (:mod:`fleetopt.optimizer.simulation.options`). A pool drawn with none up then
  has no capacity in that replication: its utilisation, batch, power, energy
  and slot-seconds count as 0 there (its requests are rejected, SLO misses).

The settings are one :class:`fleetopt.optimizer.simulation.options.SimOptions`
(``warmup_share`` is :math:`w`); the report keeps them as provenance
(``SimReport.options``, with ``router="auto"`` and a default ``spill_bound``
resolved to what ran). With ``precision`` the requests per replication double
until the P99 intervals that decide the verdict are narrow enough, or
``max_requests`` would be exceeded. Under a fleet-scope SLO that is the fleet
P99's interval (half-width at most ``precision`` x P99); under a pool-scope SLO
it is every pool with traffic, each of which must also hold at least
:data:`fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS` measured requests
(a pool whose P99 is unbounded, more than 1 % of its requests without a first
token, is decided: it misses whatever the run length). ``stopped_by`` says which
(``requests`` without a precision target, ``precision``, ``max_requests``,
``trace_length`` when a replay has no more requests, ``p99_unbounded`` when more
than 1 % of all measured requests get no first token, so more requests cannot
narrow it).

Semantic plans
--------------
A multi-model plan (an instance's ``semantic`` section; :mod:`fleetopt.optimizer.plan.semantic`) has one tiling of
pools per model class. Its stream is drawn as for any plan (the instance's workload and seed). The router
(:class:`SemanticRouter`) then sends a request of total length :math:`L` to the small class when its uniform draw
:math:`U < \alpha(L)` (the plan's rule, :class:`fleetopt.models.semantic.ShareRule`), else to the large class, and
routes it by length within that class's pools, which tile :math:`(0, B_c]`. The draws come from a generator of
their own, derived from the replication's seed path (:data:`_CLASS_SEED_KEY`), never from the stream's, so every
plan simulated with one seed classifies the same requests the same way (common random numbers: a plan with one
replica fewer sees the same requests in each class). Given the lengths, the classes are independent thinnings,
so a class receives a binomial share with mean :math:`\pi_c` and a Poisson stream of rate :math:`\pi_c \Lambda`
within the class, the traffic its pools were sized for. All pools run through the engine together; the report's
rows carry their ``role`` (small or large), the analytic side is
:func:`fleetopt.optimizer.plan.semantic.evaluate_semantic` of the same pools, the fleet's P99 TTFT and attainment
cover every request of both classes, and ``SimReport.semantic`` gives each class's measured share beside
:math:`\pi_c`. Thin pools get dedicated runs as elsewhere (the router decides each request from itself and its
own draws). Semantic plans take ``--router auto`` or ``length`` only.

P/D pairs
---------
A plan's pool may be a disaggregated prefill/decode pair (``PoolPlan.decode``). The stream is drawn and routed as
for any plan (length or random routing: the routers that read queues or rewrite requests refuse pairs); the
aggregated pools' requests run through the engine together, each pair's through
:func:`fleetopt.solvers.des.disagg.simulate_disaggregated` (:func:`_mixed_replication`; the pair's stations and KV
transfer: :mod:`fleetopt.optimizer.simulation.pairs`), with the same horizon, warm-up and measured window. The pair
is two rows of the report (the analytic evaluation's ``phase`` rows): the prefill row measures and is judged on
the pair's TTFT, the decode row on its TPOT (:func:`fleetopt.optimizer.simulation.records.build_report`); a
measured request counts once in the fleet's figures. A thin pair gets a dedicated run like a thin pool.

Thin pools
----------
A pool whose share of the stream is tiny (a compress-and-route plan's top pool can get under 0.01 % of the
requests) ends a run with fewer than :data:`fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS` measured
requests, and no run length the user would wait for changes that. Such a pool is then measured in a *dedicated
run* (:func:`_thin_pool_runs`). Under Poisson arrivals and a router that decides each request from the request
itself and its own draws (length, random, split, compress; not ``spillover``, which reads the queues), the
requests routed to one pool are a thinned Poisson stream of rate :math:`\lambda_p = \lambda\, s_p`, independent
of the other pools, and pools share nothing else, so the pool alone on that stream is the pool in the fleet.
The stream's lengths are drawn in chunks of up to :math:`2^{20}` requests from a generator of its own (the
router's draws come from another, so they do not shift it), routed, and the pool's requests kept until each
replication holds :math:`\lceil n_t` / ``replications`` :math:`\rceil` of them or
:data:`THIN_MAX_DRAWN` requests were drawn, where

.. math:: n_t = \max\left(\text{THIN\_POOL\_REQUESTS},\; \min\left(\frac{R}{P},\; s_p\, D\right)\right)

with :math:`R` = ``SimOptions.requests``, :math:`P` the pools with traffic, :math:`s_p` the pool's share of the
stream and :math:`D` = :data:`THIN_SCALED_DRAWN`: a thin pool gets the requests a pool of an even split would,
as far as :math:`D` draws find them, so that its P99 interval narrows with ``--requests`` like the others'
(a pool of 0.35 % of the stream: 25,000 requests at the default 50,000 over two pools), and never fewer than
:data:`THIN_POOL_REQUESTS` (a pool of 0.0035 %: 2,000, drawn from about 57 million); their instants follow from
their indices in the stream (gamma gaps, :func:`_routed_to`: the routing never reads an instant). The pool is
simulated on those alone (warm-up floor :math:`2\tau_p`, its own relaxation time; seeds derived from ``seed``
and the pool's index, so the report stays deterministic).

The books stay the main run's: the pool's row keeps ``requests``, ``rejected``, ``unfinished``, its rate,
utilisation, batch, power and energy from the run of the whole stream (the fleet's ``requests_measured``,
rejected, unfinished and power are sums of the pools'), and takes from the dedicated run only its latency
statistics: the P99 TTFT and TPOT with their intervals, the percentiles, the attainment and the verdict.
``p99_requests`` says how many measured requests those rest on, ``p99_source`` which run (``main run`` or
``dedicated run``), ``too_few_requests`` is judged on ``p99_requests``, and a note says so. The fleet P99 and
attainment stay the main run's; a pool-scope fleet verdict is judged again from the rows. No dedicated run
(the row stays flagged, a note says why) under spillover, non-Poisson arrivals or a trace replay, for a pool
that receives every request or whose requests in this run are already as many as a dedicated run would
simulate (it is thin because the run is short: a longer run is the remedy), or when
:data:`THIN_MAX_DRAWN` draws per replication would not hold
:data:`~fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS` of its requests in all. A dedicated run that
draws that many and finds fewer than it sought says so, and stays flagged if it measured fewer than
``MIN_POOL_REQUESTS``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, cast

import numpy as np

from fleetopt.models.fleet import DecodeStage, FleetResult, PoolPlan, PoolResult
from fleetopt.models.profiles import served_model
from fleetopt.models.semantic import ShareRule, split_by_model
from fleetopt.models.workload import RequestTrace
from fleetopt.solvers.des.state import SimPool
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.engine import simulate
from fleetopt.solvers.des.arrivals import diurnal_arrivals, mmpp_arrivals
from fleetopt.solvers.des.metrics import e2e_s, littles_law, replicate, tpot_s, ttft_s, wait_s
from fleetopt.solvers.des.routers import CompressRouter, SpilloverRouter
from fleetopt.solvers.des.routing import (
    JoinShortestQueue,
    LeastQueue,
    LengthRouter,
    RandomRouter,
    Requests,
    RoundRobin,
    SplitRouter,
    poisson_arrivals,
    replay_trace,
    sample_lengths,
)

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.plan.evaluate import evaluate_plans, parse_fleet, spec_plans
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.simulation.options import (  # the settings and their choices live with the record
    ARRIVALS,
    DEFAULT_SPILL_BOUND,
    DISPATCHES,
    MIN_REQUESTS_PER_REPLICATION,
    MODES,
    ROUTERS,
    DownPoolsRouter,
    EngineOptions,
    SimOptions,
    engine_pools,
    parse_precision,
    sample_up,
)
from fleetopt.optimizer.forked import ordered_map, workers_for
from fleetopt.optimizer.simulation.records import (
    MIN_POOL_REQUESTS,
    Latency,
    Replication,
    RequestLatencies,
    SimPoolReport,
    SimReport,
    build_report,
    p99_estimate,
    rejudged,
    with_dedicated_latency,
)
from fleetopt.optimizer.simulation.pairs import (analytic_fleet, disagg_pair, has_pairs, pair_name,
                                                 transfer_times, unit_rows)

if TYPE_CHECKING:   # P/D pairs' simulator, split routing and model classes load with the first plan that has them
    from fleetopt.optimizer.plan.split_candidates import SplitRouting
    from fleetopt.solvers.des.disagg import DisaggPair

__all__ = ["ROUTERS", "DISPATCHES", "ARRIVALS", "MODES", "MIN_REQUESTS_PER_REPLICATION", "DEFAULT_SPILL_BOUND",
           "COOLDOWN_SHARE", "THIN_POOL_REQUESTS", "THIN_SCALED_DRAWN", "THIN_MAX_DRAWN", "Latency", "SimPoolReport",
           "SimReport",
           "SimOptions", "simulate_plan", "simulate_pools", "simulate_solved_plan", "planned_router",
           "plans_from_fleet", "plans_from_spec", "parse_precision", "SemanticRouting", "SemanticRouter",
           "semantic_routing", "roles_of", "semantic_problems", "semantic_analytic"]

COOLDOWN_SHARE = 0.05
"""Share of a replication's span at its end whose arrivals are not measured (they keep the load on)."""
COOLDOWN_SLOS = 10.0
"""The unmeasured end of a replication lasts at least this many TTFT SLOs (up to a quarter of the span)."""
THIN_POOL_REQUESTS = 4 * MIN_POOL_REQUESTS
"""Fewest requests routed to a thin pool that its dedicated run simulates, over all replications (module
docstring, "Thin pools"); 15 % or more of them fall in the warm-up and cool-down, so about 1,700 are measured."""
THIN_SCALED_DRAWN = 10_000_000
"""Draws of the stream a dedicated run may spend, over all replications, to give a thin pool more than
:data:`THIN_POOL_REQUESTS`: up to a fair share of ``SimOptions.requests`` (module docstring, "Thin pools")."""
THIN_MAX_DRAWN = 20_000_000
"""Requests of the stream a dedicated run draws at most per replication to find a thin pool's requests."""
_THIN_CHUNK = 1 << 20
"""Requests of the stream drawn at most at once for a dedicated run (about 40 MB of arrays)."""
_THIN_SEED_KEY = 0x7417
"""Mixed into the seed of a dedicated run (with ``seed`` and the pool's index), apart from the main run's."""
_CLASS_SEED_KEY = 0x5E3A
"""Appended to a replication's seed path for the semantic router's class draws (module docstring, "Semantic
plans"): a stream of their own, the same whatever else the replication draws."""
_DISPATCH = {"jsq": JoinShortestQueue, "round-robin": RoundRobin, "least-queue": LeastQueue}
"""The engine's dispatch policy per :data:`DISPATCHES` name (one entry each)."""


# --------------------------------------------------------------------------------------------
# Plans from the CLI's spec or from a solve plan
# --------------------------------------------------------------------------------------------


def plans_from_spec(instance: Instance, text: str, field: str = "--fleet") -> list[PoolPlan]:
    """The pools of a ``--fleet`` spec (:func:`fleetopt.optimizer.plan.evaluate.parse_fleet`); no ``xN`` = sized
    later."""
    return spec_plans(instance, parse_fleet(text, instance, field))


def plans_from_fleet(instance: Instance, fleet: FleetResult) -> list[PoolPlan]:
    """The pools of an evaluated fleet (e.g. a ``solve`` plan) with their replicas and batch caps fixed; a P/D
    pair's two rows (``phase`` ``prefill`` then ``decode``) become one PoolPlan with ``decode`` and the instance's
    KV transfer of that (prefill, decode) pair of options (:func:`pair_plan`)."""
    out, rows, k = [], list(fleet.pools), 0
    while k < len(rows):
        p = rows[k]
        if getattr(p, "phase", "both") == "prefill" and k + 1 < len(rows) and rows[k + 1].phase == "decode":
            out.append(pair_plan(instance, p, rows[k + 1]))
            k += 2
            continue
        g = instance.gpu(p.gpu)
        out.append(PoolPlan(p.min_tokens, p.max_tokens, g.name, g.profile, p.replicas, g.availability,
                            p.compress_gamma, p.max_num_seqs))
        k += 1
    return out


def pair_plan(instance: Instance, prefill, decode, field: str = "--fleet") -> PoolPlan:
    """One P/D pair's PoolPlan from its two rows (an evaluated :class:`PoolResult` or anything with ``min_tokens``,
    ``max_tokens``, ``gpu``, ``replicas`` and, for the decode row, ``max_num_seqs``): the prefill pool on the
    prefill row's option, a :class:`~fleetopt.models.fleet.DecodeStage` on the decode row's, and
    ``instance.pools.transfer(prefill, decode)``; an :class:`InstanceError` naming ``field`` when the instance has
    no KV transfer for that pair of options (``pools.disaggregation`` none, or options of two models)."""
    gp, gd = instance.gpu(prefill.gpu), instance.gpu(decode.gpu)
    transfer = instance.pools.transfer(gp.name, gd.name)
    if transfer is None:
        raise InstanceError(f"{field}: the P/D pair {prefill.min_tokens}-{prefill.max_tokens} (prefill {gp.name}, "
                            f"decode {gd.name}) has no KV transfer in this instance: set pools.disaggregation to "
                            "allow or only, with options of one model")
    return PoolPlan(prefill.min_tokens, prefill.max_tokens, gp.name, gp.profile, int(prefill.replicas),
                    gp.availability,
                    decode=DecodeStage(gpu=gd.name, profile=gd.profile, replicas=int(decode.replicas),
                                       max_num_seqs=int(decode.max_num_seqs), availability=gd.availability),
                    transfer=transfer)


def planned_router(pools: list[PoolPlan], routing: SplitRouting | None = None) -> str:
    """The router a plan was solved for: ``split`` when it has its own routing (a split plan), ``compress`` when a
    pool has ``@gamma`` (compress-and-route), else ``length``.

    Examples
    --------
    >>> planned_router([PoolPlan(0, 4096, "h100", None, 2), PoolPlan(4096, 65536, "h100", None, 1)])
    'length'
    >>> planned_router([PoolPlan(0, 4096, "h100", None, 2, compress_gamma=1.5), PoolPlan(4096, 65536, "h100", None)])
    'compress'
    """
    if routing is not None:
        return "split"
    return "compress" if any(p.compress_gamma > 1 for p in pools) else "length"


@dataclass(frozen=True, eq=False)
class SemanticRouting:
    """How a semantic plan routes (module docstring, "Semantic plans"): the classifier's ``rule`` (its share
    :math:`\\alpha(L)` to the small model), each pool's class (``roles``, ``small`` or ``large``, in the order of the
    plan's pools) and the rule as the instance writes it (``label``, e.g. ``0.4``)."""

    rule: ShareRule
    roles: tuple[str, ...]
    label: str = ""


def roles_of(instance: Instance, pools) -> tuple[str, ...]:
    """Each pool's model class in a semantic ``instance``: ``small`` when its GPU option serves
    ``semantic.small_model``, else ``large`` (every option serves one of the two; the instance checks that)."""
    spec = instance.semantic
    assert spec is not None
    return tuple("small" if served_model(instance.gpu(p.gpu).profile.model_name) == spec.small_model else "large"
                 for p in pools)


def semantic_routing(instance: Instance, plan) -> SemanticRouting | None:
    """A solved plan's :class:`SemanticRouting` (its rule by label among ``instance.semantic``'s, its roles);
    None for a plan of one model class."""
    sem = getattr(plan, "semantic", None)
    if sem is None:
        return None
    spec = instance.semantic
    if spec is None or sem.share not in spec.labels:
        raise InstanceError(f"semantic: the plan runs share {sem.share}, which the instance does not offer")
    return SemanticRouting(spec.rules[spec.labels.index(sem.share)], tuple(sem.roles), sem.share)


class SemanticRouter:
    """Route a request to the small class with probability :math:`\\alpha(L)` (its own uniform draw from ``rng``),
    else to the large class, then by length among that class's pools (module docstring, "Semantic plans").

    ``boundaries`` are each pool's upper edge (tokens) and ``roles`` its class, in plan order; a class's pools tile
    :math:`(0, B_c]` in that order. A request longer than its class's last pool, or sent to a class without
    pools, is rejected (-1).

    Examples
    --------
    >>> r = SemanticRouter(ShareRule.step([1000], [1.0, 0.0]), [1000, 2000, 8000], ["small", "large", "large"],
    ...                    ["s", "l1", "l2"], np.random.default_rng(0))
    >>> r.route(np.array([100, 1400, 2900]), np.array([100, 100, 100])).tolist()
    [0, 1, 2]
    """

    def __init__(self, rule: ShareRule, boundaries, roles, pool_names, rng: np.random.Generator) -> None:
        from fleetopt.optimizer.plan.semantic import ROLES

        self.rule = rule
        self.pool_names = tuple(pool_names)
        self._rng = rng
        self._classes = []
        for role in ROLES:
            idx = np.array([k for k, r in enumerate(roles) if r == role], dtype=np.int64)
            his = np.array([float(boundaries[k]) for k in idx])
            self._classes.append((role, idx, his))

    def classify(self, total_tokens) -> np.ndarray:
        """True where a request (total length, tokens) goes to the small class: one uniform draw each."""
        L = np.asarray(total_tokens, dtype=float)
        return self._rng.random(len(L)) < self.rule.share_at(L)

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        L = np.asarray(prompt_tokens) + np.asarray(output_tokens)
        small = self.classify(L)
        out = np.full(len(L), -1, dtype=np.int64)
        for role, idx, his in self._classes:
            mine = np.flatnonzero(small if role == "small" else ~small)
            if mine.size == 0 or idx.size == 0:
                continue
            k = np.searchsorted(his, L[mine], side="left")      # right-closed segments (lo, hi]
            ok = (k < idx.size) & (L[mine] > 0)
            out[mine[ok]] = idx[k[ok]]
        return out


def _class_rng(rng: np.random.Generator) -> np.random.Generator:
    """The semantic router's own generator: the replication generator's seed path with :data:`_CLASS_SEED_KEY`
    appended (the same for every plan simulated with one seed; nothing drawn from ``rng``)."""
    seq = cast(np.random.SeedSequence, rng.bit_generator.seed_seq)   # default_rng's: typed as the ISeedSequence base
    return np.random.default_rng(np.random.SeedSequence(seq.entropy, spawn_key=(*seq.spawn_key, _CLASS_SEED_KEY)))


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _RunSpec:
    """Everything a replication needs besides its size and generator (validated by :func:`_checked`)."""

    instance: Instance
    analytic: FleetResult
    pools: tuple[SimPool, ...]
    options: SimOptions
    """The run's settings with ``router`` and ``spill_bound`` resolved (:func:`_resolved`)."""
    warmup_floor_s: float
    cooldown_floor_s: float
    split_shares: object
    availability: tuple = ()
    only_pool: int | None = None
    """A thin pool's dedicated run (module docstring, "Thin pools"): simulate only the requests routed to it (an
    index into ``units``)."""
    units: tuple = ()
    """The plan's pools as the router sees them (:class:`_Unit`, plan order): one per aggregated pool or P/D pair."""
    semantic: SemanticRouting | None = None
    """A semantic plan's rule and classes (module docstring, "Semantic plans"); None for one model class."""

    @property
    def pairs(self) -> bool:
        """Whether the plan holds a P/D pair (then :func:`_mixed_replication` runs it)."""
        return any(u.pair is not None for u in self.units)

    @property
    def names(self) -> list[str]:
        """The router's pool names: one per unit."""
        return [u.name for u in self.units]

    @property
    def entry(self) -> FleetResult:
        """The analytic fleet with one row per unit (a pair's prefill row): what the routers read."""
        if not self.pairs:
            return self.analytic
        return replace(self.analytic, pools=tuple(self.analytic.pools[u.rows[0]] for u in self.units))


@dataclass(frozen=True, eq=False)
class _Unit:
    """One pool of the plan as the run routes to it: an aggregated pool (``engine``: its index among the engine's
    pools) or a P/D pair (``pair`` and its ``plan``); ``rows`` are its rows in the analytic fleet and the report."""

    name: str
    rows: tuple[int, ...]
    engine: int = -1
    pair: DisaggPair | None = None
    plan: PoolPlan | None = None


def simulate_plan(instance: Instance, pools: list[PoolPlan], options: SimOptions = SimOptions(), *,  # noqa: B008 frozen dataclass default
                  routing: SplitRouting | None = None, split_shares=None,
                  progress: Callable[[int, int], None] | None = None, keep_requests: bool = False,
                  semantic: SemanticRouting | None = None, workers: int | None = None) -> SimReport:
    """Simulate a fleet plan and report simulated latencies, SLO attainment and power with 95 % intervals.

    Parameters
    ----------
    instance : Instance
        Workload (CDF with ``input_fraction``, or a trace's own pairs), arrival
        rate, SLO (TTFT P99, TPOT P99 if set, scope) and the compress success
        probability.
    pools : list of PoolPlan
        Pools tiling ``(0, max_context]``; ``replicas=None`` is sized
        analytically first (:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`), and the
        batch cap is the analytic one (``max_num_seqs``, or the TPOT cap).
    options : SimOptions
        The run's settings (:class:`fleetopt.optimizer.simulation.options.SimOptions`, validated when built):
        ``requests`` per round over ``replications`` (1: batch means within the run), the ``seed`` of
        ``SeedSequence(seed).spawn(replications)`` (the same seed gives the same report except
        ``wall_seconds``), ``warmup_share``, the service ``mode`` (``iteration`` or ``slot``,
        :func:`fleetopt.solvers.des.engine.simulate`'s), the ``router`` between pools, the ``dispatch`` to a
        replica (iteration mode; slot mode uses one FCFS queue per pool, the analytic M/G/c), the
        ``arrivals`` and their parameters, the ``precision`` target and its ``max_requests`` cap, and the
        ``engine`` (KV admission, token budget, availability; :mod:`fleetopt.optimizer.simulation.options`).

        Routers: ``auto`` (default), the router the plan was solved for (:func:`planned_router`);
        ``length``, the plan's boundaries; ``split``, :class:`SplitRouter` with ``split_shares`` (default the
        identity: each segment to its own pool) or a split plan's ``routing``; ``random``, a baseline, pools
        drawn by their analytic routing shares whatever the length (a request longer than its pool's window is
        rejected); ``compress``, compress-and-route for pools with ``@gamma``
        (:class:`fleetopt.solvers.des.routers.CompressRouter`); ``spillover``, length routing, but an arrival
        moves to the next pool up when more than ``spill_bound`` requests wait in its own pool
        (:class:`fleetopt.solvers.des.routers.SpilloverRouter`; one hop).

        Arrivals: Poisson at the instance's rate; the trace's own instants rescaled to that rate (trace
        workloads; one deterministic run, batch-means CI); a two-state MMPP with ``peak_to_mean`` and mean
        burst ``mean_dwell_s`` (:func:`fleetopt.solvers.des.arrivals.mmpp_arrivals`); a sinusoidal rate with
        amplitude ``peak_to_mean - 1`` (<= 1) and period ``period_s`` (None: the expected span of one
        replication, so a run sees one whole cycle).
    routing : SplitRouting or None
        A split-routing plan's own routing (``plan.routing`` of ``solve``; router ``auto`` or ``split``, no
        ``split_shares``): the router draws pools with the routing's per-segment rates as weights, on its own
        elementary boundaries, and the analytic numbers are the plan's own, each pool evaluated at its routed
        mix (:func:`fleetopt.optimizer.plan.split_candidates.evaluate_routing`, which checks the routing) rather
        than a tiling's. The pools (e.g. :func:`plans_from_fleet` of ``plan.fleet``) need fixed replica counts
        and may overlap.
    split_shares : array (pools x pools) or None
        ``router="split"`` on a tiled plan: weight of pool ``p`` (column) for segment ``k`` (row). Like
        ``routing`` it is indexed by this call's pools, so it is an argument, not a setting.
    progress : callable or None
        ``progress(done_requests, planned_requests)`` after each replication.
    keep_requests : bool
        Keep every measured request's pool, TTFT and TPOT in the report (``SimReport.latencies()``, for
        plotting); off by default, as they take memory in proportion to the requests.
    semantic : SemanticRouting or None
        A semantic plan's rule and each pool's class (:func:`semantic_routing` of a solved plan; module docstring,
        "Semantic plans"): each class's pools tile :math:`(0, B_c]` on their own, the analytic numbers are
        :func:`fleetopt.optimizer.plan.semantic.evaluate_semantic`'s and the report's rows carry the roles.
    workers : int or None
        Processes the replications run on (:mod:`fleetopt.optimizer.forked`): None picks them (one per
        replication up to a few per core, on Linux, for replications of at least
        :data:`~fleetopt.optimizer.forked.MIN_FORKED_REQUESTS` requests; a worker process simulates
        serially), 1 runs them in this process. The report is the same whatever the number, except
        ``wall_seconds``.

    Returns
    -------
    SimReport
        With ``options``: the settings as run (``router`` and ``spill_bound`` resolved).

    Raises
    ------
    InstanceError
        For options the plan or the instance cannot take, or a plan the simulator cannot run (one line each).
    """
    t0 = time.perf_counter()
    options = _resolved(options, pools, routing)
    analytic, sim_pools, trace, units = _checked(instance, pools, options, routing, split_shares, semantic)
    R = 1 if options.arrivals == "trace" else int(options.replications)
    n_rep = int(math.ceil(options.requests / R))
    trace_rows = len(trace.arrived_at_s) if trace is not None else 0   # read for a replay alone (_checked: a trace)
    if options.arrivals == "trace":
        n_rep = min(n_rep, trace_rows)
    planned, done = R * n_rep, [0]
    relax_s = max((p.relaxation_s for p in analytic.pools if p.arrival_rate > 0), default=0.0)
    spec = _RunSpec(instance, analytic, tuple(sim_pools), options, 2.0 * relax_s,
                    COOLDOWN_SLOS * instance.slo.ttft_p99_s,
                    split_shares if routing is None else routing,  # the split router's weights, either form
                    tuple(instance.gpu(analytic.pools[u.rows[0]].gpu).availability for u in units if u.engine >= 0),
                    units=tuple(units), semantic=semantic)

    def counted(n: int):
        """A map that runs the replications of ``n`` requests (forked where that pays: :mod:`.forked`) and reports
        each as it comes back, in this process."""
        def mapper(run, rngs):
            for out in _forked_map(run, rngs, per_rep=n, workers=workers):
                done[0] += n
                if progress is not None:
                    progress(done[0], planned)
                yield out
        return mapper

    precision = options.precision
    while True:
        runs = replicate(partial(_replication, spec, n_rep), options.seed, R, counted(n_rep)).results
        fleet = p99_estimate([r.ttft_s for r in runs])
        if precision is None:
            stop = "requests"
        elif not math.isfinite(fleet.value):
            stop = "p99_unbounded"
        elif _precise(instance, analytic, runs, fleet, precision):
            stop = "precision"
        elif options.arrivals == "trace" and n_rep >= trace_rows:
            stop = "trace_length"
        elif 2 * n_rep * R > options.max_requests:
            stop = "max_requests"
        else:
            n_rep *= 2
            if options.arrivals == "trace":
                n_rep = min(n_rep, trace_rows)
            planned = done[0] + R * n_rep
            continue
        break
    report = build_report(instance, analytic, runs, fleet, options, replications=R, stopped_by=stop,
                          requests_simulated=R * n_rep, relaxation_s=relax_s,
                          routing_source=None if options.router != "split" else "shares" if routing is None else "plan",
                          wall_s=time.perf_counter() - t0)
    report = _thin_pool_runs(spec, report, R, workers)
    if semantic is not None:
        report = _with_roles(report, semantic, runs)
    report = replace(report, wall_seconds=time.perf_counter() - t0)   # the dedicated runs' time included
    if keep_requests:
        report = replace(report, request_latencies=RequestLatencies.from_runs(analytic, runs))
    return report


def _precise(instance: Instance, analytic: FleetResult, runs: Sequence[Replication], fleet, precision: float) -> bool:
    """Whether the P99 intervals that decide the verdict meet the ``precision`` target (module docstring): the
    fleet's under a fleet-scope SLO; under a pool-scope SLO every pool with traffic, with at least
    :data:`~fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS` measured requests (an unbounded pool P99
    is decided)."""
    if instance.slo.scope == "fleet":
        return bool(fleet.half_width <= precision * fleet.value)
    for k, p in enumerate(analytic.pools):
        if not p.arrival_rate > 0 or getattr(p, "phase", "both") == "decode":   # a pair's requests: its prefill row
            continue
        est = p99_estimate([r.ttft_s[r.pool == k] for r in runs])
        if est.value == math.inf:
            continue
        measured = sum(int(np.sum(r.pool == k)) for r in runs)
        if measured < MIN_POOL_REQUESTS or not est.half_width <= precision * est.value:
            return False
    return True


def _resolved(options: SimOptions, pools: list[PoolPlan], routing) -> SimOptions:
    """The options as the run uses them: ``router="auto"`` replaced by :func:`planned_router`'s, and spillover's
    ``spill_bound=None`` by :data:`DEFAULT_SPILL_BOUND`."""
    if not isinstance(options, SimOptions):
        raise InstanceError(f"options: {options!r} is not a SimOptions")
    router = planned_router(pools, routing) if options.router == "auto" else options.router
    bound = DEFAULT_SPILL_BOUND if router == "spillover" and options.spill_bound is None else options.spill_bound
    if (router, bound) == (options.router, options.spill_bound):
        return options
    return replace(options, router=router, spill_bound=bound)


def _checked(instance: Instance, pools: list[PoolPlan], options: SimOptions, routing, split_shares,
             semantic: SemanticRouting | None = None):
    """Check what the options (valid on their own, :class:`SimOptions`) and the plan need of each other and of the
    instance, at the edge; the analytic fleet, the simulator's pools and the trace."""
    problems = []
    w = instance.workload
    trace = w.lengths if isinstance(w.lengths, RequestTrace) else None
    if options.arrivals == "trace" and trace is None:
        problems.append(f"--arrivals: 'trace' replays a trace's instants, but the workload of {instance.name} is a "
                        "length CDF; use poisson, mmpp or diurnal")
    elif options.arrivals == "trace" and trace is not None and not math.isfinite(trace.mean_rate_req_per_s):
        # a replay rescales the trace's own rate to workload.arrival_rate; rows at one instant have no rate
        problems.append(f"--arrivals: 'trace' replays the trace's instants at workload.arrival_rate, but all "
                        f"{len(trace.arrived_at_s)} of its rows arrive at one instant (it spans no time), so it has no "
                        "rate to rescale; use --arrivals poisson (its lengths at workload.arrival_rate) or give the "
                        "rows their own arrival instants")
    if options.router in ("length", "spillover") and any(p.compress_gamma > 1 for p in pools):
        problems.append("--router: the plan has @gamma (compress-and-route) pools; simulate them with "
                        "--router compress")
    pairs = has_pairs(pools)
    if pairs and options.router not in ("length", "random"):
        problems.append(f"--router: the plan has P/D pairs, which simulate under --router length (or random); "
                        f"got {options.router}")
    if pairs and routing is not None:
        problems.append("routing: a split plan's routing cannot send requests to a P/D pair; pairs need length "
                        "routing")
    engine = options.engine
    if semantic is not None:
        problems += semantic_problems(instance, pools, options, routing, split_shares, semantic)
    elif instance.semantic is not None:
        problems.append("semantic: the instance routes by model class (its semantic section), but this plan has no "
                        "classes; simulate a semantic plan of solve (simulate --plan FILE)")
    if problems:
        raise InstanceError(problems)
    try:
        if semantic is not None:
            analytic = semantic_analytic(instance, pools, semantic)
            rows_of = [(k,) for k in range(len(analytic.pools))]
        elif pairs:
            analytic = analytic_fleet(instance, list(pools))
            rows_of = unit_rows(pools, analytic.pools)
        elif routing is None:
            analytic = evaluate_plans(instance, list(pools))
            rows_of = [(k,) for k in range(len(analytic.pools))]
        else:                                   # a split plan: routed mixes
            from fleetopt.optimizer.plan.split_candidates import evaluate_routing

            analytic = evaluate_routing(instance, list(pools), routing)
            rows_of = [(k,) for k in range(len(analytic.pools))]
    except ValueError as err:
        raise InstanceError(f"--fleet: {err}") from err
    for p in analytic.pools:
        name = _pool_name(p)
        if p.replicas < 1:
            problems.append(f"--fleet: pool {name} has no replica (it receives no traffic); give it xN or drop it")
        elif p.max_num_seqs < 1 and getattr(p, "phase", "both") != "prefill":
            problems.append(f"--fleet: pool {name} has batch cap 0 ({p.miss_reason or 'no sequence fits'})")
    agg = replace(analytic, pools=tuple(analytic.pools[r[0]] for r in rows_of if len(r) == 1))
    profiles, names = [instance.gpu(p.gpu).profile for p in agg.pools], [_pool_name(p) for p in agg.pools]
    sim_pools: list[SimPool] = []
    if not problems and agg.pools:
        problems += _budget_problems(agg, profiles, names, engine)
    if not problems and agg.pools:
        try:
            sim_pools = engine_pools(agg, profiles, names, engine)
        except ValueError as err:
            problems.append(f"--fleet: {err}")
    if split_shares is not None and options.router != "split":
        problems.append(f"split_shares: weights of router 'split'; the router is {options.router!r}")
    if routing is not None and (options.router != "split" or split_shares is not None):
        problems.append(f"routing: a split plan's routing needs router 'split' (got {options.router!r}) and no "
                        "split_shares")
    if not problems and len({p.name for p in sim_pools}) < len(sim_pools):
        sim_pools = _unique_names(sim_pools)  # e.g. a split plan with two batch caps of one range and GPU
    if options.router == "split" and split_shares is not None:
        s = np.asarray(split_shares, dtype=float)
        if s.shape != (len(pools), len(pools)) or not np.all(np.isfinite(s)) or np.any(s < 0) \
                or np.any(s.sum(axis=1) <= 0):
            problems.append(f"split_shares: give a ({len(pools)}, {len(pools)}) array of finite weights >= 0 with a "
                            "positive sum in every row")
        else:
            his = [p.max_tokens for p in analytic.pools]
            bad = [(k, q) for k in range(len(pools)) for q in range(len(pools)) if s[k, q] > 0 and his[q] < his[k]]
            if bad:
                k, q = bad[0]
                problems.append(f"split_shares: segment {k} sends requests up to {his[k]} tokens to pool "
                                f"{_pool_name(analytic.pools[q])}, whose window is shorter")
    units: list[_Unit] = []
    if not problems:
        engine_k = 0
        for plan, rows in zip(pools, rows_of):
            if len(rows) == 1:
                units.append(_Unit(sim_pools[engine_k].name, rows, engine=engine_k))
                engine_k += 1
                continue
            pre, dec = analytic.pools[rows[0]], analytic.pools[rows[1]]
            try:
                units.append(_Unit(pair_name(pre.min_tokens, pre.max_tokens, pre.gpu, dec.gpu), rows,
                                   pair=disagg_pair(plan, pre, dec), plan=plan))
            except ValueError as err:
                problems.append(f"--fleet: pair {pre.min_tokens}-{pre.max_tokens}: {err}")
    if problems:
        raise InstanceError(problems)
    return analytic, sim_pools, trace, units


def semantic_problems(instance: Instance, pools: list[PoolPlan], options: SimOptions, routing, split_shares,
                       semantic: SemanticRouting) -> list[str]:
    """What a semantic plan needs (module docstring, "Semantic plans"): a semantic instance, one role per pool,
    length routing within the classes, and each class's pools consecutive and in order, tiling :math:`(0, B_c]`
    with :math:`B_c` at least its longest request and at most ``pools.max_context``, with replica counts."""
    from fleetopt.optimizer.plan.semantic import ROLES

    if instance.semantic is None:
        return ["semantic: the plan routes by model class, but the instance has no semantic section"]
    out = []
    if options.router != "length" or routing is not None or split_shares is not None:
        out.append(f"--router: a semantic plan routes each model class by length (router auto or length); got "
                   f"{options.router}")
    if has_pairs(pools) or any(p.compress_gamma > 1 for p in pools):
        out.append("semantic: a semantic plan's pools are aggregated pools without compression")
    if len(semantic.roles) != len(pools) or any(r not in ROLES for r in semantic.roles):
        return out + [f"semantic: give one role ({' or '.join(ROLES)}) per pool; got {list(semantic.roles)} for "
                      f"{len(pools)} pools"]
    served = roles_of(instance, pools)
    wrong = [k for k in range(len(pools)) if served[k] != semantic.roles[k]]
    if wrong:
        k = wrong[0]
        out.append(f"semantic: pool {pools[k].lo_tokens}-{pools[k].hi_tokens} on {pools[k].gpu} serves the "
                   f"{served[k]} model, not the {semantic.roles[k]} one")
    if any(p.replicas is None for p in pools):
        out.append("semantic: every pool of a semantic plan needs its replica count")
    roles = list(semantic.roles)
    if [r for k, r in enumerate(roles) if k == 0 or roles[k - 1] != r] != list(dict.fromkeys(roles)):
        out.append("semantic: each class's pools must be consecutive in the plan (small, then large)")
    top = instance.pools.max_context_tokens
    for traffic in split_by_model(instance.workload.lengths, semantic.rule):
        mine = [p for p, r in zip(pools, roles) if r == traffic.role]
        if traffic.distribution is None:
            if mine:
                out.append(f"semantic: the {traffic.role} class receives no request under share {semantic.label}, "
                           f"but the plan has {len(mine)} pool(s) for it")
            continue
        if not mine:
            out.append(f"semantic: the {traffic.role} class receives {traffic.rate_share:.1%} of the requests under "
                       f"share {semantic.label}, but the plan has no pool for it")
            continue
        edge, tiled = 0, True
        for p in mine:
            if p.lo_tokens != edge:
                out.append(f"semantic: the {traffic.role} class's pools must tile (0, B] in order; pool "
                           f"{p.lo_tokens}-{p.hi_tokens} on {p.gpu} should start at {edge}")
                tiled = False
                break
            edge = p.hi_tokens
        longest = traffic.distribution.max_tokens
        if tiled and (edge < longest - 1e-9 or edge > top):
            out.append(f"semantic: the {traffic.role} class's pools end at {edge} tokens; they must reach its "
                       f"longest request ({longest:,.0f}) and stay within pools.max_context {top}")
    return out


def semantic_analytic(instance: Instance, pools: list[PoolPlan], semantic: SemanticRouting) -> FleetResult:
    """The analytic fleet of a semantic plan: :func:`fleetopt.optimizer.plan.semantic.evaluate_semantic` over its
    classes in plan order (each class's pools consecutive, so its rows are in plan order too)."""
    traffic = {t.role: t for t in split_by_model(instance.workload.lengths, semantic.rule)}
    from fleetopt.optimizer.plan.semantic import evaluate_semantic

    classes = [(traffic[role], [p for p, r in zip(pools, semantic.roles) if r == role])
               for role in dict.fromkeys(semantic.roles)]
    return evaluate_semantic(instance, classes)


def _with_roles(report: SimReport, semantic: SemanticRouting, runs: Sequence[Replication]) -> SimReport:
    """A semantic plan's report: each row's ``role`` and ``SimReport.semantic``, each class's measured share of
    the requests beside its analytic :math:`\\pi_c` (module docstring, "Semantic plans")."""
    from fleetopt.optimizer.plan.semantic import ROLES

    pools = tuple(replace(p, role=r) for p, r in zip(report.pools, semantic.roles))
    measured = sum(len(r.pool) for r in runs)
    total_rate = sum(p.arrival_rate for p in report.analytic.pools)
    classes = []
    for role in ROLES:
        rows = [k for k, r in enumerate(semantic.roles) if r == role]
        got = sum(int(np.isin(r.pool, rows).sum()) for r in runs)
        rate = sum(report.analytic.pools[k].arrival_rate for k in rows)
        classes.append({"role": role, "pools": len(rows),
                        "rate_share": rate / total_rate if total_rate > 0 else 0.0,
                        "requests": got, "share_sim": got / measured if measured else math.nan})
    return replace(report, pools=pools, semantic={"share": semantic.label, "classes": classes})


def _budget_problems(analytic: FleetResult, profiles: list, names: list[str], engine: EngineOptions) -> list[str]:
    """``--max-batched-tokens`` below a pool's engine batch cap (vLLM refuses ``max_num_batched_tokens <
    max_num_seqs``): one line naming the pool with the largest cap, which the budget must reach. The caps are
    :func:`fleetopt.optimizer.simulation.options.engine_pools`' own (arguments as there)."""
    if engine.max_batched_tokens is None:
        return []
    pools = engine_pools(analytic, profiles, names, replace(engine, max_batched_tokens=None))
    widest = max(pools, key=lambda p: cast(int, p.max_num_seqs))   # engine_pools sets every pool's cap
    if engine.max_batched_tokens >= cast(int, widest.max_num_seqs):
        return []
    return [f"--max-batched-tokens: {engine.max_batched_tokens} is below pool {widest.name}'s batch cap "
            f"{widest.max_num_seqs} (vLLM needs max_num_batched_tokens >= max_num_seqs); give at least "
            f"{widest.max_num_seqs}"]


def _pool_name(p: PoolResult) -> str:
    return f"{p.min_tokens}-{p.max_tokens}:{p.gpu}"


def _unique_names(pools: list[SimPool]) -> list[SimPool]:
    """Pools sharing a name get their batch cap appended (``#SEQS``, as in a fleet spec), then a counter."""
    names = [p.name for p in pools]
    names = [f"{n}#{p.max_num_seqs}" if names.count(n) > 1 else n for n, p in zip(names, pools)]
    names = [f"{n}/{names[:k].count(n) + 1}" if names.count(n) > 1 else n for k, n in enumerate(names)]
    return [replace(p, name=n) for p, n in zip(pools, names)]


def _stream(instance: Instance, n: int, rng: np.random.Generator, options: SimOptions) -> Requests:
    """``n`` requests of the instance's workload with the options' arrival process (draws: instants, then lengths)."""
    w = instance.workload
    rate = w.arrival_rate_req_per_s
    if options.arrivals == "trace":
        full = replay_trace(cast(RequestTrace, w.lengths), rate)   # _checked refused a replay of a length CDF
        return Requests(full.arrival_at_s[:n], full.prompt_tokens[:n], full.output_tokens[:n])
    if options.arrivals == "mmpp":
        at = mmpp_arrivals(rate, options.peak_to_mean, n, rng, options.mean_dwell_s)
    elif options.arrivals == "diurnal":
        period_s = options.period_s
        at = diurnal_arrivals(rate, n, rng, options.peak_to_mean - 1.0, period_s if period_s else n / rate)
    else:
        at = poisson_arrivals(rate, n, rng)
    prompt, output = sample_lengths(w.lengths, n, rng, w.input_fraction)
    return Requests(at, prompt, output)


def _router(kind: str, instance: Instance, analytic: FleetResult, names: list[str], rng, split_shares,
            spill_bound: int | None = DEFAULT_SPILL_BOUND, semantic: SemanticRouting | None = None):
    """The router between pools (a :class:`CompressRouter` also rewrites the stream, see :func:`_replication`; a
    semantic plan's :class:`SemanticRouter` draws from its own generator, :func:`_class_rng`)."""
    if semantic is not None:
        return SemanticRouter(semantic.rule, [p.max_tokens for p in analytic.pools], semantic.roles, names,
                              _class_rng(rng))
    edges = [0] + [p.max_tokens for p in analytic.pools]
    if kind == "random":
        shares = np.array([p.arrival_rate for p in analytic.pools])
        return RandomRouter(dict(zip(names, shares if shares.sum() > 0 else np.ones(len(names)))), rng)
    if kind == "split":
        from fleetopt.optimizer.plan.split_candidates import SplitRouting
    if kind == "split" and isinstance(split_shares, SplitRouting):  # a split plan's own segments and rates
        return SplitRouter(split_shares.boundaries_tokens, names,
                           split_shares.router_weights([p.max_tokens for p in analytic.pools]), rng)
    if kind == "split":
        shares = np.eye(len(names)) if split_shares is None else np.asarray(split_shares, dtype=float)
        return SplitRouter(edges, names, shares, rng)
    if kind == "spillover":
        assert spill_bound is not None   # _resolved gave spillover its bound
        return SpilloverRouter(edges, names, int(spill_bound))
    if kind == "compress":
        return CompressRouter(edges, names, [p.compress_gamma for p in analytic.pools],
                              instance.pools.compress_success, rng)
    return LengthRouter(edges, names)


def _replication(spec: _RunSpec, n: int, rng: np.random.Generator) -> Replication:
    """One replication: stream, route, simulate to the last arrival, keep the measured requests (a thin pool's
    dedicated run, ``spec.only_pool``: ``n`` requests routed to that pool, module docstring "Thin pools")."""
    o = spec.options
    names, entry = spec.names, spec.entry
    if spec.only_pool is None:
        req = _stream(spec.instance, n, rng, o)
        route = _router(o.router, spec.instance, entry, names, rng, spec.split_shares, o.spill_bound, spec.semantic)
        if isinstance(route, CompressRouter):
            req = route.compress(req)
    else:                                       # a thin pool's own run: its requests, then straight to it
        stream_rng, route_rng = rng.spawn(2)    # the stream apart from the router's draws
        route = _router(o.router, spec.instance, entry, names, route_rng, spec.split_shares, o.spill_bound,
                        spec.semantic)
        req = _routed_to(spec, route, n, stream_rng)
        route = _ToPool(route.pool_names, names[spec.only_pool])
    horizon_s = float(req.arrival_at_s[-1])
    warmup_s = min(max(o.warmup_share * horizon_s, spec.warmup_floor_s), 0.5 * horizon_s)
    measure_end_s = horizon_s - min(max(COOLDOWN_SHARE * horizon_s, spec.cooldown_floor_s), 0.25 * horizon_s)
    if spec.pairs:
        return _mixed_replication(spec, req, route, horizon_s, warmup_s, measure_end_s, rng)
    pools, up = list(spec.pools), np.array([p.replicas for p in spec.pools], dtype=np.int64)
    if o.engine.availability == "sampled":
        pools, up = sample_up(pools, list(spec.availability), rng)
        if np.any(up == 0):
            route = DownPoolsRouter(route, [p.name for p, u in zip(pools, up) if u == 0])
    disp = _DISPATCH[o.dispatch]()
    res = simulate(pools, req, route, mode=o.mode, queue="pool" if o.mode == "slot" else "replica",
                   dispatch=disp, horizon_s=horizon_s, warmup_s=warmup_s)
    keep = (res.arrival_at_s >= warmup_s) & (res.arrival_at_s <= measure_end_s)
    pool_of = res.pool
    if isinstance(route, DownPoolsRouter):      # requests lost to a pool that was down count against that pool
        to_pool = np.array([[p.name for p in pools].index(x) for x in route.pool_names] + [-1])
        pool_of = np.where(res.pool < 0, to_pool[route.intended], res.pool)
    ttft, wait = ttft_s(res)[keep], wait_s(res)[keep]
    L, lam_w = littles_law(res)
    done = res.outcome == Outcome.COMPLETED
    in_window = done & (res.end_at_s >= warmup_s)
    live = (up > 0).astype(float)   # sample_up keeps one idle replica in a pool drawn with none up: it is not there
    return Replication(
        pool=pool_of[keep], ttft_s=np.where(np.isnan(ttft), np.inf, ttft),
        wait_s=np.where(np.isnan(wait), np.inf, wait), tpot_s=tpot_s(res)[keep], e2e_s=e2e_s(res)[keep],
        unfinished=(res.outcome == Outcome.UNFINISHED)[keep], rejected=(res.outcome == Outcome.REJECTED)[keep],
        utilization=res.pool_utilization * live, mean_batch=res.pool_mean_batch * live,
        power_w=res.pool_mean_power_w * live,
        preemptions=res.preemptions, spilled=res.spilled, replicas_up=up,
        batch_cap=np.array([p.max_num_seqs for p in pools]),
        energy_j=np.bincount(res.replica_pool, res.replica_energy_j, len(spec.pools)) * live,
        output_tokens_done=np.bincount(res.pool[in_window], res.output_tokens[in_window], len(spec.pools)),
        tokens_done=np.bincount(res.pool[in_window], res.prompt_tokens[in_window] + res.output_tokens[in_window],
                                len(spec.pools)),
        busy_slot_s=res.pool_busy_slot_s * live, slot_s=res.pool_slots * res.window_s * live,
        n_requests=len(req), span_s=horizon_s, warmup_s=warmup_s, warmup_cut=spec.warmup_floor_s > 0.5 * horizon_s,
        measured_s=measure_end_s - warmup_s,
        littles_error=float(np.max(np.abs(L - lam_w) / np.maximum(L, 1e-12), initial=0.0)))


def _mixed_replication(spec: _RunSpec, req: Requests, route, horizon_s: float, warmup_s: float,
                       measure_end_s: float, rng: np.random.Generator) -> Replication:
    """One replication of a plan with P/D pairs (:func:`_replication` drew and routed nothing else differently).

    The router (length or random; each request decided from itself and the router's own draws) assigns every
    request of the stream to a unit; the aggregated pools' requests run through the engine together (the same
    dispatch, mode, engine options and sampled availability as a plan without pairs), and each pair's through
    :func:`fleetopt.solvers.des.disagg.simulate_disaggregated` with the same horizon, warm-up and measured window
    (its KV transfer per request, :func:`fleetopt.optimizer.simulation.pairs.transfer_times`). A measured request
    is charged to its unit's first row (a pair's prefill row, which reports its TTFT; the report's decode row reads
    the same requests' TPOT, :func:`fleetopt.optimizer.simulation.records.build_report`)."""
    from fleetopt.solvers.des.disagg import simulate_disaggregated

    o = spec.options
    n, n_rows = len(req), len(spec.analytic.pools)
    unit = np.asarray(route.route(req.prompt_tokens, req.output_tokens), dtype=np.int64)
    row = np.full(n, -1, dtype=np.int64)
    ttft, wait, tpot, e2e, dwait = (np.full(n, math.nan) for _ in range(5))
    outcome = np.full(n, int(Outcome.REJECTED), dtype=np.int8)
    per_row = {k: np.zeros(n_rows) for k in ("utilization", "mean_batch", "power_w", "energy_j", "out_done",
                                             "tokens_done", "busy", "slots")}
    counts = {k: np.zeros(n_rows, dtype=np.int64) for k in ("preemptions", "spilled", "up", "cap")}
    littles = 0.0
    first_row = np.array([u.rows[0] for u in spec.units] + [-1], dtype=np.int64)
    row[:] = first_row[unit]                       # -1: the router rejected it (no pool fits it)
    engine_of = np.array([u.engine for u in spec.units] + [-1], dtype=np.int64)
    agg = np.flatnonzero(engine_of[unit] >= 0)
    if spec.pools:
        rows = np.array([u.rows[0] for u in spec.units if u.engine >= 0], dtype=np.int64)   # engine pool -> row
        counts["up"][rows] = [p.replicas for p in spec.pools]
        counts["cap"][rows] = [cast(int, p.max_num_seqs) for p in spec.pools]   # engine_pools sets every cap
    if spec.pools and agg.size:
        pools, up = list(spec.pools), np.array([p.replicas for p in spec.pools], dtype=np.int64)
        fixed = _Assigned(tuple(p.name for p in pools), engine_of[unit[agg]])
        engine_route = fixed
        if o.engine.availability == "sampled":
            pools, up = sample_up(pools, list(spec.availability), rng)
            if np.any(up == 0):
                engine_route = DownPoolsRouter(fixed, [p.name for p, u in zip(pools, up) if u == 0])
        sub = Requests(req.arrival_at_s[agg], req.prompt_tokens[agg], req.output_tokens[agg])
        res = simulate(pools, sub, engine_route, mode=o.mode, queue="pool" if o.mode == "slot" else "replica",
                       dispatch=_DISPATCH[o.dispatch](), horizon_s=horizon_s, warmup_s=warmup_s)
        ttft[agg], wait[agg], tpot[agg], e2e[agg] = ttft_s(res), wait_s(res), tpot_s(res), e2e_s(res)
        outcome[agg] = res.outcome
        L, lam_w = littles_law(res)
        littles = max(littles, float(np.max(np.abs(L - lam_w) / np.maximum(L, 1e-12), initial=0.0)))
        live = (up > 0).astype(float)
        done = (res.outcome == Outcome.COMPLETED) & (res.end_at_s >= warmup_s)
        served = np.where(res.pool >= 0, res.pool, 0)
        per_row["utilization"][rows] = res.pool_utilization * live
        per_row["mean_batch"][rows] = res.pool_mean_batch * live
        per_row["power_w"][rows] = res.pool_mean_power_w * live
        per_row["energy_j"][rows] = np.bincount(res.replica_pool, res.replica_energy_j, len(pools)) * live
        per_row["out_done"][rows] = np.bincount(served[done], res.output_tokens[done], len(pools))
        per_row["tokens_done"][rows] = np.bincount(served[done], (res.prompt_tokens + res.output_tokens)[done],
                                                   len(pools))
        per_row["busy"][rows] = res.pool_busy_slot_s * live
        per_row["slots"][rows] = res.pool_slots * res.window_s * live
        counts["preemptions"][rows], counts["spilled"][rows] = res.preemptions, res.spilled
        counts["up"][rows], counts["cap"][rows] = up, [cast(int, p.max_num_seqs) for p in pools]
    for k, u in enumerate(spec.units):
        if u.pair is None:
            continue
        mine = np.flatnonzero(unit == k)
        kp, kd = u.rows
        pair = u.pair
        counts["up"][kp], counts["up"][kd] = pair.prefill_replicas, pair.decode_replicas
        counts["cap"][kp], counts["cap"][kd] = 1, int(pair.decode_max_num_seqs)
        if mine.size == 0:
            continue
        sub = Requests(req.arrival_at_s[mine], req.prompt_tokens[mine], req.output_tokens[mine])
        res = simulate_disaggregated(pair, sub, transfer_s=transfer_times(u.plan, sub.prompt_tokens),
                                     horizon_s=horizon_s, warmup_s=warmup_s, measure_end_s=measure_end_s)
        ttft[mine], wait[mine], tpot[mine], e2e[mine] = res.ttft_s, res.prefill_wait_s, res.tpot_s, res.e2e_s
        dwait[mine] = res.decode_wait_s
        outcome[mine] = res.outcome
        for station in (res.prefill_sim, res.decode_sim):
            if len(station.arrival_at_s):
                L, lam_w = littles_law(station)
                littles = max(littles, float(np.max(np.abs(L - lam_w) / np.maximum(L, 1e-12), initial=0.0)))
        pf, dc = res.prefill, res.decode
        window = pf.window_end_s - pf.window_start_s
        per_row["utilization"][kp], per_row["utilization"][kd] = pf.utilization, dc.slot_utilization
        per_row["mean_batch"][kp], per_row["mean_batch"][kd] = pf.mean_batch, dc.mean_batch
        per_row["power_w"][kp], per_row["power_w"][kd] = pf.mean_power_w, dc.mean_power_w
        per_row["energy_j"][kp], per_row["energy_j"][kd] = pf.energy_j, dc.energy_j
        done = (res.outcome == Outcome.COMPLETED) & (res.end_at_s >= warmup_s)
        per_row["out_done"][kd] = float(np.sum(res.output_tokens[done]))
        per_row["tokens_done"][kd] = float(np.sum((res.prompt_tokens + res.output_tokens)[done]))
        per_row["busy"][kp], per_row["slots"][kp] = pf.busy_s, pf.replicas * window
        dc_window = dc.window_end_s - dc.window_start_s
        per_row["busy"][kd] = dc.slot_utilization * dc.replicas * dc.max_num_seqs * dc_window
        per_row["slots"][kd] = dc.replicas * dc.max_num_seqs * dc_window
    keep = (req.arrival_at_s >= warmup_s) & (req.arrival_at_s <= measure_end_s)
    return Replication(
        pool=row[keep], ttft_s=np.where(np.isnan(ttft), np.inf, ttft)[keep],
        wait_s=np.where(np.isnan(wait), np.inf, wait)[keep], tpot_s=tpot[keep], e2e_s=e2e[keep],
        unfinished=(outcome == Outcome.UNFINISHED)[keep], rejected=(outcome == Outcome.REJECTED)[keep],
        utilization=per_row["utilization"], mean_batch=per_row["mean_batch"], power_w=per_row["power_w"],
        preemptions=counts["preemptions"], spilled=counts["spilled"], replicas_up=counts["up"],
        batch_cap=counts["cap"], energy_j=per_row["energy_j"], output_tokens_done=per_row["out_done"],
        tokens_done=per_row["tokens_done"], busy_slot_s=per_row["busy"], slot_s=per_row["slots"],
        n_requests=n, span_s=horizon_s, warmup_s=warmup_s, warmup_cut=spec.warmup_floor_s > 0.5 * horizon_s,
        measured_s=measure_end_s - warmup_s, littles_error=littles, decode_wait_s=dwait[keep])


class _Assigned:
    """A router that returns pools chosen beforehand (the aggregated pools' share of a mixed run's stream)."""

    def __init__(self, pool_names, chosen: np.ndarray) -> None:
        self.pool_names = tuple(pool_names)
        self._chosen = chosen

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        if len(prompt_tokens) != len(self._chosen):
            raise ValueError("_Assigned: routes a stream of its own length only")
        return self._chosen.copy()


class _ToPool:
    """A router that sends every request to one pool (a thin pool's dedicated run: its requests are routed)."""

    def __init__(self, pool_names, name: str):
        self.pool_names = tuple(pool_names)
        self._k = self.pool_names.index(name)

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        return np.full(len(prompt_tokens), self._k, dtype=np.int64)


def _routed_to(spec: _RunSpec, route, n: int, rng: np.random.Generator) -> Requests:
    r"""``n`` requests of the Poisson stream routed to pool ``spec.only_pool`` (module docstring, "Thin pools"), fewer
    when :data:`THIN_MAX_DRAWN` draws did not hold ``n``. The stream's lengths are drawn from ``rng`` in chunks,
    compressed where the router compresses and routed (routers of this run decide from the lengths and their own
    draws, never the instants); the instants follow for the kept requests alone: the one at stream index
    :math:`j` arrives at :math:`\sum_{i \le j} E_i`, so from one kept request to the next, :math:`m` indices on,
    passes :math:`\mathrm{Gamma}(m, 1/\lambda)`."""
    assert spec.only_pool is not None   # only a thin pool's own run comes here
    w = spec.instance.workload
    target = route.pool_names.index(spec.names[spec.only_pool])
    share = spec.entry.pools[spec.only_pool].arrival_rate / w.arrival_rate_req_per_s
    size = int(min(_THIN_CHUNK, max(4096, math.ceil(1.5 * n / share))))   # about 1.5 n of its requests in one
    parts, got, drawn, last, t_s = [], 0, 0, -1, 0.0    # last: stream index of the last kept request, at t_s
    while got < n and drawn < THIN_MAX_DRAWN:
        m = min(size, THIN_MAX_DRAWN - drawn)
        prompt, output = sample_lengths(w.lengths, m, rng, w.input_fraction)
        if isinstance(route, CompressRouter):
            cut = route.compress(Requests(np.zeros(m), prompt, output))
            prompt, output = cut.prompt_tokens, cut.output_tokens
        mine = np.flatnonzero(np.asarray(route.route(prompt, output)) == target)
        if mine.size:
            at_s = t_s + np.cumsum(rng.gamma(np.diff(drawn + mine, prepend=last), 1.0 / w.arrival_rate_req_per_s))
            parts.append((at_s, prompt[mine], output[mine]))
            got, last, t_s = got + mine.size, drawn + int(mine[-1]), float(at_s[-1])
        drawn += m
    if not parts:
        raise RuntimeError(f"pool {spec.names[spec.only_pool]}: none of {drawn:,} requests drawn was routed to "
                           "it (its dedicated run needs some)")
    at_s, prompt, output = (np.concatenate([p[i] for p in parts])[:n] for i in range(3))
    return Requests(at_s, prompt, output)


def _forked_map(run, rngs, *, per_rep: int, workers: int | None):
    """The replications ``run(rng)`` of ``per_rep`` requests each, in order, forked where that pays (:mod:`.forked`)."""
    return ordered_map(run, rngs, workers_for(len(rngs), per_rep, workers))


def _no_dedicated_run(options: SimOptions) -> str | None:
    """Why the run's options allow no thin pool a dedicated run (module docstring, "Thin pools"); None if they do."""
    if options.arrivals == "trace":
        return ("a trace replay holds only the trace's requests at their own instants: there is no more of the "
                "stream to draw")
    if options.arrivals != "poisson":
        return (f"{options.arrivals} arrivals are not Poisson, so the instants of a pool's requests cannot be drawn "
                "apart from the stream's (gamma gaps need exponential ones); raise --requests")
    if options.router == "spillover":
        return ("the spillover router reads the pools' queues, so the requests a pool gets depend on the other "
                "pools and are not a thinned stream of their own; raise --requests")
    return None


def _thin_pool_runs(spec: _RunSpec, report: SimReport, replications: int, workers: int | None = None) -> SimReport:
    """Measure each thin pool of ``report`` (``too_few_requests``) in a dedicated run and put its latency
    statistics and verdict in its row, with a note (module docstring, "Thin pools"); a thin pool that gets none
    keeps its row and a note says why."""
    thin_rows = {k for k, p in enumerate(report.pools) if p.too_few_requests}
    thin = [u for u, unit in enumerate(spec.units) if thin_rows & set(unit.rows)]   # a pair: both rows at once
    if not thin:
        return report
    pools, notes, o = list(report.pools), list(report.notes), spec.options
    fair = o.requests / max(sum(1 for a in spec.entry.pools if a.arrival_rate > 0), 1)
    why_all = _no_dedicated_run(o)
    for u in thin:
        rows = spec.units[u].rows
        k = rows[0]
        a, had = spec.analytic.pools[k], report.pools[k].requests
        share = a.arrival_rate / spec.instance.workload.arrival_rate_req_per_s
        want = max(THIN_POOL_REQUESTS, min(fair, share * THIN_SCALED_DRAWN))
        per_rep = max(int(math.ceil(want / replications)), MIN_REQUESTS_PER_REPLICATION)
        said = f"pool {_pool_name(a)} measured {had:,} request{'' if had == 1 else 's'}, too few for its P99"
        why = why_all
        if why is None and share >= 1.0 - 1e-9:
            why = "it receives every request, so its own run would be this run; raise --requests"
        elif why is None and share * report.requests_simulated >= per_rep * replications:
            why = (f"this run simulated about {share * report.requests_simulated:,.0f} of its requests, no fewer "
                   f"than a dedicated run would ({per_rep * replications:,}); raise --requests")
        elif why is None and share * THIN_MAX_DRAWN * replications < MIN_POOL_REQUESTS:
            why = (f"its share of the stream ({share:.2g}) would leave it fewer than {MIN_POOL_REQUESTS} requests in "
                   f"the {THIN_MAX_DRAWN:,} a replication may draw")
        if why is not None:
            notes.append(f"{said}, and gets no dedicated run: {why}")
            continue
        own_spec = replace(spec, only_pool=u,
                           warmup_floor_s=2.0 * max(spec.analytic.pools[j].relaxation_s for j in rows))
        seed = int(np.random.SeedSequence([int(o.seed), _THIN_SEED_KEY, k]).generate_state(1)[0])
        runs = replicate(partial(_replication, own_spec, per_rep), seed, replications,
                         partial(_forked_map, per_rep=per_rep, workers=workers)).results
        own_rows = build_report(spec.instance, spec.analytic, runs, p99_estimate([r.ttft_s for r in runs]), o,
                                replications=replications, stopped_by="requests", requests_simulated=0,
                                relaxation_s=0.0, routing_source=None, wall_s=0.0).pools
        own = own_rows[k]
        short = min(r.n_requests for r in runs)
        ran_out = (f"; a replication found only {short:,} of the {per_rep:,} sought in the {THIN_MAX_DRAWN:,} "
                   "requests it may draw" if short < per_rep else "")
        if own.requests <= had:
            notes.append(f"{said}; its dedicated run measured no more ({own.requests:,}), so its row stays the "
                         f"run's{ran_out}")
            continue
        for j in rows:
            pools[j] = with_dedicated_latency(report.pools[j], own_rows[j])
        notes.append(f"{said} in this run: its P99 TTFT and TPOT, their intervals, attainment and verdict come from "
                     f"a dedicated run of {own.requests:,} measured requests routed to it "
                     f"({sum(r.n_requests for r in runs):,} simulated, seed {seed}); its requests, rate, "
                     f"utilisation, batch and power stay this run's{ran_out}")
    return rejudged(report, tuple(pools), tuple(notes), spec.instance.slo)


def simulate_solved_plan(instance: Instance, plan, options: SimOptions = SimOptions(), *,  # noqa: B008 frozen dataclass default
                         progress: Callable[[int, int], None] | None = None, workers: int | None = None) -> SimReport:
    """Simulate a plan of :func:`fleetopt.optimizer.plan.solve.solve_instance` (its pools and, for a split plan, its
    routing ``plan.routing``; a semantic plan's rule and classes, ``plan.semantic``); with ``options.router="auto"``
    (default) under the router it was planned for. ``workers``: as :func:`simulate_plan`'s."""
    return simulate_pools(instance, plans_from_fleet(instance, plan.fleet), plan.routing, options, progress=progress,
                          semantic=semantic_routing(instance, plan), workers=workers)


def simulate_pools(instance: Instance, pools: list, routing=None, options: SimOptions = SimOptions(), *,  # noqa: B008 frozen dataclass default
                   progress: Callable[[int, int], None] | None = None,
                   semantic: SemanticRouting | None = None, workers: int | None = None) -> SimReport:
    """Simulate pools (``fleetopt.models.fleet.PoolPlan`` with replica counts) and a split plan's ``routing`` (or
    None); with ``options.router="auto"`` (default) under the router they were planned for
    (:func:`planned_router`): split with a routing, compress-and-route when a pool has ``@gamma``, else length; a
    semantic plan's classes with ``semantic`` (:class:`SemanticRouting`). ``workers``: as :func:`simulate_plan`'s."""
    return simulate_plan(instance, pools, options, routing=routing, progress=progress, semantic=semantic,
                         workers=workers)
