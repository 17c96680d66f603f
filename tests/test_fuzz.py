"""Fuzzing the input edge (hypothesis): instance files, ``--fleet`` specs, ``--set`` overrides, solve JSON plan
files and result files for ``report``, profile files, Hugging Face ``config.json`` files, CDF JSON files, trace
CSV files, user catalogues and the measurement files ``profile fit`` reads, each mutated at random (wrong types,
missing and unknown keys, out-of-range numbers, random strings, nested junk).

Whatever the input, the loader returns a result or raises :class:`InstanceError` whose every line names the
file (and the CLI exits 0 or 2, one ``error:`` line each); never another exception, a traceback or exit 1.

The default set runs a fixed, derandomised budget per target (a few seconds in all); the ``slow`` tests run
1,600 examples per target (a third for plan and result files; ``FLEETOPT_FUZZ_EXAMPLES`` for more).
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetopt.optimizer.errors import InstanceError

DEFAULT_EXAMPLES = 25
SLOW_EXAMPLES = int(__import__("os").environ.get("FLEETOPT_FUZZ_EXAMPLES", 1_600))
"""Per target in the slow set (a third of it for plan and result files); set FLEETOPT_FUZZ_EXAMPLES for a longer
run."""
REPO = Path(__file__).resolve().parents[1]

BASE_INSTANCE = {
    "name": "fuzz",
    "workload": {"cdf": "builtin:lmsys", "arrival_rate": 50, "input_fraction": 0.8},
    "slo": {"ttft_p99_ms": 500, "ttft_model": "batched", "scope": "pool"},
    "gpus": [{"name": "a100", "profile": "A100-80GB", "max_count": 64, "availability": 0.99},
             {"name": "h100x8", "hardware": "H100-SXM-80GB", "model": "Llama-3.1-8B", "tp": 1, "dtype": "fp16"}],
    "pools": {"max_pools": 2, "max_context": 65536, "boundaries": "auto", "routing": "length",
              "compress": {"gammas": [1.5], "success_probability": 0.9}},
    "constraints": {"max_utilization": 0.85, "max_power_kw": 30, "max_cost_per_hr": 60, "max_total_gpus": 40},
    "energy": {"usd_per_kwh": 0.12, "pue": 1.3},
    "objective": "cost",
    "allow_mixed_models": True,     # a 70B-class unit next to a Llama-3.1-8B option
}

CONFIG_8B = {
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "vocab_size": 128256,
}
"""Llama-3.1-8B's published config.json, the fields the reader uses."""

SCALARS = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
           | st.sampled_from(["auto", "builtin:lmsys", "builtin:nope", "A100-80GB", "fp8", "../x", "", "1e309",
                              "-0", "0x10", "nan", "a100", "h100x8", "split", "fleet"]))
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


@st.composite
def mutated(draw, base, junk=JUNK):
    """``base`` with one to four random edits: a value replaced by junk, a key deleted, an unknown key added, a
    number scaled or negated, a list emptied; junk values drawn from ``junk``."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        node = doc
        for _depth in range(draw(st.integers(0, 3))):  # walk down a random path
            children = list(node.items()) if isinstance(node, dict) else list(enumerate(node)) \
                if isinstance(node, list) else []
            children = [(k, v) for k, v in children if isinstance(v, (dict, list))]
            if not children:
                break
            node = draw(st.sampled_from(children))[1]
        if isinstance(node, dict):
            keys = list(node)
            op = draw(st.sampled_from(["junk", "delete", "unknown", "number"]))
            if op == "unknown" or not keys:
                node[draw(st.text(max_size=10))] = draw(junk)
                continue
            key = draw(st.sampled_from(keys))
            if op == "delete":
                del node[key]
            elif op == "number" and isinstance(node[key], (int, float)) and not isinstance(node[key], bool):
                node[key] = node[key] * draw(st.sampled_from([-1, 0, 0.5, 1.5, 1e6, 1e300, math.inf, math.nan]))
            else:
                node[key] = draw(junk)
        elif isinstance(node, list):
            if node and draw(st.booleans()):
                node[draw(st.integers(0, len(node) - 1))] = draw(junk)
            else:
                node.clear()
    return doc


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="fleetopt-fuzz-") as folder:
        yield Path(folder)


def _fuzz(check, strategy, n: int) -> None:
    """Run ``check`` on ``n`` examples of ``strategy`` (derandomised for the default budget: reproducible)."""

    @settings(max_examples=n, deadline=None, derandomize=n <= DEFAULT_EXAMPLES, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        check(example)

    run()


def _named(err: InstanceError, name: str) -> None:
    """Every problem line starts with the file's name, is one line and carries no Python internals."""
    assert err.problems
    for line in err.problems:
        assert line.startswith(name), (name, line)
        assert "\n" not in line and "Traceback" not in line, line


def _load_as(path: Path, text: str):
    from fleetopt.optimizer.io.instance import load_instance

    path.write_text(text, encoding="utf-8")
    try:
        return load_instance(path)
    except InstanceError as err:
        _named(err, str(path))
        return None


def _dump(doc) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


# --------------------------------------------------------------------------------------------
# Targets
# --------------------------------------------------------------------------------------------


def _instance_check(workdir):
    def check(doc):
        _load_as(workdir / "instance.yaml", _dump(doc))
    return check


def _raw_text_check(workdir):
    def check(text):
        _load_as(workdir / "raw.yaml", text)
    return check


def _json_instance_check(workdir):
    def check(doc):
        text = json.dumps(doc, allow_nan=True)
        _load_as(workdir / "instance.json", text)
    return check


YAML_TEXT = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(["workload:", "  cdf: builtin:lmsys", "slo: {ttft_p99_ms: 5}", "gpus: [", "- a",
                              "pools: {max_context: 1e9}", "&a [*a]", "!!python/object:os.system", "? [1]: 2",
                              "key: key: key", "\t", "{", "}", "'", "workload: *x", "- {name: a, profile: A10G}",
                              "name: [1, 2]", "objective: 3", "d: 2024-02-30", "[" * 3]), max_size=8).map("\n".join),
)


def _fleet_check(inst):
    from fleetopt.optimizer.api import evaluate_report

    def check(text):
        try:
            evaluate_report(inst, text)
        except InstanceError as err:
            _named(err, "--fleet")
    return check


FLEET_TEXT = st.one_of(
    st.text(alphabet="0123456789-:,x@#.a1h ", max_size=40),
    st.text(max_size=30),
    st.lists(st.tuples(st.integers(-5, 2**70), st.integers(-5, 2**70), st.sampled_from(["a100", "h100x8", "zz", ""]),
                       st.sampled_from(["", "x0", "x3", "x-1", "x99999999999", "@1.5", "@0", "@nan", "#0", "#24",
                                        "#1e9", "x2@2#4"])),
             min_size=1, max_size=4).map(lambda ps: ",".join(f"{a}-{b}:{g}{s}" for a, b, g, s in ps)),
)


@pytest.fixture(scope="module")
def base_instance(workdir):
    from fleetopt.optimizer.io.instance import load_instance

    path = workdir / "base.yaml"
    doc = copy.deepcopy(BASE_INSTANCE)
    doc["pools"] = {"max_pools": 2, "max_context": 65536, "boundaries": [2048, 8192]}
    doc["gpus"] = doc["gpus"][:1]  # one calibrated option: a plan file is re-evaluated on every load
    doc.pop("constraints")
    path.write_text(_dump(doc))
    return load_instance(path)


@pytest.fixture(scope="module")
def solve_json(base_instance):
    from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance
    from fleetopt.optimizer.output.documents import solve_json as to_json

    return json.loads(json.dumps(to_json(solve_instance(base_instance, SolveOptions(top=2, method="mip"))),
                                 default=str))


def _plan_check(workdir, inst):
    from fleetopt.optimizer.simulation.plan_files import load_solved_plan

    def check(args):
        doc, rank = args
        path = workdir / "plan.json"
        path.write_text(json.dumps(doc, allow_nan=True))
        try:
            load_solved_plan(path, inst, rank)
        except InstanceError as err:
            _named(err, str(path))
    return check


def _profile_check(workdir):
    def check(doc):
        (workdir / "profile.yaml").write_text(_dump(doc))
        inst = {**BASE_INSTANCE, "gpus": [{"name": "fit", "profile_file": "profile.yaml"}]}
        inst["pools"] = {"max_pools": 2, "max_context": 8192}
        _load_as(workdir / "with_profile.yaml", _dump(inst))
    return check


def _config_check(workdir):
    def check(doc):
        (workdir / "config.json").write_text(json.dumps(doc, allow_nan=True))
        inst = {**BASE_INSTANCE, "gpus": [{"name": "hf", "hardware": "H100-SXM-80GB", "model_config": "config.json",
                                           "tp": 1, "dtype": "bf16"}]}
        inst["pools"] = {"max_pools": 2, "max_context": 8192}
        _load_as(workdir / "with_config.yaml", _dump(inst))
    return check


def _profile_doc():
    return yaml.safe_load((REPO / "data" / "profiles" / "h100_llama31_8b.yaml").read_text())


SET_PATHS = ["workload.arrival_rate", "slo.ttft_p99_ms", "gpus.a100.max_count", "gpus[0].profile", "gpus[1]",
             "gpus[9].tp", "gpus.zz.x", "pools.compress.gammas[0]", "pools.max_context", "pools[0]", "a..b", "gpus[",
             "constraints", "objective", "name", "workload"]
SET_TEXT = st.one_of(
    st.tuples(st.sampled_from(SET_PATHS) | st.text(max_size=12),
              st.sampled_from(["-1", "0", "1e+7", "1e7", "2024-02-30", "2024-02-03", "nan", ".inf", "[1", "{a: 1}",
                               "99999999999999999999999", "", "~", "!!python/name:os.system", "&a [*a]"])
              | st.text(max_size=12)).map(lambda pv: f"{pv[0]}={pv[1]}"),
    st.text(max_size=20))


def _set_check(workdir):
    from fleetopt.optimizer.io.instance import instance_from_dict

    path = workdir / "set.yaml"

    def check(overrides):
        try:
            instance_from_dict(BASE_INSTANCE, path, overrides)
        except InstanceError as err:
            _named(err, str(path))
    return check


def _cdf_check(workdir):
    def check(doc):
        (workdir / "cdf.json").write_text(json.dumps(doc, allow_nan=True))
        inst = {**BASE_INSTANCE, "workload": {"cdf": "cdf.json", "arrival_rate": 5}}
        _load_as(workdir / "with_cdf.yaml", _dump(inst))
    return check


TRACE_ROWS = st.lists(st.tuples(st.sampled_from(["0", "0.5", "1", "1", "-1", "nan", "inf", "1e309", "x", ""])
                                | st.floats(0, 1e6).map(repr),
                                *[st.sampled_from(["0", "1", "100", "-5", "1.5", "2.0", "99999999999999999999999",
                                                   "1e30", "", "x"]) | st.integers(0, 2**40).map(str)] * 2),
                      max_size=6)


def _trace_check(workdir):
    def check(args):
        header, rows, rate = args
        (workdir / "trace.csv").write_text("\n".join([header] + [",".join(r) for r in rows]) + "\n")
        workload = {"trace": "trace.csv", **({} if rate is None else {"arrival_rate": rate})}
        inst = {**BASE_INSTANCE, "workload": workload, "pools": {"max_pools": 2, "max_context": 8192}}
        _load_as(workdir / "with_trace.yaml", _dump(inst))
    return check


TRACE_TEXT = st.tuples(st.sampled_from(["arrived_at,num_prefill_tokens,num_decode_tokens",
                                        "arrived_at,num_prefill_tokens", "a,b,c", ""]),
                       TRACE_ROWS, st.none() | st.sampled_from([5, 0, -1]))


def _catalog_check(workdir):
    from fleetopt.optimizer.io.instance import load_instance

    def check(doc):
        (workdir / "catalog.yaml").write_text(_dump(doc))
        inst = yaml.safe_load((REPO / "instances" / "user_catalog.yaml").read_text())
        inst["catalog"] = "catalog.yaml"
        inst["workload"]["cdf"] = "builtin:lmsys"
        path = workdir / "with_catalog.yaml"
        path.write_text(_dump(inst))
        try:
            load_instance(path)
        except InstanceError as err:  # a line names the instance or the catalogue file it points to
            for line in err.problems:
                _named(InstanceError(line), str(path) if line.startswith(str(path)) else str(workdir / "catalog.yaml"))
    return check


def _report_check(workdir):
    from fleetopt.optimizer.cli import main

    def check(doc):
        path = workdir / "result.json"
        path.write_text(json.dumps(doc, allow_nan=True))
        res = CliRunner().invoke(main, ["report", str(path), "-o", str(workdir / "result.html")])
        assert res.exit_code in (0, 2), res.output
        assert "Traceback" not in res.output and "internal error" not in res.output, res.output
        if res.exit_code == 2:
            lines = [line for line in res.stderr.splitlines() if line.strip()]
            assert len(lines) == 1 and lines[0].startswith(f"error: RESULT: {path}"), lines
    return check


MEASUREMENTS = REPO / "data" / "measurements"
_DECODE_LINES = (MEASUREMENTS / "h100_llama31_8b_decode.csv").read_text().splitlines()
MEASUREMENT_CELL = (st.sampled_from(["", "nan", "inf", "-1", "0", "1e309", "99999999999999999999999", "bf16", "x",
                                     "H100-SXM-80GB", "Llama-3.1-8B", '"', "1,2"])
                    | st.integers(-(2**70), 2**70).map(str) | st.floats().map(repr) | st.text(max_size=6))
MEASUREMENT_CSV = st.tuples(
    st.sampled_from([_DECODE_LINES[0], _DECODE_LINES[0].replace(",power_w", ""), "a,b,c", ""]),
    st.lists(st.sampled_from(_DECODE_LINES[1:]), min_size=0, max_size=12),
    st.lists(st.tuples(st.integers(0, 11), st.integers(0, 8), MEASUREMENT_CELL), max_size=4))
"""A decode measurement CSV: a header (the real one, one short, junk or none), real rows, and cells replaced."""


def _measurement_check(workdir):
    """``profile fit`` on a mutated decode CSV and meta file beside the real prefill CSV: exit 0 or 2, never 1;
    every error line names one of the files."""
    from fleetopt.optimizer.cli import main

    def check(example):
        (header, rows, edits), meta = example
        rows = [row.split(",") for row in rows]
        for r, c, cell in edits:
            if r < len(rows) and c < len(rows[r]):
                rows[r][c] = cell
        (workdir / "decode.csv").write_text("\n".join([header, *(",".join(row) for row in rows)]) + "\n")
        (workdir / "meta.json").write_text(json.dumps(meta, allow_nan=True))
        files = [workdir / "decode.csv", MEASUREMENTS / "h100_llama31_8b_prefill.csv", workdir / "meta.json"]
        res = CliRunner().invoke(main, ["profile", "fit", *map(str, files), "-o", str(workdir / "fitted.yaml")])
        assert res.exit_code in (0, 2), res.output
        assert "Traceback" not in res.output and "internal error" not in res.output, res.output
        if res.exit_code == 2:
            lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
            assert lines and all(any(str(f) in line for f in files) for line in lines), lines
        (workdir / "fitted.yaml").unlink(missing_ok=True)
    return check


# --------------------------------------------------------------------------------------------
# The default budget and the slow one
# --------------------------------------------------------------------------------------------

TARGETS = ["instance", "instance_json", "yaml_text", "fleet", "plan", "profile", "config", "set", "cdf", "trace",
           "catalog", "report", "measurement"]


def _run(target: str, n: int, request) -> None:
    workdir = request.getfixturevalue("workdir")
    if target == "instance":
        _fuzz(_instance_check(workdir), mutated(BASE_INSTANCE), n)
    elif target == "instance_json":
        _fuzz(_json_instance_check(workdir), mutated(BASE_INSTANCE) | JUNK, n)
    elif target == "yaml_text":
        _fuzz(_raw_text_check(workdir), YAML_TEXT, n)
    elif target == "fleet":
        _fuzz(_fleet_check(request.getfixturevalue("base_instance")), FLEET_TEXT, n)
    elif target == "plan":
        plan = request.getfixturevalue("solve_json")
        _fuzz(_plan_check(workdir, request.getfixturevalue("base_instance")),
              st.tuples(mutated(plan), st.none() | st.integers(-1, 4)), n)
    elif target == "profile":
        _fuzz(_profile_check(workdir), mutated(_profile_doc()), n)
    elif target == "config":
        _fuzz(_config_check(workdir), mutated(CONFIG_8B), n)
    elif target == "set":
        _fuzz(_set_check(workdir), st.lists(SET_TEXT, min_size=1, max_size=3), n)
    elif target == "cdf":
        cdf = json.loads((REPO / "data" / "workloads" / "lmsys_cdf.json").read_text())
        _fuzz(_cdf_check(workdir), mutated({"points": cdf}).map(lambda d: d.get("points", d)) | JUNK, n)
    elif target == "trace":
        _fuzz(_trace_check(workdir), TRACE_TEXT, n)
    elif target == "catalog":
        doc = yaml.safe_load((REPO / "instances" / "catalogs" / "catalog_example.yaml").read_text())
        _fuzz(_catalog_check(workdir), mutated(doc), n)
    elif target == "report":
        _fuzz(_report_check(workdir), mutated(request.getfixturevalue("solve_json")), n)
    elif target == "measurement":
        meta = json.loads((MEASUREMENTS / "h100_llama31_8b_meta.json").read_text())
        _fuzz(_measurement_check(workdir), st.tuples(MEASUREMENT_CSV, mutated(meta) | JUNK), n)


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz(target, request):
    # a plan file that survives its mutation is re-evaluated analytically on load (~0.2 s), and a result that
    # passes the report's checks is rendered with its figures (~0.4 s), and a measurement set that reads is fitted
    # (~0.4 s): fewer of them
    _run(target, {"plan": DEFAULT_EXAMPLES // 3, "report": DEFAULT_EXAMPLES // 5,
                  "measurement": DEFAULT_EXAMPLES // 5}.get(target, DEFAULT_EXAMPLES),
         request)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_long(target, request):
    _run(target, SLOW_EXAMPLES // 3 if target in ("plan", "report", "measurement") else SLOW_EXAMPLES, request)


def test_cli_on_junk_exits_2_with_one_line_per_problem(workdir):
    """The command on a few junk files: exit 2, ``error: FILE: ...`` lines on stderr, no traceback."""
    from fleetopt.optimizer.cli import main

    runner = CliRunner()
    for k, text in enumerate(["workload: [1, {a: b}]\nslo: 7\n", "{", "gpus: !!python/object:os.system x\n",
                              _dump({**BASE_INSTANCE, "pools": {"max_context": 10**12}})]):
        path = workdir / f"junk{k}.yaml"
        path.write_text(text)
        result = runner.invoke(main, ["validate", str(path)])
        assert result.exit_code == 2, (text, result.output)
        assert "Traceback" not in result.output and "internal error" not in result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines and all(line.startswith(f"error: {path}") for line in lines), lines
