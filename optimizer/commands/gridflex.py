"""``fleetopt gridflex INSTANCE --fleet SPEC``: load, sweep the curtailment depths
(:func:`fleetopt.optimizer.workflows.gridflex.gridflex`), render, exit. Registered lazily by the main group
(``_Commands.LAZY`` in :mod:`fleetopt.optimizer.cli`).

Errors are one line each on stderr with the documented exit code (:mod:`fleetopt.optimizer.errors`; 2 for
invalid input), as the main command's guard does.
"""

from __future__ import annotations


import click

from fleetopt.optimizer.commands import CONTEXT_SETTINGS, guard as _guard
from fleetopt.optimizer.output.writes import write_text as _write_text
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.simulation.guards import refuse_semantic
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.output.tables import FORMATS, Output
from fleetopt.optimizer.output.documents import gridflex_csv
from fleetopt.optimizer.output.render import render_gridflex
from fleetopt.optimizer.workflows import plots
from fleetopt.optimizer.workflows.gridflex import CONVENTIONS, gridflex as sweep, parse_depths

__all__ = ["gridflex"]

@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option("--fleet", required=True, metavar="SPEC", help="The fleet, LO-HI:GPU[xN][#SEQS],... (no xN: sized "
              "at the instance's rate).")
@click.option("--depths", default="0,5,10,15,20,25,30,35,40,45,50", show_default=True, metavar="D1,D2,...",
              help="Curtailment depths in % of the uncurtailed power (0 is always included: the reference).")
@click.option("--convention", type=click.Choice(CONVENTIONS), default="delivered", show_default=True,
              help="What a depth means: 'delivered' = the fleet's draw falls by that share (levers: replicas out "
              "of service, batch caps); 'seed' = the reference scenarios' convention, a per-GPU peak-power cap "
              "(reproduces Puzzle 8).")
@click.option("--event-minutes", type=click.FloatRange(0, min_open=True), default=15.0, show_default=True,
              help="Length of the demand-response event (simulated from the loaded steady state).")
@click.option("--analytic-only", is_flag=True, help="Skip the event simulation (analytic figures only; seconds).")
@click.option("--replications", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Independent event simulations per depth (the same streams at every depth).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Root of the replications' seeds.")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override an instance field (repeatable).")
@click.option("--json", "json_out", metavar="FILE", help="Also write the result as JSON ('-' = stdout).")
@click.option("--csv", "csv_out", metavar="FILE", help="Also write the depth rows as CSV ('-' = stdout).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Text layout.")
@click.option("--plot", "plot_out", metavar="FILE", help="Also draw power and P99 TTFT against the depth to FILE "
              "(.png or .svg; needs pip install 'fleetopt[plot]').")
@_guard
def gridflex(instance, fleet, depths, convention, event_minutes, analytic_only, replications, seed, overrides,
             json_out, csv_out, fmt, plot_out):
    """Demand response: the deepest reduction of the fleet's draw that keeps the SLO, sustained (analytic) and
    per event (simulated from the loaded steady state), with the levers that deliver each depth."""
    if json_out == "-" and csv_out == "-":
        raise InstanceError("--json / --csv: only one of them can go to stdout ('-')")
    levels = parse_depths(depths)
    if plot_out:
        plots.check_target(plot_out, "--plot", (instance,))
    inst = load_instance(instance, overrides)
    refuse_semantic(inst, "gridflex")
    result = sweep(inst, fleet, levels, event_s=60.0 * event_minutes, replications=replications, seed=seed,
                   convention=convention, event=not analytic_only)
    if "-" not in (json_out, csv_out):
        render_gridflex(Output(fmt), result)
    if json_out:
        write_document(result.to_json(), json_out, (inst.path,))
    if csv_out:
        _write_text(gridflex_csv(result), csv_out, "--csv", (inst.path,))
    if plot_out:
        plots.plot_gridflex(result, plot_out)
