"""Progress on stderr (issue 13, "Around them": progress; :mod:`fleetopt.optimizer.commands.progress`).

``solve --verify-top --trim`` runs in a subprocess with stderr a pipe (not a terminal): every stderr line is a
plain ``[   t s] message`` log line, and the lines are counted against the verification record the same run
wrote to stdout (one per solve of every round, per whole-plan simulation, per single-pool simulation, per trim
trial). ``--quiet`` leaves stderr empty and the stdout JSON the same. ``pareto --axes`` logs one line per point.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.commands.progress import Reporter, reporter

LINE = re.compile(r"^\[\s*\d+\.\d s\] (.+)$")
VERIFY = ["--set", "slo.ttft_model=mean-prefill", "--set", "slo.ttft_p99_ms=150", "--verify-top", "1", "--trim",
          "--sim-requests", "2000", "--sim-replications", "2"]
"""Two rounds on quickstart sized by the mean-prefill model at 150 ms (the first plan's pools miss outright in
simulation, a miss the interval supports, so they are cut; the second plan passes), a trim trial after; about 20 s.
At quickstart's own SLO the first plan's 2,000-request interval straddles the SLO: accepted as undecided, no cut."""


def _solve(repo_root, *flags) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "fleetopt.optimizer.cli", "solve",
           str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"),
           *VERIFY, "--json", "-", *flags]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=repo_root)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout), res.stderr


def _drop(doc, key: str):
    """``doc`` without ``key`` at any depth (the wall time differs between runs)."""
    if isinstance(doc, dict):
        return {k: _drop(v, key) for k, v in doc.items() if k != key}
    if isinstance(doc, list):
        return [_drop(v, key) for v in doc]
    return doc


@pytest.fixture(scope="module")
def logged(repo_root):
    return _solve(repo_root)


@pytest.mark.slow
def test_one_log_line_per_round_step_and_trial(logged):
    doc, err = logged
    lines = err.splitlines()
    assert lines and all(LINE.match(x) for x in lines), lines      # nothing else on stderr, no terminal codes
    msgs = [LINE.match(x).group(1) for x in lines]
    v = doc["verification"]
    assert v["rounds"] == 2
    solves = [re.match(r"verify round (\d+): solve (\d+): ", m) for m in msgs]
    solves = [(int(m.group(1)), int(m.group(2))) for m in solves if m]
    assert [n for _, n in solves] == list(range(1, v["solves"] + 1))
    assert sorted({r for r, _ in solves}) == list(range(1, v["rounds"] + 1))
    sims = [re.match(r"verify round (\d+): simulating plan (\d+) ", m) for m in msgs]
    assert [(int(m.group(1)), int(m.group(2))) for m in sims if m] == [
        (p["round"], p["rank"]) for p in v["plans"] if not p["cached"]]
    assert sum(m.startswith("sizing ") for m in msgs) == v["pool_simulations"] > 0
    trials = [m for m in msgs if m.startswith("trim trial ")]
    assert len(trials) == v["trim"]["trials"] >= 1
    assert [int(re.match(r"trim trial (\d+):", m).group(1)) for m in trials] == list(range(1, len(trials) + 1))
    times = [float(re.match(r"^\[\s*(\d+\.\d) s\]", x).group(1)) for x in lines]
    assert times == sorted(times)
    # issue 31: each step names its place (plan x of N), is stamped when it starts, and is closed by a
    # completion line before the next starts
    started = [m for m in msgs if not m.startswith("done (")]
    closed = [re.match(r"done \((\d+\.\d) s\): (.+)$", m) for m in msgs if m.startswith("done (")]
    assert [c.group(2) for c in closed] == started
    assert [m.startswith("done (") for m in msgs] == [False, True] * len(started)
    for m in (x for x in msgs if re.match(r"verify round \d+: simulating plan", x)):
        k, n = map(int, re.search(r"\((\d+) of (\d+);", m).groups())
        assert 1 <= k <= n


@pytest.mark.slow
def test_quiet_is_silent_and_the_json_is_the_same(repo_root, logged):
    doc, _ = logged
    quiet_doc, err = _solve(repo_root, "--quiet")
    assert err == ""
    assert _drop(quiet_doc, "solve_seconds") == _drop(doc, "solve_seconds")


def test_pareto_logs_one_line_per_point(repo_root):
    inst = str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    res = CliRunner().invoke(main, ["pareto", inst, "--axes", "cost,pools", "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    msgs = [LINE.match(x).group(1) for x in res.stderr.splitlines()]
    points = [m for m in msgs if re.match(r"pools frontier: point \d+ ", m)]
    assert len(points) == doc["solves"] >= len(doc["points"])
    quiet = CliRunner().invoke(main, ["pareto", inst, "--axes", "cost,pools", "--json", "-", "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert _drop(json.loads(quiet.stdout), "solve_seconds") == _drop(doc, "solve_seconds")



def test_whatif_logs_one_line_per_scenario(repo_root):
    inst = str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    args = ["whatif", inst, "--sweep", "workload.arrival_rate=50,100", "--json", "-"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    msgs = [LINE.match(x).group(1) for x in res.stderr.splitlines()]
    assert sorted(int(re.match(r"scenario (\d+)/3 solved: ", m).group(1)) for m in msgs) == [1, 2, 3]
    quiet = CliRunner().invoke(main, args + ["--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""

def test_reporter_modes():
    with reporter(quiet=True) as r:
        assert r == Reporter()
    buf = io.StringIO()
    with reporter(stream=buf, terminal=False) as r:
        assert r.requests is None
        r.step("round 1: solve 1")
        r.step("round 1: simulating plan 1")
    assert [LINE.match(x).group(1) for x in buf.getvalue().splitlines()] == ["round 1: solve 1",
                                                                             "round 1: simulating plan 1"]
    tty = io.StringIO()
    with reporter(stream=tty, terminal=True) as r:
        r.step("round 1: simulating plan 1")
        r.requests(50, 100)
    assert "\x1b[" in tty.getvalue()            # a rich live display on a terminal, cleared at the end


def test_piped_steps_are_stamped_when_they_start_and_closed(monkeypatch):
    """Issue 31: piped, each line carries its own time (the step's start, or its end for the completion line),
    and with ``closes`` each step is closed by a ``done`` line with its duration, the last one at the end."""
    from fleetopt.optimizer.commands import progress

    clock = iter([0.0, 1.0, 3.5, 4.0])      # the start, each step's start, the end
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    buf = io.StringIO()
    with reporter(stream=buf, terminal=False, closes=True) as r:
        r.step("round 1: solve 1")
        r.step("round 1: simulating plan 1 (1 of 2)")
    assert buf.getvalue().splitlines() == [
        "[    1.0 s] round 1: solve 1",
        "[    3.5 s] done (2.5 s): round 1: solve 1",
        "[    3.5 s] round 1: simulating plan 1 (1 of 2)",
        "[    4.0 s] done (0.5 s): round 1: simulating plan 1 (1 of 2)"]


def test_terminal_label_names_the_step_and_no_unknown_count():
    """Issue 31: before the first step the terminal's label names it (not 'working'), and a step with no request
    count yet shows none (not '0/?')."""
    tty = io.StringIO()
    with reporter(stream=tty, terminal=True, first="verify round 1: solve 1"):
        pass
    text = tty.getvalue()
    assert "verify round 1: solve 1" in text and "working" not in text and "0/?" not in text
