"""Fit a serving profile's iteration-time and power coefficients to measured points.

The iteration-time model of a measured profile (:func:`fleetopt.models.service.compute_coefficients`):
one iteration whose decode sequences start at contexts :math:`x_s` and whose prefill chunks of
:math:`c_j` tokens start at prefixes :math:`p_j` takes

.. math::

    t = W + h\\Big(\\sum_s x_s + \\sum_j p_j\\Big) + g\\, n_{dec}
        + \\sum_j \\left(a\\, c_j + b\\left((p_j + c_j)^2 - p_j^2\\right)\\right).

Two kinds of measurement pin it down (``data/measurements/README.md``):

* a *decode* point: one iteration of :math:`n` sequences all at context :math:`L`,
  :math:`t_{dec}(n, L) = W + h\\,nL + g\\,n`;
* a *prefill* point: one whole prompt of :math:`P` tokens alone, in one chunk,
  :math:`t_{pre}(P) = W + aP + bP^2`.

Both are linear in :math:`\\theta = (W, h, g, a, b) \\ge 0`, so each point :math:`i` is a row
:math:`m_i` with :math:`t_i \\approx m_i^\\top \\theta` and relative error
:math:`e_i = m_i^\\top\\theta / t_i - 1`. :func:`fit_iteration_coefficients` fits all points jointly
(one :math:`W` for both kinds) in two stages:

1. the Chebyshev fit, a linear programme: :math:`z^* = \\min_{\\theta \\ge 0} \\max_i |e_i|`, the smallest
   worst-case relative error the model can reach on the data;
2. relative least squares within a tolerance :math:`\\tau` (default 10 %):
   :math:`\\min_{\\theta \\ge 0} \\sum_i e_i^2` subject to :math:`|e_i| \\le \\tau` for every point,
   started from the Chebyshev fit (SLSQP). When :math:`\\tau < z^*` no coefficients meet the tolerance;
   the Chebyshev fit is returned and ``tolerance_met`` is False.

Why the constraint: with one shared :math:`W` the additive model overstates short prompts, whose weight
streaming overlaps their compute on the GPU (a 512-token prompt takes 15.3 ms, :math:`W` alone is 6.3 ms).
Plain least squares lets the 49 decode points pull :math:`W` up and leaves the 512-token prompt 14.6 % high;
the bound keeps every point within :math:`\\tau`. On the shipped H100 data :math:`z^* = 9.6\\,\\%`
(``docs/profile_fit.md`` gives the trade-off between :math:`W`, the decode median and the worst prefill).

Power (:class:`~fleetopt.models.power.ActivityPower`) is fitted afterwards by
:func:`fit_activity_power` on the points that carry a board-power reading.

Everything here is pure: measured points in, a frozen :class:`ProfileFit` out (no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetopt.models.power import ActivityPower

__all__ = ["DecodePoint", "PrefillPoint", "PointFit", "KindSummary", "IterationFit", "ProfileFit",
           "decode_components_s", "prefill_components_s", "fit_iteration_coefficients", "fit_activity_power",
           "fit_profile_coefficients", "DEFAULT_MAX_REL_ERROR", "MIN_DECODE_POINTS", "MIN_PREFILL_POINTS",
           "MIN_POWER_POINTS"]

DEFAULT_MAX_REL_ERROR = 0.10
"""Default tolerance :math:`\\tau` of the constrained least-squares stage (every point within 10 %)."""

MIN_DECODE_POINTS = 3
"""Decode points needed to fit :math:`W, h, g`."""

MIN_PREFILL_POINTS = 2
"""Prefill points needed to fit :math:`a, b` (with :math:`W` shared with decode)."""

MIN_POWER_POINTS = 3
"""Points with a board-power reading needed to fit the three component powers."""

_KINDS = ("decode", "prefill", "power")


@dataclass(frozen=True)
class DecodePoint:
    """One measured decode iteration: ``batch`` sequences all at ``context_tokens`` KV tokens took ``seconds``;
    mean board power ``power_w`` while it was replayed back to back (None: not measured)."""

    batch: int
    context_tokens: int
    seconds: float
    power_w: float | None = None

    def __post_init__(self) -> None:
        if self.batch < 1 or self.context_tokens < 0:
            raise ValueError(f"decode point needs batch >= 1 and context_tokens >= 0; got {self.batch}, "
                             f"{self.context_tokens}")
        _check_positive("seconds", self.seconds, self.power_w)


@dataclass(frozen=True)
class PrefillPoint:
    """One measured whole-prompt prefill: ``prompt_tokens`` tokens alone, in one chunk, took ``seconds``;
    mean board power ``power_w`` (None: not measured)."""

    prompt_tokens: int
    seconds: float
    power_w: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prefill point needs prompt_tokens >= 1; got {self.prompt_tokens}")
        _check_positive("seconds", self.seconds, self.power_w)


def _check_positive(name: str, seconds: float, power_w: float | None) -> None:
    if not (np.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be finite and > 0; got {seconds}")
    if power_w is not None and not (np.isfinite(power_w) and power_w > 0):
        raise ValueError(f"power_w must be finite and > 0 or None; got {power_w}")


@dataclass(frozen=True)
class PointFit:
    """One measured value next to the model's prediction.

    ``kind`` is ``decode`` or ``prefill`` (a time, ``unit`` ``s``) or ``power`` (board power, ``unit`` ``W``);
    ``phase`` says which kind of iteration it was measured on (``decode`` or ``prefill``). A prefill point has
    ``batch`` 1 and ``prompt_tokens``; a decode point ``context_tokens``. ``rel_error`` = predicted / measured - 1.
    """

    kind: str
    phase: str
    batch: int
    context_tokens: int | None
    prompt_tokens: int | None
    measured: float
    predicted: float
    unit: str

    @property
    def rel_error(self) -> float:
        return self.predicted / self.measured - 1.0


@dataclass(frozen=True)
class KindSummary:
    """How well one kind of point is fitted: median and worst absolute relative error over ``points`` points."""

    kind: str
    points: int
    median_abs_rel_error: float
    worst_abs_rel_error: float


@dataclass(frozen=True)
class IterationFit:
    """Fitted iteration-time coefficients (seconds; ``h_s_per_token`` per KV token, ``prefill_b_s`` per
    token squared) and how the fit went: the Chebyshev error :math:`z^*`, the tolerance :math:`\\tau` and
    whether the least-squares stage met it (module docstring)."""

    W_s: float
    h_s_per_token: float
    g_s: float
    prefill_a_s: float
    prefill_b_s: float
    chebyshev_rel_error: float
    max_rel_error: float
    tolerance_met: bool


@dataclass(frozen=True)
class ProfileFit:
    """The whole fit: coefficients, power (None when too few points carry a power reading), every point with its
    prediction, and a summary per kind (``decode``, ``prefill``, ``power``; kinds without points are left out)."""

    iteration: IterationFit
    power: ActivityPower | None
    points: tuple[PointFit, ...]
    summaries: tuple[KindSummary, ...]

    def summary(self, kind: str) -> KindSummary | None:
        """The summary of ``kind``, or None when no point of that kind was measured."""
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}; got {kind!r}")
        return next((s for s in self.summaries if s.kind == kind), None)

    def H_s(self, calibration_ctx_tokens: int) -> float:
        """The profile constant :math:`H = h\\,B_{cal}`: KV scan of one sequence at ``calibration_ctx_tokens``."""
        return self.iteration.h_s_per_token * calibration_ctx_tokens


# --------------------------------------------------------------------------------------------
# The model's time components per measured point
# --------------------------------------------------------------------------------------------


def decode_components_s(batch, context_tokens, W_s: float, h_s_per_token: float, g_s: float):
    """Time components (weights, KV scan, compute) of a decode iteration of ``batch`` sequences all at
    ``context_tokens``: :math:`(W,\\; h\\,nL,\\; g\\,n)`, seconds (array-aware); their sum is :math:`t_{dec}`."""
    n = np.asarray(batch, dtype=float)
    L = np.asarray(context_tokens, dtype=float)
    return np.full(np.broadcast(n, L).shape, float(W_s)), h_s_per_token * n * L, g_s * n * np.ones_like(L)


def prefill_components_s(prompt_tokens, W_s: float, prefill_a_s: float, prefill_b_s: float):
    """Time components (weights, KV scan, compute) of one whole prompt of :math:`P` tokens in one chunk:
    :math:`(W,\\; 0,\\; aP + bP^2)`, seconds (array-aware); their sum is :math:`t_{pre}`."""
    P = np.asarray(prompt_tokens, dtype=float)
    return np.full(P.shape, float(W_s)), np.zeros(P.shape), prefill_a_s * P + prefill_b_s * P * P


def _design(decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint]) -> tuple[np.ndarray, np.ndarray]:
    """Rows :math:`m_i` over :math:`\\theta = (W, h, g, a, b)` and measured times :math:`t_i`."""
    rows = [[1.0, p.batch * p.context_tokens, p.batch, 0.0, 0.0] for p in decode]
    rows += [[1.0, 0.0, 0.0, p.prompt_tokens, float(p.prompt_tokens) ** 2] for p in prefill]
    times = [p.seconds for p in decode] + [p.seconds for p in prefill]
    return np.array(rows, dtype=float).reshape(-1, 5), np.array(times, dtype=float)


def _chebyshev(R: np.ndarray) -> tuple[np.ndarray, float]:
    """:math:`\\min_{u \\ge 0} \\max_i |R_i u - 1|` as a linear programme in :math:`(u, z)` (HiGHS)."""
    m, k = R.shape
    ones = np.ones((m, 1))
    A_ub = np.vstack([np.hstack([R, -ones]), np.hstack([-R, -ones])])
    b_ub = np.concatenate([np.ones(m), -np.ones(m)])
    cost = np.r_[np.zeros(k), 1.0]
    from scipy.optimize import linprog   # here, not at import: fitting is rare, scipy.optimize loads in 0.3 s

    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, bounds=[(0, None)] * (k + 1), method="highs")
    if res.status != 0:
        raise ValueError(f"the Chebyshev fit failed: {res.message}")
    return np.maximum(res.x[:k], 0.0), float(res.x[k])


def _bounded_least_squares(R: np.ndarray, start: np.ndarray, tol: float) -> np.ndarray | None:
    """:math:`\\min_{u \\ge 0} \\|Ru - 1\\|^2` s.t. :math:`|Ru - 1| \\le` ``tol`` (SLSQP from a feasible start);
    None when the solver does not end at a feasible point."""
    margin = 1e-5    # inside the tolerance after round-off and after the profile file's 6-digit rounding

    def cost(u):
        r = R @ u - 1.0
        return float(r @ r), 2.0 * (R.T @ r)

    constraints = [{"type": "ineq", "fun": lambda u: (tol - margin) - (R @ u - 1.0), "jac": lambda u: -R},
                   {"type": "ineq", "fun": lambda u: (tol - margin) + (R @ u - 1.0), "jac": lambda u: R}]
    from scipy.optimize import minimize

    res = minimize(cost, start, jac=True, method="SLSQP", bounds=[(0.0, None)] * R.shape[1],
                   constraints=constraints, options={"ftol": 1e-15, "maxiter": 500})
    u = np.maximum(res.x, 0.0)
    if not np.all(np.isfinite(u)) or np.max(np.abs(R @ u - 1.0)) > tol:
        return None
    return u


def fit_iteration_coefficients(decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint] = (), *,
                               max_rel_error: float = DEFAULT_MAX_REL_ERROR) -> IterationFit:
    """Fit :math:`W, h, g, a, b \\ge 0` to decode and prefill times (method in the module docstring).

    Parameters
    ----------
    decode : sequence of DecodePoint
        At least :data:`MIN_DECODE_POINTS` points (median times).
    prefill : sequence of PrefillPoint, optional
        None, or at least :data:`MIN_PREFILL_POINTS` points; without them :math:`a = b = 0`.
    max_rel_error : float
        The tolerance :math:`\\tau > 0` of the least-squares stage.

    Returns
    -------
    IterationFit

    Raises
    ------
    ValueError
        Too few points, or a tolerance that is not > 0.

    Examples
    --------
    Points made from :math:`W` = 5 ms, :math:`h` = 1e-8 s, :math:`g` = 2e-5 s, :math:`a` = 2e-5 s,
    :math:`b` = 1e-9 s come back exactly:

    >>> dec = [DecodePoint(n, L, 0.005 + 1e-8 * n * L + 2e-5 * n) for n, L in [(1, 1024), (64, 1024), (8, 32768)]]
    >>> pre = [PrefillPoint(P, 0.005 + 2e-5 * P + 1e-9 * P * P) for P in (1024, 16384)]
    >>> f = fit_iteration_coefficients(dec, pre)
    >>> [float(f"{x:.6g}") for x in (f.W_s, f.h_s_per_token, f.g_s, f.prefill_a_s, f.prefill_b_s)]
    [0.005, 1e-08, 2e-05, 2e-05, 1e-09]
    """
    if len(decode) < MIN_DECODE_POINTS:
        raise ValueError(f"the fit needs at least {MIN_DECODE_POINTS} decode points; got {len(decode)}")
    if 0 < len(prefill) < MIN_PREFILL_POINTS:
        raise ValueError(f"the fit needs no prefill points or at least {MIN_PREFILL_POINTS}; got {len(prefill)}")
    if not max_rel_error > 0:
        raise ValueError(f"max_rel_error must be > 0; got {max_rel_error}")
    M, t = _design(decode, prefill)
    used = np.flatnonzero(np.any(M != 0.0, axis=0))          # a, b drop out without prefill points
    scale = np.max(np.abs(M[:, used] / t[:, None]), axis=0)  # columns of order 1 for the solvers
    R = M[:, used] / t[:, None] / scale
    u, z_star = _chebyshev(R)
    met = z_star <= max_rel_error
    if met:
        bounded = _bounded_least_squares(R, u, max_rel_error)
        if bounded is None:
            met = False
        else:
            u = bounded
    theta = np.zeros(5)
    theta[used] = u / scale
    return IterationFit(*(float(x) for x in theta), chebyshev_rel_error=z_star, max_rel_error=float(max_rel_error),
                        tolerance_met=bool(met))


# --------------------------------------------------------------------------------------------
# Power
# --------------------------------------------------------------------------------------------


def _power_components(decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint], it: IterationFit):
    """Time components of every point with a power reading (rows of (weights, kv, compute)), and the readings."""
    dec = [p for p in decode if p.power_w is not None]
    pre = [p for p in prefill if p.power_w is not None]
    parts = [np.column_stack(decode_components_s([p.batch for p in dec], [p.context_tokens for p in dec],
                                                 it.W_s, it.h_s_per_token, it.g_s)),
             np.column_stack(prefill_components_s([p.prompt_tokens for p in pre], it.W_s, it.prefill_a_s,
                                                  it.prefill_b_s))]
    comp = np.vstack([p.reshape(-1, 3) for p in parts])
    return comp, np.array([p.power_w for p in dec] + [p.power_w for p in pre], dtype=float)


def fit_activity_power(decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint], iteration: IterationFit, *,
                       idle_w: float, limit_w: float, quality: str = "measured") -> ActivityPower:
    """Fit the component powers of :class:`~fleetopt.models.power.ActivityPower` to measured board power.

    Notes
    -----
    Each point with a reading :math:`P_i` has the model's time components
    :math:`(T_{w,i}, T_{kv,i}, T_{c,i})` under ``iteration`` (:func:`decode_components_s`,
    :func:`prefill_components_s`). Stage 1 ignores the cap: :math:`P_i T_i = p_w T_w + p_{kv} T_{kv} + p_c T_c`
    is linear, solved in relative terms by non-negative least squares. Stage 2 starts there and minimises
    :math:`\\sum_i (\\hat P_i / P_i - 1)^2` with the cap :math:`\\hat P_i = \\min(P_{lim}, \\dots)` in place
    (``scipy.optimize.least_squares``, bounds :math:`p \\ge 0`): points at the board limit no longer pull the
    component powers down.

    Raises
    ------
    ValueError
        Fewer than :data:`MIN_POWER_POINTS` points carry a power reading.
    """
    comp, measured = _power_components(decode, prefill, iteration)
    if len(measured) < MIN_POWER_POINTS:
        raise ValueError(f"the power fit needs at least {MIN_POWER_POINTS} points with power_w; got {len(measured)}")
    total = comp.sum(axis=1)
    from scipy.optimize import least_squares, nnls

    start, _ = nnls(comp / (measured * total)[:, None], np.ones(len(measured)))

    def residual(p):
        return np.minimum(limit_w, comp @ p / total) / measured - 1.0

    res = least_squares(residual, start, bounds=(0.0, np.inf), method="trf", x_scale=np.maximum(start, 1.0))
    p = np.maximum(res.x, 0.0)
    return ActivityPower(idle_w=float(idle_w), limit_w=float(limit_w), weights_w=float(p[0]), kv_w=float(p[1]),
                         compute_w=float(p[2]), quality=quality)


# --------------------------------------------------------------------------------------------
# The whole fit
# --------------------------------------------------------------------------------------------


def _point_fits(decode, prefill, it: IterationFit, power: ActivityPower | None) -> tuple[PointFit, ...]:
    out = []
    for p in decode:
        parts = decode_components_s(p.batch, p.context_tokens, it.W_s, it.h_s_per_token, it.g_s)
        out.append(PointFit("decode", "decode", p.batch, p.context_tokens, None, p.seconds, float(sum(parts)), "s"))
    for p in prefill:
        parts = prefill_components_s(p.prompt_tokens, it.W_s, it.prefill_a_s, it.prefill_b_s)
        out.append(PointFit("prefill", "prefill", 1, None, p.prompt_tokens, p.seconds, float(sum(parts)), "s"))
    if power is not None:
        for p in decode:
            if p.power_w is not None:
                watts = power.iteration_power_w(*decode_components_s(p.batch, p.context_tokens, it.W_s,
                                                                     it.h_s_per_token, it.g_s))
                out.append(PointFit("power", "decode", p.batch, p.context_tokens, None, p.power_w, float(watts), "W"))
        for p in prefill:
            if p.power_w is not None:
                watts = power.iteration_power_w(*prefill_components_s(p.prompt_tokens, it.W_s, it.prefill_a_s,
                                                                      it.prefill_b_s))
                out.append(PointFit("power", "prefill", 1, None, p.prompt_tokens, p.power_w, float(watts), "W"))
    return tuple(out)


def _summaries(points: tuple[PointFit, ...]) -> tuple[KindSummary, ...]:
    out = []
    for kind in _KINDS:
        errors = np.abs([p.rel_error for p in points if p.kind == kind])
        if errors.size:
            out.append(KindSummary(kind, int(errors.size), float(np.median(errors)), float(errors.max())))
    return tuple(out)


def fit_profile_coefficients(decode: Sequence[DecodePoint], prefill: Sequence[PrefillPoint] = (), *,
                             idle_w: float | None = None, limit_w: float | None = None,
                             max_rel_error: float = DEFAULT_MAX_REL_ERROR,
                             power_quality: str = "measured") -> ProfileFit:
    """Fit iteration time (:func:`fit_iteration_coefficients`) and, where enough points carry a power reading and
    ``idle_w`` and ``limit_w`` are given, power (:func:`fit_activity_power`); compare every point.

    Parameters
    ----------
    decode, prefill : sequences of DecodePoint, PrefillPoint
        The measured points (median times).
    idle_w, limit_w : float, optional
        Idle power and board power limit of the replica (W); both are needed to fit power.
    max_rel_error : float
        Tolerance :math:`\\tau` of the time fit.
    power_quality : str
        Quality label of the fitted power.

    Returns
    -------
    ProfileFit
        ``power`` is None when fewer than :data:`MIN_POWER_POINTS` points carry ``power_w`` or when
        ``idle_w``/``limit_w`` are missing.
    """
    iteration = fit_iteration_coefficients(decode, prefill, max_rel_error=max_rel_error)
    with_power = sum(p.power_w is not None for p in (*decode, *prefill))
    power = None
    if with_power >= MIN_POWER_POINTS and idle_w is not None and limit_w is not None:
        power = fit_activity_power(decode, prefill, iteration, idle_w=idle_w, limit_w=limit_w, quality=power_quality)
    points = _point_fits(decode, prefill, iteration, power)
    return ProfileFit(iteration, power, points, _summaries(points))
