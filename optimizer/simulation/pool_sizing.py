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

Assumptions and limits: requests are independent of the other pools (length routing, a pool-scope SLO; not
compress-and-route, whose pools exchange a band of requests, nor split routing, whose shares are free) and
the verdict is monotone in the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.fleet import PoolPlan
from fleetopt.models.units import P99
from fleetopt.models.workload import LengthDistribution, RequestTrace

from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.simulation.options import MIN_REQUESTS_PER_REPLICATION, SimOptions
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS

__all__ = ["CAP_FACTOR", "CAP_REPLICAS", "MAX_DOUBLINGS", "PoolCandidate", "PoolVerdict", "PoolSizing",
           "PoolSizer", "pool_instance", "window_lengths", "pool_misses", "least_passing"]

CAP_FACTOR = 8
"""A candidate missing at this many times its analytic minimum (or its failing count) is infeasible alone."""
CAP_REPLICAS = 256
"""... unless that is above this count, which is then the cap (but always above the failing count)."""
MAX_DOUBLINGS = 4
"""Times a pool's request count doubles until it holds :data:`MIN_POOL_REQUESTS` measured requests."""


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
    ``"plan"`` (a plan's simulation missed in this pool)."""

    replicas: int
    passed: bool
    ttft_p99_ms_sim: float
    ttft_p99_ci_ms: tuple[float, float]
    wait_p99_ms_sim: float
    requests: int
    """Measured requests of the pool."""
    source: str = "alone"


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


def pool_misses(pool, rule: str, slo_ms: float, tpot_ms: float | None = None) -> bool:
    """A simulated pool (:class:`~fleetopt.optimizer.simulation.records.SimPoolReport`) misses under ``rule``.

    ``ci-upper``: the upper end of its P99 TTFT interval exceeds ``slo_ms`` (judged by the point estimate when
    too few requests leave the bound infinite); ``point``: the P99 point estimate does; ``attainment``: fewer
    than 99 % of its requests meet the SLO. With ``tpot_ms`` its P99 TPOT must also be within it. A pool without
    a measured request cannot miss.
    """
    if rule == "ci-upper" and math.isfinite(pool.ttft_p99_ci_ms[1]):
        miss = pool.ttft_p99_ci_ms[1] > slo_ms
    elif rule in ("ci-upper", "point"):
        miss = bool(pool.ttft_p99_ms_sim > slo_ms)  # False for NaN (no measured request)
    else:
        miss = bool(pool.slo_attainment < P99)
    return bool(miss or (tpot_ms is not None and pool.tpot_p99_ms_sim > tpot_ms))


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
        Simulations run (each (candidate, count) at most once).
    """

    def __init__(self, instance: Instance, options: SimOptions, rule: str, progress=None, *, on_step=None) -> None:
        self.instance = instance
        self.options = options
        self.rule = rule
        self.progress = progress
        self.on_step = on_step
        self.verdicts: dict[tuple[PoolCandidate, int], PoolVerdict] = {}
        self.simulations = 0
        self.sized: dict[PoolCandidate, tuple[int | None, int | None]] = {}
        """``candidate -> (least count, analytic minimum)`` of every feasible sizing (for :meth:`guess`)."""
        self._windows: dict[tuple[int, int], tuple[Instance, float]] = {}

    def verdict(self, candidate: PoolCandidate, replicas: int) -> PoolVerdict:
        """The verdict of ``candidate`` at ``replicas`` (simulated alone once, then cached; a recorded plan miss
        at that count wins: the count is known to fail)."""
        key = (candidate, int(replicas))
        if key not in self.verdicts:
            self.verdicts[key] = self._simulate(candidate, int(replicas))
        return self.verdicts[key]

    def record_miss(self, candidate: PoolCandidate, replicas: int, pool) -> None:
        """Evidence from a plan's simulation: ``candidate`` missed with ``replicas`` (``pool``, its
        :class:`~fleetopt.optimizer.simulation.records.SimPoolReport`)."""
        self.verdicts[(candidate, int(replicas))] = PoolVerdict(
            int(replicas), False, float(pool.ttft_p99_ms_sim), tuple(pool.ttft_p99_ci_ms),
            float(pool.wait.p99_ms), int(pool.requests), "plan")

    def size(self, candidate: PoolCandidate, failing_replicas: int, analytic_replicas: int | None = None,
             guess: int | None = None) -> PoolSizing:
        """The least count of ``candidate`` that passes alone, above every count known to fail (module docstring,
        "The search"); ``failing_replicas`` is a count known to fail (a plan's), ``analytic_replicas`` the
        analytic minimum :math:`N^*` (for the cap; None: the failing count) and ``guess`` a count to try first
        (:meth:`guess`; None: gallop from the failing count)."""
        known = [n for (c, n), v in self.verdicts.items() if c == candidate and not v.passed]
        failing = int(failing_replicas)
        failed = max(known + [failing])
        n_star = int(analytic_replicas) if analytic_replicas else failing
        cap = max(failing + 1, min(CAP_FACTOR * max(n_star, failing), CAP_REPLICAS))
        if failed >= cap and (candidate, failed) in self.verdicts:
            return PoolSizing(candidate, None, failed, self._trials(candidate), self._reason(candidate, failed))
        passes = [n for (c, n), v in self.verdicts.items() if c == candidate and v.passed and n > failed]
        hi = min(passes) if passes else None
        if hi is None and guess is not None and failed < guess < cap:
            if self.verdict(candidate, guess).passed:
                hi = guess
            else:
                failed = guess
        step = max(1, failed // 4)
        while hi is None:
            n = min(failed + step, cap)
            if self.verdict(candidate, n).passed:
                hi = n
            elif n >= cap:
                return PoolSizing(candidate, None, cap, self._trials(candidate), self._reason(candidate, cap))
            else:
                failed, step = n, 2 * step
        least = least_passing(lambda n: self.verdict(candidate, n).passed, hi, failed + 1)
        self.sized[candidate] = (least, int(analytic_replicas) if analytic_replicas else None)
        return PoolSizing(candidate, least, cap, self._trials(candidate))

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
        from fleetopt.optimizer.simulation.simulate import simulate_plan

        if candidate.gamma_in != 1.0 or candidate.gamma_out != 1.0:
            raise ValueError(f"candidate {candidate.label()}: compress-and-route pools cannot be sized alone")
        inst, share = self._window(candidate)
        g = inst.gpu(candidate.gpu)
        plan = [PoolPlan(0, candidate.hi_tokens, g.name, g.profile, int(replicas), g.availability, 1.0,
                         int(candidate.max_num_seqs))]
        o = self.options
        least = MIN_REQUESTS_PER_REPLICATION * (1 if o.arrivals == "trace" else o.replications)
        requests = max(math.ceil(o.requests * share), least)
        for _ in range(MAX_DOUBLINGS + 1):
            run = replace(o, requests=requests, max_requests=max(o.max_requests, requests))
            if self.on_step is not None:
                self.on_step(f"sizing {candidate.label()} alone at x{replicas}, {requests:,} requests")
            sim = simulate_plan(inst, plan, run, progress=self.progress)
            self.simulations += 1
            pool = sim.pools[0]
            trace = inst.workload.lengths if o.arrivals == "trace" else None
            if pool.requests >= MIN_POOL_REQUESTS or (trace is not None and requests >= len(trace.arrived_at_s)):
                break
            requests *= 2
        slo = self.instance.slo
        tpot_ms = None if slo.tpot_p99_s is None else slo.tpot_p99_s * 1000.0
        ok = not pool_misses(pool, self.rule, slo.ttft_p99_s * 1000.0, tpot_ms) and not pool.too_few_requests
        return PoolVerdict(int(replicas), ok, float(pool.ttft_p99_ms_sim), tuple(pool.ttft_p99_ci_ms),
                           float(pool.wait.p99_ms), int(pool.requests))
