"""Computed (roofline) profiles against measurement, the 1/W-law paper's Tables 2 and 5 and closed forms.

Measured values are literals copied from ``data/measurements/`` (Llama-3.1-8B bf16 TP=1 on one
H100-SXM; each table names its file): the default (``physical``) profile must stay within 25 % of
every measured decode time and of the measured tok/W at full KV occupancy.

Paper values are quoted from the seed paper (seeds/000_09ee93d41337e3d4.txt): Table 5
(Llama-3.1-70B, TP=8, fp16) and Table 2 (8K context). They reproduce only under the seeds'
convention (``RooflineDefaults.seeds_convention()``: bandwidth efficiency 0.80, no compute terms),
and the paper computed its Table 2/5 KV capacity with whole-model KV bytes in every GPU's budget,
so those rows are built with ``kv_layout="replicated"``. Expected values in the closed-form tests
are written out from the catalogue figures, never taken from the code under test.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yaml

from fleetopt.models.hardware import SEEDS_BANDWIDTH_EFFICIENCY, RooflineDefaults
from fleetopt.models.profiles import ServingProfile
from fleetopt.models.roofline import (
    ComputedProfile,
    activity_power_per_gpu_w,
    busy_power_per_gpu_w,
    computed_profile,
    kv_bytes_per_token_per_gpu,
    matmul_params,
)
from fleetopt.models.service import iteration_latency_s
from fleetopt.optimizer.io.catalog import load_catalog

CTX = 8192
MEAN_SEQ = CTX / 2  # the paper's Table-1 convention: mean sequence = half the window
H100, H200, B200, GB200 = "H100-SXM-80GB", "H200-SXM", "B200-SXM", "GB200"


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def build(cat, gpu: str, model: str, **kw) -> ComputedProfile:
    return computed_profile(cat.hardware[gpu], cat.models[model], defaults=cat.defaults, **kw)


def build_seeds(cat, gpu: str, model: str, **kw) -> ComputedProfile:
    """Under the seeds' convention, the recipe of the paper's Tables 2 and 5."""
    return computed_profile(cat.hardware[gpu], cat.models[model], defaults=cat.defaults.seeds_convention(), **kw)


def paper_row(cat, gpu: str, model: str, tp: int, dtype: str = "fp16") -> ComputedProfile:
    return build_seeds(cat, gpu, model, tp=tp, dtype=dtype, kv_layout="replicated")


def rel_err(ours: float, paper: float) -> float:
    return abs(ours - paper) / paper


def decode_point(profile: ComputedProfile):
    """(n, replica tok/s, per-GPU activity power W) at n_slots(8K), mean sequence 4K."""
    n = profile.n_slots(CTX)
    tok_s = n / float(iteration_latency_s(profile, n, MEAN_SEQ))
    return n, tok_s, activity_power_per_gpu_w(profile, n, MEAN_SEQ)


# --- Table 5: Llama-3.1-70B, TP=8, fp16 -------------------------------------------------
# GPU: (W ms, n@8K, P W, tok/W)
TABLE5 = {
    H100: (6.72, 22, 367, 7.41),
    H200: (4.76, 44, 422, 15.58),
    B200: (2.95, 58, 619, 20.93),
    GB200: (2.95, 65, 755, 18.49),
}


@pytest.mark.parametrize("gpu", TABLE5)
def test_table5_weight_streaming_time(cat, gpu):
    # Official parameter count (70.55B) streams 1.5% more than the paper's simplified 69.50B.
    assert rel_err(build_seeds(cat, gpu, "Llama-3.1-70B", tp=8).W_s * 1e3, TABLE5[gpu][0]) <= 0.05


@pytest.mark.parametrize("gpu", TABLE5)
def test_table5_slots_at_8k(cat, gpu):
    assert rel_err(paper_row(cat, gpu, "Llama-3.1-70B", 8).n_slots(CTX), TABLE5[gpu][1]) <= 0.05


@pytest.mark.parametrize("gpu", TABLE5)
def test_table5_power_and_tok_per_watt(cat, gpu):
    """Table 5's P is one GPU's power under the activity rule; its tok/W is the replica's
    tok/s over that single GPU's power (tok/s per GPU-equivalent, tp times the physical value)."""
    _, _, paper_p_w, paper_tok_w = TABLE5[gpu]
    profile = paper_row(cat, gpu, "Llama-3.1-70B", 8)
    n, tok_s, p_gpu_w = decode_point(profile)
    assert rel_err(p_gpu_w, paper_p_w) <= 0.05
    assert rel_err(tok_s / p_gpu_w, paper_tok_w) <= 0.05  # brief asks 20 %; the rule is found, so 5 %
    physical_tok_w = tok_s / (profile.gpus_per_replica * p_gpu_w)
    assert physical_tok_w == pytest.approx(paper_tok_w / 8, rel=0.05)


# --- Table 2: 8K context, H100 and B200 ---------------------------------------------------
# (model, tp, gpu): (n@8K, tok/s, tok/W) as printed
TABLE2_LLAMA = {
    ("Llama-3.1-8B", 1, H100): (58, 3350, 6.46),
    ("Llama-3.1-8B", 1, B200): (148, 9962, 12.18),
    ("Llama-3.1-70B", 8, H100): (22, 2716, 7.41),
    ("Llama-3.1-70B", 8, B200): (58, 12960, 20.93),
    ("Llama-3.1-405B", 8, B200): (17, 1009, 2.16),
}


@pytest.mark.parametrize("row", TABLE2_LLAMA)
def test_table2_llama_slots_throughput_and_tok_per_watt(cat, row):
    model, tp, gpu = row
    paper_n, paper_tok_s, paper_tok_w = TABLE2_LLAMA[row]
    n, tok_s, p_gpu_w = decode_point(paper_row(cat, gpu, model, tp))
    assert rel_err(n, paper_n) <= 0.05
    assert rel_err(tok_s, paper_tok_s) <= 0.05
    assert rel_err(tok_s / p_gpu_w, paper_tok_w) <= 0.05


def test_table2_405b_on_h100_holds_no_sequence(cat):
    # Paper prints n = 1 (a floor). Weights per GPU: 405,853,388,800 x 2 / 8 = 101.46 GB,
    # above 0.90 x 85.90 GB = 77.31 GB, so the KV budget is negative and we report 0.
    profile = paper_row(cat, H100, "Llama-3.1-405B", 8)
    assert profile.weight_bytes_per_gpu == 405_853_388_800 * 2 / 8
    assert profile.kv_budget_bytes < 0
    assert profile.n_slots(CTX) == 0 and profile.total_kv_blocks == 0
    assert "no KV cache" in profile.note and "101.5 GB" in profile.note


def test_table2_and_5_do_not_print_w_for_8b_405b_so_check_closed_form(cat):
    # W = params x 2 B / tp / (bandwidth x 0.80) + layers x 3 us, official parameter counts.
    w_8b = 8_030_261_248 * 2 / (3.35e12 * 0.80) + 32 * 3e-6  # 6.0887 ms (paper recipe: 5.70 ms)
    w_405b = 405_853_388_800 * 2 / 8 / (3.35e12 * 0.80) + 126 * 3e-6  # 38.237 ms
    assert build_seeds(cat, H100, "Llama-3.1-8B", tp=1).W_s == pytest.approx(w_8b, rel=1e-12)
    assert build_seeds(cat, H100, "Llama-3.1-405B", tp=8).W_s == pytest.approx(w_405b, rel=1e-12)


# --- MoE rows: official architectures differ from the paper's --------------------------------

def test_qwen3_235b_official_architecture_slots(cat):
    # Official head_dim 128 gives 192,512 KV bytes/token (paper used 96,256).
    # Weights per GPU: 235,093,634,560 x 2 / 8 = 58,773,408,640 B.
    # H100: 0.9 x 85,899,345,920 - 58,773,408,640 - 411,041,792 = 18,124,960,896 B;
    #       / (192,512 x 8192 = 1,577,058,304) = 11.49 -> 11   (paper 24)
    # B200: 173,946,175,488 - 58,773,408,640 - 411,041,792 = 114,761,725,056 B -> 72.77 -> 72 (paper 146)
    assert paper_row(cat, H100, "Qwen3-235B-A22B", 8).n_slots(CTX) == 11
    assert paper_row(cat, B200, "Qwen3-235B-A22B", 8).n_slots(CTX) == 72


def test_qwen3_235b_peer_figures_reproduce_paper_slots(cat):
    # The paper's 24 / 146 come back with the peer's figures (models.yaml peer_catalog):
    # KV 96,256 B/token, 231,069,974,528 parameters, 18,167,103,488 active.
    peer = dataclasses.replace(cat.models["Qwen3-235B-A22B"], kv_bytes_per_token_fp16=96_256,
                               params=231_069_974_528, active_params=18_167_103_488)
    for gpu, paper_n in ((H100, 24), (B200, 146)):
        profile = computed_profile(cat.hardware[gpu], peer, tp=8, kv_layout="replicated",
                                   defaults=cat.defaults.seeds_convention())
        assert profile.n_slots(CTX) == paper_n


def test_deepseek_v3_fp8_official_mla_slots(cat):
    # fp8 weights per GPU: 671,026,404,352 / 8 = 83,878,300,544 B > 77.3 GB on H100 -> 0 (paper 1).
    # B200: 173,946,175,488 - 83,878,300,544 - 411,041,792 = 89,656,833,152 B;
    #       MLA latent at fp8 = 70,272 / 2 = 35,136 B/token, / (35,136 x 8192) = 311.49 -> 311 (paper 11,
    #       computed for plain MHA with 128 KV heads of 56).
    assert paper_row(cat, H100, "DeepSeek-V3", 8, "fp8").n_slots(CTX) == 0
    assert paper_row(cat, B200, "DeepSeek-V3", 8, "fp8").n_slots(CTX) == 311


def test_moe_active_params_w_closed_form(cat):
    # Qwen3-235B-A22B on H100, TP=8, fp16: 22,190,763,520 x 2 / 8 / 2.68e12 + 94 x 3 us = 2.352 ms
    expected = 22_190_763_520 * 2 / 8 / (3.35e12 * 0.80) + 94 * 3e-6
    assert build_seeds(cat, H100, "Qwen3-235B-A22B", tp=8).W_s == pytest.approx(expected, rel=1e-12)
    # physical: the 151,936 x 4,096 embedding table is gathered, not streamed; 0.75 of the bandwidth
    streamed = 22_190_763_520 - 151_936 * 4_096
    physical = build(cat, H100, "Qwen3-235B-A22B", tp=8)
    # + the TP all-reduce latency (2 x 94 layers x 10 us) + the MoE dispatch (94 layers x 20 us)
    assert physical.W_s == pytest.approx(streamed * 2 / 8 / (3.35e12 * 0.75) + 94 * 3e-6 + 2 * 94 * 10e-6
                                         + 94 * 20e-6, rel=1e-12)
    assert physical.name == "H100-SXM-80GB/Qwen3-235B-A22B/tp8/fp16/moe-active-params"


def test_moe_layer_table_w_closed_form(cat):
    # Table "128/8/4096/1536" at 2.0 B, 8 tokens: 0.480 ms per layer on H100, x (3.35/8)^0.7 on B200;
    # attention q,o,k,v: 94 x 2 x (64 + 4) x 128 x 4096 weights x 2 B / 8 GPUs.
    attn_bytes = 94 * 2 * (64 + 4) * 128 * 4096 * 2 / 8
    for gpu, bw, scale in ((H100, 3.35e12, 1.0), (B200, 8.0e12, (3.35 / 8.0) ** 0.7)):
        # physical also pays the TP all-reduce latency (2 x 94 x 10 us) and the MoE dispatch (94 x 20 us)
        for build_fn, eta, suffix, extra in ((build_seeds, 0.80, "/moe-layer-table/seeds", 0.0),
                                             (build, 0.75, "/moe-layer-table", 2 * 94 * 10e-6 + 94 * 20e-6)):
            expected = 94 * 0.480e-3 * scale + attn_bytes / (bw * eta) + 94 * 3e-6 + extra
            profile = build_fn(cat, gpu, "Qwen3-235B-A22B", tp=8, moe_w="layer-table", moe_table=cat.moe_latency_table)
            assert profile.W_s == pytest.approx(expected, rel=1e-12)
            assert profile.name.endswith(suffix) and profile.moe_w == "layer-table"


def test_moe_layer_table_rejects_untabulated_config(cat):
    odd = dataclasses.replace(cat.models["Qwen3-30B-A3B"],
                              moe=dataclasses.replace(cat.models["Qwen3-30B-A3B"].moe, routed_experts=64))
    with pytest.raises(ValueError, match="64/8/2048/768"):
        computed_profile(cat.hardware[H100], odd, tp=1, moe_w="layer-table", moe_table=cat.moe_latency_table,
                         defaults=cat.defaults)
    with pytest.raises(ValueError, match="moe_table"):
        build(cat, H100, "Qwen3-30B-A3B", moe_w="layer-table")


# --- Layouts, dtypes, caps ----------------------------------------------------------------

def test_sharded_layout_holds_eight_times_the_kv(cat):
    sharded = build(cat, H100, "Llama-3.1-70B", tp=8)
    replicated = build(cat, H100, "Llama-3.1-70B", tp=8, kv_layout="replicated")
    # 59,259,942,912 B // (40,960 x 16) = 90,423 blocks vs // (327,680 x 16) = 11,302
    assert (sharded.total_kv_blocks, replicated.total_kv_blocks) == (90_423, 11_302)
    assert sharded.kv_slots(CTX) == 8 * replicated.kv_slots(CTX) == 176
    assert sharded.H_s == replicated.H_s  # the layout only changes capacity, never the KV scan


def test_kv_bytes_per_gpu_gqa_and_mla(cat):
    qwen, ds = cat.models["Qwen3-235B-A22B"], cat.models["DeepSeek-V3"]
    assert kv_bytes_per_token_per_gpu(qwen, "fp16", 8) == 192_512 / 4  # 4 KV heads replicated over 8 ranks
    assert kv_bytes_per_token_per_gpu(ds, "fp16", 8) == 70_272  # MLA latent on every rank
    assert kv_bytes_per_token_per_gpu(ds, "fp8", 8, "replicated") == 70_272 / 2


def test_fp8_halves_weights_and_lowers_w(cat):
    fp16 = build(cat, H100, "Llama-3.1-70B", tp=8)
    fp8 = build(cat, H100, "Llama-3.1-70B", tp=8, dtype="fp8")
    assert fp8.weight_bytes_per_gpu == fp16.weight_bytes_per_gpu / 2
    assert fp8.W_s < fp16.W_s
    assert fp8.weight_stream_s == pytest.approx(fp16.weight_stream_s / 2, rel=1e-12)
    assert fp8.kv_scan_bytes_per_token_per_gpu == fp16.kv_scan_bytes_per_token_per_gpu / 2


def test_fp8_on_a10g_is_rejected(cat):
    with pytest.raises(ValueError, match="A10G"):
        build(cat, "A10G", "Llama-3.1-8B", dtype="fp8")


def test_invalid_configuration_lists_every_problem(cat):
    with pytest.raises(ValueError, match="kv_layout.*chunk_tokens|chunk_tokens.*kv_layout") as err:
        build(cat, H100, "Llama-3.1-70B", tp=8, kv_layout="mirrored", chunk_tokens=0)
    assert "dtype" not in str(err.value)
    with pytest.raises(ValueError, match="does not divide"):
        build(cat, H100, "Llama-3.1-70B", tp=3)


def test_concurrency_cap_is_max_num_seqs_or_the_seeds_ridge_batch(cat):
    # physical: no compute cap, only the KV cache: 0.9 x 85,899,345,920 - 8,030,261,248 x 2 = 61,248,888,832 B
    # // (131,072 x 16) = 29,205 blocks; at 1K (64 blocks) 456 sequences
    physical = build(cat, H100, "Llama-3.1-8B")
    assert physical.concurrency_cap_seqs is None and physical.n_slots(1024) == 29_205 // 64 == 456
    # seeds: the ridge batch, floor(989e12 x 2 / (2 x 3.35e12 x 0.80)) = 369 for any model streaming its weights
    assert build_seeds(cat, H100, "Llama-3.1-8B").concurrency_cap_seqs == 369
    assert build_seeds(cat, H100, "Llama-3.1-8B").n_slots(1024) == 369
    for build_fn in (build, build_seeds):
        capped = build_fn(cat, H100, "Llama-3.1-70B", tp=8, max_num_seqs=64)
        assert capped.n_slots(CTX) == 64 and capped.kv_slots(CTX) == 176


def test_replica_cost_power_and_protocol(cat):
    profile = build(cat, H100, "Llama-3.1-70B", tp=8)
    assert isinstance(profile, ServingProfile)
    assert profile.name == "H100-SXM-80GB/Llama-3.1-70B/tp8/fp16"
    assert profile.model_name == "Llama-3.1-70B" and profile.latency_quality == "roofline"
    assert profile.gpus_per_replica == 8 and profile.cost_usd_per_hr == pytest.approx(8 * 4.02)
    # physical power: the busy rule at the calibration context, 8 GPUs of 0.60 x 700 W floor and 700 W limit
    p = profile.power
    assert (p.idle_w, p.nominal_w, p.k) == pytest.approx((8 * 0.60 * 700, 8 * 700, math.log(2)))
    assert p.quality == "projected"
    # seeds: the catalogue curve scaled by tp
    seeds = build_seeds(cat, H100, "Llama-3.1-70B", tp=8)
    assert seeds.name == "H100-SXM-80GB/Llama-3.1-70B/tp8/fp16/seeds" and seeds.activity_power is None
    per_gpu = cat.hardware[H100].power
    assert seeds.power.power_w(22) == pytest.approx(8 * per_gpu.power_w(22))
    assert seeds.power.quality == "measured"


def test_gpu_without_power_model_gets_tdp_fraction_rule(cat):
    profile = build_seeds(cat, "L40S", "Llama-3.1-8B")
    p = profile.power
    assert (p.idle_w, p.nominal_w, p.k) == pytest.approx((0.43 * 350, 0.86 * 350, 1.0))
    assert p.x0 == pytest.approx(math.log2(profile.W_s / profile.H_s))
    assert p.quality == "projected"


def test_iteration_latency_identity(cat):
    profile = build(cat, B200, "Llama-3.1-70B", tp=8)
    # W + H (L / B_cal) n + g n with H = 8192 x 40,960 B / (8e12 x 0.75),
    # g = 2 x (70,553,706,496 - 128,256 x 8,192) / 8 / (2,250e12 x 0.60) + the TP all-reduce per token:
    #     2 x 80 layers x 2 x 7/8 x 8,192 x 2 B / 900e9 B/s (NVLink 5)
    h = 8192 * 40_960 / (8.0e12 * 0.75)
    g = 2 * (70_553_706_496 - 128_256 * 8_192) / 8 / (2250e12 * 0.60) + 160 * 1.75 * 16_384 / 900e9
    assert profile.H_s == pytest.approx(h, rel=1e-12) and profile.g_s == pytest.approx(g, rel=1e-12)
    assert float(iteration_latency_s(profile, 58, 4096)) == pytest.approx(profile.W_s + h * 0.5 * 58 + g * 58,
                                                                          rel=1e-12)


CONFIGS = [(H100, "Llama-3.1-70B", 8), ("A10G", "Llama-3.1-8B", 1), (B200, "Qwen3-235B-A22B", 8),
           (GB200, "DeepSeek-V3", 8), ("L40S", "Qwen3-30B-A3B", 2)]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CONFIGS), st.sampled_from(["sharded", "replicated"]),
       st.lists(st.integers(1, 1 << 20), min_size=2, max_size=20))
def test_n_slots_non_increasing_in_ctx(config, layout, ctxs):
    gpu, model, tp = config
    cat = load_catalog()
    profile = build(cat, gpu, model, tp=tp, kv_layout=layout)
    ctx = np.sort(np.asarray(ctxs))
    n = profile.n_slots(ctx)
    assert np.all(np.diff(n) <= 0) and np.all(n >= 0)
    assert profile.concurrency_cap_seqs is None or np.all(n <= profile.concurrency_cap_seqs)
    assert [profile.n_slots(int(c)) for c in ctx] == list(n)


# --- Against measurement: Llama-3.1-8B bf16 TP=1 on one H100-SXM (data/measurements/) ----------------

# data/measurements/h100_llama31_8b_decode.csv, every row: (batch, context_tokens, iteration_s_median)
MEASURED_DECODE = [
    (1, 1024, 0.0066795), (2, 1024, 0.0067505), (4, 1024, 0.0068727), (8, 1024, 0.0071162),
    (16, 1024, 0.0075511), (32, 1024, 0.0082931), (64, 1024, 0.0102380), (128, 1024, 0.0141135),
    (256, 1024, 0.0231981), (384, 1024, 0.0344470), (1, 2048, 0.0067957), (2, 2048, 0.0069077),
    (4, 2048, 0.0070468), (8, 2048, 0.0074707), (16, 2048, 0.0082469), (32, 2048, 0.0099970),
    (64, 2048, 0.0134311), (128, 2048, 0.0214333), (1, 4096, 0.0070203), (2, 4096, 0.0070952),
    (4, 4096, 0.0074306), (8, 4096, 0.0082139), (16, 4096, 0.0096135), (32, 4096, 0.0131878),
    (64, 4096, 0.0201390), (1, 8192, 0.0071871), (2, 8192, 0.0074608), (4, 8192, 0.0081648),
    (8, 8192, 0.0095710), (16, 8192, 0.0123511), (32, 8192, 0.0197814), (1, 16384, 0.0075347),
    (2, 16384, 0.0081970), (4, 16384, 0.0095893), (8, 16384, 0.0122889), (16, 16384, 0.0178837),
    (1, 32768, 0.0082348), (2, 32768, 0.0096023), (4, 32768, 0.0123121), (8, 32768, 0.0178352),
    (1, 65536, 0.0096506), (2, 65536, 0.0123678), (4, 65536, 0.0179443), (192, 2048, 0.0298607),
    (48, 8192, 0.0282152), (12, 32768, 0.0237431), (6, 65536, 0.0235563), (96, 4096, 0.0278296),
    (24, 16384, 0.0233918),
]
# the same file, the rows with a board-power reading: (batch, context_tokens, iteration_s_median, power_w)
MEASURED_POWER = [
    (256, 1024, 0.0231981, 676.3), (384, 1024, 0.0344470, 699.7), (1, 2048, 0.0067957, 428.9),
    (2, 2048, 0.0069077, 417.5), (4, 2048, 0.0070468, 431.0), (8, 2048, 0.0074707, 452.9),
    (16, 2048, 0.0082469, 497.9), (32, 2048, 0.0099970, 617.8), (64, 2048, 0.0134311, 688.8),
    (128, 2048, 0.0214333, 695.1), (16, 8192, 0.0123511, 580.9), (32, 8192, 0.0197814, 693.9),
    (8, 32768, 0.0178352, 632.9), (4, 65536, 0.0179443, 624.4), (192, 2048, 0.0298607, 697.1),
    (48, 8192, 0.0282152, 710.0), (12, 32768, 0.0237431, 657.3), (6, 65536, 0.0235563, 644.9),
]
# full KV occupancy (393,216 cached tokens, the last four power rows and (384, 1024)); the README's tok/W
MEASURED_FULL_OCCUPANCY = [(384, 1024, 15.9), (192, 2048, 9.2), (48, 8192, 2.4), (12, 32768, 0.77), (6, 65536, 0.40)]
# data/measurements/h100_llama31_8b_prefill.csv, every row: (prompt_tokens, time_s_median)
MEASURED_PREFILL = [(512, 0.015282), (1024, 0.028319), (2048, 0.055918), (4096, 0.118167), (8192, 0.260168),
                    (16384, 0.635914), (32768, 1.664489)]
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def h100_8b(cat):
    return build(cat, H100, "Llama-3.1-8B", dtype="bf16")


def decode_s(profile: ComputedProfile, n, ctx):
    """t = W + h n L + g n, written out (the iteration model of the brief) rather than imported."""
    return profile.W_s + profile.H_s / profile.calibration_ctx_tokens * n * ctx + profile.g_s * n


def test_default_efficiencies_are_the_catalogue_defaults(cat):
    """hardware.yaml's defaults block, the record's defaults and the loaded catalogue agree."""
    block = yaml.safe_load((Path(__file__).parents[1] / "data" / "catalog" / "hardware.yaml").read_text())["defaults"]
    d = RooflineDefaults()
    assert (d.bandwidth_efficiency, d.flop_efficiency, d.attention_flop_efficiency) == (
        block["bandwidth_efficiency"], block["flop_efficiency"], block["attention_flop_efficiency"])
    assert (d.streaming_power_fraction, d.idle_power_fraction) == (
        block["power"]["streaming_power_fraction_of_tdp"], block["power"]["idle_power_fraction_of_tdp"])
    assert SEEDS_BANDWIDTH_EFFICIENCY == block["seeds_convention"]["bandwidth_efficiency"] == 0.80
    # the tensor-parallel all-reduce and MoE dispatch constants (physical convention)
    assert (d.p2p_latency_s, d.activation_bytes, d.moe_dispatch_s_per_layer) == (
        block["p2p_latency_s"], block["tensor_parallel"]["activation_bytes"], block["moe_dispatch_s_per_layer"])
    assert cat.defaults == d and d.convention == "physical"
    seeds = d.seeds_convention()
    assert (seeds.bandwidth_efficiency, seeds.convention) == (0.80, "seeds")


def test_every_measured_decode_time_within_25_percent(h100_8b):
    for n, ctx, measured_s in MEASURED_DECODE:
        assert rel_err(decode_s(h100_8b, n, ctx), measured_s) <= TOLERANCE, (n, ctx)


def test_every_measured_board_power_within_25_percent(h100_8b):
    for n, ctx, _, measured_w in MEASURED_POWER:
        assert rel_err(busy_power_per_gpu_w(h100_8b, n, ctx), measured_w) <= TOLERANCE, (n, ctx)


def test_tok_per_watt_at_full_kv_occupancy_within_25_percent(h100_8b):
    """At the measured operating points, with the (n, L)-aware busy power and with the profile's power curve."""
    for n, ctx, measured_tok_w in MEASURED_FULL_OCCUPANCY:
        tok_s = n / decode_s(h100_8b, n, ctx)
        assert rel_err(tok_s / busy_power_per_gpu_w(h100_8b, n, ctx), measured_tok_w) <= TOLERANCE, ctx
        assert rel_err(tok_s / h100_8b.power.power_w(n), measured_tok_w) <= TOLERANCE, ctx
        # the old logistic curve (300-600 W) made 64K 1.8x optimistic; the busy rule keeps the board near its limit
        assert busy_power_per_gpu_w(h100_8b, n, ctx) >= 0.85 * 700


def test_tok_per_watt_at_the_profiles_own_full_occupancy_within_25_percent(h100_8b):
    """Filled to its own n_slots(ctx) (all sequences at the window), the profile's tok/W matches measurement."""
    for _, ctx, measured_tok_w in MEASURED_FULL_OCCUPANCY:
        n = h100_8b.n_slots(ctx)
        tok_s = n / decode_s(h100_8b, n, ctx)
        assert rel_err(tok_s / busy_power_per_gpu_w(h100_8b, n, ctx), measured_tok_w) <= TOLERANCE, ctx


def test_whole_prompt_prefill_within_25_percent(h100_8b):
    for prompt, measured_s in MEASURED_PREFILL:
        t = h100_8b.W_s + h100_8b.prefill_a_s * prompt + h100_8b.prefill_b_s * prompt ** 2
        assert rel_err(t, measured_s) <= TOLERANCE, prompt


def test_compute_coefficients_closed_form_llama_8b_h100(cat, h100_8b):
    m8b = cat.models["Llama-3.1-8B"]
    # matmul weights: 8,030,261,248 - 128,256 x 4,096 (embedding gathered) = 7,504,924,672; prefill also
    # drops the LM head: 6,979,588,096. bf16 dense 989 TFLOPS, eta_flop 0.60, eta_attn 0.35, eta_bw 0.75.
    assert (matmul_params(m8b), matmul_params(m8b, prefill=True)) == (
        7_504_924_672, 6_979_588_096)
    assert h100_8b.g_s == pytest.approx(2 * 7_504_924_672 / (989e12 * 0.60), rel=1e-12)         # 25.29 us
    assert h100_8b.prefill_a_s == pytest.approx(2 * 6_979_588_096 / (989e12 * 0.60), rel=1e-12)  # 23.52 us
    assert h100_8b.prefill_b_s == pytest.approx(2 * 32 * 32 * 128 / (989e12 * 0.35), rel=1e-12)  # 7.57e-10 s
    assert h100_8b.W_s == pytest.approx(7_504_924_672 * 2 / (3.35e12 * 0.75) + 32 * 3e-6, rel=1e-12)  # 6.07 ms
    assert h100_8b.H_s / 8192 == pytest.approx(131_072 / (3.35e12 * 0.75), rel=1e-12)             # 5.22e-8 s
    # the README's fits: g 2.5e-5, a 26.5e-6, b 7.4e-10, h 4.5e-8, W 6.43 ms
    for ours, fitted in ((h100_8b.g_s, 2.5e-5), (h100_8b.prefill_a_s, 26.5e-6), (h100_8b.prefill_b_s, 7.4e-10),
                         (h100_8b.H_s / 8192, 4.5e-8), (h100_8b.W_s, 6.43e-3)):
        assert rel_err(ours, fitted) <= TOLERANCE


def test_compute_coefficients_closed_form_70b_fp8_tp8(cat):
    # fp8 matmuls at the FP8 rate (1,978 TFLOPS), split over 8 GPUs; attention at the FP16 rate, heads / 8.
    # Both also pay the TP all-reduce per token, in 16-bit activations: 2 x 80 x 2 x 7/8 x 8,192 x 2 B / 450e9 B/s.
    p = build(cat, H100, "Llama-3.1-70B", tp=8, dtype="fp8")
    mm = 70_553_706_496 - 128_256 * 8_192
    ar = 2 * 80 * 2 * 7 / 8 * 8_192 * 2 / 450e9
    assert p.g_s == pytest.approx(2 * mm / 8 / (1978e12 * 0.60) + ar, rel=1e-12)
    assert p.prefill_a_s == pytest.approx(2 * (mm - 128_256 * 8_192) / 8 / (1978e12 * 0.60) + ar, rel=1e-12)
    assert p.prefill_b_s == pytest.approx(2 * 80 * 64 * 128 / 8 / (989e12 * 0.35), rel=1e-12)
    seeds = build_seeds(cat, H100, "Llama-3.1-70B", tp=8, dtype="fp8")
    assert (seeds.g_s, seeds.prefill_a_s, seeds.prefill_b_s) == (0.0, 0.0, 0.0)


def test_busy_power_rule_closed_form(h100_8b):
    # weights only (n = 0): 0.60 x 700 W; a KV scan as long as W: (420 W x W + 700 W x W) / 2W = 560 W
    assert busy_power_per_gpu_w(h100_8b, 0, 4096) == pytest.approx(0.60 * 700)
    n = 8
    ctx = (h100_8b.W_s - h100_8b.g_s * n) / (h100_8b.H_s / 8192 * n)
    assert busy_power_per_gpu_w(h100_8b, n, ctx) == pytest.approx(560.0, rel=1e-9)
    # the power curve is the same rule at the calibration context: P(n) = 420 + 280 x (t - W) / t
    for n in (1, 7, 64, 500):
        t = decode_s(h100_8b, n, 8192)
        assert h100_8b.power.power_w(n) == pytest.approx(420 + 280 * (t - h100_8b.W_s) / t, rel=1e-9)
    # an empty replica (no iteration) draws the measured idle fraction
    assert h100_8b.activity_power.iteration_power_w(0.0, 0.0, 0.0) == pytest.approx(0.10 * 700)


# --- Orderings physics demands -----------------------------------------------------------------------

ORDER_CTX = [1024, 4096, 16384, 65536, 131072]
ORDER_MODELS = [("Llama-3.1-8B", 1), ("Llama-3.1-70B", 8), ("Qwen3-32B", 2), ("Qwen3-235B-A22B", 8),
                ("Qwen3-30B-A3B", 1)]


def throughput_tok_s(profile: ComputedProfile, ctx: int) -> float:
    """n / t at n = n_slots(ctx), every sequence at the window (0 when nothing fits)."""
    n = profile.n_slots(ctx)
    return n / decode_s(profile, n, ctx) if n else 0.0


@pytest.mark.parametrize("model,tp", ORDER_MODELS)
@pytest.mark.parametrize("dtype", ["fp16", "fp8", "int4"])
def test_more_memory_never_gives_fewer_slots(cat, model, tp, dtype):
    h100, h200 = build(cat, H100, model, tp=tp, dtype=dtype), build(cat, H200, model, tp=tp, dtype=dtype)
    for ctx in ORDER_CTX:
        assert h200.n_slots(ctx) >= h100.n_slots(ctx), ctx


@pytest.mark.parametrize("model,tp", ORDER_MODELS)
@pytest.mark.parametrize("gpu", [H100, H200, B200, "A100-SXM-80GB"])
def test_quantisation_never_gives_fewer_slots_or_less_throughput(cat, model, tp, gpu):
    fp16 = build(cat, gpu, model, tp=tp)
    low = [build(cat, gpu, model, tp=tp, dtype="int4")]
    if cat.hardware[gpu].fp8_dense_tflops is not None:
        low.append(build(cat, gpu, model, tp=tp, dtype="fp8"))
    for q in low:
        for ctx in ORDER_CTX:
            assert q.n_slots(ctx) >= fp16.n_slots(ctx), (q.name, ctx)
            assert throughput_tok_s(q, ctx) >= throughput_tok_s(fp16, ctx), (q.name, ctx)


def test_the_ridge_cap_defect_is_gone_for_70b_at_4k(cat):
    # Seeds' ridge cap: H200 floor(989e12 x 2 / (2 x 4.8e12 x 0.8)) = 257 < H100's KV limit 353, int4 92.
    # KV limit on H100: 59,259,942,912 B // 655,360 B per block = 90,423 blocks // 256 per 4K sequence = 353.
    seeds = {(g, d): build_seeds(cat, g, "Llama-3.1-70B", tp=8, dtype=d).n_slots(4096)
             for g in (H100, H200) for d in ("fp16", "int4")}
    assert seeds == {(H100, "fp16"): 353, (H200, "fp16"): 257, (H100, "int4"): 92, (H200, "int4"): 64}
    h100 = build(cat, H100, "Llama-3.1-70B", tp=8)
    assert h100.n_slots(4096) == 90_423 // 256 == 353
    assert build(cat, H200, "Llama-3.1-70B", tp=8).n_slots(4096) > 353
    assert build(cat, H100, "Llama-3.1-70B", tp=8, dtype="int4").n_slots(4096) > 353
    # and an iteration at n = 92 is memory-bound: g n < W + h n L
    n = 92
    assert h100.g_s * n < h100.W_s + h100.H_s / 8192 * n * 4096


def test_moe_name_says_which_weight_method_applies(cat):
    assert build(cat, H100, "Qwen3-30B-A3B").name.endswith("/moe-active-params")
    assert build(cat, H100, "Qwen3-30B-A3B", moe_w="layer-table",
                 moe_table=cat.moe_latency_table).name.endswith("/moe-layer-table")
    dense = build(cat, H100, "Llama-3.1-8B", moe_w="layer-table")  # ignored for a dense model
    assert dense.moe_w == "dense" and "moe" not in dense.name
