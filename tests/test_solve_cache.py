"""The solve-report cache of :func:`fleetopt.optimizer.plan.solve.solve_instance`: keyed on the instance's content
(not its identity) and the options; a repeated solve returns the kept report, any change solves afresh."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.plan import solve as solve_mod
from fleetopt.optimizer.plan.solve import REPORT_CACHE_SIZE, SolveOptions, clear_report_cache, solve_instance

INSTANCE = Path(__file__).resolve().parents[1] / "instances" / "ref_puzzle10_lmsys.yaml"


@pytest.fixture
def calls(monkeypatch):
    """Counts the solves actually run (cache misses)."""
    clear_report_cache()
    ran = []
    real = solve_mod._solve_instance

    def counted(instance, options):
        ran.append(instance)
        return real(instance, options)

    monkeypatch.setattr(solve_mod, "_solve_instance", counted)
    yield ran
    clear_report_cache()


def test_a_repeated_solve_of_the_same_instance_is_served_from_the_cache(calls):
    inst = load_instance(INSTANCE)
    first = solve_instance(inst)
    second = solve_instance(inst)
    assert len(calls) == 1
    assert second.plans == first.plans and second.status == first.status and second.baseline == first.baseline
    assert second.instance is inst


def test_the_key_is_the_content_not_the_object(calls):
    first = solve_instance(load_instance(INSTANCE))
    again = load_instance(INSTANCE)       # another object, the same content
    second = solve_instance(again)
    assert len(calls) == 1
    assert second.plans == first.plans and second.instance is again


def test_a_changed_instance_is_solved_afresh(calls):
    inst = load_instance(INSTANCE)
    base = solve_instance(inst)
    rate = inst.workload.arrival_rate_req_per_s
    busier = dataclasses.replace(inst, workload=dataclasses.replace(inst.workload, arrival_rate_req_per_s=4 * rate))
    report = solve_instance(busier)
    assert len(calls) == 2
    # four times the traffic needs more replicas than the base plan: a stale report would show the base count
    replicas = lambda r: sum(p.replicas for p in r.best.fleet.pools)  # noqa: E731
    assert replicas(report) > replicas(base)


def test_an_array_changed_in_place_misses(calls):
    """The instance is frozen, its arrays are not: a key on identity would return the stale report."""
    inst = load_instance(INSTANCE)
    solve_instance(inst)
    prob = inst.workload.lengths.prob
    saved = prob.copy()
    prob[[0, -1]] = prob[[-1, 0]]          # swap the shortest and the longest bins' probabilities
    try:
        solve_instance(inst)
    finally:
        prob[:] = saved
    assert len(calls) == 2
    solve_instance(inst)                   # the original content again: the first report
    assert len(calls) == 2


def test_options_are_part_of_the_key(calls):
    inst = load_instance(INSTANCE)
    solve_instance(inst)
    no_baseline = solve_instance(inst, SolveOptions(compute_baseline=False))
    assert len(calls) == 2 and no_baseline.baseline is None


def test_a_time_limited_solve_is_never_cached(calls):
    inst = load_instance(INSTANCE)
    for options in (SolveOptions(time_limit_s=600.0), SolveOptions(time_limit_s=600.0)):
        solve_instance(inst, options)
    assert len(calls) == 2


def test_the_cache_is_bounded(monkeypatch, calls):
    monkeypatch.setattr(solve_mod, "_solve_instance", lambda instance, options: calls.append(options) or options)
    inst = load_instance(INSTANCE)
    for k in range(REPORT_CACHE_SIZE + 1):     # one more distinct solve than the cache holds
        solve_instance(inst, SolveOptions(mip_gap=k / 100))
    assert len(solve_mod._REPORTS) == REPORT_CACHE_SIZE
    solve_instance(inst, SolveOptions(mip_gap=0.0))    # the oldest was dropped: solved again
    assert len(calls) == REPORT_CACHE_SIZE + 2
