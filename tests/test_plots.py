"""Figures of the workflow results (issue 13, "Around them": plots; :mod:`fleetopt.optimizer.workflows.plots`).

The inputs are records built by hand (the commands' own dataclasses with chosen numbers, or JSON dicts in the
commands' contract), so every expected position below is a number written here, not one the plotting code made.
"""

from __future__ import annotations

import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

import matplotlib  # noqa: E402,F401 - the plot extra is a test dependency: a broken install fails here

from fleetopt.optimizer.cli import main  # noqa: E402
from fleetopt.optimizer.errors import InstanceError  # noqa: E402
from fleetopt.optimizer.workflows import plots  # noqa: E402
from fleetopt.optimizer.workflows.split_table import SplitBaseline, SplitRow, SplitTable  # noqa: E402


def _row(b, cost_hr, p99_short, p99_long, met, pareto, n_s=1, n_l=2):
    return SplitRow(boundary_tokens=b, share_short=0.9, replicas_short=n_s, replicas_long=n_l, total_gpus=n_s + n_l,
                    cost_per_hr=cost_hr, cost_per_year=cost_hr * 8760.0, saving_pct=0.0, ttft_p99_ms_short=p99_short,
                    ttft_p99_ms_long=p99_long, slo_met=met, pareto=pareto,
                    fleet=f"0-{b}:a100x{n_s},{b}-65536:a100x{n_l}")


SPLIT = SplitTable(
    instance="hand", gpu="a100", arrival_rate=100.0, slo_ttft_p99_ms=500.0, ttft_model="mean-prefill",
    max_utilization=0.85, max_context_tokens=65536,
    baseline=SplitBaseline(replicas=13, total_gpus=13, cost_per_hr=20.0, cost_per_year=175_200.0, ttft_p99_ms=14.0,
                           slo_met=True, fleet="0-65536:a100x13"),
    rows=(_row(1024, 15.0, 10.0, 36.0, True, True), _row(2048, 12.0, 12.0, 64.0, True, True),
          _row(4096, 12.0, 13.0, 110.0, True, False), _row(32768, 11.0, 14.0, math.inf, False, False)),
    recommended=1)
"""A four-row split table: 2,048 recommended ($12/hr, worst P99 64 ms); 32,768 misses with an unbounded P99."""


def _collection(fig, label_prefix: str):
    ax = fig.axes[0]
    hits = [c for c in ax.collections if str(c.get_label()).startswith(label_prefix)]
    assert len(hits) == 1, [c.get_label() for c in ax.collections]
    return hits[0]


def test_split_table_marks_the_recommended_row_and_the_baseline():
    fig = plots.split_table_figure(SPLIT)
    rec = _collection(fig, "recommended").get_offsets()
    assert rec.tolist() == [[64.0, 12.0 * 8760.0 / 1e3]]       # worst of 12 and 64 ms; $12/hr x 8,760 h
    star = _collection(fig, "homogeneous baseline").get_offsets()
    assert star.tolist() == [[14.0, 175.2]]
    missed = _collection(fig, "boundary B, misses").get_offsets()
    assert len(missed) == 1 and missed[0][1] == pytest.approx(11.0 * 8.76)
    assert missed[0][0] > 500.0                                  # unbounded P99: drawn right of the SLO
    ax = fig.axes[0]
    assert "(ms" in ax.get_xlabel() and "US$/yr" in ax.get_ylabel()
    # the JSON form (inf written as null) draws the same figure
    again = plots.split_table_figure(SPLIT.to_json())
    assert _collection(again, "recommended").get_offsets().tolist() == rec.tolist()


def test_whatif_marks_a_step_where_the_fleet_changes():
    fleets = ["A", "A", "B", "B", None, "C"]
    rows = [{"overrides": {"workload.arrival_rate": 10 * (k + 1)}, "fleet": f,
             "cost_per_year": None if f is None else 1000.0 * (k + 1), "total_replicas": None if f is None else k + 1}
            for k, f in enumerate(fleets)]
    data = {"command": "whatif", "instance": "hand", "slo_ttft_p99_ms": 500.0,
            "sweeps": [{"path": "workload.arrival_rate", "values": [10, 20, 30, 40, 50, 60]}], "scenarios": rows,
            "base": {}}
    fig = plots.whatif_figure(data)
    steps = _collection(fig, "step").get_offsets().tolist()
    # B after A at 30 req/s; C at 60 follows a scenario without a plan, so it is not compared with it: no step
    assert steps == [[30.0, 3.0]]
    assert _collection(fig, "no plan").get_offsets().tolist() == [[50.0, 0.0]]
    assert "req/s" in fig.axes[0].get_xlabel() and "US$/yr" in fig.axes[0].get_ylabel()


def test_gridflex_draws_unbounded_p99_at_the_top():
    depths = []
    for d, p99 in ((0, 40.0), (20, 300.0), (40, None)):
        depths.append({"depth": d, "power_kw": 2.0 - d / 100, "power_kw_event": 2.0 - d / 100,
                       "ttft_p99_ms_analytic": p99, "ttft_p99_ms_event": p99, "ttft_p99_ci_ms_event": [p99, p99],
                       "simulated": True, "sustained_ok": p99 is not None and p99 < 500, "event_ok": True})
    data = {"command": "gridflex", "instance": "hand", "fleet": "0-8192:h100x4", "arrival_rate": 40.0,
            "slo_ttft_p99_ms": 500.0, "depths": depths, "max_safe_depth_sustained": 20, "max_safe_depth_event": 20,
            "replications": 2, "event_seconds": 30.0, "seed": 0}
    fig = plots.gridflex_figure(data)
    top, bottom = fig.axes
    unstable = [c for c in bottom.collections if "unstable" in str(c.get_label())]
    assert len(unstable) == 1 and unstable[0].get_offsets()[:, 0].tolist() == [40.0]
    assert unstable[0].get_offsets()[0, 1] == pytest.approx(bottom.get_ylim()[1])
    assert "kW" in top.get_ylabel() and "ms" in bottom.get_ylabel() and "%" in bottom.get_xlabel()


def test_ttft_figure_says_it_shows_quantiles_and_draws_samples_as_an_ecdf():
    pool = {"min_tokens": 0, "max_tokens": 4096, "gpu": "h100", "replicas": 1, "ttft_p99_ci_ms": [25.0, 35.0],
            "latency_ms": {"ttft": {"p50": 10.0, "p90": 20.0, "p99": 30.0}}}
    sim = {"command": "simulate", "instance": "hand", "slo_ttft_p99_ms": 500.0, "pools": [pool],
           "latency_ms": {"ttft": {"p50": 10.0, "p90": 20.0, "p99": 30.0}}, "ttft_p99_ci_ms": [25.0, 35.0],
           "requests_simulated": 1000, "seed": 0, "options": {"replications": 5}}
    fig = plots.ttft_figure(sim)
    assert "quantiles" in fig.axes[0].get_title() and "no per-request latencies" in fig.axes[0].get_title()
    p99 = [c for c in fig.axes[0].collections if c.get_label() == "P99"][0]
    assert p99.get_offsets().tolist() == [[30.0, 0.0]]
    fig = plots.ttft_figure(sim, samples_ms={"0-4,096 h100 x1": [3.0, 1.0, 2.0, 4.0]})
    (line,) = [ln for ln in fig.axes[0].lines if ln.get_label().startswith("0-4,096")]
    assert line.get_xdata().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert line.get_ydata().tolist() == [0.25, 0.5, 0.75, 1.0]
    assert "ms" in fig.axes[0].get_xlabel()


def test_tpw_and_plan_axes_carry_units():
    rows = [{"profile": "H100-80GB", "quality": "q", "context": c, "tok_per_watt": 35.0 * 2048 / c}
            for c in (2048, 4096, 8192)]
    ax = plots.tpw_figure({"rows": rows}).axes[0]
    assert "tokens" in ax.get_xlabel() and "tok/W" in ax.get_ylabel()
    (line,) = ax.lines
    assert line.get_ydata().tolist() == [35.0, 17.5, 8.75]
    solve = {"command": "solve", "instance": "hand", "method": "oracle", "slo_ttft_p99_ms": 500.0,
             "pools": [{"min_tokens": 0, "max_tokens": 2048, "gpu": "a100", "replicas": 1, "ttft_p99_ms": 30.0}]}
    ax = plots.plan_figure(solve).axes[0]
    assert "(ms)" in ax.get_xlabel()
    assert [p.get_width() for p in ax.patches] == [30.0]


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_plots_are_byte_identical_across_runs(tmp_path, suffix, magic):
    a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    plots.plot_split_table(SPLIT, a)
    plots.plot_split_table(SPLIT.to_json(), b)
    assert a.read_bytes().startswith(magic)
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, b.name])    # no temporary file left
    if suffix == ".svg":
        text = a.read_text()
        assert ET.fromstring(text.split("?>", 1)[1].split("]>", 1)[-1]).tag.endswith("svg")
        assert "<dc:date>" not in text and "matplotlib.org" not in text


@pytest.mark.slow
def test_plots_are_byte_identical_in_another_process(tmp_path):
    here = tmp_path / "here.svg"
    plots.plot_split_table(SPLIT, here)
    code = ("import sys; sys.path.insert(0, %r); from test_plots import SPLIT; "
            "from fleetopt.optimizer.workflows import plots; plots.plot_split_table(SPLIT, sys.argv[1])")
    there = tmp_path / "there.svg"
    subprocess.run([sys.executable, "-c", code % str(Path(__file__).parent), str(there)], check=True, timeout=120)
    assert here.read_bytes() == there.read_bytes()


def test_write_is_atomic_and_checks_the_target(tmp_path):
    target = tmp_path / "fig.png"
    target.write_bytes(b"old")
    with pytest.raises(InstanceError, match=r"--plot: .*fig\.pdf: unsupported suffix"):
        plots.check_target(tmp_path / "fig.pdf")
    with pytest.raises(InstanceError, match="does not exist"):
        plots.check_target(tmp_path / "nowhere" / "fig.png")
    with pytest.raises(InstanceError, match="refusing to overwrite"):
        plots.check_target(target, protect=(target,))

    class Boom:
        def savefig(self, *a, **k):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        plots.write_figure(Boom(), target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["fig.png"]


def _one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, lines
    return lines[0]


@pytest.mark.parametrize("command", [["pareto", "--split-table"], ["headroom", "--fleet", "0-65536:a100"],
                                     ["whatif", "--sweep", "workload.arrival_rate=50"],
                                     ["gridflex", "--fleet", "0-65536:a100"]])
def test_plot_flag_refuses_a_bad_target_before_any_work(repo_root, tmp_path, command):
    inst = repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"
    res = CliRunner().invoke(main, [command[0], str(inst), *command[1:], "--plot", str(tmp_path / "x.pdf")])
    assert "--plot" in _one_error_line(res)


def test_gridflex_plot_flag_writes_the_figure(repo_root, tmp_path):
    out = tmp_path / "g.svg"
    res = CliRunner().invoke(main, ["gridflex", str(repo_root / "instances" / "ref_puzzle3_azure_mixed.yaml"),
                                    "--fleet",
                                    "0-8192:h100x4", "--depths", "0,50", "--event-minutes", "0.2", "--replications",
                                    "1", "--set", "gpus=[{name: h100, profile: H100-80GB}]", "--set",
                                    "pools.max_pools=1", "--set", "workload.arrival_rate=20", "--json", "-",
                                    "--plot", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "curtailment depth (% of the uncurtailed power)" in text and "P99 TTFT (ms)" in text
