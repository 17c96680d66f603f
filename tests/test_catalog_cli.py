"""``fleetopt catalog list``: every catalogue name is discoverable, with units and provenance.

Independent facts: the names and figures in ``data/catalog/*.yaml`` (read here with yaml) and the datasheet /
README values quoted below.
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.io.catalog import data_dir


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _yaml(name):
    return yaml.safe_load((data_dir() / "catalog" / name).read_text())


def test_json_lists_every_name_of_every_kind(tmp_path):
    out = tmp_path / "c.json"
    res = run("catalog", "list", "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["kinds"] == ["hardware", "models", "profiles"]
    assert [h["name"] for h in data["hardware"]] == list(_yaml("hardware.yaml")["gpus"])
    assert [m["name"] for m in data["models"]] == list(_yaml("models.yaml")["models"])
    assert [p["name"] for p in data["profiles"]] == list(_yaml("calibrated_profiles.yaml")["profiles"])
    for kind in data["kinds"]:
        assert data["units"][kind] and all(row["source"] for row in data[kind])


def test_figures_and_provenance(tmp_path):
    res = run("catalog", "list", "--json", "-")
    data = json.loads(res.stdout)
    h100 = next(h for h in data["hardware"] if h["name"] == "H100-SXM-80GB")
    # NVIDIA H100 SXM datasheet: 3.35 TB/s, 989 dense FP16 TFLOPS, 700 W; 80 GiB (README capacity convention)
    assert (h100["memory_bytes"], h100["memory_bandwidth_bytes_per_s"], h100["fp16_dense_tflops"], h100["tdp_w"]) \
        == (80 * 2**30, 3.35e12, 989.0, 700.0)
    assert h100["power_quality"] == "measured" and "h100" in h100["aliases"]
    ds = next(m for m in data["models"] if m["name"] == "DeepSeek-V3")
    assert (ds["hf_id"], ds["attention"], ds["kv_bytes_per_token_fp16"]) == ("deepseek-ai/DeepSeek-V3", "MLA",
                                                                             61 * 576 * 2)
    b200 = next(p for p in data["profiles"] if p["name"] == "B200-projected")
    assert b200["latency_quality"] == "projected" and b200["cost_usd_per_hr"] == 8.0  # per-GPU equivalent of $64/node
    assert data["units"]["hardware"]["tdp_w"] == "W"


@pytest.mark.parametrize("kind", ["hardware", "models", "profiles"])
def test_kind_filter(kind):
    res = run("catalog", "list", "--kind", kind, "--json", "-")
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert data["kinds"] == [kind]
    assert set(data) == {"schema_version", "command", "instance", "kinds", "files", "units", kind}


def test_table_names_every_model_and_bad_kind_exits_2():
    res = run("catalog", "list", "--format", "plain")
    assert res.exit_code == 0
    for name in _yaml("models.yaml")["models"]:
        assert name in res.stdout
    res = run("catalog", "list", "--kind", "gpus")
    assert res.exit_code == 2 and "Invalid value for '--kind'" in res.output
