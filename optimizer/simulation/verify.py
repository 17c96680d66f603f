"""Verification (``fleetopt solve --verify-top N``): simulate the best plans before anyone buys GPUs.

Each round solves for the ``N`` best distinct plans, simulates every one with the same simulator users
call (:func:`fleetopt.optimizer.simulation.simulate.simulate_plan`; a split-routing plan with its own routing, see
``Plan.routing``), and keeps the cheapest plan that meets the SLO by simulation under the chosen rule.
When none does, the pools of the round's best plan that miss get cuts (below) and the model is solved
again, up to ``max_rounds``. Every round is reported.

Rules (``rule``):

* ``ci-upper`` (default): the upper end of the 95 % confidence interval of the simulated P99 TTFT is
  within the SLO (for a pool-scope SLO, in every pool; for a fleet-scope SLO, over all requests);
* ``point``: the simulated P99 point estimate is within the SLO;
* ``attainment``: at least 99 % of the simulated requests meet the SLO.

Cuts
----
A missing pool :math:`(b_{lo}, b_{hi}, g)` with :math:`n` replicas gets a count cut: its least replica
count becomes :math:`n^+ = \\max(n + 1, \\lceil 1.1 n \\rceil)` (``SolveOptions.min_replicas``).

With ``cuts="window"`` and length routing it also gets a window cut
(:class:`fleetopt.optimizer.plan.candidates.WindowCut`) with the derating factor
:math:`f = n^+ / N^*_{(b_{lo}, b_{hi}, g)}`, :math:`N^*` the pool's analytic minimum count before
availability inflation (``Candidates.min_replicas_analytic``): every candidate pool
:math:`(b', b_{hi}, g)` with :math:`b' \\le b_{lo}` needs at least :math:`\\lceil f N^*_{(b', b_{hi}, g)} \\rceil`
replicas (the missing pool itself exactly :math:`n^+`). The idea: a count cut alone lets the solver dodge
the raised count by moving the lower boundary down (:math:`(b_{lo} - \\delta, b_{hi}, g)`), which costs a
round, and under length routing a pool with the same window and a lower start carries a superset of the
missing pool's traffic.

Under split routing (``pools.routing: split``) only count cuts apply, whatever ``cuts`` says: the routing
shares are free, so a pool with a lower start need not carry any of the missing pool's traffic (the
superset argument fails), and a split plan's count can sit below :math:`N^*` of the nominal mix (its pool
takes only part of its segments), which would give factors below 1. A raised choice keeps its operating
point (:func:`fleetopt.optimizer.plan.split_candidates.restrict_split`), so the solver cannot load the extra replicas back up to
the count's analytic capacity.

Both cuts are heuristics, not proofs: they may exclude a cheaper plan that would pass, and the loop
ends after ``max_rounds`` without a verified plan if they do not suffice. The window cut's superset
argument fails where the simulated P99 is set by prefill under continuous batching rather than by
waiting for a slot (the usual case: in the Puzzle-2 runs below the missing pools' P99 *wait* is about
10 ms of a 400 ms P99 TTFT). A lower start then dilutes the pool's percentile with short requests and
can pass, and the window cut prices exactly that escape out. Measured with ``top=2``,
``max_rounds=8``, 20,000 requests per plan, seeds 0 / 1 / 2 (rounds; "-" = not verified):

============================  ===============  ================
instance, SLO                 count cuts       window cuts
============================  ===============  ================
``agent_h100``, 1,000 ms      1 / 1 / 1        1 / 1 / 1
``agent_h100``, 400 ms        2 / 8 / 8        4 / 6 / 7
``agent_h100``, 350 ms        8 / 8 / 8        6 / 6 / 8
``quickstart``, 45 ms         3 / 1 / 3        - / 1 / 7
``quickstart``, 60 ms         2 / 2 / 2        - / - / -
============================  ===============  ================

so count cuts are the default and window cuts an option (``solve --verify-cuts window``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fleetopt.models.units import P99
from fleetopt.optimizer.plan.candidates import WindowCut
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.solve import Plan, SolveOptions, SolveReport, solve_instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import simulate_solved_plan

__all__ = ["RULES", "CUTS", "VerifiedPlan", "Verification", "verify", "analytic_minima"]

RULES = ("ci-upper", "point", "attainment")
CUTS = ("count", "window")


@dataclass(frozen=True)
class VerifiedPlan:
    """One plan of one round with its simulation and the verdict."""

    round: int
    rank: int
    plan: Plan
    sim: object  # fleetopt.optimizer.simulation.simulate.SimReport
    passed: bool
    failing_pools: tuple[tuple[int, int, str], ...]


@dataclass(frozen=True)
class Verification:
    rule: str
    rounds: int
    plans: tuple[VerifiedPlan, ...]
    chosen: VerifiedPlan | None
    cuts: tuple[str, ...]
    trim: object = None
    """With ``trim=True``: the chosen plan trimmed by simulation (:class:`fleetopt.optimizer.simulation.trim.Trim`)."""
    options: SimOptions = SimOptions()
    """The settings every plan was simulated with (``router="auto"``: each plan under the router it was planned
    for; the report of each simulation holds them as run)."""

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
    return bool(pool.slo_attainment < P99)


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
            ok = sim.slo_attainment >= P99
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


def verify(instance: Instance, options: SolveOptions = SolveOptions(), sim_options: SimOptions = SimOptions(), *,
           top: int = 3, rule: str = "ci-upper", max_rounds: int = 3, progress=None, cuts: str = "count",
           trim: bool = False) -> tuple[SolveReport, Verification]:
    """Solve, simulate the ``top`` plans, and cut and re-solve until one passes (see the module docstring).

    ``sim_options`` are the settings of every simulation
    (:class:`~fleetopt.optimizer.simulation.options.SimOptions`): each plan of each round runs with the same
    seed, so plans are compared on the same requests. ``cuts="window"`` adds a :class:`~fleetopt.optimizer.plan.candidates.WindowCut` to every count cut under length routing
    (not under split routing, where only count cuts apply); ``trim=True`` then
    lowers the chosen plan's counts while its simulation still passes (:mod:`fleetopt.optimizer.simulation.trim`).
    Returns the last round's solve report and the verification record; the chosen plan (if any) is
    ``verification.chosen``.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    if cuts not in CUTS:
        raise ValueError(f"cuts must be one of {CUTS}; got {cuts!r}")
    if not isinstance(sim_options, SimOptions):
        raise ValueError(f"sim_options must be a SimOptions; got {sim_options!r}")
    window_cuts = cuts == "window" and instance.pools.routing == "length"  # module docstring: not under split
    min_replicas: dict = dict(options.min_replicas)
    forbidden: set = set(options.forbidden)
    factors: dict = {}  # (lo, hi, gpu) -> the largest derating factor of its window cuts
    minima = None
    verified, cut_lines = [], []
    report = None
    for round_ in range(1, max_rounds + 1):
        derated = options.window_cuts + tuple(WindowCut(*key, f) for key, f in factors.items())
        report = solve_instance(instance, replace(options, top=top, min_replicas=tuple(min_replicas.items()),
                                                  forbidden=tuple(sorted(forbidden)), window_cuts=derated))
        if not report.plans:
            break
        this_round = []
        for plan in report.plans:
            sim = simulate_solved_plan(instance, plan, sim_options, progress=progress)
            ok, failing = _fleet_passes(sim, instance, rule)
            this_round.append(VerifiedPlan(round_, plan.rank, plan, sim, ok, failing))
        verified += this_round
        passing = [v for v in this_round if v.passed]
        if passing:
            chosen = min(passing, key=lambda v: (v.plan.fleet.cost_per_hr, v.rank))
            trimmed = None
            if trim:
                from fleetopt.optimizer.simulation.trim import trim_plan

                trimmed = trim_plan(instance, chosen.plan, lambda sim: _fleet_passes(sim, instance, rule)[0],
                                    sim_options, progress=progress)
            return report, Verification(rule, round_, tuple(verified), chosen, tuple(cut_lines), trimmed,
                                        sim_options)
        best = this_round[0]
        if window_cuts and minima is None:
            minima = analytic_minima(instance)
        for key in best.failing_pools:
            pools = [(k, p) for k, p in enumerate(best.plan.fleet.pools) if (p.min_tokens, p.max_tokens, p.gpu) == key]
            k, pool = max(pools, key=lambda kp: kp[1].replicas)
            current = pool.replicas
            raised = max(current + 1, math.ceil(current * 1.1))
            min_replicas[key] = max(min_replicas.get(key, 0), raised)
            text = (f"round {round_}: {key[0]:,}-{key[1]:,} on {key[2]} needs at least {raised} replicas "
                    f"(simulated P99 misses with {current})")
            n_star = minima.get(_candidate_key(best.plan, k)) if window_cuts else None
            if cuts == "window" and not window_cuts:
                text += ("; no window cut under split routing (routing shares are free, so a lower start need not "
                         "carry this pool's traffic)")
            if n_star:
                factor = raised / n_star
                factors[key] = max(factors.get(key, 0.0), factor)
                text += (f"; every pool on {key[2]} with the {key[1]:,}-token window starting at or below "
                         f"{key[0]:,} needs at least {factor:.3g} x its analytic minimum ({raised} / {n_star})")
            cut_lines.append(text)
    return report, Verification(rule, len({v.round for v in verified}), tuple(verified), None, tuple(cut_lines),
                                options=sim_options)


def analytic_minima(instance: Instance) -> dict[tuple, int]:
    """:math:`N^*` of every candidate pool of the instance, keyed ``(lo, hi, gpu, batch cap, gamma in, gamma out)``
    (the compression factors of the pool below and of the pool itself; 1 under split routing)."""
    if instance.pools.routing == "split":
        from fleetopt.optimizer.plan.split_candidates import build_split_problem

        m = build_split_problem(instance)
        b, names = m.boundaries, m.problem.gpu_names
        return {(int(b[i]), int(b[j]), names[g], int(cap), 1.0, 1.0): int(n)
                for i, j, g, cap, n in zip(m.pool_i, m.pool_j, m.problem.pool_gpu, m.pool_cap, m.pool_min_replicas)}
    from fleetopt.optimizer.plan.candidates import generate_candidates

    c = generate_candidates(instance)
    b = c.boundaries
    return {(int(b[i]), int(b[j]), c.gpu_names[g], int(cap), c.gammas[s_in], c.gammas[s_out]): int(n)
            for i, j, g, cap, s_in, s_out, n in zip(c.i, c.j, c.gpu, c.cap, c.state_in, c.state_out,
                                                     c.min_replicas_analytic)}


def _candidate_key(plan: Plan, k: int) -> tuple:
    """The :func:`analytic_minima` key of the candidate behind pool ``k`` of a plan."""
    pools = plan.fleet.pools
    p = pools[k]
    gamma_in = pools[k - 1].compress_gamma if plan.routing is None and k > 0 else 1.0
    return (p.min_tokens, p.max_tokens, p.gpu, int(p.max_num_seqs), float(gamma_in), float(p.compress_gamma))
