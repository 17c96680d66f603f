"""Progress of long commands on stderr: one helper every command renders its workflow's callbacks through.

The layers below report progress through plain callables and never import rich: ``on_step(message)`` (a short
line before or after each step: a verification round's solve, a plan's simulation, a trim trial, a frontier
point) and ``progress(done, total)`` (requests simulated so far within one simulation). :func:`reporter` turns
them into what the user sees:

* stderr is a terminal: a transient rich status line (spinner, the last step's message, the requests bar of
  the running simulation, elapsed time), cleared when the command ends;
* stderr is not a terminal (a log file, a CI job, a pipe): one plain line per step, ``[  12.3 s] message``,
  flushed at once, and no request counts;
* ``quiet``: nothing (both callbacks None).

stdout is never touched, so ``--json -`` output is the same with or without progress.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TextIO
from collections.abc import Callable, Iterator

__all__ = ["Reporter", "reporter", "QUIET_HELP", "progress_bar"]

QUIET_HELP = "No progress on stderr (by default: a status line on a terminal, else one line per step)."


@dataclass(frozen=True)
class Reporter:
    """The callbacks to hand to a workflow: ``step(message)`` and ``requests(done, total)`` (None: not shown)."""

    step: Callable[[str], None] | None = None
    requests: Callable[[int, int], None] | None = None


@contextmanager
def reporter(quiet: bool = False, *, stream: TextIO | None = None, terminal: bool | None = None
             ) -> Iterator[Reporter]:
    """Progress callbacks on ``stream`` (default stderr) for the duration of a ``with`` block (module docstring).

    ``terminal`` overrides the stream's ``isatty()`` (tests); ``quiet`` yields a :class:`Reporter` of Nones.
    """
    if quiet:
        yield Reporter()
        return
    out = sys.stderr if stream is None else stream
    tty = out.isatty() if terminal is None else terminal
    t0 = time.perf_counter()
    if not tty:
        def step(message: str) -> None:
            out.write(f"[{time.perf_counter() - t0:7.1f} s] {message}\n")
            out.flush()

        yield Reporter(step=step)
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=out, force_terminal=True) if stream is not None else Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as shown:
        task = shown.add_task("working", total=None)

        def step(message: str) -> None:
            shown.update(task, description=message, completed=0, total=None)

        def requests(done: int, total: int) -> None:
            shown.update(task, completed=done, total=total)

        yield Reporter(step=step, requests=requests)


def progress_bar(enabled: bool):
    """A rich progress bar on stderr yielding ``progress(done, total)`` (the requests of ``simulate``'s one run),
    or None when not ``enabled``.

    A context manager: ``with progress_bar(sys.stderr.isatty()) as progress: ...``.
    """
    if not enabled:
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as shown:
            task = shown.add_task("simulate", total=None)
            yield lambda done, total: shown.update(task, completed=done, total=total)

    return bar()
