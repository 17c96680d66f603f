r"""Why a solve has no plan, in one sentence: the binding requirement of an infeasible instance
(:func:`explain_infeasible`), or why the solver stopped before it found one (:func:`explain_stop`); and why a
plan is what it is (:func:`explain_plan`, the data of ``solve --explain``).

What relaxing a limit is worth (:func:`explain_plan`)
-----------------------------------------------------
Each limit of the instance is relaxed on its own and the instance re-solved (an ordinary solve of the instance
re-loaded with one more ``--set`` override, :mod:`fleetopt.optimizer.io.overrides`):

* ``constraints.max_power_kw`` + 1 kW (when set);
* ``gpus.NAME.max_count`` + 1 GPU, for every ``gpus`` entry with a ``max_count`` (one per entry: its tp/dtype
  configurations share it);
* ``constraints.max_cost_per_hr`` x 1.1 (when set);
* ``slo.ttft_p99_ms`` x 1.1 (a 10 % looser SLO);
* ``slo.ttft_margin`` to 0 (when set: what the sizing margin costs);
* ``pools.max_pools`` + 1.

Its *worth* is :math:`\Delta = z^* - z^*_{relaxed}` in the objective's unit ($/hr, kW, ...): a relaxation only
enlarges the feasible set, so :math:`\Delta \ge 0` for proven optima, and the limit *binds* when
:math:`\Delta > 10^{-9} \max(1, |z^*|)`. A relaxed solve that does not end optimal reports ``None``.

Each pool's *bottleneck* is what fails with one replica fewer (its count is the least meeting every condition,
so one fewer breaks at least one), checked in this order on the exact analytic evaluation at :math:`n - 1`:
``slots`` (the pool is unstable: its batch places cannot carry the load), ``utilisation cap`` (capacity load
above ``max_utilization``), ``TPOT`` (the batch cap breaks the TPOT SLO), ``prefill time`` (the P99 TTFT misses
and the pool's own P99 prefill takes at least half the SLO), ``P99 TTFT`` (it misses by waiting), each against
the sizing target (the SLO less ``slo.ttft_margin``); ``one
replica`` when :math:`n = 1`. Its *headroom* is the largest fleet arrival rate at which the pool still carries its
share at its count (the bisection of :func:`fleetopt.optimizer.workflows.headroom.headroom`, passed in as
``headroom``: this module sits below the workflows).

Which configuration a pool runs (:func:`pool_configurations`)
--------------------------------------------------------------
A ``gpus`` entry that lists several ``tp``/``dtype`` values gives the MIP one GPU option per configuration that fits.
For each pool of the plan on such an entry, every configuration is put in the pool's place in turn, sized to its least
count meeting every condition on the pool's range (the same analytic evaluation as the plan's, the other pools
unchanged), and priced in the objective's unit: the chosen one wins when it is the cheapest there; a dearer one is
said to need more replicas or more GPUs, or a dearer GPU-hour; one that cannot serve the range says why (its KV cache
holds no sequence of the window, the SLO cannot be met at any count); one that does not fit at all keeps the reason it
was skipped when the instance was loaded. Where an alternative is cheaper on the pool alone, the fleet's shared limits
(the entry's ``max_count``/``max_pools``, power, budget, a fleet-scope SLO) chose otherwise, and the line says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


from fleetopt.solvers.oracle import NoFleetError, shortest_fleet
from fleetopt.solvers.outcome import Termination
from fleetopt.solvers.problem import FleetProblem

from fleetopt.optimizer.plan.candidates import Candidates
from fleetopt.optimizer.io.instance import Instance

__all__ = ["explain_infeasible", "explain_stop", "explain_plan", "pool_configurations", "Explanation", "Relaxation",
           "PoolBottleneck", "PoolConfigurations", "ConfigurationCost", "BOTTLENECKS", "BINDING_REL"]

BOTTLENECKS = ("slots", "utilisation cap", "TPOT", "prefill time", "P99 TTFT", "one replica")
"""Bottleneck labels of :func:`explain_plan`, in the order they are checked."""
BINDING_REL = 1e-9
"""A relaxation binds when it lowers the objective by more than this share of it (or of 1)."""
PREFILL_SHARE = 0.5
"""``prefill time`` rather than ``P99 TTFT``: the pool's P99 prefill takes at least this share of the SLO."""


def explain_infeasible(instance: Instance, allc: Candidates, problem: FleetProblem | None, result) -> str:
    """Check the requirements one at a time, cheapest first, and report the first that cannot hold (``problem``
    may be None when ``allc`` has an uncovered range: the first check names it)."""
    b = allc.boundaries
    slo_ms = instance.slo.ttft_p99_s * 1000.0
    # 1. some length range that no feasible candidate covers
    k = allc.uncovered()
    if k is not None:
        best_per_gpu = {}
        for d in allc.dropped:  # each GPU's best attempt: its widest pool covering the range
            if d.hi_tokens >= b[k + 1] and d.lo_tokens <= b[k]:
                width = d.hi_tokens - d.lo_tokens
                if d.gpu not in best_per_gpu or width > best_per_gpu[d.gpu][0]:
                    best_per_gpu[d.gpu] = (width, d)
        detail = "; ".join(f"{g} on {d.lo_tokens:,}-{d.hi_tokens:,}: {d.reason}"
                           for g, (_, d) in sorted(best_per_gpu.items()))
        margin = instance.slo.ttft_margin
        within = f"a P99 TTFT of {instance.slo.sizing_text()}" if margin else f"{slo_ms:,.0f} ms P99 TTFT"
        if instance.slo.tpot_p99_s is not None:
            within += f" and a P99 TPOT of {instance.slo.tpot_p99_s * 1000.0:,.4g} ms"
        if margin:
            within += "; slo.ttft_margin=0 sizes to the SLO itself"
        return f"no configuration serves {int(b[k]):,}-{int(b[k + 1]):,}-token requests within {within} ({detail})"
    # 2. the pool count
    assert problem is not None                      # only an uncovered range is explained without a problem
    free = _relaxed(problem)
    try:
        shortest_fleet(free)
    except NoFleetError:
        return f"no tiling of 0-{int(b[-1]):,} tokens uses at most {problem.max_pools} feasible pools"
    # 3. each cap on its own, against its own minimum
    checks = [("power", problem.max_power_w, 1e-3, "kW",
               "the power cap of {cap:,.2f} kW is below the {low:,.2f} kW minimum"),
              ("cost", problem.max_cost_per_hr, 1.0, "$/hr",
               "the budget of ${cap:,.2f}/hr is below the ${low:,.2f}/hr minimum"),
              ("gpus", problem.max_total_gpus, 1.0, "GPUs",
               "the limit of {cap:,.0f} GPUs is below the {low:,.0f}-GPU minimum")]
    for kind, cap, scale, _unit, text in checks:
        if cap is None:
            continue
        low = _minimum(free, kind) * scale
        if low > cap * scale * (1 + 1e-9):
            return text.format(cap=cap * scale, low=low)
    caps = problem.gpu_max_gpus
    limited = [cap for cap in caps if cap is not None]
    if len(limited) == len(caps):  # every option limited: any plan fits in their inventories together
        low = _minimum(free, "gpus")
        if low > sum(limited):
            each = ", ".join(f"{n}.max_count {cap:,}" for n, cap in zip(problem.gpu_names, limited))
            return (f"the inventories ({each}) hold {sum(limited):,} GPUs, below the {low:,.0f}-GPU minimum of any "
                    "plan (GPUs as each option prices them: replicas x gpus_per_replica)")
    for g, cap in enumerate(problem.gpu_max_gpus):
        if cap is not None and problem.gpu_min_gpus[g] > cap:
            return f"gpus[{g}] ({problem.gpu_names[g]}): min_count {problem.gpu_min_gpus[g]} exceeds max_count {cap}"
    assert problem.gpu_min_pools is not None                # FleetProblem.__post_init__ fills it
    if sum(problem.gpu_min_pools) > problem.max_pools:
        return (f"the GPU options ask for at least {sum(problem.gpu_min_pools)} pools (min_pools), "
                f"more than pools.max_pools = {problem.max_pools}")
    limits = [f"{n} <= {v}" for n, v in (("max_power_kw", instance.constraints.max_power_kw),
                                          ("max_cost_per_hr", instance.constraints.max_cost_per_hr),
                                          ("max_total_gpus", instance.constraints.max_total_gpus)) if v is not None]
    entries = instance.gpu_inventories()    # a gpus entry's limits bind the sum over its tp/dtype configurations
    limits += [f"{g.name}.max_count <= {g.max_count}" for g in entries if g.max_count is not None]
    limits += [f"{g.name}.min_count >= {g.min_count}" for g in entries if g.min_count]
    limits += [f"{g.name}.max_pools <= {g.max_pools}" for g in entries if g.max_pools is not None]
    limits += [f"{g.name}.min_pools >= {g.min_pools}" for g in entries if g.min_pools]
    return ("each limit can be met on its own, but not all together: " + ", ".join(limits)
            + f" (solver: {result.message or result.termination.value})")


def explain_stop(result) -> str:
    """Why a solve that proved nothing about feasibility ended without a plan (``result``: a
    :class:`~fleetopt.solvers.mip.SolveResult` without solutions); names the solver's own condition."""
    said = f" ({result.solver}: {result.condition})" if result.condition else ""
    open_question = "; the instance may still be feasible"
    if result.termination is Termination.TIME_LIMIT:
        limit = result.options.get("time_limit_s")
        at = f" of {limit:g} s" if limit is not None else ""
        return f"the solver stopped at its time limit{at} before it found a plan{open_question} (raise --time-limit)"
    if result.termination is Termination.ITERATION_LIMIT:
        return f"the solver stopped at an iteration, node or solution limit before it found a plan{said}{open_question}"
    if result.termination is Termination.INTERRUPTED:
        return f"the solve was interrupted before it found a plan{said}"
    if result.termination is Termination.UNKNOWN:
        return f"the solver stopped without a plan for a reason it did not give or fleetopt does not know{said}"
    return f"the solver ended without a plan: {result.termination.value}{said}"


def _relaxed(problem: FleetProblem, objective: str = "cost") -> FleetProblem:
    from dataclasses import replace

    n = len(problem.gpu_names)
    return replace(problem, gpu_max_gpus=(None,) * n, gpu_min_gpus=(0,) * n, gpu_max_pools=(None,) * n,
                   gpu_min_pools=(0,) * n, max_total_gpus=None, max_cost_per_hr=None, max_power_w=None,
                   max_miss_rate=None, objective=objective)


def _minimum(problem: FleetProblem, kind: str) -> float:
    """Least total power (W), cost ($/hr) or GPUs of any tiling, ignoring the other limits."""
    from dataclasses import replace

    if kind == "power":
        return shortest_fleet(replace(problem, objective="power"))[0] * 1000.0
    if kind == "cost":
        return shortest_fleet(replace(problem, objective="cost"))[0]
    gp = replace(problem, choice_cost_per_hr=problem.choice_gpus.astype(float), objective="cost")
    return shortest_fleet(gp)[0]


# --------------------------------------------------------------------------------------------
# Why a plan is what it is: solve --explain
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Relaxation:
    """One limit relaxed on its own and the instance re-solved (module docstring)."""

    limit: str
    """The instance field, e.g. ``constraints.max_power_kw``."""
    now: float
    relaxed: float
    override: str
    """The ``--set`` override of the re-solve."""
    objective: float | None
    """The re-solve's optimal objective (None: it did not end optimal)."""
    worth: float | None
    """:math:`z^* - z^*_{relaxed}` in the objective's unit (None: unknown)."""
    binding: bool | None
    status: str

    def to_json(self) -> dict:
        return {"limit": self.limit, "now": self.now, "relaxed": self.relaxed, "override": self.override,
                "objective": self.objective, "worth": self.worth, "binding": self.binding, "status": self.status}


@dataclass(frozen=True)
class PoolBottleneck:
    """What sets one pool's count (module docstring), and how far its traffic can grow at that count."""

    pool: str
    replicas: int
    bottleneck: str
    detail: str
    max_arrival_rate: float | None
    """Fleet req/s at which the pool still carries its share at its count (None: not computed)."""
    limited_by: str | None

    def to_json(self) -> dict:
        return {"pool": self.pool, "replicas": self.replicas, "bottleneck": self.bottleneck, "detail": self.detail,
                "max_arrival_rate": self.max_arrival_rate, "limited_by": self.limited_by}


@dataclass(frozen=True)
class Explanation:
    """Which limits bind, what relaxing each is worth, and each pool's bottleneck (module docstring)."""

    instance: str
    objective: str
    objective_unit: str
    objective_value: float
    fleet: str
    relaxations: tuple[Relaxation, ...]
    pools: tuple[PoolBottleneck, ...]
    arrival_rate: float
    configurations: tuple[PoolConfigurations, ...] = ()
    """Per pool on a ``gpus`` entry with ``tp``/``dtype`` lists: its configurations compared (module docstring)."""

    @property
    def binding(self) -> tuple[Relaxation, ...]:
        return tuple(r for r in self.relaxations if r.binding)

    def to_json(self) -> dict:
        out = {"instance": self.instance, "objective": self.objective, "objective_unit": self.objective_unit,
               "objective_value": self.objective_value, "fleet": self.fleet, "arrival_rate": self.arrival_rate,
               "source": "each relaxation an optimal re-solve; bottlenecks from the analytic evaluation at one "
                         "replica fewer",
               "relaxations": [r.to_json() for r in self.relaxations],
               "binding": [r.limit for r in self.binding], "pools": [p.to_json() for p in self.pools]}
        if self.configurations:
            out["configurations"] = [c.to_json() for c in self.configurations]
        return out


@dataclass(frozen=True)
class ConfigurationCost:
    """One tp/dtype configuration of a pool's ``gpus`` entry, in the pool's place (module docstring)."""

    option: str
    """The GPU option (``h100/tp4/fp8``)."""
    tp: int
    dtype: str
    replicas: int | None
    """Its least count on the pool's range (the plan's count for the chosen one); None: it cannot serve the range."""
    gpus: int | None
    cost_per_hr: float | None
    power_kw: float | None
    objective: float | None
    """Its pool's share of the objective, in the objective's unit."""
    chosen: bool
    verdict: str

    def to_json(self) -> dict:
        return {"option": self.option, "tp": self.tp, "dtype": self.dtype, "replicas": self.replicas,
                "gpus": self.gpus, "cost_per_hr": self.cost_per_hr, "power_kw": self.power_kw,
                "objective": self.objective, "chosen": self.chosen, "verdict": self.verdict}


@dataclass(frozen=True)
class PoolConfigurations:
    """A pool on an entry with ``tp``/``dtype`` lists: every configuration compared, and why the chosen one wins."""

    pool: str
    entry: str
    chosen: str
    why: str
    options: tuple[ConfigurationCost, ...]

    def to_json(self) -> dict:
        return {"pool": self.pool, "entry": self.entry, "chosen": self.chosen, "why": self.why,
                "options": [o.to_json() for o in self.options]}


def _pool_objective(instance: Instance, cost_per_hr: float, power_kw: float) -> float:
    """A pool's share of the objective (:meth:`fleetopt.solvers.problem.FleetProblem.choice_objective`)."""
    if instance.objective == "cost":
        return cost_per_hr
    if instance.objective in ("power", "tok_per_watt"):
        return power_kw
    return cost_per_hr + (instance.energy_usd_per_kwh or 0.0) * instance.pue * power_kw


def _configuration_cost(instance: Instance, plans, k: int, option: str, chosen: bool) -> ConfigurationCost:
    """Option ``option`` in pool ``k``'s place (the plan's count when ``chosen``, else sized to its least count)."""
    from dataclasses import replace

    from fleetopt.optimizer.plan.evaluate import evaluate_plans

    g = instance.gpu(option)
    tp, dtype = int(getattr(g.profile, "tp", 1)), str(getattr(g.profile, "dtype", ""))
    hi = plans[k].hi_tokens
    if int(g.profile.n_slots(hi)) < 1:
        return ConfigurationCost(option, tp, dtype, None, None, None, None, None, chosen,
                                 f"cannot serve the range: its KV cache holds no {hi:,}-token sequence")
    swapped = list(plans)
    if not chosen:
        swapped[k] = replace(plans[k], gpu=g.name, profile=g.profile, replicas=None, availability=g.availability,
                             max_num_seqs=None)
    p = evaluate_plans(instance, swapped).pools[k]
    if not (p.slo_met and p.utilization_ok) and not chosen:
        return ConfigurationCost(option, tp, dtype, None, None, None, None, None, chosen,
                                 f"cannot meet the SLO on this range at any count ({p.miss_reason or 'unstable'})")
    kw = p.power_w / 1000.0
    return ConfigurationCost(option, tp, dtype, p.replicas, p.gpus, p.cost_per_hr, kw,
                             _pool_objective(instance, p.cost_per_hr, kw), chosen, "")


def _verdicts(costs: list[ConfigurationCost], unit: str) -> tuple[list[ConfigurationCost], str]:
    """Each priced alternative's verdict against the chosen configuration, and the sentence of why it wins."""
    from dataclasses import replace

    chosen = next(c for c in costs if c.chosen)
    money = unit == "$/hr"

    def amount(x: float) -> str:
        return f"${x:,.2f}/hr" if money else f"{x:,.3f} {unit}"

    out, cheaper = [], []
    for c in costs:
        if c.chosen or c.objective is None or chosen.objective is None:
            out.append(replace(c, verdict=c.verdict or ("chosen" if c.chosen else c.verdict)))
            continue
        delta = c.objective - chosen.objective
        if delta < -1e-9 * max(1.0, abs(chosen.objective)):
            cheaper.append(c)
            text = (f"{amount(-delta)} cheaper on this pool alone, but the fleet's shared limits (the entry's "
                    "max_count/max_pools, power, budget, a fleet-scope SLO) rule it out with the other pools")
        elif abs(delta) <= 1e-9 * max(1.0, abs(chosen.objective)):
            text = ("as cheap; the tie-break prefers fewer GPUs, then fewer pools, then less "
                    + ("power" if money else "cost"))
        else:
            assert c.replicas is not None and c.gpus is not None and chosen.gpus is not None
            need = f"needs {c.replicas} replica{'s' if c.replicas != 1 else ''} x {c.tp} = {c.gpus} GPUs"
            if c.gpus > chosen.gpus:
                reason = f"{need}, {c.gpus - chosen.gpus} more GPUs"
            elif c.gpus < chosen.gpus:
                reason = f"{need}, fewer GPUs but more power" if not money else f"{need}, fewer but dearer GPU-hours"
            else:
                reason = f"{need}, the same GPUs at more power" if not money else f"{need} at a dearer price"
            text = f"{amount(delta)} dearer: {reason}"
        out.append(replace(c, verdict=text))
    priced = sorted((c for c in out if not c.chosen and c.objective is not None), key=lambda c: c.objective)
    at = (f"{chosen.replicas} replica{'s' if chosen.replicas != 1 else ''} x {chosen.tp} = {chosen.gpus} GPUs, "
          f"{amount(chosen.objective or 0.0)}")
    if cheaper:
        why = f"{chosen.option} at {at}: the cheapest the fleet's limits allow on this range"
    elif priced:
        nxt = priced[0]
        why = f"{chosen.option} is the cheapest on this range at {at}; next {nxt.option}: {nxt.verdict}"
    else:
        why = f"{chosen.option} ({at}) is the only configuration that serves this range"
    return out, why


def pool_configurations(instance: Instance, plans) -> tuple[PoolConfigurations, ...]:
    """For each pool of ``plans`` (:class:`~fleetopt.models.fleet.PoolPlan` with the plan's counts) on a ``gpus``
    entry with ``tp``/``dtype`` lists, every configuration compared in its place (module docstring)."""
    unit = _UNITS.get(instance.objective, "")
    out = []
    for k, plan in enumerate(plans):
        entry = instance.inventory(plan.gpu)
        if not entry.configurations or plan.decode is not None:   # a pair's phases are compared by the MIP itself
            continue
        costs = []
        for conf in entry.configurations:
            if conf.option is None:
                costs.append(ConfigurationCost(f"{entry.name}/tp{conf.tp}/{conf.dtype}", conf.tp, conf.dtype, None,
                                               None, None, None, None, False, f"does not fit: {conf.reason}"))
            else:
                costs.append(_configuration_cost(instance, plans, k, conf.option, conf.option == plan.gpu))
        costs, why = _verdicts(costs, unit)
        label = f"{plan.lo_tokens}-{plan.hi_tokens}:{plan.gpu}x{plan.replicas}"
        out.append(PoolConfigurations(label, entry.name, plan.gpu, why, tuple(costs)))
    return tuple(out)


_UNITS = {"cost": "$/hr", "power": "kW", "tok_per_watt": "kW", "cost+power": "$/hr"}


def _relaxations(instance: Instance) -> list[tuple[str, float, float, str]]:
    """(limit, now, relaxed, override) of every limit the instance sets (module docstring)."""
    out = []
    cons = instance.constraints
    if cons.max_power_kw is not None:
        v = float(cons.max_power_kw)
        out.append(("constraints.max_power_kw", v, v + 1.0, f"constraints.max_power_kw={v + 1.0!r}"))
    for g in instance.gpu_inventories():    # one per gpus entry: the file's name, shared by its configurations
        if g.max_count is not None:
            out.append((f"gpus.{g.name}.max_count", g.max_count, g.max_count + 1,
                        f"gpus.{g.name}.max_count={g.max_count + 1}"))
    if cons.max_cost_per_hr is not None:
        v = float(cons.max_cost_per_hr)
        out.append(("constraints.max_cost_per_hr", v, 1.1 * v, f"constraints.max_cost_per_hr={1.1 * v!r}"))
    slo_ms = instance.slo.ttft_p99_s * 1000.0
    out.append(("slo.ttft_p99_ms", slo_ms, 1.1 * slo_ms, f"slo.ttft_p99_ms={1.1 * slo_ms!r}"))
    if instance.slo.ttft_margin:
        out.append(("slo.ttft_margin", instance.slo.ttft_margin, 0.0, "slo.ttft_margin=0"))
    k = instance.pools.max_pools
    out.append(("pools.max_pools", k, k + 1, f"pools.max_pools={k + 1}"))
    return out


def pair_pool_label(plan) -> str:
    """A disaggregated pair's name in explanations: ``0-8192:P a100x1 + D h100x3``."""
    d = plan.decode
    return f"{plan.lo_tokens}-{plan.hi_tokens}:P {plan.gpu}x{plan.replicas} + D {d.gpu}x{d.replicas}"


def _pair_bottleneck(instance: Instance, plans, k: int) -> tuple[str, str]:
    """What fails in pair ``k`` of ``plans`` with one replica fewer in each phase (the evaluation's reasons)."""
    from dataclasses import replace

    from fleetopt.optimizer.plan.evaluate import evaluate_plans

    plan = plans[k]
    row = sum(2 if q.decode is not None else 1 for q in plans[:k])
    found = []
    for phase, n in (("prefill", plan.replicas), ("decode", int(plan.decode.replicas or 0))):
        if n <= 1:
            found.append(f"{phase}: a single replica meets every condition")
            continue
        fewer = list(plans)
        fewer[k] = (replace(plan, replicas=n - 1) if phase == "prefill"
                    else replace(plan, decode=replace(plan.decode, replicas=n - 1)))
        r = evaluate_plans(instance, fewer).pools[row + (phase == "decode")]
        why = r.miss_reason or ("" if r.utilization_ok else "utilisation above the cap")
        found.append(f"{phase} at {n - 1} replicas: {why}" if why else f"{phase}: one replica fewer still meets it")
    return "P/D pair", "; ".join(found)


def _bottleneck(instance: Instance, plans, k: int) -> tuple[str, str]:
    """The bottleneck of pool ``k`` of ``plans`` (fixed counts): what fails with one replica fewer."""
    from dataclasses import replace

    from fleetopt.optimizer.plan.evaluate import evaluate_plans

    n = plans[k].replicas
    if n <= 1:
        return "one replica", "a single replica meets every condition"
    fewer = list(plans)
    fewer[k] = replace(plans[k], replicas=n - 1)
    p = evaluate_plans(instance, fewer).pools[sum(2 if q.decode is not None else 1 for q in plans[:k])]
    slo_ms = instance.slo.ttft_sizing_s * 1000.0  # the count is the least meeting the sizing target
    target = instance.slo.sizing_text()
    cap = instance.constraints.max_utilization
    at = f"at {n - 1} replicas"
    if not p.utilization < 1.0:
        need = f"{p.utilization:.3f} of" if math.isfinite(p.utilization) else "more than"
        return "slots", f"{at} the load needs {need} the batch places (unstable)"
    if not p.utilization_ok:
        return "utilisation cap", f"{at} the capacity load {p.capacity_load:.3f} exceeds the cap {cap:g}"
    tpot = instance.slo.tpot_p99_s
    if tpot is not None and p.tpot_p99_ms > tpot * 1000.0 * (1 + 1e-12):
        return "TPOT", f"{at} the TPOT bound {p.tpot_p99_ms:,.1f} ms exceeds the {tpot * 1000.0:,.0f} ms SLO"
    if p.ttft_p99_ms > slo_ms * (1 + 1e-12):
        if p.prefill_p99_ms >= PREFILL_SHARE * slo_ms:
            return "prefill time", (f"{at} P99 TTFT {p.ttft_p99_ms:,.1f} ms > {target}; the pool's P99 prefill "
                                    f"alone is {p.prefill_p99_ms:,.1f} ms")
        return "P99 TTFT", f"{at} P99 TTFT {p.ttft_p99_ms:,.1f} ms > {target} (waiting for a batch place)"
    return "P99 TTFT", f"{at} the pool misses its SLO ({p.miss_reason or 'fleet-scope share'})"


def explain_plan(instance: Instance, report, *, resolve, headroom=None) -> Explanation:
    """Why ``report``'s best plan is what it is (module docstring).

    Parameters
    ----------
    instance : Instance
        The instance ``report`` solved; loaded from a file (each relaxation re-loads it with one ``--set``).
    report : SolveReport
        A report with a plan, length routing.
    headroom : callable, optional
        ``headroom(instance, fleet_spec)`` returning an object whose ``pools[k]`` have ``max_arrival_rate`` and
        ``limited_by`` (:func:`fleetopt.optimizer.workflows.headroom.headroom`); None: no headroom.
    resolve : callable
        ``resolve(instance) -> SolveReport``: the re-solve of a relaxed instance, e.g.
        ``lambda i: solve_instance(i, SolveOptions(compute_baseline=False))`` (passed in: ``solve`` imports this
        module, so this module does not import ``solve``).

    Raises
    ------
    InstanceError
        A report without a plan, a split-routing plan or an instance without a file.
    """
    from fleetopt.optimizer.errors import InstanceError
    from fleetopt.optimizer.io.instance import load_instance
    from fleetopt.optimizer.plan.evaluate import fleet_spec, pool_plans_of

    if report.best is None:
        raise InstanceError("--explain: the solve found no plan to explain")
    if instance.pools.routing != "length":
        raise InstanceError("--explain: explains length-routing plans only")
    if instance.path is None:
        raise InstanceError("--explain: the instance must come from a file (each relaxation re-loads it with --set)")
    z = float(report.best.objective)
    relaxations = []
    for limit, now, relaxed, override in _relaxations(instance):
        variant = load_instance(instance.path, tuple(instance.overrides) + (override,))
        rep = resolve(variant)
        if str(rep.status) == "optimal" and rep.best is not None:
            value = float(rep.best.objective)
            worth = z - value
            relaxations.append(Relaxation(limit, now, relaxed, override, value, worth,
                                          worth > BINDING_REL * max(1.0, abs(z)), str(rep.status)))
        else:
            relaxations.append(Relaxation(limit, now, relaxed, override, None, None, None, str(rep.status)))
    fleet = report.best.fleet
    plans = pool_plans_of(instance, fleet.pools)
    rows, at = [], 0
    for q in plans:     # the first row of each plan (a pair has two)
        rows.append(at)
        at += 2 if q.decode is not None else 1
    spec = fleet_spec(instance, fleet) or ""
    limits = None
    if headroom is not None and spec:
        limits = headroom(instance, spec).pools
    pools = []
    for k, (plan, row) in enumerate(zip(plans, rows)):
        p = fleet.pools[row]
        if plan.decode is not None:   # a disaggregated pair: one entry naming both options
            assert plan.replicas is not None        # pool_plans_of gives each plan at its evaluated count
            label, detail = _pair_bottleneck(instance, plans, k)
            pools.append(PoolBottleneck(pair_pool_label(plan), plan.replicas + int(plan.decode.replicas or 0),
                                        label, detail, None, None))
            continue
        label, detail = _bottleneck(instance, plans, k)
        lim = None if limits is None else limits[k]
        pools.append(PoolBottleneck(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}", p.replicas, label, detail,
                                    None if lim is None else float(lim.max_arrival_rate),
                                    None if lim is None else lim.limited_by))
    return Explanation(instance.name, instance.objective, _UNITS.get(instance.objective, ""), z, spec,
                       tuple(relaxations), tuple(pools), instance.workload.arrival_rate_req_per_s,
                       pool_configurations(instance, plans))
