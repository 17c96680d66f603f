"""Analytic evaluation of user-given fleets against an instance (``fleetopt evaluate``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetopt.models.fleet import FleetResult, PoolPlan, ServiceLevel, evaluate_fleet
from fleetopt.models.service import ContextPoint, context_point

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance

__all__ = ["FleetSpec", "parse_fleet", "fleet_spec", "evaluate", "evaluate_plans", "baseline", "service_level", "Evaluation", "context_sweep"]

_POOL_RE = re.compile(r"^\s*(?P<lo>\d+[kK]?)\s*-\s*(?P<hi>\d+[kK]?)\s*:\s*(?P<gpu>[A-Za-z0-9_.\-/]+?)"
                      r"(?:\s*[xX]\s*(?P<n>\d+))?(?:\s*@\s*(?P<gamma>\d+(?:\.\d+)?))?(?:\s*#\s*(?P<seqs>\d+))?\s*$")


MAX_FLEET_REPLICAS = 100_000
"""Largest replica count a ``--fleet`` pool may ask for (far beyond any fleet; keeps typos out of the simulator)."""


@dataclass(frozen=True)
class FleetSpec:
    """A fleet as the user wrote it: ``(lo, hi, gpu name, replicas or None, compression factor, batch cap or None)``
    per pool."""

    text: str
    pools: tuple[tuple[int, int, str, int | None, float, int | None], ...]


def _tokens(s: str) -> int:
    return int(s[:-1]) * 1024 if s[-1] in "kK" else int(s)


def parse_fleet(text: str, instance: Instance, field: str = "--fleet") -> FleetSpec:
    """Parse ``"0-4096:a100x3@2,4096-65536:a100#24"`` (``4k`` = 4,096; no ``xN`` = size to the minimum;
    ``@g`` = compress-and-route: the pool also takes requests up to g x its window; ``#s`` = batch cap
    ``max_num_seqs`` per replica, at most the sequences the window holds; default: all of them, or the
    largest meeting a TPOT SLO).

    The pools must tile ``(0, max_context]`` in order and name GPUs of the instance.
    """
    pools, problems = [], []
    for part in [p for p in text.split(",") if p.strip()]:
        m = _POOL_RE.match(part)
        if not m:
            problems.append(f"'{part.strip()}' is not LO-HI:GPU[xN][@GAMMA][#SEQS] (e.g. 0-4096:a100x3 or "
                            "0-4096:a100@2)")
            continue
        n = None if m["n"] is None else int(m["n"])
        gamma = 1.0 if m["gamma"] is None else float(m["gamma"])
        seqs = None if m["seqs"] is None else int(m["seqs"])
        pools.append((_tokens(m["lo"]), _tokens(m["hi"]), m["gpu"], n, gamma, seqs))
    known = {g.name.lower(): g.name for g in instance.gpus}
    expected = 0
    for k, (lo, hi, gpu, n, gamma, seqs) in enumerate(pools):
        if gpu.lower() not in known:
            problems.append(f"unknown gpu '{gpu}'; the instance defines: {', '.join(known.values())}")
        elif seqs is not None and hi > lo and not 1 <= seqs <= int(instance.gpu(known[gpu.lower()]).profile.n_slots(hi)):
            held = int(instance.gpu(known[gpu.lower()]).profile.n_slots(hi))
            problems.append(f"pool {lo}-{hi}#{seqs}: the batch cap must lie in [1, {held}] (sequences a "
                            f"{hi}-token window holds on {known[gpu.lower()]})")
        if lo != expected:
            problems.append(f"pool {lo}-{hi} should start at {expected} (pools tile 0..max_context in order)")
        if hi <= lo:
            problems.append(f"pool {lo}-{hi} is empty")
        if n is not None and n < 1:
            problems.append(f"pool {lo}-{hi} needs at least one replica")
        elif n is not None and n > MAX_FLEET_REPLICAS:
            problems.append(f"pool {lo}-{hi}: replicas must lie in [1, {MAX_FLEET_REPLICAS:,}]; got {n}")
        if gamma < 1:
            problems.append(f"pool {lo}-{hi}: compression factor {gamma:g} must be >= 1")
        elif gamma > 1 and (k == len(pools) - 1 or gamma * hi > pools[k + 1][1]):
            problems.append(f"pool {lo}-{hi}@{gamma:g}: the band up to {gamma * hi:g} tokens must end within the "
                            "next pool")
        expected = hi
    if pools and expected != instance.pools.max_context_tokens and not problems:
        problems.append(f"the last pool ends at {expected}, but pools.max_context is "
                        f"{instance.pools.max_context_tokens}")
    if not pools and not problems:
        problems.append("no pool given")
    if problems:
        raise InstanceError([f"{field}: {p}" for p in problems])
    return FleetSpec(text, tuple((lo, hi, known[g.lower()], n, gm, sq) for lo, hi, g, n, gm, sq in pools))


def fleet_spec(instance: Instance, fleet: FleetResult, replicas=None) -> str | None:
    """The ``--fleet`` spec of an evaluated fleet (the inverse of :func:`parse_fleet`): every pool with its
    replicas (or ``replicas[k]`` when given), its compression factor if any and its batch cap when below the
    sequences its window holds. None when the pools do not tile ``(0, max_context]`` (a split-routing plan)."""
    parts, expected = [], 0
    counts = [p.replicas for p in fleet.pools] if replicas is None else list(replicas)
    for p, n in zip(fleet.pools, counts):
        if p.min_tokens != expected:
            return None
        expected = p.max_tokens
        cap = "" if p.max_num_seqs >= int(instance.gpu(p.gpu).profile.n_slots(p.max_tokens)) else f"#{p.max_num_seqs}"
        gamma = f"@{p.compress_gamma:g}" if p.compress_gamma > 1 else ""
        parts.append(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{n}{gamma}{cap}")
    return ",".join(parts) if parts and expected == instance.pools.max_context_tokens else None


def service_level(instance: Instance) -> ServiceLevel:
    return ServiceLevel(instance.slo.ttft_p99_s, instance.slo.ttft_model, instance.constraints.max_utilization,
                        instance.slo.scope, instance.slo.tpot_p99_s)


def _run(instance: Instance, pools: list[PoolPlan]) -> FleetResult:
    w = instance.workload
    return evaluate_fleet(pools, w.lengths, w.arrival_rate_req_per_s, service_level(instance), w.input_fraction,
                          instance.pools.compress_success)


def _plan(instance: Instance, lo: int, hi: int, gpu: str, n: int | None, gamma: float = 1.0,
          seqs: int | None = None) -> PoolPlan:
    g = instance.gpu(gpu)
    return PoolPlan(lo, hi, g.name, g.profile, n, g.availability, gamma, seqs)


@dataclass(frozen=True)
class Evaluation:
    fleet: FleetSpec
    result: FleetResult


def evaluate_plans(instance: Instance, pools: list[PoolPlan]) -> FleetResult:
    """Exact analytic evaluation of pools (with or without fixed counts) under the instance's SLO."""
    return _run(instance, pools)


def evaluate(instance: Instance, fleet: FleetSpec) -> Evaluation:
    """Evaluate one fleet analytically (pools without a count are sized to their minimum)."""
    return Evaluation(fleet, _run(instance, [_plan(instance, *p) for p in fleet.pools]))


def baseline(instance: Instance) -> FleetResult | None:
    """The cheapest homogeneous fleet: one pool ``(0, max_context]`` on one GPU option, sized to its minimum.

    Feasible options win over infeasible ones; returns None if no GPU holds the context window.
    """
    top = instance.pools.max_context_tokens
    best = None
    for g in instance.gpus:
        if int(g.profile.n_slots(top)) < 1:
            continue
        r = _run(instance, [PoolPlan(0, top, g.name, g.profile, None, g.availability)])
        key = (not r.feasible, r.cost_per_hr)
        if best is None or key < best[0]:
            best = (key, r)
    return None if best is None else best[1]


def context_sweep(profiles, contexts) -> list[ContextPoint]:
    """The 1/W-law table: each profile at full concurrency for each context window."""
    return [context_point(p, int(c)) for p in profiles for c in contexts]
