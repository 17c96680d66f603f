"""Configuration and run-time state of the simulator.

:class:`SimPool` is a pool's configuration (frozen, validated when built);
:class:`_State` is the run-time state that every station shares (heap, record
columns, time integrals). The iteration-mode station's own per-replica state is
documented on :class:`fleetopt.solvers.des.engine.IterationStation`. Keeping
these here lets the engine and the stations import them without importing each
other.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, cast

import numpy as np

from fleetopt.models.power import ActivityPower
from fleetopt.models.profiles import ServingProfile
from fleetopt.solvers.des.records import Outcome, SimResult

if TYPE_CHECKING:
    from fleetopt.solvers.des.routing import Requests

__all__ = ["MODES", "QUEUES", "EventKind", "SimPool", "CapChange"]

MODES = ("slot", "iteration")
QUEUES = ("pool", "replica")


class EventKind(IntEnum):
    """Kinds of events. ``ARRIVAL`` is merged from the sorted arrival stream and never sits on the heap."""

    ARRIVAL = 0
    SLOT_FREED = 1   # slot mode: target is the request whose service ends
    BOUNDARY = 2     # iteration mode: target is the replica reaching its next event boundary
    CAP_CHANGE = 3   # target is the index of a CapChange in the run's schedule


@dataclass(frozen=True)
class SimPool:
    """A pool of identical replicas (configuration only; the run keeps its state elsewhere).

    Parameters
    ----------
    name : str
        Unique pool name (routers address pools by name).
    profile : ServingProfile
        What one replica can do (:mod:`fleetopt.models.profiles`).
    replicas : int
        Number of replicas, >= 1.
    max_num_seqs : int or None
        Batch cap per replica (slots in slot mode); None means
        ``profile.n_slots(window_tokens)``. Must not exceed that unless
        ``allow_overcommit``.
    window_tokens : int
        Context window: requests with :math:`l_{in} + l_{out}` above it are rejected.
    allow_overcommit : bool
        Allow ``max_num_seqs`` above ``profile.n_slots(window_tokens)``
        (iteration mode only): the replica's KV blocks can then run out and
        sequences are preempted (:mod:`fleetopt.solvers.des.kv`).
    max_batched_tokens : int or None
        Tokens one iteration of a replica may process in all (vLLM's
        ``max_num_batched_tokens``), a whole number >= ``max_num_seqs``; None
        (the default) puts no limit beyond the chunk :math:`c` per prefilling
        sequence (module docstring, "Token budget"). Iteration mode only, and
        not with an overcommitted pool.
    """

    name: str
    profile: ServingProfile
    replicas: int
    max_num_seqs: int | None
    window_tokens: int
    allow_overcommit: bool = False
    max_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"pool name must be a non-empty string; got {self.name!r}")
        if not isinstance(self.profile, ServingProfile):
            raise ValueError(f"pool {self.name}: profile must be a ServingProfile; got {type(self.profile).__name__}")
        if int(self.replicas) != self.replicas or self.replicas < 1:
            raise ValueError(f"pool {self.name}: replicas must be a whole number >= 1; got {self.replicas}")
        if int(self.window_tokens) != self.window_tokens or self.window_tokens < 1:
            raise ValueError(f"pool {self.name}: window_tokens must be a whole number >= 1; got {self.window_tokens}")
        slots = int(self.profile.n_slots(int(self.window_tokens)))
        if slots < 1:
            raise ValueError(f"pool {self.name}: a {self.window_tokens}-token window does not fit one sequence "
                             f"in the KV cache of {self.profile.name}")
        cap = slots if self.max_num_seqs is None else self.max_num_seqs
        if self.allow_overcommit and int(cap) == cap and cap > slots \
                and getattr(self.profile, "total_kv_blocks", None) is None:
            raise ValueError(f"pool {self.name}: allow_overcommit needs a profile with total_kv_blocks")
        if int(cap) != cap or not 1 <= cap <= (cap if self.allow_overcommit else slots):
            raise ValueError(f"pool {self.name}: max_num_seqs must be a whole number in [1, {slots}] "
                             f"(sequences {self.profile.name} holds at {self.window_tokens} tokens); got {cap}")
        object.__setattr__(self, "replicas", int(self.replicas))
        object.__setattr__(self, "window_tokens", int(self.window_tokens))
        object.__setattr__(self, "max_num_seqs", int(cap))
        object.__setattr__(self, "allow_overcommit", bool(self.allow_overcommit))
        budget = self.max_batched_tokens
        if budget is not None:
            if isinstance(budget, bool) or int(budget) != budget or budget < cap:
                raise ValueError(f"pool {self.name}: max_batched_tokens must be a whole number >= max_num_seqs "
                                 f"({int(cap)}), so decodes never stall; got {budget!r}")
            if self.overcommitted:
                raise ValueError(f"pool {self.name}: max_batched_tokens is not supported on an overcommitted pool "
                                 f"(max_num_seqs {int(cap)} above {slots} slots): its KV-block events assume "
                                 f"prefill steps of chunk_tokens")
            object.__setattr__(self, "max_batched_tokens", int(budget))

    @property
    def overcommitted(self) -> bool:
        """True when ``max_num_seqs`` sequences at the full window need more KV blocks than a replica has."""
        return cast(int, self.max_num_seqs) > int(self.profile.n_slots(self.window_tokens))

    @property
    def budget_binds(self) -> bool:
        """True when ``max_batched_tokens`` can limit an iteration: it is below ``max_num_seqs`` x ``chunk_tokens``."""
        budget = self.max_batched_tokens
        return budget is not None and budget < cast(int, self.max_num_seqs) * int(self.profile.chunk_tokens)


@dataclass(frozen=True)
class CapChange:
    """At ``at_s`` the batch cap of every replica of pool ``pool`` becomes ``max_num_seqs``
    (:func:`fleetopt.solvers.des.engine.simulate`, module docstring "Cap changes").

    Parameters
    ----------
    at_s : float
        Instant of the change, finite and >= 0.
    pool : str
        Name of a pool of the run.
    max_num_seqs : int
        The new cap, a whole number in [1, the pool's ``max_num_seqs``] (the pool's configured cap is the
        most a change may restore: its power table and slot count are sized by it).
    """

    at_s: float
    pool: str
    max_num_seqs: int

    def __post_init__(self) -> None:
        if not (isinstance(self.at_s, (int, float)) and math.isfinite(self.at_s) and self.at_s >= 0):
            raise ValueError(f"cap change of pool {self.pool!r}: at_s must be finite and >= 0; got {self.at_s!r}")
        n = self.max_num_seqs
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"cap change of pool {self.pool!r}: max_num_seqs must be a whole number >= 1; got {n!r}")
        object.__setattr__(self, "at_s", float(self.at_s))
        object.__setattr__(self, "max_num_seqs", int(n))


class _State:
    """Run-time state shared by both modes: the heap, the record columns and the time integrals."""

    def __init__(self, pools: list[SimPool], n: int, lo_s: float, hi_s: float) -> None:
        self.heap: list = []
        self.counter = itertools.count()
        # Record columns as numpy arrays, written in place through memoryviews (Python floats and ints
        # in, no per-request Python objects kept for the whole run).
        self.start_at = np.full(n, math.nan)
        self.first_at = np.full(n, math.nan)
        self.end_at = np.full(n, math.nan)
        self.replica = np.full(n, -1, dtype=np.int64)
        # the views of float64 columns hold floats (typeshed's memoryview defaults to int items)
        self.start, self.first, self.end = (cast("memoryview[float]", a.data)
                                            for a in (self.start_at, self.first_at, self.end_at))
        self.rep = self.replica.data
        self.ranges, self.replica_pool, self.cap, self.power = [], [], [], []
        r = 0
        caps = [cast(int, p.max_num_seqs) for p in pools]        # ints once the pools are built
        for k, p in enumerate(pools):
            self.ranges.append(range(r, r + p.replicas))
            power = p.profile.power
            if isinstance(power, ActivityPower):     # busy energy is credited per iteration by the engine
                table = [float(power.idle_w)] + [0.0] * caps[k]
            else:
                table = np.asarray(power.power_w(np.arange(caps[k] + 1)), dtype=float).tolist()
            for _ in range(p.replicas):
                self.replica_pool.append(k)
                self.cap.append(caps[k])
                self.power.append(table)
            r += p.replicas
        R, P = r, len(pools)
        self.lo_s, self.hi_s = lo_s, hi_s
        self.batch = [0] * R                         # running sequences (busy slots) per replica
        self.outstanding = [0] * R                   # running plus waiting, for dispatch
        self.batch_last = [lo_s] * R
        self.batch_area = [0.0] * R
        self.energy = [0.0] * R
        self.in_system = [0] * P
        self.system_last = [lo_s] * P
        self.system_area = [0.0] * P
        self.slots = [p.replicas * c for p, c in zip(pools, caps, strict=True)]
        self.preempt = [0] * R                       # KV-cache preemptions per replica
        self.spilled = [0] * P                       # requests a live router moved out of each pool
        self.finish = []                             # the stations' end-of-run hooks, called with the end instant
        self.batch_to, self.system_to = _integrators(self)

    def result(self, mode, names, requests: Requests, pool_of, accepted, end_s: float, events: int) -> SimResult:
        for r in range(len(self.batch)):
            self.batch_to(r, end_s)
        for p in range(len(names)):
            self.system_to(p, end_s, 0)
        for v in (self.start, self.first, self.end, self.rep):
            v.release()
        start, first, end = cols = (self.start_at, self.first_at, self.end_at)
        if end_s < math.inf:
            for c in cols:
                c[c > end_s] = math.nan
        outcome = np.where(~accepted, Outcome.REJECTED,
                           np.where(np.isfinite(end), Outcome.COMPLETED, Outcome.UNFINISHED)).astype(np.int8)
        window = end_s - self.lo_s
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_in_system = np.array(self.system_area) / window
            mean_batch = np.array(self.batch_area) / window
        columns = (requests.arrival_at_s.copy(), start, first, end, requests.prompt_tokens.copy(),
                   requests.output_tokens.copy(), pool_of, self.replica, outcome)
        pools = (mean_in_system, np.bincount(self.replica_pool, self.batch_area, len(names)),
                 np.array(self.slots, dtype=np.int64), np.array(self.replica_pool, dtype=np.int64),
                 mean_batch, np.array(self.energy))
        for a in columns + pools:
            a.flags.writeable = False
        rp = np.array(self.preempt, dtype=np.int64)
        pre = (np.bincount(self.replica_pool, rp, len(names)).astype(np.int64), rp,
               np.array(self.spilled, dtype=np.int64))
        for a in pre:
            a.flags.writeable = False
        return SimResult(mode, names, *columns, self.lo_s, end_s, *pools, events, *pre)


def _integrators(st: _State):
    """``batch_to(r, t)``: integrate replica ``r``'s batch and power up to instant ``t``; ``system_to(p, t, delta)``:
    integrate pool ``p``'s number in system up to ``t``, then change it by ``delta``; both clip ``t`` to the
    window ``[lo_s, hi_s]``.

    Closures over the state's lists rather than methods: every arrival and event calls them, and a closure's
    reads of its free variables are cheaper than attribute reads through ``self``.
    """
    lo_s, hi_s = st.lo_s, st.hi_s
    batch, batch_last, batch_area, energy, power = st.batch, st.batch_last, st.batch_area, st.energy, st.power
    in_system, system_last, system_area = st.in_system, st.system_last, st.system_area

    def batch_to(r: int, t: float) -> None:
        t = lo_s if t < lo_s else (hi_s if t > hi_s else t)
        dt = t - batch_last[r]
        if dt > 0:
            b = batch[r]
            batch_area[r] += b * dt
            energy[r] += power[r][b] * dt
            batch_last[r] = t

    def system_to(p: int, t: float, delta: int) -> None:
        t = lo_s if t < lo_s else (hi_s if t > hi_s else t)
        dt = t - system_last[p]
        if dt > 0:
            system_area[p] += in_system[p] * dt
            system_last[p] = t
        in_system[p] += delta

    return batch_to, system_to
