"""``fleetopt simulate``: arrival processes, compress-and-route, the pipeline's contract and statistics, the CLI.

Statistical checks compare with closed forms inside generous multiples of
their standard error; no seeded digits are pinned.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation import simulate as simulate_module
from fleetopt.optimizer.simulation.records import MIN_POOL_REQUESTS
from fleetopt.optimizer.simulation.simulate import plans_from_fleet, plans_from_spec, simulate_plan
from fleetopt.solvers.des.arrivals import diurnal_arrivals, mmpp_arrivals, mmpp_dispersion_limit, mmpp_rates
from fleetopt.solvers.des.routers import CompressRouter
from fleetopt.solvers.des.routing import Requests

CONTRACT = {"requests_simulated", "simulated_seconds", "wall_seconds", "ttft_p99_ms", "ttft_p99_ci_ms", "tpot_p99_ms",
            "slo_met", "slo_attainment", "power_kw", "energy_per_output_token_j", "pools", "engine", "spill_bound",
            "routing_source", "latency_ms", "analytic", "notes", "options"}
POOL_CONTRACT = {"min_tokens", "max_tokens", "gpu", "replicas", "gpus", "arrival_rate", "utilization", "ttft_p99_ms",
                 "power_w", "slo_met", "ttft_p99_ms_sim", "ttft_p99_ci_ms", "tpot_p99_ms_sim", "slo_attainment",
                 "mean_batch", "preemptions", "spilled", "max_num_seqs_sim", "replicas_up_mean"}
TRACE_FLEET = "0-2048:h100,2048-16384:h100"


@pytest.fixture(scope="module")
def trace_inst(repo_root):
    return api.load(repo_root / "tests" / "data" / "azure_trace_h100_units.yaml")


@pytest.fixture(scope="module")
def quick_inst(repo_root):
    return api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def counts_in_windows(t: np.ndarray, window_s: float) -> np.ndarray:
    return np.bincount((t // window_s).astype(int))[:-1]        # drop the last, partial window


# --- arrival processes ------------------------------------------------------------------------------------------


def test_mmpp_long_run_rate_and_index_of_dispersion():
    lam, kappa, dwell = 50.0, 3.0, 1.0
    t = mmpp_arrivals(lam, kappa, 200_000, np.random.default_rng(np.random.SeedSequence(5)), mean_dwell_s=dwell)
    assert t.shape == (200_000,) and np.all(np.diff(t) >= 0) and t[0] >= 0
    limit = mmpp_dispersion_limit(lam, kappa, dwell)
    # N(t) has variance ~ I * E N(t): the rate lies within 4 standard errors
    assert abs(len(t) / t[-1] - lam) <= 4 * math.sqrt(limit * len(t)) / t[-1]
    c = counts_in_windows(t, 20.0)
    idc = c.var(ddof=1) / c.mean()
    r = 1 / dwell + 1 / (kappa * dwell)                       # IDC(t) = 1 + (I - 1)(1 - (1 - e^{-rt})/(rt))
    expected = 1 + (limit - 1) * (1 - (1 - math.exp(-r * 20.0)) / (r * 20.0))
    assert idc > 10 and abs(idc / expected - 1) < 0.35


def test_mmpp_parametrisation_and_poisson_limit():
    (hi, lo), (d_hi, d_lo) = mmpp_rates(10.0, 4.0, 2.0)
    share_hi = d_hi / (d_hi + d_lo)
    assert hi == 40.0 and math.isclose(share_hi * hi + (1 - share_hi) * lo, 10.0)
    assert mmpp_dispersion_limit(10.0, 1.0) == 1.0
    t = mmpp_arrivals(10.0, 1.0, 20_000, np.random.default_rng(2))
    c = counts_in_windows(t, 5.0)
    assert 0.7 < c.var(ddof=1) / c.mean() < 1.3


def test_diurnal_arrivals_keep_the_mean_and_follow_the_sinusoid():
    lam, period = 40.0, 100.0
    t = diurnal_arrivals(lam, 80_000, np.random.default_rng(np.random.SeedSequence(9)), 0.8, period)
    whole = t[t < period * math.floor(t[-1] / period)]
    assert abs(len(whole) / (period * math.floor(t[-1] / period)) - lam) < 4 * math.sqrt(lam / t[-1]) * 1.5
    phase = (t % period) / period
    peak, trough = np.sum((phase > 0.125) & (phase < 0.375)), np.sum((phase > 0.625) & (phase < 0.875))
    # rate integrals over the quarters around the peak and the trough: 1 +- a * 2*sqrt(2)/pi
    ratio = (1 + 0.8 * 2 * math.sqrt(2) / math.pi) / (1 - 0.8 * 2 * math.sqrt(2) / math.pi)
    assert abs(peak / trough / ratio - 1) < 0.1


@pytest.mark.parametrize("call", [
    lambda rng: mmpp_arrivals(0.0, 2.0, 10, rng), lambda rng: mmpp_arrivals(1.0, 0.5, 10, rng),
    lambda rng: mmpp_arrivals(1.0, 2.0, 10, rng, mean_dwell_s=-1),
    lambda rng: diurnal_arrivals(1.0, 10, rng, 1.5, 10.0),
    lambda rng: diurnal_arrivals(1.0, -1, rng, 0.5, 10.0), lambda rng: diurnal_arrivals(1.0, 10, rng, 0.5, 0.0),
])
def test_arrival_processes_reject_bad_parameters(call):
    with pytest.raises(ValueError):
        call(np.random.default_rng(0))


# --- routers ----------------------------------------------------------------------------------------------------


def test_compress_router_moves_the_band_with_its_success_probability():
    rng = np.random.default_rng(4)
    n = 20_000
    out = rng.integers(1, 60, n)
    total = rng.integers(2, 400, n)
    req = Requests(np.zeros(n), np.maximum(total - out, 0), out)
    band = (req.total_tokens > 100) & (req.total_tokens <= 200)
    for p_c, share in ((1.0, 1.0), (0.0, 0.0), (0.3, 0.3)):
        router = CompressRouter([0, 100, 400], ["s", "l"], [2.0, 1.0], p_c, np.random.default_rng(1))
        moved = router.compress(req)
        pools = router.route(moved.prompt_tokens, moved.output_tokens)
        changed = moved.prompt_tokens != req.prompt_tokens
        assert np.array_equal(moved.output_tokens, req.output_tokens) and not np.any(changed & ~band)
        assert np.all(moved.total_tokens[changed] == 100) and np.all(pools[changed] == 0)
        assert abs(changed[band].mean() - share) < 0.03
        assert np.all(pools[band & ~changed] == 1)
    with pytest.raises(ValueError, match="next pool"):
        CompressRouter([0, 100, 150], ["s", "l"], [2.0, 1.0], 1.0, rng)


# --- the pipeline -----------------------------------------------------------------------------------------------


def test_json_contract_and_books(trace_inst):
    rep = simulate_plan(trace_inst, plans_from_spec(trace_inst, TRACE_FLEET), SimOptions(requests=6000, replications=3))
    data = rep.to_json()
    assert CONTRACT <= set(data) and all(POOL_CONTRACT <= set(p) for p in data["pools"])
    assert data["requests_simulated"] == 6000 and data["replications"] == 3 and data["seed"] == 0
    # provenance: the settings as run ("auto" resolved to the router the plan needs), the same record back
    assert SimOptions.from_json(data["options"]) == SimOptions(requests=6000, replications=3, router="length")
    assert data["options"]["engine"] == data["engine"] and data["options"]["seed"] == data["seed"]
    low, high = data["ttft_p99_ci_ms"]
    assert low <= data["ttft_p99_ms"] <= high and 0 <= data["slo_attainment"] <= 1
    assert all(p["preemptions"] == 0 and p["replicas"] >= 1 for p in data["pools"])
    assert data["preemptions"] == 0 and all(isinstance(p["preemptions"], int) for p in data["pools"])
    assert data["power_kw"] > 0 and data["energy_per_output_token_j"] > 0
    assert data["scope"] == "pool" and data["slo_met"] == all(p["ttft_p99_ci_ms"][1] <= data["slo_ttft_p99_ms"]
                                                              for p in data["pools"])
    assert math.isclose(data["power_kw"] * 1000, sum(p["power_w_sim"] for p in data["pools"]))
    assert sum(p["requests"] for p in data["pools"]) == data["requests_measured"]
    for p, d in zip(rep.pools, data["pools"]):          # the analytic evaluate fields read as attributes too
        assert (p.min_tokens, p.max_tokens, p.gpu, p.replicas, p.ttft_p99_ms) == \
            (d["min_tokens"], d["max_tokens"], d["gpu"], d["replicas"], d["ttft_p99_ms"])
    json.dumps(data)


@pytest.mark.parametrize("mode,arrivals,router", [("iteration", "poisson", "length"), ("slot", "mmpp", "length"),
                                                  ("iteration", "trace", "random"), ("slot", "diurnal", "split")])
def test_littles_law_holds_in_every_run(trace_inst, mode, arrivals, router):
    rep = simulate_plan(trace_inst, plans_from_spec(trace_inst, TRACE_FLEET),
                        SimOptions(requests=4000, replications=2, mode=mode, arrivals=arrivals, router=router))
    assert rep.littles_law_rel_error < 1e-9
    assert rep.requests_measured > 0 and rep.unfinished + rep.rejected <= rep.requests_measured


def test_lightly_loaded_slot_p99_matches_the_analytic_tail(repo_root):
    """Slot mode is the slot model's own queue (one KV slot per request for its full-batch service time), so
    its analytic counterpart is the slot model ``tail``."""
    trace_inst = api.load(repo_root / "tests" / "data" / "azure_trace_h100_units.yaml", ["slo.ttft_model=tail"])
    rep = simulate_plan(trace_inst, plans_from_spec(trace_inst, "0-2048:h100x2,2048-16384:h100x2"),
                        SimOptions(requests=20_000, mode="slot"))
    for p in rep.pools:
        analytic = p.analytic.ttft_p99_ms
        low, high = p.ttft_p99_ci_ms
        assert p.analytic.utilization < 0.35
        assert low <= analytic <= high or abs(p.ttft_p99_ms_sim / analytic - 1) < 0.03
        assert abs(p.utilization_sim / p.analytic.utilization - 1) < 0.1
    assert rep.slo_met and rep.slo_attainment == 1.0


def test_trace_replay_and_poisson_at_the_same_rate(trace_inst):
    plans = plans_from_spec(trace_inst, TRACE_FLEET)
    replay = simulate_plan(trace_inst, plans, SimOptions(requests=8000, arrivals="trace", replications=5))
    poisson = simulate_plan(trace_inst, plans, SimOptions(requests=8000, arrivals="poisson", replications=2))
    assert replay.replications == 1 and replay.ci_method.startswith("batch-means")
    assert replay.requests_simulated == 8000 and poisson.requests_simulated == 8000
    for rep in (replay, poisson):
        rate = sum(p.arrival_rate_sim for p in rep.pools)
        assert abs(rate / trace_inst.workload.arrival_rate_req_per_s - 1) < 0.15
        assert math.isfinite(rep.ttft_p99_ms) and rep.ttft_p99_ci_ms[0] <= rep.ttft_p99_ms <= rep.ttft_p99_ci_ms[1]
    again = simulate_plan(trace_inst, plans, SimOptions(requests=8000, arrivals="trace", seed=99))
    assert again.ttft_p99_ms == replay.ttft_p99_ms           # a replay does not depend on the seed


def test_mmpp_raises_p99_on_a_loaded_pool(repo_root):
    quick_inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml",
                          ["slo.ttft_model=tail"])  # slot utilisation
    plans = plans_from_spec(quick_inst, "0-4096:h100x1,4096-65536:h100x3")
    assert evaluate_plans(quick_inst, plans).pools[0].utilization > 0.7
    kw = dict(requests=20_000, replications=2, mode="slot")
    poisson = simulate_plan(quick_inst, plans, SimOptions(arrivals="poisson", **kw))
    bursty = simulate_plan(quick_inst, plans, SimOptions(arrivals="mmpp", peak_to_mean=2.0, **kw))
    assert bursty.pools[0].ttft_p99_ms_sim > 2 * poisson.pools[0].ttft_p99_ms_sim
    assert bursty.slo_attainment < poisson.slo_attainment


def test_random_router_rejects_what_does_not_fit_and_split_identity_is_length(trace_inst):
    plans = plans_from_spec(trace_inst, TRACE_FLEET)
    rand = simulate_plan(trace_inst, plans, SimOptions(requests=4000, replications=2, router="random"))
    assert rand.rejected > 0 and rand.slo_attainment < 1 and not rand.slo_met
    length = simulate_plan(trace_inst, plans, SimOptions(requests=4000, replications=2)).to_json()
    split = simulate_plan(trace_inst, plans, SimOptions(requests=4000, replications=2, router="split")).to_json()
    for d in (length, split):
        d.pop("wall_seconds"), d.pop("router"), d.pop("routing_source"), d.pop("notes"), d["options"].pop("router")
    assert length == split


def test_compress_and_route(repo_root, monkeypatch):
    # ~0.04 req/s reach the top pool: a run measures (almost) none there. Its dedicated run would draw tens of
    # millions of requests (test_a_table3_thin_pool_is_measured_in_a_dedicated_run, slow); capped at a million
    # draws it cannot find 500, so it is not run and the row stays the run's, flagged
    monkeypatch.setattr(simulate_module, "THIN_MAX_DRAWN", 1_000_000)
    inst = api.load(repo_root / "instances" / "ref_1w_table3_azure.yaml")
    plans = plans_from_spec(inst, "0-4096:h100@2,4096-65536:h100")
    with pytest.raises(InstanceError, match="--router compress"):
        simulate_plan(inst, plans, SimOptions(requests=2000, router="length"))
    assert simulate_plan(inst, plans, SimOptions(requests=2000, replications=2)).router == "compress"   # auto
    rep = simulate_plan(inst, plans, SimOptions(requests=30_000, replications=2, router="compress"))
    share = rep.pools[0].requests / rep.requests_measured
    beyond = float(1 - inst.workload.lengths.cdf(4096))          # ~10 % of requests are longer than 4,096
    assert beyond > 0.05 and share > 1 - beyond / 20              # the band (4096, 8192] lands in pool 0
    assert abs(share - rep.pools[0].analytic.routing_share) < 1e-3 and rep.rejected == 0
    idle = simulate_plan(inst, plans, SimOptions(requests=2000, replications=2, router="compress"))
    top = idle.pools[1]
    assert top.requests == top.p99_requests < 20 and top.p99_source == "main run" and top.too_few_requests
    assert any("4096-65536:h100" in n and "gets no dedicated run: its share of the stream" in n for n in idle.notes)


@pytest.mark.slow
def test_precision_doubles_until_met_or_capped(trace_inst):
    """With a pool-scope SLO every pool with traffic must meet the precision target (at least MIN_POOL_REQUESTS
    measured), so the run doubles until the thinnest pool's interval is narrow enough."""
    plans = plans_from_spec(trace_inst, TRACE_FLEET)
    met = simulate_plan(trace_inst, plans,
                        SimOptions(requests=2000, replications=2, precision=0.1, max_requests=200_000))
    half = (met.ttft_p99_ci_ms[1] - met.ttft_p99_ci_ms[0]) / 2
    assert met.stopped_by == "precision" and half <= 0.1 * met.ttft_p99_ms
    capped = simulate_plan(trace_inst, plans,
                           SimOptions(requests=2000, replications=2, precision=1e-4, max_requests=7000))
    assert capped.stopped_by == "max_requests" and capped.requests_simulated == 4000


def test_plans_from_fleet_round_trip(quick_inst):
    fleet = api.evaluate_report(quick_inst, "0-4096:h100,4096-65536:a100").fleets[0][1]
    again = evaluate_plans(quick_inst, plans_from_fleet(quick_inst, fleet))
    assert [(p.replicas, p.max_num_seqs, p.ttft_p99_ms) for p in again.pools] == \
        [(p.replicas, p.max_num_seqs, p.ttft_p99_ms) for p in fleet.pools]


def test_option_errors_are_collected(trace_inst, quick_inst):
    plans = plans_from_spec(trace_inst, TRACE_FLEET)
    with pytest.raises(InstanceError) as err:
        simulate_plan(trace_inst, plans, SimOptions(router="magic", arrivals="diurnal", peak_to_mean=3.0, requests=50))
    text = str(err.value)
    assert "'magic' is not one of" in text and "peak_to_mean: 3 is above 2" in text and "requests: 50" in text
    assert len(err.value.problems) == 3 and isinstance(err.value, ValueError)
    with pytest.raises(InstanceError, match="length CDF"):
        simulate_plan(quick_inst, plans_from_spec(quick_inst, "0-65536:h100"), SimOptions(arrivals="trace"))


# --- the CLI ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_is_deterministic_per_seed(repo_root, tmp_path):
    args = ["simulate", repo_root / "tests" / "data" / "azure_trace_h100_units.yaml", "--fleet", TRACE_FLEET,
            "--requests", 3000, "--replications", 2]
    out = []
    for seed, name in ((1, "a"), (1, "b"), (2, "c")):
        res = run(*args, "--seed", seed, "--json", tmp_path / f"{name}.json")
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / f"{name}.json").read_text())
        assert data.pop("wall_seconds") >= 0
        out.append(data)
    assert out[0] == out[1] and out[0] != out[2]
    assert out[0]["requests_simulated"] == 3000 and out[0]["replications"] == 2


@pytest.mark.parametrize("extra,phrase", [
    (["--fleet", "0-2048:zz,2048-16384:h100"], "error: --fleet: unknown gpu 'zz'"),
    (["--fleet", TRACE_FLEET, "--precision", "abc"], "error: --precision: 'abc' is not a percentage"),
    (["--fleet", TRACE_FLEET, "--arrivals", "diurnal", "--peak-to-mean", "3"], "error: --peak-to-mean: 3 is above 2"),
])
def test_cli_errors_are_one_line(repo_root, extra, phrase):
    res = run("simulate", repo_root / "tests" / "data" / "azure_trace_h100_units.yaml", *extra)
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(phrase)


def test_cli_rejects_unknown_choices(repo_root):
    res = run("simulate", repo_root / "tests" / "data" / "azure_trace_h100_units.yaml", "--fleet", TRACE_FLEET,
              "--router", "magic")
    assert res.exit_code == 2 and "Invalid value for '--router'" in res.stderr


def test_spillover_rescues_an_undersized_short_pool(quick_inst):
    # One A100 capped at 40 sequences cannot take the short traffic (it saturates); with spillover the requests
    # that would queue behind more than 4 others go to the six H100s above, and the fleet meets its SLO.
    fleet = "0-2048:a100x1#40,2048-65536:h100x6"
    plans = plans_from_spec(quick_inst, fleet)
    length = simulate_plan(quick_inst, plans, SimOptions(requests=6000, replications=2))
    spill = simulate_plan(quick_inst, plans,
                          SimOptions(requests=6000, replications=2, router="spillover", spill_bound=4))
    assert not length.slo_met and length.pools[0].utilization_sim > 0.99
    assert spill.slo_met and spill.pools[0].spilled > 0 and spill.pools[1].spilled == 0
    assert spill.pools[1].requests > length.pools[1].requests       # the spilled requests are served above
    data = spill.to_json()
    assert data["spill_bound"] == 4 and data["pools"][0]["spilled"] == spill.pools[0].spilled
    assert length.to_json()["spill_bound"] is None
    assert spill.littles_law_rel_error < 1e-6
    with pytest.raises(InstanceError, match="spill_bound: -1 must be None or a whole number >= 0"):
        simulate_plan(quick_inst, plans, SimOptions(requests=600, router="spillover", spill_bound=-1))


# --- sampled availability: a pool with no replica up -------------------------------------------------------------


def test_a_pool_with_no_replica_up_draws_no_power(repo_root):
    """Each up replica draws between its idle and nominal power, so a pool's mean power over the replications lies
    in [idle, nominal] x its mean count up; a pool that was down in every replication draws exactly nothing,
    and neither its utilisation nor its batch count. (Availability 0.5: the one-replica pool is down in all
    three replications of a seed with probability 1/8.)"""
    from fleetopt.optimizer.simulation.options import EngineOptions

    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml",
                    ["gpus.a100.availability=0.5", "gpus.h100.availability=0.5"])
    plans = plans_from_spec(inst, "0-4096:h100x6,4096-65536:a100x1")
    curves = [inst.gpu(p.gpu).profile.power for p in plans]
    all_down = 0
    for seed in range(40):
        rep = simulate_plan(inst, plans, SimOptions(requests=300, replications=3, seed=seed,
                                                    engine=EngineOptions(availability="sampled")))
        for p, curve in zip(rep.pools, curves):
            up = p.replicas_up_mean
            assert curve.idle_w * up * (1 - 1e-9) <= p.power_w_sim <= curve.nominal_w * up * (1 + 1e-9), (seed, p)
        assert rep.power_kw * 1000 == pytest.approx(sum(p.power_w_sim for p in rep.pools), rel=1e-9)
        long_ = rep.pools[1]
        if long_.replicas_up_mean == 0:
            all_down += 1
            assert long_.power_w_sim == 0 and long_.utilization_sim == 0 and long_.mean_batch == 0
            assert long_.rejected == long_.requests   # whatever traffic it had was lost, not served
        if all_down >= 2:
            break
    assert all_down >= 2


# --- engine settings named at the edge ----------------------------------------------------------------------------


def test_token_budget_below_a_batch_cap_names_the_flag(repo_root, quick_inst):
    """vLLM refuses max_num_batched_tokens < max_num_seqs; the error names --max-batched-tokens and the largest
    cap (without a TPOT SLO the reserve view's cap is the sequences the window holds), and that cap runs."""
    fleet = "0-4096:h100x4,4096-65536:h100x8"
    held = max(int(quick_inst.gpu("h100").profile.n_slots(hi)) for hi in (4096, 65536))
    r = run("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet", fleet,
            "--max-batched-tokens", 100)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert lines[0].startswith("error: --max-batched-tokens: 100 is below pool ") and f"batch cap {held} " in lines[0]
    assert f"give at least {held}" in lines[0]
    r = run("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet", fleet,
            "--max-batched-tokens", held,
            "--requests", 500, "--replications", 1, "--json", "-")
    assert "error" not in r.stderr, r.output   # it runs; its exit code is its SLO verdict (5: missed)
    assert r.exit_code == (0 if json.loads(r.stdout)["slo_met"] else 5), r.output


# --- spillover, surfaced ------------------------------------------------------------------------------------------


def test_spillover_text_shows_the_spilled_counts(repo_root, tmp_path):
    out = tmp_path / "sim.json"
    r = run("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet",
            "0-2048:a100x1#40,2048-65536:h100x6",
            "--router", "spillover", "--spill-bound", 4, "--requests", 2000, "--replications", 2, "--json", out)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    spilled = [p["spilled"] for p in data["pools"]]
    assert spilled[0] > 0 and spilled[-1] == 0    # the top pool has nowhere to spill
    (line,) = [x for x in r.output.splitlines() if "simulated spills to the next pool up" in x]
    assert "bound 4" in line and line.endswith(f"0-2,048: {spilled[0]:,}; 2,048-65,536: 0")


def test_spill_bound_default_and_misuse(repo_root, quick_inst):
    plans = plans_from_spec(quick_inst, "0-2048:a100x1#40,2048-65536:h100x6")
    from fleetopt.optimizer.simulation.simulate import DEFAULT_SPILL_BOUND

    spilled = simulate_plan(quick_inst, plans, SimOptions(requests=400, replications=2, router="spillover"))
    assert spilled.spill_bound == DEFAULT_SPILL_BOUND
    with pytest.raises(InstanceError, match="spill_bound: 4 applies to router 'spillover' only"):
        simulate_plan(quick_inst, plans, SimOptions(requests=400, replications=2, router="length", spill_bound=4))
    r = run("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet", "0-65536:h100x8",
            "--spill-bound", 4)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert lines[0] == "error: --spill-bound: 4 applies to router 'spillover' only; the router is 'auto'"


def test_one_pool_spillover_says_there_is_nowhere_to_spill(quick_inst):
    rep = simulate_plan(quick_inst, plans_from_spec(quick_inst, "0-65536:h100x8"),
                        SimOptions(requests=400, replications=2, router="spillover", spill_bound=0))
    assert rep.pools[0].spilled == 0
    assert any("nowhere to spill" in n for n in rep.notes)
    two = simulate_plan(quick_inst, plans_from_spec(quick_inst, "0-4096:h100x4,4096-65536:h100x8"),
                        SimOptions(requests=400, replications=2, router="spillover"))
    assert not any("nowhere to spill" in n for n in two.notes)


# --- records ------------------------------------------------------------------------------------------------------


def test_every_field_docstring_sits_under_its_field():
    """In the report records, a string right after a field documents that field: no two strings in a row (one
    would belong to no field), and the ones of SimPoolReport name what their field holds."""
    import ast
    import inspect

    from fleetopt.optimizer.simulation import records as sim_report

    tree = ast.parse(inspect.getsource(sim_report))
    docs = {}
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        body = cls.body[1:] if ast.get_docstring(cls) else cls.body
        for before, node in zip(body, body[1:]):
            text = node.value.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) else None
            if isinstance(text, str):
                assert isinstance(before, ast.AnnAssign), (cls.name, text)
                docs[(cls.name, before.target.id)] = text
    assert docs[("SimPoolReport", "spilled")].startswith("Requests the spillover router moved")
    assert docs[("SimPoolReport", "replicas_up_mean")].startswith("Replicas simulated")
    assert docs[("SimPoolReport", "max_num_seqs_sim")].startswith("Batch cap per replica")


def test_energy_per_token_counts_prompts_too(repo_root):
    """All tokens per joule beside output tokens per joule (the energy study separates the phases): the same
    energy over more tokens; the ratio is the output share of the completed requests' tokens, which for chat
    traffic (LMSYS: prompts ~ 4x outputs) lies well below 1."""
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    rep = api.simulate_report(inst, "0-768:a100x1,768-6144:h100x1,6144-65536:h100x2", SimOptions(requests=6000))
    doc = rep.to_json()
    assert doc["energy_per_token_j"] == rep.energy_per_token_j
    assert 0.05 < rep.energy_per_token_j / rep.energy_per_output_token_j < 0.6


# --- thin pools: a dedicated run of the requests routed to the pool ------------------------------------------------

THIN_FLEET = "0-32768:h100x2,32768-65536:h100x1"   # LMSYS above 32,768 tokens: ~0.02 % of the stream, 0.02 req/s
THIN = SimOptions(requests=6000, replications=2, seed=3)


def _with_dedicated_runs(run):
    """``run()`` and the pool reports of the dedicated runs it made, as they went into the rows (by pool window)."""
    seen, original = {}, simulate_module.with_dedicated_latency

    def spy(main, own):
        seen[(main.min_tokens, main.max_tokens)] = own
        return original(main, own)

    simulate_module.with_dedicated_latency = spy
    try:
        return run(), seen
    finally:
        simulate_module.with_dedicated_latency = original


@pytest.fixture(scope="module")
def thin_run(quick_inst):
    plans = plans_from_spec(quick_inst, THIN_FLEET)
    return _with_dedicated_runs(lambda: simulate_plan(quick_inst, plans, THIN))


def test_a_thin_pool_gets_its_latency_from_a_dedicated_run(thin_run):
    rep, _ = thin_run
    top = rep.pools[1]
    # the run itself leaves the top pool a handful of requests at most: too few for a P99 on its own
    assert top.requests < 20 and top.analytic.arrival_rate < 1e-3 * rep.analytic.pools[0].arrival_rate
    assert top.p99_source == "dedicated run" and top.p99_requests >= MIN_POOL_REQUESTS and not top.too_few_requests
    assert rep.pools[0].p99_source == "main run" and rep.pools[0].p99_requests == rep.pools[0].requests
    # one H100 at ~14 % utilisation: little queueing, so the simulated P99 is the analytic one (the batched model's
    # own tail, long prefills in a small batch) within the sampling noise of ~1,700 requests' P99 (seeds 0-7: +-14 %)
    lo, hi = top.ttft_p99_ci_ms
    assert top.analytic.utilization < 0.2 and lo <= top.ttft_p99_ms_sim <= hi < math.inf
    assert abs(top.ttft_p99_ms_sim / top.analytic.ttft_p99_ms - 1) < 0.25
    assert rep.slo_met == all(p.slo_met_sim for p in rep.pools)      # a pool-scope verdict reads the rows
    doc = rep.to_json()["pools"][1]
    assert (doc["p99_requests"], doc["p99_source"], doc["too_few_requests"]) == (top.p99_requests, "dedicated run",
                                                                                 False)
    assert doc["simulated"]["p99_requests"] == top.p99_requests and doc["simulated"]["requests"] == top.requests
    assert any(f"dedicated run of {top.p99_requests:,} measured requests" in n and "32768-65536:h100" in n
               for n in rep.notes)
    from rich.console import Console

    from fleetopt.optimizer.output.render import render_simulation

    c = Console(width=200, record=True)
    render_simulation(c, rep)
    row = next(line for line in c.export_text().splitlines() if line.lstrip("│ ").startswith("32,768-65,536"))
    assert "(dedicated run)" in row and "too few" not in row


def test_a_dedicated_run_keeps_the_fleet_books(thin_run):
    """The rows keep the run's counts, so the fleet's totals are still the pools' sums."""
    rep, _ = thin_run
    doc = rep.to_json()
    assert sum(p.requests for p in rep.pools) == rep.requests_measured == doc["simulated"]["requests_measured"]
    assert sum(p["simulated"]["requests"] for p in doc["pools"]) == doc["requests_measured"]
    assert sum(p.rejected for p in rep.pools) == rep.rejected and sum(p.unfinished for p in rep.pools) == rep.unfinished
    assert rep.power_kw * 1000 == pytest.approx(sum(p.power_w_sim for p in rep.pools), rel=1e-12)


def test_a_thin_pool_gets_an_even_share_of_the_requests(quick_inst):
    """A dedicated run holds n_t = max(THIN_POOL_REQUESTS, min(R / P, s_p D)) requests: the quickstart's long pool
    (0.35 % of the stream) in a two-pool run of 20,000 gets 10,000 of its own, not 2,000, so its P99 interval
    narrows with --requests like the other pool's (s_p D = 35,000 draws' worth does not bind)."""
    plans = plans_from_spec(quick_inst, "0-8192:h100x2,8192-65536:h100x2")
    rep, seen = _with_dedicated_runs(lambda: simulate_plan(quick_inst, plans, SimOptions(requests=20_000,
                                                                                         replications=2, seed=5)))
    top = rep.pools[1]
    assert top.requests < MIN_POOL_REQUESTS and top.p99_source == "dedicated run"
    assert any("(10,000 simulated" in n for n in rep.notes), rep.notes
    assert 8_000 <= top.p99_requests < 10_000 and seen[(top.min_tokens, top.max_tokens)].requests == top.p99_requests


def test_the_dedicated_run_sees_the_pool_at_its_thinned_rate(thin_run):
    """The requests routed to one pool are a thinned Poisson stream: their measured rate is the analytic arrival
    rate into the pool (the instance's rate times the pool's share) within four standard errors (N^-1/2)."""
    rep, seen = thin_run
    top = rep.pools[1]
    own = seen[(top.min_tokens, top.max_tokens)]
    lam = top.analytic.arrival_rate
    assert own.requests == top.p99_requests
    assert abs(own.arrival_rate_sim / lam - 1) < 4 / math.sqrt(own.requests)
    assert abs(own.arrival_rate_sim / (rep.analytic.pools[0].arrival_rate + lam) - 1) > 0.9   # not the stream's


def test_a_dedicated_run_is_deterministic_per_seed(quick_inst, thin_run):
    rep, _ = thin_run
    again = simulate_plan(quick_inst, plans_from_spec(quick_inst, THIN_FLEET), THIN)
    assert json.dumps({**again.to_json(), "wall_seconds": 0}) == json.dumps({**rep.to_json(), "wall_seconds": 0})


@pytest.mark.parametrize("changes,why", [
    (dict(router="spillover", spill_bound=10**6), "the spillover router reads the pools' queues"),
    (dict(arrivals="mmpp", peak_to_mean=1.5), "mmpp arrivals are not Poisson"),
])
def test_no_dedicated_run_where_the_pool_is_no_thinned_stream(quick_inst, changes, why):
    """Spillover routes by the queues and a modulated stream cannot be drawn in pieces: the row stays the run's,
    flagged, and a note says why."""
    rep = simulate_plan(quick_inst, plans_from_spec(quick_inst, THIN_FLEET),
                        SimOptions(requests=2000, replications=2, seed=3, **changes))
    top = rep.pools[1]
    assert top.too_few_requests and top.p99_source == "main run" and top.p99_requests == top.requests
    assert any("32768-65536:h100" in n and "gets no dedicated run" in n and why in n for n in rep.notes)


def test_a_dedicated_run_that_runs_out_of_draws_stays_flagged(quick_inst, monkeypatch):
    """Capped at draws that hold ~520 of the pool's requests (0.02 % of 1.26 M, twice), the dedicated run finds
    fewer than it seeks and measures fewer than MIN_POOL_REQUESTS (warm-up and cool-down cut 15 % or more)."""
    monkeypatch.setattr(simulate_module, "THIN_MAX_DRAWN", 1_260_000)
    rep = simulate_plan(quick_inst, plans_from_spec(quick_inst, THIN_FLEET),
                        SimOptions(requests=2000, replications=2, seed=3))
    top = rep.pools[1]
    assert top.p99_source == "dedicated run" and top.requests < 20 < top.p99_requests < MIN_POOL_REQUESTS
    assert top.too_few_requests and rep.to_json()["pools"][1]["simulated"]["too_few_requests"] is True
    assert any("32768-65536:h100" in n and "found only" in n for n in rep.notes)


@pytest.mark.slow
def test_a_table3_thin_pool_is_measured_in_a_dedicated_run(repo_root):
    """The compress-and-route plan of Table 3 (Azure): its top pool gets ~0.0035 % of the requests, none of a
    50,000-request run. Its dedicated run draws ~57 M requests to measure ~1,700 (about 6 s). With the batched
    TTFT model the pool, at 3 % utilisation, has an analytic P99 the simulation must meet within 10 %."""
    inst = api.load(repo_root / "instances" / "ref_1w_table3_azure.yaml", ["slo.ttft_model=batched"])
    rep = simulate_plan(inst, plans_from_spec(inst, "0-4096:b200x18@2,4096-65536:h100x1"), SimOptions())
    top = rep.pools[1]
    assert rep.router == "compress" and top.requests < 10 and top.analytic.utilization < 0.1
    assert top.p99_source == "dedicated run" and top.p99_requests >= MIN_POOL_REQUESTS and not top.too_few_requests
    lo, hi = top.ttft_p99_ci_ms
    assert lo <= top.ttft_p99_ms_sim <= hi < rep.slo_ttft_p99_ms and top.slo_met_sim
    assert abs(top.ttft_p99_ms_sim / top.analytic.ttft_p99_ms - 1) < 0.1
    assert sum(p.requests for p in rep.pools) == rep.requests_measured
    assert sum(p.rejected for p in rep.pools) == rep.rejected
