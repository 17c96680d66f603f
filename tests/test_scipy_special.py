"""``fleetopt.models.numerics.special``: ``scipy.special`` loads without NumPy's unused submodules, NumPy's names
come back whole, and SciPy's NumPy namespace still resolves every name (each check in a fresh process)."""

import json
import math
import subprocess
import sys

PROBE = """
import json, sys
import numpy
all_before, dir_before, loaded_before = list(numpy.__all__), dir(numpy), set(sys.modules)
from fleetopt.models.numerics import special
out = {"all_restored": numpy.__all__ == all_before, "dir_restored": dir(numpy) == dir_before,
       "loaded": sorted(m for m in ("numpy.f2py", "numpy.testing", "numpy.random", "numpy.ctypeslib", "numpy.rec",
                                    "numpy.char", "numpy.strings") if m in set(sys.modules) - loaded_before),
       "gammaln_5": float(special.gammaln(5.0)), "ndtri_half": float(special.ndtri(0.5))}
compat = sys.modules.get("scipy._lib.array_api_compat.numpy")
out["compat"] = compat is not None
if compat is not None:
    out["compat_random"] = compat.random is numpy.random
    out["compat_testing"] = compat.testing is numpy.testing
    out["compat_float64"] = compat.float64 is numpy.float64
    try:
        compat.no_such_name
        out["compat_missing"] = "resolved"
    except AttributeError as e:
        out["compat_missing"] = str(e)
from scipy import stats
out["norm_cdf_0"] = float(stats.norm.cdf(0.0))
print(json.dumps(out))
"""


def _probe(code: str) -> dict:
    run = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(run.stdout)


def test_special_loads_lean_and_numpy_is_left_as_it_was():
    out = _probe(PROBE)
    assert out["all_restored"] and out["dir_restored"]
    assert out["loaded"] == []
    assert out["gammaln_5"] == math.log(24.0)     # ln Gamma(5) = ln 4!
    assert out["ndtri_half"] == 0.0
    assert out["norm_cdf_0"] == 0.5               # scipy.stats works on top of it


def test_scipys_numpy_namespace_still_resolves_the_names_left_out():
    out = _probe(PROBE)
    import scipy

    if not out["compat"]:      # SciPy built that namespace with scipy.special from 1.15 on
        assert tuple(int(p) for p in scipy.__version__.split(".")[:2]) < (1, 15)
        return
    assert out["compat_random"] and out["compat_testing"] and out["compat_float64"]
    assert out["compat_missing"] == "module 'scipy._lib.array_api_compat.numpy' has no attribute 'no_such_name'"


def test_an_already_imported_scipy_special_is_used_as_it_is():
    code = ("import sys, scipy.special as s\nfrom fleetopt.models.numerics import special\n"
            "print(__import__('json').dumps({'same': special is s, 'f2py': 'numpy.f2py' in sys.modules}))")
    assert _probe(code)["same"]
