"""Bad input at the command line: exit 2 and one ``error:`` line naming the flag or file and the field, never
exit 1 (``internal error``) or a traceback. Each case ran into an internal error or named the wrong culprit."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

QUICKSTART = "instances/quickstart.yaml"


def _one_line(args, repo_root) -> str:
    """Run the command in the checkout's folder; its one stderr line (exit 2, no traceback)."""
    import os

    here = os.getcwd()
    os.chdir(repo_root)
    try:
        res = CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(here)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "internal error" not in res.output, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_fleet_bound_beyond_int64_names_the_pool(repo_root):
    line = _one_line(["evaluate", QUICKSTART, "--fleet", "0-99999999999999999999:a100#1"], repo_root)
    assert line.startswith("error: --fleet: pool 0-99999999999999999999") and "max_context (65536)" in line


@pytest.mark.parametrize("count", ["-1", "1.5", ""])
def test_fleet_bad_glued_count_says_the_count_is_wrong(repo_root, count):
    line = _one_line(["evaluate", QUICKSTART, "--fleet", f"0-65536:a100x{count}"], repo_root)
    assert line.startswith("error: --fleet: pool 0-65536:") and f"replica count {count!r}" in line
    assert "unknown gpu" not in line


def _trace_instance(tmp_path, rows: str, rate: str = ", arrival_rate: 5") -> str:
    (tmp_path / "t.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    doc = {"workload": yaml.safe_load(f"{{trace: t.csv{rate}}}"), "slo": {"ttft_p99_ms": 500},
           "gpus": [{"name": "h100", "profile": "H100-80GB"}], "pools": {"max_pools": 1, "max_context": 4096}}
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_trace_with_a_huge_token_count_names_the_row(tmp_path, repo_root):
    path = _trace_instance(tmp_path, "0.0,99999999999999999999999,44\n1.0,10,10\n")
    line = _one_line(["validate", path], repo_root)
    assert line.startswith(f"error: {path}: workload.trace: ") and "row 1 (line 2)" in line


def test_trace_replay_of_rows_at_one_instant_is_refused(tmp_path, repo_root):
    """Replaying rescales the trace's own rate to arrival_rate; rows that all share one instant have none."""
    path = _trace_instance(tmp_path, "5.0,100,20\n5.0,300,40\n5.0,50,10\n")
    line = _one_line(["simulate", path, "--arrivals", "trace", "--fleet", "0-4096:h100x1", "--requests", "1000"],
                     repo_root)
    assert line.startswith("error: --arrivals: ") and "one instant" in line and "--arrivals poisson" in line


def test_set_a_date_that_does_not_exist(repo_root):
    line = _one_line(["validate", QUICKSTART, "--set", "gpus.h100.max_count=2024-02-30"], repo_root)
    assert line.startswith(f"error: {QUICKSTART}: --set gpus.h100.max_count: ") and "2024-02-30" in line


def test_set_takes_the_bracket_path_that_errors_print(repo_root):
    """``gpus[0].hardware`` addresses the first option (an unknown GPU proves the value reached it)."""
    line = _one_line(["validate", QUICKSTART, "--set", "gpus[0].hardware=X"], repo_root)
    assert line.startswith(f"error: {QUICKSTART}: --set gpus[0].hardware: unknown hardware 'X'"), line
    res = CliRunner().invoke(main, ["validate", f"{repo_root}/{QUICKSTART}", "--set", "gpus[1].max_count=16",
                                    "--json", "-"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gpus"][1]["max_count"] == 16


def test_set_out_of_range_names_the_flag(repo_root):
    line = _one_line(["validate", QUICKSTART, "--set", "workload.arrival_rate=-1"], repo_root)
    assert line.startswith(f"error: {QUICKSTART}: --set workload.arrival_rate: -1 is out of range"), line


@pytest.mark.parametrize("text, spelled", [("1e+7", "1.0e+7"), ("5e2", "5.0e+2"), ("7.5e9", "7.5e+9")])
def test_yaml_exponent_hint_spells_what_yaml_reads(tmp_path, repo_root, text, spelled):
    doc = yaml.safe_load((repo_root / QUICKSTART).read_text())
    path = tmp_path / "e.yaml"
    doc["workload"]["cdf"] = "builtin:lmsys"
    path.write_text(yaml.safe_dump(doc).replace("arrival_rate: 100", f"arrival_rate: {text}"))
    assert isinstance(yaml.safe_load(text), str) and isinstance(yaml.safe_load(spelled), float)
    line = _one_line(["validate", str(path)], repo_root)
    assert line.startswith(f"error: {path}: workload.arrival_rate: ") and f"write {spelled}" in line, line


@pytest.fixture(scope="module")
def solve_doc(repo_root, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("solve") / "solve.json"
    res = CliRunner().invoke(main, ["solve", str(repo_root / QUICKSTART), "--json", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


@pytest.mark.parametrize("key, value, words", [
    ("candidates", [1], "candidates: expected a mapping"), ("provenance", 3, "provenance: expected a mapping"),
    ("total_replicas", 3.5, "total_replicas: 3.5 is not an integer"),
    ("ttft_margin", {}, "ttft_margin: a mapping is not a number"), ("overrides", 5, "overrides: expected a list")])
def test_report_checks_the_result_against_the_contract(solve_doc, tmp_path, repo_root, key, value, words):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**solve_doc, key: value}))
    line = _one_line(["report", str(path), "-o", str(tmp_path / "r.html")], repo_root)
    assert line == f"error: RESULT: {path}: {words}" + line.split(words, 1)[1], line
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("drop", ["ttft_sizing_ms", "pools.0.min_tokens"])
def test_report_refuses_a_current_document_that_lacks_a_key(solve_doc, tmp_path, repo_root, drop):
    """A document of the current contract with a key deleted (the fuzz found ``ttft_sizing_ms`` and a pool's
    ``min_tokens``, which the page read unguarded) is one line naming the key, exit 2, and no page."""
    import copy

    doc = copy.deepcopy(solve_doc)
    *parents, key = drop.split(".")
    node = doc
    for part in parents:
        node = node[int(part) if part.isdigit() else part]
    del node[key]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    line = _one_line(["report", str(path), "-o", str(tmp_path / "r.html")], repo_root)
    assert line.startswith(f"error: RESULT: {path}: ") and key in line and "missing" in line, line
    assert not (tmp_path / "r.html").exists()


def test_report_checks_whatif_scenarios(tmp_path, repo_root):
    doc = {"schema_version": "2.1", "command": "whatif", "instance": "q", "slo_ttft_p99_ms": 500.0, "sweeps": [],
           "base": {}, "scenarios": [{"index": 0, "key": "base", "overrides": 5, "status": "optimal"}]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc))
    line = _one_line(["report", str(path), "-o", str(tmp_path / "w.html")], repo_root)
    assert line.startswith(f"error: RESULT: {path}: scenarios[0].overrides: expected a mapping"), line
