"""``fleetopt gridflex`` (demand response) and ``fleetopt tpw --rho-sweep`` (issue 13, commands 5 and 6).

The cap inversion is checked against a brute-force scan of the power curve; depth 0 against the plain analytic
evaluation of the same fleet (``evaluate_plans``, the ``evaluate`` path); the sweep's safe depths against its own
per-depth flags (a consistency rule, stated in the module docstring); the utilisation sweep against the target it
was asked for. Puzzle 8 (the capacity-planning seed: 40 H100, Azure lambda = 200, SLO 500 ms) is a slow test with
the seed's table quoted.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import click
import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.service import DecodePower
from fleetopt.optimizer import api
from fleetopt.optimizer.commands.gridflex import gridflex as gridflex_cmd
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.workflows.gridflex import cap_under, gridflex, parse_depths
from fleetopt.optimizer.workflows.headroom import at_rate, fixed_pools
from fleetopt.optimizer.workflows.rho_sweep import rho_sweep

H100_AZURE = ["gpus=[{name: h100, profile: H100-80GB}]", "pools.max_pools=1"]
"""Azure conversations (8,192-token window) on H100 units (``instances/ref_puzzle3_azure_mixed.yaml`` narrowed to
H100)."""


@pytest.fixture(scope="module")
def azure(repo_root):
    return repo_root / "instances" / "ref_puzzle3_azure_mixed.yaml"


def _scan(curve, power_w: float, n_max: int) -> int:
    """Brute force: the largest n in 0..n_max with P(n) <= power_w, scanning every batch."""
    ok = [n for n in range(n_max + 1) if float(curve.power_w(n)) <= power_w]
    return max(ok) if ok else 0


@pytest.mark.parametrize("curve", [PowerCurve(300.0, 600.0, 1.0, 4.2, "measured"),
                                   PowerCurve(175.0, 400.0, 0.8, 3.5, "one-anchor"),
                                   PowerCurve(60.0, 150.0, 1.4, 2.0, "projected")])
def test_cap_inversion_matches_a_scan_of_the_power_curve(curve):
    n_max = 256
    for share in np.linspace(0.3, 1.0, 57):
        target = share * float(curve.power_w(n_max))
        assert cap_under(curve, target, n_max) == _scan(curve, target, n_max)


def test_cap_inversion_by_bisection_for_activity_power():
    curve = DecodePower(ActivityPower(70.0, 700.0, 400.0, 650.0, 1800.0), 0.004, 2e-5, 1e-5)
    n_max = 300
    for share in np.linspace(0.2, 1.0, 41):
        target = share * float(curve.power_w(n_max))
        assert cap_under(curve, target, n_max) == _scan(curve, target, n_max)


def test_parse_depths_rejects_full_curtailment():
    assert parse_depths("0,5%,5") == (0.0, 5.0)
    with pytest.raises(InstanceError, match="--depths"):
        parse_depths("0,100")


@pytest.fixture(scope="module")
def small_sweep(azure):
    """A small fleet under a short event: 4 H100 units at 20 req/s, 20-second events."""
    inst = api.load(azure, H100_AZURE + ["workload.arrival_rate=20"])
    return inst, gridflex(inst, "0-8192:h100x4", (0, 20, 40, 60), event_s=20.0, replications=2, seed=1,
                          convention="seed")


def test_depth_zero_is_the_uncapped_fleet(small_sweep):
    inst, g = small_sweep
    plans, _ = fixed_pools(inst, "0-8192:h100x4")
    plain = evaluate_plans(inst, plans)          # the evaluate path, no cap given
    zero = g.depths[0]
    assert zero.depth == 0
    assert zero.batch_cap == plain.pools[0].max_num_seqs == inst.gpu("h100").profile.n_slots(8192)
    assert zero.power_kw == pytest.approx(plain.power_kw, rel=1e-12)
    assert zero.ttft_p99_ms_analytic == pytest.approx(plain.ttft_p99_ms, rel=1e-12)


def test_power_and_cap_never_rise_with_depth(small_sweep):
    _, g = small_sweep
    caps = [r.batch_cap for r in g.depths]
    assert all(a >= b for a, b in zip(caps, caps[1:]))
    # each cap keeps a replica's draw under (1 - d) of the uncapped one, and one more sequence would not
    curve = PowerCurve(300.0, 600.0, 1.0, 4.2, "measured")    # data/catalog: the H100-80GB unit's measured curve
    ref = curve.power_w(caps[0])
    for r in g.depths:
        assert curve.power_w(r.batch_cap) <= (1 - r.depth / 100) * ref or r.batch_cap == 0
        assert curve.power_w(r.batch_cap + 1) > (1 - r.depth / 100) * ref or r.batch_cap == caps[0]
        # the fleet's mean draw never exceeds what the caps commit: replicas x (1 - d) x P(uncapped cap)
        assert r.power_kw * 1000 <= 4 * (1 - r.depth / 100) * ref * (1 + 1e-12) or r.batch_cap == 0
    # the mean power falls with depth while the capped pool is stable (past the point of instability the
    # evaluation charges every batch full, N P(cap), which can sit a hair above the last stable mean: docs)
    stable = [r.power_kw for r in g.depths if math.isfinite(r.ttft_p99_ms_analytic)]
    assert len(stable) >= 2
    assert all(b <= a * (1 + 1e-12) for a, b in zip(stable, stable[1:]))


def test_safe_depths_follow_the_flags(small_sweep):
    _, g = small_sweep
    for attr, flag in (("max_safe_depth_sustained", "sustained_ok"), ("max_safe_depth_event", "event_ok")):
        best = getattr(g, attr)
        flags = [getattr(r, flag) for r in g.depths]
        if best is None:
            assert not flags[0]
            continue
        k = [r.depth for r in g.depths].index(best)
        assert all(flags[:k + 1])
        assert k + 1 == len(flags) or not flags[k + 1]
    # 60 % leaves a cap of 1-2 sequences: far below the 20 req/s load, unstable in steady state
    deep = g.depths[-1]
    assert deep.ttft_p99_ms_analytic == math.inf and not deep.sustained_ok


def test_drain_is_when_each_batch_falls_within_its_cap(repo_root):
    # A cap lowered at t0 on loaded replicas: from t0 + drain on, no replica runs more than its cap (checked at
    # every start and end instant of the run), and just before it the replica still ran more.
    from fleetopt.models.workload import LengthDistribution
    from fleetopt.solvers.des.engine import CapChange, simulate
    from fleetopt.solvers.des.routing import LengthRouter, poisson_requests
    from fleetopt.solvers.des.state import SimPool
    from fleetopt.optimizer.io.catalog import load_catalog
    from fleetopt.optimizer.workflows.gridflex import drain_s

    h100 = load_catalog().profiles["H100-80GB"]
    cdf = LengthDistribution.from_cdf(json.loads((repo_root / "data" / "workloads" / "azure_cdf.json").read_text()))
    req = poisson_requests(cdf.truncated(8192)[0], 60.0, 6000, np.random.default_rng(3))
    t0, cap = 40.0, 3
    res = simulate([SimPool("p", h100, 3, None, 8192)], req, LengthRouter([0, 8192], ["p"]),
                   cap_changes=[CapChange(t0, "p", cap)])
    d = drain_s(res.start_at_s, res.end_at_s, res.replica, np.full(3, cap), t0)
    assert np.all(d > 0)                                   # every replica ran more than 3 at t0
    instants = np.unique(np.concatenate([res.start_at_s, res.end_at_s]))
    for r in range(3):
        s, e = res.start_at_s[res.replica == r], res.end_at_s[res.replica == r]

        def running(t, s=s, e=e):
            return int(np.sum((s <= t) & (e > t)))

        assert all(running(t) <= cap for t in instants[instants >= t0 + d[r]])
        assert running(np.nextafter(t0 + d[r], -np.inf)) > cap


def test_gridflex_cli_json(azure, tmp_path):
    out = tmp_path / "g.json"
    group = click.Group(commands={"gridflex": gridflex_cmd})
    res = CliRunner().invoke(group, ["gridflex", str(azure), "--fleet", "0-8192:h100x4", "--depths", "0,50",
                                     "--event-minutes", "0.2", "--replications", "1", "--set", H100_AZURE[0],
                                     "--set", H100_AZURE[1], "--set", "workload.arrival_rate=10",
                                     "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [d["depth"] for d in data["depths"]] == [0, 50]
    for d in data["depths"]:
        assert {"depth", "batch_cap", "power_kw", "ttft_p99_ms_analytic", "ttft_p99_ms_event", "sustained_ok",
                "event_ok", "drain_s_event"} <= set(d)
    assert {"max_safe_depth_sustained", "max_safe_depth_event"} <= set(data)
    bad = CliRunner().invoke(group, ["gridflex", str(azure), "--fleet", "0-8192:h100x4", "--depths", "0,120"])
    assert bad.exit_code == 2 and "--depths" in bad.output


# --------------------------------------------------------------------------------------------
# tpw --rho-sweep
# --------------------------------------------------------------------------------------------


def test_rho_sweep_hits_each_utilisation_and_tok_per_watt_rises(azure):
    inst = api.load(azure, H100_AZURE + ["workload.arrival_rate=100"])
    fleet = "0-8192:h100x8"
    s = rho_sweep(inst, fleet, (0.2, 0.5, 0.8))
    plans, _ = fixed_pools(inst, fleet)
    for q in s.pools[0].points:
        # re-evaluated independently at the reported fleet rate: the utilisation is the target
        again = evaluate_plans(at_rate(inst, q.fleet_arrival_rate), plans).pools[0]
        assert again.utilization == pytest.approx(q.rho, abs=1e-6)
        assert q.tok_per_watt == pytest.approx(again.output_tok_per_s / again.power_w, rel=1e-12)
        assert q.usd_per_mtok == pytest.approx(again.cost_per_hr / (3600 * again.output_tok_per_s) * 1e6, rel=1e-12)
    tpw = [q.tok_per_watt for q in s.pools[0].points]
    assert tpw[0] < tpw[1] < tpw[2]
    usd = [q.usd_per_mtok for q in s.pools[0].points]
    assert usd[0] > usd[1] > usd[2]


def test_tpw_without_instance_keeps_the_context_sweep():
    from fleetopt.optimizer.cli import main

    res = CliRunner().invoke(main, ["tpw", "--profile", "H100-80GB", "--contexts", "8192", "--json", "-"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)["rows"]
    assert len(rows) == 1 and rows[0]["context"] == 8192 and rows[0]["n_slots"] == 128


# --------------------------------------------------------------------------------------------
# Puzzle 8
# --------------------------------------------------------------------------------------------

PUZZLE8_SEED = {0: (128, 23.3, 35.2), 5: (84, 22.8, 36.1), 10: (48, 21.6, 38.4), 15: (33, 20.4, 39.9),
                20: (24, 19.1, 41.0), 25: (17, 17.7, 42.3), 30: (13, 16.5, 51.0), 40: (6, 14.0, 189.8),
                50: (1, 12.2, 449791.0)}
"""The seed's Puzzle 8 table (``vllm-sr-sim grid-flex --lam 200 --n-gpus 40 --gpu h100 --slo 500 --verify-des
15000``): depth % -> (n_max, fleet kW, P99 DES ms). Its analytic P99 is 7.9 ms up to 30 % and inf at 40 % and 50 %;
max safe flex: 30 % sustained, 40 % per event. The seed's fleet kW is 40 x P(n_max), the draw with every batch
full; its event is 15,000 requests (75 s) from an empty fleet."""


@pytest.mark.slow
def test_puzzle8_gridflex(azure):
    inst = api.load(azure, H100_AZURE + ["workload.arrival_rate=200"])
    g = gridflex(inst, "0-8192:h100x40", tuple(range(0, 55, 5)), event_s=120.0, replications=2,
                 convention="seed")
    rows = {r.depth: r for r in g.depths}
    curve = PowerCurve(300.0, 600.0, 1.0, 4.2, "measured")
    # depth 0: the seed's cap and baseline draw (583 W per unit, 40 units: 23.3 kW with every batch full)
    assert rows[0].batch_cap == 128
    assert 40 * curve.power_w(128) / 1000 == pytest.approx(PUZZLE8_SEED[0][1], abs=0.05)
    # our caps are the exact floor of the inverse: within the seed's at the deep end, below it where the curve
    # is flat (5 %: P(84) = 570 W is above 0.95 x 583 = 554 W, so 84 is not under the cap; the seed's 84 is
    # its own rounding)
    for d in (20, 25, 30):
        assert abs(rows[d].batch_cap - PUZZLE8_SEED[d][0]) <= 3
    assert curve.power_w(PUZZLE8_SEED[5][0]) > 0.95 * curve.power_w(128)
    # our power is the mean at the operating point (batch about 8 per unit at 200 req/s), not 40 x P(cap):
    # it stays below the seed's full-batch figure and does not fall until the cap binds
    assert rows[0].power_kw < PUZZLE8_SEED[0][1]
    # the seed's verdicts: steady state safe at 30 %, unstable at 40 %; an event survives deeper than steady state
    assert rows[30].sustained_ok and not rows[40].sustained_ok
    assert g.max_safe_depth_sustained == 30.0
    assert rows[50].batch_cap == 0 and not rows[50].event_ok
    assert g.max_safe_depth_event is not None and g.max_safe_depth_event >= 30.0


# --------------------------------------------------------------------------------------------
# Delivered depths (the default convention) and undecided pools
# --------------------------------------------------------------------------------------------

H100_IDLE_W = 300.0
"""P(0) of the H100-80GB unit's measured power curve (data/catalog: PowerCurve(300, 600, 1.0, 4.2))."""


def test_delivered_reduction_of_replicas_out_is_their_idle_draw(azure):
    # 8 H100 units at 0.05 req/s are idle but for a fraction of a sequence: each draws P(0) = 300 W plus a share
    # of well under 1 W, so k units out cut the draw by k x 300 W, and depth d needs ceil(8 d) units out.
    inst = api.load(azure, H100_AZURE + ["workload.arrival_rate=0.05"])
    g = gridflex(inst, "0-8192:h100x8", (20, 30), event=False)
    data = g.to_json()
    rows = {r["depth"]: r for r in data["depths"]}
    assert sorted(rows) == [0, 20, 30]                                # depth 0, the reference, is always swept
    p0_w = 1000 * rows[0]["draw_kw"]
    assert p0_w == pytest.approx(8 * H100_IDLE_W, abs=1.0)
    for d in (20, 30):
        r = rows[d]
        k = math.ceil(8 * d / 100)
        assert r["pools"][0]["replicas_out"] == k and r["pools"][0]["replicas"] == 8 - k
        assert r["lever"] == f"{k} of 8 replicas out of pool 0-8192"
        # independently: 1 - (sum of the curtailed replicas' power) / (sum of the uncurtailed)
        curtailed_w = sum(p["power_w"] for p in r["pools"])
        uncurtailed_w = sum(p["power_w"] for p in rows[0]["pools"])
        assert r["delivered_reduction"] == pytest.approx(1 - curtailed_w / uncurtailed_w, rel=1e-12)
        assert r["uncurtailed_draw_kw"] == pytest.approx(uncurtailed_w / 1000, rel=1e-12)
        # the closed form: (8 - k) idle units against 8, up to the load's sub-watt share
        assert 1000 * r["draw_kw"] == pytest.approx((8 - k) * H100_IDLE_W, abs=1.0)
        assert r["delivered_reduction"] == pytest.approx(k / 8, abs=1e-3)
        assert r["delivered_reduction"] >= d / 100 and r["verdict"] == "met" and r["source"] == "analytic"
    assert data["convention"] == "delivered" and g.max_safe_depth_sustained == 30.0


def test_thin_pool_is_undecided_not_breach(azure):
    # A 4-second event at 4 req/s on two pools: each pool measures fewer than 20 requests in its one replication,
    # too few for a P99 interval (batch means need 20): the pools are named undecided, not BREACH.
    inst = api.load(azure, ["gpus=[{name: h100, profile: H100-80GB}]", "pools.max_pools=2",
                            "workload.arrival_rate=4"])
    g = gridflex(inst, "0-1024:h100x1,1024-8192:h100x2", (0,), event_s=4.0, replications=1)
    zero = g.to_json()["depths"][0]
    assert all(0 < p["measured_event"] < 20 for p in zero["pools"])
    assert all(p["event_verdict"] == "undecided" for p in zero["pools"])
    assert zero["event"]["verdict"] == "undecided"
    assert set(zero["event"]["undecided_pools"]) == {"0-1024:h100", "1024-8192:h100"}
    assert g.max_safe_depth_event is None and zero["verdict"] == "met"      # undecided is not counted safe


PUZZLE8_SECTION = ("/work/shared/seeds/003_6f72f6c62180dc89.txt, 'Puzzle 8 - How much grid power can I shed "
                   "without an SLO breach?', 'Numerical example (with DES verification)'")
"""Where :data:`PUZZLE8_SEED` is quoted from: 40 H100s, lambda = 200 req/s, SLO = 500 ms; baseline 23.3 kW fleet
power (583 W/GPU); analytic max safe flex 30 % (the table's 'Long-term steady-state reduction' row)."""


@pytest.fixture(scope="module")
def puzzle8(azure):
    return api.load(azure, H100_AZURE + ["workload.arrival_rate=200"])


def test_puzzle8_seed_convention_reproduces_the_seed(puzzle8):
    g = gridflex(puzzle8, "0-8192:h100x40", tuple(range(0, 55, 5)), event=False, convention="seed")
    data = g.to_json()
    assert data["convention"] == "seed"
    assert data["convention_label"] == "the reference scenarios' convention: per-GPU peak-power cap"
    rows = {r.depth: r for r in g.depths}
    curve = PowerCurve(300.0, 600.0, 1.0, 4.2, "measured")
    # the seed's baseline: 128 per unit, 583 W, 40 x 583 W = 23.3 kW
    assert rows[0].batch_cap == PUZZLE8_SEED[0][0]
    assert round(float(curve.power_w(128))) == 583
    assert 40 * curve.power_w(rows[0].batch_cap) / 1000 == pytest.approx(PUZZLE8_SEED[0][1], abs=0.05)
    for d in (20, 25, 30):        # the caps of the deep rows within the seed's rounding
        assert abs(rows[d].batch_cap - PUZZLE8_SEED[d][0]) <= 3
        # the seed's fleet kW is 40 x P(n_max): ours within its rounding of the cap
        assert 40 * curve.power_w(rows[d].batch_cap) / 1000 == pytest.approx(PUZZLE8_SEED[d][1], abs=0.6)
    assert g.max_safe_depth_sustained == 30.0                               # the seed's analytic 30 %
    # what the per-GPU cap delivers on the draw: under 1 % at 30 % (the fleet runs about 8 sequences a unit)
    assert 0 <= rows[30].delivered_reduction < 0.01


def test_puzzle8_delivered_depth_is_delivered(puzzle8):
    g = gridflex(puzzle8, "0-8192:h100x40", (30, 50), event=False)
    plans, base = fixed_pools(puzzle8, "0-8192:h100x40")
    best = g.safe_row("sustained")
    assert best is not None and best.depth == g.max_safe_depth_sustained >= 50.0
    # re-evaluated independently on the evaluate path with the row's levers: the draw falls by at least the depth,
    # in kW, and the SLO holds
    p = best.pools[0]
    again = evaluate_plans(puzzle8, [replace(plans[0], replicas=40 - p.replicas_out, max_num_seqs=p.batch_cap)])
    assert best.uncurtailed_draw_kw == pytest.approx(base.power_kw, rel=1e-12)
    assert again.power_kw == pytest.approx(best.power_kw, rel=1e-12)
    assert base.power_kw - again.power_kw >= best.depth / 100 * base.power_kw
    assert again.slo_met and best.verdict == "met"


@pytest.mark.slow
def test_puzzle8_delivered_event(puzzle8):
    g = gridflex(puzzle8, "0-8192:h100x40", (30,), event_s=60.0, replications=2)
    r = g.depths[1]
    assert r.event_verdict == "met" and r.ttft_p99_ci_ms_event[1] <= 500
    # the simulated draw falls by about the analytic share (same streams as depth 0)
    assert r.event_delivered_reduction == pytest.approx(r.delivered_reduction, abs=0.02)
    assert r.event_delivered_reduction >= 0.28
