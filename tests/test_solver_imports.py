"""``solvers/pyomo_env.py``: Pyomo loads without scipy's unused submodules and without ``pyomo.environ``'s plugins,
and scipy stays one module."""

import subprocess
import sys

PROBE = """
import sys
import scipy, scipy.special
from fleetopt.solvers import pyomo_env  # noqa: F401  (the MIP's branch and bound imports Pyomo through it)
assert sys.modules["scipy"] is scipy, "scipy was loaded twice"
assert "pyomo.environ" not in sys.modules, "the MIP loaded pyomo.environ and every plugin with it"
print("stats" if "scipy.stats" in sys.modules else "no-stats")
from pyomo.common.dependencies import scipy as deferred, scipy_available
assert bool(scipy_available)
assert deferred.special is scipy.special, "Pyomo's scipy is another module"
print("stats" if "scipy.stats" in sys.modules else "no-stats")
"""


def test_pyomo_defers_scipy_and_resolves_to_the_loaded_module():
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True).stdout.split()
    # not imported with the MIP; Pyomo's own finalisation still runs once Pyomo asks for scipy
    assert out == ["no-stats", "stats"]
