"""Issue 12, item 7: what one replica is, in every table header and JSON document that counts GPUs.

The seeds' calibrated A100/H100/B200 profiles are TP=8 servers priced and powered as one GPU; computed and
fitted profiles count physical GPUs. Tables show physical GPUs and say what a replica is; the JSON carries
``gpus_per_replica``, ``physical_gpus_per_replica``, ``physical_gpus`` and ``unit`` per pool and option and
``physical_gpus`` per fleet; ``validate`` and ``solve`` warn when one instance mixes the two conventions.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.models.profiles import replica_unit
from fleetopt.optimizer.output.contract import validate_document

SEED_TEXT = "1 replica = 1 billing unit = 8 physical GPUs"
MIXED = {
    "name": "units-mixed",
    "workload": {"cdf": "builtin:azure", "arrival_rate": 20},
    "slo": {"ttft_p99_ms": 500},
    "gpus": [{"name": "h100", "profile": "H100-80GB"},
             {"name": "h100-tp8", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-70B", "tp": 8, "dtype": "fp16"}],
    "pools": {"max_pools": 2, "max_context": 8192},
    "allow_mixed_models": True,
}
"""A seeds' calibrated H100 unit next to a computed TP=8 H100 option: the issue's two conventions in one MIP."""


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_replica_unit_of_each_kind(catalog):
    h100 = catalog.profiles["H100-80GB"]
    seed = replica_unit(h100)
    assert (seed.unit, seed.gpus_per_replica, seed.physical_gpus_per_replica) == ("seed_unit", 1, 8)
    assert seed.text.startswith(SEED_TEXT)
    a10g = catalog.profiles["A10G"]    # a 7B-class model on one GPU: a counted GPU is a physical one
    assert replica_unit(a10g).unit == "gpu"
    tp8 = replica_unit(SimpleNamespace(gpus_per_replica=8, physical_gpus_per_replica=8))
    assert (tp8.unit, tp8.physical_gpus_per_replica, tp8.text) == ("gpu", 8, "1 replica = 8 physical GPUs (TP=8)")


def test_solve_json_counts_physical_gpus_of_seed_units(repo_root):
    """The quickstart's traffic on seed units: 1 counted GPU per replica, 8 physical ones (before: no such keys)."""
    res = run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    validate_document(doc)
    for pool in doc["pools"] + [p for s in doc["solutions"] for p in s["pools"]]:
        assert (pool["unit"], pool["gpus_per_replica"], pool["physical_gpus_per_replica"]) == ("seed_unit", 1, 8)
        assert pool["physical_gpus"] == 8 * pool["replicas"] and pool["gpus"] == pool["replicas"]
        assert pool["model"].startswith("Llama-3-70B-class")
    assert doc["physical_gpus"] == 8 * doc["total_gpus"]
    assert doc["baseline"]["physical_gpus"] == 8 * doc["baseline"]["total_gpus"]


def test_evaluate_json_of_computed_options_counts_physical_gpus(repo_root):
    res = run("evaluate", repo_root / "instances" / "llama70b_generations.yaml", "--fleet", "0-8192:h100x8x20",
              "--json", "-")
    doc = json.loads(res.stdout)
    validate_document(doc)
    (pool,) = doc["fleets"][0]["pools"]
    assert (pool["unit"], pool["gpus_per_replica"], pool["physical_gpus_per_replica"]) == ("gpu", 8, 8)
    assert pool["physical_gpus"] == pool["gpus"] == 160 and doc["fleets"][0]["physical_gpus"] == 160


def test_tables_say_what_a_replica_is(repo_root):
    """Every table that counts GPUs shows physical GPUs and what one replica is, in its header."""
    seeds = run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--format", "plain").output
    title = next(line for line in seeds.splitlines() if line.startswith("plan 1:"))
    assert f"a100, h100: {SEED_TEXT}" in title
    assert f"a100, h100: {SEED_TEXT}" in title and "(seed_unit)" in title
    header = next(line for line in seeds.splitlines() if line.startswith("tokens"))
    assert " GPUs " in header and "seed units" in header and "replicas" in header and "model" in header
    fleet = next(line for line in seeds.splitlines() if line.startswith("fleet "))
    assert fleet.split()[1:4] == ["4", "32", "4"]         # 4 replicas = 32 physical GPUs = 4 seed units
    computed = run("evaluate", repo_root / "instances" / "llama70b_generations.yaml", "--fleet", "0-8192:h100x8x20",
                   "--format", "plain").output
    assert "h100x8: 1 replica = 8 physical GPUs (TP=8)" in computed
    summary = run("validate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--format", "plain").output
    assert "physical GPUs/replica" in summary and f"h100: {SEED_TEXT}" in summary


def test_validate_json_gpus_carry_the_unit(repo_root):
    doc = json.loads(run("validate", repo_root / "instances" / "ref_units_stress_60x8.yaml", "--json", "-").stdout)
    validate_document(doc)
    units = {g["name"]: (g["unit"], g["gpus_per_replica"], g["physical_gpus_per_replica"]) for g in doc["gpus"]}
    assert units["h100"] == ("seed_unit", 1, 8) and units["h100-8b"] == ("gpu", 1, 1)


@pytest.mark.parametrize("command", ["validate", "solve"])
def test_mixed_conventions_are_warned(tmp_path, command):
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(MIXED))
    doc = json.loads(run(command, path, "--json", "-").stdout)
    mixed = [w for w in doc["warnings"] if "count a replica two ways" in w]
    assert len(mixed) == 1 and "h100" in mixed[0] and "h100-tp8" in mixed[0]
    text = run(command, path, "--format", "plain").output
    assert "count a replica two ways" in text


def test_one_convention_is_not_warned(repo_root):
    for name in ("quickstart.yaml", "ref_units_lmsys_a100_h100.yaml", "llama70b_generations.yaml",
                 "h100_8b_fitted.yaml"):
        warnings = api.summarize_instance(api.load(repo_root / "instances" / name))["warnings"]
        assert not any("two ways" in w for w in warnings), (name, warnings)
