"""The documents of ``simulate`` (:class:`SimulateDocument`: one fleet simulated, with its pools' latencies) and
``simulate --routers`` (:class:`SimulateRoutersDocument`), on the contract's envelope and figures
(:mod:`fleetopt.optimizer.output.contract`)."""

from typing import Literal, get_args

from pydantic import Field

from fleetopt.optimizer.output.contract import (Document, Figure, FleetAnalytic, FleetSimulated, Interval,
                                                PoolSimulated, _Batch, _deprecated, _Open, _PoolHead, _Phase, _Role)


class _Latency(_Open):
    """Percentiles of one latency, in ms (null: no measured request has it, or some never got it)."""

    p50: Figure
    p90: Figure
    p99: Figure


class _LatenciesMs(_Open):
    """P50/P90/P99 in ms of the time to first token, per output token, queueing wait and end to end."""

    ttft: _Latency
    tpot: _Latency
    wait: _Latency
    e2e: _Latency


class SimulatedPool(_PoolHead):
    """A pool of ``simulate``: both sub-objects, then the simulated details (``*_sim`` the deprecated 1.0 aliases
    of ``simulated``'s figures)."""

    simulated: PoolSimulated
    ttft_p99_ms_sim: Figure = _deprecated("simulated.ttft_p99_ms")
    ttft_p99_ci_ms: Interval = _deprecated("simulated.ttft_p99_ci_ms")
    tpot_p99_ms_sim: Figure = _deprecated("simulated.tpot_p99_ms")
    slo_attainment: Figure = _deprecated("simulated.slo_attainment")
    mean_batch: Figure = _deprecated("simulated.mean_batch")
    preemptions: int = Field(description="KV preemptions (--kv paged), all replications")
    replicas_up_mean: float = Field(description="replicas simulated, mean over the replications")
    spilled: int = Field(description="requests the spillover router moved to the next pool up")
    max_num_seqs_sim: int = Field(description="batch cap per replica in the engine")
    tpot_p99_ci_ms: Interval = _deprecated("simulated.tpot_p99_ci_ms")
    slo_met_sim: bool = _deprecated("simulated.slo_met")
    utilization_sim: Figure = _deprecated("simulated.utilization")
    power_w_sim: Figure = _deprecated("simulated.power_w")
    energy_per_output_token_j: Figure = Field(description="energy over the window per output token completed")
    arrival_rate_sim: Figure = _deprecated("simulated.arrival_rate")
    requests: int = _deprecated("simulated.requests")
    too_few_requests: bool = _deprecated("simulated.too_few_requests")
    p99_requests: int = _deprecated("simulated.p99_requests")
    p99_source: Literal["main run", "dedicated run"] = _deprecated("simulated.p99_source")
    unfinished: int = Field(description="measured requests not completed at the horizon")
    rejected: int = Field(description="measured requests their router rejected")
    max_num_seqs: int = Field(description="the analytic batch cap per replica")
    compress_gamma: float = Field(description="compress-and-route factor of the pool")
    mean_batch_analytic: _Batch
    tpot_p99_ms_bound: Figure = Field(description="analytic.tpot_p99_ms: the analytic upper bound")
    latency_ms: _LatenciesMs
    profile: str
    quality: str
    source: Literal["simulated"]
    phase: _Phase
    role: _Role



class SimulateDocument(Document):
    """``fleetopt simulate``: one fleet simulated, next to its analytic figures (the top-level figures before
    ``pools`` are the deprecated 1.0 aliases of ``simulated``'s)."""

    command: Literal["simulate"]
    instance: str
    requests_simulated: int
    simulated_seconds: float = Field(description="simulated time of the runs (s)")
    wall_seconds: float = Field(description="wall-clock time of the simulation (s)")
    ttft_p99_ms: Figure = _deprecated("simulated.ttft_p99_ms")
    ttft_p99_ci_ms: Interval = _deprecated("simulated.ttft_p99_ci_ms")
    tpot_p99_ms: Figure = _deprecated("simulated.tpot_p99_ms")
    slo_met: bool = _deprecated("simulated.slo_met")
    slo_attainment: Figure = _deprecated("simulated.slo_attainment")
    power_kw: Figure = _deprecated("simulated.power_kw")
    energy_per_output_token_j: Figure = _deprecated("simulated.energy_per_output_token_j")
    energy_per_token_j: Figure = Field(description="energy over the window per token (prompt and output) completed")
    pools: list[SimulatedPool]
    source: Literal["simulated"]
    slo_ttft_p99_ms: float
    slo_tpot_p99_ms: float | None
    scope: Literal["pool", "fleet"]
    ttft_model: str
    slo_met_point: bool = _deprecated("simulated.slo_met_point")
    tpot_p99_ci_ms: Interval = _deprecated("simulated.tpot_p99_ci_ms")
    requests_measured: int = _deprecated("simulated.requests_measured")
    utilization_sim: Figure = _deprecated("simulated.utilization")
    unfinished: int = Field(description="measured requests not completed at the horizon")
    rejected: int = Field(description="measured requests their router rejected")
    preemptions: int = Field(description="KV preemptions of every pool (--kv paged)")
    latency_ms: _LatenciesMs
    seed: int
    mode: Literal["iteration", "slot"]
    router: str
    dispatch: str = Field(description="replica choice within a pool (pool-fcfs in slot mode)")
    arrivals: str
    spill_bound: int | None = Field(description="--router spillover only: the queue beyond which arrivals spill")
    routing_source: str | None = Field(description="--router split only: where its weights came from (plan or "
                                                   "shares)")
    engine: dict = Field(description="the simulation engine's settings")
    replications: int
    options: dict = Field(description="the simulation settings")
    confidence: float = Field(description="confidence level of every interval")
    ci_method: str
    stopped_by: str = Field(description="what ended the run (requests, or --precision reached)")
    precision: float | None = Field(description="--precision's target half-width in %")
    warmup_s: float = Field(description="mean warm-up discarded per replication, simulated s")
    cooldown_s: float = Field(description="mean unmeasured end of a replication, simulated s")
    relaxation_s: Figure = Field(description="the largest pool relaxation time (s)")
    littles_law_rel_error: Figure = Field(description="largest |L - lambda W| / L over pools and replications")
    analytic: FleetAnalytic
    simulated: FleetSimulated
    notes: list[str]
    semantic: dict | None = Field(None, description="semantic plans only: the rule and, per model class, its "
                                                    "pools and shares")


class _RouterPool(_Open):
    """One pool's simulated figures under one router."""

    pool: str = Field(description="LO-HI:GPU")
    replicas: int
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    slo_attainment: Figure
    utilization: Figure
    slo_met: bool


class _RouterRun(_Open):
    """One router's run on the common stream: the fleet's figures, each pool's, and its whole ``simulate``
    document."""

    router: str
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    slo_attainment: Figure
    utilization: Figure = Field(description="the pools' simulated utilisations weighted by their batch places")
    slo_met: bool
    power_kw: Figure
    simulated_seconds: float
    requests_simulated: int
    note: str
    pools: list[_RouterPool]
    report: SimulateDocument


class SimulateRoutersDocument(Document):
    """``fleetopt simulate --routers``: one simulation per router on the same request stream."""

    command: Literal["simulate --routers"]
    instance: str
    fleet: str
    slo_ttft_p99_ms: float
    source: str
    seed: int
    stream_sha256: str = Field(description="digest of the common request stream")
    options: dict = Field(description="the simulation settings")
    routers: list[_RouterRun] = Field(min_length=1)


DOCUMENTS: dict[str, type[Document]] = {
    kind: m for m in (SimulateDocument, SimulateRoutersDocument)
    for kind in get_args(m.model_fields["command"].annotation)}
"""Each document kind (its ``command`` value) this module declares, and its model."""
