"""``solve --verify-top N --workers / --scheduler``: a round's plans are simulated side by side on the executor
(local processes, a Dask ``LocalCluster``), with the same results as in one process (every plan runs on the same
seed; the verification assembles the results in the plans' order)."""

from __future__ import annotations

import json

import distributed
import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

INSTANCE = "tests/data/azure_trace_h100_units.yaml"      # verifies in one round, three plans simulated
ARGS = ["--verify-top", "3", "--sim-requests", "10000", "--sim-replications", "2", "--max-rounds", "1", "--quiet",
        "--json", "-"]


def _drop_times(doc):
    if isinstance(doc, dict):
        return {k: _drop_times(v) for k, v in doc.items() if "seconds" not in k and not k.startswith("wall")}
    if isinstance(doc, list):
        return [_drop_times(v) for v in doc]
    return doc


def _run(*extra) -> dict:
    res = CliRunner().invoke(main, ["solve", *extra])
    assert res.exit_code in (0, 4), res.output          # 4: no plan passed in the round (still a verification)
    return _drop_times(json.loads(res.stdout))


@pytest.fixture(scope="module")
def serial(repo_root):
    return _run(str(repo_root / INSTANCE), *ARGS)


@pytest.mark.slow
def test_processes_give_the_serial_verification(repo_root, serial):
    assert len(serial["verification"]["plans"]) >= 2      # a round simulated several plans
    assert _run(str(repo_root / INSTANCE), *ARGS, "--workers", "2") == serial


@pytest.mark.slow
def test_a_dask_cluster_gives_the_serial_verification(repo_root, serial):
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        got = _run(str(repo_root / INSTANCE), *ARGS, "--scheduler", c.scheduler_address)
    assert got == serial


def test_workers_need_verify_top(repo_root):
    res = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"),
                                    "--workers", "2"])
    assert res.exit_code == 2 and "--verify-top" in res.output
