"""Click commands beside the main ``fleetopt`` group (loaded on first use by :mod:`fleetopt.optimizer.cli`), and
what every command shares: the error guard, the help settings, the ``--format`` option and the ``--catalog``
option."""

from __future__ import annotations

import functools
import os

import click

from fleetopt.optimizer.errors import FleetoptError
from fleetopt.optimizer.io.output import FORMATS

__all__ = ["CONTEXT_SETTINGS", "CATALOG_ENV", "catalog_option", "format_option", "guard", "output"]

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
            raise click.exceptions.Exit(err.exit_code)
        except (KeyboardInterrupt, click.exceptions.Exit, click.ClickException, BrokenPipeError):
            raise
        except Exception as err:  # a bug: say so in one line unless debugging
            if os.environ.get("FLEETOPT_DEBUG"):
                raise
            click.echo(f"error: internal error: {type(err).__name__}: {err} (set FLEETOPT_DEBUG=1 for details)",
                       err=True)
            raise click.exceptions.Exit(1)

    return wrapper


def output(fmt: str = "table"):
    """Where a command's text goes, in the layout ``--format`` names (:class:`fleetopt.optimizer.report.Output`)."""
    from fleetopt.optimizer.report import Output

    return Output(fmt)
