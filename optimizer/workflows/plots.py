r"""Figures of the workflow results (``--plot FILE`` and ``fleetopt report``): one function per figure.

Each figure function takes the command's result record (anything with a ``to_json()``) or its JSON dict (as the
command's ``--json`` wrote it: non-finite numbers as ``null``) and a path, and writes the figure as PNG or SVG
by the path's suffix, atomically (a temporary file in the target's folder, then :func:`os.replace`). The
figures:

==========================  ==========================================================================
function                    figure (every axis labelled with its unit; the source of each series named)
==========================  ==========================================================================
:func:`plot_split_table`    ``pareto --split-table``: $/yr against the worst pool's P99 TTFT per boundary,
                            the Pareto rows joined, the homogeneous baseline and the recommended row marked
:func:`plot_frontier`       ``pareto --axes cost,AXIS``: least $/yr against power (kW), the worst pool's
                            P99 TTFT (ms) or the number of pools, one point per optimal re-solve, the
                            least-cost step function :math:`C(\varepsilon)` through them, the homogeneous
                            baseline and the recommended point marked
:func:`plot_whatif`         ``whatif``: $/yr against the first swept value (one curve per value of the
                            others), a step (the fleet changes from the previous point) marked
:func:`plot_gridflex`       ``gridflex``: fleet power (kW) and P99 TTFT (ms) against the curtailment
                            depth, the SLO line and the safe depths
:func:`plot_headroom`       ``headroom``: each pool's largest fleet rate (analytic; the simulated bracket
                            with ``--verify``) against the current rate; ``--range``: least $/yr
                            against the arrival rate
:func:`plot_tpw`            ``tpw``: tokens per watt against the context window, per profile
:func:`plot_ttft`           ``simulate``: the TTFT distribution of each pool with the SLO line. The JSON of
                            ``simulate`` holds quantiles (P50, P90, P99 and the P99 interval), not the
                            per-request latencies (the replications' arrays stay inside
                            :func:`fleetopt.optimizer.simulation.simulate.simulate_plan`), so the figure
                            shows those quantiles and says so in its title; given ``samples_ms`` (per pool
                            label, milliseconds) it draws their empirical CDFs instead
:func:`plot_plan`           ``solve``: each pool's P99 TTFT (analytic; simulated with its 95 % interval
                            where a verification or a ``simulate`` report of the same plan gives it)
                            against the SLO
==========================  ==========================================================================

Reproducible output
-------------------
The same input gives the same bytes (:func:`render`): a fixed figure size (:data:`FIGSIZE_IN`) and
resolution (:data:`DPI`), matplotlib's bundled DejaVu Sans, ``svg.hashsalt`` fixed (:data:`SVG_HASHSALT`; the
SVG backend otherwise salts its clip-path and marker ids with random numbers), and no metadata that changes
between runs: SVG without its ``Date`` (and ``Creator``, ``Format``, ``Type``, which carry the matplotlib
version and external URLs), PNG without its ``Software`` text chunk (PNG gets no date unless asked). Matplotlib
is imported inside the functions (the ``plot`` extra: ``pip install 'fleetopt[plot]'``); figures are built on
:class:`matplotlib.figure.Figure` directly, not through ``pyplot``, so nothing global is left behind.
"""

from __future__ import annotations

import io
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Callable, Mapping, Sequence

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.output.writes import check_target as output_target
from fleetopt.optimizer.output.writes import to_jsonable, write_bytes

if TYPE_CHECKING:   # matplotlib is the optional plot extra, imported where a figure is built
    from matplotlib.typing import RcKeyType

__all__ = ["FORMATS", "FIGSIZE_IN", "DPI", "SVG_HASHSALT", "check_target", "require_matplotlib", "as_json",
           "render", "write_figure", "write_atomic", "plot_split_table", "plot_frontier", "plot_whatif",
           "plot_gridflex", "plot_headroom", "plot_tpw", "plot_ttft", "plot_plan", "split_table_figure",
           "frontier_figure", "whatif_figure", "gridflex_figure", "headroom_figure", "tpw_figure", "ttft_figure",
           "plan_figure"]

FORMATS = {".png": "png", ".svg": "svg"}
"""Suffix of the target -> format written."""
FIGSIZE_IN = (8.0, 4.8)
"""Width and height of every figure, inches."""
DPI = 100
"""Resolution of PNG output, dots per inch (SVG is resolution-free; matplotlib writes it at 72 dpi)."""
SVG_HASHSALT = "fleetopt"
"""The ``svg.hashsalt`` rcParam: a fixed salt makes the SVG ids the same from run to run."""
_SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
_PNG_METADATA = {"Software": None}
_MET, _MISSED, _ACCENT, _GREY, _SIM = "#1f77b4", "#d62728", "#ff7f0e", "#7f7f7f", "#2ca02c"
_MS_PER_S = 1000.0


# --------------------------------------------------------------------------------------------
# Plumbing: input, matplotlib, output
# --------------------------------------------------------------------------------------------


def require_matplotlib(flag: str = "--plot"):
    """Import matplotlib for figures (Agg backend unless ``pyplot`` is already loaded with another one).

    Raises
    ------
    InstanceError
        matplotlib is not installed (one line naming ``flag`` and the extra to install).
    """
    try:
        import matplotlib
    except ImportError:
        raise InstanceError(f"{flag}: figures need matplotlib: pip install 'fleetopt[plot]'") from None
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    return matplotlib


def check_target(target: str | os.PathLike, flag: str = "--plot", protect: Sequence = ()) -> Path:
    """Check a figure's target before the work that feeds it: a ``.png`` or ``.svg`` name in an existing folder,
    not one of ``protect`` (the user's input files), and matplotlib importable.

    Raises
    ------
    InstanceError
        One line naming ``flag`` and the file.
    """
    path = Path(target)
    if path.suffix.lower() not in FORMATS:
        raise InstanceError(f"{flag}: {target}: unsupported suffix {path.suffix or '(none)'!r}; use .png or .svg")
    output_target(path, flag, protect)
    require_matplotlib(flag)
    return path


def as_json(result: Any) -> dict:
    """A result record (with ``to_json()``) or its JSON dict, as the JSON reads it back (non-finite -> None)."""
    data = result.to_json() if hasattr(result, "to_json") else result
    if not isinstance(data, Mapping):
        raise InstanceError(f"expected a result record or its JSON object, got {type(data).__name__}")
    return cast(dict, to_jsonable(dict(data)))      # to_jsonable maps a dict to a dict


def _f(x) -> float:
    """A JSON number as float: None (a non-finite value in the JSON) -> nan."""
    return math.nan if x is None else float(x)


def _inf(x) -> float:
    """A JSON latency as float: None -> +inf (the JSON writes an unbounded P99 as null)."""
    return math.inf if x is None else float(x)


def _new_figure(nrows: int = 1, sharex: bool = False):
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, 1, sharex=sharex, squeeze=False)[:, 0]
    return fig, list(axes)


def render(fig, fmt: str, *, text_as_paths: bool = True) -> bytes:
    """The figure's bytes in ``fmt`` (``png`` or ``svg``), reproducible (module docstring, "Reproducible output").

    ``text_as_paths=False`` writes SVG text as ``<text>`` elements (smaller, selectable; the HTML report's
    inline figures) instead of glyph outlines.
    """
    import matplotlib

    if fmt not in FORMATS.values():
        raise ValueError(f"fmt must be one of {sorted(FORMATS.values())}; got {fmt!r}")
    rc: dict[RcKeyType, Any] = {"svg.hashsalt": SVG_HASHSALT, "svg.fonttype": "path" if text_as_paths else "none",
          "path.simplify": True, "savefig.dpi": DPI}
    buf = io.BytesIO()
    with matplotlib.rc_context(rc):
        fig.savefig(buf, format=fmt, dpi=DPI, metadata=_SVG_METADATA if fmt == "svg" else _PNG_METADATA)
    return buf.getvalue()


def write_figure(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` (format by suffix) atomically: a temporary file in the same folder, then
    :func:`os.replace`, so a reader never sees half a file."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InstanceError(f"--plot: {path}: unsupported suffix {path.suffix or '(none)'!r}; use .png or .svg")
    return write_atomic(path, render(fig, fmt))


def write_atomic(path: str | Path, data: bytes, flag: str = "-o") -> Path:
    """Write ``data`` to ``path`` by :func:`fleetopt.optimizer.output.writes.write_bytes`: atomically over a regular
    file (its mode kept), through a device or FIFO, never over a file the command read."""
    return write_bytes(data, path, flag)


def _writer(build: Callable) -> Callable:
    def plot(result, path, **kwargs) -> Path:
        require_matplotlib()
        return write_figure(build(result, **kwargs), path)

    plot.__name__ = "plot_" + build.__name__.removesuffix("_figure")
    plot.__doc__ = (f"Write :func:`{build.__name__}` of ``result`` to ``path`` (PNG or SVG by suffix, atomically); "
                    "returns the path.")
    return plot


def _k(x: float) -> str:
    """Tokens as a short label: 2048 -> '2K', 1536 -> '1.5K', 768 -> '768'."""
    if x >= 1024 and x % 1024 == 0:
        return f"{int(x) // 1024}K"
    if x >= 1024:
        return f"{x / 1024:.1f}K"
    return f"{int(x)}"


LOG_TICK_SUBS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0), tuple(float(k) for k in range(1, 10)))
"""Mantissas a log axis labels, coarsest first (:func:`log_ticks`)."""
MAX_LOG_TICKS = 8
"""Most labelled ticks on a log axis (:func:`log_ticks`)."""


def log_ticks(vmin: float, vmax: float, max_ticks: int = MAX_LOG_TICKS) -> list[float]:
    """The labelled ticks of a log axis over ``[vmin, vmax]``: the finest mantissa set of :data:`LOG_TICK_SUBS`
    (1; 1, 2, 5; ...; 1..9 times the powers of ten) giving at most ``max_ticks`` ticks in the range, so that an
    axis spanning less than a decade still shows several labels (matplotlib's default labels the powers of ten
    only: one label, or none, on such an axis). Over more decades than ``max_ticks``: every k-th power of ten.
    A range holding fewer than 3 of the finest ticks gets evenly spaced round numbers instead.

    Examples
    --------
    >>> log_ticks(40.0, 600.0)
    [50.0, 70.0, 100.0, 200.0, 300.0, 500.0]
    >>> log_ticks(40.0, 600.0, max_ticks=4)
    [50.0, 100.0, 200.0, 500.0]
    >>> log_ticks(1.0, 1e6)
    [1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0]
    >>> log_ticks(210.0, 290.0)
    [220.0, 240.0, 260.0, 280.0]
    """
    if not (vmin > 0 and vmax > vmin and math.isfinite(vmax)):
        return []
    lo, hi = math.floor(math.log10(vmin)), math.ceil(math.log10(vmax))

    def ticks(subs, stride=1):
        return [float(f"{m * 10.0 ** e:.12g}") for e in range(lo, hi + 1, stride) for m in subs
                if vmin * (1 - 1e-9) <= m * 10.0 ** e <= vmax * (1 + 1e-9)]

    best = None
    for subs in LOG_TICK_SUBS:
        got = ticks(subs)
        if len(got) > max_ticks:
            break
        best = got
    if best is None:
        stride = 1
        while len(ticks((1.0,), stride)) > max_ticks:
            stride += 1
        return ticks((1.0,), stride)
    if len(best) < 3:
        from matplotlib.ticker import MaxNLocator

        return [float(t) for t in MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(vmin, vmax)
                if vmin <= t <= vmax]
    return best


def _log_ms(axis) -> None:
    """A log-scale millisecond axis labelled in plain numbers (10, 100, 1,000) at :func:`log_ticks` (several
    labels even within one decade), no minor labels."""
    from matplotlib.axis import XAxis, YAxis
    from matplotlib.ticker import FuncFormatter, Locator, NullFormatter

    class _Plain(Locator):
        def _axis(self) -> XAxis | YAxis:
            assert isinstance(self.axis, (XAxis, YAxis))    # attached below to a plot's x or y axis
            return self.axis

        def __call__(self):
            return self.tick_values(*self._axis().get_view_interval())

        def tick_values(self, vmin, vmax):
            return log_ticks(min(vmin, vmax), max(vmin, vmax), self._room())

        def _room(self) -> int:
            """Labels the axis has room for: one per 50 px across, one per 20 px up (at :data:`DPI`)."""
            box = self._axis().axes.bbox
            span, pitch = (box.width, 50.0) if self._axis().axis_name == "x" else (box.height, 20.0)
            return max(2, min(MAX_LOG_TICKS, int(span / pitch)))

    axis.set_major_locator(_Plain())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _legend_below(fig, *axes, ncols: int = 2) -> None:
    """The axes' legend (one for all of ``axes``) outside the plotting area, below it (the constrained layout
    makes room), so that it never covers data, whatever the data's shape."""
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(ncols, len(handles)), fontsize=7,
                   frameon=False)


def _slo_line(ax, slo_ms: float, vertical: bool = False) -> None:
    if slo_ms is None or not math.isfinite(slo_ms):
        return
    line = ax.axvline if vertical else ax.axhline
    line(slo_ms, color=_MISSED, linestyle="--", linewidth=1.0, label=f"P99 TTFT SLO {slo_ms:,.0f} ms")


# --------------------------------------------------------------------------------------------
# pareto --split-table
# --------------------------------------------------------------------------------------------


def split_table_figure(result):
    """The split table's frontier: $/yr (thousands) against the worst pool's P99 TTFT (ms), one point per boundary.

    Rows meeting the SLO are filled, rows missing it hollow (an unbounded P99 is drawn at the right edge);
    the Pareto rows (``pareto`` true) are joined in order of cost; the homogeneous baseline is a star, the
    recommended row a ring. Every number is the table's own (analytic).
    """
    t = as_json(result)
    fig, (ax,) = _new_figure()
    rows = t.get("rows") or []
    worst = [max(_inf(r.get("ttft_p99_ms_short")), _inf(r.get("ttft_p99_ms_long"))) for r in rows]
    cost_k = [_f(r.get("cost_per_year")) / 1e3 for r in rows]
    finite = [w for w in worst if math.isfinite(w)]
    b = t.get("baseline") or {}
    base_ms, base_k = _inf(b.get("ttft_p99_ms")), _f(b.get("cost_per_year")) / 1e3
    slo = _f(t.get("slo_ttft_p99_ms"))
    edge = 1.5 * max(finite + [slo if math.isfinite(slo) else 0.0] + ([base_ms] if math.isfinite(base_ms) else []),
                     default=1.0)
    x = [w if math.isfinite(w) else edge for w in worst]
    met = [bool(r.get("slo_met")) for r in rows]
    ax.scatter([x[k] for k in range(len(rows)) if met[k]], [cost_k[k] for k in range(len(rows)) if met[k]],
               color=_MET, zorder=3, label="boundary B, meets the SLO")
    ax.scatter([x[k] for k in range(len(rows)) if not met[k]], [cost_k[k] for k in range(len(rows)) if not met[k]],
               facecolors="none", edgecolors=_GREY, zorder=3, label="boundary B, misses the SLO")
    front = sorted((cost_k[k], x[k]) for k in range(len(rows)) if rows[k].get("pareto"))
    if front:
        ax.plot([p[1] for p in front], [p[0] for p in front], color=_MET, linewidth=1.0, zorder=2,
                label="Pareto rows")
    for k, r in enumerate(rows):
        ax.annotate(_k(r["boundary_tokens"]), (x[k], cost_k[k]), textcoords="offset points", xytext=(4, 4),
                    fontsize=7, color=_GREY)
    if math.isfinite(base_k):
        ax.scatter([base_ms if math.isfinite(base_ms) else edge], [base_k], marker="*", s=180, color=_ACCENT,
                   zorder=4, label=f"homogeneous baseline {b.get('fleet', '')}")
    rec = t.get("recommended")
    if rec is not None and 0 <= rec < len(rows):
        ax.scatter([x[rec]], [cost_k[rec]], s=260, facecolors="none", edgecolors="black", linewidths=1.5, zorder=5,
                   label=f"recommended B = {rows[rec]['boundary_tokens']:,} ({rows[rec]['fleet']})")
    _slo_line(ax, slo, vertical=True)
    ax.set_xscale("log")
    _log_ms(ax.xaxis)
    ax.set_xlabel("worst pool P99 TTFT (ms, analytic; log scale)")
    ax.set_ylabel("fleet cost (thousand US$/yr)")
    ax.set_title(f"{t.get('instance', '')}: two-pool split table on {t.get('gpu', '')}, "
                 f"{_f(t.get('arrival_rate')):g} req/s (analytic, ttft_model {t.get('ttft_model', '')})", fontsize=9)
    ax.grid(True, alpha=0.3)
    _legend_below(fig, ax)
    return fig


# --------------------------------------------------------------------------------------------
# pareto --axes
# --------------------------------------------------------------------------------------------

FRONTIER_AXIS_LABELS = {"power": "fleet power (kW, analytic)",
                        "ttft": "worst pool P99 TTFT (ms, analytic)",
                        "pools": "pools in the plan (count)"}
"""x-axis label of :func:`frontier_figure` per second axis, unit in parentheses."""
FRONTIER_POINTS_GID = "frontier-points"
"""SVG id of :func:`frontier_figure`'s points (one marker per point, in the JSON's order): the report gives each
marker its plan as a hover title."""


def frontier_figure(result):
    r"""The exact trade-off curve: least cost (thousand US$/yr) against the second axis, one point per frontier
    point (an optimal re-solve, analytic), joined by the least-cost step function
    :math:`C(\varepsilon)` (the cost of the cheapest point with axis value at most :math:`\varepsilon`); the
    homogeneous baseline is a star, the recommended point a ring, a point missing the instance's SLO hollow. The
    points series is labelled ``frontier points`` and holds exactly the JSON's points,
    ``(axis_value, cost_per_year / 1000)``.

    The SLO line: on a ``ttft`` curve, the instance's P99 TTFT SLO as a vertical line (the axis is the P99);
    on a ``power`` or ``pools`` curve, a second panel below (same x) gives each point's worst pool P99 TTFT
    against the SLO as a horizontal line (a document without ``slo_ttft_p99_ms`` gets no SLO line).
    """
    f = as_json(result)
    axis = (f.get("axes") or ["cost", ""])[-1]
    unit = f.get("axis_unit", "")
    slo = _f(f.get("slo_ttft_p99_ms"))
    pts = f.get("points") or []
    second = axis != "ttft" and math.isfinite(slo) and bool(pts)
    fig, axes = _new_figure(2 if second else 1, sharex=True)
    ax = axes[0]
    xs = [_f(p.get("axis_value")) for p in pts]
    ys = [_f(p.get("cost_per_year")) / 1e3 for p in pts]
    met = [p.get("slo_met", True) is not False and not p.get("violations") for p in pts]
    ax.scatter(xs, ys, color=_MET, zorder=3, label=f"frontier points ({len(pts)} optimal re-solves)",
               facecolors=[_MET if m else "white" for m in met], edgecolors=_MET, gid=FRONTIER_POINTS_GID)
    order = sorted(range(len(pts)), key=lambda k: xs[k])
    if len(order) > 1:
        ax.step([xs[k] for k in order], [ys[k] for k in order], where="post", color=_MET, linewidth=1.0, zorder=2,
                label="least cost C(ε) at cap ε")
    b = f.get("baseline")
    if b is not None:
        ax.scatter([_f(b.get("axis_value"))], [_f(b.get("cost_per_year")) / 1e3], marker="*", s=180, color=_ACCENT,
                   zorder=4, label=f"homogeneous baseline {b.get('fleet', '')}"
                   + (" (dominated)" if f.get("baseline_dominated") else ""))
    rec = f.get("recommended")
    if rec is not None and 0 <= rec < len(pts):
        ax.scatter([xs[rec]], [ys[rec]], s=260, facecolors="none", edgecolors="black", linewidths=1.5, zorder=5,
                   label=f"recommended (point {rec + 1}): {pts[rec].get('fleet', '')}")
    if not all(met):
        ax.scatter([], [], facecolors="white", edgecolors=_MET, label="hollow: misses the SLO or a limit")
    if axis == "ttft":
        _slo_line(ax, slo, vertical=True)
    if axis == "pools":
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(x=0.06, y=0.15)
    ax.set_ylabel("least fleet cost\n(thousand US$/yr)" if second else "least fleet cost (thousand US$/yr)")
    ax.set_title(f"{f.get('instance', '')}: least cost against {axis}\n({f.get('sweep', '')} sweep; analytic, "
                 "each point an optimal re-solve)", fontsize=9)
    ax.grid(True, alpha=0.3)
    if second:
        low = axes[1]
        worst = [_inf(p.get("worst_ttft_p99_ms")) for p in pts]
        ok = [k for k in range(len(pts)) if math.isfinite(worst[k]) and worst[k] > 0]
        low.scatter([xs[k] for k in ok], [worst[k] for k in ok], marker="D", s=18, zorder=3,
                    color=[_MET if worst[k] <= slo else _MISSED for k in ok],
                    label="worst pool P99 TTFT of each point (analytic)")
        if rec is not None and 0 <= rec < len(pts) and rec in ok:
            low.scatter([xs[rec]], [worst[rec]], s=160, facecolors="none", edgecolors="black", linewidths=1.5,
                        zorder=5)
        _slo_line(low, slo)
        low.set_yscale("log")
        finite = [worst[k] for k in ok] + [slo]
        low.set_ylim(0.7 * min(finite), 1.5 * max(finite))
        _log_ms(low.yaxis)
        low.set_ylabel("P99 TTFT (ms)")
        low.grid(True, alpha=0.3, which="both")
        low.set_xlabel(FRONTIER_AXIS_LABELS.get(axis, f"{axis} ({unit})"))
    else:
        ax.set_xlabel(FRONTIER_AXIS_LABELS.get(axis, f"{axis} ({unit})"))
    _legend_below(fig, *axes)
    return fig


# --------------------------------------------------------------------------------------------
# whatif
# --------------------------------------------------------------------------------------------


def _numeric(values: Sequence) -> bool:
    return bool(values) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def whatif_figure(result):
    """The sweep's least cost ($/yr, thousands) against the first swept value, one curve per combination of the
    other sweeps' values (grid order). A point whose fleet differs from the previous point of its curve is a
    *step* (a large marker, labelled with its replica count); a scenario without a plan is an ``x`` on the
    axis. Every number analytic (each scenario re-solved exactly)."""
    w = as_json(result)
    sweeps = w.get("sweeps") or []
    rows = w.get("scenarios") or []
    fig, (ax,) = _new_figure()
    if not sweeps:
        ax.set_title("whatif: no sweep")
        return fig
    first = sweeps[0]["path"]
    values = list(sweeps[0]["values"])
    numeric = _numeric(values)
    pos = (lambda v: float(v)) if numeric else (lambda v: float(values.index(v)))
    curves: dict[tuple, list[dict]] = {}
    for r in rows:
        rest = tuple((s["path"], repr(r["overrides"].get(s["path"]))) for s in sweeps[1:])
        curves.setdefault(rest, []).append(r)
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    missing_x = []
    for c, (rest, pts) in enumerate(curves.items()):
        color = colors[c % len(colors)]
        label = ", ".join(f"{p}={v}" for p, v in rest) or "least cost"
        xs, ys, prev = [], [], None
        steps_x, steps_y, steps_n = [], [], []
        for r in pts:
            xv = pos(r["overrides"].get(first))
            if r.get("cost_per_year") is None:
                missing_x.append(xv)
                prev = None
                continue
            xs.append(xv)
            ys.append(r["cost_per_year"] / 1e3)
            if prev is not None and r.get("fleet") != prev:
                steps_x.append(xv)
                steps_y.append(r["cost_per_year"] / 1e3)
                steps_n.append(r.get("total_replicas"))
            prev = r.get("fleet")
        ax.plot(xs, ys, marker="o", markersize=3, color=color, linewidth=1.2, label=label)
        if steps_x:
            ax.scatter(steps_x, steps_y, s=60, color=color, edgecolors="black", zorder=4,
                       label="step: the fleet changes" if c == 0 else None)
            for xv, yv, n in zip(steps_x, steps_y, steps_n):
                ax.annotate(f"{n} rep.", (xv, yv), textcoords="offset points", xytext=(4, -10), fontsize=7)
    if missing_x:
        ax.scatter(missing_x, [0.0] * len(missing_x), marker="x", color=_MISSED, zorder=4, label="no plan",
                   clip_on=False)
    if not numeric:
        ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=20, fontsize=7)
    ax.set_xlabel(f"{first} (swept value{'; ' + _unit_of(first) if _unit_of(first) else ''})")
    ax.set_ylabel("least fleet cost (thousand US$/yr)")
    ax.set_ylim(bottom=0.0)
    ax.set_title(f"{w.get('instance', '')}: what-if over {len(rows)} scenarios (analytic: each re-solved exactly; "
                 f"P99 TTFT SLO {_f(w.get('slo_ttft_p99_ms')):,.0f} ms)", fontsize=9)
    ax.grid(True, alpha=0.3)
    _legend_below(fig, ax)
    return fig


def _unit_of(path: str) -> str:
    """The unit of a swept instance field, from its name (the instance schema's conventions)."""
    leaf = path.rsplit(".", 1)[-1]
    units = {"arrival_rate": "req/s", "ttft_p99_ms": "ms", "tpot_p99_ms": "ms", "max_context": "tokens",
             "max_count": "GPUs", "min_count": "GPUs", "cost_per_hr": "US$/hr", "max_power_kw": "kW",
             "max_cost_per_hr": "US$/hr", "max_total_gpus": "GPUs", "usd_per_kwh": "US$/kWh",
             "max_utilization": "share of capacity", "availability": "share of time up"}
    return units.get(leaf, "")


# --------------------------------------------------------------------------------------------
# gridflex
# --------------------------------------------------------------------------------------------


def gridflex_figure(result):
    """Power (kW) and P99 TTFT (ms, log scale) against the curtailment depth (% of the uncurtailed power).

    Top: the fleet's analytic mean power at the caps and the simulated mean over the event. Bottom: the analytic
    steady-state P99 and the simulated event P99 with its 95 % interval; an unbounded P99 (an unstable capped
    pool, or requests without a first token) is a triangle at the top edge; the SLO line and the safe depths
    (sustained, event) are drawn."""
    g = as_json(result)
    rows = g.get("depths") or []
    fig, (top, bottom) = _new_figure(2, sharex=True)
    d = [_f(r["depth"]) for r in rows]
    top.plot(d, [_f(r.get("power_kw")) for r in rows], marker="o", color=_MET, label="analytic mean power at the cap")
    top.plot(d, [_f(r.get("power_kw_event")) for r in rows], marker="s", linestyle=":", color=_SIM,
             label="simulated mean power over the event")
    top.set_ylabel("fleet power (kW)")
    top.grid(True, alpha=0.3)
    an = [_inf(r.get("ttft_p99_ms_analytic")) for r in rows]
    ev = [_inf(r.get("ttft_p99_ms_event")) if r.get("simulated", True) else math.nan for r in rows]
    finite = [v for v in an + ev if math.isfinite(v) and v > 0]
    slo = _f(g.get("slo_ttft_p99_ms"))
    ceiling = 3.0 * max(finite + ([slo] if math.isfinite(slo) else []), default=1.0)
    floor = 0.3 * min(finite + ([slo] if math.isfinite(slo) else []), default=1.0)
    bottom.plot([x for x, v in zip(d, an) if math.isfinite(v)], [v for v in an if math.isfinite(v)], marker="o",
                color=_MET, label="analytic steady-state P99")
    ok = [k for k, v in enumerate(ev) if math.isfinite(v)]
    if ok:
        lo = [ev[k] - _f((rows[k].get("ttft_p99_ci_ms_event") or [None, None])[0]) for k in ok]
        hi = [_inf((rows[k].get("ttft_p99_ci_ms_event") or [None, None])[1]) - ev[k] for k in ok]
        hi = [min(h, ceiling) if math.isfinite(h) else ceiling - ev[k] for h, k in zip(hi, ok)]
        lo = [0.0 if not math.isfinite(v) else max(v, 0.0) for v in lo]
        bottom.errorbar([d[k] for k in ok], [ev[k] for k in ok], yerr=[lo, hi], marker="s", linestyle=":",
                        color=_SIM, capsize=3, label="simulated event P99 (95 % interval)")
    unb_an = [x for x, v in zip(d, an) if not math.isfinite(v) and not math.isnan(v)]
    unb_ev = [d[k] for k, v in enumerate(ev) if v == math.inf]
    if unb_an:
        bottom.scatter(unb_an, [ceiling] * len(unb_an), marker="^", color=_MET, clip_on=False, zorder=4,
                       label="analytic: unstable (P99 unbounded)")
    if unb_ev:
        bottom.scatter(unb_ev, [ceiling] * len(unb_ev), marker="^", facecolors="none", edgecolors=_SIM,
                       clip_on=False, zorder=4, label="event: P99 unbounded")
    _slo_line(bottom, slo)
    bottom.set_yscale("log")
    _log_ms(bottom.yaxis)
    bottom.set_ylim(floor, ceiling)
    safe: dict[float, list[str]] = {}
    for key, name in (("max_safe_depth_sustained", "sustained"), ("max_safe_depth_event", "event")):
        if g.get(key) is not None:
            safe.setdefault(float(g[key]), []).append(name)
    for v, names in safe.items():
        for ax in (top, bottom):
            ax.axvline(v, color=_GREY, linestyle=":", linewidth=1.0)
        top.annotate(f"max safe depth ({' and '.join(names)}): {v:g} %", (v, 0.0), xycoords=("data", "axes fraction"),
                     fontsize=7, xytext=(3, 4), textcoords="offset points", color=_GREY)
    bottom.set_ylabel("P99 TTFT (ms)")
    bottom.set_xlabel("curtailment depth (% of the uncurtailed power)")
    bottom.grid(True, alpha=0.3, which="both")
    _legend_below(fig, top, bottom)
    top.set_title(f"{g.get('instance', '')}: demand response of {g.get('fleet', '')} at "
                  f"{_f(g.get('arrival_rate')):g} req/s\n(analytic; event simulated: "
                  f"{g.get('replications', '?')} replications, {_f(g.get('event_seconds')):g} s events, "
                  f"seed {g.get('seed', '?')})", fontsize=9)
    return fig


# --------------------------------------------------------------------------------------------
# headroom
# --------------------------------------------------------------------------------------------


STEP_LABEL_GAP_PX = 8.0
"""Least horizontal gap between two step labels of one row (pixels at :data:`DPI`)."""


def _step_labels(fig, ax, xs: Sequence[float], texts: Sequence[str], data_ys: Sequence[float]) -> None:
    """Label vertical step lines at ``xs`` with ``texts``, horizontally, in a band below the data that no data
    point enters (the y-axis is extended downwards), each label just right of its line. Labels are laid out in
    rows greedily: a label goes in the first row where it clears the previous label by :data:`STEP_LABEL_GAP_PX`
    (widths measured by the renderer after a layout pass), so no two labels overprint, however close the
    steps."""
    if not xs:
        return
    fontsize = 7
    labels = [ax.annotate(t, (x, 0.0), xycoords=("data", "axes fraction"), xytext=(2, 3),
                          textcoords="offset points", fontsize=fontsize, color=_ACCENT, ha="left", va="bottom")
              for x, t in zip(xs, texts)]
    fig.draw_without_rendering()
    renderer = fig._get_renderer()
    spans = sorted(((t.get_window_extent(renderer).x0, t.get_window_extent(renderer).x1, t) for t in labels),
                   key=lambda e: e[0])
    ends: list[float] = []
    row_of = {}
    for x0, x1, t in spans:
        row = next((r for r, end in enumerate(ends) if x0 >= end + STEP_LABEL_GAP_PX), len(ends))
        if row == len(ends):
            ends.append(x1)
        else:
            ends[row] = x1
        row_of[id(t)] = row
    line_pt = 1.35 * fontsize
    for t in labels:
        t.xyann = (2, 3 + line_pt * row_of[id(t)])
    finite = [y for y in data_ys if math.isfinite(y)]
    if finite:
        lo, hi = min(finite), max(finite)
        height_pt = ax.get_window_extent(renderer).height * 72.0 / fig.dpi
        band = min(0.6, (len(ends) * line_pt + 6.0) / max(height_pt, 1.0))   # share of the axes for the labels
        span = max(hi - lo, abs(hi) * 0.1, 1e-9)
        top = hi + 0.05 * span
        ax.set_ylim(lo - band * (top - lo + 0.02 * span) / (1.0 - band) - 0.02 * span, top)


def headroom_figure(result):
    """``headroom --fleet``: per pool, the largest fleet arrival rate (req/s) it carries analytically (bars, the
    binding pool darker) and in simulation (the passing/failing bracket, with ``--verify``), against the current
    rate. ``headroom --range``: the least cost ($/yr, thousands) of every rate solved, steps marked."""
    h = as_json(result)
    fig, (ax,) = _new_figure()
    if h.get("command") == "headroom --range":
        pts = sorted(h.get("solved") or [], key=lambda p: p["arrival_rate"])
        xs = [p["arrival_rate"] for p in pts if p.get("cost_per_year") is not None]
        ys = [p["cost_per_year"] / 1e3 for p in pts if p.get("cost_per_year") is not None]
        ax.step(xs, ys, where="post", color=_MET, marker="o", markersize=3, label="least cost at the rates solved")
        rates = [float(s["arrival_rate"]) for s in h.get("steps") or []]
        for k, rate in enumerate(rates):
            ax.axvline(rate, color=_ACCENT, linewidth=0.8, linestyle="--",
                       label="capacity step: add capacity before the rate labelled (req/s)" if k == 0 else None)
        _step_labels(fig, ax, rates, [f"{r:g}" for r in rates], ys)
        ax.set_xlabel("fleet arrival rate (req/s)")
        ax.set_ylabel("least fleet cost (thousand US$/yr)")
        ax.set_title(f"{h.get('instance', '')}: least-cost fleet over {h['range'][0]:g}-{h['range'][1]:g} req/s "
                     "(analytic: re-solved at each rate)", fontsize=9)
        ax.grid(True, alpha=0.3)
        _legend_below(fig, ax)
        return fig
    pools = h.get("pools") or []
    labels = [f"{p['min_tokens']:,}-{p['max_tokens']:,} {p['gpu']} x{p['replicas']}" for p in pools]
    ys = list(range(len(pools)))
    rates = [_inf(p.get("max_arrival_rate")) for p in pools]
    finite = [r for r in rates if math.isfinite(r)]
    now = _f(h.get("arrival_rate"))
    sim = h.get("sim") or {}
    sim_pools = sim.get("pools") or []
    sim_vals = [_f(q.get(k)) for q in sim_pools for k in ("max_arrival_rate_sim", "min_failing_rate_sim")]
    edge = 1.15 * max(finite + [v for v in sim_vals if math.isfinite(v)] + [now], default=1.0)
    bind = h.get("binding_pool_index")
    colors = [_MET if k == bind else "#9ecae1" for k in ys]
    ax.barh(ys, [r if math.isfinite(r) else edge for r in rates], color=colors, height=0.5,
            label="largest fleet rate carried (analytic; dark: binding pool)")
    for k, (r, p) in enumerate(zip(rates, pools)):
        ax.annotate(f"{r:,.1f} ({p.get('limited_by') or 'no limit found'})" if math.isfinite(r) else "no limit found",
                    (min(r, edge) if math.isfinite(r) else edge, k), xytext=(3, 6), textcoords="offset points",
                    fontsize=7)
    if sim_pools:
        for k, q in enumerate(sim_pools):
            lo, hi = _f(q.get("max_arrival_rate_sim")), _f(q.get("min_failing_rate_sim"))
            if math.isfinite(lo):
                ax.plot([lo, hi if math.isfinite(hi) else lo], [k - 0.3, k - 0.3], color=_SIM, marker="|",
                        markersize=10, label="simulated: largest passing .. first failing rate" if k == 0 else None)
    ax.axvline(now, color=_ACCENT, linestyle="--", label=f"current rate {now:g} req/s")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("fleet arrival rate (req/s)")
    ax.set_title(f"{h.get('instance', '')}: headroom of {h.get('fleet', '')} (P99 TTFT SLO "
                 f"{_f(h.get('slo_ttft_p99_ms')):,.0f} ms, analytic{'; simulated with --verify' if sim else ''})",
                 fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    _legend_below(fig, ax)
    return fig


# --------------------------------------------------------------------------------------------
# tpw
# --------------------------------------------------------------------------------------------


def tpw_figure(result):
    """Tokens per watt against the context window (tokens, log2 scale; tok/W log scale), one curve per profile
    and model, labelled with its profile quality. Every number analytic (one replica at full batch)."""
    t = as_json(result)
    rows = t.get("rows") or []
    fig, (ax,) = _new_figure()
    curves: dict[str, list[dict]] = {}
    for r in rows:
        curves.setdefault(f"{r.get('profile', '')} ({r.get('quality', '')})", []).append(r)
    for label, pts in curves.items():
        pts = sorted(pts, key=lambda r: r["context"])
        ax.plot([r["context"] for r in pts], [_f(r.get("tok_per_watt")) for r in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    contexts = sorted({r["context"] for r in rows})
    if contexts:
        ax.set_xticks(contexts, [_k(c) for c in contexts])
    ax.set_xlabel("context window (tokens)")
    ax.set_ylabel("output tokens per watt (tok/W = tok/s per W)")
    ax.set_title("tokens per watt against the context window (analytic: one replica, every KV slot busy)",
                 fontsize=9)
    ax.grid(True, alpha=0.3, which="both")
    _legend_below(fig, ax)
    return fig


# --------------------------------------------------------------------------------------------
# simulate: TTFT per pool
# --------------------------------------------------------------------------------------------


def _pool_label(p: Mapping) -> str:
    return f"{p['min_tokens']:,}-{p['max_tokens']:,} {p['gpu']} x{p['replicas']}"


def ttft_figure(result, samples_ms: Mapping[str, Sequence[float]] | None = None):
    """The simulated TTFT distribution of each pool (ms, log scale) with the SLO line.

    Without ``samples_ms`` (the ``simulate`` JSON holds no per-request latencies): each pool's P50, P90 and P99
    from ``latency_ms.ttft``, the P99's 95 % interval as an error bar, and the fleet's; the title says the figure
    shows quantiles only. With ``samples_ms`` (pool label as :func:`_pool_label` writes it, or ``"fleet"``, ->
    per-request TTFT in ms; +inf for a request without a first token): their empirical CDFs.
    """
    s = as_json(result)
    pools = s.get("pools") or []
    slo = _f(s.get("slo_ttft_p99_ms"))
    fig, (ax,) = _new_figure()
    if samples_ms:
        import numpy as np

        for label, values in samples_ms.items():
            v = np.sort(np.asarray(values, dtype=float))
            if v.size == 0:
                continue
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=f"{label} ({v.size:,} requests)")
        ax.set_xscale("log")
        _log_ms(ax.xaxis)
        ax.set_ylabel("share of requests with TTFT at most x")
        ax.set_ylim(0.0, 1.0)
        _slo_line(ax, slo, vertical=True)
        ax.set_xlabel("time to first token (ms, simulated)")
        ax.set_title(f"{s.get('instance', '')}: simulated TTFT per pool (empirical CDF of the measured requests)",
                     fontsize=9)
        ax.grid(True, alpha=0.3, which="both")
        _legend_below(fig, ax)
        return fig
    entries = [(_pool_label(p), p) for p in pools] + [("fleet", s)]
    q_style = (("p50", "o", "#9ecae1"), ("p90", "s", "#4292c6"), ("p99", "D", _MET))
    for k, (_label, p) in enumerate(entries):
        t = ((p.get("latency_ms") or {}).get("ttft") or {})
        xs = [_inf(t.get(q)) for q, _, _ in q_style]
        for (q, marker, color), x in zip(q_style, xs):
            if math.isfinite(x):
                ax.scatter([x], [k], marker=marker, color=color, zorder=3, label=q.upper() if k == 0 else None)
        finite = [x for x in xs if math.isfinite(x)]
        if len(finite) > 1:
            ax.plot([min(finite), max(finite)], [k, k], color=_GREY, linewidth=1.0, zorder=2)
        ci = p.get("ttft_p99_ci_ms") or [None, None]
        p99 = _inf(t.get("p99"))
        if ci[0] is not None and math.isfinite(p99):
            hi = _inf(ci[1])
            ax.plot([ci[0], hi if math.isfinite(hi) else 3.0 * p99], [k + 0.18, k + 0.18], color=_MET, marker="|",
                    label="P99 95 % interval" if k == 0 else None)
    _slo_line(ax, slo, vertical=True)
    ax.set_xscale("log")
    _log_ms(ax.xaxis)
    ax.set_yticks(range(len(entries)), [e[0] for e in entries], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time to first token (ms, simulated)")
    opts = s.get("options") or {}
    ax.set_title(f"{s.get('instance', '')}: simulated TTFT quantiles per pool, P50/P90/P99 only (the JSON holds no "
                 f"per-request latencies)\n{s.get('requests_simulated', '?'):,} requests, "
                 f"{opts.get('replications', s.get('replications', '?'))} replications, seed {s.get('seed', '?')}",
                 fontsize=9)
    ax.grid(True, axis="x", alpha=0.3, which="both")
    _legend_below(fig, ax)
    return fig


# --------------------------------------------------------------------------------------------
# solve: the plan's pools against the SLO
# --------------------------------------------------------------------------------------------


def plan_figure(result, sim: Mapping | None = None):
    """Each pool's analytic P99 TTFT (ms, horizontal bars, log scale) of a ``solve`` plan against the SLO, with the
    simulated P99 and its 95 % interval where known: the chosen plan's pools of a ``--verify-top``
    verification, or ``sim`` (a ``simulate`` report of the same plan, pools in the same order)."""
    q = as_json(result)
    pools = q.get("pools") or []
    slo = _f(q.get("slo_ttft_p99_ms"))
    fig, (ax,) = _new_figure()
    ys = list(range(len(pools)))
    an = [_inf(p.get("ttft_p99_ms")) for p in pools]
    finite = [v for v in an if math.isfinite(v)]
    edge = 2.0 * max(finite + ([slo] if math.isfinite(slo) else []), default=1.0)
    ax.barh(ys, [v if math.isfinite(v) else edge for v in an], height=0.5, color="#9ecae1",
            label=f"analytic P99 TTFT (ttft_model {q.get('ttft_model', '')})")
    sim_pools = _simulated_pools(q, sim)
    if sim_pools:
        xs = [(k, _inf(sp.get("ttft_p99_ms_sim")), sp.get("ttft_p99_ci_ms") or [None, None])
              for k, sp in enumerate(sim_pools) if sp is not None]
        xs = [(k, v, ci) for k, v, ci in xs if math.isfinite(v)]
        if xs:
            lo = [max(v - _f(ci[0]), 0.0) if ci[0] is not None else 0.0 for _, v, ci in xs]
            hi = [(_inf(ci[1]) - v) if ci[1] is not None and math.isfinite(_inf(ci[1])) else 0.0 for _, v, ci in xs]
            ax.errorbar([v for _, v, _ in xs], [k for k, _, _ in xs], xerr=[lo, hi], fmt="D", color=_SIM, capsize=3,
                        label="simulated P99 TTFT (95 % interval)")
    _slo_line(ax, slo, vertical=True)
    ax.set_xscale("log")
    _log_ms(ax.xaxis)
    ax.set_yticks(ys, [_pool_label(p) for p in pools], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("P99 time to first token (ms)")
    ax.set_title(f"{q.get('instance', '')}: P99 TTFT per pool of the plan (selected by {q.get('method', '?')}; "
                 "bars analytic)", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3, which="both")
    _legend_below(fig, ax)
    return fig


def _simulated_pools(solve: Mapping, sim: Mapping | None) -> list | None:
    """Per pool of the solve's plan, its simulated record (``ttft_p99_ms_sim``, ``ttft_p99_ci_ms``), or None."""
    if sim is not None:
        return list(sim.get("pools") or [])
    v = solve.get("verification") or {}
    rank, round_ = v.get("chosen_rank"), v.get("chosen_round")
    for p in v.get("plans") or []:
        if rank is not None and p.get("rank") == rank and p.get("round") == round_:
            return list(p.get("pools") or [])
    return None


plot_split_table = _writer(split_table_figure)
plot_frontier = _writer(frontier_figure)
plot_whatif = _writer(whatif_figure)
plot_gridflex = _writer(gridflex_figure)
plot_headroom = _writer(headroom_figure)
plot_tpw = _writer(tpw_figure)
plot_ttft = _writer(ttft_figure)
plot_plan = _writer(plan_figure)
