"""1/W paper, Table 3: fleets at 1,000 req/s, P99 TTFT 500 ms, H100 (calibrated) and B200 (projected) units.

Rows: homogeneous 64K pool; pool routing at B_short (Azure 4,096, LMSYS 1,536); FleetOpt (the short pool
also takes requests up to 2 x B_short, compressed). fleetopt computes these exactly with its own,
physical conventions; the paper's numbers come from the reference tool's conventions, which differ in
three documented places. This test shows both:

1. ``test_tool_conventions_reproduce_the_paper``: emulating the tool's three conventions on top of
   fleetopt's exact queueing reproduces every row within 10 % (LMSYS homogeneous rows: within the tool's
   own Monte-Carlo standard error, see below).
2. ``test_fleetopt_rows``: fleetopt's own numbers for the same topologies, pinned against the paper with
   the gap each convention explains.

The tool's conventions:

* **long-pool sub-CDF**: the tool calibrates the long pool on the CDF above B_short without passing the
  lower clamp, so its first bucket is sampled from 1 token instead of from B_short: the long pool's
  requests look shorter (Azure: 45 instead of 65 H100s).
* **compressed requests**: the tool clamps a request above the window to exactly B tokens split 80/20,
  i.e. it also cuts the *output*; fleetopt compresses the prompt and keeps the output.
* **tok/W numerator**: the tool counts the original outputs of compressed requests while serving the
  clamped ones.
* **Monte-Carlo moments**: E[S] comes from 3,000 samples; for the full LMSYS range (cv^2 = 63 on H100,
  90 on B200) that estimate has a 14-17 % standard error, which bounds how close any exact computation
  can get to the homogeneous LMSYS rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetopt.models.fleet import PoolPlan, ServiceLevel, _evaluate_pool
from fleetopt.models.segments import RawSums, context_work, raw_between, segment_basis, segment_stats
from fleetopt.models.workload import LengthDistribution
from fleetopt.optimizer import api
from fleetopt.optimizer.io.catalog import data_dir, load_catalog
from fleetopt.optimizer.plan.solve import solve_instance

PAPER = {  # (GPUs, kW, tok/W) for Homo 64K, Pool routing, FleetOpt
    ("azure", "h100"): [(141, 58.3, 5.58), (68, 32.0, 9.16), (40, 23.1, 14.08)],
    ("azure", "b200"): [(47, 33.4, 9.74), (25, 19.1, 15.39), (17, 13.7, 23.71)],
    ("lmsys", "h100"): [(69, 28.5, 4.77), (38, 16.4, 7.91), (29, 12.9, 10.30)],
    ("lmsys", "b200"): [(24, 17.0, 7.98), (16, 11.7, 11.12), (12, 9.0, 14.82)],
}
B_SHORT = {"azure": 4096, "lmsys": 1536}
PROFILE = {"h100": "H100-80GB", "b200": "B200-projected"}
LEVEL = ServiceLevel(0.5, "mean-prefill")


def _cdf(name):
    data = json.loads((data_dir() / "workloads" / f"{name}_cdf.json").read_text())
    return data["cdf"] if isinstance(data, dict) else data


def _pool(dist, lo, hi, window, prof, lam, clamp=False):
    """One pool on ``dist`` restricted to (lo, hi] at context ``window``; ``clamp``: requests above the
    window become window-length requests split 80/20 (the tool's convention)."""
    grid = np.unique([0, lo, hi, window, 65536.0])
    basis = segment_basis(dist, grid, prof.chunk_tokens, 0.8)
    at = {float(x): k for k, x in enumerate(grid)}
    if not clamp:
        raw = raw_between(basis, at[lo], at[hi])
    else:
        raw = raw_between(basis, at[lo], at[window])
        mass = raw_between(basis, at[window], at[hi]).mass[0]
        length = window
        out = length - int(0.8 * length)
        k = np.ceil(int(0.8 * length) / prof.chunk_tokens)
        a = k + out
        hist = np.zeros((1, int(k) + 1))
        hist[0, int(k)] = mass
        values = (mass, mass * a, mass * a * length, mass * a * a, mass * a * a * length, mass * a * a * length ** 2,
                  mass * k, mass * out, mass * length)
        work, work2 = context_work(int(0.8 * length), out, prof.chunk_tokens)
        raw = raw + RawSums(*(np.array([v]) for v in values), hist, np.array([mass * work]), np.array([mass * work2]))
    result, _ = _evaluate_pool(raw, PoolPlan(lo, window, "x", prof), lam, LEVEL)
    return result


def _tool_long(points, cut):
    """The tool's long-pool sub-CDF: renormalised above ``cut``, first bucket starting at 0 tokens."""
    full = LengthDistribution.from_cdf(points)
    alpha = float(full.cdf(cut))
    long_ = [(t, (f - alpha) / (1 - alpha)) for t, f in points if t > cut]
    long_[-1] = (long_[-1][0], 1.0)
    return LengthDistribution.from_cdf(long_), 1 - alpha


def _totals(pools, output_tok_per_s=None):
    kw = sum(p.power_w for p in pools) / 1000.0
    out = sum(p.output_tok_per_s for p in pools) if output_tok_per_s is None else output_tok_per_s
    return sum(p.replicas for p in pools), kw, out / (kw * 1000.0)


def tool_rows(workload: str, gpu: str):
    prof = load_catalog().profiles[PROFILE[gpu]]
    points = _cdf(workload)
    full = LengthDistribution.from_cdf(points)
    b = B_SHORT[workload]
    homo = [_pool(full, 0, 65536, 65536, prof, 1000.0)]
    long_dist, share = _tool_long(points, b)
    pool = [_pool(full, 0, b, b, prof, 1000.0), _pool(long_dist, 0, 65536, 65536, prof, 1000.0 * share)]
    long2, share2 = _tool_long(points, 2 * b)
    fleetopt = [_pool(full, 0, 2 * b, b, prof, 1000.0, clamp=True),
                _pool(long2, 0, 65536, 65536, prof, 1000.0 * share2)]
    # numerator: original outputs of every request, 0.2 x its original length
    grid = np.array([0.0, 2 * b, 65536.0])
    s = segment_stats(segment_basis(full, grid, prof.chunk_tokens, 0.8), [0, 1], [1, 2], prof)
    original_out = 1000.0 * float(np.sum(s.rate_share * s.mean_output_tokens))
    return [_totals(homo), _totals(pool), _totals(fleetopt, original_out)]


@pytest.mark.parametrize("workload,gpu", sorted(PAPER))
def test_tool_conventions_reproduce_the_paper(workload, gpu):
    prof = load_catalog().profiles[PROFILE[gpu]]
    full = LengthDistribution.from_cdf(_cdf(workload))
    homo_cv2 = segment_stats(segment_basis(full, np.array([0.0, 65536.0]), prof.chunk_tokens, 0.8), [0], [1],
                             prof).cv2_service[0]
    mc_stderr = float(np.sqrt(homo_cv2 / 3000))
    for row, (ours, paper) in enumerate(zip(tool_rows(workload, gpu), PAPER[(workload, gpu)])):
        tol = max(0.10, mc_stderr) if row == 0 else 0.10
        for value, printed in zip(ours, paper):
            assert abs(value / printed - 1) <= tol, (workload, gpu, row, ours, paper)


FLEETS = {"azure": ["0-64k:{g}", "0-4096:{g},4096-64k:{g}", "0-4096:{g}@2,4096-64k:{g}"],
          "lmsys": ["0-64k:{g}", "0-1536:{g},1536-64k:{g}", "0-1536:{g}@2,1536-64k:{g}"]}
@pytest.mark.parametrize("workload,gpu", sorted(PAPER))
def test_fleetopt_rows(repo_root, workload, gpu):
    """fleetopt's exact rows against the tool's conventions (docs/seeds.md shows all three sets of numbers).

    No convention of the tool touches the homogeneous row, so it must equal the emulation exactly. The
    tool's long-pool sub-CDF makes long requests look shorter and its compression also cuts outputs, so
    the exact pool-routing and FleetOpt rows need at least as many replicas as the emulated ones. The
    paper's qualitative result must survive: pool routing beats homogeneous, FleetOpt beats pool routing.
    """
    inst = api.load(repo_root / "instances" / f"ref_1w_table3_{workload}.yaml")
    rep = api.evaluate_report(inst, [f.format(g=gpu) for f in FLEETS[workload]])
    exact = [r for _, r in rep.fleets]
    tool = tool_rows(workload, gpu)
    assert all(r.feasible for r in exact)
    assert exact[0].total_replicas == tool[0][0] and exact[0].power_kw == pytest.approx(tool[0][1], rel=1e-9)
    for r, (replicas, _, _) in zip(exact[1:], tool[1:]):
        assert r.total_replicas >= replicas
    tpw = [r.tok_per_watt for r in exact]
    assert tpw == sorted(tpw)


@pytest.mark.parametrize("workload", ["azure", "lmsys"])
def test_free_topology_is_at_least_as_efficient(repo_root, workload):
    """With boundaries, GPU and compression free, the optimizer's tok/W is at least the FleetOpt row's."""
    import yaml

    from fleetopt.optimizer.io.instance import instance_from_dict

    path = repo_root / "instances" / f"ref_1w_table3_{workload}.yaml"
    data = yaml.safe_load(path.read_text())
    best_fixed = 0.0
    for gpu in ("h100", "b200"):
        one = dict(data, gpus=[g for g in data["gpus"] if g["name"] == gpu])
        inst = instance_from_dict(one, path)
        fixed = api.evaluate_report(inst, FLEETS[workload][2].format(g=gpu)).fleets[0][1]
        free = solve_instance(inst)
        assert free.status == "optimal" and free.best.fleet.feasible
        assert free.best.fleet.tok_per_watt >= fixed.tok_per_watt - 1e-9
        best_fixed = max(best_fixed, fixed.tok_per_watt)
    both = solve_instance(instance_from_dict(data, path))
    assert both.best.fleet.tok_per_watt >= best_fixed - 1e-9
