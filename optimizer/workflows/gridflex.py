r"""Demand response (``fleetopt gridflex``): how deep a fixed fleet can curtail its power, sustained and per event.

A grid operator asks the site to shed a share :math:`d` of its power for an event (15-60 minutes). What the
operator measures is the site's draw, so by default (``convention="delivered"``) a depth is a *delivered*
reduction of the fleet's draw,

.. math:: \delta = 1 - P_{curtailed} / P_{uncurtailed} \quad (\text{site draw in kW}),

and the sweep searches two levers for the cheapest in-SLO way to deliver each requested depth (module section
"Delivered depths"). The reference scenarios (the capacity-planning seed's Puzzle 8, ``vllm-sr-sim grid-flex``)
read a depth instead as a *per-GPU peak-power cap*: every replica's batch cap is lowered until its draw with a
full batch is :math:`(1 - d)` of the uncapped one. That convention (``convention="seed"``, labelled
:data:`SEED_LABEL`) is kept to reproduce Puzzle 8's numbers; it bounds the peak a replica could draw, which a
lightly loaded fleet never reaches, so its delivered reduction can be far below :math:`d` (Puzzle 8: 0.3 % at
:math:`d` = 30 %, README "Puzzle 8"). Every row reports the delivered reduction under either convention.

Delivered depths (the default)
------------------------------
Levers, per pool :math:`p` of :math:`N_p` replicas with uncapped batch cap :math:`n_p^0`:

* *replicas out of service*: :math:`k_p \in \{0, \dots, N_p - 1\}` replicas are taken out of the pool and powered
  down (a replica out of service draws nothing; the pool's load moves to the :math:`N_p - k_p` left). At low
  utilisation this sheds most: an idle replica still draws :math:`P_p(0)`.
* *batch caps* (vLLM ``max_num_seqs``): :math:`n_p \in \{n_p^0, \lfloor n_p^0/2 \rfloor, \lfloor n_p^0/4 \rfloor,
  \dots, 1\}`: lower peak power, longer queues.

Each option :math:`(k_p, n_p)` is the analytic evaluation (:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`,
the instance's TTFT model and power model, :func:`fleetopt.models.service.decode_power_curve`) of the fleet with
pool :math:`p` at :math:`N_p - k_p` replicas and cap :math:`n_p`. For a depth :math:`d`, each pool's target is
:math:`(1 - d) P_p^{0}`, its share of the uncurtailed draw; for each cap the fewest replicas out that meet it
(:math:`k` by bisection: the pool's draw falls as replicas leave) gives one candidate, and the pool takes the
in-SLO candidate with the least P99 TTFT (ties: fewer replicas out, then the larger cap). A pool with no in-SLO
candidate takes its least-P99 candidate (the row breaches), one with no candidate at all its deepest option
(the row does not deliver :math:`d`). With several pools, when some pool cannot meet its share within the SLO,
every pool instead takes its deepest in-SLO option (for each cap, the most replicas out that keep the pool's
P99 within the SLO), used when that delivers :math:`d`. The chosen fleet is evaluated once more (the fleet-wide
P99 included): ``draw_kw`` is its analytic mean draw, ``delivered_reduction`` :math:`1 - ` ``draw_kw`` /
``uncurtailed_draw_kw``, ``verdict`` ``met`` when it delivers :math:`d` and meets the SLO, else ``breach``.
Depth 0 (no lever) is always in the sweep: it is the reference of both the analytic and the simulated draw.

Seed convention: batch cap of a depth (:func:`cap_under`)
--------------------------------------------------------
Pool :math:`p` runs with its uncapped batch cap :math:`n_p^0` (the cap its analytic evaluation uses: the slots of
its window, a ``#SEQS`` cap or a TPOT cap) and draws at most :math:`P_p(n_p^0)` per replica, with :math:`P_p` its
power as a function of the batch (:func:`fleetopt.models.service.decode_power_curve` at half the pool's window, as
every batch-only power reading in fleetopt). At depth :math:`d` its cap is

.. math:: n_p(d) = \max\{n \in \{0, \dots, n_p^0\} : P_p(n) \le (1 - d)\, P_p(n_p^0)\},

so :math:`n_p(0) = n_p^0`. For a logistic :class:`~fleetopt.models.power.PowerCurve` this is
:meth:`~fleetopt.models.power.PowerCurve.max_batch_under` (the closed-form inverse, floored and checked); for an
activity power model (:class:`~fleetopt.models.service.DecodePower`) an integer bisection over the batch, which
is exact where the power does not fall as the batch grows. A cap of 0 serves nothing.

Power and analytic P99 (sustained, seed convention)
---------------------------------------------------
The fleet is evaluated analytically (:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`, the instance's TTFT
model) with every pool's ``max_num_seqs`` set to :math:`n_p(d)` and its replica count fixed: ``power_kw`` is the
mean power at the operating point the cap forces (an unstable pool draws :math:`N_p P_p(n_p(d))`, every batch
full), ``ttft_p99_ms_analytic`` the steady-state P99 (inf when a capped pool is unstable). ``sustained_ok`` is
the evaluation's SLO verdict (``FleetResult.slo_met``: stable, P99 and TPOT within the SLO, per pool or fleet-wide
as ``slo.scope`` says): the cap can be held for hours. The row's ``delivered_reduction`` is still measured on
the draw (:math:`1 -` ``power_kw`` / the depth-0 ``power_kw``), for comparison with the delivered convention.

Event P99 (a transient from the loaded steady state)
----------------------------------------------------
One simulator run per replication (:func:`event_replication`, :func:`fleetopt.solvers.des.engine.simulate` with
``cap_changes``):

1. *Warm-up*: the uncapped fleet (under the delivered convention: without the row's replicas out of service,
   which are absent from the whole run, so the pool is at least as loaded at :math:`t_0` as when they leave at
   :math:`t_0`; their own drain is not simulated) serves the instance's Poisson stream from empty on
   :math:`[0, t_0)`, length
   routing, JSQ dispatch (:math:`t_0 = \max(` :data:`WARMUP_RELAXATIONS` :math:`\tau,` :data:`WARMUP_MIN_S`
   :math:`)`, :math:`\tau` the largest pool relaxation time of the rows' uncapped warm-up fleets,
   ``PoolResult.relaxation_s``):
   the loaded steady state.
2. *Event*: at :math:`t_0` every replica of pool :math:`p` gets the batch cap :math:`n_p(d)`
   (:class:`fleetopt.solvers.des.state.CapChange`), in the same run. As in vLLM's scheduler, the cap gates
   admission only: no running sequence is preempted, the replica admits nothing until its batch is below the
   cap, so the batch drains to it as sequences complete (the power follows). The stream continues; the cap
   holds until the horizon :math:`t_0 + D + T_c` (:math:`T_c` = :data:`TAIL_SLOS` TTFT SLOs, so a measured
   request still waiting at the horizon has waited at least that long).

The *measured* requests are the new arrivals in :math:`[t_0, t_0 + D]` (:math:`D` = ``event_s``, no warm-up
cut); one without a first token at the horizon counts as :math:`+\infty`. ``ttft_p99_ms_event`` is their P99
pooled over the replications with its 95 % interval (:func:`fleetopt.optimizer.simulation.records.p99_estimate`:
over replications when there are two or more, else batch means), and ``event_ok`` asks the interval's upper end
to meet the SLO (per pool under a pool-scope SLO, over all measured requests under a fleet-scope one), as
``fleetopt simulate`` judges. Every depth runs the same replications' streams (common random numbers: the
generators of ``SeedSequence(seed).spawn(replications)``), so depths differ by the cap, not by the sample.
``power_w_event`` is the pool's simulated mean power over :math:`[t_0, t_0 + D + T_c]`, the drain included; the
row's simulated ``delivered_reduction`` is :math:`1 -` its simulated draw / the depth-0 row's (same streams).

Event verdict (``met`` / ``breach`` / ``undecided``): a pool with no traffic is ``met``; one whose interval's upper
end meets the SLO is ``met``; one whose upper end is unbounded only because its sample is too small for a P99
(every measured request got its first token, and the point estimate, if any, is within the SLO: too few
requests in one replication for batch means, or none at all) is ``undecided`` and named in
``undecided_pools``; any other is ``breach``. The row's event verdict is ``breach`` if a pool breaches, else
``undecided`` if one is undecided, else ``met`` (under a fleet-scope SLO, the same rule on all measured
requests). ``event_ok`` is ``event_verdict == "met"`` (and, under the delivered convention, the row delivers
its depth analytically).

Drain (:func:`drain_s`): the cap binds on the power only once a replica's batch is within it. A replica running
:math:`k` sequences at :math:`t_0` admits nothing while :math:`k > n_p(d)`, so its batch is within the cap from its
:math:`(k - n_p(d))`-th completion among them on; ``drain_s_event`` is the longest such wait over the pool's
replicas and the replications (0 when no batch exceeds its cap at :math:`t_0`): how long after the cap is set
the per-replica draw can still exceed :math:`P_p(n_p(d))`.

Safe depths
-----------
``max_safe_depth_sustained`` (``_event``) is the largest depth of the sweep such that it and every shallower
depth of the sweep are ``sustained_ok`` (``event_ok``): the depth one can commit to without passing through an
unsafe one; None when the shallowest depth fails (an undecided depth is not safe).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.fleet import FleetResult, PoolPlan
from fleetopt.models.power import PowerCurve
from fleetopt.models.service import decode_power_curve
from fleetopt.models.units import MS_PER_S
from fleetopt.solvers.des.engine import CapChange, simulate
from fleetopt.solvers.des.routing import LengthRouter, Requests, poisson_arrivals, sample_lengths

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.simulation.options import EngineOptions, engine_pools
from fleetopt.optimizer.simulation.records import p99_estimate
from fleetopt.optimizer.workflows.headroom import fixed_pools

__all__ = ["SCHEMA_VERSION", "DEFAULT_DEPTHS_PCT", "CONVENTIONS", "DELIVERED_LABEL", "SEED_LABEL", "WARMUP_RELAXATIONS",
           "WARMUP_MIN_S", "TAIL_SLOS", "EVENT_MODEL",
           "PoolDepth", "DepthRow", "GridFlex", "cap_under", "parse_depths", "drain_s", "event_replication", "gridflex"]

from fleetopt.optimizer.output.contract import SCHEMA_VERSION  # noqa: E402 (one contract version)
from fleetopt.optimizer.output.contract import build  # noqa: E402
from fleetopt.optimizer.output.contract.workflows import GridFlexDocument, _Depth, _DepthPool  # noqa: E402
"""Version of the JSON contract of :meth:`GridFlex.to_json`."""
DEFAULT_DEPTHS_PCT = tuple(range(0, 55, 5))
"""Depths of ``--depths`` by default, in % of the uncurtailed power: 0, 5, ..., 50."""
WARMUP_RELAXATIONS = 10.0
"""The warm-up before the event lasts at least this many relaxation times of the uncapped fleet."""
WARMUP_MIN_S = 60.0
"""... and at least this long (s)."""
TAIL_SLOS = 10.0
"""The capped run goes on this many TTFT SLOs after the event's last measured arrival."""
EVENT_MODEL = ("one run from the loaded steady state: the uncapped fleet (less any replicas out of service, absent "
               "from the whole run) warms up from empty, then each pool's "
               "batch cap drops at t0 (running sequences drain, none preempted, as vLLM's scheduler does)")
"""The one-line statement of the event model (the command's note line; module docstring)."""
CONVENTIONS = ("delivered", "seed")
"""What a depth means: the fleet's delivered draw reduction (default) or the reference scenarios' per-GPU cap."""
DELIVERED_LABEL = ("delivered draw reduction: depth d = 1 - P_curtailed / P_uncurtailed, the site's draw (kW); "
                   "levers: replicas out of service (powered down) and batch caps")
"""The label of the default convention (output and JSON ``convention_label``)."""
SEED_LABEL = "the reference scenarios' convention: per-GPU peak-power cap"
"""The label of ``convention="seed"`` (Puzzle 8's reading of a depth)."""
_DEPTHS_RE = re.compile(r"^\s*\d+(\.\d*)?\s*%?\s*$")


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolDepth:
    """One pool at one depth."""

    label: str
    replicas: int
    batch_cap: int
    """:math:`n_p(d)`."""
    power_cap_w: float
    """:math:`(1 - d) P_p(n_p^0)`: the per-replica power the cap must stay under."""
    replica_power_at_cap_w: float
    """:math:`P_p(n_p(d))`: the most one replica draws under the cap."""
    power_w: float
    """The pool's analytic mean power at the capped operating point."""
    utilization: float
    ttft_p99_ms_analytic: float
    ttft_p99_ms_event: float
    ttft_p99_ci_ms_event: tuple[float, float]
    power_w_event: float
    """Simulated mean power of the pool over the event run (NaN when not simulated)."""
    drain_s_event: float
    """Longest time after :math:`t_0` a replica's batch stays above the cap (module docstring, "Drain"; NaN when
    not simulated)."""
    measured_event: int
    sustained_ok: bool
    event_ok: bool
    replicas_out: int = 0
    """Replicas of the pool taken out of service (``replicas`` counts those left)."""
    event_verdict: str = ""
    """``met`` / ``breach`` / ``undecided`` (module docstring, "Event verdict"); empty when not simulated."""

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._DepthPool`) from these fields."""
        return build(_DepthPool, self, pool=self.label)


@dataclass(frozen=True)
class DepthRow:
    """The fleet at one curtailment depth."""

    depth: float
    """In % of the uncurtailed power."""
    pools: tuple[PoolDepth, ...]
    power_kw: float
    """Analytic mean power of the fleet with the caps (kW)."""
    ttft_p99_ms_analytic: float
    ttft_p99_ms_event: float
    ttft_p99_ci_ms_event: tuple[float, float]
    power_kw_event: float
    drain_s_event: float
    """The longest drain over the fleet's pools (NaN when not simulated)."""
    sustained_ok: bool
    event_ok: bool
    simulated: bool
    """False when a cap of 0 leaves a pool with no batch place (its requests never get a token: event P99 inf)."""
    lever: str = ""
    """What the row changes, in words ("2 of 10 replicas out of pool 0-4096; batch cap 64 on pool 0-4096")."""
    uncurtailed_draw_kw: float = math.nan
    """The depth-0 fleet's analytic draw (kW)."""
    delivered_reduction: float = math.nan
    """:math:`1 -` ``power_kw`` / ``uncurtailed_draw_kw`` (a share, not %)."""
    delivers: bool = True
    """Whether ``delivered_reduction`` reaches the depth (always true under the seed convention, whose depth is a
    per-GPU cap)."""
    verdict: str = ""
    """Analytic: ``met`` (delivers the depth and meets the SLO) or ``breach``."""
    event_uncurtailed_draw_kw: float = math.nan
    event_delivered_reduction: float = math.nan
    event_verdict: str = ""
    """Simulated: ``met`` / ``breach`` / ``undecided`` (module docstring, "Event verdict")."""
    undecided_pools: tuple[str, ...] = ()
    """Pools whose event sample is too small to judge a P99."""

    @property
    def batch_cap(self) -> int | None:
        """The cap of a one-pool fleet (None with several pools: see :attr:`pools`)."""
        return self.pools[0].batch_cap if len(self.pools) == 1 else None

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._Depth`) from these fields."""
        return build(_Depth, self, draw_kw=self.power_kw, source="analytic",
                     event={"delivered_reduction": self.event_delivered_reduction, "draw_kw": self.power_kw_event,
                            "uncurtailed_draw_kw": self.event_uncurtailed_draw_kw, "source": "simulated",
                            "verdict": self.event_verdict or None, "undecided_pools": list(self.undecided_pools)},
                     pools=[p.to_json() for p in self.pools])


@dataclass(frozen=True)
class GridFlex:
    """A depth sweep of one fleet (module docstring)."""

    instance: str
    fleet: str
    arrival_rate: float
    slo_ttft_p99_ms: float
    ttft_model: str
    scope: str
    event_s: float
    warmup_s: float
    tail_s: float
    replications: int
    seed: int
    depths: tuple[DepthRow, ...]
    max_safe_depth_sustained: float | None
    max_safe_depth_event: float | None
    overrides: tuple[str, ...] = ()
    wall_s: float = 0.0
    event_model: str = EVENT_MODEL
    convention: str = "delivered"

    @property
    def convention_label(self) -> str:
        return SEED_LABEL if self.convention == "seed" else DELIVERED_LABEL

    def safe_row(self, which: str = "sustained") -> DepthRow | None:
        """The row of ``max_safe_depth_sustained`` (``"event"``: of ``max_safe_depth_event``); None if none."""
        d = self.max_safe_depth_sustained if which == "sustained" else self.max_safe_depth_event
        return next((r for r in self.depths if r.depth == d), None)

    def to_json(self) -> dict:
        """The document, built by its model (:class:`fleetopt.optimizer.output.contract.workflows.GridFlexDocument`)."""
        return build(GridFlexDocument, self, schema_version=SCHEMA_VERSION, command="gridflex",
                     source={"batch_cap": ("inverse of the power model" if self.convention == "seed"
                                           else "lever search (analytic)"), "power_kw": "analytic",
                             "delivered_reduction": "analytic (event.delivered_reduction: simulated)",
                             "ttft_p99_ms_analytic": "analytic (steady state at the cap)",
                             "ttft_p99_ms_event": "simulated event window from the loaded steady state"},
                     event_seconds=self.event_s, warmup_seconds=self.warmup_s, tail_seconds=self.tail_s,
                     depths=[r.to_json() for r in self.depths],
                     undecided_pools=sorted({x for r in self.depths for x in r.undecided_pools}),
                     wall_seconds=self.wall_s)

    def to_csv_rows(self) -> list[dict]:
        return [{"depth": r.depth, "lever": r.lever, "batch_cap": "" if r.batch_cap is None else r.batch_cap,
                 "power_kw": r.power_kw, "uncurtailed_draw_kw": r.uncurtailed_draw_kw,
                 "delivered_reduction": r.delivered_reduction, "ttft_p99_ms_analytic": r.ttft_p99_ms_analytic,
                 "ttft_p99_ms_event": r.ttft_p99_ms_event, "power_kw_event": r.power_kw_event,
                 "event_delivered_reduction": r.event_delivered_reduction, "verdict": r.verdict,
                 "event_verdict": r.event_verdict, "sustained_ok": r.sustained_ok, "event_ok": r.event_ok}
                for r in self.depths]


# --------------------------------------------------------------------------------------------
# The cap of a depth
# --------------------------------------------------------------------------------------------


def cap_under(curve, power_w: float, max_batch: int) -> int:
    """Largest batch :math:`n \\in \\{0, \\dots, n_{max}\\}` with :math:`P(n) \\le` ``power_w``
    (module docstring, "Batch cap of a depth").

    ``curve`` maps a batch to watts (``power_w(batch)``): a :class:`~fleetopt.models.power.PowerCurve` is inverted
    in closed form (:meth:`~fleetopt.models.power.PowerCurve.max_batch_under`), any other by integer bisection
    (exact where the power does not fall as the batch grows).

    Examples
    --------
    The seeds' H100 curve (300-600 W, k = 1, x0 = 4.2) at 90 % of its power at a batch of 128:

    >>> h100 = PowerCurve(300.0, 600.0, 1.0, 4.2, "measured")
    >>> cap_under(h100, 0.9 * h100.power_w(128), 128)
    39
    """
    if max_batch < 0:
        raise ValueError(f"max_batch must be >= 0; got {max_batch}")
    if float(curve.power_w(max_batch)) <= power_w:
        return int(max_batch)
    if isinstance(curve, PowerCurve):
        return min(int(curve.max_batch_under(power_w)), int(max_batch))
    if float(curve.power_w(0)) > power_w:
        return 0
    lo, hi = 0, int(max_batch)          # P(lo) <= power_w < P(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if float(curve.power_w(mid)) <= power_w:
            lo = mid
        else:
            hi = mid
    return lo


def parse_depths(text: str, field: str = "--depths") -> tuple[float, ...]:
    """``"0,5,10"`` (or ``"0%,5%"``) -> ``(0.0, 5.0, 10.0)``: depths in % of the uncurtailed power, each in
    [0, 100), sorted and without repeats.

    Examples
    --------
    >>> parse_depths("10, 0,5%")
    (0.0, 5.0, 10.0)
    """
    parts = [x for x in str(text).split(",") if x.strip()]
    if not parts or not all(_DEPTHS_RE.match(x) for x in parts):
        raise InstanceError(f"{field}: {text!r} is not a comma-separated list of depths in % (e.g. 0,5,10)")
    out = sorted({float(x.strip().rstrip("%")) for x in parts})
    if out[-1] >= 100.0:
        raise InstanceError(f"{field}: {out[-1]:g} % would cut all power; give depths in [0, 100)")
    return tuple(out)


# --------------------------------------------------------------------------------------------
# The event simulation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Event:
    """One replication's event: the measured requests' TTFTs (s, inf without a first token) and pools, and the
    pools' simulated mean power over the event run (W)."""

    ttft_s: np.ndarray
    pool: np.ndarray
    power_w: np.ndarray
    drain_s: np.ndarray
    """Per pool, the longest drain over its replicas (:func:`drain_s`)."""


def _stream(instance: Instance, end_s: float, rng: np.random.Generator) -> Requests:
    """The instance's Poisson stream on :math:`[0, end]` (draws: instants, then lengths, as ``simulate`` does)."""
    w = instance.workload
    lam = w.arrival_rate_req_per_s
    mean = lam * end_s
    n = int(mean + 8.0 * math.sqrt(mean) + 16)
    at = poisson_arrivals(lam, n, rng)
    prompt, output = sample_lengths(w.lengths, n, rng, w.input_fraction)
    keep = at <= end_s
    return Requests(at[keep], prompt[keep], output[keep])


def drain_s(start_s: np.ndarray, end_s: np.ndarray, replica: np.ndarray, replica_cap: np.ndarray,
            t0_s: float) -> np.ndarray:
    """Per replica, the time after ``t0_s`` until its batch is within its cap (module docstring, "Drain").

    ``start_s``, ``end_s`` and ``replica`` are the simulator's per-request columns (NaN end: unfinished, -1
    replica: never admitted); ``replica_cap`` the caps from ``t0_s`` on. A replica with :math:`k` sequences running
    at ``t0_s`` (started before it, ending after it) and cap :math:`n < k` drains at the :math:`(k - n)`-th of their
    completions (inf if the run ends first).

    Examples
    --------
    Replica 0 runs three sequences at t0 = 10 (ending at 12, 15, 11) under a cap of 1: within it from the second
    completion on, at 12. Replica 1 runs one, within its cap of 2.

    >>> drain_s(np.array([1.0, 2, 3, 4, 9]), np.array([12.0, 15, 11, 20, 9.5]), np.array([0, 0, 0, 1, 1]),
    ...         np.array([1, 2]), 10.0).tolist()
    [2.0, 0.0]
    """
    out = np.zeros(len(replica_cap))
    running = (replica >= 0) & (start_s < t0_s) & ~(end_s <= t0_s)
    ends = np.where(np.isnan(end_s), np.inf, end_s)
    for r in unique(replica[running]):
        mine = np.sort(ends[running & (replica == r)])
        over = len(mine) - int(replica_cap[r])
        if over > 0:
            out[r] = mine[over - 1] - t0_s
    return out


def event_replication(pools, caps: list[int], edges: list[int], names: list[str], stream: Requests, t0_s: float,
                      event_s: float, end_s: float) -> _Event:
    """One replication of the event (module docstring, "Event P99"): ``pools`` are the simulator's uncapped pools
    (:class:`fleetopt.solvers.des.state.SimPool`), ``caps`` their batch caps from :math:`t_0` on, ``stream`` the
    arrivals on :math:`[0, end]`."""
    changes = [CapChange(t0_s, x, n) for x, n in zip(names, caps)]
    res = simulate(pools, stream, LengthRouter(edges, names), horizon_s=end_s, warmup_s=t0_s, cap_changes=changes)
    per_replica = drain_s(res.start_at_s, res.end_at_s, res.replica, np.repeat(caps, [p.replicas for p in pools]),
                          t0_s)
    of_pool = np.repeat(np.arange(len(pools)), [p.replicas for p in pools])
    pool_drain = np.array([per_replica[of_pool == k].max() for k in range(len(pools))])
    at = stream.arrival_at_s
    keep = (at >= t0_s) & (at <= t0_s + event_s)
    ttft = res.first_token_at_s[keep] - at[keep]
    pool = res.pool[keep]
    if np.any(pool < 0):        # rejected (longer than every window): charged to the pool its length belongs to
        tot = (stream.prompt_tokens + stream.output_tokens)[keep]
        pool = np.where(pool < 0, np.clip(np.searchsorted(edges, tot, side="left") - 1, 0, len(pools) - 1), pool)
    return _Event(np.where(np.isnan(ttft), np.inf, ttft), pool, res.pool_mean_power_w, pool_drain)


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


def _prefix_max(depths: list[float], ok: list[bool]) -> float | None:
    """Largest depth whose own flag and every shallower depth's flag hold (None if the shallowest fails)."""
    best = None
    for d, good in zip(depths, ok):
        if not good:
            break
        best = d
    return best


@dataclass(frozen=True)
class _Option:
    """One pool with ``out`` replicas out of service and batch cap ``cap``: its analytic draw and P99."""

    out: int
    cap: int
    power_w: float
    ttft_p99_ms: float
    slo_met: bool


def _count(p: PoolPlan) -> int:
    """The replica count of a pool of :func:`~fleetopt.optimizer.workflows.headroom.fixed_pools` (every count
    fixed)."""
    assert p.replicas is not None
    return p.replicas


class _PoolLevers:
    """The lever options of pool ``i`` of ``plans`` (module docstring, "Delivered depths"), evaluated on demand
    and cached: the fleet with that pool at ``replicas - out`` replicas and cap ``cap``, the others as given."""

    def __init__(self, instance: Instance, plans: list[PoolPlan], i: int):
        self.instance, self.plans, self.i = instance, plans, i
        plan = plans[i]
        assert plan.max_num_seqs is not None        # gridflex gives every pool its evaluated batch cap
        self.n = int(_count(plan))
        n0 = int(plan.max_num_seqs)
        caps = [n0]
        while caps[-1] > 1:
            caps.append(caps[-1] // 2)
        self.caps = caps
        self._seen: dict[tuple[int, int], _Option] = {}

    def at(self, out: int, cap: int) -> _Option:
        key = (out, cap)
        if key not in self._seen:
            plans = list(self.plans)
            plans[self.i] = replace(plans[self.i], replicas=self.n - out, max_num_seqs=cap)
            q = evaluate_plans(self.instance, plans, fleet_p99=False).pools[self.i]
            self._seen[key] = _Option(out, cap, float(q.power_w), float(q.ttft_p99_ms), bool(q.slo_met))
        return self._seen[key]

    def _fewest_out(self, cap: int, target_w: float) -> _Option | None:
        """The option with cap ``cap`` and the fewest replicas out whose draw is within ``target_w`` (bisection on
        the count: the draw falls as replicas leave); None when even ``replicas - 1`` out draw more."""
        if self.at(0, cap).power_w <= target_w:
            return self.at(0, cap)
        hi = self.n - 1
        if hi < 1 or self.at(hi, cap).power_w > target_w:
            return None
        lo = 0                                # draw(lo) > target >= draw(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.at(mid, cap).power_w <= target_w:
                hi = mid
            else:
                lo = mid
        return self.at(hi, cap)

    def _most_out_in_slo(self, cap: int) -> _Option | None:
        """The option with cap ``cap`` and the most replicas out that keeps the pool within the SLO (bisection: the
        P99 rises as replicas leave); None when none does."""
        if not self.at(0, cap).slo_met:
            return None
        lo, hi = 0, self.n                    # slo(lo) holds; hi is past the last count
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.at(mid, cap).slo_met:
                lo = mid
            else:
                hi = mid
        return self.at(lo, cap)

    @staticmethod
    def _rank(o: _Option) -> tuple:
        return (round(o.ttft_p99_ms, 2) if math.isfinite(o.ttft_p99_ms) else math.inf, o.out, -o.cap)

    def best(self, target_w: float) -> tuple[_Option, bool]:
        """The pool's choice for a draw of at most ``target_w`` and whether its draw reaches it."""
        usable = [c for c in self.caps if self.at(0, c).slo_met]     # more replicas out only raises the P99
        found = [o for o in (self._fewest_out(c, target_w) for c in usable) if o is not None]
        safe = [o for o in found if o.slo_met]
        if safe:
            return min(safe, key=self._rank), True
        found += [o for o in (self._fewest_out(c, target_w) for c in self.caps if c not in usable) if o is not None]
        if found:
            return min(found, key=self._rank), True
        return min((self.at(self.n - 1, c) for c in self.caps), key=lambda o: o.power_w), False

    def deepest_in_slo(self) -> _Option | None:
        """The in-SLO option of least draw (None when even the uncurtailed pool misses the SLO)."""
        opts = [o for o in (self._most_out_in_slo(c) for c in self.caps) if o is not None]
        return min(opts, key=lambda o: (o.power_w, self._rank(o))) if opts else None


def _lever_text(base: FleetResult, outs: list[int], caps: list[int], curves=None) -> str:
    """The levers of a row in words; ``curves`` given: the seed convention's per-replica peak under each cap."""
    one = len(base.pools) == 1
    parts = []
    for q, k, n, c in zip(base.pools, outs, caps, curves or [None] * len(caps)):
        where = f"pool {q.min_tokens}-{q.max_tokens}"
        if k:
            parts.append(f"{k} of {q.replicas} replicas out of {where}")
        if n != q.max_num_seqs:
            peak = "" if c is None else f" (peak {float(c.power_w(n)):,.0f} W/replica)"
            parts.append(f"batch cap {n}{peak}" + ("" if one else f" on {where}"))
    return "; ".join(parts) or "none (uncurtailed)"


def _delivered_levers(instance: Instance, plans: list[PoolPlan], base: FleetResult,
                      depths: list[float]) -> list[tuple[list[int], list[int], bool]]:
    """Per depth: replicas out and batch cap per pool, and whether the analytic draw reaches the depth
    (module docstring, "Delivered depths")."""
    levers = [_PoolLevers(instance, plans, i) for i in range(len(plans))]
    base_w = [float(q.power_w) for q in base.pools]
    total_w = sum(base_w)
    deepest = None
    out = []
    for d in depths:
        share = 1.0 - d / 100.0
        picks = [lv.best(share * w) for lv, w in zip(levers, base_w)]
        chosen = [o for o, _ in picks]
        reach = all(ok for _, ok in picks)
        if len(levers) > 1 and not all(o.slo_met and ok for o, ok in picks):
            if deepest is None:
                deepest = [lv.deepest_in_slo() for lv in levers]
            found = [o for o in deepest if o is not None]
            if len(found) == len(deepest) and sum(o.power_w for o in found) <= share * total_w:
                chosen, reach = found, True
        out.append(([o.out for o in chosen], [o.cap for o in chosen], reach))
    return out


def _event_verdict(est, values: list[np.ndarray], traffic: bool, slo_ms: float) -> str:
    """``met`` / ``breach`` / ``undecided`` of one measured sample (module docstring, "Event verdict")."""
    if not traffic:
        return "met"
    hi = est.high * MS_PER_S
    if hi <= slo_ms * (1 + 1e-12):
        return "met"
    served = all(bool(np.all(np.isfinite(v))) for v in values)
    point_ok = math.isnan(est.value) or est.value * MS_PER_S <= slo_ms * (1 + 1e-12)
    if not math.isfinite(hi) and served and point_ok:
        return "undecided"
    return "breach"


def _combine(verdicts: list[str]) -> str:
    return "breach" if "breach" in verdicts else ("undecided" if "undecided" in verdicts else "met")


def gridflex(instance: Instance, fleet: str, depths_pct=DEFAULT_DEPTHS_PCT, *, event_s: float = 900.0,
             replications: int = 3, seed: int = 0, progress=None, convention: str = "delivered",
             event: bool = True) -> GridFlex:
    """The depth sweep of ``fleet`` (a ``--fleet`` spec, counts fixed as ``evaluate`` sizes them) on ``instance``
    (module docstring), a depth read as ``convention`` (:data:`CONVENTIONS`). ``progress(depth)``, if given, is
    called before each depth's simulation. ``event=False`` skips the event simulation (analytic figures only: the
    event columns are NaN, ``event_verdict`` empty, ``max_safe_depth_event`` None).

    Raises
    ------
    InstanceError
        A bad fleet spec, depths outside [0, 100), a compress-and-route pool (``@GAMMA``: the event runs length
        routing), a bad event length or replication count, or an unknown convention.
    """
    import time

    t_start = time.perf_counter()
    depths = sorted({0.0} | {float(d) for d in depths_pct})
    problems = []
    if depths[0] < 0 or depths[-1] >= 100:
        problems.append(f"--depths: {depths_pct!r}: give depths in % in [0, 100)")
    if not (math.isfinite(event_s) and event_s > 0):
        problems.append(f"--event-minutes: {event_s / 60:g} must be > 0")
    if not (isinstance(replications, int) and replications >= 1):
        problems.append(f"--replications: {replications!r} must be a whole number >= 1")
    if convention not in CONVENTIONS:
        problems.append(f"--convention: {convention!r} is not one of {', '.join(CONVENTIONS)}")
    if problems:
        raise InstanceError(problems)
    plans, base = fixed_pools(instance, fleet)
    if any(p.compress_gamma > 1 for p in plans):
        raise InstanceError("--fleet: gridflex simulates length routing; drop @GAMMA (compress-and-route) pools")
    bad = [p for p in base.pools if p.replicas < 1 or p.max_num_seqs < 1]
    if bad:
        raise InstanceError([f"--fleet: pool {p.min_tokens}-{p.max_tokens}:{p.gpu} has no replica or batch place"
                             for p in bad])
    plans = [replace(p, max_num_seqs=q.max_num_seqs) for p, q in zip(plans, base.pools)]
    curves = [decode_power_curve(p.profile, p.hi_tokens / 2) for p in plans]
    ref_w = [float(c.power_w(q.max_num_seqs)) for c, q in zip(curves, base.pools)]
    names = [f"{q.min_tokens}-{q.max_tokens}:{q.gpu}" for q in base.pools]
    edges = [0] + [q.max_tokens for q in base.pools]
    profiles = [p.profile for p in plans]
    slo_s = instance.slo.ttft_p99_s
    slo_ms = slo_s * MS_PER_S

    # the levers of each depth: (replicas out, batch caps, whether the depth is reached)
    if convention == "seed":
        levers = [([0] * len(plans), [cap_under(c, (1.0 - d / 100.0) * r, q.max_num_seqs)
                                      for c, r, q in zip(curves, ref_w, base.pools)], True) for d in depths]
    else:
        levers = _delivered_levers(instance, plans, base, depths)
    # the warm-up fleets (uncapped, without the replicas out) and the warm-up length over all of them
    warm: dict[tuple[int, ...], FleetResult] = {}
    for outs, _, _ in levers:
        if tuple(outs) not in warm:
            warm[tuple(outs)] = evaluate_plans(instance, [replace(p, replicas=_count(p) - k)
                                                          for p, k in zip(plans, outs)], fleet_p99=False)
    relax_s = max((q.relaxation_s for f in warm.values() for q in f.pools
                   if q.arrival_rate > 0 and math.isfinite(q.relaxation_s)), default=0.0)
    t0_s = max(WARMUP_RELAXATIONS * relax_s, WARMUP_MIN_S)
    tail_s = TAIL_SLOS * slo_s
    end_s = t0_s + event_s + tail_s
    children = np.random.SeedSequence(seed).spawn(replications)
    streams = [_stream(instance, end_s, np.random.default_rng(c)) for c in children]

    rows = []
    for d, (outs, caps, reach) in zip(depths, levers):
        at_cap: FleetResult = evaluate_plans(instance, [replace(p, replicas=_count(p) - k, max_num_seqs=n)
                                                        for p, k, n in zip(plans, outs, caps)])
        simulated = event and min(caps) >= 1
        if simulated:
            if progress is not None:
                progress(d)
            sim_pools = engine_pools(warm[tuple(outs)], profiles, names, EngineOptions())
            runs = [event_replication(sim_pools, caps, edges, names, s, t0_s, event_s, end_s) for s in streams]
        else:
            runs = []
        pools = []
        for k, (q, n) in enumerate(zip(at_cap.pools, caps)):
            if simulated:
                groups = [r.ttft_s[r.pool == k] for r in runs]
                est = p99_estimate(groups)
                measured = sum(int(g.size) for g in groups)
                pw = float(np.mean([r.power_w[k] for r in runs]))
                drain = float(max(r.drain_s[k] for r in runs))
                verdict_k = _event_verdict(est, groups, q.arrival_rate > 0, slo_ms)
                p99, lo, hi = est.value * MS_PER_S, est.low * MS_PER_S, est.high * MS_PER_S
            else:
                measured, pw, drain = 0, math.nan, math.nan
                verdict_k = "" if not event else ("met" if q.arrival_rate == 0 else "breach")
                p99 = lo = hi = math.inf if event else math.nan
            pools.append(PoolDepth(names[k], q.replicas, n, (1.0 - d / 100.0) * ref_w[k],
                                   float(curves[k].power_w(n)), q.power_w, q.utilization, q.ttft_p99_ms, p99,
                                   (lo, hi), pw, drain, measured, bool(q.slo_met), verdict_k == "met",
                                   outs[k], verdict_k if simulated else ""))
        if simulated:
            fl = p99_estimate([r.ttft_s for r in runs])
            f99, fci = fl.value * MS_PER_S, (fl.low * MS_PER_S, fl.high * MS_PER_S)
            pkw = float(np.mean([r.power_w.sum() for r in runs])) / 1000.0
        else:
            fl = None
            f99 = math.inf if event else math.nan
            fci, pkw = (f99, f99), math.nan
        if instance.slo.scope == "fleet":
            ev = (_event_verdict(fl, [r.ttft_s for r in runs], any(q.arrival_rate > 0 for q in at_cap.pools), slo_ms)
                  if simulated else ("breach" if event else ""))
            undecided = tuple(names) if ev == "undecided" else ()
        else:
            ev = _combine([p.event_verdict or "breach" for p in pools]) if simulated else ("breach" if event else "")
            undecided = tuple(p.label for p in pools if p.event_verdict == "undecided")
        ref = rows[0] if rows else None             # depth 0, the uncurtailed fleet
        p0_kw = at_cap.power_kw if ref is None else ref.power_kw
        p0_kw_event = pkw if ref is None else ref.power_kw_event
        delivered = 1.0 - at_cap.power_kw / p0_kw if p0_kw > 0 else math.nan
        delivered_event = 1.0 - pkw / p0_kw_event if p0_kw_event > 0 else math.nan
        delivers = bool(convention == "seed" or (reach and delivered >= d / 100.0 - 1e-12))
        verdict = "met" if at_cap.slo_met and delivers else "breach"
        rows.append(DepthRow(d, tuple(pools), at_cap.power_kw, at_cap.ttft_p99_ms, f99, fci, pkw,
                             max((p.drain_s_event for p in pools), default=math.nan) if simulated else math.nan,
                             verdict == "met", ev == "met" and delivers, simulated,
                             _lever_text(base, outs, caps, curves if convention == "seed" else None), p0_kw,
                             delivered, delivers, verdict, p0_kw_event, delivered_event, ev, undecided))
    spec = ",".join(f"{q.min_tokens}-{q.max_tokens}:{q.gpu}x{q.replicas}" for q in base.pools)
    return GridFlex(instance.name, spec, instance.workload.arrival_rate_req_per_s, slo_ms,
                    instance.slo.ttft_model, instance.slo.scope, float(event_s), t0_s, tail_s, replications, seed,
                    tuple(rows), _prefix_max(depths, [r.sustained_ok for r in rows]),
                    _prefix_max(depths, [r.event_ok for r in rows]) if event else None, tuple(instance.overrides),
                    time.perf_counter() - t_start, EVENT_MODEL, convention)
