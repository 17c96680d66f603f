"""fleetopt: plan GPU fleets for LLM inference.

The installed package has one import name, ``fleetopt``, with three layers
below it (imports run downward only; ``tests/test_layering.py`` checks it):

``fleetopt.models``
    Pure performance models (no I/O, no randomness): catalogue records,
    iteration time, power, queueing, workloads, analytic fleet evaluation.
``fleetopt.solvers``
    The fleet MIP (Pyomo + HiGHS), the exact graph oracle and the split MIP;
    the discrete-event simulator in its own subpackage,
    ``fleetopt.solvers.des``.
``fleetopt.optimizer``
    The pipeline and the user surface, by stage: ``io`` (file -> validated
    instance), ``plan`` (candidates -> MIP -> plans), ``simulation``
    (simulate, verify, trim), then ``report``, ``api`` and ``cli``.

``fleetopt.load``, ``fleetopt.solve``, ``fleetopt.evaluate``, ``fleetopt.simulate`` and
``fleetopt.verify`` are the notebook entry points (``docs/api.md``; they live in ``fleetopt.api``,
with every function of ``fleetopt.optimizer.api``), and the ``fleetopt`` command is
``fleetopt.optimizer.cli``.

In the repository this file lives in ``optimizer/_fleetopt/``: the build
maps that folder to the package root and ``models/``, ``solvers/``,
``optimizer/`` and ``data/`` below it (``pyproject.toml``,
``[tool.setuptools.package-dir]``).
"""

from __future__ import annotations

from importlib import import_module

__all__ = ["__version__", "api", "load", "solve", "evaluate", "simulate", "verify"]

_NOTEBOOK = ("load", "solve", "evaluate", "simulate", "verify")
"""The notebook functions of ``fleetopt.api`` (``docs/api.md``), reachable as ``fleetopt.<name>``."""


def _version() -> str:
    """The installed distribution's version (its metadata), or ``0+unknown`` in a tree that was never built."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetopt")
    except PackageNotFoundError:  # pragma: no cover - running from an unbuilt tree
        return "0+unknown"


def __getattr__(name: str):
    """``__version__``, ``fleetopt.api`` and its notebook functions on first use, so ``import fleetopt`` stays cheap:
    numpy, scipy, pydantic and Pyomo load only when one is used, and ``importlib.metadata`` (with the ``email``
    package it parses metadata with, about 25 ms) only when the version is read; every command imports this
    package."""
    if name == "__version__":
        globals()["__version__"] = value = _version()
        return value
    if name == "api":
        return import_module("fleetopt.api")
    if name in _NOTEBOOK:
        return getattr(import_module("fleetopt.api"), name)
    raise AttributeError(f"module 'fleetopt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
