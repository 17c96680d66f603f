"""The operator-workflow commands ``fleetopt pareto --split-table`` and ``fleetopt headroom``: load, call the
workflow (:mod:`fleetopt.optimizer.workflows`), render, exit. Wired into the main group by
``main.add_command(pareto)`` and ``main.add_command(headroom)`` in :mod:`fleetopt.optimizer.cli`.

Errors are one line each on stderr with the documented exit code (:mod:`fleetopt.optimizer.errors`; 2 for
invalid input), as the main command's guard does.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from fleetopt.optimizer.commands import CONTEXT_SETTINGS, format_option as _format_opt, guard as _guard
from fleetopt.optimizer.commands import output as _console
from fleetopt.optimizer.commands.progress import QUIET_HELP, reporter
from fleetopt.optimizer.output.writes import write_text as _write_text
from fleetopt.optimizer.errors import EXIT_CODES, InstanceError
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.commands.sim_flags import VERIFY_FLAGS, sim_options
from fleetopt.optimizer.workflows import plots
from fleetopt.optimizer.workflows.headroom import (Headroom, StepSchedule, fleet_change as _range_change, fleet_steps,
                                                   headroom as find_headroom, parse_range, simulated_limit)
from fleetopt.optimizer.workflows.split_table import SplitTable, parse_boundaries, split_table
from fleetopt.optimizer.simulation.guards import refuse_semantic

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from fleetopt.optimizer.output.tables import Output

PLOT_HELP = "Also draw the result's figure to FILE (.png or .svg; needs pip install 'fleetopt[plot]')."

__all__ = ["pareto", "headroom"]

_PIPE_COLUMNS = 200
"""Console width when stdout is not a terminal (wide enough for the tables here)."""


def _ms(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:,.1f}"


def _rate(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "-"
    return "none" if not math.isfinite(x) else f"{x:,.{digits}f}"


# --------------------------------------------------------------------------------------------
# pareto --split-table
# --------------------------------------------------------------------------------------------


def render_split_table(c: Console | Output, t: SplitTable) -> None:
    b = t.baseline
    exact = getattr(c, "format", "table") == "csv"     # a spreadsheet gets whole dollars, not $K
    table = Table(title=f"{t.instance}: two-pool split table on {t.gpu}, {t.arrival_rate:g} req/s  "
                        f"[P99 TTFT SLO {t.slo_ttft_p99_ms:,.0f} ms, ttft_model {t.ttft_model}, "
                        f"utilisation cap {t.max_utilization:g}]", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("B tokens", "right"), ("short %", "right"), ("n_short", "right"), ("n_long", "right"), ("GPUs", "right"),
        ("$/yr", "right"), ("saving", "right"), ("P99 short ms", "right"), ("P99 long ms", "right"), ("SLO", "left"),
        ("limits", "left"), ("Pareto", "left"), ("", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=True)
    for k, r in enumerate(t.rows):
        table.add_row(f"{r.boundary_tokens:,}", f"{100 * r.share_short:.1f}", str(r.replicas_short),
                      str(r.replicas_long), str(r.total_gpus),
                      f"{r.cost_per_year:.0f}" if exact else f"${r.cost_per_year / 1e3:,.0f}K",
                      f"{r.saving_pct:+.1f}%", _ms(r.ttft_p99_ms_short), _ms(r.ttft_p99_ms_long),
                      "met" if r.slo_met else "MISSED", "ok" if r.limits_ok else f"BREAKS {len(r.violations)}",
                      "*" if r.pareto else "",
                      "<- recommended" if k == t.recommended else "")
    c.print(table)
    c.print(f"homogeneous baseline (analytic): {b.fleet}, {b.total_gpus} GPUs, ${b.cost_per_year / 1e3:,.0f}K/yr, "
            f"P99 {_ms(b.ttft_p99_ms)} ms, SLO {'met' if b.slo_met else 'MISSED'}"
            + (f", breaks {'; '.join(b.violations)}" if b.violations else ""), markup=False)
    c.print("every number analytic: each pool sized to its least count meeting the SLO and the utilisation cap "
            "(as 'fleetopt evaluate' sizes a pool without xN); Pareto: meets the SLO, not dominated in "
            "($/yr, worst P99)", markup=False)
    if t.recommended is None:
        c.print("no row meets the SLO within the instance's limits: nothing to recommend", markup=False)
    else:
        r = t.rows[t.recommended]
        c.print(f"recommended: B = {r.boundary_tokens:,} (least cost among rows meeting the SLO within the "
                f"instance's limits; ties: fewer GPUs, then smaller B): fleetopt evaluate INSTANCE --fleet "
                f"'{r.fleet}'", markup=False)
    for r in t.rows:
        if not r.slo_met and r.miss_reason:
            c.print(f"B = {r.boundary_tokens:,} misses: {r.miss_reason}", markup=False)
        for v in r.violations:
            c.print(f"B = {r.boundary_tokens:,} breaks {v}", markup=False)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option("--split-table", "split", is_flag=True, help="The fixed-topology table: two pools of one GPU type "
              "split at each boundary, each sized analytically.")
@click.option("--boundaries", metavar="B1,B2,...", help="Split boundaries in tokens (default: the instance's "
              "candidate boundaries, pools.boundaries as resolved).")
@click.option("--gpu", metavar="NAME", help="The GPU option of both pools (default: the instance's only one).")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override an instance field, e.g. slo.ttft_model=mean-prefill (repeatable).")
@click.option("--json", "json_out", metavar="FILE", help="Also write the result as JSON ('-' = stdout).")
@click.option("--csv", "csv_out", metavar="FILE", help="Also write the rows as CSV ('-' = stdout).")
@click.option("--plot", "plot_out", metavar="FILE", help=PLOT_HELP)
@click.option("--axes", metavar="cost,AXIS", help="The exact trade-off curve by epsilon-constraint re-solves: "
              "cost,power | cost,ttft | cost,pools.")
@click.option("--points", type=int, default=None, help="--axes: power: N evenly spaced caps; ttft/pools: at most N "
              "points.")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="--axes: local processes to solve ahead on (1: this process; see docs/workflows.md).")
@click.option("--scheduler", metavar="ADDRESS", help="--axes: solve ahead on the Dask cluster at ADDRESS "
              "(tcp://HOST:8786; needs pip install 'fleetopt[scale]').")
@click.option("--quiet", is_flag=True, help="--axes: " + QUIET_HELP)
@_format_opt
@_guard
def pareto(instance, split, boundaries, gpu, overrides, json_out, csv_out, plot_out, axes, points, workers, scheduler,
           quiet, fmt):
    """Cost against latency over split boundaries (--split-table: two pools of one GPU type), or the exact
    trade-off curve of least cost against power, P99 TTFT or pools (--axes cost,AXIS)."""
    if axes is not None:
        if split:
            raise InstanceError("--axes: give --axes or --split-table, not both")
        refuse_semantic(load_instance(instance, overrides), "pareto")     # its frontier re-judges by length
        from fleetopt.optimizer.commands.frontier import run_axes
        from fleetopt.optimizer.workflows.executor import Backend

        run_axes(instance, axes, points, overrides, json_out, csv_out, _console(fmt), _write_text, plot_out=plot_out,
                 backend=Backend(workers=workers, scheduler=scheduler), quiet=quiet)
        return
    if workers != 1 or scheduler is not None:
        raise InstanceError("--workers / --scheduler: apply to --axes (the split table is one analytic pass)")
    if not split:
        raise InstanceError("--split-table: give --split-table (the seeds' two-pool table) or --axes cost,AXIS "
                            "(the exact frontier)")
    if json_out == "-" and csv_out == "-":
        raise InstanceError("--json / --csv: only one of them can go to stdout ('-')")
    if plot_out:
        plots.check_target(plot_out, "--plot", (instance,))
    inst = load_instance(instance, overrides)
    refuse_semantic(inst, "pareto --split-table")
    bounds = None if boundaries is None else parse_boundaries(boundaries, inst)
    result = split_table(inst, gpu, bounds)
    if "-" not in (json_out, csv_out):
        render_split_table(_console(fmt), result)
    if json_out:
        write_document(result.to_json(), json_out, (inst.path,))
    if csv_out:
        _write_text(result.to_csv(), csv_out, "--csv", (inst.path,))
    if plot_out:
        plots.plot_split_table(result, plot_out)


# --------------------------------------------------------------------------------------------
# headroom
# --------------------------------------------------------------------------------------------


def render_headroom(c: Console | Output, h: Headroom) -> None:
    table = Table(title=f"{h.instance}: headroom of {h.fleet} (now {h.arrival_rate:g} req/s)  [P99 TTFT SLO "
                        f"{h.slo_ttft_p99_ms:,.0f} ms, ttft_model {h.ttft_model}, utilisation cap "
                        f"{h.max_utilization:g}]", title_justify="left")
    for name in ("pool", "share %", "max req/s", "limited by", "P99 ms @max", "load @max", "P99 ms @max+",
                 "load @max+"):
        table.add_column(name, justify="left" if name in ("pool", "limited by") else "right", no_wrap=True)
    if h.sim is not None:
        table.add_column("max req/s sim", justify="right", no_wrap=True)
        table.add_column("first miss sim", justify="right", no_wrap=True)
    for k, p in enumerate(h.pools):
        row = [p.label + (" *" if k == h.binding_pool else ""), f"{100 * p.routing_share:.2f}",
               _rate(p.max_arrival_rate), p.limited_by or "-", _ms(p.ttft_p99_ms), f"{p.capacity_load:.3f}",
               _ms(p.ttft_p99_ms_above), f"{p.capacity_load_above:.3f}"]
        if h.sim is not None:
            q = h.sim.pools[k]
            row += [_rate(q.max_arrival_rate_sim, 0), _rate(q.min_failing_rate_sim, 0)]
        table.add_row(*row)
    c.print(table)
    c.print(f"max arrival rate (analytic): {_rate(h.max_arrival_rate)} req/s, binding pool {h.binding_label or '-'}"
            f" ({h.limited_by or 'no limit found'}); max req/s: the largest rate each pool carries (analytic), "
            f"@max+ one {h.tolerance_req_per_s:g} req/s step above it; {h.evaluations} analytic evaluations",
            markup=False)
    if h.fleet_p99_limit is not None:
        c.print(f"fleet-wide P99 TTFT (slo.scope fleet) holds up to {_rate(h.fleet_p99_limit)} req/s", markup=False)
    if h.violations:
        c.print(f"warning: at {h.arrival_rate:g} req/s the fleet breaks {len(h.violations)} limit(s) of the instance "
                "(exit 6); its headroom is that of a fleet the instance does not allow", markup=False)
        for v in h.violations:
            c.print(f"  breaks {v}", markup=False)
    if h.sim is not None:
        s, o = h.sim, h.sim.options
        binding = "-" if s.binding_pool is None else s.pools[s.binding_pool].label
        c.print(f"max arrival rate (simulated): {_rate(s.max_arrival_rate_sim, 0)} req/s, binding pool {binding}; "
                f"each pool simulated alone at its share, {o.requests:,} requests in {o.replications} replications "
                f"per rate, seed {o.seed} at every rate (common random numbers), grid "
                f"{s.tolerance_req_per_s:g} req/s, {s.simulations} simulations; passes: {s.rule}", markup=False)


def render_steps(c: Console | Output, s: StepSchedule) -> None:
    table = Table(title=f"{s.instance}: least-cost fleet over {s.lo:g}-{s.hi:g} req/s  [P99 TTFT SLO "
                        f"{s.slo_ttft_p99_ms:,.0f} ms, ttft_model {s.ttft_model}]", title_justify="left")
    against = "current fleet" if s.current is not None else "previous step"
    for name in ("from req/s", "fleet", "GPUs", "$/yr", "add capacity before req/s", f"change from {against}"):
        table.add_column(name, justify="left" if name == "fleet" or name.startswith("change") else "right",
                         no_wrap=True)
    changes = [None if s.current is None else _range_change(s.current, s.plateaus[0][0]),
               *(st.change for st in s.steps)]
    for (p, until), change in zip(s.plateaus, changes):
        table.add_row(f"{p.arrival_rate:g}", p.fleet or f"no plan ({p.status})",
                      "-" if p.total_gpus is None else str(p.total_gpus),
                      "-" if not math.isfinite(p.cost_per_year) else f"${p.cost_per_year / 1e3:,.0f}K",
                      "-" if until is None else f"{until:g}", "-" if change is None else change.summary())
    c.print(table)
    c.print(f"re-solved (analytic, least cost) at {len(s.solved)} rates; a step is the first whole-req/s rate whose "
            "least cost exceeds the plateau's (found by bisection: the least cost never falls as the rate grows)",
            markup=False)
    if s.current is not None:
        c.print(f"current fleet (at the instance's {s.current.arrival_rate:g} req/s): {s.current.fleet}, "
                f"{s.current.physical_gpus} physical GPUs; each change is what to buy (or release) from it to reach "
                "the row's fleet", markup=False)
    else:
        c.print("each change is what to buy (or release) from the previous row's fleet (give --fleet SPEC for "
                "changes from the current fleet)", markup=False)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option("--fleet", metavar="SPEC", help="The fleet, LO-HI:GPU[xN],... (no xN: sized at the instance's rate).")
@click.option("--verify", is_flag=True, help="Also search the limit by simulation (each pool alone at its share).")
@click.option("--range", "rate_range", metavar="LO:HI", help="The rates in [LO, HI] where the least-cost fleet steps "
              "up (re-solved, bisected to 1 req/s), each step as what to add to the current fleet (--fleet) or else "
              "to the previous step.")
@click.option("--sim-requests", type=click.IntRange(1000), default=20_000, show_default=True,
              help="--verify: requests per simulated rate (each pool alone), over all replications.")
@click.option("--sim-replications", type=click.IntRange(2, 100), default=5, show_default=True,
              help="--verify: independent replications per simulated rate.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True,
              help="--verify: the seed of every simulated rate (common random numbers).")
@click.option("--sim-tolerance", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              metavar="REQ/S", help="--verify: grid of the simulated search (fleet req/s).")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override an instance field, e.g. slo.ttft_model=mean-prefill (repeatable).")
@click.option("--json", "json_out", metavar="FILE", help="Also write the result as JSON ('-' = stdout).")
@click.option("--plot", "plot_out", metavar="FILE", help=PLOT_HELP)
@click.option("--quiet", is_flag=True, help="--verify: " + QUIET_HELP)
@_format_opt
@_guard
def headroom(instance, fleet, verify, rate_range, sim_requests, sim_replications, seed, sim_tolerance, overrides,
             json_out, plot_out, quiet, fmt):
    """The largest arrival rate a fleet carries within its SLO (--fleet), or where the optimal fleet steps
    up over a range of rates (--range LO:HI; with --fleet, each step as what to add to that fleet). Exit 6 when
    the --fleet breaks a limit of the instance."""
    if rate_range is None and fleet is None:
        raise InstanceError("--fleet: give the fleet to test (or --range LO:HI for the steps of the optimal fleet)")
    bounds = None if rate_range is None else parse_range(rate_range)
    if bounds is not None and verify:
        raise InstanceError("--verify: applies to --fleet (the limit of one fleet), not to --range")
    if plot_out:
        plots.check_target(plot_out, "--plot", (instance,))
    inst = load_instance(instance, overrides)
    refuse_semantic(inst, "headroom")
    result: StepSchedule | Headroom
    if bounds is not None:
        result = fleet_steps(inst, *bounds, current=fleet)
    else:
        result = find_headroom(inst, fleet)
        if verify:
            options = sim_options(VERIFY_FLAGS, requests=sim_requests, replications=sim_replications, seed=seed)
            with reporter(quiet) as shown:
                say = shown.step        # a frozen Reporter: the callback cannot change under the lambda
                step = None if say is None else (
                    lambda pool, rate: say(f"headroom: simulating pool {pool} at {rate:g} req/s"))
                result = replace(result, sim=simulated_limit(inst, fleet, options, start=result,
                                                              tolerance_req_per_s=sim_tolerance, progress=step))
    if json_out != "-":
        if isinstance(result, StepSchedule):     # --range
            render_steps(_console(fmt), result)
        else:
            render_headroom(_console(fmt), result)
    if json_out:
        write_document(result.to_json(), json_out, (inst.path,))
    if plot_out:
        plots.plot_headroom(result, plot_out)
    if isinstance(result, Headroom) and result.violations:
        raise click.exceptions.Exit(EXIT_CODES["limits_broken"])  # as evaluate: the fleet breaks an instance limit
