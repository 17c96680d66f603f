"""``pareto --axes``: every frontier point against exhaustive enumeration on small random instances.

The enumeration is independent of the solver: every 1- and 2-pool layout on the instance's boundaries times every
GPU assignment, each pool sized by ``fleetopt evaluate`` (its least analytic count; for the TTFT axis also 1..3
replicas more), priced and judged by the evaluate path; the true non-dominated set of (cost, axis) is computed
here by brute force and compared with the command's points (1e-6 relative).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.api import evaluate_report
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.workflows.frontier import frontier

PROFILES = ("A100-80GB", "H100-80GB", "B200-projected")
REL = 1e-6


def _instance(tmp_path, seed: int, max_context: int = 65536):
    rng = np.random.default_rng(seed)
    inner = sorted(int(b) for b in rng.choice([512, 1024, 2048, 4096, 8192, 16384], size=2, replace=False))
    gpus = [{"name": f"g{k}", "profile": str(p)} for k, p in enumerate(rng.choice(PROFILES, size=2, replace=False))]
    data = {"name": f"rand{seed}", "workload": {"cdf": "builtin:lmsys", "arrival_rate": float(rng.uniform(5, 40))},
            "slo": {"ttft_p99_ms": float(rng.uniform(800, 2000))}, "gpus": gpus,
            "pools": {"max_pools": 2, "max_context": max_context, "boundaries": inner}}
    path = tmp_path / f"rand{seed}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_instance(path)


def _layouts(inst):
    b = inst.pools.boundaries
    yield [(0, b[-1])]
    for k in range(1, len(b) - 1):
        yield [(0, b[k]), (b[k], b[-1])]


def _plans(inst, extra: int = 0):
    """(cost $/hr, power kW, worst P99 ms, pools) of every plan meeting the SLO and the utilisation cap."""
    names = [g.name for g in inst.gpus]
    out = []
    for layout in _layouts(inst):
        for gpus in itertools.product(names, repeat=len(layout)):
            spec = ",".join(f"{lo}-{hi}:{g}" for (lo, hi), g in zip(layout, gpus))
            least = evaluate_report(inst, spec).fleets[0][1]
            if not least.feasible:
                continue
            for adds in itertools.product(range(extra + 1), repeat=len(layout)):
                counted = ",".join(f"{lo}-{hi}:{g}x{p.replicas + a}"
                                   for (lo, hi), g, p, a in zip(layout, gpus, least.pools, adds))
                r = evaluate_report(inst, counted).fleets[0][1] if any(adds) else least
                if not r.feasible:
                    continue
                worst = max(p.ttft_p99_ms for p in r.pools if p.routing_share > 0)
                out.append((r.cost_per_hr, r.power_kw, worst, float(len(layout))))
    return out


def _front(points):
    """Brute-force non-dominated set of (cost, axis) pairs, sorted by cost (repeats merged)."""
    def dom(a, b):
        return a[0] <= b[0] * (1 + 1e-12) and a[1] <= b[1] * (1 + 1e-12) and (
            a[0] < b[0] * (1 - REL) or a[1] < b[1] * (1 - REL))
    kept = [p for p in points if not any(dom(q, p) for q in points)]
    out = []
    for p in sorted(kept):
        if not out or not (abs(p[0] - out[-1][0]) <= REL * p[0] and abs(p[1] - out[-1][1]) <= REL * max(p[1], 1)):
            out.append(p)
    return out


def _assert_same(got, want):
    assert len(got) == len(want), (got, want)
    for (c, a), (c0, a0) in zip(got, want):
        assert c == pytest.approx(c0, rel=REL) and a == pytest.approx(a0, rel=REL, abs=1e-9)


def _check(tmp_path, seed, axis):
    inst = _instance(tmp_path, seed)
    f = frontier(inst, axis)
    got = [(p.cost_per_hr, p.axis_value) for p in f.points]
    if axis == "ttft":
        plans = _plans(inst, extra=3)
        c_min = min(p[0] for p in plans)
        # any plan costing at most c_min + 3 * (cheapest replica) adds at most 3 replicas to a pool (module docstring)
        one = min(r for r in (evaluate_report(inst, f"0-{inst.pools.boundaries[-1]}:{g.name}x1")
                              .fleets[0][1].cost_per_hr
                              for g in inst.gpus))
        cap = c_min + 3 * one * (1 - 1e-9)
        want = _front([(p[0], p[2]) for p in plans if p[0] <= cap])
        got = [g for g in got if g[0] <= cap]
    else:
        want = _front([(p[0], p[1] if axis == "power" else p[3]) for p in _plans(inst)])
    _assert_same(got, want)
    assert f.recommended is None or 0 <= f.recommended < len(f.points)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("axis", ["power", "pools"])
def test_frontier_equals_enumeration(tmp_path, seed, axis):
    _check(tmp_path, seed, axis)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_ttft_frontier_equals_enumeration(tmp_path, seed):
    _check(tmp_path, seed, "ttft")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 25))
@pytest.mark.parametrize("axis", ["power", "pools"])
def test_frontier_equals_enumeration_more(tmp_path, seed, axis):
    _check(tmp_path, seed, axis)


def test_recommended_point_is_on_the_frontier_and_json(tmp_path):
    from fleetopt.optimizer.commands.workflows import pareto as pareto_axes

    inst = _instance(tmp_path, 3)
    out = tmp_path / "f.json"
    res = CliRunner().invoke(pareto_axes, [str(inst.path), "--axes", "cost,pools", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    want = _front([(p[0], p[3]) for p in _plans(inst)])
    _assert_same([(p["cost_per_hr"], p["pools"]) for p in doc["points"]], want)
    k = doc["recommended"]
    assert doc["points"][k]["recommended"] and (doc["points"][k]["cost_per_hr"], doc["points"][k]["pools"]) in [
        (p["cost_per_hr"], p["pools"]) for p in doc["points"]]
    assert doc["axis_unit"] == "pools" and doc["baseline"]["pools"] == 1


@pytest.mark.parametrize("axes", ["cost,latency", "power,cost", "cost", "cost,power,pools"])
def test_bad_axes_is_one_line_exit_2(tmp_path, axes):
    from fleetopt.optimizer.commands.workflows import pareto as pareto_axes

    inst = _instance(tmp_path, 0)
    res = CliRunner().invoke(pareto_axes, [str(inst.path), "--axes", axes])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --axes:") and "Traceback" not in res.output
