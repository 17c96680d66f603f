"""Split routing (``pools.routing: split``): build the split MIP from an instance and decode its plans.

Each candidate pool :math:`p = (i, j, g)` (with a batch cap under a TPOT SLO) may serve any
elementary segment inside its range. Its replica counts :math:`n` come from a ladder up to its
length-routing minimum :math:`N^*_p`; each count gets an operating point from the exact Erlang-C
curve at the pool's nominal mix: the largest load :math:`A` (Erlangs) meeting the SLO and
:math:`\\rho_{max}` (:func:`fleetopt.models.queueing.erlang.max_load_erlangs`), with :math:`C = C(n s, A)` and
:math:`\\theta = 2(n s - A)/R_p`
(:math:`R_p = E[S^2]/E[S]`), its SLO coefficients (:func:`fleetopt.models.queueing.erlang.miss_coefficients`)
and a power line (:func:`fleetopt.models.power.pool_power_secant`). See :mod:`fleetopt.solvers.split` for the
constraints.

Under the batched replica model (``ttft_model: batched``, :mod:`fleetopt.models.queueing.batched`) the ladder's
top count :math:`N^*_p` is the batched minimum, but the operating points (capacities, SLO coefficients,
power lines) still come from the slot model with the exact prefill tail (``tail``): the batched model's
TTFT is not a function of one linear load in the routed rates. Each capacity is also bounded by what the
count carries at the pool's nominal mix under the batched model (:func:`model_capacity_erlangs`), and a pool
that does not carry its routed mix in the decoded plan gets a cut (:func:`slo_cut`) before the MIP is solved
again (``fleetopt.optimizer.plan.solve._split_cut_loop``); a plan still missing is reported as such.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING
from collections.abc import Sequence

import numpy as np

from fleetopt.models.numerics import unique
from fleetopt.models.fleet import FleetResult, PoolPlan, evaluate_traffic, inflate_for_availability
from fleetopt.models.power import pool_power_secant
from fleetopt.models.service import decode_power_curve
from fleetopt.models.queueing.erlang import erlang_c, max_load_erlangs, miss_coefficients
from fleetopt.models.segments import raw_between, segment_basis, stats_from_raw
from fleetopt.models.queueing.ttft import ttft_model

from fleetopt.optimizer.plan.candidates import batch_caps, least_counts, pool_counts
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.plan.evaluate import service_level
from fleetopt.optimizer.io.instance import Instance

if TYPE_CHECKING:  # the MIP (and Pyomo) load only when a split problem is built
    from fleetopt.solvers.split import SplitProblem

__all__ = ["SplitModel", "SplitRouting", "build_split_problem", "decode_split_plan", "evaluate_routing",
           "pool_carries", "replica_ladder", "restrict_split", "slo_cut"]


def replica_ladder(n_max: int, dense: int = 24) -> np.ndarray:
    """Replica counts offered to a pool: every count up to ``dense``, then the top 16 below ``n_max`` and a
    geometric ladder under them (each count is exact; a missing count only costs optimality)."""
    if n_max <= dense:
        return np.arange(1, n_max + 1)
    geometric = unique(np.round(np.geomspace(1, n_max, 24)).astype(int))
    return unique(np.concatenate([geometric, np.arange(max(1, n_max - 15), n_max + 1)]))


@dataclass(frozen=True, eq=False)
class SplitModel:
    """The split MIP's input plus what decoding a plan needs."""

    problem: SplitProblem
    boundaries: np.ndarray
    pool_i: np.ndarray
    pool_j: np.ndarray
    pool_cap: np.ndarray
    pool_min_replicas: np.ndarray
    """:math:`N^*_p`, the length-routing minimum count of each pool at its nominal mix (before availability)."""
    segment_raws: dict            # chunk -> RawSums of the elementary segments
    dropped: tuple[str, ...]
    generated: int


def build_split_problem(instance: Instance) -> SplitModel:
    """Candidates, operating points, link coefficients and power secants of a split-routing instance."""
    from fleetopt.solvers.split import SplitProblem

    w = instance.workload
    b = np.asarray(instance.pools.boundaries, dtype=float)
    M = len(b) - 1
    slo, rho = instance.slo, instance.constraints.max_utilization
    # The operating points are linear in the routed rates only under the slot models; under ``batched`` the
    # ladder's capacities and SLO coefficients come from the slot model with the exact prefill tail (module
    # docstring), and the decoded plan is evaluated under the batched model.
    model = ttft_model(slo.ttft_model)
    point_model = model.split_point_model
    ii, jj = np.triu_indices(len(b), k=1)
    seg_rate = None
    cols = {k: [] for k in ("gpu", "i", "j", "cap", "n_star")}
    link = {k: [] for k in ("seg", "pool", "load", "resid")}
    ch = {k: [] for k in ("pool", "n", "gpus", "cost", "cap_erl", "base", "slope")}
    slo_coef, dropped, power_err, raws_by_chunk = [], [], 0.0, {}
    for g_idx, opt in enumerate(instance.gpus):
        prof = opt.profile
        basis = segment_basis(w.lengths, b, prof.chunk_tokens, w.input_fraction)
        elem = raw_between(basis, np.arange(M), np.arange(1, M + 1))
        raws_by_chunk[prof.chunk_tokens] = elem
        seg_rate = w.arrival_rate_req_per_s * elem.mass
        rows, caps, _ = batch_caps(instance, prof, b[jj])
        pi, pj = ii[rows], jj[rows]
        nominal = stats_from_raw(raw_between(basis, pi, pj), b[pi], b[pj], prof, n_slots=caps)
        lam = w.arrival_rate_req_per_s * nominal.rate_share
        counts, ok, reasons = pool_counts(instance, nominal, lam)
        for k in np.flatnonzero(~ok):
            dropped.append(f"{int(b[pi[k]]):,}-{int(b[pj[k]]):,} on {opt.name}: {reasons[k]}")
        chunk_s = prof.W_s + prof.H_s
        for k in np.flatnonzero(ok & (lam > 0)):
            p = len(cols["gpu"])
            for key, value in (("gpu", g_idx), ("i", pi[k]), ("j", pj[k]), ("cap", caps[k]),
                               ("n_star", int(counts[k][0][0]))):
                cols[key].append(value)
            es, cv2 = float(nominal.mean_service_s[k]), float(nominal.cv2_service[k])
            resid_nom = es * (1 + cv2)
            segs = np.arange(pi[k], pj[k])
            c_eff = prof.H_s * caps[k] / prof.calibration_ctx_tokens
            w_eff = prof.W_s + prof.g_s * caps[k]         # a full batch's iteration (stats_from_raw)
            with np.errstate(divide="ignore", invalid="ignore"):
                m1 = np.where(elem.mass[segs] > 0, (w_eff * elem.A[segs] + c_eff * elem.AL[segs]) / elem.mass[segs], 0)
                m2 = np.where(elem.mass[segs] > 0, (w_eff ** 2 * elem.A2[segs] + 2 * w_eff * c_eff * elem.A2L[segs]
                                                    + c_eff ** 2 * elem.A2L2[segs]) / elem.mass[segs], 0)
                seg_probs = np.where(elem.mass[segs, None] > 0, elem.k_hist[segs] / elem.mass[segs, None], 0)
                seg_pf = np.where(elem.mass[segs] > 0, elem.k[segs] / elem.mass[segs] * chunk_s, 0)
            link["seg"].extend(segs)
            link["pool"].extend([p] * len(segs))
            link["load"].extend(m1)
            link["resid"].extend(m2 - resid_nom * m1)
            n_base = replica_ladder(int(counts[k][0][0]))
            servers = n_base * caps[k]
            tau = np.arange(nominal.prefill_probs.shape[1]) * chunk_s
            A = max_load_erlangs(servers.astype(float), es, cv2, tau, nominal.prefill_probs[k],
                                 nominal.mean_prefill_s[k], slo_s=slo.ttft_sizing_s, rho_max=rho, model=point_model)
            if model.split_point_model != model.name:
                A = np.minimum(A, model_capacity_erlangs(model, basis, int(pi[k]), int(pj[k]), b, prof, int(caps[k]),
                                                         es, n_base, slo.ttft_sizing_s, rho,
                                                         float(lam[k]), int(counts[k][0][0])))
            usable = A > 0
            replicas = np.asarray(inflate_for_availability(n_base, opt.availability))   # (n_base is an array)
            C = np.asarray(erlang_c(servers.astype(float), np.minimum(A, servers - 1e-9)))
            theta = 2 * (servers - A) / resid_nom
            for n_rep, a_c, c_c, th in zip(replicas[usable], A[usable], C[usable], theta[usable]):
                # pool_power_secant reads only curve.power_w(batch), which a DecodePower answers like a PowerCurve
                base, slope, err = pool_power_secant(
                    decode_power_curve(prof, b[pj[k]] / 2),  # pyright: ignore[reportArgumentType]
                    int(n_rep), float(a_c), int(caps[k]))
                row = {"pool": p, "n": n_rep, "gpus": n_rep * prof.gpus_per_replica,
                       "cost": n_rep * prof.cost_usd_per_hr, "cap_erl": a_c, "base": base, "slope": slope}
                for key, value in row.items():
                    ch[key].append(value)
                power_err = max(power_err, err)
                slo_coef.append(miss_coefficients(seg_probs, seg_pf, tau, c_c, th, slo.ttft_sizing_s, point_model))
    cons = instance.constraints
    assert seg_rate is not None                     # set by the first GPU option (an instance has at least one)
    problem = SplitProblem(
        segment_rate=seg_rate, pool_gpu=np.array(cols["gpu"], dtype=np.int64),
        gpu_names=tuple(g.name for g in instance.gpus),
        link_segment=np.array(link["seg"], dtype=np.int64), link_pool=np.array(link["pool"], dtype=np.int64),
        link_load=np.array(link["load"]), link_residual=np.array(link["resid"]),
        choice_pool=np.array(ch["pool"], dtype=np.int64), choice_replicas=np.array(ch["n"], dtype=np.int64),
        choice_gpus=np.array(ch["gpus"], dtype=np.int64), choice_cost_per_hr=np.array(ch["cost"]),
        choice_capacity=np.array(ch["cap_erl"]), choice_power_base_w=np.array(ch["base"]),
        choice_power_slope_w=np.array(ch["slope"]), slo_coef=tuple(slo_coef), max_pools=instance.pools.max_pools,
        gpu_max_gpus=tuple(g.max_count for g in instance.gpus), gpu_min_gpus=tuple(g.min_count for g in instance.gpus),
        max_total_gpus=cons.max_total_gpus, max_cost_per_hr=cons.max_cost_per_hr,
        max_power_w=None if cons.max_power_kw is None else cons.max_power_kw * 1000.0, objective=instance.objective,
        energy_usd_per_kwh=instance.energy_usd_per_kwh or 0.0, pue=instance.pue, power_error_w=power_err)
    return SplitModel(problem, b, np.array(cols["i"], dtype=np.int64), np.array(cols["j"], dtype=np.int64),
                      np.array(cols["cap"], dtype=np.int64), np.array(cols["n_star"], dtype=np.int64), raws_by_chunk,
                      tuple(dropped), len(ii) * len(instance.gpus))


CAPACITY_HALVINGS = 14
"""Bisection steps of :func:`model_capacity_erlangs` on the arrival rate (a bracket of :math:`2^{-14}` of its
start): the capacity returned is the bracket's lower end, so it errs on the side of fewer requests."""


def model_capacity_erlangs(model, basis, i: int, j: int, b: np.ndarray, profile, cap: int, mean_service_s: float,
                           counts: np.ndarray, slo_s: float, rho_max: float, rate: float, least: int) -> np.ndarray:
    r"""The load (Erlangs of slot time, :math:`\lambda E[S]`) that ``counts`` replicas carry at the pool's nominal
    mix under the instance's own TTFT ``model`` (not the slot model standing in for it).

    For each count :math:`n` the largest rate :math:`\lambda^*(n)` whose least count under ``model`` (SLO target
    ``slo_s``, utilisation cap ``rho_max``) is at most :math:`n`, bisected on :math:`[0, \lambda_{hi}]` with
    :math:`\lambda_{hi} = 2 \lambda_{nom} n / N^*` doubled until it fails (a least count grows with the rate);
    returned as :math:`\lambda^*(n) E[S]` so that it bounds the same routed load
    :math:`\sum_s \lambda_s E[S_s]` as the slot operating point. Under the batched model the slot model's
    capacity can exceed what the replicas carry when prefill compute stalls their batches: a split plan sized
    on it alone is overloaded once evaluated. At the nominal mix the bound is exact; off it, it is the same
    linearisation in the routed rates as the slot capacity.
    """
    counts = np.asarray(counts, dtype=float)
    rows = len(counts)
    stats = stats_from_raw(raw_between(basis, np.full(rows, i), np.full(rows, j)), np.full(rows, b[i]),
                           np.full(rows, b[j]), profile, n_slots=np.full(rows, cap))

    def carried(lam: np.ndarray) -> np.ndarray:
        return model.carries(model.traffic(stats, lam), counts, slo_s, rho_max)

    lo = np.zeros(rows)
    hi = np.maximum(2.0 * rate * counts / max(least, 1), 1e-6)
    for _ in range(40):                      # grow the bracket until every count fails at its top
        ok = carried(hi)
        if not ok.any():
            break
        lo = np.where(ok, hi, lo)
        hi = np.where(ok, 2.0 * hi, hi)
    for _ in range(CAPACITY_HALVINGS):
        mid = 0.5 * (lo + hi)
        ok = carried(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return lo * mean_service_s


def restrict_split(model: SplitModel, instance: Instance, min_replicas: dict, forbidden: set,
                   window_cuts=()) -> SplitModel:
    """Apply cuts from verification to the split MIP's choices (the split form of
    :func:`fleetopt.optimizer.plan.candidates.restrict`).

    Pools ``forbidden`` (keys ``(lo, hi, gpu)``) lose every choice. A pool with a least count
    (:func:`fleetopt.optimizer.plan.candidates.least_counts`: its own ``min_replicas[key]`` or a
    :class:`~fleetopt.optimizer.plan.candidates.WindowCut` over :math:`N^*_p`) gets every smaller choice raised to it,
    re-priced (GPUs, cost, power secant) but keeping its operating point: a raised choice serves no more
    load, under the same SLO coefficients, than the count it came from. Of the choices raised to one count,
    only the one from the largest count (the largest operating point) stays, so no two choices of a pool
    describe the same fleet.
    """
    pr = model.problem
    b = model.boundaries
    keys = [(int(b[i]), int(b[j]), pr.gpu_names[g]) for i, j, g in zip(model.pool_i, model.pool_j, pr.pool_gpu)]
    least = least_counts(keys, model.pool_min_replicas, min_replicas, window_cuts)
    cp = pr.choice_pool
    replicas = np.maximum(pr.choice_replicas, least[cp])
    order = np.lexsort((-pr.choice_replicas, replicas, cp))  # by pool, new count, then the largest old count first
    first = np.r_[True, (np.diff(cp[order]) != 0) | (np.diff(replicas[order]) != 0)]
    keep = np.zeros(len(cp), dtype=bool)
    keep[order[first]] = True
    keep &= np.array([keys[p] not in forbidden for p in cp], dtype=bool)
    gpus, cost = pr.choice_gpus.copy(), pr.choice_cost_per_hr.copy()
    base, slope = pr.choice_power_base_w.copy(), pr.choice_power_slope_w.copy()
    power_err = pr.power_error_w
    for c in np.flatnonzero(keep & (replicas != pr.choice_replicas)):
        p = int(cp[c])
        prof = instance.gpus[pr.pool_gpu[p]].profile
        gpus[c] = replicas[c] * prof.gpus_per_replica
        cost[c] = replicas[c] * prof.cost_usd_per_hr
        base[c], slope[c], err = pool_power_secant(prof.power, int(replicas[c]), float(pr.choice_capacity[c]),
                                                   int(model.pool_cap[p]))
        power_err = max(power_err, err)
    idx = np.flatnonzero(keep)
    problem = dataclasses.replace(
        pr, choice_pool=cp[idx], choice_replicas=replicas[idx], choice_gpus=gpus[idx], choice_cost_per_hr=cost[idx],
        choice_capacity=pr.choice_capacity[idx], choice_power_base_w=base[idx], choice_power_slope_w=slope[idx],
        slo_coef=tuple(pr.slo_coef[c] for c in idx), power_error_w=power_err)
    return dataclasses.replace(model, problem=problem)


@dataclass(frozen=True)
class SplitRouting:
    """Where a split-routing plan sends each elementary segment's traffic.

    ``rate_req_per_s[k][q]`` is the rate (req/s) of requests of total length in
    :math:`(b_k, b_{k+1}]` (``boundaries_tokens``) sent to pool ``q`` of the plan (the order of
    ``plan.fleet.pools``); each row adds up to the segment's arrival rate :math:`\\lambda P(b_k < L \\le b_{k+1})`.
    The simulator's :class:`fleetopt.solvers.des.routing.SplitRouter` draws pools with these rates as weights.
    Checked where it is used (:func:`evaluate_routing`), not when built.
    """

    boundaries_tokens: tuple[int, ...]
    rate_req_per_s: tuple[tuple[float, ...], ...]

    @classmethod
    def from_array(cls, boundaries_tokens, rate_req_per_s) -> SplitRouting:
        """From a boundary sequence and a (segments x pools) array."""
        return cls(tuple(int(x) for x in boundaries_tokens),
                   tuple(tuple(float(v) for v in row)
                         for row in np.atleast_2d(np.asarray(rate_req_per_s, dtype=float))))

    def as_array(self) -> np.ndarray:
        """The rates as a (segments x pools) float array (req/s)."""
        return np.array(self.rate_req_per_s, dtype=float).reshape(len(self.rate_req_per_s), -1)

    def router_weights(self, windows_tokens: Sequence[int]) -> np.ndarray:
        """Weights for :class:`~fleetopt.solvers.des.routing.SplitRouter`: the rates; a segment without traffic (which
        draws no request) goes to the pool with the smallest window holding it, or the largest window if none
        does (its requests would then be rejected), since every row needs a positive weight."""
        w = self.as_array()
        windows = np.asarray(windows_tokens, dtype=float)
        for k in np.flatnonzero(w.sum(axis=1) <= 0):
            fits = np.flatnonzero(windows >= self.boundaries_tokens[k + 1])
            w[k, fits[np.argmin(windows[fits])] if len(fits) else int(np.argmax(windows))] = 1.0
        return w


ROW_TOLERANCE = 1e-6
"""A routing row may differ from its segment's arrival rate by this share of the fleet's rate (solver round-off)."""


def evaluate_routing(instance: Instance, pools: Sequence[PoolPlan], routing: SplitRouting) -> FleetResult:
    """Exact analytic evaluation of pools fed by a split router (:class:`SplitRouting`), checked at the edge.

    Each pool's traffic is the routed mix :math:`\\sum_k \\phi_{kq} R_k` of the elementary segments' raw
    sums :math:`R_k`, :math:`\\phi_{kq} = r_{kq} / \\sum_{q'} r_{kq'}` the share of segment :math:`k` routed
    to pool :math:`q` (what the router draws), evaluated by :func:`fleetopt.models.fleet.evaluate_traffic`.

    Raises
    ------
    InstanceError
        One line per problem: a pool without a fixed replica count or with compress-and-route, boundaries
        that do not run from 0 to ``pools.max_context`` in increasing order, a rate array of the wrong
        shape, a negative or non-finite rate, a row that does not add up to its segment's arrival rate,
        or a segment sent to a pool whose window is shorter than the segment.
    """
    problems = []
    for q, p in enumerate(pools):
        if p.replicas is None or p.replicas < 1:
            problems.append(f"routing: pool {q} ({p.lo_tokens}-{p.hi_tokens}:{p.gpu}) needs a fixed replica count >= 1")
        if p.compress_gamma != 1.0:
            problems.append(f"routing: pool {q} ({p.lo_tokens}-{p.hi_tokens}:{p.gpu}) has @gamma; split routing "
                            "does not compress")
    if not isinstance(routing, SplitRouting):
        raise InstanceError(problems + [f"routing: expected a SplitRouting, got {type(routing).__name__}"])
    b = np.asarray(routing.boundaries_tokens, dtype=float)
    top = instance.pools.max_context_tokens
    if b.ndim != 1 or len(b) < 2 or b[0] != 0 or b[-1] != top or np.any(np.diff(b) <= 0):
        problems.append(f"routing: boundaries {list(routing.boundaries_tokens)} must increase from 0 to "
                        f"pools.max_context {top}")
        raise InstanceError(problems)
    M = len(b) - 1
    try:
        rates = routing.as_array()
    except ValueError:
        rates = None
    if rates is None or rates.shape != (M, len(pools)):
        shape = "ragged rows" if rates is None else f"shape {rates.shape}"
        raise InstanceError(problems + [f"routing: rates have {shape}; expected ({M}, {len(pools)}) "
                                        "(segments x pools)"])
    if not np.all(np.isfinite(rates)) or np.any(rates < 0):
        raise InstanceError(problems + ["routing: rates must be finite and >= 0 req/s"])
    elem = _segment_raws(instance, b, {p.profile.chunk_tokens for p in pools})
    total = instance.workload.arrival_rate_req_per_s
    expected = total * next(iter(elem.values())).mass
    off = np.flatnonzero(np.abs(rates.sum(axis=1) - expected) > ROW_TOLERANCE * total)
    if len(off):
        k = int(off[0])
        problems.append(f"routing: segment {k} ({int(b[k])}-{int(b[k + 1])} tokens) routes "
                        f"{rates[k].sum():.6g} req/s, but the workload sends {expected[k]:.6g} req/s there")
    windows = np.array([p.hi_tokens for p in pools], dtype=float)
    bad = np.argwhere((rates > 0) & (windows[None, :] < b[1:, None]))
    if len(bad):
        k, q = (int(x) for x in bad[0])
        problems.append(f"routing: segment {k} sends requests up to {int(b[k + 1])} tokens to pool {q} "
                        f"({pools[q].lo_tokens}-{pools[q].hi_tokens}:{pools[q].gpu}), whose window is shorter")
    if problems:
        raise InstanceError(problems)
    return _evaluate_routed(instance, list(pools), rates, elem)


def _segment_raws(instance: Instance, b: np.ndarray, chunks) -> dict:
    """Raw sums of the elementary segments of ``b`` for each prefill chunk size."""
    w = instance.workload
    M = len(b) - 1
    return {chunk: raw_between(segment_basis(w.lengths, b, chunk, w.input_fraction), np.arange(M), np.arange(1, M + 1))
            for chunk in sorted(chunks)}


def _evaluate_routed(instance: Instance, pools: list[PoolPlan], rates: np.ndarray, elem: dict) -> FleetResult:
    """:func:`evaluate_routing` without the checks (``elem``: chunk -> elementary raw sums)."""
    row = rates.sum(axis=1)
    share = np.divide(rates, row[:, None], out=np.zeros_like(rates), where=row[:, None] > 0)
    raws = [elem[p.profile.chunk_tokens].scaled(share[:, q]).total() for q, p in enumerate(pools)]
    return evaluate_traffic(raws, pools, instance.workload.arrival_rate_req_per_s, service_level(instance))


def decode_split_plan(instance: Instance, model: SplitModel, choices, link_rate) -> tuple[FleetResult, SplitRouting]:
    """Exact analytic re-evaluation of a split plan (each pool's traffic is its routed mix of segments, see
    :func:`evaluate_routing`) and the plan's routing; pools ordered by window, then lower boundary."""
    pr = model.problem
    b = model.boundaries
    order = sorted(choices, key=lambda c: (model.pool_j[pr.choice_pool[c]], model.pool_i[pr.choice_pool[c]]))
    pools = []
    rates = np.zeros((len(b) - 1, len(order)))
    for q, c in enumerate(order):
        p = int(pr.choice_pool[c])
        opt = instance.gpus[pr.pool_gpu[p]]
        mine = np.flatnonzero(pr.link_pool == p)
        rates[pr.link_segment[mine], q] = link_rate[mine]
        pools.append(PoolPlan(int(b[model.pool_i[p]]), int(b[model.pool_j[p]]), opt.name, opt.profile,
                              int(pr.choice_replicas[c]), opt.availability, max_num_seqs=int(model.pool_cap[p])))
    routing = SplitRouting.from_array(b, rates)
    return _evaluate_routed(instance, pools, routing.as_array(), model.segment_raws), routing


CUT_HALVINGS = 30
"""Bisection steps of :func:`slo_cut` on the scale of a routed mix (a bracket of :math:`2^{-30}`)."""
CUT_STEP = 0.02
"""Forward-difference step of :func:`slo_cut`'s gradient, as a share of the pool's routed rate."""
CUT_SLACK = 1e-6
"""Relative tightening of each cut, so that a solution on a cut (to the solver's feasibility tolerance) is still
on the carried side."""


def _routed_stats(model: SplitModel, instance: Instance, pool: int, rates: np.ndarray):
    """Segment statistics of pool ``pool`` fed the rate vectors ``rates`` (rows x the pool's segments, req/s), as
    :func:`evaluate_routing` builds them (its routed mix of elementary raw sums at the pool's window and cap)."""
    pr = model.problem
    prof = instance.gpus[pr.pool_gpu[pool]].profile
    elem = model.segment_raws[prof.chunk_tokens]._full()
    i, j = int(model.pool_i[pool]), int(model.pool_j[pool])
    lam = np.asarray(pr.segment_rate, dtype=float)[i:j]
    share = np.divide(rates, lam, out=np.zeros_like(rates), where=lam > 0)
    mix = {f: np.tensordot(share, getattr(elem, f)[i:j], axes=(1, 0)) for f in _raw_fields()}
    spectra = None if elem.spectra is None else np.tensordot(share, elem.spectra[i:j], axes=(1, 0))
    raw = type(elem)(**mix, spectra=spectra)
    rows = len(rates)
    b = model.boundaries
    return stats_from_raw(raw, np.full(rows, b[i]), np.full(rows, b[j]), prof,
                          n_slots=np.full(rows, int(model.pool_cap[pool])))


def _raw_fields() -> tuple[str, ...]:
    from fleetopt.models.segments import RawSums

    return tuple(f.name for f in dataclasses.fields(RawSums) if f.name != "spectra")


def pool_carries(instance: Instance, model: SplitModel, choice: int, rates: np.ndarray) -> np.ndarray:
    """Whether choice ``choice``'s replicas carry each row of ``rates`` (req/s per segment of its pool) under the
    instance's TTFT model at the sizing target and the utilisation cap (:meth:`TTFTModel.carries`)."""
    pr = model.problem
    pool = int(pr.choice_pool[choice])
    rates = np.atleast_2d(np.asarray(rates, dtype=float))
    ttft = ttft_model(instance.slo.ttft_model)
    stats = _routed_stats(model, instance, pool, rates)
    return ttft.carries(ttft.traffic(stats, rates.sum(axis=1)), np.full(len(rates), float(pr.choice_replicas[choice])),
                        instance.slo.ttft_sizing_s, instance.constraints.max_utilization)


def _carried_scale(instance: Instance, model: SplitModel, choice: int, rates: np.ndarray) -> np.ndarray:
    r""":math:`t^*(r) = \sup\{t \in [0, 1] : t r \text{ carried}\}` per row of ``rates`` (bisection, lower end;
    a row carried at :math:`t = 1` returns 1). Rays are searched as a line: that a carried :math:`t r` has every
    smaller scale carried is the model's monotonicity in the rate (more traffic of a fixed mix never helps)."""
    lo, hi = np.zeros(len(rates)), np.ones(len(rates))
    top = pool_carries(instance, model, choice, rates)
    lo[top] = 1.0
    for _ in range(CUT_HALVINGS):
        mid = 0.5 * (lo + hi)
        ok = pool_carries(instance, model, choice, rates * mid[:, None])
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return np.where(top, 1.0, lo)


def slo_cut(instance: Instance, model: SplitModel, choice: int, link_rate: np.ndarray) -> np.ndarray | None:
    r"""A cut separating the routed mix of choice ``choice`` from the rate vectors its replicas carry, or None when
    they carry it (``link_rate``: req/s per link of the split problem, as :func:`decode_split_plan` reads it).

    With :math:`F_c` the routed rate vectors :math:`r` (one per segment of the pool) that :math:`n_c` replicas
    carry under the instance's TTFT model (:func:`pool_carries`) and its gauge
    :math:`\gamma(r) = \inf\{s > 0 : r / s \in F_c\} = 1 / t^*(r)` (:func:`_carried_scale`), the cut is the
    tangent of :math:`\gamma` at the failing mix :math:`r_0`,

    .. math:: \sum_k w_k r_k \le 1, \qquad w_k = \max\Big(0, \frac{\gamma(r_0 + h e_k) - \gamma(r_0)}{h}\Big)
              \cdot \max\Big(1, \frac{\gamma(r_0)}{\sum_k w_k r_{0k}}\Big)(1 + \epsilon)

    (forward differences, :math:`h` = :data:`CUT_STEP` of :math:`\sum_k r_{0k}`, the rescaling so that the cut
    holds :math:`t^* r_0` on its boundary, :math:`\epsilon` = :data:`CUT_SLACK`). It separates :math:`r_0`
    (:math:`w \cdot r_0 \ge \gamma(r_0) > 1`). It is valid, i.e. keeps every vector of :math:`F_c`, where
    :math:`F_c` is convex (then :math:`\gamma` is sublinear, :math:`\gamma(r) \ge \nabla\gamma(r_0) \cdot r`, and a
    forward difference over-estimates the gradient); convexity is checked numerically
    (``tests/test_split_physical.py``), not proven, so a split plan after cuts is optimal within its cuts.
    """
    pr = model.problem
    pool = int(pr.choice_pool[choice])
    links = pr.links_of_pool[pool]
    seg = pr.link_segment[links] - int(model.pool_i[pool])
    r0 = np.zeros(int(model.pool_j[pool] - model.pool_i[pool]))
    r0[seg] = np.asarray(link_rate, dtype=float)[links]
    if r0.sum() <= 0 or pool_carries(instance, model, choice, r0)[0]:
        return None
    h = CUT_STEP * r0.sum()
    rows = np.vstack([r0, r0 + h * np.eye(len(r0))])
    gauge = 1.0 / np.maximum(_carried_scale(instance, model, choice, rows), 2.0 ** -CUT_HALVINGS)
    w = np.maximum(0.0, (gauge[1:] - gauge[0]) / h)
    w = w * max(1.0, gauge[0] / max(float(w @ r0), 1e-300)) * (1 + CUT_SLACK)
    return w[seg]
