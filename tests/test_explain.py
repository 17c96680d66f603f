"""``solve --explain`` data (:func:`fleetopt.optimizer.plan.explain.explain_plan`): relaxations from re-solves,
pool bottlenecks from the analytic evaluation at one replica fewer."""

from __future__ import annotations

import pytest
import yaml

from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.plan.explain import explain_plan
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance


def _resolve(inst):
    return solve_instance(inst, SolveOptions(compute_baseline=False))


def _write(tmp_path, data, name="i.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return load_instance(path)


BASE = {"workload": {"cdf": "builtin:lmsys", "arrival_rate": 40.0}, "slo": {"ttft_p99_ms": 1000},
        "gpus": [{"name": "a100", "profile": "A100-80GB"}, {"name": "h100", "profile": "H100-80GB"}],
        "pools": {"max_pools": 2, "max_context": 65536, "boundaries": [2048, 8192]}}


def test_relaxing_never_costs_more_and_a_slack_cap_is_worth_zero(tmp_path):
    free = _write(tmp_path, BASE, "free.yaml")
    plan = solve_instance(free).best.fleet
    # an inventory one GPU short of the free optimum's count on its dearest pool's GPU must bind; a power cap
    # 10 kW above the free optimum's power cannot (the free optimum stays feasible under it)
    gpu = max(plan.pools, key=lambda p: p.cost_per_hr).gpu
    used = sum(p.gpus for p in plan.pools if p.gpu == gpu)
    data = {**BASE, "gpus": [dict(g, max_count=used - 1) if g["name"] == gpu else g for g in BASE["gpus"]],
            "constraints": {"max_power_kw": plan.power_kw + 10.0}}
    inst = _write(tmp_path, data)
    report = solve_instance(inst)
    e = explain_plan(inst, report, resolve=_resolve)
    by = {r.limit: r for r in e.relaxations}
    assert set(by) == {"constraints.max_power_kw", f"gpus.{gpu}.max_count", "slo.ttft_p99_ms", "slo.ttft_margin",
                       "pools.max_pools"}      # the batched model's default margin is a limit too
    for r in e.relaxations:
        assert r.worth is not None and r.worth >= -1e-9 * max(1.0, e.objective_value)
    assert by["constraints.max_power_kw"].worth == 0.0 and by["constraints.max_power_kw"].binding is False
    # with one more GPU the inventory equals the free optimum's use: the free optimum is feasible again and optimal
    assert by[f"gpus.{gpu}.max_count"].objective == pytest.approx(plan.cost_per_hr, rel=1e-9)
    assert by[f"gpus.{gpu}.max_count"].binding == (report.best.fleet.cost_per_hr > plan.cost_per_hr * (1 + 1e-9))
    assert e.to_json()["binding"] == [r.limit for r in e.relaxations if r.binding]


def test_bottleneck_labels_hand_built(tmp_path):
    # a 100 s SLO cannot bind: a pool needing 3+ replicas at a 0.5 cap is set by the cap (at n-1 its load per
    # replica is at most 0.5 n / (n - 1) < 1, stable but above the cap); a pool of one replica is "one replica"
    data = {"workload": {"cdf": "builtin:lmsys", "arrival_rate": 60.0}, "slo": {"ttft_p99_ms": 100000},
            "gpus": [{"name": "a100", "profile": "A100-80GB"}],
            "pools": {"max_pools": 1, "max_context": 65536, "boundaries": [8192]},
            "constraints": {"max_utilization": 0.5}}
    inst = _write(tmp_path, data)
    report = solve_instance(inst)
    e = explain_plan(inst, report, resolve=_resolve)
    (pool,) = e.pools
    assert pool.replicas == report.best.fleet.pools[0].replicas
    assert pool.bottleneck == ("utilisation cap" if pool.replicas >= 3 else pool.bottleneck)
    assert pool.replicas >= 3
    slow = _write(tmp_path, {**data, "workload": {"cdf": "builtin:lmsys", "arrival_rate": 0.01}}, "slow.yaml")
    (one,) = explain_plan(slow, solve_instance(slow), resolve=_resolve).pools
    assert one.replicas == 1 and one.bottleneck == "one replica"
