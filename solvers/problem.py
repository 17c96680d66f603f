"""The fleet-selection problem as plain data: what the MIP, the graph oracle and the enumerator read.

Sets and parameters (units in names):

* boundaries :math:`b_0 = 0 < b_1 < \\dots < b_M` (tokens);
* nodes :math:`v`: a boundary and a compression state (the factor :math:`\\gamma` of the pool that ends
  there, or none); without compress-and-route node :math:`v` is boundary :math:`v`. Pools run from node
  to node and a plan is a path from the source (node 0) to the sink;
* candidate pools :math:`p = (i_p, j_p, g_p)` serving :math:`(b_{i_p}, b_{j_p}]` on GPU option :math:`g_p`;
* replica *choices* :math:`c` of a pool, each with a replica count :math:`n_c`, physical GPUs
  :math:`G_c`, cost :math:`\\kappa_c` ($/hr), power :math:`\\pi_c` (W) and SLO-miss rate :math:`m_c`
  (requests/s whose TTFT exceeds the SLO). With a pool-scope SLO each pool has one choice, its
  minimum count :math:`N^*_p`; a fleet-scope SLO adds the smaller counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["FleetProblem", "OBJECTIVES"]

OBJECTIVES = ("cost", "power", "tok_per_watt", "cost+power")


@dataclass(frozen=True, eq=False)
class FleetProblem:
    """Everything a solver needs, as arrays indexed by candidate ``p`` or choice ``c``.

    ``pool_*`` arrays have one entry per candidate pool, ``choice_*`` arrays one
    per replica choice (``choice_pool`` maps a choice to its pool). Limits are
    None when absent. ``gpu_max_gpus[g]`` is the inventory of GPU option ``g``
    in physical GPUs.
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
        gpus = len(self.gpu_names)
        if self.gpu_min_pools is None:
            set_(self, "gpu_min_pools", (0,) * gpus)
        if self.gpu_max_pools is None:
            set_(self, "gpu_max_pools", (None,) * gpus)

    @property
    def n_boundaries(self) -> int:
        return len(self.boundaries)

    @property
    def n_pools(self) -> int:
        return len(self.pool_i)

    @property
    def n_choices(self) -> int:
        return len(self.choice_pool)

    def choice_objective(self) -> np.ndarray:
        """Objective coefficient of each choice: $/hr, kW, or $/hr + energy price x PUE x kW."""
        kw = self.choice_power_w / 1000.0
        if self.objective == "cost":
            return self.choice_cost_per_hr.astype(float)
        if self.objective in ("power", "tok_per_watt"):
            return kw
        return self.choice_cost_per_hr + self.energy_usd_per_kwh * self.pue * kw

    @property
    def separable(self) -> bool:
        """True when only the tiling and the pool count bind: the graph oracle solves it exactly."""
        assert self.gpu_min_pools is not None and self.gpu_max_pools is not None     # __post_init__ fills them
        return (all(v is None for v in self.gpu_max_gpus) and not any(self.gpu_min_gpus)
                and all(v is None for v in self.gpu_max_pools) and not any(self.gpu_min_pools)
                and self.max_total_gpus is None and self.max_cost_per_hr is None and self.max_power_w is None
                and self.max_miss_rate is None)
