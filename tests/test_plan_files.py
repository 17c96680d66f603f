"""``fleetopt simulate --plan FILE``: a solve's JSON read back, split-routing plans included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from optimizer.cli import main


def _invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def split_solve(repo_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "solve.json"
    r = _invoke("solve", repo_root / "instances" / "agent_split.yaml", "--top", 2, "--json", out)
    assert r.exit_code == 0, r.output
    return out, json.loads(out.read_text())


def test_split_plan_replays_its_routing(repo_root, split_solve, tmp_path):
    path, solved = split_solve
    assert solved["routing"] is not None and solved["fleet"] is None      # overlapping pools: no --fleet spec
    out = tmp_path / "sim.json"
    r = _invoke("simulate", repo_root / "instances" / "agent_split.yaml", "--plan", path, "--requests", 4000,
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
    r = _invoke("simulate", repo_root / "instances" / "agent_split.yaml", "--plan", path, "--rank", 2,
                "--requests", 1000, "--json", out)
    assert r.exit_code == 0, r.output
    sim = json.loads(out.read_text())
    assert [p["min_tokens"] for p in sim["pools"]] == [p["min_tokens"] for p in solved["solutions"][1]["pools"]]


def test_length_plan_file_equals_its_fleet_spec(repo_root, tmp_path):
    inst = repo_root / "instances" / "quickstart.yaml"
    solve = tmp_path / "solve.json"
    assert _invoke("solve", inst, "--json", solve).exit_code == 0
    spec = json.loads(solve.read_text())["fleet"]
    runs = []
    for how in (["--plan", solve], ["--fleet", spec]):
        out = tmp_path / "sim.json"
        r = _invoke("simulate", inst, *how, "--requests", 2000, "--json", out)
        assert r.exit_code == 0, r.output
        d = json.loads(out.read_text())
        d.pop("wall_seconds")
        runs.append(d)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("setup, args, phrase", [
    (lambda p: p.write_text("{not json"), ["--plan", "{f}"], "not JSON (line 1"),
    (lambda p: p.write_text('{"command": "evaluate"}'), ["--plan", "{f}"], "command: not the JSON output"),
    (None, ["--plan", "{solve}"], "instance: the plan was solved for instance 'agent-split', not 'quickstart'"),
    (None, ["--plan", "{solve}", "--fleet", "0-65536:h100"], "give exactly one of them"),
    (None, ["--fleet", "0-65536:h100", "--rank", "2"], "--rank: picks a solution of --plan FILE"),
    (lambda p: p.write_text("{}"), ["--plan", "{missing}"], "no such file"),
])
def test_plan_file_errors_are_one_line(repo_root, split_solve, tmp_path, setup, args, phrase):
    f = tmp_path / "bad.json"
    if setup:
        setup(f)
    subst = {"{f}": str(f), "{solve}": str(split_solve[0]), "{missing}": str(tmp_path / "none.json")}
    r = _invoke("simulate", repo_root / "instances" / "quickstart.yaml", *[subst.get(a, a) for a in args])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0], r.output


def test_split_plan_refuses_another_router_and_a_bad_rank(repo_root, split_solve):
    inst = repo_root / "instances" / "agent_split.yaml"
    r = _invoke("simulate", inst, "--plan", split_solve[0], "--router", "length", "--requests", 1000)
    assert r.exit_code == 2 and "runs with its own routing" in r.output
    r = _invoke("simulate", inst, "--plan", split_solve[0], "--rank", 9, "--requests", 1000)
    assert r.exit_code == 2 and "solutions: --rank 9: the file holds 2 solution(s)" in r.output
