"""``fleetopt whatif`` and the executor (issue 13, command 2 and "Scale-out").

The references are independent of the sweep: each scenario's optimum is checked against ``api.solve`` on the
instance loaded with the same ``--set`` flags (the solve path the sweep must not bend), deltas against those
solves' own fleets, the binding constraint against ``api.evaluate_report`` of the pool with one replica fewer,
and the monotonicity of the least cost in the arrival rate (a larger rate only removes fleets from the feasible
set). Runs on processes and on a Dask cluster are compared with the serial run, and a resumed run with an
uninterrupted one, byte for byte.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.workflows.executor import Backend, ResultLog, Task, iter_results, run_tasks

INSTANCE = (Path(__file__).parent / "data" / "azure_2gpu.yaml").read_text()
"""A small, fast instance: Azure conversations, two GPU options, two pools, the seeds' TTFT convention."""
RATE = "workload.arrival_rate"


@pytest.fixture(scope="module")
def inst_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("whatif") / "azure2.yaml"
    path.write_text(INSTANCE)
    return path


def rates_flag(n: int, step: int = 10) -> str:
    return f"{RATE}=" + ",".join(str(step * (k + 1)) for k in range(n))


def invoke(*args):
    return CliRunner().invoke(main, ["whatif", *map(str, args)])


def run_json(*args) -> dict:
    res = invoke(*args, "--json", "-")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --------------------------------------------------------------------------------------------
# Same result however it is run
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serial10(inst_file) -> dict:
    return run_json(inst_file, "--sweep", rates_flag(10))


def test_serial_sweep_matches_independent_solves(serial10, inst_file):
    rows = serial10["scenarios"]
    assert [r["overrides"] for r in rows] == [{RATE: 10 * (k + 1)} for k in range(10)]
    costs = [r["cost_per_year"] for r in rows]
    # a larger rate only removes fleets from the feasible set: the least cost never falls
    assert all(a <= b + 1e-6 for a, b in zip(costs, costs[1:]))
    assert costs[0] < costs[-1]
    for k in (0, 9):
        rep = api.solve(api.load(inst_file, [f"{RATE}={10 * (k + 1)}"]))
        spec = ",".join(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}" for p in rep.best.fleet.pools)
        assert rows[k]["fleet"] == spec
        assert rows[k]["cost_per_year"] == pytest.approx(rep.best.fleet.cost_per_year, rel=1e-12)
    base = api.solve(api.load(inst_file))
    assert serial10["base"]["cost_per_year"] == pytest.approx(base.best.fleet.cost_per_year, rel=1e-12)
    assert set(serial10) >= {"schema_version", "command", "instance", "base", "scenarios"}


@pytest.mark.slow
def test_processes_give_the_serial_result(serial10, inst_file):
    assert run_json(inst_file, "--sweep", rates_flag(10), "--workers", 2) == serial10


def test_dask_cluster_gives_the_serial_result(serial10, inst_file):
    import dask.distributed as distributed  # a test dependency (the scale extra): no skip
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        got = run_json(inst_file, "--sweep", rates_flag(10), "--scheduler", c.scheduler_address)
    assert got == serial10


@pytest.mark.slow
def test_100_scenarios_identical_serial_processes_dask(inst_file):
    import dask.distributed as distributed  # a test dependency (the scale extra): no skip
    flag = rates_flag(100, 5)
    serial = run_json(inst_file, "--sweep", flag)
    assert len(serial["scenarios"]) == 100
    assert all(r["status"] == "optimal" for r in serial["scenarios"])
    costs = [r["cost_per_year"] for r in serial["scenarios"]]
    assert all(a <= b + 1e-6 for a, b in zip(costs, costs[1:]))
    assert run_json(inst_file, "--sweep", flag, "--workers", 2) == serial
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None) as c:
        assert run_json(inst_file, "--sweep", flag, "--scheduler", c.scheduler_address) == serial


# --------------------------------------------------------------------------------------------
# Streaming and resume
# --------------------------------------------------------------------------------------------


def test_resume_after_a_torn_write_gives_the_uninterrupted_file(inst_file, tmp_path):
    flag = rates_flag(8)
    full_log = tmp_path / "full.jsonl"
    full = run_json(inst_file, "--sweep", flag, "--out", full_log)
    lines = full_log.read_text().splitlines(keepends=True)
    assert len(lines) == 1 + 1 + 8                  # header, base, 8 scenarios
    assert all(line.endswith("\n") for line in lines)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])     # killed while writing line 6
    # without --resume an existing log is not overwritten
    assert "--resume" in one_error_line(invoke(inst_file, "--sweep", flag, "--out", cut))
    resumed = run_json(inst_file, "--sweep", flag, "--out", cut, "--resume")
    assert resumed == full
    assert sorted(cut.read_text().splitlines()) == sorted(line.rstrip("\n") for line in lines)
    # a log of another run (another --set) is refused
    line = one_error_line(invoke(inst_file, "--sweep", flag, "--set", "slo.ttft_p99_ms=400", "--out", cut,
                                 "--resume"))
    assert "--resume" in line and "sets" in line


@pytest.mark.slow
def test_killed_run_resumed_equals_uninterrupted(inst_file, tmp_path):
    exe = Path(sys.executable).with_name("fleetopt")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fleetopt.optimizer.cli"]
    flag = rates_flag(30)
    log = tmp_path / "killed.jsonl"
    proc = subprocess.Popen([*cmd, "whatif", str(inst_file), "--sweep", flag, "--out", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and log.read_text().count("\n") >= 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = log.read_text().count("\n")
    assert 6 <= written < 32
    resumed = subprocess.run([*cmd, "whatif", str(inst_file), "--sweep", flag, "--out", str(log), "--resume",
                              "--json", "-"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    full_log = tmp_path / "full.jsonl"
    full = run_json(inst_file, "--sweep", flag, "--out", full_log)
    assert json.loads(resumed.stdout) == full
    assert sorted(log.read_text().splitlines()) == sorted(full_log.read_text().splitlines())


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, value, phrase", [
    ("--sweep", "workload.bogus=1,2", "--sweep workload.bogus"),
    ("--sweep", f"{RATE}=50,-3", f"--sweep {RATE}=-3"),
    ("--sweep", "gpus.x100.max_count=2", "--sweep gpus.x100.max_count"),
    ("--sweep", f"{RATE}=50,50", f"--sweep {RATE}"),
    ("--set", "slo.bogus=3", "--set slo.bogus"),
    ("--set", "slo.ttft_p99_ms=fast", "--set slo.ttft_p99_ms"),
])
def test_bad_path_or_value_is_one_line_exit_2(inst_file, flag, value, phrase):
    args = ["--sweep", f"{RATE}=50"] if flag == "--set" else []
    line = one_error_line(invoke(inst_file, *args, flag, value))
    assert phrase in line


def test_no_sweep_and_both_backends_are_refused(inst_file):
    assert "--sweep" in one_error_line(invoke(inst_file))
    assert "--scheduler" in one_error_line(invoke(inst_file, "--sweep", f"{RATE}=50", "--workers", 2,
                                                  "--scheduler", "tcp://127.0.0.1:1"))
    assert "--out" in one_error_line(invoke(inst_file, "--sweep", f"{RATE}=50", "--resume"))


# --------------------------------------------------------------------------------------------
# Deltas and binding, by hand
# --------------------------------------------------------------------------------------------


def _pools(rep) -> dict[str, int]:
    return {f"{p.min_tokens}-{p.max_tokens}:{p.gpu}": p.replicas for p in rep.best.fleet.pools}


def test_deltas_against_independent_solves(inst_file):
    out = run_json(inst_file, "--sweep", f"{RATE}=50,200")
    base = api.solve(api.load(inst_file)).best.fleet
    base_pools = _pools(api.solve(api.load(inst_file)))
    lo, hi = out["scenarios"]
    for row, rate in ((lo, 50), (hi, 200)):
        rep = api.solve(api.load(inst_file, [f"{RATE}={rate}"]))
        f, mine = rep.best.fleet, _pools(rep)
        d = row["deltas"]
        assert d["cost_per_year"] == pytest.approx(f.cost_per_year - base.cost_per_year, rel=1e-9)
        assert d["replicas"] == f.total_replicas - base.total_replicas
        assert d["gpus"] == f.total_gpus - base.total_gpus
        assert set(d["pools_added"]) == set(mine) - set(base_pools)
        assert set(d["pools_removed"]) == set(base_pools) - set(mine)
        assert {r["pool"] for r in d["pools_resized"]} == {k for k in mine if k in base_pools
                                                           and mine[k] != base_pools[k]}
    # halving the rate never costs more, quadrupling... doubling never costs less
    assert lo["deltas"]["cost_per_year"] <= 0 <= hi["deltas"]["cost_per_year"]
    assert lo["deltas"]["replicas"] <= 0 <= hi["deltas"]["replicas"]


def test_binding_is_what_breaks_with_one_replica_fewer(inst_file):
    row = run_json(inst_file, "--sweep", f"{RATE}=200")["scenarios"][0]
    inst = api.load(inst_file, [f"{RATE}=200"])
    pools = row["pools"]
    assert len(row["binding"]) == len(pools)
    for j, b in enumerate(row["binding"]):
        n = pools[j]["replicas"]
        if n == 1:
            assert b["binds"] == ["one replica"]
            continue
        spec = ",".join(f"{p['min_tokens']}-{p['max_tokens']}:{p['gpu']}x{p['replicas'] - (k == j)}"
                        for k, p in enumerate(pools))
        fewer = api.evaluate_report(inst, spec).fleets[0][1].pools[j]
        assert ("utilization cap" in b["binds"]) == (fewer.capacity_load > inst.constraints.max_utilization)
        assert ("P99 TTFT" in b["binds"]) == (fewer.ttft_p99_ms > 500.0)
        assert b["binds"]                    # the optimal count is the least one: something breaks below it
    assert "pools.max_pools (2 of 2)" in row["limits_at_bound"] if len(pools) == 2 else True


def test_inventory_at_its_bound_is_listed(inst_file):
    rows = run_json(inst_file, "--sweep", "gpus.a10g.max_count=3,6,10")["scenarios"]
    at_bound = []
    for row in rows:
        cap = row["overrides"]["gpus.a10g.max_count"]
        a10g = sum(p["gpus"] for p in row["pools"] if p["gpu"] == "a10g")
        assert a10g <= cap
        listed = [s for s in row["limits_at_bound"] if s.startswith("gpus.a10g.max_count")]
        assert listed == ([f"gpus.a10g.max_count ({cap} of {cap} GPUs)"] if a10g == cap else [])
        at_bound.append(a10g == cap)
    assert any(at_bound) and not all(at_bound)      # the grid holds both cases (else the check is empty)


# --------------------------------------------------------------------------------------------
# The executor on its own
# --------------------------------------------------------------------------------------------


def _square(x):
    return x * x


def test_executor_backends_and_log(tmp_path):
    tasks = [Task(f"t{k}", _square, (k,)) for k in range(6)]
    assert run_tasks(tasks) == {f"t{k}": k * k for k in range(6)}
    assert run_tasks(tasks, Backend(workers=2)) == {f"t{k}": k * k for k in range(6)}
    with pytest.raises(InstanceError, match="given twice"):
        list(iter_results([Task("a", _square, (1,)), Task("a", _square, (2,))]))
    path = tmp_path / "log.jsonl"
    log, done = ResultLog.open(path, {"run": 1})
    assert done == {}
    with log:
        run_tasks(tasks[:3], on_result=lambda k, v: log.append(k, {"value": v}))
    path.write_text(path.read_text() + '{"key": "t3", "val')          # a torn write
    log, done = ResultLog.open(path, {"run": 1}, resume=True)
    log.close()
    assert sorted(done) == ["t0", "t1", "t2"] and done["t2"]["value"] == 4
    assert path.read_text().endswith("}\n")                             # the torn tail is cut off
    with pytest.raises(InstanceError, match="another run"):
        ResultLog.open(path, {"run": 2}, resume=True)
