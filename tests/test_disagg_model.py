"""The analytic model of a disaggregated prefill/decode pair (models/queueing/disagg.py).

Expected values are closed forms written out here (Pollaczek-Khinchine, Erlang C as a finite sum, the decode fixed
point solved by hand, transfer times by hand, integrals of polynomials over a uniform law), exhaustive enumeration
over replica counts, and the reference scenarios' Puzzle 7 table (seed 003, lines 156-205), never a value produced
by the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.queueing.disagg import (DecodeStation, KVTransfer, PhaseTraffic, PrefillStation,
                                             evaluate_pair, kv_bytes_per_token, link_bandwidth_bytes_per_s,
                                             prefill_components_s, prefill_service_s, reference_disagg, size_pair)
from fleetopt.models.workload import LengthDistribution, RequestTrace

REPO = Path(__file__).resolve().parents[1]
FLAT = PowerCurve(400.0, 400.0, 1.0, 4.0, "projected")

# W = 10 ms, h = 1e-6 s/token (H = 8.192 ms at 8,192 tokens), chunk 512, a = 1e-5 s/token, b = 1e-9 s/token^2
TOY = CalibratedProfile("toy", "toy", 0.01, 0.008192, 8192, 512, 16, 1 << 20, 4096, 2.0, 1,
                        PowerCurve(100.0, 500.0, 1.0, 4.0, "projected"), prefill_a_s=1e-5, prefill_b_s=1e-9)


def erlang_c_sum(c: int, a: float) -> float:
    """Textbook Erlang C: (a^c/c! c/(c-a)) / (sum_{k<c} a^k/k! + a^c/c! c/(c-a))."""
    terms = sum(a**k / math.factorial(k) for k in range(c))
    last = a**c / math.factorial(c) * c / (c - a)
    return last / (terms + last)


def station(service_s, probs, rate, transfer_s=None, idle_w=100.0, busy_w=500.0) -> PrefillStation:
    s = np.asarray(service_s, dtype=float)
    return PrefillStation(name="toy", arrival_rate=rate, prompt_tokens=np.ones_like(s), probs=np.asarray(probs, float),
                          service_s=s, transfer_s=np.zeros_like(s) if transfer_s is None else np.asarray(transfer_s),
                          idle_power_w=idle_w, busy_power_w=busy_w, cost_usd_per_hr=3.0, gpus_per_replica=2,
                          physical_gpus_per_replica=2)


def one_request(prompt, output, rate, hi=8192.0) -> PhaseTraffic:
    return PhaseTraffic(lo_tokens=0.0, hi_tokens=hi, arrival_rate=rate, rate_share=1.0,
                        prompt_tokens=np.atleast_1d(prompt), output_tokens=np.atleast_1d(output),
                        probs=np.full(np.size(prompt), 1.0 / np.size(prompt)))


# ---------------------------------------------------------------- KV transfer


def test_transfer_time_by_hand():
    # 2,000 tokens x 327,680 B = 655.36 MB over 8 x 50 GB/s = 1.6384 ms, plus 20 us
    x = KVTransfer(model="bandwidth", kv_bytes_per_token=327_680.0, bandwidth_bytes_per_s=4e11, latency_s=2e-5)
    assert float(x.time_s(2000, 0.3)) == pytest.approx(0.0016584, rel=1e-12)
    assert float(x.time_s(0, 0.0)) == 0.0                                   # an empty prompt moves nothing
    np.testing.assert_allclose(x.time_s([1000, 4000], [0.1, 0.2]), [2e-5 + 0.0008192, 2e-5 + 0.0032768])
    # the reference's convention: TTFT = 1.8 x prefill, so the transfer is 0.8 x prefill
    assert float(KVTransfer(model="seed-factor").time_s(2000, 0.25)) == pytest.approx(0.2)
    assert float(KVTransfer(model="seed-factor", factor=2.5).time_s(7, 0.1)) == pytest.approx(0.15)


@pytest.mark.parametrize("kwargs", [dict(model="nvme"), dict(model="bandwidth", kv_bytes_per_token=1.0),
                                    dict(model="bandwidth", bandwidth_bytes_per_s=1.0),
                                    dict(model="seed-factor", factor=0.5)])
def test_transfer_refuses_bad_input(kwargs):
    with pytest.raises(ValueError):
        KVTransfer(**kwargs)


def test_link_is_the_slower_side_of_the_chosen_path():
    # across nodes: TP=8 at 50 GB/s per GPU against TP=2 at 50 GB/s per GPU: 100 GB/s
    assert link_bandwidth_bytes_per_s(same_node=False, prefill_gpus=8, decode_gpus=2, prefill_network_bytes_per_s=50e9,
                                      decode_network_bytes_per_s=50e9, prefill_nvlink_bytes_per_s=450e9,
                                      decode_nvlink_bytes_per_s=450e9) == 100e9
    # one node: NVLink, 2 x 450 against 2 x 300 GB/s
    assert link_bandwidth_bytes_per_s(same_node=True, prefill_gpus=2, decode_gpus=2, prefill_nvlink_bytes_per_s=450e9,
                                      decode_nvlink_bytes_per_s=300e9) == 600e9
    with pytest.raises(ValueError, match="network"):
        link_bandwidth_bytes_per_s(same_node=False, prefill_gpus=1, decode_gpus=1, prefill_nvlink_bytes_per_s=1e9,
                                   decode_nvlink_bytes_per_s=1e9)


def test_kv_bytes_per_token_of_a_computed_replica():
    from fleetopt.models.roofline import computed_profile
    from fleetopt.optimizer.io.catalog import bundled_catalog
    c = bundled_catalog()
    p = computed_profile(c.hardware["H100-SXM-80GB"], c.models["Llama-3.1-70B"], tp=8, dtype="bf16",
                         defaults=c.defaults)
    # Llama-3.1-70B: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 bytes per token, whole model
    assert kv_bytes_per_token(p) == 2 * 80 * 8 * 128 * 2
    with pytest.raises(ValueError, match="calibrated"):
        kv_bytes_per_token(TOY)


# ---------------------------------------------------------------- traffic


def test_segment_moments_of_a_uniform_law_by_hand():
    """Uniform L on (0, 1000], segment (200, 800], f = 0.8: share 0.6, E[L] = 500, E[L^2] = (800^3 - 200^3)/1800."""
    d = LengthDistribution.from_cdf([(1000, 1.0)])
    t = PhaseTraffic.from_distribution(d, 200, 800, 50.0, chunk_tokens=[128, 512])
    EL, EL2 = 500.0, (800.0**3 - 200.0**3) / 1800.0
    assert t.rate_share == pytest.approx(0.6, rel=1e-12)
    assert t.arrival_rate == pytest.approx(30.0, rel=1e-12)
    assert t.mean_prompt_tokens == pytest.approx(0.8 * EL, rel=1e-12)
    assert t.mean_output_tokens == pytest.approx(0.2 * EL, rel=1e-12)
    # X_d = l_out l_in + l_out (l_out - 1)/2 = 0.16 L^2 + (0.04 L^2 - 0.2 L)/2; x_bar = E[X_d]/E[l_out]
    x_d = 0.16 * EL2 + (0.04 * EL2 - 0.2 * EL) / 2.0
    assert t.mean_decode_context_tokens == pytest.approx(x_d / (0.2 * EL), rel=1e-12)
    assert t.cv2_output == pytest.approx(EL2 / EL**2 - 1.0, rel=1e-10)


def test_mean_prefill_over_a_segment_matches_dense_integration():
    """E[S_p] with the chunk count's steps: Gauss-Legendre atoms cut at the chunks against a midpoint rule."""
    d = LengthDistribution.from_cdf([(1000, 0.3), (5000, 0.8), (20000, 1.0)])
    t = PhaseTraffic.from_distribution(d, 3000, 20000, 1.0, chunk_tokens=[TOY.chunk_tokens])
    L = np.linspace(3000, 20000, 2_000_001)
    mid = (L[1:] + L[:-1]) / 2
    w = np.where(mid <= 5000, 0.5 / 4000, 0.2 / 15000) * np.diff(L)
    dense = float(w @ prefill_service_s(TOY, 0.8 * mid) / w.sum())
    assert float(t.probs @ prefill_service_s(TOY, t.prompt_tokens)) == pytest.approx(dense, rel=1e-6)


def test_trace_segment_keeps_its_requests():
    trace = RequestTrace(np.arange(5.0), np.array([100, 100, 3000, 700, 50]), np.array([20, 20, 200, 10, 5]))
    t = PhaseTraffic.from_trace(trace, 100, 1000, arrival_rate=10.0)      # totals 120, 120, 710 (55 and 3200 out)
    assert t.rate_share == pytest.approx(0.6) and t.arrival_rate == pytest.approx(6.0)
    assert sorted(zip(t.prompt_tokens.tolist(), t.output_tokens.tolist(), t.probs.round(12).tolist())) == [
        (100.0, 20.0, round(2 / 3, 12)), (700.0, 10.0, round(1 / 3, 12))]
    empty = PhaseTraffic.from_trace(trace, 5000, 9000)
    assert empty.arrival_rate == 0.0


def test_time_average_context_of_two_requests_by_hand():
    # (100, 10): 10 x 100 + 45 = 1,045; (1000, 30): 30,000 + 435 = 30,435; mean 15,740 over E[l_out] = 20
    t = PhaseTraffic(lo_tokens=0, hi_tokens=2048, arrival_rate=1.0, rate_share=1.0, prompt_tokens=[100, 1000],
                     output_tokens=[10, 30], probs=[0.5, 0.5])
    assert t.mean_decode_context_tokens == pytest.approx(787.0)


# ---------------------------------------------------------------- prefill station


def test_prefill_time_of_a_prompt_by_hand():
    # 1,200 tokens in chunks of 512: k = 3; 3 W = 30 ms, h c (0 + 1 + 2) = 1.536 ms, a P = 12 ms, b P^2 = 1.44 ms
    w, kv, comp = (float(x) for x in prefill_components_s(TOY, 1200))
    assert (w, kv, comp) == pytest.approx((0.03, 0.001536, 0.01344), rel=1e-12)
    assert float(prefill_service_s(TOY, 1200)) == pytest.approx(0.044976, rel=1e-12)
    assert float(prefill_service_s(TOY, 1200, chunk_tokens=2048)) == pytest.approx(0.01 + 0.01344, rel=1e-12)


def test_md1_wait_is_pollaczek_khinchine():
    """M/D/1, lambda = 5, S = 0.1 s: E[W] = lambda E[S^2] / (2 (1 - rho)) = 0.05 s; L_q = rho^2 / (2 (1 - rho))."""
    s = station([0.1], [1.0], 5.0)
    assert float(s.mean_wait_s(1)) == pytest.approx(0.05, rel=1e-12)
    assert float(s.mean_in_system(1)) - 0.5 == pytest.approx(0.25 / (2 * 0.5), rel=1e-12)   # Little: L_q = lambda W
    assert float(s.mean_ttft_s(1)) == pytest.approx(0.15, rel=1e-12)


def test_mg1_wait_is_pollaczek_khinchine():
    """Two-point service 0.05 / 0.25 s, lambda = 2: E[S] = 0.15, E[S^2] = 0.0325, rho = 0.3."""
    s = station([0.05, 0.25], [0.5, 0.5], 2.0)
    assert float(s.mean_wait_s(1)) == pytest.approx(2.0 * 0.0325 / (2 * 0.7), rel=1e-12)


def test_mmc_wait_is_erlang_c():
    """Service with c_s^2 = 1 (0 or 2 s, equally likely: E[S] = 1, E[S^2] = 2): the tail is M/M/c's exactly."""
    s = station([0.0, 2.0], [0.5, 0.5], 1.5)
    C = erlang_c_sum(2, 1.5)                       # 4.5 / 7
    assert C == pytest.approx(4.5 / 7)
    assert float(s.wait_prob(2)) == pytest.approx(C, rel=1e-12)
    assert float(s.mean_wait_s(2)) == pytest.approx(C / (2 - 1.5), rel=1e-12)
    # P(TTFT > 3) = 1/2 [C e^{-0.5 x 3} + C e^{-0.5 x 1}] (wait tail after prefill 0 and 2 s)
    assert float(s.miss_probability(3.0, 2)) == pytest.approx(0.5 * C * (math.exp(-1.5) + math.exp(-0.5)), rel=1e-12)
    # M/M/3 at a = 1.5
    assert float(s.wait_prob(3)) == pytest.approx(erlang_c_sum(3, 1.5), rel=1e-12)
    assert float(s.mean_wait_s(3)) == pytest.approx(erlang_c_sum(3, 1.5) / 1.5, rel=1e-12)


def test_transfer_adds_to_each_prompts_ttft():
    base = station([0.1, 0.3], [0.5, 0.5], 2.0)
    moved = station([0.1, 0.3], [0.5, 0.5], 2.0, transfer_s=[0.05, 0.15])
    assert float(moved.mean_ttft_s(2)) == pytest.approx(float(base.mean_ttft_s(2)) + 0.1)
    # the transfer does not occupy the replica: the same wait
    assert float(moved.mean_wait_s(2)) == float(base.mean_wait_s(2))
    assert moved.ttft_floor_s == pytest.approx(0.45)


def test_prefill_station_is_monotone_and_vectorised():
    s = station([0.02, 0.05, 0.4], [0.5, 0.4, 0.1], 30.0)
    n = np.arange(2, 12)
    p99 = s.p99_ttft_s(n)
    miss = s.miss_probability(0.5, n)
    assert np.all(np.diff(p99) <= 1e-12) and np.all(np.diff(miss) <= 1e-15)
    assert np.all(np.diff(s.utilization(n)) < 0) and np.all(np.diff(s.power_w(n)) > 0)
    grid = np.array([[2, 3], [4, 5]])
    assert s.p99_ttft_s(grid).shape == (2, 2) and s.power_w(grid).shape == (2, 2)
    np.testing.assert_allclose(s.p99_ttft_s(grid).ravel(), s.p99_ttft_s([2, 3, 4, 5]))
    assert float(s.p99_ttft_s(0)) == math.inf and float(s.miss_probability(1.0, 0)) == 1.0
    np.testing.assert_array_equal(s.miss_function(grid)(0.3), s.miss_probability(0.3, grid))
    # at its own P99 a count misses at most 1 % of requests, and more just below it
    for n in (4, 6, 9):
        p99 = float(s.p99_ttft_s(n))
        assert float(s.miss_probability(p99, n)) <= 0.01 + 1e-12 < float(s.miss_probability(p99 * (1 - 1e-9), n))
    # below stability (a = 30 x 0.07 = 2.1 Erlangs): unstable, certain miss
    assert float(s.p99_ttft_s(2)) == math.inf and float(s.miss_probability(10.0, 2)) == 1.0


def test_prefill_power_by_hand():
    # a = 30 x 0.07 = 2.1 Erlangs over 3 replicas: u = 0.7; 3 x (0.3 x 100 + 0.7 x 500) = 1,140 W
    s = station([0.02, 0.05, 0.4], [0.5, 0.4, 0.1], 30.0)
    assert float(s.power_w(3)) == pytest.approx(1140.0)
    assert float(s.pool_cost_usd_per_hr(3)) == pytest.approx(9.0)


def test_prefill_busy_power_under_an_activity_model_by_hand():
    """1,200-token prompts on TOY's iteration: 30 ms of weights at 400 W, 1.536 ms of KV scan at 700 W, 13.44 ms of
    compute at 1,800 W: (12 + 1.0752 + 24.192) J over 44.976 ms."""
    power = ActivityPower(idle_w=70.0, limit_w=1000.0, weights_w=400.0, kv_w=700.0, compute_w=1800.0)
    prof = CalibratedProfile("act", "toy", 0.01, 0.008192, 8192, 512, 16, 1 << 20, 4096, 2.0, 1, power,
                             prefill_a_s=1e-5, prefill_b_s=1e-9)
    s = PrefillStation.from_profile(prof, one_request(1200.0, 10.0, 10.0), KVTransfer(model="seed-factor"))
    assert s.busy_power_w == pytest.approx(37.2672 / 0.044976, rel=1e-12)
    assert s.idle_power_w == 70.0
    u = 10.0 * 0.044976 / 2                                        # two replicas
    assert float(s.power_w(2)) == pytest.approx(2 * ((1 - u) * 70.0 + u * 37.2672 / 0.044976), rel=1e-12)


def test_prefill_min_replicas_is_the_least_count_by_enumeration():
    s = station([0.02, 0.05, 0.4], [0.5, 0.4, 0.1], 30.0, transfer_s=[0.001, 0.002, 0.01])
    for slo, rho_max, margin in ((0.6, 0.85, 0.0), (0.6, 0.85, 0.1), (0.45, 0.5, 0.0), (2.0, 0.9, 0.03)):
        z = s.min_replicas(slo, rho_max=rho_max, margin=margin)
        n = np.arange(1, 60)
        ok = (s.p99_ttft_s(n) <= slo * (1 - margin) * (1 + 1e-9)) & (s.utilization(n) <= rho_max + 1e-12)
        assert z.feasible[0] and int(z.replicas[0]) == int(n[ok][0])
    # the longest prompt (0.41 s with its transfer) is 10 % of requests: a 0.3 s SLO fails at any count
    z = s.min_replicas(0.3)
    assert not z.feasible[0] and z.reason[0] == "prefill"


# ---------------------------------------------------------------- decode station


def test_decode_fixed_point_by_hand():
    """W = 10 ms, h = 1e-6, g = 0; one request shape (1,000 in, 201 out) at 2 req/s: x_bar = 1,000 + 100 = 1,100,
    h x_bar = 1.1 ms; one replica: r = 402 tok/s, t = 0.01/(1 - 0.4422), b = r t."""
    d = DecodeStation.from_profile(TOY, one_request(1000.0, 201.0, 2.0))
    assert d.mean_context_tokens == pytest.approx(1100.0)
    t1, t2 = 0.01 / (1 - 402 * 1.1e-3), 0.01 / (1 - 201 * 1.1e-3)
    np.testing.assert_allclose(d.mean_iteration_s([1, 2]), [t1, t2], rtol=1e-12)
    np.testing.assert_allclose(d.mean_batch([1, 2]), [402 * t1, 201 * t2], rtol=1e-12)
    assert float(d.mean_batch(1)) == pytest.approx(7.20688, rel=1e-5)
    # Little's law: N b = lambda x E[l_out] x t
    for n in (1, 2, 3):
        assert n * float(d.mean_batch(n)) == pytest.approx(2.0 * float(d.mean_residence_s(n)), rel=1e-12)
    # 5 req/s on one replica: r (h x_bar) = 1005 x 1.1e-3 > 1
    hot = DecodeStation.from_profile(TOY, one_request(1000.0, 201.0, 5.0))
    assert not bool(hot.stable(1)) and float(hot.mean_batch(1)) == math.inf and bool(hot.stable(2))


def test_decode_cap_and_tpot_bound_by_hand():
    # window 4,096: KV allows min(4096 x 8192 / 4096, 2^20 / 256) = 4,096 slots; TPOT 50 ms allows
    # floor((0.05 - 0.01) / (1e-6 x 4096)) = 9; the bound is 10 ms + 9 x 4.096 ms
    d = DecodeStation.from_profile(TOY, one_request(1000.0, 201.0, 2.0, hi=4096.0), tpot_slo_s=0.05)
    assert (d.kv_slots, d.cap) == (4096, 9)
    assert d.tpot_bound_s == pytest.approx(0.01 + 9 * 0.004096, rel=1e-12)
    assert DecodeStation.from_profile(TOY, one_request(1000.0, 201.0, 2.0, hi=4096.0), max_num_seqs=5).cap == 5


def test_decode_slot_wait_is_erlang_c_at_the_full_batch():
    d = DecodeStation.from_profile(TOY, one_request(1000.0, 201.0, 2.0, hi=4096.0), tpot_slo_s=0.05)
    hold = 201.0 * (0.01 + 9 * 1.1e-3)          # E[l_out] t(n), t at the mean context
    a = 2.0 * hold
    assert d.full_slot_hold_s == pytest.approx(hold, rel=1e-12)
    for n in (1, 2, 3):
        assert float(d.slot_wait_prob(n)) == pytest.approx(erlang_c_sum(9 * n, a), rel=1e-10)
    # the M/G/c mean wait with c_s^2 = 0 (one output length): C / (2 (c/E[S] - lambda))
    assert float(d.mean_slot_wait_s(1)) == pytest.approx(erlang_c_sum(9, a) / (2 * (9 / hold - 2.0)), rel=1e-10)


def test_decode_min_replicas_by_enumeration_and_closed_form():
    d = DecodeStation.from_profile(TOY, one_request([500.0, 3000.0], [100.0, 900.0], 40.0, hi=4096.0),
                                   tpot_slo_s=0.06)
    for rho_max, wmax in ((0.85, 0.01), (0.5, 0.01), (0.95, 0.2)):
        z = d.min_replicas(rho_max=rho_max, wait_prob_max=wmax)
        n = np.arange(1, 400)
        ok = (d.utilization(n) <= rho_max * (1 + 1e-12)) & (d.slot_wait_prob(n) <= wmax * (1 + 1e-12))
        assert z.feasible[0] and int(z.replicas[0]) == int(n[ok][0])
        m = rho_max * d.cap                      # N_rho = ceil(lambda E[out] t(m) / m)
        n_rho = math.ceil(40.0 * 500.0 * (0.01 + m * d.per_seq_s) / m)
        assert int(z.replicas[0]) >= n_rho
    assert d.mean_output_tokens == 500.0


def test_decode_station_is_monotone_and_priced():
    d = DecodeStation.from_profile(TOY, one_request([500.0, 3000.0], [100.0, 900.0], 40.0, hi=4096.0))
    n = np.arange(64, 120)                       # 20,000 tok/s x 3.16 ms per sequence: stable from 64
    assert np.all(np.diff(d.mean_batch(n)) < 0) and np.all(np.diff(d.mean_iteration_s(n)) < 0)
    assert np.all(np.diff(d.slot_wait_prob(n)) <= 1e-15)
    # power need not grow with N (a saturated replica draws its nominal power): between idle and nominal
    assert np.all(d.power_w(n) >= 100.0 * n) and np.all(d.power_w(n) <= 500.0 * n)
    flat = DecodeStation.from_profile(CalibratedProfile("f", "f", 0.01, 0.008192, 8192, 512, 16, 1 << 20, 4096, 2.0,
                                                        1, FLAT), one_request(1000.0, 201.0, 2.0))
    assert float(flat.power_w(3)) == pytest.approx(1200.0)       # a flat curve: N x P
    assert float(flat.pool_cost_usd_per_hr(3)) == pytest.approx(6.0)


def test_decode_infeasible_reasons():
    # one sequence at 8,192 tokens: 10 ms + 8.192 ms > a 15 ms TPOT
    slow = DecodeStation.from_profile(TOY, one_request(1000.0, 201.0, 2.0), tpot_slo_s=0.015)
    z = slow.min_replicas()
    assert slow.cap == 0 and not z.feasible[0] and z.reason[0] == "tpot"
    idle = DecodeStation.from_profile(TOY, PhaseTraffic.from_trace(
        RequestTrace(np.zeros(1), np.array([10]), np.array([10])), 1000, 2000))
    assert int(idle.min_replicas().replicas[0]) == 1


# ---------------------------------------------------------------- the pair


def test_size_pair_reports_the_least_counts_and_why_not():
    d = LengthDistribution.from_cdf([(1000, 0.5), (4000, 1.0)])
    traffic = PhaseTraffic.from_distribution(d, 0, 4096, 20.0, chunk_tokens=[TOY.chunk_tokens])
    x = KVTransfer(model="bandwidth", kv_bytes_per_token=131_072.0, bandwidth_bytes_per_s=50e9, latency_s=1e-5)
    r = size_pair(TOY, TOY, traffic, x, ttft_slo_s=0.5, tpot_slo_s=0.06)
    pre = PrefillStation.from_profile(TOY, traffic, x)
    dec = DecodeStation.from_profile(TOY, traffic, tpot_slo_s=0.06)
    assert r.feasible and r.reason == ""
    assert r.prefill_replicas == int(pre.min_replicas(0.5).replicas[0])
    assert r.decode_replicas == int(dec.min_replicas().replicas[0])
    assert r.cost_usd_per_hr == pytest.approx(2.0 * (r.prefill_replicas + r.decode_replicas))
    assert r.cost_usd_per_yr == pytest.approx(8760 * r.cost_usd_per_hr)
    assert r.output_tok_per_s == pytest.approx(20.0 * traffic.mean_output_tokens)
    assert r.p99_ttft_s <= 0.5 and r.ttft_miss_prob <= 0.01 and r.tpot_bound_s <= 0.06
    assert r.to_json()["gpus"] == r.prefill_gpus + r.decode_gpus
    # one fewer prefill replica misses (or exceeds the utilisation cap), judged by evaluate_pair
    if r.prefill_replicas > 1:
        worse = evaluate_pair(pre, dec, r.prefill_replicas - 1, r.decode_replicas, ttft_slo_s=0.5, tpot_slo_s=0.06)
        assert not worse.feasible and worse.reason.startswith("prefill")
    tight = size_pair(TOY, TOY, traffic, KVTransfer(model="seed-factor"), ttft_slo_s=0.01, tpot_slo_s=0.011)
    assert not tight.feasible
    assert "prefill plus KV transfer alone" in tight.reason and "decodes in" in tight.reason


def test_a_segment_without_requests_needs_one_replica_per_phase():
    d = LengthDistribution.from_cdf([(1000, 1.0)])
    t = PhaseTraffic.from_distribution(d, 2000, 4096, 50.0)
    assert t.arrival_rate == 0.0 and t.rate_share == 0.0
    r = size_pair(TOY, TOY, t, KVTransfer(model="seed-factor"), ttft_slo_s=0.5, tpot_slo_s=0.1)
    assert r.feasible and (r.prefill_replicas, r.decode_replicas) == (1, 1) and r.output_tok_per_s == 0.0


# ---------------------------------------------------------------- the reference convention (Puzzle 7)

PUZZLE7 = [  # prefill, decode, nP, nD, $K/yr, TTFT ms, TPOT ms (seed 003, Puzzle 7's table)
    ("H100-80GB", "A100-80GB", 1, 6, 151.0, 162.0, 91.0),
    ("H100-80GB", "H100-80GB", 1, 3, 141.0, 162.0, 45.0),
    ("A100-80GB", "H100-80GB", 1, 3, 125.0, 492.0, 45.0),
]


@pytest.mark.parametrize("pre, dec, n_p, n_d, kusd, ttft_ms, tpot_ms", PUZZLE7)
def test_reference_disagg_reproduces_puzzle7(pre, dec, n_p, n_d, kusd, ttft_ms, tpot_ms):
    from fleetopt.optimizer.io.catalog import bundled_catalog
    c = bundled_catalog()
    cdf = LengthDistribution.from_cdf(json.loads((REPO / "data/workloads/azure_cdf.json").read_text()))
    r = reference_disagg(c.find("profiles", pre), c.find("profiles", dec), cdf, arrival_rate=100.0, ttft_slo_s=0.5,
                         tpot_slo_s=0.1, window_tokens=8192)
    assert (r.mean_input_tokens, r.mean_output_tokens) == (1450, 483)     # the seed's "ISL ~ 1450, OSL ~ 483"
    assert r.best is not None
    assert (r.best.prefill_replicas, r.best.decode_replicas) == (n_p, n_d)
    assert r.best.cost_usd_per_yr / 1e3 == pytest.approx(kusd, rel=0.01)
    assert r.best.ttft_s * 1e3 == pytest.approx(ttft_ms, rel=0.05)
    assert r.best.tpot_s * 1e3 == pytest.approx(tpot_ms, rel=0.05)


def test_reference_disagg_by_hand_and_infeasible():
    """A100 prefill: 3 chunks of 512 for 1,450 tokens, each W + 128 H = 91.2 ms, x 1.8 = 492.48 ms; H100 decode
    worker: 128 / ((1 + 483) x (4 ms + 0.32 ms x 484/8192 x 128)) req/s."""
    from fleetopt.optimizer.io.catalog import bundled_catalog
    c = bundled_catalog()
    cdf = LengthDistribution.from_cdf(json.loads((REPO / "data/workloads/azure_cdf.json").read_text()))
    a100, h100 = c.find("profiles", "A100-80GB"), c.find("profiles", "H100-80GB")
    r = reference_disagg(a100, h100, cdf, arrival_rate=100.0, ttft_slo_s=0.5, tpot_slo_s=0.1, window_tokens=8192)
    assert r.ttft_s == pytest.approx(1.8 * 3 * (0.008 + 0.00065 * 128), rel=1e-12)
    assert r.decode_rate_per_replica == pytest.approx(128 / (484 * (0.004 + 0.00032 * 484 / 8192 * 128)), rel=1e-12)
    assert r.best is not None and r.best.rate_req_per_s >= 100.0
    late = reference_disagg(a100, h100, cdf, arrival_rate=100.0, ttft_slo_s=0.4, tpot_slo_s=0.1, window_tokens=8192)
    assert late.best is None and "TTFT" in late.reason
