"""Non-Poisson arrival processes for the simulator: bursty (MMPP) and diurnal (thinned sinusoid).

Both return ``n`` sorted arrival instants from time 0, like
:func:`fleetopt.solvers.des.routing.poisson_arrivals`, and take their randomness from an
explicit ``numpy.random.Generator``; pair them with
:func:`fleetopt.solvers.des.routing.sample_lengths` to build a
:class:`fleetopt.solvers.des.routing.Requests` stream.

* :func:`mmpp_arrivals` - a two-state Markov-modulated Poisson process with a
  given long-run mean rate and peak-to-mean ratio;
* :func:`mmpp_dispersion_limit` - its asymptotic index of dispersion of counts;
* :func:`diurnal_arrivals` - a non-homogeneous Poisson process with a
  sinusoidal rate, by thinning.

References
----------
.. [1] H. Heffes and D. M. Lucantoni, "A Markov modulated characterization of
       packetized voice and data traffic and related statistical multiplexer
       performance", IEEE JSAC 4(6), 1986, 856-868 (the MMPP and its index of dispersion).
.. [2] W. Fischer and K. Meier-Hellstern, "The Markov-modulated Poisson process
       (MMPP) cookbook", Performance Evaluation 18(2), 1993, 149-171.
.. [3] P. A. W. Lewis and G. S. Shedler, "Simulation of nonhomogeneous Poisson
       processes by thinning", Naval Res. Logistics Quarterly 26(3), 1979, 403-413.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DEFAULT_MEAN_DWELL_S", "mmpp_rates", "mmpp_arrivals", "mmpp_dispersion_limit", "diurnal_arrivals"]

DEFAULT_MEAN_DWELL_S = 10.0
"""Mean length of a burst (a sojourn in the high state) of :func:`mmpp_arrivals`, in seconds."""


def _check_rate(name: str, value: float) -> float:
    if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0; got {value!r}")
    return float(value)


def _check_n(n) -> int:
    if int(n) != n or n < 0:
        raise ValueError(f"n must be a whole number >= 0; got {n!r}")
    return int(n)


def mmpp_rates(mean_rate_req_per_s: float, peak_to_mean: float,
               mean_dwell_s: float = DEFAULT_MEAN_DWELL_S) -> tuple[tuple[float, float], tuple[float, float]]:
    r"""Arrival rates and mean sojourns ``((lambda_H, lambda_L), (d_H, d_L))`` of :func:`mmpp_arrivals`.

    With mean rate :math:`\bar\lambda`, peak-to-mean ratio :math:`\kappa \ge 1`
    and mean burst length :math:`d`:

    .. math::

        \lambda_H = \kappa \bar\lambda, \quad \lambda_L = \bar\lambda / \kappa, \quad
        \pi_H = \frac{1}{1 + \kappa}, \quad d_H = d, \quad d_L = \kappa d

    (:math:`\pi_H = d_H / (d_H + d_L)` is the long-run share of time in the high
    state), so :math:`\pi_H \lambda_H + (1 - \pi_H) \lambda_L = \bar\lambda`.
    :math:`\kappa = 1` is a Poisson process.

    Examples
    --------
    >>> mmpp_rates(100.0, 2.0, 5.0)
    ((200.0, 50.0), (5.0, 10.0))
    """
    lam = _check_rate("mean_rate_req_per_s", mean_rate_req_per_s)
    dwell = _check_rate("mean_dwell_s", mean_dwell_s)
    if not (math.isfinite(peak_to_mean) and peak_to_mean >= 1.0):
        raise ValueError(f"peak_to_mean must be finite and >= 1; got {peak_to_mean!r}")
    k = float(peak_to_mean)
    return (k * lam, lam / k), (dwell, k * dwell)


def mmpp_dispersion_limit(mean_rate_req_per_s: float, peak_to_mean: float,
                          mean_dwell_s: float = DEFAULT_MEAN_DWELL_S) -> float:
    r"""Asymptotic index of dispersion of counts :math:`\lim_{t\to\infty} \mathrm{Var}\,N(t) / E\,N(t)` of the MMPP.

    .. math::

        I(\infty) = 1 + \frac{2\, r_H r_L (\lambda_H - \lambda_L)^2}{(r_H + r_L)^3 \,\bar\lambda}

    with :math:`r_H = 1/d_H`, :math:`r_L = 1/d_L` the rates of leaving each state
    (:func:`mmpp_rates`) [1]_. A Poisson process has :math:`I = 1`.

    Examples
    --------
    >>> mmpp_dispersion_limit(10.0, 1.0)
    1.0
    """
    (lam_h, lam_l), (d_h, d_l) = mmpp_rates(mean_rate_req_per_s, peak_to_mean, mean_dwell_s)
    r_h, r_l = 1.0 / d_h, 1.0 / d_l
    return 1.0 + 2.0 * r_h * r_l * (lam_h - lam_l) ** 2 / ((r_h + r_l) ** 3 * float(mean_rate_req_per_s))


def mmpp_arrivals(mean_rate_req_per_s: float, peak_to_mean: float, n: int, rng: np.random.Generator,
                  mean_dwell_s: float = DEFAULT_MEAN_DWELL_S) -> np.ndarray:
    r"""``n`` arrival instants of a stationary two-state Markov-modulated Poisson process, from time 0.

    A hidden state alternates between *high* and *low*; sojourns are exponential
    with means :math:`d_H, d_L`, and while in a state arrivals are Poisson at its
    rate (parametrisation in :func:`mmpp_rates`: the long-run mean rate is
    ``mean_rate_req_per_s`` and the high-state rate is ``peak_to_mean`` times it).
    The first state is drawn from the stationary law :math:`(\pi_H, \pi_L)`; by
    memorylessness its remaining sojourn has the full exponential law, so the
    process is stationary from time 0.

    Parameters
    ----------
    mean_rate_req_per_s : float
        Long-run mean rate :math:`\bar\lambda` > 0.
    peak_to_mean : float
        :math:`\kappa = \lambda_H / \bar\lambda \ge 1`.
    n : int
        Number of arrivals.
    rng : numpy.random.Generator
        Source of all draws.
    mean_dwell_s : float
        Mean burst length :math:`d_H` in seconds (default :data:`DEFAULT_MEAN_DWELL_S`);
        the lulls last :math:`\kappa d_H` on average.

    Returns
    -------
    numpy.ndarray
        Non-decreasing instants in seconds, shape ``(n,)``.

    Notes
    -----
    Sojourns are drawn in vectorized blocks (a two-state chain always switches,
    so the states of consecutive sojourns alternate); within a sojourn of length
    :math:`s` in state :math:`j` the number of arrivals is Poisson
    :math:`(\lambda_j s)` and their instants are i.i.d. uniform on the sojourn.

    Examples
    --------
    >>> t = mmpp_arrivals(50.0, 3.0, 1000, np.random.default_rng(7))
    >>> t.shape, bool(np.all(np.diff(t) >= 0))
    ((1000,), True)
    """
    (lam_h, lam_l), (d_h, d_l) = mmpp_rates(mean_rate_req_per_s, peak_to_mean, mean_dwell_s)
    n = _check_n(n)
    rates, dwells = np.array([lam_h, lam_l]), np.array([d_h, d_l])
    per_cycle = lam_h * d_h + lam_l * d_l          # expected arrivals in one high + one low sojourn
    state = 0 if rng.random() < d_h / (d_h + d_l) else 1
    start_s, got, parts = 0.0, 0, []
    while got < n:
        pairs = int(math.ceil(1.2 * (n - got) / per_cycle)) + 1
        states = (state + np.arange(2 * pairs)) % 2
        length = rng.exponential(dwells[states])
        counts = rng.poisson(rates[states] * length)
        begin = start_s + np.concatenate(([0.0], np.cumsum(length)[:-1]))
        at = np.repeat(begin, counts) + rng.random(int(counts.sum())) * np.repeat(length, counts)
        parts.append(np.sort(at))
        got += at.size
        start_s += float(length.sum())
        state = int((states[-1] + 1) % 2)
    return np.concatenate(parts)[:n] if parts else np.zeros(0)


def diurnal_arrivals(mean_rate: float, n: int, rng: np.random.Generator, amplitude: float,
                     period_s: float) -> np.ndarray:
    r"""``n`` arrival instants of a Poisson process with a sinusoidal rate, by thinning, from time 0.

    .. math:: \lambda(t) = \bar\lambda \left(1 + a \sin\frac{2\pi t}{T}\right), \qquad 0 \le a \le 1

    Candidates come from a homogeneous Poisson process at
    :math:`\lambda_{max} = \bar\lambda (1 + a)`; a candidate at :math:`t` is kept
    with probability :math:`\lambda(t) / \lambda_{max}` [3]_. The mean rate over
    whole periods is :math:`\bar\lambda` and the peak-to-mean ratio is :math:`1 + a`.

    Parameters
    ----------
    mean_rate : float
        :math:`\bar\lambda` in requests per second, > 0.
    n : int
        Number of arrivals.
    rng : numpy.random.Generator
        Source of all draws.
    amplitude : float
        :math:`a \in [0, 1]` (0 is a Poisson process).
    period_s : float
        :math:`T` in seconds, > 0 (86,400 for a day; shorter to compress a day into a run).

    Examples
    --------
    >>> t = diurnal_arrivals(20.0, 500, np.random.default_rng(3), 0.5, 60.0)
    >>> t.shape, bool(np.all(np.diff(t) >= 0))
    ((500,), True)
    """
    lam = _check_rate("mean_rate", mean_rate)
    period = _check_rate("period_s", period_s)
    if not (math.isfinite(amplitude) and 0.0 <= amplitude <= 1.0):
        raise ValueError(f"amplitude must lie in [0, 1]; got {amplitude!r}")
    n = _check_n(n)
    lam_max = lam * (1.0 + amplitude)
    t_s, got, parts = 0.0, 0, []
    while got < n:
        block = int(math.ceil(1.1 * (n - got) * (1.0 + amplitude))) + 16
        cand = t_s + np.cumsum(rng.exponential(1.0 / lam_max, size=block))
        keep = rng.random(block) * lam_max <= lam * (1.0 + amplitude * np.sin(2.0 * np.pi * cand / period))
        parts.append(cand[keep])
        got += int(keep.sum())
        t_s = float(cand[-1])
    return np.concatenate(parts)[:n] if parts else np.zeros(0)
