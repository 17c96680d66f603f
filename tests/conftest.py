"""Shared test fixtures. The suite runs against the installed package ``fleetopt`` (a wheel or an editable
install of this checkout); the checkout gives only its instance files and data."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def catalog():
    from fleetopt.optimizer.io.catalog import load_catalog

    return load_catalog()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
