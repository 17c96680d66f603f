"""Numerical building blocks shared by the models: one vectorised bisection, and SciPy's special functions.

Every monotone search over a real variable in fleetopt (a quantile of a length
distribution, the P99 of TTFT for a pool or a fleet, the largest load a pool
carries within its SLO) is the same bisection on a boolean predicate, written
here once (:func:`bisect_boundary`). :func:`bisect_level` returns the same bracket
for a predicate :math:`f(x) > L` whose :math:`f` is cheaper at many points at once
than at one point many times.

``special`` is ``scipy.special``, imported on first use without the NumPy submodules it never uses
(:func:`_import_special`); every use of SciPy in the package goes through it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import numpy as np

__all__ = ["bisect_boundary", "bisect_level", "MAX_HALVINGS", "LEVEL_TREE_DEPTH", "LEVEL_PATH_POINTS",  # noqa: F822
           "special", "unique"]

MAX_HALVINGS = 2100
"""Guard on the number of halvings of :func:`bisect_boundary`, never reached for a finite bracket.

Halving a float64 bracket of width at most :math:`2^{1024}` reaches adjacent floats (spacing at least
:math:`2^{-1074}`, the smallest subnormal) after at most :math:`1024 + 1074 = 2098` halvings, one more
settles a bracket onto a single float, so 2100 halvings always suffice."""


def bisect_boundary(is_below, lo, hi, *, max_halvings: int = MAX_HALVINGS) -> tuple[np.ndarray, np.ndarray]:
    """Bracket the boundary of a monotone predicate by bisection, to float resolution (array-aware).

    Parameters
    ----------
    is_below : callable
        ``is_below(x)`` returns a boolean array of the shape of ``x``: True where ``x`` lies below
        the boundary, False at and above it (it is True then False along each element's axis).
        It is called with arrays of the broadcast shape of ``lo`` and ``hi``.
    lo, hi : array_like
        The starting bracket, :math:`lo \\le hi` elementwise (broadcast together). Neither end is
        tested: ``lo`` is taken as below the boundary and ``hi`` as at or above it.
    max_halvings : int, optional
        Guard on the number of halvings (default :data:`MAX_HALVINGS`, enough for any finite bracket).

    Returns
    -------
    lo, hi : numpy.ndarray
        The final bracket: ``is_below`` was True at ``lo`` (or ``lo`` is the starting end) and False at
        ``hi`` (or ``hi`` is the starting end). ``hi`` is the smallest float tested not below the
        boundary, ``lo`` the largest below it; 0-d arrays for scalar input.

    Raises
    ------
    RuntimeError
        If the bracket has not settled after ``max_halvings`` halvings (impossible for a finite bracket
        and a deterministic predicate with the default guard).

    Notes
    -----
    Each step sets :math:`m = (lo + hi)/2` and replaces ``lo`` by :math:`m` where ``is_below(m)``, else
    ``hi``. There is no fixed iteration count: the loop stops when a step changes no element, which
    happens once every bracket's ends are adjacent floats (:math:`m` rounds to one of them) or equal.
    From then on every further step would repeat the same :math:`m` and change nothing, so the result
    is the limit of the iteration, the boundary to float resolution, and does not depend on a count.
    A root at :math:`r` inside a bracket of width :math:`w` takes about :math:`53 + \\log_2(w/|r|)`
    halvings (53 significand bits); a root at an end that is 0 takes about 1075 more (down through the
    subnormals), which is why the guard is as large as it is. The mid-point formula overflows for
    brackets wider than about :math:`8.9 \\times 10^{307}`.

    References
    ----------
    .. [1] R. L. Burden and J. D. Faires, *Numerical Analysis*, 9th ed., Brooks/Cole 2011, Sec. 2.1
           (the bisection method).

    Examples
    --------
    The square root of 2 as the boundary of :math:`x^2 < 2` on :math:`[1, 2]`: ``hi`` is the smallest
    float whose square is at least 2, which is the correctly rounded :math:`\\sqrt 2`.

    >>> import math
    >>> lo, hi = bisect_boundary(lambda x: x * x < 2.0, 1.0, 2.0)
    >>> float(hi) == math.sqrt(2.0), float(lo) == math.nextafter(math.sqrt(2.0), 0.0)
    (True, True)
    >>> lo, hi = bisect_boundary(lambda x: x < [0.25, 3.0], 0.0, [1.0, 4.0])   # elementwise
    >>> hi.tolist()
    [0.25, 3.0]
    """
    lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))
    lo, hi = lo.copy(), hi.copy()
    for _ in range(max_halvings):
        mid = (lo + hi) / 2.0
        below = np.asarray(is_below(mid), dtype=bool)
        new_lo = np.where(below, mid, lo)
        new_hi = np.where(below, hi, mid)
        if np.array_equal(new_lo, lo, equal_nan=True) and np.array_equal(new_hi, hi, equal_nan=True):
            return lo, hi
        lo, hi = new_lo, new_hi
    raise RuntimeError(f"bisection did not settle in {max_halvings} halvings")


LEVEL_TREE_DEPTH = 3
""":func:`bisect_level`'s first call evaluates every midpoint of this many halvings (:math:`2^d - 1` points) and
the two ends."""
LEVEL_PATH_POINTS = 64
"""Most points :func:`bisect_level` asks of ``f`` per element in one call after the first."""


def _same(a: float, b: float) -> bool:
    """``a`` and ``b`` equal, NaN equal to NaN (as :func:`numpy.array_equal` with ``equal_nan``)."""
    return a == b or (a != a and b != b)


def _key(x: float):
    """``x`` as a key of the points seen: itself, but NaN as one key (NaN equals nothing) and the two zeros apart
    (0.0 and -0.0 are equal keys)."""
    if x != x:
        return "nan"
    return ("zero", math.copysign(1.0, x)) if x == 0.0 else x


def _estimate(a: float | None, fa: float, b: float | None, fb: float, level: float, lo: float, hi: float,
              near_a: tuple = (None, math.nan), near_b: tuple = (None, math.nan)) -> float:
    """Where ``f`` crosses ``level`` by the points evaluated so far: ``a`` the largest with :math:`f(a) > L`, ``b`` the
    smallest with :math:`f(b) \\le L` (None where there is none), ``near_a`` and ``near_b`` the next ones on each
    side ``(x, f(x))``. With a third point, inverse quadratic interpolation of :math:`x` in :math:`g = \\log(f/L)`
    at :math:`g = 0` (as in Brent's method; kept when it falls inside :math:`(a, b)`); else interpolated between
    ``a`` and ``b`` linearly in :math:`\\log f` (a tail probability falls about exponentially), else linearly in
    :math:`f`; an end of ``[lo, hi]`` when the evaluated points lie all on one side. Only the speed of
    :func:`bisect_level` depends on it."""
    if b is None:
        return hi
    if a is None:
        return lo
    if not a < b:                       # not monotone at this resolution: any point between will do
        return 0.5 * (a + b)
    logs = fb > 0.0 and level > 0.0 and math.isfinite(fa)
    third = [q for q in (near_a, near_b) if q[0] is not None and q[1] > 0.0 and math.isfinite(q[1])]
    if logs and third:
        c, fc = min(third, key=lambda q: min(abs(q[0] - a), abs(q[0] - b)))
        ga, gb, gc = math.log(fa / level), math.log(fb / level), math.log(fc / level)
        dab, dac, dbc = ga - gb, ga - gc, gb - gc
        if dab * dac * dbc != 0.0:
            r = a * gb * gc / (dab * dac) - b * ga * gc / (dab * dbc) + c * ga * gb / (dac * dbc)
            if a < r < b:
                return r
    share = 0.5
    if logs and math.log(fa) > math.log(fb):
        share = (math.log(fa) - math.log(level)) / (math.log(fa) - math.log(fb))
    elif math.isfinite(fa) and math.isfinite(fb):
        share = (fa - level) / (fa - fb)
    return a + (b - a) * min(max(share, 0.0), 1.0)


def bisect_level(f: Callable[[np.ndarray], np.ndarray], level: float, lo, hi, *,
                 max_halvings: int = MAX_HALVINGS) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bisect_boundary` of the predicate :math:`f(x) > L` (``level``), the same bracket to the last bit, with
    ``f`` asked for many points per call.

    Parameters
    ----------
    f : callable
        ``f(x)`` with ``x`` of shape (n, M), row :math:`i` holding M points of element :math:`i` of the flattened
        broadcast of ``lo`` and ``hi``, returns an array of that shape whose ``[i, j]`` must equal, to the last
        bit, what element :math:`i` of ``f`` evaluated at ``x[:, j]`` alone would be (each element computed on its
        own). :math:`f(x) > L` is the predicate ``is_below`` of :func:`bisect_boundary`.
    level : float
        :math:`L`.
    lo, hi, max_halvings
        As in :func:`bisect_boundary`.

    Returns
    -------
    lo, hi : numpy.ndarray
        :func:`bisect_boundary`'s bracket for ``lambda x: f(x) > level``.

    Notes
    -----
    The bisection's steps are replayed one by one, each midpoint :math:`m = (lo + hi)/2` computed as
    :func:`bisect_boundary` computes it and each decision taken from :math:`f(m)` itself, so the result is that
    bisection's whatever ``f`` is (no assumption on ``f`` beyond determinism); only which points are evaluated
    when changes. The first call evaluates the bracket's ends and every midpoint of the first
    :data:`LEVEL_TREE_DEPTH` halvings; each later call evaluates, per element, the path the bisection would take
    from its current bracket if the boundary were at an estimate interpolated from the points seen so far
    (:func:`_estimate`: inverse quadratic interpolation through the nearest points on either side of the level),
    down to a bracket an eighth of the estimate's error (taken as the square of its last correction, as for a
    secant step; at most :data:`LEVEL_PATH_POINTS` points). The replay follows that path until its first
    midpoint on the other side of the boundary, so a path is used in full while the estimate is closer to the
    boundary than the midpoints are, and the points it ends on bracket the boundary more tightly for the next
    estimate. For the P99 of a pool's TTFT (55 to 60 halvings) that is about six calls of ``f`` over 1.2 to 1.3
    times as many points as halvings: it pays where a call costs more than its points (small arrays, where
    numpy's per-call overhead dominates), not where each point is dear.

    Examples
    --------
    >>> lo, hi = bisect_level(lambda x: 2.0 - x * x, 0.0, 1.0, 2.0)
    >>> blo, bhi = bisect_boundary(lambda x: x * x < 2.0, 1.0, 2.0)
    >>> float(hi) == float(bhi) == math.sqrt(2.0), float(lo) == float(blo)
    (True, True)
    """
    lo_a, hi_a = np.broadcast_arrays(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))
    shape = lo_a.shape
    los, his = [float(x) for x in lo_a.ravel()], [float(x) for x in hi_a.ravel()]
    n = len(los)
    seen: list[dict] = [{} for _ in range(n)]      # per element: _key(x) -> f(x) of every point evaluated
    none: tuple[float | None, float] = (None, math.nan)
    over: list[tuple[float | None, float]] = [none] * n     # per element: the largest x with f(x) > L, and f(x)
    under: list[tuple[float | None, float]] = [none] * n    # the smallest x with f(x) <= L, and f(x)
    over2: list[tuple[float | None, float]] = [none] * n    # the next ones: for a third point of the estimate
    under2: list[tuple[float | None, float]] = [none] * n
    steps = [0] * n
    last: dict[int, float] = {}
    active = list(range(n))
    first = True
    while active:
        plans: dict[int, list[float]] = {}
        for i in active:
            if first:       # the ends too: not steps of the bisection, but what the first estimate needs
                points, layer = [los[i], his[i]], [(los[i], his[i])]
                for _ in range(LEVEL_TREE_DEPTH):
                    nxt = []
                    for a, b in layer:
                        m = (a + b) / 2.0
                        points.append(m)
                        nxt += [(m, b), (a, m)]
                    layer = nxt
            else:
                r = _estimate(*over[i], *under[i], level, los[i], his[i], over2[i], under2[i])
                if i in last:   # the estimate's error: the square of the last correction (secant-like)
                    d = abs(r - last[i])
                    err = 4.0 * d * d / abs(r) if r != 0.0 and math.isfinite(d * d / r) else math.inf
                else:
                    err = (his[i] - los[i]) / 4.0
                last[i] = r
                points, a, b = [], los[i], his[i]
                while len(points) < LEVEL_PATH_POINTS and not (points and b - a < err / 8.0):
                    m = (a + b) / 2.0
                    k = _key(m)
                    if k not in seen[i]:
                        points.append(m)
                    below = seen[i][k] > level if k in seen[i] else m < r
                    na, nb = (m, b) if below else (a, m)
                    if _same(na, a) and _same(nb, b):
                        break
                    a, b = na, nb
            plans[i] = points
        first = False
        width = max(len(p) for p in plans.values())
        grid = np.empty((n, width))
        for i in range(n):
            p = plans.get(i) or [his[i]]
            grid[i, :len(p)] = p
            grid[i, len(p):] = p[-1]
        values = np.asarray(f(grid), dtype=float)
        for i, p in plans.items():
            fs = values[i, :len(p)].tolist()
            seen[i].update(zip(map(_key, p), fs))
            (a, fa), (b, fb) = over[i], under[i]
            (a2, fa2), (b2, fb2) = over2[i], under2[i]
            for x, v in zip(p, fs):
                if x != x:
                    continue
                if v > level:
                    if a is None or x > a:
                        a2, fa2, a, fa = a, fa, x, v
                    elif x != a and (a2 is None or x > a2):
                        a2, fa2 = x, v
                elif b is None or x < b:
                    b2, fb2, b, fb = b, fb, x, v
                elif x != b and (b2 is None or x < b2):
                    b2, fb2 = x, v
            over[i], under[i] = (a, fa), (b, fb)
            over2[i], under2[i] = (a2, fa2), (b2, fb2)
        still = []
        for i in active:
            a, b, known = los[i], his[i], seen[i]
            while True:
                m = (a + b) / 2.0
                k = _key(m)
                if k not in known:
                    still.append(i)
                    break
                na, nb = (m, b) if known[k] > level else (a, m)
                if _same(na, a) and _same(nb, b):
                    break
                a, b = na, nb
                steps[i] += 1
                if steps[i] >= max_halvings:
                    raise RuntimeError(f"bisection did not settle in {max_halvings} halvings")
            los[i], his[i] = a, b
        active = still
    return np.array(los).reshape(shape), np.array(his).reshape(shape)


def unique(values) -> np.ndarray:
    """The sorted distinct values of ``values`` (flattened): ``np.unique(values)``, without loading ``numpy.ma``.

    NumPy 2.3+'s ``np.unique`` of a plain call first asks ``np.ma.is_masked`` whether it may take its hash-based
    path, which imports ``numpy.ma`` (about 8 ms of a command's start on a 2-core machine, for a module nothing in
    fleetopt uses); asked for the counts too, it takes its sorting path at once, whose values are the same (NaNs
    collapsed to one, as ``equal_nan`` does). Every distinct-values call in the package goes through here
    (``tests/test_numerics_unique.py``).

    >>> unique([3, 1, 3, 2]).tolist()
    [1, 2, 3]
    """
    return np.unique(values, return_counts=True)[0]


# ---------------------------------------------------------------- scipy.special, imported lean

_COMPAT_NUMPY = "scipy._lib.array_api_compat.numpy"
"""SciPy's array-API namespace for NumPy, the module whose import copies ``numpy``'s names."""


def _delegate_to_numpy(name: str):
    """PEP 562 ``__getattr__`` for SciPy's NumPy namespace: a name it lacks is NumPy's (lazily loaded) one."""
    try:
        return getattr(np, name)
    except AttributeError:
        raise AttributeError(f"module {_COMPAT_NUMPY!r} has no attribute {name!r}") from None


def _import_special():
    """Import ``scipy.special`` without the NumPy submodules it never uses.

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
    caller, is used as it is. Every module of the package that needs SciPy asks for ``special`` here first
    (``scipy.stats`` and ``scipy.optimize`` import ``scipy.special`` themselves). ``tests/test_scipy_special.py``
    checks, in a fresh process, that the submodules stay unloaded, that NumPy's names are restored and that the
    namespace still resolves them.
    """
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


def __getattr__(name: str):
    """``special`` (``scipy.special``, :func:`_import_special`), imported when first asked for: the bisections
    alone need no SciPy."""
    if name == "special":
        return _import_special()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
