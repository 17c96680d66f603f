"""Independent tasks side by side on local processes, results in their order: the replications of a simulation,
the GPU options of a candidate sizing.

:func:`ordered_map` is ``map(fn, items)`` (the results in the order of ``items``), run either in this process or,
when that pays, on worker processes *forked* from it: a fork inherits ``fn`` and ``items`` (a run's spec and its
generators, an instance and its segment sums) as they are, so nothing is pickled on the way out and a closure is
fine; only the results are pickled back. Each task is a function of its own item alone (a replication of its own
generator, :func:`fleetopt.solvers.des.metrics.replication_rngs`; a GPU option's sizing of that option), so the
results are the same, bit for bit, whatever the number of workers.

Where it may fork (:func:`forkable`): on Linux only (fork is the platform's default start method there; macOS
frameworks are not fork-safe), from the main thread of a process that is not itself a worker (no nesting: a plan
verifier or a what-if that runs on worker processes runs each task's parts serially). Whether it pays is each
caller's rule: replications of at least :data:`MIN_FORKED_REQUESTS` requests each (:func:`workers_for`; below
that, starting the workers costs more than it saves), one worker per replication up to :data:`OVERSUBSCRIBE` per
usable core (on 2 cores, 5 replications on 5 workers take 2.5 replications' time where 2 workers take 3);
candidate sizing: :func:`fleetopt.optimizer.plan.candidates.generate_candidates`.

The children only run numpy, the engine and the analytic models: a thread pool of the parent (HiGHS's, after a
solve) is inherited without its threads, which is harmless as long as the children never call into it, and they do
not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["MIN_FORKED_REQUESTS", "OVERSUBSCRIBE", "usable_cpus", "forkable", "workers_for", "ordered_map"]

MIN_FORKED_REQUESTS = 5_000
"""Fewest requests per replication for which replications run on forked workers: about 30 ms of the Python loop's
time each, where starting a worker and sending its result back costs a few milliseconds. On the compiled loop's
path (:mod:`fleetopt.solvers.des.engine`, "The compiled loop") a replication is ten times cheaper and forking
neither pays nor costs much (five replications of 40,000 requests: 0.16-0.18 s in process, 0.16-0.17 s forked;
of 10,000: 0.05 s against 0.05-0.07 s); the rule is set for the Python paths, where it halves the time."""
OVERSUBSCRIBE = 4
"""Workers per usable core at most (one per replication below that)."""

_TASK: tuple[Callable[[Any], Any], Sequence[Any]] | None = None
"""The function and items of the :func:`ordered_map` under way, read by the forked workers."""


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                      # not Linux
        return os.cpu_count() or 1


def forkable() -> bool:
    """Whether this process may fork workers (module docstring): Linux, not a worker itself, the main thread."""
    if sys.platform != "linux":
        return False
    import multiprocessing
    import threading

    if multiprocessing.parent_process() is not None:     # a worker itself: no nested pools
        return False
    return threading.current_thread() is threading.main_thread()   # a fork copies only the calling thread


def workers_for(tasks: int, requests_per_task: int, workers: int | None = None) -> int:
    """Worker processes for ``tasks`` replications of ``requests_per_task`` requests each: ``workers`` when given
    (1: in this process), else as the module docstring says; 1 wherever forking is off."""
    if tasks < 2 or not forkable():
        return 1
    if workers is not None:
        return max(1, min(int(workers), tasks))
    if requests_per_task < MIN_FORKED_REQUESTS:
        return 1
    return min(tasks, OVERSUBSCRIBE * usable_cpus())


def _own_streams() -> None:
    """A forked worker's own ``sys.stdout`` and ``sys.stderr`` on the same files: another thread of the parent (a
    progress bar's refresh) may have held the lock of the parent's objects at the fork, and a worker that wrote to
    them (a warning) would wait for it forever."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):     # no file behind it (a test's capture)
            continue
        setattr(sys, name, open(os.dup(fd), "w", buffering=1, encoding=stream.encoding, errors=stream.errors))


def _child(k: int):
    assert _TASK is not None
    fn, items = _TASK
    return fn(items[k])


def ordered_map(fn: Callable[[Any], Any], items: Sequence[Any], workers: int) -> Iterator[Any]:
    """``fn(item)`` for each of ``items``, yielded in their order, on ``workers`` forked processes (1: here)."""
    if workers <= 1 or len(items) <= 1:
        yield from map(fn, items)
        return
    import gc
    import multiprocessing

    global _TASK
    _TASK = (fn, items)
    freeze = gc.get_freeze_count() == 0     # (a caller's own freeze is left as it is)
    if freeze:
        gc.freeze()     # the parent's objects out of the children's collections, which would copy every page touched
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(items)), initializer=_own_streams) as pool:
            yield from pool.imap(_child, range(len(items)))
    finally:
        if freeze:
            gc.unfreeze()
        _TASK = None
