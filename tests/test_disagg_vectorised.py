"""The vectorised P/D stations (PrefillStations, DecodeStations) against the single stations, row by row.

The single stations (PrefillStation, DecodeStation) are held to closed forms and enumeration in
tests/test_disagg_model.py; here each row of the vectorised columns must give the same least counts, reasons and
verdicts as the single station of its segment, and the same loads, miss probabilities and power to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.queueing.disagg import (DecodeStation, DecodeStations, KVTransfer, PhaseTraffic, PrefillStation,
                                             PrefillStations, stack_traffic)
from fleetopt.models.workload import LengthDistribution

CURVE = CalibratedProfile("toy", "toy", 0.01, 0.008192, 8192, 512, 16, 1 << 20, 4096, 2.0, 1,
                          PowerCurve(100.0, 500.0, 1.0, 4.0, "projected"), prefill_a_s=1e-5, prefill_b_s=1e-9)
ACTIVE = CalibratedProfile("act", "toy", 0.01, 0.008192, 8192, 512, 16, 1 << 20, 4096, 2.0, 1,
                           ActivityPower(idle_w=70.0, limit_w=1000.0, weights_w=400.0, kv_w=700.0, compute_w=1800.0),
                           prefill_a_s=1e-5, prefill_b_s=1e-9)
LAW = LengthDistribution.from_cdf([(256, 0.3), (2048, 0.7), (8192, 0.95), (32768, 1.0)])
EDGES = [0.0, 64.0, 256.0, 1000.0, 2048.0, 8192.0, 20000.0, 32768.0, 40000.0]
TRANSFERS = [KVTransfer(model="seed-factor"),
             KVTransfer(model="bandwidth", kv_bytes_per_token=327_680.0, bandwidth_bytes_per_s=4e10, latency_s=1e-4)]


def segments(rate: float = 40.0) -> list[PhaseTraffic]:
    """Every segment between EDGES (one beyond the law's support: no traffic)."""
    return [PhaseTraffic.from_distribution(LAW, lo, hi, rate, chunk_tokens=(512,))
            for a, lo in enumerate(EDGES) for hi in EDGES[a + 1:]]


@pytest.mark.parametrize("profile", [CURVE, ACTIVE], ids=["curve", "activity"])
@pytest.mark.parametrize("transfer", TRANSFERS, ids=["seed", "bandwidth"])
@pytest.mark.parametrize("slo_s", [0.4, 2.0])
def test_prefill_rows_match_single_stations(profile, transfer, slo_s):
    ts = segments()
    lam, prompt, _, probs = stack_traffic(ts)
    many = PrefillStations.from_profile(profile, lam, prompt, probs, transfer)
    z = many.min_replicas(slo_s, rho_max=0.8, margin=0.03)
    floor = many.min_replicas(np.inf, rho_max=0.8)
    ns = floor.replicas[:, None] + np.arange(4)[None, :]
    miss = many.miss_probability(0.9 * slo_s, ns)
    power = many.power_w(np.maximum(z.replicas, 1))
    assert not z.feasible.all() and z.feasible.any()          # both kinds of rows are exercised
    for r, t in enumerate(ts):
        one = PrefillStation.from_profile(profile, t, transfer)
        s = one.min_replicas(slo_s, rho_max=0.8, margin=0.03)
        assert (int(z.replicas[r]), bool(z.feasible[r]), str(z.reason[r])) == (
            int(s.replicas[0]), bool(s.feasible[0]), str(s.reason[0]))
        assert int(floor.replicas[r]) == int(one.min_replicas(np.inf, rho_max=0.8).replicas[0])
        assert many.offered_load_erlangs[r] == pytest.approx(one.offered_load_erlangs, rel=1e-12, abs=1e-300)
        assert many.ttft_floor_s[r] == pytest.approx(one.ttft_floor_s, rel=1e-12, abs=1e-300)
        np.testing.assert_allclose(miss[r], one.miss_probability(0.9 * slo_s, ns[r]), rtol=1e-10, atol=1e-300)
        assert power[r] == pytest.approx(float(one.power_w(max(int(z.replicas[r]), 1))), rel=1e-12)


@pytest.mark.parametrize("profile", [CURVE, ACTIVE], ids=["curve", "activity"])
@pytest.mark.parametrize("tpot_slo_s", [None, 0.03, 0.0105])
@pytest.mark.parametrize("rate", [0.5, 40.0, 3000.0])
def test_decode_rows_match_single_stations(profile, tpot_slo_s, rate):
    ts = segments(rate)
    lam, prompt, output, probs = stack_traffic(ts)
    hi = np.array([t.hi_tokens for t in ts])
    many = DecodeStations.from_profile(profile, lam, prompt, output, probs, window_tokens=hi, tpot_slo_s=tpot_slo_s)
    z = many.min_replicas(rho_max=0.85, wait_prob_max=0.01)
    counts = np.maximum(z.replicas, 1)
    power = many.power_w(counts)
    for r, t in enumerate(ts):
        one = DecodeStation.from_profile(profile, t, tpot_slo_s=tpot_slo_s)
        s = one.min_replicas(rho_max=0.85, wait_prob_max=0.01)
        assert (int(z.replicas[r]), bool(z.feasible[r]), str(z.reason[r]), bool(z.bound_by_utilization[r])) == (
            int(s.replicas[0]), bool(s.feasible[0]), str(s.reason[0]), bool(s.bound_by_utilization[0]))
        assert (int(many.cap[r]), int(many.kv_slots[r])) == (one.cap, one.kv_slots)
        assert many.tpot_bound_s[r] == one.tpot_bound_s
        assert many.output_tok_per_s[r] == pytest.approx(one.output_tok_per_s, rel=1e-12, abs=1e-300)
        assert power[r] == pytest.approx(float(one.power_w(int(counts[r]))), rel=1e-12)


def test_stacked_rows_pad_with_empty_atoms():
    a = PhaseTraffic.from_distribution(LAW, 0.0, 256.0, 10.0)
    b = PhaseTraffic.from_distribution(LAW, 0.0, 32768.0, 10.0, chunk_tokens=(512,))
    lam, prompt, output, probs = stack_traffic([a, b])
    assert prompt.shape == (2, len(b.probs)) and len(a.probs) < len(b.probs)
    assert lam.tolist() == [a.arrival_rate, b.arrival_rate]
    assert probs[0, len(a.probs):].sum() == 0.0 and prompt[0, len(a.probs):].sum() == 0.0
    np.testing.assert_array_equal(probs[0, :len(a.probs)], a.probs)


def _instance(scope: str, tpot_ms: float | None):
    from fleetopt.optimizer.io.instance import instance_from_dict

    slo = {"ttft_p99_ms": 600.0, "scope": scope} | ({"tpot_p99_ms": tpot_ms} if tpot_ms else {})
    return instance_from_dict({
        "workload": {"cdf": "builtin:agent_heavy", "arrival_rate": 30.0}, "slo": slo,
        "gpus": [{"name": "h100", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-8B"},
                 {"name": "a100", "hardware": "A100-SXM-80GB", "model": "Llama-3.1-8B", "availability": 0.95}],
        "pools": {"max_pools": 3, "max_context": 65536, "boundaries": [512, 2048, 8192, 32768],
                  "disaggregation": "allow"}})


@pytest.mark.parametrize("scope, tpot_ms", [("pool", None), ("pool", 10.0), ("fleet", None)])   # 10 ms drops decodes
def test_pair_candidates_are_the_single_stations_least_counts(scope, tpot_ms):
    """Each pair candidate against the single stations of its segment (bandwidth transfer, computed profiles with
    activity power, an availability below 1): its least prefill count, its decode count inflated by hand, its cost,
    and every pair that no count serves is dropped."""
    import math

    from fleetopt.optimizer.plan.disagg_candidates import pair_candidates

    inst = _instance(scope, tpot_ms)
    b = np.asarray(inst.pools.boundaries, dtype=float)
    pc = pair_candidates(inst, b)
    w, slo, rho = inst.workload, inst.slo, inst.constraints.max_utilization
    seen = set()
    for k in range(len(pc.pools["i"])):
        i, j = int(pc.pools["i"][k]), int(pc.pools["j"][k])
        gp, gd = inst.gpus[int(pc.pools["gpu"][k])], inst.gpus[int(pc.pools["decode_gpu"][k])]
        t = PhaseTraffic.from_distribution(w.lengths, b[i], b[j], w.arrival_rate_req_per_s,
                                           input_fraction=w.input_fraction, chunk_tokens=(gp.profile.chunk_tokens,))
        pre = PrefillStation.from_profile(gp.profile, t, inst.pools.transfer(gp.name, gd.name))
        dec = DecodeStation.from_profile(gd.profile, t, window_tokens=b[j], tpot_slo_s=slo.tpot_p99_s)
        zd = dec.min_replicas(rho_max=rho, wait_prob_max=0.01)
        if scope == "pool":
            n_p = int(pre.min_replicas(slo.ttft_p99_s, rho_max=rho, margin=slo.ttft_margin).replicas[0])
        else:
            n_p = int(pre.min_replicas(math.inf, rho_max=rho).replicas[0])        # the utilisation floor first
        assert int(pc.pools["min_replicas"][k]) == n_p
        mine = pc.choices["pool"] == k
        n_pp = math.ceil(n_p / gp.availability - 1e-9)
        n_dd = math.ceil(int(zd.replicas[0]) / gd.availability - 1e-9)
        assert int(pc.choices["replicas"][mine][0]) == n_pp
        assert set(pc.choices["decode_replicas"][mine].tolist()) == {n_dd}
        assert pc.choices["cost"][mine][0] == pytest.approx(n_pp * gp.profile.cost_usd_per_hr
                                                            + n_dd * gd.profile.cost_usd_per_hr, rel=1e-12)
        assert pc.choices["power"][mine][0] == pytest.approx(float(pre.power_w(n_pp)) + float(dec.power_w(n_dd)),
                                                             rel=1e-12)
        if scope == "fleet":        # consecutive counts from the floor, each with its miss rate at the target
            counts = pc.choices["replicas"][mine]
            assert np.all(np.diff(counts) >= 0)
            ns = np.arange(n_p, n_p + int(mine.sum()))
            np.testing.assert_allclose(pc.choices["miss"][mine],
                                       t.arrival_rate * pre.miss_probability(slo.ttft_sizing_s, ns), rtol=1e-9,
                                       atol=1e-300)
        seen.add((i, j, gp.name, gd.name))
    dropped = {(lo, hi, name) for lo, hi, name, _ in pc.dropped}
    assert len(seen) + len(pc.dropped) == pc.generated and len(dropped) == len(pc.dropped)
