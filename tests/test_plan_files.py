"""``fleetopt simulate --plan FILE``: a solve's JSON read back, split-routing plans included."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.io.instance import load_instance

QUICKSTART = Path(__file__).resolve().parents[1] / "instances" / "ref_units_lmsys_a100_h100.yaml"


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def split_solve(repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "solve.json"
    r = _invoke("solve", repo_root / "tests" / "data" / "agent_split_units.yaml", "--top", 2, "--json", out)
    assert r.exit_code == 0, r.output
    return out, json.loads(out.read_text())


def test_split_plan_replays_its_routing(repo_root, split_solve, tmp_path):
    path, solved = split_solve
    assert solved["routing"] is not None and solved["fleet"] is None      # overlapping pools: no --fleet spec
    out = tmp_path / "sim.json"
    r = _invoke("simulate", repo_root / "tests" / "data" / "agent_split_units.yaml", "--plan", path, "--requests", 4000,
                "--json", out)
    assert r.exit_code == 0, r.output
    sim = json.loads(out.read_text())
    assert sim["router"] == "split"
    # the analytic side is the solved plan's own, pool by pool
    keys = ("min_tokens", "max_tokens", "gpu", "replicas", "arrival_rate", "ttft_p99_ms")
    assert [[p[k] for k in keys] for p in sim["pools"]] == [[p[k] for k in keys] for p in solved["pools"]]
    # measured requests per pool follow the routed rates (4.5 binomial standard deviations)
    share = np.array([p["arrival_rate"] for p in solved["pools"]]) / sum(p["arrival_rate"] for p in solved["pools"])
    n = np.array([p["requests"] for p in sim["pools"]])
    assert np.all(np.abs(n - n.sum() * share) <= 4.5 * np.sqrt(n.sum() * share * (1 - share)) + 1)


def test_rank_picks_a_solution(repo_root, split_solve, tmp_path):
    path, solved = split_solve
    out = tmp_path / "sim.json"
    r = _invoke("simulate", repo_root / "tests" / "data" / "agent_split_units.yaml", "--plan", path, "--rank", 2,
                "--requests", 1000, "--json", out)
    assert r.exit_code == 0, r.output
    sim = json.loads(out.read_text())
    assert [p["min_tokens"] for p in sim["pools"]] == [p["min_tokens"] for p in solved["solutions"][1]["pools"]]


def test_length_plan_file_equals_its_fleet_spec(repo_root, tmp_path):
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    solve = tmp_path / "solve.json"
    assert _invoke("solve", inst, "--json", solve).exit_code == 0
    spec = json.loads(solve.read_text())["fleet"]
    runs = []
    for how in (["--plan", solve], ["--fleet", spec]):
        out = tmp_path / "sim.json"
        r = _invoke("simulate", inst, *how, "--requests", 2000, "--json", out)
        assert r.exit_code in (0, 5), r.output      # 5: the plan's SLO verdict (its thin top pool may miss)
        d = json.loads(out.read_text())
        d.pop("wall_seconds")
        runs.append(d)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("setup, args, phrase", [
    (lambda p: p.write_text("{not json"), ["--plan", "{f}"], "not JSON (line 1"),
    (lambda p: p.write_text('{"command": "evaluate"}'), ["--plan", "{f}"], "command: not the JSON output"),
    (None, ["--plan", "{solve}"],
     "instance: the plan was solved for instance 'agent-split', not 'lmsys-a100-h100-units'"),
    (None, ["--plan", "{solve}", "--fleet", "0-65536:h100"], "give exactly one of them"),
    (None, ["--fleet", "0-65536:h100", "--rank", "2"], "--rank: picks a solution of --plan FILE"),
    (lambda p: p.write_text("{}"), ["--plan", "{missing}"], "no such file"),
])
def test_plan_file_errors_are_one_line(repo_root, split_solve, tmp_path, setup, args, phrase):
    f = tmp_path / "bad.json"
    if setup:
        setup(f)
    subst = {"{f}": str(f), "{solve}": str(split_solve[0]), "{missing}": str(tmp_path / "none.json")}
    r = _invoke("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", *[subst.get(a,
                                                                                                    a) for a in args])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0], r.output


def test_split_plan_refuses_another_router_and_a_bad_rank(repo_root, split_solve):
    inst = repo_root / "tests" / "data" / "agent_split_units.yaml"
    r = _invoke("simulate", inst, "--plan", split_solve[0], "--router", "length", "--requests", 1000)
    assert r.exit_code == 2 and "runs with its own routing" in r.output
    r = _invoke("simulate", inst, "--plan", split_solve[0], "--rank", 9, "--requests", 1000)
    assert r.exit_code == 2 and "solutions: --rank 9: the file holds 2 solution(s)" in r.output


# --- --set overrides travel with the plan ------------------------------------------------------------------------


def _printed_simulate(output: str) -> list[str]:
    """The arguments of the ``fleetopt simulate ...`` command ``solve`` prints, split as a shell would."""
    (line,) = [x for x in output.splitlines() if "fleetopt simulate" in x]
    return shlex.split(line.split("fleetopt ", 1)[1])


@pytest.fixture(scope="module")
def busy_solve(repo_root, tmp_path_factory):
    """quickstart solved at three times its file's 100 req/s."""
    out = tmp_path_factory.mktemp("busy") / "solve.json"
    r = _invoke("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--set",
                "workload.arrival_rate=300",
                "--json", out)
    assert r.exit_code == 0, r.output
    return out, json.loads(out.read_text()), r.output


def test_printed_simulate_command_keeps_the_overrides(busy_solve, tmp_path):
    """Running the printed command simulates the solved fleet at the solved 300 req/s, not the file's 100."""
    _, solved, output = busy_solve
    args = _printed_simulate(output)
    assert args[args.index("--set") + 1] == "workload.arrival_rate=300"
    out = tmp_path / "sim.json"
    r = _invoke(*args, "--requests", 2000, "--json", out)
    assert r.exit_code == 0, r.output
    sim = json.loads(out.read_text())
    assert sum(p["arrival_rate"] for p in sim["pools"]) == pytest.approx(300.0, rel=1e-9)
    assert [(p["min_tokens"], p["max_tokens"], p["gpu"], p["replicas"]) for p in sim["pools"]] == [
        (p["min_tokens"], p["max_tokens"], p["gpu"], p["replicas"]) for p in solved["pools"]]
    # the simulated stream runs at 300 req/s: 2000 Poisson arrivals span about 2000 / 300 s per replication
    assert sim["simulated_seconds"] == pytest.approx(2000 / 300, rel=0.15)


def test_printed_split_command_keeps_the_overrides(repo_root):
    r = _invoke("solve", repo_root / "tests" / "data" / "agent_split_units.yaml", "--set", "slo.ttft_p99_ms=1500")
    assert r.exit_code == 0, r.output
    args = _printed_simulate(r.output)
    assert args[:4] == ["simulate", str(repo_root / "tests" / "data" / "agent_split_units.yaml"), "--set",
                        "slo.ttft_p99_ms=1500"] and args[-2:] == ["--plan", "FILE"]


def test_solve_json_records_the_overrides(busy_solve, split_solve):
    assert busy_solve[1]["overrides"] == ["workload.arrival_rate=300"]
    assert split_solve[1]["overrides"] == []


def test_plan_file_needs_the_overrides_it_was_solved_with(repo_root, busy_solve, tmp_path):
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    path, solved, _ = busy_solve
    r = _invoke("simulate", inst, "--plan", path, "--requests", 1000)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert lines[0].startswith(f"error: {path}: overrides: ") and "pass --set 'workload.arrival_rate=300'" in lines[0]
    out = tmp_path / "sim.json"
    r = _invoke("simulate", inst, "--set", "workload.arrival_rate = 300.0", "--plan", path, "--requests", 1000,
                "--json", out)  # the same value, spelled differently
    assert r.exit_code == 0, r.output
    assert sum(p["arrival_rate"] for p in json.loads(out.read_text())["pools"]) == pytest.approx(300.0, rel=1e-9)
    # a file without the key was solved without overrides
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({k: v for k, v in solved.items() if k != "overrides"}))
    r = _invoke("simulate", inst, "--set", "workload.arrival_rate=300", "--plan", legacy, "--requests", 1000)
    assert r.exit_code == 2 and f"{legacy}: overrides: the plan was solved with no --set" in r.output, r.output


# --- a plan file is checked at the edge ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_solve(repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("quick") / "solve.json"
    assert _invoke("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--top", 2, "--json",
                   out).exit_code == 0
    return json.loads(out.read_text())


def _set_pool(key, value, k=0):
    def change(d):
        d["pools"][k][key] = value
    return change


def _over_cap(d):
    """One sequence more than the first pool's window holds on its GPU."""
    p = d["pools"][0]
    held = int(load_instance(QUICKSTART).gpu(p["gpu"]).profile.n_slots(p["max_tokens"]))
    p["max_num_seqs"] = held + 1
    return str(held)


@pytest.mark.parametrize("change, args, field, phrase", [
    (_set_pool("replicas", math.inf), [], "pools[0].replicas", "inf is not allowed"),
    (_set_pool("replicas", 1e30), [], "pools[0].replicas", "whole number in [1, "),
    (_set_pool("replicas", 1.7), [], "pools[0].replicas", "1.7 is not allowed"),
    (_set_pool("replicas", True), [], "pools[0].replicas", "a boolean is not allowed"),
    (_set_pool("max_tokens", 2048.9), [], "pools[0].max_tokens", "2048.9 is not allowed"),
    (_set_pool("max_num_seqs", 2.5), [], "pools[0].max_num_seqs", "2.5 is not allowed"),
    (_over_cap, [], "pools[0].max_num_seqs", "{held} sequences a"),
    (lambda d: d.update(solutions="zz"), ["--rank", "1"], "solutions", "must be a list"),
    (lambda d: d.update(solutions=[1]), ["--rank", "1"], "solutions[0]", "must be a mapping"),
    (lambda d: d["pools"].__setitem__(0, [0, 2048]), [], "pools[0]", "must be a mapping"),
    (lambda d: d.update(pools=d["pools"][:-1]), [], "pools[1].max_tokens", "should be pools.max_context 65536"),
    (lambda d: d["pools"][1].update(min_tokens=d["pools"][1]["min_tokens"] + 1), [], "pools[1].min_tokens",
     "without a routing, the pools tile"),
    (_set_pool("compress_gamma", 100.0), [], "pools", "the plan cannot be evaluated (the compression band"),
], ids=["inf", "1e30", "fraction", "bool", "tokens", "cap-fraction", "cap-over-window", "solutions-str",
        "solutions-int", "pool-list", "no-tiling", "gap", "gamma-band"])
def test_bad_plan_files_are_one_line_naming_file_and_field(repo_root, quick_solve, tmp_path, change, args, field,
                                                           phrase):
    data = json.loads(json.dumps(quick_solve))
    held = change(data)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(data))
    r = _invoke("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--plan", f, *args,
                "--requests", 500)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and "Traceback" not in r.output and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: {f}: ") and f": {field}" in lines[0], lines[0]
    assert phrase.format(held=held) in lines[0], lines[0]


def test_integral_numbers_are_whole_numbers(repo_root, quick_solve, tmp_path):
    """2.0 replicas is 2 replicas: the same simulation as the file as written."""
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    runs = []
    for change in (lambda d: None, lambda d: [p.update(replicas=float(p["replicas"])) for p in d["pools"]]):
        data = json.loads(json.dumps(quick_solve))
        change(data)
        f, out = tmp_path / "plan.json", tmp_path / "sim.json"
        f.write_text(json.dumps(data))
        r = _invoke("simulate", inst, "--plan", f, "--requests", 1000, "--json", out)
        assert r.exit_code in (0, 5), r.output      # 5: the plan's SLO verdict (its thin top pool may miss)
        runs.append({k: v for k, v in json.loads(out.read_text()).items() if k != "wall_seconds"})
    assert runs[0] == runs[1]


def test_bad_split_routing_names_the_file(repo_root, split_solve, tmp_path):
    """A routing whose rows no longer add up to the workload's segment rates is refused when the file is read."""
    data = json.loads(json.dumps(split_solve[1]))
    data["routing"]["rate_req_per_s"] = [[v / 2 for v in row] for row in data["routing"]["rate_req_per_s"]]
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(data))
    r = _invoke("simulate", repo_root / "tests" / "data" / "agent_split_units.yaml", "--plan", f, "--requests", 1000)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert lines[0].startswith(f"error: {f}: routing: segment ") and "but the workload sends" in lines[0]
    data["routing"]["boundaries_tokens"][1] += 0.5
    f.write_text(json.dumps(data))
    r = _invoke("simulate", repo_root / "tests" / "data" / "agent_split_units.yaml", "--plan", f, "--requests", 1000)
    assert r.exit_code == 2 and f"{f}: routing.boundaries_tokens[1]: the number" in r.output, r.output
