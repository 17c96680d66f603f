"""The fleet MIP as data: its variables, objective and constraint families as sparse rows.

Sets
----
NODES     path nodes :math:`v` (a boundary, and with compress-and-route a compression state); source 0, or with
          several commodities :math:`k` (model classes) a source :math:`s_k` and a sink :math:`t_k` each, every
          commodity on its own range of nodes
POOLS     candidate pools :math:`p = (i_p, j_p, g_p)`, :math:`g_p` the primary GPU option
CHOICES   replica choices :math:`c` of the pools (:math:`p(c)` their pool)
GPUS      GPU options :math:`g`; choice :math:`c` takes :math:`G_{cg}` physical GPUs of option :math:`g`
          (:math:`\\sum_g G_{cg} = G_c`; by default all :math:`G_c` of :math:`g_{p(c)}`), and *uses* :math:`g`,
          :math:`c \\in C_g`, when :math:`G_{cg} > 0` (a prefill/decode pair uses two options)
GROUPS    inventory groups :math:`k`: options :math:`O_k` that share one physical inventory

Variables
---------
:math:`z_c \\in \\{0, 1\\}`: choice :math:`c` is built. Pool :math:`p` is used,
:math:`x_p = \\sum_{c \\in p} z_c`, with :math:`n_p = \\sum_{c \\in p} n_c z_c` replicas.

Objective
---------
:math:`\\min \\sum_c w_c z_c` with :math:`w_c` the choice's $/hr, kW or
$/hr + energy price x PUE x kW (:meth:`FleetProblem.choice_objective`).
The objective stays in $/hr or kW so coefficients are of order one.

Constraints
-----------
Each constraint family is a ``*_rows`` function below whose docstring is its math; it returns the family's rows
:math:`l \\le A z \\le u` as :class:`Rows` (:math:`A` sparse by row). :func:`formulation` collects them in
:data:`FAMILIES` order. The formulation is declared here once and read by both of the MIP's solver paths
(:mod:`fleetopt.solvers.mip`): the LP relaxation handed to HiGHS as this matrix, and the Pyomo model of branch
and bound, one indexed constraint per family.

Pure numpy: importing this module imports neither Pyomo nor HiGHS.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from fleetopt.solvers.problem import FleetProblem

__all__ = ["Rows", "Formulation", "formulation", "FAMILIES", "no_good_rows", "one_row"]


@dataclass(frozen=True, eq=False)
class Rows:
    """One constraint family as sparse rows: row :math:`r` reads

    .. math:: l_r \\le \\sum_{s_r \\le e < s_{r+1}} a_e z_{c_e} \\le u_r

    with ``start`` :math:`s` (length rows + 1), ``index`` :math:`c_e`, ``value`` :math:`a_e` (compressed sparse
    rows: no duplicate and no zero entry in a row), ``lower`` :math:`l` and ``upper`` :math:`u` (:math:`\\mp\\infty`
    where a side has no bound). ``key`` names each row's element of the family's set (its node, pool, GPU option
    or inventory group; 0 for a family of one row). A row without entries is kept only where 0 breaks its
    bounds, as are crossed bounds: either makes the family :attr:`infeasible`.
    """

    name: str
    key: np.ndarray
    start: np.ndarray
    index: np.ndarray
    value: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    @property
    def n_rows(self) -> int:
        return len(self.key)

    @property
    def infeasible(self) -> bool:
        """True when no :math:`z`, integer or not, meets the family: crossed bounds, or an empty row whose bounds
        exclude 0."""
        empty = self.start[1:] == self.start[:-1]
        return bool(np.any(self.lower > self.upper) or np.any(empty & ((self.lower > 0) | (self.upper < 0))))

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``r``'s choices and coefficients."""
        s, e = self.start[r], self.start[r + 1]
        return self.index[s:e], self.value[s:e]

    def activity(self, chosen) -> np.ndarray:
        """Each row's left-hand side :math:`\\sum_e a_e z_{c_e}` at the fleet ``chosen`` (:math:`z_c = 1` for
        those choices, 0 for every other)."""
        z = np.zeros(int(self.index.max(initial=-1)) + 1)
        mine = np.asarray(list(chosen), dtype=np.int64)
        z[mine[mine < len(z)]] = 1.0
        rows = np.repeat(np.arange(self.n_rows), np.diff(self.start))
        return np.bincount(rows, weights=self.value * z[self.index], minlength=self.n_rows)

    def holds(self, chosen, rel_tol: float = 1e-9) -> bool:
        """Whether the fleet ``chosen`` meets every row, to ``rel_tol`` of a bound's size (of 1 where smaller)."""
        act = self.activity(chosen)
        tol = rel_tol * np.maximum(1.0, np.abs(np.where(np.isfinite(self.upper), self.upper, 0.0)))
        low_tol = rel_tol * np.maximum(1.0, np.abs(np.where(np.isfinite(self.lower), self.lower, 0.0)))
        return bool(np.all(act <= self.upper + tol) and np.all(act >= self.lower - low_tol))


def _rows(name: str, key, row, col, val, lower, upper) -> Rows:
    """A :class:`Rows` from coordinate entries ``(row, col, val)`` (``row`` a position in ``key``): duplicates
    summed, zero entries dropped, and an empty row dropped where 0 meets its bounds."""
    key = np.asarray(key, dtype=np.int64)
    row, col = np.asarray(row, dtype=np.int64), np.asarray(col, dtype=np.int64)
    val = np.asarray(val, dtype=float)
    lower = np.broadcast_to(np.asarray(lower, dtype=float), key.shape)
    upper = np.broadcast_to(np.asarray(upper, dtype=float), key.shape)
    order = np.lexsort((col, row))
    row, col, val = row[order], col[order], val[order]
    if len(row):
        first = np.flatnonzero(np.r_[True, (row[1:] != row[:-1]) | (col[1:] != col[:-1])])
        row, col, val = row[first], col[first], np.add.reduceat(val, first)
        nonzero = val != 0.0
        row, col, val = row[nonzero], col[nonzero], val[nonzero]
    count = np.bincount(row, minlength=len(key))
    keep = (count > 0) | (lower > 0) | (upper < 0) | (lower > upper)
    # a dropped row has no entry: the entries stay as they are, sorted by row
    return Rows(name, key[keep], np.r_[0, np.cumsum(count[keep])].astype(np.int64), col, val, lower[keep].copy(),
                upper[keep].copy())


def _empty(name: str) -> Rows:
    z = np.zeros(0)
    return Rows(name, z.astype(np.int64), np.zeros(1, dtype=np.int64), z.astype(np.int64), z, z, z)


def one_row(name: str, coef, lower=-np.inf, upper=np.inf) -> Rows:
    """A family of one row :math:`l \\le \\sum_c a_c z_c \\le u` over every choice (``coef`` :math:`a`)."""
    coef = np.asarray(coef, dtype=float)
    return _rows(name, [0], np.zeros(len(coef), dtype=np.int64), np.arange(len(coef)), coef, lower, upper)


def tiling_rows(problem: FleetProblem) -> Rows:
    """Chosen pools tile :math:`(b_0, b_M]` exactly once: one path from the source to the sink.

    .. math::

        \\sum_{c:\\, \\mathrm{tail}(p(c)) = v} z_c - \\sum_{c:\\, \\mathrm{head}(p(c)) = v} z_c =
        \\begin{cases} 1 & v = \\text{source} \\\\ -1 & v = \\text{sink} \\\\ 0 & \\text{otherwise} \\end{cases}
        \\qquad \\forall v \\in \\mathrm{NODES}

    With compress-and-route a node also carries the compression factor of the
    pool that ends there, so consecutive pools agree on who serves the band.

    With several commodities (``FleetProblem.sources``/``sinks``: the model classes of semantic routing) the
    right-hand side is 1 at every source :math:`s_k` and -1 at every sink :math:`t_k`: no pool joins two
    commodities' node ranges, so the rows split into one path per commodity, each tiling its class's lengths
    once with its own pools (a multi-commodity path on disjoint graphs, coupled only by the shared rows below).
    """
    # FleetProblem.__post_init__ fills the node arrays
    assert problem.pool_from_node is not None and problem.pool_to_node is not None and problem.n_nodes is not None
    cp = problem.choice_pool
    n = problem.n_choices
    rhs = np.zeros(problem.n_nodes)
    rhs[list(problem.sources or ())] = 1.0
    rhs[list(problem.sinks or ())] = -1.0
    return _rows("tiling", np.arange(problem.n_nodes), np.r_[problem.pool_from_node[cp], problem.pool_to_node[cp]],
                 np.r_[np.arange(n), np.arange(n)], np.r_[np.ones(n), -np.ones(n)], rhs, rhs)


def one_count_rows(problem: FleetProblem) -> Rows:
    """A pool is built with at most one replica count: :math:`x_p = \\sum_{c \\in p} z_c \\le 1` (for pools of
    two choices or more; :math:`z_c \\le 1` is the variable's own bound)."""
    cp = np.asarray(problem.choice_pool, dtype=np.int64)
    several = np.flatnonzero(np.bincount(cp, minlength=problem.n_pools) > 1)
    at = np.full(problem.n_pools, -1, dtype=np.int64)
    at[several] = np.arange(len(several))
    mine = at[cp] >= 0
    return _rows("one_count", several, at[cp[mine]], np.flatnonzero(mine), np.ones(int(mine.sum())), -np.inf, 1.0)


def max_pools_rows(problem: FleetProblem) -> Rows:
    """At most :math:`K` pools over all commodities: :math:`\\sum_c z_c \\le K` (left out where :math:`K` is at
    least the most pools a path can have, :attr:`FleetProblem.max_path_pools`)."""
    if problem.max_pools >= problem.max_path_pools:
        return _empty("max_pools")
    return one_row("max_pools", np.ones(problem.n_choices), upper=problem.max_pools)


def _by_option(problem: FleetProblem, name: str, options, per_choice, lower, upper) -> Rows:
    """One row per GPU option of ``options`` over the choices :math:`C_g` that use it, with coefficient
    :math:`G_{cg}` (``per_choice`` False: 1)."""
    options = np.asarray(options, dtype=np.int64)
    use = problem.gpu_use_by_option
    empty = [np.zeros(0, dtype=np.int64)]       # np.concatenate needs one part
    rows = np.concatenate(empty + [np.full(len(use[g][0]), r) for r, g in enumerate(options)])
    cols = np.concatenate(empty + [use[g][0] for g in options])
    vals = np.concatenate(empty + [use[g][1] if per_choice else np.ones(len(use[g][0])) for g in options])
    return _rows(name, options, rows, cols, vals, lower, upper)


def _bound(values) -> np.ndarray:
    """Limits with None for none as floats with :math:`\\infty`."""
    return np.array([np.inf if v is None else float(v) for v in values], dtype=float)


def gpu_inventory_rows(problem: FleetProblem) -> Rows:
    """Inventory of GPU option :math:`g` in physical GPUs: :math:`\\sum_{c \\in C_g} G_{cg} z_c \\le \\bar G_g`."""
    cap = _bound(problem.gpu_max_gpus)
    has = np.flatnonzero(np.isfinite(cap))
    return _by_option(problem, "gpu_inventory", has, True, -np.inf, cap[has])


def gpu_minimum_rows(problem: FleetProblem) -> Rows:
    """Committed GPUs of option :math:`g`: :math:`\\sum_{c \\in C_g} G_{cg} z_c \\ge \\underline G_g`."""
    low = np.array(problem.gpu_min_gpus, dtype=float)
    has = np.flatnonzero(low > 0)
    return _by_option(problem, "gpu_minimum", has, True, low[has], np.inf)


def gpu_pool_count_rows(problem: FleetProblem) -> Rows:
    """Pools per GPU option: :math:`\\underline K_g \\le \\sum_{c \\in C_g} z_c \\le \\bar K_g`.

    A pool counts once toward every option it uses: a prefill/decode pair on A100 prefill and H100 decode
    is one A100 pool and one H100 pool (and one pool toward :math:`K`).
    """
    assert problem.gpu_min_pools is not None and problem.gpu_max_pools is not None    # __post_init__ fills them
    low, high = np.array(problem.gpu_min_pools, dtype=float), _bound(problem.gpu_max_pools)
    has = np.flatnonzero((low > 0) | np.isfinite(high))
    return _by_option(problem, "gpu_pool_count", has, False, low[has], high[has])


def inventory_group_rows(problem: FleetProblem) -> Rows:
    """Options sharing one physical inventory (the TP/dtype configurations of one hardware entry):

    .. math:: \\underline G_k \\le \\sum_c \\Bigl(\\sum_{g \\in O_k} G_{cg}\\Bigr) z_c \\le \\bar G_k
    """
    use = problem.gpu_use
    rows, cols, vals, keys, low, high = [], [], [], [], [], []
    for k, grp in enumerate(problem.inventory_groups):
        if grp.max_gpus is None and not grp.min_gpus:
            continue
        mine = np.isin(use.option, np.asarray(grp.options))
        rows.append(np.full(int(mine.sum()), len(keys)))
        cols.append(use.choice[mine])
        vals.append(use.gpus[mine])         # summed per choice over the group's options by _rows
        keys.append(k)
        low.append(float(grp.min_gpus))
        high.append(np.inf if grp.max_gpus is None else float(grp.max_gpus))
    if not keys:
        return _empty("inventory_group")
    return _rows("inventory_group", keys, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), low, high)


def total_gpus_rows(problem: FleetProblem) -> Rows:
    """Fleet size: :math:`\\sum_c G_c z_c \\le G_{max}`."""
    cap = problem.max_total_gpus
    return _empty("total_gpus") if cap is None else one_row("total_gpus", problem.choice_gpus, upper=cap)


def budget_rows(problem: FleetProblem) -> Rows:
    """Budget: :math:`\\sum_c \\kappa_c z_c \\le \\$_{max}` ($/hr)."""
    cap = problem.max_cost_per_hr
    return _empty("budget") if cap is None else one_row("budget", problem.choice_cost_per_hr, upper=cap)


def power_cap_rows(problem: FleetProblem) -> Rows:
    """Power cap: :math:`\\sum_c \\pi_c z_c \\le P_{max}` (kW, with :math:`\\pi_c` in kW)."""
    cap = problem.max_power_w
    return _empty("power_cap") if cap is None else \
        one_row("power_cap", np.asarray(problem.choice_power_w, dtype=float) / 1000.0, upper=cap / 1000.0)


def fleet_slo_rows(problem: FleetProblem) -> Rows:
    """Fleet-scope SLO: requests missing the TTFT SLO stay within 1 % of all:
    :math:`\\sum_c m_c z_c \\le 0.01 \\Lambda`.
    """
    cap = problem.max_miss_rate
    return _empty("fleet_slo") if cap is None else one_row("fleet_slo", problem.choice_miss_rate, upper=cap)


FAMILIES = (tiling_rows, one_count_rows, max_pools_rows, gpu_inventory_rows, gpu_minimum_rows, gpu_pool_count_rows,
            inventory_group_rows, total_gpus_rows, budget_rows, power_cap_rows, fleet_slo_rows)
"""The constraint families of the fleet MIP, in the order of the model's rows."""


def no_good_rows(n_choices: int, chosen) -> Rows:
    """Exclude one fleet :math:`S`: :math:`\\sum_{c \\in S} (1 - z_c) + \\sum_{c \\notin S} z_c \\ge 1`, that is
    :math:`\\sum_{c \\notin S} z_c - \\sum_{c \\in S} z_c \\ge 1 - |S|`."""
    coef = np.ones(n_choices)
    mine = np.asarray(sorted(set(int(c) for c in chosen)), dtype=np.int64)
    coef[mine] = -1.0
    return one_row("no_good", coef, lower=1.0 - len(mine))


@dataclass(frozen=True, eq=False)
class Formulation:
    """The fleet MIP as data: the objective :math:`w` over binary :math:`z`, and the constraint families."""

    objective: np.ndarray
    families: tuple[Rows, ...]

    @property
    def n_vars(self) -> int:
        return len(self.objective)

    @property
    def infeasible(self) -> bool:
        """A family no :math:`z` meets (:attr:`Rows.infeasible`): the relaxation is infeasible without a solve."""
        return any(f.infeasible for f in self.families)

    @cached_property
    def matrix(self) -> Rows:
        """Every family's rows stacked in order, as one :class:`Rows` (``key`` the family-local keys)."""
        fs = [f for f in self.families if f.n_rows]
        if not fs:
            return _empty("all")
        offsets = np.cumsum([0] + [len(f.index) for f in fs])
        return Rows("all", np.concatenate([f.key for f in fs]),
                    np.r_[0, np.concatenate([f.start[1:] + o for f, o in zip(fs, offsets)])],
                    np.concatenate([f.index for f in fs]), np.concatenate([f.value for f in fs]),
                    np.concatenate([f.lower for f in fs]), np.concatenate([f.upper for f in fs]))

    def with_rows(self, rows: Rows) -> Formulation:
        """The formulation with one more family."""
        return replace(self, families=self.families + (rows,))

    def with_objective(self, objective) -> Formulation:
        """The same rows under another objective."""
        return replace(self, objective=np.asarray(objective, dtype=float))


def formulation(problem: FleetProblem) -> Formulation:
    """The fleet MIP of ``problem``: the objective :meth:`FleetProblem.choice_objective` and every family of
    :data:`FAMILIES`."""
    return Formulation(np.asarray(problem.choice_objective(), dtype=float),
                       tuple(family(problem) for family in FAMILIES))
