"""``fleetopt pareto --axes cost,AXIS --plot FILE`` (issue 13, "Around them": plots): the frontier figure.

The figure is read back two ways: the :class:`matplotlib.figure.Figure` of
:func:`fleetopt.optimizer.workflows.plots.frontier_figure` (its ``frontier points`` series must hold exactly the
JSON's points, the baseline and recommended markers exactly theirs), and the files the command writes (PNG and
SVG magic bytes, the SVG's axis labels with their units).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.workflows import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _collection(fig, label_prefix: str):
    hits = [c for c in fig.axes[0].collections if str(c.get_label()).startswith(label_prefix)]
    assert len(hits) == 1, [c.get_label() for c in fig.axes[0].collections]
    return hits[0]


@pytest.fixture(scope="module")
def pools_run(repo_root, tmp_path_factory):
    """``pareto quickstart --axes cost,pools`` with ``--json`` and ``--plot`` (SVG): 3 points."""
    tmp = tmp_path_factory.mktemp("frontier_plot")
    out = tmp / "f.svg"
    res = CliRunner().invoke(main, ["pareto", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), "--axes",
                                    "cost,pools", "--json", "-", "--plot", str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), out


def test_figure_points_are_the_frontier_points(pools_run):
    doc, _ = pools_run
    fig = plots.frontier_figure(doc)
    pts = _collection(fig, "frontier points").get_offsets().tolist()
    assert len(doc["points"]) >= 2
    assert pts == [[p["axis_value"], p["cost_per_year"] / 1e3] for p in doc["points"]]
    rec = doc["points"][doc["recommended"]]
    assert _collection(fig, "recommended").get_offsets().tolist() == [[rec["axis_value"], rec["cost_per_year"] / 1e3]]
    b = doc["baseline"]
    assert _collection(fig, "homogeneous baseline").get_offsets().tolist() == [[b["axis_value"],
                                                                                b["cost_per_year"] / 1e3]]
    ax = fig.axes[0]
    assert fig.axes[-1].get_xlabel() == "pools in the plan (count)" and "(thousand US$/yr)" in ax.get_ylabel()


def test_command_writes_an_svg_with_labelled_axes(pools_run):
    doc, out = pools_run
    text = out.read_text()
    assert ET.fromstring(text.split("?>", 1)[1].split("]>", 1)[-1]).tag.endswith("svg")
    for label in ("pools in the plan (count)", "least fleet cost", "(thousand US$/yr)", "homogeneous baseline",
                  f"recommended (point {doc['recommended'] + 1}): " + doc["points"][doc["recommended"]]["fleet"],
                  "P99 TTFT SLO 500 ms"):
        assert label in text, label


def test_power_frontier_png_and_units(repo_root, tmp_path):
    out = tmp_path / "power.png"
    res = CliRunner().invoke(main, ["pareto", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), "--axes",
                                    "cost,power", "--points", "3", "--json", str(tmp_path / "p.json"), "--plot",
                                    str(out), "--quiet"])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(PNG_MAGIC)
    doc = json.loads((tmp_path / "p.json").read_text())
    fig = plots.frontier_figure(doc)
    assert fig.axes[-1].get_xlabel() == "fleet power (kW, analytic)"
    assert _collection(fig, "frontier points").get_offsets().tolist() == [
        [p["axis_value"], p["cost_per_year"] / 1e3] for p in doc["points"]]


def test_bad_plot_target_is_refused_before_any_solve(repo_root, tmp_path):
    res = CliRunner().invoke(main, ["pareto", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), "--axes",
                                    "cost,pools", "--plot", str(tmp_path / "f.pdf")])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --plot:") and "f.pdf" in lines[0]
