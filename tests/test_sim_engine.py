"""``fleetopt simulate --kv paged`` and ``--availability sampled``: the engine settings users pick.

The engine's KV-block bookkeeping itself is checked exactly against a step-by-step reference in
``test_des.py``; here the checks are that the user surface reaches it and what follows from it:
paged admission runs batches the reserved view cannot, preemption shows up in the report, and
sampled availability draws Binomial(N, A) replicas.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import EXIT_CODES, InstanceError
from fleetopt.optimizer.simulation.options import VLLM_DEFAULT_MAX_NUM_SEQS, EngineOptions, SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan


@pytest.fixture(scope="module")
def agent(repo_root):
    return api.load(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml")


def _run(inst, fleet: str, **kw):
    return simulate_plan(inst, plans_from_spec(inst, fleet), SimOptions(**kw))


def test_paged_admission_runs_batches_beyond_the_reserved_slots(agent):
    # 15 H100 replicas of the 65,536-token window hold 16 reserved slots each: the agent load needs more
    # sequences than that, so the reserved view saturates, while paged admission packs the (mostly short)
    # requests into the KV cache.
    slots = agent.gpu("h100").profile.n_slots(65536)
    reserve = _run(agent, "0-65536:h100x15", requests=6000, replications=2)
    paged = _run(agent, "0-65536:h100x15", requests=6000, replications=2, engine=EngineOptions(kv="paged"))
    assert reserve.pools[0].max_num_seqs_sim == slots == 16
    assert reserve.pools[0].mean_batch <= slots
    assert paged.pools[0].max_num_seqs_sim == VLLM_DEFAULT_MAX_NUM_SEQS
    assert paged.pools[0].mean_batch > slots          # impossible with reserved slots
    assert not reserve.slo_met and paged.ttft_p99_ms < reserve.ttft_p99_ms
    assert paged.to_json()["engine"]["kv"] == "paged"
    assert paged.littles_law_rel_error < 1e-6


def test_paged_overload_preempts_and_keeps_the_books(agent):
    rep = _run(agent, "0-65536:h100x6", requests=3000, replications=1,
               engine=EngineOptions(kv="paged", max_num_seqs=128))
    assert rep.pools[0].max_num_seqs_sim == 128
    assert rep.pools[0].preemptions > 0
    assert rep.to_json()["preemptions"] == rep.pools[0].preemptions
    assert rep.littles_law_rel_error < 1e-6
    assert 16 < rep.pools[0].mean_batch <= 128


def test_paged_keeps_a_tpot_cap(repo_root):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", ["slo.tpot_p99_ms=30"])
    plan = plans_from_spec(inst, "0-4096:h100,4096-65536:h100")
    reserve = simulate_plan(inst, plan, SimOptions(requests=1000, replications=1))
    caps = [p.analytic.max_num_seqs for p in reserve.pools]
    slots = [inst.gpu("h100").profile.n_slots(p.max_tokens) for p in reserve.pools]
    assert any(c < s for c, s in zip(caps, slots)), "the TPOT SLO should cap a pool below its slots"
    paged = simulate_plan(inst, plan, SimOptions(requests=1000, replications=1, engine=EngineOptions(kv="paged")))
    for p, c, s in zip(paged.pools, caps, slots):
        assert p.max_num_seqs_sim == (c if c < s else VLLM_DEFAULT_MAX_NUM_SEQS)


@pytest.mark.parametrize("engine, mode, phrase", [
    (EngineOptions(max_num_seqs=64), "iteration", "engine.max_num_seqs"),
    (EngineOptions(kv="paged"), "slot", "slot mode"),
    (EngineOptions(kv="lazy"), "iteration", "engine.kv"),
    (EngineOptions(availability="sometimes"), "iteration", "engine.availability"),
    (EngineOptions(kv="paged", max_num_seqs=0), "iteration", "engine.max_num_seqs"),
])
def test_engine_option_errors(agent, engine, mode, phrase):
    with pytest.raises(InstanceError) as err:
        _run(agent, "0-65536:h100x24", requests=200, replications=1, mode=mode, engine=engine)
    assert phrase in str(err.value)


def test_cli_engine_errors_are_one_line(repo_root):
    r = CliRunner().invoke(main, ["simulate", str(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml"), "--fleet",
                                  "0-65536:h100x24", "--requests", "1000", "--mode", "slot", "--kv", "paged"])
    assert r.exit_code == 2
    assert "slot mode" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_availability_one_samples_nothing(agent):
    base = _run(agent, "0-4096:h100x2,4096-65536:h100x23", requests=1000, replications=2).to_json()
    sampled = _run(agent, "0-4096:h100x2,4096-65536:h100x23", requests=1000, replications=2,
                   engine=EngineOptions(availability="sampled")).to_json()
    for d in (base, sampled):
        d.pop("wall_seconds"), d.pop("engine"), d.pop("notes"), d["options"].pop("engine")
    assert sampled == base


def test_sampled_availability_draws_binomial_replicas(repo_root):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", ["gpus.1.availability=0.5"])
    R, n = 40, 10
    rep = _run(inst, f"0-4096:h100x{n},4096-65536:h100x1", requests=R * 100, replications=R,
               engine=EngineOptions(availability="sampled"))
    short, long_ = rep.pools
    # Mean of R Binomial(10, 0.5) draws: within 4 standard errors of 5.
    assert abs(short.replicas_up_mean - n * 0.5) <= 4 * math.sqrt(n * 0.25 / R)
    # The one-replica long pool is down in about half the replications: the mean of R Bernoulli(0.5) draws lies
    # in their 1 - 1e-6 binomial interval. Its requests are then lost and charged to it as rejected misses.
    lo, hi = stats.binom.interval(1 - 1e-6, R, 0.5)
    assert lo / R <= long_.replicas_up_mean <= hi / R
    assert long_.rejected > 0 and short.rejected == 0
    assert long_.slo_attainment < 0.99 and not rep.slo_met
    assert rep.rejected == long_.rejected
    assert "availability sampled" in " ".join(rep.notes)


def test_cli_engine_flags_reach_the_json(repo_root, tmp_path):
    out = tmp_path / "sim.json"
    r = CliRunner().invoke(main, ["simulate", str(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml"), "--fleet",
                                  "0-65536:h100x15", "--requests", "400", "--replications", "1", "--kv", "paged",
                                  "--max-num-seqs", "64", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["engine"] == {"kv": "paged", "max_num_seqs": 64, "max_batched_tokens": None, "availability": "all-up"}
    assert d["pools"][0]["max_num_seqs_sim"] == 64 and d["pools"][0]["max_num_seqs"] == 16
    assert np.isfinite(d["pools"][0]["mean_batch"])


def test_verification_runs_with_paged_admission(repo_root, tmp_path):
    out = tmp_path / "v.json"
    r = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"),
                                  "--verify-top", "1",
                                  "--max-rounds", "1", "--set", "pools.max_pools=1", "--sim-requests", "4000",
                                  "--sim-kv", "paged", "--json", str(out)])
    assert r.exit_code in (0, 4), r.output       # one round: verified (0) or out of rounds (4)
    v = json.loads(out.read_text())["verification"]
    assert v["engine"]["kv"] == "paged"
    assert all(p["preemptions"] is not None for plan in v["plans"] for p in plan["pools"])


def test_token_budget_slows_prefills_and_is_reported(agent):
    fleet = "0-4096:h100x2,4096-65536:h100x23"
    free = _run(agent, fleet, requests=3000, replications=1)
    tight = _run(agent, fleet, requests=3000, replications=1, engine=EngineOptions(max_batched_tokens=256))
    # 256 tokens per iteration against 16-256 sequences with 512-token chunks: prefills share the budget, so
    # first tokens come later (TPOT is one decode token per iteration either way).
    assert tight.ttft.p50_ms > free.ttft.p50_ms
    assert tight.to_json()["engine"]["max_batched_tokens"] == 256
    assert "token budget" in " ".join(tight.notes)
    assert tight.littles_law_rel_error < 1e-6


def test_paged_with_a_token_budget_is_refused(agent):
    with pytest.raises(InstanceError, match="engine.max_batched_tokens: 4096 is not supported with kv 'paged'"):
        _run(agent, "0-65536:h100x24", requests=500, replications=1,
             engine=EngineOptions(kv="paged", max_batched_tokens=4096))


@pytest.mark.parametrize("fleet, extra", [
    ("0-4096:h100x2#64,4096-65536:h100x12", ["--kv", "paged", "--max-num-seqs", "64", "--availability", "sampled"]),
    ("0-4096:h100x1#8,4096-65536:h100x12", ["--max-batched-tokens", "600", "--router", "spillover",
                                            "--spill-bound", "1"]),
])
def test_engine_settings_are_deterministic_per_seed(repo_root, tmp_path, fleet, extra):
    """Byte-for-byte: same seed, same JSON (but wall time) with every engine path on; another seed differs."""
    args = ["simulate", str(repo_root / "instances" / "ref_puzzle2_agent_h100.yaml"), "--set",
            "gpus.0.availability=0.9",
            "--fleet", fleet, "--requests", "3000", "--replications", "2", *extra]
    texts = []
    for seed, name in ((5, "a"), (5, "b"), (6, "c")):
        out = tmp_path / f"{name}.json"
        r = CliRunner().invoke(main, args + ["--seed", str(seed), "--json", str(out)])
        assert r.exit_code in (0, EXIT_CODES["slo_missed"]), r.output      # a short run of a tight fleet may miss
        d = json.loads(out.read_text())
        d.pop("wall_seconds")
        texts.append(json.dumps(d, sort_keys=True))
    assert texts[0] == texts[1] and texts[0] != texts[2]
    d = json.loads(texts[0])
    if "--router" in extra:
        assert d["pools"][0]["spilled"] > 0 and d["engine"]["max_batched_tokens"] == 600
    else:
        assert d["engine"]["availability"] == "sampled" and d["pools"][0]["max_num_seqs_sim"] == 64
