"""Candidate sizing across TTFT SLOs: a SizingCache changes the work, never the candidates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetopt.models.queueing.batched import BatchedTraffic, batched_min_replicas
from fleetopt.models.segments import segment_basis, raw_between, stats_from_raw
from fleetopt.optimizer import api
from fleetopt.optimizer.plan.candidates import Candidates, SizingCache, generate_candidates
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.plan.solve import _pool_plans

ARRAYS = ("i", "j", "gpu", "arrival_rate", "output_tok_per_s", "choice_pool", "choice_replicas", "choice_gpus",
          "choice_cost_per_hr", "choice_power_w", "choice_miss_rate", "state_in", "state_out", "cap", "load_erlangs",
          "min_replicas_analytic")


def _same(a: Candidates, b: Candidates) -> None:
    for name in ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert [(d.lo_tokens, d.hi_tokens, d.gpu, d.reason) for d in a.dropped] == \
        [(d.lo_tokens, d.hi_tokens, d.gpu, d.reason) for d in b.dropped]


@pytest.mark.parametrize("slos_ms", [(500, 300, 200, 120), (200, 500, 120, 300, 300)])
def test_cached_sizing_equals_fresh_sizing(repo_root, slos_ms):
    """Tightening (the frontier's order) and an arbitrary order with a repeat: every set of candidates, counts,
    costs, power and dropped reasons equals the one sized from scratch."""
    cache = SizingCache()
    for slo in slos_ms:
        inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", [f"slo.ttft_p99_ms={slo}"])
        _same(generate_candidates(inst, cache=cache), generate_candidates(inst))


def test_cache_refuses_an_instance_that_differs_beyond_the_slo(repo_root):
    cache = SizingCache()
    generate_candidates(api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), cache=cache)
    other = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", ["workload.arrival_rate=50"])
    with pytest.raises(ValueError, match="slo.ttft_p99_ms"):
        generate_candidates(other, cache=cache)


def test_search_from_a_known_lower_count_finds_the_same_least_count(repo_root):
    """``at_least`` = the least count under a looser SLO (every smaller count fails at the tighter one): the
    answer equals the search from the utilisation floor, and so does a start at the answer itself."""
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    prof = inst.gpus[1].profile
    w = inst.workload
    b = np.array([0, 1024, 4096, 16384, 65536], dtype=float)
    basis = segment_basis(w.lengths, b, prof.chunk_tokens, w.input_fraction)
    lo, hi = np.triu_indices(len(b), k=1)
    caps = np.asarray(prof.n_slots(b[hi].astype(np.int64)), dtype=np.int64)
    s = stats_from_raw(raw_between(basis, lo, hi), b[lo], b[hi], prof, n_slots=caps)
    traffic = BatchedTraffic.from_stats(s, w.arrival_rate_req_per_s * s.rate_share)
    loose = batched_min_replicas(traffic, 0.8, 0.85)
    for slo in (0.8, 0.4, 0.25):
        fresh = batched_min_replicas(traffic, slo, 0.85)
        hinted = batched_min_replicas(traffic, slo, 0.85, at_least=np.where(loose.feasible, loose.replicas, 1))
        at_answer = batched_min_replicas(traffic, slo, 0.85, at_least=fresh.replicas)
        for z in (hinted, at_answer):
            np.testing.assert_array_equal(z.replicas, fresh.replicas)
            np.testing.assert_array_equal(z.feasible, fresh.feasible)
            np.testing.assert_array_equal(z.bound_by_utilization, fresh.bound_by_utilization)
    assert fresh.feasible.any() and (fresh.replicas >= loose.replicas)[fresh.feasible].all()


def test_evaluation_without_the_fleet_p99_keeps_pools_and_totals(repo_root):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    c = generate_candidates(inst)
    first = [int(np.flatnonzero(c.choice_pool == p)[0]) for p in range(len(c))
             if c.i[p] == 0 and c.boundaries[c.j[p]] == c.boundaries[-1]][:1]
    plans = _pool_plans(inst, c, tuple(first))
    full, lean = evaluate_plans(inst, plans), evaluate_plans(inst, plans, fleet_p99=False)
    assert math.isnan(lean.ttft_p99_ms) and math.isfinite(full.ttft_p99_ms)
    assert lean.pools == full.pools
    assert (lean.cost_per_hr, lean.power_kw, lean.total_gpus) == (full.cost_per_hr, full.power_kw, full.total_gpus)


def test_tightening_table_is_a_relaxation_until_verified_then_exact(repo_root):
    """Lazily sized candidates (the cost,ttft frontier's): before verification every count is at most the one
    sized from scratch at the tighter SLO (and every candidate sized from scratch is still there); once all are
    verified the table equals the candidates sized from scratch, field by field."""
    from fleetopt.optimizer.plan.candidates import TighteningCandidates

    path = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    lazy = TighteningCandidates(api.load(path, ["slo.ttft_p99_ms=500"]))
    with pytest.raises(ValueError, match="looser"):
        lazy.tighten(0.6)
    for slo_ms in (300, 180):
        tighter = api.load(path, [f"slo.ttft_p99_ms={slo_ms}"])
        lazy.tighten(tighter.slo.ttft_sizing_s)   # the SLO less its margin, as generate_candidates sizes
        fresh = generate_candidates(tighter)
        table, ids = lazy.table()
        keys = {k: n for k, n in zip(zip(table.i, table.j, table.gpu, table.cap), table.min_replicas_analytic)}
        assert len(keys) == len(table)
        for k, n in zip(zip(fresh.i, fresh.j, fresh.gpu, fresh.cap), fresh.min_replicas_analytic):
            assert keys[k] <= n
        assert np.any([keys[k] < n for k, n in zip(zip(fresh.i, fresh.j, fresh.gpu, fresh.cap),
                                                     fresh.min_replicas_analytic)]) or slo_ms == 300
        assert not lazy.verify(ids)          # some count moved (or some candidate went) at the tighter SLO
        assert lazy.verify(lazy.table()[1])  # verified: nothing moves any more
        _same_pools(lazy.table()[0], fresh)


def _same_pools(a: Candidates, b: Candidates) -> None:
    """Counts and integers equal; figures re-priced on a subset of candidates equal to round-off (the vectorised
    operating point sums in another order)."""
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        if np.issubdtype(np.asarray(y).dtype, np.integer):
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize("name, sets", [pytest.param("ref_units_stress_60x8.yaml", ["slo.ttft_p99_ms=2000"],
                                                     marks=pytest.mark.slow),
                                        ("ref_units_lmsys_a100_h100.yaml", [])])
def test_power_grows_with_the_count_from_the_least_count_on(repo_root, name, sets):
    """What makes a table of lower-bound counts a relaxation (TighteningCandidates): from a candidate's least
    count on, one more replica never lowers the pool's analytic power (its load's work is the same and the
    replica adds its idle draw). Checked on every candidate, for 20 counts above the least."""
    import fleetopt.optimizer.plan.candidates as C

    inst = api.load(repo_root / "instances" / name, sets)
    cache = SizingCache()
    c = generate_candidates(inst, cache=cache)
    checked = 0
    for g, opt in enumerate(inst.gpus):
        inputs, rows, least = cache.inputs[g], cache.feasible_rows(g), c.min_replicas_analytic[c.gpu == g]
        for extra in range(20):
            n = least + extra
            now = C._choice_columns(opt, inputs, rows, n, np.zeros(len(rows)))
            more = C._choice_columns(opt, inputs, rows, n + 1, np.zeros(len(rows)))
            assert np.all(more["power"] >= now["power"] * (1 - 1e-12))
            assert np.all(more["cost"] >= now["cost"]) and np.all(more["gpus"] >= now["gpus"])
            checked += len(rows)
    assert checked > 1000
