"""Trimming a verified plan by simulation (``fleetopt solve --verify-top N --trim``).

The analytic model can be conservative as well as optimistic: a pool sized by whole-window KV slots
needs far more replicas than vLLM's paged admission does when most requests are short
(``--sim-kv paged``), and the Erlang-C tail bound over-states the wait of lightly loaded pools. After the
verification loop has chosen a plan that passes, :func:`trim_plan` lowers each pool's replica count as far
as the simulated SLO still holds:

1. **Long enough runs.** A pool below its stability limit still looks fine in a simulation shorter than
   the time its queue takes to build up. The trials therefore run at least :data:`RELAXATION_SPANS`
   times the plan's start-up scale :math:`\\max_p \\tau_p` (``PoolResult.relaxation_s``) per replication (the
   measurement
   protocol of :mod:`fleetopt.optimizer.simulation.simulate`): the request count of the verification is raised as
   needed,
   up to :data:`MAX_TRIAL_REQUESTS`.
2. **Floors.** Pool :math:`k` never goes below the count that can keep up with its context work (below),
   a physical stability bound. Under length routing that is its only floor: its traffic is its own, so the
   simulation decides how far below the analytic count it may go (the analytic service time overstates the
   simulator's, :mod:`fleetopt.optimizer.simulation.pool_sizing`). Under split routing or compress-and-route,
   where pools share traffic, it also keeps the analytic floor, the count whose engine slots carry its offered
   load, :math:`\\lambda_k E[S_k] / (s_k \\rho)` (:math:`s_k` the simulated batch cap per replica; with
   whole-window slots :math:`\\rho` is the instance's ``max_utilization``, the operator's cap; with paged
   admission, whose slots are not the analytic ones, :math:`\\rho = 1`: the stability limit).

   The context-work floor: an iteration over contexts :math:`x_s` takes
   :math:`W + h \\sum_s x_s` (:mod:`fleetopt.solvers.des.engine`), so a replica busy all the time spends at least
   :math:`h \\sum x_s` per iteration on context, and over a long run :math:`N` replicas must absorb
   :math:`\\lambda_k\\, h\\, E[X]` seconds of it per second, where a request's
   :math:`X = c\\, m(m-1)/2 + l_{out} l_{in} + l_{out}(l_{out}-1)/2` (:math:`m = \\lceil l_{in}/c \\rceil`)
   sums the contexts its prefill chunks and decode steps start from. Hence
   :math:`N_k > \\lambda_k h E[X]`, whatever the admission: a budget or a preemption only adds
   steps. :math:`E[X]` is estimated from :data:`WORK_SAMPLES` requests of the workload (a fixed seed),
   and the bound is shaded by :data:`WORK_MARGIN` for the sampling error; compress-and-route pools
   get none (their band requests would have to be moved between pools).
3. **Search.** Pools are taken most expensive replica first (then the largest count). For pool
   :math:`k` a search between its floor and its count (steps down 1, 2, 4, ... until a count fails, then
   bisection) finds the smallest count whose plan (the other pools at their current counts) passes the
   verification rule, simulated with the verification's seed.
   It assumes that fewer replicas never help, which holds in expectation; the common seed (the same
   requests in every trial) keeps the comparisons from flipping on sampling noise.
4. **Confirmation.** The trimmed plan is simulated again with an independent seed (``seed + 1``),
   because a bisection over many trials favours counts that passed by luck. If that confirmation misses,
   every trimmed pool gets one replica back and the confirmation is repeated, up to
   :data:`MAX_BACKOFFS` times; after that the verified plan is kept.
5. **What the planner guarantees.** With every replica up in simulation (``availability="all-up"``) the
   trimmed counts are replicas that must be *up*: a GPU option with availability :math:`A < 1` gets
   :math:`\\lceil n / A \\rceil`, as the planner inflates its counts (``--sim-availability sampled``
   simulates the failures instead, and no inflation is added). A GPU option's ``min_count`` is restored
   by giving replicas back to its most trimmed pools. Counts never exceed the verified ones.

A disaggregated prefill/decode pair is not trimmed: it keeps its verified counts in both phases (its count in the
record is the prefill pool's), while the trials lower the aggregated pools around it.

Every count the trim reports rests on simulation (``source: simulated``): the analytic model may call
the trimmed plan infeasible, and its analytic figures are printed next to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import cast

import numpy as np

from fleetopt.models.fleet import inflate_for_availability
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.solve import Plan
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.pool_sizing import ladder_run, least_passing as _least_passing
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS

__all__ = ["MAX_BACKOFFS", "TrimStep", "Trim", "trim_plan"]

MAX_BACKOFFS = 3
"""Times the trimmed pools get one replica back when the independent confirmation misses."""
RELAXATION_SPANS = 4.0
"""A trial's replication lasts at least this many start-up scales :math:`\\max_p \\tau_p`
(``PoolResult.relaxation_s``)."""
MAX_TRIAL_REQUESTS = 2_000_000
"""Cap on the requests of one trial when raising them for the run length."""
WORK_SAMPLES = 200_000
"""Requests drawn to estimate a pool's context work :math:`E[X]` (module docstring, step 2)."""
WORK_MARGIN = 0.95
"""The context-work floor uses this share of the estimated work, for the sampling error."""


@dataclass(frozen=True)
class TrimStep:
    """One simulated trial: pool ``pool`` (index in the plan; -1 for a confirmation with the independent seed)
    at ``replicas``, the plan at ``counts``."""

    pool: int
    replicas: int
    counts: tuple[int, ...]
    passed: bool
    ttft_p99_ms_sim: float
    seed: int


@dataclass(frozen=True)
class Trim:
    """What trimming found: the counts, their simulations and every trial."""

    verified_counts: tuple[int, ...]
    counts: tuple[int, ...]
    """Replicas per pool to buy (``up_counts`` inflated by availability and raised to ``min_count``, module
    docstring step 5; the verified counts when nothing could be trimmed or confirmed)."""
    up_counts: tuple[int, ...]
    """Replicas per pool the simulations ran (the trimmed, confirmed counts)."""
    sim: object
    """The simulation of ``up_counts`` with the verification's seed (a
    :class:`fleetopt.optimizer.simulation.records.SimReport`)."""
    confirmation: object
    """Their simulation with the independent seed (the one that decides)."""
    confirmed: bool
    """The final counts pass with the independent seed (when every backoff missed, the final counts are the
    verified ones, which may then miss too: the verification's own pass was one seed's)."""
    steps: tuple[TrimStep, ...]
    cost_per_hr: float
    verified_cost_per_hr: float
    requests_per_trial: int
    """Requests each trial simulated (raised from the verification's for the run length, step 1)."""

    @property
    def savings(self) -> float:
        """Share of the verified plan's cost the trim saves."""
        return 1.0 - self.cost_per_hr / self.verified_cost_per_hr if self.verified_cost_per_hr else 0.0


def trim_plan(instance: Instance, plan: Plan, passes: Callable[[object], bool],
              options: SimOptions = SimOptions(),  # noqa: B008 frozen dataclass default
              *, progress=None, relaxation_spans: float = RELAXATION_SPANS,
              on_step: Callable[[str], None] | None = None) -> Trim:
    """Lower the replica counts of a verified ``plan`` while its simulation ``passes`` (module docstring).

    ``passes(sim_report)`` is the verification rule; ``options`` are the verification's simulation settings
    (:class:`~fleetopt.optimizer.simulation.options.SimOptions`): the search runs them with their ``seed``, the
    confirmation with ``seed + 1``, and every trial with ``requests`` raised for the run length (step 1;
    ``max_requests`` follows when a precision target would otherwise refuse them; with one, each trial runs the
    precision ladder of :func:`~fleetopt.optimizer.simulation.pool_sizing.ladder_run`). ``relaxation_spans`` is the
    least run length of a trial in start-up scales (0 keeps the verification's request count).
    ``progress(done, total)`` is passed to every simulation; ``on_step(message)``, if given, is called before
    each trial (one line: the pool and count tried, or the confirmation).
    """
    from fleetopt.optimizer.simulation.options import engine_pools
    from fleetopt.optimizer.simulation.simulate import plans_from_fleet, semantic_routing, simulate_pools

    if not isinstance(options, SimOptions):
        raise ValueError(f"options must be a SimOptions; got {options!r}")
    base = plans_from_fleet(instance, plan.fleet)
    semantic = semantic_routing(instance, plan)       # a semantic plan: every trial with its classifier
    engine, seed = options.engine, options.seed
    requests = _trial_requests(instance, plan.fleet, options.requests, options.replications, relaxation_spans)
    trial_options = replace(options, requests=requests, max_requests=max(options.max_requests, requests))
    steps: list[TrimStep] = []
    cache: dict = {}

    def run(counts: tuple[int, ...], run_seed: int):
        key = (counts, run_seed)
        if key not in cache:
            pools = [replace(p, replicas=n) for p, n in zip(base, counts)]
            cache[key] = ladder_run(      # with a precision target: its ladder, skipping rungs too short for it
                lambda o, shown: simulate_pools(instance, pools, plan.routing, o, progress=shown, semantic=semantic),
                replace(trial_options, seed=run_seed), instance.slo.scope, progress)
        return cache[key]

    def trial(k: int, counts: tuple[int, ...], run_seed: int) -> bool:
        if on_step is not None:
            what = (f"pool {k + 1} ({base[k].lo_tokens:,}-{base[k].hi_tokens:,} on {base[k].gpu}) at x{counts[k]}"
                    if k >= 0 else f"confirming counts {list(counts)} with seed {run_seed}")
            on_step(f"trim trial {len(steps) + 1}: {what}")
        sim = run(counts, run_seed)
        ok = bool(passes(sim))
        steps.append(TrimStep(k, counts[k] if k >= 0 else -1, counts, ok, sim.ttft_p99_ms, run_seed))
        return ok

    verified = tuple(int(cast(int, p.replicas)) for p in base)   # plans_from_fleet: the fleet's counts, all set
    paired = [p.decode is not None for p in base]
    if any(paired):                                   # a pair's first row stands for it; its count is kept
        from fleetopt.optimizer.simulation.pairs import unit_rows

        fleet = replace(plan.fleet, pools=tuple(plan.fleet.pools[r[0]] for r in unit_rows(base, plan.fleet.pools)))
    else:
        fleet = plan.fleet
    caps = [cast(int, p.max_num_seqs) for p in engine_pools(fleet, [p.profile for p in base],   # every cap set
                                                            [str(k) for k in range(len(base))], engine)]
    floors = work_floors(instance, base, plan.routing, semantic)
    if plan.routing is not None or any(p.compress_gamma > 1 for p in base):   # pools share traffic: step 2
        floors = [max(a, b) for a, b in zip(_floors(fleet, caps, engine, instance.constraints.max_utilization),
                                            floors)]
    counts = list(verified)
    per_replica = [p.profile.cost_usd_per_hr for p in base]
    for k in sorted((k for k in range(len(base)) if not paired[k]), key=lambda k: (-per_replica[k], -counts[k], k)):
        counts[k] = _least_passing(lambda n, k=k: trial(k, tuple(counts[:k] + [n] + counts[k + 1:]), seed),
                                   counts[k], min(floors[k], counts[k]))
    confirm_seed = seed + 1
    trimmed = tuple(counts)
    for backoff in range(MAX_BACKOFFS + 1):
        if trimmed == verified or trial(-1, trimmed, confirm_seed):
            break
        trimmed = verified if backoff == MAX_BACKOFFS else tuple(min(n + 1, v) for n, v in zip(trimmed, verified))
    confirmation = run(trimmed, confirm_seed)
    final = _planner_counts(instance, base, trimmed, verified, engine.availability == "all-up")
    kept = sum(cast(int, p.decode.replicas) * p.decode.profile.cost_usd_per_hr for p in base if p.decode is not None)
    cost = sum(n * c for n, c in zip(final, per_replica)) + kept
    verified_cost = sum(n * c for n, c in zip(verified, per_replica)) + kept
    return Trim(verified, final, trimmed, run(trimmed, seed), confirmation, bool(passes(confirmation)),
                tuple(steps), float(cost), float(verified_cost), int(trial_options.requests))


def _trial_requests(instance: Instance, fleet, requests: int, replications: int,
                    spans: float = RELAXATION_SPANS) -> int:
    """Requests per trial so that a replication lasts ``spans`` start-up scales :math:`\\max_p \\tau_p`
    and the pool with the least traffic gets four times :data:`MIN_POOL_REQUESTS` (its verdict needs them, and the
    warm-up may take half a replication and the cool-down a quarter); ``spans = 0`` keeps ``requests`` as it is
    (the scale of :mod:`fleetopt.optimizer.simulation.simulate`, from the analytic pools; a replication of :math:`n`
    requests
    spans about :math:`n / \\lambda`): at least ``requests``, at most :data:`MAX_TRIAL_REQUESTS`."""
    relax_s = max((p.relaxation_s for p in fleet.pools if p.arrival_rate > 0), default=0.0)
    lam = instance.workload.arrival_rate_req_per_s
    need = spans * relax_s * lam * replications
    least_share = min((p.arrival_rate / lam for p in fleet.pools if p.arrival_rate > 0), default=1.0)
    thin = 4.0 * MIN_POOL_REQUESTS / least_share if spans > 0 else 0.0   # every pool measures enough for its verdict
    return int(min(MAX_TRIAL_REQUESTS, max(requests, math.ceil(need), math.ceil(thin))))


def _floors(fleet, caps: list[int], engine, max_utilization: float) -> list[int]:
    """Least count per pool whose engine slots (``caps`` per replica) carry its offered load (module
    docstring, step 2)."""
    out = []
    for a, cap in zip(fleet.pools, caps):
        load = a.arrival_rate * a.mean_service_s / max(cap, 1)   # replicas' worth of busy slots
        if engine.kv == "paged":
            out.append(max(1, math.floor(load) + 1))
        else:
            out.append(max(1, math.ceil(load / max_utilization - 1e-9)))
    return out


def work_floors(instance: Instance, pools, routing=None, semantic=None) -> list[int]:
    """Least replicas of each pool that can keep up with its context work, :math:`\\lfloor 0.95\\, \\lambda h
    E[X] \\rfloor + 1` (module docstring, step 2); 1 for pools of a compress-and-route plan. A semantic plan's
    pool (``semantic``, :class:`fleetopt.optimizer.simulation.simulate.SemanticRouting`) takes of each request in
    its window its class's share, :math:`\\alpha(L)` or :math:`1 - \\alpha(L)`."""
    from fleetopt.solvers.des.routing import sample_lengths

    if any(p.compress_gamma > 1 for p in pools):
        return [1] * len(pools)
    w = instance.workload
    lin, lout = sample_lengths(w.lengths, WORK_SAMPLES, np.random.default_rng(0), w.input_fraction)
    lin, lout = lin.astype(float), lout.astype(float)
    total = lin + lout
    if routing is not None:                  # each request's share of pool q: its segment's routed share
        b = np.asarray(routing.boundaries_tokens, dtype=float)
        rates = routing.as_array()
        share = rates / np.maximum(rates.sum(axis=1, keepdims=True), 1e-300)
        seg = np.clip(np.searchsorted(b, total, side="left") - 1, 0, len(b) - 2)
    out = []
    for q, p in enumerate(pools):
        c = float(p.profile.chunk_tokens)
        m = np.ceil(lin / c)
        work = c * m * (m - 1) / 2 + lout * lin + lout * (lout - 1) / 2
        mine = share[seg, q] if routing is not None else ((total > p.lo_tokens) & (total <= p.hi_tokens))
        if semantic is not None:
            alpha = semantic.rule.share_at(total)
            mine = mine * (alpha if semantic.roles[q] == "small" else 1.0 - alpha)
        h = float(p.profile.H_s) / float(p.profile.calibration_ctx_tokens)
        load = w.arrival_rate_req_per_s * float(np.mean(mine * work)) * h
        out.append(int(math.floor(WORK_MARGIN * load)) + 1)
    return out


def _planner_counts(instance: Instance, base, up: tuple[int, ...], verified: tuple[int, ...], inflate: bool
                    ) -> tuple[int, ...]:
    """Replicas to buy for ``up`` replicas up (module docstring, step 5): inflated by availability when the
    simulation had every replica up, raised to each GPU option's ``min_count``, never above ``verified``."""
    counts = [min(v, cast(int, inflate_for_availability(n, p.availability)) if inflate else n)   # an int for an int
              for p, n, v in zip(base, up, verified)]
    for g in instance.gpu_inventories():     # a gpus entry: its min_count binds the sum over its configurations
        if not g.min_count:
            continue
        mine = sorted((k for k, p in enumerate(base) if p.gpu in g.options), key=lambda k: counts[k] - verified[k])
        for k in mine:                          # the most trimmed pool first
            while counts[k] < verified[k] and sum(counts[j] * base[j].profile.gpus_per_replica
                                                  for j in mine) < g.min_count:
                counts[k] += 1
    return tuple(counts)
