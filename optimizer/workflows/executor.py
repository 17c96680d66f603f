"""One executor for independent tasks: serially, on local processes, or on a Dask cluster; keyed results
streamed to a JSONL log that a later run resumes.

A :class:`Task` is a picklable function with its arguments and a unique string key. :func:`iter_results` runs a
list of them on a :class:`Backend` and yields ``(key, result)`` pairs *as they finish* (in completion order):

* ``Backend()``: in this process, one after the other (the reference: no pickling, no other process);
* ``Backend(workers=N)``: on N local processes (:class:`concurrent.futures.ProcessPoolExecutor`, started with
  ``spawn``: a caller that has run HiGHS has its thread pool, and a child *forked* from it inherits the pool
  without its threads and can wait on it forever); the function and its arguments are pickled to the workers.
  The workers die with their parent (:func:`_worker_init`): on Linux the kernel kills them when it dies
  (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), elsewhere a watchdog thread in each ends it when its parent changes,
  so a parent killed with SIGKILL leaves no process behind (multiprocessing's resource tracker ends by itself
  once the last process holding its pipe is gone). They ignore SIGINT: a Ctrl-C reaches the parent, which stops
  the workers (:meth:`Session.close` with ``abort``) rather than wait for their tasks;
* ``Backend(scheduler=ADDRESS)``: on a Dask distributed cluster (``dask.distributed.Client(ADDRESS)``; a
  ``Client`` object is taken as it is). Dask is imported only here, so it is needed only when asked for
  (``pip install 'fleetopt[scale]'``). Every worker must be able to import ``fleetopt``.

:func:`open_session` keeps a backend open (the same processes or Dask client) for several batches of tasks, for
a sweep whose next batch depends on the results of the last one.

Nothing in a result depends on where it ran: the caller assembles its output from the results by key, in its
own order, so the output is the same however the tasks were run.

:class:`ResultLog` is the stream: one JSON line per finished task (``{"key": ..., ...}``) after one header line
(``{"header": {...}}``, what run the log belongs to), each written whole and then flushed and ``fsync``-ed, so a
run that is killed loses no finished task. Resuming (:meth:`ResultLog.open` with ``resume=True``) reads the
finished keys back (a torn last line, a write the kill cut short, is cut off the file), checks that the header
is the same run's, and appends the rest; the caller skips the finished keys.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import InvalidStateError, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from fleetopt.optimizer.errors import InstanceError

__all__ = ["Task", "Backend", "iter_results", "run_tasks", "map_ordered", "Session", "open_session", "ResultLog",
           "DASK_CONNECT_TIMEOUT_S", "PARENT_POLL_S"]

DASK_CONNECT_TIMEOUT_S = 30.0
"""How long :func:`iter_results` waits for a Dask scheduler to answer before giving up (s)."""
PARENT_POLL_S = 0.5
"""How often a worker's watchdog thread (where ``PR_SET_PDEATHSIG`` is not available) checks its parent (s)."""
_PR_SET_PDEATHSIG = 1
"""``PR_SET_PDEATHSIG`` of ``<linux/prctl.h>``."""


@dataclass(frozen=True)
class Task:
    """One independent unit of work: ``fn(*args)``, known by ``key`` (unique within a run). ``fn`` must be a
    module-level function and ``args`` picklable for the process and Dask backends."""

    key: str
    fn: Callable[..., Any]
    args: tuple = ()


@dataclass(frozen=True)
class Backend:
    """Where tasks run: ``workers`` local processes (1: in this process), or the Dask cluster at ``scheduler``
    (an address such as ``tcp://10.0.0.5:8786``, or a ``dask.distributed.Client``).

    Raises
    ------
    InstanceError
        ``workers`` below 1, or ``workers`` > 1 together with ``scheduler`` (one line naming the flag).
    """

    workers: int = 1
    scheduler: Any = None

    def __post_init__(self) -> None:
        if not (isinstance(self.workers, int) and not isinstance(self.workers, bool) and self.workers >= 1):
            raise InstanceError(f"--workers: {self.workers!r} is not a whole number >= 1")
        if self.scheduler is not None and self.workers > 1:
            raise InstanceError("--workers / --scheduler: give one of them (the Dask cluster has its own workers)")
        if isinstance(self.scheduler, str) and not self.scheduler.strip():
            raise InstanceError("--scheduler: give the scheduler's address, e.g. tcp://127.0.0.1:8786")

    @property
    def label(self) -> str:
        if self.scheduler is not None:
            return f"Dask scheduler {self.scheduler if isinstance(self.scheduler, str) else 'client'}"
        return "serial (this process)" if self.workers == 1 else f"{self.workers} local processes"


def iter_results(tasks: Iterable[Task], backend: Backend = Backend()) -> Iterator[tuple[str, Any]]:
    """Run ``tasks`` on ``backend`` and yield ``(key, result)`` as each finishes (completion order).

    A task that raises stops the run with its exception (the results yielded before it stand). Closing the
    generator early (an interrupt) cancels the tasks not yet started.

    Raises
    ------
    InstanceError
        Duplicate keys; ``--scheduler`` without Dask installed, or a scheduler that does not answer.
    """
    tasks = list(tasks)
    _check_keys(tasks)
    if not tasks:
        return
    with open_session(backend, size_hint=len(tasks)) as session:
        yield from session.iter_results(tasks)


def run_tasks(tasks: Iterable[Task], backend: Backend = Backend(),
              on_result: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Run ``tasks`` (:func:`iter_results`) and return ``{key: result}``; ``on_result(key, result)`` is called on
    this process as each finishes (e.g. :meth:`ResultLog.append`)."""
    out = {}
    for key, result in iter_results(tasks, backend):
        if on_result is not None:
            on_result(key, result)
        out[key] = result
    return out


def map_ordered(fn: Callable, args_list: Sequence[tuple], backend: Backend = Backend()) -> list:
    """``[fn(*args) for args in args_list]`` on ``backend`` (:func:`run_tasks`), the results in the list's order:
    for a caller that needs ordered results from independent runs (``solve --verify-top --workers``: the plans of
    a verification round). ``fn`` must be a module-level function."""
    tasks = [Task(str(k), fn, tuple(args)) for k, args in enumerate(args_list)]
    done = run_tasks(tasks, backend)
    return [done[t.key] for t in tasks]


def _check_keys(tasks: list[Task]) -> None:
    keys = [t.key for t in tasks]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise InstanceError(f"executor: task key {dup!r} is given twice; keys must be unique")


class Session:
    """An open :class:`Backend` that runs several batches of tasks on the same processes or Dask client (a
    sweep whose next batch depends on the last one's results, e.g. :func:`fleetopt.optimizer.workflows.frontier
    .frontier`). Use :func:`open_session`.

    Attributes
    ----------
    slots : int
        How many tasks run at once: 1 (serial), the worker processes, or the Dask cluster's worker threads when
        the session opened.
    """

    def __init__(self, backend: Backend, size_hint: int | None = None) -> None:
        self.backend = backend
        self._pool = None
        self._client = None
        self._own_client = False
        if backend.scheduler is not None:
            self._client, self._own_client = _dask_client(backend.scheduler)
            # a synchronous client (no asynchronous=True) answers the worker -> threads mapping, not a coroutine
            self.slots = max(1, sum(cast(dict[str, int], self._client.nthreads()).values()))
        elif backend.workers > 1:
            self.slots = backend.workers if size_hint is None else max(1, min(backend.workers, size_hint))
            self._pool = ProcessPoolExecutor(max_workers=self.slots, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_init, initargs=(os.getpid(),))
        else:
            self.slots = 1

    def iter_results(self, tasks: Iterable[Task]) -> Iterator[tuple[str, Any]]:
        """Run one batch (keys unique within it) and yield ``(key, result)`` as each finishes (:func:`iter_results`)."""
        tasks = list(tasks)
        _check_keys(tasks)
        if self._client is not None:
            yield from _dask_results(tasks, self._client)
        elif self._pool is not None:
            yield from _process_results(tasks, self._pool)
        else:
            for t in tasks:
                yield t.key, t.fn(*t.args)

    def close(self, abort: bool = False) -> None:
        """Shut the backend down: wait for the running tasks, or with ``abort`` (an interrupt or an error ended
        the run) terminate the worker processes first, so the caller need not wait for tasks nobody will read."""
        if self._pool is not None:
            if abort:
                _quiet_cancelled_race()
                # no public way before Python 3.14 (terminate_workers); the pool's process table is long stable
                for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                    try:
                        proc.terminate()
                    except (OSError, ValueError):
                        pass
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._client is not None and self._own_client:
            self._client.close()
        self._client = None


def _quiet_cancelled_race() -> None:
    """Keep the pool's management thread from printing a traceback when an abort stops its workers: it marks the
    pool broken and sets an exception on every pending future, and on Python 3.11 one the interrupted caller has
    just cancelled raises ``InvalidStateError: CANCELLED`` there (a race in ``terminate_broken``, seen once in
    five CI runs of ``tests/test_executor_lifetime.py``). Only that error is dropped; every other one of any
    thread reaches the hook that was installed before."""
    if getattr(threading.excepthook, "_fleetopt_quiet", False):
        return
    previous = threading.excepthook

    def hook(args) -> None:
        if isinstance(args.exc_value, InvalidStateError) and "CANCELLED" in str(args.exc_value):
            return
        previous(args)

    setattr(hook, "_fleetopt_quiet", True)   # noqa: B010 (a mark on a function object)
    threading.excepthook = hook


@contextmanager
def open_session(backend: Backend = Backend(), size_hint: int | None = None) -> Iterator[Session]:
    """A :class:`Session` on ``backend``, closed (processes shut down, an own Dask client closed) on exit;
    ``size_hint``: at most that many worker processes are started (the number of tasks, when known).

    Raises
    ------
    InstanceError
        ``--scheduler`` without Dask installed, or a scheduler that does not answer.
    """
    session = Session(backend, size_hint)
    try:
        yield session
    except BaseException:
        session.close(abort=True)
        raise
    else:
        session.close()


def _linux_pdeathsig() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux ``prctl``); whether that took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    """A worker's watchdog: end the process as soon as its parent is no longer ``parent_pid`` (it died and the
    worker was re-parented)."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _worker_init(parent_pid: int) -> None:
    """Initializer of every local worker process: ignore SIGINT (the parent handles a Ctrl-C and stops the
    workers) and die with the parent ``parent_pid`` (module docstring): ``PR_SET_PDEATHSIG`` on Linux, else a
    watchdog thread; a parent already gone by now ends the worker at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not _linux_pdeathsig():
        threading.Thread(target=_watch_parent, args=(parent_pid,), name="fleetopt-parent-watchdog",
                         daemon=True).start()
    if os.getppid() != parent_pid:     # the parent died before the request above took effect
        os._exit(1)


def _process_results(tasks: list[Task], pool: ProcessPoolExecutor) -> Iterator[tuple[str, Any]]:
    futures = {pool.submit(t.fn, *t.args): t.key for t in tasks}
    try:
        for fut in as_completed(futures):
            yield futures[fut], fut.result()
    finally:
        for fut in futures:
            fut.cancel()


def _dask_client(scheduler):
    """``(client, own)``: a new client for an address (``own``: closed by the session), or the given one."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise InstanceError("--scheduler: needs dask.distributed; install it with pip install 'fleetopt[scale]'") \
            from None
    if not isinstance(scheduler, str):
        return scheduler, False
    try:
        return Client(scheduler, timeout=DASK_CONNECT_TIMEOUT_S, set_as_default=False), True
    except (OSError, TimeoutError, ValueError) as err:
        raise InstanceError(f"--scheduler: {scheduler}: no Dask scheduler answered ({type(err).__name__}: "
                            f"{err})") from None


def _dask_results(tasks: list[Task], client) -> Iterator[tuple[str, Any]]:
    from dask.distributed import as_completed as dask_completed

    run = uuid.uuid4().hex
    futures = {}
    try:
        for k, t in enumerate(tasks):
            futures[client.submit(t.fn, *t.args, key=f"fleetopt-{run}-{k}", pure=False)] = t.key
        for fut in dask_completed(list(futures), loop=client.loop):
            yield futures[fut], fut.result()
    finally:
        pending = [fut for fut in futures if not fut.done()]
        if pending:
            client.cancel(pending)


# --------------------------------------------------------------------------------------------
# The JSONL stream
# --------------------------------------------------------------------------------------------


class ResultLog:
    """An append-only JSONL file of finished tasks: a header line, then one line per task (module docstring).

    Use :meth:`open`; :meth:`append` writes one record, flushed and fsync-ed before it returns.
    """

    def __init__(self, path: Path, handle) -> None:
        self.path = path
        self._handle = handle
        self.stale_header: dict | None = None
        """The header of the log this one replaced because it differed in ``stale_keys`` (:meth:`open`)."""

    @classmethod
    def open(cls, path: str | Path, header: Mapping, *, resume: bool = False, flag: str = "--out",
             stale_keys: Sequence[str] = ()) -> tuple[ResultLog, dict[str, dict]]:
        """Open ``path`` for a run described by ``header`` (a JSON-able mapping) and return the log with the
        records already finished (``{key: record}``; empty unless resuming).

        Without ``resume`` the file must not exist or be empty; with it, a missing file starts a new log, and
        an existing one must start with the same header. A last line without its newline or not valid JSON
        (a write cut short) is cut off the file before appending. ``stale_keys`` name header keys that record
        what the inputs held rather than which run it is (their content hashes): an existing log whose header
        differs *only* in them holds stale records, so it is started anew (its records dropped, the new header
        written) and its header is kept as :attr:`stale_header` for the caller to report.

        Raises
        ------
        InstanceError
            One line naming ``flag`` (or ``--resume``) and the file: it exists without ``resume``, its header
            is another run's, a line before the last is not a record, or its folder does not exist.
        """
        path = Path(path)
        record: dict = json.loads(json.dumps(dict(header), allow_nan=False))    # the header as the log writes it
        if not path.parent.exists():
            raise InstanceError(f"{flag}: {path}: folder {path.parent} does not exist")
        finished: dict[str, dict] = {}
        exists = path.exists() and path.stat().st_size > 0
        if exists and not resume:
            raise InstanceError(f"{flag}: {path} exists; give --resume to continue it, or remove it")
        stale = None
        if exists:
            finished, keep_bytes, old = _read_log(path, record, tuple(stale_keys))
            if old == record:
                with open(path, "r+b") as f:
                    f.truncate(keep_bytes)
                return cls(path, open(path, "a", encoding="utf-8")), finished
            stale, finished = old, {}
        log = cls(path, open(path, "w", encoding="utf-8"))
        log.stale_header = stale
        log._write({"header": record})
        return log, finished

    def append(self, key: str, record: Mapping) -> None:
        """Write ``{"key": key, **record}`` as one line, flush and fsync it."""
        self._write({"key": key, **record})

    def _write(self, obj: Mapping) -> None:
        self._handle.write(json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_log(path: Path, header: dict, stale_keys: tuple[str, ...] = ()) -> tuple[dict[str, dict], int, dict]:
    """The finished records of an existing log, the byte length of its whole lines (a torn tail excluded) and
    its header, which differs from ``header`` at most in ``stale_keys`` (else it is another run's: refused)."""
    data = path.read_bytes()
    finished: dict[str, dict] = {}
    offset, number, keep, old = 0, 0, 0, header
    while offset < len(data):
        end = data.find(b"\n", offset)
        last = end < 0 or end == len(data) - 1
        line = data[offset:] if end < 0 else data[offset:end]
        number += 1
        try:
            obj = None if end < 0 else json.loads(line)
        except ValueError:
            obj = None
        if obj is None or not isinstance(obj, dict):
            if last and number > 1:      # a write the interruption cut short: drop it
                break
            raise InstanceError(f"--resume: {path}: line {number} is not a JSON record of a fleetopt log")
        if number == 1:
            if not isinstance(obj.get("header"), dict):
                raise InstanceError(f"--resume: {path}: line 1 is not a fleetopt log header")
            old = obj["header"]
            diff = sorted(k for k in set(old) | set(header) if old.get(k) != header.get(k))
            if any(k not in stale_keys for k in diff):
                diff = [k for k in diff if k not in stale_keys]
                raise InstanceError(f"--resume: {path}: was written by another run (it differs in "
                                    f"{', '.join(diff)}); give the same instance and flags, or another --out file")
        else:
            if not isinstance(obj.get("key"), str):
                raise InstanceError(f"--resume: {path}: line {number} has no \"key\"")
            finished[obj["key"]] = obj
        keep = end + 1
        offset = end + 1
    return finished, keep, old
