"""Verification (``fleetopt solve --verify-top N``): simulate the best plans before anyone buys GPUs.

Each round solves for the ``N`` best distinct plans, simulates every one with the same simulator users
call (:func:`optimizer.simulate.simulate_plan`), and keeps the cheapest plan that meets the SLO by
simulation under the chosen rule. When none does, the pools of the round's best plan that miss get a
cut (their least replica count rises by 10 %, at least one replica) and the model is solved again, up to
``max_rounds``. Every round is reported.

Rules (``rule``):

* ``ci-upper`` (default): the upper end of the 95 % confidence interval of the simulated P99 TTFT is
  within the SLO (for a pool-scope SLO, in every pool; for a fleet-scope SLO, over all requests);
* ``point``: the simulated P99 point estimate is within the SLO;
* ``attainment``: at least 99 % of the simulated requests meet the SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .instance import Instance
from .solve import Plan, SolveOptions, SolveReport, solve_instance

__all__ = ["RULES", "VerifiedPlan", "Verification", "verify"]

RULES = ("ci-upper", "point", "attainment")


@dataclass(frozen=True)
class VerifiedPlan:
    """One plan of one round with its simulation and the verdict."""

    round: int
    rank: int
    plan: Plan
    sim: object  # optimizer.simulate.SimReport
    passed: bool
    failing_pools: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class Verification:
    rule: str
    rounds: int
    plans: tuple[VerifiedPlan, ...]
    chosen: VerifiedPlan | None
    cuts: tuple[str, ...]

    @property
    def verified(self) -> bool:
        return self.chosen is not None


def _pool_misses(pool, rule: str, slo_ms: float) -> bool:
    """A pool misses under ``rule``. A pool with too few simulated requests for a finite confidence bound is
    judged by its point estimate (an infinite bound means no data, not a miss); one without any is not judged."""
    if rule == "ci-upper" and math.isfinite(pool.ttft_p99_ci_ms[1]):
        return pool.ttft_p99_ci_ms[1] > slo_ms
    if rule in ("ci-upper", "point"):
        return bool(pool.ttft_p99_ms_sim > slo_ms)  # False for NaN (no measured request)
    return bool(pool.slo_attainment < 0.99)


def _fleet_passes(sim, instance: Instance, rule: str) -> tuple[bool, tuple]:
    """Verdict on one simulated plan and the pools that miss (for the cuts)."""
    slo_ms = instance.slo.ttft_p99_s * 1000.0
    failing = tuple((p.min_tokens, p.max_tokens, p.gpu) for p in sim.pools if _pool_misses(p, rule, slo_ms))
    if instance.slo.scope == "fleet":
        if rule == "ci-upper":
            ok = sim.ttft_p99_ci_ms[1] <= slo_ms
        elif rule == "point":
            ok = sim.ttft_p99_ms <= slo_ms
        else:
            ok = sim.slo_attainment >= 0.99
        if not ok and not failing:  # no pool misses on its own: cut the one with the worst attainment
            judged = [p for p in sim.pools if not math.isnan(p.slo_attainment)] or list(sim.pools)
            worst = min(judged, key=lambda p: p.slo_attainment)
            failing = ((worst.min_tokens, worst.max_tokens, worst.gpu),)
        return ok, (() if ok else failing)
    if instance.slo.tpot_p99_s is not None:
        tpot_ms = instance.slo.tpot_p99_s * 1000.0
        failing += tuple((p.min_tokens, p.max_tokens, p.gpu) for p in sim.pools
                         if p.tpot_p99_ms_sim > tpot_ms and (p.min_tokens, p.max_tokens, p.gpu) not in failing)
    return not failing, failing


def verify(instance: Instance, options: SolveOptions = SolveOptions(), *, top: int = 3, seed: int = 0,
           rule: str = "ci-upper", max_rounds: int = 3, simulate_options: dict | None = None,
           progress=None) -> tuple[SolveReport, Verification]:
    """Solve, simulate the ``top`` plans, and cut and re-solve until one passes (see the module docstring).

    Returns the last round's solve report and the verification record; the chosen plan (if any) is
    ``verification.chosen``.
    """
    from .errors import InstanceError
    from .simulate import plans_from_fleet, simulate_plan

    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    if instance.pools.routing == "split":
        raise InstanceError("--verify-top: split-routing plans cannot be simulated yet (the simulator routes by "
                            "length); verify a length-routing instance")
    sim_kwargs = dict(simulate_options or {})
    min_replicas: dict = dict(options.min_replicas)
    forbidden: set = set(options.forbidden)
    verified, cuts = [], []
    report = None
    for round_ in range(1, max_rounds + 1):
        report = solve_instance(instance, replace(options, top=top, min_replicas=tuple(min_replicas.items()),
                                                  forbidden=tuple(sorted(forbidden))))
        if not report.plans:
            break
        this_round = []
        for plan in report.plans:
            pools = plans_from_fleet(instance, plan.fleet)
            router = "compress" if any(p.compress_gamma > 1 for p in pools) else "length"
            sim = simulate_plan(instance, pools, seed=seed, progress=progress, router=router, **sim_kwargs)
            ok, failing = _fleet_passes(sim, instance, rule)
            this_round.append(VerifiedPlan(round_, plan.rank, plan, sim, ok, failing))
        verified += this_round
        passing = [v for v in this_round if v.passed]
        if passing:
            chosen = min(passing, key=lambda v: (v.plan.fleet.cost_per_hr, v.rank))
            return report, Verification(rule, round_, tuple(verified), chosen, tuple(cuts))
        best = this_round[0]
        for key in best.failing_pools:
            current = next(p.replicas for p in best.plan.fleet.pools if (p.min_tokens, p.max_tokens, p.gpu) == key)
            raised = max(current + 1, math.ceil(current * 1.1))
            min_replicas[key] = max(min_replicas.get(key, 0), raised)
            cuts.append(f"round {round_}: {key[0]:,}-{key[1]:,} on {key[2]} needs at least {raised} replicas "
                        f"(simulated P99 misses with {current})")
    return report, Verification(rule, len({v.round for v in verified}), tuple(verified), None, tuple(cuts))
