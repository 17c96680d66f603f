"""Shared test fixtures. The suite runs against the installed package ``fleetopt`` (a wheel or an editable
install of this checkout); the checkout gives only its instance files and data."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FLEETOPT_SCRIPT = Path(sys.executable).parent / "fleetopt"
"""Where pip puts the ``fleetopt`` console script ([project.scripts] in pyproject.toml): beside the interpreter."""


SLOW_CASES = Path(__file__).with_name("slow_cases.txt")
"""Node ids of cases that run in the slow set without a ``slow`` mark in their file (measured, dated there)."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the cases listed in :data:`SLOW_CASES` ``slow`` before ``-m`` selects (a parametrised case is one
    id, so its siblings stay where they are)."""
    listed = {line.strip() for line in SLOW_CASES.read_text().splitlines() if line.strip() and line[0] != "#"}
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _fresh_solves():
    """Every test solves afresh: the report cache of ``solve_instance`` (the notebook's repeated call) keys on the
    instance and the options, not on module settings a test patches (``SPLIT_CUT_ROUNDS``, budgets)."""
    from fleetopt.optimizer.plan.solve import clear_report_cache

    clear_report_cache()


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch):
    """Every test sees the width a plain pipe has (no ``COLUMNS``): pytest-xdist's workers inherit ``COLUMNS=80``
    from execnet, which would wrap piped prose at 80 under ``-n`` and not without it. A test that wants a width
    sets ``COLUMNS`` itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def catalog():
    from fleetopt.optimizer.io.catalog import load_catalog

    return load_catalog()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def h100_8b():
    """A factory of the measured H100 / Llama-3.1-8B profile (data/measurements/README.md, coefficients rounded:
    W = 6.43 ms, 4.5e-8 s a context token, g = 25 us, a = 26.5 us, b = 7.4e-10 s) with a chunk and a batch cap,
    and KV blocks enough that the cap binds first."""
    from fleetopt.models.power import PowerCurve
    from fleetopt.models.profiles import CalibratedProfile

    def make(chunk: int = 512, slots: int = 1024) -> CalibratedProfile:
        return CalibratedProfile("h100-8b", "Llama-3.1-8B", 6.43e-3, 4.5e-8 * 8192, 8192, chunk, 16, 10**7, slots,
                                 3.0, 1, PowerCurve(300.0, 700.0, 1.0, 4.0, "projected"), "measured", g_s=2.5e-5,
                                 prefill_a_s=26.5e-6, prefill_b_s=7.4e-10)

    return make


@pytest.fixture(scope="session")
def h100(catalog):
    """The bundled H100-80GB profile (``data/calibrated_profiles.yaml``)."""
    return catalog.profiles["H100-80GB"]


@pytest.fixture(scope="session")
def azure(repo_root):
    """The Azure conversation prompt-length distribution (``data/workloads/azure_cdf.json``)."""
    import json

    from fleetopt.models.workload import LengthDistribution

    points = json.loads((repo_root / "data" / "workloads" / "azure_cdf.json").read_text())
    return LengthDistribution.from_cdf(points)


@pytest.fixture(scope="session")
def fleetopt_script() -> Path:
    """The installed ``fleetopt`` console script. The package declares it, so an install without it is broken:
    the tests that need it fail (at setup), they are not skipped."""
    assert FLEETOPT_SCRIPT.is_file(), f"the fleetopt console script is not installed at {FLEETOPT_SCRIPT}"
    return FLEETOPT_SCRIPT
