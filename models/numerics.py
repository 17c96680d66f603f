"""Numerical building blocks shared by the models: one vectorised bisection.

Every monotone search over a real variable in fleetopt (a quantile of a length
distribution, the P99 of TTFT for a pool or a fleet, the largest load a pool
carries within its SLO) is the same bisection on a boolean predicate, written
here once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bisect_boundary", "MAX_HALVINGS"]

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
