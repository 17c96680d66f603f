"""A built wheel carries the catalogue and workload data, so a non-editable install finds them."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest


@pytest.mark.slow
def test_wheel_ships_data(repo_root, tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(repo_root)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"pip wheel unavailable here: {res.stderr.strip()[:200]}")
    wheel = next(tmp_path.glob("fleetopt-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("optimizer/_data/catalog/hardware.yaml", "optimizer/_data/catalog/calibrated_profiles.yaml",
                 "optimizer/_data/workloads/lmsys_cdf.json", "optimizer/_data/workloads/azure_conv_trace.csv",
                 "models/queueing.py", "solvers/__init__.py", "optimizer/cli.py"):
        assert path in names, path
