"""Trimming a verified plan by simulation (``fleetopt solve --verify-top N --trim``).

The analytic model can be conservative as well as optimistic: a pool sized by whole-window KV slots
needs far more replicas than vLLM's paged admission does when most requests are short
(``--sim-kv paged``), and the Erlang-C tail bound over-states the wait of lightly loaded pools. After the
verification loop has chosen a plan that passes, :func:`trim_plan` lowers each pool's replica count as far
as the simulated SLO still holds:

1. Pools are taken most expensive replica first (then the largest count). For pool :math:`k` with
   :math:`n_k` replicas, a bisection on :math:`[1, n_k]` finds the smallest count whose plan (the other
   pools at their current counts) passes the verification rule, simulated with the verification's seed.
   It assumes that fewer replicas never help, which holds in expectation; the common seed (the same
   requests in every trial) keeps the comparisons from flipping on sampling noise.
2. The trimmed plan is simulated again with an independent seed (``seed + 1``), because a bisection over
   many trials favours counts that passed by luck. If that confirmation misses, every trimmed pool gets
   one replica back and the confirmation is repeated, up to :data:`MAX_BACKOFFS` times; after that the
   verified plan is kept unchanged.

Every count the trim reports rests on simulation alone (``source: simulated``): the analytic model may
call the trimmed plan infeasible, and its analytic figures are printed next to it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .instance import Instance
from .solve import Plan

__all__ = ["MAX_BACKOFFS", "TrimStep", "Trim", "trim_plan"]

MAX_BACKOFFS = 3
"""Times the trimmed pools get one replica back when the independent confirmation misses."""


@dataclass(frozen=True)
class TrimStep:
    """One simulated trial: pool ``pool`` (index in the plan; -1 for a confirmation with the independent seed)
    at ``replicas``, the plan at ``counts``."""

    pool: int
    replicas: int
    counts: tuple[int, ...]
    passed: bool
    ttft_p99_ms_sim: float
    seed: int


@dataclass(frozen=True)
class Trim:
    """What trimming found: the counts, their simulations and every trial."""

    verified_counts: tuple[int, ...]
    counts: tuple[int, ...]
    """Replicas per pool of the trimmed plan (the verified counts when nothing could be trimmed or confirmed)."""
    sim: object
    """The trimmed plan's simulation with the verification's seed (a :class:`optimizer.sim_report.SimReport`)."""
    confirmation: object
    """Its simulation with the independent seed (the one that decides)."""
    confirmed: bool
    """The final counts pass with the independent seed (when every backoff missed, the final counts are the
    verified ones, which may then miss too: the verification's own pass was one seed's)."""
    steps: tuple[TrimStep, ...]
    cost_per_hr: float
    verified_cost_per_hr: float

    @property
    def savings(self) -> float:
        """Share of the verified plan's cost the trim saves."""
        return 1.0 - self.cost_per_hr / self.verified_cost_per_hr if self.verified_cost_per_hr else 0.0


def trim_plan(instance: Instance, plan: Plan, passes: Callable[[object], bool], *, seed: int = 0,
              simulate_options: dict | None = None, progress=None) -> Trim:
    """Lower the replica counts of a verified ``plan`` while its simulation ``passes`` (module docstring).

    ``passes(sim_report)`` is the verification rule; ``simulate_options`` are those of
    :func:`optimizer.simulate.simulate_plan` (requests, engine settings, ...).
    """
    from .simulate import plans_from_fleet
    from .verify import simulate_pools

    base = plans_from_fleet(instance, plan.fleet)
    options = dict(simulate_options or {})
    steps: list[TrimStep] = []
    cache: dict = {}

    def run(counts: tuple[int, ...], run_seed: int):
        key = (counts, run_seed)
        if key not in cache:
            pools = [replace(p, replicas=n) for p, n in zip(base, counts)]
            cache[key] = simulate_pools(instance, pools, plan.routing, seed=run_seed, progress=progress, **options)
        return cache[key]

    def trial(k: int, counts: tuple[int, ...], run_seed: int) -> bool:
        sim = run(counts, run_seed)
        ok = bool(passes(sim))
        steps.append(TrimStep(k, counts[k], counts, ok, sim.ttft_p99_ms, run_seed))
        return ok

    verified = tuple(int(p.replicas) for p in base)
    counts = list(verified)
    per_replica = [p.profile.cost_usd_per_hr for p in base]
    for k in sorted(range(len(base)), key=lambda k: (-per_replica[k], -counts[k], k)):
        lo, hi = 1, counts[k]                       # hi passes (the verified plan, or an earlier trim)
        while lo < hi:
            mid = (lo + hi) // 2
            trial_counts = tuple(counts[:k] + [mid] + counts[k + 1:])
            if trial(k, trial_counts, seed):
                hi = mid
            else:
                lo = mid + 1
        counts[k] = hi
    confirm_seed = seed + 1
    trimmed = tuple(counts)
    for backoff in range(MAX_BACKOFFS + 1):
        if trimmed == verified or trial(-1, trimmed, confirm_seed):
            break
        trimmed = verified if backoff == MAX_BACKOFFS else tuple(min(n + 1, v) for n, v in zip(trimmed, verified))
    confirmation = run(trimmed, confirm_seed)
    cost = sum(n * c for n, c in zip(trimmed, per_replica))
    verified_cost = sum(n * c for n, c in zip(verified, per_replica))
    return Trim(verified, trimmed, run(trimmed, seed), confirmation, bool(passes(confirmation)), tuple(steps),
                float(cost), float(verified_cost))
