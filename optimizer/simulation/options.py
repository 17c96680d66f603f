r"""How ``fleetopt simulate`` configures the engine of each pool: KV admission and replica availability.

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

from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.fleet import FleetResult
from fleetopt.solvers.des.state import SimPool
from fleetopt.solvers.des.routing import LiveRouter

__all__ = ["KV_MODES", "AVAILABILITY_MODES", "VLLM_DEFAULT_MAX_NUM_SEQS", "EngineOptions", "engine_pools",
           "sample_up", "DownPoolsRouter"]

KV_MODES = ("reserve", "paged")
AVAILABILITY_MODES = ("all-up", "sampled")
VLLM_DEFAULT_MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``, the per-replica batch cap of ``kv="paged"`` unless given."""
DEFAULT_SPILL_BOUND = 8
"""``router="spillover"``: requests waiting in a pool beyond which an arrival spills to the next pool up
(``spill_bound=None`` in :func:`fleetopt.optimizer.simulation.simulate.simulate_plan`)."""


@dataclass(frozen=True)
class EngineOptions:
    """Engine settings of a simulation (module docstring); the defaults are the analytic model's view."""

    kv: str = "reserve"
    max_num_seqs: int | None = None
    """``kv="paged"``: per-replica batch cap (None: :data:`VLLM_DEFAULT_MAX_NUM_SEQS`); a plan's TPOT cap bounds it."""
    max_batched_tokens: int | None = None
    """Per-iteration token budget per replica (vLLM's ``max_num_batched_tokens``); None: no budget."""
    availability: str = "all-up"

    def problems(self, mode: str) -> list[str]:
        """One line per bad setting (``mode`` is the simulator's service mode)."""
        out = []
        if self.kv not in KV_MODES:
            out.append(f"--kv: {self.kv!r} is not one of {', '.join(KV_MODES)}")
        if self.availability not in AVAILABILITY_MODES:
            out.append(f"--availability: {self.availability!r} is not one of {', '.join(AVAILABILITY_MODES)}")
        for name, value in (("max-num-seqs", self.max_num_seqs), ("max-batched-tokens", self.max_batched_tokens)):
            if value is not None and not (isinstance(value, (int, np.integer)) and 1 <= value <= 1 << 30):
                out.append(f"--{name}: {value!r} must be a whole number >= 1")
        if self.max_num_seqs is not None and self.kv != "paged":
            out.append("--max-num-seqs: sets the batch cap of --kv paged; the reserve view uses the analytic cap")
        if self.kv == "paged" and self.max_batched_tokens is not None:
            out.append("--max-batched-tokens: not supported with --kv paged yet (the simulator's KV-block events "
                       "assume whole prefill chunks)")
        if mode == "slot" and (self.kv == "paged" or self.max_batched_tokens is not None):
            out.append("--mode: slot mode has no iterations or KV blocks; --kv paged and --max-batched-tokens "
                       "need --mode iteration")
        return out

    def to_json(self) -> dict:
        return {"kv": self.kv, "max_num_seqs": self.max_num_seqs, "max_batched_tokens": self.max_batched_tokens,
                "availability": self.availability}


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
        if isinstance(router, LiveRouter):      # spillover never spills into a pool that is down
            self.spill_to = tuple(-1 if t < 0 or self._down[t] else t for t in router.spill_to)
            self.spill_bound = router.spill_bound

    def __repr__(self) -> str:
        return f"DownPoolsRouter({self.router!r})"

    def route(self, prompt_tokens, output_tokens) -> np.ndarray:
        k = np.asarray(self.router.route(prompt_tokens, output_tokens), dtype=np.int64)
        self.intended = k
        return np.where(self._down[k], -1, k)
