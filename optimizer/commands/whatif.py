"""``fleetopt whatif``: load, run the sweep (:mod:`fleetopt.optimizer.workflows.whatif`) on the chosen executor
(:mod:`fleetopt.optimizer.workflows.executor`), render, exit. Registered lazily in :mod:`fleetopt.optimizer.cli`.

Errors are one line each on stderr with the documented exit code (2 for invalid input), as the main group's
guard does.
"""

from __future__ import annotations


import click
from rich.table import Table

from fleetopt.optimizer.commands.progress import QUIET_HELP, reporter
from fleetopt.optimizer.commands import CONTEXT_SETTINGS, format_option as _format_opt, guard as _guard
from fleetopt.optimizer.commands import output as _console
from fleetopt.optimizer.commands.workflows import PLOT_HELP
from fleetopt.optimizer.output.writes import write_text as _write_text
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.commands.sim_flags import VERIFY_FLAGS, sim_options
from fleetopt.optimizer.workflows import plots
from fleetopt.optimizer.workflows.executor import Backend
from fleetopt.optimizer.workflows.whatif import WhatIf, binding_text, run_whatif
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.simulation.guards import refuse_semantic

__all__ = ["whatif", "render_whatif"]


def _money(x, exact: bool = False) -> str:
    """$/yr in thousands for people; whole dollars for a spreadsheet (``exact``: ``--format csv``)."""
    if x is None:
        return "-"
    return f"{x:.0f}" if exact else f"${x / 1e3:,.0f}K"


def _delta_money(x, exact: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.0f}" if exact else f"{'+' if x >= 0 else '-'}${abs(x) / 1e3:,.0f}K"


def _changes(d: dict) -> str:
    parts = [f"+{p}" for p in d["pools_added"]] + [f"-{p}" for p in d["pools_removed"]]
    parts += [f"{r['pool']} {r['replicas_base']}->{r['replicas']}" for r in d["pools_resized"]]
    if d["gpu_types_added"] or d["gpu_types_removed"]:
        parts.append("GPUs " + " ".join([f"+{g}" for g in d["gpu_types_added"]] +
                                         [f"-{g}" for g in d["gpu_types_removed"]]))
    return ", ".join(parts) or ("same fleet" if d["same_fleet"] else "-")


def render_whatif(c, w: WhatIf) -> None:
    base = w.base
    exact = getattr(c, "format", "table") == "csv"     # a spreadsheet gets whole dollars, not $K
    table = Table(title=f"{w.instance}: what-if over {len(w.scenarios)} scenarios  [P99 TTFT SLO "
                        f"{w.slo_ttft_p99_ms:,.0f} ms, ttft_model {w.ttft_model}]", title_justify="left")
    cols = [s.path for s in w.sweeps] + ["status", "$/yr", "Δ $/yr", "Δ %", "replicas", "Δ rep", "fleet",
                                         "changes vs base", "binds (one replica fewer)"]
    if w.sim_options is not None:
        cols.append("sim SLO")
    for name in cols:
        table.add_column(name, justify="right" if name in ("$/yr", "Δ $/yr", "Δ %", "replicas", "Δ rep")
                         else "left", no_wrap=name not in ("changes vs base", "binds (one replica fewer)"))
    entries = [({s.path: "(base)" for s in w.sweeps}, {**base, "deltas": None})] + \
              [(r["overrides"], r) for r in w.rows()]
    for overrides, r in entries:
        d = r["deltas"]
        row = [str(overrides[s.path]) for s in w.sweeps] + [
            r["status"], _money(r["cost_per_year"], exact),
            "" if d is None else _delta_money(d["cost_per_year"], exact),
            "" if d is None or d["cost_pct"] is None else f"{d['cost_pct']:+.1f}",
            "-" if r["total_replicas"] is None else str(r["total_replicas"]),
            "" if d is None or d["replicas"] is None else f"{d['replicas']:+d}", r["fleet"] or "-",
            "" if d is None else _changes(d), binding_text(r) or r["binding_note"] or "-"]
        if w.sim_options is not None:
            sim = r.get("sim")
            row.append("-" if sim is None else ("met" if sim["slo_met"] else "MISSED"))
        table.add_row(*row)
    c.print(table)
    c.print("every number analytic: each scenario re-solved exactly (graph oracle or MIP over every candidate pool) "
            "with the --set overrides and its own values; Δ against the base (the --set overrides alone); binds: "
            "what a pool breaks evaluated with one deployed replica fewer (P99 TTFT, TPOT, utilization cap), then "
            "fleet limits at their bound", markup=False)
    if w.sim_options is not None:
        o = w.sim_options
        c.print(f"sim SLO: the plan simulated, {o.requests:,} requests in {o.replications} replications, seed "
                f"{o.seed}; met: the upper end of the 95 % P99 TTFT interval within the SLO", markup=False)
    missing = [(r["key"], r["explanation"]) for r in w.rows() if r["fleet"] is None]
    for key, why in missing:
        c.print(f"{key}: no plan: {why}", markup=False)
    if w.resumed:
        c.print(f"{w.resumed} records read back from the log (--resume), the rest solved now", markup=False)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option("--sweep", "sweeps", multiple=True, metavar="PATH=v1,v2,...",
              help="Values of an instance field to solve at (repeatable: the grid is the Cartesian product).")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override an instance field in the base and every scenario (repeatable).")
@click.option("--verify", is_flag=True, help="Also simulate each scenario's plan.")
@click.option("--sim-requests", type=click.IntRange(1000), default=20_000, show_default=True,
              help="--verify: requests per scenario, over all replications.")
@click.option("--sim-replications", type=click.IntRange(2, 100), default=5, show_default=True,
              help="--verify: independent replications per scenario.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="--verify: the seed of every "
              "scenario's simulation.")
@click.option("--time-limit", type=click.FloatRange(0, min_open=True), metavar="S",
              help="Solver time limit per scenario (seconds; default none).")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Local processes to solve on (1: this process).")
@click.option("--scheduler", metavar="ADDRESS", help="Solve on the Dask cluster at ADDRESS (tcp://HOST:8786; "
              "needs pip install 'fleetopt[scale]').")
@click.option("--out", "log_out", metavar="FILE.jsonl", help="Stream each finished scenario to this JSONL file.")
@click.option("--resume", is_flag=True, help="Continue --out FILE.jsonl: skip the scenarios it holds that were "
              "solved from the same inputs. A log of other --set/--verify/--time-limit flags is refused (exit 2); "
              "when an input's content changed since (the instance, workload, catalogue, profile or model config "
              "file, or the fleetopt version), its stale records are dropped and solved again, said in one line "
              "on stderr naming the file.")
@click.option("--quiet", is_flag=True, help=QUIET_HELP)
@click.option("--json", "json_out", metavar="FILE", help="Also write the result as JSON ('-' = stdout).")
@click.option("--csv", "csv_out", metavar="FILE", help="Also write the scenarios as CSV ('-' = stdout).")
@click.option("--plot", "plot_out", metavar="FILE", help=PLOT_HELP)
@_format_opt
@_guard
def whatif(instance, sweeps, overrides, verify, sim_requests, sim_replications, seed, time_limit, workers,
           scheduler, log_out, resume, quiet, json_out, csv_out, plot_out, fmt):
    """Solve the instance over a grid of field values (--sweep PATH=v1,v2,...) and show what changes."""
    if json_out == "-" and csv_out == "-":
        raise InstanceError("--json / --csv: only one of them can go to stdout ('-')")
    if plot_out:
        plots.check_target(plot_out, "--plot", (instance,))
    refuse_semantic(load_instance(instance, overrides), "whatif")    # its scenarios compare length-routed plans
    options = None
    if verify:
        options = sim_options(VERIFY_FLAGS, requests=sim_requests, replications=sim_replications, seed=seed)
    with reporter(quiet) as shown:
        result = run_whatif(instance, overrides, sweeps, backend=Backend(workers=workers, scheduler=scheduler),
                            sim_options=options, time_limit_s=time_limit, out=log_out, resume=resume,
                            on_step=shown.step, on_warning=lambda line: click.echo(f"warning: {line}", err=True))
    if "-" not in (json_out, csv_out):
        render_whatif(_console(fmt), result)
    if json_out:
        write_document(result.to_json(), json_out, (instance,))
    if csv_out:
        _write_text(result.to_csv(), csv_out, "--csv", (instance,))
    if plot_out:
        plots.plot_whatif(result, plot_out)
