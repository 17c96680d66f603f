r"""Agreement of the analytic pool model with the simulator: random single pools, both views, ratio statistics.

A yardstick for the analytic model (:func:`fleetopt.models.fleet.evaluate_fleet`): draw candidate pools at
random, evaluate each analytically and simulate it (:func:`fleetopt.optimizer.simulation.simulate.simulate_plan`,
iteration mode, JSQ dispatch, Poisson arrivals by default), and summarise the ratio analytic / simulated of four
metrics: P99 TTFT, mean batch per replica, slot utilisation and pool power.

The pools
---------
:func:`sample_pools` draws, from one ``numpy.random.Generator``, pools of

* a workload of :data:`WORKLOADS` (the bundled CDFs and the bundled trace);
* a GPU option of :data:`GPU_CHOICES` (every calibrated profile, plus computed hardware + model profiles);
* a length window :math:`(lo, hi]`: :math:`hi` on the grid :data:`WINDOW_HI_TOKENS` (2K to 64K) that the
  profile holds, :math:`lo = 0` or :math:`hi/k`, :math:`k \in \{2, 4, 8\}`;
* a replica count :math:`N` (log-uniform in 1..:data:`MAX_REPLICAS`) and a target utilisation
  :math:`u \sim U(` :data:`UTILIZATION_BAND` :math:`)`, from which the arrival rate is
  :math:`\lambda = u\, N c / E[S]` (:math:`c` slots per replica, :math:`E[S]` mean slot time of the window;
  the analytic utilisation :math:`\lambda E[S] / (N c)` is linear in :math:`\lambda`).

A pool of window :math:`(lo, hi]` is one instance whose workload is the bundled one *conditioned* on
:math:`(lo, hi]` (a CDF renormalised on the window, or the trace's rows in it) with one pool ``0-hi``: the
pool then receives exactly the window's requests at rate :math:`\lambda`, its slots are those of a
:math:`hi`-token window, and no other pool has to be simulated. A draw is skipped and drawn again when the
window holds too little of the workload (:data:`MIN_WINDOW_SHARE`, :data:`MIN_TRACE_ROWS`), the profile
cannot hold :math:`hi`, or the analytic pool is unstable (utilisation outside the band, P99 TTFT not finite).
Each pool carries its own simulation seed, drawn from the same generator, so the whole run is reproducible.

The statistics
--------------
For each metric :func:`summarize_ratios` gives the median, P10 and P90 of :math:`r` = analytic / simulated
(numpy percentiles, method :data:`fleetopt.solvers.des.metrics.PERCENTILE_METHOD`, the empirical quantile),
the worst ratio (largest :math:`|\ln r|`), the share within the metric's band
(:math:`|r - 1| \le` :data:`BANDS`: 10 % for TTFT, 5 % for the others) and the share *optimistic* by more
than 20 % (:math:`r <` :data:`OPTIMISTIC_BELOW` = 0.8, e.g. analytic TTFT below 0.8 x simulated). A
simulated P99 TTFT of :math:`+\infty` (a measured request without a first token) gives :math:`r = 0`.

P/D pairs
---------
:func:`run_pair_agreement` does the same for disaggregated prefill/decode pairs (:func:`draw_pair`: a workload and
window as above, a prefill and a decode option of one model from a group of :data:`PD_GPU_GROUPS`, the prefill
count and the rate that puts the prefill utilisation in :data:`UTILIZATION_BAND`, the decode station's least count
at a drawn utilisation cap, a KV transfer by the bandwidth model), each pair one plan simulated by
:func:`~fleetopt.optimizer.simulation.simulate.simulate_plan`, and compares :data:`PD_METRICS`: the pair's P99 TTFT,
prefill utilisation and power, decode batch, utilisation and power, and the mean TPOT
(:func:`summarize_pair_agreement`, bands :data:`PD_BANDS`; ``docs/benchmarks.md``, "P/D pairs").
"""

from __future__ import annotations

import csv
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from fleetopt.models.fleet import PoolPlan, PoolResult
from fleetopt.models.workload import LengthDistribution, RequestTrace
from fleetopt.solvers.des.metrics import PERCENTILE_METHOD, percentile

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.catalog import BUILTIN_WORKLOADS, data_dir
from fleetopt.optimizer.io.instance import Instance, instance_from_dict
from fleetopt.optimizer.io.schema import DEFAULT_MAX_UTILIZATION
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan

if TYPE_CHECKING:   # the P/D stations load with the first pair drawn
    from fleetopt.models.queueing.disagg import KVTransfer

__all__ = ["WORKLOADS", "GPU_CHOICES", "WINDOW_HI_TOKENS", "UTILIZATION_BAND", "MAX_REPLICAS", "METRICS", "BANDS",
           "RELAXATION_SPANS", "MAX_REQUESTS", "PINNED_HALF_WIDTH", "pinned",
           "OPTIMISTIC_BELOW", "MIN_WINDOW_SHARE", "MIN_TRACE_ROWS", "SampledPool", "MetricAgreement",
           "PoolAgreement", "RatioSummary", "draw_pool", "sample_pools", "agreement_options", "measure_pool",
           "run_agreement", "summarize_ratios", "summarize_agreement", "PD_GPU_GROUPS", "PD_METRICS", "PD_BANDS",
           "SampledPair", "PairAgreement", "draw_pair", "sample_pairs", "measure_pair", "run_pair_agreement",
           "summarize_pair_agreement"]

WORKLOADS = ("builtin:azure", "builtin:lmsys", "builtin:agent_heavy", "builtin:azure_conv_trace")
"""The bundled workloads the sampler draws from (the last one is a trace)."""

GPU_CHOICES: tuple[tuple[tuple[str, object], ...], ...] = (
    (("profile", "A10G"),),
    (("profile", "A100-80GB"),),
    (("profile", "H100-80GB"),),
    (("profile", "B200-projected"),),
    (("hardware", "H100-SXM-80GB"), ("model", "Llama-3.1-8B"), ("tp", 1)),
    (("hardware", "H100-SXM-80GB"), ("model", "Llama-3.1-70B"), ("tp", 8)),
)
"""GPU option entries (the ``gpus[]`` keys of an instance, as pairs): the calibrated profiles and two computed ones."""

WINDOW_HI_TOKENS = (2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536)
"""Upper ends a window may have."""

WINDOW_LO_DIVISORS = (2, 4, 8)
"""A window's lower end is 0 (probability 1/3) or its upper end divided by one of these."""

UTILIZATION_BAND = (0.2, 0.85)
"""The analytic slot utilisation a drawn pool is given, uniform in this interval."""

MAX_REPLICAS = 16
"""Largest replica count drawn (log-uniform in 1..16)."""

MIN_WINDOW_SHARE = 0.005
"""A CDF window must hold at least this share of the workload's requests."""

MIN_TRACE_ROWS = 200
"""A trace window must hold at least this many of the trace's rows."""

METRICS = ("ttft_p99", "mean_batch", "utilization", "power")
"""The metrics compared, in report order."""

BANDS = {"ttft_p99": 0.10, "mean_batch": 0.05, "utilization": 0.05, "power": 0.05}
"""Relative band around 1 within which a ratio counts as agreeing, per metric."""

OPTIMISTIC_BELOW = 0.8
"""A ratio below this is optimistic by more than 20 % (for TTFT: the model promises less than is measured)."""

RELAXATION_SPANS = 40.0
"""A pool's simulation spans at least this many of its relaxation times (``PoolResult.relaxation_s``): a pool
near its stability limit forgets its empty start slowly, and a run of a fixed request count would then measure
the start-up transient instead of the steady state the analytic model describes."""

MAX_REQUESTS = 3_000_000
"""Cap on the requests :data:`RELAXATION_SPANS` may ask of one pool."""

SLO_TTFT_P99_MS = 60_000.0
"""TTFT SLO of the drawn instances. It plays no part in a pool's analytic numbers at a fixed replica count; the
simulator's unmeasured end lasts ``min(max(5 % of the span, 10 SLOs), 25 % of the span)``."""


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class SampledPool:
    """One drawn pool: its description, the instance that carries it and its analytic evaluation.

    ``instance`` has the workload conditioned on ``(lo_tokens, hi_tokens]`` and one pool ``0-hi_tokens``
    of ``replicas`` replicas (``spec``, a ``--fleet`` spec); ``analytic`` is that pool's evaluation.
    """

    workload: str
    gpu: str
    """The profile's name (a calibrated profile, or ``HARDWARE/MODEL/tpN/dtype`` for a computed one)."""
    lo_tokens: int
    hi_tokens: int
    replicas: int
    arrival_rate_req_per_s: float
    utilization_analytic: float
    window_share: float
    """Share of the workload's requests (a trace's rows) in the window."""
    sim_seed: int
    spec: str
    instance: Instance
    analytic: PoolResult

    def describe(self) -> dict:
        """The description as JSON-ready scalars."""
        return {"workload": self.workload, "gpu": self.gpu, "lo_tokens": self.lo_tokens, "hi_tokens": self.hi_tokens,
                "replicas": self.replicas, "arrival_rate_req_per_s": self.arrival_rate_req_per_s,
                "utilization_analytic": self.utilization_analytic, "window_share": self.window_share,
                "sim_seed": self.sim_seed}


@dataclass(frozen=True)
class MetricAgreement:
    """One metric of one pool: analytic value, simulated value (with its 95 % interval where the report has one)
    and ``ratio`` = analytic / simulated (0 when the simulated value is infinite)."""

    analytic: float
    simulated: float
    simulated_ci: tuple[float, float] | None
    ratio: float


@dataclass(frozen=True)
class PoolAgreement:
    """One pool, analytic against simulated. Units: TTFT in ms, power in W, batch in sequences per replica."""

    pool: SampledPool
    ttft_p99_ms: MetricAgreement
    mean_batch: MetricAgreement
    utilization: MetricAgreement
    power_w: MetricAgreement
    requests_simulated: int
    wall_s: float

    def metric(self, name: str) -> MetricAgreement:
        """The agreement of metric ``name`` (one of :data:`METRICS`)."""
        fields = {"ttft_p99": self.ttft_p99_ms, "mean_batch": self.mean_batch, "utilization": self.utilization,
                  "power": self.power_w}
        if name not in fields:
            raise ValueError(f"metric: {name!r} is not one of {', '.join(METRICS)}")
        return fields[name]

    def to_json(self) -> dict:
        return {**self.pool.describe(), "requests_simulated": self.requests_simulated, "wall_s": self.wall_s,
                **{m: {"analytic": self.metric(m).analytic, "simulated": self.metric(m).simulated,
                       "simulated_ci": self.metric(m).simulated_ci, "ratio": self.metric(m).ratio}
                   for m in METRICS}}


@dataclass(frozen=True)
class RatioSummary:
    """The distribution of one metric's ratio analytic / simulated over the pools (:func:`summarize_ratios`)."""

    metric: str
    pools: int
    median: float
    p10: float
    p90: float
    worst: float
    """The ratio farthest from 1 in log terms (largest :math:`|\\ln r|`)."""
    band: float
    within_band_share: float
    optimistic_share: float
    """Share of ratios below :data:`OPTIMISTIC_BELOW`."""

    def to_json(self) -> dict:
        return {"metric": self.metric, "pools": self.pools, "median": self.median, "p10": self.p10, "p90": self.p90,
                "worst": self.worst, "band": self.band, "within_band_share": self.within_band_share,
                "optimistic_share": self.optimistic_share, "percentile_method": PERCENTILE_METHOD}


# --------------------------------------------------------------------------------------------
# Drawing pools
# --------------------------------------------------------------------------------------------


@cache
def _workload_lengths(workload: str) -> LengthDistribution | RequestTrace:
    """The bundled workload's lengths (read once per process), untruncated."""
    from fleetopt.optimizer.io.schema import Problems, RawWorkload
    from fleetopt.optimizer.io.workloads import load_workload

    key = "trace" if BUILTIN_WORKLOADS[workload.removeprefix("builtin:")].endswith(".csv") else "cdf"
    problems = Problems(None)
    loaded = load_workload(RawWorkload.model_validate({key: workload, "arrival_rate": 1.0}), data_dir(), problems)
    problems.raise_if_any()
    assert loaded is not None   # raise_if_any raised for a workload that did not load
    return loaded.lengths


def _window_cdf(dist: LengthDistribution, lo: int, hi: int) -> tuple[list[list[float]], float]:
    """The CDF points of ``dist`` conditioned on ``(lo, hi]`` and the window's share of ``dist``.

    .. math:: F_w(x) = \\frac{F(x) - F(lo)}{F(hi) - F(lo)}, \\quad lo \\le x \\le hi

    on ``lo`` (when > 0), the CDF's own breakpoints inside the window, and ``hi``: the conditioned
    distribution is the same piecewise-uniform one restricted to the window.
    """
    inner = [float(t) for t in dist.breakpoints if lo < t < hi]
    points = ([float(lo)] if lo > 0 else []) + inner + [float(hi)]
    F_lo, F_hi = float(dist.cdf(lo)), float(dist.cdf(hi))
    share = F_hi - F_lo
    if share <= 0:
        return [], 0.0
    F = (np.asarray(dist.cdf(points), dtype=float) - F_lo) / share
    F = np.clip(np.maximum.accumulate(F), 0.0, 1.0)
    F[-1] = 1.0
    return [[t, float(f)] for t, f in zip(points, F)], share


def _window_trace_csv(trace: RequestTrace, lo: int, hi: int, folder: Path) -> tuple[Path | None, float]:
    """The trace's rows of total length in ``(lo, hi]`` written as a trace CSV in ``folder``, and their share."""
    total = trace.total_tokens
    keep = (total > lo) & (total <= hi)
    if int(keep.sum()) < MIN_TRACE_ROWS:
        return None, float(np.mean(keep))
    path = folder / "window.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("arrived_at", "num_prefill_tokens", "num_decode_tokens"))
        for row in zip(trace.arrived_at_s[keep], trace.prompt_tokens[keep], trace.output_tokens[keep]):
            w.writerow((repr(float(row[0])), int(row[1]), int(row[2])))
    return path, float(np.mean(keep))


def _window_entry(lengths, lo: int, hi: int, folder: Path) -> tuple[dict | None, float]:
    """The workload entry of an instance that serves only ``(lo, hi]`` of ``lengths`` (the CDF conditioned on the
    window, or the trace's requests in it written to a CSV in ``folder``) and the window's share of the workload;
    entry None when the window holds too little of it (:data:`MIN_WINDOW_SHARE`, or no trace request)."""
    if isinstance(lengths, RequestTrace):
        path, share = _window_trace_csv(lengths, lo, hi, folder)
        return (None if path is None else {"trace": str(path)}), share
    points, share = _window_cdf(lengths, lo, hi)
    return (None if share < MIN_WINDOW_SHARE else {"cdf": points}), share


def _instance(workload_entry: dict, gpu_entry: dict, hi: int, rate_req_per_s: float, ttft_model: str) -> Instance:
    return instance_from_dict({
        "name": "agreement-pool", "workload": {**workload_entry, "arrival_rate": rate_req_per_s},
        "slo": {"ttft_p99_ms": SLO_TTFT_P99_MS, "ttft_model": ttft_model, "scope": "pool"},
        "gpus": [{"name": "g", **gpu_entry}],
        "pools": {"max_pools": 1, "max_context": int(hi), "boundaries": []},
        "constraints": {"max_utilization": 0.99}})


def _evaluate(inst: Instance, spec: str) -> PoolResult:
    return evaluate_plans(inst, plans_from_spec(inst, spec, "spec")).pools[0]


def _rate_for(utilization, target: float, rate: float, at_rate: float) -> float:
    """The arrival rate at which ``utilization(rate)`` reaches ``target`` (``at_rate`` is its value at ``rate``).

    Under every TTFT model :math:`1/u` is affine in :math:`1/\\lambda`: the slot models have
    :math:`u = \\lambda E[S]/(N n)`, the batched model :math:`u = \\lambda a / (N - \\lambda b)` with
    :math:`a = E[I] W / n` and :math:`b = h E[X]` (:func:`fleetopt.models.queueing.batched.operating_point`), so
    :math:`1/u = (N/a)(1/\\lambda) - b/a`. Two probes fix the line and the rate follows exactly; an unstable
    probe (:math:`u = \\infty`) is moved down until it is finite.
    """
    while not np.isfinite(at_rate):
        rate /= 8.0
        at_rate = utilization(rate)
    rate2 = 0.5 * rate
    at2 = utilization(rate2)
    slope = (1.0 / at_rate - 1.0 / at2) / (1.0 / rate - 1.0 / rate2)
    intercept = 1.0 / at_rate - slope / rate
    return float(slope / (1.0 / target - intercept))


def draw_pool(rng: np.random.Generator, workloads=WORKLOADS, gpu_choices=GPU_CHOICES,
              ttft_model: str = "batched") -> SampledPool | None:
    """One attempt at a pool (module docstring, "The pools"); None when the draw is skipped.

    Parameters
    ----------
    rng : numpy.random.Generator
        The only source of randomness; an attempt makes the same draws whether or not it is skipped up to
        the point where it is.
    workloads : sequence of str
        ``builtin:NAME`` workloads to draw from (uniformly).
    gpu_choices : sequence of tuple of (key, value) pairs
        GPU option entries to draw from (uniformly); see :data:`GPU_CHOICES`.

    Returns
    -------
    SampledPool or None
    """
    workload = workloads[int(rng.integers(len(workloads)))]
    gpu_entry = dict(gpu_choices[int(rng.integers(len(gpu_choices)))])
    hi = int(WINDOW_HI_TOKENS[int(rng.integers(len(WINDOW_HI_TOKENS)))])
    k = int(rng.integers(len(WINDOW_LO_DIVISORS) + 1))
    lo = 0 if k == len(WINDOW_LO_DIVISORS) else hi // WINDOW_LO_DIVISORS[k]
    replicas = int(np.floor(np.exp(rng.uniform(0.0, np.log(MAX_REPLICAS + 1)))))
    replicas = min(max(replicas, 1), MAX_REPLICAS)
    u_target = float(rng.uniform(*UTILIZATION_BAND))
    sim_seed = int(rng.integers(2**31 - 1))
    lengths = _workload_lengths(workload)
    spec = f"0-{hi}:gx{replicas}"
    with tempfile.TemporaryDirectory() as folder:
        entry, share = _window_entry(lengths, lo, hi, Path(folder))
        if entry is None:
            return None
        try:
            probe = _evaluate(_instance(entry, gpu_entry, hi, 1.0, ttft_model), spec)
        except InstanceError:  # the profile cannot hold the window
            return None
        if probe.max_num_seqs < 1 or not probe.utilization > 0:
            return None
        rate = _rate_for(lambda r: _evaluate(_instance(entry, gpu_entry, hi, r, ttft_model), spec).utilization,
                         u_target, 1.0, probe.utilization)
        inst = _instance(entry, gpu_entry, hi, rate, ttft_model)
    analytic = _evaluate(inst, spec)
    lo_u, hi_u = UTILIZATION_BAND
    if not (lo_u <= analytic.utilization <= hi_u and math.isfinite(analytic.ttft_p99_ms)):
        return None
    return SampledPool(workload, inst.gpus[0].profile.name, lo, hi, replicas,
                       float(inst.workload.arrival_rate_req_per_s),
                       float(analytic.utilization), share, sim_seed, spec, inst, analytic)


def sample_pools(rng: np.random.Generator, n: int, *, workloads=WORKLOADS, gpu_choices=GPU_CHOICES,
                 max_attempts: int | None = None, ttft_model: str = "batched") -> tuple[SampledPool, ...]:
    """``n`` pools drawn by :func:`draw_pool` from ``rng`` (skipped draws are drawn again).

    Parameters
    ----------
    rng : numpy.random.Generator
        The same generator state gives the same pools.
    n : int
        Pools to draw (>= 0).
    workloads, gpu_choices
        As :func:`draw_pool`.
    max_attempts : int or None
        Attempts allowed in all (None: ``50 n + 50``).

    Raises
    ------
    ValueError
        For ``n < 0``, or when ``max_attempts`` attempts give fewer than ``n`` pools.
    """
    return _draw_until(n, lambda: draw_pool(rng, workloads, gpu_choices, ttft_model), max_attempts, "pools")


_T = TypeVar("_T")


def _draw_until(n: int, draw: Callable[[], _T | None], max_attempts: int | None, what: str) -> tuple[_T, ...]:
    """``n`` results of ``draw()``, calling it again where it returns None (a skipped draw); ``ValueError`` for
    ``n < 0`` or when ``max_attempts`` calls (default ``50 n + 50``) give fewer."""
    if n < 0:
        raise ValueError(f"n: {n} must be >= 0")
    limit = 50 * n + 50 if max_attempts is None else int(max_attempts)
    out: list[_T] = []
    attempts = 0
    while len(out) < n:
        if attempts >= limit:
            raise ValueError(f"max_attempts: {limit} attempts gave {len(out)} of {n} {what}; widen the choices")
        attempts += 1
        item = draw()
        if item is not None:
            out.append(item)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# Simulating them
# --------------------------------------------------------------------------------------------


def agreement_options(requests: int = 50_000, *, mode: str = "iteration", replications: int = 1,
                      seed: int = 0, precision: float | None = None, max_requests: int = 2_000_000) -> SimOptions:
    """The simulator settings of the harness: ``requests`` in the pool over ``replications``, JSQ dispatch,
    Poisson arrivals, the given service ``mode`` (``iteration``; ``slot`` is the analytic M/G/c).

    One replication by default (the P99 TTFT interval from batch means): the start-up transient is
    discarded once per run, so a long-tailed window (:math:`E[S^2]/E[S]` of tens of seconds) keeps a span
    long against it and its time averages (utilisation, batch, power) are not biased low by a warm-up cut
    at half of a short replication (:mod:`fleetopt.optimizer.simulation.simulate`).

    With ``precision`` (e.g. :data:`PINNED_HALF_WIDTH`) a pool's run doubles, up to ``max_requests``, until its
    P99 TTFT interval is that tight (``SimOptions.precision``): near the stability limit a run of 50,000 requests
    cannot tell a P99 from its neighbours (``docs/benchmarks.md`` measured one pool at 1,347 ms over 50,000 requests,
    53 ms over 200,000 and 434 ms over 2 million), and a ratio against such a figure says nothing of the model."""
    return SimOptions(requests=requests, replications=replications, seed=seed, mode=mode, dispatch="jsq",
                      arrivals="poisson", router="length", precision=precision,
                      max_requests=max(int(max_requests), int(requests)))


def _ratio(analytic: float, simulated: float) -> float:
    if math.isinf(simulated) and simulated > 0:
        return 0.0
    if simulated == 0:
        return 1.0 if analytic == 0 else math.inf
    return float(analytic / simulated)


def _metric(analytic: float, simulated: float, ci=None) -> MetricAgreement:
    ci = None if ci is None else (float(ci[0]), float(ci[1]))
    return MetricAgreement(float(analytic), float(simulated), ci, _ratio(float(analytic), float(simulated)))


def measure_pool(pool: SampledPool, options: SimOptions = agreement_options()) -> PoolAgreement:  # noqa: B008 frozen dataclass default
    """Simulate one drawn pool (seed: the pool's own ``sim_seed``) and set its four metrics side by side.

    Parameters
    ----------
    pool : SampledPool
    options : SimOptions
        Settings (:func:`agreement_options`); ``seed`` is replaced by ``pool.sim_seed``.

    Returns
    -------
    PoolAgreement
    """
    t0 = time.perf_counter()
    a = pool.analytic
    spans = math.ceil(a.arrival_rate * RELAXATION_SPANS * a.relaxation_s) if a.relaxation_s > 0 else 0
    requests = int(min(max(options.requests, spans), max(MAX_REQUESTS, options.requests)))
    report = simulate_plan(pool.instance, plans_from_spec(pool.instance, pool.spec, "spec"),
                           replace(options, seed=pool.sim_seed, requests=requests,
                                   max_requests=max(options.max_requests, requests)))
    s = report.pools[0]
    a = s.analytic
    return PoolAgreement(pool, _metric(a.ttft_p99_ms, s.ttft_p99_ms_sim, s.ttft_p99_ci_ms),
                         _metric(a.mean_batch, s.mean_batch), _metric(a.utilization, s.utilization_sim),
                         _metric(a.power_w, s.power_w_sim), int(report.requests_simulated),
                         time.perf_counter() - t0)


def run_agreement(n_pools: int, rng: np.random.Generator, options: SimOptions = agreement_options(), *,  # noqa: B008 frozen dataclass default
                  workloads=WORKLOADS, gpu_choices=GPU_CHOICES, progress=None,
                  workers: int = 1) -> tuple[PoolAgreement, ...]:
    """Draw ``n_pools`` pools (:func:`sample_pools`) and measure each (:func:`measure_pool`).

    ``progress(done, total)``, if given, is called after each pool. ``workers`` > 1 measures the pools in that
    many local processes (started with ``spawn``); each pool's run has its own seed, so the records are the same,
    in the same order.
    """
    pools = sample_pools(rng, n_pools, workloads=workloads, gpu_choices=gpu_choices)
    if workers <= 1 or len(pools) < 2:
        out = []
        for k, pool in enumerate(pools):
            out.append(measure_pool(pool, options))
            if progress is not None:
                progress(k + 1, len(pools))
        return tuple(out)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    got: dict[int, PoolAgreement] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(pools)),
                             mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {ex.submit(measure_pool, pool, options): k for k, pool in enumerate(pools)}
        for fut in as_completed(futures):
            got[futures[fut]] = fut.result()
            if progress is not None:
                progress(len(got), len(pools))
    return tuple(got[k] for k in range(len(pools)))


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def summarize_ratios(ratios, band: float, metric: str = "", optimistic_below: float = OPTIMISTIC_BELOW
                     ) -> RatioSummary:
    """The distribution of ratios analytic / simulated.

    Parameters
    ----------
    ratios : sequence of float
        Ratios >= 0 (0 and inf allowed; NaN is not).
    band : float
        Relative band: a ratio :math:`r` agrees when :math:`|r - 1| \\le` ``band``.
    metric : str
        The metric's name, kept in the record.
    optimistic_below : float
        A ratio below this counts as optimistic.

    Returns
    -------
    RatioSummary
        Median, P10 and P90 by :func:`fleetopt.solvers.des.metrics.percentile` (the empirical quantile
        :math:`\\min\\{r : \\hat F_n(r) \\ge q\\}`), the ratio with the largest :math:`|\\ln r|`, the share
        within the band and the share below ``optimistic_below``.

    Raises
    ------
    ValueError
        For no ratios, a NaN or a negative ratio, or a negative ``band``.

    Examples
    --------
    >>> s = summarize_ratios([0.5, 0.95, 1.0, 1.08, 3.0], band=0.1)
    >>> (float(s.median), s.worst, s.within_band_share, s.optimistic_share)
    (1.0, 3.0, 0.6, 0.2)
    """
    r = np.asarray(ratios, dtype=float)
    if r.size == 0:
        raise ValueError("ratios: empty; give at least one ratio")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("ratios: must be numbers >= 0 (no NaN)")
    if not band >= 0:
        raise ValueError(f"band: {band!r} must be >= 0")
    with np.errstate(divide="ignore"):
        dev = np.abs(np.log(r))
    worst = float(r[int(np.argmax(dev))])
    p10, med, p90 = (float(x) for x in percentile(r, [10, 50, 90]))
    return RatioSummary(metric, int(r.size), med, p10, p90, worst, float(band),
                        float(np.mean(np.abs(r - 1.0) <= band * (1 + 1e-12))),
                        float(np.mean(r < optimistic_below)))


def summarize_agreement(records) -> tuple[RatioSummary, ...]:
    r"""One :class:`RatioSummary` per metric of :data:`METRICS` over :class:`PoolAgreement` records, with the
    metric's band from :data:`BANDS`, then the P99 TTFT over the :func:`pinned` pools only (metric
    ``ttft_p99_pinned``; omitted when no pool is pinned) and over the pools a plan may hold under the default
    ``constraints.max_utilization``, a full-batch load :math:`\rho_f` (``PoolResult.capacity_load``) of at most
    0.85 (metric ``ttft_p99_within_cap``; omitted when none is). The draw itself fixes the realised share of
    batch places, 0.2-0.85, which puts about half the pools beyond that cap, up to :math:`\rho_f` = 0.96."""
    records = list(records)
    out = [summarize_ratios([rec.metric(m).ratio for rec in records], BANDS[m], m) for m in METRICS]
    held = [rec for rec in records if pinned(rec)]
    if held:
        out.append(summarize_ratios([rec.ttft_p99_ms.ratio for rec in held], BANDS["ttft_p99"], "ttft_p99_pinned"))
    plannable = [rec for rec in records if rec.pool.analytic.capacity_load <= DEFAULT_MAX_UTILIZATION]
    if plannable:
        out.append(summarize_ratios([rec.ttft_p99_ms.ratio for rec in plannable], BANDS["ttft_p99"],
                                    "ttft_p99_within_cap"))
    return tuple(out)


PINNED_HALF_WIDTH = 0.10
"""A simulated P99 TTFT is *pinned down* when its 95 % interval lies within this share of it on either side."""


def pinned(record: PoolAgreement) -> bool:
    """Whether the pool's simulated P99 TTFT is pinned down: a finite 95 % interval of half-width at most
    :data:`PINNED_HALF_WIDTH` x the estimate. Near its stability limit a pool alternates between long congested
    episodes and quiet ones; a run there cannot tell a P99 apart from its neighbours at +-10 %, so a ratio
    against it says little about the model."""
    m = record.ttft_p99_ms
    if m.simulated_ci is None or not all(math.isfinite(v) for v in m.simulated_ci) or not m.simulated > 0:
        return False
    return (m.simulated_ci[1] - m.simulated_ci[0]) / 2.0 <= PINNED_HALF_WIDTH * m.simulated


# --------------------------------------------------------------------------------------------
# Disaggregated prefill/decode pairs
# --------------------------------------------------------------------------------------------

_NIC_BYTES_PER_S = {"H100-SXM-80GB": 50e9, "A100-SXM-80GB": 25e9}
"""Per-GPU inter-node bandwidth of the hardware the computed P/D options use (``data/catalog/hardware.yaml``,
``inter_node_bandwidth_bytes_per_s``: one 400 Gb/s NIC per H100, 200 Gb/s per A100)."""

CALIBRATED_KV_BYTES_PER_TOKEN = 327_680.0
"""KV bytes per token of the calibrated TP=8 units' model class (Llama-3-70B: 80 layers x 8 KV heads x 128 x 2 (K, V)
x 2 bytes), which their profiles do not state."""
CALIBRATED_LINK_BYTES_PER_S = 8 * 50e9
"""The calibrated TP=8 units' replica-to-replica bandwidth: eight 400 Gb/s NICs."""

PD_GPU_GROUPS: tuple[tuple[tuple[tuple[str, object], ...], ...], ...] = (
    ((("profile", "A100-80GB"),), (("profile", "H100-80GB"),), (("profile", "B200-projected"),)),
    ((("hardware", "H100-SXM-80GB"), ("model", "Llama-3.1-8B"), ("tp", 1)),
     (("hardware", "A100-SXM-80GB"), ("model", "Llama-3.1-8B"), ("tp", 1))),
    ((("hardware", "H100-SXM-80GB"), ("model", "Llama-3.1-70B"), ("tp", 8)),
     (("hardware", "A100-SXM-80GB"), ("model", "Llama-3.1-70B"), ("tp", 8))),
)
"""GPU options of one model each (``gpus[]`` entries as pairs), from which a P/D pair draws its prefill and its decode
option: the calibrated TP=8 units (one model class), and Llama-3.1-8B and -70B computed on H100 and A100."""

PD_METRICS = ("ttft_p99", "prefill_utilization", "prefill_power", "decode_batch", "decode_utilization",
              "decode_power", "mean_tpot")
"""The P/D metrics compared, in report order (module docstring of :mod:`fleetopt.optimizer.simulation.agreement`,
"P/D pairs")."""

PD_BANDS = {"ttft_p99": 0.10, "prefill_utilization": 0.05, "prefill_power": 0.05, "decode_batch": 0.05,
            "decode_utilization": 0.05, "decode_power": 0.05, "mean_tpot": 0.05}
"""Relative band around 1 within which a P/D ratio counts as agreeing."""

PD_MAX_PREFILL_REPLICAS = 8
"""Largest prefill count drawn (log-uniform in 1..8)."""

PD_MAX_REQUESTS = 400_000
"""Cap on the requests :data:`RELAXATION_SPANS` may ask of one pair."""


@dataclass(frozen=True, eq=False)
class SampledPair:
    """One drawn P/D pair: its description, the instance that carries its window's workload and the pair's plan,
    and the analytic prefill and decode rows (:func:`fleetopt.optimizer.simulation.pairs.analytic_fleet`)."""

    workload: str
    prefill_gpu: str
    decode_gpu: str
    lo_tokens: int
    hi_tokens: int
    prefill_replicas: int
    decode_replicas: int
    arrival_rate_req_per_s: float
    window_share: float
    transfer: KVTransfer
    sim_seed: int
    instance: Instance
    plan: PoolPlan
    prefill: PoolResult
    decode: PoolResult
    mean_tpot_ms: float
    """Analytic mean TPOT over the requests with more than one output token: :math:`\\bar t\\, E[l/(l-1)]`."""

    def describe(self) -> dict:
        return {"workload": self.workload, "prefill_gpu": self.prefill_gpu, "decode_gpu": self.decode_gpu,
                "lo_tokens": self.lo_tokens, "hi_tokens": self.hi_tokens, "prefill_replicas": self.prefill_replicas,
                "decode_replicas": self.decode_replicas, "arrival_rate_req_per_s": self.arrival_rate_req_per_s,
                "window_share": self.window_share, "transfer_model": self.transfer.model,
                "transfer_bandwidth_bytes_per_s": self.transfer.bandwidth_bytes_per_s, "sim_seed": self.sim_seed}


@dataclass(frozen=True)
class PairAgreement:
    """One P/D pair, analytic against simulated, per metric of :data:`PD_METRICS` (TTFT and TPOT in ms, power in W,
    batch in sequences per decode replica)."""

    pool: SampledPair
    metrics: dict
    requests_simulated: int
    wall_s: float

    def metric(self, name: str) -> MetricAgreement:
        if name not in self.metrics:
            raise ValueError(f"metric: {name!r} is not one of {', '.join(PD_METRICS)}")
        return self.metrics[name]

    def to_json(self) -> dict:
        return {**self.pool.describe(), "requests_simulated": self.requests_simulated, "wall_s": self.wall_s,
                **{m: {"analytic": a.analytic, "simulated": a.simulated, "simulated_ci": a.simulated_ci,
                       "ratio": a.ratio} for m, a in self.metrics.items()}}


def _pd_transfer(p_entry: dict, d_entry: dict, p_profile, d_profile):
    """The pair's KV transfer, bandwidth model over the network: a computed profile's KV bytes per token
    (:func:`fleetopt.models.queueing.disagg.kv_bytes_per_token`) over the slower side's NICs
    (:func:`fleetopt.models.queueing.disagg.link_bandwidth_bytes_per_s`); the calibrated units'
    :data:`CALIBRATED_KV_BYTES_PER_TOKEN` over :data:`CALIBRATED_LINK_BYTES_PER_S`."""
    from fleetopt.models.queueing.disagg import KVTransfer, kv_bytes_per_token, link_bandwidth_bytes_per_s

    if "hardware" not in p_entry:
        return KVTransfer(model="bandwidth", kv_bytes_per_token=CALIBRATED_KV_BYTES_PER_TOKEN,
                          bandwidth_bytes_per_s=CALIBRATED_LINK_BYTES_PER_S)
    bw = link_bandwidth_bytes_per_s(same_node=False, prefill_gpus=p_profile.physical_gpus_per_replica,
                                    decode_gpus=d_profile.physical_gpus_per_replica,
                                    prefill_network_bytes_per_s=_NIC_BYTES_PER_S[p_entry["hardware"]],
                                    decode_network_bytes_per_s=_NIC_BYTES_PER_S[d_entry["hardware"]])
    return KVTransfer(model="bandwidth", kv_bytes_per_token=kv_bytes_per_token(p_profile), bandwidth_bytes_per_s=bw)


def _pd_instance(workload_entry: dict, p_entry: dict, d_entry: dict, hi: int, rate: float) -> Instance:
    return instance_from_dict({
        "name": "agreement-pair", "workload": {**workload_entry, "arrival_rate": rate},
        "slo": {"ttft_p99_ms": SLO_TTFT_P99_MS, "scope": "pool"},
        "gpus": [{"name": "p", **p_entry}, {"name": "d", **d_entry}],
        "pools": {"max_pools": 1, "max_context": int(hi), "boundaries": []},
        "constraints": {"max_utilization": 0.99}})


def draw_pair(rng: np.random.Generator, workloads=WORKLOADS, groups=PD_GPU_GROUPS) -> SampledPair | None:
    r"""One attempt at a P/D pair; None when the draw is skipped (module docstring, "P/D pairs").

    Draws a workload, a group of :data:`PD_GPU_GROUPS` and from it the prefill and the decode option (with
    replacement), a window as :func:`draw_pool`, a prefill count :math:`N_p` (log-uniform in
    1..:data:`PD_MAX_PREFILL_REPLICAS`), a prefill utilisation :math:`u_p \sim U(` :data:`UTILIZATION_BAND` :math:`)`,
    whence :math:`\lambda = u_p N_p / E[S_p]` (the station's utilisation is linear in the rate), and a decode
    utilisation cap :math:`u_d \sim U(0.3, 0.85)`: :math:`N_d` is the decode station's least count with
    utilisation at most :math:`u_d` and at most 1 % of requests waiting for a slot
    (:meth:`~fleetopt.models.queueing.disagg.DecodeStation.min_replicas`), as a plan would hold it.
    """
    from fleetopt.models.fleet import DecodeStage, PoolPlan
    from fleetopt.optimizer.plan.evaluate import service_level
    from fleetopt.optimizer.simulation.pairs import analytic_fleet, pair_stations, pair_traffic

    workload = workloads[int(rng.integers(len(workloads)))]
    group = groups[int(rng.integers(len(groups)))]
    p_entry = dict(group[int(rng.integers(len(group)))])
    d_entry = dict(group[int(rng.integers(len(group)))])
    hi = int(WINDOW_HI_TOKENS[int(rng.integers(len(WINDOW_HI_TOKENS)))])
    k = int(rng.integers(len(WINDOW_LO_DIVISORS) + 1))
    lo = 0 if k == len(WINDOW_LO_DIVISORS) else hi // WINDOW_LO_DIVISORS[k]
    n_p = int(np.floor(np.exp(rng.uniform(0.0, np.log(PD_MAX_PREFILL_REPLICAS + 1)))))
    n_p = min(max(n_p, 1), PD_MAX_PREFILL_REPLICAS)
    u_p = float(rng.uniform(*UTILIZATION_BAND))
    u_d = float(rng.uniform(0.3, 0.85))
    sim_seed = int(rng.integers(2**31 - 1))
    lengths = _workload_lengths(workload)
    with tempfile.TemporaryDirectory() as folder:
        entry, share = _window_entry(lengths, lo, hi, Path(folder))
        if entry is None:
            return None
        try:
            probe = _pd_instance(entry, p_entry, d_entry, hi, 1.0)
        except InstanceError:
            return None
        pg, dg = probe.gpu("p"), probe.gpu("d")
        if int(pg.profile.n_slots(hi)) < 1 or int(dg.profile.n_slots(hi)) < 1:
            return None
        transfer = _pd_transfer(p_entry, d_entry, pg.profile, dg.profile)

        def plan_at(n_d):
            return PoolPlan(0, hi, "p", pg.profile, n_p, decode=DecodeStage(gpu="d", profile=dg.profile,
                                                                           replicas=n_d), transfer=transfer)

        pre, _ = pair_stations(probe, plan_at(1), service_level(probe))
        if not pre.mean_service_s > 0:
            return None
        rate = u_p * n_p / pre.mean_service_s       # the probe's window holds all its requests: rate 1
        inst = _pd_instance(entry, p_entry, d_entry, hi, rate)
    level = service_level(inst)
    pre, dec = pair_stations(inst, plan_at(1), level)
    sized = dec.min_replicas(rho_max=u_d)
    if not sized.feasible[0]:
        return None
    n_d = int(sized.replicas[0])
    plan = plan_at(n_d)
    rows = analytic_fleet(inst, [plan]).pools
    prefill, decode = rows[0], rows[1]
    if not (math.isfinite(prefill.ttft_p99_ms) and prefill.utilization < 1 and math.isfinite(decode.utilization)):
        return None
    traffic = pair_traffic(inst, 0, hi, int(pg.profile.chunk_tokens))
    w, l_out = traffic.probs, traffic.output_tokens
    many = l_out > 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = float(np.sum((w * l_out / (l_out - 1.0))[many]) / np.sum(w[many])) if many.any() else math.nan
    t_bar = float(dec.mean_iteration_s(n_d))
    return SampledPair(workload, pg.profile.name, dg.profile.name, lo, hi, n_p, n_d, float(rate), share, transfer,
                       sim_seed, inst, plan, prefill, decode, t_bar * factor * 1000.0)


def sample_pairs(rng: np.random.Generator, n: int, *, workloads=WORKLOADS, groups=PD_GPU_GROUPS,
                 max_attempts: int | None = None) -> tuple[SampledPair, ...]:
    """``n`` pairs drawn by :func:`draw_pair` from ``rng`` (skipped draws are drawn again; ``ValueError`` when
    ``max_attempts``, default ``50 n + 50``, give fewer)."""
    return _draw_until(n, lambda: draw_pair(rng, workloads, groups), max_attempts, "pairs")


def measure_pair(pair: SampledPair, options: SimOptions = agreement_options()) -> PairAgreement:  # noqa: B008 frozen dataclass default
    """Simulate one drawn pair through :func:`fleetopt.optimizer.simulation.simulate.simulate_plan` (seed: the pair's
    ``sim_seed``; requests at least :data:`RELAXATION_SPANS` of the slower station's relaxation time, at most
    :data:`PD_MAX_REQUESTS`) and set the metrics of :data:`PD_METRICS` side by side. The simulated mean TPOT is the
    mean over the measured requests with a TPOT (more than one output token)."""
    t0 = time.perf_counter()
    relax = max(pair.prefill.relaxation_s, pair.decode.relaxation_s)
    spans = math.ceil(pair.prefill.arrival_rate * RELAXATION_SPANS * relax) if relax > 0 else 0
    requests = int(min(max(options.requests, spans), max(PD_MAX_REQUESTS, options.requests)))
    report = simulate_plan(pair.instance, [pair.plan],
                           replace(options, seed=pair.sim_seed, requests=requests,
                                   max_requests=max(options.max_requests, requests)), keep_requests=True)
    pre, dec = report.pools[0], report.pools[1]
    tpot = next(v["tpot_ms"] for label, v in report.latencies().items() if label.endswith(" decode"))
    metrics = {
        "ttft_p99": _metric(pair.prefill.ttft_p99_ms, pre.ttft_p99_ms_sim, pre.ttft_p99_ci_ms),
        "prefill_utilization": _metric(pair.prefill.utilization, pre.utilization_sim),
        "prefill_power": _metric(pair.prefill.power_w, pre.power_w_sim),
        "decode_batch": _metric(pair.decode.mean_batch, dec.mean_batch),
        "decode_utilization": _metric(pair.decode.utilization, dec.utilization_sim),
        "decode_power": _metric(pair.decode.power_w, dec.power_w_sim),
        "mean_tpot": _metric(pair.mean_tpot_ms, float(np.mean(tpot)) if tpot.size else math.nan),
    }
    return PairAgreement(pair, metrics, int(report.requests_simulated), time.perf_counter() - t0)


def run_pair_agreement(n_pairs: int, rng: np.random.Generator, options: SimOptions = agreement_options(), *,  # noqa: B008 frozen dataclass default
                       workloads=WORKLOADS, groups=PD_GPU_GROUPS, progress=None) -> tuple[PairAgreement, ...]:
    """Draw ``n_pairs`` P/D pairs (:func:`sample_pairs`) and measure each (:func:`measure_pair`), in this process."""
    pairs = sample_pairs(rng, n_pairs, workloads=workloads, groups=groups)
    out = []
    for k, pair in enumerate(pairs):
        out.append(measure_pair(pair, options))
        if progress is not None:
            progress(k + 1, len(pairs))
    return tuple(out)


def summarize_pair_agreement(records) -> tuple[RatioSummary, ...]:
    """One :class:`RatioSummary` per metric of :data:`PD_METRICS` (named ``pd_METRIC``) with its band from
    :data:`PD_BANDS`; a metric a pair cannot give (NaN: no request with two output tokens) is left out for it."""
    records = list(records)
    out = []
    for m in PD_METRICS:
        r = [rec.metric(m).ratio for rec in records if not math.isnan(rec.metric(m).ratio)]
        if r:
            out.append(summarize_ratios(r, PD_BANDS[m], f"pd_{m}"))
    return tuple(out)
