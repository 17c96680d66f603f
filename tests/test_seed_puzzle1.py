"""Seed Puzzle 1 (vllm-sr-sim ``pareto``: LMSYS, lambda = 100, A100 units, P99 TTFT 500 ms, 65,536 max).

The seed's table (capacity-planning seed, Puzzle 1):

    B_short  n_s  n_l  $/yr   P99-s  P99-l
        512    2   13  290K     9ms   25ms
      1,024    2   10  232K    10ms   36ms
      2,048    2    7  174K    12ms   63ms
      4,096    3    5  155K    13ms  108ms
      8,192    4    4  155K    14ms  212ms
     12,288    5    3  155K    14ms  319ms
    homogeneous: 14 GPUs, $271K

The seed estimated service-time moments from 3,000 Monte-Carlo samples and
starts its replica search at ceil(lambda/mu) + 1; fleetopt computes the moments
exactly and returns the true minimum, so single counts may differ by one.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main

SEED_CONVENTION = "slo.ttft_model=mean-prefill"
"""The seed's TTFT convention (P99 wait + mean prefill), which its table was computed with."""

SEED = {512: (2, 13, 9, 25), 1024: (2, 10, 10, 36), 2048: (2, 7, 12, 63), 4096: (3, 5, 13, 108),
        8192: (4, 4, 14, 212), 12288: (5, 3, 14, 319)}


@pytest.fixture(scope="module")
def inst(repo_root):
    return api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", [SEED_CONVENTION])


@pytest.mark.parametrize("b_short", sorted(SEED))
def test_auto_sizing_within_one_replica_of_seed(inst, b_short):
    n_s, n_l, _, _ = SEED[b_short]
    r = api.evaluate_report(inst, f"0-{b_short}:a100,{b_short}-65536:a100").to_json()
    short, long_ = r["pools"]
    assert abs(short["replicas"] - n_s) <= 1 and abs(long_["replicas"] - n_l) <= 1
    assert r["slo_met"] and all(p["source"] == "analytic" for p in r["pools"])


@pytest.mark.parametrize("b_short", sorted(SEED))
def test_seed_counts_give_seed_p99(inst, b_short):
    """Evaluating the seed's own counts reproduces its P99 TTFTs (printed to 1 ms) within 2 ms."""
    n_s, n_l, p99_s, p99_l = SEED[b_short]
    r = api.evaluate_report(inst, f"0-{b_short}:a100x{n_s},{b_short}-65536:a100x{n_l}").to_json()
    short, long_ = r["pools"]
    assert short["ttft_p99_ms"] == pytest.approx(p99_s, abs=2.0)
    if b_short == 4096:
        # With exact moments (E[S] = 38.93 s, cv2 = 6.60) five long replicas leave P(wait) above 1 %:
        # they pass only if E[S] is underestimated by >= 4.5 %, which a 3,000-sample estimate of this
        # heavy-tailed segment does in about one seed in five. Six replicas give the seed's 108 ms.
        assert not long_["slo_met"]
        six = api.evaluate_report(inst, "0-4096:a100x3,4096-65536:a100x6").to_json()["pools"][1]
        assert six["ttft_p99_ms"] == pytest.approx(p99_l, abs=2.0)
    else:
        assert long_["ttft_p99_ms"] == pytest.approx(p99_l, rel=0.02, abs=2.0)


def test_optimum_fleet_and_baseline(inst):
    r = api.evaluate_report(inst, "0-8192:a100,8192-65536:a100").to_json()
    assert [p["replicas"] for p in r["pools"]] == [4, 4]
    assert round(r["cost_per_year"] / 1000) == 155 and r["slo_met"]
    assert r["cost_per_year"] == pytest.approx(8 * 2.21 * 8760)
    assert abs(r["baseline"]["total_replicas"] - 14) <= 1 and r["baseline"]["slo_met"]


def test_tail_model_rejects_the_a100_long_pool(repo_root):
    inst = api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", ["slo.ttft_model=tail"])
    r = api.evaluate_report(inst, "0-4096:a100,4096-65536:a100").to_json()
    short, long_ = r["pools"]
    assert short["slo_met"] and not long_["slo_met"] and not r["slo_met"]
    assert "prefill of its longest prompts" in long_["miss_reason"]
    assert long_["prefill_p99_ms"] > 500


def test_cli_json_contract(repo_root, tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["evaluate", str(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"),
                                    "--set", SEED_CONVENTION,
                                    "--fleet", "0-8192:a100,8192-65536:a100", "--json", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    for key in ("cost_per_hr", "cost_per_year", "total_replicas", "total_gpus", "power_kw", "tok_per_watt",
                "slo_met", "pools", "baseline"):
        assert key in r
    for key in ("min_tokens", "max_tokens", "gpu", "replicas", "gpus", "arrival_rate", "utilization",
                "ttft_p99_ms", "power_w", "slo_met"):
        assert key in r["pools"][0] and key in r["baseline"]["pools"][0]
    assert sum(p["arrival_rate"] for p in r["pools"]) == pytest.approx(100.0)
    # fleet tok/W is output tokens per second over watts (the 1/W paper's Eq. 4)
    out_tps = sum(p["output_tok_per_s"] for p in r["pools"])
    assert r["tok_per_watt"] == pytest.approx(out_tps / (r["power_kw"] * 1000))


def test_several_fleets_and_stdout_json(repo_root):
    res = CliRunner().invoke(main, ["evaluate", str(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"),
                                    "--set", SEED_CONVENTION,
                                    "--fleet", "0-8192:a100,8192-65536:a100", "--fleet", "0-64k:a100x14",
                                    "--json", "-"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert [f["total_replicas"] for f in r["fleets"]] == [8, 14]


@pytest.mark.parametrize("fleet,phrase", [
    ("0-4096:a100,8192-65536:a100", "should start at 4096"),
    ("0-4096:v100", "unknown gpu 'v100'"),
    ("0-4096:a100", "pools.max_context is 65536"),
    ("0-4096:a100x0,4096-65536:a100", "at least one replica"),
    ("zero-4096", "is not LO-HI:GPU"),
])
def test_bad_fleet_specs(repo_root, fleet, phrase):
    res = CliRunner().invoke(main, ["evaluate", str(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"),
                                    "--set", SEED_CONVENTION,
                                    "--fleet", fleet])
    assert res.exit_code == 2 and phrase in res.stderr and "Traceback" not in res.output
