"""Outputs land where the user meant and nothing the user wrote is lost: a device or FIFO is written through (never
replaced by a rename, which as root turns ``/dev/null`` into a regular file), a link's file is replaced and the link
kept, modes follow the existing file or the umask, no command writes over a file it read, targets are checked before
the work, and a FIFO or device given as an input is refused instead of blocking."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "instances" / "quickstart.yaml"


def run(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result, *words: str) -> str:
    """The run failed with exit 2 and one ``error:`` line holding every word (no traceback)."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    """A copy of the quickstart instance and its CDF in a folder of its own (instance paths are relative)."""
    (tmp_path / "data" / "workloads").mkdir(parents=True)
    shutil.copy(REPO / "data" / "workloads" / "lmsys_cdf.json", tmp_path / "data" / "workloads")
    (tmp_path / "instances").mkdir()
    shutil.copy(QUICKSTART, tmp_path / "instances")
    return tmp_path


def test_dev_null_is_still_a_character_device():
    """The suite writes ``--json os.devnull`` in places; as root a rename over it would have made it a file."""
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root (CI runs as root)")
def test_json_to_a_device_node_writes_through(tmp_path: Path):
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))     # the null device's numbers on Linux
    result = run("validate", QUICKSTART, "--json", node)
    assert result.exit_code == 0, result.output
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert os.lstat(node).st_rdev == os.makedev(1, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]    # no temporary file left beside it
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_json_to_a_fifo_writes_through(tmp_path: Path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    result = run("validate", QUICKSTART, "--json", fifo)
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(got[0])["command"] == "validate"


def test_a_link_keeps_pointing_at_the_replaced_file(tmp_path: Path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert run("validate", QUICKSTART, "--json", link).exit_code == 0
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["command"] == "validate"


def test_new_files_follow_the_umask_and_existing_files_keep_their_mode(tmp_path: Path, umask022):
    new = tmp_path / "new.json"
    assert run("validate", QUICKSTART, "--json", new).exit_code == 0
    assert stat.S_IMODE(new.stat().st_mode) == 0o644
    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    kept.chmod(0o640)
    assert run("validate", QUICKSTART, "--json", kept).exit_code == 0
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert json.loads(kept.read_text())["command"] == "validate"


def test_exported_script_is_executable(tmp_path: Path, umask022):
    plan = tmp_path / "plan.json"
    assert run("solve", QUICKSTART, "--json", plan).exit_code == 0
    out = tmp_path / "deploy"
    out.mkdir()
    result = run("export", plan, "--format", "vllm", "-o", out)
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE((out / "vllm.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "router.yaml").stat().st_mode) == 0o644


def test_export_to_a_missing_folder_is_refused(tmp_path: Path):
    plan = tmp_path / "plan.json"
    assert run("solve", QUICKSTART, "--json", plan).exit_code == 0
    missing = f"{tmp_path / 'nodir'}/"
    one_error_line(run("export", plan, "--format", "vllm", "-o", missing), "-o", "nodir", "does not exist")
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("flag", ["--json"])
def test_outputs_never_overwrite_the_workload(workdir: Path, flag: str):
    cdf = workdir / "data" / "workloads" / "lmsys_cdf.json"
    before = cdf.read_bytes()
    one_error_line(run("validate", workdir / "instances" / "quickstart.yaml", flag, cdf), flag, "input file")
    assert cdf.read_bytes() == before


def test_outputs_never_overwrite_a_profile_file(tmp_path: Path):
    shutil.copytree(REPO / "instances", tmp_path / "instances")
    shutil.copytree(REPO / "data", tmp_path / "data")
    profile = tmp_path / "data" / "profiles" / "h100_llama31_8b.yaml"
    before = profile.read_bytes()
    one_error_line(run("validate", tmp_path / "instances" / "h100_8b_fitted.yaml", "--json", profile),
                   "--json", "input file")
    assert profile.read_bytes() == before


def test_outputs_never_overwrite_a_catalogue_file(tmp_path: Path):
    catalog = tmp_path / "catalog.yaml"
    shutil.copy(REPO / "instances" / "catalogs" / "catalog_example.yaml", catalog)
    before = catalog.read_bytes()
    one_error_line(run("catalog", "list", "--catalog", catalog, "--json", catalog), "--json", "input file")
    assert catalog.read_bytes() == before


def test_whatif_csv_never_overwrites_the_workload(workdir: Path):
    cdf = workdir / "data" / "workloads" / "lmsys_cdf.json"
    before = cdf.read_bytes()
    result = run("whatif", workdir / "instances" / "quickstart.yaml", "--sweep", "workload.arrival_rate=50",
                 "--csv", cdf)
    one_error_line(result, "--csv", "input file")
    assert cdf.read_bytes() == before


def test_a_missing_output_folder_is_reported_before_the_work(tmp_path: Path):
    """The check runs before the solve: a solve would print a plan table, and nothing is printed."""
    result = run("solve", QUICKSTART, "--json", tmp_path / "missing" / "plan.json")
    one_error_line(result, "--json", "does not exist")
    assert "pool" not in result.output.lower()


def test_a_read_only_output_folder_is_reported(tmp_path: Path):
    """As root a mode cannot forbid a write, so a child process drops to an unprivileged user first."""
    from fleetopt.optimizer.errors import InstanceError
    from fleetopt.optimizer.output.writes import check_target

    import tempfile

    base = Path(tempfile.mkdtemp(prefix="fleetopt-ro-", dir="/tmp"))   # pytest's own folders are 0700
    base.chmod(0o755)
    folder = base / "ro"
    folder.mkdir()
    folder.chmod(0o555)

    def refused() -> bool:
        try:
            check_target(folder / "out.json", "--json")
        except InstanceError as err:
            return "not writable" in str(err) and "--json" in str(err)
        return False

    if os.geteuid() != 0:
        assert refused()
        shutil.rmtree(base, ignore_errors=True)
        return
    pid = os.fork()
    if pid == 0:        # the child: an unprivileged user, then the check
        try:
            os.setgid(65534)
            os.setuid(65534)
            os._exit(0 if refused() else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    shutil.rmtree(base, ignore_errors=True)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_device_as_input_is_refused_not_read(tmp_path: Path, kind: str):
    if kind == "fifo":
        special = tmp_path / "instance.yaml"
        os.mkfifo(special)       # opening it for reading would block until a writer came
    else:
        special = tmp_path / "zero.yaml"
        special.symlink_to("/dev/zero")     # reading it would never end
    one_error_line(run("validate", special), "not a regular file")


def test_a_fifo_as_workload_is_refused(tmp_path: Path):
    os.mkfifo(tmp_path / "cdf.json")
    instance = tmp_path / "i.yaml"
    instance.write_text(QUICKSTART.read_text().replace("../data/workloads/lmsys_cdf.json", "cdf.json"))
    one_error_line(run("validate", instance), "cdf.json", "not a regular file")


def test_an_input_over_the_size_limit_is_refused(tmp_path: Path):
    from fleetopt.optimizer.io.files import read_bytes

    big = tmp_path / "big.csv"
    big.write_bytes(b"x" * 2049)
    data, reason = read_bytes(big, limit=2048)
    assert data is None and "limit" in reason
    assert read_bytes(big, limit=4096)[0] == b"x" * 2049
