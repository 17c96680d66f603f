"""The Examples in every module's docstrings run, in every package (models, solvers, optimizer, the root)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import fleetopt
import fleetopt.models
import fleetopt.optimizer
import fleetopt.solvers


def _module_names() -> list[str]:
    names = ["fleetopt", "fleetopt.api"]
    for package in (fleetopt.models, fleetopt.solvers, fleetopt.optimizer):
        names.append(package.__name__)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return sorted(names)


MODULE_NAMES = _module_names()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.parametrize("name", MODULE_NAMES)
def test_module_doctests_pass(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=FLAGS, verbose=False, report=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} doctest examples failed"


def test_the_walk_finds_every_package_and_their_examples():
    """The walk reaches the simulator subpackage and the stage folders, and there are examples to run."""
    for name in ("fleetopt.solvers.des.engine", "fleetopt.optimizer.io.instance", "fleetopt.optimizer.plan.solve",
                 "fleetopt.optimizer.simulation.verify", "fleetopt.models.queueing.erlang"):
        assert name in MODULE_NAMES
    finder = doctest.DocTestFinder()
    examples = {name: sum(len(t.examples) for t in finder.find(importlib.import_module(name)))
                for name in MODULE_NAMES}
    for package in ("fleetopt.models", "fleetopt.solvers", "fleetopt.optimizer"):
        assert sum(n for m, n in examples.items() if m.startswith(package)) > 0, package
