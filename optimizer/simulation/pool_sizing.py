r"""Per-pool simulated sizing: the least replica count at which one candidate pool meets the SLO in simulation.

Under length routing a pool's requests are exactly those of total length in its window
:math:`(lo, hi]`, and replicas of other pools never touch them, so a pool's simulated latencies depend only
on its own traffic and its own engine (GPU, batch cap, replica count). :func:`pool_instance` therefore
builds, for a window, an instance whose workload is the original one *conditioned* on the window (a CDF
restricted to :math:`(lo, hi]` and renormalised, or a trace's rows in it) at the rate
:math:`\lambda\, P(lo < L \le hi)`, with one pool ``0-hi``: that pool receives the window's requests at
their own rate, its slots are those of an :math:`hi`-token window, and no other pool is simulated (the
construction of :mod:`fleetopt.optimizer.simulation.agreement`). The simulation is the one users call
(:func:`fleetopt.optimizer.simulation.simulate.simulate_plan`), with the verification's settings.

Request volume
--------------
A pool alone is simulated with the requests it would get in a simulation of a whole plan with the
verification's settings, :math:`\lceil n\, P(lo < L \le hi) \rceil` of the plan's :math:`n` (at least
:data:`~fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS` measured; the request count doubles, up to
:data:`MAX_DOUBLINGS` times, until it holds that many). Its verdict is then a draw of the same precision as
the pool's verdict inside a plan, so the verdict rule (``ci-upper`` in particular, whose interval widens as
requests fall) means the same in both.

The search
----------
:class:`PoolSizer` keeps every verdict of the solve, keyed (candidate, count), where a candidate
(:class:`PoolCandidate`) is ``(lo, hi, gpu, batch cap, gamma in, gamma out)`` as in
:func:`fleetopt.optimizer.simulation.verify.analytic_minima`. :meth:`PoolSizer.size` finds the least passing
count above the largest count known to fail (a plan's simulation that missed in this pool counts as such
evidence, :meth:`PoolSizer.record_miss`): it gallops up by 1, 2, 4, ... replicas until a count passes, then
bisects between the last failing and the first passing count. Every count of a candidate is simulated
with the same seed and the same requests (common random numbers), so the comparisons between counts do
not flip on sampling noise; it assumes that more replicas never hurt, which holds in expectation.

A candidate that still misses at :math:`N_{cap} = \max(n_f + 1, \min(8 \max(N^*, n_f), 256))` replicas
(:data:`CAP_FACTOR`, :data:`CAP_REPLICAS`; :math:`N^*` the analytic minimum, :math:`n_f` the count that
failed) is infeasible alone: with that many replicas JSQ gives nearly every request an idle replica, so
what remains is its prefill under continuous batching, which no count shortens. The sizing says so with
the pool's P99 wait and TTFT at :math:`N_{cap}` as the reason.

Undecided verdicts
------------------
Under the ``ci-upper`` rule one run has three outcomes (:func:`pool_outcome`): *pass* (the P99 TTFT interval
is within the SLO), *fail* (its lower end is above the SLO: a miss the interval supports) and *undecided* (it
straddles the SLO). The search brackets the least count not shown failing with short runs (an undecided short
run passes unsettled, :meth:`PoolSizer.short`); only that count, where the outcome decides the cut, is run again
with :data:`ESCALATION_STEP` times the requests, up to the pool's share of :func:`escalation_cap`
(:data:`ESCALATION_FACTOR` times the verification's requests, at most :data:`ESCALATION_MAX_REQUESTS`), until it
is decided (a fail moves the search up). One sizing, or one screened pool, spends at most :data:`SIZING_BUDGET`
pool caps of requests on escalation; once that is spent, the longest run's point estimate settles the count. A count
still undecided at
the cap is *settled* by its point estimate (:func:`settled_outcome`): within the SLO it is accepted (outcome
``"undecided"``, ``passed``), above it the longest run's point misses and the count fails. So the search's
answer is the least count that passes or is undecided at the cap with its point within the SLO: the least
count not shown failing. Only a failing count moves the search up; the cut never rests on a short run whose
interval merely reaches above the SLO (on ``ref_puzzle1_lmsys_a100`` split at 2,048 tokens, runs of about 4,000 requests
of the long window cut it to 34 units on point estimates near 340 ms whose intervals reached above 500 ms, while
8 units measure 424 ms [420, 430] over 2 million requests). Each escalation is another look at that count, so
several looks raise the chance that noise passes it (sequential testing): by default the cap allows three
(x1, x4, x16).

Assumptions and limits: requests are independent of the other pools (length routing, a pool-scope SLO; not
compress-and-route, whose pools exchange a band of requests, nor split routing, whose shares are free) and
the verdict is monotone in the count.

Precision ladder
----------------
With a ``precision`` target, :func:`fleetopt.optimizer.simulation.simulate.simulate_plan` simulates rounds of
:math:`n_0, 2 n_0, 4 n_0, \dots` requests (:math:`n_0` = ``requests`` rounded up to whole replications; each
round a fresh run of the same seed) until the P99 intervals that decide the verdict meet the target or the next
rung would exceed ``max_requests``. Every rung before the last is thrown away, so a plan that needs the top
rung of ``20,000 -> 320,000`` pays for :math:`620{,}000` simulated requests to report :math:`320{,}000`.

:func:`ladder_run` walks the same ladder but, after a rung that misses the target, estimates the requests the
target needs (:func:`needed_requests`) and goes straight to the largest rung of the ladder at or below that
estimate (at least the next one; at most the top rung under ``max_requests``). Each rung is one run of
:func:`simulate_plan` with ``requests = max_requests =`` the rung, which is exactly the round the doubling loop
runs at that rung (same requests per replication, same seed), so:

* the figures are those of the doubling loop whenever the rungs skipped would have missed the target. Rounding the
  estimate down keeps that the usual case: a rung is skipped only when the estimate says the next one up is still
  short. (Rounding up skipped a rung that met the target on ``quickstart``: the estimate from 20,000 requests asked
  for 123,000, and 80,000 already met 5 %.) When a skipped rung would have met the target, the run ends on a
  longer rung that meets it too (the target still holds; the figures are that rung's);
* for a given seed the run and its figures are reproducible: each rung's choice depends only on the previous
  rung's report, which depends only on the seed and the rung (and not on the number of processes the
  replications or the plans run on);
* one difference remains when the last rung still has a thin pool (it stopped at ``max_requests``): its
  dedicated run (:mod:`fleetopt.optimizer.simulation.simulate`, "Thin pools") is sized from that rung's requests,
  where the doubling loop sizes it from the first rung's.

The verification's whole-plan runs (:func:`fleetopt.optimizer.simulation.verify.simulate_plan_checked`), the
pools simulated alone (:class:`PoolSizer`) and the trim's trials (:func:`fleetopt.optimizer.simulation.trim.trim_plan`)
take this ladder; ``fleetopt simulate --precision`` keeps the doubling loop.

The sample-size estimate (:func:`needed_requests`) is the usual :math:`1/\sqrt n` law of an interval's
half-width: a pool whose P99 interval has relative half-width :math:`h` over :math:`m` measured requests needs
:math:`m (h / \text{precision})^2` measured requests, and at least
:data:`~fleetopt.optimizer.simulation.records.MIN_POOL_REQUESTS`; its share of the run's requests turns that into
requests of the whole run. A row whose interval came from a dedicated run (a thin pool, ``p99_source``) counts
that run's measured requests (``p99_requests``) for :math:`m`.

Measured (``verify(..., SimOptions(requests=20_000, precision=0.05, max_requests=400_000), top=3)``, the bench's
verification row, before and after in turn in one process on the shared 2-core machine): on Puzzle 2 all three
plans need the top rung (320,000 requests; each long-context pool stays above 5 % there); the first rung's
intervals send two of them straight to it and one through 80,000 and 160,000: 1.26 million simulated requests
instead of 1.86 million, the same reports, 10.5 s of CPU instead of 14.9 s. On ``quickstart`` (rungs 20k -> 320k,
20k -> 80k, 20k -> 160k -> 320k): 0.94 million requests instead of 1.38 million, the same reports, 7.0 s of CPU
instead of 9.9 s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.fleet import PoolPlan
from fleetopt.models.units import P99
from fleetopt.models.workload import LengthDistribution, RequestTrace

from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.simulation.options import MIN_REQUESTS_PER_REPLICATION, SimOptions
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS, SimPoolReport, SimReport, interval_outcome

__all__ = ["CAP_FACTOR", "CAP_REPLICAS", "MAX_DOUBLINGS", "ESCALATION_STEP", "ESCALATION_FACTOR",
           "ESCALATION_MAX_REQUESTS", "SIZING_BUDGET", "PoolCandidate", "PoolVerdict", "PoolSizing", "PoolSizer",
           "pool_instance", "window_lengths", "pool_misses", "pool_outcome", "settled_outcome", "escalation_cap",
           "least_passing", "needed_requests", "ladder_run"]

CAP_FACTOR = 8
"""A candidate missing at this many times its analytic minimum (or its failing count) is infeasible alone."""
CAP_REPLICAS = 256
"""... unless that is above this count, which is then the cap (but always above the failing count)."""
MAX_DOUBLINGS = 4
"""Times a pool's request count doubles until it holds :data:`MIN_POOL_REQUESTS` measured requests."""
ESCALATION_STEP = 4
"""An undecided verdict (rule ``ci-upper``) is run again with this many times the requests (module docstring,
"Undecided verdicts")."""
ESCALATION_FACTOR = 16
"""... up to this many times the verification's requests (:func:`escalation_cap`) ..."""
ESCALATION_MAX_REQUESTS = 2_000_000
"""... and no more than this many requests of a whole plan (unless the verification's own are more)."""
SIZING_BUDGET = 2
"""Requests one sizing (:meth:`PoolSizer.size`) may spend on escalation, in units of the pool's share of
:func:`escalation_cap` (one count run to the cap spends 1.25: x4 then x16)."""


@dataclass(frozen=True)
class PoolCandidate:
    """A candidate pool: window ``(lo_tokens, hi_tokens]`` on GPU option ``gpu`` with batch cap ``max_num_seqs``
    and the compression factors of the pool below (``gamma_in``) and of itself (``gamma_out``)."""

    lo_tokens: int
    hi_tokens: int
    gpu: str
    max_num_seqs: int
    gamma_in: float = 1.0
    gamma_out: float = 1.0

    @property
    def key(self) -> tuple:
        """The :func:`fleetopt.optimizer.simulation.verify.analytic_minima` key."""
        return (self.lo_tokens, self.hi_tokens, self.gpu, self.max_num_seqs, self.gamma_in, self.gamma_out)

    @property
    def window(self) -> tuple[int, int, str]:
        """``(lo, hi, gpu)``: the key of ``SolveOptions.min_replicas`` and ``forbidden``."""
        return (self.lo_tokens, self.hi_tokens, self.gpu)

    def label(self) -> str:
        return f"{self.lo_tokens:,}-{self.hi_tokens:,} on {self.gpu}"


@dataclass(frozen=True)
class PoolVerdict:
    """One simulated verdict of a candidate at ``replicas``: ``source`` ``"alone"`` (:class:`PoolSizer`'s run) or
    ``"plan"`` (a plan's simulation missed in this pool).

    ``outcome`` is what the last run said (:data:`~fleetopt.optimizer.simulation.records.OUTCOMES`, after any
    escalation: ``"undecided"`` only when the interval still straddles the SLO at the cap, or the pool measured
    too few requests); ``passed`` is whether the search accepts the count: ``"pass"``, or ``"undecided"`` at the
    cap with the point estimate within the SLO (:func:`settled_outcome`), and enough measured requests."""

    replicas: int
    passed: bool
    ttft_p99_ms_sim: float
    ttft_p99_ci_ms: tuple[float, float]
    wait_p99_ms_sim: float
    requests: int
    """Measured requests of the pool."""
    source: str = "alone"
    outcome: str = ""
    """``"pass"``, ``"fail"`` or ``"undecided"``; empty: read from ``passed`` (``"pass"`` or ``"fail"``)."""
    requests_simulated: int = 0
    """Requests of the last run (the pool's stream alone; 0 for a plan's miss)."""
    settled: bool = True
    """The outcome is final: decided, or undecided after running to the cap (then settled by the point
    estimate). False: an undecided run not (yet) escalated, accepted by the search as not shown failing (module
    docstring, "Undecided verdicts")."""

    def __post_init__(self) -> None:
        if not self.outcome:
            object.__setattr__(self, "outcome", "pass" if self.passed else "fail")


@dataclass(frozen=True)
class PoolSizing:
    """What :meth:`PoolSizer.size` found: the least passing count, or None with the reason when none up to
    ``cap_replicas`` passes; ``trials`` the verdicts it used, in count order."""

    candidate: PoolCandidate
    least_replicas: int | None
    cap_replicas: int
    trials: tuple[PoolVerdict, ...]
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.least_replicas is not None


def least_passing(passes_at, hi: int, floor: int) -> int:
    """The least count in ``[floor, hi]`` that passes, ``hi`` passing and ``passes_at`` monotone: steps down 1, 2,
    4, ... from ``hi`` until a count fails or the floor is reached, then bisects between the last count that failed
    and the least that passed. Stepping down first keeps the trials near ``hi`` (a count far below the answer
    overloads the pool, and such runs are the slow ones)."""
    failed, step = floor - 1, 1
    while hi > floor:
        n = max(hi - step, floor)
        if not passes_at(n):
            failed = n
            break
        hi, step = n, 2 * step
    while hi - failed > 1:
        mid = (failed + hi) // 2
        if passes_at(mid):
            hi = mid
        else:
            failed = mid
    return hi


def pool_outcome(pool: SimPoolReport, rule: str, slo_ms: float, tpot_ms: float | None = None) -> str:
    """What one run says of a simulated pool (:class:`~fleetopt.optimizer.simulation.records.SimPoolReport`)
    under ``rule``: ``"pass"``, ``"fail"`` or ``"undecided"``.

    ``ci-upper``: its P99 TTFT interval against ``slo_ms``
    (:func:`~fleetopt.optimizer.simulation.records.interval_outcome`: pass when the upper end is within it, fail
    when the lower end exceeds it, else undecided; judged pass or fail by the point estimate when too few requests
    leave the upper end infinite); ``point``: the P99 point estimate; ``attainment``: at least 99 % of its requests
    meet the SLO. Only ``ci-upper`` can leave a run undecided. With ``tpot_ms`` a P99 TPOT point estimate above it
    fails. A pool without a measured request cannot miss.

    A P/D pair's rows (``analytic.phase``) are judged each on its own figure by the same rule: the prefill row on
    its P99 TTFT (wait + prefill + KV transfer) alone, the decode row on its P99 TPOT against ``tpot_ms``
    (interval, point or the share within it; no TPOT SLO: it cannot miss).
    """
    phase = getattr(getattr(pool, "analytic", None), "phase", "both")
    if phase == "decode":
        return _tpot_outcome(pool, rule, tpot_ms)
    if phase == "prefill":
        tpot_ms = None
    if rule == "ci-upper" and math.isfinite(pool.ttft_p99_ci_ms[1]):
        out = interval_outcome(*pool.ttft_p99_ci_ms, slo_ms)
    elif rule in ("ci-upper", "point"):
        out = "fail" if pool.ttft_p99_ms_sim > slo_ms else "pass"  # pass for NaN (no measured request)
    else:
        out = "fail" if pool.slo_attainment < P99 else "pass"
    return "fail" if tpot_ms is not None and pool.tpot_p99_ms_sim > tpot_ms else out


def _tpot_outcome(pool: SimPoolReport, rule: str, tpot_ms: float | None) -> str:
    """A P/D pair's decode row under ``rule`` (:func:`pool_outcome`): its P99 TPOT interval (``ci-upper``), point
    (``point``, and ``ci-upper`` with an unbounded interval) or, for ``attainment``, the P99 point as well (the row
    keeps no per-request share within a TPOT limit)."""
    if tpot_ms is None or math.isnan(pool.tpot_p99_ms_sim):
        return "pass"
    if rule == "ci-upper" and math.isfinite(pool.tpot_p99_ci_ms[1]):
        return interval_outcome(*pool.tpot_p99_ci_ms, tpot_ms)
    return "fail" if pool.tpot_p99_ms_sim > tpot_ms else "pass"


def judged_point_ms(pool, slo_ms: float, tpot_ms: float | None) -> tuple[float, float]:
    """``(P99 point, its limit)`` in ms a row is judged on: TTFT against ``slo_ms``, or for a P/D pair's decode row
    TPOT against ``tpot_ms`` (:func:`settled_outcome` reads them)."""
    if getattr(getattr(pool, "analytic", None), "phase", "both") == "decode":
        return pool.tpot_p99_ms_sim, math.inf if tpot_ms is None else tpot_ms
    return pool.ttft_p99_ms_sim, slo_ms


def settled_outcome(outcome: str, point_ms: float, slo_ms: float) -> str:
    """The outcome of the last run an undecided verdict gets (module docstring, "Undecided verdicts"): still
    ``"undecided"`` when the P99 point estimate ``point_ms`` is within ``slo_ms`` (accepted, reported as
    undecided, never cut), ``"fail"`` when it is not (the point of the longest run misses: cut); a decided
    ``outcome`` stays."""
    return "fail" if outcome == "undecided" and point_ms > slo_ms else outcome


def pool_misses(pool, rule: str, slo_ms: float, tpot_ms: float | None = None) -> bool:
    """A simulated pool does not pass under ``rule`` in this run (:func:`pool_outcome` is ``"fail"`` or
    ``"undecided"``): for ``ci-upper``, the upper end of its P99 TTFT interval exceeds ``slo_ms``."""
    return pool_outcome(pool, rule, slo_ms, tpot_ms) != "pass"


def escalation_cap(requests: int) -> int:
    """Most requests of a whole plan an undecided verdict is run with: :data:`ESCALATION_FACTOR` times the
    verification's ``requests``, at most :data:`ESCALATION_MAX_REQUESTS` (never fewer than ``requests``).

    >>> escalation_cap(100_000), escalation_cap(20_000), escalation_cap(4_000_000)
    (1600000, 320000, 4000000)
    """
    return max(int(requests), min(ESCALATION_FACTOR * int(requests), ESCALATION_MAX_REQUESTS))


def window_lengths(lengths: LengthDistribution | RequestTrace, lo: float, hi: float
                   ) -> tuple[LengthDistribution | RequestTrace | None, float]:
    """The lengths conditioned on :math:`lo < L \\le hi` and the window's share :math:`P(lo < L \\le hi)`.

    A CDF keeps its pieces clipped to the window (a uniform piece keeps the mass of its overlap, an atom
    its mass when it lies in the window), renormalised; a trace keeps its rows in the window. None when
    the window holds nothing.

    Examples
    --------
    >>> d = LengthDistribution.from_cdf([(100, 0.5), (300, 1.0)])
    >>> w, share = window_lengths(d, 100, 200)
    >>> share, float(w.cdf(150))
    (0.25, 0.5)
    """
    if isinstance(lengths, RequestTrace):
        total = lengths.total_tokens
        keep = (total > lo) & (total <= hi)
        if not keep.any():
            return None, 0.0
        return (RequestTrace(lengths.arrived_at_s[keep], lengths.prompt_tokens[keep], lengths.output_tokens[keep]),
                float(np.mean(keep)))
    a, b, p = lengths.lo_tokens, lengths.hi_tokens, lengths.prob
    atom = b <= a
    lo_c, hi_c = np.maximum(a, lo), np.minimum(b, hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        mass = np.where(atom, p * ((b > lo) & (b <= hi)), p * np.clip((hi_c - lo_c) / np.where(atom, 1.0, b - a),
                                                                        0.0, 1.0))
    keep = mass > 0
    share = float(mass.sum())
    if share <= 0:
        return None, 0.0
    lo_c, hi_c = np.where(atom, b, lo_c), np.where(atom, b, hi_c)
    return LengthDistribution(lo_c[keep], hi_c[keep], mass[keep] / share), share


def pool_instance(instance: Instance, lo: int, hi: int) -> tuple[Instance, float]:
    """An instance for the window ``(lo, hi]`` alone (module docstring) and the window's share of the traffic.

    Its workload is the instance's conditioned on the window (:func:`window_lengths`) at rate
    :math:`\\lambda\\, P(lo < L \\le hi)`, its only pool boundary pair ``(0, hi)``; the SLO, GPU options and
    constraints are the instance's.

    Raises
    ------
    ValueError
        When the window holds none of the workload's requests.
    """
    w = instance.workload
    lengths, share = window_lengths(w.lengths, lo, hi)
    if lengths is None:
        raise ValueError(f"window ({lo}, {hi}] holds none of the workload's requests")
    workload = replace(w, lengths=lengths, truncated_share=0.0, arrival_rate_req_per_s=w.arrival_rate_req_per_s * share)
    pools = replace(instance.pools, max_pools=1, max_context_tokens=int(hi), boundaries=(0, int(hi)), routing="length",
                    compress_gammas=())
    return replace(instance, name=f"{instance.name} [{lo}-{hi}]", workload=workload, pools=pools), share


class PoolSizer:
    """Per-pool simulated verdicts of one solve, cached by (candidate, count), and the search over counts.

    Parameters
    ----------
    instance : Instance
        The instance being verified (length routing, pool-scope SLO).
    options : SimOptions
        The verification's settings; ``requests`` is the plan-level request count the pool's share of which
        each pool alone gets (module docstring, "Request volume").
    rule : str
        The verification rule (:func:`pool_misses`).
    progress : callable or None
        Passed to each simulation.
    on_step : callable or None
        ``on_step(message)`` before each simulation (one line: the candidate, its count and its requests).

    Attributes
    ----------
    verdicts : dict
        ``(PoolCandidate, replicas) -> PoolVerdict``, every verdict so far (alone or from a plan).
    simulations : int
        Verdicts simulated (each (candidate, count) at most once).
    runs : int
        Runs of the simulator behind them (a verdict's doublings and escalations each count).
    """

    def __init__(self, instance: Instance, options: SimOptions, rule: str, progress=None, *, on_step=None) -> None:
        self.instance = instance
        self.options = options
        self.rule = rule
        self.progress = progress
        self.on_step = on_step
        self.verdicts: dict[tuple[PoolCandidate, int], PoolVerdict] = {}
        self.simulations = 0
        self.runs = 0
        self.sized: dict[PoolCandidate, tuple[int | None, int | None]] = {}
        """``candidate -> (least count, analytic minimum)`` of every feasible sizing (for :meth:`guess`)."""
        self._windows: dict[tuple[int, int], tuple[Instance, float]] = {}
        self._asked: dict[tuple[PoolCandidate, int], tuple[int, bool]] = {}
        """``(candidate, count) -> (requests asked of its last run, a trace ran out)``: where escalation resumes."""

    def verdict(self, candidate: PoolCandidate, replicas: int, budget: list | None = None) -> PoolVerdict:
        """The settled verdict of ``candidate`` at ``replicas``: :meth:`short`, escalated while undecided (module
        docstring, "Undecided verdicts"; ``budget``, a one-element list of requests left, bounds the escalation,
        which stops unsettled when it is spent). Cached; a recorded plan miss at that count wins."""
        key = (candidate, int(replicas))
        v = self.short(candidate, replicas)
        if not v.settled:
            v = self.verdicts[key] = self._escalate(candidate, v, budget)
        return v

    def short(self, candidate: PoolCandidate, replicas: int) -> PoolVerdict:
        """The verdict of ``candidate`` at ``replicas`` on the pool's share of the verification's requests
        (simulated alone once, then cached, escalated or not): ``passed`` unless it fails (or measures too few
        requests), so an undecided run passes unsettled. A recorded plan miss at that count wins."""
        key = (candidate, int(replicas))
        if key not in self.verdicts:
            self.verdicts[key] = self._simulate(candidate, int(replicas))
        return self.verdicts[key]

    def record_miss(self, candidate: PoolCandidate, replicas: int, pool) -> None:
        """Evidence from a plan's simulation: ``candidate`` missed with ``replicas`` (``pool``, its
        :class:`~fleetopt.optimizer.simulation.records.SimPoolReport`)."""
        self.verdicts[(candidate, int(replicas))] = PoolVerdict(
            int(replicas), False, float(pool.ttft_p99_ms_sim), tuple(pool.ttft_p99_ci_ms),
            float(pool.wait.p99_ms), int(pool.requests), "plan", "fail")

    def size(self, candidate: PoolCandidate, failing_replicas: int, analytic_replicas: int | None = None,
             guess: int | None = None) -> PoolSizing:
        """The least count of ``candidate`` that passes alone, above every count known to fail (module docstring,
        "The search"); ``failing_replicas`` is a count known to fail (a plan's), ``analytic_replicas`` the
        analytic minimum :math:`N^*` (for the cap; None: the failing count) and ``guess`` a count to try first
        (:meth:`guess`; None: gallop from the failing count)."""
        failing = int(failing_replicas)
        n_star = int(analytic_replicas) if analytic_replicas else failing
        cap = max(failing + 1, min(CAP_FACTOR * max(n_star, failing), CAP_REPLICAS))
        budget = [self.budget(candidate)]
        while True:
            known = [n for (c, n), v in self.verdicts.items() if c == candidate and not v.passed]
            failed = max(known + [failing])
            if failed >= cap and (candidate, failed) in self.verdicts:
                return PoolSizing(candidate, None, failed, self._trials(candidate), self._reason(candidate, failed))
            passes = [n for (c, n), v in self.verdicts.items() if c == candidate and v.passed and n > failed]
            hi = min(passes) if passes else None
            if hi is None and guess is not None and failed < guess < cap:
                if self.short(candidate, guess).passed:
                    hi = guess
                else:
                    failed = guess
            step = max(1, failed // 4)
            while hi is None:
                n = min(failed + step, cap)
                if self.short(candidate, n).passed:
                    hi = n
                elif n >= cap:
                    return PoolSizing(candidate, None, cap, self._trials(candidate), self._reason(candidate, cap))
                else:
                    failed, step = n, 2 * step
            least = least_passing(lambda n: self.short(candidate, n).passed, hi, failed + 1)
            # only the count the cut rests on is run longer: undecided there, it decides the cut
            if self.verdict(candidate, least, budget).passed:
                break
        self.sized[candidate] = (least, int(analytic_replicas) if analytic_replicas else None)
        return PoolSizing(candidate, least, cap, self._trials(candidate))

    def budget(self, candidate: PoolCandidate) -> int:
        """Requests one sizing or screen of ``candidate`` may spend on escalation (:data:`SIZING_BUDGET`)."""
        _, share = self._window(candidate)
        return SIZING_BUDGET * math.ceil(escalation_cap(self.options.requests) * share)

    def guess(self, candidate: PoolCandidate, analytic_replicas: int | None) -> int | None:
        """A first count to try for ``candidate``: its analytic minimum times the ratio least / analytic of the
        sized candidate on the same GPU with the nearest window (same upper end first); None without one."""
        if not analytic_replicas:
            return None
        sized = [(c, s) for c, s in self.sized.items() if c.gpu == candidate.gpu and s[0] and s[1]]
        if not sized:
            return None
        c, (least, n_star) = min(sized, key=lambda cs: (cs[0].hi_tokens != candidate.hi_tokens,
                                                        abs(cs[0].hi_tokens - candidate.hi_tokens),
                                                        abs(cs[0].lo_tokens - candidate.lo_tokens)))
        assert least is not None and n_star is not None   # the filter above kept only sized pairs
        return max(1, math.ceil(analytic_replicas * least / n_star))

    def _trials(self, candidate: PoolCandidate) -> tuple[PoolVerdict, ...]:
        return tuple(v for (c, n), v in sorted(self.verdicts.items(), key=lambda kv: kv[0][1]) if c == candidate)

    def _reason(self, candidate: PoolCandidate, cap: int) -> str:
        v = self.verdicts[(candidate, cap)]
        slo_ms = self.instance.slo.ttft_p99_s * 1000.0
        return (f"requests of {candidate.lo_tokens:,}-{candidate.hi_tokens:,} tokens on {candidate.gpu}: simulated "
                f"P99 TTFT {v.ttft_p99_ms_sim:,.0f} ms (interval up to {v.ttft_p99_ci_ms[1]:,.0f} ms) with {cap} "
                f"replicas still misses the {slo_ms:,.0f} ms SLO while their P99 wait is {v.wait_p99_ms_sim:,.0f} ms: "
                "their prefill alone, under continuous batching, is too long at any replica count")

    def _window(self, candidate: PoolCandidate) -> tuple[Instance, float]:
        key = (candidate.lo_tokens, candidate.hi_tokens)
        if key not in self._windows:
            self._windows[key] = pool_instance(self.instance, *key)
        return self._windows[key]

    def _simulate(self, candidate: PoolCandidate, replicas: int) -> PoolVerdict:
        """The short verdict of ``candidate`` at ``replicas``: one run of the pool's share of the verification's
        requests (doubled while it measures too few), not escalated (``settled`` False when it is undecided)."""
        if candidate.gamma_in != 1.0 or candidate.gamma_out != 1.0:
            raise ValueError(f"candidate {candidate.label()}: compress-and-route pools cannot be sized alone")
        inst, share = self._window(candidate)
        o = self.options
        least = MIN_REQUESTS_PER_REPLICATION * (1 if o.arrivals == "trace" else o.replications)
        requests = max(math.ceil(o.requests * share), least)
        trace = inst.workload.lengths if o.arrivals == "trace" else None
        self.simulations += 1
        for k in range(MAX_DOUBLINGS + 1):
            pool, done = self._run(candidate, replicas, requests, "too few measured requests" if k else "")
            ran_out = isinstance(trace, RequestTrace) and requests >= len(trace.arrived_at_s)   # a trace ran out
            out = done < requests or ran_out
            if pool.requests >= MIN_POOL_REQUESTS or out:
                break
            requests *= 2
        return self._judge(candidate, replicas, pool, done, requests, out)

    def _escalate(self, candidate: PoolCandidate, v: PoolVerdict, budget: list | None = None) -> PoolVerdict:
        """``v`` run again with :data:`ESCALATION_STEP` times the requests while it is undecided, up to the pool's
        share of :func:`escalation_cap` (then settled by its point estimate, :func:`settled_outcome`) or until
        ``budget[0]`` (requests left to the sizing; None: no limit) cannot pay for the next run (module docstring,
        "Undecided verdicts")."""
        o = self.options
        if v.settled or o.precision is not None:
            return v
        inst, share = self._window(candidate)
        requests, out = self._asked[(candidate, v.replicas)]
        cap = max(requests, math.ceil(escalation_cap(o.requests) * share))
        slo_ms = self.instance.slo.ttft_p99_s * 1000.0
        while v.outcome == "undecided" and requests < cap and not out:
            more = min(requests * ESCALATION_STEP, cap)
            if budget is not None and more > budget[0]:
                break                                     # the sizing's budget is spent: the point settles it
            if budget is not None:
                budget[0] -= more
            lo, hi = v.ttft_p99_ci_ms
            pool, done = self._run(candidate, v.replicas, more,
                                   f"undecided: P99 interval [{lo:,.1f}, {hi:,.1f}] ms straddles the SLO")
            requests, out = more, done < more
            v = self._judge(candidate, v.replicas, pool, done, requests, out)
            if v.settled:
                return v
        outcome = v.outcome if v.outcome != "undecided" else settled_outcome(v.outcome, v.ttft_p99_ms_sim, slo_ms)
        return replace(v, outcome=outcome, passed=v.passed and outcome != "fail", settled=True)

    def _run(self, candidate: PoolCandidate, replicas: int, requests: int, why: str = ""):
        from fleetopt.optimizer.simulation.simulate import simulate_plan

        inst, _ = self._window(candidate)
        g = inst.gpu(candidate.gpu)
        plan = [PoolPlan(0, candidate.hi_tokens, g.name, g.profile, int(replicas), g.availability, 1.0,
                         int(candidate.max_num_seqs))]
        if self.on_step is not None:   # one "sizing" line per verdict, one "again" line per longer run of it
            self.on_step(f"again {candidate.label()} alone at x{replicas}, {requests:,} requests ({why})" if why
                         else f"sizing {candidate.label()} alone at x{replicas}, {requests:,} requests")
        o = replace(self.options, requests=requests, max_requests=max(self.options.max_requests, requests))
        sim = ladder_run(lambda opts, shown: simulate_plan(inst, plan, opts, progress=shown), o, inst.slo.scope,
                         self.progress)    # with a precision target: its ladder, skipping rungs too short for it
        self.runs += 1
        return sim.pools[0], sim.requests_simulated

    def _judge(self, candidate: PoolCandidate, replicas: int, pool, done: int, requests: int, out: bool
               ) -> PoolVerdict:
        """The verdict of one run of ``candidate`` (``requests`` asked, ``done`` simulated; ``out``: a trace ran
        out, so no longer run is possible), settled unless it is undecided and a longer run is possible."""
        slo = self.instance.slo
        slo_ms = slo.ttft_p99_s * 1000.0
        tpot_ms = None if slo.tpot_p99_s is None else slo.tpot_p99_s * 1000.0
        outcome = pool_outcome(pool, self.rule, slo_ms, tpot_ms)
        thin = bool(pool.too_few_requests)
        if thin and outcome != "fail":
            outcome = "undecided"
        settled = outcome != "undecided" or out or self.options.precision is not None
        if settled and not thin:
            outcome = settled_outcome(outcome, float(pool.ttft_p99_ms_sim), slo_ms)
        ok = outcome != "fail" and not thin
        self._asked[(candidate, int(replicas))] = (int(requests), bool(out))
        return PoolVerdict(int(replicas), ok, float(pool.ttft_p99_ms_sim), tuple(pool.ttft_p99_ci_ms),
                           float(pool.wait.p99_ms), int(pool.requests), "alone", outcome, int(done), settled)


def needed_requests(report, scope: str, precision: float) -> float:
    """Estimated requests of a run whose deciding P99 intervals meet ``precision`` (module docstring, "Precision
    ladder"), from ``report``, a run that missed it: under a fleet-scope SLO the fleet's interval; under a
    pool-scope SLO every pool with traffic (a P/D pair by its prefill row; an unbounded P99 is decided and asks
    for nothing). Each interval of relative half-width :math:`h = (x_{hi} - x_{lo}) / (2 \\hat x)` over :math:`m`
    measured requests needs :math:`M = \\max(m (h/p)^2, \\text{MIN\\_POOL\\_REQUESTS})` of them, i.e.
    :math:`n\\, M / m_{run}` requests of a run of :math:`n` that measured :math:`m_{run}` of them. inf when a
    pool with traffic measured none; 0 when nothing can be estimated (the caller then doubles).

    >>> from types import SimpleNamespace as S
    >>> pool = S(arrival_rate=1.0, phase="both", ttft_p99_ms_sim=100.0, ttft_p99_ci_ms=(90.0, 110.0),
    ...         requests=1_000, p99_requests=1_000)
    >>> needed_requests(S(pools=[pool], requests_simulated=10_000), "pool", 0.05)   # h = 10 %: 4 x the run
    40000.0
    """
    n = report.requests_simulated
    if scope == "fleet":
        return n * _factor(report.ttft_p99_ms, report.ttft_p99_ci_ms, precision, 0)
    need = 0.0
    for p in report.pools:
        if not p.arrival_rate > 0 or getattr(p, "phase", "both") == "decode":
            continue
        value = p.ttft_p99_ms_sim
        if value == math.inf:
            continue
        if p.requests <= 0:
            return math.inf
        measured = max(_factor(value, p.ttft_p99_ci_ms, precision, 0) * p.p99_requests, MIN_POOL_REQUESTS)
        need = max(need, n * measured / p.requests)
    return need


def _factor(value: float, ci, precision: float, default: float) -> float:
    """:math:`(h/p)^2` of an interval (``default`` when it has no finite relative half-width)."""
    low, high = ci
    if not (math.isfinite(value) and value > 0 and math.isfinite(low) and math.isfinite(high)):
        return default
    return ((high - low) / 2.0 / value / precision) ** 2


def ladder_run(run: Callable[[SimOptions, Callable | None], SimReport], options: SimOptions, scope: str,
               progress: Callable[[int, int], None] | None = None) -> SimReport:
    """The report of a ``precision`` run by the skipping ladder (module docstring, "Precision ladder"):
    ``run(rung_options, progress)`` simulates one round (``options`` with ``requests`` and ``max_requests`` set to
    the rung); the returned report carries ``options``' own ``requests`` and ``max_requests`` (what was asked),
    the rung it stopped on (``requests_simulated``, ``stopped_by`` as the doubling loop's) and the wall time of
    all rungs. ``scope`` is the SLO's (``"pool"`` or ``"fleet"``). Without a precision target: one ``run`` of
    ``options``. ``progress(done, planned)`` counts the requests of every rung run so far."""
    if options.precision is None:
        return run(options, progress)
    t0 = time.perf_counter()
    per = 1 if options.arrivals == "trace" else int(options.replications)
    rung = per * int(math.ceil(options.requests / per))
    done = [0]

    def counted(d: int, planned: int) -> None:
        assert progress is not None
        progress(done[0] + d, done[0] + planned)

    while True:
        report = run(replace(options, requests=rung, max_requests=rung), None if progress is None else counted)
        done[0] += report.requests_simulated
        if report.stopped_by != "max_requests" or 2 * rung > options.max_requests:
            break
        need = needed_requests(report, scope, options.precision)
        nxt = 2 * rung           # the largest rung at or below the estimate (at least the next, at most the top)
        while 2 * nxt <= need and 2 * nxt <= options.max_requests:
            nxt *= 2
        rung = nxt
    asked = replace(report.options, requests=options.requests, max_requests=options.max_requests)
    return replace(report, options=asked, wall_seconds=time.perf_counter() - t0)
