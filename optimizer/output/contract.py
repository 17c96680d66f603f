"""The JSON contract of every ``fleetopt`` command, defined once as pydantic models.

Every document a command writes with ``--json FILE|-`` carries the envelope :class:`Document`:
``schema_version`` (:data:`SCHEMA_VERSION`), ``command`` (the document's kind, e.g. ``"solve"``,
``"tpw --rho-sweep"``) and ``instance`` (the instance's name; null for a command without one: ``tpw`` context
sweep, ``bench``, ``profile fit``, ``catalog list``). The models below list the keys a consumer may rely on and
their types. Most documents are built by their model (:func:`build`: its fields, in their order, and no other
key), so ``fleetopt schema``, the JSON and the tests cannot diverge; ``validate``, ``bench``, ``profile fit``
and ``catalog list`` are checked against theirs before they are written. A document read back may hold more
keys (``extra="allow"``: a later version's).

Figures and where they come from
--------------------------------
A pool's or fleet's figures sit in explicit sub-objects: ``analytic`` (:class:`PoolAnalytic`,
:class:`FleetAnalytic`: the queueing model) and ``simulated`` (:class:`PoolSimulated`, :class:`FleetSimulated`:
the discrete-event simulation, pooled over replications, with 95 % intervals; null when nothing was simulated).
The flat figure keys of schema 1.0 (``pools[].ttft_p99_ms`` analytic, ``pools[].ttft_p99_ms_sim`` simulated,
and ``simulate``'s top-level ``ttft_p99_ms`` simulated) are kept in 2.0 as deprecated aliases (``docs/json.md``).

Units: ms for latencies, W for a pool's power, kW for a fleet's, $/hr for cost, req/s for ``arrival_rate``.
A figure is a JSON number, or null where it is infinite (an unstable queue) or undefined (no measured request).

What a replica is
-----------------
``gpus`` counts the GPUs a replica is priced and powered as, and the limits (``max_count``,
``max_total_gpus``) count the same. For most profiles that is its physical GPUs (``gpus_per_replica`` = TP); a
profile states both
(``gpus_per_replica``, ``physical_gpus_per_replica``).
The seeds' calibrated A100/H100/B200 profiles are the exception: their latency and KV constants describe a
TP=8 server, priced and powered as ONE GPU (``data/catalog/calibrated_profiles.yaml``).
:func:`~fleetopt.models.profiles.replica_unit` tells them apart (``unit``: ``gpu`` or ``seed_unit``), and every
pool states ``physical_gpus`` as well.

:func:`schema_for` gives the JSON Schema (``fleetopt schema [COMMAND]``); :func:`validate_document` checks a
document against its model (strict types: an integer field rejects 3.0, a boolean rejects 1).
"""

# No ``from __future__ import annotations`` here: pydantic would then evaluate every field's annotation from its
# string, about 20 ms of each document-writing command's start on a 2-core machine (the annotations are evaluated
# by the interpreter at class creation instead; the JSON Schemas are the same byte for byte).

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.profiles import ReplicaUnit

# the figures and layout constants the documents hold, declared without pydantic (the text output reads them too)
from fleetopt.optimizer.output.figures import (DROPPED_LINES, SECONDS_PER_HOUR, TOKENS_PER_MILLION,
                                               fleet_output_tok_per_s, physical_gpus, pool_identity,
                                               usd_per_million_output_tokens)

__all__ = ["SCHEMA_VERSION", "Document", "PoolAnalytic", "PoolSimulated", "FleetAnalytic", "FleetSimulated", "Pool",
           "SimulatedPool", "Fleet", "EvaluatedFleet", "DOCUMENTS", "COMMANDS", "FRONTIER_KINDS", "FRONTIER_DOCUMENTS",
           "FRONTIER_POINTS", "FrontierDocument", "PowerFrontierDocument", "TtftFrontierDocument",
           "PoolsFrontierDocument", "DROPPED_LINES", "envelope", "with_envelope", "pool_analytic", "fleet_analytic",
           "pool_simulated", "fleet_simulated", "document_model", "validate_document", "check_document", "schema_for",
           "top_level_fields", "build", "InstanceSummary", "pool_identity", "physical_gpus",
           "usd_per_million_output_tokens", "SECONDS_PER_HOUR", "TOKENS_PER_MILLION", "fleet_output_tok_per_s"]

SCHEMA_VERSION = "2.5"
"""Version of the JSON contract (``docs/json.md`` has the changelog). 1.0: the documents before this contract
(the workflow commands wrote ``schema_version: 1``, the others none); 2.0: the envelope on every document,
``evaluate``'s ``fleets`` list, and the ``analytic`` / ``simulated`` sub-objects; 2.1: what a replica is
(``model``, ``gpus_per_replica``, ``physical_gpus_per_replica``, ``physical_gpus``, ``unit`` per pool and GPU
option, ``physical_gpus`` per fleet); 2.2: the headline in physical GPUs (``analytic.physical_gpus``,
``output_tok_per_s`` and ``usd_per_million_output_tokens`` per fleet; ``cost_per_hr``, ``power_kw``,
``output_tok_per_s``, ``tok_per_watt`` and ``usd_per_million_output_tokens`` per pool); 2.3: the
``pareto --axes cost,AXIS`` documents (:class:`FrontierDocument`; they wrote ``schema_version: 1`` outside the
contract), with the instance's SLO and each point's physical GPUs; 2.4: ``solve``'s ``candidates.dropped`` a bounded
summary (``dropped_total``, at most :data:`DROPPED_LINES` example reasons, ``dropped_by_option``) instead of every
dropped candidate's reason, and every key of ``solve``, ``evaluate``, ``simulate``, ``simulate --routers``,
``pareto --axes`` and ``whatif`` declared (each document built by its model); 2.5: ``solve``'s
``candidates.left_unsized`` (the candidates bounded sizing never sized)."""

Figure = Annotated[float | None, Field(description="null: infinite (an unstable queue) or undefined")]
Interval = Annotated[list[Figure], Field(min_length=2, max_length=2,
                                         description="95 % confidence interval [low, high] (high null: unbounded)")]


def _deprecated(alias_of: str) -> Any:
    """A kept 1.0 key: required in 2.0, marked deprecated in the schema, to go in 3.0."""
    return Field(description=f"deprecated alias of {alias_of} (schema 1.0); removed in 3.0",
                 json_schema_extra={"deprecated": True})


class _Open(BaseModel):
    """Strict types for the listed keys; more keys are welcome. Each model is built (its validator and
    serializer) when first used, not at import: a command builds only its own document's models (``fleetopt
    solve``: about 4 % less CPU, paired runs of quickstart, 1.45 s -> 1.40 s median)."""

    model_config = ConfigDict(extra="allow", strict=True, defer_build=True)


class Document(_Open):
    """The envelope every ``--json`` document carries."""

    schema_version: Literal["2.5"] = Field(description="Version of this contract")
    command: str = Field(description="The document's kind: the command (and variant) that wrote it")
    instance: str | None = Field(description="The instance's name; null for a command without an instance")


# --------------------------------------------------------------------------------------------
# Figures: analytic and simulated, per pool and per fleet
# --------------------------------------------------------------------------------------------


class PoolAnalytic(_Open):
    """A pool's figures from the queueing model (``fleetopt.models``)."""

    source: Literal["analytic"]
    arrival_rate: float = Field(description="req/s routed to the pool")
    utilization: Figure
    ttft_p99_ms: Figure
    tpot_p99_ms: Figure = Field(description="upper bound: one iteration at the batch cap with full contexts")
    mean_batch: Figure
    power_w: Figure
    power_kw: Figure = Field(description="power_w in kW")
    cost_per_hr: float = Field(description="$/hr of the pool's replicas, as its profile prices them")
    output_tok_per_s: Figure
    tok_per_watt: Figure
    usd_per_million_output_tokens: Figure = Field(description="cost_per_hr / (3600 x output_tok_per_s) x 1e6 "
                                                              "(null without output)")
    slo_met: bool


class PoolSimulated(_Open):
    """A pool's figures measured by the simulation (pooled over replications' measured requests)."""

    source: Literal["simulated"]
    requests: int = Field(description="measured requests routed to the pool")
    too_few_requests: bool = Field(description="traffic but too few measured requests for a verdict "
                                               "(p99_requests below 500)")
    p99_requests: int = Field(description="measured requests the P99s, their intervals, the attainment and the "
                                          "verdict rest on: requests, or the dedicated run's for a thin pool")
    p99_source: Literal["main run", "dedicated run"] = Field(
        description="where the latency figures and the verdict come from: the run of the whole stream, or a "
                    "dedicated run of the requests routed to this pool (a thin pool; counts, rate, utilization, "
                    "batch and power stay the main run's)")
    arrival_rate: Figure
    utilization: Figure
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    tpot_p99_ms: Figure
    tpot_p99_ci_ms: Interval
    mean_batch: Figure
    power_w: Figure
    slo_attainment: Figure = Field(description="share of measured requests whose TTFT meets the SLO")
    slo_met: bool


class FleetAnalytic(_Open):
    """A fleet's figures from the queueing model."""

    source: Literal["analytic"]
    physical_gpus: int = Field(description="physical GPUs of every pool: the headline count of GPUs")
    cost_per_hr: float
    cost_per_year: float
    total_replicas: int
    total_gpus: int = Field(description="GPUs as the options price them (seed units count one per TP=8 server)")
    power_kw: Figure
    output_tok_per_s: Figure
    tok_per_watt: Figure
    usd_per_million_output_tokens: Figure = Field(description="cost_per_hr / (3600 x output_tok_per_s) x 1e6 "
                                                              "(null without output)")
    ttft_p99_ms: Figure = Field(description="P99 over all requests (the mixture of the pools)")
    slo_miss_share: Figure
    slo_met: bool
    feasible: bool


class FleetSimulated(_Open):
    """A fleet's figures measured by the simulation."""

    source: Literal["simulated"]
    requests_measured: int
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    tpot_p99_ms: Figure
    tpot_p99_ci_ms: Interval
    slo_attainment: Figure
    slo_met: bool = Field(description="judged on the interval's upper end")
    slo_met_point: bool = Field(description="judged on the point estimate")
    utilization: Figure
    power_kw: Figure
    energy_per_output_token_j: Figure


_Unit = Annotated[Literal["gpu", "seed_unit"], Field(
    description="what a replica is priced and powered as: gpu = its physical GPUs; seed_unit = the seeds' "
                "calibrated TP=N server priced and powered as one GPU")]


class _PoolHead(_Open):
    """What every pool of a fleet states first: its segment, GPU option and count, the deprecated 1.0 figures, what
    it serves and what a replica is, and its ``analytic`` and ``simulated`` sub-objects."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    gpus: int = Field(description="GPUs counted, priced and powered: replicas x gpus_per_replica")
    arrival_rate: float = _deprecated("analytic.arrival_rate")
    utilization: Figure = _deprecated("analytic.utilization")
    ttft_p99_ms: Figure = _deprecated("analytic.ttft_p99_ms")
    power_w: Figure = _deprecated("analytic.power_w")
    slo_met: bool = _deprecated("analytic.slo_met")
    model: str = Field(description="the model its profile serves (the profile's label)")
    gpus_per_replica: int
    physical_gpus_per_replica: int = Field(description="physical GPUs one replica's constants describe (TP)")
    unit: _Unit
    unit_note: str = Field(description="what a replica is, in words")
    physical_gpus: int = Field(description="replicas x physical_gpus_per_replica")
    analytic: PoolAnalytic
    simulated: PoolSimulated | None


_Phase = Annotated[Literal["both", "prefill", "decode"], Field(
    description="what its replicas do: both (aggregated), or prefill / decode (the two pools of a disaggregated pair "
                "over the same segment, prefill first)")]
_Batch = Annotated[float | int | None, Field(
    description="the analytic mean running batch per replica (a decode pool whose batch is unbounded: its cap, an "
                "integer)")]
_Role = Annotated[str | None, Field(
    None, description="semantic routing only: the model class the pool serves (small | large)")]


class Pool(_PoolHead):
    """One pool of an analytically evaluated fleet: its identity, its figures, then the details of its evaluation
    (:class:`fleetopt.models.fleet.PoolResult`'s fields of the same names)."""

    profile: str = Field(description="the serving profile its figures rest on")
    quality: str = Field(description="the profile's quality: what its constants rest on")
    sized: bool = Field(description="the count was sized by the model (false: given)")
    n_slots: int = Field(description="KV slots of one replica at the pool's window")
    routing_share: float = Field(description="share of the fleet's requests routed to the pool")
    prefill_p99_ms: Figure = Field(description="P99 prefill time of the pool's requests on an idle replica")
    mean_prefill_ms: Figure
    mean_service_s: Figure = Field(description="mean time a request holds a slot")
    cv2_service: Figure = Field(description="squared coefficient of variation of the service time")
    mean_batch: _Batch
    output_tok_per_s: Figure
    tok_per_watt: Figure
    cost_per_hr: float
    utilization_ok: bool = Field(description="capacity_load within constraints.max_utilization")
    miss_reason: str = Field(description="why the pool misses its SLO (empty when it meets it)")
    slo_miss_prob: Figure = Field(description="P(TTFT > SLO) for the pool's requests")
    compress_gamma: float = Field(description="compress-and-route factor: the pool also serves compressed "
                                              "requests up to this multiple of its window")
    max_num_seqs: int = Field(description="the batch cap per replica (n_slots)")
    tpot_p99_ms: Figure = Field(description="upper bound: one iteration at the batch cap with full contexts")
    capacity_load: Figure = Field(description="offered load over the throughput at a full batch (null: not "
                                              "computed)")
    relaxation_s: Figure = Field(description="time scale over which the pool's occupancy forgets its start")
    phase: _Phase
    overloaded: bool = Field(description="an unstable queue (utilization null)")
    source: str = Field(description="where the figures come from (analytic)")
    chunk_tokens: int | None = Field(None, description="the GPU option's prefill chunk (vLLM's "
                                                       "--max-num-batched-tokens); with the instance known")
    role: _Role


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


class Fleet(_Open):
    """An analytically evaluated fleet (``evaluate``'s fleets and baseline, ``solve``'s solutions): the headline
    first, then its pools and figures."""

    physical_gpus: int = Field(description="physical GPUs of every pool (total_gpus counts priced GPUs)")
    cost_per_hr: float = _deprecated("analytic.cost_per_hr")
    cost_per_year: float = _deprecated("analytic.cost_per_year")
    power_kw: Figure = _deprecated("analytic.power_kw")
    tok_per_watt: Figure = _deprecated("analytic.tok_per_watt")
    usd_per_million_output_tokens: Figure = Field(description="analytic.usd_per_million_output_tokens: the "
                                                              "headline $ per million output tokens")
    total_replicas: int = _deprecated("analytic.total_replicas")
    total_gpus: int = _deprecated("analytic.total_gpus")
    slo_met: bool = _deprecated("analytic.slo_met")
    feasible: bool = _deprecated("analytic.feasible")
    scope: Literal["pool", "fleet"] = Field(description="the SLO's scope: each pool's P99, or the fleet-wide one")
    ttft_p99_ms: Figure = _deprecated("analytic.ttft_p99_ms")
    slo_miss_share: Figure = _deprecated("analytic.slo_miss_share")
    pools: list[Pool]
    analytic: FleetAnalytic
    simulated: FleetSimulated | None
    source: str = Field(description="where the figures come from (analytic)")


# --------------------------------------------------------------------------------------------
# Builders of the figure sub-objects (the keys above are their only definition)
# --------------------------------------------------------------------------------------------


def _plain(value):
    """numpy scalars to Python ones, tuples to lists, at any depth of lists and mappings (the models are strict)."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if hasattr(value, "item") and callable(value.item) else value


def _dump(model: type[_Open], **values) -> dict:
    return model.model_validate({k: _plain(v) for k, v in values.items()}).model_dump()


def _undeclared(model: BaseModel, where: str = "") -> list[str]:
    """The keys of a validated ``model`` (and of the models it holds) that no model declares."""
    out = [f"{where}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        for k, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, BaseModel):
                out += _undeclared(item, f"{where}{name}{f'[{k}]' if isinstance(value, list) else ''}.")
    return out


def build(model: type[BaseModel], record: object = None, /, **values) -> dict:
    """The JSON object of a ``model`` built from its declared fields, in their order: each field's value from
    ``values`` when given there, else the attribute of that name of ``record`` (a workflow's dataclass), validated
    (strict types) and dumped by the model, so the model is the one declaration of a document's keys, their types
    and their order. A field with a default (a key written only sometimes) is left out unless given in ``values``
    or ``record`` holds another value.
    numpy scalars become Python ones and tuples lists; nested objects may be given as mappings.

    Raises
    ------
    ValueError
        A bug, not bad input: a value the model does not declare (at any depth), or one of the wrong type.

    Examples
    --------
    >>> build(_ValidatePools, routing="length", boundaries=(0, 4096), max_pools=2, max_context=4096)
    {'max_pools': 2, 'max_context': 4096, 'routing': 'length', 'boundaries': [0, 4096]}
    """
    fields = model.model_fields
    unknown = [k for k in values if k not in fields]
    if unknown:
        raise ValueError(f"{model.__name__} declares no {', '.join(unknown)}")
    data = {name: _plain(values[name] if name in values else getattr(record, name)) for name in fields
            if name in values or hasattr(record, name) and (fields[name].is_required()
                                                             or getattr(record, name) != fields[name].default)}
    try:
        instance = model.model_validate(data)
    except ValidationError as err:
        raise ValueError(f"{model.__name__}: {err}") from None
    undeclared = _undeclared(instance)
    if undeclared:
        raise ValueError(f"{model.__name__} declares no {', '.join(undeclared)}")
    return instance.model_dump(exclude_unset=True)


def pool_analytic(p: PoolResult) -> dict:
    """The ``analytic`` sub-object of a pool."""
    return _dump(PoolAnalytic, source="analytic", arrival_rate=float(p.arrival_rate),
                 utilization=float(p.utilization), ttft_p99_ms=float(p.ttft_p99_ms),
                 tpot_p99_ms=float(p.tpot_p99_ms), mean_batch=float(p.mean_batch), power_w=float(p.power_w),
                 power_kw=float(p.power_w) / 1000.0, cost_per_hr=float(p.cost_per_hr),
                 output_tok_per_s=float(p.output_tok_per_s), tok_per_watt=float(p.tok_per_watt),
                 usd_per_million_output_tokens=usd_per_million_output_tokens(p.cost_per_hr, p.output_tok_per_s),
                 slo_met=bool(p.slo_met))


def fleet_analytic(r: FleetResult, units: Mapping[str, ReplicaUnit] | None = None) -> dict:
    """The ``analytic`` sub-object of a fleet (``units``: as :func:`physical_gpus`)."""
    out = fleet_output_tok_per_s(r)
    return _dump(FleetAnalytic, source="analytic", physical_gpus=physical_gpus(r, units),
                 cost_per_hr=float(r.cost_per_hr), cost_per_year=float(r.cost_per_year),
                 total_replicas=int(r.total_replicas), total_gpus=int(r.total_gpus), power_kw=float(r.power_kw),
                 output_tok_per_s=out, tok_per_watt=float(r.tok_per_watt),
                 usd_per_million_output_tokens=usd_per_million_output_tokens(r.cost_per_hr, out),
                 ttft_p99_ms=float(r.ttft_p99_ms), slo_miss_share=float(r.slo_miss_share), slo_met=bool(r.slo_met),
                 feasible=bool(r.feasible))


def pool_simulated(**values) -> dict:
    """The ``simulated`` sub-object of a pool (keys of :class:`PoolSimulated` but ``source``)."""
    return _dump(PoolSimulated, source="simulated", **values)


def fleet_simulated(**values) -> dict:
    """The ``simulated`` sub-object of a fleet (keys of :class:`FleetSimulated` but ``source``)."""
    return _dump(FleetSimulated, source="simulated", **values)


def envelope(command: str, instance: str | None) -> dict:
    """The envelope keys of a document, in their order."""
    return {"schema_version": SCHEMA_VERSION, "command": command, "instance": instance}


def with_envelope(document: Mapping, command: str, instance: str | None) -> dict:
    """``document`` with the envelope first (its own ``schema_version``, ``command``, ``instance`` replaced)."""
    head = envelope(command, instance)
    return {**head, **{k: v for k, v in document.items() if k not in head}}


# --------------------------------------------------------------------------------------------
# Documents, one per command (and variant)
# --------------------------------------------------------------------------------------------


class _ValidateWorkload(_Open):
    kind: str
    source: str
    arrival_rate: float
    input_fraction: float | None
    truncated_share: float


class _ValidateSlo(_Open):
    ttft_p99_ms: float
    ttft_model: str
    scope: str
    tpot_p99_ms: float | None
    ttft_margin: float
    ttft_sizing_ms: float


class _ValidateGpu(_Open):
    name: str
    profile: str
    kind: str
    model: str
    gpus_per_replica: int
    physical_gpus_per_replica: int
    unit: _Unit
    unit_note: str
    cost_per_hr: float
    n_slots_at_max_context: int
    max_count: int | None
    availability: float
    quality: str


class _ValidatePools(_Open):
    max_pools: int
    max_context: int
    routing: str
    boundaries: list[int]


class _ValidateConstraints(_Open):
    max_utilization: float
    max_power_kw: float | None
    max_cost_per_hr: float | None
    max_total_gpus: int | None


class InstanceSummary(_Open):
    """What an instance asks for (``fleetopt validate``'s document without its envelope)."""

    name: str
    workload: _ValidateWorkload
    slo: _ValidateSlo
    gpus: list[_ValidateGpu]
    pools: _ValidatePools
    constraints: _ValidateConstraints
    objective: str
    valid: bool
    warnings: list[str]


class ValidateDocument(InstanceSummary, Document):
    """``fleetopt validate``: what the instance asks for."""

    command: Literal["validate"]
    instance: str


class _FleetSpec(_Open):
    fleet: str = Field(description="the fleet spec, LO-HI:GPUxN,...")


class EvaluatedFleet(Fleet, _FleetSpec):
    """One fleet given to ``evaluate`` (its spec first), judged against the instance's limits."""

    violations: list[str] = Field(description="every instance limit it breaks")


class _Baseline(Fleet):
    """The homogeneous baseline: the cheapest fleet of one pool of one GPU option."""

    violations: list[str] = Field(description="every instance limit it breaks")


def _one_fleet(key: str) -> Any:
    """A top-level key of an ``evaluate`` document of one fleet: fleets[0]'s, in the 1.0 layout."""
    return Field(None, description=f"one fleet only: fleets[0].{key} (the deprecated 1.0 layout)",
                 json_schema_extra={"deprecated": True})


class EvaluateDocument(Document):
    """``fleetopt evaluate``: every given fleet (always a list) and the homogeneous baseline; with one fleet its
    keys also sit at top level (the deprecated 1.0 layout), before ``fleets``."""

    command: Literal["evaluate"]
    instance: str
    ttft_model: str
    slo_ttft_p99_ms: float
    max_utilization: float
    truncated_share: float
    fleet: str | None = _one_fleet("fleet")
    physical_gpus: int | None = _one_fleet("physical_gpus")
    cost_per_hr: float | None = _one_fleet("cost_per_hr")
    cost_per_year: float | None = _one_fleet("cost_per_year")
    power_kw: Figure = _one_fleet("power_kw")
    tok_per_watt: Figure = _one_fleet("tok_per_watt")
    usd_per_million_output_tokens: Figure = _one_fleet("usd_per_million_output_tokens")
    total_replicas: int | None = _one_fleet("total_replicas")
    total_gpus: int | None = _one_fleet("total_gpus")
    slo_met: bool | None = _one_fleet("slo_met")
    feasible: bool | None = _one_fleet("feasible")
    scope: Literal["pool", "fleet"] | None = _one_fleet("scope")
    ttft_p99_ms: Figure = _one_fleet("ttft_p99_ms")
    slo_miss_share: Figure = _one_fleet("slo_miss_share")
    pools: list[Pool] | None = _one_fleet("pools")
    analytic: FleetAnalytic | None = _one_fleet("analytic")
    simulated: FleetSimulated | None = _one_fleet("simulated")
    source: str | None = _one_fleet("source")
    violations: list[str] | None = _one_fleet("violations")
    fleets: list[EvaluatedFleet] = Field(min_length=1)
    baseline: _Baseline | None


class _Objective(_Open):
    name: str = Field(description="the instance's objective")
    value: float | None = Field(description="the selected plan's objective value, in unit (null without a plan)")
    unit: str
    bound: float | None = Field(description="the solver's best bound on the objective")
    lp_bound: float | None = Field(description="the LP relaxation's bound")
    minimizes: str = Field(description="what the solver minimises, in words")


class _Routing(_Open):
    """A split-routing plan's routing: per elementary length segment, the req/s sent to each pool."""

    boundaries_tokens: list[int] = Field(description="the elementary segments' boundaries")
    rate_req_per_s: list[list[float]] = Field(description="per segment, the req/s to each pool (columns in the "
                                                          "order of the plan's pools)")
    source: Literal["MIP"]


class _SolutionHead(_Open):
    rank: int = Field(description="1-based, by increasing objective")
    objective: float = Field(description="the plan's objective value, in objective.unit")


class _Solution(Fleet, _SolutionHead):
    """One plan the solver found: its rank and objective, then the fleet's keys."""

    fleet: str | None = Field(description="the fleet spec, LO-HI:GPUxN,...; null for a split-routing plan, whose "
                              "pools overlap (its routing says how)")
    routing: _Routing | None




class _DroppedReason(_Open):
    """The dropped candidates of one GPU option that share one reason (its wording less the numbers)."""

    count: int = Field(description="candidates dropped for this reason")
    example: str = Field(description="one of them, with its segment and reason: LO-HI on GPU: why")


class _DroppedOption(_Open):
    """The candidates of one GPU option the sizing dropped."""

    gpu: str = Field(description="the GPU option (a semantic plan's: role, share and option)")
    dropped: int = Field(description="candidate segments dropped")
    reasons: list[_DroppedReason] = Field(description="per reason, most frequent first (at most 3; the rest in "
                                                      "other)")
    other: int = Field(description="dropped for a reason not listed")


class _Candidates(_Open):
    generated: int = Field(description="candidate pools (segment x GPU option) generated")
    feasible: int = Field(description="those a replica count makes meet the SLO")
    after_pruning: int = Field(description="those left after dominated ones are pruned")
    left_unsized: int = Field(description="candidates never sized because feasible candidates of the same segment "
                                          "(as many as the plans asked for) rule them out by their cost (and "
                                          "power and GPU) floors, so the plans are the same without them; "
                                          "counted in generated, in neither feasible nor dropped_total")
    dropped_total: int = Field(description="candidates dropped: no replica count makes them meet the SLO")
    dropped: list[str] = Field(description=f"the reasons of representative dropped candidates (at most "
                                           f"{DROPPED_LINES}, the most frequent reason of each option first)")
    dropped_by_option: list[_DroppedOption] = Field(description="per GPU option, how many were dropped and why")


class _VerifiedPool(_Open):
    """One pool of a simulated plan of ``solve --verify-top``."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    ttft_p99_ms_analytic: Figure
    ttft_p99_ms_sim: Figure = Field(description="null: the plan's simulation has no row for the pool")
    ttft_p99_ci_ms: Interval | None
    slo_met_sim: bool
    outcome: Literal["pass", "fail", "undecided"]
    too_few_requests: bool
    requests_measured: int | None
    preemptions: int | None


class _VerifiedPlan(_Open):
    """One plan simulated by ``solve --verify-top``, in one round."""

    round: int
    rank: int
    cost_per_hr: float
    passed: bool
    outcome: Literal["pass", "fail", "undecided"]
    accepted: bool
    verdict: str = Field(description="passes, misses or undecided in simulation at N requests")
    ttft_p99_ms_sim: Figure
    ttft_p99_ci_ms: Interval
    requests_simulated: int
    cached: bool = Field(description="judged in an earlier round, not simulated again")
    pools: list[_VerifiedPool]


class _SizingTrial(_Open):
    """One simulated count of a pool sized alone."""

    replicas: int
    passed: bool
    outcome: str
    ttft_p99_ms_sim: Figure
    ttft_p99_ci_ms: Interval
    requests: int = Field(description="measured requests")
    requests_simulated: int
    source: str = Field(description="alone: the pool's own run; or the plan's run it was judged in")


class _PoolSizing(_Open):
    """A pool sized alone by simulation (``--verify-cuts pool``): its least passing count."""

    min_tokens: int
    max_tokens: int
    gpu: str
    max_num_seqs: int
    least_replicas: int | None = Field(description="the least count that passes (null: none up to the cap)")
    cap_replicas: int
    reason: str | None
    trials: list[_SizingTrial]


class _TrimPool(_Open):
    """One pool of the trimmed plan."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int = Field(description="replicas to buy: replicas_up inflated by availability, at least min_count")
    replicas_up: int = Field(description="replicas the simulations ran (the trimmed, confirmed count)")
    replicas_verified: int = Field(description="the verified plan's count")
    ttft_p99_ms_sim: Figure
    ttft_p99_ci_ms: Interval
    ttft_p99_ms_confirmation: Figure = Field(description="the independent confirmation run's P99 TTFT")
    ttft_p99_ms_analytic: Figure
    slo_met_analytic: bool


class _Trim(_Open):
    """``solve --trim``: the chosen plan's counts lowered while its simulation still meets the SLO."""

    source: Literal["simulated"]
    confirmed: bool = Field(description="an independent simulation confirms the trimmed plan")
    cost_per_hr: float = Field(description="the trimmed plan's $/hr")
    verified_cost_per_hr: float
    savings: float = Field(description="$/hr saved against the verified plan")
    ttft_p99_ms_sim: Figure
    ttft_p99_ms_confirmation: Figure
    fleet: str | None
    fleet_simulated: str | None
    trials: int
    requests_per_trial: int
    pools: list[_TrimPool]
    options: dict = Field(description="the simulation settings")


class _Verification(_Open):
    """``solve --verify-top N``: every simulated plan, per round, the pools sized alone, and the trim."""

    rule: str = Field(description="what meets the SLO in simulation (--verify-rule)")
    rounds: int
    cuts: list[str] = Field(description="why each cut was made, in order")
    plans: list[_VerifiedPlan]
    reason: str | None = Field(description="why no plan was chosen (null: one was)")
    pool_sizing: list[_PoolSizing]
    solves: int
    plan_simulations: int
    pool_simulations: int
    pool_runs: int
    engine: dict | None = Field(description="the simulation engine's settings (null: nothing simulated)")
    options: dict = Field(description="the simulation settings")
    outcome: Literal["pass", "fail", "undecided"] | None
    verdict: str | None
    chosen_rank: int | None
    chosen_round: int | None
    trim: _Trim | None = Field(description="--trim only (null without)")


class _Provenance(_Open):
    selection: str = Field(description="what selected the plan (the method)")
    numbers: str = Field(description="where its figures come from")
    profiles: list[str] = Field(description="per GPU option of the plan: the quality of its profile")


class SolveDocument(Document):
    """``fleetopt solve``: the chosen plan's fleet at top level (its keys null without a plan), every solution."""

    command: Literal["solve"]
    instance: str
    overrides: list[str]
    status: str
    method: str
    solver: str | None = Field(description="the solver that selected the plan")
    explanation: str
    objective: _Objective
    physical_gpus: int | None = Field(description="physical GPUs of the plan (null without a plan)")
    cost_per_hr: float | None = Field(description="deprecated alias of analytic.cost_per_hr (null without a plan)",
                                      json_schema_extra={"deprecated": True})
    cost_per_year: float | None = _deprecated("analytic.cost_per_year")
    power_kw: Figure = _deprecated("analytic.power_kw")
    tok_per_watt: Figure = _deprecated("analytic.tok_per_watt")
    usd_per_million_output_tokens: Figure = Field(description="the plan's $ per million output tokens "
                                                              "(analytic.usd_per_million_output_tokens; null "
                                                              "without a plan)")
    total_replicas: int | None = _deprecated("analytic.total_replicas")
    total_gpus: int | None = _deprecated("analytic.total_gpus")
    slo_met: bool | None = _deprecated("analytic.slo_met")
    feasible: bool | None = _deprecated("analytic.feasible")
    scope: Literal["pool", "fleet"] | None = Field(None, description="the SLO's scope (absent without a plan)")
    ttft_p99_ms: Figure = Field(None, description="deprecated alias of analytic.ttft_p99_ms (absent without a plan)",
                                json_schema_extra={"deprecated": True})
    slo_miss_share: Figure = Field(None, description="deprecated alias of analytic.slo_miss_share (absent without "
                                                     "a plan)", json_schema_extra={"deprecated": True})
    pools: list[Pool] | None
    analytic: FleetAnalytic | None
    simulated: FleetSimulated | None
    source: str | None = Field(None, description="where the plan's figures come from (absent without a plan)")
    semantic: dict | None = Field(description="a semantic plan's model classes (null for one model class)")
    fleet: str | None
    routing: _Routing | None
    baseline: _Baseline | None
    warnings: list[str]
    solve_seconds: float
    mip_gap: float | None
    ttft_model: str
    slo_ttft_p99_ms: float
    ttft_margin: float = Field(description="share of the SLO the plans were sized to keep free (slo.ttft_margin; 0 "
                                           "with --verify-top)")
    ttft_sizing_ms: float = Field(description="the P99 TTFT the candidates were sized to: the SLO less the margin")
    power_linearization_error_w: Figure = Field(description="largest error of the MIP's linearised power")
    candidates: _Candidates = Field(description="the candidate pools generated, feasible and kept; the dropped ones "
                                                "summarised")
    solutions: list[_Solution]
    verified: bool | None = Field(description="null without --verify-top")
    verification: _Verification | None = Field(None, description="--verify-top only: every simulated plan, per "
                                                                 "round, the pools sized alone and the trim")
    provenance: _Provenance


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


class _TpwRow(_Open):
    profile: str
    model: str
    context: int
    n_slots: int
    iter_latency_ms: Figure
    tok_per_s: Figure
    power_w: Figure
    tok_per_watt: Figure
    quality: str
    source: Literal["analytic"]


class TpwDocument(Document):
    """``fleetopt tpw``: tokens per watt of one replica per context window."""

    command: Literal["tpw"]
    instance: None
    rows: list[_TpwRow]


class _RhoPoint(_Open):
    """The fleet at one utilisation of every pool (``fleet_points``, ``fleet_now``)."""

    rho: Figure = Field(description="utilisation (null: the pool is unstable now)")
    power_w: Figure
    output_tok_per_s: Figure
    tok_per_watt: Figure
    usd_per_mtok: Figure


class _RhoPoolPoint(_Open):
    """One pool brought to a utilisation by scaling the arrival rate (``now``: the instance's own rate)."""

    rho: Figure = Field(description="utilisation (null: the pool is unstable now)")
    fleet_arrival_rate: Figure = Field(description="the fleet's req/s that brings the pool to rho")
    arrival_rate: Figure = Field(description="the pool's own req/s there")
    utilization: Figure
    mean_batch: Figure
    power_w: Figure
    output_tok_per_s: Figure
    tok_per_watt: Figure
    usd_per_mtok: Figure
    cost_per_hr: float
    ttft_p99_ms: Figure
    slo_met: bool


class _RhoPool(_Open):
    pool: str
    gpu: str
    replicas: int
    batch_cap: int
    quality: str
    routing_share: Figure
    points: list[_RhoPoolPoint]
    now: _RhoPoolPoint


class RhoSweepDocument(Document):
    """``fleetopt tpw INSTANCE --fleet SPEC --rho-sweep``: a fleet's pools against utilisation."""

    command: Literal["tpw --rho-sweep"]
    instance: str
    fleet: str
    arrival_rate: float
    ttft_model: str
    source: Literal["analytic"]
    rhos: list[float]
    pools: list[_RhoPool]
    fleet_points: list[_RhoPoint]
    fleet_now: _RhoPoint
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")


class _BenchRow(_Open):
    name: str


class BenchDocument(Document):
    """``fleetopt bench``: one row per benchmark (medians in s, targets, whether met)."""

    command: Literal["bench"]
    instance: None
    machine: dict
    repeats: int
    statistic: str
    benchmarks: list[_BenchRow]


class _SplitRow(_Open):
    """One boundary of the split table (``fleetopt.optimizer.workflows.split_table.SplitRow``)."""

    boundary_tokens: int
    share_short: float = Field(description="F(B): the share of requests of at most boundary_tokens tokens")
    replicas_short: int
    replicas_long: int
    total_gpus: int
    cost_per_hr: float
    cost_per_year: float
    saving_pct: Figure = Field(description="100 (C0 - C) / C0 against the baseline's cost C0")
    ttft_p99_ms_short: Figure
    ttft_p99_ms_long: Figure
    slo_met: bool
    pareto: bool
    fleet: str
    miss_reason: str = Field(description="why a pool misses the SLO (empty when the row meets it)")
    limits_ok: bool = Field(description="the row's fleet breaks no limit of the instance")
    violations: list[str] = Field(description="every instance limit the row's fleet breaks (as evaluate's)")


class _SplitBaseline(_Open):
    """The homogeneous fleet of the split table's GPU option the savings are measured against."""

    replicas: int
    total_gpus: int
    cost_per_hr: float
    cost_per_year: float
    ttft_p99_ms: Figure
    slo_met: bool
    fleet: str
    violations: list[str] = Field(description="every instance limit the baseline breaks")


class ParetoDocument(Document):
    """``fleetopt pareto --split-table``: one two-pool fleet per split boundary."""

    command: Literal["pareto --split-table"]
    instance: str
    source: Literal["analytic"]
    gpu: str
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    max_utilization: float
    max_context_tokens: int
    baseline: _SplitBaseline
    rows: list[_SplitRow]
    recommended: int | None = Field(description="0-based index into rows of the cost optimum meeting the SLO "
                                                "within the instance's limits; null when none does")
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")


FRONTIER_KINDS = ("pareto --axes cost,power", "pareto --axes cost,ttft", "pareto --axes cost,pools")
"""The ``command`` values of the ``pareto --axes`` documents, one per second axis."""


class _FrontierHead(_Open):
    fleet: str = Field(description="the plan's fleet spec, LO-HI:GPUxN,... (one entry per pool)")
    cost_per_hr: float
    cost_per_year: float


class _PowerAxis(_FrontierHead):
    power: Figure = Field(description="the point's value on the power axis: axis_value, kW")


class _TtftAxis(_FrontierHead):
    ttft: Figure = Field(description="the point's value on the ttft axis: axis_value, ms")


class _PoolsAxis(_FrontierHead):
    pools: int = Field(description="number of pools of the plan (the pools axis: axis_value)")


class _FrontierPoint(_FrontierHead):
    """One point of a ``pareto --axes`` curve: an optimal plan of a re-solve, re-judged on the instance itself.
    Its value on the second axis is ``axis_value``, and also under the axis' name (``power``, ``ttft``), after
    ``cost_per_year``; on the pools axis that key is ``pools`` itself, there (the points of each axis:
    :class:`_PowerPoint`, :class:`_TtftPoint`, :class:`_PoolsPoint`)."""

    axis_value: Figure = Field(description="the plan's value on the second axis, in axis_unit")
    axis_unit: str
    total_gpus: int = Field(description="GPUs as the options price them (seed units count one per TP=8 server)")
    physical_gpus: int = Field(description="physical GPUs of the plan's pools")
    pools: int = Field(description="number of pools of the plan")
    power_kw: Figure
    worst_ttft_p99_ms: Figure = Field(description="the largest analytic P99 TTFT over the pools with traffic")
    worst_tpot_p99_ms: Figure
    slo_miss_share: Figure
    slo_met: bool = Field(description="the plan meets the instance's own SLO, re-evaluated at its counts")
    violations: list[str] = Field(description="every limit of the instance the plan breaks")
    constraint: str = Field(description="the --set of the re-solve that found it")
    rank: int = Field(description="1-based, by increasing cost (the baseline: 0)")
    recommended: bool
    knee: bool


class _PowerPoint(_FrontierPoint, _PowerAxis):
    """A point of the cost,power curve (``power``: its kW)."""


class _TtftPoint(_FrontierPoint, _TtftAxis):
    """A point of the cost,ttft curve (``ttft``: its worst P99 TTFT, ms)."""


class _PoolsPoint(_FrontierPoint, _PoolsAxis):
    """A point of the cost,pools curve (``pools`` right after ``cost_per_year``)."""


class FrontierDocument(Document):
    """``fleetopt pareto --axes cost,AXIS``: the exact least-cost curve against power, P99 TTFT or pools (one
    model per axis: :class:`PowerFrontierDocument`, :class:`TtftFrontierDocument`, :class:`PoolsFrontierDocument`,
    whose points carry the axis' key)."""

    command: Literal["pareto --axes cost,power", "pareto --axes cost,ttft", "pareto --axes cost,pools"]
    instance: str
    source: str
    axes: list[str] = Field(min_length=2, max_length=2, description='["cost", AXIS]')
    axis_unit: str = Field(description="kW, ms or pools")
    sweep: Literal["consecutive", "evenly spaced caps"]
    slo_ttft_p99_ms: float = Field(description="the instance's P99 TTFT SLO every point is judged on")
    slo_tpot_p99_ms: float | None = Field(description="the instance's P99 TPOT SLO (null: none)")
    slo: str = Field(description="the instance's SLO in words")
    points: list[_FrontierPoint] = Field(description="non-dominated, by increasing cost")
    recommended: int | None = Field(description="0-based index into points of the cheapest point meeting the SLO "
                                                "within the instance's limits; null when none does")
    recommended_index: int | None = Field(description="recommended, under a second name")
    recommended_reason: str
    recommendation_rule: str = Field(description="what recommended means, in words")
    knee_index: int | None = Field(description="0-based index into points of the knee (an alternative)")
    knee_rule: str = Field(description="what the knee is, in words")
    baseline: _FrontierPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")
    baseline_dominated: bool | None
    solves: int
    solve_seconds: float
    truncated: bool = Field(description="a consecutive sweep stopped at its point limit before the curve's end")
    overrides: list[str]
    solves_unused: int = Field(description="solves made ahead on the backend's workers the sweep did not ask for")
    backend: str = Field(description="where the re-solves ran")


class PowerFrontierDocument(FrontierDocument):
    """``fleetopt pareto --axes cost,power``."""

    command: Literal["pareto --axes cost,power"]
    points: list[_PowerPoint] = Field(description="non-dominated, by increasing cost")
    baseline: _PowerPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")


class TtftFrontierDocument(FrontierDocument):
    """``fleetopt pareto --axes cost,ttft``."""

    command: Literal["pareto --axes cost,ttft"]
    points: list[_TtftPoint] = Field(description="non-dominated, by increasing cost")
    baseline: _TtftPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")


class PoolsFrontierDocument(FrontierDocument):
    """``fleetopt pareto --axes cost,pools``."""

    command: Literal["pareto --axes cost,pools"]
    points: list[_PoolsPoint] = Field(description="non-dominated, by increasing cost")
    baseline: _PoolsPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")


FRONTIER_DOCUMENTS: dict[str, type[FrontierDocument]] = {
    "power": PowerFrontierDocument, "ttft": TtftFrontierDocument, "pools": PoolsFrontierDocument}
"""The document model of each ``pareto --axes cost,AXIS``, by AXIS."""
FRONTIER_POINTS: dict[str, type[_FrontierPoint]] = {"power": _PowerPoint, "ttft": _TtftPoint, "pools": _PoolsPoint}
"""The model of a point (and of the baseline) of each ``pareto --axes cost,AXIS``, by AXIS."""


class _HeadroomPool(_Open):
    """One pool's analytic limit (``fleetopt.optimizer.workflows.headroom.PoolLimit``)."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    routing_share: Figure
    max_arrival_rate: Figure = Field(description="the largest fleet rate at which the pool carries its share "
                                                 "(null: no traffic, or no limit below the search's top)")
    pool_arrival_rate: Figure = Field(description="routing_share x max_arrival_rate")
    limited_by: str = Field(description="what fails just above the limit (empty: nothing)")
    ttft_p99_ms: Figure = Field(description="the pool's analytic P99 TTFT at the limit")
    capacity_load: Figure = Field(description="the pool's capacity load at the limit")
    ttft_p99_ms_above: Figure = Field(description="the pool's analytic P99 TTFT one grid step above the limit")
    capacity_load_above: Figure


class _HeadroomProbe(_Open):
    """One simulated rate of a pool's search: the pool alone at its share of the fleet rate."""

    arrival_rate: float = Field(description="the fleet rate (req/s)")
    pool_arrival_rate: Figure
    slo_met: bool
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    requests: int = Field(description="measured requests of the pool (all replications)")


class _HeadroomPoolSim(_Open):
    """One pool's simulated limit: the largest passing and the smallest failing fleet rate of the grid."""

    pool: str
    routing_share: Figure
    max_arrival_rate_sim: Figure
    min_failing_rate_sim: Figure
    probes: list[_HeadroomProbe]


class _HeadroomSim(_Open):
    """The simulated limit (``headroom --verify``): the least of the pools'."""

    max_arrival_rate_sim: Figure
    binding_pool: str | None
    tolerance_req_per_s: float
    rule: str
    ci: str
    simulations: int
    options: dict = Field(description="the simulation settings")
    pools: list[_HeadroomPoolSim]


class HeadroomDocument(Document):
    """``fleetopt headroom``: the largest arrival rate a fleet carries within its SLO."""

    command: Literal["headroom"]
    instance: str
    fleet: str
    source: Literal["analytic"]
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    scope: str
    max_utilization: float
    max_arrival_rate: Figure
    binding_pool: str | None
    binding_pool_index: int | None = Field(description="0-based index into pools of binding_pool (null: the "
                                                       "fleet-wide P99 binds, or nothing)")
    limited_by: str
    fleet_p99_limit: Figure = Field(description="fleet scope only: the largest rate at which the fleet-wide P99 "
                                                "meets the SLO")
    tolerance_req_per_s: float
    evaluations: int = Field(description="analytic evaluations of the fleet the search made")
    pools: list[_HeadroomPool]
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")
    slo_met: bool = Field(description="the fleet meets its SLO at the instance's arrival_rate")
    limits_ok: bool = Field(description="the fleet breaks no limit of the instance at its arrival_rate "
                                        "(false: exit code 6)")
    violations: list[str] = Field(description="every instance limit the fleet breaks at its arrival_rate "
                                              "(as evaluate's)")
    max_arrival_rate_sim: Figure = Field(None, description="--verify only: sim.max_arrival_rate_sim")
    sim: _HeadroomSim | None = Field(None, description="--verify only: the simulated limit")


class _DiffPoolChange(_Open):
    change: Literal["added", "removed", "resized", "moved", "unchanged"]
    gpu: str
    phase: Literal["both", "prefill", "decode"]
    hardware: str = Field(description="the profile's GPU (its name up to the first /), else the GPU option")
    physical_gpus_per_replica: int
    min_tokens_a: int | None = Field(description="the pool's segment in A (null: added)")
    max_tokens_a: int | None
    min_tokens_b: int | None = Field(description="the pool's segment in B (null: removed)")
    max_tokens_b: int | None
    replicas_a: int
    replicas_b: int
    replicas_delta: int = Field(description="replicas_b - replicas_a")
    physical_gpus_a: int
    physical_gpus_b: int
    physical_gpus_delta: int = Field(description="physical_gpus_b - physical_gpus_a")


class _DiffOption(_Open):
    gpu: str
    replicas_a: int
    replicas_b: int
    replicas_delta: int
    physical_gpus_a: int
    physical_gpus_b: int
    physical_gpus_delta: int


class _DiffHardware(_Open):
    hardware: str
    physical_gpus_a: int
    physical_gpus_b: int
    physical_gpus_delta: int = Field(description="GPUs to buy (> 0) or release (< 0)")
    action: Literal["buy", "release", "keep"]


class _BoundaryMove(_Open):
    from_tokens: int
    to_tokens: int


class FleetChange(_Open):
    """What changes from fleet A to fleet B (``diff``'s ``change``, each ``headroom --range`` step's): pools
    matched by GPU configuration, phase and segment, GPUs per option and per hardware, boundaries, $/hr."""

    pools: list[_DiffPoolChange]
    options: list[_DiffOption]
    hardware: list[_DiffHardware]
    boundaries_a: list[int]
    boundaries_b: list[int]
    boundary_moves: list[_BoundaryMove]
    boundaries_added: list[int]
    boundaries_removed: list[int]
    replicas_delta: int
    physical_gpus_delta: int
    cost_per_hr_delta: float | None = Field(description="B's $/hr - A's (null: a side's cost unknown)")
    cost_per_year_delta: float | None
    unchanged: bool
    summary: str = Field(description="the change in words: GPUs to buy / release per hardware, the $/hr delta")


class _RangePool(_Open):
    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    phase: Literal["both", "prefill", "decode"] = "both"
    hardware: str = Field("", description="the profile's GPU (its name up to the first /), else the GPU option")
    physical_gpus: int = 0


class _RangeFleet(_Open):
    """The optimal fleet at one rate of ``headroom --range`` (no plan: ``fleet`` null and costs null)."""

    arrival_rate: float
    status: str = Field(description="the solve's status at this rate")
    fleet: str | None
    total_gpus: int | None
    total_replicas: int | None
    physical_gpus: int | None
    cost_per_hr: Figure
    cost_per_year: Figure
    pools: list[_RangePool]


class _RangePlateau(_RangeFleet):
    add_capacity_before: Figure = Field(description="the step rate that ends the plateau (null: it lasts to the "
                                                    "range's top)")
    change: FleetChange | None = Field(description="from the current fleet (--fleet) to the plateau's fleet "
                                                   "(null without --fleet)")


class _RangeStep(_Open):
    arrival_rate: float
    before: _RangeFleet
    after: _RangeFleet
    change: FleetChange = Field(description="what to add at the step: from the current fleet (--fleet) or else "
                                            "from the previous step's fleet")
    change_from_previous: FleetChange


class HeadroomRangeDocument(Document):
    """``fleetopt headroom --range LO:HI``: where the optimal fleet steps up over a rate range."""

    command: Literal["headroom --range"]
    instance: str
    source: str
    range: list[float] = Field(min_length=2, max_length=2)
    slo_ttft_p99_ms: float
    ttft_model: str
    current_fleet: _RangeFleet | None = Field(description="the --fleet at the instance's rate (null without --fleet)")
    reference: Literal["current fleet", "previous step"] = Field(
        description="what each step's change is measured from")
    steps: list[_RangeStep]
    plateaus: list[_RangePlateau]
    solved: list[_RangeFleet] = Field(description="every rate solved, by increasing rate")
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")


class _DiffFigures(_Open):
    """A plan's headline figures (``diff``'s ``a`` and ``b``), or their change B - A (``delta``)."""

    physical_gpus: int
    total_replicas: int
    cost_per_hr: float
    cost_per_year: float
    power_kw: Figure
    tok_per_watt: Figure
    usd_per_million_output_tokens: Figure


class _DiffPlanHead(_Open):
    file: str
    command: Literal["solve", "evaluate", "simulate"]
    instance: str | None
    plan: str = Field(description="which plan of the file: the selected plan, plan N, fleet N, the simulated fleet")
    fleet: str | None
    overrides: list[str]
    slo_ttft_p99_ms: float | None
    arrival_rate: Figure = Field(description="req/s: the sum of its pools' analytic arrival_rate (decode rows out)")


class _DiffPlan(_DiffFigures, _DiffPlanHead):
    """One side of a ``diff``: which plan, its headline figures, its SLO verdict."""

    slo_met: bool | None
    slo_source: Literal["analytic", "simulated"]
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval | None = Field(description="simulated only: the P99 TTFT's 95 % interval")


class _DiffDelta(_DiffFigures):
    """B - A of each headline figure."""


class DiffDocument(Document):
    """``fleetopt diff A.json B.json``: what changes from plan A to plan B."""

    command: Literal["diff"]
    instance: str | None = Field(description="the instance of both plans; null when they differ")
    same_instance: bool
    instance_note: str | None = Field(description="what differs between the plans' instances (null: nothing)")
    a: _DiffPlan
    b: _DiffPlan
    change: FleetChange
    delta: _DiffDelta = Field(description="B - A of each headline figure (null where a side's is null)")


class _WhatIfPool(_Open):
    """One pool of a scenario's plan (analytic)."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    gpus: int
    ttft_p99_ms: Figure
    capacity_load: Figure
    cost_per_hr: float


class _WhatIfBinding(_Open):
    """What a pool breaks with one deployed replica fewer (``fleetopt.optimizer.workflows.whatif.binding``)."""

    pool: str = Field(description="LO-HI:GPUxN")
    binds: list[str] = Field(description="P99 TTFT, TPOT, utilization cap; or one replica, or above least count")
    replicas_tested: int | None = Field(description="the up count tested (null: the pool has no traffic)")
    ttft_p99_ms: Figure = Field(description="the pool's P99 TTFT at replicas_tested (null: not evaluated)")
    capacity_load: Figure


class _WhatIfSim(_Open):
    """--verify only: the scenario's plan simulated."""

    slo_met: bool = Field(description="the upper end of the 95 % P99 TTFT interval within the SLO")
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval
    requests_measured: int
    seed: int


class _WhatIfRecord(_Open):
    """A solve's record: the base instance's, or one scenario's (``fleetopt.optimizer.workflows.whatif.RECORD_KEYS``;
    the plan's keys null without a plan)."""

    status: str
    method: str
    explanation: str
    mip_gap: float | None
    cost_per_hr: float | None
    cost_per_year: float | None
    total_replicas: int | None
    total_gpus: int | None
    power_kw: Figure
    fleet: str | None
    pools: list[_WhatIfPool]
    binding: list[_WhatIfBinding]
    limits_at_bound: list[str] = Field(description="the fleet-wide limits the plan meets with equality")
    binding_note: str = Field(description="why the per-pool binding is not determined (empty: it is)")
    sim: _WhatIfSim | None = Field(description="--verify only (null without)")


class _PoolResize(_Open):
    pool: str = Field(description="LO-HI:GPU")
    replicas_base: int
    replicas: int


class _WhatIfDeltas(_Open):
    """A scenario against the base (null where either has no plan)."""

    cost_per_year: float | None = Field(description="$/yr: the scenario's - the base's")
    cost_pct: float | None = Field(description="cost_per_year over the base's, in %")
    replicas: int | None
    gpus: int | None
    pools_added: list[str]
    pools_removed: list[str]
    pools_resized: list[_PoolResize]
    gpu_types_added: list[str]
    gpu_types_removed: list[str]
    same_fleet: bool | None


class _ScenarioHead(_Open):
    index: int
    key: str
    overrides: dict = Field(description="the swept values by dotted path")


class _Scenario(_WhatIfRecord, _ScenarioHead):
    """One scenario of the grid: its place, its values, its record and its deltas against the base."""

    deltas: _WhatIfDeltas


class _Sweep(_Open):
    path: str = Field(description="the dotted instance field swept")
    values: list = Field(description="its values, as YAML reads them")


class WhatIfDocument(Document):
    """``fleetopt whatif``: the base solve and one re-solve per scenario of the grid."""

    command: Literal["whatif"]
    instance: str
    instance_file: str
    source: str
    slo_ttft_p99_ms: float
    ttft_model: str
    overrides: list[str] = Field(description="the --set overrides of the base and every scenario")
    sweeps: list[_Sweep]
    base: _WhatIfRecord
    scenarios: list[_Scenario]
    sim_options: dict | None = Field(None, description="--verify only: the simulation settings")


class _DepthEvent(_Open):
    delivered_reduction: Figure
    draw_kw: Figure
    uncurtailed_draw_kw: Figure
    source: Literal["simulated"]
    verdict: Literal["met", "breach", "undecided"] | None
    undecided_pools: list[str]


class _DepthPool(_Open):
    """One pool at one curtailment depth (``fleetopt.optimizer.workflows.gridflex.PoolDepth``)."""

    pool: str
    replicas: int = Field(description="replicas left in service")
    replicas_out: int = Field(description="replicas taken out of service")
    batch_cap: int
    power_cap_w: Figure
    replica_power_at_cap_w: Figure
    power_w: Figure
    utilization: Figure
    ttft_p99_ms_analytic: Figure
    ttft_p99_ms_event: Figure
    ttft_p99_ci_ms_event: Interval
    power_w_event: Figure
    drain_s_event: Figure
    measured_event: int
    sustained_ok: bool
    event_ok: bool
    event_verdict: str = Field(description="met, breach or undecided; empty when not simulated")


class _Depth(_Open):
    depth: float
    batch_cap: int | None = Field(description="the cap of a one-pool fleet (null with several pools)")
    power_kw: Figure
    ttft_p99_ms_analytic: Figure
    ttft_p99_ms_event: Figure
    ttft_p99_ci_ms_event: Interval
    power_kw_event: Figure
    drain_s_event: Figure
    sustained_ok: bool
    event_ok: bool
    simulated: bool
    lever: str
    delivered_reduction: Figure
    draw_kw: Figure
    uncurtailed_draw_kw: Figure
    source: Literal["analytic"]
    verdict: Literal["met", "breach"]
    delivers: bool
    event: _DepthEvent
    pools: list[_DepthPool]


class _GridFlexSources(_Open):
    """Where each figure of a depth comes from."""

    batch_cap: str
    power_kw: str
    delivered_reduction: str
    ttft_p99_ms_analytic: str
    ttft_p99_ms_event: str


class GridFlexDocument(Document):
    """``fleetopt gridflex``: the fleet at each curtailment depth, a depth read as ``convention`` (``delivered``:
    the fleet's draw reduction; ``seed``: the reference scenarios' per-GPU peak-power cap)."""

    command: Literal["gridflex"]
    instance: str
    fleet: str
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    scope: str
    convention: Literal["delivered", "seed"]
    convention_label: str
    source: _GridFlexSources
    event_seconds: float
    warmup_seconds: float
    tail_seconds: float
    replications: int
    seed: int
    event_model: str
    depths: list[_Depth]
    max_safe_depth_sustained: float | None
    max_safe_depth_event: float | None
    undecided_pools: list[str]
    overrides: list[str] = Field(description="the --set overrides the instance was loaded with")
    wall_seconds: float = Field(description="wall-clock time of the sweep (s)")


class ProfileFitDocument(Document):
    """``fleetopt profile fit``: the fitted coefficients, every point and the profile file's content."""

    command: Literal["profile fit"]
    instance: None
    coefficients: dict[str, float]
    power: dict | None
    fit: dict
    summary: dict
    points: list[dict]
    profile: dict


class CatalogDocument(Document):
    """``fleetopt catalog list``: what the catalogue holds, with units and provenance."""

    command: Literal["catalog list"]
    instance: None
    kinds: list[str] = Field(min_length=1)
    files: dict[str, str]
    units: dict


DOCUMENTS: dict[str, type[Document]] = {
    kind: m  # each of the Literal's values (pareto --axes: one per second axis)
    for m in (ValidateDocument, EvaluateDocument, SolveDocument, SimulateDocument, SimulateRoutersDocument,
              TpwDocument, RhoSweepDocument, BenchDocument, ParetoDocument, *FRONTIER_DOCUMENTS.values(),
              HeadroomDocument,
              HeadroomRangeDocument, WhatIfDocument, GridFlexDocument, ProfileFitDocument, CatalogDocument,
              DiffDocument)
    for kind in get_args(m.model_fields["command"].annotation)}
"""Each document kind (its ``command`` value) and its model."""

COMMANDS: dict[str, tuple[str, ...]] = {
    "validate": ("validate",), "evaluate": ("evaluate",), "solve": ("solve",),
    "simulate": ("simulate", "simulate --routers"), "tpw": ("tpw", "tpw --rho-sweep"), "bench": ("bench",),
    "pareto": ("pareto --split-table", *FRONTIER_KINDS), "headroom": ("headroom", "headroom --range"),
    "whatif": ("whatif",), "gridflex": ("gridflex",), "profile": ("profile fit",), "catalog": ("catalog list",),
    "diff": ("diff",)}
"""Each command and the document kinds its ``--json`` writes (``export`` writes deployment files, not JSON)."""


def document_model(command: str | None) -> type[Document]:
    """The model of the document kind ``command`` (a ``command`` value, e.g. ``"tpw --rho-sweep"``).

    Raises
    ------
    KeyError
        When no document has that kind; the message lists the known ones.
    """
    model = DOCUMENTS.get(command) if command is not None else None
    if model is None:
        raise KeyError(f"unknown document kind {command!r}; known: {', '.join(DOCUMENTS)}")
    return model


def validate_document(document: Mapping) -> Document:
    """Check a ``--json`` document (as read back from JSON) against the model its ``command`` names.

    Raises
    ------
    KeyError
        When its ``command`` is missing or names no document kind.
    pydantic.ValidationError
        When a contract key is missing or has the wrong type.
    """
    return document_model(document.get("command")).model_validate(dict(document))


def check_document(document: Mapping) -> None:
    """Check a document about to be written (JSON values: :func:`fleetopt.optimizer.output.writes.to_jsonable`)
    against its model, so that no command writes a document that drifts from ``fleetopt schema``.

    Raises
    ------
    ValueError
        A bug, not bad input: the document's ``command`` names no document kind, or a contract key is missing
        or has the wrong type; one ``key: problem`` per broken key.
    """
    try:
        validate_document(document)
    except KeyError as err:
        raise ValueError(f"a --json document of no known kind: {err.args[0]}") from None
    except ValidationError as err:
        broken = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'document'}: {e['msg']}"
                           for e in err.errors(include_url=False))
        raise ValueError(f"the {document.get('command')!r} document breaks its contract: {broken}") from None


def _union(kinds) -> TypeAdapter:
    models = tuple(DOCUMENTS[k] for k in kinds)
    if len(models) == 1:
        return TypeAdapter(models[0])
    # a union of a tuple of models built at run time, which no static type expression spells
    return TypeAdapter(Annotated[Union[models], Field(discriminator="command")])  # noqa: UP007  # pyright: ignore[reportInvalidTypeForm, reportInvalidTypeArguments, reportArgumentType]


def schema_for(command: str | None = None) -> dict:
    """The JSON Schema (draft 2020-12, pydantic's ``model_json_schema``) of a command's ``--json`` documents.

    ``command``: a command (``"tpw"``: either of its documents, told apart by ``command``), a document kind
    (``"tpw --rho-sweep"``, ``"profile fit"``), or None for every document of every command.

    Raises
    ------
    KeyError
        When ``command`` is neither; the message lists the known names.
    """
    if command is None:
        kinds = tuple(DOCUMENTS)
    elif command in COMMANDS:
        kinds = COMMANDS[command]
    elif command in DOCUMENTS:
        kinds = (command,)
    else:
        known = sorted(set(COMMANDS) | set(DOCUMENTS))
        raise KeyError(f"unknown command {command!r}; known: {', '.join(known)}")
    schema = _union(kinds).json_schema()
    schema.setdefault("title", f"fleetopt {command or 'documents'}")
    schema["$comment"] = f"fleetopt JSON contract, schema_version {SCHEMA_VERSION}"
    return schema


def _type_text(prop: dict) -> str:
    """A JSON Schema property's type in a few characters (``number|null``, ``array of Pool``, ``"tpw"``)."""
    if "const" in prop:
        return _json_text(prop["const"])
    if "enum" in prop:
        return "|".join(_json_text(v) for v in prop["enum"])
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1].lstrip("_")
    if "anyOf" in prop:
        return "|".join(_type_text(p) for p in prop["anyOf"])
    if prop.get("type") == "array":
        return f"array of {_type_text(prop['items'])}" if "items" in prop else "array"
    return str(prop.get("type", "any"))


def _json_text(value) -> str:
    import json

    return json.dumps(value)


def top_level_fields(kind: str) -> list[tuple[str, str, bool, str]]:
    """The contract keys of a document kind: ``(name, JSON type, required, description)`` in model order (a
    deprecated 1.0 alias says so in its description)."""
    schema = document_model(kind).model_json_schema()
    required = set(schema.get("required", ()))
    return [(name, _type_text(prop), name in required, prop.get("description", ""))
            for name, prop in schema["properties"].items()]
