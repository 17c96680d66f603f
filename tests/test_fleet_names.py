"""Issue 12, item 3: ``--fleet`` names that look like a name with a count (``h100x8``).

An option's exact name wins over a glued count; a count after a space (``h100 x8``) is always a count; the specs
fleetopt prints evaluate back to their fleet; ``validate`` warns once per name that reads two ways.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import EXIT_CODES, InstanceError
from fleetopt.optimizer.io.instance import instance_from_dict
from fleetopt.optimizer.plan.evaluate import evaluate, fleet_name_ambiguities, fleet_spec, parse_fleet

TWO_H100 = {
    "name": "two-h100",
    "workload": {"cdf": "builtin:azure", "arrival_rate": 20},
    "slo": {"ttft_p99_ms": 500},
    "gpus": [{"name": "h100", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-70B", "tp": 4, "dtype": "fp16"},
             {"name": "h100x8", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-70B", "tp": 8, "dtype": "fp16"}],
    "pools": {"max_pools": 2, "max_context": 8192},
}
"""The issue's case: an option ``h100`` and a computed TP=8 option ``h100x8`` (one model, TP 4 and 8)."""


@pytest.fixture(scope="module")
def two():
    return instance_from_dict(TWO_H100)


def _pool(inst, text):
    (pool,) = parse_fleet(text, inst).pools
    return pool[2], pool[3]


def test_exact_option_name_wins_over_a_glued_count(two):
    """Before the fix ``0-8192:h100x8`` was 8 replicas of ``h100``."""
    assert _pool(two, "0-8192:h100x8") == ("h100x8", None)       # the option, sized to its minimum
    assert _pool(two, "0-8192:H100X8") == ("h100x8", None)       # names are case-insensitive
    assert _pool(two, "0-8192:h100x8x3") == ("h100x8", 3)
    assert _pool(two, "0-8192:h100x3") == ("h100", 3)            # no option 'h100x3': a count


@pytest.mark.parametrize("text", ["0-8192:h100 x8", "0-8192:h100 x 8", "0-8192:h100x 8", " 0 - 8192 : h100  X8 "])
def test_a_count_after_a_space_is_always_a_count(two, text):
    assert _pool(two, text) == ("h100", 8)


def test_spaced_count_with_compression_and_batch_cap(two):
    (pool,) = parse_fleet("0-8192:h100x8 x2#4", two).pools
    assert pool[2:] == ("h100x8", 2, 1.0, 4)


def test_the_instance_own_option_is_known(repo_root):
    """``instances/llama70b_generations.yaml`` has ``h100x8`` and no ``h100``: before the fix the spec failed
    with "unknown gpu 'h100'"."""
    inst = api.load(repo_root / "instances" / "llama70b_generations.yaml")
    assert _pool(inst, "0-8192:h100x8") == ("h100x8", None)
    assert _pool(inst, "0-8192:h100x8x2") == ("h100x8", 2)
    res = CliRunner().invoke(main, ["evaluate", str(repo_root / "instances" / "llama70b_generations.yaml"),
                                    "--fleet", "0-8192:h100x8", "--json", "-"])
    assert res.exit_code in (0, EXIT_CODES["slo_missed"], EXIT_CODES["limits_broken"]), res.output
    data = json.loads(res.stdout)
    assert data["pools"][0]["gpu"] == "h100x8" and data["pools"][0]["gpus"] == 8 * data["pools"][0]["replicas"]


def test_unknown_names_are_still_reported(two):
    with pytest.raises(InstanceError, match="unknown gpu 'a100'"):
        parse_fleet("0-8192:a100x3", two)
    with pytest.raises(InstanceError, match="unknown gpu 'h200x8'"):
        parse_fleet("0-8192:h200x8x2", two)


def test_printed_specs_round_trip(two):
    """``fleet_spec`` writes 8 replicas of ``h100`` with a space (the glued form names the other option) and
    evaluates back to the same pools."""
    for text, expected in (("0-4096:h100 x8,4096-8192:h100x8x3", "0-4096:h100 x8,4096-8192:h100x8x3"),
                           ("0-4096:h100x2,4096-8192:h100x8x1", "0-4096:h100x2,4096-8192:h100x8x1")):
        fleet = evaluate(two, parse_fleet(text, two)).result
        spec = fleet_spec(two, fleet)
        assert spec == expected
        again = evaluate(two, parse_fleet(spec, two)).result
        assert [(p.gpu, p.replicas) for p in again.pools] == [(p.gpu, p.replicas) for p in fleet.pools]


def test_validate_warns_once_about_the_ambiguous_name(two, repo_root):
    lines = fleet_name_ambiguities(two)
    assert len(lines) == 1 and "'h100 x8'" in lines[0] and "h100x8" in lines[0]
    warnings = api.summarize_instance(two)["warnings"]
    assert sum("'h100 x8'" in w for w in warnings) == 1
    assert fleet_name_ambiguities(api.load(repo_root / "instances" / "llama70b_generations.yaml")) == []
    assert fleet_name_ambiguities(api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")) == []


def test_validate_cli_prints_the_warning(tmp_path):
    import yaml

    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(TWO_H100))
    res = CliRunner().invoke(main, ["validate", str(path), "--format", "plain"])
    assert res.exit_code == 0, res.output
    assert res.output.count("with a space") == 1 and "'h100 x8'" in res.output
