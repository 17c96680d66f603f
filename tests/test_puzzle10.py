"""Reference scenarios, Puzzle 10: a semantic router's small model (A10G unit, 7B-class) for short requests and
large model (H100 unit, 70B-class TP=8 server powered as one GPU) for long ones, against all traffic on H100.

``vllm-sr-sim tok-per-watt --cdf {azure,lmsys} --lam 100 --slo 500 --b-short {4096,2048} --gpu-short a10g
--gpu-long h100`` printed (the reference tool run from its source, vllm-project/semantic-router src/fleet-sim):

======  ==========================  ==============================  ==========================  ============
CDF     short pool A10G             long pool H100                  routed fleet                homo H100
======  ==========================  ==============================  ==========================  ============
azure   10, rho 0.82, 18.500, 53.9  4, rho 0.50, 3.693 tok/W, 16.0  14 GPUs, 3.4 kW, 8.705      6, 0.82, 9.384
lmsys   4, rho 0.66, 19.949, 26.5   2, rho 0.40, 3.745, 13.8 ms     6 GPUs, 1.5 kW, 8.506       3, 0.46, 8.198
======  ==========================  ==============================  ==========================  ============

(GPUs, rho, pool tok/W, P99 TTFT ms.) Its method is fleetopt's: M/G/c per KV slot, P99 wait plus mean
prefill (the instances loaded with ``slo.ttft_model=mean-prefill``), fleet tok/W =
sum(lambda_i mean_out_i) / sum(N_i P_i(n_i)) with n_i = rho_i n_slots. Where its numbers differ, each reason
is checked below (docs/multi_model.md):

1. Both of its pools have the 8,192-token window (``--max-ctx``), so its short A10G holds 64 sequences;
   fleetopt's 0-B pool has the window B (128 at 4K). ``#64`` on the fleet spec caps the short pool at 64: the
   short pools then agree (``test_short_pool_matches_the_reference``).
2. It calibrates the long pool on the sub-CDF above B_short with its first bucket sampled from 1 token (no
   lower clamp), so long requests look shorter (Azure: mean output 809 instead of 1,121 tokens).
3. Its replica search starts at ceil(lambda / mu) + 1, so it never returns fewer (Azure long pool 4, LMSYS
   long pool 2, LMSYS homogeneous 3, where 3, 1 and 2 meet the SLO).
4. E[S] from 3,000 Monte-Carlo samples: the Azure homogeneous pool's estimate is 4.1 % below the exact value,
   which puts 6 units under the 0.85 utilisation cap that exactly needs 7.
5. Power at ``int(n_active)`` (fleetopt: the continuous mean batch), and a tok/W numerator from bucket
   midpoints of the untruncated CDF, ``int(0.2 x mean)``.
"""

from __future__ import annotations

import json
import math

import pytest

from fleetopt.optimizer import api
from fleetopt.optimizer.io.catalog import data_dir

B_SHORT = {"azure": 4096, "lmsys": 2048}
# printed by the reference tool: (GPUs, rho, pool tok/W, P99 ms)
REF_SHORT = {"azure": (10, 0.82, 18.500, 53.9), "lmsys": (4, 0.66, 19.949, 26.5)}
REF_LONG = {"azure": (4, 0.50, 3.693, 16.0), "lmsys": (2, 0.40, 3.745, 13.8)}
REF_ROUTED = {"azure": (14, 3.4, 8.705), "lmsys": (6, 1.5, 8.506)}  # GPUs, kW, fleet tok/W
REF_HOMO = {"azure": (6, 0.82, 9.384), "lmsys": (3, 0.46, 8.198)}
REF_ALPHA = {"azure": 0.898, "lmsys": 0.948}  # printed share of traffic at or below B_short


def a10g_power_w(batch: float) -> float:
    """The A10G unit's logistic curve (catalogue, the reference's A10G profile): 75-120 W, k 0.7, x0 3."""
    return 75 + 45 / (1 + math.exp(-0.7 * (math.log2(max(batch, 1.0)) - 3.0)))


def h100_power_w(batch: float) -> float:
    """The H100 unit's curve: 300-600 W, k 1, x0 4.2 (one GPU's, for the whole TP=8 unit)."""
    return 300 + 300 / (1 + math.exp(-(math.log2(max(batch, 1.0)) - 4.2)))


def cdf_points(workload: str):
    data = json.loads((data_dir() / "workloads" / f"{workload}_cdf.json").read_text())
    return data["cdf"] if isinstance(data, dict) else data


def segment_mean_output(workload: str, lo: float, hi: float, window: float = 8192) -> float:
    """0.2 x E[L | lo < L <= hi] by hand: the CDF's pieces are uniform; requests above the instance's 8K window
    are served cut to it, so the top segment also holds them as ``window``-token requests."""
    mass = total = 0.0
    if hi == window:
        above = 1.0 - next(f0 + (f - f0) * (window - t0) / (t - t0)
                           for (t0, f0), (t, f) in zip([(0, 0.0), *cdf_points(workload)], cdf_points(workload))
                           if t >= window)
        mass, total = above, above * window
    prev_t, prev_f = 0.0, 0.0
    for t, f in cdf_points(workload):
        a, b = max(prev_t, lo), min(t, hi)
        if b > a:
            p = (f - prev_f) * (b - a) / (t - prev_t)
            mass += p
            total += p * (a + b) / 2
        prev_t, prev_f = t, f
    return 0.2 * total / mass


@pytest.fixture(scope="module")
def fleets(repo_root):
    out = {}
    for w, b in B_SHORT.items():
        inst = api.load(repo_root / "instances" / f"ref_puzzle10_{w}.yaml", ["slo.ttft_model=mean-prefill"])
        rep = api.evaluate_report(inst, [f"0-{b}:a10g#64,{b}-8192:h100", f"0-{b}:a10g,{b}-8192:h100", "0-8192:h100"])
        out[w] = [f for _, f in rep.fleets]
    return out


@pytest.mark.parametrize("workload", sorted(B_SHORT))
def test_fleet_tok_per_watt_by_hand(fleets, workload):
    """sum(lambda_i out_i) / sum(N_i P_i(b_i)) from each pool's own figures: b_i = rho_i x slots, P_i the
    catalogue curve, out_i the segment's exact mean output (0.2 x mean length of its uniform pieces)."""
    b = B_SHORT[workload]
    for fleet in fleets[workload]:
        num = den = 0.0
        for pool in fleet.pools:
            curve = a10g_power_w if pool.gpu == "a10g" else h100_power_w
            batch = pool.utilization * pool.max_num_seqs
            assert pool.power_w == pytest.approx(pool.replicas * curve(batch), rel=1e-9)
            hi = pool.max_tokens
            out = segment_mean_output(workload, pool.min_tokens, hi)
            if hi == 8192 and pool.min_tokens == 0:
                assert workload == "lmsys" or out == pytest.approx(325, abs=1)  # the reference's 325 for Azure
            num += pool.arrival_rate * out
            den += pool.power_w
        assert fleet.tok_per_watt == pytest.approx(num / den, rel=1e-9)
        assert fleet.power_kw == pytest.approx(den / 1000, rel=1e-9)
    short = fleets[workload][0].pools[0]
    assert short.routing_share == pytest.approx(REF_ALPHA[workload], abs=5e-4)
    assert short.max_tokens == b


@pytest.mark.parametrize("workload", sorted(B_SHORT))
def test_short_pool_matches_the_reference(fleets, workload):
    """With the reference's 64 slots (its 8K window) the short pool is the reference's: same count, rho, tok/W
    and P99 (the E[S] of this light-tailed segment is within Monte-Carlo error of the exact one)."""
    pool = fleets[workload][0].pools[0]
    n, rho, tpw, p99 = REF_SHORT[workload]
    assert pool.gpu == "a10g" and pool.max_num_seqs == 64
    assert pool.replicas == n
    assert pool.utilization == pytest.approx(rho, abs=0.01)
    assert pool.tok_per_watt == pytest.approx(tpw, rel=0.01)
    assert pool.ttft_p99_ms == pytest.approx(p99, rel=0.01)
    # with fleetopt's own 0-B window the A10G holds 128 (Azure) / 256 (LMSYS) sequences and needs fewer units
    own = fleets[workload][1].pools[0]
    assert own.max_num_seqs == 64 * 8192 // B_SHORT[workload] and own.replicas < n


@pytest.mark.parametrize("workload", sorted(B_SHORT))
def test_routed_fleet_against_the_reference(fleets, workload):
    """Same total count; Azure's tok/W is 8.7 % higher because fleetopt's long requests are the real ones above
    4,096 tokens (reason 2: 1,121 output tokens each, the reference's 809); LMSYS within 1 %."""
    fleet = fleets[workload][0]
    n, kw, tpw = REF_ROUTED[workload]
    assert fleet.total_replicas == n
    assert fleet.power_kw == pytest.approx(kw, abs=0.06)
    if workload == "lmsys":
        assert fleet.tok_per_watt == pytest.approx(tpw, rel=0.01)
    else:
        assert fleet.tok_per_watt == pytest.approx(9.46, abs=0.01) and fleet.tok_per_watt > tpw * 1.08
        long_ = fleet.pools[1]
        assert long_.output_tok_per_s / long_.arrival_rate == pytest.approx(segment_mean_output("azure", 4096, 8192))
        assert segment_mean_output("azure", 4096, 8192) == pytest.approx(1121.4, abs=0.1)  # 0.2 x 5,607 tokens


def tool_long_instance(workload: str):
    """The reference's long pool: the sub-CDF above B_short renormalised, its first bucket from 0 (reason 2)."""
    pts = cdf_points(workload)
    b = B_SHORT[workload]
    alpha = next(f0 + (f - f0) * (b - t0) / (t - t0) for (t0, f0), (t, f) in zip([(0, 0.0), *pts], pts) if t >= b)
    sub = [[t, (f - alpha) / (1 - alpha)] for t, f in pts if t > b]
    sub[-1][1] = 1.0
    return api.load({"name": f"tool-long-{workload}", "workload": {"cdf": sub, "arrival_rate": 100 * (1 - alpha)},
                     "slo": {"ttft_p99_ms": 500, "ttft_model": "mean-prefill"},
                     "gpus": [{"name": "h100", "profile": "H100-80GB"}],
                     "pools": {"max_pools": 1, "max_context": 8192}})


@pytest.mark.parametrize("workload", sorted(B_SHORT))
def test_long_pool_differences_are_the_tools_conventions(workload):
    """On the reference's own long sub-CDF fleetopt finds the least count meeting the SLO; the reference's
    count is max(that, ceil(lambda / mu) + 1) (reason 3), mu = slots / E[S]."""
    pool = api.evaluate_report(tool_long_instance(workload), "0-8192:h100").fleets[0][1].pools[0]
    mu = pool.max_num_seqs / pool.mean_service_s
    assert max(pool.replicas, math.ceil(pool.arrival_rate / mu) + 1) == REF_LONG[workload][0]
    assert pool.replicas < REF_LONG[workload][0]
    if workload == "azure":  # no truncation here: the reference's numerator, 809 tokens per request, comes back
        assert pool.output_tok_per_s / pool.arrival_rate == pytest.approx(809, abs=1)


def test_homogeneous_baselines(fleets):
    """Azure: the exact E[S] puts 6 units at rho 0.851, over the 0.85 cap, so 7; the reference's Monte-Carlo
    mu = 20.429 req/s per unit (E[S] = 128 / 20.429 = 6.266 s) gives 100 x 6.266 / (6 x 128) = 0.816 (reason 4).
    LMSYS: 2 units meet the SLO; the reference starts at ceil(100 / 72.23) + 1 = 3 (reason 3)."""
    azure, lmsys = fleets["azure"][2].pools[0], fleets["lmsys"][2].pools[0]
    assert azure.replicas == 7 and lmsys.replicas == 2
    assert 100 * azure.mean_service_s / (6 * 128) == pytest.approx(0.851, abs=0.001)
    assert 100 * (128 / 20.429) / (6 * 128) == pytest.approx(REF_HOMO["azure"][1], abs=0.005)
    assert azure.mean_service_s / (128 / 20.429) - 1 == pytest.approx(0.043, abs=0.002)
    assert math.ceil(100 / 72.23) + 1 == REF_HOMO["lmsys"][0]
    assert lmsys.ttft_p99_ms < 500 and lmsys.utilization < 0.85


def test_the_verdict_depends_on_the_conventions(fleets):
    """The reference finds routing 7.2 % worse than homogeneous H100 on Azure and 3.8 % better on LMSYS; with
    exact counts both verdicts flip (Azure +17 %, LMSYS -26 %), so the puzzle's answer is not robust."""
    assert REF_ROUTED["azure"][2] < REF_HOMO["azure"][2] and REF_ROUTED["lmsys"][2] > REF_HOMO["lmsys"][2]
    az, lm = fleets["azure"], fleets["lmsys"]
    assert az[0].tok_per_watt / az[2].tok_per_watt - 1 == pytest.approx(0.168, abs=0.01)
    assert lm[0].tok_per_watt / lm[2].tok_per_watt - 1 == pytest.approx(-0.26, abs=0.01)
