"""The JSON contract of every ``fleetopt`` command, defined once as pydantic models.

Every document a command writes with ``--json FILE|-`` carries the envelope :class:`Document`:
``schema_version`` (:data:`SCHEMA_VERSION`), ``command`` (the document's kind, e.g. ``"solve"``,
``"tpw --rho-sweep"``) and ``instance`` (the instance's name; null for a command without one: ``tpw`` context
sweep, ``bench``, ``profile fit``, ``catalog list``). The models below list the keys a consumer may rely on and
their types; a document may hold more keys (``extra="allow"``), which are details, not contract.

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

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.profiles import ReplicaUnit, replica_unit

__all__ = ["SCHEMA_VERSION", "Document", "PoolAnalytic", "PoolSimulated", "FleetAnalytic", "FleetSimulated", "Pool",
           "Fleet", "DOCUMENTS", "COMMANDS", "FRONTIER_KINDS", "FrontierDocument", "envelope", "with_envelope",
           "pool_analytic", "fleet_analytic",
           "pool_simulated", "fleet_simulated", "document_model", "validate_document", "check_document", "schema_for",
           "top_level_fields", "build", "InstanceSummary",
           "pool_identity", "physical_gpus", "usd_per_million_output_tokens",
           "SECONDS_PER_HOUR", "TOKENS_PER_MILLION", "fleet_output_tok_per_s"]

SCHEMA_VERSION = "2.3"
"""Version of the JSON contract (``docs/json.md`` has the changelog). 1.0: the documents before this contract
(the workflow commands wrote ``schema_version: 1``, the others none); 2.0: the envelope on every document,
``evaluate``'s ``fleets`` list, and the ``analytic`` / ``simulated`` sub-objects; 2.1: what a replica is
(``model``, ``gpus_per_replica``, ``physical_gpus_per_replica``, ``physical_gpus``, ``unit`` per pool and GPU
option, ``physical_gpus`` per fleet); 2.2: the headline in physical GPUs (``analytic.physical_gpus``,
``output_tok_per_s`` and ``usd_per_million_output_tokens`` per fleet; ``cost_per_hr``, ``power_kw``,
``output_tok_per_s``, ``tok_per_watt`` and ``usd_per_million_output_tokens`` per pool); 2.3: the
``pareto --axes cost,AXIS`` documents (:class:`FrontierDocument`; they wrote ``schema_version: 1`` outside the
contract), with the instance's SLO and each point's physical GPUs."""

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1.0e6


def usd_per_million_output_tokens(cost_per_hr: float, output_tok_per_s: float) -> float:
    """Dollars per million output tokens of a pool or fleet, :math:`C / (3600\\, r) \\cdot 10^6` for a cost
    :math:`C` in $/hr and an output rate :math:`r` in tokens/s (inf without output). The cost is what the
    profile prices (physical GPUs x $/GPU-hour for computed and fitted profiles).

    Examples
    --------
    One H100-SXM-80GB replica of Llama-3.1-70B at TP=8 ($4.02/GPU-hour x 8 = $32.16/hr) writing 2,000 tokens/s:
    32.16 / 7.2 = $4.4667 per million.

    >>> round(usd_per_million_output_tokens(32.16, 2000.0), 4)
    4.4667
    >>> usd_per_million_output_tokens(32.16, 0.0)
    inf
    """
    if not output_tok_per_s > 0:
        return float("inf")
    return cost_per_hr / (SECONDS_PER_HOUR * output_tok_per_s) * TOKENS_PER_MILLION

def _pool_unit(p: PoolResult, unit: ReplicaUnit | None) -> ReplicaUnit:
    """A pool's :class:`~fleetopt.models.profiles.ReplicaUnit`: ``unit`` (its profile's, when the caller has it),
    else that of the catalogue profile the pool names, else its GPUs over its replicas (one GPU without a
    replica), each a physical one."""
    if unit is not None:
        return unit
    from fleetopt.optimizer.io.catalog import load_catalog

    profile = load_catalog().profiles.get(p.profile)
    if profile is not None:
        return replica_unit(profile)
    n = p.gpus // p.replicas if p.replicas > 0 else 1
    return ReplicaUnit(n, n)


def pool_identity(p: PoolResult, unit: ReplicaUnit | None = None) -> dict:
    """The keys of a pool that say what it serves and what its replicas are: ``model`` (the profile's model
    label), ``gpus_per_replica``, ``physical_gpus_per_replica``, ``physical_gpus``, ``unit``, ``unit_note``
    (``unit``: the pool's profile's :func:`~fleetopt.models.profiles.replica_unit`, when the caller has it)."""
    u = _pool_unit(p, unit)
    return {"model": p.model, **u.to_json(), "physical_gpus": int(p.replicas) * u.physical_gpus_per_replica}


def physical_gpus(r: FleetResult, units: Mapping[str, ReplicaUnit] | None = None) -> int:
    """The physical GPUs of a fleet: per pool, replicas x the physical GPUs of one
    (:func:`~fleetopt.models.profiles.replica_unit`); ``units`` maps a pool's ``gpu`` to its profile's
    :func:`~fleetopt.models.profiles.replica_unit`, when the caller has them."""
    per = units or {}
    return sum(int(p.replicas) * _pool_unit(p, per.get(p.gpu)).physical_gpus_per_replica for p in r.pools)

Figure = Annotated[float | None, Field(description="null: infinite (an unstable queue) or undefined")]
Interval = Annotated[list[Figure], Field(min_length=2, max_length=2,
                                         description="95 % confidence interval [low, high] (high null: unbounded)")]


def _deprecated(alias_of: str) -> Any:
    """A kept 1.0 key: required in 2.0, marked deprecated in the schema, to go in 3.0."""
    return Field(description=f"deprecated alias of {alias_of} (schema 1.0); removed in 3.0",
                 json_schema_extra={"deprecated": True})


class _Open(BaseModel):
    """Strict types for the listed keys; more keys are welcome."""

    model_config = ConfigDict(extra="allow", strict=True)


class Document(_Open):
    """The envelope every ``--json`` document carries."""

    schema_version: Literal["2.3"] = Field(description="Version of this contract")
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


class Pool(_Open):
    """One pool of a fleet: its identity and its figures."""

    min_tokens: int
    max_tokens: int
    gpu: str
    model: str = Field(description="the model its profile serves (the profile's label)")
    replicas: int
    gpus: int = Field(description="GPUs counted, priced and powered: replicas x gpus_per_replica")
    gpus_per_replica: int
    physical_gpus_per_replica: int = Field(description="physical GPUs one replica's constants describe (TP)")
    physical_gpus: int = Field(description="replicas x physical_gpus_per_replica")
    unit: _Unit
    phase: Literal["both", "prefill", "decode"] = Field(
        "both", description="what its replicas do: both (aggregated), or prefill / decode (the two pools of a "
                    "disaggregated pair over the same segment, prefill first)")
    analytic: PoolAnalytic
    simulated: PoolSimulated | None
    arrival_rate: float = _deprecated("analytic.arrival_rate")
    utilization: Figure = _deprecated("analytic.utilization")
    ttft_p99_ms: Figure = _deprecated("analytic.ttft_p99_ms")
    power_w: Figure = _deprecated("analytic.power_w")
    slo_met: bool = _deprecated("analytic.slo_met")


class SimulatedPool(Pool):
    """A pool of ``simulate``: both sub-objects."""

    simulated: PoolSimulated
    ttft_p99_ms_sim: Figure = _deprecated("simulated.ttft_p99_ms")
    slo_met_sim: bool = _deprecated("simulated.slo_met")


class Fleet(_Open):
    """An analytically evaluated fleet (``evaluate``'s fleets and baseline, ``solve``'s solutions)."""

    pools: list[Pool]
    physical_gpus: int = Field(description="physical GPUs of every pool (total_gpus counts priced GPUs)")
    usd_per_million_output_tokens: Figure = Field(description="analytic.usd_per_million_output_tokens: the "
                                                              "headline $ per million output tokens")
    analytic: FleetAnalytic
    simulated: FleetSimulated | None
    cost_per_hr: float = _deprecated("analytic.cost_per_hr")
    total_gpus: int = _deprecated("analytic.total_gpus")
    power_kw: Figure = _deprecated("analytic.power_kw")
    ttft_p99_ms: Figure = _deprecated("analytic.ttft_p99_ms")
    slo_met: bool = _deprecated("analytic.slo_met")
    feasible: bool = _deprecated("analytic.feasible")


# --------------------------------------------------------------------------------------------
# Builders of the figure sub-objects (the keys above are their only definition)
# --------------------------------------------------------------------------------------------


def _plain(value):
    """numpy scalars to Python ones, tuples to lists (the models are strict)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
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


def fleet_output_tok_per_s(r: FleetResult) -> float:
    """Output tokens per second of a fleet: the sum over its pools."""
    return float(sum(p.output_tok_per_s for p in r.pools))


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


class EvaluatedFleet(Fleet):
    """One fleet given to ``evaluate``, judged against the instance's limits."""

    fleet: str = Field(description="the fleet spec, LO-HI:GPUxN,...")
    violations: list[str] = Field(description="every instance limit it breaks")


class _Baseline(Fleet):
    violations: list[str]


class EvaluateDocument(Document):
    """``fleetopt evaluate``: every given fleet (always a list) and the homogeneous baseline."""

    command: Literal["evaluate"]
    instance: str
    ttft_model: str
    slo_ttft_p99_ms: float
    max_utilization: float
    truncated_share: float
    fleets: list[EvaluatedFleet] = Field(min_length=1)
    baseline: _Baseline | None


class _Objective(_Open):
    name: str
    value: float | None
    unit: str
    bound: float | None


class _Solution(Fleet):
    rank: int
    objective: float
    fleet: str | None = Field(description="the fleet spec, LO-HI:GPUxN,...; null for a split-routing plan, whose "
                              "pools overlap (its routing says how)")
    routing: dict | None


class _Candidates(_Open):
    generated: int
    feasible: int
    after_pruning: int
    dropped: list[str]


class SolveDocument(Document):
    """``fleetopt solve``: the chosen plan's fleet at top level (null without a plan), every solution."""

    command: Literal["solve"]
    instance: str
    overrides: list[str]
    status: str
    method: str
    explanation: str
    objective: _Objective
    fleet: str | None
    routing: dict | None
    pools: list[Pool] | None
    physical_gpus: int | None = Field(description="physical GPUs of the plan (null without a plan)")
    usd_per_million_output_tokens: Figure = Field(description="the plan's $ per million output tokens "
                                                              "(analytic.usd_per_million_output_tokens; null "
                                                              "without a plan)")
    analytic: FleetAnalytic | None
    simulated: FleetSimulated | None
    baseline: _Baseline | None
    warnings: list[str]
    solve_seconds: float
    mip_gap: float | None
    slo_ttft_p99_ms: float
    ttft_margin: float = Field(description="share of the SLO the plans were sized to keep free (slo.ttft_margin; 0 "
                                           "with --verify-top)")
    ttft_sizing_ms: float = Field(description="the P99 TTFT the candidates were sized to: the SLO less the margin")
    solutions: list[_Solution]
    verified: bool | None = Field(description="null without --verify-top")
    provenance: dict
    candidates: _Candidates | None = Field(None, description="the candidate pools generated, feasible and kept")
    cost_per_hr: float | None = Field(None,
                                      description="deprecated alias of analytic.cost_per_hr (null without a plan)")
    cost_per_year: float | None = Field(None, description="deprecated alias of analytic.cost_per_year")
    total_replicas: int | None = Field(None, description="deprecated alias of analytic.total_replicas")
    total_gpus: int | None = Field(None, description="deprecated alias of analytic.total_gpus")
    power_kw: Figure = Field(None, description="deprecated alias of analytic.power_kw")
    tok_per_watt: Figure = Field(None, description="deprecated alias of analytic.tok_per_watt")
    ttft_p99_ms: Figure = Field(None, description="deprecated alias of analytic.ttft_p99_ms")


class SimulateDocument(Document):
    """``fleetopt simulate``: one fleet simulated, next to its analytic figures."""

    command: Literal["simulate"]
    instance: str
    pools: list[SimulatedPool]
    analytic: FleetAnalytic
    simulated: FleetSimulated
    slo_ttft_p99_ms: float
    slo_tpot_p99_ms: float | None
    requests_simulated: int
    seed: int
    replications: int
    confidence: float
    options: dict
    notes: list[str]
    ttft_p99_ms: Figure = _deprecated("simulated.ttft_p99_ms")
    ttft_p99_ci_ms: Interval = _deprecated("simulated.ttft_p99_ci_ms")
    slo_met: bool = _deprecated("simulated.slo_met")
    power_kw: Figure = _deprecated("simulated.power_kw")


class _RouterRun(_Open):
    router: str
    slo_met: bool
    report: SimulateDocument


class SimulateRoutersDocument(Document):
    """``fleetopt simulate --routers``: one simulation per router on the same request stream."""

    command: Literal["simulate --routers"]
    instance: str
    fleet: str
    seed: int
    stream_sha256: str
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


class _FrontierPoint(_Open):
    """One point of a ``pareto --axes`` curve: an optimal plan of a re-solve, re-judged on the instance itself."""

    rank: int = Field(description="1-based, by increasing cost")
    fleet: str = Field(description="the plan's fleet spec, LO-HI:GPUxN,... (one entry per pool)")
    cost_per_hr: float
    cost_per_year: float
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
    recommended: bool
    knee: bool


class FrontierDocument(Document):
    """``fleetopt pareto --axes cost,AXIS``: the exact least-cost curve against power, P99 TTFT or pools."""

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
    recommended_reason: str
    knee_index: int | None = Field(description="0-based index into points of the knee (an alternative)")
    baseline: _FrontierPoint | None = Field(description="the homogeneous baseline (its rank 0, never recommended)")
    baseline_dominated: bool | None
    solves: int
    solve_seconds: float
    truncated: bool
    overrides: list[str]


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


class _DiffPlan(_Open):
    file: str
    command: Literal["solve", "evaluate", "simulate"]
    instance: str | None
    plan: str = Field(description="which plan of the file: the selected plan, plan N, fleet N, the simulated fleet")
    fleet: str | None
    overrides: list[str]
    slo_ttft_p99_ms: float | None
    arrival_rate: Figure = Field(description="req/s: the sum of its pools' analytic arrival_rate (decode rows out)")
    physical_gpus: int
    total_replicas: int
    cost_per_hr: float
    cost_per_year: float
    power_kw: Figure
    tok_per_watt: Figure
    usd_per_million_output_tokens: Figure
    slo_met: bool | None
    slo_source: Literal["analytic", "simulated"]
    ttft_p99_ms: Figure
    ttft_p99_ci_ms: Interval | None = Field(description="simulated only: the P99 TTFT's 95 % interval")


class _DiffDelta(_Open):
    physical_gpus: int
    total_replicas: int
    cost_per_hr: float
    cost_per_year: float
    power_kw: Figure
    tok_per_watt: Figure
    usd_per_million_output_tokens: Figure


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


class _Scenario(_Open):
    index: int
    key: str
    overrides: dict
    status: str


class WhatIfDocument(Document):
    """``fleetopt whatif``: the base solve and one re-solve per scenario of the grid."""

    command: Literal["whatif"]
    instance: str
    slo_ttft_p99_ms: float
    sweeps: list[dict]
    base: dict
    scenarios: list[_Scenario]


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
              TpwDocument, RhoSweepDocument, BenchDocument, ParetoDocument, FrontierDocument, HeadroomDocument,
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
