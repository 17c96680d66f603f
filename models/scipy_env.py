"""``scipy.special``, imported without the NumPy submodules it never uses.

The analytic models need a handful of SciPy's special functions (``gammaln``, ``gammainc``, ``gammaincc``,
``gammaincinv``, ``betainc``, ``xlogy``, ``ndtr``, ``ndtri``, ``stdtrit``). Since SciPy 1.15, importing
``scipy.special`` also builds an array-API namespace for NumPy (its vendored ``array_api_compat.numpy``) by
copying every public name of ``numpy``: ``from numpy import *``, then ``getattr`` for each name of ``dir(numpy)``.
NumPy 2 loads its optional submodules (``f2py``, ``testing``, ``ma``, ``random``, ``polynomial``, ``ctypeslib``,
``char``, ``rec``, ``strings``, ``core``) on first attribute access, so that copy imports all of them: about
0.09 s of every command's start-up on a 2-core machine (``numpy.f2py`` alone 0.04 s, compiling the regular
expressions of its Fortran parser), two fifths of ``import scipy.special``, for modules no command uses.

While ``scipy.special`` is imported here, the NumPy submodules not yet loaded are left out of ``numpy.__all__``
and ``dir(numpy)``; both are put back at once. The namespace SciPy built then lacks those names, so it gets a
module ``__getattr__`` (PEP 562) that hands any name it lacks to ``numpy``: ``xp.random`` still resolves there,
loading ``numpy.random`` on first use, as it would through ``numpy`` itself. Nothing numerical changes: the
functions are SciPy's own ufuncs. A SciPy without that namespace (before 1.15), or one already imported by the
caller, is used as it is. Every module of the package that needs SciPy imports it after this one (``scipy.stats``
and ``scipy.optimize`` import ``scipy.special`` first). ``tests/test_scipy_env.py`` checks, in a fresh process,
that the submodules stay unloaded, that NumPy's names are restored and that the namespace still resolves them.
"""

from __future__ import annotations

import sys

import numpy as np

_COMPAT_NUMPY = "scipy._lib.array_api_compat.numpy"
"""SciPy's array-API namespace for NumPy, the module whose import copies ``numpy``'s names."""


def _delegate_to_numpy(name: str):
    """PEP 562 ``__getattr__`` for SciPy's NumPy namespace: a name it lacks is NumPy's (lazily loaded) one."""
    try:
        return getattr(np, name)
    except AttributeError:
        raise AttributeError(f"module {_COMPAT_NUMPY!r} has no attribute {name!r}") from None


def _import_special():
    """Import ``scipy.special`` with NumPy's unloaded submodules hidden (see the module's docstring)."""
    if "scipy.special" in sys.modules:
        return sys.modules["scipy.special"]
    lazy = {n for n in getattr(np, "__numpy_submodules__", ()) if f"numpy.{n}" not in sys.modules}
    names = np.__dict__     # numpy's namespace: a module's __dir__ is an entry of it
    saved_all, saved_dir = np.__all__, names.get("__dir__")
    np.__all__ = [n for n in saved_all if n not in lazy]
    if saved_dir is not None:
        names["__dir__"] = lambda: [n for n in saved_dir() if n not in lazy]
    try:
        from scipy import special
    finally:
        np.__all__ = saved_all
        if saved_dir is not None:
            names["__dir__"] = saved_dir
    compat = sys.modules.get(_COMPAT_NUMPY)
    if compat is not None and "__getattr__" not in compat.__dict__:
        compat.__getattr__ = _delegate_to_numpy
    return special


special = _import_special()

__all__ = ["special"]
