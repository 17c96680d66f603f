r"""The settings of a simulation run: :class:`SimOptions` (the run) and :class:`EngineOptions` (each pool's engine).

:class:`SimOptions` is the one frozen record every simulation takes
(:func:`fleetopt.optimizer.simulation.simulate.simulate_plan`, the verification, the trim, the CLI): the
requests, replications, seed and warm-up of the measurement protocol, the service mode, the router and
dispatch, the arrival process and its parameters, the precision target and its cap, and the engine
settings as a nested :class:`EngineOptions`. It is validated once, when it is built (``dataclasses.replace``
builds a new one, so it is validated again); a bad setting raises :class:`SimOptionsError` (a
``ValueError``) with one line per problem naming the field, its value and what is allowed. What needs the
instance or the plan (a trace replay of a CDF workload, a router the plan's pools cannot take, a token
budget below a batch cap) is checked when the run starts. The report records the options it ran with
(``SimReport.options``, ``"options"`` in its JSON).

Engine
------
The analytic model and the default simulation give every sequence a *reserved* KV slot of the
pool's whole window: a replica runs at most :math:`n_{slots}(B)` sequences (or the TPOT cap of the
plan), so its KV blocks can never run out. A vLLM server does not reserve: it admits up to its
``max_num_seqs`` while the blocks of the sequences' *current* contexts fit, and preempts (recompute)
when decoding sequences outgrow the cache. :class:`EngineOptions` picks the view:

``kv="reserve"`` (default)
    The analytic batch cap; no preemption can happen. Simulated and analytic numbers differ only
    where the analytic assumptions (Erlang-C, the P99-wait approximation) do.
``kv="paged"``
    vLLM's paged admission (:mod:`fleetopt.solvers.des.engine`, "KV blocks and preemption"): per replica up to
    ``max_num_seqs`` sequences (default :data:`VLLM_DEFAULT_MAX_NUM_SEQS`, vLLM's long-standing
    default; a plan's TPOT cap, which is a deliberate engine setting, is kept), admitted while their
    blocks fit, preempted when they no longer do. Shorter-than-window requests then share the cache
    and queue less; long ones risk preemption, which the report counts per pool. The iteration
    latency :math:`t(n, \bar x) = W + h\, n \bar x` is extrapolated to batches beyond the profile's
    calibrated concurrency (it is affine in the batch's total context, so nothing breaks, but the
    profile was not measured there).

``max_batched_tokens`` sets vLLM's per-iteration token budget (``max_num_batched_tokens``) on every
replica; None leaves prefills one chunk per iteration each (the seeds' service model).

Availability
------------
``availability="all-up"`` (default) simulates every replica of the plan. ``"sampled"`` draws, per
replication and per pool, the replicas that are up from :math:`\mathrm{Binomial}(N, A)`
(:math:`A` = ``gpus[].availability``, independent replicas) and simulates only those for the whole
replication: a snapshot model, right when failures and repairs are slow against a replication's
span (hours against minutes). A pool drawn with no replica up loses its requests: they are
rejected, counted as SLO misses with no first token. Planning inflated the replica counts to
:math:`\lceil N^*/A \rceil` so that the *mean* number up covers :math:`N^*`; sampling shows what
the P99 looks like when fewer are up than on average.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

from typing import TYPE_CHECKING

from fleetopt.solvers.des.arrivals import DEFAULT_MEAN_DWELL_S
from fleetopt.solvers.des.state import MODES, SimPool

if TYPE_CHECKING:                                 # the settings do not load the performance models
    from fleetopt.models.fleet import FleetResult

from fleetopt.optimizer.errors import InstanceError
# the names and the spillover default live in the package, without numpy: the CLI declares its flags with them
from fleetopt.optimizer.simulation import (ARRIVALS, AVAILABILITY_MODES, DEFAULT_SPILL_BOUND, DISPATCHES, KV_MODES,
                                            ROUTERS)

__all__ = ["KV_MODES", "AVAILABILITY_MODES", "ROUTERS", "DISPATCHES", "ARRIVALS", "MODES",
           "MIN_REQUESTS_PER_REPLICATION", "VLLM_DEFAULT_MAX_NUM_SEQS", "DEFAULT_SPILL_BOUND", "EngineOptions",
           "SimOptions", "SimOptionsError", "VERIFY_SIM_OPTIONS", "parse_precision", "engine_pools", "sample_up",
           "DownPoolsRouter"]

MIN_REQUESTS_PER_REPLICATION = 100
"""Fewest requests a replication may have (``SimOptions.requests`` over ``SimOptions.replications``)."""
_MAX_ENGINE_CAP = 1 << 30
VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``, the per-replica batch cap of ``kv="paged"`` unless given."""


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings of a simulation (module docstring); the defaults are the analytic model's view.

    Checked where they are used, as the ``engine`` of a :class:`SimOptions` (:meth:`problems`; whether a
    setting is allowed depends on the run's service mode), so every bad setting is reported with the others."""

    kv: str = "reserve"
    max_num_seqs: int | None = None
    """``kv="paged"``: per-replica batch cap (None: :data:`VLLM_DEFAULT_MAX_NUM_SEQS`); a plan's TPOT cap bounds it."""
    max_batched_tokens: int | None = None
    """Per-iteration token budget per replica (vLLM's ``max_num_batched_tokens``); None: no budget."""
    availability: str = "all-up"

    def problems(self, mode: str) -> list[tuple[str, str]]:
        """``(field, what is wrong)`` per bad setting, fields named ``engine.<name>`` (``mode`` is the run's service
        mode: slot mode has no iterations or KV blocks). :class:`SimOptions` raises them."""
        out = []
        if self.kv not in KV_MODES:
            out.append(("engine.kv", f"{self.kv!r} is not one of {', '.join(KV_MODES)}"))
        if self.availability not in AVAILABILITY_MODES:
            out.append(("engine.availability",
                        f"{self.availability!r} is not one of {', '.join(AVAILABILITY_MODES)}"))
        for name in ("max_num_seqs", "max_batched_tokens"):
            value = getattr(self, name)
            if value is not None and not (_whole(value) and 1 <= value <= _MAX_ENGINE_CAP):
                out.append((f"engine.{name}", f"{value!r} must be None or a whole number in [1, {_MAX_ENGINE_CAP}]"))
        if self.max_num_seqs is not None and self.kv != "paged":
            out.append(("engine.max_num_seqs", f"{self.max_num_seqs!r} sets the batch cap of kv 'paged'; kv "
                        f"{self.kv!r} uses the plan's analytic cap (give None)"))
        if self.kv == "paged" and self.max_batched_tokens is not None:
            out.append(("engine.max_batched_tokens", f"{self.max_batched_tokens!r} is not supported with kv 'paged' "
                        "yet (the simulator's KV-block events assume whole prefill chunks); give None"))
        if mode == "slot" and (self.kv == "paged" or self.max_batched_tokens is not None):
            out.append(("mode", "slot mode has no iterations or KV blocks; kv 'paged' and max_batched_tokens need "
                        "mode 'iteration'"))
        return out

    def to_json(self) -> dict:
        return {"kv": self.kv, "max_num_seqs": self.max_num_seqs, "max_batched_tokens": self.max_batched_tokens,
                "availability": self.availability}


class SimOptionsError(InstanceError, ValueError):
    """Bad settings of a :class:`SimOptions`: ``by_field`` holds ``(field, what is wrong)`` per problem, and the
    message one ``field: what is wrong`` line each (an :class:`~fleetopt.optimizer.errors.InstanceError`, so the CLI
    exits 2; the CLI names its own flags instead of the fields)."""

    def __init__(self, by_field: list[tuple[str, str]]):
        self.by_field = tuple(by_field)
        super().__init__([f"{field}: {text}" for field, text in self.by_field])


@dataclass(frozen=True)
class SimOptions:
    """Every setting of a simulation run (module docstring), validated when built.

    The fields are the run's *settings*; what belongs to one call (the pools, a split plan's routing, a split
    router's share matrix, a progress callback) is an argument of
    :func:`fleetopt.optimizer.simulation.simulate.simulate_plan`. The engine settings are a nested
    :class:`EngineOptions`: they describe each pool's replicas (what :func:`engine_pools` builds and the trim's
    floors read) rather than the run, and keep their own ``"engine"`` JSON block.

    Raises
    ------
    SimOptionsError
        One line per bad field, naming the field, its value and what is allowed.

    Examples
    --------
    >>> o = SimOptions(requests=20_000, seed=3)
    >>> (o.replications, replace(o, seed=4).seed, o.engine.kv)
    (5, 4, 'reserve')
    >>> SimOptions.from_json(o.to_json()) == o
    True
    >>> replace(o, replications=0)
    Traceback (most recent call last):
    ...
    fleetopt.optimizer.simulation.options.SimOptionsError: replications: 0 must be a whole number >= 1
    """

    requests: int = 50_000
    """Requests of a round over all replications (split evenly; at least :data:`MIN_REQUESTS_PER_REPLICATION`
    each); the first round's with a ``precision`` target."""
    replications: int = 5
    """Independent replications (1: batch means within the run; a trace replay runs one)."""
    seed: int = 0
    """Root of ``SeedSequence(seed).spawn(replications)``: the same seed gives the same report but its wall time."""
    warmup_share: float = 0.1
    """Share of each replication's span discarded at its start, in [0, 0.5] (raised to the start-up floor, at
    most half the span; :mod:`fleetopt.optimizer.simulation.simulate`)."""
    mode: str = "iteration"
    """Service model of :func:`fleetopt.solvers.des.engine.simulate`: ``iteration`` (continuous batching) or
    ``slot`` (the analytic model's M/G/c)."""
    router: str = "auto"
    """Router between pools: one of :data:`ROUTERS`, or ``auto``, the one the plan was solved for (a split plan's
    own routing, compress-and-route for ``@gamma`` pools, else length)."""
    dispatch: str = "jsq"
    """Replica choice within a pool (iteration mode): ``jsq``, ``round-robin`` or ``least-queue``
    (:data:`DISPATCHES`)."""
    arrivals: str = "poisson"
    """Arrival process at the instance's rate: ``poisson``, ``trace`` (replay a trace's instants), ``mmpp`` or
    ``diurnal``."""
    peak_to_mean: float = 2.0
    """Burstiness of ``mmpp`` and ``diurnal`` arrivals (>= 1; diurnal at most 2, a sinusoid of amplitude
    ``peak_to_mean - 1``)."""
    mean_dwell_s: float = DEFAULT_MEAN_DWELL_S
    """``mmpp``: mean burst duration, in seconds."""
    period_s: float | None = None
    """``diurnal``: period in seconds (None: the expected span of one replication, one whole cycle)."""
    spill_bound: int | None = None
    """``router="spillover"``: requests waiting in a pool beyond which an arrival spills to the next pool up
    (None: :data:`DEFAULT_SPILL_BOUND`); only with that router."""
    precision: float | None = None
    """Target relative half-width of the fleet P99 TTFT interval (0.05 = 5 %); the requests per round double
    until it is met or ``max_requests`` is reached. None: one round. The verification skips the rungs of that
    ladder its last round shows too short (:mod:`fleetopt.optimizer.simulation.pool_sizing`, "Precision ladder")."""
    max_requests: int = 1_000_000
    """Cap on the requests of a round when doubling for ``precision`` (at least ``requests`` then)."""
    engine: EngineOptions = EngineOptions()
    """KV admission, token budget and replica availability of every pool's engine."""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise SimOptionsError(problems)
        for f in fields(self):          # numpy scalars become Python numbers (the report's JSON, the repr)
            value = getattr(self, f.name)
            if isinstance(value, (np.integer, np.floating)):
                object.__setattr__(self, f.name, value.item())

    def problems(self) -> list[tuple[str, str]]:
        """``(field, what is wrong)`` per bad setting; ``__post_init__`` raises them all at once."""
        out = []
        for name, allowed in (("mode", MODES), ("router", ("auto",) + ROUTERS), ("dispatch", DISPATCHES),
                              ("arrivals", ARRIVALS)):
            if getattr(self, name) not in allowed:
                out.append((name, f"{getattr(self, name)!r} is not one of {', '.join(allowed)}"))
        for name, least in (("requests", 1), ("replications", 1), ("seed", 0), ("max_requests", 1)):
            if not (_whole(getattr(self, name)) and getattr(self, name) >= least):
                out.append((name, f"{getattr(self, name)!r} must be a whole number >= {least}"))
        counts_ok = not any(f in ("requests", "replications", "max_requests") for f, _ in out)
        per = 1 if self.arrivals == "trace" else self.replications
        if counts_ok and self.requests < MIN_REQUESTS_PER_REPLICATION * per:
            out.append(("requests", f"{self.requests!r} leaves fewer than {MIN_REQUESTS_PER_REPLICATION} requests "
                        f"per replication ({per} replications); give at least {MIN_REQUESTS_PER_REPLICATION * per}"))
        if self.precision is not None and not (_real(self.precision) and 0.0 < self.precision < 1.0):
            out.append(("precision", f"{self.precision!r} must be None or a fraction in (0, 1), e.g. 0.05"))
        elif self.precision is not None and counts_ok and self.requests > self.max_requests:
            out.append(("max_requests", f"{self.max_requests!r} is below requests {self.requests!r}; with a "
                        "precision target it must be at least that"))
        if not (_real(self.warmup_share) and 0.0 <= self.warmup_share <= 0.5):
            out.append(("warmup_share", f"{self.warmup_share!r} must lie in [0, 0.5]"))
        ptm = self.peak_to_mean
        if not (_real(ptm) and math.isfinite(ptm) and ptm >= 1.0):
            out.append(("peak_to_mean", f"{ptm!r} must be finite and >= 1"))
        elif self.arrivals == "diurnal" and ptm > 2.0:
            out.append(("peak_to_mean", f"{ptm:g} is above 2, the largest a sinusoidal rate reaches (amplitude 1)"))
        if not (_real(self.mean_dwell_s) and math.isfinite(self.mean_dwell_s) and self.mean_dwell_s > 0):
            out.append(("mean_dwell_s", f"{self.mean_dwell_s!r} must be finite and > 0"))
        if self.period_s is not None and not (_real(self.period_s) and math.isfinite(self.period_s)
                                              and self.period_s > 0):
            out.append(("period_s", f"{self.period_s!r} must be None or finite and > 0"))
        bound = self.spill_bound
        if bound is not None and not (_whole(bound) and bound >= 0):
            out.append(("spill_bound", f"{bound!r} must be None or a whole number >= 0"))
        elif bound is not None and self.router != "spillover":
            out.append(("spill_bound", f"{bound!r} applies to router 'spillover' only; the router is "
                        f"{self.router!r}"))
        if not isinstance(self.engine, EngineOptions):
            out.append(("engine", f"{self.engine!r} is not an EngineOptions"))
        else:
            out += self.engine.problems(self.mode)
        return out

    def to_json(self) -> dict:
        """Every field, the engine as its own mapping (``dataclasses.asdict``)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> SimOptions:
        """The record of :meth:`to_json`'s mapping (missing fields take their defaults; unknown ones are an error)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SimOptionsError([(name, "is not a setting of SimOptions") for name in unknown])
        engine = data.get("engine", EngineOptions())
        return cls(**{**data, "engine": engine if isinstance(engine, EngineOptions) else EngineOptions(**engine)})


def parse_precision(text, field: str = "--precision") -> float | None:
    """``"5%"`` or ``"5"`` (percent of the P99) -> 0.05, for :attr:`SimOptions.precision`; None stays None.

    Examples
    --------
    >>> parse_precision("5%"), parse_precision(None)
    (0.05, None)
    """
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*%?\s*", str(text))
    value = float(m[1]) / 100.0 if m else math.nan
    if not 0.0 < value < 1.0:
        raise InstanceError(f"{field}: '{text}' is not a percentage in (0, 100), e.g. 5%")
    return value


def _whole(x) -> bool:
    """A whole number (a Python or numpy integer, not a bool)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _real(x) -> bool:
    """A real number (a Python or numpy integer or float, not a bool)."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


VERIFY_SIM_OPTIONS = SimOptions(requests=100_000)
"""The simulation settings of a plan verification unless given (``solve --verify-top``'s defaults,
:func:`fleetopt.optimizer.api.verify`)."""


def engine_pools(analytic: FleetResult, profiles: list, names: list[str], engine: EngineOptions) -> list[SimPool]:
    """The simulator's pools for an evaluated plan: one :class:`SimPool` per pool with replicas, with the batch cap
    and KV admission ``engine`` asks for (``profiles[k]`` and ``names[k]`` belong to ``analytic.pools[k]``)."""
    out = []
    for p, profile, name in zip(analytic.pools, profiles, names):
        cap, overcommit = p.max_num_seqs, False
        if engine.kv == "paged":
            slots = int(profile.n_slots(p.max_tokens))
            tpot_capped = p.max_num_seqs < slots        # a deliberate engine setting of the plan: it stays a bound
            cap = engine.max_num_seqs or VLLM_DEFAULT_MAX_NUM_SEQS
            cap = min(cap, p.max_num_seqs) if tpot_capped else cap
            overcommit = True
        kw = {} if engine.max_batched_tokens is None else {"max_batched_tokens": int(engine.max_batched_tokens)}
        out.append(SimPool(name, profile, p.replicas, int(cap), p.max_tokens, allow_overcommit=overcommit, **kw))
    return out


def sample_up(pools: list[SimPool], availability: list[float], rng: np.random.Generator
              ) -> tuple[list[SimPool], np.ndarray]:
    """Replicas up per pool, drawn from :math:`\\mathrm{Binomial}(N_k, A_k)` for the pools with :math:`A_k < 1`.

    The draws come from a child of ``rng`` (``rng.spawn``), which leaves ``rng``'s own stream untouched: the
    requests and the routers' draws are those of an all-up run, and with every :math:`A_k = 1` the run is
    the all-up run. Returns the pools with their up replicas (a pool with none keeps one, unused: its
    requests are rejected by :class:`DownPoolsRouter`) and the up counts.
    """
    n = np.array([p.replicas for p in pools], dtype=np.int64)
    a = np.asarray(availability, dtype=float)
    up = n.copy()
    partial = np.flatnonzero(a < 1.0)
    if partial.size:
        up[partial] = rng.spawn(1)[0].binomial(n[partial], a[partial])
    return [replace(p, replicas=max(int(u), 1)) for p, u in zip(pools, up)], up


class DownPoolsRouter:
    """Wraps a router: requests it sends to a pool with no replica up are rejected (pool -1).

    ``intended`` keeps the wrapped router's choices, so a report can charge the lost requests to the pool
    that was down (``pool_names`` indices, -1 for none).
    """

    def __init__(self, router, down: list[str]) -> None:
        self.router = router
        self.pool_names = router.pool_names
        self._down = np.array([x in set(down) for x in router.pool_names] + [False])
        from fleetopt.solvers.des.routing import LiveRouter

        if isinstance(router, LiveRouter):      # spillover never spills into a pool that is down
            self.spill_to = tuple(-1 if t < 0 or self._down[t] else t for t in router.spill_to)
            self.spill_bound = router.spill_bound

    def __repr__(self) -> str:
        return f"DownPoolsRouter({self.router!r})"

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        k = np.asarray(self.router.route(prompt_tokens, output_tokens), dtype=np.int64)
        self.intended = k
        return np.where(self._down[k], -1, k)
