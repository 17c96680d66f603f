"""Progress of long commands on stderr: one helper every command renders its workflow's callbacks through.

The layers below report progress through plain callables and never import rich: ``on_step(message)`` (a short
line before or after each step: a verification round's solve, a plan's simulation, a trim trial, a frontier
point) and ``progress(done, total)`` (requests simulated so far within one simulation). :func:`reporter` turns
them into what the user sees:

* stderr is a terminal: a transient rich status line (spinner, the step being worked, the requests bar of
  the running simulation once it knows its total, elapsed time), cleared when the command ends;
* stderr is not a terminal (a log file, a CI job, a pipe): one plain line per step, ``[  12.3 s] message``,
  stamped when the step starts and flushed at once, and no request counts; with ``closes`` (the caller's
  messages announce work about to start, as ``solve --verify-top``'s do: "verify round 1: simulating plan 2 (2
  of 3; ...)"), each step is closed by a completion line, ``[  14.0 s] done (1.7 s): message``, when the next
  starts or the command ends;
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
def reporter(quiet: bool = False, *, stream: TextIO | None = None, terminal: bool | None = None,
             closes: bool = False, first: str = "starting") -> Iterator[Reporter]:
    """Progress callbacks on ``stream`` (default stderr) for the duration of a ``with`` block (module docstring).

    ``terminal`` overrides the stream's ``isatty()`` (tests); ``quiet`` yields a :class:`Reporter` of Nones;
    ``closes``: each message starts a step that the next message (or the block's end) closes with a completion
    line; ``first``: the terminal's label before the first message.
    """
    if quiet:
        yield Reporter()
        return
    out = sys.stderr if stream is None else stream
    tty = out.isatty() if terminal is None else terminal
    t0 = time.perf_counter()
    if not tty:
        open_step: list = []        # (message, started_at_s) of the step being worked

        def line(text: str, now: float) -> None:
            out.write(f"[{now - t0:7.1f} s] {text}\n")
            out.flush()

        def close(now: float) -> None:
            if open_step:
                message, started = open_step.pop()
                line(f"done ({now - started:.1f} s): {message}", now)

        def step(message: str) -> None:
            now = time.perf_counter()
            if closes:
                close(now)
                open_step.append((message, now))
            line(message, now)

        try:
            yield Reporter(step=step)
        finally:
            close(time.perf_counter())
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=out, force_terminal=True) if stream is not None else Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Count(),
                  TimeElapsedColumn(), console=console, transient=True) as shown:
        task = shown.add_task(first, total=None)

        def step(message: str) -> None:
            shown.update(task, description=message, completed=0, total=None)

        def requests(done: int, total: int) -> None:
            shown.update(task, completed=done, total=total)

        yield Reporter(step=step, requests=requests)


def _count_text(completed: float, total: float | None) -> str:
    """The requests count of the status line: ``1,200/5,000 requests``; empty while the total is unknown (no
    ``0/?``).

    Examples
    --------
    >>> _count_text(1200, 5000), _count_text(0, None)
    ('1,200/5,000 requests', '')
    """
    return "" if total is None else f"{int(completed):,}/{int(total):,} requests"


def _Count():
    """A rich progress column of :func:`_count_text` (built on first use: rich loads only on a terminal)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Count(ProgressColumn):
        def render(self, task) -> Text:
            return Text(_count_text(task.completed, task.total), style="progress.download")

    return Count()


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
