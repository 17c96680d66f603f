"""Multi-model (semantic) plans: one tiling of pools per model class, sized together in one MIP.

A classifier sends the share :math:`\\alpha(L)` of the requests of total length :math:`L` to a small model and
the rest to a large one (:class:`fleetopt.optimizer.io.instance.SemanticSpec`). For a rule, the model-level split
(:func:`fleetopt.models.semantic.split_by_model`, exact) gives each class :math:`c` its length distribution
:math:`f_c` and rate :math:`\\pi_c \\Lambda`. Each class is then a workload of its own: a *sub-instance* with that
distribution and rate and only its model's GPU options (:func:`class_instance`), whose candidate pools the
ordinary candidate machinery sizes (:func:`fleetopt.optimizer.plan.candidates.generate_candidates`).

**One MIP, one tiling per class.** The classes' candidates are merged into one
:class:`~fleetopt.solvers.problem.FleetProblem` with one commodity per class (:func:`build_semantic_problem`):
class :math:`c`'s pools live on its own range of path nodes (its nodes shifted by an offset), its source and
sink are that range's first and last node, so the tiling rows give each class exactly one path, i.e. its
lengths are served exactly once by pools of its own model. Every other row is shared: the pool count
:math:`K`, per-option and per-inventory GPU and pool limits (indexed, as in
:func:`fleetopt.optimizer.plan.solve.build_problem`, by the instance's inventories), total GPUs, budget, power
cap and the fleet-scope SLO :math:`\\sum_c m_c z_c \\le 0.01 \\Lambda` over all requests
(docs/formulation.md, "Several tilings").

**The share as a decision.** With candidate rules :math:`s = 1 \\dots S` (``semantic.shares``), each rule gives
its own class distributions, candidates and MIP. A plan runs exactly one rule, so the feasible set of the joint
problem (binaries :math:`y_s`, :math:`\\sum_s y_s = 1`, each class's tiling row of rule :math:`s` equal to
:math:`y_s`, the quality row :math:`\\sum_s (1 - \\pi_{small}(s)) y_s \\ge q`) is the disjoint union over the
rules meeting the quality floor of each rule's own feasible set, and its optimum is the least of the per-rule
optima: solving one MIP per admissible rule and keeping the cheapest is exact
(:func:`fleetopt.optimizer.plan.solve.solve_instance` does so for an instance with ``semantic``). Rules
below the floor are dropped when the instance is loaded. Ties between rules go to the larger large-model share.

**Evaluation.** Each class's pools tile :math:`(0, B]` on their own and are evaluated on the class's
distribution; the rows of all classes are evaluated in one pass on traffic weighted by :math:`\\pi_c`
(:func:`evaluate_semantic`), so each pool's rate is :math:`\\pi_c \\Lambda` times its share of the class, and the
fleet totals, the SLO verdict and the fleet-wide P99 TTFT (the root of
:math:`\\sum_p \\lambda_p P_p(T > t) = 0.01 \\sum_p \\lambda_p` over every pool of every class) cover all requests.

The classes' outputs are different models' tokens: fleet tok/W and $/M tokens summed over them compare unlike
products (docs/multi_model.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.fleet import FleetResult, PoolPlan, evaluate_traffic
from fleetopt.models.profiles import replica_unit, served_model
from fleetopt.models.segments import raw_between, segment_basis
from fleetopt.models.semantic import ModelClass, ShareRule, split_by_model
from fleetopt.models.units import P99_TAIL
from fleetopt.solvers.problem import FleetProblem

from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.candidates import Candidates, Deadline, generate_candidates
from fleetopt.optimizer.plan.evaluate import service_level

__all__ = ["ClassPart", "ClassTotals", "ShareOutcome", "SemanticPlan", "class_instance", "class_parts",
           "build_semantic_problem", "split_choices", "evaluate_semantic", "semantic_plan", "large_model_instance",
           "ROLES", "MODELS_WARNING"]

ROLES = ("small", "large")
"""The model classes, in the order of their tilings in the MIP."""

MODELS_WARNING = ("these pools serve different models: their cost and tok/W compare different models' outputs")
"""The caveat every report of a multi-model fleet prints."""


@dataclass(frozen=True, eq=False)
class ClassPart:
    """One model class under one rule: its traffic, its sub-instance and its candidates (pruned)."""

    role: str
    model: str
    traffic: ModelClass
    instance: Instance
    candidates: Candidates
    feasible: int
    """Candidates with a replica choice, before pruning."""


@dataclass(frozen=True)
class ClassTotals:
    """One class's share of a semantic plan (analytic): its traffic and its pools' totals."""

    role: str
    model: str
    rate_share: float
    """:math:`\\pi_c`: the class's share of all requests."""
    arrival_rate: float
    pools: int
    physical_gpus: int
    cost_per_hr: float
    power_kw: float
    output_tok_per_s: float

    @property
    def tok_per_watt(self) -> float:
        return self.output_tok_per_s / (self.power_kw * 1000.0) if self.power_kw > 0 else 0.0

    def to_json(self) -> dict:
        return {"role": self.role, "model": self.model, "rate_share": self.rate_share,
                "arrival_rate": self.arrival_rate, "pools": self.pools, "physical_gpus": self.physical_gpus,
                "cost_per_hr": self.cost_per_hr, "power_kw": self.power_kw,
                "output_tok_per_s": self.output_tok_per_s, "tok_per_watt": self.tok_per_watt, "source": "analytic"}


@dataclass(frozen=True)
class ShareOutcome:
    """What the solve of one candidate rule gave: its best objective (None: no plan) and why it stopped."""

    label: str
    large_share: float
    status: str
    objective: float | None

    def to_json(self) -> dict:
        return {"share": self.label, "large_share": self.large_share, "status": self.status,
                "objective": self.objective}


@dataclass(frozen=True)
class SemanticPlan:
    """The multi-model side of a plan: the rule it runs, the large model's share of the requests it delivers
    (:math:`1 - \\pi_{small}`), each pool's class (``roles``, in the order of ``Plan.fleet.pools``), per-class
    totals, and every candidate rule's outcome (``tried``; one entry for a fixed rule)."""

    share: str
    large_share: float
    small_model: str
    large_model: str
    roles: tuple[str, ...]
    classes: tuple[ClassTotals, ...]
    tried: tuple[ShareOutcome, ...]
    min_large_share: float | None = None
    dropped: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"share": self.share, "large_share": self.large_share, "min_large_share": self.min_large_share,
                "small_model": self.small_model, "large_model": self.large_model, "roles": list(self.roles),
                "classes": [c.to_json() for c in self.classes], "shares_tried": [t.to_json() for t in self.tried],
                "shares_dropped": list(self.dropped), "warning": MODELS_WARNING}


# --------------------------------------------------------------------------------------------
# Classes and their candidates
# --------------------------------------------------------------------------------------------


def class_instance(instance: Instance, role: str, traffic: ModelClass) -> Instance:
    """The sub-instance of one class: its length distribution at rate :math:`\\pi_c \\Lambda` (a distribution even
    for a trace workload, whose prompt share it keeps), only the GPU options serving its model and the
    inventories made of them, and the instance's boundaries up to the first at or above the class's longest
    request (a step rule may leave a class no request above an edge: its pools then tile only up to there, and
    their windows end there); every other field (SLO, limits, objective) is the instance's. Its candidates are
    the ones the class's pools may take; the shared limits bind in the merged MIP."""
    spec = instance.semantic
    assert spec is not None and traffic.distribution is not None
    model = spec.model_of(role)
    gpus = tuple(g for g in instance.gpus if served_model(g.profile.model_name) == model)
    names = {g.name for g in gpus}
    inventories = tuple(inv for inv in instance.inventories if set(inv.options) <= names)
    w = instance.workload
    workload = replace(w, kind="cdf", lengths=traffic.distribution,
                       arrival_rate_req_per_s=w.arrival_rate_req_per_s * traffic.rate_share)
    b = instance.pools.boundaries
    top = next(x for x in b[1:] if x >= traffic.distribution.max_tokens - 1e-9)
    pools = replace(instance.pools, max_context_tokens=int(top), boundaries=tuple(x for x in b if x <= top))
    return replace(instance, name=f"{instance.name} [{role}: {model}]", workload=workload, gpus=gpus,
                   inventories=inventories, pools=pools, semantic=None, allow_mixed_models=False)


def class_parts(instance: Instance, rule: ShareRule, deadline: Deadline | None = None,
                prune: Callable[[Instance, Candidates], Candidates] | None = None) -> list[ClassPart]:
    """Each class with traffic under ``rule`` (small first), its sub-instance and its candidates, passed through
    ``prune(sub_instance, candidates)`` when given (the plain solve's pruning of dominated choices)."""
    spec = instance.semantic
    assert spec is not None
    parts = []
    for traffic in split_by_model(instance.workload.lengths, rule):
        if traffic.distribution is None:      # no request reaches this model under the rule: no pools
            continue
        sub = class_instance(instance, traffic.role, traffic)
        cands = generate_candidates(sub, deadline)
        parts.append(ClassPart(traffic.role, spec.model_of(traffic.role), traffic, sub,
                               cands if prune is None else prune(sub, cands), len(cands)))
    return parts


def build_semantic_problem(instance: Instance, parts: list[ClassPart]) -> FleetProblem:
    """The MIP input of several classes' candidates: one commodity per class on its own node range.

    Class :math:`c`'s node :math:`v` becomes :math:`o_c + v` with :math:`o_c` the nodes of the classes before it;
    its source is :math:`o_c` and its sink :math:`o_c + (M)\\,|\\Gamma|` (its last boundary's node). GPU indices are
    the instance's inventories (``instance.inventory_of_options()``, as in
    :func:`fleetopt.optimizer.plan.solve.build_problem`), so every shared limit reads one index whatever the class.
    Labels carry the class: ``small:0-2,048:h100-8b``."""
    cons = instance.constraints
    inventories = instance.gpu_inventories()
    entry = instance.inventory_of_options()
    index_of = {g.name: k for k, g in enumerate(instance.gpus)}
    cols: dict[str, list] = {k: [] for k in ("i", "j", "gpu", "rate", "from", "to", "cpool", "n", "gpus", "cost",
                                             "power", "miss")}
    sources, sinks, labels = [], [], []
    node_off = pool_off = 0
    for part in parts:
        c = part.candidates
        if c.is_pair.any():
            raise ValueError("semantic routing takes aggregated pools only")
        full = np.array([index_of[name] for name in c.gpu_names], dtype=np.int64)
        width = len(c.gammas)
        cols["i"].append(c.i), cols["j"].append(c.j), cols["gpu"].append(entry[full[c.gpu]])
        cols["rate"].append(c.arrival_rate)
        cols["from"].append(node_off + c.from_node), cols["to"].append(node_off + c.to_node)
        cols["cpool"].append(pool_off + c.choice_pool)
        for key, field in (("n", "choice_replicas"), ("gpus", "choice_gpus"), ("cost", "choice_cost_per_hr"),
                           ("power", "choice_power_w"), ("miss", "choice_miss_rate")):
            cols[key].append(getattr(c, field))
        sources.append(node_off)
        sinks.append(node_off + (len(c.boundaries) - 1) * width)
        labels += [f"{part.role}:{c.label(p)}" for p in range(len(c))]
        node_off += len(c.boundaries) * width
        pool_off += len(c)
    cat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    ints = {k: cat[k].astype(np.int64) for k in ("i", "j", "gpu", "from", "to", "cpool", "n", "gpus")}
    fleet_scope = instance.slo.scope == "fleet"
    return FleetProblem(
        boundaries=np.asarray(instance.pools.boundaries, dtype=float), gpu_names=tuple(g.name for g in inventories),
        pool_i=ints["i"], pool_j=ints["j"], pool_gpu=ints["gpu"], pool_arrival_rate=cat["rate"],
        choice_pool=ints["cpool"], choice_replicas=ints["n"], choice_gpus=ints["gpus"],
        choice_cost_per_hr=cat["cost"], choice_power_w=cat["power"], choice_miss_rate=cat["miss"],
        max_miss_rate=P99_TAIL * instance.workload.arrival_rate_req_per_s if fleet_scope else None,
        max_pools=instance.pools.max_pools, gpu_max_gpus=tuple(g.max_count for g in inventories),
        gpu_min_gpus=tuple(g.min_count for g in inventories),
        pool_from_node=ints["from"], pool_to_node=ints["to"], n_nodes=node_off, sink_node=sinks[0],
        sources=tuple(sources), sinks=tuple(sinks),
        gpu_min_pools=tuple(g.min_pools for g in inventories), gpu_max_pools=tuple(g.max_pools for g in inventories),
        energy_usd_per_kwh=instance.energy_usd_per_kwh or 0.0, pue=instance.pue,
        max_total_gpus=cons.max_total_gpus, max_cost_per_hr=cons.max_cost_per_hr,
        max_power_w=None if cons.max_power_kw is None else cons.max_power_kw * 1000.0,
        objective=instance.objective, labels=tuple(labels))


def split_choices(parts: list[ClassPart], choices) -> list[list[int]]:
    """The merged problem's choices as each class's own choice indices."""
    firsts = np.cumsum([0] + [p.candidates.n_choices for p in parts])
    out: list[list[int]] = [[] for _ in parts]
    for ch in sorted(int(c) for c in choices):
        k = int(np.searchsorted(firsts, ch, side="right") - 1)
        out[k].append(ch - int(firsts[k]))
    return out


# --------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------


def evaluate_semantic(instance: Instance, classes: list[tuple[ModelClass, list[PoolPlan]]]) -> FleetResult:
    """Every class's pools evaluated on its own traffic, as one fleet over all requests.

    Class :math:`c`'s pools tile :math:`(0, B]` and take the traffic of its distribution :math:`f_c` between their
    edges (:func:`fleetopt.models.segments.raw_between`), weighted by its rate share :math:`\\pi_c`, so that at the
    instance's rate :math:`\\Lambda` each pool's rate is :math:`\\pi_c \\Lambda \\int_{pool} f_c`, exactly what
    :func:`fleetopt.models.fleet.evaluate_fleet` gives the pool on the class alone at rate :math:`\\pi_c \\Lambda`.
    :func:`fleetopt.models.fleet.evaluate_traffic` then sums the totals, judges the SLO over all requests and
    takes the fleet-wide P99 as the root of the mixture of every pool of every class."""
    w = instance.workload
    raws, pools = [], []
    for traffic, plans in classes:
        assert traffic.distribution is not None
        edges = unique([p.lo_tokens for p in plans] + [p.hi_tokens for p in plans]).astype(float)
        at = {float(x): n for n, x in enumerate(edges)}
        bases = {}
        for p in plans:
            chunk = p.profile.chunk_tokens
            if chunk not in bases:
                bases[chunk] = segment_basis(traffic.distribution, edges, chunk, w.input_fraction)
            raws.append(raw_between(bases[chunk], at[float(p.lo_tokens)], at[float(p.hi_tokens)])
                        .scaled([traffic.rate_share]))
            pools.append(p)
    return evaluate_traffic(raws, pools, w.arrival_rate_req_per_s, service_level(instance))


def _totals(instance: Instance, role: str, model: str, traffic: ModelClass, rows) -> ClassTotals:
    per = {g.name: replica_unit(g.profile).physical_gpus_per_replica for g in instance.gpus}
    return ClassTotals(role=role, model=model, rate_share=traffic.rate_share,
                       arrival_rate=traffic.rate_share * instance.workload.arrival_rate_req_per_s, pools=len(rows),
                       physical_gpus=sum(int(r.replicas) * per.get(r.gpu, 1) for r in rows),
                       cost_per_hr=sum(r.cost_per_hr for r in rows), power_kw=sum(r.power_w for r in rows) / 1000.0,
                       output_tok_per_s=sum(r.output_tok_per_s for r in rows))


def semantic_plan(instance: Instance, k: int, parts: list[ClassPart], per_class: list[list[int]],
                  fleet: FleetResult, tried: tuple[ShareOutcome, ...]) -> SemanticPlan:
    """The :class:`SemanticPlan` of a fleet solved under candidate rule ``k``, whose pools are the classes' (in
    ``parts`` order, ``per_class`` choices each) evaluated together (:func:`evaluate_semantic`)."""
    spec = instance.semantic
    assert spec is not None
    totals, roles, at = [], [], 0
    for part, mine in zip(parts, per_class):
        totals.append(_totals(instance, part.role, part.model, part.traffic, fleet.pools[at:at + len(mine)]))
        roles += [part.role] * len(mine)
        at += len(mine)
    return SemanticPlan(share=spec.labels[k], large_share=spec.large_shares[k], small_model=spec.small_model,
                        large_model=spec.large_model, roles=tuple(roles), classes=tuple(totals), tried=tried,
                        min_large_share=spec.min_large_share, dropped=spec.dropped)


def large_model_instance(instance: Instance) -> Instance:
    """The instance with the large model's options only and no semantic routing: its homogeneous baseline is the
    multi-model plan's (all traffic on the large model; the small model serving everything is no baseline)."""
    spec = instance.semantic
    assert spec is not None
    mine = {g.name for g in instance.gpus if served_model(g.profile.model_name) == spec.large_model}
    return replace(instance, gpus=tuple(g for g in instance.gpus if g.name in mine),
                   inventories=tuple(inv for inv in instance.inventories if set(inv.options) <= mine),
                   semantic=None, allow_mixed_models=False)

