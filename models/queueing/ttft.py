r"""TTFT models: one object per ``slo.ttft_model`` answering every question sizing and evaluation ask of it.

A TTFT model (:class:`TTFTModel`) turns a pool's traffic and replica count into its time to first token: the
least count meeting a P99 target (:meth:`~TTFTModel.min_replicas`), the miss probability :math:`P(T > t)`
(:meth:`~TTFTModel.miss_probability`), the P99 (:meth:`~TTFTModel.p99_ttft_s`) and what prefill alone costs
at any count (:meth:`~TTFTModel.prefill_floor_s`), plus the offered load and power of a sized candidate.
Each implementation reads its own view of a pool's traffic (:meth:`~TTFTModel.traffic`): the slot models a
:class:`SlotTraffic`, the batched model a :class:`fleetopt.models.queueing.batched.BatchedTraffic`. Arrays run over
pools (candidates); ``replicas`` broadcasts over them.

:data:`TTFT_MODELS` maps the instance's ``slo.ttft_model`` to its implementation (:func:`ttft_model`); a new
station type (a prefill pool, a decode pool) is one more implementation and one more entry, and callers ask
the object rather than compare names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Protocol, runtime_checkable

import numpy as np

from fleetopt.models.queueing.batched import (BatchedTraffic, batched_carries, batched_min_replicas,
                                              batched_utilization_floor, batched_miss_function, batched_miss_prob,
                                              batched_ttft_p99_s,
                                              mean_activity_power_w, mean_power_w, operating_point, prefill_limit_s)
from fleetopt.models.power import ActivityPower
from fleetopt.models.queueing.erlang import (Sizing, min_replicas, prefill_p99_s, ttft_miss_prob, ttft_p99_s,
                                             utilization_floor)
from fleetopt.models.service import decode_power_curve
from fleetopt.models.units import MS_PER_S

__all__ = ["TTFTModel", "SlotTraffic", "SlotModel", "TailModel", "MeanPrefillModel", "BatchedModel", "TTFT_MODELS",
           "ttft_model"]


@runtime_checkable
class TTFTModel(Protocol):
    """What sizing and evaluation ask of a TTFT model (module docstring)."""

    name: str
    """The ``slo.ttft_model`` value it implements."""
    warm_start: bool
    """:meth:`min_replicas` honours ``at_least`` (a search started at a known lower bound), which
    :class:`fleetopt.optimizer.plan.candidates.SizingCache` and a tightening frontier rely on."""
    @property
    def split_point_model(self) -> str:
        """The slot model (:data:`fleetopt.models.queueing.erlang.TTFT_MODELS`) whose Erlang-C operating points,
        linear in the routed rates, stand in for this model in the split-routing MIP."""
        ...

    simulation_note: str
    """A line for a simulation report where the model's P99 is not the simulated quantity ('' if it is)."""

    def traffic(self, stats, arrival_rate, cap=None) -> SlotTraffic | BatchedTraffic:
        """The model's view of pools with segment statistics ``stats`` and arrival rates ``arrival_rate``
        (req/s); ``cap``: batch cap per replica (default ``stats.n_slots``)."""
        ...

    def min_replicas(self, traffic, slo_s, rho_max: float, at_least=None) -> Sizing:
        """Least replica counts meeting the P99 target ``slo_s`` under the utilisation cap ``rho_max`` (a pool
        without traffic needs one)."""
        ...

    def count_floor(self, traffic, rho_max: float) -> np.ndarray:
        """The utilisation floor of each pool: the count :meth:`min_replicas` searches from, so a lower bound on
        its least count (a pool without traffic: one). Closed-form: no miss probability is evaluated."""
        ...

    def carries(self, traffic, replicas, slo_s, rho_max: float) -> np.ndarray:
        """Whether ``replicas`` replicas carry each pool's traffic: True exactly where the least count of
        :meth:`min_replicas` is at most ``replicas`` (one evaluation per pool instead of a search)."""
        ...

    def miss_probability(self, t_s, traffic, replicas) -> np.ndarray:
        """:math:`P(T > t)` per pool at ``replicas`` (1 where unstable, 0 without traffic)."""
        ...

    def miss_function(self, traffic, replicas) -> Callable[[float], np.ndarray]:
        """:math:`t \\mapsto P(T > t)` per pool at ``replicas``, for a search over :math:`t`."""
        ...

    def p99_ttft_s(self, traffic, replicas) -> np.ndarray:
        """P99 TTFT per pool at ``replicas`` (s; inf where unstable)."""
        ...

    def prefill_miss_share(self, traffic, slo_s) -> np.ndarray:
        """Share of each pool's requests that miss ``slo_s`` at any replica count (prefill alone)."""
        ...

    def prefill_floor_s(self, traffic) -> np.ndarray:
        """The prefill figure the model's P99 never goes below, per pool (s)."""
        ...

    def drop_reason(self, floor_s: float, target: str) -> str:
        """Why a candidate whose :meth:`prefill_floor_s` is ``floor_s`` is dropped (``target``: the SLO in
        words)."""
        ...

    def pool_miss_reason(self, floor_s: float, slo_s: float) -> str:
        """Why a pool whose :meth:`prefill_floor_s` is ``floor_s`` misses ``slo_s`` ('' if prefill does not
        explain it)."""
        ...

    def load_erlangs(self, traffic, replicas) -> np.ndarray:
        """Offered load per pool at ``replicas`` (busy batch places on average)."""
        ...

    def power_w(self, profile, traffic, replicas) -> np.ndarray:
        """Power per pool of ``replicas`` replicas of ``profile`` carrying the traffic (W)."""
        ...


@dataclass(frozen=True, eq=False)
class SlotTraffic:
    """What the slot models read of pools' traffic (arrays over pools; the fields of
    :class:`fleetopt.models.segments.SegmentStats` they use, as they are)."""

    arrival_rate: np.ndarray
    mean_service_s: np.ndarray
    cv2_service: np.ndarray
    n_slots: np.ndarray
    """KV slots (batch cap) per replica."""
    prefill_times_s: np.ndarray
    """Prefill atoms :math:`\\tau_k` (s), shared by every pool."""
    prefill_probs: np.ndarray
    mean_prefill_s: np.ndarray
    hi_tokens: np.ndarray
    """Context window (tokens): decode power is priced at half of it."""

    @staticmethod
    def from_stats(stats, arrival_rate, cap=None) -> SlotTraffic:
        lam = np.atleast_1d(np.asarray(arrival_rate, dtype=float))
        n = stats.n_slots if cap is None else np.broadcast_to(np.asarray(cap, dtype=float), lam.shape)
        return SlotTraffic(lam, stats.mean_service_s, stats.cv2_service, n, stats.prefill_times_s,
                           stats.prefill_probs, stats.mean_prefill_s, stats.hi_tokens)

    def take(self, idx) -> SlotTraffic:
        """The pools at ``idx`` (the prefill atoms are shared)."""
        return replace(self, **{f.name: np.asarray(getattr(self, f.name))[idx] for f in fields(self)
                                if f.name != "prefill_times_s"})

    def queue(self, replicas) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                       np.ndarray]:
        """The arguments of :func:`fleetopt.models.queueing.erlang.ttft_miss_prob` after ``t`` at ``replicas``."""
        lam = self.arrival_rate
        return (np.asarray(replicas) * self.n_slots, lam, np.where(lam > 0, self.mean_service_s, 1.0),
                self.cv2_service, self.prefill_times_s, self.prefill_probs, self.mean_prefill_s)


class SlotModel:
    r"""The seeds' slot model: each KV slot is a server of an M/G/c queue (:mod:`fleetopt.models.queueing.erlang`).

    A pool of :math:`N` replicas of :math:`n` slots has :math:`c = Nn` servers, offered load
    :math:`a = \lambda E[S]` and utilisation :math:`\rho = a / c`; the wait has the atom :math:`1 - C` at zero
    (:math:`C = C(c, a)`, Erlang-C [1]_) and the exponential tail :math:`P(W_q > x) = C e^{-\theta x}`,
    :math:`\theta = 2(c\mu - \lambda)/(1 + c_s^2)` (Kimura's M/G/c approximation [2]_). Time to first token is
    wait plus prefill; the subclasses differ in how the prefill enters.

    References
    ----------
    .. [1] A. K. Erlang; L. Kleinrock, *Queueing Systems Vol. 1*, Wiley 1975, Ch. 3.
    .. [2] T. Kimura, "Approximations for multi-server queues: system interpolations",
           Queueing Systems 17 (1994) 347-382.
    """

    name = ""
    warm_start = False
    simulation_note = ""

    @property
    def split_point_model(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def traffic(self, stats, arrival_rate, cap=None) -> SlotTraffic:
        return SlotTraffic.from_stats(stats, arrival_rate, cap)

    def min_replicas(self, traffic: SlotTraffic, slo_s, rho_max: float, at_least=None) -> Sizing:
        r""":math:`N^* = \min\{N \ge N_\rho : T_{99}(N) \le T_{SLO}\}`,
        :math:`N_\rho = \lceil \lambda E[S] / (n \rho_{max}) \rceil`
        (:func:`fleetopt.models.queueing.erlang.min_replicas`)."""
        if at_least is not None:
            raise ValueError(f"the {self.name!r} model sizes from the utilisation floor only (no at_least)")
        t = traffic
        return min_replicas(t.arrival_rate, t.mean_service_s, t.cv2_service, t.n_slots, slo_s, t.prefill_times_s,
                            t.prefill_probs, t.mean_prefill_s, rho_max, self.name)

    def count_floor(self, traffic: SlotTraffic, rho_max: float) -> np.ndarray:
        """:math:`N_\\rho` (:func:`fleetopt.models.queueing.erlang.utilization_floor`)."""
        return utilization_floor(traffic.arrival_rate, traffic.mean_service_s, traffic.n_slots, rho_max)

    def carries(self, traffic: SlotTraffic, replicas, slo_s, rho_max: float) -> np.ndarray:
        z = self.min_replicas(traffic, slo_s, rho_max)
        return z.feasible & (z.replicas <= np.asarray(replicas))

    def miss_probability(self, t_s, traffic: SlotTraffic, replicas) -> np.ndarray:
        return ttft_miss_prob(t_s, *traffic.queue(replicas), self.name)

    def miss_function(self, traffic: SlotTraffic, replicas) -> Callable[[float], np.ndarray]:
        queue = traffic.queue(replicas)
        return lambda t_s: ttft_miss_prob(t_s, *queue, self.name)

    def p99_ttft_s(self, traffic: SlotTraffic, replicas) -> np.ndarray:
        return np.atleast_1d(ttft_p99_s(*traffic.queue(replicas), model=self.name))

    def load_erlangs(self, traffic: SlotTraffic, replicas) -> np.ndarray:
        """:math:`\\lambda E[S]`, whatever the count."""
        return traffic.arrival_rate * np.nan_to_num(traffic.mean_service_s)

    def power_w(self, profile, traffic: SlotTraffic, replicas) -> np.ndarray:
        """:math:`N P(\\min(\\lambda E[S] / N, n))` on the profile's decode curve at half the window."""
        n = np.asarray(replicas)
        batch = self.load_erlangs(traffic, n) / n
        return n * decode_power_curve(profile, traffic.hi_tokens / 2).power_w(np.minimum(batch, traffic.n_slots))

    # How the prefill enters: each subclass's own (TailModel, MeanPrefillModel).
    def prefill_miss_share(self, traffic: SlotTraffic, slo_s) -> np.ndarray:
        raise NotImplementedError

    def prefill_floor_s(self, traffic: SlotTraffic) -> np.ndarray:
        raise NotImplementedError

    def drop_reason(self, floor_s: float, target: str) -> str:
        raise NotImplementedError

    def pool_miss_reason(self, floor_s: float, slo_s: float) -> str:
        raise NotImplementedError


class TailModel(SlotModel):
    r"""``tail``: the true 99th percentile of :math:`W_q + T_{pf}` with the pool's own prefill distribution
    (atoms :math:`p_k` at :math:`\tau_k`),

    .. math::

        P(T > t) = \sum_k p_k \left[ \tau_k > t \; ? \; 1 : \min(1, C e^{-\theta (t - \tau_k)}) \right]

    (:func:`fleetopt.models.queueing.erlang.ttft_exceed_prob`; closed forms in ``tests/test_formulas.py``). As
    :math:`N \to \infty`, :math:`C \to 0` and only the requests with :math:`\tau_k \ge T_{SLO}` miss; the P99
    never goes below the P99 prefill.
    """

    name = "tail"

    def prefill_miss_share(self, traffic: SlotTraffic, slo_s) -> np.ndarray:
        return np.sum(np.where(traffic.prefill_times_s[None, :] >= slo_s, traffic.prefill_probs, 0.0), axis=1)

    def prefill_floor_s(self, traffic: SlotTraffic) -> np.ndarray:
        probs = np.atleast_2d(traffic.prefill_probs)
        return np.array([prefill_p99_s(traffic.prefill_times_s, p) for p in probs])

    def drop_reason(self, floor_s: float, target: str) -> str:
        return f"P99 prefill alone is {floor_s * MS_PER_S:,.0f} ms, above {target}, at any replica count"

    def pool_miss_reason(self, floor_s: float, slo_s: float) -> str:
        return _longest_prompts(floor_s, slo_s)


class MeanPrefillModel(SlotModel):
    r"""``mean-prefill``, the seeds' convention: :math:`T_{99} = W_{99} + E[T_{pf}]`, with
    :math:`W_{99} = \ln(C/q)/\theta` for :math:`C > q` and 0 otherwise (:math:`q = 0.01`,
    :func:`fleetopt.models.queueing.erlang.wait_p99_from_tail_s`). Read as a distribution,
    :math:`P(T > t) = P(W_q > t - E[T_{pf}])`, so that its 99th percentile is exactly that sum. It understates
    the P99 of pools whose long prompts dominate it (the simulated P99 is the true one).
    """

    name = "mean-prefill"
    simulation_note = ("analytic P99 TTFT uses the 'mean-prefill' model (P99 wait + mean prefill); the simulated "
                       "one is the true P99 of wait + prefill")

    def prefill_miss_share(self, traffic: SlotTraffic, slo_s) -> np.ndarray:
        return np.where(np.nan_to_num(traffic.mean_prefill_s) < slo_s, 0.0, 1.0)

    def prefill_floor_s(self, traffic: SlotTraffic) -> np.ndarray:
        return np.nan_to_num(np.asarray(traffic.mean_prefill_s, dtype=float))

    def drop_reason(self, floor_s: float, target: str) -> str:
        return f"mean prefill {floor_s * MS_PER_S:,.0f} ms alone exceeds {target}"

    def pool_miss_reason(self, floor_s: float, slo_s: float) -> str:
        if floor_s < slo_s:
            return ""
        return f"mean prefill {floor_s * MS_PER_S:,.0f} ms alone exceeds the SLO {slo_s * MS_PER_S:,.0f} ms"


class BatchedModel:
    r"""``batched`` (the default): continuous-batching replicas at their realised occupancy
    (:mod:`fleetopt.models.queueing.batched`, whose docstring derives it; ``docs/models.md``, "The batched replica
    model").

    A request waits for a batch place only when every one of the pool's :math:`Nn` places is taken, then runs
    its :math:`k` prefill iterations among the other sequences,
    :math:`T = W_q + (k + U)(W + C) + \omega_k`, and
    :math:`P(T > t) = \sum_k p_k E_{C,U}[P(W_q > t - \tau_k(C, U))]`
    (:func:`fleetopt.models.queueing.batched.batched_miss_prob`); the least count
    :math:`N^* = \min\{N \ge N_0 : P(T > T_{SLO} \mid N) \le q\}` with the full-batch load capped
    (:func:`fleetopt.models.queueing.batched.batched_min_replicas`). As :math:`N \to \infty` a request's TTFT tends
    to its prefill on an idle replica, :math:`kW + \omega_k` (:func:`fleetopt.models.queueing.batched.prefill_limit_s`).
    Closed forms: ``tests/test_batched.py``.
    """

    name = "batched"
    warm_start = True
    split_point_model = "tail"
    simulation_note = ""

    def __repr__(self) -> str:
        return "BatchedModel()"

    def traffic(self, stats, arrival_rate, cap=None) -> BatchedTraffic:
        return BatchedTraffic.from_stats(stats, arrival_rate, cap=cap)

    def min_replicas(self, traffic: BatchedTraffic, slo_s, rho_max: float, at_least=None) -> Sizing:
        return batched_min_replicas(traffic, slo_s, rho_max, at_least=at_least)

    def count_floor(self, traffic: BatchedTraffic, rho_max: float) -> np.ndarray:
        """:math:`N_0` (:func:`fleetopt.models.queueing.batched.batched_utilization_floor`)."""
        return batched_utilization_floor(traffic, rho_max)

    def carries(self, traffic: BatchedTraffic, replicas, slo_s, rho_max: float) -> np.ndarray:
        return batched_carries(traffic, replicas, slo_s, rho_max)

    def miss_probability(self, t_s, traffic: BatchedTraffic, replicas) -> np.ndarray:
        return batched_miss_prob(t_s, traffic, replicas)

    def miss_function(self, traffic: BatchedTraffic, replicas) -> Callable[[float], np.ndarray]:
        return batched_miss_function(traffic, replicas)

    def p99_ttft_s(self, traffic: BatchedTraffic, replicas) -> np.ndarray:
        return batched_ttft_p99_s(traffic, replicas)

    def prefill_miss_share(self, traffic: BatchedTraffic, slo_s) -> np.ndarray:
        return np.sum(np.where(prefill_limit_s(traffic) > slo_s, traffic.chunk_probs, 0.0), axis=1)

    def prefill_floor_s(self, traffic: BatchedTraffic) -> np.ndarray:
        """The P99 prefill on an idle replica."""
        return np.array([prefill_p99_s(limit, p) for limit, p in zip(prefill_limit_s(traffic), traffic.chunk_probs)])

    def drop_reason(self, floor_s: float, target: str) -> str:
        return (f"P99 prefill alone on an idle replica is {floor_s * MS_PER_S:,.0f} ms, above {target}, "
                "at any replica count")

    def pool_miss_reason(self, floor_s: float, slo_s: float) -> str:
        return _longest_prompts(floor_s, slo_s)

    def load_erlangs(self, traffic: BatchedTraffic, replicas) -> np.ndarray:
        """:math:`\\lambda` times the mean residence at the realised occupancy of ``replicas`` (at least one)."""
        n = np.maximum(replicas, 1).astype(float)
        return traffic.arrival_rate * np.nan_to_num(operating_point(traffic, n).residence_s, posinf=0.0)

    def power_w(self, profile, traffic: BatchedTraffic, replicas) -> np.ndarray:
        """Mean power at the realised occupancy (:func:`fleetopt.models.queueing.batched.mean_activity_power_w` or
        :func:`fleetopt.models.queueing.batched.mean_power_w`)."""
        op = operating_point(traffic, replicas)
        if isinstance(profile.power, ActivityPower):
            return replicas * mean_activity_power_w(profile.power, traffic, op)
        return replicas * mean_power_w(profile.power.power_w, op, traffic.cap)


def _longest_prompts(floor_s: float, slo_s: float) -> str:
    if floor_s < slo_s:
        return ""
    return (f"prefill of its longest prompts: P99 prefill alone is {floor_s * MS_PER_S:,.0f} ms "
            f"> SLO {slo_s * MS_PER_S:,.0f} ms at any replica count")


TTFT_MODELS: dict[str, TTFTModel] = {m.name: m for m in (BatchedModel(), TailModel(), MeanPrefillModel())}
"""Every TTFT model by its ``slo.ttft_model`` name."""


def ttft_model(name: str) -> TTFTModel:
    """The implementation of ``slo.ttft_model`` ``name`` (``ValueError`` naming the known ones if none).

    >>> ttft_model("tail").name, ttft_model("batched").warm_start
    ('tail', True)
    """
    try:
        return TTFT_MODELS[name]
    except KeyError:
        raise ValueError(f"ttft_model must be one of {tuple(TTFT_MODELS)}; got {name!r}") from None
