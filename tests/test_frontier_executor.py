"""``fleetopt pareto --axes`` on the executor (issue 13, "Scale-out"): the same curve serially, on local processes
(``--workers 2``) and on a Dask ``LocalCluster`` (``--scheduler``).

The reference is the serial run: the parallel runs solve caps ahead and drop those the serial sweep skips
(:mod:`fleetopt.optimizer.workflows.frontier`, "Parallel re-solves"), so everything but the wall time, the backend
and the count of solves made ahead must be equal, bit for bit. The instance is chosen so that both sweeps that
solve ahead have more than one point: evenly spaced power caps (3 points out of 9 caps) and pools (3 points).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.workflows.executor import Backend, Task, open_session
from fleetopt.optimizer.workflows.frontier import frontier

INSTANCE = {"name": "azure-3gpu-300", "workload": {"cdf": "builtin:azure", "arrival_rate": 300},
            "slo": {"ttft_p99_ms": 500},
            "gpus": [{"name": "a100", "profile": "A100-80GB"}, {"name": "h100", "profile": "H100-80GB"},
                     {"name": "b200", "profile": "B200-projected"}],
            "pools": {"max_pools": 4, "max_context": 8192}, "objective": "cost"}
"""Azure at 300 req/s on three GPU options of one model, up to four pools: a power and a pools curve of 3 points."""
RUN_KEYS = ("solve_seconds", "backend", "solves_unused")
"""JSON keys that say how a run went, not what it found."""
AXES_RUNS = [("cost,power", ("--points", "10")), ("cost,pools", ())]


@pytest.fixture(scope="module")
def inst_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("frontier_executor") / "azure3.json"
    path.write_text(json.dumps(INSTANCE))
    return path


def run_json(inst_file, axes, extra, *flags) -> dict:
    res = CliRunner().invoke(main, ["pareto", str(inst_file), "--axes", axes, *extra, "--json", "-", "--quiet",
                                    *map(str, flags)])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def curve(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in RUN_KEYS}


@pytest.fixture(scope="module")
def serial(inst_file) -> dict:
    return {axes: run_json(inst_file, axes, extra) for axes, extra in AXES_RUNS}


def test_serial_curves_have_points_to_solve_ahead(serial):
    for axes, _ in AXES_RUNS:
        doc = serial[axes]
        assert len(doc["points"]) >= 3, axes
        assert doc["backend"] == "serial (this process)" and doc["solves_unused"] == 0
        costs = [p["cost_per_hr"] for p in doc["points"]]
        assert costs == sorted(costs)


@pytest.mark.parametrize("axes, extra", [pytest.param(*AXES_RUNS[0], marks=pytest.mark.slow), AXES_RUNS[1]])
def test_processes_give_the_serial_curve(serial, inst_file, axes, extra):
    got = run_json(inst_file, axes, extra, "--workers", 2)
    assert got["backend"] == "2 local processes"
    assert curve(got) == curve(serial[axes])


@pytest.mark.parametrize("axes, extra", AXES_RUNS)
def test_dask_cluster_gives_the_serial_curve(serial, inst_file, axes, extra):
    import dask.distributed as distributed  # a test dependency (the scale extra): no skip
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        got = run_json(inst_file, axes, extra, "--scheduler", c.scheduler_address)
    assert got["backend"].startswith("Dask scheduler")
    assert curve(got) == curve(serial[axes])


def test_ttft_sweep_cannot_solve_ahead_and_runs_here(inst_file):
    inst = load_instance(inst_file)
    a = frontier(inst, "ttft", points=3)
    b = frontier(inst, "ttft", points=3, backend=Backend(workers=2))
    assert curve(b.to_json()) == curve(a.to_json()) and b.solves_unused == 0


def test_session_runs_several_batches_on_the_same_workers():
    with open_session(Backend(workers=2)) as s:
        assert s.slots == 2
        first = dict(s.iter_results([Task(f"a{k}", pow, (k, 2)) for k in range(3)]))
        second = dict(s.iter_results([Task(f"a{k}", pow, (k, 3)) for k in range(3)]))   # keys unique per batch
    assert first == {f"a{k}": k ** 2 for k in range(3)} and second == {f"a{k}": k ** 3 for k in range(3)}
    with open_session(Backend()) as s:
        assert s.slots == 1 and dict(s.iter_results([Task("x", abs, (-2,))])) == {"x": 2}


def test_workers_apply_to_axes_only(inst_file):
    res = CliRunner().invoke(main, ["pareto", str(inst_file), "--split-table", "--workers", "2"])
    assert res.exit_code == 2 and "--workers" in res.stderr
