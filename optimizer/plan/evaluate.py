"""Analytic evaluation of user-given fleets against an instance (``fleetopt evaluate``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fleetopt.models.fleet import FleetResult, PoolPlan, ServiceLevel, evaluate_fleet
from fleetopt.models.service import ContextPoint, context_point

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance

__all__ = ["FleetSpec", "parse_fleet", "spec_plans", "fleet_spec", "fleet_name_ambiguities", "evaluate",
           "evaluate_plans", "pool_plans_of", "baseline",
           "service_level", "Evaluation", "context_sweep", "limit_violations", "LIMIT_TOLERANCE"]

_POOL_RE = re.compile(r"^\s*(?P<lo>\d+[kK]?)\s*-\s*(?P<hi>\d+[kK]?)\s*:\s*(?P<gpu>[A-Za-z0-9_.\-/]+)"
                      r"(?:\s+[xX]\s*(?P<n>\d+)|\s*[xX]\s+(?P<n_spaced>\d+))?"
                      r"(?:\s*@\s*(?P<gamma>\d+(?:\.\d+)?))?(?:\s*#\s*(?P<seqs>\d+))?\s*$")
"""One pool of a ``--fleet`` spec. ``gpu`` is the word after the colon, up to a space or ``@``/``#``: an option
name, or an option name with its count glued on (``h100x3``), told apart by :func:`_gpu_and_count`. A count
written after a space (``h100 x3``, ``h100 x 3``, ``h100x 3``) is always a count: names hold no spaces."""

_NAME = r"[A-Za-z0-9_.\-/]+"
_COUNT = r"(?:\s+[xX]\s*(?P<{0}>\d+)|\s*[xX]\s+(?P<{0}_spaced>\d+))?"
_PAIR_RE = re.compile(r"^\s*(?P<lo>\d+[kK]?)\s*-\s*(?P<hi>\d+[kK]?)\s*:\s*(?P<gpu>" + _NAME + ")" + _COUNT.format("n")
                      + r"\s*\+\s*(?P<dgpu>" + _NAME + ")" + _COUNT.format("nd")
                      + r"(?:\s*#\s*(?P<seqs>\d+))?\s*$")
"""One disaggregated prefill/decode pair of a ``--fleet`` spec: ``LO-HI:PREFILL[xNp]+DECODE[xNd][#SEQS]`` (option
names hold no ``+``); a phase without a count is sized by its station, ``#SEQS`` is the decode pool's batch cap."""

_GLUED_COUNT_RE = re.compile(r"^(?P<name>.+)[xX](?P<n>\d+)$")
"""``NAMExN`` with no space: the last ``x`` followed by digits only, so ``h100x8x3`` is ``h100x8`` times 3."""


MAX_FLEET_REPLICAS = 100_000
"""Largest replica count a ``--fleet`` pool may ask for (far beyond any fleet; keeps typos out of the simulator)."""


@dataclass(frozen=True)
class FleetSpec:
    """A fleet as the user wrote it: ``(lo, hi, gpu name, replicas or None, compression factor, batch cap or None)``
    per pool; for a disaggregated prefill/decode pair the gpu and replicas are its prefill pool's and the batch cap
    its decode pool's, and ``decode`` holds ``(decode gpu name, replicas or None)`` at the pair's position (None
    for an aggregated pool; empty: no pair)."""

    text: str
    pools: tuple[tuple[int, int, str, int | None, float, int | None], ...]
    decode: tuple[tuple[str, int | None] | None, ...] = ()

    def decode_of(self, k: int) -> tuple[str, int | None] | None:
        """Pool ``k``'s decode pool ``(gpu, replicas or None)``, None for an aggregated pool."""
        return self.decode[k] if k < len(self.decode) else None


def _tokens(s: str) -> int:
    return int(s[:-1]) * 1024 if s[-1] in "kK" else int(s)


def _gpu_and_count(word: str, known: dict[str, str]) -> tuple[str, int | None]:
    """The GPU option and replica count of a spec word written without a space (``h100``, ``h100x3``).

    An option's exact name wins (case-insensitive): with an option named ``h100x8``, ``h100x8`` is that option
    (sized to its minimum) and ``h100x8x3`` is 3 replicas of it. Otherwise ``NAMExN`` is N replicas of ``NAME``.
    A word that is neither comes back whole (or split at its last ``xN``) for the caller to report as unknown.

    Examples
    --------
    >>> known = {"h100": "h100", "h100x8": "h100x8"}
    >>> _gpu_and_count("h100x8", known), _gpu_and_count("h100x8x3", known), _gpu_and_count("h100x3", known)
    (('h100x8', None), ('h100x8', 3), ('h100', 3))
    """
    if word.lower() in known:
        return word, None
    m = _GLUED_COUNT_RE.match(word)
    return (m["name"], int(m["n"])) if m else (word, None)


def _bad_count(word: str, known: dict[str, str]) -> tuple[str, str] | None:
    """``(name, count text)`` when ``word`` is a known option's name, an ``x`` and a count that is not a whole
    number (``a100x-1``, ``a100x1.5``, ``a100x``); None otherwise (the longest such name wins).

    Examples
    --------
    >>> _bad_count("a100x-1", {"a100": "a100"}), _bad_count("zz", {"a100": "a100"})
    (('a100', '-1'), None)
    """
    for i in range(len(word) - 1, 0, -1):
        if word[i] in "xX" and word[:i].lower() in known:
            return known[word[:i].lower()], word[i + 1:]
    return None


def _glued(gpu: str, n: int, known: dict[str, str]) -> str:
    """``gpu`` with ``n`` replicas as a spec writes it: ``h100x3``, or ``h100 x3`` (with a space) when
    ``h100x3`` is itself the name of an option (:func:`_gpu_and_count` would read it as that option)."""
    word = f"{gpu}x{n}"
    return f"{gpu} x{n}" if word.lower() in known else word


def fleet_name_ambiguities(instance: Instance) -> list[str]:
    """One line per GPU option whose name reads as another option's name with a glued count (``h100x8`` next
    to ``h100``): in a ``--fleet`` spec the exact name wins, and the line says how to write N replicas of the
    other option (with a space: ``h100 x8``). Empty when no name is ambiguous."""
    known = {g.name.lower(): g.name for g in instance.gpus}
    out = []
    for g in instance.gpus:
        m = _GLUED_COUNT_RE.match(g.name)
        if m and m["name"].lower() in known:
            other, n = known[m["name"].lower()], int(m["n"])
            out.append(f"gpus: option names {other!r} and {g.name!r}: in a --fleet spec '{g.name}' means the "
                       f"option {g.name} (sized to its minimum; '{g.name}x3' is 3 replicas of it); write "
                       f"'{other} x{n}' (with a space) for {n} replicas of {other}")
    return out


def parse_fleet(text: str, instance: Instance, field: str = "--fleet") -> FleetSpec:
    """Parse ``"0-4096:a100x3@2,4096-65536:a100#24"`` (``4k`` = 4,096; no ``xN`` = size to the minimum;
    ``@g`` = compress-and-route: the pool also takes requests up to g x its window; ``#s`` = batch cap
    ``max_num_seqs`` per replica, at most the sequences the window holds; default: all of them, or the
    largest meeting a TPOT SLO).

    A disaggregated prefill/decode pair is ``LO-HI:PREFILL[xN]+DECODE[xN][#SEQS]`` (``0-8192:a100x1+h100x3``; a
    phase without a count is sized by its station, ``#SEQS`` caps the decode batch): its prefill pool is the
    entry of ``pools``, its decode pool that of ``decode`` (:class:`FleetSpec`); the two options need a KV transfer
    in the instance (``pools.disaggregation`` allow or only, one model).

    The pools must tile ``(0, max_context]`` in order and name GPUs of the instance. A GPU option's exact name
    wins over a glued count (:func:`_gpu_and_count`: with options ``h100`` and ``h100x8``, ``h100x8`` is the
    option ``h100x8``); a count after a space (``h100 x8``) is always a count. ``docs/workflows.md`` (Fleet
    specs) has the grammar.
    """
    pools, decode, problems = [], [], []
    known = {g.name.lower(): g.name for g in instance.gpus}

    def word(m, name: str, count: str) -> tuple[str, int | None]:
        spaced = m[count] if m[count] is not None else m[f"{count}_spaced"]
        return (m[name], int(spaced)) if spaced is not None else _gpu_and_count(m[name], known)

    for part in [p for p in text.split(",") if p.strip()]:
        m = _POOL_RE.match(part)
        pair = _PAIR_RE.match(part) if m is None else None
        if not m and not pair:
            shown = part.strip()
            shown = repr(shown) if not shown.isprintable() else f"'{shown}'"     # one line, whatever was typed
            problems.append(f"{shown} is not LO-HI:GPU[xN][@GAMMA][#SEQS] (e.g. 0-4096:a100x3, 0-4096:a100 x3 "
                            "or 0-4096:a100@2) nor a prefill/decode pair LO-HI:PREFILL[xN]+DECODE[xN][#SEQS] (e.g. "
                            "0-8192:a100x1+h100x3)")
            continue
        if pair:
            gpu, n = word(pair, "gpu", "n")
            decode.append(word(pair, "dgpu", "nd"))
            gamma, seqs = 1.0, None if pair["seqs"] is None else int(pair["seqs"])
            m = pair
        else:
            assert m is not None
            spaced = m["n"] if m["n"] is not None else m["n_spaced"]
            gpu, n = (m["gpu"], int(spaced)) if spaced is not None else _gpu_and_count(m["gpu"], known)
            gamma = 1.0 if m["gamma"] is None else float(m["gamma"])
            seqs = None if m["seqs"] is None else int(m["seqs"])
            decode.append(None)
        pools.append((_tokens(m["lo"]), _tokens(m["hi"]), gpu, n, gamma, seqs))
    expected, top = 0, instance.pools.max_context_tokens

    def unknown(gpu: str, lo: int, hi: int) -> str:
        glued = _bad_count(gpu, known)
        return (f"unknown gpu '{gpu}'; the instance defines: {', '.join(known.values())}" if glued is None else
                f"pool {lo}-{hi}: the replica count {glued[1]!r} after '{glued[0]}x' is not a whole "
                f"number >= 1; write e.g. {glued[0]}x3")

    for k, (lo, hi, gpu, n, gamma, seqs) in enumerate(pools):
        dec = decode[k]
        batch_gpu = gpu if dec is None else dec[0]          # the pool whose batch #SEQS caps
        if hi > top:
            problems.append(f"pool {lo}-{hi} ends beyond pools.max_context ({top}); pools tile 0..{top}")
        if gpu.lower() not in known:
            problems.append(unknown(gpu, lo, hi))
        elif dec is not None and dec[0].lower() not in known:
            problems.append(unknown(dec[0], lo, hi))
        elif dec is not None and instance.pools.transfer(known[gpu.lower()], known[dec[0].lower()]) is None:
            problems.append(f"pool {lo}-{hi}: the P/D pair (prefill {known[gpu.lower()]}, decode "
                            f"{known[dec[0].lower()]}) has no KV transfer in this instance: set pools.disaggregation "
                            "to allow or only, with options of one model")
        elif seqs is not None and lo < hi <= top \
                and not 1 <= seqs <= int(instance.gpu(known[batch_gpu.lower()]).profile.n_slots(hi)):
            held = int(instance.gpu(known[batch_gpu.lower()]).profile.n_slots(hi))
            problems.append(f"pool {lo}-{hi}#{seqs}: the batch cap must lie in [1, {held}] (sequences a "
                            f"{hi}-token window holds on {known[batch_gpu.lower()]})")
        if dec is not None and dec[1] is not None and not 1 <= dec[1] <= MAX_FLEET_REPLICAS:
            problems.append(f"pool {lo}-{hi}: decode replicas must lie in [1, {MAX_FLEET_REPLICAS:,}]; got {dec[1]}")
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
    return FleetSpec(text, tuple((lo, hi, known[g.lower()], n, gm, sq) for lo, hi, g, n, gm, sq in pools),
                     tuple(None if d is None else (known[d[0].lower()], d[1]) for d in decode)
                     if any(d is not None for d in decode) else ())


def spec_plans(instance: Instance, spec: FleetSpec) -> list[PoolPlan]:
    """The :class:`~fleetopt.models.fleet.PoolPlan` of each pool of a parsed spec (a count left out: sized to its
    minimum); a pair's plan carries its :class:`~fleetopt.models.fleet.DecodeStage` and the instance's KV
    transfer of its two options."""
    from fleetopt.models.fleet import DecodeStage

    plans = []
    for k, (lo, hi, gpu, n, gamma, seqs) in enumerate(spec.pools):
        dec = spec.decode_of(k)
        if dec is None:
            plans.append(_plan(instance, lo, hi, gpu, n, gamma, seqs))
            continue
        g, dg = instance.gpu(gpu), instance.gpu(dec[0])
        plans.append(PoolPlan(lo, hi, g.name, g.profile, n, g.availability,
                              decode=DecodeStage(gpu=dg.name, profile=dg.profile, replicas=dec[1], max_num_seqs=seqs,
                                                 availability=dg.availability),
                              transfer=instance.pools.transfer(g.name, dg.name)))
    return plans


def fleet_spec(instance: Instance, fleet: FleetResult, replicas=None) -> str | None:
    """The ``--fleet`` spec of an evaluated fleet (the inverse of :func:`parse_fleet`): every pool with its
    replicas (or ``replicas[k]`` when given), its compression factor if any and its batch cap when below the
    sequences its window holds. None when the pools do not tile ``(0, max_context]`` (a split-routing plan)."""
    parts, expected = [], 0
    known = {g.name.lower(): g.name for g in instance.gpus}
    rows = list(fleet.pools)
    counts = [p.replicas for p in rows] if replicas is None else list(replicas)
    k = 0
    while k < len(rows):
        p, n = rows[k], counts[k]
        if p.min_tokens != expected:
            return None
        expected = p.max_tokens
        if getattr(p, "phase", "both") == "prefill" and k + 1 < len(rows) and rows[k + 1].phase == "decode":
            q, nd = rows[k + 1], counts[k + 1]
            held = int(instance.gpu(q.gpu).profile.n_slots(q.max_tokens))
            cap = "" if q.max_num_seqs >= held else f"#{q.max_num_seqs}"
            parts.append(f"{p.min_tokens}-{p.max_tokens}:{_glued(p.gpu, n, known)}+{_glued(q.gpu, nd, known)}{cap}")
            k += 2
            continue
        cap = "" if p.max_num_seqs >= int(instance.gpu(p.gpu).profile.n_slots(p.max_tokens)) else f"#{p.max_num_seqs}"
        gamma = f"@{p.compress_gamma:g}" if p.compress_gamma > 1 else ""
        parts.append(f"{p.min_tokens}-{p.max_tokens}:{_glued(p.gpu, n, known)}{gamma}{cap}")
        k += 1
    return ",".join(parts) if parts and expected == instance.pools.max_context_tokens else None


def service_level(instance: Instance) -> ServiceLevel:
    return ServiceLevel(instance.slo.ttft_p99_s, instance.slo.ttft_model, instance.constraints.max_utilization,
                        instance.slo.scope, instance.slo.tpot_p99_s, instance.slo.ttft_margin)


def _run(instance: Instance, pools: list[PoolPlan], fleet_p99: bool = True) -> FleetResult:
    w = instance.workload
    return evaluate_fleet(pools, w.lengths, w.arrival_rate_req_per_s, service_level(instance), w.input_fraction,
                          instance.pools.compress_success, fleet_p99)


def _plan(instance: Instance, lo: int, hi: int, gpu: str, n: int | None, gamma: float = 1.0,
          seqs: int | None = None) -> PoolPlan:
    g = instance.gpu(gpu)
    return PoolPlan(lo, hi, g.name, g.profile, n, g.availability, gamma, seqs)


@dataclass(frozen=True)
class Evaluation:
    fleet: FleetSpec
    result: FleetResult


def pool_plans_of(instance: Instance, pools) -> list[PoolPlan]:
    """The :class:`~fleetopt.models.fleet.PoolPlan` of each pool of an evaluated fleet (``FleetResult.pools``) at its
    counts and batch caps, to re-evaluate it: a disaggregated pair's two rows (``phase`` prefill, then decode) become
    one plan with its :class:`~fleetopt.models.fleet.DecodeStage` and the instance's KV transfer."""
    from fleetopt.models.fleet import DecodeStage

    plans, k = [], 0
    while k < len(pools):
        p = pools[k]
        g = instance.gpu(p.gpu)
        if p.phase == "prefill" and k + 1 < len(pools) and pools[k + 1].phase == "decode":
            q = pools[k + 1]
            dg = instance.gpu(q.gpu)
            plans.append(PoolPlan(p.min_tokens, p.max_tokens, g.name, g.profile, p.replicas, g.availability,
                                  decode=DecodeStage(gpu=dg.name, profile=dg.profile, replicas=q.replicas,
                                                     max_num_seqs=q.max_num_seqs, availability=dg.availability),
                                  transfer=instance.pools.transfer(g.name, dg.name)))
            k += 2
            continue
        plans.append(PoolPlan(p.min_tokens, p.max_tokens, g.name, g.profile, p.replicas, g.availability,
                              p.compress_gamma, p.max_num_seqs))
        k += 1
    return plans


def evaluate_plans(instance: Instance, pools: list[PoolPlan], fleet_p99: bool = True) -> FleetResult:
    """Exact analytic evaluation of pools (with or without fixed counts) under the instance's SLO (without
    ``fleet_p99``, the fleet-wide P99 is left NaN: :func:`fleetopt.models.fleet.evaluate_fleet`)."""
    return _run(instance, pools, fleet_p99)


def evaluate(instance: Instance, fleet: FleetSpec) -> Evaluation:
    """Evaluate one fleet analytically (pools without a count are sized to their minimum)."""
    return Evaluation(fleet, _run(instance, spec_plans(instance, fleet)))


LIMIT_TOLERANCE = 1e-9
"""Relative slack of :func:`limit_violations` on a real-valued cap (power, budget): round-off is no breach."""


def limit_violations(instance: Instance, fleet: FleetResult) -> tuple[str, ...]:
    """Every limit of ``instance`` that ``fleet`` breaks, one line each, starting with the instance field.

    The limits are those the solver enforces (:func:`fleetopt.optimizer.plan.solve.build_problem`), on the same
    quantities: per GPU option its physical GPUs against ``max_count`` / ``min_count`` and its pools against
    ``max_pools`` / ``min_pools``; the fleet's pools against ``pools.max_pools``; its GPUs, $/hr and kW against
    ``constraints.max_total_gpus`` / ``max_cost_per_hr`` / ``max_power_kw``; and each pool's capacity load
    against ``constraints.max_utilization`` (the analytic model's ``utilization_ok``). The TTFT SLO is not a
    limit here: ``fleet.slo_met`` says whether it is met. Empty: the fleet respects every limit.
    """
    out = []
    pools = fleet.pools
    # a disaggregated pair (a prefill row, then its decode row) is one pool of each inventory it uses, and one
    # pool of the fleet (the MIP's count)
    pair_of = [k - 1 if p.phase == "decode" and k > 0 else k for k, p in enumerate(pools)]
    for g in instance.gpu_inventories():     # a gpus entry: its limits bind the sum over its configurations
        mine = [p for p in pools if p.gpu in g.options]
        n_gpus = sum(p.gpus for p in mine)
        n_pools = len({pair_of[k] for k, p in enumerate(pools) if p.gpu in g.options})
        if g.max_count is not None and n_gpus > g.max_count:
            out.append(f"gpus.{g.name}.max_count: {n_gpus} GPUs of {g.name}, above its inventory of {g.max_count}")
        if g.min_count and n_gpus < g.min_count:
            out.append(f"gpus.{g.name}.min_count: {n_gpus} GPUs of {g.name}, below the committed {g.min_count}")
        if g.max_pools is not None and n_pools > g.max_pools:
            out.append(f"gpus.{g.name}.max_pools: {n_pools} pools on {g.name}, above the cap of {g.max_pools}")
        if g.min_pools and n_pools < g.min_pools:
            out.append(f"gpus.{g.name}.min_pools: {n_pools} pools on {g.name}, below the least of {g.min_pools}")
    n_fleet = len(set(pair_of))
    if n_fleet > instance.pools.max_pools:
        out.append(f"pools.max_pools: {n_fleet} pools, above the cap of {instance.pools.max_pools}")
    c = instance.constraints
    if c.max_total_gpus is not None and fleet.total_gpus > c.max_total_gpus:
        out.append(f"constraints.max_total_gpus: {fleet.total_gpus} GPUs, above the cap of {c.max_total_gpus}")
    if c.max_power_kw is not None and fleet.power_kw > c.max_power_kw * (1 + LIMIT_TOLERANCE):
        out.append(f"constraints.max_power_kw: {fleet.power_kw:,.2f} kW, above the cap of {c.max_power_kw:g} kW")
    if c.max_cost_per_hr is not None and fleet.cost_per_hr > c.max_cost_per_hr * (1 + LIMIT_TOLERANCE):
        out.append(f"constraints.max_cost_per_hr: ${fleet.cost_per_hr:,.2f}/hr, above the budget of "
                   f"${c.max_cost_per_hr:,.2f}/hr")
    for p in pools:
        if not p.utilization_ok:
            load = p.capacity_load if p.capacity_load == p.capacity_load else p.utilization
            out.append(f"constraints.max_utilization: pool {p.min_tokens:,}-{p.max_tokens:,} on {p.gpu} runs at "
                       f"{load:.3f} of its capacity, above {c.max_utilization:g}")
    return tuple(out)


def baseline(instance: Instance, losers: frozenset[str] = frozenset()) -> FleetResult | None:
    """The cheapest homogeneous fleet: one pool ``(0, max_context]`` on one GPU option, sized to its minimum.

    An option that meets the SLO within every limit of the instance (:func:`limit_violations`: inventory,
    GPU, power and budget caps, ...) wins over one that does not; among those that do not, one that meets the
    SLO wins, then the cheaper. So the result breaks a limit or misses the SLO only when every option does (the
    caller reports it as infeasible: see :func:`limit_violations`). None if no GPU holds the context window.
    ``losers``: options the caller knows another beats (a solve's bounded sizing left them unsized on the full
    range: :func:`fleetopt.optimizer.plan.solve.unsized_on_full_range`), not evaluated.
    """
    top = instance.pools.max_context_tokens
    best = None
    for g in instance.gpus:
        if int(g.profile.n_slots(top)) < 1 or g.name in losers:
            continue
        r = _run(instance, [PoolPlan(0, top, g.name, g.profile, None, g.availability)])
        key = (not (r.feasible and not limit_violations(instance, r)), not r.feasible, r.cost_per_hr)
        if best is None or key < best[0]:
            best = (key, r)
    return None if best is None else best[1]


def context_sweep(profiles, contexts) -> list[ContextPoint]:
    """The 1/W-law table: each profile at full concurrency for each context window."""
    return [context_point(p, int(c)) for p in profiles for c in contexts]
