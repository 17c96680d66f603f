"""The disaggregated prefill/decode simulator against hand computations, queueing theory and its own books.

Closed forms: a lone request's TTFT, TPOT, busy time and energy by hand; a one-prompt-at-a-time prefill
replica is the Lindley recursion of a single FCFS server whose service is the prompt's chunked prefill time,
and with equal prompts and Poisson arrivals its mean wait is Pollaczek-Khinchine's M/D/1; a decode pool of
slot cap 1 is the FCFS multi-server recursion (Kiefer-Wolfowitz), and with equal work its mean wait is the
M/D/c mean from the exact embedded chain at multiples of the service time (Crommelin). Books: Little's law on
both stations, busy slot-seconds against the records, conservation and the slot cap. No seeded digit of the
code under test is pinned.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from scipy import stats

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.solvers.des.disagg import DisaggPair, simulate_disaggregated
from fleetopt.solvers.des.metrics import littles_law, replications_ci
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.routing import Requests, poisson_arrivals

CURVE = PowerCurve(300.0, 700.0, 1.0, 4.0, "projected")
W_S, H_PER_TOKEN_S, G_S, A_S, B_S = 6.43e-3, 4.5e-8, 2.5e-5, 26.5e-6, 7.4e-10


def profile(chunk: int = 512, power=CURVE, W_s: float = W_S, h_s: float = H_PER_TOKEN_S, g_s: float = G_S,
            a_s: float = A_S, b_s: float = B_S, slots: int = 1024) -> CalibratedProfile:
    """The measured H100 / Llama-3.1-8B shape (conftest's ``h100_8b``): iteration W + h sum(ctx) + g n_dec +
    prefill compute a P + b P^2; KV blocks enough that the slot cap binds first."""
    return CalibratedProfile("h100-8b", "Llama-3.1-8B", W_s, h_s * 8192, 8192, chunk, 16, 10**7, slots, 3.0, 1,
                             power, "measured", g_s=g_s, prefill_a_s=a_s, prefill_b_s=b_s)


def prefill_by_hand_s(P, chunk: int = 512, W_s: float = W_S, h_s: float = H_PER_TOKEN_S, a_s: float = A_S,
                      b_s: float = B_S):
    """A prompt of P tokens alone on a replica: k = ceil(P/c) iterations, iteration j scanning the j c tokens of
    the full chunks before it, and the prompt's compute a P + b P^2 in all."""
    P = np.asarray(P, dtype=float)
    k = np.ceil(P / chunk)
    return k * W_s + h_s * chunk * k * (k - 1) / 2 + a_s * P + b_s * P * P


def decode_by_hand_s(P, out, W_s: float = W_S, h_s: float = H_PER_TOKEN_S, g_s: float = G_S):
    """l_out decode steps of one sequence alone at contexts P, P + 1, ..., P + l_out - 1."""
    P, out = np.asarray(P, dtype=float), np.asarray(out, dtype=float)
    return out * (W_s + h_s * P + g_s) + h_s * out * (out - 1) / 2


def pair_of(prefill=None, decode=None, n_p: int = 1, n_d: int = 1, window: int = 8192, **kw) -> DisaggPair:
    return DisaggPair(prefill_profile=prefill or profile(), prefill_replicas=n_p, decode_profile=decode or profile(),
                      decode_replicas=n_d, window_tokens=window, **kw)


def mdc_mean_wait_s(lam: float, D: float, c: int, states: int = 400) -> float:
    """Mean wait in queue of M/D/c (FCFS): the number in system N at instants D apart is the Markov chain
    N' = max(N - c, 0) + A, A ~ Poisson(lam D) (every customer in service at t leaves by t + D, no other does;
    Crommelin 1932). Its stationary mean is the time-average L, and Little gives W_q = L / lam - D."""
    pmf = stats.poisson.pmf(np.arange(states), lam * D)
    T = np.zeros((states, states))
    for n in range(states):
        base = max(n - c, 0)
        T[n, base:] = pmf[:states - base]
        T[n, -1] += 1.0 - T[n].sum()              # the truncated tail (negligible at the loads used)
    A = np.vstack([(T.T - np.eye(states))[:-1], np.ones(states)])
    pi = np.linalg.solve(A, np.r_[np.zeros(states - 1), 1.0])
    return float(pi @ np.arange(states)) / lam - D


def batch_means(values: np.ndarray, n_batches: int = 20) -> np.ndarray:
    return np.array([b.mean() for b in np.array_split(values, n_batches)])


def lone(arrival_s: float = 2.5, P: int = 1300, out: int = 5, tau: float = 0.0123, power=CURVE, n_d: int = 2):
    req = Requests(np.array([arrival_s]), np.array([P]), np.array([out]))
    return simulate_disaggregated(pair_of(profile(power=power), profile(power=power), n_d=n_d), req, transfer_s=tau)


# --- one request, by hand ---------------------------------------------------------------------------------------


def test_mdc_chain_with_one_server_is_pollaczek_khinchine():
    lam, D = 0.7, 1.0
    assert mdc_mean_wait_s(lam, D, 1) == pytest.approx(lam * D * D / (2 * (1 - lam * D)), rel=1e-9)


def test_lone_request_ttft_is_prefill_plus_transfer_and_tpot_its_steps_by_hand():
    a, P, out, tau = 2.5, 1300, 5, 0.0123
    res = lone(a, P, out, tau)
    pf, dec = prefill_by_hand_s(P), decode_by_hand_s(P, out)
    assert res.outcome.tolist() == [Outcome.COMPLETED]
    assert res.prefill_wait_s[0] == 0.0 and res.decode_wait_s[0] == 0.0
    assert res.prefill_end_at_s[0] == pytest.approx(a + pf, rel=1e-12)
    assert res.ttft_s[0] == pytest.approx(pf + tau, rel=1e-12)
    assert res.end_at_s[0] == pytest.approx(a + pf + tau + dec, rel=1e-12)
    # TPOT: l_out steps after the first token, over l_out - 1 gaps (the aggregated engine's convention)
    steps = [W_S + H_PER_TOKEN_S * (P + d) + G_S for d in range(out)]
    assert res.tpot_s[0] == pytest.approx(sum(steps) / (out - 1), rel=1e-12)
    assert res.e2e_s[0] == pytest.approx(pf + tau + dec, rel=1e-12)


def test_lone_request_busy_time_batch_and_power_curve_energy_by_hand():
    a, P, out, tau = 2.5, 1300, 5, 0.0123
    res = lone(a, P, out, tau)
    pf, dec = prefill_by_hand_s(P), decode_by_hand_s(P, out)
    p0, p1 = CURVE.power_w(0), CURVE.power_w(1)
    # prefill: one replica, window [0, end of the prefill], idle until the arrival
    s = res.prefill
    assert s.window_end_s == pytest.approx(a + pf, rel=1e-12)
    assert s.busy_s == pytest.approx(pf, rel=1e-12)
    assert s.energy_j == pytest.approx(p0 * a + p1 * pf, rel=1e-12)
    assert s.mean_batch == pytest.approx(pf / (a + pf), rel=1e-12)
    assert s.utilization == pytest.approx(pf / (a + pf), rel=1e-12)
    # decode: two replicas, window [0, completion]; one serves the request from its arrival there, one idles
    end = a + pf + tau + dec
    d = res.decode
    assert d.window_end_s == pytest.approx(end, rel=1e-12)
    assert d.busy_s == pytest.approx(dec, rel=1e-12)
    assert d.energy_j == pytest.approx(p0 * (end - dec) + p1 * dec + p0 * end, rel=1e-12)
    assert d.mean_power_w == pytest.approx(d.energy_j / end, rel=1e-12)
    assert d.mean_batch == pytest.approx(dec / end / 2, rel=1e-12)
    assert d.utilization == pytest.approx(dec / (2 * end), rel=1e-12)
    assert d.served == 1 and s.served == 1


def test_lone_request_activity_energy_by_hand():
    """Activity power: weights, KV-scan and compute seconds at their intensities (no board limit reached), idle
    power otherwise."""
    act = ActivityPower(idle_w=70.0, limit_w=1e6, weights_w=400.0, kv_w=700.0, compute_w=800.0)
    a, P, out, tau = 2.5, 1300, 5, 0.0123
    res = lone(a, P, out, tau, power=act)
    pf, dec = prefill_by_hand_s(P), decode_by_hand_s(P, out)
    k = math.ceil(P / 512)
    pf_j = 400.0 * k * W_S + 700.0 * H_PER_TOKEN_S * 512 * k * (k - 1) / 2 + 800.0 * (A_S * P + B_S * P * P)
    assert res.prefill.energy_j == pytest.approx(70.0 * a + pf_j, rel=1e-9)
    dec_j = 400.0 * out * W_S + 700.0 * H_PER_TOKEN_S * (out * P + out * (out - 1) / 2) + 800.0 * out * G_S
    end = a + pf + tau + dec
    assert res.decode.energy_j == pytest.approx(70.0 * (end - dec) + dec_j + 70.0 * end, rel=1e-9)


# --- sample paths: single servers and multi-server FCFS ---------------------------------------------------------


def test_one_prompt_at_a_time_prefill_replica_is_the_lindley_recursion():
    rng = np.random.default_rng(np.random.SeedSequence(401))
    n = 2000
    P = rng.integers(1, 4000, n)
    req = Requests(poisson_arrivals(3.0, n, rng), P, rng.integers(1, 50, n))
    res = simulate_disaggregated(pair_of(prefill_max_num_seqs=1, n_d=4), req, transfer_s=0.0)
    S = prefill_by_hand_s(P)
    start, free_at = np.empty(n), 0.0
    for i in range(n):
        start[i] = max(req.arrival_at_s[i], free_at)
        free_at = start[i] + S[i]
    np.testing.assert_allclose(res.prefill_start_at_s, start, rtol=1e-10)
    np.testing.assert_allclose(res.prefill_end_at_s, start + S, rtol=1e-10)


def test_decode_pool_of_slot_cap_one_is_the_fcfs_multiserver_recursion():
    """Slot cap 1: a freed replica is idle, the pool's FIFO queue feeds it at once, so decode admission is
    Kiefer-Wolfowitz's recursion over the arrivals at the pool (first token) with each request's decode time."""
    rng = np.random.default_rng(np.random.SeedSequence(402))
    n, c = 3000, 3
    P, out = rng.integers(1, 3000, n), rng.integers(1, 200, n)
    req = Requests(poisson_arrivals(2.0, n, rng), P, out)
    tau = rng.uniform(0.0, 0.2, n)
    res = simulate_disaggregated(pair_of(n_p=2, n_d=c, decode_max_num_seqs=1), req, transfer_s=tau)
    np.testing.assert_array_equal(res.first_token_at_s, res.prefill_end_at_s + tau)
    S = decode_by_hand_s(P, out)
    order = np.argsort(res.first_token_at_s, kind="stable")
    free_at = [0.0] * c
    start = np.empty(n)
    for i in order:
        start[i] = max(res.first_token_at_s[i], free_at[0])
        heapq.heapreplace(free_at, start[i] + S[i])
    np.testing.assert_allclose(res.decode_start_at_s, start, rtol=1e-10)
    np.testing.assert_allclose(res.end_at_s, start + S, rtol=1e-10)


def test_prefill_pool_queue_is_the_fcfs_multiserver_recursion():
    """prefill_queue 'pool': one FIFO queue, one prompt at a time per replica: Kiefer-Wolfowitz with each prompt's
    prefill time by hand (the analytic prefill station's M/G/c)."""
    rng = np.random.default_rng(np.random.SeedSequence(407))
    n, c = 3000, 3
    P = rng.integers(1, 6000, n)
    req = Requests(poisson_arrivals(18.0, n, rng), P, rng.integers(1, 20, n))
    res = simulate_disaggregated(pair_of(n_p=c, n_d=2, prefill_queue="pool"), req, transfer_s=0.0)
    S = prefill_by_hand_s(P)
    free_at, start = [0.0] * c, np.empty(n)
    for i in range(n):
        start[i] = max(req.arrival_at_s[i], free_at[0])
        heapq.heapreplace(free_at, start[i] + S[i])
    assert np.mean(start > req.arrival_at_s) > 0.2          # the queue matters
    np.testing.assert_allclose(res.prefill_start_at_s, start, rtol=1e-12)
    np.testing.assert_allclose(res.prefill_end_at_s, start + S, rtol=1e-12)
    assert res.prefill.max_num_seqs == 1


@pytest.mark.parametrize("power, horizon", [(CURVE, False), (CURVE, True),
                                            (ActivityPower(idle_w=70.0, limit_w=650.0, weights_w=400.0, kv_w=700.0,
                                                           compute_w=800.0), False)])
def test_one_prefill_replica_runs_the_same_with_a_pool_queue_as_with_the_engine(power, horizon):
    """One replica prefilling one prompt at a time: its own queue is the pool's, so the pool-queue station and
    the engine's replica (cap 1) must leave the same records, integrals and, under activity power, energy (the
    board limit binds on long prompts here). Under a power curve of the batch the pool-queue station charges a
    busy replica the curve at one chunk's tokens (the analytic prefill station's rule), the engine at batch 1."""
    rng = np.random.default_rng(np.random.SeedSequence(408))
    n = 1500
    req = Requests(poisson_arrivals(4.0, n, rng), rng.integers(1, 8000, n), rng.integers(1, 30, n))
    end = float(req.arrival_at_s[-1]) if horizon else None
    runs = [simulate_disaggregated(pair_of(profile(power=power), n_d=2, prefill_max_num_seqs=1, prefill_queue=q),
                                   req, transfer_s=0.001, horizon_s=end, warmup_s=10.0) for q in ("pool", "replica")]
    a, b = (r.prefill_sim for r in runs)
    for col in ("start_at_s", "first_token_at_s", "end_at_s"):
        np.testing.assert_allclose(getattr(a, col), getattr(b, col), rtol=1e-12, err_msg=col)
    np.testing.assert_array_equal(a.outcome, b.outcome)
    assert a.window_end_s == pytest.approx(b.window_end_s, rel=1e-12)
    for col in ("pool_mean_in_system", "pool_busy_slot_s", "replica_mean_batch"):
        np.testing.assert_allclose(getattr(a, col), getattr(b, col), rtol=1e-9, err_msg=col)
    if isinstance(power, ActivityPower):
        np.testing.assert_allclose(a.replica_energy_j, b.replica_energy_j, rtol=1e-9)
    else:
        window = a.window_end_s - 10.0
        busy = a.replica_mean_batch * window
        by_hand = power.power_w(512) * busy + power.power_w(0) * (window - busy)   # 512: profile()'s chunk
        np.testing.assert_allclose(a.replica_energy_j, by_hand, rtol=1e-9)
    assert (a.outcome == Outcome.UNFINISHED).any() == horizon


# --- queueing theory --------------------------------------------------------------------------------------------


def test_prefill_replica_with_equal_prompts_has_the_md1_mean_wait():
    rng = np.random.default_rng(np.random.SeedSequence(403))
    n, P, rho = 40_000, 2000, 0.7
    D = float(prefill_by_hand_s(P))
    lam = rho / D
    req = Requests(poisson_arrivals(lam, n, rng), np.full(n, P), np.ones(n, dtype=int))
    res = simulate_disaggregated(pair_of(prefill_max_num_seqs=1, n_d=1), req, transfer_s=0.0)
    np.testing.assert_allclose(res.prefill_end_at_s - res.prefill_start_at_s, D, rtol=1e-10)   # deterministic
    ci = replications_ci(batch_means(res.prefill_wait_s[1000:]), confidence=0.99)
    pk = lam * D * D / (2 * (1 - rho))
    assert ci.low <= pk <= ci.high, (ci, pk)


def test_decode_pool_of_slot_cap_one_with_equal_work_has_the_mdc_mean_wait():
    """A prefill of one microsecond on replicas that never queue (checked) and a constant transfer pass the
    Poisson stream to the decode pool shifted by a constant, so the decode pool is M/D/c."""
    rng = np.random.default_rng(np.random.SeedSequence(404))
    n, c, P, out, rho = 60_000, 3, 1000, 40, 0.75
    fast = profile(W_s=1e-6, h_s=1e-12, g_s=0.0, a_s=0.0, b_s=0.0)
    D = float(decode_by_hand_s(P, out))
    lam = rho * c / D
    req = Requests(poisson_arrivals(lam, n, rng), np.full(n, P), np.full(n, out))
    res = simulate_disaggregated(pair_of(prefill=fast, n_p=8, n_d=c, prefill_max_num_seqs=1, decode_max_num_seqs=1),
                                 req, transfer_s=0.05)
    assert np.all(res.prefill_wait_s == 0.0)
    np.testing.assert_allclose(res.end_at_s - res.decode_start_at_s, D, rtol=1e-10)
    ci = replications_ci(batch_means(res.decode_wait_s[1000:]), confidence=0.99)
    want = mdc_mean_wait_s(lam, D, c)
    assert ci.low <= want <= ci.high, (ci, want)


# --- books -------------------------------------------------------------------------------------------------------


def mixed_run(horizon: bool, n: int = 3000, seed: int = 405):
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    P = rng.integers(0, 3000, n)
    out = rng.integers(0, 400, n)
    out[P == 0] = np.maximum(out[P == 0], 1)      # a request has at least one token
    P[rng.random(n) < 0.01] = 9000                # beyond the window: rejected
    req = Requests(poisson_arrivals(12.0, n, rng), P, out)
    pair = pair_of(n_p=2, n_d=3, decode_max_num_seqs=48, prefill_max_num_seqs=4)
    end = float(req.arrival_at_s[-1]) if horizon else None
    res = simulate_disaggregated(pair, req, transfer_s=lambda p: 0.002 + 1e-6 * p, horizon_s=end,
                                 warmup_s=20.0, measure_end_s=0.8 * float(req.arrival_at_s[-1]))
    return req, res


@pytest.mark.parametrize("horizon", [False, True])
def test_littles_law_and_busy_slot_seconds_on_both_stations(horizon):
    _, res = mixed_run(horizon)
    for sim in (res.prefill_sim, res.decode_sim):
        L, lam_w = littles_law(sim)
        np.testing.assert_allclose(L, lam_w, rtol=1e-9)
        # busy slot-seconds: the engine's batch integral against the records' [start, end] in the window
        t0, t1 = sim.window_start_s, sim.window_end_s
        s = np.clip(sim.start_at_s, t0, t1)
        e = np.clip(np.where(np.isnan(sim.end_at_s), t1, sim.end_at_s), t0, t1)
        np.testing.assert_allclose(sim.pool_busy_slot_s[0], np.nansum(e - s), rtol=1e-9)


def test_conservation_every_request_completes_once_in_order():
    req, res = mixed_run(horizon=False)
    n = len(req)
    over = req.total_tokens > 8192
    assert np.array_equal(res.outcome == Outcome.REJECTED, over)
    assert res.count(Outcome.COMPLETED) == n - over.sum() and res.count(Outcome.UNFINISHED) == 0
    ok = ~over
    # each request with a prompt is prefilled once, each with output decoded once
    np.testing.assert_array_equal(np.sort(res.prefill_request), np.flatnonzero(ok & (req.prompt_tokens > 0)))
    np.testing.assert_array_equal(np.sort(res.decode_request), np.flatnonzero(ok & (req.output_tokens > 0)))
    assert res.prefill_sim.count(Outcome.COMPLETED) == len(res.prefill_request)
    assert res.decode_sim.count(Outcome.COMPLETED) == len(res.decode_request)
    a, ps, pe, f, ds, e = (x[ok] for x in (res.arrival_at_s, res.prefill_start_at_s, res.prefill_end_at_s,
                                           res.first_token_at_s, res.decode_start_at_s, res.end_at_s))
    assert np.all(a <= ps) and np.all(ps <= pe) and np.all(pe <= f) and np.all(np.isfinite(e))
    dec = req.output_tokens[ok] > 0
    assert np.all(f[dec] <= ds[dec]) and np.all(ds[dec] < e[dec])
    assert np.all(np.isnan(ds[~dec])) and np.array_equal(e[~dec], pe[~dec])       # no output: ends at prefill
    np.testing.assert_allclose(f[dec] - pe[dec], 0.002 + 1e-6 * req.prompt_tokens[ok][dec], rtol=0, atol=1e-12)
    assert np.all(np.isnan(res.tpot_s[ok][req.output_tokens[ok] <= 1]))
    # the slot cap holds on every decode replica at every admission
    for r in range(3):
        mine = res.decode_replica == r
        starts, ends = res.decode_start_at_s[mine], res.end_at_s[mine]
        running = np.searchsorted(np.sort(starts), starts, side="right") - np.searchsorted(np.sort(ends), starts,
                                                                                             side="right")
        assert running.max() <= 48


def test_horizon_leaves_late_requests_unfinished_and_their_ttft_infinite_in_the_p99():
    req, res = mixed_run(horizon=True)
    end = float(req.arrival_at_s[-1])
    late = res.outcome == Outcome.UNFINISHED
    assert late.any()
    assert np.all(np.isnan(res.end_at_s[late]))
    assert np.all(np.nan_to_num(res.first_token_at_s, nan=0.0) <= end)
    ttft = np.where(np.isnan(res.ttft_s), np.inf, res.ttft_s)[res.measured]
    assert res.p99_ttft is not None and res.p99_tpot is not None
    assert res.p99_ttft.value == float(np.percentile(ttft, 99, method="inverted_cdf"))
    tpot = res.tpot_s[res.measured & np.isfinite(res.tpot_s)]
    assert res.p99_tpot.value == float(np.percentile(tpot, 99, method="inverted_cdf"))
    for est in (res.p99_ttft, res.p99_tpot):
        assert est.low <= est.value <= est.high and est.n == 20
    assert np.array_equal(res.measured, (req.arrival_at_s >= 20.0) & (req.arrival_at_s <= 0.8 * end))


def test_same_input_gives_byte_identical_results():
    _, one = mixed_run(horizon=True, n=1500, seed=406)
    _, two = mixed_run(horizon=True, n=1500, seed=406)
    for name in ("prefill_start_at_s", "prefill_end_at_s", "first_token_at_s", "decode_start_at_s", "end_at_s",
                 "prefill_replica", "decode_replica", "outcome", "ttft_s", "tpot_s"):
        assert getattr(one, name).tobytes() == getattr(two, name).tobytes(), name
    assert one.p99_ttft == two.p99_ttft and one.p99_tpot == two.p99_tpot
    assert one.prefill == two.prefill and one.decode == two.decode


# --- bad input ---------------------------------------------------------------------------------------------------


def test_bad_input_is_named():
    req = Requests(np.array([0.0, 1.0]), np.array([10, 20]), np.array([5, 5]))
    with pytest.raises(ValueError, match="decode_replicas"):
        pair_of(n_d=0)
    with pytest.raises(ValueError, match="pool decode: max_num_seqs"):
        pair_of(decode_max_num_seqs=10**6)
    with pytest.raises(ValueError, match=r"transfer_s\[1\]"):
        simulate_disaggregated(pair_of(), req, transfer_s=np.array([0.1, -1.0]))
    with pytest.raises(ValueError, match="one per request"):
        simulate_disaggregated(pair_of(), req, transfer_s=np.array([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="prefill_queue 'pool' prefills one prompt at a time"):
        pair_of(prefill_queue="pool", prefill_max_num_seqs=2)
    with pytest.raises(ValueError, match="prefill_queue must be one of"):
        pair_of(prefill_queue="central")
    with pytest.raises(ValueError, match="warmup_s"):
        simulate_disaggregated(pair_of(), req, transfer_s=0.0, horizon_s=1.0, warmup_s=2.0)
