"""Bounded candidate sizing (:func:`fleetopt.optimizer.plan.candidates._size_bounded`) against sizing every
candidate.

A solve that wants one least-cost plan, with no limit coupling its pools, sizes per segment the GPU option of the
least utilisation floor, then only the options whose floor does not cost more than what that one found. Each
check compares it with the full sizing, which is computed independently of the bound: the candidates it sizes
carry the same columns bit for bit, every candidate it leaves out costs strictly more than a feasible candidate
of its segment in the full sizing, and the solve returns the same plan.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.models.queueing import ttft
from fleetopt.models.queueing.batched import BatchedTraffic, batched_min_replicas, batched_utilization_floor
from fleetopt.models.queueing.erlang import min_replicas, utilization_floor
from fleetopt.optimizer import api
from fleetopt.optimizer.plan import candidates as cand
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.plan import solve as solve_mod

CASES = {
    # name: (instance, overrides, the rule bounded_sizing picks)
    # two options of physical GPUs, one precision each: nothing but cost decides
    "quickstart": ("quickstart.yaml", (), "cost"),
    # six computed configurations with a TPOT SLO: several batch caps per segment, rows too slow to serve
    "tp-tpot": ("llama70b_tp.yaml", ("slo.tpot_p99_ms=60", "slo.ttft_p99_ms=600", "gpus.h100.max_count=null"),
                "cost"),
    # calibrated units under availability below one (the floor is inflated as the counts are)
    "units-availability": ("ref_units_lmsys_a100_h100.yaml", ("gpus.a100.availability=0.9",), "cost"),
    # compress-and-route: the compression states are part of a segment
    "compression": ("quickstart.yaml", ("pools.compress={gammas: [1.5], success_probability: 0.8}",), "cost"),
    # a slot TTFT model (its own floor)
    "tail-model": ("ref_units_lmsys_a100_h100.yaml", ("slo.ttft_model=tail",), "cost"),
    # a binding power cap and inventories (the MIP): only dominated candidates may go unsized
    "stress": ("ref_units_stress_60x8.yaml", (), "dominance"),
    # one inventory shared by every configuration: none may stand in for another, nothing goes unsized
    "tp-tpot-inventory": ("llama70b_tp.yaml", ("slo.tpot_p99_ms=60", "slo.ttft_p99_ms=600"), "dominance"),
    # another objective: power
    "power-objective": ("quickstart.yaml", ("objective=power",), "dominance"),
}
BOUND = {k: v[2] for k, v in CASES.items()}


@pytest.fixture(autouse=True)
def _bounded_at_any_size(monkeypatch):
    """These instances are small: bounded sizing runs at any size here (a solve uses it from MIN_BOUNDED_ROWS
    rows, where it pays)."""
    monkeypatch.setattr(cand, "MIN_BOUNDED_ROWS", 0)
SKIPS_NONE = {"tp-tpot-inventory"}
"""Cases where no candidate may go unsized (no option may stand in for another)."""


def _key(c: cand.Candidates, p: int) -> tuple:
    return (int(c.i[p]), int(c.j[p]), int(c.state_in[p]), int(c.state_out[p]), int(c.gpu[p]), int(c.cap[p]),
            int(c.decode_gpu[p]))


def _load(repo_root, case):
    name, overrides, _ = CASES[case]
    return api.load(repo_root / "instances" / name, list(overrides))


def _same_rows(full: cand.Candidates, part: cand.Candidates) -> None:
    """``part``'s candidates are candidates of ``full``, in its order, with its columns bit for bit."""
    where = {_key(full, p): p for p in range(len(full))}
    at = np.array([where[_key(part, q)] for q in range(len(part))], dtype=np.int64)   # KeyError: one full lacks
    assert np.all(np.diff(at) > 0)
    for f in ("arrival_rate", "output_tok_per_s", "load_erlangs", "min_replicas_analytic", "i", "j", "gpu"):
        a, b = getattr(full, f)[at], getattr(part, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert np.all(np.diff(part.choice_pool) >= 0)
    for q, p in enumerate(at):
        mine, theirs = np.flatnonzero(part.choice_pool == q), np.flatnonzero(full.choice_pool == p)
        for f in ("choice_replicas", "choice_gpus", "choice_cost_per_hr", "choice_power_w", "choice_miss_rate"):
            assert np.array_equal(getattr(part, f)[mine], getattr(full, f)[theirs]), (f, q)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bounded_sizing_sizes_a_subset_with_the_same_columns(case, repo_root):
    inst = _load(repo_root, case)
    assert cand.bounded_sizing(inst) == BOUND[case]
    full = cand.generate_candidates(inst)
    part = cand.generate_candidates(inst, bounded=BOUND[case])
    _same_rows(full, part)
    if case not in SKIPS_NONE:
        assert part.left_unsized > 0 and len(part) < len(full)
    # the dropped candidates it sized, with their reasons, in the full sizing's order
    listed = [(d.lo_tokens, d.hi_tokens, d.gpu, d.reason) for d in full.dropped]
    rest = iter(listed)
    assert all(d in rest for d in [(d.lo_tokens, d.hi_tokens, d.gpu, d.reason) for d in part.dropped])


def test_with_compression_states_every_rows_sums_are_computed_once_per_chunk_size(repo_root, monkeypatch):
    """With compression states a round cannot compute only its own rows (a compressed band may widen the
    histograms): every row's raw sums are computed once per chunk size and shared by the count floors and both
    rounds, not once per round (three times the work, as a sizing of the stress instance with one compression
    state once did: 12 computations of every row instead of 4, 3.3 s instead of 1.3 s)."""
    inst = _load(repo_root, "compression")
    n_rows = len(cand._candidate_rows(np.asarray(inst.pools.boundaries, dtype=float),
                                      (1.0,) + tuple(inst.pools.compress_gammas))[0])
    calls = []
    real = cand._traffic
    monkeypatch.setattr(cand, "_traffic", lambda *a: calls.append(len(a[5][0])) or real(*a))
    part = cand.generate_candidates(inst, None, bounded=BOUND["compression"], top=1)
    assert part.left_unsized > 0                     # both rounds ran
    assert calls == [n_rows] * len({g.profile.chunk_tokens for g in inst.gpus})


@pytest.mark.parametrize("top", [1, 2])
@pytest.mark.parametrize("case", sorted(k for k, v in BOUND.items() if v == "cost"))
def test_every_unsized_candidate_costs_more_than_top_feasible_ones_of_its_segment(case, top, repo_root):
    """The cost rule, checked on the full sizing: a (segment, option) left unsized has no candidate as cheap as
    the ``top``-th cheapest feasible option of its segment, so none of the ``top`` least-cost plans uses it."""
    inst = _load(repo_root, case)
    full = cand.generate_candidates(inst)
    part = cand.generate_candidates(inst, bounded="cost", top=top)
    seg = lambda c: c.from_node * (len(c.boundaries) * len(c.gammas) + 1) + c.to_node  # noqa: E731
    cost_full = {}
    for p, (s, g) in enumerate(zip(seg(full), full.gpu)):
        cost = float(full.choice_cost_per_hr[full.choice_pool == p].min())
        cost_full[int(s), int(g)] = min(cost, cost_full.get((int(s), int(g)), np.inf))
    sized = set(zip(seg(part).tolist(), part.gpu.tolist()))
    by_segment: dict[int, list[float]] = {}
    for (s, _g), cost in cost_full.items():
        by_segment.setdefault(s, []).append(cost)
    best = {s: sorted(costs)[top - 1] if len(costs) >= top else np.inf for s, costs in by_segment.items()}
    unsized = [(s, g) for (s, g) in cost_full if (s, g) not in sized]
    assert unsized or len(inst.gpus) <= top         # with no more options than plans wanted every one is sized
    assert all(cost_full[s, g] > best[s] for s, g in unsized)
    # and each segment keeps its cheapest candidate
    assert all((s, g) in sized for (s, g), cost in cost_full.items() if cost == min(by_segment[s]))


@pytest.mark.parametrize("top", [1, 2, 3])
@pytest.mark.parametrize("case", sorted(k for k, v in BOUND.items() if v == "dominance"))
def test_dominance_leaves_the_pruned_candidates_of_the_full_sizing(case, top, repo_root):
    """The dominance rule leaves unsized only candidates the pruning would drop (for ``--top N``, those N
    others dominate): the pruned candidates, what the MIP is built from, are those of the full sizing, each with
    its columns."""
    inst = _load(repo_root, case)
    full = solve_mod._prune(inst, cand.generate_candidates(inst), top)
    part = solve_mod._prune(inst, cand.generate_candidates(inst, bounded="dominance", top=top), top)
    assert len(part) == len(full) and part.n_choices == full.n_choices
    _same_rows(full, part)


@pytest.mark.parametrize("top", [1, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bounded_solve_returns_the_plan_of_the_full_sizing(case, top, repo_root, monkeypatch):
    """The plan, and with ``--top N`` every rank's objective, as sizing every candidate gives them."""
    inst = _load(repo_root, case)
    assert cand.bounded_sizing(inst, top) == BOUND[case]
    solve_mod.clear_report_cache()
    bounded = api.solve(inst, top=top)
    solve_mod.clear_report_cache()
    monkeypatch.setattr(solve_mod, "bounded_sizing", lambda *a: None)
    full = api.solve(inst, top=top)
    solve_mod.clear_report_cache()
    assert full.candidates_left_unsized == 0
    assert [p.objective for p in bounded.plans] == pytest.approx([p.objective for p in full.plans], rel=1e-12)
    if top == 1:
        assert (bounded.candidates_left_unsized > 0) == (case not in SKIPS_NONE)
    assert bounded.best is not None and full.best is not None
    assert bounded.best.objective == full.best.objective
    rows = lambda r: [(p.min_tokens, p.max_tokens, p.gpu, p.replicas, p.max_num_seqs) for p in r.best.fleet.pools]  # noqa: E731
    assert rows(bounded) == rows(full)
    assert bounded.best.fleet.power_kw == full.best.fleet.power_kw
    assert bounded.candidates_generated == full.candidates_generated
    if BOUND[case] == "dominance":      # the same pruned candidates: the same MIP
        assert bounded.candidates_after_pruning == full.candidates_after_pruning


def test_which_rule_a_solve_may_use(repo_root):
    quick = repo_root / "instances" / "quickstart.yaml"
    assert cand.bounded_sizing(api.load(quick)) == "cost"
    assert cand.bounded_sizing(api.load(quick), top=2) == "cost"          # what two cheaper ones rule out
    assert cand.bounded_sizing(api.load(quick), method="mip") == "dominance"
    assert cand.bounded_sizing(api.load(quick, ["slo.scope=fleet"])) is None     # miss rates enter the MIP
    for override in ("constraints.max_power_kw=100", "constraints.max_cost_per_hr=1000",
                     "constraints.max_total_gpus=100", "gpus.h100.max_count=64", "gpus.h100.min_pools=1",
                     "objective=power"):
        assert cand.bounded_sizing(api.load(quick, [override])) == "dominance", override
    with pytest.raises(ValueError, match="bounded must be one of"):
        cand.generate_candidates(api.load(quick), bounded="cheapest")


def _solve_json(*args) -> dict:
    res = CliRunner().invoke(main, ["solve", *map(str, args), "--json", "-"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_solve_json_counts_the_unsized_candidates(repo_root):
    quick = repo_root / "instances" / "quickstart.yaml"
    c = _solve_json(quick)["candidates"]
    # no batch caps and no compression: each (segment, option) is one candidate, sized or not
    assert c["left_unsized"] > 0
    assert c["generated"] == c["feasible"] + c["dropped_total"] + c["left_unsized"]
    c2 = _solve_json(quick, "--top", "2")["candidates"]     # two options, both sized first: none left out
    assert c2["left_unsized"] == 0 and c2["generated"] == c2["feasible"] + c2["dropped_total"]
    plain = CliRunner().invoke(main, ["solve", str(quick), "--format", "plain"])
    assert f"feasible {c['feasible']} ({c['left_unsized']} unsized: cheaper feasible candidates of their segment " \
           "rule them out)" \
        in " ".join(plain.output.split())


# ------------------------------------------------------------------ the floors are lower bounds


def _traffic(rng, n: int) -> BatchedTraffic:
    q = 4
    probs = rng.dirichlet(np.ones(q), size=n)
    return BatchedTraffic(arrival_rate=rng.uniform(0.0, 40.0, n), cap=rng.integers(0, 64, n).astype(float),
                          mean_iterations=rng.uniform(50, 500, n), cv2_iterations=rng.uniform(0.1, 2.0, n),
                          mean_work=rng.uniform(0.0, 2.0, n), mean_work_sq=rng.uniform(0.0, 8.0, n),
                          chunk_probs=probs, own_prefill_s=np.zeros((n, q)), W_s=0.02,
                          mean_kv_work=rng.uniform(0.0, 1.0, n), prefill_compute_s=np.zeros(n),
                          column_chunks=np.arange(q, dtype=float))


def test_batched_floor_is_the_closed_form_and_below_every_least_count():
    rng = np.random.default_rng(7)
    t = _traffic(rng, 200)
    floor = batched_utilization_floor(t, 0.85)
    cap = np.where(t.cap < 1, 1.0, t.cap)
    load = t.arrival_rate * (t.mean_work + t.mean_iterations * t.W_s / cap) / 0.85
    assert np.all(floor >= 1) and np.all(floor >= load - 1e-9) and np.all(floor < np.maximum(load, 1.0) + 1)
    z = batched_min_replicas(t, 2.0, 0.85)
    assert np.all(z.replicas[z.feasible] >= floor[z.feasible])
    assert np.array_equal(ttft.BatchedModel().count_floor(t, 0.85), floor)


def test_slot_floor_is_the_closed_form_and_below_every_least_count():
    rng = np.random.default_rng(11)
    n = 200
    lam, es, slots = rng.uniform(0.0, 30.0, n), rng.uniform(0.5, 20.0, n), rng.integers(1, 64, n).astype(float)
    floor = utilization_floor(lam, es, slots, 0.85)
    assert np.array_equal(floor, np.maximum(np.ceil(lam * es / (slots * 0.85) * (1 - 1e-12)), 1.0))
    z = min_replicas(lam, es, np.ones(n), slots, 1.5, np.array([0.05, 0.2]), np.tile([0.7, 0.3], (n, 1)),
                     np.full(n, 0.1), 0.85, "tail")
    assert np.all(z.replicas[z.feasible] >= floor[z.feasible])


def test_candidates_record_keeps_the_count_through_pruning(repo_root):
    inst = api.load(repo_root / "instances" / "quickstart.yaml")
    part = cand.generate_candidates(inst, bounded="cost")
    kept = part.keep_choices(np.ones(part.n_choices, dtype=bool))
    assert kept.left_unsized == part.left_unsized > 0


@pytest.mark.parametrize("case", ["quickstart", "compression", "tail-model", "tp-tpot"])
def test_count_floors_are_those_of_the_full_statistics(case, repo_root):
    """_count_floors reads the sums without the histograms and spectra; its floors are the ones the model gives on
    the full statistics of every candidate, the least over each row's batch caps."""
    from fleetopt.models.fleet import inflate_for_availability
    from fleetopt.models.segments import stats_from_raw

    inst = _load(repo_root, case)
    b = np.asarray(inst.pools.boundaries, dtype=float)
    gammas = (1.0,) + tuple(inst.pools.compress_gammas)
    rows = cand._candidate_rows(b, gammas)
    grid = np.unique(np.concatenate([b] + [g * b[1:-1] for g in gammas[1:]]))
    grid = grid[grid <= b[-1]]
    model = ttft.ttft_model(inst.slo.ttft_model)
    for opt in inst.gpus:
        raw = cand._chunk_traffic(inst, b, gammas, grid, rows, opt.profile.chunk_tokens)
        idx, caps, _ = cand.batch_caps(inst, opt.profile, b[rows[1]])
        s = stats_from_raw(raw.take(idx), b[rows[0][idx]], b[rows[1][idx]], opt.profile, n_slots=caps)
        floor = model.count_floor(model.traffic(s, inst.workload.arrival_rate_req_per_s * s.rate_share),
                                  inst.constraints.max_utilization)
        want = np.full(len(rows[0]), np.inf)
        np.minimum.at(want, idx, inflate_for_availability(floor, opt.availability).astype(float))
        assert np.array_equal(cand._count_floors(inst, opt, raw, b, rows), want), opt.name


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_baseline_is_the_same_without_the_options_left_unsized_on_the_full_range(case, repo_root):
    """The homogeneous baseline skips the options bounded sizing left unsized on (0, max_context]; it is the fleet
    that evaluating every option gives."""
    from fleetopt.optimizer.plan.evaluate import baseline

    inst = _load(repo_root, case)
    part = cand.generate_candidates(inst, bounded=BOUND[case])
    losers = solve_mod.unsized_on_full_range(inst, part)
    assert losers < {g.name for g in inst.gpus}
    full, fast = baseline(inst), baseline(inst, losers)
    assert full is not None and fast is not None
    assert fast.cost_per_hr == full.cost_per_hr and fast.power_kw == full.power_kw
    assert [(p.gpu, p.replicas) for p in fast.pools] == [(p.gpu, p.replicas) for p in full.pools]
    if case in ("quickstart", "stress", "tp-tpot"):
        assert losers        # some option is left out


def test_nothing_is_left_out_of_the_baseline_when_every_candidate_was_sized(repo_root):
    inst = api.load(repo_root / "instances" / "quickstart.yaml")
    assert solve_mod.unsized_on_full_range(inst, cand.generate_candidates(inst)) == frozenset()


def test_small_instances_size_every_candidate(repo_root, monkeypatch):
    monkeypatch.setattr(cand, "MIN_BOUNDED_ROWS", 2_000)
    quick = api.load(repo_root / "instances" / "quickstart.yaml")     # 342 rows: below the threshold
    assert cand.generate_candidates(quick, bounded="cost").left_unsized == 0
    monkeypatch.setattr(cand, "MIN_BOUNDED_ROWS", 342)
    assert cand.generate_candidates(quick, bounded="cost").left_unsized > 0
