"""A model architecture read from a Hugging Face ``config.json`` on disk.

:func:`model_config_problems` turns the ``config.json`` of a decoder-only transformer (Llama, Mistral, Qwen2/3,
Qwen3-MoE, Mixtral, DeepSeek-V2/V3 and their relatives) into the same
:class:`~fleetopt.models.hardware.ModelSpec` the catalogue builds from ``data/catalog/models.yaml``
(:func:`fleetopt.optimizer.io.catalog.load_catalog`), so an instance can plan for a model the catalogue does not
list: ``gpus: [{name: x, hardware: H100-SXM-80GB, model_config: path/to/config.json, tp: 1}]``.

Keys read (Hugging Face names; defaults are the ``transformers`` defaults):

=============================  =======================================================================
ModelSpec field                config.json key(s)
=============================  =======================================================================
layers                         ``num_hidden_layers``
hidden_size                    ``hidden_size``
attention_heads                ``num_attention_heads``
kv_heads                       ``num_key_value_heads`` (default: ``num_attention_heads``)
head_dim                       ``head_dim`` (default: ``hidden_size / num_attention_heads``)
intermediate_size              ``intermediate_size`` (dense FFN width; needed only when a layer is dense)
vocab_size                     ``vocab_size``
max_position_embeddings        ``max_position_embeddings``
tied_embeddings                ``tie_word_embeddings`` (default false)
moe.routed_experts             ``num_experts`` | ``n_routed_experts`` | ``num_local_experts``
moe.experts_per_token          ``num_experts_per_tok``
moe.shared_experts             ``n_shared_experts`` (1 when ``shared_expert_intermediate_size`` is given)
moe.expert_intermediate_size   ``moe_intermediate_size`` (default: ``intermediate_size``, Mixtral's layout)
MoE layers                     ``first_k_dense_replace`` + ``moe_layer_freq`` (DeepSeek),
                               ``decoder_sparse_step`` + ``mlp_only_layers`` (Qwen-MoE)
attention = "MLA"              ``kv_lora_rank`` with ``qk_rope_head_dim``, ``qk_nope_head_dim``,
                               ``v_head_dim``, ``q_lora_rank`` (null: no query compression)
=============================  =======================================================================

``params``, ``active_params`` and ``kv_bytes_per_token_fp16`` are derived from the shape by
:func:`parameter_counts` and :func:`kv_bytes_per_token_fp16` under the catalogue's conventions
(``data/catalog/README.md``, section ``models.yaml``): every weight matrix, the embedding, an untied LM head,
routers and norms; DeepSeek's multi-token-prediction module and its router score-correction bias are left out.
For the seven catalogue models the counts equal ``params_computed`` / ``active_params_computed`` exactly
(``tests/test_hf_config.py``); the model-card figures are those counts rounded (8.0B, 30.5B / 3.3B active,
671B / 37B active). Every problem is one line naming the key; nothing is guessed.
"""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict
from pathlib import Path

from fleetopt.models.hardware import ModelSpec, MoESpec

from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.io.files import json_position, read_text

__all__ = ["ModelShape", "model_config_problems", "read_model_config", "model_spec_from_config",
           "parameter_counts", "kv_bytes_per_token_fp16", "QK_NORM_MODEL_TYPES", "QKV_BIAS_MODEL_TYPES"]

QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})
"""``model_type`` values whose attention normalises q and k per head (RMSNorm weights of ``head_dim`` each);
config.json has no key for it (Qwen3 technical report, arXiv:2505.09388, section 2)."""

QKV_BIAS_MODEL_TYPES = frozenset({"qwen2", "qwen2_moe"})
"""``model_type`` values with a bias on the q, k and v projections (Qwen2; config.json has no key for it)."""

_BYTES_FP16 = 2


@dataclass(frozen=True)
class ModelShape:
    """The architecture figures of one config.json, as counted by :func:`parameter_counts`.

    Sizes are element counts; ``moe_layers`` of the ``layers`` have routed experts, the rest a dense FFN of
    ``intermediate_size``. ``kv_lora_rank`` is 0 for GQA/MHA attention; ``q_lora_rank`` 0 means queries are
    projected directly. ``shared_intermediate_size`` is the width of each shared expert.
    """

    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool = False
    moe_layers: int = 0
    routed_experts: int = 0
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0


def _attention_params(s: ModelShape) -> int:
    """Weights of one attention block (projections, their biases, q/k norms; MLA latent norms)."""
    D, H = s.hidden_size, s.attention_heads
    if s.is_mla:
        q_head = s.qk_nope_head_dim + s.qk_rope_head_dim
        q = (D * s.q_lora_rank + s.q_lora_rank + s.q_lora_rank * H * q_head) if s.q_lora_rank else D * H * q_head
        kv = D * (s.kv_lora_rank + s.qk_rope_head_dim) + s.kv_lora_rank \
            + s.kv_lora_rank * H * (s.qk_nope_head_dim + s.v_head_dim)
        return q + kv + H * s.v_head_dim * D
    d, G = s.head_dim, s.kv_heads
    params = D * H * d + 2 * D * G * d + H * d * D
    if s.qkv_bias:
        params += H * d + 2 * G * d
    if s.o_bias:
        params += D
    if s.qk_norm:
        params += 2 * d
    return params


def parameter_counts(s: ModelShape) -> tuple[int, int]:
    """Total and active (per-token) parameters of a decoder-only transformer, exact integers.

    .. math::

        P = \\ell (A + 2D) + \\ell_d \\, 3 D F + \\ell_m \\left[(E + S) \\, 3 D F_e + E D\\right]
            + (2 - [\\text{tied}]) V D + D

    and :math:`P_a` the same with :math:`E` replaced by :math:`k` in the expert term (the router's
    :math:`E D` is counted whole: every token scores every expert). :math:`\\ell` layers, of which
    :math:`\\ell_d` dense and :math:`\\ell_m` MoE; :math:`A` the attention block (GQA:
    :math:`2 D h_q d + 2 D h_{kv} d` plus q/k norms :math:`2d` where the model has them; MLA (DeepSeek-V2/V3):
    :math:`D r_q + r_q + r_q h_q (d_n + d_r) + D (r_{kv} + d_r) + r_{kv} + r_{kv} h_q (d_n + d_v) + h_q d_v D`);
    :math:`2D` the two RMSNorms of a layer; gated FFNs (gate, up, down: :math:`3 D F`); :math:`E` routed and
    :math:`S` shared experts of width :math:`F_e`, :math:`k` routed per token; :math:`V D` the embedding and
    the LM head unless tied; :math:`D` the final norm. Biases where the config asks for them
    (``attention_bias``: q, k, v and o; Qwen2: q, k and v; ``mlp_bias``: :math:`2F + D` per dense FFN).

    The catalogue's conventions (``data/catalog/README.md``): DeepSeek-V3's multi-token-prediction module
    (``num_nextn_predict_layers``, ~14B) and its router score-correction bias (:math:`E` per MoE layer,
    14,848 in all) are not counted.

    Examples
    --------
    Llama-3.1-8B (models.yaml ``params_computed`` 8,030,261,248):

    >>> parameter_counts(ModelShape(32, 4096, 32, 8, 128, 14336, 128256))
    (8030261248, 8030261248)
    """
    attn_norms = _attention_params(s) + 2 * s.hidden_size
    dense_layers = s.layers - s.moe_layers
    dense_ffn = 3 * s.hidden_size * s.intermediate_size + (2 * s.intermediate_size + s.hidden_size if s.mlp_bias else 0)
    expert = 3 * s.hidden_size * s.expert_intermediate_size
    shared = s.shared_experts * 3 * s.hidden_size * (s.shared_intermediate_size or s.expert_intermediate_size)
    shared += s.hidden_size if s.shared_expert_gate else 0
    router = s.routed_experts * s.hidden_size
    embeddings = (1 if s.tied_embeddings else 2) * s.vocab_size * s.hidden_size + s.hidden_size
    common = s.layers * attn_norms + dense_layers * dense_ffn + embeddings
    total = common + s.moe_layers * (s.routed_experts * expert + shared + router)
    active = common + s.moe_layers * (s.experts_per_token * expert + shared + router)
    return total, active


def kv_bytes_per_token_fp16(s: ModelShape) -> int:
    """KV-cache bytes one token occupies at 16 bit, whole model.

    .. math::

        k_{16} = \\begin{cases} 2 \\cdot \\ell \\, h_{kv} \\, d \\cdot 2 & \\text{GQA/MHA (K and V per KV head)} \\\\
                                \\ell \\, (r_{kv} + d_r) \\cdot 2 & \\text{MLA (latent + RoPE key, DeepSeek-V2/V3)}
                 \\end{cases}

    the catalogue's ``kv_bytes_per_token_fp16`` (``data/catalog/README.md``): Llama-3.1-8B 131,072 B,
    DeepSeek-V3 61 x 576 x 2 = 70,272 B.

    >>> kv_bytes_per_token_fp16(ModelShape(32, 4096, 32, 8, 128, 14336, 128256))
    131072
    """
    if s.is_mla:
        return s.layers * (s.kv_lora_rank + s.qk_rope_head_dim) * _BYTES_FP16
    return 2 * s.layers * s.kv_heads * s.head_dim * _BYTES_FP16


_MAX_SIZE = 1 << 31
"""Largest size a config.json key may give (layers, widths, heads, vocabulary, experts)."""


class _Reader:
    """Typed look-ups in one config mapping; every problem is one ``key: message`` line."""

    def __init__(self, config: Mapping) -> None:
        self.config = config
        self.lines: list[str] = []

    def int(self, *keys: str, default: builtins.int | None = None, minimum: builtins.int = 1,
            required: bool = True) -> builtins.int | None:
        """The first of ``keys`` present, as a whole number >= ``minimum``; ``default`` when none is present.
        None only after a problem line is recorded, or when ``default`` is None and not ``required``."""
        key = next((k for k in keys if k in self.config and self.config[k] is not None), None)
        if key is None:
            if default is None and required:
                names = " or ".join(keys)
                self.lines.append(f"{keys[0]}: missing; config.json must give {names} (a whole number)")
            return default
        value = self.config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
            self.lines.append(f"{key}: {value!r} is not a whole number; give an integer >= {minimum}")
            return None
        if value < minimum:
            self.lines.append(f"{key}: {value!r} is out of range; must be >= {minimum}")
            return None
        if value > _MAX_SIZE:               # no model dimension comes near; beyond it products overflow floats
            self.lines.append(f"{key}: {value!r} is out of range; must be <= {_MAX_SIZE:,}")
            return None
        return int(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.lines.append(f"{key}: {value!r} is not a boolean; give true or false")
            return default
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.config.get(key) or []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            self.lines.append(f"{key}: {value!r} is not a list of layer indices; give a list of integers")
            return []
        return value


class _MoEFields(TypedDict, total=False):
    """The MoE keywords of :class:`ModelShape` (none for a dense model)."""
    routed_experts: int
    experts_per_token: int
    shared_experts: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    shared_expert_gate: bool


class _MLAFields(TypedDict, total=False):
    """The multi-head latent attention keywords of :class:`ModelShape` (none for GQA)."""
    kv_lora_rank: int
    q_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def _moe_layer_count(r: _Reader, layers: int) -> int:
    """Layers with routed experts: DeepSeek's ``first_k_dense_replace``/``moe_layer_freq`` or Qwen-MoE's
    ``decoder_sparse_step``/``mlp_only_layers`` (``transformers`` modelling code: layer i is MoE when
    ``i >= first_k_dense_replace and i % moe_layer_freq == 0``, resp. ``i not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0``)."""
    first_dense = r.int("first_k_dense_replace", default=0, minimum=0)
    freq = r.int("moe_layer_freq", default=1)
    step = r.int("decoder_sparse_step", default=1)
    dense_only = set(r.int_list("mlp_only_layers"))
    if first_dense is None or freq is None or step is None:
        return 0
    if first_dense > layers:
        r.lines.append(f"first_k_dense_replace: {first_dense} is more than the {layers} layers (num_hidden_layers)")
    return sum(1 for i in range(layers)
               if i >= first_dense and i % freq == 0 and i not in dense_only and (i + 1) % step == 0)


def model_spec_from_config(config: Mapping, name: str, source: str = "") -> tuple[ModelSpec | None, list[str]]:
    """The :class:`ModelSpec` of a parsed ``config.json`` mapping, or None and ``key: problem`` lines."""
    if not isinstance(config, Mapping):
        return None, ["the top level must be a JSON object (a Hugging Face config.json)"]
    if isinstance(config.get("text_config"), Mapping) and "num_hidden_layers" not in config:
        return None, ["text_config: a multimodal config; give the language model's own config.json "
                      "(the text_config block saved as a file)"]
    r = _Reader(config)
    layers = r.int("num_hidden_layers", "n_layer")
    hidden = r.int("hidden_size", "n_embd")
    heads = r.int("num_attention_heads", "n_head")
    vocab = r.int("vocab_size")
    max_pos = r.int("max_position_embeddings", "n_positions")
    kv_heads = r.int("num_key_value_heads", default=heads) if heads is not None else 0
    head_dim = r.int("head_dim", default=0, required=False)
    tied = r.bool("tie_word_embeddings", False)
    experts = r.int("num_experts", "n_routed_experts", "num_local_experts", default=0, minimum=0)
    kv_lora = r.int("kv_lora_rank", default=0, minimum=0)
    model_type = str(config.get("model_type", "")).lower()
    if (layers is None or hidden is None or heads is None or vocab is None or max_pos is None or kv_heads is None
            or head_dim is None or experts is None or kv_lora is None):
        return None, r.lines
    if not head_dim:
        if hidden % heads:
            r.lines.append(f"head_dim: missing, and hidden_size {hidden} is not a multiple of "
                           f"num_attention_heads {heads}; give head_dim")
        head_dim = hidden // heads
    if heads % kv_heads:
        r.lines.append(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads {heads}")
    moe_layers = _moe_layer_count(r, layers) if experts else 0
    moe: _MoEFields = {}
    if experts:
        per_token = r.int("num_experts_per_tok")
        shared = r.int("n_shared_experts", default=0, minimum=0)
        shared_width = r.int("shared_expert_intermediate_size", default=0, minimum=0)
        width = r.int("moe_intermediate_size", "intermediate_size")
        if per_token is not None and per_token > experts:
            r.lines.append(f"num_experts_per_tok: {per_token} is more than the {experts} routed experts")
        moe = _MoEFields(routed_experts=experts, experts_per_token=per_token or 0,
                   shared_experts=(shared or 0) or (1 if shared_width else 0),
                   expert_intermediate_size=width or 0, shared_intermediate_size=shared_width or 0,
                   shared_expert_gate=bool(shared_width))
    ffn = r.int("intermediate_size", required=moe_layers < layers,
                default=None if moe_layers < layers else moe.get("expert_intermediate_size", 0))
    mla_dims: tuple[int | None, ...] = ()
    if kv_lora:
        mla_dims = (r.int("q_lora_rank", default=0, minimum=0), r.int("qk_nope_head_dim"),
                    r.int("qk_rope_head_dim"), r.int("v_head_dim"))
    if r.lines:
        return None, r.lines
    # r.int gives None only after recording a line (ffn's default is None exactly when it is required)
    assert ffn is not None and None not in mla_dims
    mla: _MLAFields = {}
    if mla_dims:
        q_lora, qk_nope, qk_rope, v_dim = (d or 0 for d in mla_dims)
        mla = _MLAFields(kv_lora_rank=kv_lora, q_lora_rank=q_lora, qk_nope_head_dim=qk_nope,
                         qk_rope_head_dim=qk_rope, v_head_dim=v_dim)
    attention_bias = r.bool("attention_bias", False)
    shape = ModelShape(layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied, moe_layers=moe_layers,
                       qk_norm=model_type in QK_NORM_MODEL_TYPES,
                       qkv_bias=attention_bias or model_type in QKV_BIAS_MODEL_TYPES, o_bias=attention_bias,
                       mlp_bias=r.bool("mlp_bias", False),
                       **moe, **mla)
    if r.lines:
        return None, r.lines
    params, active = parameter_counts(shape)
    notes = (f"architecture from {source or 'a config.json'}; parameters counted from the shape "
             f"({params:,} total, {active:,} active)",)
    spec = ModelSpec(
        name=name, family="moe" if experts else "dense", layers=layers, hidden_size=hidden,
        attention_heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate_size=ffn, vocab_size=vocab,
        max_position_embeddings=max_pos, params=params, active_params=active,
        kv_bytes_per_token_fp16=kv_bytes_per_token_fp16(shape),
        moe=MoESpec(experts, moe.get("experts_per_token", 0), moe.get("shared_experts", 0),
                    moe.get("expert_intermediate_size", 0)) if experts else None,
        attention="MLA" if kv_lora else "GQA", notes=notes, tied_embeddings=tied)
    return spec, []


def _default_name(path: Path, config: Mapping) -> str:
    """``_name_or_path`` when config.json records it (``transformers`` writes it), else the folder's name."""
    recorded = config.get("_name_or_path") if isinstance(config, Mapping) else None
    if isinstance(recorded, str) and recorded.strip() and not recorded.startswith(("/", ".")):
        return recorded.strip()
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


def model_config_problems(path: str | Path, name: str | None = None) -> tuple[ModelSpec | None, list[str]]:
    """The model in the config.json at ``path``, or None and ``key: problem`` lines (the file not named)."""
    path = Path(path)
    text, reason = read_text(path)
    if text is None:            # read_text gives the reason exactly when it gives no text
        return None, [f"cannot read: {reason}" + (" (give the path of config.json)" if path.is_dir() else "")]
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        return None, [f"not JSON ({json_position(err)})"]
    if not isinstance(config, dict):
        return None, ["the top level must be a JSON object (a Hugging Face config.json)"]
    return model_spec_from_config(config, name or _default_name(path, config), str(path))


def read_model_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """:func:`model_config_problems` that raises :class:`InstanceError` (one ``FILE: key: problem`` line each)."""
    spec, lines = model_config_problems(path, name)
    if spec is None:
        raise InstanceError([format_problem(path, "", line) for line in lines])
    return spec
