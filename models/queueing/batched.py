r"""The batched replica model: a continuous-batching replica at its realised occupancy.

The seeds' slot model (:mod:`fleetopt.models.queueing.erlang` with ``ttft_model`` ``tail`` or ``mean-prefill``)
charges every request the iteration time of a *full* batch and prices a prefill chunk as if it ran
alone. A replica of vLLM (and fleetopt's simulator, :mod:`fleetopt.solvers.des.engine`) does neither:
an iteration carries whatever sequences are running, decodes and prefill chunks together, and takes

.. math:: t = W + h\, C + g\, n_{dec} + \sum_j (a\, c_j + b((p_j + c_j)^2 - p_j^2)), \qquad C = \sum_s x_s

with :math:`x_s` the context of sequence :math:`s` at the iteration's start and the compute terms of decode
sequences and prefill chunks (:func:`fleetopt.models.service.compute_coefficients`; 0 for the seeds' units).
Below, the *work* of an iteration is its time beyond :math:`W`, in seconds, and :math:`C` denotes the work the
other sequences bring (:math:`hC` in the context-only case). This module derives TTFT, occupancy,
utilisation and power from that same function (``ttft_model: batched``, the default). The derivation,
its assumptions and where it errs are in ``docs/models.md`` ("The batched replica model").

Occupancy as a fixed point
--------------------------
Length routing and join-the-shortest-queue dispatch give each of a pool's :math:`N` replicas the rate
:math:`\lambda_r = \lambda / N`. A request of :math:`k = \lceil l_{in}/c \rceil` prefill chunks and
:math:`l_{out}` output tokens runs :math:`I = k + l_{out}` iterations to which it adds the work :math:`Y` in
all, :math:`Y_2` summed squared (:func:`fleetopt.models.segments.compute_work`; :math:`Y = hX` with :math:`X`
of :func:`fleetopt.models.segments.context_work` without compute terms). Treating the replica's total work
:math:`C` as shot noise with iterations of mean length :math:`\bar t` (Campbell's theorem),

.. math::

    E[C] = \lambda_r E[Y]\, \bar t, \qquad \bar t = W + E[C]
    \;\Rightarrow\; \bar t = \frac{W}{1 - x}, \quad x = \lambda_r E[Y] < 1,

    \mathrm{Var}[C] = \lambda_r \bar t\, E[Y_2], \qquad
    \bar b = \lambda_r E[I]\, \bar t \;\text{(Little's law)}, \qquad \rho = \bar b / n

with :math:`n` the batch cap. :math:`x` is the replica's *context load*: the share of its time spent
on context; :math:`x \ge 1` is unstable whatever the slots.

TTFT
----
A request waits for a batch place, then joins at the next iteration boundary and runs :math:`k`
prefill iterations:

.. math::

    T = W_q + (k + U)(W + C) + \omega_k, \qquad \omega_k = h c \frac{k(k-1)}{2} + a E[l_{in} | k]
        + b E[l_{in}^2 | k]

where :math:`U \sim U(0, 1)` is the residual of the iteration in progress (:math:`U = 0` and
:math:`C = 0` when the replica is idle), :math:`C` is the other sequences' work, drawn from a gamma
law with the mean and variance above, and :math:`\omega_k` is the request's own prefill work (its prefix
context and its prompt's compute, at the mean prompt moments of its chunk count).
:math:`W_q` is 0 unless every one of the pool's :math:`N n` batch places is taken (the count's mass there,
:func:`operating_point`: the chain's arrivals come in geometric clusters sized so that its variance is
:func:`occupancy_dispersion`'s :math:`F` times the chain's, :func:`cluster_size`). Then it has mean
:math:`1/\theta`, :math:`\theta = 2(\mu_f - \lambda)/(I_A + I)`, Kimura's correction [3]_ with :math:`I` the
departures' index of dispersion over the time the queue takes to relax (:func:`departure_dispersion`) and
:math:`I_A` the arrivals' (1 unless unequal requests cluster them), and squared coefficient of variation
:math:`1 + (I - 1)/K`: the arrival waits for :math:`K` departures, :math:`K` geometric of mean
:math:`\mu_f/\theta`, released with index :math:`I` (1 gives the exponential; the law is Whitt's two-moment
fit, :func:`waited_exceed_prob`). The P99 comes from the distribution
of the sum, :math:`P(T > t) = \sum_k p_k E_{C,U}[P(W_q > t - \tau_k(C, U))]`, integrated exactly over :math:`U`
(:func:`waited_exceed_prob`) and by quantile nodes over :math:`C` (:data:`CONTEXT_NODES`).

References
----------
.. [1] S. O. Rice, "Mathematical analysis of random noise", Bell System Technical Journal 23 (1944)
       282-332 (shot noise, Campbell's theorem).
.. [2] J. D. C. Little, "A proof for the queuing formula L = lambda W", Operations Research 9 (1961).
.. [3] T. Kimura, "Approximations for multi-server queues: system interpolations", Queueing Systems 17
       (1994) 347-382.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from fleetopt.models.queueing.dispersion import count_dispersion
from fleetopt.models.numerics import bisect_level, special
from fleetopt.models.queueing.erlang import Sizing
from fleetopt.models.units import P99_TAIL

__all__ = ["CONTEXT_NODES", "BatchedTraffic", "OperatingPoint", "operating_point", "occupancy_dispersion",
           "cluster_size", "batched_miss_grid",
           "waited_exceed_prob", "batched_miss_prob", "batched_miss_function", "batched_ttft_p99_s",
           "batched_min_replicas", "batched_utilization_floor", "batched_carries", "prefill_limit_s",
           "departure_dispersion",
           "mean_prefill_s", "mean_power_w", "mean_activity_power_w", "prefill_lumps", "coarrival_exceed_prob",
           "own_prefill_context"]

_BIN_EDGES = np.array([0.0, 0.25, 0.5, 0.75, 0.9, 0.97, 0.995, 1.0])
CONTEXT_NODES = (0.5 * (_BIN_EDGES[1:] + _BIN_EDGES[:-1]), np.diff(_BIN_EDGES))
"""Quantile levels and weights of the nodes that integrate over the context :math:`C`: the mid-point of
each probability bin, with bins narrowing into the upper tail (where the P99 is decided)."""

_MAX_REPLICAS = 10**7


@dataclass(frozen=True, eq=False)
class BatchedTraffic:
    """What the batched model needs of a pool's traffic and replica (arrays over pools, shape (S,)).

    Build it with :meth:`from_stats` from :class:`fleetopt.models.segments.SegmentStats`.
    """

    arrival_rate: np.ndarray
    """Requests per second into the pool, :math:`\\lambda`."""
    cap: np.ndarray
    """Batch cap per replica (``max_num_seqs``), :math:`n`."""
    mean_iterations: np.ndarray
    cv2_iterations: np.ndarray
    mean_work: np.ndarray
    """:math:`E[Y]`: the seconds a request adds to the iterations it runs in (:math:`hE[X]` without compute
    terms; :attr:`fleetopt.models.segments.SegmentStats.mean_time_work`)."""
    mean_work_sq: np.ndarray
    """:math:`E[Y_2]` in s²: those per-iteration seconds squared, summed."""
    chunk_probs: np.ndarray
    """Shape (S, Q): probability of each prompt class (column); a class is a chunk count :math:`k` (column
    :math:`k`) unless :attr:`column_chunks` says otherwise."""
    own_prefill_s: np.ndarray
    """Shape (S, Q): the seconds a request of each class adds to its own prefill iterations,
    :math:`\\omega = h c k(k-1)/2 + a E[l_{in}] + b E[l_{in}^2]` over the class."""
    W_s: float
    mean_kv_work: np.ndarray | None = None
    """:math:`E[hX]`: the part of :attr:`mean_work` that scans the KV cache (the rest is compute); ``None``: all."""
    prefill_compute_s: np.ndarray | None = None
    """:math:`E[a\\, l_{in} + b\\, l_{in}^2]` per pool (the lumps other requests' prefill chunks add to an
    iteration; ``None``: 0, a profile without prefill compute)."""
    column_chunks: np.ndarray | None = None
    """Shape (Q,): the chunk count :math:`k` of each class (prompt bins finer than a chunk, for a profile with
    prefill compute: :attr:`fleetopt.models.segments.SegmentStats.ttft_chunks`); ``None``: column :math:`k` has
    :math:`k` chunks."""
    mean_work_total_sq: np.ndarray | None = None
    """:math:`E[Y^2]` in s²: the square of a request's whole work (``None``: the occupancy and the full-pool wait
    take no account of how the work varies between requests)."""
    mean_iterations_work: np.ndarray | None = None
    """:math:`E[I Y]` in s (``None`` with :attr:`mean_work_total_sq`)."""
    prefill_compute_sq: np.ndarray | None = None
    """:math:`E[(a\\, l_{in} + b\\, l_{in}^2)^2]` in s² (``None``: prompts' compute taken as equal)."""
    decode_work_total_sq: np.ndarray | None = None
    """:math:`E[Y_d^2]` in s² of the work beyond the prompt's compute, :math:`Y_d = Y - \\ell` (``None``: taken as
    :math:`Y`'s, with :attr:`mean_work_total_sq`)."""
    iterations_decode_work: np.ndarray | None = None
    """:math:`E[I Y_d]` in s (``None`` with :attr:`decode_work_total_sq`)."""
    count_spectra: np.ndarray | None = None
    """Shape (S, 5, len(OMEGA)), complex: the mean transforms of the requests' presence and work
    (:attr:`fleetopt.models.segments.SegmentStats.count_spectra`), from which :func:`occupancy_dispersion` takes
    :math:`F` (``None``: its closed form)."""

    @property
    def prompt_compute_s(self) -> np.ndarray:
        """:attr:`prefill_compute_s`, or 0 per pool where the profile has no prefill compute."""
        return np.zeros_like(self.arrival_rate) if self.prefill_compute_s is None else self.prefill_compute_s

    @property
    def chunks(self) -> np.ndarray:
        """The chunk count of each column."""
        if self.column_chunks is not None:
            return np.asarray(self.column_chunks, dtype=float)
        return np.arange(self.chunk_probs.shape[1], dtype=float)

    @staticmethod
    def from_stats(stats, arrival_rate, *, cap=None) -> BatchedTraffic:
        """From segment statistics (``stats.n_slots`` is the cap unless ``cap`` is given); every field by name."""
        lam = np.atleast_1d(np.asarray(arrival_rate, dtype=float))
        n = np.asarray(stats.n_slots if cap is None else cap, dtype=float)
        fix = lambda a: np.broadcast_to(np.nan_to_num(np.asarray(a, dtype=float)), lam.shape)  # noqa: E731
        optional = lambda a: None if a is None else fix(a)  # noqa: E731
        probs = np.nan_to_num(np.atleast_2d(stats.ttft_probs))
        own = np.broadcast_to(np.nan_to_num(np.atleast_2d(stats.own_prefill_s)), probs.shape)
        spectra = stats.count_spectra
        return BatchedTraffic(
            arrival_rate=lam, cap=np.broadcast_to(n, lam.shape), mean_iterations=fix(stats.mean_iterations),
            cv2_iterations=fix(stats.cv2_iterations), mean_work=fix(stats.mean_time_work),
            mean_work_sq=fix(stats.mean_time_work_sq), chunk_probs=probs, own_prefill_s=own,
            W_s=float(stats.iteration_base_s),
            mean_kv_work=fix(stats.context_s_per_token * np.asarray(stats.mean_context_work, dtype=float)),
            prefill_compute_s=fix(stats.mean_prefill_compute_s),
            column_chunks=np.asarray(stats.ttft_chunks, dtype=float),
            mean_work_total_sq=optional(stats.mean_time_work_total_sq),
            mean_iterations_work=optional(stats.mean_iterations_time_work),
            prefill_compute_sq=optional(stats.mean_prefill_compute_sq),
            decode_work_total_sq=optional(stats.mean_decode_work_sq),
            iterations_decode_work=optional(stats.mean_iterations_decode_work),
            count_spectra=None if spectra is None else np.nan_to_num(
                np.broadcast_to(spectra, lam.shape + spectra.shape[-2:])))

    def take(self, idx) -> BatchedTraffic:
        """The pools at ``idx`` (every per-pool array indexed; ``W_s`` and ``column_chunks`` are shared)."""
        return replace(self, **{f.name: getattr(self, f.name)[idx] for f in fields(self)
                                if f.name not in ("W_s", "column_chunks") and getattr(self, f.name) is not None})


@dataclass(frozen=True, eq=False)
class OperatingPoint:
    """A pool's replicas at their realised occupancy (arrays over pools; module docstring).

    An arrival finds one of three states: a replica idle (``idle_prob``), a replica running a batch with a
    place free (``busy``), or every batch place of the pool taken (``full_prob``), when it waits; the
    context :math:`C` of the replica it joins has the mean and variance given for its state.
    """

    replicas: np.ndarray
    context_load: np.ndarray
    """:math:`x = \\lambda E[Y] / N`: the share of a replica's time spent on work beyond :math:`W`."""
    full_load: np.ndarray
    """:math:`\\rho_f = x + \\lambda E[I] W / (N n)`: offered load over the pool's throughput when every
    batch place is taken (stable below 1)."""
    mean_batch: np.ndarray
    """:math:`E[\\min(J, Nn)] / N`, sequences running per replica."""
    utilization: np.ndarray
    """Mean batch over the cap :math:`n`: the share of batch places in use."""
    residence_s: np.ndarray
    """Mean time a request holds its batch place (Little's law: mean batch x N / lambda)."""
    idle_prob: np.ndarray
    full_prob: np.ndarray
    busy_context_mean: np.ndarray
    busy_context_var: np.ndarray
    full_context_mean: np.ndarray
    full_context_var: np.ndarray
    wait_decay: np.ndarray
    """:math:`\\theta`: the wait of an arrival that finds the pool full has mean :math:`1/\\theta` (1/s)."""
    stable: np.ndarray
    busy_fraction: np.ndarray | None = None
    """:math:`E[\\min(J, N)] / N`: the share of time a replica runs iterations (JSQ keeps :math:`\\min(J, N)`
    replicas busy)."""
    occupancy_var: np.ndarray | None = None
    """Variance of the clustered chain's count without a cap (:func:`occupancy_dispersion`'s :math:`F` times the
    negative binomial's): the pool's count where the cap is rarely reached."""
    wait_scv: np.ndarray | float = 1.0
    """Squared coefficient of variation of the full-pool wait (1: exponential; :func:`waited_exceed_prob`)."""


def _nb_cdf(m, r, x):
    """:math:`P(J \\le m)` for :math:`J` negative binomial with shape :math:`r` and ratio :math:`x` (0 for m < 0)."""
    m = np.asarray(m, dtype=float)
    if not np.any(m >= 0):      # a partial sum from 0 asks for P(J <= -1), -2, ...: no beta function needed
        return np.zeros(np.broadcast_shapes(m.shape, np.shape(r), np.shape(x)))
    return np.where(m >= 0, special.betainc(r, np.maximum(m, 0.0) + 1.0, 1.0 - x), 0.0)


def _nb_pmf(m, r, x):
    """:math:`P(J = m) = \\binom{m + r - 1}{m} (1 - x)^r x^m`."""
    return np.exp(special.gammaln(r + m) - special.gammaln(r) - special.gammaln(m + 1.0)
                  + r * np.log1p(-x) + special.xlogy(m, x))


def cluster_size(x, a, F) -> np.ndarray:
    r"""Mean size :math:`q \ge 1` of the geometric clusters in which arrivals must come for the occupancy chain
    to vary ``F`` times as much as it does with single arrivals (arrays; ``docs/models.md``, "The count near the
    cap").

    The chain of :func:`operating_point` has birth rate :math:`\lambda` and death rates
    :math:`\mu_j = \lambda j / (A + x j)`, :math:`A = \lambda E[I] W` (``a``): a negative binomial of
    shape :math:`A/x + 1` and ratio :math:`x`, mean :math:`(A + x)/(1 - x)`, variance :math:`(A + x)/(1 - x)^2`.
    With the arrivals in clusters of :math:`X` geometric on :math:`1, 2, \dots` of mean :math:`q` (at rate
    :math:`\lambda / q`) the mean becomes :math:`(q x + A)/(1 - x)` (the completion rate is concave in :math:`j`,
    so a wider count runs slower on average) and the variance (:func:`_cluster_variance`)

    .. math:: \mathrm{Var}[J] = \frac{q^2 x (2 - x) + q (A - x (1 - x))}{(1 - x)^2},

    so :math:`q` is the positive root of :math:`q^2 x(2 - x) + q(A - x(1 - x)) = F (A + x)` (1 at
    :math:`F = 1`).

    >>> float(cluster_size(0.5, 2.0, 1.0)), round(float(cluster_size(0.5, 2.0, 1.5)), 4)
    (1.0, 1.3555)
    """
    x, a, F = (np.asarray(v, dtype=float) for v in (x, a, F))
    A2 = x * (2.0 - x)
    A1 = a - x * (1.0 - x)
    C = F * (a + x)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(A2 > 0, 2.0 * C / (A1 + np.sqrt(A1 * A1 + 4.0 * A2 * C)), F)
    return np.maximum(q, 1.0)


def _cluster_variance(x, a, q) -> np.ndarray:
    """Variance of the clustered chain's count without a cap (:func:`cluster_size`)."""
    return (q * q * x * (2.0 - x) + q * (a - x * (1.0 - x))) / (1.0 - x) ** 2


def _nb_partial(r, x, lo, hi):
    r"""Sums of :math:`P(j)`, :math:`j P(j)`, :math:`j^2 P(j)` over :math:`j \in [lo, hi]` for the negative binomial
    (:math:`r`, :math:`x`): :math:`j P(j; r) = r \frac{x}{1-x} P(j - 1; r + 1)` and
    :math:`j(j-1) P(j; r) = r(r+1) (\frac{x}{1-x})^2 P(j - 2; r + 2)`."""
    q = x / (1.0 - x)
    m0 = _nb_cdf(hi, r, x) - _nb_cdf(lo - 1.0, r, x)
    m1 = r * q * (_nb_cdf(hi - 1.0, r + 1.0, x) - _nb_cdf(lo - 2.0, r + 1.0, x))
    f2 = r * (r + 1.0) * q * q * (_nb_cdf(hi - 2.0, r + 2.0, x) - _nb_cdf(lo - 3.0, r + 2.0, x))
    return m0, m1, f2 + m1


def _cluster_partial(r, xi, p, lo, hi):
    r"""Sums of :math:`\pi(j)`, :math:`j \pi(j)`, :math:`j^2 \pi(j)` over :math:`[lo, hi]` for the clustered chain
    below the cap, :math:`\pi(j) = S_j - (1 - p) S_{j-1}` with :math:`S` the negative binomial (:math:`r`,
    :math:`\xi`) (``docs/models.md``, "The count near the cap")."""
    a0, a1, a2 = _nb_partial(r, xi, lo, hi)
    b0, b1, b2 = _nb_partial(r, xi, lo - 1.0, hi - 1.0)     # S_{j-1} over [lo, hi], i.e. S_i, i + 1 = j
    g = 1.0 - p
    return a0 - g * b0, a1 - g * (b1 + b0), a2 - g * (b2 + 2.0 * b1 + b0)


def operating_point(traffic: BatchedTraffic, replicas) -> OperatingPoint:
    """Occupancy of a pool of ``replicas`` continuous-batching replicas (module docstring, "Occupancy").

    Examples
    --------
    One replica, W = 10 ms, 1 req/s of 100 iterations adding 0.2 s in all (200,000 context tokens at
    h = 1 us/token): :math:`x = 0.2`, :math:`\\beta = W E[I] / E[Y] = 5`, so the batch is negative binomial with shape
    :math:`r = 6` and ratio 0.2 (mean :math:`r x/(1-x) = 1.5`) as long as the cap of 8 is rarely reached.

    >>> t = BatchedTraffic(np.array([1.0]), np.array([8.0]), np.array([100.0]), np.array([0.0]),
    ...                    np.array([0.2]), np.array([1e-3]), np.array([[0.0, 1.0]]), np.array([[0.0, 0.0]]), 0.01)
    >>> op = operating_point(t, 1)
    >>> [round(float(v[0]), 4) for v in (op.context_load, op.mean_batch)]
    [0.2, 1.4997]
    """
    N = np.broadcast_to(np.asarray(replicas, dtype=float), traffic.arrival_rate.shape).astype(float)
    lam, n = traffic.arrival_rate, traffic.cap
    W = traffic.W_s
    EI, EX = traffic.mean_iterations, traffic.mean_work
    live = (lam > 0) & (N > 0) & (n >= 1) & (EI > 0)
    Ns = np.where(live, N, 1.0)
    EIs = np.where(live, EI, 1.0)
    xbar, seq_var = _per_iteration_work(traffic, live)          # a running sequence's work: mean, spread
    a = lam * EI * W                                            # work without context, per second
    x = np.where(live, np.maximum(lam * EX / Ns, 1e-300), 0.0)
    m = Ns * n                                                  # batch places in the pool
    rho_f = x + a / np.where(live, m, 1.0)
    stable = live & (rho_f < 1.0)
    disp, unequal, dep_cv2 = occupancy_dispersion(traffic, N)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        xs = np.where(stable, x, 0.5)
        As = np.where(stable, a, 1.0)
        F = np.ones_like(xs) if disp is None else disp
        p = 1.0 / cluster_size(xs, As, F)                     # 1: the chain itself
        xi = 1.0 - p * (1.0 - xs)                               # S_j: negative binomial (r_c, xi)
        r = 1.0 + p * As / xi
        S_top = _nb_pmf(m - 1.0, r, xi)
        below, run_below, sq_below = _cluster_partial(r, xi, p, 0.0, m - 1.0)
        tail = rho_f * S_top / np.where(stable, 1.0 - rho_f, 1.0)   # sum over J >= Nn
        Z = below + tail
        p_full = tail / Z
        idle, run_idle, sq_idle = _cluster_partial(r, xi, p, 0.0, Ns - 1.0)
        p_idle = idle / Z                                       # J < N: JSQ finds an idle replica
        busy_mass = np.maximum(below - idle, 0.0)               # partial moments over [N, Nn - 1]
        S1, S2 = run_below - run_idle, sq_below - sq_idle
        has_busy = busy_mass > 0
        Ej = np.where(has_busy, S1 / np.where(has_busy, busy_mass, 1.0), Ns)
        Ej2 = np.where(has_busy, S2 / np.where(has_busy, busy_mass, 1.0), Ns * Ns)
        b_mean = Ej / Ns
        b_var = np.maximum(Ej2 - Ej * Ej, 0.0) / (Ns * Ns)
        running = (run_below + m * tail) / Z                    # E[min(J, Nn)]
        busy_frac = (run_idle / Z + Ns * (1.0 - p_idle)) / Ns   # E[min(J, N)] / N
        batch = np.where(stable, running / Ns, np.where(live, n, 0.0))
        period = EIs * (W + n * xbar)                           # a batch place's mean residence when full
        mu_full = m / period
        lump = traffic.prompt_compute_s
        S_mean = _place_time_s(traffic, EIs)
        spread = np.clip(1.0 - lump / np.where(S_mean > 0, S_mean, 1.0), 0.0, 1.0)
        dep_index = departure_dispersion(dep_cv2, mu_full, lam, spread * period)
        arrivals_index = 1.0 if unequal is None else 2.0 * cluster_size(xs, As, unequal) - 1.0
        theta = np.where(stable, (mu_full - lam) * 2.0 / (arrivals_index + dep_index), -1.0)
        # an arrival that finds the pool full waits for K departures, K geometric of mean mu_f / theta: the
        # wait's squared coefficient of variation is 1 + (I - 1)/E[K]
        depth = np.maximum(np.where(stable, mu_full / np.where(theta > 0, theta, 1.0), 1.0), 1.0)
        wait_scv = np.maximum(1.0 + (dep_index - 1.0) / depth, 0.0)
        residence = np.where(live & stable, batch * Ns / np.where(lam > 0, lam, 1.0), np.inf)
    ok = lambda v, fill: np.where(stable, v, fill)  # noqa: E731
    return OperatingPoint(
        N, np.where(live, x, 0.0), np.where(live, rho_f, 0.0), batch, batch / np.where(n >= 1, n, 1.0),
        residence, ok(p_idle, 0.0), ok(p_full, 1.0),
        ok(b_mean * xbar, 0.0), ok(xbar * xbar * b_var + b_mean * seq_var, 0.0), ok(n * xbar, 0.0),
        ok(n * seq_var, 0.0), theta, stable | (lam <= 0), np.where(stable, busy_frac, np.where(live, 1.0, 0.0)),
        ok(_cluster_variance(xs, As, 1.0 / p), 0.0), ok(wait_scv, 1.0))


def _place_time_s(traffic: BatchedTraffic, mean_iterations) -> np.ndarray:
    """:math:`E[S'] = W E[I]/n + E[Y]`: the replica time a request holds through its batch place when every place
    is taken (the iteration's fixed part shared by the :math:`n` places, plus its own work)."""
    return traffic.W_s * mean_iterations / np.maximum(traffic.cap, 1.0) + traffic.mean_work


def _per_iteration_work(traffic: BatchedTraffic, live):
    r"""Mean :math:`\bar y = E[Y]/E[I]` and variance :math:`E[Y_2]/E[I] - \bar y^2` of the work a running
    sequence adds to an iteration (iteration-weighted over requests; 0 where not ``live``)."""
    EI = np.where(live, traffic.mean_iterations, 1.0)
    ybar = np.where(live, traffic.mean_work / EI, 0.0)
    return ybar, np.maximum(np.where(live, traffic.mean_work_sq / EI, 0.0) - ybar * ybar, 0.0)


def occupancy_dispersion(traffic: BatchedTraffic, replicas) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    r"""How much more a pool's occupancy varies than the chain's negative binomial, :math:`F`; the part of it due
    to unequal requests alone, :math:`1 + \lambda_r^2 E[Z^2]/(2(1 + \kappa\tau_Z))` (below; it clusters the arrivals
    of a full pool's queue, :func:`operating_point`); and the long-run index of dispersion :math:`c^2_{S'}` of a
    full pool's departures (arrays over pools; ``docs/models.md``, "Occupancy dispersion"). Without the work
    moments (:attr:`BatchedTraffic.mean_work_total_sq`) ``(None, None, c_I^2)``: the chain as it stands and
    Kimura's wait with the spread of the iterations.

    The chain gives every running sequence the mean work :math:`\bar y = E[Y]/E[I]` an iteration, so its
    variance is that of a symmetric queue, :math:`E[J]/(1 - x)`. Two things the mean hides add to it:

    **Prefill stalls.** A prompt's compute :math:`\ell = a\, l_{in} + b\, l_{in}^2` stalls every sequence of its
    replica while it runs, and it comes with an *arrival*, not with the occupancy. On the clock of decode
    progress the stalls vanish and the arrivals come in clusters: those that arrive while a stall lasts, the
    customers of a busy period of an M/G/1 queue of load :math:`\rho_p = \lambda_r E[\ell]`, whose size
    :math:`X` has :math:`E[X^2]/E[X] = M = (1 + \lambda_r^2 \mathrm{Var}[\ell])/(1 - \rho_p)^2`. On that clock the
    decode load is :math:`x_d / (1 - \rho_p)`, and clustered arrivals multiply the variance of an
    infinite-server count by :math:`1 + \gamma (M - 1)`, :math:`\gamma = E[\min(S_1, S_2)]/E[S]` for two
    residences (1 when they are equal, 1/2 when exponential; here for a gamma law of :math:`I`,
    :math:`\gamma = 1 - \Gamma(\alpha + 1/2) / (\sqrt\pi\, \Gamma(\alpha + 1))`, :math:`\alpha = 1/c_I^2`):

    .. math:: F_p = (1 - \rho_p)\,\bigl(1 + \gamma (M - 1)\bigr)

    (:math:`1/(1 - \rho_p)` for equal residences; 1 without prefill compute). :math:`F` is kept at 1 or more: the
    cluster law of :func:`cluster_size` cannot vary less than the chain (the exact :math:`F` can, slightly: 0.94 for
    short prompts with long outputs, whose work grows over their lives, so a clamp at 1 errs pessimistic).

    **Unequal requests.** A request whose work exceeds its share of the mean slows its replica beyond what
    its place in the count says. The prompt's compute :math:`\ell` is the stalls' above, so the excess is that
    of the rest of the work, :math:`Y_d = Y - \ell` (its moments :attr:`BatchedTraffic.decode_work_total_sq`,
    :attr:`BatchedTraffic.iterations_decode_work`; counting :math:`\ell` in both terms would count the stalls
    twice). In a linear-noise view the count relaxes at
    :math:`\kappa = \lambda_r (1 - x)/E[J_r]` and is driven by that excess, a shot noise of spectral density
    :math:`\lambda_r \bar t^2 E[Z^2]` at low frequency, :math:`Z = Y_d - \bar y_d I`,
    :math:`\bar y_d = E[Y_d]/E[I]`, which adds
    :math:`\lambda_r^2 E[Z^2]/2` to :math:`F`; a request's excess lasts its residence, so the part slower than
    :math:`1/\kappa` is filtered out by :math:`1/(1 + \kappa\tau_Z)`, :math:`\kappa\tau_Z = (1 - x) E[Z^2] / (2
    E[I]^2 \sigma^2)` with :math:`\sigma^2` the per-iteration spread of a sequence's work:

    .. math:: F = F_p + \frac{\lambda_r^2 E[Z^2]}{2 (1 + \kappa \tau_Z)}

    **From the requests' transforms.** Where the traffic carries its requests' mean transforms
    (:attr:`BatchedTraffic.count_spectra`, which segment statistics always do) :math:`F` is instead
    :func:`fleetopt.models.queueing.dispersion.count_dispersion`: the count's second moment on the clock of iterations,
    exact for one replica without a cap, and a closure for what arrivals see (its accuracy against the exact
    oracle, and the closed form's: ``docs/models.md``, "The count's exact second moment"). The closed form stays
    for the unequal-request part that clusters a full pool's arrivals, and for traffic built without the
    transforms.

    **A full pool's departures.** With every place taken a replica is a server whose requests each need
    :math:`S' = W I / n + Y` of its time (the iteration's fixed part shared by the :math:`n` places, plus the
    request's own work); on the random clock of the iterations the departures' long-run index of dispersion is
    :math:`c^2_{S'}` (a renewal-reward argument over the places), returned here; :func:`operating_point` takes
    it over the queue's relaxation time (:func:`departure_dispersion`) into the wait's decay.

    How :math:`F` compares with the simulator's occupancy, pool by pool: ``docs/models.md``, "Occupancy
    dispersion" and "Measurement history".

    Examples
    --------
    Without prefill compute or unequal requests nothing changes: :math:`F = 1`.

    >>> t = BatchedTraffic(np.array([1.0]), np.array([8.0]), np.array([100.0]), np.array([0.0]),
    ...                    np.array([0.2]), np.array([1e-3]), np.array([[0.0, 1.0]]), np.array([[0.0, 0.0]]), 0.01,
    ...                    mean_work_total_sq=np.array([0.04]), mean_iterations_work=np.array([20.0]))
    >>> [round(float(v[0]), 6) for v in occupancy_dispersion(t, 1)]
    [1.0, 1.0, 0.0]
    """
    lam = traffic.arrival_rate
    N = np.broadcast_to(np.asarray(replicas, dtype=float), lam.shape)
    n = traffic.cap
    live = (lam > 0) & (N > 0) & (n >= 1) & (traffic.mean_iterations > 0)
    if traffic.mean_work_total_sq is None or traffic.mean_iterations_work is None:
        return None, None, traffic.cv2_iterations
    lam_r = lam / np.where(live, N, 1.0)
    EI = np.where(live, traffic.mean_iterations, 1.0)
    EY = traffic.mean_work
    EI2 = EI * EI * (1.0 + traffic.cv2_iterations)
    EY2, EIY = traffic.mean_work_total_sq, traffic.mean_iterations_work
    ybar, seq_var = _per_iteration_work(traffic, live)
    if traffic.decode_work_total_sq is not None and traffic.iterations_decode_work is not None:
        lump = traffic.prompt_compute_s
        yd = np.where(live, np.maximum(EY - lump, 0.0) / EI, 0.0)              # the prompt's compute is the stalls'
        z2 = np.maximum(traffic.decode_work_total_sq - 2.0 * yd * traffic.iterations_decode_work + yd * yd * EI2,
                        0.0)                                                  # E[(Y_d - ybar_d I)^2]
    else:
        z2 = np.maximum(EY2 - 2.0 * ybar * EIY + ybar * ybar * EI2, 0.0)      # E[(Y - ybar I)^2]
    rho_p = lam_r * traffic.prompt_compute_s
    rho_p = np.clip(rho_p, 0.0, 0.95)                                         # x >= rho_p: unstable beyond
    var_l = (np.zeros_like(lam_r) if traffic.prefill_compute_sq is None or traffic.prefill_compute_s is None
             else np.maximum(traffic.prefill_compute_sq - traffic.prefill_compute_s ** 2, 0.0))
    M = (1.0 + lam_r * lam_r * var_l) / (1.0 - rho_p) ** 2
    alpha = 1.0 / np.maximum(traffic.cv2_iterations, 1e-6)
    gamma = 1.0 - np.exp(special.gammaln(alpha + 0.5) - special.gammaln(alpha + 1.0)) / np.sqrt(np.pi)
    x = lam_r * EY
    filt = 1.0 / (1.0 + np.maximum(1.0 - x, 0.0) * z2 / (2.0 * EI * EI * np.maximum(seq_var, 1e-300)))
    unequal = 0.5 * lam_r * lam_r * z2 * filt
    disp = (1.0 - rho_p) * (1.0 + gamma * (M - 1.0)) + unequal
    if traffic.count_spectra is not None:
        disp = _spectral_dispersion(traffic, lam_r, live & (x < 1.0), disp)
    ncap = np.maximum(n, 1.0)
    W = traffic.W_s
    ES = _place_time_s(traffic, EI)
    ES2 = W * W * EI2 / (ncap * ncap) + 2.0 * W * EIY / ncap + EY2
    with np.errstate(divide="ignore", invalid="ignore"):
        dep = np.where(live & (ES > 0), np.maximum(ES2 / (ES * ES) - 1.0, 0.0), traffic.cv2_iterations)
    return (np.where(live, np.maximum(disp, 1.0), 1.0), np.where(live, 1.0 + np.maximum(unequal, 0.0), 1.0), dep)


def _spectral_dispersion(traffic: BatchedTraffic, lam_r, use, fallback) -> np.ndarray:
    """:func:`fleetopt.models.queueing.dispersion.count_dispersion` from :attr:`BatchedTraffic.count_spectra` on
    the pools ``use`` (the rest keep ``fallback``)."""
    idx = np.flatnonzero(use)
    if not idx.size:
        return fallback
    assert traffic.count_spectra is not None     # the caller's condition
    G, R, Wh, Q, P = np.moveaxis(traffic.count_spectra[idx], 1, 0)
    F = count_dispersion(G, R.real, Wh, Q, P.real, lam_r[idx], traffic.W_s, traffic.mean_iterations[idx],
                         traffic.mean_work[idx])
    out = np.array(fallback, dtype=float, copy=True)
    out[idx] = np.where(np.isfinite(F), F, out[idx])
    return out


_RELAX_STEPS = 8
"""Newton steps of :func:`departure_dispersion`'s fixed point (quadratic convergence from :math:`c^2`; the
test checks the residual below 1e-8)."""


def departure_dispersion(cv2, mu, lam, period_s) -> np.ndarray:
    r"""Index of dispersion of a full pool's departures over the time its queue takes to relax (arrays).

    A full pool of :math:`m` batch places releases a request whenever a place's occupant finishes; each place
    is refilled at once and holds its requests for :math:`S'` (mean ``period_s`` :math:`= R = m/\mu`, squared
    coefficient of variation ``cv2`` :math:`= c^2`, :func:`occupancy_dispersion`). Over a window :math:`\tau`
    the count of departures has index :math:`I(\tau)`: 1 for :math:`\tau \ll R` (the places' streams are
    independent and out of phase, so their superposition is locally Poisson) and :math:`c^2` for
    :math:`\tau \gg R` (renewal-reward). The simplest index with those limits and one time scale is that of
    an exponentially decaying correlation,

    .. math:: I(\tau) = c^2 + (1 - c^2)\,\frac{1 - e^{-u}}{u}, \qquad u = \tau / R .

    The window that matters is the one over which the queue beyond the cap forms and drains. As a reflected
    random walk of drift :math:`-(\mu - \lambda)` and variance rate :math:`\sigma^2 = \mu (1 + I)` it relaxes
    in :math:`\tau = \sigma^2 / (\mu - \lambda)^2` [1]_, so :math:`I` is the fixed point of

    .. math:: I = c^2 + (1 - c^2)\,\phi\!\left(\frac{\mu (1 + I)}{(\mu - \lambda)^2 R}\right),
        \qquad \phi(u) = \frac{1 - e^{-u}}{u},

    unique because the right side decreases in :math:`I`; it is found by Newton's method from :math:`c^2`.

    Only work spread over a residence keeps a place's stream off the work clock: the compute of a prompt,
    :math:`E[\ell]`, is done in a lump when its request takes the place, so it is never in progress across a
    window's ends. :func:`operating_point` therefore passes :math:`R\,(1 - E[\ell]/E[S'])` as the time scale.
    Near the stability limit :math:`\tau \gg R` and :math:`I \to c^2`; a pool far from it, with near-equal
    requests (:math:`c^2 \ll 1`), waits on the locally Poisson stream and :math:`I` approaches 1, where
    :math:`c^2` alone gives waits that decay too fast. Where :math:`c^2 \ge 1` the index is kept at :math:`c^2`:
    the superposition argument would lower it, but there a replica's heavy sequences slow all its places
    together. Neither limit is exact; the pools that show it, and the figures behind both choices, are in
    ``docs/models.md``, "A full pool's departures", "Where it errs" and "Measurement history".

    Parameters
    ----------
    cv2, mu, lam, period_s : array_like
        :math:`c^2`, the full pool's departure rate :math:`\mu` and arrival rate :math:`\lambda` (1/s), and
        the time scale :math:`R` of a place's stream (s). Where :math:`\lambda \ge \mu` or :math:`R \le 0` the
        index is :math:`c^2`.

    References
    ----------
    .. [1] J. M. Harrison, *Brownian Motion and Stochastic Flow Systems*, Wiley (1985), ch. 1 (the relaxation
           time :math:`\sigma^2/\delta^2` of a reflected Brownian motion of drift :math:`-\delta`).

    Examples
    --------
    Near-equal residences (:math:`c^2 = 0`) of 10 s at a departure rate of 10/s: at 9.9 arrivals/s the queue
    relaxes slowly and :math:`I \approx 0`; at 5/s it relaxes within a residence and the stream is nearly
    Poisson.

    >>> [round(float(v), 3) for v in departure_dispersion(0.0, 10.0, np.array([9.9, 5.0]), 10.0)]
    [0.01, 0.962]
    """
    c2 = np.asarray(cv2, dtype=float)
    mu, lam, R = np.broadcast_arrays(np.asarray(mu, dtype=float), np.asarray(lam, dtype=float),
                                     np.asarray(period_s, dtype=float))
    out = np.array(np.broadcast_to(c2, mu.shape), dtype=float)
    with np.errstate(invalid="ignore"):
        act = (out < 1.0) & (mu > lam) & (R > 0) & np.isfinite(mu)
    if not act.any():
        return out
    c, k = out[act], mu[act] / ((mu[act] - lam[act]) ** 2 * R[act])   # u = k (1 + I)
    amp = 1.0 - c
    I = c.copy()                 # g(I) = I - c - amp phi(k (1 + I)) is increasing and concave from g(c) <= 0
    for _ in range(_RELAX_STEPS):
        u = np.maximum(k * (1.0 + I), 1e-300)
        em = np.exp(-u)
        small = u < 1e-3
        us = np.where(small, 1.0, u)
        phi = np.where(small, 1.0 - u / 2.0 + u * u / 6.0, -np.expm1(-u) / us)
        dphi = np.where(small, -0.5 + u / 3.0, (em * (1.0 + u) - 1.0) / (us * us))
        g = I - c - amp * phi
        I = np.clip(I - g / (1.0 - amp * dphi * k), c, 1.0)
    out[act] = I
    return out


def _context_nodes(mean, var) -> np.ndarray:
    """Gamma quantiles of the context at :data:`CONTEXT_NODES` levels (Wilson-Hilferty), shape (S, Q).

    The Wilson-Hilferty cube-root normal approximation is accurate for gamma shapes above about 0.3 (a
    context whose standard deviation is below about twice its mean), which the bundled workloads' batches
    satisfy; for far more skewed laws it misplaces the upper tail (6 % off a miss probability at shape 0.008,
    ``tests/test_batched.py``). The exact inverse (``scipy.special.gammaincinv``) costs about a microsecond
    per node, too slow for the sizing loop."""
    q, _ = CONTEXT_NODES
    z = special.ndtri(q)
    mean = np.asarray(mean, dtype=float)[:, None]
    var = np.asarray(var, dtype=float)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        shape = np.where(var > 0, mean * mean / np.where(var > 0, var, 1.0), np.inf)
        v = 1.0 / (9.0 * shape)
        wh = mean * np.maximum(1.0 - v + z * np.sqrt(v), 0.0) ** 3
    return np.where(np.isfinite(shape) & (mean > 0), wh, mean)


_BLOCK = 256
"""Pools per block in :func:`batched_miss_prob`: each block integrates only the chunk counts its pools hold."""


def _blocks(traffic: BatchedTraffic) -> list[tuple[np.ndarray, int, int]]:
    """``(rows, a, b)`` per block of :func:`batched_miss_prob`: up to :data:`_BLOCK` pools of similar chunk-count
    support (sorted by their largest, then smallest, class with mass) and the columns ``a:b`` they hold."""
    probs = traffic.chunk_probs
    S, K = probs.shape
    has = probs > 0
    k_hi = np.where(has.any(axis=1), K - 1 - np.argmax(has[:, ::-1], axis=1), 0)
    k_lo = np.where(has.any(axis=1), np.argmax(has, axis=1), 0)
    order = np.lexsort((k_lo, k_hi))
    return [(rows, int(k_lo[rows].min()), int(k_hi[rows].max()) + 1)
            for rows in (order[lo:lo + _BLOCK] for lo in range(0, S, _BLOCK))]


def _nodes(traffic: BatchedTraffic, op: OperatingPoint) -> tuple:
    """What :func:`batched_miss_prob` needs of the operating point that does not depend on :math:`t`: the
    blocks (:func:`_blocks`), the iteration times at the context nodes (busy, full; and, with prefill compute,
    of each block's own prefill iterations, :func:`own_prefill_context`) and the prefill lumps."""
    blocks = _blocks(traffic)
    own = None
    if traffic.prefill_compute_s is not None and np.any(traffic.prefill_compute_s > 0):
        own = [traffic.W_s + _context_nodes_2d(mean, var) for mean, var in _own_prefill_cells(traffic, op, blocks)]
    return (blocks, traffic.W_s + _context_nodes(op.busy_context_mean, op.busy_context_var),
            traffic.W_s + _context_nodes(op.full_context_mean, op.full_context_var), own, *prefill_lumps(traffic, op))


def batched_miss_prob(t_s, traffic: BatchedTraffic, replicas, op: OperatingPoint | None = None,
                      nodes: tuple | None = None) -> np.ndarray:
    """:math:`P(T > t)` per pool at ``replicas`` (module docstring; 1 where unstable).

    Pools are taken in blocks of similar chunk-count support (sorted by their largest :math:`k`), and each
    block integrates only the columns :math:`k` some pool of it holds: the result is the same as over all
    columns (the others carry probability 0), at a fraction of the work.
    """
    op = operating_point(traffic, replicas) if op is None else op
    probs = traffic.chunk_probs
    S = probs.shape[0]
    t = np.broadcast_to(np.asarray(t_s, dtype=float), (S,))
    chunks = traffic.chunks
    blocks, T_busy, T_full, T_own, lump, lump_share = _nodes(traffic, op) if nodes is None else nodes
    lam_r = traffic.arrival_rate / np.maximum(op.replicas, 1.0)
    join = 1.0 + lam_r * lump               # the mean stretch co-arrivals' chunks give a waited-out residual
    miss = np.zeros(S)
    for n, (rows, a, b) in enumerate(blocks):
        miss[rows] = _miss_block(t[rows], probs[rows, a:b], k=chunks[a:b], own=traffic.own_prefill_s[rows, a:b],
                                 T_busy=T_busy[rows], T_full=T_full[rows], p_idle=op.idle_prob[rows],
                                 p_full=op.full_prob[rows], theta=op.wait_decay[rows], W_s=traffic.W_s,
                                 lump=lump[rows], lump_share=lump_share[rows], join=join[rows], lam_r=lam_r[rows],
                                 T_own=None if T_own is None else T_own[n],
                                 scv=np.broadcast_to(op.wait_scv, S)[rows])
    live = traffic.arrival_rate > 0
    return np.where(live, np.where(op.stable, miss, 1.0), 0.0)


def batched_miss_grid(t_s, traffic: BatchedTraffic, op: OperatingPoint, nodes: tuple) -> np.ndarray:
    """:func:`batched_miss_prob` at ``M`` times per pool in one pass: ``t_s`` of shape (S, M), the result too.

    Each pool's row is repeated once per time and every block keeps its own columns, so element ``[s, j]`` is
    ``batched_miss_prob(t_s[:, j], traffic, op.replicas, op, nodes)[s]`` to the last bit: what a search over
    :math:`t` that evaluates many points at once (:func:`fleetopt.models.numerics.bisect_level`) relies on.
    """
    probs = traffic.chunk_probs
    t = np.asarray(t_s, dtype=float)
    S, M = t.shape
    chunks = traffic.chunks
    blocks, T_busy, T_full, T_own, lump, lump_share = nodes
    lam_r = traffic.arrival_rate / np.maximum(op.replicas, 1.0)
    join = 1.0 + lam_r * lump
    scv = np.broadcast_to(op.wait_scv, S)
    miss = np.zeros((S, M))
    for n, (rows, a, b) in enumerate(blocks):
        local = np.repeat(np.arange(len(rows)), M)
        r = rows[local]
        miss[rows] = _miss_block(t[rows].ravel(), probs[r, a:b], k=chunks[a:b], own=traffic.own_prefill_s[r, a:b],
                                 T_busy=T_busy[r], T_full=T_full[r], p_idle=op.idle_prob[r], p_full=op.full_prob[r],
                                 theta=op.wait_decay[r], W_s=traffic.W_s, lump=lump[r], lump_share=lump_share[r],
                                 join=join[r], lam_r=lam_r[r], T_own=None if T_own is None else T_own[n][local],
                                 scv=scv[r]).reshape(len(rows), M)
    live = (traffic.arrival_rate > 0)[:, None]
    return np.where(live, np.where(op.stable[:, None], miss, 1.0), 0.0)


def batched_miss_function(traffic: BatchedTraffic, replicas):
    r""":math:`t \mapsto P(T > t)` per pool (:func:`batched_miss_prob`) with the operating point and the context
    nodes, which do not depend on :math:`t`, computed once: for a search over :math:`t` (a fleet's P99 mixes its
    pools' miss functions).

    >>> t = BatchedTraffic(np.array([1.0]), np.array([8.0]), np.array([100.0]), np.array([0.0]),
    ...                    np.array([0.2]), np.array([1e-3]), np.array([[0.0, 1.0]]), np.array([[0.0, 0.0]]), 0.01)
    >>> miss = batched_miss_function(t, 1)
    >>> bool(miss(0.5)[0] == batched_miss_prob(0.5, t, 1)[0])
    True
    """
    op = operating_point(traffic, replicas)
    nodes = _nodes(traffic, op)
    return lambda t_s: batched_miss_prob(t_s, traffic, op.replicas, op, nodes)


_MIN_WAIT_SCV = 1e-6
"""The least squared coefficient of variation :func:`waited_exceed_prob` gives the wait: its exponential part then
has a thousandth of the wait's mean (a deterministic wait to that resolution) and a finite rate."""


def _exp_waited(x0, spread, rate):
    """:math:`E_U[P(E > x_0 - U b)]` for :math:`E` exponential of ``rate`` (:func:`waited_exceed_prob`). Where
    :math:`u^* = 0` every :math:`U` leaves a negative argument and the average is 1; elsewhere
    :math:`x_0 - b u^* \\ge 0`, so the exponential cannot overflow."""
    u = np.clip(x0 / spread, 0.0, 1.0)
    tb = rate * spread
    with np.errstate(invalid="ignore", divide="ignore"):
        tail = np.where(u > 0.0, np.exp(-rate * np.maximum(x0 - spread * u, 0.0)) * (-np.expm1(-tb * u)) / tb, 0.0)
    return np.minimum((1.0 - u) + tail, 1.0)


def _wait_phases(theta, scv):
    """Whitt's two-moment wait of mean :math:`1/\\theta` and squared coefficient of variation ``scv``
    (:func:`waited_exceed_prob`): the shift :math:`d` and rate of its shifted exponential (used where
    :math:`s \\le 1`), and the weight :math:`p_1` and rates of its balanced-means hyperexponential (where
    :math:`s > 1`). ``scv`` is floored at :data:`_MIN_WAIT_SCV`."""
    s = np.maximum(np.asarray(scv, dtype=float), _MIN_WAIT_SCV)
    root = np.sqrt(np.minimum(s, 1.0))
    p1 = 0.5 * (1.0 + np.sqrt(np.maximum(s - 1.0, 0.0) / (s + 1.0)))
    return s, (1.0 - root) / theta, theta / root, p1, 2.0 * p1 * theta, 2.0 * (1.0 - p1) * theta


def waited_exceed_prob(t_s, start_s, spread_s, theta, scv=1.0):
    """:math:`P(W + a + U b > t)` for a wait :math:`W` of mean :math:`1/\\theta` and squared coefficient of variation
    :math:`s` (``scv``) and :math:`U \\sim U(0, 1)`, :math:`b > 0` (array-aware): an arrival that finds every batch
    place taken.

    The wait's law is the two-moment fit of Whitt's QNA [1]_: exponential at :math:`s = 1`; a shifted exponential
    :math:`d + E` below (:math:`E` of mean :math:`\\sqrt s/\\theta`, :math:`d = (1 - \\sqrt s)/\\theta`); above, a
    hyperexponential of balanced means, :math:`p_i` and rates :math:`2 p_i \\theta` with
    :math:`p_{1,2} = (1 \\pm \\sqrt{(s - 1)/(s + 1)})/2`. Each exponential part averages over :math:`U` in closed
    form: with :math:`x_0 = t - a` and :math:`u^* = \\mathrm{clip}(x_0 / b, 0, 1)`, averaging
    :math:`P(E > x_0 - U b)` (1 where the argument is negative, :math:`e^{-r x}` above 0):

    .. math::

        (1 - u^*) + \\frac{e^{-r (x_0 - b u^*)} - e^{-r x_0}}{r b}

    (without a wait the same average is :math:`1 - u^*`, the share of :math:`U` whose prefill ends after
    :math:`t`; :func:`_miss_block` writes that one inline).

    References
    ----------
    .. [1] W. Whitt, "The queueing network analyzer", Bell System Technical Journal 62 (1983) 2779-2815 (the
           shifted exponential for :math:`c^2 < 1`, the balanced-means hyperexponential for :math:`c^2 > 1`).

    Examples
    --------
    Half of :math:`U` ends its prefill after :math:`t`; the other half needs an exponential wait of up to 0.5 s:
    :math:`0.5 + (1 - e^{-0.5})/1 = 0.8935`.

    >>> round(float(waited_exceed_prob(1.5, 1.0, 1.0, 1.0)), 4)
    0.8935
    """
    x0 = np.asarray(t_s, dtype=float) - np.asarray(start_s, dtype=float)
    spread = np.asarray(spread_s, dtype=float)
    theta = np.asarray(theta, dtype=float)
    if np.all(np.asarray(scv) == 1.0):
        return _exp_waited(x0, spread, theta)
    s, shift, rate, p1, fast, slow = _wait_phases(theta, scv)
    low = _exp_waited(x0 - shift, spread, rate)                               # s <= 1: d + E
    if np.all(s <= 1.0):
        return low
    high = p1 * _exp_waited(x0, spread, fast) + (1.0 - p1) * _exp_waited(x0, spread, slow)
    return np.where(s > 1.0, high, low)


_FULL_NEGLIGIBLE = 1e-12
"""Pools whose full-state probability is below this skip the wait term: it adds less than this to the miss
probability (which is compared with 0.01)."""


def prefill_lumps(traffic: BatchedTraffic, op: OperatingPoint) -> tuple[np.ndarray, np.ndarray]:
    """The prefill lump :math:`\\ell` an arrival's first, partial iteration may carry, and the share of time
    :math:`f_L` a busy replica spends in such iterations (arrays over pools; 0 without prefill compute).

    A prefill chunk computes its tokens (:math:`a c + b(\\dots)`): with long chunks one chunk adds far more to
    its iteration than all the decodes beside it (about 160 ms for 6,000 prompt tokens of an 8B model on an
    H100, against a few ms), so iterations come in two kinds. An arrival lands in an iteration with
    probability proportional to its *length* (it waits out the residual :math:`U t` of the iteration in
    progress), so it meets the rare long ones far more often than their share of iterations, which the
    gamma law of the other requests' work (matched to the iteration average) cannot show. The model keeps
    that law for the request's own iterations and gives the residual a lump with probability

    .. math::

        f_L = 1 - e^{-\\lambda_r E[k] (W + \\bar C + \\ell)}, \\qquad
        \\ell = \\frac{E[a\\, l_{in} + b\\, l_{in}^2]}{E[k]}, \\quad \\lambda_r = \\lambda / N

    (:math:`\\lambda_r E[k]` chunk iterations a second, each lasting :math:`W + \\bar C + \\ell`; Poisson
    overlap): the residual is :math:`U(W + C)` with probability :math:`1 - f_L` and :math:`U(W + C + \\ell)`
    with :math:`f_L`. Measured against the simulator: ``docs/models.md``, "Prefill lumps".
    """
    S = traffic.arrival_rate.shape
    if traffic.prefill_compute_s is None or not np.any(traffic.prefill_compute_s > 0):
        return np.zeros(S), np.zeros(S)
    probs = traffic.chunk_probs
    mass = np.maximum(probs.sum(axis=1), 1e-300)
    ek = probs @ traffic.chunks / mass
    with np.errstate(divide="ignore", invalid="ignore"):
        ell = np.where(ek > 0, traffic.prefill_compute_s / np.where(ek > 0, ek, 1.0), 0.0)
        lam_r = traffic.arrival_rate / np.maximum(op.replicas, 1.0)
        share = -np.expm1(-lam_r * ek * (traffic.W_s + op.busy_context_mean + ell))
    return np.nan_to_num(ell), np.clip(np.nan_to_num(share), 0.0, 1.0)



def _window_share(k, tau):
    """Variance of the mean over a window of ``k`` steps of a stationary process whose autocorrelation decays as
    :math:`e^{-|s|/\\tau}`, as a share of its variance (``tau`` over pools, ``k`` over classes; shape (S, Q)):

    .. math:: f(k, \\tau) = 2 \\left(\\frac{\\tau}{k}\\right)^2 \\left(\\frac{k}{\\tau} - 1 + e^{-k/\\tau}\\right)

    (the double integral of the autocorrelation over the window, divided by :math:`k^2`): 1 for a window short
    against :math:`\\tau`, :math:`2\\tau/k` for a long one.

    Examples
    --------
    >>> [round(float(v), 4) for v in _window_share(np.array([1e-8, 1.0, 1e4]), np.array([1.0]))[0]]
    [1.0, 0.7358, 0.0002]
    """
    z = np.asarray(k, dtype=float) / np.maximum(np.asarray(tau, dtype=float)[:, None], 1e-300)
    zs = np.maximum(z, 1e-6)
    return np.where(z > 1e-6, 2.0 / (zs * zs) * (zs - 1.0 + np.exp(-zs)), 1.0)


def own_prefill_context(traffic: BatchedTraffic, op: OperatingPoint) -> tuple[np.ndarray, np.ndarray]:
    r"""Mean and variance of the others' work :math:`C` in an arrival's own prefill iterations, per pool and
    prompt class (shape (S, Q) each; ``docs/models.md``, "Concurrent prefill").

    Without prefill compute (the seeds' units) a prefill chunk adds about what a decode step adds, and the
    busy law of :func:`operating_point` (all running sequences alike) is used for every class. With it, the
    others' *prefill* work is a class of its own: a few sequences whose chunks cost far more than a decode
    step, and whose number the arrival meets at its time average, which persists over its prefill.

    **The prefill class as processor sharing.** Every prefilling sequence of a replica advances one chunk per
    iteration, so the prefill work is served like jobs of a processor-sharing queue. With per-chunk work
    :math:`\ell = E[w_p]/E[k]` (:math:`w_p` a request's prefill work, :attr:`BatchedTraffic.own_prefill_s`),
    decode work :math:`C_d` a slow background and the pool's :math:`n_P` prefilling sequences spread over its
    :math:`N` replicas, chunks are served at the rate :math:`n_P / (W + C_d + \ell\, n_P/N)`: a symmetric
    queue whose stationary law is negative binomial (Kelly, ch. 3), whatever the prompt-length law,

    .. math::

        n_P \sim \mathrm{NB}\!\left(r = \frac{N (W + C_d)}{\ell} + 1,\; \rho_p\right), \qquad
        \rho_p = \lambda_r E[w_p], \qquad
        E[n_P] = \frac{r \rho_p}{1 - \rho_p}, \quad \mathrm{Var}[n_P] = \frac{r \rho_p}{(1 - \rho_p)^2},

    with :math:`C_d = \bar C (x - \rho_p)/x` the decode share of the busy mean :math:`\bar C` (:math:`x` the
    context load). A replica holds :math:`p = n_P/N` plus the binomial spread of the split,
    :math:`E[p](1 - 1/N)`, each chunk of work :math:`\ell_i` with :math:`\mathrm{Var}[\ell_i]` over the classes.

    **Persistence over the request's own iterations.** Poisson arrivals see that time average (PASTA). Of the
    chunks in progress, the share :math:`\kappa_k = 1 - 1/(k E[k])` is still there in the arrival's iterations
    (an arrival of one chunk, among others of one chunk, meets none of them again: their chunks end with the
    iteration in progress, whose residual :func:`prefill_lumps` carries). The mean is the busy law's, moved by
    that share toward the prefill class's,

    .. math:: E[C_k] = \bar C + \kappa_k \left(C_d + \ell E[p] - \bar C\right),

    and the variance is the average over the :math:`k` iterations: the pool's count relaxes in
    :math:`\tau = E[k]/(1 - \rho_p)` iterations, the split and the chunk sizes in :math:`E[k]`
    (:func:`_window_share` :math:`f`),

    .. math::

        \mathrm{Var}[C_k] = (1 - \kappa_k) \sigma_C^2 + \kappa_k \left(\sigma_C^2 \left(\frac{x - \rho_p}{x}\right)^2
            + f(k, \tau) \frac{\ell^2 \mathrm{Var}[n_P]}{N^2}
            + f(k, E[k]) \left(\ell^2 E[p] (1 - 1/N) + E[p] \mathrm{Var}[\ell_i]\right)\right).

    Measured against the simulator: ``docs/models.md``, "Concurrent prefill".

    References
    ----------
    .. [1] F. P. Kelly, *Reversibility and Stochastic Networks*, Wiley (1979), ch. 3 (symmetric queues).
    """
    return _own_prefill_cells(traffic, op, [(np.arange(traffic.chunk_probs.shape[0]), 0,
                                             traffic.chunk_probs.shape[1])])[0]


def _own_prefill_cells(traffic: BatchedTraffic, op: OperatingPoint, blocks) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`own_prefill_context` of the cells of each block ``(rows, a, b)`` only (pools ``rows``, classes
    ``a:b``): the per-pool sums over all classes, then each block's cells, element by element (the same values as
    the whole (S, Q) arrays sliced, at the cost of the cells a block holds)."""
    mean0, var0 = op.busy_context_mean, op.busy_context_var
    probs = traffic.chunk_probs
    if traffic.prefill_compute_s is None or not np.any(traffic.prefill_compute_s > 0):
        return [(np.broadcast_to(mean0[rows, None], (len(rows), b - a)),
                 np.broadcast_to(var0[rows, None], (len(rows), b - a))) for rows, a, b in blocks]
    chunks = traffic.chunks
    k = chunks[None, :]
    mass = np.maximum(probs.sum(axis=1), 1e-300)
    ek = probs @ chunks / mass
    wp = np.sum(probs * traffic.own_prefill_s, axis=1) / mass
    with np.errstate(divide="ignore", invalid="ignore"):
        eks = np.where(ek > 0, ek, 1.0)
        ell = wp / eks
        per_chunk = np.where(k > 0, traffic.own_prefill_s / np.maximum(k, 1.0), 0.0)
        ell_var = np.maximum(np.sum(probs * k * per_chunk ** 2, axis=1) / mass / eks - ell * ell, 0.0)
        N = np.maximum(op.replicas, 1.0)
        rho = traffic.arrival_rate / N * wp
        x = op.context_load
        ok = (traffic.prefill_compute_s > 0) & (ek > 0) & (ell > 0) & (rho < 1.0) & (x > 0)
        rho = np.where(ok, rho, 0.5)
        share_d = np.clip((x - rho) / np.where(x > 0, x, 1.0), 0.0, 1.0)
        C_d = mean0 * share_d
        r = N * (traffic.W_s + C_d) / np.where(ell > 0, ell, 1.0) + 1.0
        n_mean = r * rho / (1.0 - rho)
        n_var = n_mean / (1.0 - rho)
        p_mean = n_mean / N
        v_pool = ell * ell * n_var / (N * N)
        v_local = ell * ell * p_mean * (1.0 - 1.0 / N) + p_mean * ell_var
        shift = C_d + ell * p_mean - mean0
        busy_part = var0 * share_d ** 2
        tau_pool = ek / (1.0 - rho)
    out = []
    for rows, a, b in blocks:
        kb = chunks[None, a:b]
        m0, v0, okk = mean0[rows, None], var0[rows, None], ok[rows, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            keep = np.clip(1.0 - 1.0 / np.maximum(kb * ek[rows, None], 1.0), 0.0, 1.0)
            mean = m0 + keep * shift[rows, None]
            var = (1.0 - keep) * v0 + keep * (busy_part[rows, None]
                                              + _window_share(kb, tau_pool[rows]) * v_pool[rows, None]
                                              + _window_share(kb, ek[rows]) * v_local[rows, None])
        out.append((np.where(okk, mean, m0), np.where(okk, var, v0)))
    return out


def _context_nodes_2d(mean, var) -> np.ndarray:
    """:func:`_context_nodes` of (S, Q) moments, shape (S, Q, nodes)."""
    S, Q = mean.shape
    return _context_nodes(mean.ravel(), var.ravel()).reshape(S, Q, -1)


_COARRIVALS = 6
"""Co-arrivals counted one by one in :func:`coarrival_exceed_prob`; more are taken to miss (a bound)."""


def coarrival_exceed_prob(x0, spread, ell, rate):
    """:math:`P(U b + M \\ell > x_0)` with :math:`U \\sim U(0, 1)` and :math:`M \\mid U` Poisson of mean
    :math:`\\lambda U b` (array-aware): an arrival waits out the residual :math:`U b` of the iteration in
    progress, and the :math:`M` requests that arrive meanwhile join its first iteration, each with a prefill
    chunk of :math:`\\ell` seconds (:func:`prefill_lumps`). With :math:`c = \\lambda b` and
    :math:`u_m = \\mathrm{clip}((x_0 - m \\ell)/b, 0, 1)`,

    .. math::

        \\sum_m \\int_{u_m}^1 e^{-cu} \\frac{(cu)^m}{m!} du
        = \\sum_m \\frac{P(m + 1, c) - P(m + 1, c\\, u_m)}{c}

    (:math:`P` the regularised lower incomplete gamma function), for :math:`m` up to :data:`_COARRIVALS`; the
    rest, :math:`1 - \\sum_m P(m + 1, c)/c`, counts as exceeding. Without co-arrivals (:math:`c \\to 0`) it is
    :math:`1 - u_0`.

    Examples
    --------
    No lump: the co-arrivals change nothing, :math:`1 - 0.3 = 0.7`.

    >>> round(float(coarrival_exceed_prob(0.3, 1.0, 0.0, 0.5)), 6)
    0.7
    """
    c0 = np.asarray(rate, dtype=float) * np.asarray(spread, dtype=float)   # without x0's and ell's axes
    small0 = c0 < 1e-9
    cs0 = np.where(small0, 1.0, c0)
    orders = np.arange(1.0, _COARRIVALS + 2.0).reshape((-1,) + (1,) * cs0.ndim)
    wholes0 = special.gammainc(orders, cs0) / cs0                        # P(m + 1, c)/c, m = 0.._COARRIVALS
    rest0 = np.maximum(1.0 - sum(wholes0), 0.0)  # E_U[P(M > _COARRIVALS | U)], taken to exceed: a bound
    x0 = np.asarray(x0, dtype=float)
    shape = np.broadcast_shapes(x0.shape, np.shape(spread), np.shape(ell), c0.shape)
    full = lambda v: v if v.shape == shape else np.broadcast_to(v, shape)  # noqa: E731
    # Every u_m is 0 where x0 <= 0 (the sum is 1) and 1 where x0 >= b + _COARRIVALS ell (only the uncounted rest
    # is left): the integrals are evaluated where neither holds, which in a P99 search is a small share. Each test
    # reads x0 once at its own shape and the other arguments at theirs (they lack x0's axis of classes).
    out = np.where(full(x0 <= 0.0), 1.0, rest0)
    mid = (x0 > 0.0) & (x0 < np.asarray(spread, dtype=float) + _COARRIVALS * np.asarray(ell, dtype=float))
    if np.any(small0):
        out = np.where(small0, 1.0 - np.clip(x0 / np.asarray(spread, dtype=float), 0.0, 1.0), out)
        mid = mid & ~small0
    mid = full(mid)
    if np.any(mid):
        mid = mid.reshape(mid.shape or (1,))     # scalars as one-element arrays
        flat = np.flatnonzero(mid)
        at = np.unravel_index(flat, mid.shape)

        def pick(v):  # v[mid] for v broadcast to x0's shape, read from v's own (smaller) array
            v = np.asarray(v, dtype=float)
            v = v.reshape((1,) * (mid.ndim - v.ndim) + v.shape)
            r = v[tuple(i if n > 1 else 0 for i, n in zip(at, v.shape))]
            return r if np.shape(r) == at[0].shape else np.full(at[0].shape, r)

        xm, bm, lm, cm = pick(x0), pick(spread), pick(ell), pick(c0)
        wm = [pick(w) for w in wholes0]
        acc = pick(rest0)
        for m in range(_COARRIVALS + 1):
            # u_m = 0 adds the whole P(m + 1, c)/c and u_m = 1 adds exactly 0 (the same quotient twice): the
            # incomplete gamma function is evaluated only where 0 < u_m < 1, a small share of the nodes.
            u = np.clip((xm - m * lm) / bm, 0.0, 1.0)
            part = np.flatnonzero((u > 0.0) & (u < 1.0))
            term = np.where(u > 0.0, 0.0, wm[m])
            term[part] = wm[m][part] - special.gammainc(m + 1, cm[part] * u[part]) / cm[part]
            acc += term
        out = out.reshape(mid.shape)     # out is a new array of that size: a view, written through
        out.ravel()[flat] = np.clip(acc, 0.0, 1.0)
        out = out.reshape(shape)
    return out         # in [0, 1]: 1, the rest and 1 - clip(x0/b) are, and the integrals are clipped


def _miss_block(t, probs, *, k, own, T_busy, T_full, p_idle, p_full, theta, W_s: float, lump=None,
                lump_share=None, join=None, lam_r=None, T_own=None, scv=None) -> np.ndarray:
    """:math:`\\sum_k p_k [p_0 P_{idle}(k) + p_b E_C P_{busy}(k, C) + p_f E_C P_{full}(k, C)]` for a block.

    Without a wait (idle and busy states) the average over :math:`U` is the share whose prefill ends after
    :math:`t`, :math:`1 - \\mathrm{clip}((t - a)/b, 0, 1)`; with one, :func:`waited_exceed_prob`.
    """
    _, weights = CONTEXT_NODES
    tt = t[:, None, None]
    T_own = T_busy[:, None, :] if T_own is None else T_own
    start = k[None, :, None] * T_own + own[:, :, None]
    has_lump = lump_share > 0 if lump_share is not None else np.zeros(len(t), dtype=bool)
    lumpy = np.flatnonzero(has_lump)
    every = lumpy.size == len(t)        # the usual case with prefill compute: no rows to gather
    busy = np.empty(probs.shape)
    if not every:                       # the rows without a lump: a plain residual
        plain = np.flatnonzero(~has_lump)
        busy[plain] = (1.0 - np.clip((tt[plain] - start[plain]) / T_busy[plain][:, None, :], 0.0, 1.0)) @ weights
    if lumpy.size:
        assert lump is not None and lump_share is not None and lam_r is not None   # lumpy is empty without them
        # The residual iteration may carry a prefill lump (prefill_lumps), and the requests that arrive during
        # the residual join the first iteration with theirs (coarrival_exceed_prob).
        x0 = tt - start if every else tt[lumpy] - start[lumpy]
        ell, rate = lump[lumpy][:, None, None], lam_r[lumpy][:, None, None]
        T = T_busy[lumpy][:, None, :]
        alone = coarrival_exceed_prob(x0, T, ell, rate) @ weights
        with_lump = coarrival_exceed_prob(x0, T + ell, ell, rate) @ weights
        f = lump_share[lumpy][:, None]
        busy[lumpy] = (1.0 - f) * alone + f * with_lump
    idle = (k[None, :] * W_s + own) > t[:, None]
    p0, pf = p_idle[:, None], p_full[:, None]
    out = np.sum(probs * (p0 * idle + (1.0 - p0 - pf) * busy), axis=1)
    waits = np.flatnonzero(p_full > _FULL_NEGLIGIBLE)
    if waits.size:
        T = T_full[waits][:, None, :]
        g = 1.0 if join is None else join[waits][:, None, None]
        th = theta[waits][:, None, None]
        sw = 1.0 if scv is None else scv[waits][:, None, None]
        full = waited_exceed_prob(tt[waits], k[None, :, None] * T + own[waits][:, :, None], g * T, th, sw) @ weights
        if lumpy.size and lump is not None and lump_share is not None and np.any(lump_share[waits] > 0):
            f = lump_share[waits][:, None]
            full_lump = waited_exceed_prob(tt[waits], k[None, :, None] * T + own[waits][:, :, None],
                                           g * (T + lump[waits][:, None, None]), th, sw) @ weights
            full = (1.0 - f) * full + f * full_lump
        out[waits] += np.sum(probs[waits] * pf[waits] * full, axis=1)
    return out


def batched_ttft_p99_s(traffic: BatchedTraffic, replicas, op: OperatingPoint | None = None,
                       nodes: tuple | None = None) -> np.ndarray:
    """P99 TTFT per pool at ``replicas`` (inf where unstable; 0 without traffic): the root of
    :math:`P(T > t) = q` to float resolution (:func:`fleetopt.models.numerics.bisect_level` over
    :func:`batched_miss_grid`). ``op`` and ``nodes``: the operating point at ``replicas`` and its
    :func:`_nodes`, when the caller has them already."""
    op = operating_point(traffic, replicas) if op is None else op
    probs = traffic.chunk_probs
    k_max = np.max(np.where(probs > 0, traffic.chunks[None, :], 0), axis=1)
    nodes = _nodes(traffic, op) if nodes is None else nodes     # the same at every t of the search
    blocks, T_busy, T_full, T_own, lump, _ = nodes
    T_top = np.maximum(np.nanmax(T_full, axis=1), np.nanmax(T_busy, axis=1))
    if T_own is not None:   # the upper end of the search: the largest own-iteration node
        for (rows, _, _), T in zip(blocks, T_own):
            T_top[rows] = np.maximum(T_top[rows], np.nanmax(T.reshape(len(rows), -1), axis=1))
    own = np.max(np.where(probs > 0, traffic.own_prefill_s, 0.0), axis=1)
    theta = op.wait_decay
    with np.errstate(divide="ignore", invalid="ignore"):   # P(wait > w) <= p_full e^{-r (w - d)} <= q beyond w99
        s, shift, rate, _, _, slow = _wait_phases(np.where(theta > 0, theta, 1.0), op.wait_scv)
        d, r_min = np.where(s > 1.0, 0.0, shift), np.where(s > 1.0, slow, rate)
        w99 = np.where(op.full_prob > P99_TAIL, d + np.log(np.maximum(op.full_prob, P99_TAIL) / P99_TAIL) / r_min, 0.0)
    hi = (k_max + 1) * T_top + own + w99 + lump + 1e-9
    live = op.stable & (traffic.arrival_rate > 0)
    hi = np.where(live, hi, 0.0)                # the others' root is not searched: they are inf or 0
    _, hi = bisect_level(lambda t: batched_miss_grid(t, traffic, op, nodes), P99_TAIL, np.zeros_like(hi), hi)
    return np.where(traffic.arrival_rate > 0, np.where(op.stable, hi, np.inf), 0.0)


def prefill_limit_s(traffic: BatchedTraffic) -> np.ndarray:
    """Prefill time of each prompt class on an idle replica, :math:`k W + \\omega`, shape (S, Q).

    The limit of TTFT as the replica count grows: requests whose prefill alone exceeds the SLO here
    miss it at any count.
    """
    return traffic.chunks[None, :] * traffic.W_s + traffic.own_prefill_s


def mean_prefill_s(traffic: BatchedTraffic, op: OperatingPoint) -> np.ndarray:
    """Mean time from joining a batch to the first token, :math:`E[(k + U)(W + C)] + E[\\omega_k]`."""
    probs = traffic.chunk_probs
    mass = np.maximum(probs.sum(axis=1), 1e-300)
    ek = probs @ traffic.chunks / mass
    own = np.sum(probs * traffic.own_prefill_s, axis=1) / mass
    busy = (ek + 0.5) * (traffic.W_s + op.busy_context_mean)
    full = (ek + 0.5) * (traffic.W_s + op.full_context_mean)
    p_busy = 1.0 - op.idle_prob - op.full_prob
    return op.idle_prob * ek * traffic.W_s + p_busy * busy + op.full_prob * full + own


_EXACT_BELOW = 50.0
"""Mean batches below this get the Poisson sum term by term; above it the normal limit of the Poisson law."""
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(24)
_GH_W = _GH_W / _GH_W.sum()


def mean_power_w(power_w, op: OperatingPoint, cap) -> np.ndarray:
    """A replica's mean power :math:`E[P(\\min(b, n))]` with the batch :math:`b` Poisson of mean :math:`\\bar b`
    (``power_w`` maps batch sizes to watts; arrays over pools).

    .. math:: E[P] = \\sum_{j < n} \\frac{\\bar b^j e^{-\\bar b}}{j!} P(j) + P(b \\ge n)\\, P(n)

    summed term by term for :math:`\\bar b <` :data:`_EXACT_BELOW` (the terms beyond :math:`j = 3 \\cdot 50`
    are below :math:`10^{-20}`); above it the Poisson law is within :math:`O(\\bar b^{-1/2})` of the normal
    :math:`N(\\bar b, \\bar b)`, integrated by 24-point Gauss-Hermite quadrature with :math:`b` clipped to
    :math:`[0, n]` (the power curve is smooth there).
    """
    m = np.asarray(op.mean_batch, dtype=float)
    n = np.broadcast_to(np.asarray(cap, dtype=float), m.shape)
    m = np.where(np.isfinite(m), m, n)
    out = np.empty(m.shape)
    small = m < _EXACT_BELOW
    if np.any(small):
        ms, ns = m[small][:, None], n[small]
        b = np.arange(int(3 * _EXACT_BELOW) + 1, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            pmf = np.exp(special.xlogy(b[None, :], ms) - ms - special.gammaln(b + 1.0)[None, :])
        pmf = np.where(b[None, :] < ns[:, None], pmf, 0.0)
        rest = np.maximum(1.0 - pmf.sum(axis=1), 0.0)
        # row by row (a sum along each row, not a matrix product: BLAS sums a row in an order that depends on how
        # many rows it is given), so a pool's power is the same whichever pools are evaluated with it
        out[small] = np.sum(pmf * np.asarray(power_w(b), dtype=float), axis=1) + rest * np.asarray(power_w(ns),
                                                                                                   dtype=float)
    if np.any(~small):
        ml, nl = m[~small][:, None], n[~small][:, None]
        b = np.clip(ml + np.sqrt(ml) * _GH_X[None, :], 0.0, nl)
        out[~small] = np.sum(np.asarray(power_w(b), dtype=float) * _GH_W, axis=1)
    return out


def mean_activity_power_w(power, traffic: BatchedTraffic, op: OperatingPoint) -> np.ndarray:
    """A replica's mean power under an activity power model (:class:`fleetopt.models.power.ActivityPower`).

    Energy per second is linear in the time a replica spends on each component: of the busy share :math:`f_b`
    (:attr:`OperatingPoint.busy_fraction`), the work :math:`\\lambda_r E[Y]` (s/s) splits into KV scan
    :math:`\\lambda_r E[hX]` and compute, and the rest is weight streaming, so without the board limit

    .. math::

        \\bar P = P_{idle} (1 - f_b) + p_w (f_b - \\lambda_r E[Y]) + p_{kv} \\lambda_r E[hX]
                  + p_c \\lambda_r (E[Y] - E[hX])

    exactly in the work rates. The limit caps each iteration, and prefill chunks make iterations of two kinds
    (:func:`prefill_lumps`): the chunk iterations, :math:`\\lambda_r E[k]` a second, carry all the prefill
    compute :math:`\\Pi = \\lambda_r E[a l_{in} + b l_{in}^2]`, their weight streaming :math:`\\lambda_r E[k] W`
    and their time's share :math:`T_L / f_b` of the decode work :math:`D` (KV scan and per-sequence compute),
    so they take

    .. math:: T_L = \\frac{\\lambda_r E[k] W + \\Pi}{1 - D / f_b}

    of each second; the limit caps the mean of the chunk iterations and of the others separately. Without
    prefill compute :math:`T_L = 0` and the limit caps the busy time's mean (the simulator caps the mean
    between events: :mod:`fleetopt.solvers.des.engine`, "Power").
    """
    lam_r = traffic.arrival_rate / np.maximum(op.replicas, 1.0)
    work = lam_r * traffic.mean_work
    kv = lam_r * (traffic.mean_work if traffic.mean_kv_work is None else traffic.mean_kv_work)
    assert op.busy_fraction is not None, "mean_activity_power_w needs an operating point with busy_fraction"
    fb = np.clip(op.busy_fraction, 0.0, 1.0)
    pf = lam_r * traffic.prompt_compute_s
    decode_compute = np.maximum(work - kv - pf, 0.0)
    probs = traffic.chunk_probs
    ek = probs @ traffic.chunks / np.maximum(probs.sum(axis=1), 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(fb > 0, (kv + decode_compute) / np.where(fb > 0, fb, 1.0), 0.0)
        t_lump = np.where(pf > 0, (lam_r * ek * traffic.W_s + pf) / np.maximum(1.0 - share, 1e-12), 0.0)
        t_lump = np.minimum(t_lump, fb)
        frac = np.where(fb > 0, t_lump / np.where(fb > 0, fb, 1.0), 0.0)

    def capped(time, weights, kv_s, compute_s):
        energy = power.weights_w * np.maximum(weights, 0.0) + power.kv_w * kv_s + power.compute_w * compute_s
        return np.minimum(energy, power.limit_w * time)

    lump = capped(t_lump, np.minimum(lam_r * ek * traffic.W_s, t_lump), kv * frac, pf + decode_compute * frac)
    rest_time = fb - t_lump
    rest = capped(rest_time, rest_time - (kv + decode_compute) * (1.0 - frac), kv * (1.0 - frac),
                  decode_compute * (1.0 - frac))
    return power.idle_w * (1.0 - fb) + lump + rest


def _probe(traffic: BatchedTraffic, N, slo_s, rho_max: float) -> tuple[np.ndarray, np.ndarray]:
    """Whether :math:`N` replicas are stable, within :math:`\\rho_f \\le \\rho_{max}` and meet the P99 target, and the
    miss probability :math:`P(T > t_{SLO} \\mid N)` that decided it (1 where unstable; no check of idle pools, empty
    batches or the prefill limit: :func:`batched_carries` adds them)."""
    op = operating_point(traffic, N)
    miss = batched_miss_prob(slo_s, traffic, N, op)
    return op.stable & (op.full_load <= rho_max * (1 + 1e-12)) & (miss <= P99_TAIL * (1 + 1e-12)), miss


def _meets(traffic: BatchedTraffic, N, slo_s, rho_max: float) -> np.ndarray:
    """:math:`N` replicas are stable, within :math:`\\rho_f \\le \\rho_{max}` and meet the P99 target
    (:func:`_probe`)."""
    return _probe(traffic, N, slo_s, rho_max)[0]


def batched_carries(traffic: BatchedTraffic, replicas, slo_s, rho_max: float = 0.85) -> np.ndarray:
    """Whether ``replicas`` replicas carry each pool's traffic: the test :func:`batched_min_replicas` searches with,
    at one count (True exactly where the least count is at most ``replicas``; a pool without traffic is carried).
    """
    lam = traffic.arrival_rate
    N = np.broadcast_to(np.asarray(replicas, dtype=float), lam.shape)
    slo = np.broadcast_to(np.asarray(slo_s, dtype=float), lam.shape)
    idle = lam <= 0
    limit = np.sum(np.where(prefill_limit_s(traffic) > slo[:, None], traffic.chunk_probs, 0.0), axis=1)
    active = ~idle & (traffic.cap >= 1) & (limit < P99_TAIL) & (N >= 1)
    out = idle.copy()
    idx = np.flatnonzero(active)
    if idx.size:
        out[idx] = _meets(traffic.take(idx), N[idx], slo[idx], rho_max)
    return out


_EXTRAPOLATE_MAX = 8.0
"""Most a probe beyond every count tried may multiply the last failing count by (:func:`_next_count`)."""
_PRIOR_SLOPE = 5.0
"""The fall of :math:`\\log P(T > t_{SLO})` per unit of :math:`\\log N` assumed from a single failing count (the
sizing of the shipped instances' candidates falls by 2 to 10 near their least counts; :func:`_next_count`)."""


def _next_count(lo, hi, n1, g1, n2, g2, w1, w3, step, hinted) -> tuple[np.ndarray, np.ndarray]:
    r"""The next count to probe in :func:`batched_min_replicas`' search, per pool: ``lo`` fails and ``hi`` passes
    (inf before any count passed); the last probe was ``n1``, the one before ``n2`` (0: none), with
    :math:`g = \log(P(T > t_{SLO}) / q)` at each; the bracket was ``w1`` wide after the last probe and ``w3`` two
    probes earlier (inf: not known). Also returns where the search has stalled (it bisects there, and the caller
    forgets the widths).

    The miss probability falls with :math:`N` roughly as a power, so :math:`g` is extrapolated linearly in
    :math:`\log N` through the last two probes (the secant method; from one probe, at the slope
    :data:`_PRIOR_SLOPE`), to the count where it crosses 0, kept strictly inside the bracket and beyond a failing
    count by at most :data:`_EXTRAPOLATE_MAX` times. Where the estimate is unusable the search doubles (from a
    caller's count, ``hinted``: adds ``step``), and within a bracket that two probes did not halve it bisects.
    Every probe lies strictly inside the bracket, so the search ends at the least passing count, whatever the
    estimates (the tests check it against enumeration).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        x1, x2 = np.log(np.maximum(n1, 1.0)), np.log(np.maximum(n2, 1.0))
        slope = np.where(n2 >= 1, (g1 - g2) / (x1 - x2), -_PRIOR_SLOPE)
        est = np.exp(x1 - g1 / slope)
        steer = np.isfinite(est) & np.isfinite(g1) & (slope < 0)
        est = np.ceil(est * (1 - 1e-12))
        floor = np.maximum(lo, 1.0)
        grow = np.where(hinted, lo + step, floor * 2)
        beyond = np.where(steer, np.clip(est, lo + 1, floor * _EXTRAPOLATE_MAX), grow)
        stalled = (w1 > w3 / 2) & (hi - lo > 2)
        inside = np.where(steer & ~stalled, est, np.floor((lo + hi) / 2))
        out = np.where(np.isfinite(hi), np.clip(inside, lo + 1, hi - 1), np.minimum(beyond, _MAX_REPLICAS))
    return np.maximum(out, 1.0), stalled & np.isfinite(hi)


def batched_utilization_floor(traffic: BatchedTraffic, rho_max: float = 0.85, min_count: int = 1) -> np.ndarray:
    """The utilisation floor :math:`N_0 = \\max(\\lceil \\lambda (E[Y] + E[I] W / n) / \\rho_{max} \\rceil, N_{min})`
    per pool (a pool without slots counts one per replica): the count :func:`batched_min_replicas` searches from,
    so a lower bound on every count it returns (``tests/test_bounded_sizing.py`` checks both).
    """
    lam = traffic.arrival_rate
    cap = np.where(traffic.cap < 1, 1.0, traffic.cap)
    with np.errstate(invalid="ignore"):
        N0 = np.ceil((lam * traffic.mean_work + lam * traffic.mean_iterations * traffic.W_s / cap)
                     / rho_max * (1 - 1e-12))
    return np.maximum(np.nan_to_num(N0, nan=1.0), min_count)


def batched_min_replicas(traffic: BatchedTraffic, slo_s, rho_max: float = 0.85, min_count: int = 1,
                         at_least=None) -> Sizing:
    """Smallest replica count meeting the P99-TTFT SLO with the full-batch load :math:`\\rho_f \\le \\rho_{max}`.

    .. math::

        N^* = \\min\\{N \\ge N_0 : P(T > T_{SLO} \\mid N) \\le q\\}, \\qquad
        N_0 = \\left\\lceil \\frac{\\lambda (E[Y] + E[I] W / n)}{\\rho_{max}} \\right\\rceil

    The utilisation cap ``max_utilization`` is a capacity headroom: it bounds :math:`\\rho_f = x + \\lambda E[I] W
    / (N n)`, the offered load over what the pool completes with every batch place taken (the slot models'
    utilisation is the same ratio, a slot charged a full batch's iteration time), so :math:`N_0` is closed-form.
    It does not bound the realised share of batch places in use (``OperatingPoint.utilization``), which is
    lower: a pool at :math:`\\rho_f` near 1 alternates between long congested episodes and quiet ones that a
    mean occupancy hides (``docs/models.md``, "Where it errs"). The miss probability falls with :math:`N`; the
    search, vectorised over pools, brackets :math:`N^*` between a failing and a passing count, each probe placed by
    the miss probabilities seen (:func:`_next_count`), and ends when the two are adjacent: the least passing count,
    as doubling then bisecting finds it, with fewer evaluations (280,000 -> 197,000 pool-counts on the large
    instance). Pools whose idle-replica prefill alone misses the SLO
    for more than 1 % of requests are infeasible (reason ``prefill``); a pool without traffic needs
    ``min_count``.

    ``at_least`` (optional, per pool): a count the caller knows every smaller count fails (the answer at a looser
    SLO: :math:`P(T > t \\mid N)` grows as :math:`t` falls); the search starts there instead of at :math:`N_0`
    and, where the miss probabilities give no estimate, steps up by 1, 2, 4, ... (such a count is usually close)
    instead of doubling. The answer is the same, with fewer evaluations.

    (Tried and dropped, on the large instance's sizing: clearing the first counts by a bound with every context
    node at the top one cost as much as the exact miss probability and cleared only a third to a half of the pools
    that pass; and blocks that end where a pool would pad them by more than a few hundred cells (the later probes
    hold few pools of very different supports) saved less than the machine's noise.)
    """
    if not 0.0 < rho_max <= 1.0:
        raise ValueError(f"rho_max must lie in (0, 1]; got {rho_max}")
    lam = traffic.arrival_rate
    slo = np.broadcast_to(np.asarray(slo_s, dtype=float), lam.shape)
    idle = lam <= 0
    no_slots = traffic.cap < 1
    cap = np.where(no_slots, 1.0, traffic.cap)
    N0 = N_rho = batched_utilization_floor(traffic, rho_max, min_count)
    if at_least is not None:
        N0 = np.maximum(N0, np.minimum(np.asarray(at_least, dtype=float), _MAX_REPLICAS))
    limit = np.sum(np.where(prefill_limit_s(traffic) > slo[:, None], traffic.chunk_probs, 0.0), axis=1)
    limit_ok = limit < P99_TAIL
    active = ~idle & ~no_slots & limit_ok
    safe = replace(traffic, arrival_rate=lam, cap=cap)

    def probe(N, idx):
        return _probe(safe.take(idx), N, slo[idx], rho_max)

    # Bracket the least count between one that fails (lo) and one that passes (hi), steering each probe by the miss
    # probabilities seen (_next_count); the answer is the least passing count, as a plain gallop and bisection finds.
    hinted = N0 > N_rho
    lo, hi = N0 - 1, np.full_like(N0, np.inf)
    n1, g1, n2, g2 = np.zeros_like(N0), np.full_like(N0, np.nan), np.zeros_like(N0), np.full_like(N0, np.nan)
    w1, w2, w3 = (np.full_like(N0, np.inf) for _ in range(3))
    step = np.ones_like(N0)
    nxt = N0.copy()
    todo = np.flatnonzero(active)
    log_q = np.log(P99_TAIL * (1 + 1e-12))
    while todo.size:
        good, miss = probe(nxt[todo], todo)
        with np.errstate(divide="ignore"):
            g = np.log(np.maximum(miss, 0.0)) - log_q          # > 0 fails, <= 0 passes (unless unstable)
        hi[todo[good]] = nxt[todo[good]]
        lo[todo[~good]] = nxt[todo[~good]]
        n2[todo], g2[todo], n1[todo], g1[todo] = n1[todo], g1[todo], nxt[todo], g
        w3[todo], w2[todo], w1[todo] = w2[todo], w1[todo], hi[todo] - lo[todo]
        todo = todo[(hi[todo] - lo[todo] > 1) & (lo[todo] < _MAX_REPLICAS)]
        nxt[todo], stalled = _next_count(lo[todo], hi[todo], n1[todo], g1[todo], n2[todo], g2[todo], w1[todo],
                                         w3[todo], step[todo], hinted[todo])
        w1[todo[stalled]] = w2[todo[stalled]] = w3[todo[stalled]] = np.inf
        step[todo] *= 2
    capped = active & ~np.isfinite(hi)
    feasible = (active & ~capped) | idle
    replicas = np.where(idle, min_count, np.where(feasible, hi, 0)).astype(np.int64)
    reason = np.where(feasible, "", np.where(no_slots, "no-slots", np.where(~limit_ok, "prefill", "cap")))
    bound = feasible & ~idle & (replicas == N_rho)
    return Sizing(replicas, feasible, reason, bound)
