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

Where the models live
---------------------
This module declares the envelope, the figure sub-objects, pools and fleets, and the registry (:data:`COMMANDS`,
:func:`document_model`, :func:`schema_for`); each command's documents are declared in the module of its commands
(:data:`MODULES`: ``plan`` for validate, evaluate and solve, ``simulation`` for simulate, ``workflows`` for the
others), imported when one of its documents is first built or checked.

:func:`schema_for` gives the JSON Schema (``fleetopt schema [COMMAND]``); :func:`validate_document` checks a
document against its model (strict types: an integer field rejects 3.0, a boolean rejects 1).
"""

# No ``from __future__ import annotations`` here: pydantic would then evaluate every field's annotation from its
# string, about 20 ms of each document-writing command's start on a 2-core machine (the annotations are evaluated
# by the interpreter at class creation instead; the JSON Schemas are the same byte for byte).

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.profiles import ReplicaUnit

# the figures and layout constants the documents hold, declared without pydantic (the text output reads them too)
from fleetopt.optimizer.output.figures import (DROPPED_LINES, SECONDS_PER_HOUR, TOKENS_PER_MILLION,
                                               fleet_output_tok_per_s, physical_gpus, pool_identity,
                                               usd_per_million_output_tokens)

__all__ = ["SCHEMA_VERSION", "Document", "PoolAnalytic", "PoolSimulated", "FleetAnalytic", "FleetSimulated", "Pool",
           "Fleet", "COMMANDS", "KINDS", "MODULES", "FRONTIER_KINDS", "DROPPED_LINES", "envelope", "with_envelope",
           "pool_analytic", "fleet_analytic", "pool_simulated", "fleet_simulated", "documents", "document_model",
           "validate_document", "check_document", "schema_for", "top_level_fields", "build", "pool_identity",
           "physical_gpus",
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
    >>> from fleetopt.optimizer.output.contract.plan import _ValidatePools
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
# The documents, one per command (and variant), each declared in the module of its commands
# --------------------------------------------------------------------------------------------

FRONTIER_KINDS = ("pareto --axes cost,power", "pareto --axes cost,ttft", "pareto --axes cost,pools")
"""The ``command`` values of the ``pareto --axes`` documents, one per second axis."""

COMMANDS: dict[str, tuple[str, ...]] = {
    "validate": ("validate",), "evaluate": ("evaluate",), "solve": ("solve",),
    "simulate": ("simulate", "simulate --routers"), "tpw": ("tpw", "tpw --rho-sweep"), "bench": ("bench",),
    "pareto": ("pareto --split-table", *FRONTIER_KINDS), "headroom": ("headroom", "headroom --range"),
    "whatif": ("whatif",), "gridflex": ("gridflex",), "profile": ("profile fit",), "catalog": ("catalog list",),
    "diff": ("diff",)}
"""Each command and the document kinds its ``--json`` writes (``export`` writes deployment files, not JSON)."""

KINDS: tuple[str, ...] = tuple(kind for kinds in COMMANDS.values() for kind in kinds)
"""Every document kind (a document's ``command`` value)."""

_OWN_MODULE = {"validate": "plan", "evaluate": "plan", "solve": "plan", "simulate": "simulation"}
MODULES: dict[str, str] = {command: _OWN_MODULE.get(command, "workflows") for command in COMMANDS}
"""The module of this package that declares each command's document models (its ``DOCUMENTS``): a command loads
its own document's models only (``fleetopt solve --json``: 36 of the contract's 103 classes, 20 ms instead of 45-60
ms of its start on a 2-core machine)."""


def _declared_in(module: str) -> dict[str, type[Document]]:
    """The ``DOCUMENTS`` of this package's ``module``."""
    import importlib

    return importlib.import_module(f"{__name__}.{module}").DOCUMENTS


def documents() -> dict[str, type[Document]]:
    """Each document kind (its ``command`` value) and its model, every command's (in :data:`COMMANDS`' order)."""
    out: dict[str, type[Document]] = {}
    for module in dict.fromkeys(MODULES.values()):
        out |= _declared_in(module)
    return out


def document_model(command: str | None) -> type[Document]:
    """The model of the document kind ``command`` (a ``command`` value, e.g. ``"tpw --rho-sweep"``).

    Raises
    ------
    KeyError
        When no document has that kind; the message lists the known ones.
    """
    owner = next((c for c, kinds in COMMANDS.items() if command in kinds), None)
    model = _declared_in(MODULES[owner]).get(command) if owner is not None and command is not None else None
    if model is None:
        raise KeyError(f"unknown document kind {command!r}; known: {', '.join(KINDS)}")
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
    models = tuple(document_model(k) for k in kinds)
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
        kinds = tuple(documents())
    elif command in COMMANDS:
        kinds = COMMANDS[command]
    elif command in KINDS:
        kinds = (command,)
    else:
        known = sorted(set(COMMANDS) | set(KINDS))
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
