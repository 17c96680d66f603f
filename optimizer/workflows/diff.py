r"""Comparing plans (``fleetopt diff A.json B.json``): what changes between two plans, the question an operator
asks before a change.

Reading a plan (:func:`read_plan`)
----------------------------------
A plan is one fleet of a result document: ``solve`` (the selected plan, or ``solutions[N-1]`` with ``--plan N``;
read by :func:`fleetopt.optimizer.io.solve_json.read_solve_plan`), ``evaluate`` (``fleets[N-1]``, the first
without ``--plan``) or ``simulate`` (its one fleet). Every problem is one
:class:`~fleetopt.optimizer.errors.InstanceError` line ``FILE: field: problem`` (exit 2).

Matching pools (:func:`compare_pools`, the one home of pool matching: ``headroom --range`` uses it too)
-------------------------------------------------------------------------------------------------------------
A pool is identified by its GPU configuration, the key :math:`(g, t, \phi)` of its GPU option :math:`g`, the
physical GPUs of one replica :math:`t` and its phase :math:`\phi` (``both``, or ``prefill`` / ``decode`` for the
two rows of a disaggregated pair over one segment), and by its segment :math:`[lo, hi)` of prompt lengths.

1. Pools of A and B with the same key and segment are the same pool: ``unchanged``, or ``resized`` when the
   replica counts differ (several such pools, as a split-routing plan may hold, pair in their order).
2. Of the rest, pools of one key whose segments overlap pair in order of their lower bound: ``moved`` (the
   segment changed; the replicas may too).
3. What is left is ``removed`` (only in A) or ``added`` (only in B).

A pool change's deltas are B minus A: :math:`\Delta n = n_B - n_A` replicas and :math:`\Delta G = G_B - G_A`
physical GPUs (:math:`G = n \cdot t`; an absent side counts 0). Summed per GPU option they say how each option is
resized; summed per hardware (the profile's GPU, the part of its name before the first ``/``) they are the GPUs to
buy (:math:`\Delta G > 0`) or release (:math:`\Delta G < 0`), so that

.. math:: G_A(h) + \Delta G(h) = G_B(h) \quad \text{for every hardware } h.

The *boundaries* of a plan are the lower bounds of its segments but the smallest (for contiguous length routing:
the interior split points). Those only in A and only in B pair in order as *moves* when they are as many, else
they are listed as removed and added.

Figures (:class:`PlanDiff`)
---------------------------
Per plan: physical GPUs, replicas, $/hr, $/yr, kW, tok/W and $ per million output tokens from its ``analytic``
sub-object (the same model on both sides), and the SLO verdict with its source: ``simulated`` (with the P99
TTFT's 95 % interval) where the plan carries a ``simulated`` sub-object, else ``analytic``. Each delta is B minus
A (null where a side's figure is null). The fleet rate of a plan is the sum of its pools' analytic
``arrival_rate`` (a decode row repeats its prefill row's rate and is left out). Plans of different instances (the
name, the rate, the P99 TTFT SLO or the overrides differ) are compared all the same and flagged in one line
(``instance_note``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetopt.models.fleet import FleetResult
from fleetopt.models.profiles import ReplicaUnit
from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.io.files import read_json
from fleetopt.optimizer.io.solve_json import json_kind, read_solve_plan, whole_number
from fleetopt.optimizer.output.contract import SCHEMA_VERSION, build
from fleetopt.optimizer.output.contract.workflows import (DiffDocument, FleetChange as FleetChangeModel, _DiffHardware,
                                                          _DiffOption, _DiffPlan, _DiffPoolChange)

__all__ = ["PLAN_COMMANDS", "PoolRow", "PoolChange", "OptionChange", "HardwareChange", "FleetChange", "PlanSide",
           "PlanDiff", "hardware_of", "result_rows", "compare_pools", "read_plan", "diff_plans", "diff_files",
           "parse_plan_flag"]

PLAN_COMMANDS = ("solve", "evaluate", "simulate")
"""The documents a plan is read from."""
_HINT = "give the --json of fleetopt solve, evaluate or simulate"
_REL = 1e-9


def hardware_of(profile: str | None, gpu: str) -> str:
    """The hardware of a pool: its profile's name up to the first ``/`` (the catalogue names a profile
    ``GPU/MODEL/tpN/DTYPE``; a calibrated one is the GPU's name), else the GPU option's name.

    >>> hardware_of("H100-SXM-80GB/Llama-3.1-70B/tp8/fp8", "h100"), hardware_of("A100-80GB", "a100")
    ('H100-SXM-80GB', 'A100-80GB')
    >>> hardware_of(None, "a100")
    'a100'
    """
    if isinstance(profile, str) and profile.strip():
        return profile.split("/", 1)[0]
    return gpu


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PoolRow:
    """One pool as compared: its segment, GPU configuration, phase and size."""

    min_tokens: int
    max_tokens: int
    gpu: str
    phase: str = "both"
    hardware: str
    replicas: int
    physical_gpus_per_replica: int
    physical_gpus: int

    @property
    def key(self) -> tuple[str, int, str]:
        """The GPU configuration: option, physical GPUs per replica, phase."""
        return (self.gpu, self.physical_gpus_per_replica, self.phase)

    @property
    def label(self) -> str:
        phase = "" if self.phase == "both" else f" ({self.phase})"
        return f"{self.min_tokens}-{self.max_tokens}:{self.gpu}x{self.replicas}{phase}"


@dataclass(frozen=True, kw_only=True)
class PoolChange:
    """One pool of A matched to one of B (either may be None: added, removed)."""

    change: str
    """``added``, ``removed``, ``resized``, ``moved`` or ``unchanged``."""
    a: PoolRow | None
    b: PoolRow | None

    @property
    def row(self) -> PoolRow:
        row = self.b if self.b is not None else self.a
        assert row is not None                      # a pool change has at least one side
        return row

    @property
    def replicas_delta(self) -> int:
        return (0 if self.b is None else self.b.replicas) - (0 if self.a is None else self.a.replicas)

    @property
    def physical_gpus_delta(self) -> int:
        return (0 if self.b is None else self.b.physical_gpus) - (0 if self.a is None else self.a.physical_gpus)

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._DiffPoolChange`); an absent side
        has no segment and no replicas."""
        r, a, b = self.row, self.a, self.b
        return build(_DiffPoolChange, self, gpu=r.gpu, phase=r.phase, hardware=r.hardware,
                     physical_gpus_per_replica=r.physical_gpus_per_replica,
                     min_tokens_a=None if a is None else a.min_tokens, max_tokens_a=None if a is None else a.max_tokens,
                     min_tokens_b=None if b is None else b.min_tokens, max_tokens_b=None if b is None else b.max_tokens,
                     replicas_a=0 if a is None else a.replicas, replicas_b=0 if b is None else b.replicas,
                     physical_gpus_a=0 if a is None else a.physical_gpus,
                     physical_gpus_b=0 if b is None else b.physical_gpus)


@dataclass(frozen=True, kw_only=True)
class OptionChange:
    """One GPU option's replicas and physical GPUs in A and B (summed over its pools)."""

    gpu: str
    replicas_a: int
    replicas_b: int
    physical_gpus_a: int
    physical_gpus_b: int

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._DiffOption`) from these fields."""
        return build(_DiffOption, self, replicas_delta=self.replicas_b - self.replicas_a,
                     physical_gpus_delta=self.physical_gpus_b - self.physical_gpus_a)


@dataclass(frozen=True, kw_only=True)
class HardwareChange:
    """One hardware's physical GPUs in A and B: what to buy or release."""

    hardware: str
    physical_gpus_a: int
    physical_gpus_b: int

    @property
    def delta(self) -> int:
        return self.physical_gpus_b - self.physical_gpus_a

    @property
    def action(self) -> str:
        return "buy" if self.delta > 0 else "release" if self.delta < 0 else "keep"

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._DiffHardware`) from these
        fields."""
        return build(_DiffHardware, self, physical_gpus_delta=self.delta)


@dataclass(frozen=True, kw_only=True)
class FleetChange:
    """What changes from fleet A to fleet B: pools matched, per GPU option and hardware, boundaries, $/hr."""

    pools: tuple[PoolChange, ...]
    options: tuple[OptionChange, ...]
    hardware: tuple[HardwareChange, ...]
    boundaries_a: tuple[int, ...]
    boundaries_b: tuple[int, ...]
    boundary_moves: tuple[tuple[int, int], ...]
    boundaries_added: tuple[int, ...]
    boundaries_removed: tuple[int, ...]
    cost_per_hr_delta: float | None = None
    """B's $/hr less A's (None: a side's cost not known)."""

    @property
    def replicas_delta(self) -> int:
        return sum(c.replicas_delta for c in self.pools)

    @property
    def physical_gpus_delta(self) -> int:
        return sum(c.physical_gpus_delta for c in self.pools)

    @property
    def unchanged(self) -> bool:
        return all(c.change == "unchanged" for c in self.pools)

    def summary(self) -> str:
        """The change in a few words: GPUs to buy and release per hardware, the $/hr delta.

        >>> row = PoolRow(min_tokens=0, max_tokens=8, gpu="h", hardware="H100", replicas=1,
        ...               physical_gpus_per_replica=8, physical_gpus=8)
        >>> compare_pools([], [row], 0.0, 32.0).summary()
        'buy 8 H100; +$32.00/hr'
        """
        parts = [f"{h.action} {abs(h.delta)} {h.hardware}" for h in self.hardware if h.delta]
        text = ", ".join(parts) or "no GPU change"
        if not parts and not self.unchanged:
            text = "pools rearranged, no GPU change"
        if self.cost_per_hr_delta is not None:
            text += f"; {'+' if self.cost_per_hr_delta >= 0 else '-'}${abs(self.cost_per_hr_delta):,.2f}/hr"
        return text

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows.FleetChange`) from these fields."""
        return build(FleetChangeModel, self, pools=[c.to_json() for c in self.pools],
                     options=[o.to_json() for o in self.options], hardware=[h.to_json() for h in self.hardware],
                     boundary_moves=[{"from_tokens": a, "to_tokens": b} for a, b in self.boundary_moves],
                     cost_per_year_delta=None if self.cost_per_hr_delta is None else self.cost_per_hr_delta * _HOURS,
                     summary=self.summary())


_HOURS = 8760.0
"""Hours of a year: $/yr = $/hr x 8,760, as every document's ``cost_per_year``."""


# --------------------------------------------------------------------------------------------
# Matching
# --------------------------------------------------------------------------------------------


def _boundaries(rows: Sequence[PoolRow]) -> tuple[int, ...]:
    starts = sorted({r.min_tokens for r in rows})
    return tuple(starts[1:])


def _overlap(a: PoolRow, b: PoolRow) -> bool:
    return min(a.max_tokens, b.max_tokens) > max(a.min_tokens, b.min_tokens)


def compare_pools(a: Sequence[PoolRow], b: Sequence[PoolRow], cost_per_hr_a: float | None = None,
                  cost_per_hr_b: float | None = None) -> FleetChange:
    """The change from fleet ``a`` to fleet ``b`` (module docstring: the matching, per option and hardware, the
    boundaries); ``cost_per_hr_*``: each fleet's $/hr, for the delta.

    >>> h = dict(gpu="h100", hardware="H100", physical_gpus_per_replica=8)
    >>> a = [PoolRow(min_tokens=0, max_tokens=4096, replicas=2, physical_gpus=16, **h)]
    >>> b = [PoolRow(min_tokens=0, max_tokens=4096, replicas=3, physical_gpus=24, **h)]
    >>> c = compare_pools(a, b)
    >>> c.pools[0].change, c.hardware[0].delta, c.hardware[0].action
    ('resized', 8, 'buy')
    """
    left, right = list(a), list(b)
    pairs: list[PoolChange] = []
    used_b: set[int] = set()
    unmatched_a: list[int] = []
    for i, p in enumerate(left):
        j = next((j for j, q in enumerate(right) if j not in used_b and q.key == p.key
                  and (q.min_tokens, q.max_tokens) == (p.min_tokens, p.max_tokens)), None)
        if j is None:
            unmatched_a.append(i)
            continue
        used_b.add(j)
        pairs.append(PoolChange(change="unchanged" if right[j].replicas == p.replicas else "resized", a=p, b=right[j]))
    removed = []
    for i in sorted(unmatched_a, key=lambda i: (left[i].min_tokens, left[i].max_tokens)):
        p = left[i]
        j = next((j for j in sorted(range(len(right)), key=lambda j: (right[j].min_tokens, right[j].max_tokens))
                  if j not in used_b and right[j].key == p.key and _overlap(p, right[j])), None)
        if j is None:
            removed.append(PoolChange(change="removed", a=p, b=None))
            continue
        used_b.add(j)
        pairs.append(PoolChange(change="moved", a=p, b=right[j]))
    added = [PoolChange(change="added", a=None, b=q) for j, q in enumerate(right) if j not in used_b]
    changes = sorted(pairs + removed + added, key=lambda c: (c.row.min_tokens, c.row.max_tokens, c.row.gpu,
                                                              c.row.phase != "prefill", c.change))

    def totals(rows: Sequence[PoolRow], name) -> dict:
        out: dict = {}
        for r in rows:
            n, g = out.get(name(r), (0, 0))
            out[name(r)] = (n + r.replicas, g + r.physical_gpus)
        return out

    opt_a, opt_b = totals(left, lambda r: r.gpu), totals(right, lambda r: r.gpu)
    options = tuple(OptionChange(gpu=g, replicas_a=opt_a.get(g, (0, 0))[0], replicas_b=opt_b.get(g, (0, 0))[0],
                                 physical_gpus_a=opt_a.get(g, (0, 0))[1], physical_gpus_b=opt_b.get(g, (0, 0))[1])
                    for g in sorted(set(opt_a) | set(opt_b)))
    hw_a, hw_b = totals(left, lambda r: r.hardware), totals(right, lambda r: r.hardware)
    hardware = tuple(HardwareChange(hardware=h, physical_gpus_a=hw_a.get(h, (0, 0))[1],
                                    physical_gpus_b=hw_b.get(h, (0, 0))[1]) for h in sorted(set(hw_a) | set(hw_b)))
    ba, bb = _boundaries(left), _boundaries(right)
    only_a, only_b = [x for x in ba if x not in bb], [x for x in bb if x not in ba]
    if len(only_a) == len(only_b):
        moves, plus, minus = tuple(zip(only_a, only_b)), (), ()
    else:
        moves, plus, minus = (), tuple(only_b), tuple(only_a)
    delta = None if cost_per_hr_a is None or cost_per_hr_b is None else float(cost_per_hr_b) - float(cost_per_hr_a)
    return FleetChange(pools=tuple(changes), options=options, hardware=hardware, boundaries_a=ba, boundaries_b=bb,
                       boundary_moves=moves, boundaries_added=plus, boundaries_removed=minus, cost_per_hr_delta=delta)


def result_rows(r: FleetResult, units: Mapping[str, ReplicaUnit], profiles: Mapping[str, str] | None = None
                ) -> tuple[PoolRow, ...]:
    """The pools of an evaluated fleet as :class:`PoolRow`: ``units`` maps a GPU option to its profile's
    :func:`~fleetopt.models.profiles.replica_unit` (a missing one: the pool's GPUs over its replicas),
    ``profiles`` a GPU option to its profile's name (else the pool's own ``profile``)."""
    rows = []
    for p in r.pools:
        u = units.get(p.gpu)
        per = u.physical_gpus_per_replica if u is not None else (p.gpus // p.replicas if p.replicas > 0 else 1)
        rows.append(PoolRow(min_tokens=int(p.min_tokens), max_tokens=int(p.max_tokens), gpu=p.gpu,
                            phase=getattr(p, "phase", "both"),
                            hardware=hardware_of((profiles or {}).get(p.gpu, p.profile), p.gpu),
                            replicas=int(p.replicas), physical_gpus_per_replica=int(per),
                            physical_gpus=int(p.replicas) * int(per)))
    return tuple(rows)


# --------------------------------------------------------------------------------------------
# One plan of a result document
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlanSide:
    """One plan as read from its file: its pools and headline figures."""

    file: str
    command: str
    instance: str | None
    label: str
    """The plan in words: ``the selected plan``, ``plan N``, ``fleet N``, ``the simulated fleet``."""
    fleet: str | None
    overrides: tuple[str, ...]
    slo_ttft_p99_ms: float | None
    arrival_rate: float | None
    rows: tuple[PoolRow, ...]
    physical_gpus: int
    total_replicas: int
    cost_per_hr: float
    cost_per_year: float
    power_kw: float | None
    tok_per_watt: float | None
    usd_per_million_output_tokens: float | None
    slo_met: bool | None
    slo_source: str
    """``simulated`` where the plan carries a simulated verdict, else ``analytic``."""
    ttft_p99_ms: float | None
    ttft_p99_ci_ms: tuple[float | None, float | None] | None

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._DiffPlan`) from these fields."""
        return build(_DiffPlan, self, plan=self.label)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _pool_row(path: Path, field: str, d) -> PoolRow:
    def fail(key: str, message: str) -> InstanceError:
        return InstanceError(format_problem(path, f"{field}.{key}" if key else field, message))

    if not isinstance(d, dict):
        raise fail("", f"must be a pool (a mapping); got {json_kind(d)}")
    ints = {}
    for key in ("min_tokens", "max_tokens", "replicas"):
        v = whole_number(d.get(key), 0, 10**12)
        if v is None:
            raise fail(key, f"must be a whole number >= 0; got {json_kind(d.get(key))}")
        ints[key] = v
    if ints["max_tokens"] <= ints["min_tokens"]:
        raise fail("max_tokens", f"{ints['max_tokens']} must exceed min_tokens {ints['min_tokens']}")
    gpu = d.get("gpu")
    if not isinstance(gpu, str) or not gpu.strip():
        raise fail("gpu", f"must be the GPU option's name; got {json_kind(gpu)}")
    phase = d.get("phase", "both")
    if phase not in ("both", "prefill", "decode"):
        raise fail("phase", f"must be both, prefill or decode; got {json_kind(phase)}")
    per = whole_number(d.get("physical_gpus_per_replica"), 1, 10**6)
    if per is None:  # a document before schema 2.1: the priced GPUs per replica stand in
        gpus = whole_number(d.get("gpus"), 0, 10**12)
        if gpus is None:
            raise fail("physical_gpus_per_replica", f"must be a whole number >= 1; got "
                                                    f"{json_kind(d.get('physical_gpus_per_replica'))}")
        per = gpus // ints["replicas"] if ints["replicas"] > 0 else 1
    return PoolRow(min_tokens=ints["min_tokens"], max_tokens=ints["max_tokens"], gpu=gpu, phase=phase,
                   hardware=hardware_of(d.get("profile"), gpu), replicas=ints["replicas"],
                   physical_gpus_per_replica=per, physical_gpus=ints["replicas"] * per)


def _arrival_rate(pools: list) -> float | None:
    total = 0.0
    for d in pools:
        if d.get("phase", "both") == "decode":
            continue
        a = d.get("analytic")
        if not isinstance(a, dict):
            a = d
        v = _number(a.get("arrival_rate"))
        if v is None:
            return None
        total += v
    return total


def _side(path: Path, command: str, document: dict, plan: dict, field: str, label: str, instance: str | None,
          pools: list) -> PlanSide:
    rows = tuple(_pool_row(path, f"{field}pools[{k}]", d) for k, d in enumerate(pools))
    analytic = plan.get("analytic")
    if not isinstance(analytic, dict):
        analytic = plan
    cost = _number(analytic.get("cost_per_hr"))
    if cost is None:
        raise InstanceError(format_problem(path, f"{field}analytic.cost_per_hr",
                                           f"must be a number; got {json_kind(analytic.get('cost_per_hr'))}"))
    year = _number(analytic.get("cost_per_year"))
    sim = plan.get("simulated")
    if isinstance(sim, dict) and isinstance(sim.get("slo_met"), bool):
        ci = sim.get("ttft_p99_ci_ms")
        verdict, source, p99 = sim["slo_met"], "simulated", _number(sim.get("ttft_p99_ms"))
        interval = (_number(ci[0]), _number(ci[1])) if isinstance(ci, list) and len(ci) == 2 else None
    else:
        met = analytic.get("slo_met")
        verdict, source, p99, interval = (met if isinstance(met, bool) else None), "analytic", \
            _number(analytic.get("ttft_p99_ms")), None
    overrides = document.get("overrides")
    fleet = plan.get("fleet")
    return PlanSide(file=str(path), command=command, instance=instance, label=label,
                    fleet=fleet if isinstance(fleet, str) else None,
                    overrides=tuple(str(o) for o in overrides) if isinstance(overrides, list) else (),
                    slo_ttft_p99_ms=_number(document.get("slo_ttft_p99_ms")), arrival_rate=_arrival_rate(pools),
                    rows=rows, physical_gpus=sum(r.physical_gpus for r in rows),
                    total_replicas=sum(r.replicas for r in rows), cost_per_hr=cost,
                    cost_per_year=cost * _HOURS if year is None else year,
                    power_kw=_number(analytic.get("power_kw")), tok_per_watt=_number(analytic.get("tok_per_watt")),
                    usd_per_million_output_tokens=_number(analytic.get("usd_per_million_output_tokens")),
                    slo_met=verdict, slo_source=source, ttft_p99_ms=p99, ttft_p99_ci_ms=interval)


def read_plan(path: str | Path, plan: int | None = None, *, flag: str = "--plan") -> PlanSide:
    """Plan ``plan`` (1-based; None: the selected plan of a solve, the first fleet of an evaluate) of a result
    document (module docstring).

    Raises
    ------
    InstanceError
        One line ``FILE: field: problem``: unreadable, not JSON, not a result document, the plan index out of
        range, a pool without its segment, GPU option or replicas, a plan without its $/hr.
    """
    path = Path(path)

    def fail(field: str, message: str) -> InstanceError:
        return InstanceError(format_problem(path, field, message))

    data, problem = read_json(path)
    if problem is not None:
        raise fail("", problem if "nested" in problem else f"{problem}; {_HINT}")
    command = data.get("command") if isinstance(data, dict) else None
    if command not in PLAN_COMMANDS:
        got = json_kind(command) if isinstance(data, dict) else f"the document is {json_kind(data)}"
        raise fail("command", f"not a plan ({_HINT}); got {got}")
    if command == "solve":
        s = read_solve_plan(path, plan, flag=flag)
        return _side(path, command, s.document, s.plan, s.field, s.label, s.instance, s.pools)
    instance = data.get("instance") if isinstance(data.get("instance"), str) else None
    if command == "evaluate":
        fleets = data.get("fleets")
        if not isinstance(fleets, list) or not fleets:
            raise fail("fleets", f"must be a non-empty list of fleets; got {json_kind(fleets)}")
        k = 1 if plan is None else plan
        if not 1 <= k <= len(fleets):
            raise fail("fleets", f"{flag} {k}: the file holds {len(fleets)} fleet(s)")
        chosen, field, label = fleets[k - 1], f"fleets[{k - 1}].", f"fleet {k}"
        if not isinstance(chosen, dict):
            raise fail(field[:-1], f"must be a mapping with pools; got {json_kind(chosen)}")
    else:
        if plan not in (None, 1):
            raise fail("pools", f"{flag} {plan}: a simulate document holds one fleet")
        chosen, field, label = data, "", "the simulated fleet"
    pools = chosen.get("pools")
    if not isinstance(pools, list) or not pools:
        raise fail(f"{field}pools", f"must be a non-empty list of pools; got "
                                    f"{'an empty list' if pools == [] else json_kind(pools)}")
    return _side(path, command, data, chosen, field, label, instance, pools)


def parse_plan_flag(text: str | None, flag: str = "--plan") -> tuple[int | None, int | None]:
    """``--plan N`` (both files' plan N) or ``--plan N:M`` (A's N, B's M); None: each file's default plan.

    >>> parse_plan_flag("2"), parse_plan_flag("1:3"), parse_plan_flag(None)
    ((2, 2), (1, 3), (None, None))
    """
    if text is None:
        return None, None
    parts = str(text).split(":")
    nums = [whole_number(int(p), 1, 10**6) if p.strip().isdigit() else None for p in parts]
    if len(parts) not in (1, 2) or any(n is None for n in nums):
        raise InstanceError(f"{flag}: {text!r} is not N or N:M (plan numbers from 1: solve's solutions, "
                            "evaluate's fleets)")
    return (nums[0], nums[0]) if len(nums) == 1 else (nums[0], nums[1])


# --------------------------------------------------------------------------------------------
# The diff
# --------------------------------------------------------------------------------------------


def _minus(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= _REL * max(abs(a), abs(b), 1.0)


@dataclass(frozen=True, kw_only=True)
class PlanDiff:
    """What changes from plan A to plan B (module docstring)."""

    a: PlanSide
    b: PlanSide
    change: FleetChange
    instance_note: str | None
    """One line naming what differs between the two plans' instances (None: the same instance)."""

    @property
    def same_instance(self) -> bool:
        return self.instance_note is None

    def delta(self) -> dict:
        """B minus A of each headline figure (None where a side's figure is null)."""
        a, b = self.a, self.b
        return {"physical_gpus": b.physical_gpus - a.physical_gpus,
                "total_replicas": b.total_replicas - a.total_replicas,
                "cost_per_hr": b.cost_per_hr - a.cost_per_hr, "cost_per_year": b.cost_per_year - a.cost_per_year,
                "power_kw": _minus(b.power_kw, a.power_kw), "tok_per_watt": _minus(b.tok_per_watt, a.tok_per_watt),
                "usd_per_million_output_tokens": _minus(b.usd_per_million_output_tokens,
                                                        a.usd_per_million_output_tokens)}

    def to_json(self) -> dict:
        """The document, built by its model (:class:`fleetopt.optimizer.output.contract.workflows.DiffDocument`)."""
        same = self.a.instance if self.a.instance == self.b.instance else None
        return build(DiffDocument, self, schema_version=SCHEMA_VERSION, command="diff", instance=same,
                     a=self.a.to_json(), b=self.b.to_json(), change=self.change.to_json(), delta=self.delta())


def _instance_note(a: PlanSide, b: PlanSide) -> str | None:
    diffs = []
    if a.instance != b.instance:
        diffs.append(f"instance {a.instance} vs {b.instance}")
    if not _close(a.arrival_rate, b.arrival_rate):
        diffs.append(f"arrival rate {'-' if a.arrival_rate is None else f'{a.arrival_rate:g}'} vs "
                     f"{'-' if b.arrival_rate is None else f'{b.arrival_rate:g}'} req/s")
    if not _close(a.slo_ttft_p99_ms, b.slo_ttft_p99_ms):
        diffs.append(f"P99 TTFT SLO {a.slo_ttft_p99_ms} vs {b.slo_ttft_p99_ms} ms")
    if a.overrides != b.overrides:
        diffs.append(f"overrides [{', '.join(a.overrides)}] vs [{', '.join(b.overrides)}]")
    if not diffs:
        return None
    return "the plans are of different instances (compared all the same): " + "; ".join(diffs)


def diff_plans(a: PlanSide, b: PlanSide) -> PlanDiff:
    """The change from plan ``a`` to plan ``b``."""
    return PlanDiff(a=a, b=b, change=compare_pools(a.rows, b.rows, a.cost_per_hr, b.cost_per_hr),
                    instance_note=_instance_note(a, b))


def diff_files(path_a: str | Path, path_b: str | Path, plan_a: int | None = None, plan_b: int | None = None,
               *, flag: str = "--plan") -> PlanDiff:
    """:func:`diff_plans` of plan ``plan_a`` of the file ``path_a`` and plan ``plan_b`` of ``path_b``
    (:func:`read_plan`; its errors)."""
    return diff_plans(read_plan(path_a, plan_a, flag=flag), read_plan(path_b, plan_b, flag=flag))
