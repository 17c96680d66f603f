"""Verification (``fleetopt solve --verify-top N``): simulate the best plans before anyone buys GPUs.

Each round solves for the ``N`` best distinct plans, simulates every one with the same simulator users
call (:func:`fleetopt.optimizer.simulation.simulate.simulate_plan`; a split-routing plan with its own routing, see
``Plan.routing``), and keeps the cheapest plan that meets the SLO by simulation under the chosen rule.
When none does, the failing pools get cuts (below) and the model is solved again, up to ``max_rounds``.
Every round is reported, and a plan judged in an earlier round is never simulated again (its verdict is
kept by its pools: window, GPU, count, batch cap, compression, and a split plan's routing).

Rules (``rule``):

* ``ci-upper`` (default): the upper end of the 95 % confidence interval of the simulated P99 TTFT is
  within the SLO (for a pool-scope SLO, in every pool; for a fleet-scope SLO, over all requests);
* ``point``: the simulated P99 point estimate is within the SLO;
* ``attainment``: at least 99 % of the simulated requests meet the SLO.

Under a pool-scope SLO a pool with traffic but fewer than
:data:`~fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS` measured requests is *thin*: its verdict is
flagged ``too few requests``, never ``ok``, and the plan is simulated once more with its requests scaled so
that the pool should reach them (up to ``max_requests``); a plan with a thin pool does not pass.

Undecided verdicts
------------------
Under ``ci-upper`` a simulated pool (a fleet, under a fleet-scope SLO) has three outcomes
(:func:`~fleetopt.optimizer.simulation.pool_sizing.pool_outcome`): *pass* (its P99 TTFT interval is within the
SLO), *fail* (the interval's lower end is above it: a miss the interval supports) and *undecided* (it straddles
the SLO). A plan with no failing pool and an undecided one is simulated again with
:data:`~fleetopt.optimizer.simulation.pool_sizing.ESCALATION_STEP` times the requests, until it is decided or
its requests reach :func:`~fleetopt.optimizer.simulation.pool_sizing.escalation_cap` (16 times
``sim_options.requests``, at most 2 million unless those are more; :func:`simulate_plan_checked`; not with a
``precision`` target, whose own loop sets the run's length: the doubling ladder of
:func:`~fleetopt.optimizer.simulation.simulate.simulate_plan`, whose rungs too short for the target are skipped,
:mod:`fleetopt.optimizer.simulation.pool_sizing`, "Precision ladder"). Only a failing pool is cut, so an interval
too wide to decide never becomes replicas. A pool still undecided at the cap is settled by its point estimate
(:func:`~fleetopt.optimizer.simulation.pool_sizing.settled_outcome`): above the SLO it fails (and is cut); within
it the plan is *accepted undecided*: it may be chosen like a passing plan (the analytic model and the point of
the longest run both meet the SLO, and more requests than the cap would be needed to tell), with
``VerifiedPlan.outcome == "undecided"``, ``passed`` False and the verdict "undecided in simulation at N
requests" in the table and the JSON (``verification.outcome``, ``verification.verdict``, each plan's
``outcome``). ``solve`` then exits 0, as for a passing plan (:mod:`fleetopt.optimizer.errors`: a plan was found;
the verdict says how far simulation confirms it); no error code fits a plan that no evidence rejects. Pool-alone
sizing uses the same three outcomes (:mod:`fleetopt.optimizer.simulation.pool_sizing`, "Undecided verdicts").
Measured on ``ref_puzzle1_lmsys_a100`` split at 2,048 tokens (``--verify-top 1``): the long pool's 7 units straddle
the SLO
at 100,000 requests (389 ms [300, 547]) and used to be cut to 34 units (13 homogeneous units, $28.73/hr, or exit
4 when the rounds ran out); now seed 0 passes at 400,000 requests (418 ms [349, 486], 17 s), seeds 1 and 2 are
accepted undecided at 1.6 million (466 ms [423, 516]), seed 3 passes there, each 1 + 7 units ($17.68/hr) in
70-80 s on the shared 2-core machine.

Per-pool cuts (``cuts="pool"``, the default)
--------------------------------------------
Under length routing and a pool-scope SLO a pool's verdict depends only on its own traffic and replica
count, so a failing pool is sized *alone* (:mod:`fleetopt.optimizer.simulation.pool_sizing`): its candidate
(window, GPU, batch cap) is simulated at increasing counts with common random numbers until the least
count that passes is found, and every verdict is cached for the whole solve. That count is an exact lower
bound for the candidate in simulation: ``SolveOptions.min_replicas[(lo, hi, gpu)]`` (the solver's cuts are
keyed by window and GPU: when several batch caps or compression states of one window and GPU are sized,
the cut is the largest of their counts, which may exclude a cheaper variant). A candidate that misses even
at :data:`~fleetopt.optimizer.simulation.pool_sizing.CAP_FACTOR` times its count is forbidden
(``SolveOptions.forbidden``) with that reason; when the solver then has no plan, ``Verification.reason``
says which requests cannot be served and why, and ``solve`` exits 3.

Every failing plan of a round is cut, not only the best. From the second round on, before plans are
simulated whole, each new plan is *screened*: every pool is simulated alone at its count (cached), a pool
that misses alone is sized and cut at once, and the model is solved again, up to :data:`MAX_SCREENS`
times, until the best plan's pools all pass alone. Only then are the plans whose pools all pass alone
simulated whole: the whole simulation stays the user-visible verdict (its requests differ from the
pools' own runs, so a plan can still miss by sampling noise; the miss is then recorded as a failing
count of that pool and its sizing resumes above it). The first round is simulated whole without
screening, so a plan the analytic model got right costs nothing more.

Optimality
----------
A plan that passes is an *incumbent*, not yet the answer: a cheaper plan of the same round may have failed
only in a pool that more replicas fix. With per-pool cuts, every failing plan cheaper than the incumbent has
its failing pools sized alone and cut, and the model is solved again; plans no cheaper than the incumbent are
not simulated. The incumbent is returned once the cut model's optimum is no cheaper than it (the cuts are
lower bounds, so no plan the simulation accepts is cheaper) or the rounds run out. The proof costs a solve,
not a simulation; the reported rounds are those that simulated. Measured on 20 small random instances
(``tests/test_verify_quality.py``): returning the first passing plan was 20 % and 33 % above the exhaustive
optimum on two of them.

Plan-level cuts (``cuts="count"`` or ``"window"``, and under split routing or a fleet-scope SLO)
---------------------------------------------------------------------------------------------
A missing pool :math:`(b_{lo}, b_{hi}, g)` with :math:`n` replicas gets a count cut: its least replica
count becomes :math:`n^+ = \\max(n + 1, \\lceil 1.1 n \\rceil)` (``SolveOptions.min_replicas``). With
``cuts="count"`` or ``"window"`` only the round's best plan is cut (the heuristics as first measured); with
``cuts="pool"`` where pools cannot be sized alone (split routing, whose routing shares are free; a
fleet-scope SLO, whose verdict is not per pool; compress-and-route pools, which exchange a band of
requests), every failing plan gets count cuts.

With ``cuts="window"`` and length routing a count cut also brings a window cut
(:class:`fleetopt.optimizer.plan.candidates.WindowCut`) with the derating factor
:math:`f = n^+ / N^*_{(b_{lo}, b_{hi}, g)}`, :math:`N^*` the pool's analytic minimum count before
availability inflation (``Candidates.min_replicas_analytic``): every candidate pool
:math:`(b', b_{hi}, g)` with :math:`b' \\le b_{lo}` needs at least :math:`\\lceil f N^*_{(b', b_{hi}, g)} \\rceil`
replicas. Plan-level cuts are heuristics, not proofs: they may exclude a cheaper plan that would pass,
and the loop may end after ``max_rounds`` without a verified plan (``solve`` exits 4: a limit, not a proof).
A plan-level cut, too, follows only a failing pool (above, "Undecided verdicts").

P/D pairs
---------
A disaggregated prefill/decode pair is simulated as its two stations with the KV transfer between them
(:mod:`fleetopt.optimizer.simulation.pairs`) and reported as two rows over its segment. Each row is judged by the
rule on its own figure: the prefill row on the pair's P99 TTFT (prefill wait + prefill + transfer), the decode row
on its P99 TPOT (against ``slo.tpot_p99_ms``; without a TPOT SLO it cannot miss), with the same pass / fail /
undecided outcomes and escalation as any pool (:func:`~fleetopt.optimizer.simulation.pool_sizing.pool_outcome`).
A plan with a failing or thin pair row does not pass. Pairs are **not sized alone** and get **no cut**: a failing
pair keeps its analytic counts (a cut line says which phase missed), so every plan holding it fails and the
verification ends with another plan or none (at once when a round's only failing pools are pairs: solving again
would return the same plans); pool-alone sizing and screening skip pair rows.

Semantic plans
--------------
A multi-model plan (an instance's ``semantic`` section) is simulated with its classifier
(:mod:`fleetopt.optimizer.simulation.simulate`, "Semantic plans") and judged as any other plan: each pool's P99
TTFT under a pool-scope SLO, the fleet's over both classes under a fleet-scope one, with the same pass / fail /
undecided outcomes and escalation. A semantic pool is **not sized alone** and gets **no cut**: its traffic is its
class's (a share :math:`\\alpha(L)` of each length), which a pool-alone run on the instance's workload would not
draw, and the semantic solve takes no verification cuts (one MIP per share rule). So the plans keep their
analytic counts; the cheapest that passes (or is accepted undecided) is chosen, and a round in which every
failing pool is semantic (all of them, in a semantic plan) ends the search with a line per failing pool, as for
P/D pairs: solving again would return the same plans. Trimming (``trim=True``) lowers a semantic plan's counts
like any plan's, each trial simulated with the plan's classifier.

Measured
--------
``fleetopt solve INSTANCE --verify-top 3`` (default: 100,000 requests per plan, 5 replications, seed 0,
``cuts="pool"``), wall time on the 2-core machine with another simulation job running beside it, with the
default analytic model unless the row says otherwise:

==========================================  ======  ==========================================  =======  ======
instance (``--set``)                        rounds  verified plan                               $/hr     wall s
==========================================  ======  ==========================================  =======  ======
p3 example (issue 10; Azure, 3 GPUs)        1       0-1536 a10g x2, 1536-8192 h100 x5           22.12    33
``ref_puzzle3_azure_mixed``                 1       0-1536 a10g x2, 1536-8192 h100 x5           22.12    32
``ref_puzzle6_lmsys_mixed``                 1       0-8192 a10g x6, 8192-65536 h100 x2          14.10    46
``ref_puzzle1_lmsys_a100``                  1       0-1536 a100 x1, 1536-65536 a100 x8          19.89    37
``ref_puzzle1_lmsys_a100``, mean-prefill    2       0-1536 a100 x1, 1536-65536 a100 x8          19.89    115
``ref_puzzle2_agent_h100`` (Puzzle 2)       1       0-16384 h100 x8, 16384-65536 h100 x12       80.40    39
``ref_units_lmsys_a100_h100``               1       0-1536 a100 x1, 1536-8192 h100 x1,          14.27    50
                                                    8192-65536 h100 x2
==========================================  ======  ==========================================  =======  ======

Under the seeds' ``mean-prefill`` convention most of the time goes to sizing candidates alone (90 single-pool
simulations on ``ref_puzzle1_lmsys_a100``): that model's plans miss in simulation, and each missing window is sized.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from collections.abc import Callable
from typing import cast

from fleetopt.models.units import P99
from fleetopt.optimizer.plan.candidates import WindowCut
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.solve import Plan, SolveOptions, SolveReport, solve_instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.pool_sizing import (ESCALATION_STEP, PoolCandidate, PoolSizer, PoolSizing,
                                                       escalation_cap, judged_point_ms, ladder_run, pool_misses,
                                                       pool_outcome, settled_outcome)
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS, SimReport, interval_outcome
from fleetopt.optimizer.simulation.simulate import simulate_solved_plan

__all__ = ["RULES", "CUTS", "VerifiedPlan", "Verification", "PlanVerdict", "verify", "analytic_minima",
           "plan_verdict", "judge_plan", "simulate_plan_checked"]

RULES = ("ci-upper", "point", "attainment")
CUTS = ("pool", "count", "window")
MAX_SCREENS = 8
"""Solves per round while the best plan has a pool that misses when simulated alone (module docstring)."""
THIN_MARGIN = 1.25
"""A plan with a pool below :data:`MIN_POOL_REQUESTS` is simulated again with its requests scaled by the
missing factor times this margin (measured requests vary with the warm-up)."""


@dataclass(frozen=True)
class VerifiedPlan:
    """One plan of one round with its simulation and the verdict."""

    round: int
    rank: int
    plan: Plan
    sim: SimReport
    passed: bool
    failing_pools: tuple[tuple[int, int, str], ...]
    """``(lo, hi, gpu)`` of the pools that miss under the rule."""
    thin_pools: tuple[tuple[int, int, str], ...] = ()
    """``(lo, hi, gpu)`` of the pools with too few measured requests for a verdict (``too_few_requests``; they
    keep the plan from passing without counting as misses)."""
    cached: bool = False
    """The plan was judged in an earlier round; its verdict and simulation are that round's (not re-simulated)."""
    undecided_pools: tuple[tuple[int, int, str], ...] = ()
    """``(lo, hi, gpu)`` of the pools whose interval still straddles the SLO at the escalation cap with the point
    estimate within it (module docstring, "Undecided verdicts"): they keep the plan from passing, not from being
    accepted."""

    @property
    def outcome(self) -> str:
        """``"pass"`` (every pool's interval within the SLO), ``"fail"`` (a pool misses: the cuts' evidence) or
        ``"undecided"`` (no pool misses; a pool is undecided at the cap, or has too few requests)."""
        return "pass" if self.passed else "fail" if self.failing_pools else "undecided"

    @property
    def accepted(self) -> bool:
        """The plan may be the answer: it passes, or it is undecided at the cap with every point estimate within
        the SLO (no pool with too few requests)."""
        return self.passed or (bool(self.undecided_pools) and not self.failing_pools and not self.thin_pools)

    def verdict(self) -> str:
        """One line: ``passes``, ``misses`` or ``undecided in simulation at N requests``."""
        if self.outcome == "undecided" and self.accepted:
            return f"undecided in simulation at {self.sim.requests_simulated:,} requests"
        return {"pass": "passes", "fail": "misses", "undecided": "too few requests"}[self.outcome]


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
    reason: str | None = None
    """Why no plan exists when the cuts left the solver without one: the pools that cannot meet the SLO in
    simulation at any count, and the solver's explanation (None otherwise)."""
    sizings: tuple[PoolSizing, ...] = ()
    """Every per-pool simulated sizing (``cuts="pool"``; :mod:`fleetopt.optimizer.simulation.pool_sizing`)."""
    pool_simulations: int = 0
    """Single-pool verdicts the sizings simulated (each candidate and count once)."""
    plan_simulations: int = 0
    """Simulations of whole plans (a plan judged before is not simulated again)."""
    solves: int = 0
    """Solves of the MIP (a round may re-solve after screening, module docstring)."""
    pool_runs: int = 0
    """Simulator runs behind the single-pool verdicts (a verdict run again with more requests counts each run)."""

    @property
    def verified(self) -> bool:
        return self.chosen is not None

    @property
    def infeasible(self) -> bool:
        """No plan is left: the solver had none once the cuts were in (``reason`` says why)."""
        return self.chosen is None and self.reason is not None

    @property
    def outcome(self) -> str | None:
        """The chosen plan's outcome: ``"pass"``, or ``"undecided"`` (accepted undecided at the cap; module
        docstring, "Undecided verdicts"); None without a chosen plan."""
        return None if self.chosen is None else self.chosen.outcome


@dataclass(frozen=True)
class PlanVerdict:
    """What one simulated plan says under a rule (:func:`judge_plan`); pools as ``(lo, hi, gpu)``."""

    failing: tuple[tuple[int, int, str], ...]
    """Pools that miss: the interval's lower end above the SLO (or, settled, the point estimate above it)."""
    thin: tuple[tuple[int, int, str], ...]
    """Pools that do not miss but measured fewer than :data:`MIN_POOL_REQUESTS` requests."""
    undecided: tuple[tuple[int, int, str], ...]
    """Pools whose interval straddles the SLO (pool scope; under a fleet-scope SLO every pool when the fleet's
    interval straddles it)."""

    @property
    def passed(self) -> bool:
        return not (self.failing or self.thin or self.undecided)

    @property
    def outcome(self) -> str:
        """``"pass"``, ``"fail"`` or ``"undecided"`` (undecided or thin pools, none failing)."""
        return "pass" if self.passed else "fail" if self.failing else "undecided"


def plan_verdict(sim, instance: Instance, rule: str) -> tuple[bool, tuple, tuple]:
    """Verdict on one run of a plan: ``(passed, failing pools, thin pools)``, pools as ``(lo, hi, gpu)``
    (:func:`judge_plan` of this run alone; an undecided pool is neither passing nor failing)."""
    v = judge_plan(sim, instance, rule)
    return v.passed, v.failing, v.thin


def judge_plan(sim, instance: Instance, rule: str, settled: bool = False) -> PlanVerdict:
    """The three-way verdict on one simulated plan (module docstring, "Undecided verdicts").

    Pool scope: each pool's outcome under ``rule``
    (:func:`~fleetopt.optimizer.simulation.pool_sizing.pool_outcome`, TPOT included when the SLO sets one); a pool
    that does not fail but holds fewer than :data:`MIN_POOL_REQUESTS` measured requests is *thin* and keeps the
    plan from passing. Fleet scope: the fleet's P99 interval (or point, or attainment) decides; when it fails, the
    pools that do not pass on their own fail (none: the one with the worst attainment, for the cuts), and when it
    is undecided, so are they (none: every pool). ``settled=True``: this run is the last
    (:func:`simulate_plan_checked` escalated it to the cap), so an undecided pool whose P99 point estimate is
    above the SLO fails (:func:`~fleetopt.optimizer.simulation.pool_sizing.settled_outcome`).
    """
    slo_ms = instance.slo.ttft_p99_s * 1000.0
    key = lambda p: (p.min_tokens, p.max_tokens, p.gpu)  # noqa: E731
    if instance.slo.scope == "fleet":
        low, high = sim.ttft_p99_ci_ms
        if rule == "ci-upper":
            out = interval_outcome(low, high, slo_ms)
        elif rule == "point":
            out = "pass" if sim.ttft_p99_ms <= slo_ms else "fail"
        else:
            out = "pass" if sim.slo_attainment >= P99 else "fail"
        if settled:
            out = settled_outcome(out, sim.ttft_p99_ms, slo_ms)
        if out == "pass":
            return PlanVerdict((), (), ())
        pools = tuple(dict.fromkeys(key(p) for p in sim.pools if pool_misses(p, rule, slo_ms)))
        if out == "undecided":
            return PlanVerdict((), (), pools or tuple(dict.fromkeys(key(p) for p in sim.pools)))
        if not pools:  # no pool misses on its own: cut the one with the worst attainment
            judged = [p for p in sim.pools if not math.isnan(p.slo_attainment)] or list(sim.pools)
            pools = (key(min(judged, key=lambda p: p.slo_attainment)),)
        return PlanVerdict(pools, (), ())
    tpot_ms = None if instance.slo.tpot_p99_s is None else instance.slo.tpot_p99_s * 1000.0
    outs = []
    for p in sim.pools:
        out = pool_outcome(p, rule, slo_ms, tpot_ms)
        outs.append((key(p), settled_outcome(out, *judged_point_ms(p, slo_ms, tpot_ms)) if settled else out, p))
    failing = tuple(dict.fromkeys(k for k, out, _ in outs if out == "fail"))
    thin = tuple(dict.fromkeys(k for k, _, p in outs if p.too_few_requests and k not in failing))
    undecided = tuple(dict.fromkeys(k for k, out, _ in outs if out == "undecided" and k not in failing + thin))
    return PlanVerdict(failing, thin, undecided)


def verify(instance: Instance, options: SolveOptions = SolveOptions(),  # noqa: B008 frozen dataclass default
           sim_options: SimOptions = SimOptions(), *,  # noqa: B008 frozen dataclass default
           top: int = 3, rule: str = "ci-upper", max_rounds: int = 3, progress=None, cuts: str = "pool",
           trim: bool = False, on_step: Callable[[str], None] | None = None,
           map_plans: Callable[[Callable, list], list] | None = None) -> tuple[SolveReport, Verification]:
    """Solve, simulate the ``top`` plans, and cut and re-solve until one passes (see the module docstring).

    ``sim_options`` are the settings of every simulation
    (:class:`~fleetopt.optimizer.simulation.options.SimOptions`): each plan of each round runs with the same
    seed, so plans are compared on the same requests. ``cuts`` chooses how a failing pool is cut: ``pool``
    (default) sizes it alone by simulation (:mod:`fleetopt.optimizer.simulation.pool_sizing`) where its traffic
    is its own, else a count cut; ``count`` and ``window`` are the heuristics of "Plan-level cuts".
    ``trim=True`` then lowers the chosen plan's counts while its simulation still passes
    (:mod:`fleetopt.optimizer.simulation.trim`). The plans are sized to the SLO itself (``slo.ttft_margin`` is
    set to 0: the simulation is the check the margin stands in for). Returns the last round's solve report and
    the verification record; the chosen plan (if any) is ``verification.chosen``.

    ``map_plans(fn, args_list)``, if given, runs ``fn(*args)`` for each ``args`` of the list and returns the results
    in order: the whole-plan simulations of a round are independent (each on the same seed), so the command
    layer runs them on its executor (local processes or Dask; :mod:`fleetopt.optimizer.workflows.executor`); the
    results are the same as in this process, where they run without it.

    ``progress(done, total)`` is passed to every simulation (requests done); ``on_step(message)``, if given, is
    called with a one-line message naming the step about to be worked: before each solve and each whole-plan
    simulation (``plan 2 (2 of 3; ...)``), single-pool
    simulation (:class:`~fleetopt.optimizer.simulation.pool_sizing.PoolSizer`) and trim trial
    (:func:`~fleetopt.optimizer.simulation.trim.trim_plan`); the command layer renders both.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    if cuts not in CUTS:
        raise ValueError(f"cuts must be one of {CUTS}; got {cuts!r}")
    if not isinstance(sim_options, SimOptions):
        raise ValueError(f"sim_options must be a SimOptions; got {sim_options!r}")
    if max_rounds < 1:   # no solve would run, and there would be no report to return
        raise ValueError(f"max_rounds must be at least 1; got {max_rounds!r}")
    # the simulator, not a margin, stands between the model and the SLO here: size to the SLO itself
    instance = replace(instance, slo=instance.slo.without_margin())
    length = instance.pools.routing == "length"
    window_cuts = cuts == "window" and length  # module docstring: not under split
    step = on_step if on_step is not None else _quiet
    semantic = instance.semantic is not None     # module docstring, "Semantic plans": no pool-alone sizing, no cut
    sizer = PoolSizer(instance, sim_options, rule, progress, on_step=on_step) if (
        cuts == "pool" and length and instance.slo.scope == "pool" and not semantic) else None
    user_min = dict(options.min_replicas)
    min_replicas: dict = dict(user_min)
    forbidden: set = set(options.forbidden)
    forbidden_why: dict = {}
    factors: dict[tuple[int, int, str], float] = {}  # (lo, hi, gpu) -> the largest derating factor of its window cuts
    minima = None
    sizings: dict = {}
    judged: dict = {}   # plan key -> (sim, PlanVerdict)
    verified, cut_lines = [], []
    report, plan_sims = None, [0]

    def simulate_all(round_: int, plans: list[Plan]) -> list:
        args = [(instance, plan, sim_options, None, rule) for plan in plans]

        def announce(k: int, plan: Plan) -> None:     # the step being worked: plan x of the round's N
            step(f"verify round {round_}: simulating plan {plan.rank} ({k} of {len(plans)}; "
                 f"${plan.fleet.cost_per_hr:,.2f}/hr, {sum(p.replicas for p in plan.fleet.pools)} replicas)")

        if map_plans is None or len(plans) < 2:
            done = []
            for k, a in enumerate(args, 1):
                announce(k, a[1])
                done.append(simulate_plan_checked(*a[:3], progress, rule))
        else:                                         # other processes: no progress callback crosses over
            for k, a in enumerate(args, 1):
                announce(k, a[1])
            done = map_plans(simulate_plan_checked, args)
        plan_sims[0] += sum(n for _, n in done)
        return [sim for sim, _ in done]

    solves = [0]

    def solve(round_: int):
        derated = options.window_cuts + tuple(WindowCut(*key, f) for key, f in factors.items())
        solves[0] += 1
        step(f"verify round {round_}: solve {solves[0]}: the {top} best plan(s)" + (
            f" under {len(cut_lines)} cut(s)" if cut_lines else ""))
        return solve_instance(instance, replace(options, top=top, min_replicas=tuple(min_replicas.items()),
                                                forbidden=tuple(sorted(forbidden)), window_cuts=derated))

    def cut_alone(round_: int, plan: Plan, k: int, sim_pool=None) -> None:
        cand = _candidate(plan, k)
        pool = plan.fleet.pools[k]
        if sim_pool is not None:
            assert sizer is not None   # a plan's failing pool is cut alone under a sizer alone
            sizer.record_miss(cand, pool.replicas, sim_pool)
        # called under a sizer alone, and after round 1 set the minima
        line = _size_cut(round_, cast(PoolSizer, sizer), cand, pool, cast(dict, minima), sizings, min_replicas,
                         user_min, forbidden, forbidden_why, sim_pool is not None)
        if line and line not in cut_lines:    # several plans of a round may share a failing pool
            cut_lines.append(line)

    incumbent = None    # the cheapest plan that passed so far (module docstring, "Optimality")

    def screen_budget(cand: PoolCandidate) -> int:
        assert sizer is not None   # screening runs under a sizer alone
        return sizer.budget(cand)

    def finish(chosen, rounds: int):
        trimmed = None
        if trim:
            from fleetopt.optimizer.simulation.trim import trim_plan

            trimmed = trim_plan(instance, chosen.plan, lambda sim: plan_verdict(sim, instance, rule)[0],
                                sim_options, progress=progress, on_step=on_step)
        # finish follows a solve: report is set
        return cast(SolveReport, report), Verification(
            rule, rounds, tuple(verified), chosen, tuple(cut_lines), trimmed, sim_options, None,
            tuple(sizings.values()), _sims(sizer), plan_sims[0], solves[0], 0 if sizer is None else sizer.runs)

    def beats(plan) -> bool:
        return incumbent is None or plan.fleet.cost_per_hr < incumbent.plan.fleet.cost_per_hr * (1 - 1e-9)

    for round_ in range(1, max_rounds + 1):
        report = solve(round_)
        if incumbent is not None and not (report.plans and beats(report.plans[0])):
            return finish(incumbent, round_ - 1)      # no plan the cuts allow is cheaper: the incumbent is optimal
        screened = None
        if sizer is not None and round_ > 1:      # screening: only once a round has failed (module docstring)
            for _ in range(MAX_SCREENS):
                if not report.plans:
                    break
                screened = []
                for plan in report.plans:
                    if _plan_key(plan) in judged:
                        screened.append(plan)
                        continue
                    misses = [k for k, pool in _sizable(plan) if not sizer.verdict(
                        _candidate(plan, k), pool.replicas, [screen_budget(_candidate(plan, k))]).passed]
                    for k in misses:
                        cut_alone(round_, plan, k)
                    if not misses:
                        screened.append(plan)
                if screened and screened[0].rank == report.plans[0].rank:
                    break
                report = solve(round_)
        if not report.plans:
            break
        this_round = []
        # a plan that cannot beat one that already passed is not simulated; a plan judged before is not again
        candidates = [plan for plan in (report.plans if not screened else screened) if beats(plan)]
        fresh = {}
        for plan in candidates:
            key = _plan_key(plan)
            if key not in judged and key not in fresh:
                fresh[key] = plan
        for key, sim in zip(fresh, simulate_all(round_, list(fresh.values()))):
            judged[key] = (sim, judge_plan(sim, instance, rule, settled=True))
        for plan in candidates:
            key = _plan_key(plan)
            sim, got = judged[key]
            this_round.append(VerifiedPlan(round_, plan.rank, plan, sim, got.passed, got.failing, got.thin,
                                           key not in fresh, got.undecided))
        verified += this_round
        passing = [v for v in this_round if v.accepted]      # passed, or undecided at the cap (module docstring)
        if passing:
            best = min(passing, key=lambda v: (v.plan.fleet.cost_per_hr, v.rank))
            if beats(best.plan):
                incumbent = best
        cheaper_failed = [v for v in this_round if not v.accepted and beats(v.plan)]
        if incumbent is not None and (not cheaper_failed or sizer is None or round_ == max_rounds):
            return finish(incumbent, round_)
        if (window_cuts or sizer is not None) and minima is None:
            minima = analytic_minima(instance)
        to_cut = ([v for v in this_round if not v.cached and beats(v.plan)] if cuts == "pool" else this_round[:1])
        if semantic:
            for vp in to_cut:
                for k, _ in _failing(vp):
                    line = _semantic_miss_line(round_, vp, k)
                    if line not in cut_lines:
                        cut_lines.append(line)
            break       # semantic pools get no cut: solving again would give the same plans
        failing_rows = [pool for vp in to_cut for _, pool in _failing(vp)]
        if failing_rows and all(getattr(p, "phase", "both") != "both" for p in failing_rows):
            for vp in to_cut:
                for k, _ in _failing(vp):
                    line = _pair_miss_line(round_, vp.plan, k)
                    if line not in cut_lines:
                        cut_lines.append(line)
            break       # only pairs failed, and they get no cut: solving again would give the same plans
        for vp in to_cut:
            for k, pool in _failing(vp):
                key = (pool.min_tokens, pool.max_tokens, pool.gpu)
                if getattr(pool, "phase", "both") != "both":     # module docstring, "P/D pairs": no cut
                    line = _pair_miss_line(round_, vp.plan, k)
                    if line not in cut_lines:
                        cut_lines.append(line)
                    continue
                cand = _candidate(vp.plan, k)
                if sizer is not None and cand.gamma_in == 1.0 and cand.gamma_out == 1.0:
                    cut_alone(round_, vp.plan, k, vp.sim.pools[k])
                    continue
                current = pool.replicas
                raised = max(current + 1, math.ceil(current * 1.1))
                if min_replicas.get(key, 0) >= raised:
                    continue
                min_replicas[key] = raised
                text = (f"round {round_}: {key[0]:,}-{key[1]:,} on {key[2]} needs at least {raised} replicas "
                        f"(simulated P99 misses with {current})")
                n_star = minima.get(cand.key) if window_cuts and minima is not None else None   # set: window cuts
                if cuts == "window" and not window_cuts:
                    text += ("; no window cut under split routing (routing shares are free, so a lower start need "
                             "not carry this pool's traffic)")
                if n_star:
                    factor = raised / n_star
                    factors[key] = max(factors.get(key, 0.0), factor)
                    text += (f"; every pool on {key[2]} with the {key[1]:,}-token window starting at or below "
                             f"{key[0]:,} needs at least {factor:.3g} x its analytic minimum ({raised} / {n_star})")
                cut_lines.append(text)
    reason = None
    if report is not None and not report.plans:
        why = [forbidden_why[k] for k in sorted(forbidden_why)]
        reason = "; ".join(why + [str(report.explanation)]) if why else str(report.explanation)
    assert report is not None    # max_rounds >= 1: the first round solved
    return report, Verification(
        rule, len({v.round for v in verified}), tuple(verified), None, tuple(cut_lines), options=sim_options,
        reason=reason, sizings=tuple(sizings.values()), pool_simulations=_sims(sizer), plan_simulations=plan_sims[0],
        solves=solves[0], pool_runs=0 if sizer is None else sizer.runs)


def simulate_plan_checked(instance: Instance, plan: Plan, sim_options: SimOptions, progress=None,
                          rule: str | None = None) -> tuple:
    """One plan's verification run: :func:`~fleetopt.optimizer.simulation.simulate.simulate_solved_plan`, run again
    with more requests when a pool that decides the verdict measured too few of its own (pool-scope SLO, no
    ``--precision``; module docstring, "Per-pool statistics"), then, with a ``rule``, while no pool fails and one
    is undecided (:func:`judge_plan`), with :data:`~fleetopt.optimizer.simulation.pool_sizing.ESCALATION_STEP`
    times the requests, up to :func:`~fleetopt.optimizer.simulation.pool_sizing.escalation_cap` (module docstring,
    "Undecided verdicts"). With a ``precision`` target its own loop sets the run's length instead: the doubling
    ladder of :func:`~fleetopt.optimizer.simulation.simulate.simulate_plan`, skipping the rungs the last one
    shows to be too short (:func:`fleetopt.optimizer.simulation.pool_sizing.ladder_run`; counted as one simulation).
    Returns ``(report, simulations run)``; the report is the last run's. A module-level function, so an executor
    can run it in another process."""
    if sim_options.precision is not None:     # the doubling ladder, skipping the rungs too short to meet it
        return ladder_run(lambda o, shown: simulate_solved_plan(instance, plan, o, progress=shown), sim_options,
                          instance.slo.scope, progress), 1
    requests = sim_options.requests
    sim = simulate_solved_plan(instance, plan, sim_options, progress=progress)
    runs = 1
    thin = [p for p in sim.pools if p.too_few_requests]
    if thin and instance.slo.scope == "pool":
        scale = THIN_MARGIN * max(MIN_POOL_REQUESTS / max(p.requests, 1) for p in thin)
        more = min(math.ceil(requests * scale), max(sim_options.max_requests, requests))
        if more > requests:
            requests = more
            sim = simulate_solved_plan(instance, plan, replace(sim_options, requests=requests), progress=progress)
            runs += 1
    if rule is None:
        return sim, runs
    cap = escalation_cap(sim_options.requests)
    while requests < cap and sim.requests_simulated >= requests:     # (fewer: a trace ran out)
        got = judge_plan(sim, instance, rule)
        if got.failing or not got.undecided:
            break
        requests = min(requests * ESCALATION_STEP, cap)
        sim = simulate_solved_plan(instance, plan, replace(sim_options, requests=requests), progress=progress)
        runs += 1
    return sim, runs


def _quiet(message: str) -> None:
    """The ``on_step`` of a caller that gave none."""


def _sims(sizer) -> int:
    return 0 if sizer is None else sizer.simulations


def _failing(vp: VerifiedPlan):
    """``(index, pool)`` of each failing pool of a plan (the one with the most replicas when two share a key)."""
    out = {}
    for k, p in enumerate(vp.plan.fleet.pools):
        key = (p.min_tokens, p.max_tokens, p.gpu)
        if key in vp.failing_pools and (key not in out or p.replicas > out[key][1].replicas):
            out[key] = (k, p)
    return list(out.values())


def _sizable(plan: Plan):
    """``(index, pool)`` of the pools of a plan that can be sized alone: traffic of their own (no compression)."""
    out = []
    for k, p in enumerate(plan.fleet.pools):
        if getattr(p, "phase", "both") != "both":    # a P/D pair is not sized alone (module docstring, "P/D pairs")
            continue
        c = _candidate(plan, k)
        if c.gamma_in == 1.0 and c.gamma_out == 1.0 and p.arrival_rate > 0:
            out.append((k, p))
    return out


def _pair_miss_line(round_: int, plan: Plan, k: int) -> str:
    """The line a failing row of a P/D pair adds (module docstring, "P/D pairs"): which phase missed, and that the
    pair keeps its analytic counts."""
    rows = plan.fleet.pools
    pre, dec = (rows[k], rows[k + 1]) if rows[k].phase == "prefill" else (rows[k - 1], rows[k])
    what = "P99 TTFT (prefill + KV transfer)" if rows[k].phase == "prefill" else "P99 TPOT (decode)"
    return (f"round {round_}: the P/D pair {pre.min_tokens:,}-{pre.max_tokens:,} (prefill {pre.gpu} x{pre.replicas}, "
            f"decode {dec.gpu} x{dec.replicas}) misses its {what} in simulation; pairs are not sized alone: it keeps "
            "its analytic counts, so no plan holding it passes")


def _semantic_miss_line(round_: int, vp: VerifiedPlan, k: int) -> str:
    """The line a failing pool of a semantic plan adds (module docstring, "Semantic plans"): its class, its count
    and simulated P99, and that it keeps its analytic count."""
    pool = vp.plan.fleet.pools[k]
    role = vp.plan.semantic.roles[k] if vp.plan.semantic is not None else "?"
    sim = vp.sim.pools[k]
    lo, hi = sim.ttft_p99_ci_ms
    return (f"round {round_}: plan {vp.plan.rank}'s {role}-model pool {pool.min_tokens:,}-{pool.max_tokens:,} on "
            f"{pool.gpu} x{pool.replicas} misses in simulation (P99 TTFT {sim.ttft_p99_ms_sim:,.1f} ms "
            f"[{lo:,.1f}, {hi:,.1f}]); semantic pools are not sized alone: it keeps its analytic count, so no plan "
            "holding it passes")


def _size_cut(round_: int, sizer: PoolSizer, cand: PoolCandidate, pool, minima: dict, sizings: dict,
              min_replicas: dict, user_min: dict, forbidden: set, forbidden_why: dict, plan_miss: bool = False
              ) -> str | None:
    """Size a failing candidate alone and turn the result into its cut (module docstring, "Per-pool cuts");
    None when an earlier sizing of the solve already cuts this count (the same candidate in two plans of a round)
    and no whole-plan miss at or above its least count asks for a new one."""
    prev = sizings.get(cand)
    if prev is not None and (not prev.feasible or (pool.replicas < prev.least_replicas and not plan_miss)):
        return None
    n_star = minima.get(cand.key)
    sizing = sizer.size(cand, pool.replicas, n_star, sizer.guess(cand, n_star))
    sizings[cand] = sizing
    key = cand.window
    if not sizing.feasible:
        forbidden.add(key)
        forbidden_why[key] = sizing.reason
        return f"round {round_}: {cand.label()} is forbidden: {sizing.reason}"
    assert sizing.least_replicas is not None   # feasible
    least = max([s.least_replicas for c, s in sizings.items() if c.window == key and s.feasible])
    min_replicas[key] = max(least, user_min.get(key, 0))
    trials = {v.replicas: v for v in sizing.trials}
    below = trials.get(least - 1)
    at = trials[sizing.least_replicas]
    miss = "" if below is None else (f"; misses with {least - 1}, P99 {below.ttft_p99_ms_sim:,.1f} ms"
                                     + (f" [{below.ttft_p99_ci_ms[0]:,.1f}, {below.ttft_p99_ci_ms[1]:,.1f}] on "
                                        f"{below.requests:,} requests" if below.source == "alone" else " in the plan"))
    verb = "passes" if at.outcome == "pass" else "undecided, point within the SLO,"
    return (f"round {round_}: {cand.label()} needs at least {least} replicas (simulated alone: {verb} with "
            f"{sizing.least_replicas}, P99 {at.ttft_p99_ms_sim:,.1f} ms [{at.ttft_p99_ci_ms[0]:,.1f}, "
            f"{at.ttft_p99_ci_ms[1]:,.1f}] on {at.requests:,} requests{miss})")


def _plan_key(plan: Plan) -> tuple:
    """What makes two plans the same plan to simulate: every pool's window, GPU, count, batch cap and compression,
    and a split plan's routing."""
    pools = tuple((p.min_tokens, p.max_tokens, p.gpu, int(p.replicas), int(p.max_num_seqs), float(p.compress_gamma),
                   getattr(p, "phase", "both")) for p in plan.fleet.pools)
    r = plan.routing
    routing = None if r is None else (tuple(r.boundaries_tokens), tuple(tuple(row) for row in r.rate_req_per_s))
    sem = getattr(plan, "semantic", None)
    if sem is not None:     # a semantic plan: the rule decides each pool's traffic
        return pools, routing, sem.share, tuple(sem.roles)
    return pools, routing


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


def _candidate(plan: Plan, k: int) -> PoolCandidate:
    """The candidate behind pool ``k`` of a plan (its ``key`` is the :func:`analytic_minima` key)."""
    pools = plan.fleet.pools
    p = pools[k]
    gamma_in = pools[k - 1].compress_gamma if plan.routing is None and k > 0 else 1.0
    return PoolCandidate(p.min_tokens, p.max_tokens, p.gpu, int(p.max_num_seqs), float(gamma_in),
                         float(p.compress_gamma))
