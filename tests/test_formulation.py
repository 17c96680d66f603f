"""``solvers/formulation.py``: the fleet MIP's rows admit exactly the fleets the plain-arithmetic check admits, its
sparse rows are well formed, and the LP relaxation handed to HiGHS as that matrix is the Pyomo model's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fleetopt.solvers import mip
from fleetopt.solvers.formulation import FAMILIES, Rows, _rows, formulation, no_good_rows
from fleetopt.solvers.oracle import fleet_is_feasible
from fleetopt.solvers.outcome import Termination, outcome_of
from tests.test_mip_topology import all_fleets, group_case, multi_option_case, to_problem


def _cases():
    """Random toys with P/D pairs, inventories, minimums, pool counts per option, fleet size, budget, power cap,
    fleet-scope SLOs (:func:`multi_option_case`) and inventory groups (:func:`group_case`)."""
    return [multi_option_case(seed)[:5] for seed in range(12)] + [group_case(seed)[:5] for seed in range(1000, 1012)]


def _meets(form, chosen) -> bool:
    return all(f.holds(chosen) for f in form.families)


def _subsets(n: int, n_segments: int, pools, seed: int) -> np.ndarray:
    """Subsets of ``n`` choices as 0/1 rows: every one (n <= 12), else 4,096 random ones about a fleet's size
    and every tiling of the segments by any number of pools (:func:`all_fleets`, by hand)."""
    if n <= 12:
        return ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(float)
    Z = (np.random.default_rng(seed).random((4096, n)) < n_segments / n).astype(float)
    tilings = list(all_fleets(n_segments, pools, n_segments))
    T = np.zeros((len(tilings), n))
    for k, fleet in enumerate(tilings):
        T[k, fleet] = 1.0
    return np.vstack([Z, T])


def _meets_all(form, Z: np.ndarray) -> np.ndarray:
    """Per row of ``Z`` (a 0/1 vector of the choices): whether it meets every row of every family (dense)."""
    ok = np.ones(len(Z), dtype=bool)
    for f in form.families:
        A = np.zeros((f.n_rows, Z.shape[1]))
        A[np.repeat(np.arange(f.n_rows), np.diff(f.start)), f.index] = f.value
        act = Z @ A.T
        ok &= np.all((act <= f.upper + 1e-9) & (act >= f.lower - 1e-9), axis=1)
    return ok


@pytest.mark.parametrize("case", range(24))
def test_rows_admit_exactly_the_feasible_fleets(case):
    """Every subset of the choices (above 12 choices, 4,096 random ones and every tiling) meets all rows of the
    formulation exactly when :func:`fleetopt.solvers.oracle.fleet_is_feasible` (path, pool counts, inventories,
    groups, caps in plain Python) accepts it as a fleet; :meth:`Rows.holds` says the same as the dense product."""
    n_seg, n_opt, pools, objective, lim = _cases()[case]
    problem = to_problem(n_seg, pools, lim, objective, n_opt)
    form = formulation(problem)
    Z = _subsets(problem.n_choices, n_seg, pools, case)
    ok = _meets_all(form, Z)
    for z, meets in zip(Z, ok):
        s = tuple(np.flatnonzero(z).tolist())
        assert meets == fleet_is_feasible(problem, s), (case, s)
    for z in Z[::97]:
        s = tuple(np.flatnonzero(z).tolist())
        assert _meets(form, s) == fleet_is_feasible(problem, s), (case, s)


def test_the_cases_admit_fleets_and_have_binding_rows():
    """The cases above are not vacuous: most admit a fleet, and in most some family other than the tiling cuts
    off a path that tiles (14 and 24 of the 24 when written)."""
    admit = cut = 0
    for case, (n_seg, n_opt, pools, objective, lim) in enumerate(_cases()):
        problem = to_problem(n_seg, pools, lim, objective, n_opt)
        form = formulation(problem)
        Z = _subsets(problem.n_choices, n_seg, pools, case)
        paths = Z[_meets_all(replace(form, families=form.families[:1]), Z)]
        ok = _meets_all(form, paths)
        admit += bool(ok.any())
        cut += bool((~ok).any())
    assert admit >= 12 and cut >= 20, (admit, cut)


def test_rows_are_compressed_sparse_rows():
    """Duplicate entries are summed, zero ones dropped, empty rows kept only where 0 breaks their bounds."""
    r = _rows("t", [7, 8, 9, 10], row=[0, 0, 0, 1, 1, 2], col=[3, 1, 3, 2, 2, 5], val=[1.0, 2.0, 4.0, 1.0, -1.0, 0.0],
              lower=[0.0, -np.inf, 1.0, -np.inf], upper=[9.0, 1.0, 2.0, 5.0])
    # row 1 sums to zero and row 3 has no entry: both dropped (0 within bounds); row 2's only entry is zero but 0
    # breaks its bounds, so it stays, empty, and makes the family infeasible
    assert r.key.tolist() == [7, 9] and r.start.tolist() == [0, 2, 2]
    assert r.index.tolist() == [1, 3] and r.value.tolist() == [2.0, 5.0]
    assert r.infeasible
    crossed = _rows("c", [0], row=[0], col=[0], val=[1.0], lower=[2.0], upper=[1.0])
    assert crossed.infeasible and crossed.n_rows == 1
    cut = no_good_rows(4, (1, 3))       # z0 - z1 + z2 - z3 >= 1 - 2
    assert cut.value.tolist() == [1.0, -1.0, 1.0, -1.0] and cut.lower.tolist() == [-1.0]
    assert not cut.holds((1, 3)) and cut.holds((1,)) and cut.holds((0, 1, 3))


@pytest.mark.parametrize("case", range(0, 24, 3))
def test_the_relaxation_as_a_matrix_is_the_pyomo_models(case):
    """:func:`fleetopt.solvers.mip.relax` (the formulation's matrix handed to HiGHS through highspy) reaches the
    optimum of the Pyomo model's relaxation (every binary relaxed by Pyomo's own transformation, solved through
    Pyomo's HiGHS interface), and its values meet every row to HiGHS's tolerance."""
    import pyomo.environ as pyo

    n_seg, n_opt, pools, objective, lim = _cases()[case]
    problem = to_problem(n_seg, pools, lim, objective, n_opt)
    form = formulation(problem)
    model = mip.build_model(problem)
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(model)   # pyright: ignore[reportOptionalMemberAccess]
    solver, opts = mip._highs(None, 0.0, None, False)
    pyomo_lp = mip._highs_solve(solver, model, opts)
    root = mip.relax(form)
    if root.objective is None:          # (Pyomo 6.9 reports an infeasible LP's last objective as its incumbent)
        assert outcome_of(pyomo_lp).termination is Termination.INFEASIBLE and root.condition == "Infeasible"
        return
    assert root.objective == pytest.approx(pyomo_lp.incumbent_objective, rel=1e-9, abs=1e-9)
    z = root.values
    assert z is not None and np.all(z >= -1e-9) and np.all(z <= 1 + 1e-9)
    for f in form.families:
        rows = np.repeat(np.arange(f.n_rows), np.diff(f.start))
        act = np.bincount(rows, weights=f.value * z[f.index], minlength=f.n_rows)
        assert np.all(act <= f.upper + 1e-6) and np.all(act >= f.lower - 1e-6), f.name


def test_every_family_is_named_once_and_builds_its_pyomo_constraint():
    """The Pyomo model has one constraint per non-empty family, under the family's name and keys."""
    n_seg, n_opt, pools, objective, lim = group_case(1003)[:5]
    problem = to_problem(n_seg, pools, lim, objective, n_opt)
    form = formulation(problem)
    names = [f.name for f in form.families]
    assert len(set(names)) == len(names) == len(FAMILIES)
    model = mip.build_model(problem, form)
    for f in form.families:
        if f.n_rows:
            assert sorted(getattr(model, f.name).keys()) == sorted(f.key.tolist())
        else:
            assert getattr(model, f.name, None) is None
    assert isinstance(form.matrix, Rows) and form.matrix.n_rows == sum(f.n_rows for f in form.families)
