"""``fleetopt bench`` runs from an installed package as from a checkout, and reports only what it measured.

The instances it benchmarks ship with the package (``fleetopt/instances``, beside ``fleetopt/data`` as
``instances/`` is beside ``data/`` in a checkout), so no row is skipped for lack of a checkout; no row divides
by a figure measured elsewhere (the old "x reference tool" ratio used a hard-coded 17,000 req/s).
"""

from __future__ import annotations

import ast
import inspect
import shutil
import subprocess
import sys
import zipfile

import pytest

from fleetopt.optimizer import bench
from fleetopt.optimizer.io.catalog import instances_dir
from fleetopt.optimizer.io.instance import instance_from_dict, load_instance


def test_bench_instances_resolve_inside_the_package_and_load(repo_root):
    # the checkout's own folder (an editable install) or the package's copy (a wheel): the same files either way
    shipped = instances_dir()
    for name in bench.BENCH_INSTANCES:
        assert (shipped / name).read_bytes() == (repo_root / "instances" / name).read_bytes(), name
    for name in bench.BENCH_INSTANCES:
        assert bench.bench_instance(name).is_file(), name
    for name in ("ref_puzzle1_lmsys_a100.yaml", "ref_puzzle2_agent_h100.yaml"):
        assert load_instance(bench.bench_instance(name)).gpus
    assert instance_from_dict(bench._stress_data()).pools.max_pools == 4


def test_no_row_skips_for_lack_of_a_checkout_or_divides_by_a_constant():
    source = inspect.getsource(bench)
    assert "not found" not in source and "REPO" not in source and "PYTHONPATH" not in source
    assert "vs_reference" not in source
    numbers = {node.value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
               and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)}
    assert not numbers & {17_000}
    # every benchmarked file the module names is one of the shipped instances
    named = {node.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".yaml")}
    assert named == set(bench.BENCH_INSTANCES)


@pytest.mark.slow
def test_installed_wheel_resolves_and_loads_the_bench_instances(repo_root, tmp_path):
    """A wheel built from a clean copy ships the instances; installed elsewhere, ``bench_instance`` finds them in
    the installed package and their relative workload paths (``../data/workloads``) resolve there."""
    src, out, target = tmp_path / "src" / "fleetopt", tmp_path / "wheel", tmp_path / "site"
    shutil.copytree(repo_root, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                                  ".hypothesis", ".venv", "venv", "tests"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    wheel = next(out.glob("fleetopt-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in (*bench.BENCH_INSTANCES, "user_catalog.yaml", "catalogs/catalog_example.yaml"):
        assert f"fleetopt/instances/{name}" in names, name
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    code = ("import sys; from fleetopt.optimizer.bench import bench_instance, BENCH_INSTANCES; "
            "from fleetopt.optimizer.io.instance import load_instance; "
            "paths = [bench_instance(n) for n in BENCH_INSTANCES]; "
            "assert all(str(p).startswith(sys.argv[1]) and p.is_file() for p in paths), paths; "
            "assert load_instance(bench_instance('user_catalog.yaml')).gpu('mi300x'); "   # its catalogue file ships too
            "print(load_instance(bench_instance('ref_puzzle1_lmsys_a100.yaml')).workload.source)")
    res = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().startswith(str(target))


def test_a_process_row_reports_the_commands_own_peak_memory():
    """Linux keeps a process's peak resident memory across ``exec``: a command started straight from a process of
    300 MB reported at least 300 MB. Started through the bench's launcher it reports its own (an interpreter that
    does nothing: well under 100 MB), and its exit code and wall time come back."""
    held = bytearray(300 * 2**20)
    held[::4096] = b"x" * len(held[::4096])      # touch every page: resident, not just reserved
    wall_s, peak_mb = bench._process_once([sys.executable, "-c", "pass"])
    assert wall_s > 0 and peak_mb < 100
    with pytest.raises(subprocess.CalledProcessError):
        bench._process_once([sys.executable, "-c", "raise SystemExit(3)"])
    assert bench._process_once([sys.executable, "-c", "raise SystemExit(3)"], ok=(3,))[1] < 100
    del held
