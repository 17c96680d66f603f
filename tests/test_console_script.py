"""The installed ``fleetopt`` console script runs: the command a user types, not the in-process CLI the other
tests call through click's runner."""

from __future__ import annotations

import json
import subprocess
from importlib.metadata import entry_points, version

from tests.conftest import FLEETOPT_SCRIPT


def _run(repo_root, *args: str) -> subprocess.CompletedProcess:
    # Asserted here, not in a fixture, so that a missing script is this test's failure, never a skip or an error.
    assert FLEETOPT_SCRIPT.is_file(), f"the fleetopt console script is not installed at {FLEETOPT_SCRIPT}"
    return subprocess.run([str(FLEETOPT_SCRIPT), *args], capture_output=True, text=True, cwd=repo_root,
                          timeout=120)


def test_the_package_declares_the_script():
    (script,) = entry_points(group="console_scripts", name="fleetopt")
    assert script.value == "fleetopt.optimizer.cli:main"


def test_version(repo_root):
    proc = _run(repo_root, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == version("fleetopt")


def test_validate_quickstart_json(repo_root):
    proc = _run(repo_root, "validate", "instances/quickstart.yaml", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["command"] == "validate" and data["valid"] is True and data["name"] == "quickstart"
