"""``fleetopt whatif --resume`` never mixes records solved from other inputs.

A sweep is run to its end with ``--out``, an input it read is changed (the workload's CDF file, the instance's
catalogue file, a ``config.json`` that catalogue names), and the sweep is resumed on the same log: the result must
be a fresh run's on the new inputs, not the old records read back. The references are fresh runs without a log and
closed forms (a unit's price doubled doubles the cost of a fleet of that unit alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

RATE = "workload.arrival_rate"
SWEEP = f"{RATE}=20,60"

CDF_SHORT = [[64, 0.0], [256, 0.5], [1024, 0.9], [4096, 1.0]]
CDF_LONG = [[64, 0.0], [1024, 0.3], [4096, 0.7], [8192, 1.0]]

CDF_INSTANCE = """\
name: cdf-file
workload: {cdf: lengths.json, arrival_rate: 40}
slo: {ttft_p99_ms: 500, ttft_model: mean-prefill}
gpus:
  - {name: h100, profile: H100-80GB}
pools: {max_pools: 1, max_context: 8192}
objective: cost
"""

UNIT = {"name": "unit-8b", "provenance": "test figures", "model": "Llama-3.1-8B", "W": 0.0061, "H": 0.00043,
        "calibration_ctx": 8192, "chunk": 512, "blk_size": 16, "total_kv_blks": 29205, "max_slots": 57,
        "cost_per_hr": 4.0, "cost_basis": "per GPU",
        "power": {"idle_w": 420.0, "nominal_w": 700.0, "logistic_k": 0.69, "logistic_x0": 3.75}}
"""A calibrated unit in a user catalogue (the figures of instances/catalogs/catalog_example.yaml's H100 unit)."""

CATALOG_INSTANCE = """\
name: own-unit
catalog: units.yaml
workload: {cdf: builtin:azure, arrival_rate: 40}
slo: {ttft_p99_ms: 500, ttft_model: mean-prefill}
gpus:
  - {name: unit, profile: unit-8b}
pools: {max_pools: 1, max_context: 8192}
objective: cost
"""

CONFIG_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 128256,
}
"""Llama-3.1-8B's published config.json, the fields the reader uses."""

CONFIG_INSTANCE = """\
name: own-model
catalog: models.yaml
workload: {cdf: builtin:azure, arrival_rate: 40}
slo: {ttft_p99_ms: 500, ttft_model: mean-prefill}
gpus:
  - {name: h100, hardware: H100-SXM-80GB, model: my-8b, tp: 1, dtype: bf16}
pools: {max_pools: 1, max_context: 8192}
objective: cost
"""


def whatif(*args):
    res = CliRunner().invoke(main, ["whatif", *map(str, args), "--quiet", "--json", "-"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def log_keys(log: Path) -> list[str]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert "header" in lines[0]
    return [line["key"] for line in lines[1:]]


def test_changed_cdf_file_is_solved_again_not_read_back(tmp_path):
    inst = tmp_path / "inst.yaml"
    inst.write_text(CDF_INSTANCE)
    cdf = tmp_path / "lengths.json"
    cdf.write_text(json.dumps(CDF_SHORT))
    log = tmp_path / "sweep.jsonl"
    old, _ = whatif(inst, "--sweep", SWEEP, "--out", log)
    cdf.write_text(json.dumps(CDF_LONG))        # the workload changes between the run and the resume
    resumed, stderr = whatif(inst, "--sweep", SWEEP, "--out", log, "--resume")
    fresh, _ = whatif(inst, "--sweep", SWEEP)
    assert resumed == fresh
    # the new lengths cost more at every rate: nothing of the old run survived
    assert all(new["cost_per_year"] > before["cost_per_year"]
               for new, before in zip(resumed["scenarios"], old["scenarios"]))
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(cdf) in warnings[0] and "changed" in warnings[0]
    # the log was started anew: one header, the base and each scenario once
    assert sorted(log_keys(log)) == sorted(["base"] + [f"{RATE}={r}" for r in (20, 60)])
    # resumed again on unchanged inputs: every record read back, nothing said
    again, stderr = whatif(inst, "--sweep", SWEEP, "--out", log, "--resume")
    assert again == fresh and "warning" not in stderr


def test_changed_catalogue_price_is_solved_again(tmp_path):
    inst = tmp_path / "inst.yaml"
    inst.write_text(CATALOG_INSTANCE)
    catalog = tmp_path / "units.yaml"
    catalog.write_text(json.dumps({"profiles": [UNIT]}))
    log = tmp_path / "sweep.jsonl"
    old, _ = whatif(inst, "--sweep", SWEEP, "--out", log)
    catalog.write_text(json.dumps({"profiles": [{**UNIT, "cost_per_hr": 2 * UNIT["cost_per_hr"]}]}))
    resumed, stderr = whatif(inst, "--sweep", SWEEP, "--out", log, "--resume")
    assert resumed == whatif(inst, "--sweep", SWEEP)[0]
    # one GPU option: the same fleets at twice the unit price cost exactly twice as much
    for new, before in zip([resumed["base"], *resumed["scenarios"]], [old["base"], *old["scenarios"]]):
        assert new["fleet"] == before["fleet"]
        assert new["cost_per_year"] == pytest.approx(2 * before["cost_per_year"], rel=1e-12)
    assert str(catalog) in stderr


def test_changed_catalogue_flag_file_is_solved_again(tmp_path):
    inst = tmp_path / "inst.yaml"
    inst.write_text(CATALOG_INSTANCE.replace("catalog: units.yaml\n", ""))
    catalog = tmp_path / "flag_units.yaml"
    catalog.write_text(json.dumps({"profiles": [UNIT]}))
    log = tmp_path / "sweep.jsonl"
    old, _ = whatif(inst, "--sweep", SWEEP, "--out", log, "--catalog", catalog)
    catalog.write_text(json.dumps({"profiles": [{**UNIT, "cost_per_hr": 3 * UNIT["cost_per_hr"]}]}))
    resumed, stderr = whatif(inst, "--sweep", SWEEP, "--out", log, "--resume", "--catalog", catalog)
    assert resumed["base"]["cost_per_year"] == pytest.approx(3 * old["base"]["cost_per_year"], rel=1e-12)
    assert str(catalog) in stderr


def test_model_config_a_catalogue_names_is_checked_by_content(tmp_path):
    """A config.json named inside a catalogue file is not among the header's files; the record's digest of the
    resolved instance catches its change."""
    inst = tmp_path / "inst.yaml"
    inst.write_text(CONFIG_INSTANCE)
    (tmp_path / "models.yaml").write_text(json.dumps(
        {"models": [{"name": "my-8b", "config": "cfg/config.json", "provenance": "test"}]}))
    (tmp_path / "cfg").mkdir()
    config = tmp_path / "cfg" / "config.json"
    config.write_text(json.dumps(CONFIG_8B))
    log = tmp_path / "sweep.jsonl"
    old, _ = whatif(inst, "--sweep", SWEEP, "--out", log)
    config.write_text(json.dumps({**CONFIG_8B, "num_hidden_layers": 64}))   # twice the layers: slower replicas
    resumed, stderr = whatif(inst, "--sweep", SWEEP, "--out", log, "--resume")
    assert resumed == whatif(inst, "--sweep", SWEEP)[0]
    assert resumed["base"]["cost_per_year"] > old["base"]["cost_per_year"]
    assert "3 records were solved from other inputs" in stderr


def test_extended_sweep_reuses_the_records_it_has(tmp_path):
    inst = tmp_path / "inst.yaml"
    inst.write_text(CDF_INSTANCE)
    (tmp_path / "lengths.json").write_text(json.dumps(CDF_SHORT))
    log = tmp_path / "sweep.jsonl"
    whatif(inst, "--sweep", f"{RATE}=20,40", "--out", log)
    before = log.read_text()
    resumed, stderr = whatif(inst, "--sweep", f"{RATE}=20,40,60", "--out", log, "--resume")
    assert resumed == whatif(inst, "--sweep", f"{RATE}=20,40,60")[0]
    assert log.read_text().startswith(before) and "warning" not in stderr
    assert log_keys(log) == ["base", f"{RATE}=20", f"{RATE}=40", f"{RATE}=60"][:len(log_keys(log))]


def test_result_log_restarts_on_stale_keys_only(tmp_path):
    from fleetopt.optimizer.errors import InstanceError
    from fleetopt.optimizer.workflows.executor import ResultLog

    path = tmp_path / "log.jsonl"
    log, _ = ResultLog.open(path, {"run": 1, "inputs": {"a": "1"}})
    with log:
        log.append("k", {"value": 3})
    # only what the inputs held differs: the log starts anew, the old header kept for the caller's message
    log, done = ResultLog.open(path, {"run": 1, "inputs": {"a": "2"}}, resume=True, stale_keys=("inputs",))
    log.close()
    assert done == {} and log.stale_header == {"run": 1, "inputs": {"a": "1"}}
    assert path.read_text() == '{"header":{"run":1,"inputs":{"a":"2"}}}\n'
    # another run besides: refused, naming what is not an input
    with pytest.raises(InstanceError, match=r"differs in run\)"):
        ResultLog.open(path, {"run": 2, "inputs": {"a": "3"}}, resume=True, stale_keys=("inputs",))
