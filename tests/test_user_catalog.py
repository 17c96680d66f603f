"""The user's own catalogue: ``catalog:`` in an instance, ``--catalog FILE`` on the commands, ``catalog list``.

Independent facts: the shipped catalogue files (read here with yaml) and the closed-form identity "the same
figures give the same profile": a user entry that copies a shipped entry under another name must plan exactly
as the shipped one (a user-catalogue path that changed any figure would show here). Malformed files give one
line per problem naming the file and ``catalog.SECTION[i].FIELD``, exit 2, no traceback.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.catalog import (bundled_catalog, catalog_files, data_dir, instances_dir, load_catalog,
                                           user_catalog)
from fleetopt.optimizer.io.instance import instance_from_dict, load_instance
from tests.test_fuzz import mutated

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {"hardware": ("hardware.yaml", "gpus"), "models": ("models.yaml", "models"),
           "profiles": ("calibrated_profiles.yaml", "profiles")}

CONFIG_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "tie_word_embeddings": False, "vocab_size": 128256,
}
"""Llama-3.1-8B's published config.json (the fields the reader uses)."""


def _shipped(kind: str) -> dict:
    file, section = SHIPPED[kind]
    return yaml.safe_load((data_dir() / "catalog" / file).read_text())[section]


def _entry(kind: str, name: str, new_name: str | None = None, **extra) -> dict:
    """A shipped entry as a user entry (aliases dropped when renamed: they would collide)."""
    entry = copy.deepcopy(_shipped(kind)[name])
    if new_name is not None:
        entry.pop("aliases", None)
    return {"name": new_name or name, "provenance": f"copy of the shipped {name}", **entry, **extra}


def _write(path: Path, doc) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False) if not isinstance(doc, str) else doc)
    return path


def _instance(gpus: list, **extra) -> dict:
    return {"workload": {"cdf": "builtin:lmsys", "arrival_rate": 20}, "slo": {"ttft_p99_ms": 500},
            "gpus": gpus, "pools": {"max_pools": 1, "max_context": 8192}, **extra}


def run(*args, env=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def _without_names(profile) -> dict:
    out = dataclasses.asdict(profile)
    for key in ("name", "hardware_name", "model_name", "source", "note"):
        out.pop(key, None)
    return out


# --------------------------------------------------------------------------------------------
# Same figures in, same records and profiles out
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hardware", "models", "profiles"])
def test_every_shipped_entry_is_a_valid_user_entry_and_loads_to_the_same_record(kind, tmp_path):
    """The file format has exactly the shipped files' fields: each shipped entry, replaced by itself, loads to an
    equal record (only the provenance differs)."""
    doc = {kind: [_entry(kind, name, replace=True) for name in _shipped(kind)]}
    catalog, lines = user_catalog([_write(tmp_path / "all.yaml", doc)])
    assert lines == ()
    for name, record in getattr(bundled_catalog(), kind).items():
        mine = getattr(catalog, kind)[name]
        ignore = {"hardware": {"spec_source"}, "models": {"notes"}, "profiles": {"source"}}[kind]
        assert {k: v for k, v in dataclasses.asdict(mine).items() if k not in ignore} == \
               {k: v for k, v in dataclasses.asdict(record).items() if k not in ignore}, name


def test_user_hardware_and_model_copies_give_the_shipped_profile(tmp_path):
    """User hardware (a renamed copy of H100-SXM-80GB) with the catalogue's model, and the catalogue's hardware with
    a renamed copy of Llama-3.1-8B (or its config.json), give the profile of the shipped pair."""
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(CONFIG_8B))
    _write(tmp_path / "cat.yaml", {
        "hardware": [_entry("hardware", "H100-SXM-80GB", "my-h100")],
        "models": [_entry("models", "Llama-3.1-8B", "my-llama"),
                   {"name": "hf-llama", "config": "llama/config.json", "provenance": "published config.json"}]})
    serving = {"tp": 1, "dtype": "bf16"}
    inst = instance_from_dict(_instance([
        {"name": "shipped", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-8B", **serving},
        {"name": "hw", "hardware": "my-h100", "model": "Llama-3.1-8B", **serving},
        {"name": "model", "hardware": "H100-SXM-80GB", "model": "my-llama", **serving},
        {"name": "config", "hardware": "H100-SXM-80GB", "model": "hf-llama", **serving}],
        catalog="cat.yaml", allow_mixed_models=True), tmp_path / "inst.yaml")   # same model under 3 names
    shipped = _without_names(inst.gpu("shipped").profile)
    for name in ("hw", "model", "config"):
        assert _without_names(inst.gpu(name).profile) == shipped, name
    assert inst.gpu("hw").profile.hardware_name == "my-h100" and inst.gpu("config").profile.model_name == "hf-llama"


def test_inline_catalogue_and_a_list_of_files(tmp_path):
    hw = _entry("hardware", "A100-SXM-80GB", "my-a100")
    gpus = [{"name": "a", "hardware": "my-a100", "model": "Llama-3.1-8B", "tp": 1}]
    inline = instance_from_dict(_instance(gpus, catalog={"hardware": [hw]}), tmp_path / "i.yaml")
    _write(tmp_path / "one.yaml", {"hardware": [hw]})
    _write(tmp_path / "two.yaml", {"profiles": [_entry("profiles", "A10G", "my-a10g")]})
    listed = instance_from_dict(_instance(gpus + [{"name": "b", "profile": "my-a10g"}],
                                          catalog=["one.yaml", "two.yaml"]), tmp_path / "i.yaml")
    assert _without_names(inline.gpu("a").profile) == _without_names(listed.gpu("a").profile)
    assert _without_names(listed.gpu("b").profile) == _without_names(bundled_catalog().profiles["A10G"])


def test_a_user_profile_solves_like_the_shipped_one_it_copies(tmp_path):
    """``solve --catalog FILE``: a renamed copy of H100-80GB plans the same fleet at the same cost."""
    cat = _write(tmp_path / "cat.yaml", {"profiles": [_entry("profiles", "H100-80GB", "ours-h100",
                                                             model="Llama-3-70B-class (TP=8 unit)")]})
    costs = {}
    for name in ("H100-80GB", "ours-h100"):
        inst = _write(tmp_path / f"{name}.yaml", _instance([{"name": "h", "profile": name}]))
        res = run("solve", inst, "--json", "-", "--catalog", cat)
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert doc["status"] == "optimal"
        costs[name] = (doc["cost_per_hr"], [(p["min_tokens"], p["max_tokens"], p["replicas"]) for p in doc["pools"]])
    assert costs["ours-h100"] == costs["H100-80GB"]
    listed = json.loads(run("catalog", "list", "--kind", "profiles", "--catalog", cat, "--json", "-").stdout)
    row = next(p for p in listed["profiles"] if p["name"] == "ours-h100")
    assert (row["supplied_by"], row["file"]) == ("user", str(cat))
    assert row["source"] == f"user-supplied ({cat}): copy of the shipped H100-80GB"
    assert row["model"] == "Llama-3-70B-class (TP=8 unit)" and listed["user_files"] == [str(cat)]
    assert all(p["supplied_by"] == "bundled" for p in listed["profiles"] if p["name"] != "ours-h100")


def test_the_shipped_example_solves_and_lists(tmp_path):
    res = run("solve", instances_dir() / "user_catalog.yaml", "--json", "-")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"] == "optimal"
    example = instances_dir() / "catalogs" / "catalog_example.yaml"
    listed = json.loads(run("catalog", "list", "--catalog", example, "--json", "-").stdout)
    user = {(k, r["name"]) for k in ("hardware", "models", "profiles") for r in listed[k] if r["supplied_by"] == "user"}
    assert user == {("hardware", "MI300X"), ("models", "Mistral-7B-v0.3"), ("profiles", "H100-8B-unit")}
    table = run("catalog", "list", "--catalog", example, "--format", "plain")
    assert table.exit_code == 0 and f"user-supplied ({example})" in table.output


def test_replace_true_replaces_the_shipped_entry(tmp_path):
    cat = _write(tmp_path / "cat.yaml", {"hardware": [
        {**_entry("hardware", "H100-SXM-80GB"), "replace": True, "price": {"usd_per_gpu_hour": 2.5}}]})
    inst = _write(tmp_path / "i.yaml", _instance([{"name": "h", "hardware": "h100", "model": "Llama-3.1-8B"}]))
    with catalog_files([cat]):
        assert load_catalog().find("hardware", "h100").usd_per_gpu_hour == 2.5
        assert load_instance(inst).gpu("h").profile.cost_usd_per_hr == 2.5
        rows = [h for h in json.loads(run("catalog", "list", "--kind", "hardware", "--json", "-").stdout)["hardware"]
                if h["name"] == "H100-SXM-80GB"]
    assert load_catalog() is bundled_catalog()       # the block ended: the shipped catalogue again
    assert load_instance(inst).gpu("h").profile.cost_usd_per_hr == 4.02
    assert [r["supplied_by"] for r in rows] == ["user"]


def test_env_variable_and_every_instance_command_take_the_option(tmp_path):
    cat = _write(tmp_path / "cat.yaml", {"profiles": [_entry("profiles", "A10G", "env-a10g")]})
    inst = _write(tmp_path / "i.yaml", _instance([{"name": "a", "profile": "env-a10g"}]))
    assert run("validate", inst).exit_code == 2
    assert run("validate", inst, env={"FLEETOPT_CATALOG": str(cat)}).exit_code == 0
    import click

    ctx = click.Context(main)
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        params = {p.name for p in command.params}
        if "overrides" in params:
            assert "catalog_files" in params, name


# --------------------------------------------------------------------------------------------
# Malformed catalogue files: one line each, file and field named, exit 2
# --------------------------------------------------------------------------------------------

GOOD_HW = {"name": "g1", "provenance": "test", "memory": {"capacity_bytes": 2**36},
           "memory_bandwidth_bytes_per_s": 2_000_000_000_000, "fp16_dense_tflops": 300.0, "tdp_w": 400,
           "price": {"usd_per_gpu_hour": 2.0}}
BAD = {
    "missing field": ({"hardware": [{k: v for k, v in GOOD_HW.items() if k != "tdp_w"}]},
                      "catalog.hardware[0].tdp_w: missing"),
    "missing provenance": ({"hardware": [{k: v for k, v in GOOD_HW.items() if k != "provenance"}]},
                           "catalog.hardware[0].provenance: missing"),
    "negative price": ({"hardware": [{**GOOD_HW, "price": {"usd_per_gpu_hour": -1.0}}]},
                       "catalog.hardware[0].price.usd_per_gpu_hour: -1.0 is out of range"),
    "unknown section": ({"gpus": [GOOD_HW]}, "catalog.gpus: unknown key; allowed: schema_version, hardware"),
    "unknown key": ({"hardware": [{**GOOD_HW, "bandwidth": 1}]}, "catalog.hardware[0].bandwidth: unknown key"),
    "collision": ({"hardware": [{**GOOD_HW, "name": "H100"}]},
                  "catalog.hardware[0].name: 'h100' is already in the catalogue: hardware 'H100-SXM-80GB'"),
    "alias collision": ({"hardware": [{**GOOD_HW, "aliases": ["a100"]}]},
                        "catalog.hardware[0].aliases: 'a100' is already in the catalogue"),
    "replace nothing": ({"hardware": [{**GOOD_HW, "replace": True}]},
                        "catalog.hardware[0].replace: true, but the catalogue has no hardware named 'g1'"),
    "bad config path": ({"models": [{"name": "m", "config": "nope/config.json", "provenance": "x"}]},
                        "catalog.models[0].config: 'nope/config.json' (resolved to"),
    "idle above nominal": ({"profiles": [{**_entry("profiles", "A10G", "p"),
                                          "power": {"idle_w": 200.0, "nominal_w": 100.0, "logistic_k": 1.0,
                                                    "logistic_x0": 2.0}}]},
                           "catalog.profiles[0].power.idle_w: 200 exceeds nominal_w 100"),
    "n_slots_at disagrees": ({"profiles": [{**_entry("profiles", "A10G", "p"), "n_slots_at": {8192: 65}}]},
                             "catalog.profiles[0].n_slots_at: 65 sequences at 8192 tokens, but"),
    "moe without block": ({"models": [{**_entry("models", "Qwen3-30B-A3B", "q"), "moe": None}]},
                          "catalog.models[0].moe: a moe block is required"),
    "exponent as text": ({"hardware": [{**GOOD_HW, "memory_bandwidth_bytes_per_s": "2e12"}]},
                         "catalog.hardware[0].memory_bandwidth_bytes_per_s: '2e12' is text to YAML"),
    "not a mapping": ([1, 2], "catalog: expected a mapping"),
    "syntax": ("hardware: [\n", "YAML syntax error"),
    "empty": ("", "the file is empty"),
}


def _error_lines(result) -> list[str]:
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_catalogue_files_give_one_line_naming_file_and_field(case, tmp_path):
    doc, expected = BAD[case]
    cat = _write(tmp_path / "cat.yaml", doc)
    inst = _write(tmp_path / "i.yaml", _instance([{"name": "a", "profile": "A10G"}]))
    for args in (("catalog", "list", "--catalog", cat), ("validate", inst, "--catalog", cat),
                 ("solve", inst, "--catalog", cat)):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        lines = _error_lines(result)
        assert len(lines) == 1 and lines[0].startswith(f"error: {cat}: "), lines
        assert expected in lines[0], lines
    # the same problems through the instance's own catalog: key (a file beside it)
    _write(tmp_path / "j.yaml", _instance([{"name": "a", "profile": "A10G"}], catalog="cat.yaml"))
    lines = _error_lines(run("validate", tmp_path / "j.yaml"))
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'cat.yaml'}: ") and expected in lines[0]


def test_inline_catalogue_problems_name_the_instance_file(tmp_path):
    inst = _write(tmp_path / "i.yaml", _instance([{"name": "a", "profile": "A10G"}],
                                                 catalog={"hardware": [{**GOOD_HW, "tdp_w": -5}]}))
    result = run("validate", inst)
    assert result.exit_code == 2
    assert _error_lines(result) == [f"error: {inst}: catalog.hardware[0].tdp_w: -5 is out of range; must be > 0"]
    for value, field in ((3, "catalog"), (["ok.yaml", 5], "catalog[1]")):
        bad = _write(tmp_path / "k.yaml", _instance([{"name": "a", "profile": "A10G"}], catalog=value))
        lines = _error_lines(run("validate", bad))
        assert any(line.startswith(f"error: {bad}: {field}: ") for line in lines), lines


def test_missing_cli_catalogue_file_is_one_line(tmp_path):
    result = run("catalog", "list", "--catalog", tmp_path / "none.yaml")
    assert result.exit_code == 2
    assert _error_lines(result) == [f"error: {tmp_path / 'none.yaml'}: cannot read the catalogue file: no such file; "
                                    "check the path"]


# --------------------------------------------------------------------------------------------
# Fuzzing: a result or one-line errors naming the file, never another exception
# --------------------------------------------------------------------------------------------

BASE_CATALOG = {
    "schema_version": 1,
    "hardware": [GOOD_HW, {**_entry("hardware", "H100-SXM-80GB"), "replace": True}],
    "models": [_entry("models", "Qwen3-30B-A3B", "fz-moe"), {"name": "fz-cfg", "config": "config.json",
                                                             "provenance": "fuzz"}],
    "profiles": [_entry("profiles", "B200-projected", "fz-unit")],
}
SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=10) | st.sampled_from(["H100", "a100", "moe", "dense", "1e12", "config.json", "", "-1"]))
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)

def test_fuzz_catalogue_files(tmp_path):
    """60 mutated catalogue files (derandomised): loaded alone and under an instance that uses their names."""
    (tmp_path / "config.json").write_text(json.dumps(CONFIG_8B))
    path, inst = tmp_path / "fuzz.yaml", tmp_path / "inst.yaml"
    gpus = [{"name": "a", "hardware": "g1", "model": "fz-cfg", "tp": 1}, {"name": "b", "profile": "fz-unit"},
            {"name": "c", "hardware": "h100", "model": "fz-moe", "tp": 4}]
    _write(inst, _instance(gpus, catalog="fuzz.yaml", allow_mixed_models=True))

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated(BASE_CATALOG, JUNK) | JUNK)
    def check(doc):
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
        _catalog, lines = user_catalog([path])
        for line in lines:
            assert line.startswith(f"{path}: ") and "\n" not in line, line
        try:
            load_instance(inst)
        except InstanceError as err:
            for line in err.problems:
                assert line.startswith((f"{inst}: ", f"{path}: ")) and "\n" not in line, line

    check()


def test_fuzzed_files_through_the_cli_exit_0_or_2(tmp_path):
    path = tmp_path / "c.yaml"

    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated(BASE_CATALOG, JUNK))
    def check(doc):
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
        result = run("catalog", "list", "--catalog", path, "--json", os.devnull)
        assert result.exit_code in (0, 2), result.output
        assert all(line.startswith(f"error: {path}: ") for line in _error_lines(result))

    check()


def test_user_hardware_link_bandwidths_drive_the_tp_all_reduce(tmp_path):
    """A user GPU's NVLink figure is the tensor-parallel all-reduce link: a copy of the H100 with its NVLink halved
    pays twice the per-token all-reduce (2 x 32 layers x 2 x 1/2 x 4,096 x 2 B / 225e9 B/s at TP=2); without any
    link figure TP=2 is refused, naming the field, while TP=1 still works."""
    fast = _entry("hardware", "H100-SXM-80GB", "my-h100")
    slow = _entry("hardware", "H100-SXM-80GB", "slow-h100", nvlink_bandwidth_bytes_per_s=225e9)
    links = ("nvlink_bandwidth_bytes_per_s", "pcie_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s")
    bare = {k: v for k, v in _entry("hardware", "H100-SXM-80GB", "bare-h100").items() if k not in links}
    gpus = [{"name": n, "hardware": n, "model": "Llama-3.1-8B", "tp": 2, "dtype": "bf16"}
            for n in ("my-h100", "slow-h100")]
    inst = instance_from_dict(_instance(gpus, catalog={"hardware": [fast, slow, bare]}), tmp_path / "i.yaml")
    per_token = 2 * 32 * (2 * 1 / 2) * 4_096 * 2
    assert inst.gpu("my-h100").profile.tp_allreduce_s_per_token == pytest.approx(per_token / 450e9, rel=1e-12)
    assert inst.gpu("slow-h100").profile.tp_allreduce_s_per_token == pytest.approx(per_token / 225e9, rel=1e-12)
    with pytest.raises(InstanceError, match=r"gpus\[0\]\.tp: .*no link bandwidth"):
        instance_from_dict(_instance([{"name": "b", "hardware": "bare-h100", "model": "Llama-3.1-8B", "tp": 2}],
                                     catalog={"hardware": [bare]}), tmp_path / "i.yaml")
    one = instance_from_dict(_instance([{"name": "b", "hardware": "bare-h100", "model": "Llama-3.1-8B", "tp": 1}],
                                       catalog={"hardware": [bare]}), tmp_path / "i.yaml")
    assert one.gpu("b").profile.tp_allreduce_s_per_token == 0.0
