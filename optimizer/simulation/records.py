r"""The records of ``fleetopt simulate`` and how they are built from the replications.

:class:`Replication` is what one replication of :func:`fleetopt.optimizer.simulation.simulate.simulate_plan` leaves
(its measured
requests and the window's time averages). :func:`build_report` pools the replications into a :class:`SimReport`
(the fleet) with one :class:`SimPoolReport` per pool and their :class:`Latency` percentiles, next to the analytic
evaluation of the same pools. :func:`p99_estimate` gives a P99 with its 95 % interval, from independent
replications or from batch means of one run. The measurement protocol (warm-up, cool-down, what counts as a
miss) is in the docstring of :mod:`fleetopt.optimizer.simulation.simulate`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.queueing.ttft import ttft_model
from fleetopt.models.units import MS_PER_S
from fleetopt.solvers.des.metrics import Estimate, batch_means_ci, percentile, quantile_ci

from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.pairs import PAIR_NOTE

__all__ = ["CONFIDENCE", "N_BATCHES", "MIN_POOL_REQUESTS", "OUTCOMES", "P99_SOURCES", "ANALYTIC_POOL_KEYS",
           "Latency", "SimPoolReport", "SimReport", "RequestLatencies", "Replication", "p99_estimate", "build_report",
           "with_dedicated_latency", "rejudged", "interval_outcome"]

CONFIDENCE = 0.95
"""Confidence level of every interval in a report."""
N_BATCHES = 20
"""Batches of the batch-means interval (one replication, or a trace replay)."""
MIN_POOL_REQUESTS = 500
"""Least measured requests a pool with traffic needs for its own verdict. A P99 over :math:`n` requests rests on
its :math:`n/100` slowest ones (5 at this floor); below it a pool's verdict is flagged ``too_few_requests`` and
never shown as met (:attr:`SimPoolReport.too_few_requests`; the verification re-simulates with more requests,
:mod:`fleetopt.optimizer.simulation.verify`)."""
OUTCOMES = ("pass", "fail", "undecided")
"""What an interval says about a limit (:func:`interval_outcome`)."""
P99_SOURCES = ("main run", "dedicated run")
"""Where a pool row's latency statistics and verdict come from (:attr:`SimPoolReport.p99_source`): the run of the
whole stream, or the pool's dedicated run of the requests routed to it (a thin pool,
:mod:`fleetopt.optimizer.simulation.simulate`, "Thin pools")."""
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
class _Measured:
    """What the simulation measured, for one pool or for the fleet, pooled over the replications' measured requests.

    Times in ms; a statistic is NaN when no measured request has it, and an interval's upper end is inf when
    too few requests leave it unbounded (:func:`p99_estimate`).
    """

    ttft_p99_ci_ms: tuple[float, float]
    """95 % interval of the P99 TTFT."""
    tpot_p99_ci_ms: tuple[float, float]
    """95 % interval of the P99 TPOT (completed requests)."""
    slo_attainment: float
    """Share of the measured requests whose TTFT meets the TTFT SLO."""
    utilization_sim: float
    """Busy slot-seconds over slot-seconds (mean over replications)."""
    energy_per_output_token_j: float
    """Energy over the window divided by the output tokens of the requests completed in it."""
    unfinished: int
    """Measured requests not completed at the horizon."""
    rejected: int
    """Measured requests their router rejected."""
    ttft: Latency
    tpot: Latency
    wait: Latency
    e2e: Latency

    def _latency_json(self) -> dict:
        return {"ttft": self.ttft.to_json(), "tpot": self.tpot.to_json(), "wait": self.wait.to_json(),
                "e2e": self.e2e.to_json()}


@dataclass(frozen=True)
class SimPoolReport(_Measured):
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
    tpot_p99_ms_sim: float
    slo_met_sim: bool
    mean_batch: float
    preemptions: int
    power_w_sim: float
    spilled: int
    """Requests the spillover router moved out of this pool to the next one up (all replications)."""
    replicas_up_mean: float
    """Replicas simulated, mean over the replications (the plan's count unless availability is sampled)."""
    max_num_seqs_sim: int
    """Batch cap per replica in the engine (the analytic one, unless ``kv="paged"``)."""
    p99_requests: int
    """Measured requests the P99s, their intervals, the attainment and the verdict rest on: ``requests`` (the main
    run's), or the dedicated run's for a thin pool (``p99_source``)."""
    p99_source: str
    """One of :data:`P99_SOURCES`: ``"main run"``, or ``"dedicated run"`` when the latency statistics and verdict
    come from the pool's own run (the counts, rate, utilisation, batch, power and energy stay the main run's, so
    the fleet's totals are still the pools' sums)."""
    role: str | None = None
    """A semantic plan's model class the pool serves (``small`` or ``large``); None for one model class."""

    @property
    def too_few_requests(self) -> bool:
        """The pool has traffic (analytic arrival rate > 0) but its verdict rests on fewer than
        :data:`MIN_POOL_REQUESTS` measured requests (``p99_requests``): too few to be trusted either way."""
        return bool(self.analytic.arrival_rate > 0 and self.p99_requests < MIN_POOL_REQUESTS)

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
        """The pool's object, built by its model (:class:`fleetopt.optimizer.output.contract.simulation.SimulatedPool`,
        the values its fields of the same names): its ``analytic`` and ``simulated`` figures; the flat keys are the
        deprecated 1.0 aliases (analytic, ``*_sim`` simulated); ``role`` only for a semantic plan."""
        from fleetopt.optimizer.output.contract import build, pool_analytic, pool_identity, pool_simulated
        from fleetopt.optimizer.output.contract.simulation import SimulatedPool

        a = self.analytic
        simulated = pool_simulated(
            requests=self.requests, p99_requests=self.p99_requests, p99_source=self.p99_source,
            too_few_requests=self.too_few_requests, arrival_rate=self.arrival_rate_sim,
            utilization=self.utilization_sim, ttft_p99_ms=self.ttft_p99_ms_sim, ttft_p99_ci_ms=self.ttft_p99_ci_ms,
            tpot_p99_ms=self.tpot_p99_ms_sim, tpot_p99_ci_ms=self.tpot_p99_ci_ms, mean_batch=self.mean_batch,
            power_w=self.power_w_sim, slo_attainment=self.slo_attainment, slo_met=self.slo_met_sim)
        return build(SimulatedPool, self, **pool_identity(a), analytic=pool_analytic(a), simulated=simulated,
                     max_num_seqs=a.max_num_seqs, compress_gamma=a.compress_gamma, mean_batch_analytic=a.mean_batch,
                     tpot_p99_ms_bound=a.tpot_p99_ms, latency_ms=self._latency_json(), profile=a.profile,
                     quality=a.quality, source=_SOURCE, phase=getattr(a, "phase", "both"))


@dataclass(frozen=True)
class SimReport(_Measured):
    """What :func:`fleetopt.optimizer.simulation.simulate.simulate_plan` measured, with the analytic evaluation of the
    same pools beside it.

    Times in ms, pooled over the replications' measured requests (:mod:`fleetopt.optimizer.simulation.simulate`); a
    statistic is NaN
    when no measured request has it (written as null in JSON, like inf).
    """

    requests_simulated: int
    requests_measured: int
    simulated_seconds: float
    wall_seconds: float
    ttft_p99_ms: float
    tpot_p99_ms: float
    slo_met: bool
    slo_met_point: bool
    power_kw: float
    pools: tuple[SimPoolReport, ...]
    options: SimOptions
    """The settings the run used (``router="auto"`` and spillover's default ``spill_bound`` resolved); ``seed``,
    ``mode``, ``router``, ``arrivals``, ``precision``, ``engine`` and ``spill_bound`` read from it."""
    replications: int
    """Replications run (1 for a trace replay, whatever ``options.replications`` says)."""
    ci_method: str
    stopped_by: str
    relaxation_s: float
    """The largest pool relaxation time (``PoolResult.relaxation_s``), the start-up time scale behind the warm-up
    floor (:mod:`fleetopt.optimizer.simulation.simulate`)."""
    warmup_s: float
    """Mean warm-up discarded per replication, in simulated seconds."""
    cooldown_s: float
    """Mean unmeasured end of a replication, in simulated seconds."""
    littles_law_rel_error: float
    """Largest :math:`|L - \\lambda W| / L` over pools and replications (the engine's books; ~0)."""
    analytic: FleetResult
    instance_name: str
    slo_ttft_p99_ms: float
    slo_tpot_p99_ms: float | None
    scope: str
    ttft_model: str
    notes: tuple[str, ...] = ()
    routing_source: str | None = None
    """``router="split"``: where the router's weights came from, ``"plan"`` (a split plan's own routing, req/s
    per length segment and pool from the split MIP) or ``"shares"`` (per-segment shares over a tiled plan's
    pools; default each segment to its own pool); None for the other routers."""
    request_latencies: RequestLatencies | None = field(default=None, repr=False, compare=False)
    """The measured requests' latencies, kept only when asked (``keep_requests=True``); :meth:`latencies`."""
    energy_per_token_j: float = math.nan
    """Energy over the window divided by all tokens (prompt and output) of the requests completed in it: the
    energy study's all-tokens figure beside :attr:`energy_per_output_token_j` (prefill energy is in both)."""
    semantic: dict | None = None
    """A semantic plan's rule (``share``, as the instance writes it) and per class (``classes``: ``role``,
    ``pools``, analytic ``rate_share`` :math:`\\pi_c`, measured ``requests`` and their share ``share_sim``); None
    for one model class (:mod:`fleetopt.optimizer.simulation.simulate`, "Semantic plans")."""

    seed = property(lambda self: self.options.seed)
    mode = property(lambda self: self.options.mode)
    router = property(lambda self: self.options.router)
    arrivals = property(lambda self: self.options.arrivals)
    precision = property(lambda self: self.options.precision)
    engine = property(lambda self: self.options.engine)
    spill_bound = property(lambda self: self.options.spill_bound)   # None unless router="spillover"
    dispatch = property(lambda self: self.options.dispatch if self.options.mode == "iteration" else "pool-fcfs")

    def undecided_notes(self) -> list[str]:
        """A note for each pool whose P99 TTFT interval straddles the SLO: it is not shown to meet it (the verdict
        is judged on the interval's upper bound), but this run cannot tell met from missed either; the note names
        the ``--precision`` that would decide (the SLO's distance from the point, in percent)."""
        slo, out = self.slo_ttft_p99_ms, []
        for p in self.pools:
            if getattr(p.analytic, "phase", "both") == "decode":     # a P/D pair's decode row: its TPOT interval
                lo, hi = p.tpot_p99_ci_ms
                tpot = self.slo_tpot_p99_ms
                if tpot is not None and not p.too_few_requests and lo <= tpot and \
                        interval_outcome(lo, hi, tpot) == "undecided":
                    q = p.analytic
                    out.append(f"pool {q.min_tokens:,}-{q.max_tokens:,} decode: its P99 TPOT interval [{lo:,.1f}, "
                               f"{hi:,.1f}] ms straddles the {tpot:,g} ms SLO, so this run cannot tell whether it "
                               "meets it; a longer run (--requests) may decide (--precision narrows TTFT intervals)")
                continue
            lo, hi = p.ttft_p99_ci_ms
            if p.too_few_requests or not (lo <= slo and interval_outcome(lo, hi, slo) == "undecided"):
                continue
            q, point = p.analytic, p.ttft_p99_ms_sim
            if not (math.isfinite(point) and point > 0):
                how = "a longer run (--requests) may decide"
            else:
                need = math.floor(1000.0 * abs(slo - point) / point) / 10.0
                how = (f"--precision {need:g} runs until the interval is narrow enough to decide (up to "
                       "--max-requests)" if need >= 0.1 else
                       "its P99 is within 0.1 % of the SLO, closer than a simulation can decide")
            out.append(f"pool {q.min_tokens:,}-{q.max_tokens:,}: its P99 TTFT interval [{lo:,.1f}, {hi:,.1f}] ms "
                       f"straddles the {slo:,g} ms SLO, so this run cannot tell whether it meets it; {how}")
        return out

    def to_json(self) -> dict:
        """The document, built by its model (:class:`fleetopt.optimizer.output.contract.simulation.SimulateDocument`,
        the values its fields of the same names): the envelope, the keys of the issue, then provenance and details. The
        fleet's figures are in ``analytic`` and ``simulated``; the top-level ones are the deprecated 1.0 aliases of
        ``simulated``'s."""
        from fleetopt.optimizer.output.contract import build, envelope, fleet_analytic, fleet_simulated
        from fleetopt.optimizer.output.contract.simulation import SimulateDocument

        simulated = fleet_simulated(
            requests_measured=self.requests_measured, ttft_p99_ms=self.ttft_p99_ms,
            ttft_p99_ci_ms=self.ttft_p99_ci_ms, tpot_p99_ms=self.tpot_p99_ms, tpot_p99_ci_ms=self.tpot_p99_ci_ms,
            slo_attainment=self.slo_attainment, slo_met=self.slo_met, slo_met_point=self.slo_met_point,
            utilization=self.utilization_sim, power_kw=self.power_kw,
            energy_per_output_token_j=self.energy_per_output_token_j)
        return build(SimulateDocument, self, **envelope("simulate", self.instance_name),
                     pools=[p.to_json() for p in self.pools], source=_SOURCE,
                     preemptions=int(sum(p.preemptions for p in self.pools)), latency_ms=self._latency_json(),
                     engine=self.engine.to_json(), options=self.options.to_json(), confidence=CONFIDENCE,
                     analytic=fleet_analytic(self.analytic), simulated=simulated,
                     notes=[*self.undecided_notes(), *self.notes],
                     **({} if self.semantic is None else {"semantic": self.semantic}))

    def rows(self) -> list[dict]:
        """One row per pool: the analytic figures next to the simulated ones (ms, W)."""
        from fleetopt.optimizer.plan.solve import pool_row

        return [{**pool_row(p.analytic), **{k: getattr(p, k) for k in _SIM_COLUMNS}} for p in self.pools]

    def to_frame(self):
        """:meth:`rows` as a ``pandas.DataFrame`` (the optional extra ``fleetopt[frames]``)."""
        from fleetopt.optimizer.plan.solve import POOL_COLUMNS, table_frame

        return table_frame(self.rows(), [*POOL_COLUMNS, *_SIM_COLUMNS])

    def _repr_html_(self) -> str:
        from fleetopt.optimizer.plan.solve import POOL_COLUMNS, table_html

        lo, hi = self.ttft_p99_ci_ms
        head = (f"{self.instance_name}: simulated P99 TTFT {self.ttft_p99_ms:,.1f} ms (95% CI {lo:,.1f}-{hi:,.1f}), "
                f"SLO {self.slo_ttft_p99_ms:,.0f} ms {'met' if self.slo_met else 'missed'}; "
                f"{self.requests_measured:,} requests measured, {self.replications} replication(s), seed {self.seed}")
        return table_html(head, self.rows(), [*POOL_COLUMNS, *_SIM_COLUMNS])

    def latencies(self) -> dict[str, dict[str, np.ndarray]]:
        """Per pool (``"MIN-MAX:GPU"``), the measured requests' TTFT and TPOT in ms, for plotting.

        ``ttft_ms`` holds every measured request of the pool (inf: no first token by the horizon); ``tpot_ms``
        the completed ones with more than one output token. Replications are concatenated in order.

        Raises
        ------
        ValueError
            When the run did not keep them (``simulate(..., keep_requests=True)`` does).
        """
        if self.request_latencies is None:
            raise ValueError("latencies(): the per-request latencies were not kept; simulate with keep_requests=True")
        return self.request_latencies.by_pool()


_SIM_COLUMNS = ("requests", "ttft_p99_ms_sim", "tpot_p99_ms_sim", "slo_attainment", "utilization_sim",
                "power_w_sim", "slo_met_sim")
"""The simulated pool figures a notebook table shows next to the analytic ones (ms, W)."""


@dataclass(frozen=True, eq=False)
class RequestLatencies:
    """Every measured request's pool and latencies, pooled over the replications (seconds inside)."""

    pool_labels: tuple[str, ...]
    pool: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray

    phases: tuple[str, ...] = ()
    """Each row's ``phase`` (empty: every row ``both``)."""

    @classmethod
    def from_runs(cls, analytic: FleetResult, runs: Sequence[Replication]) -> RequestLatencies:
        phases = tuple(getattr(p, "phase", "both") for p in analytic.pools)
        labels = tuple(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}" + ("" if ph == "both" else f" {ph}")
                       for p, ph in zip(analytic.pools, phases))
        return cls(labels, np.concatenate([r.pool for r in runs]), np.concatenate([r.ttft_s for r in runs]),
                   np.concatenate([r.tpot_s for r in runs]), phases)

    def by_pool(self) -> dict[str, dict[str, np.ndarray]]:
        """``{label: {"ttft_ms": ..., "tpot_ms": ...}}`` (TPOT without its NaNs). A P/D pair's rows are labelled
        with their phase (``"0-8192:h100 prefill"``) and hold the pair's requests, each row its own figure: the
        prefill row their TTFT, the decode row their TPOT (the other empty)."""
        out = {}
        for k, label in enumerate(self.pool_labels):
            phase = self.phases[k] if self.phases else "both"
            sel = self.pool == (k - 1 if phase == "decode" else k)
            if phase != "both":
                keep = "ttft_ms" if phase == "prefill" else "tpot_ms"
                tpot = self.tpot_s[sel]
                got = {"ttft_ms": self.ttft_s[sel] * MS_PER_S, "tpot_ms": tpot[~np.isnan(tpot)] * MS_PER_S}
                out[label] = {name: (v if name == keep else np.zeros(0)) for name, v in got.items()}
                continue
            tpot = self.tpot_s[sel]
            out[label] = {"ttft_ms": self.ttft_s[sel] * MS_PER_S, "tpot_ms": tpot[~np.isnan(tpot)] * MS_PER_S}
        return out


@dataclass(frozen=True, eq=False)
class Replication:
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
    preemptions: np.ndarray     # per pool: KV-cache preemptions in the run
    spilled: np.ndarray         # per pool: requests a spillover router moved out of it
    replicas_up: np.ndarray     # per pool: replicas simulated (all, or those drawn up)
    batch_cap: np.ndarray       # per pool: max_num_seqs per replica in the engine
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
    tokens_done: np.ndarray | None = None   # per pool: prompt plus output tokens of the requests completed
    decode_wait_s: np.ndarray | None = None  # per measured request: a P/D pair's wait for a decode slot (else NaN)

# --------------------------------------------------------------------------------------------
# From replications to a report
# --------------------------------------------------------------------------------------------


def p99_estimate(groups: list[np.ndarray]) -> Estimate:
    """P99 of the non-NaN values with its 95 % interval (:mod:`fleetopt.optimizer.simulation.simulate`).

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


def _mean_defined(values: list[float]) -> float:
    """Mean of the values that are not NaN (a replication with no replica up has no utilisation); NaN if none."""
    defined = [v for v in values if not math.isnan(v)]
    return float(np.mean(defined)) if defined else math.nan


def _ci_ms(e: Estimate) -> tuple[float, float]:
    return (e.low * MS_PER_S, e.high * MS_PER_S)


def _meets(value_s: float, limit_s: float | None, measured: bool = True) -> bool:
    r"""Whether a P99 in seconds meets ``limit_s``, :math:`x \le T (1 + 10^{-12})`; without a limit, or with
    nothing ``measured``, it cannot miss (a NaN ``value_s`` of something measured misses)."""
    return bool(limit_s is None or not measured or value_s <= limit_s * (1 + 1e-12))


def interval_outcome(low: float, high: float, limit: float) -> str:
    r"""What the interval :math:`[a, b]` of a P99 says about a limit :math:`s` (one of :data:`OUTCOMES`):
    ``"pass"`` when :math:`b \le s` (the whole interval is within it, the tolerance of :func:`_meets`),
    ``"fail"`` when :math:`a > s` (a miss the interval supports), else ``"undecided"`` (it straddles the limit;
    a NaN or infinite end leaves it so). Any unit, the same for all three.

    >>> [interval_outcome(a, b, 500.0) for a, b in ((400.0, 480.0), (510.0, 600.0), (300.0, 547.0))]
    ['pass', 'fail', 'undecided']
    """
    if high <= limit * (1 + 1e-12):
        return "pass"
    if low > limit:
        return "fail"
    return "undecided"


def _within(e: Estimate, limit_s: float | None, upper: bool) -> bool:
    """Whether the P99 (its interval's upper end if ``upper``) meets ``limit_s``; nothing measured cannot miss."""
    return _meets(e.high if upper else e.value, limit_s, not math.isnan(e.value))


def _pool_scope_verdicts(pools, slo) -> tuple[bool, bool]:
    """A pool-scope SLO's fleet verdicts from the pool rows: every pool met on its interval's upper end, and
    every pool's point estimates (TTFT and, if the SLO sets one, TPOT) within the SLO."""
    met = all(p.slo_met_sim for p in pools)
    met_point = all(_meets(v / MS_PER_S, limit, not math.isnan(v))
                    for p in pools for v, limit in ((p.ttft_p99_ms_sim, slo.ttft_p99_s),
                                                    (p.tpot_p99_ms_sim, slo.tpot_p99_s)))
    return met, met_point


def with_dedicated_latency(main: SimPoolReport, own: SimPoolReport) -> SimPoolReport:
    """The main run's row of a thin pool with the latency statistics and verdict of its dedicated run ``own``
    (P99s and intervals, percentiles, attainment, ``slo_met_sim``; ``p99_requests`` = ``own.requests``). The
    counts, rate, utilisation, batch, power and energy stay ``main``'s: the fleet's totals sum them."""
    return replace(main, ttft_p99_ms_sim=own.ttft_p99_ms_sim, ttft_p99_ci_ms=own.ttft_p99_ci_ms,
                   tpot_p99_ms_sim=own.tpot_p99_ms_sim, tpot_p99_ci_ms=own.tpot_p99_ci_ms,
                   slo_attainment=own.slo_attainment, slo_met_sim=own.slo_met_sim, ttft=own.ttft, tpot=own.tpot,
                   wait=own.wait, e2e=own.e2e, p99_requests=own.requests, p99_source=P99_SOURCES[1])


def rejudged(report: SimReport, pools: tuple[SimPoolReport, ...], notes: tuple[str, ...], slo) -> SimReport:
    """``report`` with new pool rows and notes; under a pool-scope ``slo`` (the instance's) its verdicts
    (``slo_met``, ``slo_met_point``) judged again from the rows. The fleet's figures (P99, attainment, counts,
    power) stay."""
    if slo.scope == "fleet":
        return replace(report, pools=pools, notes=notes)
    met, met_point = _pool_scope_verdicts(pools, slo)
    return replace(report, pools=pools, notes=notes, slo_met=met, slo_met_point=met_point)


_NOTHING = Estimate(math.nan, math.nan, math.nan, CONFIDENCE, 0)
"""The estimate of a figure a row does not report (a P/D pair's TPOT on its prefill row, TTFT on its decode row)."""


def _pool_report(instance: Instance, a: PoolResult, k: int, runs: Sequence[Replication]) -> SimPoolReport:
    """Row ``k`` of the report. A P/D pair's rows share the pair's requests (charged to its prefill row, ``k - 1``
    for the decode row): the prefill row reports and is judged on their TTFT (wait + prefill + KV transfer), the
    decode row on their TPOT (its ``wait`` latency: the wait for a decode slot); each leaves the other's figure
    NaN."""
    phase = getattr(a, "phase", "both")
    src = k - 1 if phase == "decode" else k
    sel = [r.pool == src for r in runs]

    def pooled(name: str) -> list[np.ndarray]:
        return [getattr(r, name)[s] for r, s in zip(runs, sel)]

    n = int(sum(s.sum() for s in sel))
    ttft, tpot = p99_estimate(pooled("ttft_s")), p99_estimate(pooled("tpot_s"))
    slo = instance.slo
    all_ttft = np.concatenate(pooled("ttft_s"))
    all_tpot = np.concatenate(pooled("tpot_s"))
    wait = np.concatenate(pooled("wait_s"))
    attainment = float(np.mean(all_ttft <= slo.ttft_p99_s)) if n else math.nan
    if phase == "prefill":
        tpot, all_tpot = _NOTHING, np.full(0, math.nan)
        met = _within(ttft, slo.ttft_p99_s, True)
    elif phase == "decode":
        ttft, all_ttft, attainment = _NOTHING, np.full(0, math.nan), math.nan
        wait = np.concatenate([r.decode_wait_s[s] for r, s in zip(runs, sel) if r.decode_wait_s is not None]
                              or [np.full(0, math.nan)])
        met = _within(tpot, slo.tpot_p99_s, True)
    else:
        met = _within(ttft, slo.ttft_p99_s, True) and _within(tpot, slo.tpot_p99_s, True)
    return SimPoolReport(
        analytic=a, requests=n, arrival_rate_sim=n / sum(r.measured_s for r in runs),
        ttft_p99_ms_sim=ttft.value * MS_PER_S, ttft_p99_ci_ms=_ci_ms(ttft),
        tpot_p99_ms_sim=tpot.value * MS_PER_S, tpot_p99_ci_ms=_ci_ms(tpot),
        slo_attainment=attainment,
        slo_met_sim=met,
        mean_batch=float(np.mean([r.mean_batch[k] for r in runs])),
        preemptions=int(sum(int(r.preemptions[k]) for r in runs)),
        spilled=int(sum(int(r.spilled[k]) for r in runs)),
        replicas_up_mean=float(np.mean([r.replicas_up[k] for r in runs])),
        max_num_seqs_sim=int(runs[0].batch_cap[k]), p99_requests=n, p99_source=P99_SOURCES[0],
        utilization_sim=float(np.mean([r.utilization[k] for r in runs])),
        power_w_sim=float(np.mean([r.power_w[k] for r in runs])),
        energy_per_output_token_j=_ratio(sum(r.energy_j[k] for r in runs), sum(r.output_tokens_done[k] for r in runs)),
        unfinished=int(sum(x.sum() for x in pooled("unfinished"))),
        rejected=int(sum(x.sum() for x in pooled("rejected"))),
        ttft=_latency(all_ttft), tpot=_latency(all_tpot), wait=_latency(wait),
        e2e=_latency(np.concatenate(pooled("e2e_s"))))


def build_report(instance: Instance, analytic: FleetResult, runs: Sequence[Replication], fleet: Estimate,
                 options: SimOptions, *, replications: int, stopped_by: str, requests_simulated: int,
                 relaxation_s: float, routing_source: str | None, wall_s: float) -> SimReport:
    """Pool the replications of a run into a :class:`SimReport`.

    ``runs`` holds one :class:`Replication` per replication, ``fleet`` is the fleet P99 TTFT estimate (the
    pipeline's stopping statistic), ``options`` the settings as run, the keywords the run's outcome fields of
    :class:`SimReport` and ``wall_s`` the wall time in seconds.
    """
    slo = instance.slo
    pools = tuple(_pool_report(instance, a, k, runs) for k, a in enumerate(analytic.pools))
    tpot = p99_estimate([r.tpot_s for r in runs])
    ttft_all = np.concatenate([r.ttft_s for r in runs])
    if slo.scope == "fleet":
        met = _within(fleet, slo.ttft_p99_s, True) and _within(tpot, slo.tpot_p99_s, True)
        met_point = _within(fleet, slo.ttft_p99_s, False) and _within(tpot, slo.tpot_p99_s, False)
    else:
        met, met_point = _pool_scope_verdicts(pools, slo)
    ci_method = "replications" if replications >= 2 else f"batch-means ({N_BATCHES} batches)"
    return SimReport(
        requests_measured=int(ttft_all.size), simulated_seconds=float(sum(r.span_s for r in runs)),
        wall_seconds=wall_s, ttft_p99_ms=fleet.value * MS_PER_S, ttft_p99_ci_ms=_ci_ms(fleet),
        tpot_p99_ms=tpot.value * MS_PER_S, tpot_p99_ci_ms=_ci_ms(tpot),
        slo_met=met, slo_met_point=met_point, slo_attainment=float(np.mean(ttft_all <= slo.ttft_p99_s)),
        power_kw=float(np.mean([r.power_w.sum() for r in runs])) / 1000.0,
        energy_per_output_token_j=_ratio(sum(r.energy_j.sum() for r in runs),
                                         sum(r.output_tokens_done.sum() for r in runs)),
        energy_per_token_j=(_ratio(sum(r.energy_j.sum() for r in runs),
                                   sum(cast(np.ndarray, r.tokens_done).sum() for r in runs))   # all set: below
                            if all(r.tokens_done is not None for r in runs) else math.nan),
        utilization_sim=_mean_defined([_ratio(r.busy_slot_s.sum(), r.slot_s.sum()) for r in runs]),
        pools=pools, ci_method=ci_method, warmup_s=float(np.mean([r.warmup_s for r in runs])),
        cooldown_s=float(np.mean([r.span_s - r.warmup_s - r.measured_s for r in runs])),
        littles_law_rel_error=max(r.littles_error for r in runs),
        unfinished=int(sum(r.unfinished.sum() for r in runs)), rejected=int(sum(r.rejected.sum() for r in runs)),
        ttft=_latency(ttft_all), tpot=_latency(np.concatenate([r.tpot_s for r in runs])),
        wait=_latency(np.concatenate([r.wait_s for r in runs])), e2e=_latency(np.concatenate([r.e2e_s for r in runs])),
        analytic=analytic, instance_name=instance.name, slo_ttft_p99_ms=slo.ttft_p99_s * MS_PER_S,
        slo_tpot_p99_ms=None if slo.tpot_p99_s is None else slo.tpot_p99_s * MS_PER_S, scope=slo.scope,
        ttft_model=slo.ttft_model,
        notes=_notes(instance, options, routing_source, relaxation_s, runs)
        + ((PAIR_NOTE,) if any(getattr(p, "phase", "both") != "both" for p in analytic.pools) else ()),
        options=options, replications=replications, stopped_by=stopped_by, requests_simulated=requests_simulated,
        relaxation_s=relaxation_s, routing_source=routing_source)


def _notes(instance: Instance, options: SimOptions, routing_source: str | None, relaxation_s: float,
           runs: Sequence[Replication]) -> tuple[str, ...]:
    engine = options.engine
    if engine.kv == "paged":
        out = ["kv paged: vLLM admission by KV blocks up to max_num_seqs per replica, recompute preemption when the "
               "blocks run out; the iteration latency is extrapolated beyond the profile's calibrated batch; simulated "
               "utilisation is over max_num_seqs sequences per replica"]
    else:
        out = ["kv reserve: every sequence holds a KV slot of its pool's window (the analytic view); no preemption"]
    if engine.max_batched_tokens is not None:
        out.append(f"token budget: {engine.max_batched_tokens:,} tokens per iteration per replica (decodes first, "
                   "then prefill chunks oldest first); the analytic numbers assume no budget")
    if engine.availability == "sampled":
        out.append("availability sampled: each replication simulates Binomial(N, A) replicas up per pool for its "
                   "whole span; requests of a pool with none up are rejected (SLO misses)")
    else:
        out.append("all replicas up: availability is not simulated (--availability sampled draws them)")
    if ttft_model(instance.slo.ttft_model).simulation_note:
        out.append(ttft_model(instance.slo.ttft_model).simulation_note)
    if any(r.warmup_cut for r in runs):
        out.append(f"the service times' start-up scale E[S^2]/E[S] = {relaxation_s:,.0f} s is long against a "
                   f"replication ({np.mean([r.span_s for r in runs]):,.0f} s): warm-up cut to half the span, so the "
                   "utilisation, batch and power of the slowest pools are low estimates; raise --requests or lower "
                   "--replications")
    if options.arrivals == "trace":
        out.append(f"trace replay: the first {runs[0].n_requests} requests of the trace, rescaled to "
                   f"{instance.workload.arrival_rate_req_per_s:g} req/s; one deterministic run")
    if routing_source == "plan":
        out.append("split routing from the plan: the router replays the plan's routing (req/s per length segment "
                   "and pool, from the split MIP), drawing each request's pool with those rates as weights; the "
                   "analytic numbers evaluate each pool at its routed mix")
    elif options.router == "split":
        out.append("split routing of a tiled plan: each segment's shares (default: all to its own pool)")
    if options.router == "spillover":
        out.append(f"spillover: an arrival moves to the next pool up when more than {options.spill_bound} requests "
                   "wait in its own pool (one hop, only if it fits); the analytic numbers assume length routing")
        if len(runs[0].spilled) == 1:
            out.append("spillover with one pool: there is nowhere to spill (no pool above it), so this is length "
                       "routing")
    if options.mode == "slot":
        out.append("slot mode: one FCFS queue per pool (M/G/c), the analytic model's own view; dispatch unused")
    return tuple(out)
