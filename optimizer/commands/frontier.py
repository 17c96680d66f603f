"""``fleetopt pareto INSTANCE --axes cost,AXIS``: load, call :func:`fleetopt.optimizer.workflows.frontier.frontier`
on the chosen executor backend (``--workers N``, ``--scheduler ADDRESS``) with progress on stderr
(:mod:`fleetopt.optimizer.commands.progress`), render, write, plot, exit. :func:`run_axes` is what the ``pareto``
command delegates to when ``--axes`` is given.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from fleetopt.optimizer.commands.progress import reporter
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.workflows import plots
from fleetopt.optimizer.workflows.executor import Backend
from fleetopt.optimizer.workflows.frontier import Frontier, frontier, parse_axes

if TYPE_CHECKING:
    from fleetopt.optimizer.output.tables import Output

__all__ = ["run_axes", "render_frontier"]


def _num(x: float, unit: str) -> str:
    if not math.isfinite(x):
        return "inf"
    return f"{x:,.0f}" if unit == "pools" else f"{x:,.3f}" if unit == "kW" else f"{x:,.1f}"


def render_frontier(c: Console | Output, f: Frontier) -> None:
    """The curve as a table, then where its numbers come from, the recommended point (the cheapest meeting the
    instance's SLO within its limits) and the knee as a labelled alternative."""
    a = f.axis
    table = Table(title=f"{f.instance}: least cost against {a.name} ({f.sweep} sweep, {f.solves} optimal re-solves, "
                        f"{f.seconds:.1f} s)", title_justify="left")
    axis_col = a.name if a.unit == a.name else f"{a.name} {a.unit}"
    pools_col = a.name != "pools"                  # the pools axis is its own column
    names = ["#", "$/yr", "$/hr", axis_col, "GPUs"] + ["pools"] * pools_col + ["SLO", "solved with", "fleet", ""]
    for name in names:
        table.add_column(name, justify="right" if name in ("#", "$/yr", "$/hr", "GPUs", "pools", axis_col) else "left",
                         no_wrap=True)
    for k, p in enumerate(f.points):
        mark = ["<- recommended"] * (k == f.recommended) + ["knee (alternative)"] * (k == f.knee)
        slo = ("met" if p.slo_met else "MISSED") + (", breaks limits" if p.violations else "")
        table.add_row(str(k + 1), f"${p.cost_per_year / 1e3:,.0f}K", f"{p.cost_per_hr:,.2f}",
                      _num(p.axis_value, a.unit), str(p.total_gpus), *[str(p.pools)] * pools_col, slo, p.constraint,
                      p.fleet, ", ".join(mark))
    c.print(table)
    c.print("every point: least cost (fleetopt solve, exact) of the instance with the --set shown, re-evaluated "
            "analytically; dominated points removed", markup=False)
    if f.baseline is not None:
        b = f.baseline
        c.print(f"homogeneous baseline (analytic): {b.fleet}, ${b.cost_per_year / 1e3:,.0f}K/yr, "
                f"{_num(b.axis_value, a.unit)} {a.unit}, "
                f"{'dominated by the frontier' if f.baseline_dominated else 'not dominated'}",
                markup=False)
    if f.recommended is not None:
        c.print(f"recommended: point {f.recommended + 1} ({f.recommended_reason}): {f.points[f.recommended].fleet}",
                markup=False)
    else:
        c.print(f"recommended: none ({f.recommended_reason})", markup=False)
    if f.knee is not None:
        c.print(f"knee (alternative): point {f.knee + 1} (most $ saved per {a.unit} given up, from the least-{a.name} "
                "point)", markup=False)
    if f.truncated:
        c.print(f"stopped at {len(f.points)} points (--points); the curve goes on", markup=False)
    if f.backend != Backend().label:
        c.print(f"solved on {f.backend}: {f.solves_unused} solve(s) made ahead and not needed", markup=False)


def run_axes(instance: str, axes: str, points: int | None, overrides, json_out: str | None, csv_out: str | None,
             console: Console | Output, write_text, *, plot_out: str | None = None, backend: Backend = Backend(),  # noqa: B008 frozen dataclass default
             quiet: bool = False) -> Frontier:
    """``pareto --axes``: parse, load, sweep on ``backend`` (progress on stderr unless ``quiet``), render (unless
    JSON or CSV goes to stdout), write, plot (:func:`fleetopt.optimizer.workflows.plots.plot_frontier`).

    ``write_text(text, target, flag, protect)`` writes the CSV atomically (``workflows._write_text``).

    Raises
    ------
    InstanceError
        A bad ``--axes``, ``--points`` or ``--plot`` target (exit 2, before any solve), or a bad instance.
    """
    axis = parse_axes(axes)
    if json_out == "-" and csv_out == "-":
        raise InstanceError("--json / --csv: only one of them can go to stdout ('-')")
    if plot_out:
        plots.check_target(plot_out, "--plot", (instance,))
    inst = load_instance(instance, overrides)
    with reporter(quiet) as shown:
        result = frontier(inst, axis, points=points, backend=backend, on_step=shown.step)
    if "-" not in (json_out, csv_out):
        render_frontier(console, result)
    assert inst.path is not None                    # load_instance read it from a file
    if json_out:
        write_document(result.to_json(), json_out, (inst.path,))
    if csv_out:
        write_text(result.to_csv(), csv_out, "--csv", (inst.path,))
    if plot_out:
        plots.plot_frontier(result, plot_out)
    return result
