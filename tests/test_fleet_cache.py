"""evaluate_fleet keeps a tiling's traffic sums, a pool's statistics and its batched traffic between calls (they do
not depend on replica counts): every result read back must equal the one computed afresh with the caches empty,
whatever changes between the calls (counts, batch caps, GPU, windows, the workload)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetopt.models import fleet as fleet_mod
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.plan.evaluate import evaluate_plans, parse_fleet, spec_plans


def _clear():
    fleet_mod._TRAFFIC.clear()
    fleet_mod._STATS.clear()
    fleet_mod._BATCHED.clear()


@pytest.fixture(scope="module")
def quickstart():
    return load_instance("instances/quickstart.yaml")


SPECS = ["0-4096:a100x3,4096-65536:h100x4",
         "0-4096:a100x2,4096-65536:h100x4",              # another count: statistics read back
         "0-4096:a100x3#16,4096-65536:h100x4",           # another batch cap: other statistics
         "0-4096:h100x3,4096-65536:h100x4",              # another GPU on the same window
         "0-8192:a100x3,8192-65536:h100x4"]              # other windows: other sums


def test_results_read_back_equal_fresh_ones(quickstart):
    _clear()
    warm = [evaluate_plans(quickstart, spec_plans(quickstart, parse_fleet(s, quickstart))) for s in SPECS * 2]
    fresh = []
    for s in SPECS * 2:
        _clear()
        fresh.append(evaluate_plans(quickstart, spec_plans(quickstart, parse_fleet(s, quickstart))))
    assert warm == fresh
    assert warm[0] != warm[1] and warm[0] != warm[2] and warm[0] != warm[3]


def test_another_workload_is_not_served_from_the_cache(quickstart):
    _clear()
    plans = spec_plans(quickstart, parse_fleet(SPECS[0], quickstart))
    first = evaluate_plans(quickstart, plans)
    other = load_instance("instances/quickstart.yaml", ["workload.cdf=builtin:azure", "pools.max_context=8192"])
    plans_other = spec_plans(other, parse_fleet("0-4096:a100x3,4096-8192:h100x4", other))
    got = evaluate_plans(other, plans_other)
    _clear()
    assert got == evaluate_plans(other, plans_other)
    assert got.pools[0].arrival_rate != first.pools[0].arrival_rate


def test_the_caches_stay_bounded(quickstart, monkeypatch):
    monkeypatch.setattr(fleet_mod, "STATS_CACHE_SIZE", 3)
    monkeypatch.setattr(fleet_mod, "TRAFFIC_CACHE_SIZE", 2)
    _clear()
    for n, edge in enumerate((2048, 4096, 8192, 16384), start=8):
        plans = spec_plans(quickstart, parse_fleet(f"0-{edge}:a100x3,{edge}-65536:h100x4", quickstart))
        evaluate_plans(quickstart, [replace(plans[0], max_num_seqs=n), plans[1]], fleet_p99=False)
    assert len(fleet_mod._STATS) == len(fleet_mod._BATCHED) == 3
    assert len(fleet_mod._TRAFFIC) == 2


def test_threads_share_the_caches(quickstart, monkeypatch):
    """A Dask worker evaluates in threads of one process: with the caches small enough to evict all the time,
    every thread still gets what a fresh evaluation gives."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(fleet_mod, "STATS_CACHE_SIZE", 1)
    monkeypatch.setattr(fleet_mod, "TRAFFIC_CACHE_SIZE", 1)
    plans = [spec_plans(quickstart, parse_fleet(s, quickstart)) for s in SPECS[:4]]
    want = []
    for p in plans:
        _clear()
        want.append(evaluate_plans(quickstart, p, fleet_p99=False))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: evaluate_plans(quickstart, plans[k % 4], fleet_p99=False), range(16)))
    assert all(g.pools == want[k % 4].pools for k, g in enumerate(got))      # (the fleet P99 is NaN: not asked)
