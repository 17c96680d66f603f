"""``gpus[].moe_w``: the MoE weight-streaming assumption is a per-option instance setting, named in the profile."""

from __future__ import annotations

import pytest

from fleetopt.optimizer import api
from fleetopt.optimizer.errors import InstanceError

BASE = {"name": "moe", "workload": {"cdf": "builtin:azure", "arrival_rate": 10},
        "slo": {"ttft_p99_ms": 2000}, "pools": {"max_pools": 1, "max_context": 8192}}


def _gpu(**kw):
    return {"name": "h100x8", "hardware": "H100-SXM-80GB", "tp": 8, "dtype": "fp8", **kw}


def test_layer_table_streams_more_weights_than_active_params():
    """DeepSeek-V3 (fp8, TP 8, on H200s: its fp8 weights do not fit eight H100s beside a KV cache): the layer table
    streams every expert a batch touches, the active-params default only the routed ones, so its W is larger
    (the issue measured 1.93 ms against 43.47 ms on H100)."""
    h200 = {"hardware": "H200-SXM"}
    active = api.load({**BASE, "gpus": [_gpu(model="DeepSeek-V3", **h200)]}).gpus[0].profile
    table = api.load({**BASE, "gpus": [_gpu(model="DeepSeek-V3", moe_w="layer-table", **h200)]}).gpus[0].profile
    assert active.moe_w == "active-params" and table.moe_w == "layer-table"
    assert "moe-layer-table" in table.name and "moe-active-params" in active.name
    assert table.W_s > 5 * active.W_s


def test_layer_table_on_a_dense_model_is_one_line():
    with pytest.raises(InstanceError) as info:
        api.load({**BASE, "gpus": [_gpu(model="Llama-3.1-70B", moe_w="layer-table")]})
    assert any("gpus[0].moe_w" in line and "dense" in line for line in info.value.problems)


def test_an_unknown_moe_w_is_rejected():
    with pytest.raises(InstanceError) as info:
        api.load({**BASE, "gpus": [_gpu(model="DeepSeek-V3", moe_w="experts")]})
    assert any("gpus[0].moe_w" in line for line in info.value.problems)
