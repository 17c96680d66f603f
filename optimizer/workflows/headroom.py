r"""Headroom (``fleetopt headroom``): the largest arrival rate a fleet carries, and where the optimal fleet steps.

Analytic limit of a fixed fleet (:func:`headroom`)
---------------------------------------------------
Under length routing pool :math:`p` receives the fixed share :math:`s_p` of the requests (its routing share), so
at a fleet rate :math:`\lambda` it sees :math:`\lambda_p = s_p \lambda` and nothing else; its analytic result at
its fixed count depends on :math:`\lambda` alone. The pool *carries* :math:`\lambda` when, evaluated through the
evaluate path (:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`, the instance's ``ttft_model``):

* it is stable (utilisation below 1) and its P99 TTFT meets the SLO (and its TPOT bound the TPOT SLO, if any):
  ``PoolResult.slo_met``;
* its capacity load is within the utilisation cap: ``PoolResult.utilization_ok``.

Its limit is

.. math:: \lambda_p^* = \max\{\lambda = k\,\delta : k \in \mathbb{N},\ \text{pool } p \text{ carries } \lambda\},
          \qquad \lambda^* = \min_p \lambda_p^*,

on the grid :math:`\delta` = :data:`RATE_TOLERANCE_REQ_PER_S` (0.01 req/s): the pool carries
:math:`\lambda_p^*` and not :math:`\lambda_p^* + \delta`. The *binding* pool is the arg-min; the reason is read at
its first rate it does not carry. The search brackets the limit by doubling from the instance's rate, then
bisects on the grid index (:func:`fleetopt.models.numerics.bisect_boundary` over :math:`x \mapsto` carries at
:math:`\lfloor x \rfloor \delta`, each grid point evaluated once), which is exact when "carries" is monotone in
:math:`\lambda` (more load never lowers a P99 or a load). A pool with no traffic has no limit. Under a
fleet-scope SLO (``slo.scope: fleet``) the pools' conditions are stability and the cap, and the fleet-wide P99 is
one more limit, searched the same way on the whole fleet.

The fleet is also checked against the instance's limits at the instance's own rate, as ``fleetopt evaluate``
checks a given fleet (:func:`fleetopt.optimizer.plan.evaluate.limit_violations`: GPU inventories
``max_count``/``min_count`` and pool counts, ``constraints.max_total_gpus``/``max_power_kw``/
``max_cost_per_hr``/``max_utilization``). A fleet that breaks one is flagged (``violations``; the command exits
6, ``limits_broken``): its headroom is that of a fleet the instance does not allow.

Simulated limit (``--verify``, :func:`simulated_limit`)
--------------------------------------------------------
Each pool is simulated *alone* at its share of the fleet rate, as the per-pool simulated sizing does
(:func:`fleetopt.optimizer.simulation.pool_sizing.pool_instance`: the workload conditioned on the pool's window
at rate :math:`s_p \lambda`; under length routing a pool's latencies depend on its own requests only), so the
pool's share stays fixed and every simulated request lands in the pool being tested. Each rate runs the same
options with the same seed and the same request count (common random numbers: the lengths are the same draw
and the arrival instants scale with :math:`1/\lambda`, so two rates differ by the rate, not by the sample). A
pool meets the SLO as ``fleetopt simulate`` judges it (``slo_met_sim``: the upper end of its 95 % P99 TTFT
interval within the SLO); the simulator knows no utilisation cap, so the simulated limit is the SLO's alone. The
search starts at the pool's analytic limit, widens by :data:`SIM_BRACKET_FACTOR` until one grid rate passes and
another fails, then bisects on the grid of ``tolerance_req_per_s``. Simulated P99s are noisy, so a pool's result
is a bracket (the largest passing and the smallest failing grid rate found), not a proof of monotonicity; the
fleet's simulated limit is the least over its pools. Needs a pool-scope SLO and no compress-and-route pools.

Steps of the optimal fleet (:func:`fleet_steps`)
------------------------------------------------
Over integer offsets :math:`\lambda_k = \lambda_{lo} + k` in :math:`[\lambda_{lo}, \lambda_{hi}]` (and
:math:`\lambda_{hi}` itself), the least-cost fleet is re-solved (:func:`fleetopt.optimizer.plan.solve.solve_instance`,
the MIP or its exact graph oracle) at the instance with its rate set to :math:`\lambda_k`. A larger rate only
removes fleets from the feasible set, so the optimal cost :math:`C(\lambda)` is non-decreasing; a *step* is a
rate where it rises. Equal costs at the two ends of an interval mean no step inside, so each step is found by
bisection on the index (to 1 req/s) and the solves are :math:`O(\text{steps} \cdot \log_2 n)`. The plateau before a
step is the fleet that must grow before the rate reaches the step ("add capacity before :math:`\lambda` reaches
..."). Only the cost objective has this monotone structure (``objective: cost``).

Each step is also a *change* (what to add), by the pool matching of ``fleetopt diff``
(:func:`fleetopt.optimizer.workflows.diff.compare_pools`): ``change_from_previous`` from the plateau before it,
and ``change`` from the reference: the instance's current fleet (``current``, a ``--fleet`` spec evaluated at the
instance's own rate, counts fixed as :func:`fixed_pools` fixes them) when given, else the plateau before. Per
hardware the changes from the previous plateau telescope: the first plateau's physical GPUs plus every step's
``change_from_previous`` equal the last plateau's.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import cast

import numpy as np

from fleetopt.models.fleet import FleetResult, PoolPlan, PoolResult
from fleetopt.models.profiles import replica_unit
from fleetopt.models.numerics import bisect_boundary
from fleetopt.models.units import MS_PER_S

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.evaluate import evaluate_plans, limit_violations, parse_fleet
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.workflows.diff import FleetChange, PoolRow, compare_pools, result_rows

__all__ = ["SCHEMA_VERSION", "RATE_TOLERANCE_REQ_PER_S", "MAX_RATE_REQ_PER_S", "SIM_BRACKET_FACTOR",
           "SIM_BRACKET_STEPS", "SIM_RULE", "PoolLimit", "SimProbe", "PoolSimLimit", "SimLimit", "Headroom",
           "RangePoint", "FleetStep", "StepSchedule", "fleet_change", "at_rate", "fixed_pools", "headroom",
           "simulated_limit", "fleet_steps",
           "parse_range", "MAX_RANGE_POINTS"]

from fleetopt.optimizer.output.contract import SCHEMA_VERSION  # noqa: E402 (one contract version)
from fleetopt.optimizer.output.contract import build  # noqa: E402
from fleetopt.optimizer.output.contract.workflows import (HeadroomDocument, HeadroomRangeDocument,  # noqa: E402
                                                          _RangeFleet, _RangeStep, _HeadroomPool, _HeadroomPoolSim,
                                                          _HeadroomProbe, _HeadroomSim)
"""Version of the JSON contracts of :meth:`Headroom.to_json` and :meth:`StepSchedule.to_json`."""
RATE_TOLERANCE_REQ_PER_S = 0.01
r"""Grid :math:`\delta` of the analytic limit (req/s): the limit is carried, the limit plus :math:`\delta` is not."""
MAX_RATE_REQ_PER_S = 1.0e7
"""The bracket search gives up beyond this fleet rate (req/s) and reports the pool as unlimited there."""
SIM_BRACKET_FACTOR = 1.25
"""``--verify``: the simulated bracket widens by this factor per step from the analytic limit."""
SIM_BRACKET_STEPS = 12
"""``--verify``: widening steps before the simulated search reports no bracket (1.25^12 is about 14.6)."""
SIM_RULE = "upper end of the pool's 95 % P99 TTFT interval within the SLO (simulate's slo_met_sim)"
"""What "meets the SLO in simulation" means here (``SimReport.slo_met``)."""
MAX_RANGE_POINTS = 100_000
"""Largest number of integer rates a ``--range`` may span."""
_COST_DIGITS = 6
_RANGE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*:\s*([0-9]*\.?[0-9]+)\s*$")


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolLimit:
    """One pool's analytic limit: the largest fleet rate (req/s) at which it carries its share."""

    min_tokens: int
    max_tokens: int
    gpu: str
    replicas: int
    routing_share: float
    max_arrival_rate: float
    """:math:`\\lambda_p^*` (inf: no traffic, or no limit below :data:`MAX_RATE_REQ_PER_S`)."""
    limited_by: str
    """What fails just above the limit: ``P99 TTFT``, ``utilization cap``, ``stability``, ``TPOT`` or ``""``."""
    ttft_p99_ms: float
    """The pool's analytic P99 TTFT at the limit."""
    capacity_load: float
    """The pool's capacity load at the limit (the quantity the utilisation cap bounds)."""
    ttft_p99_ms_above: float
    """The pool's analytic P99 TTFT one grid step above the limit."""
    capacity_load_above: float

    @property
    def label(self) -> str:
        return f"{self.min_tokens}-{self.max_tokens}:{self.gpu}x{self.replicas}"

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._HeadroomPool`) from these
        fields."""
        return build(_HeadroomPool, self, pool_arrival_rate=self.routing_share * self.max_arrival_rate)


@dataclass(frozen=True)
class SimProbe:
    """One simulated rate of a pool's search: the pool alone at its share of the fleet rate ``arrival_rate``."""

    arrival_rate: float
    """The fleet rate (req/s)."""
    pool_arrival_rate: float
    slo_met: bool
    ttft_p99_ms: float
    ttft_p99_ci_ms: tuple[float, float]
    requests: int
    """Measured requests of the pool (all replications)."""

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._HeadroomProbe`) from these
        fields."""
        return build(_HeadroomProbe, self)


@dataclass(frozen=True)
class PoolSimLimit:
    """One pool's simulated limit: the largest passing and the smallest failing fleet rate found on the grid."""

    label: str
    share: float
    max_arrival_rate_sim: float | None
    """Largest fleet rate found at which the pool meets the SLO in simulation (None: none passed)."""
    min_failing_rate_sim: float | None
    """Smallest fleet rate found at which it misses (None: none failed within the bracket search)."""
    probes: tuple[SimProbe, ...]

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._HeadroomPoolSim`)."""
        return build(_HeadroomPoolSim, self, pool=self.label, routing_share=self.share,
                     probes=[q.to_json() for q in self.probes])


@dataclass(frozen=True)
class SimLimit:
    """The simulated limit of a fleet: the least of its pools' (module docstring)."""

    pools: tuple[PoolSimLimit, ...]
    max_arrival_rate_sim: float | None
    """Least over the pools of the largest passing fleet rate (None: a pool passed at no rate tried)."""
    binding_pool: int | None
    tolerance_req_per_s: float
    options: SimOptions
    rule: str = SIM_RULE
    ci: str = "95 % interval of the pool's P99 TTFT over independent replications (batch means with one)"

    @property
    def simulations(self) -> int:
        return sum(len(q.probes) for q in self.pools)

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._HeadroomSim`)."""
        return build(_HeadroomSim, self,
                     binding_pool=None if self.binding_pool is None else self.pools[self.binding_pool].label,
                     options=self.options.to_json(), pools=[q.to_json() for q in self.pools])


@dataclass(frozen=True)
class Headroom:
    """The analytic limit of a fixed fleet, per pool and overall, and the simulated one when asked."""

    instance: str
    fleet: str
    arrival_rate: float
    """The instance's own rate (req/s)."""
    slo_ttft_p99_ms: float
    ttft_model: str
    scope: str
    max_utilization: float
    pools: tuple[PoolLimit, ...]
    max_arrival_rate: float
    binding_pool: int | None
    """Index into :attr:`pools` of the binding pool; None when the fleet-wide P99 binds (fleet scope) or nothing."""
    limited_by: str
    fleet_p99_limit: float | None = None
    """Fleet scope only: the largest rate at which the fleet-wide P99 meets the SLO."""
    tolerance_req_per_s: float = RATE_TOLERANCE_REQ_PER_S
    evaluations: int = 0
    """Analytic evaluations of the fleet the search made."""
    sim: SimLimit | None = None
    overrides: tuple[str, ...] = ()
    violations: tuple[str, ...] = ()
    """Every limit of the instance the fleet breaks at the instance's rate
    (:func:`fleetopt.optimizer.plan.evaluate.limit_violations`); empty: within every limit."""
    slo_met: bool = True
    """The fleet meets its SLO at the instance's rate (its limit is at or above that rate)."""

    @property
    def binding_label(self) -> str | None:
        if self.binding_pool is not None:
            return self.pools[self.binding_pool].label
        return "fleet P99 TTFT" if self.fleet_p99_limit is not None and math.isfinite(self.max_arrival_rate) else None

    def to_json(self) -> dict:
        """The document, built by its model (:class:`fleetopt.optimizer.output.contract.workflows.HeadroomDocument`);
        the simulated limit (``max_arrival_rate_sim``, ``sim``) only with ``--verify``."""
        sim = {} if self.sim is None else {"max_arrival_rate_sim": self.sim.max_arrival_rate_sim,
                                           "sim": self.sim.to_json()}
        return build(HeadroomDocument, self, schema_version=SCHEMA_VERSION, command="headroom", source="analytic",
                     binding_pool=self.binding_label, binding_pool_index=self.binding_pool,
                     pools=[p.to_json() for p in self.pools], limits_ok=not self.violations, **sim)


@dataclass(frozen=True)
class RangePoint:
    """The optimal fleet at one rate (``status`` of the solve; no plan: ``fleet`` None and cost inf)."""

    arrival_rate: float
    status: str
    fleet: str | None
    total_gpus: int | None
    total_replicas: int | None
    cost_per_hr: float
    cost_per_year: float
    pools: tuple[tuple[int, int, str, int], ...] = ()
    """``(lo, hi, gpu, replicas)`` per pool."""
    rows: tuple[PoolRow, ...] = ()
    """The pools as ``fleetopt diff`` compares them (phase, hardware, physical GPUs), in :attr:`pools`' order."""

    @property
    def physical_gpus(self) -> int | None:
        return sum(r.physical_gpus for r in self.rows) if self.fleet is not None else None

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._RangeFleet`) from these fields; a
        pool with its :attr:`rows` entry says its phase, hardware and physical GPUs."""
        pools = [{"min_tokens": lo, "max_tokens": hi, "gpu": g, "replicas": n} for lo, hi, g, n in self.pools]
        for d, r in zip(pools, self.rows):
            d.update(phase=r.phase, hardware=r.hardware, physical_gpus=r.physical_gpus)
        return build(_RangeFleet, self, pools=pools)


def fleet_change(a: RangePoint, b: RangePoint) -> FleetChange:
    """The change from fleet ``a`` to fleet ``b`` (no plan: no pools, no cost)."""
    def cost(p: RangePoint) -> float | None:
        return p.cost_per_hr if math.isfinite(p.cost_per_hr) else None

    return compare_pools(a.rows, b.rows, cost(a), cost(b))


@dataclass(frozen=True)
class FleetStep:
    """A rate where the optimal cost rises: ``before`` is optimal up to the previous grid rate, ``after`` at it."""

    arrival_rate: float
    """The first grid rate the ``before`` fleet's cost no longer suffices for ("add capacity before ...")."""
    before: RangePoint
    after: RangePoint
    current: RangePoint | None = None
    """The instance's current fleet (``--fleet``), the reference of :attr:`change`; None: the plateau before."""

    @property
    def change_from_previous(self) -> FleetChange:
        """What to add to the plateau before the step (``before``) to reach ``after``."""
        return fleet_change(self.before, self.after)

    @property
    def change(self) -> FleetChange:
        """What to add to the reference (the current fleet, else ``before``) to reach ``after``."""
        return fleet_change(self.before if self.current is None else self.current, self.after)

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._RangeStep`)."""
        return build(_RangeStep, self, before=self.before.to_json(), after=self.after.to_json(),
                     change=self.change.to_json(), change_from_previous=self.change_from_previous.to_json())


@dataclass(frozen=True)
class StepSchedule:
    """The steps of the optimal fleet over ``[lo, hi]`` and every rate solved to find them."""

    instance: str
    lo: float
    hi: float
    steps: tuple[FleetStep, ...]
    plateaus: tuple[tuple[RangePoint, float | None], ...]
    """Per plateau: the fleet optimal at its first rate and the step rate that ends it (None: lasts to ``hi``)."""
    solved: tuple[RangePoint, ...]
    slo_ttft_p99_ms: float
    ttft_model: str
    overrides: tuple[str, ...] = ()
    current: RangePoint | None = None
    """The instance's current fleet (``--fleet``) at its own rate; None: each step is measured from the one
    before."""

    def to_json(self) -> dict:
        """The document, built by its model
        (:class:`fleetopt.optimizer.output.contract.workflows.HeadroomRangeDocument`)."""
        return build(HeadroomRangeDocument, self, schema_version=SCHEMA_VERSION, command="headroom --range",
                     source="analytic (re-solved at each rate)", range=[self.lo, self.hi],
                     current_fleet=None if self.current is None else self.current.to_json(),
                     reference="previous step" if self.current is None else "current fleet",
                     steps=[s.to_json() for s in self.steps],
                     plateaus=[{**p.to_json(), "add_capacity_before": until,
                                "change": None if self.current is None else fleet_change(self.current, p).to_json()}
                               for p, until in self.plateaus],
                     solved=[p.to_json() for p in sorted(self.solved, key=lambda p: p.arrival_rate)])


# --------------------------------------------------------------------------------------------
# The instance at another rate, the fleet with fixed counts
# --------------------------------------------------------------------------------------------


def at_rate(instance: Instance, arrival_rate_req_per_s: float) -> Instance:
    """``instance`` with its workload's arrival rate set to ``arrival_rate_req_per_s`` (everything else kept)."""
    return replace(instance, workload=replace(instance.workload, arrival_rate_req_per_s=float(arrival_rate_req_per_s)))


def fixed_pools(instance: Instance, fleet: str, field: str = "--fleet") -> tuple[list[PoolPlan], FleetResult]:
    """The pools of a ``--fleet`` spec with every count fixed (a pool without ``xN`` sized at the instance's own
    rate first, as ``fleetopt evaluate`` sizes it) and their evaluation at the instance's rate."""
    spec = parse_fleet(fleet, instance, field)
    if spec.decode:
        raise InstanceError(f"{field}: P/D pairs (PREFILL+DECODE) are not taken here yet; evaluate and simulate "
                            "take them")
    plans = []
    for lo, hi, name, n, gamma, seqs in spec.pools:
        g = instance.gpu(name)
        plans.append(PoolPlan(lo, hi, g.name, g.profile, n, g.availability, gamma, seqs))
    now = evaluate_plans(instance, plans)
    plans = [replace(p, replicas=r.replicas) for p, r in zip(plans, now.pools)]
    return plans, evaluate_plans(instance, plans)


# --------------------------------------------------------------------------------------------
# The analytic limit
# --------------------------------------------------------------------------------------------


def _carries(p: PoolResult) -> bool:
    """Pool-scope condition: stable, P99 (and TPOT) within the SLO, load within the cap."""
    return bool(p.slo_met and p.utilization_ok)


def _stable_within_cap(p: PoolResult) -> bool:
    """Fleet-scope pool condition: stable and within the utilisation cap (the P99 is the fleet's)."""
    return bool(p.utilization < 1.0 and p.utilization_ok)


def _why(p: PoolResult, slo_ms: float, scope: str) -> str:
    if not p.utilization < 1.0:
        return "stability"
    if not p.utilization_ok:
        return "utilization cap"
    if scope == "pool" and p.ttft_p99_ms > slo_ms * (1 + 1e-12):
        return "P99 TTFT"
    if scope == "pool" and not p.slo_met:
        return "TPOT"
    return ""


def _grid_limit(ok: Callable[[float], bool], start: float, delta: float) -> tuple[float, float]:
    """Largest grid rate :math:`k\\delta` with ``ok`` and the next grid rate, for ``ok`` monotone (True below the
    limit). 0 is taken as carried. Returns ``(limit, first failing)``; ``(inf, inf)`` when ``ok`` holds up to
    :data:`MAX_RATE_REQ_PER_S`."""
    hi = max(start, 1.0)
    while ok(hi):
        if hi >= MAX_RATE_REQ_PER_S:
            return math.inf, math.inf
        hi = min(2.0 * hi, MAX_RATE_REQ_PER_S)
    k_hi = math.ceil(hi / delta - 1e-9)
    k_lo = math.floor(hi / (2.0 * delta)) if hi > max(start, 1.0) else 0
    if k_lo > 0 and not ok(k_lo * delta):
        k_lo = 0
    # bisection on the grid index: x is below the boundary while the grid rate floor(x) * delta is carried
    _, first = bisect_boundary(lambda x: np.array(ok(math.floor(float(x)) * delta)), float(k_lo), float(k_hi))
    k = int(first) - 1
    return k * delta, (k + 1) * delta


def headroom(instance: Instance, fleet: str, *, tolerance_req_per_s: float = RATE_TOLERANCE_REQ_PER_S) -> Headroom:
    """The analytic limit of the fleet ``fleet`` (a ``--fleet`` spec) on ``instance`` (module docstring).

    Raises
    ------
    InstanceError
        A bad ``fleet`` spec (one line per problem, naming ``--fleet``).
    """
    if not tolerance_req_per_s > 0:
        raise ValueError(f"tolerance_req_per_s must be > 0; got {tolerance_req_per_s!r}")
    plans, now = fixed_pools(instance, fleet)
    cache: dict[float, FleetResult] = {}

    def result(lam: float) -> FleetResult:
        key = round(lam, 9)
        if key not in cache:
            cache[key] = evaluate_plans(at_rate(instance, lam), plans)
        return cache[key]

    scope = instance.slo.scope
    slo_ms = instance.slo.ttft_p99_s * MS_PER_S
    condition = _carries if scope == "pool" else _stable_within_cap
    start = instance.workload.arrival_rate_req_per_s
    limits = []
    for k, p in enumerate(now.pools):
        if not p.routing_share > 0:
            limits.append(PoolLimit(p.min_tokens, p.max_tokens, p.gpu, p.replicas, p.routing_share, math.inf, "",
                                    0.0, 0.0, 0.0, 0.0))
            continue
        lam, above = _grid_limit(lambda x, k=k: condition(result(x).pools[k]), start, tolerance_req_per_s)
        at, up = (result(lam).pools[k], result(above).pools[k]) if math.isfinite(lam) else (p, p)
        limits.append(PoolLimit(p.min_tokens, p.max_tokens, p.gpu, p.replicas, p.routing_share, lam,
                                _why(up, slo_ms, scope) if math.isfinite(lam) else "", at.ttft_p99_ms,
                                at.capacity_load, up.ttft_p99_ms, up.capacity_load))
    fleet_limit = None
    if scope == "fleet":
        fleet_limit, _ = _grid_limit(lambda x: bool(result(x).feasible), start, tolerance_req_per_s)
    pool_min = min((q.max_arrival_rate for q in limits), default=math.inf)
    best = min(pool_min, math.inf if fleet_limit is None else fleet_limit)
    if fleet_limit is not None and fleet_limit < pool_min:
        binding, why = None, "fleet P99 TTFT"
    elif math.isfinite(pool_min):
        binding = min(range(len(limits)), key=lambda k: limits[k].max_arrival_rate)
        why = limits[binding].limited_by
    else:
        binding, why = None, ""
    spec = ",".join(q.label for q in limits)
    return Headroom(instance.name, spec, start, slo_ms, instance.slo.ttft_model, scope,
                    instance.constraints.max_utilization, tuple(limits), best, binding, why, fleet_limit,
                    tolerance_req_per_s, len(cache), None, tuple(instance.overrides), limit_violations(instance, now),
                    bool(now.slo_met))


# --------------------------------------------------------------------------------------------
# The simulated limit
# --------------------------------------------------------------------------------------------


def _sim_pool(instance: Instance, p: PoolPlan, options: SimOptions, delta: float, start: float,
              progress=None) -> PoolSimLimit:
    """One pool's simulated limit: the pool alone at the fleet rates :math:`k\\delta` (module docstring)."""
    from fleetopt.optimizer.simulation.pool_sizing import pool_instance
    from fleetopt.optimizer.simulation.simulate import simulate_plan

    alone, share = pool_instance(instance, p.lo_tokens, p.hi_tokens)
    plan = [replace(p, lo_tokens=0, compress_gamma=1.0)]
    label = f"{p.lo_tokens}-{p.hi_tokens}:{p.gpu}x{p.replicas}"
    probes: dict[int, SimProbe] = {}

    def ok(k: int) -> bool:
        if k not in probes:
            lam = k * delta
            if progress is not None:
                progress(label, lam)
            q = simulate_plan(at_rate(alone, lam * share), plan, options).pools[0]
            probes[k] = SimProbe(lam, lam * share, bool(q.slo_met_sim), q.ttft_p99_ms_sim,
                                 cast("tuple[float, float]", tuple(q.ttft_p99_ci_ms)), int(q.requests))
        return probes[k].slo_met

    k = max(1, round(start / delta)) if math.isfinite(start) else 1
    k_pass = k_fail = None
    if ok(k):
        k_pass = k
        for _ in range(SIM_BRACKET_STEPS):
            k = max(k + 1, math.ceil(k * SIM_BRACKET_FACTOR))
            if not ok(k):
                k_fail = k
                break
            k_pass = k
    else:
        k_fail = k
        for _ in range(SIM_BRACKET_STEPS):
            k = min(k - 1, math.floor(k / SIM_BRACKET_FACTOR))
            if k < 1:
                break
            if ok(k):
                k_pass = k
                break
            k_fail = k
    if k_pass is not None and k_fail is not None and k_fail - k_pass > 1:
        # bisection on the grid index, each grid rate simulated once
        _, first = bisect_boundary(lambda x: np.array(ok(math.floor(float(x)))), float(k_pass), float(k_fail))
        k_fail = int(first)
        k_pass = max(j for j in probes if j < k_fail and probes[j].slo_met)
    return PoolSimLimit(label, share, None if k_pass is None else k_pass * delta,
                        None if k_fail is None else k_fail * delta,
                        tuple(sorted(probes.values(), key=lambda q: q.arrival_rate)))


def simulated_limit(instance: Instance, fleet: str, options: SimOptions, *, start: Headroom | None = None,
                    tolerance_req_per_s: float = 1.0, progress=None) -> SimLimit:
    """The simulated limit of ``fleet`` (module docstring): each pool alone, searched from its analytic limit
    (``start``, a :func:`headroom` of the same fleet; computed when None).

    ``options`` are the simulation's settings (requests per pool simulation, replications, seed, ...); the same
    options, seed included, run at every rate. ``progress(pool, rate)``, if given, is called before each
    simulation.

    Raises
    ------
    InstanceError
        A fleet-scope SLO or a compress-and-route pool (the pools are not independent there).
    """
    if not tolerance_req_per_s > 0:
        raise ValueError(f"tolerance_req_per_s must be > 0; got {tolerance_req_per_s!r}")
    if instance.slo.scope != "pool":
        raise InstanceError("--verify: the simulated limit is searched pool by pool, which needs slo.scope pool")
    plans, _ = fixed_pools(instance, fleet)
    if any(p.compress_gamma > 1 for p in plans):
        raise InstanceError("--verify: the simulated limit is searched pool by pool, which needs pools without "
                            "@GAMMA (compress-and-route couples neighbouring pools)")
    start = headroom(instance, fleet) if start is None else start
    pools = []
    for p, lim in zip(plans, start.pools):
        if not lim.routing_share > 0:
            pools.append(PoolSimLimit(lim.label, 0.0, None, None, ()))
            continue
        pools.append(_sim_pool(instance, p, options, float(tolerance_req_per_s), lim.max_arrival_rate, progress))
    found = [(q.max_arrival_rate_sim, k) for k, q in enumerate(pools) if q.share > 0]
    if any(q.max_arrival_rate_sim is None for q in pools if q.share > 0):
        best, binding = None, next(k for k, q in enumerate(pools) if q.share > 0 and q.max_arrival_rate_sim is None)
    elif found:
        best, binding = min(found)
    else:
        best, binding = None, None
    return SimLimit(tuple(pools), best, binding, float(tolerance_req_per_s), options)


# --------------------------------------------------------------------------------------------
# Steps of the optimal fleet over a range of rates
# --------------------------------------------------------------------------------------------


def parse_range(text: str, field: str = "--range") -> tuple[float, float]:
    """``"25:400"`` -> ``(25.0, 400.0)``: two rates in req/s, :math:`0 < lo < hi`, at most
    :data:`MAX_RANGE_POINTS` integer steps apart.

    Examples
    --------
    >>> parse_range("25:400")
    (25.0, 400.0)
    """
    m = _RANGE_RE.match(str(text))
    if not m:
        raise InstanceError(f"{field}: {text!r} is not LO:HI (two arrival rates in req/s, e.g. 25:400)")
    lo, hi = float(m[1]), float(m[2])
    if not 0 < lo < hi:
        raise InstanceError(f"{field}: {text!r}: the rates must satisfy 0 < LO < HI")
    if hi - lo > MAX_RANGE_POINTS:
        raise InstanceError(f"{field}: {text!r} spans more than {MAX_RANGE_POINTS:,} req/s")
    return lo, hi


def _range_point(instance: Instance, lam: float, status: str, f: FleetResult) -> RangePoint:
    """A fleet evaluated at rate ``lam`` as a :class:`RangePoint` (its pools also as ``diff`` compares them)."""
    units = {g.name: replica_unit(g.profile) for g in instance.gpus}
    profiles = {g.name: g.profile.name for g in instance.gpus}
    spec = ",".join(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}" for p in f.pools)
    return RangePoint(lam, status, spec, f.total_gpus, f.total_replicas, f.cost_per_hr, f.cost_per_year,
                      tuple((p.min_tokens, p.max_tokens, p.gpu, p.replicas) for p in f.pools),
                      result_rows(f, units, profiles))


def _point(instance: Instance, lam: float, options: SolveOptions) -> RangePoint:
    rep = solve_instance(at_rate(instance, lam), options)
    if rep.best is None:
        return RangePoint(lam, str(rep.status), None, None, None, math.inf, math.inf)
    return _range_point(instance, lam, str(rep.status), rep.best.fleet)


def fleet_steps(instance: Instance, lo: float, hi: float, options: SolveOptions = SolveOptions(),  # noqa: B008 frozen dataclass default
                current: str | None = None) -> StepSchedule:
    """The steps of the least-cost fleet over the rates ``lo + k`` in ``[lo, hi]`` and ``hi`` (module docstring);
    ``current``: the instance's current fleet (a ``--fleet`` spec), the reference of each step's change.

    Raises
    ------
    InstanceError
        A bad range or ``current`` spec, or an instance whose objective is not ``cost`` (the steps follow the
        least cost).
    """
    if not 0 < lo < hi or hi - lo > MAX_RANGE_POINTS:
        raise InstanceError(f"--range: {lo:g}:{hi:g}: the rates must satisfy 0 < LO < HI, at most "
                            f"{MAX_RANGE_POINTS:,} req/s apart")
    if instance.objective != "cost":
        raise InstanceError(f"--range: the steps follow the least-cost fleet; the instance's objective is "
                            f"{instance.objective!r} (give --set objective=cost)")
    now = None
    if current is not None:
        _, evaluated = fixed_pools(instance, current)
        now = _range_point(instance, instance.workload.arrival_rate_req_per_s, "given", evaluated)
    rates = [lo + k for k in range(int(math.floor(hi - lo + 1e-9)) + 1)]
    if rates[-1] < hi - 1e-9:
        rates.append(hi)
    points: dict[int, RangePoint] = {}

    def point(i: int) -> RangePoint:
        if i not in points:
            points[i] = _point(instance, rates[i], options)
        return points[i]

    def key(i: int) -> float:
        c = point(i).cost_per_hr
        return round(c, _COST_DIGITS) if math.isfinite(c) else math.inf

    last = len(rates) - 1
    steps, plateaus, i = [], [], 0
    while key(i) != key(last):
        base = key(i)
        _, first = bisect_boundary(lambda x, base=base: np.array(key(int(math.floor(float(x)))) == base),
                                   float(i), float(last))
        j = int(first)
        steps.append(FleetStep(rates[j], point(j - 1), point(j), now))
        plateaus.append((point(i), rates[j]))
        i = j
    plateaus.append((point(i), None))
    return StepSchedule(instance.name, lo, hi, tuple(steps), tuple(plateaus), tuple(points.values()),
                        instance.slo.ttft_p99_s * MS_PER_S, instance.slo.ttft_model, tuple(instance.overrides), now)
