"""Instances: the validated, resolved records fleetopt plans for, and how they are built.

An *instance* says what to plan for: the workload (a length CDF or a request
trace, and an arrival rate), the latency SLO, the GPU options, how the context
range may be split into pools, fleet-wide constraints and the objective. A
minimal YAML instance::

    workload: {cdf: builtin:lmsys, arrival_rate: 100}
    slo: {ttft_p99_ms: 500}
    gpus:
      - {name: h100, profile: H100-80GB}
    pools: {max_pools: 2, max_context: 65536}

Input is checked once, at the edge, in two passes:

1. *structure* (:mod:`fleetopt.optimizer.io.schema`): pydantic models (``extra="forbid"``,
   strict types) check keys, types and ranges at every level;
2. *meaning* (this module): files are read (:mod:`fleetopt.optimizer.io.workloads`),
   catalogue names are looked up and profiles are built
   (:mod:`fleetopt.optimizer.io.gpu_options`), boundaries are resolved and cross-field
   rules are applied.

``--set`` overrides (:mod:`fleetopt.optimizer.io.overrides`) are applied before both.
Every problem of both passes is collected, then one
:class:`~fleetopt.optimizer.errors.InstanceError` is raised with one line per problem,
``<file>: <field>: <what is wrong>; <what is allowed>``. Nothing outside these
modules needs to re-check an :class:`Instance`.

Units: rates in requests per second, latencies in seconds inside (ms in the
file), lengths in tokens; ``max_count``, ``min_count`` and ``max_total_gpus``
count GPUs as the option prices them (replicas x ``gpus_per_replica``): physical
GPUs for computed and fitted options, one per replica for the seeds' calibrated
TP=8 units (8 physical GPUs each; :func:`gpu_warnings` says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fleetopt.models.fleet import sizing_target_s
from fleetopt.models.profiles import ServingProfile
from fleetopt.models.semantic import ShareRule, large_model_share
from fleetopt.models.units import MS_PER_S
from fleetopt.models.workload import LengthDistribution, RequestTrace

from fleetopt.optimizer.errors import InstanceError
from fleetopt.models.profiles import replica_unit, served_model
from fleetopt.optimizer.io.gpu_options import Configuration, check_context_fits, resolve_gpus
from fleetopt.optimizer.io.overrides import apply_overrides, attributed_field, overridden_copy
from fleetopt.optimizer.io.schema import (
    DEFAULT_MAX_UTILIZATION,
    Problems,
    RawConstraints,
    RawInstance,
    RawKVTransfer,
    RawPools,
    RawSemantic,
    RawSlo,
    RawWorkload,
    allowed_keys,
    gpu_choices,
    show_value,
    structure_problems,
    validate_section,
)
from fleetopt.optimizer.io.workloads import TRACE_COLUMNS, LoadedWorkload, load_workload, read_instance_file

if TYPE_CHECKING:   # the disaggregated pairs' model loads when an instance allows pairs (_kv_transfers)
    from fleetopt.models.queueing.disagg import KVTransfer

__all__ = [
    "Instance",
    "GpuOption",
    "GpuInventory",
    "Configuration",
    "WorkloadSpec",
    "SLO",
    "PoolsSpec",
    "Constraints",
    "SemanticSpec",
    "load_instance",
    "instance_from_dict",
    "apply_overrides",
    "DEFAULT_MAX_UTILIZATION",
    "DEFAULT_TTFT_MARGIN",
    "TRACE_COLUMNS",
    "default_grid_tokens",
    "gpu_warnings",
]

_GRID_START_TOKENS = 64

DEFAULT_TTFT_MARGIN = {"batched": 0.03, "tail": 0.0, "mean-prefill": 0.0}
"""``slo.ttft_margin`` when the instance gives none, by TTFT model: the share of the P99 TTFT SLO an analytic plan
keeps free for the model's error and the simulator's resolution (``docs/models.md``, "The sizing margin").

``batched``: 3 %. A plan an accurate model sizes to the SLO's edge passes "the simulated P99's 95 % interval
below the SLO" only by chance. On the 105 agreement pools within the default utilisation cap the simulated P99
is above the model's by more than 3 % for 11 % of them (by more than 5 % for 7 %, 10 % for 2 %), part of it
the runs' own noise; a 150,000-request run's interval reaches 1-3 % above its point. ``tail`` and
``mean-prefill`` (the slot models; ``mean-prefill`` reproduces the seeds' tables) keep 0: their errors are of
another order (``docs/models.md``), which no margin of a few percent repairs."""


# --------------------------------------------------------------------------------------------
# Resolved records (what the rest of fleetopt consumes)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuOption:
    """One GPU option the planner may buy.

    ``max_count`` and ``min_count`` count the GPUs the option prices: a replica of ``profile`` counts
    ``profile.gpus_per_replica`` (its physical GPUs for computed and fitted profiles, 1 for the seeds'
    calibrated TP=8 units of 8 physical GPUs); ``max_count`` None means unlimited.
    ``availability`` is the share of time a GPU is up, in (0, 1]. ``kind`` is
    ``"calibrated"`` or ``"computed"``.
    """

    name: str
    profile: ServingProfile
    max_count: int | None
    min_count: int
    availability: float
    kind: str
    min_pools: int = 0
    max_pools: int | None = None
    inventory: str = ""
    """The ``gpus`` entry whose limits this option draws on (:class:`GpuInventory`); empty: its own name. A
    configuration of an entry with ``tp``/``dtype`` lists (``h100/tp4/fp8``) carries the entry's ``max_count`` and
    ``max_pools`` (each also holds for one configuration alone) and no lower bound: the entry's limits bind the
    sum over its configurations, in :attr:`Instance.inventories`."""

    @property
    def inventory_name(self) -> str:
        """The ``gpus`` entry this option belongs to (its own name when it is not a configuration of a list)."""
        return self.inventory or self.name


@dataclass(frozen=True)
class GpuInventory:
    """One ``gpus`` entry as a set of GPU options sharing its limits.

    ``max_count``/``min_count`` (GPUs as the options price them) and ``max_pools``/``min_pools`` bind the *sum*
    over ``options``: an entry ``{name: h100, tp: [4, 8], max_count: 16}`` may run one TP=8 and two TP=4 replicas,
    not 16 GPUs of each. ``index`` is the entry's position in the file's ``gpus`` list; ``configurations`` every
    (tp, dtype) combination of an entry with lists, with the option it became or why it does not fit (empty for
    an entry of one configuration).
    """

    name: str
    index: int
    options: tuple[str, ...]
    max_count: int | None
    min_count: int
    min_pools: int = 0
    max_pools: int | None = None
    configurations: tuple[Configuration, ...] = ()


@dataclass(frozen=True)
class WorkloadSpec:
    """The request stream.

    ``lengths`` is already truncated to ``pools.max_context``; ``truncated_share``
    is the share of requests that were longer and got cut. ``source`` is
    ``builtin:NAME``, the resolved file path or ``inline``. For a trace,
    ``input_fraction`` is the trace's own prompt share of all tokens.
    """

    kind: str
    source: str
    lengths: LengthDistribution | RequestTrace
    truncated_share: float
    arrival_rate_req_per_s: float
    input_fraction: float


@dataclass(frozen=True)
class SLO:
    """Latency targets in seconds (P99), the TTFT model and its scope.

    ``ttft_margin`` is the share of ``ttft_p99_s`` an analytic plan keeps free: candidates are sized to
    :attr:`ttft_sizing_s`, and every figure is judged against ``ttft_p99_s``."""

    ttft_p99_s: float
    ttft_model: str
    scope: str
    tpot_p99_s: float | None
    ttft_margin: float = 0.0

    @property
    def ttft_sizing_s(self) -> float:
        """The P99 TTFT the analytic sizing aims at (:func:`fleetopt.models.fleet.sizing_target_s`)."""
        return sizing_target_s(self.ttft_p99_s, self.ttft_margin)

    def sizing_text(self) -> str:
        """The sizing target in words: ``the 500 ms SLO``, or ``485 ms (the 500 ms SLO less its 3 % margin)``."""
        slo_ms = self.ttft_p99_s * MS_PER_S
        if not self.ttft_margin:
            return f"the {slo_ms:,.0f} ms SLO"
        return (f"{self.ttft_sizing_s * MS_PER_S:,.0f} ms (the {slo_ms:,.0f} ms SLO less its "
                f"{100 * self.ttft_margin:g} % margin)")

    def without_margin(self) -> SLO:
        """This SLO sized to its own value (``ttft_margin`` 0): what a plan checked in simulation is sized to."""
        return replace(self, ttft_margin=0.0)


@dataclass(frozen=True)
class PoolsSpec:
    """Pool search space: ``boundaries`` starts with 0, ends with ``max_context_tokens``, increases strictly."""

    max_pools: int
    max_context_tokens: int
    boundaries: tuple[int, ...]
    routing: str
    compress_gammas: tuple[float, ...] = ()
    """Compress-and-route factors the optimizer may use (empty: off)."""
    compress_success: float = 1.0
    """Probability that compressing a request to a pool's window succeeds."""
    disaggregation: str = "none"
    """Disaggregated prefill/decode pairs: ``none`` (aggregated pools only), ``allow`` (a segment may be served by
    an aggregated pool or a pair) or ``only`` (pairs only)."""
    kv_transfers: tuple[tuple[tuple[str, str], KVTransfer], ...] = ()
    """The KV transfer of every (prefill option, decode option) pair of one model (``pools.kv_transfer`` resolved
    against each side's profile and link figures); empty without disaggregation."""
    pd_sizing: str = "model"
    """``model`` (fleetopt's stations) or ``reference`` (the reference tool's throughput matching, for reproducing
    its Puzzle 7)."""

    def transfer(self, prefill: str, decode: str) -> KVTransfer | None:
        """The KV transfer of the pair (prefill option, decode option); None when they are no pair."""
        return dict(self.kv_transfers).get((prefill, decode))


@dataclass(frozen=True)
class Constraints:
    """Fleet-wide limits; None means no limit."""

    max_utilization: float
    max_power_kw: float | None
    max_cost_per_hr: float | None
    max_total_gpus: int | None


@dataclass(frozen=True)
class SemanticSpec:
    """Multi-model (semantic) routing (the file's ``semantic`` section, docs/multi_model.md).

    A classifier sends the share :math:`\\alpha(L)` of the requests of total length :math:`L` to ``small_model``
    and the rest to ``large_model`` (names as :func:`~fleetopt.models.profiles.served_model` gives them); every GPU
    option serves one of the two. ``rules`` holds the one fixed rule (``share``), or with ``decide`` the candidate
    rules the planner chooses among (``shares``), each meeting ``min_large_share`` (the others are left out and
    named in ``dropped``): the large model's share of all requests, :math:`1 - \\pi_{small}`
    (:func:`~fleetopt.models.semantic.large_model_share`), is at least ``min_large_share``. ``labels`` say how
    each rule was written and ``large_shares`` give its :math:`1 - \\pi_{small}` on this instance's workload."""

    small_model: str
    large_model: str
    rules: tuple[ShareRule, ...]
    labels: tuple[str, ...]
    large_shares: tuple[float, ...]
    decide: bool = False
    min_large_share: float | None = None
    dropped: tuple[str, ...] = ()
    """The candidate rules that break ``min_large_share``, with their large-model share."""

    def model_of(self, role: str) -> str:
        """The model of class ``role`` (``small`` or ``large``)."""
        return self.small_model if role == "small" else self.large_model


@dataclass(frozen=True)
class Instance:
    """A validated, resolved instance."""

    path: Path | None
    name: str
    workload: WorkloadSpec
    slo: SLO
    gpus: tuple[GpuOption, ...]
    pools: PoolsSpec
    constraints: Constraints
    objective: str
    description: str = ""
    energy_usd_per_kwh: float | None = None
    pue: float = 1.0
    overrides: tuple[str, ...] = ()
    """The ``--set PATH=VALUE`` strings it was loaded with, in order (:mod:`fleetopt.optimizer.io.overrides`); a command
    that re-runs the instance (``fleetopt simulate ...``) or a plan file solved for it must carry the same."""
    allow_mixed_models: bool = False
    """The GPU options may serve different models (the file's ``allow_mixed_models: true``; else rejected)."""
    inventories: tuple[GpuInventory, ...] = ()
    """The ``gpus`` entries as groups of options sharing their limits (:meth:`gpu_inventories`)."""
    semantic: SemanticSpec | None = None
    """Multi-model (semantic) routing (:class:`SemanticSpec`); None: one model class, routed by length."""

    def gpu_inventories(self) -> tuple[GpuInventory, ...]:
        """The inventories of the GPU options: :attr:`inventories`, or one per option when it is empty (an instance
        built by hand)."""
        if self.inventories:
            return self.inventories
        return tuple(GpuInventory(g.name, k, (g.name,), g.max_count, g.min_count, g.min_pools, g.max_pools)
                     for k, g in enumerate(self.gpus))

    def inventory_of_options(self) -> np.ndarray:
        """For each GPU option (in :attr:`gpus` order) the index of its inventory in :meth:`gpu_inventories`."""
        where = {name: k for k, inv in enumerate(self.gpu_inventories()) for name in inv.options}
        return np.array([where[g.name] for g in self.gpus], dtype=np.int64)

    def inventory(self, option: str) -> GpuInventory:
        """The inventory GPU option ``option`` belongs to."""
        name = self.gpu(option).name
        return next(inv for inv in self.gpu_inventories() if name in inv.options)

    def gpu(self, name: str) -> GpuOption:
        """The GPU option called ``name`` (case-insensitive).

        Raises
        ------
        InstanceError
            When no option has that name; the message lists the known names.
        """
        for option in self.gpus:
            if option.name.lower() == name.strip().lower():
                return option
        known = ", ".join(g.name for g in self.gpus)
        raise InstanceError.at(self.path, "gpus", f"unknown gpu {name!r}; known: {known}")


def _workload_spec(loaded: LoadedWorkload, max_context_tokens: int) -> WorkloadSpec:
    """Cut requests at the context window; a trace's input fraction is its own prompt share."""
    cut, share = loaded.lengths.truncated(max_context_tokens)
    if isinstance(cut, RequestTrace):
        fraction = float(np.sum(cut.prompt_tokens) / np.sum(cut.total_tokens))
    else:
        assert loaded.input_fraction is not None        # None only for a trace (LoadedWorkload)
        fraction = loaded.input_fraction
    return WorkloadSpec(loaded.kind, loaded.source, cut, share, loaded.arrival_rate_req_per_s, fraction)


def _gpu_options(data: dict, problems: Problems, catalog_section=None
                 ) -> tuple[list[GpuOption], tuple[GpuInventory, ...]] | None:
    """Every GPU option (see :mod:`fleetopt.optimizer.io.gpu_options`) and the inventories they share, or None when
    any entry has a problem; names resolve in the catalogue in effect extended by the instance's ``catalog:`` value
    ``catalog_section``."""
    resolved = resolve_gpus(data, problems, catalog_section)
    if resolved is None:
        return None
    options, members = [], {}
    for r in resolved:
        raw, alone = r.raw, not r.configurations
        options.append(GpuOption(r.name, r.profile, raw.max_count, raw.min_count if alone else 0, raw.availability,
                                 r.kind, raw.min_pools if alone else 0, raw.max_pools, inventory=raw.name))
        members.setdefault(r.index, (raw, r.configurations, []))[2].append(r.name)
    inventories = tuple(GpuInventory(raw.name, index, tuple(names), raw.max_count, raw.min_count, raw.min_pools,
                                     raw.max_pools, configurations)
                        for index, (raw, configurations, names) in sorted(members.items()))
    return options, inventories


# --------------------------------------------------------------------------------------------
# Pools (pass 2)
# --------------------------------------------------------------------------------------------


def default_grid_tokens(max_context_tokens: int) -> tuple[int, ...]:
    """Powers of two and 1.5x powers of two from 64, below ``max_context_tokens``.

    Examples
    --------
    >>> default_grid_tokens(1000)
    (64, 96, 128, 192, 256, 384, 512, 768)
    """
    grid, power = [], _GRID_START_TOKENS
    while power < max_context_tokens:
        grid += [t for t in (power, power * 3 // 2) if t < max_context_tokens]
        power *= 2
    return tuple(grid)


def _auto_boundaries(lengths, max_context_tokens: int) -> tuple[int, ...]:
    if isinstance(lengths, LengthDistribution):
        points = {int(round(t)) for t in lengths.breakpoints}
        return tuple(sorted(t for t in points if 0 < t < max_context_tokens))
    return default_grid_tokens(max_context_tokens)


def _explicit_boundaries(value: Any, max_context_tokens: int, problems: Problems) -> tuple[int, ...] | None:
    field = "pools.boundaries"
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        problems.add(field, f"{show_value(value, spell_lists=True)} is not allowed; "
                            "give auto or a list of whole token counts")
        return None
    outside = [v for v in value if not 0 < v < max_context_tokens]
    if outside:
        problems.add(field, f"{outside[0]} is outside (0, {max_context_tokens}); give inner boundaries only "
                            "(0 and max_context are added)")
    steps = [i for i in range(1, len(value)) if value[i] <= value[i - 1]]
    if steps:
        i = steps[0]
        problems.add(field, f"not increasing: entry {i} ({value[i]}) follows {value[i - 1]}; "
                            "list boundaries in strictly increasing order")
    return None if outside or steps else tuple(value)


def _resolve_boundaries(raw: RawPools, lengths, problems: Problems) -> tuple[int, ...] | None:
    value = raw.boundaries
    if isinstance(value, str) and value.strip().lower() == "auto":
        if lengths is None:
            return None
        inner = _auto_boundaries(lengths, raw.max_context)
    else:
        inner = _explicit_boundaries(value, raw.max_context, problems)
        if inner is None:
            return None
    return (0, *inner, raw.max_context)


# --------------------------------------------------------------------------------------------
# Assembly
# --------------------------------------------------------------------------------------------


def _slo(raw: RawSlo) -> SLO:
    tpot = None if raw.tpot_p99_ms is None else raw.tpot_p99_ms / MS_PER_S
    margin = DEFAULT_TTFT_MARGIN[raw.ttft_model] if raw.ttft_margin is None else raw.ttft_margin
    return SLO(raw.ttft_p99_ms / MS_PER_S, raw.ttft_model, raw.scope, tpot, float(margin))


def _constraints(raw: RawConstraints) -> Constraints:
    return Constraints(raw.max_utilization, raw.max_power_kw, raw.max_cost_per_hr, raw.max_total_gpus)


def _cross_field_problems(data: dict, workload, problems: Problems) -> None:
    """Rules that tie several sections together (checked once every section is valid on its own)."""
    raw = RawInstance.model_validate(data)
    if raw.objective == "cost+power" and raw.energy is None:
        problems.add("objective", "'cost+power' needs an energy section; add energy: {usd_per_kwh: ..., pue: ...}")
    comp = raw.pools.compress
    if comp is not None and workload is not None and workload.kind == "cdf":
        limit = 1.0 / (1.0 - workload.input_fraction)
        for k, g in enumerate(comp.gammas):
            if g >= limit:
                problems.add(f"pools.compress.gammas[{k}]", f"{g:g} is too large: with input_fraction "
                             f"{workload.input_fraction:g} the outputs alone would fill the window; "
                             f"allowed: < {limit:g}")
    for k, g in enumerate(raw.gpus):
        if g.max_pools is not None and g.min_pools > g.max_pools:
            problems.add(f"gpus[{k}].min_pools", f"{g.min_pools} exceeds max_pools {g.max_pools}")
    for k, g in enumerate(raw.gpus):
        listed = g.hardware is not None and gpu_choices(g)[2]
        if raw.pools.routing == "split" and listed and (g.max_count is not None or g.min_count):
            problems.add(f"gpus[{k}].max_count", "'split' routing cannot yet share one inventory among the tp/dtype "
                                                 "configurations of an entry; give one tp and dtype, or drop "
                                                 "max_count/min_count, or use length routing")
    if raw.pools.routing == "split" and raw.slo.scope == "fleet":
        problems.add("pools.routing", "'split' routing works with slo.scope 'pool' only")
    if raw.pools.routing == "split" and comp is not None:
        problems.add("pools.routing", "'split' routing and pools.compress cannot be combined; choose one")
    if raw.pools.disaggregation != "none":
        if raw.pools.routing == "split":
            problems.add("pools.disaggregation", "disaggregated prefill/decode pairs need routing: length ('split' "
                                                 "routing cannot yet send a share of a segment to a pair)")
        if comp is not None:
            problems.add("pools.disaggregation", "disaggregated prefill/decode pairs cannot be combined with "
                                                 "pools.compress (compress-and-route); drop one of them")
    if raw.pools.pd_sizing == "reference" and raw.pools.disaggregation != "none":   # unused without pairs
        kv = raw.pools.kv_transfer
        if kv is None or kv.model != "seed-factor":
            problems.add("pools.pd_sizing", "'reference' (the reference tool's convention) needs "
                                            "pools.kv_transfer: {model: seed-factor}")
        if workload is not None and workload.kind != "cdf":
            problems.add("pools.pd_sizing", "'reference' reads a CDF workload's mean length; this workload is a "
                                            f"{workload.kind}")
        if raw.slo.tpot_p99_ms is None:
            problems.add("pools.pd_sizing", "'reference' checks the TPOT SLO; give slo.tpot_p99_ms")


def _kv_transfers(raw: RawPools, options: Sequence[GpuOption], catalog_section, problems: Problems
                  ) -> tuple[tuple[tuple[str, str], KVTransfer], ...]:
    """The KV transfer of every (prefill, decode) pair of options serving one model (``profile.model_name``).

    ``seed-factor``: the factor alone. ``bandwidth``: KV bytes per token from the prefill profile (or
    ``kv_bytes_per_token``) and the bandwidth from ``bandwidth_gb_per_s`` or the catalogue's link figures of both
    sides' hardware (:func:`fleetopt.models.queueing.disagg.link_bandwidth_bytes_per_s`); a calibrated profile has
    neither, which is one problem naming the field to give."""
    if raw.disaggregation == "none":
        return ()
    from fleetopt.models.queueing.disagg import KVTransfer, kv_bytes_per_token, link_bandwidth_bytes_per_s

    kv = raw.kv_transfer if raw.kv_transfer is not None else RawKVTransfer()
    pairs = [(p, d) for p in options for d in options if p.profile.model_name == d.profile.model_name]
    if kv.model == "seed-factor":
        x = KVTransfer(model="seed-factor", factor=kv.factor)
        return tuple(((p.name, d.name), x) for p, d in pairs)
    links = _link_figures(options, catalog_section)
    out, missing = [], {}
    for p, d in pairs:
        try:
            per_token = kv.kv_bytes_per_token or kv_bytes_per_token(p.profile)
        except ValueError:
            missing.setdefault("kv_bytes_per_token", p.name)
            continue
        if kv.bandwidth_gb_per_s is not None:
            bw = kv.bandwidth_gb_per_s * 1e9
        else:
            (pn, pnet), (dn, dnet) = links.get(p.name, (None, None)), links.get(d.name, (None, None))
            try:
                bw = link_bandwidth_bytes_per_s(same_node=kv.link == "nvlink",
                                                prefill_gpus=p.profile.physical_gpus_per_replica,
                                                decode_gpus=d.profile.physical_gpus_per_replica,
                                                prefill_nvlink_bytes_per_s=pn, decode_nvlink_bytes_per_s=dn,
                                                prefill_network_bytes_per_s=pnet, decode_network_bytes_per_s=dnet)
            except ValueError:
                missing.setdefault("bandwidth_gb_per_s", p.name if (pn, pnet) == (None, None) else d.name)
                continue
        out.append(((p.name, d.name), KVTransfer(model="bandwidth", kv_bytes_per_token=float(per_token),
                                                 bandwidth_bytes_per_s=float(bw), latency_s=kv.latency_ms / MS_PER_S)))
    for name, option in missing.items():
        what = ("no KV bytes per token (a calibrated profile)" if name == "kv_bytes_per_token"
                else f"no {kv.link} bandwidth in the hardware catalogue")
        problems.add(f"pools.kv_transfer.{name}", f"option {option} has {what}; give pools.kv_transfer.{name}, "
                                                  "or use model: seed-factor")
    return tuple(out)


def _link_figures(options: Sequence[GpuOption], catalog_section) -> dict[str, tuple[float | None, float | None]]:
    """Per option, the (NVLink, inter-node) per-GPU bandwidth of its hardware in bytes/s (absent: no hardware)."""
    from fleetopt.optimizer.io.catalog import instance_catalog

    catalog = instance_catalog(catalog_section, Problems(None))
    out = {}
    for o in options:
        name = getattr(o.profile, "hardware_name", None)
        if catalog is None or not name:
            continue
        try:
            hw = catalog.find("hardware", name)
        except KeyError:
            continue
        out[o.name] = (hw.nvlink_bandwidth_bytes_per_s, hw.inter_node_bandwidth_bytes_per_s)
    return out


def _models_by_option(options: Sequence[GpuOption]) -> dict[str, list[str]]:
    """The options serving each known model (:func:`~fleetopt.models.profiles.served_model`), in order."""
    out: dict[str, list[str]] = {}
    for o in options:
        model = served_model(o.profile.model_name)
        if model is not None:
            out.setdefault(model, []).append(o.name)
    return out


def _mixed_model_problems(data: dict, options: Sequence[GpuOption], problems: Problems) -> None:
    """``gpus`` whose options serve different models, unless ``allow_mixed_models: true``: a plan would compare
    a small model's cost with a large one's as a saving. Options whose profile names no model are not counted
    (:func:`gpu_warnings` says so)."""
    models = _models_by_option(options)
    if len(models) < 2 or data.get("allow_mixed_models") is True or data.get("semantic") is not None:
        return
    found = "; ".join(f"{model} ({', '.join(names)})" for model, names in models.items())
    problems.add("gpus", f"the GPU options serve {len(models)} different models: {found}; a plan would compare "
                         "their costs as if they served one model; list options of one model, or set "
                         "allow_mixed_models: true to plan them together knowingly")


def _share_rule(value, field: str, problems: Problems) -> tuple[ShareRule, str] | None:
    """One share rule of the ``semantic`` section: a number in [0, 1] or ``{edges, shares}``; None (and a problem
    naming ``field``) when it is not one."""
    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v))

    if number(value):
        if not 0 <= value <= 1:
            problems.add(field, f"{value:g} is outside [0, 1]; give the share of requests sent to the small model")
            return None
        return ShareRule.constant(float(value)), f"{value:g}"
    if isinstance(value, Mapping) and set(value) == {"edges", "shares"}:
        edges, shares = value["edges"], value["shares"]
        if not isinstance(edges, list) or not all(isinstance(e, int) and not isinstance(e, bool) and e > 0
                                                  for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            problems.add(f"{field}.edges", f"{show_value(edges, spell_lists=True)} is not allowed; give whole token "
                                           "counts > 0 in strictly increasing order")
            return None
        if not isinstance(shares, list) or not all(number(a) for a in shares):
            problems.add(f"{field}.shares", f"{show_value(shares, spell_lists=True)} is not allowed; give a list of "
                                            "numbers in [0, 1]")
            return None
        outside = [a for a in shares if not 0 <= a <= 1]
        if outside:
            problems.add(f"{field}.shares", f"{outside[0]:g} is outside [0, 1]; every share is the part of a "
                                            "segment's requests sent to the small model")
            return None
        if len(shares) != len(edges) + 1:
            problems.add(f"{field}.shares", f"{len(edges)} edges need {len(edges) + 1} shares (one per segment, the "
                                            f"last above {edges[-1] if edges else 0:,} tokens); got {len(shares)}")
            return None
        text = "edges " + "/".join(f"{e:,}" for e in edges) + ": " + "/".join(f"{a:g}" for a in shares)
        return ShareRule.step(edges, shares), text
    problems.add(field, f"{show_value(value)} is not allowed; give a share in [0, 1] or {{edges: [...], "
                        "shares: [...]}} (one share more than edges)")
    return None


def _semantic(raw: RawSemantic | None, data: dict, options: Sequence[GpuOption] | None, lengths,
              problems: Problems) -> SemanticSpec | None:
    """The ``semantic`` section resolved (:class:`SemanticSpec`), its problems added one line each: share rules
    (:func:`_share_rule`), each model served by at least one option and every option serving one of them, a
    quality floor some rule meets on the workload ``lengths`` (already cut at the context window), and the
    features semantic routing does not combine with yet."""
    if raw is None:
        return None
    if (raw.share is None) == (raw.shares is None):
        problems.add("semantic.share", "give exactly one of share (a fixed rule) and shares (candidate rules the "
                                       "planner chooses among)")
        return None
    if raw.shares is not None and not (isinstance(raw.shares, list) and raw.shares):
        problems.add("semantic.shares", f"{show_value(raw.shares)} is not allowed; give a non-empty list of shares "
                                        "in [0, 1] or {edges, shares} rules")
        return None
    given = [("semantic.share", raw.share)] if raw.shares is None else \
        [(f"semantic.shares[{k}]", v) for k, v in enumerate(raw.shares)]
    parsed = [_share_rule(v, f, problems) for f, v in given]
    pools = data.get("pools")
    if not isinstance(pools, Mapping):
        pools = {}
    for key, off in (("routing", "length"), ("disaggregation", "none")):
        if pools.get(key, off) != off:
            problems.add("semantic", f"semantic routing cannot yet be combined with pools.{key}: "
                                     f"{show_value(pools.get(key))}; drop one of them")
    if pools.get("compress") is not None:
        problems.add("semantic", "semantic routing cannot yet be combined with pools.compress (compress-and-route); "
                                 "drop one of them")
    names = {}
    if options is not None:
        models = _models_by_option(options)
        known = "; ".join(f"{m} ({', '.join(n)})" for m, n in models.items()) or "none named"
        for field in ("small_model", "large_model"):
            want = getattr(raw, field)
            match = [m for m in models if m.lower() == str(want).strip().lower()]
            if not match:
                problems.add(f"semantic.{field}", f"no GPU option serves {want!r}; the options serve: {known}; name "
                                                  "one of them, or add a GPU option serving it")
            else:
                names[field] = match[0]
        if len(names) == 2 and names["small_model"] == names["large_model"]:
            problems.add("semantic.large_model", f"{names['large_model']!r} is also the small model; semantic "
                                                 "routing needs two different models")
        for o in options:
            served = served_model(o.profile.model_name)
            if len(set(names.values())) == 2 and served not in names.values():
                problems.add("gpus", f"option {o.name} serves {served or 'no named model'}, neither "
                                     f"semantic.small_model ({names['small_model']}) nor semantic.large_model "
                                     f"({names['large_model']}); every option serves one of the two")
    valid = [p for p in parsed if p is not None]
    if len(valid) != len(parsed) or len(names) != 2 or lengths is None:
        return None
    rules, labels = [p[0] for p in valid], [p[1] for p in valid]
    large = [large_model_share(lengths, r) for r in rules]
    floor = raw.min_large_share
    keep = [k for k in range(len(rules)) if floor is None or large[k] >= floor - 1e-12]
    if not keep:
        best = max(range(len(rules)), key=lambda k: large[k])
        problems.add("semantic.min_large_share", f"{floor:g}: no share meets it; the large model gets at most "
                                                 f"{large[best]:.4g} of the requests (share {labels[best]}); lower "
                                                 "it, or offer a smaller small-model share")
        return None
    dropped = tuple(f"{labels[k]} (large-model share {large[k]:.4g} < {floor:g})" for k in range(len(rules))
                    if k not in keep)
    return SemanticSpec(small_model=names["small_model"], large_model=names["large_model"],
                        rules=tuple(rules[k] for k in keep), labels=tuple(labels[k] for k in keep),
                        large_shares=tuple(large[k] for k in keep), decide=raw.shares is not None,
                        min_large_share=floor, dropped=dropped)


def gpu_warnings(instance: Instance) -> list[str]:
    """Caveats about the GPU options, one line each: options that count a replica differently (the seeds'
    calibrated TP=8 units priced as one GPU next to options priced per physical GPU,
    :func:`~fleetopt.models.profiles.replica_unit`), options whose profile names no model (not checked
    against the others), the tp/dtype configurations of an entry with lists that do not fit (and why), and, with
    ``allow_mixed_models``, the models the options serve."""
    out = []
    units: dict[str, list[str]] = {}
    for g in instance.gpus:
        units.setdefault(replica_unit(g.profile).unit, []).append(g.name)
    if len(units) > 1:
        out.append(f"gpus: the options count a replica two ways: the seeds' calibrated units (a TP=8 server "
                   f"priced and powered as one GPU): {', '.join(units['seed_unit'])}; priced and powered per "
                   f"physical GPU: {', '.join(units['gpu'])}; one objective compares them, so their costs, power "
                   "and GPU counts follow different conventions (the tables show physical GPUs)")
    entry_of = instance.inventory_of_options()
    entries = instance.gpu_inventories()
    for k, g in enumerate(instance.gpus):
        i = entries[entry_of[k]].index      # the entry's position in the file (options of a list share it)
        unit = replica_unit(g.profile)
        k = unit.physical_gpus_per_replica
        counts = [f"{name} {v} {verb} {v} replicas = {v * k:,} physical GPUs" for name, v, verb in
                  (("max_count", g.max_count, "allows"), ("min_count", g.min_count, "asks for")) if v]
        if unit.unit == "seed_unit" and counts:  # the seeds' units count a server of k GPUs as one
            out.append(f"gpus[{i}] {g.name}: its counts are replicas of a calibrated unit of {k} physical GPUs "
                       f"priced as one: {'; '.join(counts)}; for an inventory of physical GPUs, divide it by {k}")
        if served_model(g.profile.model_name) is None:
            out.append(f"gpus[{i}] {g.name}: profile {g.profile.name} names no model; fleetopt cannot check that "
                       "it serves the same model as the other options")
    for inv in entries:
        skipped = [c for c in inv.configurations if c.option is None]
        if skipped:
            out.append(f"gpus[{inv.index}] {inv.name}: {len(skipped)} of {len(inv.configurations)} tp/dtype "
                       "configurations do not fit and are not candidates: "
                       + "; ".join(f"tp{c.tp}/{c.dtype} ({c.reason})" for c in skipped))
    models = _models_by_option(instance.gpus)
    sem = instance.semantic
    if sem is not None:
        rules = ", ".join(f"{label} ({large:.3g} to the large model)" for label, large in
                          zip(sem.labels, sem.large_shares))
        out.append(f"semantic: {sem.small_model} ({', '.join(models.get(sem.small_model, []))}) and "
                   f"{sem.large_model} ({', '.join(models.get(sem.large_model, []))}); "
                   + ("candidate shares" if sem.decide else "share") + f" to the small model: {rules}"
                   + (f"; below min_large_share {sem.min_large_share:g}, left out: {'; '.join(sem.dropped)}"
                      if sem.dropped else "")
                   + "; the pools serve different models: their cost and tok/W compare different models' outputs")
    elif instance.allow_mixed_models and len(models) > 1:
        out.append("gpus: allow_mixed_models: the options serve different models ("
                   + "; ".join(f"{m}: {', '.join(n)}" for m, n in models.items())
                   + "); a saving between them compares different models")
    return out


def _resolve(data: dict, path: Path | None, problems: Problems) -> Instance | None:
    """Both passes over a raw mapping; an :class:`Instance` when no problem was found."""
    # the instance's own catalogue (inline, a file or files: fleetopt.optimizer.io.catalog_file), checked there
    catalog_section = data.pop("catalog", None)
    structure_problems(data, problems)
    base_dir = (path.parent if path is not None else Path.cwd()).absolute()
    workload_raw = validate_section(RawWorkload, data.get("workload"))
    workload = None if workload_raw is None else load_workload(workload_raw, base_dir, problems)
    resolved = _gpu_options(data, problems, catalog_section)
    options, inventories = (None, ()) if resolved is None else resolved
    pools_raw = validate_section(RawPools, data.get("pools"))
    boundaries = None
    if pools_raw is not None:
        boundaries = _resolve_boundaries(pools_raw, None if workload is None else workload.lengths, problems)
        if options is not None:
            check_context_fits([o.profile for o in options], pools_raw.max_context, problems)
    if options is not None:
        _mixed_model_problems(data, options, problems)
    semantic_raw = validate_section(RawSemantic, data.get("semantic"))
    semantic = None
    if semantic_raw is not None:
        cut = None
        if workload is not None and pools_raw is not None:
            cut = workload.lengths.truncated(pools_raw.max_context)[0]
        semantic = _semantic(semantic_raw, data, options, cut, problems)
    if not problems.lines:
        _cross_field_problems(data, workload, problems)
    transfers = ()
    if not problems.lines and pools_raw is not None and options is not None:
        transfers = _kv_transfers(pools_raw, options, catalog_section, problems)
    if problems.lines:
        return None
    # each part is None only after a problem line was added
    assert workload is not None and options is not None and boundaries is not None
    raw = RawInstance.model_validate(data)
    return Instance(
        path=path,
        name=raw.name or (path.stem if path is not None else "instance"),
        workload=_workload_spec(workload, raw.pools.max_context),
        slo=_slo(raw.slo),
        gpus=tuple(options),
        pools=PoolsSpec(raw.pools.max_pools, raw.pools.max_context, boundaries, raw.pools.routing,
                        tuple(sorted(set(raw.pools.compress.gammas))) if raw.pools.compress else (),
                        raw.pools.compress.success_probability if raw.pools.compress else 1.0,
                        raw.pools.disaggregation, transfers, raw.pools.pd_sizing),
        constraints=_constraints(raw.constraints),
        objective=raw.objective,
        description=raw.description or "",
        energy_usd_per_kwh=raw.energy.usd_per_kwh if raw.energy else None,
        pue=raw.energy.pue if raw.energy else 1.0,
        allow_mixed_models=raw.allow_mixed_models or semantic is not None,
        inventories=inventories,
        semantic=semantic,
    )


def _printable(text: str) -> str:
    """``text`` with every unprintable character escaped (``\\n``, ``\\x1f``), so a problem stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


class _OneLineProblems(Problems):
    """:class:`Problems` whose lines stay one line whatever keys and values a file holds (a key ``"a\\nb"`` is
    shown escaped); a problem in a value a ``--set`` flag gave names that flag (``overridden``: field -> flag,
    :func:`fleetopt.optimizer.io.overrides.attributed_field`)."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.overridden: dict[str, str] = {}

    def add(self, field: str, message: str) -> None:
        super().add(_printable(attributed_field(field, self.overridden)), _printable(message))


def instance_from_dict(data: Mapping, path: str | Path | None = None, overrides: Sequence[str] = (), *,
                       label: str | None = None) -> Instance:
    """Validate and resolve an instance given as a mapping (e.g. from a notebook).

    Parameters
    ----------
    data : Mapping
        The instance as parsed from a file; it is not modified.
    path : str or Path, optional
        The file it came from: names the file in error lines, and relative
        workload paths resolve against its folder (the current folder if None).
    overrides : sequence of str
        ``PATH=VALUE`` strings applied before validation (see :func:`apply_overrides`); kept, in order, as
        ``Instance.overrides``.
    label : str, optional
        What error lines name as the file when ``path`` is None (e.g. ``<dict>`` for a notebook's mapping).

    Returns
    -------
    Instance

    Raises
    ------
    InstanceError
        With every problem found, one line each.
    """
    problems = _OneLineProblems(path if path is not None else label)
    path = None if path is None else Path(path)
    if not isinstance(data, Mapping):
        problems.add("", f"the top level must be a mapping of keys ({allowed_keys(())}); got {show_value(data)}")
        problems.raise_if_any()
    data = overridden_copy(data, overrides, problems, problems.overridden)
    instance = _resolve(data, path, problems)
    problems.raise_if_any()
    assert instance is not None                     # _resolve gives None only with a problem, raised above
    return replace(instance, overrides=tuple(str(text) for text in overrides))


def load_instance(path: str | Path, overrides: Sequence[str] = ()) -> Instance:
    """Read, validate and resolve the instance file at ``path`` (never writes to it).

    Parameters
    ----------
    path : str or Path
        A ``.yaml``/``.yml``, ``.json`` or ``.toml`` file.
    overrides : sequence of str
        ``--set`` strings ``dotted.path=value`` applied before validation.

    Returns
    -------
    Instance

    Raises
    ------
    InstanceError
        With every problem found (unreadable file, syntax, unknown keys, wrong
        types or ranges, unknown names, bad workload files, ...), one line each,
        each starting with ``path`` as given.

    See Also
    --------
    instance_from_dict : the same from an already parsed mapping.
    """
    problems = _OneLineProblems(path)
    data = read_instance_file(Path(path), problems)
    problems.raise_if_any()
    if data is None:
        problems.add("", f"the file is empty; the top level must be a mapping of keys ({allowed_keys(())})")
        problems.raise_if_any()
    assert data is not None                         # an empty file was raised above
    return instance_from_dict(data, path, overrides)
