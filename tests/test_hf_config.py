"""Models from a Hugging Face config.json: the catalogue's conventions, computed profiles and one-line errors.

The three config.json files below are the published ones (huggingface.co, files ``config.json`` of
meta-llama/Llama-3.1-8B, Qwen/Qwen3-30B-A3B and deepseek-ai/DeepSeek-V3), trimmed to the keys that describe the
architecture plus a few that fleetopt must ignore (rope scaling, dtypes, quantisation). The independent facts they
are checked against: ``data/catalog/models.yaml`` (architecture figures and parameter counts counted by hand, KV
bytes per token) and the model cards' rounded parameter counts.

Tolerance: a config.json yields the catalogue's architecture field for field and the same parameter counts to the
parameter, so its computed profile equals the catalogue entry's to floating-point round-off (relative 1e-12 on
W, h, g, a, b; slot counts equal).
"""

from __future__ import annotations

import json
import math

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.models.roofline import computed_profile
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.catalog import data_dir, load_catalog
from fleetopt.optimizer.io.hf_config import model_config_problems, read_model_config
from fleetopt.optimizer.io.instance import load_instance

LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "decoder_sparse_step": 1, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "v_head_dim": 128, "vocab_size": 129280,
}

# (catalogue name, config, hardware, tp, dtype, model card: total params B, active params B)
CASES = [
    ("Llama-3.1-8B", LLAMA_31_8B, "H100-SXM-80GB", 1, "bf16", 8.0, 8.0),
    ("Qwen3-30B-A3B", QWEN3_30B_A3B, "H100-SXM-80GB", 2, "fp16", 30.5, 3.3),
    ("DeepSeek-V3", DEEPSEEK_V3, "H200-SXM", 8, "fp8", 671.0, 37.0),
]
CONTEXTS = (2048, 8192, 32768)
ARCH_FIELDS = ("family", "layers", "hidden_size", "attention_heads", "kv_heads", "head_dim", "intermediate_size",
               "vocab_size", "max_position_embeddings", "kv_bytes_per_token_fp16", "moe", "attention",
               "tied_embeddings")


def _write(folder, config, name="config.json"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


def _models_yaml():
    return yaml.safe_load((data_dir() / "catalog" / "models.yaml").read_text())["models"]


@pytest.mark.parametrize("name,config,hardware,tp,dtype,card_b,card_active_b", CASES, ids=[c[0] for c in CASES])
def test_config_json_gives_the_catalogue_architecture_and_counts(tmp_path, name, config, hardware, tp, dtype,
                                                                  card_b, card_active_b):
    spec = read_model_config(_write(tmp_path / name, config))
    entry = _models_yaml()[name]
    catalogued = load_catalog().models[name]
    assert spec.name == name  # the folder's name when config.json records no _name_or_path
    for field in ARCH_FIELDS:
        assert getattr(spec, field) == getattr(catalogued, field), field
    # counted by hand in models.yaml (every matrix, embedding, untied LM head, routers, norms)
    assert (spec.params, spec.active_params) == (entry["params_computed"], entry["active_params_computed"])
    assert spec.kv_bytes_per_token_fp16 == entry.get("kv_bytes_per_token_fp16")
    # the model cards' rounded figures (DeepSeek-V3's 37B active rounds 37.55B down: within 2 %)
    assert spec.params / 1e9 == pytest.approx(card_b, rel=0.01)
    assert spec.active_params / 1e9 == pytest.approx(card_active_b, rel=0.02)


@pytest.mark.parametrize("name,config,hardware,tp,dtype,card_b,card_active_b", CASES, ids=[c[0] for c in CASES])
def test_config_json_profile_equals_the_catalogue_profile(tmp_path, name, config, hardware, tp, dtype, card_b,
                                                           card_active_b):
    catalog = load_catalog()
    spec = read_model_config(_write(tmp_path / name, config))
    gpu = catalog.hardware[hardware]
    mine = computed_profile(gpu, spec, tp=tp, dtype=dtype, defaults=catalog.defaults)
    ref = computed_profile(gpu, catalog.models[name], tp=tp, dtype=dtype, defaults=catalog.defaults)
    h, h_ref = mine.H_s / mine.calibration_ctx_tokens, ref.H_s / ref.calibration_ctx_tokens
    for got, want in ((mine.W_s, ref.W_s), (h, h_ref), (mine.g_s, ref.g_s), (mine.prefill_a_s, ref.prefill_a_s),
                      (mine.prefill_b_s, ref.prefill_b_s)):
        assert got == pytest.approx(want, rel=1e-12)
    assert [mine.n_slots(c) for c in CONTEXTS] == [ref.n_slots(c) for c in CONTEXTS]
    assert mine.n_slots(2048) >= 1  # the configurations hold sequences (the comparison is not 0 == 0)
    assert mine.name == ref.name


def test_llama_slots_by_hand(tmp_path):
    """Llama-3.1-8B bf16 on one H100-SXM: slots = floor((0.9 x 80 GiB - 2 x 8,030,261,248 B) / (131,072 x 16))
    // ceil(ctx / 16)."""
    spec = read_model_config(_write(tmp_path / "m", LLAMA_31_8B))
    catalog = load_catalog()
    p = computed_profile(catalog.hardware["H100-SXM-80GB"], spec, tp=1, dtype="bf16", defaults=catalog.defaults)
    blocks = math.floor(0.9 * 85899345920 - 2 * 8030261248) // (131072 * 16)
    assert [p.n_slots(c) for c in CONTEXTS] == [blocks // (c // 16) for c in CONTEXTS]


def test_tied_embeddings_count_the_table_once(tmp_path):
    untied = read_model_config(_write(tmp_path / "a", LLAMA_31_8B))
    tied = read_model_config(_write(tmp_path / "b", {**LLAMA_31_8B, "tie_word_embeddings": True}))
    assert untied.params - tied.params == 128256 * 4096
    assert tied.tied_embeddings and not untied.tied_embeddings


def test_recorded_name_wins_over_the_folder(tmp_path):
    spec = read_model_config(_write(tmp_path / "snapshot", {**LLAMA_31_8B, "_name_or_path": "meta-llama/Llama-3.1-8B"}))
    assert spec.name == "meta-llama/Llama-3.1-8B"


def _instance(tmp_path, gpu: str) -> str:
    path = tmp_path / "inst.yaml"
    path.write_text("name: byo\nworkload: {cdf: builtin:lmsys, arrival_rate: 10}\nslo: {ttft_p99_ms: 500}\n"
                    f"gpus:\n  - {gpu}\npools: {{max_pools: 1, max_context: 8192}}\n")
    return str(path)


def test_instance_with_model_config_uses_the_computed_profile(tmp_path):
    _write(tmp_path / "models" / "llama", LLAMA_31_8B)
    inst = load_instance(_instance(tmp_path, "{name: mine, hardware: H100-SXM-80GB, "
                                             "model_config: models/llama/config.json, tp: 1, dtype: bf16}"))
    catalog = load_catalog()
    ref = computed_profile(catalog.hardware["H100-SXM-80GB"], catalog.models["Llama-3.1-8B"], tp=1, dtype="bf16",
                           defaults=catalog.defaults)
    profile = inst.gpus[0].profile
    assert profile.W_s == pytest.approx(ref.W_s, rel=1e-12)
    assert profile.n_slots(8192) == ref.n_slots(8192)


@pytest.mark.parametrize("gpu,field,phrase", [
    ("{name: x, hardware: H100-SXM-80GB, model: Llama-3.1-8B, model_config: c.json}", "gpus[0]",
     "both model and model_config are given"),
    ("{name: x, model_config: c.json}", "gpus[0].hardware", "missing"),
    ("{name: x, profile: H100-80GB, model_config: c.json}", "gpus[0]", "both profile and hardware/model"),
    ("{name: x, hardware: H100-SXM-80GB, model_config: nothere.json}", "gpus[0].model_config",
     "'nothere.json' (resolved to"),
])
def test_instance_model_config_problems(tmp_path, gpu, field, phrase):
    with pytest.raises(InstanceError) as err:
        load_instance(_instance(tmp_path, gpu))
    line = err.value.problems[0]
    assert line.startswith(f"{tmp_path / 'inst.yaml'}: {field}: ") and phrase in line


BAD = [
    ("missing-key", {k: v for k, v in LLAMA_31_8B.items() if k != "num_hidden_layers"}, "num_hidden_layers",
     "missing"),
    ("zero-size", {**LLAMA_31_8B, "hidden_size": 0}, "hidden_size", "out of range; must be >= 1"),
    ("negative-size", {**LLAMA_31_8B, "vocab_size": -5}, "vocab_size", "out of range"),
    ("huge-size", {**LLAMA_31_8B, "hidden_size": 4.096e303}, "hidden_size", "must be <= 2,147,483,648"),
    ("fraction", {**LLAMA_31_8B, "intermediate_size": 14336.5}, "intermediate_size", "not a whole number"),
    ("bool", {**LLAMA_31_8B, "num_attention_heads": True}, "num_attention_heads", "not a whole number"),
    ("string", {**LLAMA_31_8B, "num_key_value_heads": "8"}, "num_key_value_heads", "not a whole number"),
    ("kv-not-dividing", {**LLAMA_31_8B, "num_key_value_heads": 7}, "num_key_value_heads", "does not divide"),
    ("moe-without-top-k", {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts_per_tok"},
     "num_experts_per_tok", "missing"),
    ("top-k-above-experts", {**QWEN3_30B_A3B, "num_experts_per_tok": 200}, "num_experts_per_tok", "more than"),
    ("mla-without-rope", {k: v for k, v in DEEPSEEK_V3.items() if k != "qk_rope_head_dim"}, "qk_rope_head_dim",
     "missing"),
    ("tie-not-bool", {**LLAMA_31_8B, "tie_word_embeddings": "no"}, "tie_word_embeddings", "not a boolean"),
]


@pytest.mark.parametrize("label,config,key,phrase", BAD, ids=[b[0] for b in BAD])
def test_malformed_config_one_line_naming_file_and_key(tmp_path, label, config, key, phrase):
    path = _write(tmp_path / label, config)
    with pytest.raises(InstanceError) as err:
        read_model_config(path)
    assert len(err.value.problems) == 1
    line = err.value.problems[0]
    assert line.startswith(f"{path}: {key}: ") and phrase in line and "\n" not in line


@pytest.mark.parametrize("text,phrase", [("{not json", "not JSON (line 1"), ("[1, 2]", "top level must be"),
                                         ("", "not JSON")])
def test_not_a_config(tmp_path, text, phrase):
    spec, lines = model_config_problems(_write(tmp_path / "x", text))
    assert spec is None and len(lines) == 1 and phrase in lines[0]


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    _write(tmp_path, {**LLAMA_31_8B, "hidden_size": -1})
    inst = _instance(tmp_path, "{name: mine, hardware: H100-SXM-80GB, model_config: config.json}")
    res = CliRunner().invoke(main, ["validate", inst])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == [f"error: {inst}: gpus[0].model_config: 'config.json' (resolved to {tmp_path / 'config.json'}): "
                     "hidden_size: -1 is out of range; must be >= 1"]
