"""Instance files: every malformed input gives one named problem line; valid files resolve.

The malformed table is run twice: through :func:`fleetopt.optimizer.io.instance.load_instance`
(which must raise :class:`InstanceError` and nothing else) and through the
``fleetopt validate`` command (exit code 2, the same line on stderr, no traceback).
"""

from __future__ import annotations

import copy
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetopt.optimizer.io.catalog import data_dir
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import (
    DEFAULT_MAX_UTILIZATION,
    Instance,
    apply_overrides,
    instance_from_dict,
    load_instance,
)

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = data_dir() / "workloads"

BASE: dict[str, Any] = {
    "name": "base",
    "workload": {"cdf": "builtin:lmsys", "arrival_rate": 100, "input_fraction": 0.8},
    "slo": {"ttft_p99_ms": 500, "ttft_model": "tail", "scope": "pool"},
    "gpus": [
        {"name": "a100", "profile": "A100-80GB", "max_count": 64, "availability": 1.0},
        {"name": "h100", "profile": "H100-80GB"},
    ],
    "pools": {"max_pools": 2, "max_context": 65536, "boundaries": "auto"},
    "constraints": {"max_utilization": 0.85},
    "objective": "cost",
}




def edited(change: Callable[[dict], None]) -> Callable[[], dict]:
    """A factory of BASE with ``change`` applied to a deep copy."""

    def make() -> dict:
        data = copy.deepcopy(BASE)
        change(data)
        return data

    return make


def setting(*path_and_value) -> Callable[[], dict]:
    """BASE with the value at ``path`` (keys and list indices) replaced."""
    *path, value = path_and_value

    def change(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edited(change)


def removing(*path) -> Callable[[], dict]:
    def change(data: dict) -> None:
        node = data
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return edited(change)


def with_gpus(*gpus: dict) -> Callable[[], dict]:
    return setting("gpus", list(gpus))


@dataclass(frozen=True)
class Case:
    """One malformed instance: how to write it and the problem line it must produce."""

    id: str
    content: Callable[[], dict] | str | None  # dict factory (written as YAML), raw text, or None = no file
    field: str  # "" for file-level problems
    phrase: str
    filename: str = "inst.yaml"
    files: dict[str, str] = field(default_factory=dict)  # side files next to the instance


TRACE_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"

CASES = [
    # --- reading and syntax ------------------------------------------------------------
    Case("yaml-syntax", "name: x\nworkload: {cdf: builtin:lmsys\nslo: 1\n", "", "YAML syntax error at line"),
    Case("yaml-duplicate-key", "slo: {ttft_p99_ms: 5}\nslo: {ttft_p99_ms: 6}\n", "", "duplicate key 'slo'"),
    Case("json-syntax", '{"name": "x",\n "slo": }\n', "", "JSON syntax error at line 2", filename="inst.json"),
    Case("toml-syntax", 'name = "x"\n[slo\nttft_p99_ms = 5\n', "", "TOML syntax error", filename="inst.toml"),
    Case("missing-file", None, "", "cannot read the instance file: no such file"),
    Case("unknown-extension", "name: x\n", "", "unknown file extension '.txt'", filename="inst.txt"),
    Case("top-level-list", "- a\n- b\n", "", "the top level must be a mapping"),
    Case("empty-file", "", "", "the file is empty"),
    Case("json-nan-rate", json.dumps({**BASE, "workload": {"cdf": "builtin:lmsys", "arrival_rate": float("nan")}}),
         "workload.arrival_rate", "nan is not finite", filename="inst.json"),
    Case("toml-string-count",
         'name = "t"\n[workload]\ncdf = "builtin:lmsys"\narrival_rate = 10\n[slo]\nttft_p99_ms = 500\n'
         '[[gpus]]\nname = "a100"\nprofile = "A100-80GB"\nmax_count = "8"\n[pools]\nmax_context = 8192\n',
         "gpus[0].max_count", "'8' is not an integer", filename="inst.toml"),
    # --- unknown and missing keys, types ----------------------------------------------
    Case("unknown-top-key", setting("objectve", "cost"), "objectve",
         "unknown key; allowed: name, description, workload"),
    Case("unknown-workload-key", setting("workload", "foo", 1), "workload.foo",
         "unknown key; allowed: cdf, trace, synthetic, arrival_rate, input_fraction"),
    Case("unknown-gpu-key", setting("gpus", 0, "maxcount", 3), "gpus[0].maxcount",
         "unknown key; allowed: name, profile"),
    Case("unknown-constraint-key", setting("constraints", "max_gpus", 3), "constraints.max_gpus",
         "unknown key; allowed: max_utilization, max_power_kw, max_cost_per_hr, max_total_gpus"),
    Case("missing-slo", removing("slo"), "slo", "missing; this key is required"),
    Case("missing-ttft", removing("slo", "ttft_p99_ms"), "slo.ttft_p99_ms", "missing; this key is required"),
    Case("missing-pools", removing("pools"), "pools", "missing; this key is required"),
    Case("missing-gpu-name", removing("gpus", 1, "name"), "gpus[1].name", "missing; this key is required"),
    Case("count-wrong-type", setting("gpus", 0, "max_count", "lots"), "gpus[0].max_count",
         "'lots' is not an integer"),
    Case("slo-not-mapping", setting("slo", "fast"), "slo", "expected a mapping with keys ttft_p99_ms"),
    Case("empty-gpus", setting("gpus", []), "gpus", "the list is empty"),
    # --- ranges and choices ------------------------------------------------------------
    Case("negative-rate", setting("workload", "arrival_rate", -5), "workload.arrival_rate",
         "-5 is out of range; must be > 0"),
    Case("zero-ttft", setting("slo", "ttft_p99_ms", 0), "slo.ttft_p99_ms", "0 is out of range; must be > 0"),
    Case("bad-ttft-model", setting("slo", "ttft_model", "fast"), "slo.ttft_model",
         "'fast' is not allowed; choose batched, tail or mean-prefill"),
    Case("bad-scope", setting("slo", "scope", "global"), "slo.scope", "choose pool or fleet"),
    Case("bad-objective", setting("objective", "speed"), "objective", "choose cost, power, tok_per_watt or cost+power"),
    Case("bad-routing", setting("pools", "routing", "random"), "pools.routing", "choose length or split"),
    Case("compress-gamma-not-above-1", setting("pools", "compress", {"gammas": [1.0]}), "pools.compress.gammas[0]",
         "must be > 1"),
    Case("compress-gamma-fills-window", setting("pools", "compress", {"gammas": [6.0]}), "pools.compress.gammas[0]",
         "outputs alone would fill the window"),
    Case("compress-unknown-key", setting("pools", "compress", {"gammas": [2.0], "p": 1}), "pools.compress.p",
         "unknown key"),
    Case("cost-power-without-energy", setting("objective", "cost+power"), "objective", "needs an energy section"),
    Case("negative-energy-price", setting("energy", {"usd_per_kwh": -1}), "energy.usd_per_kwh", "must be >= 0"),
    Case("min-pools-above-max", edited(lambda d: d["gpus"][0].update(min_pools=3, max_pools=1)), "gpus[0].min_pools",
         "exceeds max_pools"),
    Case("split-with-fleet-scope",
         edited(lambda d: (d["pools"].update(routing="split"), d["slo"].update(scope="fleet"))),
         "pools.routing", "'split' routing works with slo.scope 'pool' only"),
    Case("bad-gpu-name", setting("gpus", 0, "name", "a 100"), "gpus[0].name", "'a 100' is not a valid name"),
    Case("bad-tp", with_gpus({"name": "x", "hardware": "h100", "model": "Llama-3.1-8B", "tp": 3}),
         "gpus[0].tp", "3 is not allowed; choose 1, 2, 4 or 8"),
    Case("zero-availability", setting("gpus", 0, "availability", 0), "gpus[0].availability", "must be >= 0.5"),
    Case("availability-above-1", setting("gpus", 0, "availability", 1.2), "gpus[0].availability", "must be <= 1"),
    Case("max-pools-zero", setting("pools", "max_pools", 0), "pools.max_pools", "must be >= 1"),
    Case("max-context-negative", setting("pools", "max_context", -5), "pools.max_context", "must be >= 1"),
    Case("max-context-float", setting("pools", "max_context", 4096.5), "pools.max_context", "not an integer"),
    Case("utilization-above-1", setting("constraints", "max_utilization", 1.5), "constraints.max_utilization",
         "1.5 is out of range; must be <= 1"),
    Case("utilization-zero", setting("constraints", "max_utilization", 0), "constraints.max_utilization",
         "must be >= 0.05"),
    Case("negative-power-cap", setting("constraints", "max_power_kw", -1), "constraints.max_power_kw",
         "must be > 0"),
    # --- workload files ----------------------------------------------------------------
    Case("cdf-file-missing", setting("workload", "cdf", "nothere.json"), "workload.cdf", "no such file"),
    Case("cdf-bad-json", setting("workload", "cdf", "bad.json"), "workload.cdf", "is not valid JSON",
         files={"bad.json": "[[64, 0.5],"}),
    Case("cdf-decreasing", setting("workload", "cdf", "dec.json"), "workload.cdf", "fractions must not decrease",
         files={"dec.json": "[[64, 0.5], [128, 0.4], [256, 1.0]]"}),
    Case("cdf-not-ending-at-1", setting("workload", "cdf", "short.json"), "workload.cdf",
         "must end at cumulative fraction 1", files={"short.json": '{"cdf": [[64, 0.5], [128, 0.9]]}'}),
    Case("cdf-inline-bad", setting("workload", "cdf", [[64, 0.5], [32, 1.0]]), "workload.cdf",
         "tokens must increase strictly"),
    Case("cdf-unknown-builtin", setting("workload", "cdf", "builtin:nope"), "workload.cdf",
         "unknown builtin workload 'builtin:nope'; known: builtin:azure"),
    Case("cdf-is-a-trace", setting("workload", "cdf", "builtin:azure_conv_trace"), "workload.cdf",
         "is a trace (CSV); give it as workload.trace"),
    Case("trace-missing-column", setting("workload", {"trace": "t.csv"}), "workload.trace",
         "lacks column(s) num_decode_tokens", files={"t.csv": "arrived_at,num_prefill_tokens\n0,1\n"}),
    Case("trace-bad-row", setting("workload", {"trace": "t.csv"}), "workload.trace",
         "row 2 (line 3): token counts 'abc'", files={"t.csv": TRACE_HEADER + "0,10,5\n1.5,abc,5\n"}),
    Case("trace-back-in-time", setting("workload", {"trace": "t.csv"}), "workload.trace", "row 3 goes back in time",
         files={"t.csv": TRACE_HEADER + "0,10,5\n2,1,1\n1,1,1\n"}),
    Case("trace-with-input-fraction", setting("workload", {"trace": "builtin:azure_conv_trace", "input_fraction": 0.5}),
         "workload.input_fraction", "only applies to a cdf workload"),
    Case("both-cdf-and-trace", setting("workload", "trace", "builtin:azure_conv_trace"), "workload",
         "cdf and trace are given; give exactly one"),
    Case("neither-cdf-nor-trace", setting("workload", {"arrival_rate": 5}), "workload",
         "none of cdf, trace or synthetic is given"),
    Case("synthetic-bad-sigma", setting("workload", {"synthetic": {"mixture": [{"weight": 1, "median_tokens": 900,
                                                                             "sigma": 0}]}, "arrival_rate": 5}),
         "workload.synthetic.mixture[0].sigma", "must be > 0"),
    Case("synthetic-empty-mixture", setting("workload", {"synthetic": {"mixture": []}, "arrival_rate": 5}),
         "workload.synthetic.mixture", "at least 1"),
    Case("cdf-without-rate", removing("workload", "arrival_rate"), "workload.arrival_rate",
         "a cdf workload needs an arrival rate"),
    # --- gpu options -------------------------------------------------------------------
    Case("unknown-profile", setting("gpus", 0, "profile", "X100"), "gpus[0].profile",
         "unknown profile 'X100'; known: A10G, A100-80GB, H100-80GB, B200-projected"),
    Case("unknown-hardware", with_gpus({"name": "x", "hardware": "Z900", "model": "Llama-3.1-8B"}),
         "gpus[0].hardware", "unknown hardware 'Z900'; known: A10G"),
    Case("unknown-model", with_gpus({"name": "x", "hardware": "h100", "model": "Llama-9"}),
         "gpus[0].model", "unknown model 'Llama-9'; known: Llama-3.1-8B"),
    Case("profile-and-hardware", setting("gpus", 0, "hardware", "h100"), "gpus[0]",
         "both profile and hardware/model are given"),
    Case("no-profile-no-hardware", with_gpus({"name": "x", "max_count": 3}), "gpus[0]",
         "neither profile nor hardware + model is given"),
    Case("hardware-without-model", with_gpus({"name": "x", "hardware": "h100"}), "gpus[0].model",
         "a computed profile needs both hardware and model"),
    Case("computed-key-on-profile", setting("gpus", 0, "tp", 8), "gpus[0].tp",
         "only applies to a computed profile"),
    Case("duplicate-gpu-names", setting("gpus", 1, "name", "A100"), "gpus[1].name",
         "duplicate name 'A100' (also gpus[0])"),
    Case("min-above-max", setting("gpus", 0, "min_count", 65), "gpus[0].min_count", "65 exceeds max_count 64"),
    Case("fp8-on-a100", with_gpus({"name": "x", "hardware": "A100-SXM-80GB", "model": "Llama-3.1-70B", "tp": 8,
                                   "dtype": "fp8"}), "gpus[0].dtype", "fp8"),
    Case("max-count-below-replica", with_gpus({"name": "x", "hardware": "h100", "model": "Llama-3.1-70B", "tp": 8,
                                               "max_count": 4}), "gpus[0].max_count", "which needs 8"),
    # --- pools -------------------------------------------------------------------------
    Case("boundaries-not-increasing", setting("pools", "boundaries", [4096, 2048]), "pools.boundaries",
         "not increasing: entry 1 (2048) follows 4096"),
    Case("boundary-at-max-context", setting("pools", "boundaries", [2048, 65536]), "pools.boundaries",
         "65536 is outside (0, 65536)"),
    Case("boundary-zero", setting("pools", "boundaries", [0, 2048]), "pools.boundaries", "0 is outside (0, 65536)"),
    Case("boundaries-bad-type", setting("pools", "boundaries", "some"), "pools.boundaries",
         "give auto or a list of whole token counts"),
    Case("context-no-gpu-holds", edited(lambda d: (d.update(gpus=[{"name": "a10g", "profile": "A10G"}]),
                                                   d["pools"].update(max_context=1_000_000))),
         "pools.max_context", "the largest any listed GPU holds is 524288 tokens"),
    Case("context-above-limit", setting("pools", "max_context", 2**40), "pools.max_context", "must be <="),
]

assert len(CASES) >= 25


def write_case(case: Case, folder: Path) -> Path:
    """Write the case's instance (and side files) into ``folder``; return the instance path."""
    for name, text in case.files.items():
        (folder / name).write_text(text)
    path = folder / case.filename
    if isinstance(case.content, str):
        path.write_text(case.content)
    elif case.content is not None:
        path.write_text(yaml.safe_dump(case.content(), sort_keys=False))
    return path


def expected_prefix(path: Path, case: Case) -> str:
    return f"{path}: {case.field}: " if case.field else f"{path}: "


def matching_lines(lines, prefix: str, phrase: str) -> list[str]:
    return [line for line in lines if line.startswith(prefix) and phrase in line]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_instance_raises_instance_error(case: Case, tmp_path: Path):
    path = write_case(case, tmp_path)
    with pytest.raises(InstanceError) as info:
        load_instance(path)
    lines = info.value.problems
    assert matching_lines(lines, expected_prefix(path, case), case.phrase), "\n".join(lines)
    assert all(line.startswith(f"{path}: ") for line in lines)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_instance_through_cli(case: Case, tmp_path: Path):
    from click.testing import CliRunner

    from fleetopt.optimizer.cli import main

    path = write_case(case, tmp_path)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output + result.stderr
    assert matching_lines([line.removeprefix("error: ") for line in result.stderr.splitlines()],
                          expected_prefix(path, case), case.phrase), result.stderr
    assert "Traceback" not in result.output and "Traceback" not in result.stderr


def test_every_problem_is_collected(tmp_path: Path):
    data = copy.deepcopy(BASE)
    data["slo"]["ttft_model"] = "fast"
    data["gpus"][0]["profile"] = "X100"
    data["workload"]["foo"] = 1
    data["pools"]["boundaries"] = [4096, 2048]
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InstanceError) as info:
        load_instance(path)
    fields = sorted(line.split(": ")[1] for line in info.value.problems)
    assert fields == ["gpus[0].profile", "pools.boundaries", "slo.ttft_model", "workload.foo"]


def test_error_names_file_as_given(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("given.yaml").write_text(yaml.safe_dump({**BASE, "objective": "speed"}))
    with pytest.raises(InstanceError) as info:
        load_instance("given.yaml")
    assert info.value.problems[0].startswith("given.yaml: objective: ")


def test_non_mapping_dict_input():
    with pytest.raises(InstanceError, match="top level must be a mapping"):
        instance_from_dict([1, 2])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Valid instances
# --------------------------------------------------------------------------------------------

SHIPPED = sorted(p for ext in ("yaml", "yml", "json", "toml") for p in (REPO / "instances").glob(f"*.{ext}"))


def check_invariants(inst: Instance) -> None:
    b = inst.pools.boundaries
    assert b[0] == 0 and b[-1] == inst.pools.max_context_tokens
    assert all(x < y for x, y in zip(b, b[1:]))
    assert inst.gpus and len({g.name.lower() for g in inst.gpus}) == len(inst.gpus)
    assert 0.0 <= inst.workload.truncated_share < 1.0
    assert inst.workload.arrival_rate_req_per_s > 0 and 0 < inst.workload.input_fraction < 1
    lengths = inst.workload.lengths
    longest = lengths.max_tokens if inst.workload.kind == "cdf" else lengths.total_tokens.max()
    assert longest <= inst.pools.max_context_tokens
    assert any(int(g.profile.n_slots(inst.pools.max_context_tokens)) >= 1 for g in inst.gpus)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_instances_load(path: Path):
    before = path.read_bytes()
    inst = load_instance(path)
    check_invariants(inst)
    assert path.read_bytes() == before


def test_shipped_instances_exist():
    assert len(SHIPPED) >= 10
    assert all(p.suffix in (".yaml", ".yml", ".json", ".toml") for p in SHIPPED)


TRIO_TOML = """\
name = "trio"
objective = "power"

[workload]
cdf = "cdf.json"
arrival_rate = 42.5
input_fraction = 0.75

[slo]
ttft_p99_ms = 400
tpot_p99_ms = 50
ttft_model = "mean-prefill"
scope = "fleet"

[[gpus]]
name = "a100"
profile = "a100-80gb"
max_count = 16
min_count = 2
availability = 0.95
cost_per_hr = 3.5

[[gpus]]
name = "h100"
profile = "H100-80GB"

[pools]
max_pools = 3
max_context = 16384
boundaries = [2048, 8192]
routing = "length"

[constraints]
max_utilization = 0.8
max_power_kw = 120.0
max_cost_per_hr = 500.0
max_total_gpus = 40
"""


def _trio(tmp_path: Path) -> list[Path]:
    (tmp_path / "cdf.json").write_text(json.dumps([[512, 0.3], [4096, 0.9], [32768, 1.0]]))
    data = tomllib.loads(TRIO_TOML)
    paths = [tmp_path / "trio.yaml", tmp_path / "trio.json", tmp_path / "trio.toml"]
    paths[0].write_text(yaml.safe_dump(data, sort_keys=False))
    paths[1].write_text(json.dumps(data, indent=2))
    paths[2].write_text(TRIO_TOML)
    return paths


def resolved_fields(inst: Instance) -> dict:
    w = inst.workload
    return {
        "name": inst.name, "slo": inst.slo, "pools": inst.pools, "constraints": inst.constraints,
        "objective": inst.objective, "gpus": inst.gpus,
        "workload": (w.kind, w.source, w.truncated_share, w.arrival_rate_req_per_s, w.input_fraction),
        "lengths": (w.lengths.lo_tokens.tolist(), w.lengths.hi_tokens.tolist(), w.lengths.prob.tolist()),
    }


def test_yaml_json_toml_trio_resolve_equal(tmp_path: Path):
    yaml_inst, json_inst, toml_inst = (load_instance(p) for p in _trio(tmp_path))
    assert resolved_fields(yaml_inst) == resolved_fields(json_inst) == resolved_fields(toml_inst)
    inst = toml_inst
    assert inst.slo.ttft_p99_s == pytest.approx(0.4) and inst.slo.tpot_p99_s == pytest.approx(0.05)
    assert inst.pools.boundaries == (0, 2048, 8192, 16384)
    assert inst.gpu("a100").profile.cost_usd_per_hr == 3.5
    assert inst.gpu("A100").profile.name == "A100-80GB"  # catalogue and gpu names match case-insensitively
    assert inst.workload.truncated_share == pytest.approx(1 - (0.9 + 0.1 * (16384 - 4096) / (32768 - 4096)))
    assert inst.workload.source == str(tmp_path / "cdf.json")


def test_defaults(tmp_path: Path):
    data = {"workload": {"cdf": "builtin:azure", "arrival_rate": 10}, "slo": {"ttft_p99_ms": 500},
            "gpus": [{"name": "h100", "profile": "H100-80GB"}], "pools": {"max_context": 8192}}
    path = tmp_path / "minimal.yml"
    path.write_text(yaml.safe_dump(data))
    inst = load_instance(path)
    assert inst.name == "minimal" and inst.objective == "cost" and inst.description == ""
    assert (inst.slo.ttft_model, inst.slo.scope, inst.slo.tpot_p99_s) == ("batched", "pool", None)
    assert (inst.pools.max_pools, inst.pools.routing) == (1, "length")
    assert inst.constraints.max_utilization == DEFAULT_MAX_UTILIZATION
    assert inst.workload.input_fraction == 0.8
    g = inst.gpu("h100")
    assert (g.max_count, g.min_count, g.availability, g.kind) == (None, 0, 1.0, "calibrated")


def test_builtin_lmsys_resolves_and_truncates():
    data = copy.deepcopy(BASE)
    data["pools"]["max_context"] = 8192
    inst = instance_from_dict(data)
    w = inst.workload
    assert w.kind == "cdf" and w.source == "builtin:lmsys"
    assert float(w.lengths.cdf(2048)) == pytest.approx(0.94828, abs=1e-5)  # data/workloads/README.md table
    assert w.truncated_share == pytest.approx(1 - 0.99653, abs=1e-5)
    assert w.lengths.max_tokens == 8192
    assert inst.pools.boundaries == (0, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)


def test_wrapped_cdf_form_equals_builtin(tmp_path: Path):
    (tmp_path / "agent.json").write_text((WORKLOADS / "agent_heavy_cdf.json").read_text())
    direct = instance_from_dict({**BASE, "workload": {"cdf": "agent.json", "arrival_rate": 10}}, tmp_path / "x.yaml")
    builtin = instance_from_dict({**BASE, "workload": {"cdf": "builtin:agent_heavy", "arrival_rate": 10}})
    assert float(direct.workload.lengths.cdf(2048)) == pytest.approx(0.26459, abs=1e-5)
    np.testing.assert_array_equal(direct.workload.lengths.prob, builtin.workload.lengths.prob)


def test_inline_cdf():
    inst = instance_from_dict({**BASE, "workload": {"cdf": [[100, 0.5], [300, 1.0]], "arrival_rate": 1}})
    assert inst.workload.source == "inline" and inst.workload.lengths.mean_tokens == pytest.approx(125.0)
    assert inst.pools.boundaries == (0, 100, 300, 65536)


def test_trace_workload_defaults_to_its_own_rate():
    data = {**BASE, "workload": {"trace": "builtin:azure_conv_trace"}}
    data["pools"] = {"max_pools": 2, "max_context": 4096}
    inst = instance_from_dict(data)
    w = inst.workload
    assert w.kind == "trace" and len(w.lengths.arrived_at_s) == 19366
    assert w.arrival_rate_req_per_s == pytest.approx(5.530, abs=1e-3)  # data/workloads/README.md
    assert w.truncated_share == pytest.approx(1 - 0.9168, abs=1e-3)
    assert int(w.lengths.total_tokens.max()) == 4096
    assert w.input_fraction == pytest.approx(float(w.lengths.prompt_tokens.sum() / w.lengths.total_tokens.sum()))
    assert inst.pools.boundaries == (0, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
    given = instance_from_dict({**data, "workload": {"trace": "builtin:azure_conv_trace", "arrival_rate": 50}})
    assert given.workload.arrival_rate_req_per_s == 50


def test_relative_paths_resolve_against_instance_folder(tmp_path: Path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "inst").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "data" / "c.json").write_text("[[1000, 0.5], [2000, 1.0]]")
    (tmp_path / "data" / "t.csv").write_text(TRACE_HEADER + "0,100,10\n1,200,20\n3,300,30\n")
    cdf_inst = tmp_path / "inst" / "cdf.yaml"
    cdf_inst.write_text(yaml.safe_dump({**BASE, "workload": {"cdf": "../data/c.json", "arrival_rate": 3}}))
    trace_inst = tmp_path / "inst" / "trace.json"
    trace_inst.write_text(json.dumps({**BASE, "workload": {"trace": "../data/t.csv"}}))
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_instance(cdf_inst).workload.lengths.max_tokens == 2000
    trace = load_instance(trace_inst).workload
    assert trace.arrival_rate_req_per_s == pytest.approx(2 / 3)
    assert trace.source == str(tmp_path / "inst" / "../data/t.csv")
    # A mapping without a path resolves against the current folder.
    monkeypatch.chdir(tmp_path / "data")
    assert instance_from_dict({**BASE, "workload": {"cdf": "c.json", "arrival_rate": 3}}).workload.kind == "cdf"


def test_computed_gpu_option():
    data = {**BASE, "gpus": [{"name": "h100-70b-tp8", "hardware": "h100", "model": "llama-3.1-70b", "tp": 8,
                              "dtype": "fp16", "max_count": 64, "cost_per_hr": 30.0}]}
    data["pools"] = {"max_context": 8192}
    option = instance_from_dict(data).gpu("h100-70b-tp8")
    assert option.kind == "computed" and option.profile.gpus_per_replica == 8
    assert option.profile.cost_usd_per_hr == 30.0 and option.profile.n_slots(8192) >= 1


def test_gpu_lookup_names_known_gpus():
    inst = instance_from_dict(BASE)
    assert inst.gpu("h100").profile.name == "H100-80GB"
    with pytest.raises(InstanceError, match="unknown gpu 'b200'; known: a100, h100"):
        inst.gpu("b200")


# --------------------------------------------------------------------------------------------
# Overrides (--set)
# --------------------------------------------------------------------------------------------


def test_overrides_change_values(tmp_path: Path):
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    inst = load_instance(path, [
        "gpus.h100.max_count=8",
        "slo.ttft_p99_ms=250",
        "slo.ttft_model=mean-prefill",
        "pools.boundaries=[1024, 4096]",
        "constraints.max_power_kw=12.5",
        "workload.cdf=builtin:azure",
        "objective = tok_per_watt",
    ])
    assert inst.gpu("h100").max_count == 8 and inst.gpu("a100").max_count == 64
    assert inst.slo.ttft_p99_s == pytest.approx(0.25) and inst.slo.ttft_model == "mean-prefill"
    assert inst.pools.boundaries == (0, 1024, 4096, 65536)
    assert inst.constraints.max_power_kw == 12.5
    assert inst.workload.source == "builtin:azure" and inst.objective == "tok_per_watt"


def test_overrides_add_a_missing_section():
    data = {k: v for k, v in BASE.items() if k != "constraints"}
    inst = instance_from_dict(data, overrides=["constraints.max_total_gpus=12"])
    assert inst.constraints.max_total_gpus == 12


@pytest.mark.parametrize("override, field, phrase", [
    ("slo.ttft_p99_ms", "--set slo.ttft_p99_ms", "no '='"),
    ("gpus.h200.max_count=8", "--set gpus.h200.max_count", "no gpu named 'h200'; known: a100, h100"),
    ("slo.ttft_p99_ms.x=1", "--set slo.ttft_p99_ms.x", "slo.ttft_p99_ms is 500, not a mapping"),
    ("pools.boundaries.5=3", "--set pools.boundaries.5", "no item '5'"),
    ("slo..x=1", "--set slo..x", "is not a dotted path"),
    ("slo.ttft_p99_ms=[1", "--set slo.ttft_p99_ms", "is not valid YAML"),
    ("slo.unknown=3", "--set slo.unknown", "unknown key; allowed: ttft_p99_ms"),
    ("bogus=3", "--set bogus", "unknown key; allowed: name"),
    ("gpus.a100.max_count=0", "--set gpus.a100.max_count", "must be >= 1"),
])
def test_bad_overrides_are_rejected(tmp_path: Path, override: str, field: str, phrase: str):
    data = copy.deepcopy(BASE)
    data["pools"]["boundaries"] = [1024]
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InstanceError) as info:
        load_instance(path, [override])
    assert matching_lines(info.value.problems, f"{path}: {field}: ", phrase), info.value.problems


def test_user_file_is_byte_identical_after_overrides(tmp_path: Path):
    path = tmp_path / "inst.yaml"
    text = "# my comment\n" + yaml.safe_dump(BASE, sort_keys=False)
    path.write_text(text)
    before, mtime = path.read_bytes(), path.stat().st_mtime_ns
    load_instance(path, ["gpus.a100.max_count=8", "pools.max_context=8192"])
    with pytest.raises(InstanceError):
        load_instance(path, ["slo.ttft_p99_ms=-1"])
    assert path.read_bytes() == before and path.stat().st_mtime_ns == mtime


def test_overrides_do_not_touch_the_callers_mapping():
    data = copy.deepcopy(BASE)
    instance_from_dict(data, overrides=["gpus.a100.max_count=8", "constraints.max_power_kw=3"])
    assert data == BASE
    assert apply_overrides(data, ["slo.scope=fleet"])["slo"]["scope"] == "fleet" and data == BASE


@settings(max_examples=25, deadline=None)
@given(max_count=st.integers(1, 10**9), ttft_ms=st.floats(1e-3, 1e6, allow_nan=False))
def test_override_round_trip(max_count: int, ttft_ms: float):
    inst = instance_from_dict(BASE, overrides=[f"gpus.a100.max_count={max_count}", f"slo.ttft_p99_ms={ttft_ms!r}"])
    assert inst.gpu("a100").max_count == max_count
    assert inst.slo.ttft_p99_s == pytest.approx(ttft_ms / 1000)


# --------------------------------------------------------------------------------------------
# Robustness: arbitrary values anywhere give an Instance or an InstanceError, nothing else
# --------------------------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
TARGETS = [("workload",), ("workload", "cdf"), ("workload", "trace"), ("workload", "arrival_rate"), ("slo",),
           ("slo", "ttft_p99_ms"), ("gpus",), ("gpus", 0), ("gpus", 0, "profile"), ("gpus", 1, "max_count"),
           ("pools",), ("pools", "boundaries"), ("pools", "max_context"), ("constraints",), ("objective",),
           ("name",)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=st.sampled_from(TARGETS), value=JSONISH)
def test_arbitrary_values_never_escape_as_other_errors(target, value):
    data = copy.deepcopy(BASE)
    node = data
    for key in target[:-1]:
        node = node[key]
    node[target[-1]] = value
    try:
        instance_from_dict(data, Path("/nonexistent/fuzz.yaml"))
    except InstanceError as err:
        assert err.problems and all(line.startswith("/nonexistent/fuzz.yaml: ") for line in err.problems)


def test_a_number_yaml_reads_as_text_gets_a_hint(tmp_path: Path):
    """YAML 1.1 (PyYAML) reads ``5e2`` (no sign in the exponent, no decimal point) as a string: the error says
    so and how to write it, instead of 'is not a number'."""
    path = tmp_path / "rate.yaml"
    path.write_text(yaml.safe_dump(copy.deepcopy(BASE)).replace("arrival_rate: 100", "arrival_rate: 5e2"))
    assert "5e2" in path.read_text()
    with pytest.raises(InstanceError) as info:
        load_instance(path)
    (line,) = info.value.problems
    # the hint rewrites the user's own value in the form YAML 1.1 reads as a number (a decimal point, a signed
    # exponent) and as a plain number
    assert "workload.arrival_rate" in line and "is text to YAML" in line and "write 5.0e+2 or 500" in line
    assert yaml.safe_load("x: 5.0e+2")["x"] == 500.0


def test_an_integer_yaml_reads_as_text_gets_the_hint_too(tmp_path: Path):
    """The hint comes before 'is not an integer' (``max_count: 1e2`` is text to YAML 1.1 as well)."""
    data = copy.deepcopy(BASE)
    data["gpus"][0]["max_count"] = "1e2"
    path = tmp_path / "count.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InstanceError) as info:
        load_instance(path)
    assert any("gpus[0].max_count" in line and "is text to YAML" in line for line in info.value.problems)


@pytest.mark.parametrize("field, patch", [
    ("workload.cdf", {"workload": {"cdf": "a\x00b.json", "arrival_rate": 50}}),
    ("workload.trace", {"workload": {"trace": "\x00", "arrival_rate": 50}}),
    ("gpus[0].profile_file", {"gpus": [{"name": "g", "profile_file": "\x00"}]}),
    ("gpus[0].model_config", {"gpus": [{"name": "g", "hardware": "H100-SXM-80GB", "model_config": "\x00"}]}),
])
def test_a_file_name_with_a_nul_byte_is_one_line_naming_the_field(tmp_path: Path, field, patch):
    """The operating system refuses such a name with ValueError, not OSError (found by the fuzzer): it is bad
    input like any unreadable file, reported on one line naming the file and the field."""
    data = {"name": "x", "workload": {"cdf": "builtin:lmsys", "arrival_rate": 50}, "slo": {"ttft_p99_ms": 500},
            "gpus": [{"name": "a100", "profile": "A100-80GB"}],
            "pools": {"max_pools": 2, "max_context": 8192, "boundaries": "auto"}, **patch}
    path = tmp_path / "i.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InstanceError) as err:
        load_instance(path)
    (line,) = [ln for ln in str(err.value).splitlines() if field in ln]
    assert line.startswith(f"{path}: {field}") and "contains a NUL byte" in line
