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

import numpy as np

from fleetopt.models.fleet import inflate_for_availability
from fleetopt.models.queueing.disagg import (DecodeStation, PhaseTraffic, PrefillStation, reference_disagg)
from fleetopt.models.units import MS_PER_S, P99_TAIL
from fleetopt.models.workload import RequestTrace

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


def _pairs(instance: Instance) -> list[tuple[int, int]]:
    """(prefill option, decode option) indices with a KV transfer (same model)."""
    names = [g.name for g in instance.gpus]
    return [(a, b) for a in range(len(names)) for b in range(len(names))
            if instance.pools.transfer(names[a], names[b]) is not None]


def pair_candidates(instance: Instance, b: np.ndarray) -> PairColumns:
    """Every pair candidate of ``instance`` over boundaries ``b`` (see the module docstring)."""
    if instance.pools.pd_sizing == "reference":
        return _reference_pairs(instance, b)
    slo, rho = instance.slo, instance.constraints.max_utilization
    fleet = slo.scope == "fleet"
    total = instance.workload.arrival_rate_req_per_s
    opts = instance.gpus
    pairs = _pairs(instance)
    pre_opts = sorted({p for p, _ in pairs})
    dec_opts = sorted({d for _, d in pairs})
    chunks = sorted({int(opts[g].profile.chunk_tokens) for g in pre_opts})
    pools = {k: [] for k in ("i", "j", "gpu", "decode_gpu", "decode_cap", "arrival_rate", "output_tok_per_s",
                             "load_erlangs", "min_replicas")}
    choices = {k: [] for k in ("pool", "replicas", "decode_replicas", "gpus", "decode_gpus", "cost", "power", "miss")}
    dropped = []
    n_pre = n_dec = 0
    ii, jj = np.triu_indices(len(b), k=1)
    for i, j in zip(ii.tolist(), jj.tolist()):
        lo, hi = float(b[i]), float(b[j])
        # one law per prefill chunk, cut at its multiples (as the analytic evaluation of a pair builds it); the
        # decode station reads only moments, exact on any of them
        by_chunk = {c: _traffic(instance, lo, hi, (c,)) for c in chunks}
        traffic = by_chunk[chunks[0]]
        lam = traffic.arrival_rate
        # decode stations: one per decode option
        dec = {}
        for d in dec_opts:
            st = DecodeStation.from_profile(opts[d].profile, traffic, window_tokens=hi, tpot_slo_s=slo.tpot_p99_s)
            z = st.min_replicas(rho_max=rho, wait_prob_max=P99_TAIL)
            n_dec += 1
            if z.feasible[0]:
                nd = int(inflate_for_availability(int(z.replicas[0]), opts[d].availability))
                dec[d] = (st, nd, float(st.power_w(nd)))
            else:
                dec[d] = (st, str(z.reason[0]), 0.0)
        # prefill stations: one per (prefill option, transfer)
        pre: dict = {}
        for p, d in pairs:
            x = instance.pools.transfer(opts[p].name, opts[d].name)
            key = (p, x)
            if key not in pre:
                st = PrefillStation.from_profile(opts[p].profile, by_chunk[int(opts[p].profile.chunk_tokens)], x)
                n_pre += 1
                counts = _prefill_counts(st, instance, fleet, total)
                power = (None if isinstance(counts, str) else
                         np.asarray(st.power_w(inflate_for_availability(counts[0], opts[p].availability)), dtype=float))
                pre[key] = (st, counts, power)
            st, counts, p_power = pre[key]
            dst, nd, d_power = dec[d]
            name = pair_label(opts[p].name, opts[d].name)
            if isinstance(counts, str) or isinstance(nd, str):
                why = counts if isinstance(counts, str) else _decode_reason(dst, nd, instance)
                dropped.append((int(lo), int(hi), name, why))
                continue
            ns, miss = counts
            pools["i"].append(i)
            pools["j"].append(j)
            pools["gpu"].append(p)
            pools["decode_gpu"].append(d)
            pools["decode_cap"].append(dst.cap)
            pools["arrival_rate"].append(lam)
            pools["output_tok_per_s"].append(dst.output_tok_per_s)
            pools["load_erlangs"].append(st.offered_load_erlangs)
            pools["min_replicas"].append(int(ns[0]))
            k = len(pools["i"]) - 1
            npp = inflate_for_availability(ns, opts[p].availability)
            pp, pd = opts[p].profile, opts[d].profile
            choices["pool"].append(np.full(len(ns), k))
            choices["replicas"].append(npp)
            choices["decode_replicas"].append(np.full(len(ns), nd))
            choices["gpus"].append(npp * pp.gpus_per_replica + nd * pd.gpus_per_replica)
            choices["decode_gpus"].append(np.full(len(ns), nd * pd.gpus_per_replica))
            choices["cost"].append(npp * pp.cost_usd_per_hr + nd * pd.cost_usd_per_hr)
            choices["power"].append(p_power + d_power)
            choices["miss"].append(lam * miss)
    return PairColumns(_arrays(pools), _arrays(choices, concat=True), tuple(dropped), len(ii) * len(pairs), n_pre,
                       n_dec)


def _arrays(cols: dict, concat: bool = False) -> dict:
    if concat:
        return {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    return {k: np.asarray(v) if v else np.zeros(0) for k, v in cols.items()}


def _prefill_counts(st: PrefillStation, instance: Instance, fleet: bool, total: float):
    """The prefill counts a pair offers (before availability) and each one's miss probability at the sizing
    target, or the reason none serves."""
    slo, rho = instance.slo, instance.constraints.max_utilization
    if not fleet:
        z = st.min_replicas(slo.ttft_p99_s, rho_max=rho, margin=slo.ttft_margin)
        if not z.feasible[0]:
            return _prefill_reason(st, instance, str(z.reason[0]))
        return np.array([int(z.replicas[0])]), np.zeros(1)
    floor = st.min_replicas(math.inf, rho_max=rho)
    if not floor.feasible[0]:
        return _prefill_reason(st, instance, str(floor.reason[0]))
    target = slo.ttft_sizing_s
    n0 = int(floor.replicas[0])
    if st.arrival_rate <= 0:
        return np.array([n0]), np.zeros(1)
    ns = np.arange(n0, n0 + MAX_EXTRA_COUNTS + 1)
    miss = np.asarray(st.miss_probability(target, ns), dtype=float)
    limit = float(st.miss_probability(target, 10**6))
    if st.arrival_rate * limit > P99_TAIL * total * (1 + 1e-12):
        return (f"requests whose prefill and KV transfer alone exceed {slo.sizing_text()} are "
                f"{st.arrival_rate * limit / total:.2%} of all traffic, above the fleet's 1 % budget")
    stop = np.flatnonzero(miss <= limit + 1e-9)
    last = int(stop[0]) if len(stop) else len(ns) - 1
    return ns[:last + 1], miss[:last + 1]


def _prefill_reason(st: PrefillStation, instance: Instance, code: str) -> str:
    if code == "prefill":
        return (f"prefill: P99 of prefill plus KV transfer alone is {st.ttft_floor_s * MS_PER_S:,.0f} ms, above "
                f"{instance.slo.sizing_text()} at any replica count")
    return "prefill: no replica count up to the search cap meets the SLO"


def _decode_reason(st: DecodeStation, code: str, instance: Instance) -> str:
    if code == "no-slots":
        return f"decode: the {int(st.window_tokens):,}-token window does not fit the KV cache"
    if code == "tpot":
        return (f"decode: one sequence at the {int(st.window_tokens):,}-token window decodes in "
                f"{st.tpot_bound_s * MS_PER_S:,.1f} ms per token, above the "
                f"{instance.slo.tpot_p99_s * MS_PER_S:,.4g} ms TPOT SLO")
    return "decode: no replica count up to the search cap carries the load"


def _reference_pairs(instance: Instance, b: np.ndarray) -> PairColumns:
    """``pd_sizing: reference``: one pair per (prefill, decode) option over :math:`(0, b_M]`, counted by
    :func:`~fleetopt.models.queueing.disagg.reference_disagg` (module docstring)."""
    opts, slo = instance.gpus, instance.slo
    w = instance.workload
    top = float(b[-1])
    pairs = _pairs(instance)
    pools = {k: [] for k in ("i", "j", "gpu", "decode_gpu", "decode_cap", "arrival_rate", "output_tok_per_s",
                             "load_erlangs", "min_replicas")}
    choices = {k: [] for k in ("pool", "replicas", "decode_replicas", "gpus", "decode_gpus", "cost", "power", "miss")}
    dropped = []
    for p, d in pairs:
        x = instance.pools.transfer(opts[p].name, opts[d].name)
        pp, pd = opts[p].profile, opts[d].profile
        r = reference_disagg(pp, pd, w.lengths, arrival_rate=w.arrival_rate_req_per_s, ttft_slo_s=slo.ttft_p99_s,
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
