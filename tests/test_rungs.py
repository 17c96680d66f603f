"""The precision ladder that skips short rungs (``optimizer/simulation/pool_sizing.py``, "Precision ladder").

The estimate is checked against hand calculations of the :math:`1/\\sqrt n` law; the ladder against a fake run whose
half-width follows that law exactly (the rungs it must visit are worked out by hand below), and against the
simulator's own doubling loop (:func:`simulate_plan` with the same precision target), which it must reproduce.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from fleetopt.optimizer import api
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS
from fleetopt.optimizer.simulation.pool_sizing import ladder_run, needed_requests
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan


def _pool(value=100.0, ci=(90.0, 110.0), requests=1_000, p99_requests=None, rate=1.0, phase="both"):
    return SimpleNamespace(arrival_rate=rate, phase=phase, ttft_p99_ms_sim=value, ttft_p99_ci_ms=ci,
                           requests=requests, p99_requests=requests if p99_requests is None else p99_requests)


def test_needed_requests_follows_the_square_root_law():
    # h = 10 / 100 = 10 % against 5 %: (10 / 5)^2 = 4 times the 10,000 requests
    assert needed_requests(SimpleNamespace(pools=[_pool()], requests_simulated=10_000), "pool", 0.05) == 40_000
    # the widest pool decides: h = 20 % -> 16 x
    pools = [_pool(), _pool(ci=(80.0, 120.0))]
    assert needed_requests(SimpleNamespace(pools=pools, requests_simulated=10_000), "pool", 0.05) == 160_000


def test_needed_requests_asks_for_the_floor_of_measured_requests():
    # already precise (h = 1 %) but 50 measured: 500 / 50 = 10 x the run
    thin = _pool(ci=(99.0, 101.0), requests=50)
    assert needed_requests(SimpleNamespace(pools=[thin], requests_simulated=10_000), "pool", 0.05) == (
        10_000 * MIN_POOL_REQUESTS / 50)


def test_a_dedicated_run_counts_its_own_measured_requests():
    # interval over 8,000 dedicated requests at h = 10 %: 32,000 measured needed; the run measured 80 of 10,000
    row = _pool(requests=80, p99_requests=8_000)
    assert needed_requests(SimpleNamespace(pools=[row], requests_simulated=10_000), "pool", 0.05) == pytest.approx(
        10_000 * 32_000 / 80)


def test_rows_that_decide_nothing_ask_for_nothing():
    rows = [_pool(rate=0.0, requests=0), _pool(phase="decode", ci=(0.0, 1e9)),
            _pool(value=math.inf, ci=(1.0, math.inf))]
    assert needed_requests(SimpleNamespace(pools=rows, requests_simulated=10_000), "pool", 0.05) == 0.0
    starved = _pool(requests=0)
    assert needed_requests(SimpleNamespace(pools=[starved], requests_simulated=10_000), "pool", 0.05) == math.inf


def test_fleet_scope_reads_the_fleets_interval():
    fleet = SimpleNamespace(pools=[_pool(ci=(0.0, 1e9))], requests_simulated=10_000, ttft_p99_ms=200.0,
                            ttft_p99_ci_ms=(185.0, 215.0))          # h = 7.5 %: 2.25 x
    assert needed_requests(fleet, "fleet", 0.05) == pytest.approx(22_500)


@dataclass(frozen=True)
class _Report:
    options: SimOptions
    requests_simulated: int
    stopped_by: str
    ttft_p99_ms: float
    ttft_p99_ci_ms: tuple
    pools: tuple = ()
    wall_seconds: float = 0.0


def _law(need: int, calls: list):
    """A fleet run whose relative half-width is exactly 5 % x sqrt(need / n): precise from ``need`` requests on."""
    def run(o: SimOptions, progress):
        n = o.requests
        calls.append(n)
        h = 0.05 * math.sqrt(need / n)
        if progress is not None:
            progress(n, n)
        stop = "precision" if h <= o.precision else "max_requests"
        return _Report(o, n, stop, 100.0, (100.0 * (1 - h), 100.0 * (1 + h)))
    return run


def test_the_ladder_goes_to_the_largest_rung_at_or_below_the_estimate():
    # 20,000 requests: h = 5 % x sqrt(5) -> needs 100,000; of the rungs 40k, 80k, 160k the largest at or below
    # 100k is 80k (40k skipped); 80k has h = 5 % x sqrt(1.25) = 5.6 %, still short, and asks for 100k again:
    # the next rung, 160k, meets it (h = 4 %), where the doubling loop stops too
    calls, seen = [], []
    o = SimOptions(requests=20_000, precision=0.05, max_requests=400_000)
    report = ladder_run(_law(100_000, calls), o, "fleet", lambda d, t: seen.append((d, t)))
    assert calls == [20_000, 80_000, 160_000]
    assert report.stopped_by == "precision" and report.requests_simulated == 160_000
    assert report.options.requests == 20_000 and report.options.max_requests == 400_000   # as asked
    assert seen == [(20_000, 20_000), (100_000, 100_000), (260_000, 260_000)]            # counted over all rungs


def test_a_rung_that_meets_the_target_is_not_skipped():
    # needs 70,000: from 20k the estimate is 70k, so 40k (80k is above it); 40k asks for 70k again -> 80k, the
    # first rung that meets it (h = 5 % x sqrt(70 / 80) = 4.7 %): the doubling loop's own rungs
    calls = []
    o = SimOptions(requests=20_000, precision=0.05, max_requests=400_000)
    assert ladder_run(_law(70_000, calls), o, "fleet").requests_simulated == 80_000
    assert calls == [20_000, 40_000, 80_000]


def test_the_ladder_stops_at_the_top_rung_under_max_requests():
    # never precise below 10 million; rungs under 100,000: 20k, 40k, 80k -> straight to 80k, then stop
    calls = []
    o = SimOptions(requests=20_000, precision=0.05, max_requests=100_000)
    report = ladder_run(_law(10_000_000, calls), o, "fleet")
    assert calls == [20_000, 80_000] and report.stopped_by == "max_requests"
    assert report.requests_simulated == 80_000


def test_rungs_are_whole_replications_and_no_target_is_one_run():
    calls = []
    ladder_run(_law(10_000_000, calls), SimOptions(requests=20_001, precision=0.05, max_requests=50_000), "fleet")
    assert calls == [20_005, 40_010]            # ceil(20,001 / 5) = 4,001 per replication, doubled
    calls.clear()
    o = SimOptions(requests=20_000)
    one = ladder_run(lambda opts, progress: calls.append(opts) or "one run", o, "fleet")
    assert one == "one run" and calls == [o]


@pytest.mark.slow
def test_the_ladder_reports_what_the_doubling_loop_reports(repo_root):
    """Puzzle 2's first plan at 10 %: the doubling loop runs 5k, 10k, 20k, 40k (all short of it) and stops at 80k;
    the ladder skips some of those rungs and reports what the doubling loop reports."""
    inst = api.load(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml")
    pools = plans_from_spec(inst, "0-16384:h100x8,16384-65536:h100x12")
    o = SimOptions(requests=5_000, precision=0.1, max_requests=80_000)
    calls = []

    def run(opts, progress):
        calls.append(opts.requests)
        return simulate_plan(inst, pools, opts, progress=progress)

    ours = ladder_run(run, o, inst.slo.scope)
    theirs = simulate_plan(inst, pools, o)
    strip = lambda r: {k: v for k, v in json.loads(json.dumps(r.to_json(), default=str)).items()  # noqa: E731
                       if k != "wall_seconds"}
    assert theirs.stopped_by == "precision" and theirs.requests_simulated == 80_000
    assert strip(ours) == strip(theirs)
    assert calls[0] == 5_000 and calls[-1] == 80_000 and len(calls) < 5
