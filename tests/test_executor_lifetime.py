"""Local worker processes never outlive the command, and Ctrl-C ends a command with exit code 130.

Processes are followed through ``/proc`` (Linux): the children of the ``fleetopt`` process are listed while it
runs (two spawn workers and multiprocessing's resource tracker), and after it ends each must be gone (or a zombie,
dead but not yet reaped) within a few seconds, whether it was killed with SIGKILL or interrupted with SIGINT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="follows processes through /proc")

INSTANCE = (Path(__file__).parent / "data" / "azure_2gpu.yaml").read_text()
SWEEP = "workload.arrival_rate=" + ",".join(str(5 * (k + 1)) for k in range(200))
"""Long enough that the sweep is still running when it is stopped."""


def _stat(pid: int) -> tuple[int, str, str] | None:
    """``(parent pid, state, start time)`` of a process, or None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0], fields[19]


def _children(pid: int) -> dict[int, str]:
    """The child processes of ``pid``, by pid, with their start time (to tell a reused pid apart)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[0] == pid:
            out[int(entry)] = st[2]
    return out


def _alive(children: dict[int, str]) -> list[int]:
    """Those of ``children`` that still run (a zombie has ended; a reused pid is another process)."""
    return [pid for pid, start in children.items()
            if (st := _stat(pid)) is not None and st[2] == start and st[1] != "Z"]


def _command() -> list[str]:
    exe = Path(sys.executable).with_name("fleetopt")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "fleetopt.optimizer.cli"]


def _start(tmp_path: Path, *flags: str) -> subprocess.Popen:
    inst = tmp_path / "azure2.yaml"
    inst.write_text(INSTANCE)
    return subprocess.Popen([*_command(), "whatif", str(inst), "--sweep", SWEEP, "--quiet", *flags],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr.txt").open("w"),
                            start_new_session=True)


def _wait_for_workers(proc: subprocess.Popen, count: int) -> dict[int, str]:
    """The children of ``proc`` once ``count`` of them are spawn workers that have started (their tasks run)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        kids = _children(proc.pid)
        workers = [pid for pid in kids if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        if len(workers) >= count:
            time.sleep(1.0)                           # let them import and take their first tasks
            return _children(proc.pid)
        time.sleep(0.05)
    raise AssertionError(f"the sweep did not start {count} workers (exit {proc.poll()})")


def _cleanup(children: dict[int, str]) -> None:
    for pid in _alive(children):                     # only what this test started
        os.kill(pid, signal.SIGKILL)


def _gone_within(children: dict[int, str], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _alive(children)


@pytest.mark.slow
def test_workers_die_with_a_sigkilled_parent(tmp_path):
    proc = _start(tmp_path, "--workers", "2")
    children: dict[int, str] = {}
    try:
        children = _wait_for_workers(proc, 2)
        assert len(children) >= 3                    # two workers and the resource tracker
        proc.kill()
        proc.wait()
        assert _gone_within(children, 5.0) == [], "processes outlived their killed parent"
    finally:
        proc.kill()
        _cleanup(children)


@pytest.mark.slow
def test_ctrl_c_exits_130_and_stops_the_workers(tmp_path):
    proc = _start(tmp_path, "--workers", "2")
    children: dict[int, str] = {}
    try:
        children = _wait_for_workers(proc, 2)
        os.killpg(proc.pid, signal.SIGINT)           # what a terminal's Ctrl-C sends: the whole process group
        assert proc.wait(timeout=30) == 130
        assert _gone_within(children, 5.0) == []
    finally:
        proc.kill()
        _cleanup(children)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr and "Aborted" not in stderr
    assert stderr.strip().splitlines() == ["interrupted"]


@pytest.mark.slow
def test_ctrl_c_of_a_serial_run_exits_130(tmp_path):
    proc = _start(tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not _loading_done(proc.pid):
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["interrupted"]


def _loading_done(pid: int) -> bool:
    """Whether the process has been running for a few CPU seconds (imports and the grid's loading behind it)."""
    st = Path(f"/proc/{pid}/stat").read_text()
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK") > 3.0
