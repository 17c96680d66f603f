"""Issue 12, item 8: GPU options serving different models need ``allow_mixed_models: true``.

Without it such an instance is invalid input (one line naming the file, the field ``gpus`` and the models,
exit 2); with it the reports say which model each pool serves. A profile that names no model is not blocked,
and validation says so.
"""

from __future__ import annotations

import csv
import json

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import EXIT_CODES, InstanceError
from fleetopt.models.profiles import served_model
from fleetopt.optimizer.io.instance import instance_from_dict


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _without_opt_in(repo_root, tmp_path, name="ref_puzzle6_lmsys_mixed.yaml"):
    data = yaml.safe_load((repo_root / "instances" / name).read_text())
    assert data.pop("allow_mixed_models") is True
    data["workload"]["cdf"] = str(repo_root / "data" / "workloads" / "lmsys_cdf.json")
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_mixed_models_without_opt_in_are_rejected(repo_root, tmp_path):
    """``ref_puzzle6_lmsys_mixed`` as it was (a 7B-class A10G next to 70B-class units) printed "saves 53.3 %"."""
    path = _without_opt_in(repo_root, tmp_path)
    for command in (["validate", path], ["solve", path], ["evaluate", path, "--fleet", "0-65536:a10g"]):
        res = run(*command)
        assert res.exit_code == EXIT_CODES["invalid_input"] == 2, res.output
        (line,) = res.output.strip().splitlines()
        assert line.startswith(f"error: {path}: gpus: ") and "Traceback" not in res.output
        assert "7B-class model (a10g)" in line and "Llama-3-70B-class (a100, h100)" in line
        assert "allow_mixed_models: true" in line


def test_opt_in_loads_and_is_said(repo_root):
    inst = api.load(repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml")
    assert inst.allow_mixed_models
    warnings = api.summarize_instance(inst)["warnings"]
    assert any("allow_mixed_models" in w and "7B-class model: a10g" in w for w in warnings)


def test_every_bundled_instance_validates(repo_root):
    for path in sorted((repo_root / "instances").glob("*.yaml")):
        inst = api.load(path)
        models = {served_model(g.profile.model_name) for g in inst.gpus} - {None}
        assert len(models) == 1 or inst.allow_mixed_models, path.name


def test_one_model_needs_no_opt_in(repo_root):
    """Labels are compared without their serving details: the fitted Llama-3.1-8B (bf16, TP=1) profile and a
    computed Llama-3.1-8B option serve one model."""
    data = {"workload": {"cdf": "builtin:azure", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500},
            "gpus": [{"name": "fitted", "profile_file": "../data/profiles/h100_llama31_8b.yaml"},
                     {"name": "l40s", "hardware": "L40S", "model": "Llama-3.1-8B"}],
            "pools": {"max_pools": 2, "max_context": 8192}}
    inst = instance_from_dict(data, repo_root / "instances" / "one_model.yaml")
    assert {served_model(g.profile.model_name) for g in inst.gpus} == {"Llama-3.1-8B"}
    with pytest.raises(InstanceError, match="2 different models: Llama-3.1-8B .fitted, l40s.; Llama-3.1-70B .h70."):
        instance_from_dict({**data, "gpus": data["gpus"] + [{"name": "h70", "hardware": "H100-SXM-80GB",
                                                             "model": "Llama-3.1-70B", "tp": 8}]},
                           repo_root / "instances" / "one_model.yaml")


def test_a_profile_without_a_model_is_not_blocked_but_named(repo_root, tmp_path):
    text = (repo_root / "data" / "profiles" / "h100_llama31_8b.yaml").read_text()
    lines = [line for line in text.splitlines() if not line.startswith(("model_name:", "model:"))]
    (tmp_path / "anon.yaml").write_text("\n".join(lines) + "\n")
    data = {"workload": {"cdf": "builtin:azure", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500},
            "gpus": [{"name": "anon", "profile_file": "anon.yaml"}, {"name": "h100", "profile": "H100-80GB"}],
            "pools": {"max_pools": 2, "max_context": 8192}}
    inst = instance_from_dict(data, tmp_path / "inst.yaml")
    assert inst.gpu("anon").profile.model_name == "unspecified"
    warnings = api.summarize_instance(inst)["warnings"]
    assert any(w.startswith("gpus[0] anon:") and "names no model" in w for w in warnings)


def test_reports_say_which_model_each_pool_serves(repo_root):
    path = repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml"
    doc = json.loads(run("solve", path, "--json", "-").stdout)
    models = {p["gpu"]: p["model"] for p in doc["pools"]}
    assert models["a10g"].startswith("7B-class") and all(
        m.startswith("Llama-3-70B-class") for g, m in models.items() if g != "a10g")
    text = run("solve", path, "--format", "csv").output
    block = text.split("\n\n")[0]                 # the first table: plan 1
    head, *rows = csv.reader([line for line in block.splitlines() if line and not line.startswith("#")])
    assert "model" in head
    cells = [dict(zip(head, r)) for r in rows if r[0] != "fleet"]
    assert [c["model"] for c in cells] == [served_model(p["model"]) for p in doc["pools"]]
