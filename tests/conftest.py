"""Shared test fixtures. The suite runs against the installed package or a source checkout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@pytest.fixture(scope="session")
def catalog():
    from optimizer.catalog import load_catalog

    return load_catalog()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
