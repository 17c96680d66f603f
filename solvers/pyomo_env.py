"""Pyomo, imported without the scipy submodules and the plugins the fleet MIP never uses.

The MIPs are built from ``pyomo.core`` (models, variables, constraints, objectives) and solved by the HiGHS
interface class itself (``pyomo.contrib.solver.solvers.highs.Highs``, what ``SolverFactory("highs")`` builds),
without ``pyomo.environ``: that entry point also loads every plugin Pyomo ships (GDP, DAE, network, the
transformations, the file writers and the older solver interfaces), about 0.15 s of a MIP solve's start-up on a
2-core machine (``import pyomo.environ`` 0.29 s over numpy, ``pyomo.core`` and the HiGHS class 0.14 s).

``pyomo.common.dependencies`` registers scipy as an optional dependency when it is first imported. If scipy is
already loaded at that moment (it always is here: the analytic models use ``scipy.special``), Pyomo does not defer
it but finalises it on the spot, which imports ``scipy.stats``, ``scipy.sparse``, ``scipy.spatial`` and
``scipy.integrate``: about 0.6 s of a 2-core machine's start-up, on every MIP solve, for modules neither the model
nor the HiGHS interface touches. While that one module is imported, the name ``scipy`` is taken out of
``sys.modules`` so Pyomo registers scipy as deferred (its documented behaviour for a module not yet imported); the
name is put back at once, so every later import sees the same scipy module. If some Pyomo code ever asks for scipy,
the deferred import resolves to that loaded module and runs Pyomo's finalisation then.
``tests/test_solver_imports.py`` checks both halves in a fresh process.
"""

from __future__ import annotations

import sys


def _register_scipy_deferred() -> None:
    """Import ``pyomo.common.dependencies`` with scipy registered as deferred (see the module's docstring)."""
    if "pyomo.common.dependencies" in sys.modules or "scipy" not in sys.modules:
        return
    scipy = sys.modules.pop("scipy")
    try:
        import pyomo.common.dependencies  # noqa: F401
    finally:
        sys.modules["scipy"] = scipy


_register_scipy_deferred()

import pyomo.core as pyo  # noqa: E402
from pyomo.contrib.solver.common.util import NoReducedCostsError  # noqa: E402
from pyomo.contrib.solver.solvers.highs import Highs  # noqa: E402

__all__ = ["pyo", "Highs", "NoReducedCostsError"]
