"""Disaggregated prefill/decode pairs in ``fleetopt simulate`` and ``--verify-top``.

A plan with a P/D pair simulates the pair as its two stations with the KV transfer between them
(:mod:`fleetopt.optimizer.simulation.pairs`) and reports it as two rows, prefill then decode. The tests rebuild
the pair's run from the stream the seed gives (independently of the pipeline), check that a pair sized by the
analytic stations passes verification and that one replica fewer in either phase (where the analytic model says
it misses) fails, determinism by seed, and the round trip of a P/D plan through a solve JSON file.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from fleetopt.models.fleet import DecodeStage, PoolPlan
from fleetopt.models.queueing.disagg import prefill_service_s
from fleetopt.optimizer.io.instance import instance_from_dict
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.plan_files import load_solved_plan
from fleetopt.optimizer.simulation.pool_sizing import pool_outcome
from fleetopt.optimizer.simulation.simulate import plans_from_fleet, simulate_plan
from fleetopt.optimizer.simulation.verify import judge_plan
from fleetopt.solvers.des.disagg import DisaggPair, simulate_disaggregated
from fleetopt.solvers.des.routing import Requests, poisson_arrivals, sample_lengths

SLO_TTFT_MS, SLO_TPOT_MS = 1000.0, 60.0
REQUESTS = 12_000


@pytest.fixture(scope="module")
def inst():
    """Llama-3.1-8B (TP=1) on H100 and A100 (computed profiles), 20 req/s up to 8,192 tokens; pairs allowed with
    fleetopt's own bandwidth model over the network (no latency)."""
    return instance_from_dict({
        "name": "pd-sim", "workload": {"cdf": [[1024, 0.5], [4096, 0.9], [8192, 1.0]], "arrival_rate": 20.0},
        "slo": {"ttft_p99_ms": SLO_TTFT_MS, "tpot_p99_ms": SLO_TPOT_MS},
        "gpus": [{"name": "h100", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-8B", "tp": 1},
                 {"name": "a100", "hardware": "A100-SXM-80GB", "model": "Llama-3.1-8B", "tp": 1}],
        "pools": {"max_pools": 2, "max_context": 8192, "disaggregation": "allow"}})


def _plan(inst, prefill=None, decode=None):
    """0-1024 aggregated on h100 (sized), 1024-8192 a pair: h100 prefill, a100 decode (None: sized)."""
    h, a = inst.gpu("h100"), inst.gpu("a100")
    return [PoolPlan(0, 1024, "h100", h.profile, None),
            PoolPlan(1024, 8192, "h100", h.profile, prefill, decode=DecodeStage(gpu="a100", profile=a.profile,
                                                                                  replicas=decode),
                     transfer=inst.pools.transfer("h100", "a100"))]


def _options(seed=3, requests=REQUESTS):
    return SimOptions(requests=requests, replications=1, seed=seed)


def test_pair_rows_and_ttft_are_the_pair_simulators(inst):
    rep = simulate_plan(inst, _plan(inst), _options())
    phases = [p.analytic.phase for p in rep.pools]
    assert phases == ["both", "prefill", "decode"]
    pre, dec = rep.pools[1], rep.pools[2]
    assert (pre.analytic.gpu, dec.analytic.gpu) == ("h100", "a100")
    assert (pre.min_tokens, pre.max_tokens) == (dec.min_tokens, dec.max_tokens) == (1024, 8192)
    # the pair's run rebuilt from the seed: the stream of replication 0, the requests of (1024, 8192], the pool
    # queue, the transfer as KV bytes over the link (no latency) and the report's own window
    w = inst.workload
    rng = np.random.default_rng(np.random.SeedSequence(3).spawn(1)[0])
    at = poisson_arrivals(w.arrival_rate_req_per_s, REQUESTS, rng)
    prompt, output = sample_lengths(w.lengths, REQUESTS, rng, w.input_fraction)
    total = prompt + output
    mine = (total > 1024) & (total <= 8192)
    x = inst.pools.transfer("h100", "a100")
    tau = prompt[mine] * x.kv_bytes_per_token / x.bandwidth_bytes_per_s
    pair = DisaggPair(prefill_profile=inst.gpu("h100").profile, prefill_replicas=pre.replicas,
                      decode_profile=inst.gpu("a100").profile, decode_replicas=dec.replicas, window_tokens=8192,
                      decode_max_num_seqs=dec.analytic.max_num_seqs, prefill_queue="pool")
    horizon = float(at[-1])
    got = simulate_disaggregated(pair, Requests(at[mine], prompt[mine], output[mine]), transfer_s=tau,
                                 horizon_s=horizon, warmup_s=rep.warmup_s, measure_end_s=horizon - rep.cooldown_s)
    assert pre.requests == dec.requests == int(got.measured.sum())
    assert pre.ttft_p99_ms_sim == pytest.approx(got.p99_ttft.value * 1000.0, rel=1e-12)
    assert pre.ttft_p99_ci_ms == pytest.approx((got.p99_ttft.low * 1000.0, got.p99_ttft.high * 1000.0), rel=1e-12)
    assert dec.tpot_p99_ms_sim == pytest.approx(got.p99_tpot.value * 1000.0, rel=1e-12)
    assert pre.utilization_sim == pytest.approx(got.prefill.utilization, rel=1e-12)
    assert dec.mean_batch == pytest.approx(got.decode.mean_batch, rel=1e-12)
    assert dec.power_w_sim == pytest.approx(got.decode.mean_power_w, rel=1e-12)
    # each row reports its own phase's figure only
    assert math.isnan(pre.tpot_p99_ms_sim) and math.isnan(dec.ttft_p99_ms_sim)
    # the fleet's P99s cover every measured request, the aggregated pool's and the pair's
    assert rep.requests_measured == rep.pools[0].requests + pre.requests
    assert rep.ttft_p99_ms >= min(rep.pools[0].ttft_p99_ms_sim, pre.ttft_p99_ms_sim)
    assert [p["phase"] for p in rep.to_json()["pools"]] == phases


def test_the_transfer_is_kv_bytes_over_the_slower_link(inst):
    """Hand check of the transfer the pair runs with: 131,072 KV bytes a token for Llama-3.1-8B in 16 bits (32
    layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes) over the slower side's NIC, the A100's 200 Gb/s = 25 GB/s
    (the H100's is 50 GB/s): a 4,000-token prompt in 20.97152 ms, whatever its prefill time."""
    x = inst.pools.transfer("h100", "a100")
    assert x.kv_bytes_per_token == 32 * 8 * 128 * 2 * 2
    assert x.bandwidth_bytes_per_s == 25e9
    assert float(x.time_s(4000, prefill_service_s(inst.gpu("h100").profile, 4000))) == pytest.approx(
        0.02097152, rel=1e-12)


def test_sized_pair_passes_and_one_prefill_replica_fewer_fails(inst):
    sized = simulate_plan(inst, _plan(inst), _options())
    v = judge_plan(sized, inst, "ci-upper", settled=True)
    assert v.passed, (v.failing, v.thin, v.undecided)
    n_p, n_d = sized.pools[1].replicas, sized.pools[2].replicas
    rep = simulate_plan(inst, _plan(inst, n_p - 1, n_d), _options())
    row = rep.pools[1]
    assert not row.analytic.slo_met                      # the analytic model says it misses
    v = judge_plan(rep, inst, "ci-upper", settled=True)
    assert not v.passed and (1024, 8192, "h100") in v.failing
    assert not rep.slo_met and not row.slo_met_sim and rep.pools[2].slo_met_sim


def test_overloaded_decode_pool_fails_on_tpot(inst):
    """The decode pool cut to where the analytic model calls it overloaded (its utilisation above 1): its
    requests wait for slots, the wait counts in TPOT, and the decode row fails while the prefill row passes.
    (One decode replica fewer than sized is not enough: the station sizes to at most 1 % of requests waiting for
    a slot at a full-batch hold, which the simulated pool meets with replicas to spare; docs/simulation.md.)"""
    sized = simulate_plan(inst, _plan(inst), _options())
    n_p, n_d = sized.pools[1].replicas, sized.pools[2].replicas
    fewer = next(n for n in range(n_d - 1, 0, -1)
                 if simulate_plan(inst, _plan(inst, n_p, n), _options(requests=2000)).pools[2].analytic.utilization > 1)
    rep = simulate_plan(inst, _plan(inst, n_p, fewer), _options())
    v = judge_plan(rep, inst, "ci-upper", settled=True)
    assert not v.passed and (1024, 8192, "a100") in v.failing
    assert rep.pools[1].slo_met_sim and not rep.pools[2].slo_met_sim
    assert rep.pools[2].tpot_p99_ms_sim > SLO_TPOT_MS


def _row(phase, ttft_ci=(math.nan, math.nan), tpot_ci=(math.nan, math.nan)):
    return SimpleNamespace(analytic=SimpleNamespace(phase=phase), ttft_p99_ci_ms=ttft_ci,
                           ttft_p99_ms_sim=float(np.mean(ttft_ci)), tpot_p99_ci_ms=tpot_ci,
                           tpot_p99_ms_sim=float(np.mean(tpot_ci)), slo_attainment=math.nan)


def test_pair_rows_are_judged_on_their_own_figure():
    """The decode row by its TPOT interval, the prefill row by its TTFT interval alone (a TPOT limit does not
    apply to it), with pass / fail / undecided as for any pool."""
    assert [pool_outcome(_row("decode", tpot_ci=ci), "ci-upper", 500.0, 50.0)
            for ci in ((20.0, 30.0), (55.0, 70.0), (40.0, 60.0))] == ["pass", "fail", "undecided"]
    assert pool_outcome(_row("decode", tpot_ci=(90.0, 99.0)), "ci-upper", 500.0, None) == "pass"
    assert pool_outcome(_row("decode", tpot_ci=(55.0, 70.0)), "point", 500.0, 50.0) == "fail"
    assert pool_outcome(_row("prefill", ttft_ci=(300.0, 400.0)), "ci-upper", 500.0, 1.0) == "pass"
    assert pool_outcome(_row("prefill", ttft_ci=(450.0, 600.0)), "ci-upper", 500.0, None) == "undecided"


def _stable_json(rep) -> str:
    def drop(x):
        if isinstance(x, dict):
            return {k: drop(v) for k, v in x.items() if k not in ("wall_seconds", "wall_s")}
        if isinstance(x, list):
            return [drop(v) for v in x]
        return x
    return json.dumps(drop(rep.to_json()), sort_keys=True, allow_nan=True)


def test_same_seed_same_report(inst):
    a = _stable_json(simulate_plan(inst, _plan(inst), _options(seed=11, requests=6000)))
    b = _stable_json(simulate_plan(inst, _plan(inst), _options(seed=11, requests=6000)))
    c = _stable_json(simulate_plan(inst, _plan(inst), _options(seed=12, requests=6000)))
    assert a == b
    assert a != c


def test_pd_plan_round_trips_through_a_solve_json(inst, tmp_path):
    rep = simulate_plan(inst, _plan(inst), _options(requests=6000))
    rows = [{"min_tokens": p.min_tokens, "max_tokens": p.max_tokens, "gpu": p.gpu, "replicas": p.replicas,
             "max_num_seqs": p.analytic.max_num_seqs, "phase": p.analytic.phase} for p in rep.pools]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"command": "solve", "instance": inst.name, "overrides": [], "pools": rows}))
    loaded = load_solved_plan(path, inst).pools
    assert len(loaded) == 2 and loaded[0].decode is None
    pair = loaded[1]
    assert (pair.lo_tokens, pair.hi_tokens, pair.gpu, pair.replicas) == (1024, 8192, "h100", rows[1]["replicas"])
    assert (pair.decode.gpu, pair.decode.replicas, pair.decode.max_num_seqs) == ("a100", rows[2]["replicas"],
                                                                                rows[2]["max_num_seqs"])
    assert pair.transfer == inst.pools.transfer("h100", "a100")
    # the evaluated fleet reads back to the same pools, and the file's plan simulates to the same report
    assert [(p.lo_tokens, p.gpu, p.replicas, p.decode) for p in plans_from_fleet(inst, rep.analytic)] == \
        [(p.lo_tokens, p.gpu, p.replicas, p.decode) for p in loaded]
    again = simulate_plan(inst, loaded, _options(requests=6000))
    assert _stable_json(again) == _stable_json(rep)


def test_bad_pair_rows_in_a_solve_json_are_one_line(inst, tmp_path):
    from fleetopt.optimizer.errors import InstanceError

    base = {"min_tokens": 0, "max_tokens": 8192, "gpu": "h100", "replicas": 2, "max_num_seqs": 1}
    for pools, needle in (([{**base, "phase": "prefill"}], "followed by its pair's decode row"),
                          ([{**base, "phase": "decode"}], "must follow its pair's prefill row"),
                          ([{**base, "phase": "middle"}], "'middle'"),
                          ([{**base, "phase": "prefill"}, {**base, "phase": "decode", "min_tokens": 1024}],
                           "serve one segment")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({"command": "solve", "instance": inst.name, "overrides": [], "pools": pools}))
        with pytest.raises(InstanceError, match=needle):
            load_solved_plan(path, inst)


def test_no_transfer_without_disaggregation(inst, tmp_path):
    from fleetopt.optimizer.errors import InstanceError

    plain = replace(inst, pools=replace(inst.pools, disaggregation="none", kv_transfers=()))
    rows = [{"min_tokens": 0, "max_tokens": 8192, "gpu": "h100", "replicas": 2, "max_num_seqs": 1,
             "phase": "prefill"},
            {"min_tokens": 0, "max_tokens": 8192, "gpu": "a100", "replicas": 3, "max_num_seqs": 8, "phase": "decode"}]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"command": "solve", "instance": inst.name, "overrides": [], "pools": rows}))
    with pytest.raises(InstanceError, match="no KV transfer"):
        load_solved_plan(path, plain)


def test_pairs_refuse_routers_that_read_queues(inst):
    from fleetopt.optimizer.errors import InstanceError

    with pytest.raises(InstanceError, match="P/D pairs"):
        simulate_plan(inst, _plan(inst), replace(_options(requests=2000), router="spillover"))


@pytest.mark.slow
def test_pair_agreement_on_a_fixed_draw():
    """The P/D agreement run on a fixed draw of 6 pairs (seed 2024, 20,000 requests each): the prefill utilisation
    (a Poisson stream through c servers: exact up to sampling) and the decode power within 5 %, and the pair's P99
    TTFT never optimistic by more than 20 % (docs/benchmarks.md, "P/D pairs")."""
    from fleetopt.optimizer.simulation.agreement import (PD_METRICS, agreement_options, run_pair_agreement,
                                                         summarize_pair_agreement)

    recs = run_pair_agreement(6, np.random.default_rng(2024), agreement_options(20_000))
    assert len(recs) == 6
    for r in recs:
        assert abs(r.metric("prefill_utilization").ratio - 1) <= 0.05
        assert abs(r.metric("decode_power").ratio - 1) <= 0.05
        assert r.metric("ttft_p99").ratio >= 0.8
        assert r.pool.prefill.phase == "prefill" and r.pool.decode.phase == "decode"
    assert [s.metric for s in summarize_pair_agreement(recs)] == [f"pd_{m}" for m in PD_METRICS]


def test_seed_factor_transfer_reads_each_requests_own_prefill():
    """The reference's convention, T_x = (1.8 - 1) S_p, per request: on a unit with W = 4 ms, H = 0.32 ms at 8,192
    tokens, 1,024-token chunks and no compute terms, a 2,048-token prompt prefills in 2 chunks, 2 W + (H / 8,192)
    x 1,024 x (0 + 1) = 8.04 ms, so its transfer is 6.432 ms; a 1,000-token one in 4 ms, transfer 3.2 ms."""
    from fleetopt.models.power import PowerCurve
    from fleetopt.models.profiles import CalibratedProfile
    from fleetopt.models.queueing.disagg import KVTransfer
    from fleetopt.optimizer.simulation.pairs import transfer_times

    gpu = CalibratedProfile("g", "m", 0.004, 0.00032, 8192, 1024, 16, 65536, 256, 1.0, 1,
                            PowerCurve(300.0, 600.0, 1.0, 4.2, "measured"))
    plan = PoolPlan(0, 4096, "g", gpu, 1, decode=DecodeStage(gpu="g", profile=gpu, replicas=1),
                    transfer=KVTransfer(model="seed-factor"))
    assert transfer_times(plan, np.array([2048, 1000])) == pytest.approx([0.006432, 0.0032], rel=1e-12)


def test_pair_rows_fallback_matches_the_fleet_evaluation(inst, monkeypatch):
    """Where the analytic evaluation reports a pair as one row (before it knew pairs), ``analytic_fleet`` builds
    the pair's rows from the stations; they agree with the evaluation that does report them on the counts, the
    P99 TTFT, the decode batch cap and the TPOT bound."""
    from dataclasses import replace as dc_replace

    import fleetopt.optimizer.simulation.pairs as pairs_mod
    from fleetopt.optimizer.plan.evaluate import evaluate_plans

    plan = _plan(inst)
    real = pairs_mod.analytic_fleet(inst, plan)
    if [p.phase for p in real.pools] != ["both", "prefill", "decode"]:
        pytest.skip("the analytic evaluation does not report pairs yet: nothing to compare with")

    def one_row_per_pool(instance, pools, fleet_p99=True):
        return evaluate_plans(instance, [dc_replace(p, decode=None, transfer=None) for p in pools], fleet_p99)

    monkeypatch.setattr(pairs_mod, "evaluate_plans", one_row_per_pool)
    built = pairs_mod.analytic_fleet(inst, plan)
    assert [p.phase for p in built.pools] == ["both", "prefill", "decode"]
    for a, b in zip(real.pools[1:], built.pools[1:]):
        assert (a.gpu, a.replicas, a.max_num_seqs) == (b.gpu, b.replicas, b.max_num_seqs)
        assert a.ttft_p99_ms == pytest.approx(b.ttft_p99_ms, rel=1e-9)
        assert a.tpot_p99_ms == pytest.approx(b.tpot_p99_ms, rel=1e-9) or a.phase == "prefill"
        assert a.power_w == pytest.approx(b.power_w, rel=1e-9)


def test_kept_latencies_label_a_pairs_rows_by_phase(inst):
    rep = simulate_plan(inst, _plan(inst), _options(requests=4000), keep_requests=True)
    lat = rep.latencies()
    assert list(lat) == ["0-1024:h100", "1024-8192:h100 prefill", "1024-8192:a100 decode"]
    pre, dec = lat["1024-8192:h100 prefill"], lat["1024-8192:a100 decode"]
    assert pre["ttft_ms"].size == rep.pools[1].requests and pre["tpot_ms"].size == 0
    assert dec["ttft_ms"].size == 0 and dec["tpot_ms"].size > 0
    assert float(np.percentile(dec["tpot_ms"], 99, method="inverted_cdf")) == pytest.approx(
        rep.pools[2].tpot.p99_ms, rel=1e-12)


def test_verify_top_judges_a_disaggregated_plan(inst):
    """``solve --verify-top`` on an instance that allows only pairs: the chosen plan's rows are prefill and decode,
    both judged (TTFT and TPOT intervals within the SLOs). Skipped while the planner offers no pair."""
    from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance
    from fleetopt.optimizer.simulation.verify import verify

    only = replace(inst, pools=replace(inst.pools, disaggregation="only"))
    try:
        solved = solve_instance(only, SolveOptions(top=1))
    except Exception as err:            # noqa: BLE001 - the planner's pairs are another part's work in progress
        pytest.skip(f"the planner does not solve pairs here: {err}")
    if not solved.plans or not any(getattr(p, "phase", "both") != "both" for p in solved.plans[0].fleet.pools):
        pytest.skip("the planner offered no pair")
    _, v = verify(only, SolveOptions(), _options(seed=0, requests=10_000), top=1, max_rounds=1)
    rows = v.chosen.sim.pools
    assert [p.analytic.phase for p in rows] == ["prefill", "decode"]
    assert rows[0].ttft_p99_ci_ms[1] <= SLO_TTFT_MS and rows[1].tpot_p99_ci_ms[1] <= SLO_TPOT_MS
    assert v.outcome == "pass"


def test_a_failing_pair_fails_verification_in_one_round():
    """Puzzle 7 under the reference's sizing (A100 prefill x1 + H100 decode x3, pd_sizing reference): fleetopt's
    station puts the one prefill unit at 2.45 times its capacity, so the simulated P99 TTFT is unbounded; the pair
    fails, no plan is chosen, and the search stops after the round (pairs get no cut). Skipped while the planner
    offers no pair."""
    from pathlib import Path

    from fleetopt.optimizer.io.instance import load_instance
    from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance
    from fleetopt.optimizer.simulation.verify import verify

    p7 = load_instance(Path(__file__).resolve().parents[1] / "instances" / "ref_puzzle7_azure_pd.yaml")
    try:
        solved = solve_instance(p7, SolveOptions(top=1))
    except Exception as err:            # noqa: BLE001 - the planner's pairs are another part's work in progress
        pytest.skip(f"the planner does not solve pairs here: {err}")
    pools = solved.plans[0].fleet.pools if solved.plans else ()
    if [(getattr(p, "phase", "both"), p.gpu, p.replicas) for p in pools] != [("prefill", "a100", 1),
                                                                              ("decode", "h100", 3)]:
        pytest.skip("the planner's reference sizing does not give the reference's 1 + 3 here")
    _, v = verify(p7, SolveOptions(), _options(seed=0, requests=10_000), top=1)
    assert v.chosen is None and v.rounds == 1 and v.solves == 1
    assert v.plans[0].outcome == "fail" and (0, 8192, "a100") in v.plans[0].failing_pools
    assert any("P/D pair 0-8,192" in line and "P99 TTFT" in line for line in v.cuts)
