"""Candidate disaggregated prefill/decode (P/D) pairs for the fleet MIP.

A pair candidate :math:`(i, j, g_p, g_d)` serves the requests of total length in :math:`(b_i, b_j]` (window
:math:`b_j`, no compression states) on a prefill pool of option :math:`g_p` and a decode pool of option
:math:`g_d` serving the same model (``profile.model_name``), joined by the instance's KV transfer
(``pools.kv_transfer``, :meth:`fleetopt.optimizer.io.instance.PoolsSpec.transfer`). The stations are those of
:mod:`fleetopt.models.queueing.disagg`:

* the prefill station is built and sized once per (segment, prefill option, transfer): the least :math:`N_p^*`
  with P99 TTFT (wait + prefill + transfer) within :math:`(1 - m) T_{SLO}` and :math:`\\rho \\le \\rho_{max}`
  (:meth:`~fleetopt.models.queueing.disagg.PrefillStation.min_replicas`);
* the decode station once per (segment, decode option): the least :math:`N_d^*` with :math:`\\bar b \\le
  \\rho_{max} n` and a slot wait for at most 1 % of requests, its batch cap within the TPOT SLO
  (:meth:`~fleetopt.models.queueing.disagg.DecodeStation.min_replicas`).

The phases share no resource, so a pair's least cost is the sum of the two least counts' prices and the pairs of
a segment are the outer sum of its prefill and decode columns (one numpy broadcast per segment). Each phase's count
is inflated for its own option's availability (:func:`fleetopt.models.fleet.inflate_for_availability`).

Pool-scope SLO: one choice per pair, :math:`(N_p^*, N_d^*)`, no misses counted. Fleet-scope SLO: choices over
:math:`N_p` from the utilisation floor up to where the prefill miss probability stops falling (at most
:data:`MAX_EXTRA_COUNTS` above it, the aggregated candidates' bound), each with its miss rate
:math:`\\lambda P(\\mathrm{TTFT} > T \\mid N_p)`
(:meth:`~fleetopt.models.queueing.disagg.PrefillStation.miss_probability`, at the sizing target
:math:`(1 - m) T`), the decode pool at its least count.

``pools.pd_sizing: reference`` sizes the one pair per (prefill, decode) option over the whole range
:math:`(0, b_M]` with the reference tool's throughput matching
(:func:`fleetopt.models.queueing.disagg.reference_disagg`: mean lengths, derates 0.90/0.92, TTFT = factor x
prefill): its counts reproduce the reference scenarios' Puzzle 7; cost and power are priced at those counts, and
the plan's analytic evaluation (fleetopt's own stations) says whether the pair meets the SLO under fleetopt's model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np

from fleetopt.models.fleet import inflate_for_availability
from fleetopt.models.queueing.disagg import (DecodeStation, DecodeStations, PhaseTraffic, PrefillStation,
                                             PrefillStations, reference_disagg, stack_distribution,
                                             stack_traffic)
from fleetopt.models.units import MS_PER_S, P99_TAIL
from fleetopt.models.workload import LengthDistribution, RequestTrace

from fleetopt.optimizer.io.instance import Instance

__all__ = ["PairColumns", "pair_candidates", "pair_label", "PAIR_NAME_SEPARATOR"]

PAIR_NAME_SEPARATOR = "+"
"""A pair's name in labels and keys: ``PREFILL+DECODE`` (option names hold no ``+``)."""

MAX_EXTRA_COUNTS = 64


def pair_label(prefill: str, decode: str) -> str:
    """``a100+h100``: the pair of prefill option ``a100`` and decode option ``h100``."""
    return f"{prefill}{PAIR_NAME_SEPARATOR}{decode}"


@dataclass(frozen=True)
class PairColumns:
    """Pair candidates as pool and choice columns (:class:`fleetopt.optimizer.plan.candidates.Candidates`' names),
    with the reasons of dropped pairs and what was sized.

    ``pools``: ``i``, ``j``, ``gpu`` (prefill option), ``decode_gpu``, ``decode_cap``, ``arrival_rate``,
    ``output_tok_per_s``, ``load_erlangs`` (the prefill's offered load), ``min_replicas`` (:math:`N_p^*`);
    ``choices``: ``pool`` (position in ``pools``), ``replicas`` (prefill, inflated), ``decode_replicas``
    (inflated), ``gpus`` (both phases), ``decode_gpus``, ``cost``, ``power``, ``miss``.
    """

    pools: dict
    choices: dict
    dropped: tuple
    """``(lo, hi, name, reason)`` per pair that no count serves."""
    generated: int
    prefill_stations: int
    decode_stations: int


def _traffic(instance: Instance, lo: float, hi: float, chunks) -> PhaseTraffic:
    w = instance.workload
    if isinstance(w.lengths, RequestTrace):
        return PhaseTraffic.from_trace(w.lengths, lo, hi, w.arrival_rate_req_per_s)
    return PhaseTraffic.from_distribution(w.lengths, lo, hi, w.arrival_rate_req_per_s,
                                          input_fraction=w.input_fraction, chunk_tokens=chunks)


def _stacked_traffic(instance: Instance, lo: np.ndarray, hi: np.ndarray, chunk: int):
    """The segments' laws as rows (:func:`~fleetopt.models.queueing.disagg.stack_traffic`)."""
    w = instance.workload
    if isinstance(w.lengths, RequestTrace):
        return stack_traffic([_traffic(instance, float(x), float(y), (chunk,)) for x, y in zip(lo, hi)])
    return stack_distribution(w.lengths, lo, hi, w.arrival_rate_req_per_s, input_fraction=w.input_fraction,
                              chunk_tokens=(chunk,))


def _pairs(instance: Instance) -> list[tuple[int, int]]:
    """(prefill option, decode option) indices with a KV transfer (same model)."""
    names = [g.name for g in instance.gpus]
    return [(a, b) for a in range(len(names)) for b in range(len(names))
            if instance.pools.transfer(names[a], names[b]) is not None]


def pair_candidates(instance: Instance, b: np.ndarray) -> PairColumns:
    """Every pair candidate of ``instance`` over boundaries ``b`` (see the module docstring).

    Vectorised over segments: each prefill option (per transfer) and each decode option is one
    :class:`~fleetopt.models.queueing.disagg.PrefillStations` / :class:`~fleetopt.models.queueing.disagg.DecodeStations`
    over all segments, sized in one call; the pairs of all segments are one broadcast of the two columns. The
    candidates and their order are those of sizing each station alone (segment by segment, pair by pair).
    """
    if instance.pools.pd_sizing == "reference":
        return _reference_pairs(instance, b)
    slo, rho = instance.slo, instance.constraints.max_utilization
    fleet = slo.scope == "fleet"
    total = instance.workload.arrival_rate_req_per_s
    opts = instance.gpus
    pairs = _pairs(instance)
    ii, jj = np.triu_indices(len(b), k=1)
    S = len(ii)
    if not pairs or not S:
        return PairColumns(_arrays({k: [] for k in _POOL_KEYS}), _arrays({k: [] for k in _CHOICE_KEYS}), (),
                           S * len(pairs), 0, 0)
    pre_opts = sorted({p for p, _ in pairs})
    dec_opts = sorted({d for _, d in pairs})
    chunks = sorted({int(opts[g].profile.chunk_tokens) for g in pre_opts})
    lo, hi = b[ii].astype(float), b[jj].astype(float)
    # one law per prefill chunk, cut at its multiples (as the analytic evaluation of a pair builds it); the decode
    # station reads only moments, exact on any of them
    stacks = {c: _stacked_traffic(instance, lo, hi, c) for c in chunks}
    lam0, prompt0, output0, probs0 = stacks[chunks[0]]
    dec = {}
    for d in dec_opts:
        st = DecodeStations.from_profile(opts[d].profile, lam0, prompt0, output0, probs0, window_tokens=hi,
                                         tpot_slo_s=slo.tpot_p99_s)
        z = st.min_replicas(rho_max=rho, wait_prob_max=P99_TAIL)
        nd = np.where(z.feasible, inflate_for_availability(z.replicas, opts[d].availability), 0)
        dec[d] = (st, z, nd, st.power_w(nd))
    pre: dict = {}
    for p, d in pairs:
        x = instance.pools.transfer(opts[p].name, opts[d].name)
        assert x is not None                                    # _pairs keeps the pairs with a transfer
        if (p, x) not in pre:
            lam, prompt, _, probs = stacks[int(opts[p].profile.chunk_tokens)]
            st = PrefillStations.from_profile(opts[p].profile, lam, prompt, probs, x)
            ns, miss, length, why = _prefill_counts(st, instance, fleet, total)
            npp = inflate_for_availability(ns, opts[p].availability)
            # the station's (segment x atom) arrays are dropped here: only per-segment columns are kept
            pre[(p, x)] = (st.offered_load_erlangs, ns, npp, miss, length, why,
                           np.asarray(st.power_w(npp), dtype=float))
    keys = [(p, d, pre[(p, instance.pools.transfer(opts[p].name, opts[d].name))]) for p, d in pairs]
    width = max(v[1].shape[1] for v in pre.values())
    ok = np.stack([(k[2][4] > 0) & dec[k[1]][1].feasible for k in keys], axis=1)          # [segment, pair]
    length = np.stack([np.where(ok[:, q], k[2][4], 0) for q, k in enumerate(keys)], axis=1)
    rows, cols = np.nonzero(ok)                                                            # pools, in order

    def per_pair(f, dtype: type = float) -> np.ndarray:
        """A pool field from each pair's columns, at the pools' (segment, pair) positions."""
        out = np.stack([np.asarray(f(p, d, v), dtype=dtype) for p, d, v in keys], axis=1)
        return out[rows, cols]

    pools = {"i": ii[rows], "j": jj[rows], "gpu": np.array([p for p, _, _ in keys])[cols],
             "decode_gpu": np.array([d for _, d, _ in keys])[cols],
             "decode_cap": per_pair(lambda p, d, v: dec[d][0].cap, np.int64), "arrival_rate": lam0[rows],
             "output_tok_per_s": per_pair(lambda p, d, v: dec[d][0].output_tok_per_s),
             "load_erlangs": per_pair(lambda p, d, v: v[0]),
             "min_replicas": per_pair(lambda p, d, v: v[1][:, 0], np.int64)}
    # choices: [pool, count] with the pool's first length[pool] counts valid, flattened pool by pool
    n_len = length[rows, cols]
    valid = np.arange(width)[None, :] < n_len[:, None]

    def per_choice(f) -> np.ndarray:
        out = np.stack([np.broadcast_to(np.asarray(f(p, d, v), dtype=float), (S, width)) for p, d, v in keys],
                       axis=1)
        return out[rows, cols][valid]

    def pad(a: np.ndarray) -> np.ndarray:
        return np.pad(a, ((0, 0), (0, width - a.shape[1])))

    npp = per_choice(lambda p, d, v: pad(v[2])).astype(np.int64)
    nd = per_choice(lambda p, d, v: dec[d][2][:, None]).astype(np.int64)
    gp = np.array([opts[p].profile.gpus_per_replica for p, _, _ in keys])[cols]
    gd = np.array([opts[d].profile.gpus_per_replica for _, d, _ in keys])[cols]
    cp = np.array([opts[p].profile.cost_usd_per_hr for p, _, _ in keys], dtype=float)[cols]
    cd = np.array([opts[d].profile.cost_usd_per_hr for _, d, _ in keys], dtype=float)[cols]
    k_of = np.broadcast_to(np.arange(len(rows))[:, None], valid.shape)[valid]
    choices = {"pool": k_of, "replicas": npp, "decode_replicas": nd,
               "gpus": npp * gp[k_of] + nd * gd[k_of], "decode_gpus": nd * gd[k_of],
               "cost": npp * cp[k_of] + nd * cd[k_of],
               "power": per_choice(lambda p, d, v: pad(v[6]) + dec[d][3][:, None]),
               "miss": per_choice(lambda p, d, v: lam0[:, None] * pad(v[3]))}
    dropped = []
    reasons: dict = {}                      # a prefill station's reason, once for all the pairs that share it
    for r, q in zip(*np.nonzero(~ok)):
        p, d, v = keys[q]
        name = pair_label(opts[p].name, opts[d].name)
        if not v[4][r]:
            key = (id(v), int(r))
            if key not in reasons:
                reasons[key] = v[5](int(r))
            why = reasons[key]
        else:
            why = _decode_reason(dec[d][0], int(r), str(dec[d][1].reason[r]), instance)
        dropped.append((int(lo[r]), int(hi[r]), name, why))
    return PairColumns(pools, choices, tuple(dropped), S * len(pairs), S * len(pre), S * len(dec_opts))


_POOL_KEYS = ("i", "j", "gpu", "decode_gpu", "decode_cap", "arrival_rate", "output_tok_per_s", "load_erlangs",
              "min_replicas")
_CHOICE_KEYS = ("pool", "replicas", "decode_replicas", "gpus", "decode_gpus", "cost", "power", "miss")


def _arrays(cols: dict, concat: bool = False) -> dict:
    if concat:
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    return {k: np.asarray(v) if v else np.zeros(0) for k, v in cols.items()}


_MISS_BLOCK = 1 << 22
"""Atoms x counts x segments the fleet-scope miss probabilities evaluate at once (bounds memory)."""
_MISS_STAGES = ((0, 8), (8, 24), (24, MAX_EXTRA_COUNTS + 1))
"""The fleet-scope counts above the floor, evaluated stage by stage for the rows not yet at their limit."""


def _prefill_counts(st: PrefillStations, instance: Instance, fleet: bool, total: float):
    """Per segment (row), the prefill counts a pair offers (before availability) and each one's miss probability
    at the sizing target: ``(counts (S, M), miss (S, M), length (S,), reason)``, the first ``length`` entries of a
    row valid (0: none serves; ``reason(row)`` then says why)."""
    slo, rho = instance.slo, instance.constraints.max_utilization
    S = len(st.arrival_rate)

    def sizing_reason(z):
        floor_s = st.ttft_floor_s if not z.feasible.all() else np.zeros(0)   # what the reasons quote, nothing more
        return lambda r: _prefill_reason(float(floor_s[r]), instance, str(z.reason[r]))

    if not fleet:
        z = st.min_replicas(slo.ttft_p99_s, rho_max=rho, margin=slo.ttft_margin)
        return z.replicas[:, None], np.zeros((S, 1)), z.feasible.astype(np.int64), sizing_reason(z)
    floor = st.min_replicas(math.inf, rho_max=rho)
    target = slo.ttft_sizing_s
    n0 = floor.replicas.astype(float)
    ns = n0[:, None] + np.arange(MAX_EXTRA_COUNTS + 1)[None, :]
    miss = np.zeros(ns.shape)
    limit = np.zeros(S)
    busy = np.flatnonzero(floor.feasible & (st.arrival_rate > 0))
    # rows of similar atom counts together, in blocks of about _MISS_BLOCK atoms x counts
    width = st.probs.shape[1] - np.argmax(st.probs[:, ::-1] > 0, axis=1)
    busy = busy[np.argsort(width[busy], kind="stable")]

    def blocks(rows: np.ndarray, counts: int):
        a = 0
        while a < len(rows):
            z = a + 1
            while z < len(rows) and (z - a + 1) * counts * int(width[rows[z]]) <= _MISS_BLOCK:
                z += 1
            yield rows[a:z]
            a = z

    for r in blocks(busy, 1):
        limit[r] = st.miss_probability(target, np.full((len(r), 1), 10.0**6), r)[:, 0]
    # the counts in stages: a row whose miss has reached its limit needs no larger count (the offer stops there)
    pending = busy
    for c0, c1 in _MISS_STAGES:
        for r in blocks(pending, c1 - c0):
            miss[r, c0:c1] = st.miss_probability(target, ns[r, c0:c1], r)
        pending = pending[~np.any(miss[pending, c0:c1] <= limit[pending, None] + 1e-9, axis=1)]
    over = st.arrival_rate * limit > P99_TAIL * total * (1 + 1e-12)
    stop = miss <= limit[:, None] + 1e-9
    last = np.where(stop.any(axis=1), np.argmax(stop, axis=1), ns.shape[1] - 1)
    length = np.where(floor.feasible & ~over, np.where(st.arrival_rate > 0, last + 1, 1), 0)
    miss = np.where(st.arrival_rate[:, None] > 0, miss, 0.0)
    base = sizing_reason(floor)

    lam = st.arrival_rate

    def reason(r: int) -> str:
        if not floor.feasible[r]:
            return base(r)
        return (f"requests whose prefill and KV transfer alone exceed {slo.sizing_text()} are "
                f"{lam[r] * limit[r] / total:.2%} of all traffic, above the fleet's 1 % budget")

    return ns.astype(np.int64), miss, length, reason


def _prefill_reason(ttft_floor_s: float, instance: Instance, code: str) -> str:
    if code == "prefill":
        return (f"prefill: P99 of prefill plus KV transfer alone is {ttft_floor_s * MS_PER_S:,.0f} ms, above "
                f"{instance.slo.sizing_text()} at any replica count")
    return "prefill: no replica count up to the search cap meets the SLO"


def _decode_reason(st: DecodeStations, r: int, code: str, instance: Instance) -> str:
    if code == "no-slots":
        return f"decode: the {int(st.window_tokens[r]):,}-token window does not fit the KV cache"
    if code == "tpot":
        return (f"decode: one sequence at the {int(st.window_tokens[r]):,}-token window decodes in "
                f"{st.tpot_bound_s[r] * MS_PER_S:,.1f} ms per token, above the "
                f"{(instance.slo.tpot_p99_s or 0.0) * MS_PER_S:,.4g} ms TPOT SLO")
    return "decode: no replica count up to the search cap carries the load"


def _reference_pairs(instance: Instance, b: np.ndarray) -> PairColumns:
    """``pd_sizing: reference``: one pair per (prefill, decode) option over :math:`(0, b_M]`, counted by
    :func:`~fleetopt.models.queueing.disagg.reference_disagg` (module docstring)."""
    opts, slo = instance.gpus, instance.slo
    w = instance.workload
    lengths = cast(LengthDistribution, w.lengths)       # 'reference' takes only a CDF workload (load_instance)
    top = float(b[-1])
    pairs = _pairs(instance)
    pools = {k: [] for k in ("i", "j", "gpu", "decode_gpu", "decode_cap", "arrival_rate", "output_tok_per_s",
                             "load_erlangs", "min_replicas")}
    choices = {k: [] for k in ("pool", "replicas", "decode_replicas", "gpus", "decode_gpus", "cost", "power", "miss")}
    dropped = []
    for p, d in pairs:
        x = instance.pools.transfer(opts[p].name, opts[d].name)
        assert x is not None                                    # _pairs keeps the pairs with a transfer
        pp, pd = opts[p].profile, opts[d].profile
        r = reference_disagg(pp, pd, lengths, arrival_rate=w.arrival_rate_req_per_s, ttft_slo_s=slo.ttft_p99_s,
                             tpot_slo_s=slo.tpot_p99_s if slo.tpot_p99_s is not None else math.inf,
                             window_tokens=int(top), ttft_factor=x.factor)
        name = pair_label(opts[p].name, opts[d].name)
        if r.best is None:
            dropped.append((0, int(top), name, f"the reference's sizing finds no pair: {r.reason}"))
            continue
        traffic = _traffic(instance, 0.0, top, (int(pp.chunk_tokens),))
        st = PrefillStation.from_profile(pp, traffic, x)
        dst = DecodeStation.from_profile(pd, traffic, window_tokens=top, tpot_slo_s=slo.tpot_p99_s)
        npp = int(inflate_for_availability(r.best.prefill_replicas, opts[p].availability))
        nd = int(inflate_for_availability(r.best.decode_replicas, opts[d].availability))
        k = len(pools["i"])
        for key, v in (("i", 0), ("j", len(b) - 1), ("gpu", p), ("decode_gpu", d), ("decode_cap", dst.cap),
                       ("arrival_rate", traffic.arrival_rate), ("output_tok_per_s", dst.output_tok_per_s),
                       ("load_erlangs", st.offered_load_erlangs), ("min_replicas", r.best.prefill_replicas)):
            pools[key].append(v)
        miss = float(st.miss_probability(slo.ttft_sizing_s, npp)) if slo.scope == "fleet" else 0.0
        for key, v in (("pool", k), ("replicas", npp), ("decode_replicas", nd),
                       ("gpus", npp * pp.gpus_per_replica + nd * pd.gpus_per_replica),
                       ("decode_gpus", nd * pd.gpus_per_replica),
                       ("cost", npp * pp.cost_usd_per_hr + nd * pd.cost_usd_per_hr),
                       ("power", float(st.power_w(npp)) + float(dst.power_w(nd))),
                       ("miss", traffic.arrival_rate * miss)):
            choices[key].append(np.array([v]))
    return PairColumns(_arrays(pools), _arrays(choices, concat=True), tuple(dropped), len(pairs), len(pairs),
                       len(pairs))
