"""Click commands beside the main ``fleetopt`` group (loaded on first use by :mod:`fleetopt.optimizer.cli`), and
what every command shares: the error guard, the help settings, the ``--format`` option and the ``--catalog``
option."""

from __future__ import annotations

import functools
import os

import click

from fleetopt.optimizer.errors import FleetoptError
from fleetopt.optimizer.output.tables import FORMATS

__all__ = ["CONTEXT_SETTINGS", "CATALOG_ENV", "OUTPUT_PARAMS", "catalog_option", "format_option", "guard", "output",
           "check_outputs"]

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}

format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                             help="Text layout: table (boxed; split into column groups or stacked when wider than "
                             "the terminal, never cut), plain (aligned columns), markdown, or csv (prose as # lines).")

CATALOG_ENV = "FLEETOPT_CATALOG"
"""Environment variable read when no ``--catalog`` is given: catalogue files separated by ``os.pathsep``."""


def _use_catalog_files(ctx: click.Context, param, files) -> None:
    """Put the user catalogue files in effect for the command (until its context closes)."""
    if files:
        from fleetopt.optimizer.io.catalog import catalog_files

        ctx.with_resource(catalog_files(files))


def catalog_option() -> click.Option:
    """``--catalog FILE`` (repeatable; else ``$FLEETOPT_CATALOG``): the GPUs, models and calibrated profiles of user
    catalogue files join the shipped catalogue for the command (:func:`fleetopt.optimizer.io.catalog.catalog_files`;
    format in :mod:`fleetopt.optimizer.io.catalog_file`). The command's function does not see it."""
    return click.Option(["--catalog", "catalog_files"], multiple=True, metavar="FILE", envvar=CATALOG_ENV,
                        type=click.Path(dir_okay=True), expose_value=False, callback=_use_catalog_files,
                        help="A user catalogue file: its GPUs, models and calibrated profiles join the shipped "
                        f"ones (repeatable; default ${CATALOG_ENV}, files separated by '{os.pathsep}').")


OUTPUT_PARAMS = ("json_out", "csv_out", "plot_out", "output", "router", "log_out")
"""Names of the options through which a command writes files (``--json``, ``--csv``, ``--plot``, ``-o``,
``export --router``, ``whatif --out``): :func:`check_outputs` checks each before the command's work."""


def check_outputs(ctx: click.Context) -> None:
    """Check every output file a command was given before its work (a long solve, a fit, a sweep) starts: the
    folder exists and is writable, the target is no folder and is not one of the command's input paths
    (:func:`fleetopt.optimizer.output.writes.check_target`; an ``-o`` whose metavar says ``DIR`` may be a folder).
    What the command reads later (a workload, a catalogue) is checked again when the file is written.

    Raises
    ------
    InstanceError
        One line naming the flag and the file.
    """
    from fleetopt.optimizer.output.writes import check_target

    params = [p for p in ctx.command.params if p.name in ctx.params]
    inputs = [ctx.params[p.name] for p in params if isinstance(p.type, click.Path) and ctx.params[p.name]]
    protect = [v for value in inputs for v in ((value,) if isinstance(value, str) else value)]
    for p in params:
        value = ctx.params[p.name]
        if p.name not in OUTPUT_PARAMS or not isinstance(value, str) or value == "-" \
                or not isinstance(p.type, click.types.StringParamType):
            continue
        if "DIR" in (p.metavar or "") and os.path.isdir(value):
            continue
        check_target(value, min(p.opts, key=len), protect)


def guard(fn):
    """Turn fleetopt errors into one line each on stderr and the documented exit code
    (:mod:`fleetopt.optimizer.errors`); any other exception is a bug, said in one line unless FLEETOPT_DEBUG is
    set. A closed output pipe propagates to the command group, which ends quietly (exit 141)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FleetoptError as err:
            for line in str(err).splitlines():
                click.echo(f"error: {line}", err=True)
            raise click.exceptions.Exit(err.exit_code) from err
        except (KeyboardInterrupt, click.exceptions.Exit, click.ClickException, BrokenPipeError):
            raise
        except Exception as err:  # a bug: say so in one line unless debugging
            if os.environ.get("FLEETOPT_DEBUG"):
                raise
            click.echo(f"error: internal error: {type(err).__name__}: {err} (set FLEETOPT_DEBUG=1 for details)",
                       err=True)
            raise click.exceptions.Exit(1) from err

    return wrapper


def output(fmt: str = "table"):
    """Where a command's text goes, in the layout ``--format`` names
    (:class:`fleetopt.optimizer.output.tables.Output`)."""
    from fleetopt.optimizer.output.tables import Output

    return Output(fmt)
