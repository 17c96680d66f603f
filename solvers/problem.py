"""The fleet-selection problem as plain data: what the MIP, the graph oracle and the enumerator read.

Sets and parameters (units in names):

* boundaries :math:`b_0 = 0 < b_1 < \\dots < b_M` (tokens);
* nodes :math:`v`: a boundary and a compression state (the factor :math:`\\gamma` of the pool that ends
  there, or none); without compress-and-route node :math:`v` is boundary :math:`v`. Pools run from node
  to node and a plan is a path from the source (node 0) to the sink;
* *commodities* :math:`k`: several tilings in one problem (the model classes of semantic routing, each tiling
  its own traffic with pools of its own model), each a path from its source :math:`s_k` to its sink
  :math:`t_k` on its own range of nodes (no pool joins two ranges). By default one commodity, source 0;
* candidate pools :math:`p = (i_p, j_p, g_p)` serving :math:`(b_{i_p}, b_{j_p}]`, :math:`g_p` their
  *primary* GPU option (the one its label names; a pool on several options names one of them);
* replica *choices* :math:`c` of a pool, each with a replica count :math:`n_c`, physical GPUs
  :math:`G_c`, cost :math:`\\kappa_c` ($/hr), power :math:`\\pi_c` (W) and SLO-miss rate :math:`m_c`
  (requests/s whose TTFT exceeds the SLO). With a pool-scope SLO each pool has one choice, its
  minimum count :math:`N^*_p`; a fleet-scope SLO adds the smaller counts;
* the *GPU use* :math:`G_{cg} \\ge 0` of choice :math:`c` on option :math:`g`, with
  :math:`\\sum_g G_{cg} = G_c` (:class:`GpuUse`). By default a choice takes all its GPUs from its pool's
  option, :math:`G_{cg} = G_c [g = g_{p(c)}]`; a prefill/decode pair takes its prefill replicas' GPUs from
  one option and its decode replicas' from another. Choice :math:`c` *uses* :math:`g` when
  :math:`G_{cg} > 0`, and its pool then counts once toward the pool limits of every option it uses;
* *inventory groups* :math:`k`: sets of options :math:`O_k` that draw on one physical inventory (the
  TP/dtype configurations of one hardware entry), :math:`\\underline G_k \\le \\sum_{g \\in O_k} \\sum_c G_{cg}
  z_c \\le \\bar G_k` (:class:`InventoryGroup`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from fleetopt.models.numerics import unique

__all__ = ["FleetProblem", "GpuUse", "InventoryGroup", "OBJECTIVES"]

OBJECTIVES = ("cost", "power", "tok_per_watt", "cost+power")


@dataclass(frozen=True, eq=False)
class GpuUse:
    """Physical GPUs the replica choices take from each GPU option, as sparse entries (coordinate form).

    Entry :math:`e` says that choice ``choice[e]`` takes ``gpus[e]`` physical GPUs of option ``option[e]``
    (:math:`G_{cg}`). A choice has one entry per option it uses (at most one per pair, ``gpus >= 1``), and its
    entries sum to its ``choice_gpus``; a choice without entries uses no option. Entries are in any order.

    >>> use = GpuUse(choice=np.array([0, 1, 1]), option=np.array([0, 0, 1]), gpus=np.array([4, 1, 3]))
    >>> use.by_option(2)[1]
    (array([1]), array([3]))
    """

    choice: np.ndarray
    option: np.ndarray
    gpus: np.ndarray

    def by_option(self, n_options: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per option :math:`g`: the choices that use it (ascending) and their :math:`G_{cg}`."""
        order = np.lexsort((self.choice, self.option))
        bounds = np.searchsorted(self.option[order], np.arange(n_options + 1))
        return [(self.choice[order[bounds[g]:bounds[g + 1]]], self.gpus[order[bounds[g]:bounds[g + 1]]])
                for g in range(n_options)]


@dataclass(frozen=True)
class InventoryGroup:
    """GPU options that draw on one physical inventory (the TP/dtype configurations of one hardware entry).

    :math:`\\underline G_k \\le \\sum_{g \\in O_k} \\sum_c G_{cg} z_c \\le \\bar G_k` in physical GPUs;
    ``max_gpus`` None means no cap.
    """

    options: tuple[int, ...]
    max_gpus: int | None = None
    min_gpus: int = 0


@dataclass(frozen=True, eq=False)
class FleetProblem:
    """Everything a solver needs, as arrays indexed by candidate ``p`` or choice ``c``.

    ``pool_*`` arrays have one entry per candidate pool, ``choice_*`` arrays one
    per replica choice (``choice_pool`` maps a choice to its pool). Limits are
    None when absent. ``gpu_max_gpus[g]`` is the inventory of GPU option ``g``
    in physical GPUs; ``pool_gpu[p]`` is pool ``p``'s primary option.

    ``choice_gpu_use`` (optional) says which options each choice takes its GPUs from; absent, every choice
    takes its ``choice_gpus`` from its pool's ``pool_gpu`` (:attr:`gpu_use` reads either).
    ``inventory_groups`` (optional) bound the sum over several options' GPUs.
    """

    boundaries: np.ndarray
    gpu_names: tuple[str, ...]
    pool_i: np.ndarray
    pool_j: np.ndarray
    pool_gpu: np.ndarray
    pool_arrival_rate: np.ndarray
    choice_pool: np.ndarray
    choice_replicas: np.ndarray
    choice_gpus: np.ndarray
    choice_cost_per_hr: np.ndarray
    choice_power_w: np.ndarray
    choice_miss_rate: np.ndarray
    max_pools: int
    gpu_max_gpus: tuple[int | None, ...]
    gpu_min_gpus: tuple[int, ...]
    pool_from_node: np.ndarray | None = None
    """Tail node of each pool (default: ``pool_i``)."""
    pool_to_node: np.ndarray | None = None
    """Head node of each pool (default: ``pool_j``)."""
    n_nodes: int | None = None
    sink_node: int | None = None
    gpu_min_pools: tuple[int, ...] | None = None
    gpu_max_pools: tuple[int | None, ...] | None = None
    max_total_gpus: int | None = None
    max_cost_per_hr: float | None = None
    max_power_w: float | None = None
    max_miss_rate: float | None = None
    """Fleet-scope SLO: at most this many requests/s may miss the TTFT SLO (None = pool scope)."""
    objective: str = "cost"
    energy_usd_per_kwh: float = 0.0
    pue: float = 1.0
    labels: tuple[str, ...] = field(default_factory=tuple)
    choice_gpu_use: GpuUse | None = None
    """GPUs each choice takes from each option (default: all of ``choice_gpus`` from ``pool_gpu``)."""
    inventory_groups: tuple[InventoryGroup, ...] = ()
    """Options that share one physical inventory: their GPUs together within the group's bounds."""
    sources: tuple[int, ...] | None = None
    """Source node of each commodity (default: ``(0,)``). Commodity :math:`k` is a path from ``sources[k]`` to
    ``sinks[k]``; every other limit (``max_pools`` included) is shared by all commodities."""
    sinks: tuple[int, ...] | None = None
    """Sink node of each commodity (default: ``(sink_node,)``)."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}; got {self.objective!r}")
        if self.max_pools < 1:
            raise ValueError("max_pools must be >= 1")
        set_ = object.__setattr__
        if self.pool_from_node is None:
            set_(self, "pool_from_node", np.asarray(self.pool_i))
            set_(self, "pool_to_node", np.asarray(self.pool_j))
            set_(self, "n_nodes", len(self.boundaries))
            set_(self, "sink_node", len(self.boundaries) - 1)
        if self.sources is None:
            set_(self, "sources", (0,))
            set_(self, "sinks", (self.sink_node,))
        elif self.sinks is None or len(self.sinks) != len(self.sources) or not self.sources:
            raise ValueError("sources and sinks must be given together, one of each per commodity")
        assert self.sources is not None and self.sinks is not None and self.n_nodes is not None   # set above
        if self.sink_node is None:
            set_(self, "sink_node", self.sinks[0])
        ends = tuple(self.sources) + tuple(self.sinks)
        if len(set(ends)) != len(ends) or not all(0 <= v < self.n_nodes for v in ends):
            raise ValueError(f"sources and sinks must be distinct nodes in 0..{self.n_nodes - 1}; got "
                             f"{self.sources}, {self.sinks}")
        gpus = len(self.gpu_names)
        if self.gpu_min_pools is None:
            set_(self, "gpu_min_pools", (0,) * gpus)
        if self.gpu_max_pools is None:
            set_(self, "gpu_max_pools", (None,) * gpus)
        if self.choice_gpu_use is not None:
            _check_gpu_use(self.choice_gpu_use, self.choice_gpus, gpus)
        for k, grp in enumerate(self.inventory_groups):
            if not grp.options or len(set(grp.options)) != len(grp.options) or \
                    not all(0 <= g < gpus for g in grp.options):
                raise ValueError(f"inventory_groups[{k}].options must be distinct GPU options in 0..{gpus - 1}; "
                                 f"got {grp.options}")
            if grp.min_gpus < 0 or (grp.max_gpus is not None and grp.max_gpus < 0):
                raise ValueError(f"inventory_groups[{k}]: GPU bounds must be >= 0")

    @property
    def n_boundaries(self) -> int:
        return len(self.boundaries)

    @property
    def n_commodities(self) -> int:
        """Tilings the problem holds (model classes; 1 by default)."""
        assert self.sources is not None     # __post_init__ fills it
        return len(self.sources)

    @property
    def max_path_pools(self) -> int:
        """The most pools any feasible fleet can have: a path has at most one pool per boundary segment, and
        each commodity is one path over the boundaries, :math:`C (M)` with :math:`C` commodities. ``max_pools`` at
        or above it binds nothing."""
        return self.n_commodities * (self.n_boundaries - 1)

    @property
    def n_pools(self) -> int:
        return len(self.pool_i)

    @property
    def n_choices(self) -> int:
        return len(self.choice_pool)

    @cached_property
    def gpu_use(self) -> GpuUse:
        """``choice_gpu_use``, or the default: each choice's ``choice_gpus`` on its pool's ``pool_gpu``."""
        if self.choice_gpu_use is not None:
            return self.choice_gpu_use
        return GpuUse(choice=np.arange(self.n_choices), option=np.asarray(self.pool_gpu)[self.choice_pool],
                      gpus=np.asarray(self.choice_gpus))

    @cached_property
    def gpu_use_by_option(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per GPU option: the choices that use it (ascending) and the GPUs each takes from it."""
        return self.gpu_use.by_option(len(self.gpu_names))

    def with_choices(self, keep) -> FleetProblem:
        """The problem with the choices ``keep`` (ascending indices) alone, as if every other were fixed at
        :math:`z_c = 0`: pools, nodes and limits stay, and ``choice_gpu_use`` is renumbered. Choice :math:`k` of the
        result is choice ``keep[k]`` of this one."""
        keep = np.asarray(keep, dtype=np.int64)
        gpu_use = None
        if self.choice_gpu_use is not None:
            at = np.full(self.n_choices, -1, dtype=np.int64)
            at[keep] = np.arange(len(keep))
            use = self.choice_gpu_use
            mine = at[use.choice] >= 0
            gpu_use = GpuUse(choice=at[use.choice[mine]], option=np.asarray(use.option)[mine],
                             gpus=np.asarray(use.gpus)[mine])
        return replace(self, choice_pool=self.choice_pool[keep], choice_replicas=self.choice_replicas[keep],
                       choice_gpus=self.choice_gpus[keep], choice_cost_per_hr=self.choice_cost_per_hr[keep],
                       choice_power_w=self.choice_power_w[keep], choice_miss_rate=self.choice_miss_rate[keep],
                       choice_gpu_use=gpu_use)

    def choice_objective(self) -> np.ndarray:
        """Objective coefficient of each choice: $/hr, kW, or $/hr + energy price x PUE x kW."""
        kw = self.choice_power_w / 1000.0
        if self.objective == "cost":
            return self.choice_cost_per_hr.astype(float)
        if self.objective in ("power", "tok_per_watt"):
            return kw
        return self.choice_cost_per_hr + self.energy_usd_per_kwh * self.pue * kw

    def choice_last_tie(self) -> np.ndarray:
        """Each choice's weight in the last tie-break, among fleets equal in objective, GPUs and pools: its power
        in kW under the cost objectives, its $/hr under the power ones (an operator who pays the same buys the
        fleet that draws less, and one who draws the same, the fleet that costs less)."""
        if self.objective in ("power", "tok_per_watt"):
            return self.choice_cost_per_hr.astype(float)
        return self.choice_power_w / 1000.0

    @property
    def separable(self) -> bool:
        r"""True when only the tiling and the pool count bind: the graph oracle solves it exactly.

        With several commodities the pool count :math:`\sum_c z_c \le K` couples their paths; the oracle
        handles that row exactly (:func:`fleetopt.solvers.oracle.shortest_fleet`), so it does not count here."""
        assert self.gpu_min_pools is not None and self.gpu_max_pools is not None     # __post_init__ fills them
        return (all(v is None for v in self.gpu_max_gpus) and not any(self.gpu_min_gpus)
                and all(v is None for v in self.gpu_max_pools) and not any(self.gpu_min_pools)
                and self.max_total_gpus is None and self.max_cost_per_hr is None and self.max_power_w is None
                and self.max_miss_rate is None
                and all(grp.max_gpus is None and not grp.min_gpus for grp in self.inventory_groups))


def _check_gpu_use(use: GpuUse, choice_gpus: np.ndarray, n_options: int) -> None:
    """Entries name real choices and options, once per pair, with >= 1 GPU, and sum to each choice's GPUs."""
    n = len(choice_gpus)
    choice, option, gpus = (np.asarray(a) for a in (use.choice, use.option, use.gpus))
    if not (choice.shape == option.shape == gpus.shape) or choice.ndim != 1:
        raise ValueError("choice_gpu_use: choice, option and gpus must be 1-D arrays of one length")
    if len(choice) and (choice.min() < 0 or choice.max() >= n or option.min() < 0 or option.max() >= n_options):
        raise ValueError(f"choice_gpu_use: choices must lie in 0..{n - 1} and options in 0..{n_options - 1}")
    if len(choice) and gpus.min() < 1:
        raise ValueError("choice_gpu_use: every entry takes at least one GPU (leave an unused option out)")
    if len(unique(choice.astype(np.int64) * n_options + option)) != len(choice):
        raise ValueError("choice_gpu_use: a (choice, option) pair appears twice")
    total = np.bincount(choice, weights=gpus, minlength=n)
    bad = np.flatnonzero(total != np.asarray(choice_gpus))
    if len(bad):
        c = int(bad[0])
        raise ValueError(f"choice_gpu_use: choice {c} takes {total[c]:g} GPUs over its options, "
                         f"not its choice_gpus {choice_gpus[c]}")
