"""What a simulation run leaves: one record per request and the run's per-pool integrals.

:class:`SimResult` holds the per-request columns (numpy, read-only) and the
time integrals of a run of :func:`fleetopt.solvers.des.engine.simulate`;
:class:`RequestRecord` is one row of it, with a missing time or index as None;
:class:`Outcome` says how each request left the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum
from collections.abc import Iterator

import numpy as np

__all__ = ["Outcome", "RequestRecord", "SimResult"]


class Outcome(IntEnum):
    """How a request left the simulation (its record's ``outcome``)."""

    COMPLETED = 0
    UNFINISHED = 1
    REJECTED = 2


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request's record (a row of :class:`SimResult`); a missing time or index is None."""

    request_id: int
    pool: int | None
    replica: int | None
    arrival_at_s: float
    start_at_s: float | None
    first_token_at_s: float | None
    end_at_s: float | None
    outcome: Outcome


@dataclass(frozen=True, eq=False)
class SimResult:
    """What a run produced: per-request columns plus per-pool and per-replica integrals.

    Request columns (length = number of requests, in input order): ``arrival_at_s``,
    ``start_at_s`` (admitted to a slot or batch), ``first_token_at_s``, ``end_at_s``
    (NaN when unknown), ``prompt_tokens``, ``output_tokens``, ``pool`` (router's
    choice, or the pool a live router spilled the request to; -1 none), ``replica``
    (global index, -1 none) and ``outcome`` (:class:`Outcome` codes). Time integrals
    cover ``[window_start_s, window_end_s]``.
    """

    mode: str
    pool_names: tuple[str, ...]
    arrival_at_s: np.ndarray
    start_at_s: np.ndarray
    first_token_at_s: np.ndarray
    end_at_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    pool: np.ndarray
    replica: np.ndarray
    outcome: np.ndarray
    window_start_s: float
    window_end_s: float
    pool_mean_in_system: np.ndarray
    """Time-average number of requests in each pool (waiting or served)."""
    pool_busy_slot_s: np.ndarray
    """Slot-seconds in use per pool (integral of the running sequences)."""
    pool_slots: np.ndarray
    """Slots per pool: replicas x max_num_seqs."""
    replica_pool: np.ndarray
    replica_mean_batch: np.ndarray
    """Time-average running sequences (batch) of each replica."""
    replica_energy_j: np.ndarray
    """:math:`\\int P(b(t))\\,dt` of each replica over the window, in joules."""
    events: int
    """Events handled (arrivals plus heap events, stale ones included)."""
    preemptions: np.ndarray
    """KV-cache preemptions per pool (iteration mode; 0 unless a pool is overcommitted)."""
    replica_preemptions: np.ndarray
    """KV-cache preemptions per replica."""
    spilled: np.ndarray
    """Requests spilled out of each pool by a live router (module docstring, "Live routing"); zeros without one."""

    @property
    def window_s(self) -> float:
        return self.window_end_s - self.window_start_s

    def count(self, outcome: Outcome) -> int:
        return int(np.count_nonzero(self.outcome == outcome))

    @property
    def pool_utilization(self) -> np.ndarray:
        """Busy slot-seconds over slot-seconds available, per pool."""
        return self.pool_busy_slot_s / (self.pool_slots * self.window_s)

    @property
    def pool_mean_batch(self) -> np.ndarray:
        """Mean over a pool's replicas of their time-average batch."""
        return np.bincount(self.replica_pool, self.replica_mean_batch, len(self.pool_names)) / np.bincount(
            self.replica_pool, minlength=len(self.pool_names))

    @property
    def pool_mean_power_w(self) -> np.ndarray:
        """Time-average power of each pool (sum over its replicas), in watts."""
        return np.bincount(self.replica_pool, self.replica_energy_j, len(self.pool_names)) / self.window_s

    def record(self, i: int) -> RequestRecord:
        """Request ``i`` as a :class:`RequestRecord` (NaN and -1 become None)."""
        def opt(x):
            return None if math.isnan(x) else float(x)
        return RequestRecord(int(i), None if self.pool[i] < 0 else int(self.pool[i]),
                             None if self.replica[i] < 0 else int(self.replica[i]), float(self.arrival_at_s[i]),
                             opt(self.start_at_s[i]), opt(self.first_token_at_s[i]), opt(self.end_at_s[i]),
                             Outcome(int(self.outcome[i])))

    def records(self) -> Iterator[RequestRecord]:
        return (self.record(i) for i in range(len(self.arrival_at_s)))
