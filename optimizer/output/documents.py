"""A result's JSON document, built on the contract (:mod:`fleetopt.optimizer.output.contract`): fleets, pools,
``solve`` with its verification, trim and routing, ``tpw``, the gridflex CSV, and the warnings a document carries.

Every number carries its provenance: ``source`` says analytic / MIP / simulated and ``quality`` the profile
quality its inputs rest on.
"""

from __future__ import annotations

import csv
import io
import math
from typing import TYPE_CHECKING

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.profiles import replica_unit
from fleetopt.models.service import ContextPoint

if TYPE_CHECKING:
    from fleetopt.optimizer.output.contract import Fleet

# The contract's models are imported where a document is built, not here: the tables read this module's notes
# and warnings without building them (fleetopt.optimizer.output.figures).
from fleetopt.optimizer.output.figures import (DROPPED_LINES, fleet_output_tok_per_s, physical_gpus, pool_identity,
                                               usd_per_million_output_tokens)
from fleetopt.optimizer.io.instance import gpu_warnings
from fleetopt.optimizer.plan.evaluate import fleet_name_ambiguities, fleet_spec, limit_violations

__all__ = ["ANALYTIC", "dropped_summary", "fleet_json", "gridflex_csv", "instance_warnings", "pool_json",
           "replica_units", "routing_json", "simulated_pools", "solve_json", "solve_warnings", "tpw_json", "trim_json",
           "verification_json"]

ANALYTIC = "analytic"


def replica_units(instance) -> dict:
    """Each GPU option's :func:`~fleetopt.models.profiles.replica_unit` by name (empty without an
    instance: read from the pools)."""
    return {} if instance is None else {g.name: replica_unit(g.profile) for g in instance.gpus}


def pool_json(p: PoolResult, source: str = ANALYTIC, unit=None, **values) -> dict:
    """A pool's object, built by its model (:class:`fleetopt.optimizer.output.contract.Pool`): what it serves and
    what a replica is, the ``analytic`` sub-object, no ``simulated`` one, then the details (the
    :class:`~fleetopt.models.fleet.PoolResult`'s fields of the same names); the flat figures are the deprecated 1.0
    aliases of ``analytic``'s. ``unit``: the pool's profile's :func:`~fleetopt.models.profiles.replica_unit`, when
    known; ``values``: the keys written only sometimes (``chunk_tokens``, ``role``)."""
    from fleetopt.optimizer.output.contract import Pool, build, pool_analytic

    # utilization null: an unstable queue; capacity_load says by how much
    return build(Pool, p, **pool_identity(p, unit), analytic=pool_analytic(p), simulated=None,
                 overloaded=not math.isfinite(p.utilization), source=source, **values)


def fleet_json(r: FleetResult, source: str = ANALYTIC, violations=None, instance=None, *,
               model: type[Fleet] | None = None, roles=(), **values) -> dict:
    """A fleet's object, built by its model (:class:`fleetopt.optimizer.output.contract.Fleet`, or ``model``: a
    fleet with more keys given in ``values``), the headline first: physical GPUs, $/hr, $/yr, kW, tok/W and $ per
    million output tokens (:func:`fleetopt.optimizer.output.figures.usd_per_million_output_tokens`). With
    ``violations`` (the instance limits it breaks, :func:`fleetopt.optimizer.plan.evaluate.limit_violations`)
    they are listed under ``violations`` (the model: :class:`~fleetopt.optimizer.output.contract.plan._Baseline`
    unless given) and ``feasible`` is true only when the SLO is met and none is broken. With ``instance``, each
    pool's ``gpus_per_replica`` is its profile's (else read from the pool) and its ``chunk_tokens`` is written;
    ``roles``: a semantic plan's model class per pool."""
    from fleetopt.optimizer.output.contract import Fleet, build, fleet_analytic
    from fleetopt.optimizer.output.contract.plan import _Baseline

    per = replica_units(instance)
    chunks = {} if instance is None else {g.name: int(g.profile.chunk_tokens) for g in instance.gpus}
    pools = [pool_json(p, source, per.get(p.gpu),
                       **({"chunk_tokens": chunks[p.gpu]} if p.gpu in chunks else {}),
                       **({"role": role} if role is not None else {}))
             for p, role in zip(r.pools, list(roles) + [None] * (len(r.pools) - len(roles)))]
    if violations is not None:
        values.update(feasible=bool(r.feasible and not violations), violations=list(violations))
    return build(model or (Fleet if violations is None else _Baseline), r, physical_gpus=physical_gpus(r, per),
                 usd_per_million_output_tokens=usd_per_million_output_tokens(r.cost_per_hr,
                                                                             fleet_output_tok_per_s(r)),
                 pools=pools, analytic=fleet_analytic(r, per), simulated=None, source=source, **values)


def tpw_json(rows: list[ContextPoint]) -> dict:
    """The ``tpw`` document, built by its model (:class:`fleetopt.optimizer.output.contract.workflows.TpwDocument`; a
    row's values are the :class:`~fleetopt.models.service.ContextPoint`'s fields of the same names)."""
    from fleetopt.optimizer.output.contract import build, envelope
    from fleetopt.optimizer.output.contract.workflows import TpwDocument, _TpwRow as TpwRow

    return build(TpwDocument, **envelope("tpw", None),
                 rows=[build(TpwRow, r, context=r.context_tokens, source=ANALYTIC) for r in rows])


def simulated_pools(vp) -> list:
    """The simulated pools of a verified plan, in the plan's order (a split plan may hold two pools of one range
    and GPU, so they are matched by position)."""
    n = len(vp.plan.fleet.pools)
    return list(vp.sim.pools) if len(vp.sim.pools) == n else [None] * n


def trim_json(trim, plan, instance) -> dict | None:
    """The ``trim`` block of a verification (:mod:`fleetopt.optimizer.simulation.trim`), built by its model
    (:class:`fleetopt.optimizer.output.contract.plan._Trim`); every count in it is simulated."""
    from fleetopt.optimizer.output.contract import build
    from fleetopt.optimizer.output.contract.plan import _Trim, _TrimPool

    if trim is None:
        return None
    pools = [build(_TrimPool, p, replicas=n, replicas_up=u, replicas_verified=p.replicas,
                   ttft_p99_ms_sim=s.ttft_p99_ms_sim, ttft_p99_ci_ms=s.ttft_p99_ci_ms,
                   ttft_p99_ms_confirmation=conf.ttft_p99_ms_sim, ttft_p99_ms_analytic=s.analytic.ttft_p99_ms,
                   slo_met_analytic=s.analytic.slo_met)
             for p, n, u, s, conf in zip(plan.fleet.pools, trim.counts, trim.up_counts, trim.sim.pools,
                                         trim.confirmation.pools)]
    return build(_Trim, trim, source="simulated", ttft_p99_ms_sim=trim.sim.ttft_p99_ms,
                 ttft_p99_ms_confirmation=trim.confirmation.ttft_p99_ms,
                 fleet=fleet_spec(instance, trim.sim.analytic, trim.counts),
                 fleet_simulated=fleet_spec(instance, trim.sim.analytic), trials=len(trim.steps), pools=pools,
                 options=trim.sim.options.to_json())


def _verified_pool(vp, p, s) -> dict:
    from fleetopt.optimizer.output.contract import build
    from fleetopt.optimizer.output.contract.plan import _VerifiedPool

    key = (p.min_tokens, p.max_tokens, p.gpu)
    return build(_VerifiedPool, p, ttft_p99_ms_analytic=p.ttft_p99_ms,
                 ttft_p99_ms_sim=None if s is None else s.ttft_p99_ms_sim,
                 ttft_p99_ci_ms=None if s is None else s.ttft_p99_ci_ms,
                 slo_met_sim=key not in vp.failing_pools and key not in vp.undecided_pools,
                 outcome=("fail" if key in vp.failing_pools else "undecided"
                          if key in vp.undecided_pools or key in vp.thin_pools else "pass"),
                 too_few_requests=key in vp.thin_pools, requests_measured=None if s is None else s.requests,
                 preemptions=None if s is None else s.preemptions)


def verification_json(v, instance) -> dict:
    """The ``verification`` block of ``solve --verify-top N``, built by its model
    (:class:`fleetopt.optimizer.output.contract.plan._Verification`): every simulated plan, per round (and the trim)."""
    from fleetopt.optimizer.output.contract import build
    from fleetopt.optimizer.output.contract.plan import _PoolSizing, _SizingTrial, _Verification, _VerifiedPlan

    plans = [build(_VerifiedPlan, vp, cost_per_hr=vp.plan.fleet.cost_per_hr, verdict=vp.verdict(),
                   ttft_p99_ms_sim=vp.sim.ttft_p99_ms, ttft_p99_ci_ms=vp.sim.ttft_p99_ci_ms,
                   requests_simulated=vp.sim.requests_simulated,
                   pools=[_verified_pool(vp, p, s) for p, s in zip(vp.plan.fleet.pools, simulated_pools(vp))])
             for vp in v.plans]
    sizing = [build(_PoolSizing, z, min_tokens=z.candidate.lo_tokens, max_tokens=z.candidate.hi_tokens,
                    gpu=z.candidate.gpu, max_num_seqs=z.candidate.max_num_seqs,
                    trials=[build(_SizingTrial, t) for t in z.trials]) for z in v.sizings]
    return build(_Verification, v, cuts=list(v.cuts), plans=plans, pool_sizing=sizing,
                 engine=v.plans[0].sim.engine.to_json() if v.plans else None, options=v.options.to_json(),
                 verdict=None if v.chosen is None else v.chosen.verdict(),
                 chosen_rank=None if v.chosen is None else v.chosen.rank,
                 chosen_round=None if v.chosen is None else v.chosen.round,
                 trim=None if v.chosen is None else trim_json(v.trim, v.chosen.plan, instance))


def routing_json(routing) -> dict | None:
    """A split-routing plan's routing (:class:`fleetopt.optimizer.plan.split_candidates.SplitRouting`): per
    elementary length segment, the rate in req/s sent to each pool (columns in the order of the plan's pools);
    None under length routing."""
    if routing is None:
        return None
    return {"boundaries_tokens": list(routing.boundaries_tokens),
            "rate_req_per_s": [list(row) for row in routing.rate_req_per_s], "source": "MIP"}


_NO_PLAN = ("physical_gpus", "cost_per_hr", "cost_per_year", "power_kw", "tok_per_watt",
            "usd_per_million_output_tokens", "total_replicas", "total_gpus", "slo_met", "feasible", "pools", "analytic",
            "simulated")
"""The keys of the plan's fleet a ``solve`` document writes as null without a plan."""


def solve_json(report, verification=None) -> dict:
    """The ``solve`` document, built by its model (:class:`fleetopt.optimizer.output.contract.plan.SolveDocument`);
    with a verification, its chosen plan heads it."""
    from fleetopt.optimizer.output.contract import build, envelope
    from fleetopt.optimizer.output.contract.plan import SolveDocument, _Solution

    inst = report.instance
    best = report.best
    if verification is not None and verification.chosen is not None:
        best = verification.chosen.plan
    if best:
        roles = best.semantic.roles if best.semantic is not None else ()
        fleet = fleet_json(best.fleet, ANALYTIC, instance=inst, roles=roles)
    else:
        fleet = dict.fromkeys(_NO_PLAN)
    return build(
        SolveDocument, **envelope("solve", inst.name), overrides=list(inst.overrides), status=str(report.status),
        method=report.method, solver=report.solver, explanation=report.explanation,
        objective={"name": inst.objective, "value": None if best is None else best.objective,
                   "unit": OBJECTIVE_UNITS[inst.objective], "bound": report.bound, "lp_bound": report.lp_bound,
                   "minimizes": OBJECTIVE_MEANINGS[inst.objective]},
        **fleet, semantic=None if best is None or best.semantic is None else best.semantic.to_json(),
        fleet=fleet_spec(inst, best.fleet) if best else None, routing=routing_json(best.routing) if best else None,
        baseline=(None if report.baseline is None else
                  fleet_json(report.baseline, violations=limit_violations(inst, report.baseline), instance=inst)),
        warnings=solve_warnings(report), solve_seconds=report.solve_seconds, mip_gap=report.mip_gap,
        ttft_model=inst.slo.ttft_model, slo_ttft_p99_ms=inst.slo.ttft_p99_s * 1000.0,
        ttft_margin=inst.slo.ttft_margin, ttft_sizing_ms=inst.slo.ttft_sizing_s * 1000.0,
        power_linearization_error_w=report.power_error_w,
        candidates={"generated": report.candidates_generated, "feasible": report.candidates_feasible,
                    "after_pruning": report.candidates_after_pruning,
                    "left_unsized": report.candidates_left_unsized, **dropped_summary(report.dropped_reasons)},
        solutions=[fleet_json(p.fleet, instance=inst, model=_Solution, rank=p.rank, objective=p.objective,
                              fleet=fleet_spec(inst, p.fleet), routing=routing_json(p.routing)) for p in report.plans],
        verified=None if verification is None else verification.verified,
        **({} if verification is None else {"verification": verification_json(verification, inst)}),
        provenance={"selection": report.method, "numbers": "analytic re-evaluation of the selected pools",
                    "profiles": sorted({f"{p.gpu}: {p.quality}" for p in (best.fleet.pools if best else ())})})


_NOT_WORDING = b"0123456789,."
"""What a reason's wording leaves out: its numbers (``523 ms``, ``1,012 ms``, ``0.9``; bytes.translate deletes
them ten times faster than str.translate or a regular expression)."""
_REASONS_PER_OPTION = 3


def dropped_summary(reasons, lines: int = DROPPED_LINES, per_option: int = _REASONS_PER_OPTION) -> dict:
    """A bounded summary of the dropped candidates' ``reasons`` (``LO-HI on GPU: why``, one per candidate; tens of
    thousands on a large instance): ``dropped_total``; per GPU option (in order of first appearance) how many were
    dropped and, per reason (its wording with the numbers taken out, most frequent first, at most ``per_option``;
    the rest counted in ``other``), how many and one example; and ``dropped``, at most ``lines`` examples: each
    option's most frequent reason first, then their second ones.

    Examples
    --------
    >>> s = dropped_summary(["0-4,096 on a100: P99 prefill is 523 ms, above 485 ms",
    ...                      "0-8,192 on a100: P99 prefill is 597 ms, above 485 ms",
    ...                      "0-8,192 on a100: TPOT bound 80 ms above 50 ms",
    ...                      "0-8,192 on h100: TPOT bound 60 ms above 50 ms"],
    ...                     lines=2)
    >>> s["dropped_total"], s["dropped"]
    (4, ['0-4,096 on a100: P99 prefill is 523 ms, above 485 ms', '0-8,192 on h100: TPOT bound 60 ms above 50 ms'])
    >>> [(o["gpu"], o["dropped"], [r["count"] for r in o["reasons"]], o["other"]) for o in s["dropped_by_option"]]
    [('a100', 3, [2, 1], 0), ('h100', 1, [1], 0)]
    """
    options: dict[str, dict[bytes, list]] = {}      # option -> reason's wording -> [count, example]
    for text in reasons:                            # [ROLE (share S) ]LO-HI on GPU: why
        where, on, rest = text.partition(" on ")
        gpu, colon, why = rest.partition(": ")
        if not (on and colon):
            gpu, why = "", text
        head = where.rpartition(" ")[0]
        kinds = options.setdefault(f"{head} {gpu}" if head else gpu, {})
        kind = why.encode().translate(None, _NOT_WORDING)
        entry = kinds.get(kind)
        if entry is None:
            kinds[kind] = [1, text]
        else:
            entry[0] += 1
    ranked = {o: sorted(kinds.values(), key=lambda e: -e[0]) for o, kinds in options.items()}
    examples = [e[1] for depth in range(per_option) for kinds in ranked.values() if depth < len(kinds)
                for e in (kinds[depth],)][:lines]
    return {"dropped_total": len(reasons), "dropped": examples,
            "dropped_by_option": [{"gpu": o, "dropped": sum(e[0] for e in kinds),
                                   "reasons": [{"count": e[0], "example": e[1]} for e in kinds[:per_option]],
                                   "other": sum(e[0] for e in kinds[per_option:])} for o, kinds in ranked.items()]}


def instance_warnings(inst) -> list[str]:
    """Caveats about an instance itself, for ``validate`` and ``solve``: GPU options that count a replica
    differently or serve an unknown model (:func:`fleetopt.optimizer.io.instance.gpu_warnings`), and option
    names a ``--fleet`` spec reads two ways (:func:`fleetopt.optimizer.plan.evaluate.fleet_name_ambiguities`)."""
    return gpu_warnings(inst) + fleet_name_ambiguities(inst)


def solve_warnings(report) -> list[str]:
    """Caveats a reader of a plan must see: the instance's own (:func:`instance_warnings`), mixed models,
    truncated requests, a baseline that misses."""
    out = instance_warnings(report.instance)
    best = report.best
    plan_models = sorted({p.model for p in best.fleet.pools}) if best else []
    if len(plan_models) > 1:
        out.append("the plan's pools serve different models (" + "; ".join(plan_models) + "): their cost and tok/W "
                   "compare different models' outputs")
    if best and report.baseline is not None:
        base_models = sorted({p.model for p in report.baseline.pools})
        if base_models != plan_models:
            out.append(f"the plan serves {', '.join(plan_models)} but the baseline serves {', '.join(base_models)}: "
                       "the saving compares different models")
        if not report.baseline.slo_met:
            out.append("the homogeneous baseline misses the SLO")
        broken = limit_violations(report.instance, report.baseline)
        if broken:
            out.append("the homogeneous baseline breaks the instance's limits (" + "; ".join(broken)
                       + "): no saving against it is claimed")
    share = report.instance.workload.truncated_share
    if share > 0:
        out.append(f"{share:.4%} of requests exceed max_context and are served truncated")
    return out


OBJECTIVE_UNITS = {"cost": "usd_per_hr", "power": "kw", "tok_per_watt": "kw", "cost+power": "usd_per_hr"}
"""Unit of the solver's objective value per objective (the JSON's ``objective.unit``)."""


OBJECTIVE_MEANINGS = {"cost": "fleet cost in $/hr",
                      "power": "fleet power in kW",
                      "tok_per_watt": "fleet power in kW (the served tokens/s are fixed by the workload, so the "
                                      "least power is the most tokens per watt)",
                      "cost+power": "fleet cost plus energy in $/hr (usd_per_kwh x PUE x kW)"}
"""What the solver minimises per objective (the JSON's ``objective.minimizes``): tok_per_watt is solved as least
power (:meth:`fleetopt.solvers.problem.FleetProblem.choice_objective`)."""


def gridflex_csv(g) -> str:
    """The depth rows of a gridflex sweep as CSV (one line per depth)."""
    buf = io.StringIO()
    rows = g.to_csv_rows()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["depth"], lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()
