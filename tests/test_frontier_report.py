"""``pareto --axes`` in the JSON contract and on the report page (issue 31, "A Pareto page and a contract for every
document"), and the figure fixes that page brought: the log axes' tick labels, legends off the data, the
``headroom --range`` step labels.

The frontier documents here are built by hand from :class:`~fleetopt.optimizer.workflows.frontier.Frontier`
records whose numbers are written below (a 3-point ``cost,pools`` curve of made-up plans), so every expected value
is the test's own. The figures are measured with matplotlib's renderer (the window extents of the legend, the
data and the labels, in pixels); the page in a browser is measured in ``tests/test_html_report.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.output import contract
from fleetopt.optimizer.output.contract import COMMANDS, SCHEMA_VERSION, check_document, documents, schema_for, \
    validate_document
from fleetopt.optimizer.output.contract.workflows import FRONTIER_DOCUMENTS, FrontierDocument
from fleetopt.optimizer.output.writes import to_jsonable
from fleetopt.optimizer.workflows import plots
from fleetopt.optimizer.workflows.frontier import AXES, Frontier, FrontierPoint
from fleetopt.optimizer.workflows.html_report import KINDS, build_html

SLO_MS = 500.0


def _point(fleet: str, cost_per_hr: float, pools: int, gpus: int, kw: float, worst_ms: float, constraint: str,
           slo_met: bool = True) -> dict:
    """A frontier point's fields (physical GPUs: 8 per priced seed unit)."""
    return {"fleet": fleet, "cost_per_hr": cost_per_hr, "cost_per_year": cost_per_hr * 8760.0,
            "axis_value": float(pools), "total_gpus": gpus, "pools": pools, "power_kw": kw,
            "worst_ttft_p99_ms": worst_ms, "constraint": constraint, "slo_met": slo_met, "physical_gpus": 8 * gpus}


POINTS = tuple(SimpleNamespace(**p) for p in (
    _point("0-1536:a100x1,1536-8192:h100x1,8192-65536:h100x2", 14.27, 3, 4, 1.59, 453.9, "objective=cost"),
    _point("0-8192:a100x3,8192-65536:h100x2", 14.67, 2, 5, 1.81, 453.9, "pools.max_pools=2"),
    _point("0-65536:h100x7", 28.14, 1, 7, 2.73, 30.9, "pools.max_pools=1")))


def _frontier(points=POINTS, recommended: int | None = 0, axis: str = "pools") -> Frontier:
    return Frontier(instance="hand", axis=AXES[axis], sweep="consecutive",
                    points=tuple(FrontierPoint(**vars(p)) for p in points), recommended=recommended,
                    baseline=FrontierPoint(**vars(POINTS[2])), baseline_dominated=True, solves=3, seconds=1.5,
                    truncated=False, recommended_reason=f"cheapest point meeting P99 TTFT <= {SLO_MS:g} ms", knee=1,
                    slo_ttft_p99_ms=SLO_MS, slo=f"P99 TTFT <= {SLO_MS:g} ms")


def _doc(**kwargs) -> dict:
    return to_jsonable(_frontier(**kwargs).to_json())


# --------------------------------------------------------------------------------------------
# The contract
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", sorted(AXES))
def test_frontier_documents_validate_against_the_contract(axis):
    doc = _doc(axis=axis)
    assert list(doc)[:3] == ["schema_version", "command", "instance"]
    assert doc["schema_version"] == SCHEMA_VERSION and doc["command"] == f"pareto --axes cost,{axis}"
    assert type(validate_document(doc)) is FRONTIER_DOCUMENTS[axis]     # one model per axis
    assert isinstance(validate_document(doc), FrontierDocument)
    check_document(doc)                                             # what write_document runs before writing
    assert doc["slo_ttft_p99_ms"] == SLO_MS and [p["physical_gpus"] for p in doc["points"]] == [32, 40, 56]
    for point in [*doc["points"], doc["baseline"]]:                 # the axis' own key right after cost_per_year
        assert list(point)[3] == axis
        if axis == "pools":                                         # the pool count itself, once, an integer
            assert list(point).count("pools") == 1 and point["pools"] == int(point["axis_value"])
            assert type(point["pools"]) is int
        else:
            assert point[axis] == point["axis_value"] and type(point["pools"]) is int


def test_schema_lists_the_frontier_documents():
    assert set(contract.FRONTIER_KINDS) <= set(documents()) and set(contract.FRONTIER_KINDS) <= set(COMMANDS["pareto"])
    one_of = schema_for("pareto")["oneOf"]
    assert {r["$ref"].rsplit("/", 1)[-1] for r in one_of} == {"ParetoDocument", "PowerFrontierDocument",
                                                              "TtftFrontierDocument", "PoolsFrontierDocument"}
    props = schema_for("pareto --axes cost,ttft")["properties"]
    assert props["schema_version"]["const"] == SCHEMA_VERSION
    assert props["command"]["const"] == "pareto --axes cost,ttft"


def test_the_schema_command_prints_a_frontier_kind():
    res = CliRunner().invoke(main, ["schema", "pareto --axes cost,power"])
    assert res.exit_code == 0, res.output
    assert "FrontierDocument" in res.output


def test_a_frontier_document_that_breaks_the_contract_is_refused():
    doc = _doc()
    for broken in ({**doc, "schema_version": 1}, {**doc, "points": [{**doc["points"][0], "slo_met": "yes"}]},
                   {k: v for k, v in doc.items() if k != "slo_ttft_p99_ms"}):
        with pytest.raises(ValueError, match="breaks its contract"):
            check_document(broken)


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------


def test_report_renders_a_frontier_page_with_every_points_plan():
    assert set(contract.FRONTIER_KINDS) <= set(KINDS)
    text = build_html(_doc())
    assert text.count("<figure>") == 1 and "least cost against pools" in text
    assert "Every point&#x27;s plan" in text or "Every point's plan" in text
    # each point's row: its rank, each of its pools on a line, GPUs, $/hr, kW, worst P99 and the SLO verdict
    for p in POINTS:
        for pool in p.fleet.split(","):
            assert pool in text
        for cell in (f'data-value="{p.physical_gpus!r}">{p.physical_gpus:,}<',
                     f'data-value="{p.cost_per_hr!r}">{p.cost_per_hr:,.2f}<',
                     f'data-value="{p.power_kw!r}">{p.power_kw:,.2f}<',
                     f'data-value="{p.worst_ttft_p99_ms!r}">{p.worst_ttft_p99_ms:,.1f}<'):
            assert cell in text, cell
    assert '<td class="n" id="frontier-recommended">1</td>' in text
    assert 'id="total-cost-per-hr" data-value="14.27">14.27<' in text
    assert "P99 TTFT SLO 500 ms" in text                             # the SLO line's legend entry, as SVG text
    # hover: each point's marker carries its plan as a tooltip
    assert "<title>point 1 (recommended): 0-1536:a100x1,1536-8192:h100x1,8192-65536:h100x2; 3 pools, 32 GPUs, " \
           "US$ 14.27/hr, 1.59 kW, worst P99 TTFT 453.9 ms, SLO met</title>" in text
    assert "<title>point 3: 0-65536:h100x7; 1 pool, 56 GPUs," in text


def test_report_command_accepts_a_frontier_document(tmp_path):
    src = tmp_path / "f.json"
    src.write_text(json.dumps(_doc()))
    out = tmp_path / "f.html"
    res = CliRunner().invoke(main, ["report", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "pareto --axes cost,pools" in res.output and "0-65536:h100x7" in out.read_text()


def test_a_frontier_without_a_recommended_point_says_so():
    pts = [SimpleNamespace(**{**vars(p), "slo_met": False}) for p in POINTS]
    text = build_html(_doc(points=pts, recommended=None))
    assert "No point recommended" in text and 'id="frontier-recommended"' not in text
    assert text.count('class="missed"') == 3


# --------------------------------------------------------------------------------------------
# The figures: measured with matplotlib's renderer
# --------------------------------------------------------------------------------------------


def _drawn(fig):
    fig.draw_without_rendering()
    return fig._get_renderer()


def _overlap(a, b, tol_px: float = 0.5) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > tol_px) and (min(a.y1, b.y1) - max(a.y0, b.y0) > tol_px)


def _visible_ticklabels(axis, renderer):
    lo, hi = sorted(axis.get_view_interval())
    return [t for t, v in zip(axis.get_majorticklabels(), axis.get_majorticklocs())
            if t.get_visible() and t.get_text() and lo <= v <= hi]


def _solve_doc() -> dict:
    """The quickstart's plan as the report reads it: three pools whose analytic P99s (51, 79, 454 ms) lie within
    one decade and a half under a 500 ms SLO."""
    pools = [{"min_tokens": lo, "max_tokens": hi, "gpu": g, "replicas": n, "ttft_p99_ms": ms}
             for lo, hi, g, n, ms in ((0, 1536, "a100", 1, 51.1), (1536, 8192, "h100", 1, 78.8),
                                      (8192, 65536, "h100", 2, 453.9))]
    return {"command": "solve", "instance": "hand", "pools": pools, "slo_ttft_p99_ms": SLO_MS, "method": "oracle",
            "ttft_model": "batched"}


def test_plan_figure_log_axis_has_several_tick_labels():
    """The report's first figure: a log axis over 51-500 ms labels more than its one power of ten (100)."""
    fig = plots.plan_figure(_solve_doc())
    renderer = _drawn(fig)
    labels = _visible_ticklabels(fig.axes[0].xaxis, renderer)
    assert len(labels) >= 3, [t.get_text() for t in labels]
    assert all(t.get_text().replace(",", "").isdigit() for t in labels)      # plain numbers, not 10^2
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(_overlap(a, b) for k, a in enumerate(boxes) for b in boxes[k + 1:])


def test_plots_legend_covers_no_data():
    """The plan figure's legend (before: inside the axes, over the longest bar) lies off every bar and off the
    axes' plotting area."""
    fig = plots.plan_figure(_solve_doc())
    renderer = _drawn(fig)
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    ax = fig.axes[0]
    assert not _overlap(box, ax.get_window_extent(renderer))
    assert not any(_overlap(box, bar.get_window_extent(renderer)) for bar in ax.patches)


def _headroom_range_doc() -> dict:
    """Steps at 162, 164, 165 and 168 req/s: four lines within 6 req/s on a 20-200 req/s axis."""
    steps = [40.0, 46.0, 63.0, 89.0, 92.0, 108.0, 119.0, 147.0, 162.0, 164.0, 165.0, 168.0, 187.0]
    rates = sorted({20.0, 200.0, *steps, *(s - 1.0 for s in steps)})
    solved = [{"arrival_rate": r, "cost_per_year": 50_000.0 + 10_000.0 * sum(r >= s for s in steps)} for r in rates]
    return {"command": "headroom --range", "instance": "hand", "range": [20.0, 200.0],
            "steps": [{"arrival_rate": s} for s in steps], "plateaus": [], "solved": solved}


def test_headroom_range_step_labels_never_overprint():
    doc = _headroom_range_doc()
    fig = plots.headroom_figure(doc)
    renderer = _drawn(fig)
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_visible()]
    assert sorted(float(t.get_text().split()[-1]) for t in labels) == [s["arrival_rate"] for s in doc["steps"]]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(_overlap(a, b) for k, a in enumerate(boxes) for b in boxes[k + 1:])
    # and no label sits on the cost curve's points
    line = ax.lines[0]
    pts = ax.transData.transform(line.get_xydata())
    assert not any(b.x0 <= x <= b.x1 and b.y0 <= y <= b.y1 for b in boxes for x, y in pts)


def test_frontier_figure_draws_the_slo_and_the_recommended_point():
    """cost,pools: a second panel gives each point's worst P99 TTFT against the SLO line (500 ms); cost,ttft: the
    SLO is a vertical line on the curve's own axis."""
    fig = plots.frontier_figure(_doc())
    low = fig.axes[-1]
    slo = [ln for ln in low.lines if ln.get_label().startswith("P99 TTFT SLO")]
    assert len(slo) == 1 and set(slo[0].get_ydata()) == {SLO_MS}
    worst = [c for c in low.collections if c.get_label().startswith("worst pool P99")]
    assert worst[0].get_offsets().tolist() == [[p.axis_value, p.worst_ttft_p99_ms] for p in POINTS]
    ttft = plots.frontier_figure({**_doc(axis="ttft")})
    assert len(ttft.axes) == 1
    vertical = [ln for ln in ttft.axes[0].lines if ln.get_label().startswith("P99 TTFT SLO")]
    assert len(vertical) == 1 and set(vertical[0].get_xdata()) == {SLO_MS}
