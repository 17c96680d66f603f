"""The iteration's compute terms (per-sequence g, prefill a·P + b·P²) in the simulator and the batched model.

Independent references: a request alone, by hand; a step-by-step iteration loop written here (one iteration at a
time, no closed-form jumps) against the engine's event-to-event jumps; brute-force per-iteration sums against
the segment integrals; and the batched model against the simulator on pools whose profile has compute terms.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetopt.models.queueing.batched import (BatchedTraffic, batched_ttft_p99_s, coarrival_exceed_prob,
                                              mean_activity_power_w, operating_point, own_prefill_context)
from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.models.segments import compute_work, context_work, segment_basis, segment_stats
from fleetopt.models.service import prefill_compute_terms
from fleetopt.models.workload import LengthDistribution, RequestTrace
from fleetopt.solvers.des.engine import SimPool, simulate
from fleetopt.solvers.des.routing import LengthRouter, Requests

# The measured H100 / Llama-3.1-8B coefficients of data/measurements/README.md, rounded.
W, H_CAL, CAL = 6.43e-3, 4.5e-8 * 8192, 8192
G, A, B = 2.5e-5, 26.5e-6, 7.4e-10
H = H_CAL / CAL


def _profile(chunk=512, slots=64, g=G, a=A, b=B):
    return CalibratedProfile("h100-8b", "Llama-3.1-8B", W, H_CAL, CAL, chunk, 16, 27_000, slots, 3.0, 1,
                             PowerCurve(300.0, 700.0, 1.0, 4.0, "projected"), "measured", g_s=g, prefill_a_s=a,
                             prefill_b_s=b)


def _one_pool(profile, window=32768, cap=None):
    return [SimPool("p", profile, 1, cap, window)], LengthRouter([0, window], ["p"])


def test_a_request_alone_pays_its_whole_prompt_compute():
    """k prefill iterations cost k W + h c k(k-1)/2 + a P + b P² (however chunked), then l_out decode steps
    of W + h x + g each."""
    p = _profile()
    P, out = 2000, 50                     # 4 chunks of 512
    pools, router = _one_pool(p)
    res = simulate(pools, Requests(np.array([0.25]), np.array([P]), np.array([out])), router)
    ttft = 4 * W + H * 512 * (0 + 1 + 2 + 3) + A * P + B * P * P
    decode = out * (W + G) + H * (out * P + out * (out - 1) / 2)
    assert res.first_token_at_s[0] - 0.25 == pytest.approx(ttft, rel=1e-12)
    assert res.end_at_s[0] - res.first_token_at_s[0] == pytest.approx(decode, rel=1e-12)


def _reference(profile, arrivals, prompts, outputs, cap):
    """One replica, one iteration at a time: admission at every boundary, the even-chunk compute convention."""
    c = profile.chunk_tokens
    n = len(arrivals)
    first, end = np.full(n, np.nan), np.full(n, np.nan)
    queue = deque(range(n))
    running = []                        # [i, phase ('pf' | 'dec'), step]
    t = 0.0
    waiting = deque()
    parts = [0.0, 0.0, 0.0]                 # weights, KV-scan and compute seconds over the run
    while queue or waiting or running:
        if not running and not waiting:
            t = max(t, arrivals[queue[0]])
        while queue and arrivals[queue[0]] <= t:
            waiting.append(queue.popleft())
        while waiting and len(running) < cap:
            running.append([waiting.popleft(), "pf", 0])
        kv = comp = 0.0
        for i, phase, j in running:
            if phase == "pf":
                alpha, beta = prefill_compute_terms(profile, prompts[i])
                kv += H * j * c
                comp += float(alpha) + float(beta) * j
            else:
                kv += H * (prompts[i] + j)
                comp += profile.g_s
        t += profile.W_s + kv + comp
        parts[0] += profile.W_s
        parts[1] += kv
        parts[2] += comp
        keep = []
        for s in running:
            i, phase, j = s
            k = int(np.ceil(prompts[i] / c))
            if phase == "pf":
                if j + 1 == k:
                    first[i] = t
                    if outputs[i] == 0:
                        end[i] = t
                        continue
                    keep.append([i, "dec", 0])
                else:
                    keep.append([i, "pf", j + 1])
            else:
                if j + 1 == outputs[i]:
                    end[i] = t
                    continue
                keep.append([i, "dec", j + 1])
        running = keep
    _reference.parts = parts
    return first, end


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_engine_jumps_match_an_iteration_by_iteration_loop(seed):
    rng = np.random.default_rng(seed)
    n = 60
    arrivals = np.sort(rng.uniform(0.0, 3.0, n))
    prompts = rng.integers(1, 3000, n)
    outputs = rng.integers(0, 40, n)
    p = _profile(chunk=512, slots=64)
    pools, router = _one_pool(p, window=4096, cap=6)
    res = simulate(pools, Requests(arrivals, prompts, outputs), router)
    first, end = _reference(p, arrivals, prompts, outputs, cap=6)
    assert res.first_token_at_s == pytest.approx(first, rel=1e-9, abs=1e-12)
    assert res.end_at_s == pytest.approx(end, rel=1e-9, abs=1e-12)


@given(st.integers(0, 5000), st.integers(0, 300), st.sampled_from([64, 256, 512, 2048]),
       st.floats(0.0, 1e-4), st.floats(0.0, 1e-4), st.floats(0.0, 1e-8), st.floats(0.0, 1e-7))
@settings(max_examples=200, deadline=None)
def test_time_work_sums_are_the_per_iteration_sums(P, out, chunk, g, a, b, h):
    """Y and Y2 of compute_work/context_work against the request's iterations enumerated one by one."""
    prof = type("P", (), {"chunk_tokens": chunk, "prefill_a_s": a, "prefill_b_s": b})()
    k = int(np.ceil(P / chunk))
    alpha, beta = (float(v) for v in prefill_compute_terms(prof, P))
    per = [h * j * chunk + alpha + beta * j for j in range(k)] + [h * (P + d) + g for d in range(out)]
    X, X2 = (float(v) for v in context_work(P, out, chunk))
    Xd, P1, P2, Q1, Q2, R11, R12, R22 = (float(v) for v in compute_work(P, out, chunk))
    Y = h * X + g * out + a * P1 + b * P2
    Y2 = (h * h * X2 + 2 * h * g * Xd + 2 * h * a * Q1 + 2 * h * b * Q2 + g * g * out + a * a * R11
          + 2 * a * b * R12 + b * b * R22)
    assert Y == pytest.approx(sum(per), rel=1e-9, abs=1e-15)
    assert Y2 == pytest.approx(sum(v * v for v in per), rel=1e-9, abs=1e-18)
    assert sum(alpha + beta * j for j in range(k)) == pytest.approx(a * P + b * P * P, rel=1e-9, abs=1e-15)


def test_segment_statistics_of_a_trace_are_the_request_sums():
    rng = np.random.default_rng(5)
    prompts = rng.integers(1, 20_000, 400)
    outs = rng.integers(1, 800, 400)
    trace = RequestTrace(np.arange(400.0), prompts, outs)
    p = _profile()
    s = segment_stats(segment_basis(trace, np.array([0.0, 32768.0]), 512), [0], [1], p)
    X, _ = context_work(prompts, outs, 512)
    Y = H * X + G * outs + A * prompts + B * prompts.astype(float) ** 2
    assert s.mean_time_work[0] == pytest.approx(Y.mean(), rel=1e-9)
    # the TTFT classes are prompt bins of 256 tokens (half a chunk): each with its chunk count and mean compute
    q = np.ceil(prompts / 256).astype(int)
    assert s.ttft_probs[0].sum() == pytest.approx(1.0, rel=1e-12)
    checked = 0
    for qq in np.unique(q)[::7]:
        sel = q == qq
        kk = np.ceil(qq * 256 / 512)
        own = H * 512 * kk * (kk - 1) / 2 + A * prompts[sel].mean() + B * (prompts[sel].astype(float) ** 2).mean()
        assert s.ttft_chunks[qq] == kk
        assert s.ttft_probs[0, qq] == pytest.approx(sel.mean(), rel=1e-12)
        assert s.own_prefill_s[0, qq] == pytest.approx(own, rel=1e-9)
        checked += 1
    assert checked >= 5
    # without prefill compute the classes are the chunk counts themselves
    s0 = segment_stats(segment_basis(trace, np.array([0.0, 32768.0]), 512), [0], [1], _profile(a=0.0, b=0.0))
    assert s0.ttft_chunks.tolist() == list(range(s0.prefill_probs.shape[1]))
    assert np.array_equal(s0.ttft_probs, s0.prefill_probs)


def test_without_compute_terms_the_work_is_the_context_work():
    dist = LengthDistribution(np.array([0.0, 4096.0, 16384.0]), np.array([4096.0, 16384.0, 32768.0]),
                              np.array([0.6, 0.3, 0.1]))
    basis = segment_basis(dist, np.array([0.0, 8192.0, 32768.0]), 512)
    p = _profile(g=0.0, a=0.0, b=0.0)
    s = segment_stats(basis, [0, 1], [1, 2], p)
    assert s.mean_time_work == pytest.approx(H * s.mean_context_work, rel=1e-12)
    assert s.mean_time_work_sq == pytest.approx(H * H * s.mean_context_work_sq, rel=1e-12)


@pytest.mark.parametrize("lo, hi, lam, replicas, cap, n, chunk", [(0, 4096, 12.0, 2, 64, 60_000, 512),
                                                                  (4096, 32768, 0.6, 5, 12, 20_000, 512),
                                                                  pytest.param(0, 4096, 12.0, 2, 64, 60_000, 8192,
                                                                               marks=pytest.mark.slow),
                                                                  (4096, 32768, 0.6, 5, 12, 20_000, 8192)])
def test_batched_model_agrees_with_the_simulator_under_compute_terms(lo, hi, lam, replicas, cap, n, chunk):
    """Pools of the measured 8B profile, with 512-token chunks and with vLLM's 8,192-token budget (whose chunk
    iterations carry prefill lumps: prefill_lumps): the analytic P99 TTFT within 10 %, the mean batch and the
    mean activity power (board limit 700 W) within 5 % of a simulation of the same requests (the first 10 %
    of the run dropped as warm-up for the TTFT)."""
    dist = LengthDistribution(np.array([0.0, 1024.0, 4096.0, 16384.0]), np.array([1024.0, 4096.0, 16384.0, 32768.0]),
                              np.array([0.45, 0.35, 0.15, 0.05]))
    rng = np.random.default_rng(17)
    L = dist.sample(rng, 40 * n)
    L = L[(L > lo) & (L <= hi)][:n]
    prompts = np.ceil(0.8 * L).astype(np.int64)
    outs = np.maximum(np.ceil(L).astype(np.int64) - prompts, 1)
    p = replace(_profile(chunk=chunk, slots=128), power=_activity(limit_w=700.0))
    trace = RequestTrace(np.arange(float(len(prompts))), prompts, outs)
    s = segment_stats(segment_basis(trace, np.array([0.0, float(hi)]), chunk), [0], [1], p)
    traffic = BatchedTraffic.from_stats(s, lam, cap=cap)
    op = operating_point(traffic, replicas)
    assert op.stable[0] and 0.2 < op.full_load[0] < 0.9
    p99 = float(batched_ttft_p99_s(traffic, replicas)[0])
    arrivals = np.cumsum(rng.exponential(1.0 / lam, len(prompts)))
    res = simulate([SimPool("p", p, replicas, cap, hi)], Requests(arrivals, prompts, outs),
                   LengthRouter([0, hi], ["p"]))
    warm = arrivals > arrivals[-1] * 0.1
    sim_p99 = float(np.quantile((res.first_token_at_s - arrivals)[warm], 0.99))
    assert p99 == pytest.approx(sim_p99, rel=0.10), (p99, sim_p99)
    # whole-run mean batch (warm-up included: a 10 % start-up transient shifts it by well under the 5 %)
    assert op.mean_batch[0] == pytest.approx(float(res.pool_mean_batch[0]), rel=0.05)
    power_w = float(mean_activity_power_w(p.power, traffic, op)[0])
    assert power_w == pytest.approx(float(res.pool_mean_power_w[0]) / replicas, rel=0.05)



@pytest.mark.slow
@pytest.mark.parametrize("lam_r, replicas", [(5.5, 4), (5.5, 2)])
def test_batched_model_follows_heavy_concurrent_prefill(lam_r, replicas):
    """Prompts of 3,072-6,144 tokens in 512-token chunks on the measured 8B profile, at 76 % prefill load per
    replica: a request's prefill shares every iteration with several other prompts' chunks, and their number
    persists over it (own_prefill_context). The analytic P99 TTFT within 10 % of a 600,000-request simulation
    (first 10 % dropped); measured +9 % (four replicas) and +6 % (two). A shorter run is too noisy for the bound:
    over 120,000 requests the two-replica pool read 2.72 s, against 2.95 s here and 2.98-3.19 s over 1.2 million
    requests of two other seeds. Here the busy law alone (all running sequences alike) is within 2 %; the prefill
    class is what keeps two of the agreement pools (fleetopt bench) from being 26 % optimistic."""
    n = 600_000
    rng = np.random.default_rng(17)
    prompts = rng.integers(3072, 6145, n)
    outs = np.maximum(rng.geometric(1 / 80.0, n), 1)
    p = _profile(chunk=512, slots=128)
    s = segment_stats(segment_basis(RequestTrace(np.arange(float(n)), prompts, outs), np.array([0.0, 8192.0]), 512),
                      [0], [1], p)
    lam = lam_r * replicas
    traffic = BatchedTraffic.from_stats(s, lam)
    p99 = float(batched_ttft_p99_s(traffic, replicas)[0])
    arrivals = np.cumsum(rng.exponential(1.0 / lam, n))
    res = simulate([SimPool("p", p, replicas, None, 8192)], Requests(arrivals, prompts, outs),
                   LengthRouter([0, 8192], ["p"]))
    warm = arrivals > arrivals[-1] * 0.1
    sim_p99 = float(np.quantile((res.first_token_at_s - arrivals)[warm], 0.99))
    assert p99 == pytest.approx(sim_p99, rel=0.10), (p99, sim_p99)


@pytest.mark.parametrize("compute, prompt_hi", [(False, 6144), (True, 512)])
def test_own_prefill_law_is_the_busy_law_where_no_prefill_persists(compute, prompt_hi):
    """Two limits of own_prefill_context: without prefill compute (the seeds' units) every class sees the busy
    law of operating_point; with it, but every prompt one chunk (k = E[k] = 1), no other prompt's chunk outlives
    the iteration in progress, so the own iterations see the busy law too."""
    rng = np.random.default_rng(3)
    n = 5000
    prompts = rng.integers(64, prompt_hi + 1, n)
    outs = np.maximum(rng.geometric(1 / 80.0, n), 1)
    p = _profile(chunk=512, slots=128) if compute else _profile(chunk=512, slots=128, g=0.0, a=0.0, b=0.0)
    s = segment_stats(segment_basis(RequestTrace(np.arange(float(n)), prompts, outs),
                                    np.array([0.0, 32768.0]), 512), [0], [1], p)
    traffic = BatchedTraffic.from_stats(s, 30.0)
    op = operating_point(traffic, 3)
    mean, var = own_prefill_context(traffic, op)
    live = traffic.chunk_probs[0] > 0
    assert np.allclose(mean[0, live], op.busy_context_mean[0], rtol=1e-12)
    assert np.allclose(var[0, live], op.busy_context_var[0], rtol=1e-12)

def _activity(limit_w=10_000.0):
    return ActivityPower(idle_w=70.0, limit_w=limit_w, weights_w=430.0, kv_w=720.0, compute_w=800.0)


def test_activity_energy_of_a_request_alone_by_hand():
    """Idle before the arrival, then 4 prefill iterations and 50 decode steps at their component powers."""
    p = replace(_profile(), power=_activity())
    P, out = 2000, 50
    pools, router = _one_pool(p)
    res = simulate(pools, Requests(np.array([0.25]), np.array([P]), np.array([out])), router)
    ws = (4 + out) * W
    kv = H * (512 * 6 + out * P + out * (out - 1) / 2)
    cs = A * P + B * P * P + G * out
    busy = res.end_at_s[0] - 0.25
    assert busy == pytest.approx(ws + kv + cs, rel=1e-12)
    assert res.replica_energy_j[0] == pytest.approx(70.0 * 0.25 + 430.0 * ws + 720.0 * kv + 800.0 * cs, rel=1e-9)


@pytest.mark.parametrize("seed", [4, 5])
def test_activity_energy_matches_an_iteration_by_iteration_sum(seed):
    """The engine's closed-form span energies against the per-iteration energies of the reference loop (board
    limit not binding), over a whole run that starts and ends idle."""
    rng = np.random.default_rng(seed)
    n = 50
    arrivals = np.sort(rng.uniform(0.0, 2.0, n))
    prompts = rng.integers(1, 3000, n)
    outputs = rng.integers(0, 40, n)
    p = replace(_profile(chunk=512, slots=64), power=_activity())
    pools, router = _one_pool(p, window=4096, cap=5)
    res = simulate(pools, Requests(arrivals, prompts, outputs), router)
    first, end = _reference(p, arrivals, prompts, outputs, cap=5)
    parts = _reference.parts                               # (weights, kv, compute) seconds, summed
    busy = sum(parts)
    idle = float(np.nanmax(end)) - busy
    assert res.replica_energy_j[0] == pytest.approx(70.0 * idle + 430.0 * parts[0] + 720.0 * parts[1]
                                                    + 800.0 * parts[2], rel=1e-9)


@given(st.floats(0.0, 0.5), st.floats(1e-3, 0.3), st.floats(0.0, 0.2), st.floats(0.0, 40.0))
@settings(max_examples=100, deadline=None)
def test_coarrival_tail_is_the_average_over_the_residual(x0, spread, ell, rate):
    """P(U b + M ell > x0), M | U ~ Poisson(rate U b), by a 4,001-point midpoint rule over U and the Poisson sum;
    the closed form counts more than 6 co-arrivals as exceeding, so it may only be above by that mass."""
    from scipy import stats as sstats

    u = (np.arange(4001) + 0.5) / 4001
    m = np.arange(60)
    pmf = sstats.poisson.pmf(m[None, :], rate * u[:, None] * spread)
    direct = float(np.mean(np.sum(pmf * (u[:, None] * spread + m[None, :] * ell > x0), axis=1)))
    bound = float(np.mean(sstats.poisson.sf(6, rate * u * spread)))
    got = float(coarrival_exceed_prob(x0, spread, ell, rate))
    assert direct - 5e-4 <= got <= direct + bound + 5e-4
