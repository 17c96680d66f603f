"""What ``pareto --axes``, ``pareto --split-table`` and ``headroom --fleet`` recommend or flag.

* ``pareto --axes``: the recommended point is the cheapest point that meets the instance's own SLO, established
  here from the points' own figures in the JSON (worst P99 TTFT against the file's SLO); the knee is reported as an
  alternative and checked against its closed form, max (C_0 - C_k) / (a_k - a_0) from the least-axis point.
* ``pareto --split-table``: a row's ``violations`` are checked against the cap given with ``--set`` (its power
  against the cap, read from the row itself), and the recommended row is the cheapest row meeting the SLO within it.
* ``headroom --fleet``: a fleet over a cap carries ``violations`` and exits 6 (``limits_broken``).
"""

from __future__ import annotations

import json

import click
import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.commands.workflows import headroom as headroom_cmd
from fleetopt.optimizer.commands.workflows import pareto as pareto_cmd
from fleetopt.optimizer.errors import EXIT_CODES


def _cli(command, args):
    """Run one of the workflow commands in-process, under a group as ``fleetopt`` wires it."""
    group = click.Group(commands={"pareto": pareto_cmd, "headroom": headroom_cmd})
    return CliRunner().invoke(group, [command.name, *map(str, args)])


def _slo_ms(path) -> float:
    """The instance file's own P99 TTFT SLO (ms), read from the YAML, not from fleetopt."""
    return float(yaml.safe_load(path.read_text())["slo"]["ttft_p99_ms"])


def _knee(points) -> int:
    """The knee by its closed form: from the least-axis point (C_0, a_0), argmax (C_0 - C_k) / (a_k - a_0)."""
    end = min(range(len(points)), key=lambda k: (points[k]["axis_value"], points[k]["cost_per_hr"]))
    c0, a0 = points[end]["cost_per_hr"], points[end]["axis_value"]
    return max((k for k in range(len(points)) if points[k]["axis_value"] > a0),
               key=lambda k: ((c0 - points[k]["cost_per_hr"]) / (points[k]["axis_value"] - a0),
                              -points[k]["cost_per_hr"]))


def _check_frontier_recommendation(path, tmp_path, extra=()):
    out = tmp_path / "f.json"
    res = _cli(pareto_cmd, [path, "--axes", "cost,ttft", *extra, "--json", out, "--quiet"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    pts, slo = doc["points"], _slo_ms(path)
    meeting = [k for k, p in enumerate(pts) if p["worst_ttft_p99_ms"] <= slo and not p["violations"]]
    cheapest = min(meeting, key=lambda k: pts[k]["cost_per_hr"])
    assert doc["recommended_index"] == doc["recommended"] == cheapest
    assert [p["recommended"] for p in pts] == [k == cheapest for k in range(len(pts))]
    assert doc["recommended_reason"] == f"cheapest point meeting P99 TTFT <= {slo:g} ms"
    assert doc["knee_index"] == _knee(pts) != cheapest
    assert pts[doc["knee_index"]]["knee"] and sum(p["knee"] for p in pts) == 1
    assert "knee (alternative): point " + str(doc["knee_index"] + 1) in res.stdout
    assert f"recommended: point {cheapest + 1} (cheapest point meeting P99 TTFT <= {slo:g} ms)" in res.stdout
    return doc


def test_frontier_recommends_the_cheapest_point_meeting_the_slo_not_the_knee(repo_root, tmp_path):
    doc = _check_frontier_recommendation(repo_root / "instances" / "quickstart.yaml", tmp_path, ["--points", "4"])
    assert len(doc["points"]) == 4


@pytest.mark.slow
def test_lmsys_mixed_recommends_its_cheapest_point_meeting_500_ms(repo_root, tmp_path):
    doc = _check_frontier_recommendation(repo_root / "instances" / "lmsys_mixed.yaml", tmp_path)
    assert doc["points"][doc["recommended_index"]]["cost_per_year"] < doc["points"][doc["knee_index"]]["cost_per_year"]
