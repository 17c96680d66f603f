"""The what-if benchmark row: its sweep solves every scenario and reports the CPU seconds it took beside the wall."""

from __future__ import annotations

from fleetopt.optimizer.workflows.whatif import bench_whatif_sweep


def test_bench_row_counts_the_sweeps_cpu(tmp_path):
    row = bench_whatif_sweep(2, workers=1, folder=tmp_path, target_s=60.0)
    assert row["scenarios"] == 2 and row["solved"] == 2
    assert 0.0 < row["cpu_s"] and row["cpu_s_per_scenario"] == row["cpu_s"] / 3     # the base is solved too
    assert row["meets_target"] == (row["median_s"] <= 60.0)
