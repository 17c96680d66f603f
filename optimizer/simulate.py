r"""``fleetopt simulate``: a fleet plan -> the discrete-event simulator -> a report with confidence intervals.

:func:`simulate_plan` is the one pipeline function the CLI and the plan
verifier call. It evaluates the plan analytically (sizing pools given without
a replica count, as ``evaluate`` does), builds the same pools for
:func:`solvers.des.simulate` (replicas and batch cap ``max_num_seqs`` from the
analytic evaluation), draws the request stream of the instance's workload,
runs independent replications and reports, per pool and for the fleet, the
simulated latencies next to the analytic numbers.

Measurement protocol
--------------------
Each replication generates ``n`` requests and runs until the last arrival
:math:`T` (the horizon). Arrivals before the warm-up instant

.. math:: T_w = \min\left(\max\left(wT,\; 2 \max_p \frac{E[S_p^2]}{E[S_p]}\right),\; T/2\right)

are discarded (:math:`w` = ``warmup``; :math:`E[S_p^2]/E[S_p] = E[S_p](1 + c_{s,p}^2)`
from the analytic evaluation of pool :math:`p`). The floor bounds the start-up
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
  (:func:`solvers.des_metrics.quantile_ci`, generators spawned from one
  ``SeedSequence`` by :func:`solvers.des_metrics.replicate`), or from batch
  means of one run (:func:`solvers.des_metrics.batch_means_ci`, 20 batches)
  when there is one replication or the arrivals replay a trace (a replay is
  deterministic, so its replications would be copies).
* ``slo_met`` requires the *upper* bound of the interval to meet the SLO (and
  the TPOT interval's upper bound, when the instance sets a TPOT SLO), per pool
  or over the fleet as ``slo.scope`` says; ``slo_met_point`` uses the point
  estimates.
* Power is the engine's exact integral of each replica's power curve over its
  simulated batch; energy per output token is the fleet's energy over the
  window divided by the output tokens of the requests completed in it.
* Preemptions: the engine has no KV-cache preemption (a replica never admits
  more than ``max_num_seqs`` sequences, and their KV always fits), so
  ``preemptions`` is 0 by construction, not a measurement.
* All replicas are up: availability (``gpus[].availability``) is not
  simulated, as the analytic evaluation of fixed counts does not derate them.

With ``precision`` the requests per replication double until the fleet P99
interval's half-width is at most ``precision`` x P99, or ``max_requests``
would be exceeded; ``stopped_by`` says which (``requests`` without a
precision target, ``precision``, ``max_requests``, ``trace_length`` when a
replay has no more requests, ``p99_unbounded`` when more than 1 % of measured
requests get no first token, so more requests cannot narrow it).
"""

from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np

from models.fleet import FleetResult, PoolPlan, PoolResult
from models.units import MS_PER_S
from models.workload import RequestTrace
from solvers.des import MODES, Outcome, SimPool, simulate
from solvers.des_arrivals import DEFAULT_MEAN_DWELL_S, diurnal_arrivals, mmpp_arrivals
from solvers.des_metrics import (
    Estimate, batch_means_ci, e2e_s, littles_law, percentile, quantile_ci, replicate, tpot_s, ttft_s, wait_s,
)
from solvers.des_routers_extra import SPILLOVER_UNSUPPORTED, CompressRouter
from solvers.des_routing import (
    JoinShortestQueue, LengthRouter, RandomRouter, Requests, RoundRobin, SplitRouter, poisson_arrivals,
    replay_trace, sample_lengths,
)

from .errors import InstanceError
from .evaluate import evaluate_plans, parse_fleet
from .instance import Instance

__all__ = ["ROUTERS", "DISPATCHES", "ARRIVALS", "MODES", "COOLDOWN_SHARE", "Latency", "SimPoolReport", "SimReport",
           "simulate_plan", "plans_from_fleet", "plans_from_spec", "parse_precision", "render_simulation",
           "progress_bar"]

ROUTERS = ("length", "split", "random", "compress")
DISPATCHES = ("jsq", "round-robin")
ARRIVALS = ("poisson", "trace", "mmpp", "diurnal")
COOLDOWN_SHARE = 0.05
"""Share of a replication's span at its end whose arrivals are not measured (they keep the load on)."""
COOLDOWN_SLOS = 10.0
"""The unmeasured end of a replication lasts at least this many TTFT SLOs (up to a quarter of the span)."""
CONFIDENCE = 0.95
N_BATCHES = 20
MIN_REQUESTS_PER_REPLICATION = 100
_SOURCE = "simulated"
ANALYTIC_POOL_KEYS = ("min_tokens", "max_tokens", "gpu", "replicas", "gpus", "arrival_rate", "utilization",
                      "ttft_p99_ms", "power_w", "slo_met")
"""The ``evaluate`` contract keys every simulated pool also carries (analytic values)."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """P50/P90/P99 of one latency in ms (NaN: no measured request has it; inf: some never got it)."""

    p50_ms: float
    p90_ms: float
    p99_ms: float

    def to_json(self) -> dict:
        return {"p50": self.p50_ms, "p90": self.p90_ms, "p99": self.p99_ms}


@dataclass(frozen=True)
class SimPoolReport:
    """One pool: its analytic evaluation and what the simulation measured (pooled over replications).

    The analytic ``evaluate`` fields of the pool (``min_tokens``, ``max_tokens``, ``gpu``, ``replicas``,
    ``gpus``, ``arrival_rate``, ``utilization``, ``ttft_p99_ms``, ``power_w``, ``slo_met``) are read from
    ``analytic``. A simulated statistic is NaN when the pool had no measured request to take it from (it
    cannot miss), and an interval's upper end is inf when fewer than 20 requests (or one replication
    group) leave it unbounded.
    """

    analytic: PoolResult
    requests: int
    """Measured requests routed to this pool (all replications)."""
    arrival_rate_sim: float
    ttft_p99_ms_sim: float
    ttft_p99_ci_ms: tuple[float, float]
    tpot_p99_ms_sim: float
    tpot_p99_ci_ms: tuple[float, float]
    slo_attainment: float
    slo_met_sim: bool
    mean_batch: float
    preemptions: int
    utilization_sim: float
    power_w_sim: float
    energy_per_output_token_j: float
    unfinished: int
    rejected: int
    ttft: Latency
    tpot: Latency
    wait: Latency
    e2e: Latency

    min_tokens = property(lambda self: self.analytic.min_tokens)
    max_tokens = property(lambda self: self.analytic.max_tokens)
    gpu = property(lambda self: self.analytic.gpu)
    replicas = property(lambda self: self.analytic.replicas)
    gpus = property(lambda self: self.analytic.gpus)
    arrival_rate = property(lambda self: self.analytic.arrival_rate)
    utilization = property(lambda self: self.analytic.utilization)
    ttft_p99_ms = property(lambda self: self.analytic.ttft_p99_ms)
    power_w = property(lambda self: self.analytic.power_w)
    slo_met = property(lambda self: self.analytic.slo_met)

    def to_json(self) -> dict:
        a = self.analytic
        return {
            **{k: getattr(a, k) for k in ANALYTIC_POOL_KEYS},
            "ttft_p99_ms_sim": self.ttft_p99_ms_sim, "ttft_p99_ci_ms": self.ttft_p99_ci_ms,
            "tpot_p99_ms_sim": self.tpot_p99_ms_sim, "slo_attainment": self.slo_attainment,
            "mean_batch": self.mean_batch, "preemptions": self.preemptions,
            "tpot_p99_ci_ms": self.tpot_p99_ci_ms, "slo_met_sim": self.slo_met_sim,
            "utilization_sim": self.utilization_sim, "power_w_sim": self.power_w_sim,
            "energy_per_output_token_j": self.energy_per_output_token_j,
            "arrival_rate_sim": self.arrival_rate_sim, "requests": self.requests, "unfinished": self.unfinished,
            "rejected": self.rejected, "max_num_seqs": a.max_num_seqs, "compress_gamma": a.compress_gamma,
            "mean_batch_analytic": a.mean_batch, "tpot_p99_ms_bound": a.tpot_p99_ms,
            "latency_ms": {"ttft": self.ttft.to_json(), "tpot": self.tpot.to_json(), "wait": self.wait.to_json(),
                           "e2e": self.e2e.to_json()},
            "profile": a.profile, "quality": a.quality, "source": _SOURCE,
        }


@dataclass(frozen=True)
class SimReport:
    """What :func:`simulate_plan` measured, with the analytic evaluation of the same pools beside it.

    Times in ms, pooled over the replications' measured requests (module docstring); a statistic is NaN
    when no measured request has it (written as null in JSON, like inf).
    """

    requests_simulated: int
    requests_measured: int
    simulated_seconds: float
    wall_seconds: float
    ttft_p99_ms: float
    ttft_p99_ci_ms: tuple[float, float]
    tpot_p99_ms: float
    tpot_p99_ci_ms: tuple[float, float]
    slo_met: bool
    slo_met_point: bool
    slo_attainment: float
    power_kw: float
    energy_per_output_token_j: float
    utilization_sim: float
    """Busy slot-seconds over slot-seconds of the whole fleet (mean over replications)."""
    pools: tuple[SimPoolReport, ...]
    seed: int
    mode: str
    router: str
    dispatch: str
    arrivals: str
    replications: int
    ci_method: str
    stopped_by: str
    precision: float | None
    relaxation_s: float
    """:math:`\\max_p E[S_p^2]/E[S_p]`, the start-up time scale behind the warm-up floor (module docstring)."""
    warmup_s: float
    """Mean warm-up discarded per replication, in simulated seconds."""
    cooldown_s: float
    """Mean unmeasured end of a replication, in simulated seconds."""
    littles_law_rel_error: float
    """Largest :math:`|L - \\lambda W| / L` over pools and replications (the engine's books; ~0)."""
    unfinished: int
    rejected: int
    ttft: Latency
    tpot: Latency
    wait: Latency
    e2e: Latency
    analytic: FleetResult
    instance_name: str
    slo_ttft_p99_ms: float
    slo_tpot_p99_ms: float | None
    scope: str
    ttft_model: str
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The stable JSON contract: the keys of the issue first, then provenance and details."""
        a = self.analytic
        return {
            "requests_simulated": self.requests_simulated, "simulated_seconds": self.simulated_seconds,
            "wall_seconds": self.wall_seconds, "ttft_p99_ms": self.ttft_p99_ms,
            "ttft_p99_ci_ms": self.ttft_p99_ci_ms, "tpot_p99_ms": self.tpot_p99_ms, "slo_met": self.slo_met,
            "slo_attainment": self.slo_attainment, "power_kw": self.power_kw,
            "energy_per_output_token_j": self.energy_per_output_token_j,
            "pools": [p.to_json() for p in self.pools],
            "instance": self.instance_name, "command": "simulate", "source": _SOURCE,
            "slo_ttft_p99_ms": self.slo_ttft_p99_ms, "slo_tpot_p99_ms": self.slo_tpot_p99_ms,
            "scope": self.scope, "ttft_model": self.ttft_model, "slo_met_point": self.slo_met_point,
            "tpot_p99_ci_ms": self.tpot_p99_ci_ms, "requests_measured": self.requests_measured,
            "utilization_sim": self.utilization_sim,
            "unfinished": self.unfinished, "rejected": self.rejected, "preemptions": 0,
            "latency_ms": {"ttft": self.ttft.to_json(), "tpot": self.tpot.to_json(), "wait": self.wait.to_json(),
                           "e2e": self.e2e.to_json()},
            "seed": self.seed, "mode": self.mode, "router": self.router, "dispatch": self.dispatch,
            "arrivals": self.arrivals, "replications": self.replications, "confidence": CONFIDENCE,
            "ci_method": self.ci_method, "stopped_by": self.stopped_by, "precision": self.precision,
            "warmup_s": self.warmup_s, "cooldown_s": self.cooldown_s, "relaxation_s": self.relaxation_s,
            "littles_law_rel_error": self.littles_law_rel_error,
            "analytic": {"ttft_p99_ms": a.ttft_p99_ms, "power_kw": a.power_kw, "slo_met": a.slo_met,
                         "feasible": a.feasible, "cost_per_hr": a.cost_per_hr, "total_replicas": a.total_replicas,
                         "total_gpus": a.total_gpus, "source": "analytic"},
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------------
# Plans from the CLI's spec or from a solve plan
# --------------------------------------------------------------------------------------------


def plans_from_spec(instance: Instance, text: str, field: str = "--fleet") -> list[PoolPlan]:
    """The pools of a ``--fleet`` spec (:func:`optimizer.evaluate.parse_fleet`); no ``xN`` = sized later."""
    out = []
    for lo, hi, gpu, replicas, gamma in parse_fleet(text, instance, field).pools:
        g = instance.gpu(gpu)
        out.append(PoolPlan(lo, hi, g.name, g.profile, replicas, g.availability, gamma))
    return out


def plans_from_fleet(instance: Instance, fleet: FleetResult) -> list[PoolPlan]:
    """The pools of an evaluated fleet (e.g. a ``solve`` plan) with their replicas and batch caps fixed."""
    out = []
    for p in fleet.pools:
        g = instance.gpu(p.gpu)
        out.append(PoolPlan(p.min_tokens, p.max_tokens, g.name, g.profile, p.replicas, g.availability,
                            p.compress_gamma, p.max_num_seqs))
    return out


def parse_precision(text, field: str = "--precision") -> float | None:
    """``"5%"`` or ``"5"`` (percent of the P99) -> 0.05; None stays None."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*", str(text))
    value = float(m[1]) / 100.0 if m else math.nan
    if not 0.0 < value < 1.0:
        raise InstanceError(f"{field}: '{text}' is not a percentage in (0, 100), e.g. 5%")
    return value


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _RunSpec:
    """Everything a replication needs besides its size and generator (validated by :func:`_checked`)."""

    instance: Instance
    analytic: FleetResult
    pools: tuple[SimPool, ...]
    router: str
    dispatch: str
    arrivals: str
    mode: str
    warmup_share: float
    warmup_floor_s: float
    cooldown_floor_s: float
    peak_to_mean: float
    mean_dwell_s: float
    period_s: float | None
    split_shares: object


@dataclass(frozen=True, eq=False)
class _Run:
    """What one replication leaves: the measured requests (arrival order) and the window's time averages."""

    pool: np.ndarray
    ttft_s: np.ndarray          # +inf: no first token by the horizon
    wait_s: np.ndarray          # +inf: not started by the horizon
    tpot_s: np.ndarray          # NaN unless completed with > 1 output token
    e2e_s: np.ndarray           # NaN unless completed
    unfinished: np.ndarray
    rejected: np.ndarray
    utilization: np.ndarray
    mean_batch: np.ndarray
    power_w: np.ndarray
    energy_j: np.ndarray        # per pool, over the window
    output_tokens_done: np.ndarray   # per pool: output tokens of the requests completed in the window
    busy_slot_s: np.ndarray     # per pool
    slot_s: np.ndarray          # per pool: slots x window
    n_requests: int
    span_s: float
    warmup_s: float
    warmup_cut: bool
    measured_s: float
    littles_error: float


def simulate_plan(instance: Instance, pools: list[PoolPlan], *, requests: int = 50_000, seed: int = 0,
                  router: str = "length", dispatch: str = "jsq", arrivals: str = "poisson",
                  mode: str = "iteration", precision: float | None = None, max_requests: int = 1_000_000,
                  warmup: float = 0.1, replications: int = 5, progress: Callable[[int, int], None] | None = None,
                  peak_to_mean: float = 2.0, mean_dwell_s: float = DEFAULT_MEAN_DWELL_S,
                  period_s: float | None = None, split_shares=None) -> SimReport:
    """Simulate a fleet plan and report simulated latencies, SLO attainment and power with 95 % intervals.

    Parameters
    ----------
    instance : Instance
        Workload (CDF with ``input_fraction``, or a trace's own pairs), arrival
        rate, SLO (TTFT P99, TPOT P99 if set, scope) and the compress success
        probability.
    pools : list of PoolPlan
        Pools tiling ``(0, max_context]``; ``replicas=None`` is sized
        analytically first (:func:`optimizer.evaluate.evaluate_plans`), and the
        batch cap is the analytic one (``max_num_seqs``, or the TPOT cap).
    requests : int
        Requests per round over all replications (split evenly; >= 100 each).
    seed : int
        Root of ``SeedSequence(seed).spawn(replications)``; the same seed gives
        the same report except ``wall_seconds``.
    router : {"length", "split", "random", "compress"}
        ``length``: the plan's boundaries; ``split``: :class:`SplitRouter` with
        ``split_shares`` (default the identity: each segment to its own pool);
        ``random``: baseline, pools drawn by their analytic routing shares
        whatever the length (a request longer than its pool's window is
        rejected); ``compress``: compress-and-route for pools with ``@gamma``
        (:class:`solvers.des_routers_extra.CompressRouter`). ``spillover`` is
        not supported (see :mod:`solvers.des_routers_extra`).
    dispatch : {"jsq", "round-robin"}
        Replica choice within a pool (iteration mode; slot mode uses one FCFS
        queue per pool, the analytic M/G/c).
    arrivals : {"poisson", "trace", "mmpp", "diurnal"}
        Poisson at the instance's rate; the trace's own instants rescaled to
        that rate (trace workloads; one deterministic run, batch-means CI);
        a two-state MMPP with ``peak_to_mean`` and mean burst ``mean_dwell_s``
        (:func:`solvers.des_arrivals.mmpp_arrivals`); a sinusoidal rate with
        amplitude ``peak_to_mean - 1`` (<= 1) and period ``period_s`` (None:
        the expected span of one replication, so a run sees one whole cycle).
    mode : {"iteration", "slot"}
        :func:`solvers.des.simulate`'s service model.
    precision : float or None
        Target relative half-width of the fleet P99 TTFT interval (0.05 = 5 %).
    max_requests : int
        Cap on the requests of one round when doubling for ``precision``.
    warmup : float
        Share of each replication's span discarded at its start, at least
        twice the largest E[S^2]/E[S] of a pool and at most half (module docstring).
    replications : int
        Independent replications (1: batch means within the run).
    progress : callable or None
        ``progress(done_requests, planned_requests)`` after each replication.
    split_shares : array (pools x pools) or None
        ``router="split"``: weight of pool ``p`` (column) for segment ``k`` (row).

    Returns
    -------
    SimReport

    Raises
    ------
    InstanceError
        For a bad option or a plan the simulator cannot run (one line each).
    """
    t0 = time.perf_counter()
    analytic, sim_pools, trace = _checked(instance, pools, dict(
        requests=requests, router=router, dispatch=dispatch, arrivals=arrivals, mode=mode, precision=precision,
        max_requests=max_requests, warmup=warmup, replications=replications, peak_to_mean=peak_to_mean,
        mean_dwell_s=mean_dwell_s, period_s=period_s, split_shares=split_shares))
    R = 1 if arrivals == "trace" else int(replications)
    n_rep = int(math.ceil(requests / R))
    if arrivals == "trace":
        n_rep = min(n_rep, len(trace.arrived_at_s))
    planned, done = R * n_rep, [0]
    relax_s = max((p.mean_service_s * (1.0 + p.cv2_service) for p in analytic.pools if p.arrival_rate > 0),
                  default=0.0)
    spec = _RunSpec(instance, analytic, tuple(sim_pools), router, dispatch, arrivals, mode, warmup, 2.0 * relax_s,
                    COOLDOWN_SLOS * instance.slo.ttft_p99_s, peak_to_mean, mean_dwell_s, period_s, split_shares)

    def one(n: int):
        def run(rng: np.random.Generator) -> _Run:
            out = _replication(spec, n, rng)
            done[0] += n
            if progress is not None:
                progress(done[0], planned)
            return out
        return run

    while True:
        runs = replicate(one(n_rep), seed, R).results
        fleet = _p99([r.ttft_s for r in runs])
        if precision is None:
            stop = "requests"
        elif not math.isfinite(fleet.value):
            stop = "p99_unbounded"
        elif fleet.half_width <= precision * fleet.value:
            stop = "precision"
        elif arrivals == "trace" and n_rep >= len(trace.arrived_at_s):
            stop = "trace_length"
        elif 2 * n_rep * R > max_requests:
            stop = "max_requests"
        else:
            n_rep *= 2
            if arrivals == "trace":
                n_rep = min(n_rep, len(trace.arrived_at_s))
            planned = done[0] + R * n_rep
            continue
        break
    return _report(instance, analytic, runs, fleet, dict(
        seed=int(seed), mode=mode, router=router, dispatch=dispatch if mode == "iteration" else "pool-fcfs",
        arrivals=arrivals, replications=R, stopped_by=stop, precision=precision,
        requests_simulated=R * n_rep, relaxation_s=relax_s), time.perf_counter() - t0)


def _checked(instance: Instance, pools: list[PoolPlan], opts: dict):
    """Validate the options and the plan at the edge; the analytic fleet, the simulator's pools and the trace."""
    problems = []
    choices = {"router": ROUTERS, "dispatch": DISPATCHES, "arrivals": ARRIVALS, "mode": MODES}
    for name, allowed in choices.items():
        if opts[name] not in allowed:
            extra = f"; {SPILLOVER_UNSUPPORTED}" if opts[name] == "spillover" else ""
            problems.append(f"--{name}: {opts[name]!r} is not one of {', '.join(allowed)}{extra}")
    R = opts["replications"]
    if int(R) != R or R < 1:
        problems.append(f"--replications: {R!r} must be a whole number >= 1")
    elif opts["requests"] < MIN_REQUESTS_PER_REPLICATION * (1 if opts["arrivals"] == "trace" else R):
        problems.append(f"--requests: {opts['requests']} leaves fewer than {MIN_REQUESTS_PER_REPLICATION} requests "
                        f"per replication ({R} replications)")
    if opts["precision"] is not None and not 0.0 < opts["precision"] < 1.0:
        problems.append(f"precision: {opts['precision']!r} must be a fraction in (0, 1), e.g. 0.05")
    if opts["precision"] is not None and opts["requests"] > opts["max_requests"]:
        problems.append(f"--max-requests: {opts['max_requests']} is below --requests {opts['requests']}")
    if not 0.0 <= opts["warmup"] <= 0.5:
        problems.append(f"warmup: {opts['warmup']!r} must lie in [0, 0.5]")
    w = instance.workload
    trace = w.lengths if isinstance(w.lengths, RequestTrace) else None
    if opts["arrivals"] == "trace" and trace is None:
        problems.append(f"--arrivals: 'trace' replays a trace's instants, but the workload of {instance.name} is a "
                        "length CDF; use poisson, mmpp or diurnal")
    ptm = opts["peak_to_mean"]
    if opts["arrivals"] in ("mmpp", "diurnal") and not (math.isfinite(ptm) and ptm >= 1.0):
        problems.append(f"--peak-to-mean: {ptm!r} must be >= 1")
    elif opts["arrivals"] == "diurnal" and ptm > 2.0:
        problems.append(f"--peak-to-mean: {ptm:g} is above 2, the largest a sinusoidal rate reaches (amplitude 1)")
    if not (math.isfinite(opts["mean_dwell_s"]) and opts["mean_dwell_s"] > 0):
        problems.append(f"mean_dwell_s: {opts['mean_dwell_s']!r} must be finite and > 0")
    if opts["period_s"] is not None and not (math.isfinite(opts["period_s"]) and opts["period_s"] > 0):
        problems.append(f"period_s: {opts['period_s']!r} must be finite and > 0, or None")
    if opts["router"] == "length" and any(p.compress_gamma > 1 for p in pools):
        problems.append("--router: the plan has @gamma (compress-and-route) pools; simulate them with "
                        "--router compress")
    if problems:
        raise InstanceError(problems)
    try:
        analytic = evaluate_plans(instance, list(pools))
    except ValueError as err:
        raise InstanceError(f"--fleet: {err}") from err
    sim_pools = []
    for p in analytic.pools:
        name = _pool_name(p)
        if p.replicas < 1:
            problems.append(f"--fleet: pool {name} has no replica (it receives no traffic); give it xN or drop it")
        elif p.max_num_seqs < 1:
            problems.append(f"--fleet: pool {name} has batch cap 0 ({p.miss_reason or 'no sequence fits'})")
        else:
            sim_pools.append(SimPool(name, instance.gpu(p.gpu).profile, p.replicas, p.max_num_seqs, p.max_tokens))
    if opts["router"] == "split" and opts["split_shares"] is not None:
        s = np.asarray(opts["split_shares"], dtype=float)
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
    if problems:
        raise InstanceError(problems)
    return analytic, sim_pools, trace


def _pool_name(p: PoolResult) -> str:
    return f"{p.min_tokens}-{p.max_tokens}:{p.gpu}"


def _stream(instance: Instance, n: int, rng: np.random.Generator, arrivals: str, peak_to_mean: float,
            mean_dwell_s: float, period_s: float | None) -> Requests:
    """``n`` requests of the instance's workload with the chosen arrival process (draws: instants, then lengths)."""
    w = instance.workload
    rate = w.arrival_rate_req_per_s
    if arrivals == "trace":
        full = replay_trace(w.lengths, rate)
        return Requests(full.arrival_at_s[:n], full.prompt_tokens[:n], full.output_tokens[:n])
    if arrivals == "mmpp":
        at = mmpp_arrivals(rate, peak_to_mean, n, rng, mean_dwell_s)
    elif arrivals == "diurnal":
        at = diurnal_arrivals(rate, n, rng, peak_to_mean - 1.0, period_s if period_s else n / rate)
    else:
        at = poisson_arrivals(rate, n, rng)
    prompt, output = sample_lengths(w.lengths, n, rng, w.input_fraction)
    return Requests(at, prompt, output)


def _router(kind: str, instance: Instance, analytic: FleetResult, names: list[str], rng, split_shares):
    """The router between pools (a :class:`CompressRouter` also rewrites the stream, see :func:`_replication`)."""
    edges = [0] + [p.max_tokens for p in analytic.pools]
    if kind == "random":
        shares = np.array([p.arrival_rate for p in analytic.pools])
        return RandomRouter(dict(zip(names, shares if shares.sum() > 0 else np.ones(len(names)))), rng)
    if kind == "split":
        shares = np.eye(len(names)) if split_shares is None else np.asarray(split_shares, dtype=float)
        return SplitRouter(edges, names, shares, rng)
    if kind == "compress":
        return CompressRouter(edges, names, [p.compress_gamma for p in analytic.pools],
                              instance.pools.compress_success, rng)
    return LengthRouter(edges, names)


def _replication(spec: _RunSpec, n: int, rng: np.random.Generator) -> _Run:
    """One replication: stream, route, simulate to the last arrival, keep the measured requests."""
    req = _stream(spec.instance, n, rng, spec.arrivals, spec.peak_to_mean, spec.mean_dwell_s, spec.period_s)
    route = _router(spec.router, spec.instance, spec.analytic, [p.name for p in spec.pools], rng, spec.split_shares)
    if isinstance(route, CompressRouter):
        req = route.compress(req)
    horizon_s = float(req.arrival_at_s[-1])
    warmup_s = min(max(spec.warmup_share * horizon_s, spec.warmup_floor_s), 0.5 * horizon_s)
    measure_end_s = horizon_s - min(max(COOLDOWN_SHARE * horizon_s, spec.cooldown_floor_s), 0.25 * horizon_s)
    disp = JoinShortestQueue() if spec.dispatch == "jsq" else RoundRobin()
    res = simulate(spec.pools, req, route, mode=spec.mode, queue="pool" if spec.mode == "slot" else "replica",
                   dispatch=disp, horizon_s=horizon_s, warmup_s=warmup_s)
    keep = (res.arrival_at_s >= warmup_s) & (res.arrival_at_s <= measure_end_s)
    ttft, wait = ttft_s(res)[keep], wait_s(res)[keep]
    L, lam_w = littles_law(res)
    done = res.outcome == Outcome.COMPLETED
    in_window = done & (res.end_at_s >= warmup_s)
    return _Run(
        pool=res.pool[keep], ttft_s=np.where(np.isnan(ttft), np.inf, ttft),
        wait_s=np.where(np.isnan(wait), np.inf, wait), tpot_s=tpot_s(res)[keep], e2e_s=e2e_s(res)[keep],
        unfinished=(res.outcome == Outcome.UNFINISHED)[keep], rejected=(res.outcome == Outcome.REJECTED)[keep],
        utilization=res.pool_utilization, mean_batch=res.pool_mean_batch, power_w=res.pool_mean_power_w,
        energy_j=np.bincount(res.replica_pool, res.replica_energy_j, len(spec.pools)),
        output_tokens_done=np.bincount(res.pool[in_window], res.output_tokens[in_window], len(spec.pools)),
        busy_slot_s=res.pool_busy_slot_s, slot_s=res.pool_slots * res.window_s,
        n_requests=len(req), span_s=horizon_s, warmup_s=warmup_s, warmup_cut=spec.warmup_floor_s > 0.5 * horizon_s,
        measured_s=measure_end_s - warmup_s,
        littles_error=float(np.max(np.abs(L - lam_w) / np.maximum(L, 1e-12), initial=0.0)))


def _p99(groups: list[np.ndarray]) -> Estimate:
    """P99 of the non-NaN values with its 95 % interval (module docstring).

    Over the non-empty replication groups when there are two or more, else by
    batch means of their concatenation (arrival order) when it holds at least
    :data:`N_BATCHES` values, else the point estimate with an unbounded upper
    end; NaN throughout when there is no value.
    """
    groups = [g[~np.isnan(g)] for g in groups]
    full = [g for g in groups if g.size]
    if len(full) >= 2:
        return quantile_ci(full, 99.0, CONFIDENCE)
    v = np.concatenate(groups)
    if v.size >= N_BATCHES:
        return batch_means_ci(v, 99.0, N_BATCHES, CONFIDENCE)
    if v.size:
        return Estimate(float(percentile(v, 99)), math.nan, math.inf, CONFIDENCE, 0)
    return Estimate(math.nan, math.nan, math.nan, CONFIDENCE, 0)


def _latency(values: np.ndarray) -> Latency:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return Latency(math.nan, math.nan, math.nan)
    p = percentile(v, [50, 90, 99]) * MS_PER_S
    return Latency(float(p[0]), float(p[1]), float(p[2]))


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den > 0 else math.nan


def _ci_ms(e: Estimate) -> tuple[float, float]:
    return (e.low * MS_PER_S, e.high * MS_PER_S)


def _within(e: Estimate, limit_s: float | None, upper: bool) -> bool:
    """Whether the P99 (its interval's upper end if ``upper``) meets ``limit_s``; nothing measured cannot miss."""
    if limit_s is None or math.isnan(e.value):
        return True
    return bool((e.high if upper else e.value) <= limit_s * (1 + 1e-12))


def _pool_report(instance: Instance, a: PoolResult, k: int, runs: list[_Run]) -> SimPoolReport:
    sel = [r.pool == k for r in runs]

    def pooled(name: str) -> list[np.ndarray]:
        return [getattr(r, name)[s] for r, s in zip(runs, sel)]

    n = int(sum(s.sum() for s in sel))
    ttft, tpot = _p99(pooled("ttft_s")), _p99(pooled("tpot_s"))
    slo = instance.slo
    all_ttft = np.concatenate(pooled("ttft_s"))
    return SimPoolReport(
        analytic=a, requests=n, arrival_rate_sim=n / sum(r.measured_s for r in runs),
        ttft_p99_ms_sim=ttft.value * MS_PER_S, ttft_p99_ci_ms=_ci_ms(ttft),
        tpot_p99_ms_sim=tpot.value * MS_PER_S, tpot_p99_ci_ms=_ci_ms(tpot),
        slo_attainment=float(np.mean(all_ttft <= slo.ttft_p99_s)) if n else math.nan,
        slo_met_sim=_within(ttft, slo.ttft_p99_s, True) and _within(tpot, slo.tpot_p99_s, True),
        mean_batch=float(np.mean([r.mean_batch[k] for r in runs])), preemptions=0,
        utilization_sim=float(np.mean([r.utilization[k] for r in runs])),
        power_w_sim=float(np.mean([r.power_w[k] for r in runs])),
        energy_per_output_token_j=_ratio(sum(r.energy_j[k] for r in runs), sum(r.output_tokens_done[k] for r in runs)),
        unfinished=int(sum(x.sum() for x in pooled("unfinished"))),
        rejected=int(sum(x.sum() for x in pooled("rejected"))),
        ttft=_latency(all_ttft), tpot=_latency(np.concatenate(pooled("tpot_s"))),
        wait=_latency(np.concatenate(pooled("wait_s"))), e2e=_latency(np.concatenate(pooled("e2e_s"))))


def _report(instance: Instance, analytic: FleetResult, runs, fleet: Estimate, opts: dict, wall_s: float) -> SimReport:
    slo = instance.slo
    pools = tuple(_pool_report(instance, a, k, runs) for k, a in enumerate(analytic.pools))
    tpot = _p99([r.tpot_s for r in runs])
    ttft_all = np.concatenate([r.ttft_s for r in runs])
    if slo.scope == "fleet":
        met = _within(fleet, slo.ttft_p99_s, True) and _within(tpot, slo.tpot_p99_s, True)
        met_point = _within(fleet, slo.ttft_p99_s, False) and _within(tpot, slo.tpot_p99_s, False)
    else:
        met = all(p.slo_met_sim for p in pools)
        met_point = all(_within(_p99([r.ttft_s[r.pool == k] for r in runs]), slo.ttft_p99_s, False)
                        and _within(_p99([r.tpot_s[r.pool == k] for r in runs]), slo.tpot_p99_s, False)
                        for k in range(len(pools)))
    ci_method = "replications" if opts["replications"] >= 2 else f"batch-means ({N_BATCHES} batches)"
    return SimReport(
        requests_measured=int(ttft_all.size), simulated_seconds=float(sum(r.span_s for r in runs)),
        wall_seconds=wall_s, ttft_p99_ms=fleet.value * MS_PER_S, ttft_p99_ci_ms=_ci_ms(fleet),
        tpot_p99_ms=tpot.value * MS_PER_S, tpot_p99_ci_ms=_ci_ms(tpot),
        slo_met=met, slo_met_point=met_point, slo_attainment=float(np.mean(ttft_all <= slo.ttft_p99_s)),
        power_kw=float(np.mean([r.power_w.sum() for r in runs])) / 1000.0,
        energy_per_output_token_j=_ratio(sum(r.energy_j.sum() for r in runs),
                                         sum(r.output_tokens_done.sum() for r in runs)),
        utilization_sim=float(np.mean([r.busy_slot_s.sum() / r.slot_s.sum() for r in runs])),
        pools=pools, ci_method=ci_method, warmup_s=float(np.mean([r.warmup_s for r in runs])),
        cooldown_s=float(np.mean([r.span_s - r.warmup_s - r.measured_s for r in runs])),
        littles_law_rel_error=max(r.littles_error for r in runs),
        unfinished=int(sum(r.unfinished.sum() for r in runs)), rejected=int(sum(r.rejected.sum() for r in runs)),
        ttft=_latency(ttft_all), tpot=_latency(np.concatenate([r.tpot_s for r in runs])),
        wait=_latency(np.concatenate([r.wait_s for r in runs])), e2e=_latency(np.concatenate([r.e2e_s for r in runs])),
        analytic=analytic, instance_name=instance.name, slo_ttft_p99_ms=slo.ttft_p99_s * MS_PER_S,
        slo_tpot_p99_ms=None if slo.tpot_p99_s is None else slo.tpot_p99_s * MS_PER_S, scope=slo.scope,
        ttft_model=slo.ttft_model, notes=_notes(instance, opts, runs), **opts)


def _notes(instance: Instance, opts: dict, runs) -> tuple[str, ...]:
    out = ["preemptions: the engine has no KV preemption; 0 by construction",
           "all replicas up: availability is not simulated"]
    if instance.slo.ttft_model == "mean-prefill":
        out.append("analytic P99 TTFT uses the 'mean-prefill' model (P99 wait + mean prefill); the simulated one is "
                   "the true P99 of wait + prefill")
    if any(r.warmup_cut for r in runs):
        out.append(f"the service times' start-up scale E[S^2]/E[S] = {opts['relaxation_s']:,.0f} s is long against a "
                   f"replication ({np.mean([r.span_s for r in runs]):,.0f} s): warm-up cut to half the span, so the "
                   "utilisation, batch and power of the slowest pools are low estimates; raise --requests or lower "
                   "--replications")
    if opts["arrivals"] == "trace":
        out.append(f"trace replay: the first {runs[0].n_requests} requests of the trace, rescaled to "
                   f"{instance.workload.arrival_rate_req_per_s:g} req/s; one deterministic run")
    if opts["router"] == "split":
        out.append("split routing of a tiled plan: each segment's shares (default: all to its own pool)")
    if opts["mode"] == "slot":
        out.append("slot mode: one FCFS queue per pool (M/G/c), the analytic model's own view; dispatch unused")
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Rendering (the CLI's table and progress bar)
# --------------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else ("inf" if x == math.inf else f"{x:,.1f}")


def _ci(ci: tuple[float, float]) -> str:
    return "" if all(math.isnan(x) for x in ci) else f" [{_ms(ci[0])}, {_ms(ci[1])}]"


def render_simulation(c, rep: SimReport) -> None:
    """Print a :class:`SimReport`: per pool, analytic next to simulated, then the provenance line."""
    from rich.table import Table

    t = Table(title=f"{rep.instance_name}: simulated vs analytic  [P99 TTFT SLO {rep.slo_ttft_p99_ms:,.0f} ms, "
                    f"scope {rep.scope}]", title_justify="left", show_footer=True, pad_edge=False,
              caption="util, batch, power W: analytic / simulated; TTFT, TPOT: P99 in ms", caption_justify="left")
    a = rep.analytic
    cols = [("tokens", "fleet"), ("gpu", ""), ("repl.", str(a.total_replicas)), ("util", ""), ("batch", ""),
            ("TTFT an", _ms(a.ttft_p99_ms)), ("TTFT sim [95% CI]", _ms(rep.ttft_p99_ms) + _ci(rep.ttft_p99_ci_ms)),
            ("attain %", f"{100 * rep.slo_attainment:.2f}"), ("TPOT sim", _ms(rep.tpot_p99_ms)),
            ("power W", f"{a.power_kw * 1000:,.0f} / {rep.power_kw * 1000:,.0f}"),
            ("SLO", "met" if rep.slo_met else "MISSED")]
    for name, footer in cols:
        t.add_column(name, footer=footer, no_wrap=True,
                     justify="left" if name in ("tokens", "gpu", "SLO") else "right")
    for p in rep.pools:
        q = p.analytic
        t.add_row(f"{q.min_tokens:,}-{q.max_tokens:,}" + (f" (+@{q.compress_gamma:g})" if q.compress_gamma > 1 else ""),
                  q.gpu, str(q.replicas), f"{q.utilization:.2f} / {p.utilization_sim:.2f}",
                  f"{q.mean_batch:,.1f} / {p.mean_batch:,.1f}", _ms(q.ttft_p99_ms),
                  _ms(p.ttft_p99_ms_sim) + _ci(p.ttft_p99_ci_ms),
                  "-" if math.isnan(p.slo_attainment) else f"{100 * p.slo_attainment:.2f}", _ms(p.tpot_p99_ms_sim),
                  f"{q.power_w:,.0f} / {p.power_w_sim:,.0f}", "met" if p.slo_met_sim else "MISSED")
    c.print(t)
    e = rep.energy_per_output_token_j
    c.print(f"simulated: {rep.requests_simulated:,} requests ({rep.requests_measured:,} measured), "
            f"{rep.replications} replications, seed {rep.seed}, mode {rep.mode}, router {rep.router}, "
            f"dispatch {rep.dispatch}, arrivals {rep.arrivals}; CI {rep.ci_method}, stopped by {rep.stopped_by}; "
            f"{rep.simulated_seconds:,.0f} s simulated in {rep.wall_seconds:,.1f} s; analytic numbers from models/")
    c.print(f"  energy per output token {'-' if math.isnan(e) else f'{e:.3f} J'}; Little's law error "
            f"{rep.littles_law_rel_error:.1e}; unfinished {rep.unfinished:,}, rejected {rep.rejected:,}; "
            f"SLO on the CI upper bound (point estimate: {'met' if rep.slo_met_point else 'MISSED'})")
    for line in rep.notes:
        c.print(f"  note: {line}")


@contextmanager
def progress_bar(enabled: bool):
    """A rich progress bar on stderr yielding ``progress(done, total)``, or None when not ``enabled``."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulate", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
