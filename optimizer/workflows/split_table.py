r"""The fixed-topology split table (``fleetopt pareto --split-table``): one GPU type, two pools, every boundary.

For each boundary :math:`B` of the table the fleet is two pools of the same GPU option, ``(0, B]`` and
``(B, B_{max}]``, each sized to its least replica count meeting the instance's P99 TTFT SLO and utilisation
cap analytically under its ``slo.ttft_model`` (the sizing of ``fleetopt evaluate`` for a pool given without a
count, :func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`; ``gpus[].availability`` inflates it to
:math:`\lceil N/A \rceil`). This is the reference tool's ``pareto`` table (capacity-planning seed, Puzzle 1),
computed with exact segment moments.

Columns of a row:

* ``share_short``: :math:`F(B)`, the share of requests of at most :math:`B` tokens (the short pool's routing
  share under length routing);
* ``replicas_short``, ``replicas_long``, ``total_gpus`` (replicas times GPUs per replica), ``cost_per_year``;
* ``saving_pct``: :math:`100\,(C_0 - C_B)/C_0`, with :math:`C_0` the cost of the homogeneous baseline, one pool
  ``(0, B_{max}]`` of the same GPU option sized the same way;
* ``ttft_p99_ms_short``, ``ttft_p99_ms_long``: each pool's analytic P99 TTFT at its count;
* ``slo_met``: the row's fleet meets the SLO (P99 TTFT, and TPOT if given, in the SLO's scope; a pool no count
  can make meet it is sized by the utilisation cap alone and misses); the utilisation cap is a limit, reported in
  ``violations``;
* ``pareto``: the row meets the SLO and no other such row dominates it in (cost, worst P99) (:func:`dominates`);
* ``violations``: every limit of the instance the row's fleet breaks, as ``fleetopt evaluate`` reports them
  (:func:`fleetopt.optimizer.plan.evaluate.limit_violations`: ``gpus[].max_count``/``min_count`` and pool counts,
  ``pools.max_pools``, ``constraints.max_total_gpus``/``max_power_kw``/``max_cost_per_hr``/``max_utilization``);
  ``limits_ok``: the list is empty. ``slo_met`` says nothing about these.

The recommended row (:func:`recommended_index`) is the cost optimum among the rows that meet the SLO *and* break
no limit; ties go to fewer GPUs, then to the smaller boundary. None when no row does. Every number is analytic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from fleetopt.models.fleet import FleetResult, PoolPlan
from fleetopt.models.units import MS_PER_S

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import GpuOption, Instance
from fleetopt.optimizer.output.contract import build
from fleetopt.optimizer.output.contract.workflows import (ParetoDocument, _SplitBaseline as _SplitBaselineModel,
                                                          _SplitRow as _SplitRowModel)
from fleetopt.optimizer.plan.evaluate import evaluate_plans, limit_violations

__all__ = ["SCHEMA_VERSION", "CSV_COLUMNS", "SplitRow", "SplitBaseline", "SplitTable", "split_table",
           "parse_boundaries", "choose_gpu", "dominates", "pareto_marks", "recommended_index"]

from fleetopt.optimizer.output.contract import SCHEMA_VERSION  # noqa: E402 (one contract version)
"""Version of the JSON contract of :meth:`SplitTable.to_json` (raised when a key changes meaning or goes)."""
CSV_COLUMNS = ("boundary_tokens", "share_short", "replicas_short", "replicas_long", "total_gpus", "cost_per_year",
               "saving_pct", "ttft_p99_ms_short", "ttft_p99_ms_long", "slo_met", "pareto", "recommended", "fleet",
               "limits_ok", "violations")
"""Columns of :meth:`SplitTable.to_csv`, in order."""
_COST_DIGITS = 6
"""Costs ($/hr) are compared rounded to this many decimals: sums of the same prices in another order tie."""
_TOKENS_RE = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


@dataclass(frozen=True)
class SplitRow:
    """One boundary of the table (module docstring); times in ms, costs in US$."""

    boundary_tokens: int
    share_short: float
    replicas_short: int
    replicas_long: int
    total_gpus: int
    cost_per_hr: float
    cost_per_year: float
    saving_pct: float
    ttft_p99_ms_short: float
    ttft_p99_ms_long: float
    slo_met: bool
    pareto: bool
    fleet: str
    """The row's fleet as a ``--fleet`` spec (``fleetopt evaluate`` / ``simulate`` take it back)."""
    miss_reason: str = ""
    """Why a pool misses (empty when the row meets the SLO)."""
    violations: tuple[str, ...] = ()
    """Every limit of the instance the row's fleet breaks (module docstring); empty: within every limit."""

    @property
    def limits_ok(self) -> bool:
        """The row breaks no limit of the instance."""
        return not self.violations

    @property
    def worst_ttft_p99_ms(self) -> float:
        """The larger of the two pools' P99 TTFT (the latency axis of the Pareto mark)."""
        return max(self.ttft_p99_ms_short, self.ttft_p99_ms_long)

    def to_json(self) -> dict:
        """The row's JSON object, built by its model (:class:`fleetopt.optimizer.output.contract.workflows._SplitRow`:
        the keys, their types and order; each value is the field or property of that name)."""
        return build(_SplitRowModel, self)


@dataclass(frozen=True)
class SplitBaseline:
    """The homogeneous fleet the savings are measured against: one pool of the table's GPU option."""

    replicas: int
    total_gpus: int
    cost_per_hr: float
    cost_per_year: float
    ttft_p99_ms: float
    slo_met: bool
    fleet: str
    violations: tuple[str, ...] = ()
    """Every limit of the instance the baseline breaks."""

    def to_json(self) -> dict:
        """The baseline's JSON object, built by its model
        (:class:`fleetopt.optimizer.output.contract.workflows._SplitBaseline`)."""
        return build(_SplitBaselineModel, self)


@dataclass(frozen=True)
class SplitTable:
    """The split table of one instance and GPU option (module docstring)."""

    instance: str
    gpu: str
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    max_utilization: float
    max_context_tokens: int
    baseline: SplitBaseline
    rows: tuple[SplitRow, ...]
    recommended: int | None
    """Index into :attr:`rows` of the recommended row; None when no row meets the SLO within the limits."""
    overrides: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The stable JSON contract (``schema_version`` :data:`SCHEMA_VERSION`), built by its model
        (:class:`fleetopt.optimizer.output.contract.workflows.ParetoDocument`)."""
        return build(ParetoDocument, self, schema_version=SCHEMA_VERSION, command="pareto --split-table",
                     source="analytic", baseline=self.baseline.to_json(), rows=[r.to_json() for r in self.rows])

    def to_csv(self) -> str:
        """The rows as CSV (:data:`CSV_COLUMNS`; times in ms, costs in US$/yr, booleans as true/false)."""
        lines = [",".join(CSV_COLUMNS)]
        for k, r in enumerate(self.rows):
            values = {**r.to_json(), "recommended": k == self.recommended}
            lines.append(",".join(_csv_cell(values[c]) for c in CSV_COLUMNS))
        return "\n".join(lines) + "\n"


def _csv_cell(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        value = "; ".join(value)
    if isinstance(value, float):
        return "" if not math.isfinite(value) else repr(value)
    text = str(value)
    return f'"{text}"' if "," in text else text


def parse_boundaries(text: str, instance: Instance, field: str = "--boundaries") -> tuple[int, ...]:
    """``"1024,4096,8k"`` -> ``(1024, 4096, 8192)``: whole token counts (``k`` = 1,024), strictly increasing,
    inside ``(0, pools.max_context)``.

    Raises
    ------
    InstanceError
        One line per problem, naming ``field``.

    Examples
    --------
    >>> from types import SimpleNamespace as NS
    >>> parse_boundaries("512, 4k", NS(pools=NS(max_context_tokens=65536)))
    (512, 4096)
    """
    top = instance.pools.max_context_tokens
    parts = [p for p in str(text).split(",")]
    problems, out = [], []
    for part in parts:
        m = _TOKENS_RE.match(part)
        if not m:
            problems.append(f"{part.strip()!r} is not a whole token count (e.g. 4096 or 4k)")
            continue
        value = int(m[1]) * (1024 if m[2] else 1)
        if not 0 < value < top:
            problems.append(f"{value} is outside (0, {top}) (pools.max_context is {top})")
        out.append(value)
    if not problems:
        steps = [k for k in range(1, len(out)) if out[k] <= out[k - 1]]
        if steps:
            problems.append(f"not increasing: {out[steps[0]]} follows {out[steps[0] - 1]}; list boundaries in "
                            "strictly increasing order")
    if problems:
        raise InstanceError([f"{field}: {p}" for p in problems])
    return tuple(out)


def choose_gpu(instance: Instance, name: str | None, field: str = "--gpu") -> GpuOption:
    """The GPU option of a one-type table: ``name``, or the instance's only option when ``name`` is None."""
    known = ", ".join(g.name for g in instance.gpus)
    if name is None:
        if len(instance.gpus) == 1:
            return instance.gpus[0]
        raise InstanceError(f"{field}: the instance defines {known}; name the GPU option of the table")
    for g in instance.gpus:
        if g.name.lower() == name.strip().lower():
            return g
    raise InstanceError(f"{field}: unknown gpu {name!r}; the instance defines {known}")


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    r"""Whether point ``a`` dominates ``b`` when both coordinates are minimised (Pareto dominance).

    .. math:: a \succ b \iff a_1 \le b_1 \wedge a_2 \le b_2 \wedge (a_1 < b_1 \vee a_2 < b_2)

    References
    ----------
    .. [1] K. Deb, *Multi-Objective Optimization Using Evolutionary Algorithms*, Wiley 2001, Def. 2.5.

    Examples
    --------
    >>> dominates((1.0, 2.0), (1.0, 3.0)), dominates((1.0, 3.0), (1.0, 3.0)), dominates((0.0, 4.0), (1.0, 3.0))
    (True, False, False)
    """
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def _cost_key(cost_per_hr: float) -> float:
    return round(cost_per_hr, _COST_DIGITS)


def pareto_marks(rows) -> tuple[bool, ...]:
    """Per row: it meets the SLO and no other row meeting it dominates it in (cost $/hr, worst P99 TTFT)
    (:func:`dominates`; costs compared to :data:`_COST_DIGITS` decimals)."""
    points = [(_cost_key(r.cost_per_hr), r.worst_ttft_p99_ms) for r in rows]
    met = [r.slo_met for r in rows]
    return tuple(met[k] and not any(met[j] and dominates(points[j], points[k]) for j in range(len(rows)) if j != k)
                 for k in range(len(rows)))


def recommended_index(rows) -> int | None:
    """The cost optimum among rows meeting the SLO and breaking no limit of the instance (``violations``): least
    cost, then fewer GPUs, then the smaller boundary; None when no row qualifies."""
    met = [k for k, r in enumerate(rows) if r.slo_met and not r.violations]
    if not met:
        return None
    return min(met, key=lambda k: (_cost_key(rows[k].cost_per_hr), rows[k].total_gpus, rows[k].boundary_tokens))


def _plan(g: GpuOption, lo: int, hi: int) -> PoolPlan:
    return PoolPlan(lo, hi, g.name, g.profile, None, g.availability)


def _miss(r: FleetResult) -> str:
    return "; ".join(f"{p.min_tokens:,}-{p.max_tokens:,}: {p.miss_reason}" for p in r.pools
                     if not (p.slo_met and p.utilization_ok) and p.miss_reason)


def _spec(r: FleetResult) -> str:
    return ",".join(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}" for p in r.pools)


def split_table(instance: Instance, gpu: str | None = None, boundaries=None) -> SplitTable:
    """The split table of ``instance`` for one GPU option (module docstring).

    Parameters
    ----------
    instance : Instance
        Its workload, arrival rate, SLO (``ttft_model``, ``scope``), utilisation cap and ``pools.max_context``
        size the rows; its limits (inventories, pool counts, GPU, power and budget caps) are checked on each row
        (``violations``) and bound the recommendation; its objective is not used.
    gpu : str, optional
        The GPU option's name; None: the instance's only option.
    boundaries : sequence of int, optional
        The boundaries :math:`B` (inside ``(0, max_context)``, increasing); None: the instance's candidate
        boundaries (``pools.boundaries`` as resolved: the CDF breakpoints for ``auto``).

    Raises
    ------
    InstanceError
        An unknown or missing ``gpu``, or a GPU option whose KV cache holds no sequence of ``max_context`` tokens.
    """
    g = choose_gpu(instance, gpu)
    top = instance.pools.max_context_tokens
    if int(g.profile.n_slots(top)) < 1:
        raise InstanceError(f"--gpu: {g.name} holds no sequence of {top:,} tokens (pools.max_context): the long "
                            "pool has no KV slot")
    inner = tuple(instance.pools.boundaries[1:-1]) if boundaries is None else tuple(int(b) for b in boundaries)
    if not inner:
        raise InstanceError("--boundaries: no boundary inside (0, pools.max_context) to split at")
    homo = evaluate_plans(instance, [_plan(g, 0, top)])
    base = SplitBaseline(homo.total_replicas, homo.total_gpus, homo.cost_per_hr, homo.cost_per_year,
                         homo.pools[0].ttft_p99_ms, homo.slo_met, _spec(homo), limit_violations(instance, homo))
    rows = []
    for b in inner:
        r = evaluate_plans(instance, [_plan(g, 0, b), _plan(g, b, top)])
        short, long_ = r.pools
        saving = 100.0 * (base.cost_per_hr - r.cost_per_hr) / base.cost_per_hr if base.cost_per_hr > 0 else math.nan
        rows.append(SplitRow(
            boundary_tokens=int(b), share_short=short.routing_share, replicas_short=short.replicas,
            replicas_long=long_.replicas, total_gpus=r.total_gpus, cost_per_hr=r.cost_per_hr,
            cost_per_year=r.cost_per_year, saving_pct=saving, ttft_p99_ms_short=short.ttft_p99_ms,
            ttft_p99_ms_long=long_.ttft_p99_ms, slo_met=r.slo_met, pareto=False, fleet=_spec(r),
            miss_reason=_miss(r), violations=limit_violations(instance, r)))
    marks = pareto_marks(rows)
    rows = [replace(r, pareto=m) for r, m in zip(rows, marks)]
    return SplitTable(
        instance=instance.name, gpu=g.name, arrival_rate=instance.workload.arrival_rate_req_per_s,
        slo_ttft_p99_ms=instance.slo.ttft_p99_s * MS_PER_S, ttft_model=instance.slo.ttft_model,
        max_utilization=instance.constraints.max_utilization, max_context_tokens=top, baseline=base,
        rows=tuple(rows), recommended=recommended_index(rows), overrides=tuple(instance.overrides))
