"""Why a solve has no plan, in one sentence: the binding requirement of an infeasible instance
(:func:`explain_infeasible`), or why the solver stopped before it found one (:func:`explain_stop`)."""

from __future__ import annotations

import numpy as np

from fleetopt.solvers.oracle import NoFleetError, shortest_fleet
from fleetopt.solvers.outcome import Termination
from fleetopt.solvers.problem import FleetProblem

from fleetopt.optimizer.plan.candidates import Candidates
from fleetopt.optimizer.io.instance import Instance

__all__ = ["explain_infeasible", "explain_stop"]


def explain_infeasible(instance: Instance, allc: Candidates, problem: FleetProblem, result) -> str:
    """Check the requirements one at a time, cheapest first, and report the first that cannot hold."""
    b = allc.boundaries
    top = len(b) - 1
    slo_ms = instance.slo.ttft_p99_s * 1000.0
    # 1. some length range that no feasible candidate covers
    covered = np.zeros(top, dtype=bool)
    for i, j in zip(allc.i, allc.j):
        covered[i:j] = True
    if not covered.all():
        k = int(np.flatnonzero(~covered)[-1])
        best_per_gpu = {}
        for d in allc.dropped:  # each GPU's best attempt: its widest pool covering the range
            if d.hi_tokens >= b[k + 1] and d.lo_tokens <= b[k]:
                width = d.hi_tokens - d.lo_tokens
                if d.gpu not in best_per_gpu or width > best_per_gpu[d.gpu][0]:
                    best_per_gpu[d.gpu] = (width, d)
        detail = "; ".join(f"{g} on {d.lo_tokens:,}-{d.hi_tokens:,}: {d.reason}"
                           for g, (_, d) in sorted(best_per_gpu.items()))
        return (f"no configuration serves {int(b[k]):,}-{int(b[k + 1]):,}-token requests within {slo_ms:,.0f} ms "
                f"P99 TTFT ({detail})")
    # 2. the pool count
    free = _relaxed(problem)
    try:
        shortest_fleet(free)
    except NoFleetError:
        return f"no tiling of 0-{int(b[-1]):,} tokens uses at most {problem.max_pools} feasible pools"
    # 3. each cap on its own, against its own minimum
    checks = [("power", problem.max_power_w, 1e-3, "kW", "the power cap of {cap:,.2f} kW is below the {low:,.2f} kW minimum"),
              ("cost", problem.max_cost_per_hr, 1.0, "$/hr",
               "the budget of ${cap:,.2f}/hr is below the ${low:,.2f}/hr minimum"),
              ("gpus", problem.max_total_gpus, 1.0, "GPUs", "the limit of {cap:,.0f} GPUs is below the {low:,.0f}-GPU minimum")]
    for kind, cap, scale, _unit, text in checks:
        if cap is None:
            continue
        low = _minimum(free, kind) * scale
        if low > cap * scale * (1 + 1e-9):
            return text.format(cap=cap * scale, low=low)
    for g, cap in enumerate(problem.gpu_max_gpus):
        if cap is not None and problem.gpu_min_gpus[g] > cap:
            return f"gpus[{g}] ({problem.gpu_names[g]}): min_count {problem.gpu_min_gpus[g]} exceeds max_count {cap}"
    if sum(problem.gpu_min_pools) > problem.max_pools:
        return (f"the GPU options ask for at least {sum(problem.gpu_min_pools)} pools (min_pools), "
                f"more than pools.max_pools = {problem.max_pools}")
    limits = [f"{n} <= {v}" for n, v in (("max_power_kw", instance.constraints.max_power_kw),
                                          ("max_cost_per_hr", instance.constraints.max_cost_per_hr),
                                          ("max_total_gpus", instance.constraints.max_total_gpus)) if v is not None]
    limits += [f"{g.name}.max_count <= {g.max_count}" for g in instance.gpus if g.max_count is not None]
    limits += [f"{g.name}.min_count >= {g.min_count}" for g in instance.gpus if g.min_count]
    limits += [f"{g.name}.max_pools <= {g.max_pools}" for g in instance.gpus if g.max_pools is not None]
    limits += [f"{g.name}.min_pools >= {g.min_pools}" for g in instance.gpus if g.min_pools]
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
