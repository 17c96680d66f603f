"""The compiled plain loop (``solvers/des/_cloop.c``) against the Python loop it transliterates
(:func:`fleetopt.solvers.des.engine._plain_loop`).

The compiled loop is meant to change nothing: every case runs both ways and the records, integrals and event
counts must be equal bit for bit (the regression fingerprint of ``tests/test_des_regression.py``, whose pinned
figures hold the Python loop), so neither side is an expected value produced by the code under test alone. The
loop is an optional extension: where it was not built (no C compiler at install) the comparisons cannot run and
say so; CI sets ``FLEETOPT_REQUIRE_COMPILED=1``, under which a missing build fails instead.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.optimizer import api
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan
from fleetopt.solvers.des import engine
from fleetopt.solvers.des.routing import LeastQueue, LengthRouter
from fleetopt.solvers.des.state import CapChange, SimPool
from tests.test_des_fused import _edge_requests
from tests.test_des_regression import fingerprint

BUILT = engine._compiled_module() is not None
needs_build = pytest.mark.skipif(not BUILT, reason="the compiled loop was not built (no C compiler at install); "
                                                   "the Python loop runs, tested everywhere")

CURVE = CalibratedProfile("curve", "toy", 0.006, 0.0004, 4096, 256, 16, 1 << 16, 64, 1.0, 1,
                          PowerCurve(300.0, 700.0, 1.0, 4.0, "none"))
# compute terms (a prefill chunk's own compute, decode compute) with a power curve: not metered, so compiled
COMPUTE = CalibratedProfile("compute", "toy", 0.00643, 4.5e-8 * 8192, 8192, 512, 16, 1 << 16, 256, 3.0, 1,
                            PowerCurve(250.0, 700.0, 1.0, 3.0, "none"), g_s=2.5e-5, prefill_a_s=26.5e-6,
                            prefill_b_s=7.4e-10)
ACTIVE = CalibratedProfile("active", "toy", 0.00643, 4.5e-8 * 8192, 8192, 512, 16, 1 << 16, 256, 3.0, 1,
                           ActivityPower(idle_w=90.0, limit_w=700.0, weights_w=400.0, kv_w=650.0, compute_w=900.0),
                           g_s=2.5e-5, prefill_a_s=26.5e-6, prefill_b_s=7.4e-10)


def test_the_build_is_there_where_required():
    assert BUILT or os.environ.get("FLEETOPT_REQUIRE_COMPILED") != "1", \
        "FLEETOPT_REQUIRE_COMPILED=1 but fleetopt.solvers.des._cloop was not built"


def _count_compiled_runs(monkeypatch) -> list:
    """Make the engine's compiled loop (where it is built) count its runs: returns the list each run appends to,
    and puts the loop back as it was when the test ends (monkeypatch)."""
    runs = []
    real = engine._compiled_loop

    class Counting:
        @staticmethod
        def run(*args):
            runs.append(1)
            return real().run(*args)

    monkeypatch.setattr(engine, "_compiled_loop", lambda: Counting if real() is not None else None)
    return runs


def _both(case: dict, monkeypatch) -> tuple[dict, dict, int]:
    """The run's fingerprint with the compiled loop where it applies, then with the Python loop; and how many
    times the compiled loop ran."""
    runs = _count_compiled_runs(monkeypatch)
    compiled = fingerprint(engine.simulate(**case))
    monkeypatch.setattr(engine, "_COMPILED", False)
    python = fingerprint(engine.simulate(**case))
    monkeypatch.setattr(engine, "_COMPILED", True)
    return compiled, python, len(runs)


def _case(profile, horizon, warmup, caps=(10, 6), rate=70.0, dispatch=None, cap_changes=()):
    pools = [SimPool("a", profile, 2, caps[0], 2048), SimPool("b", profile, 3, caps[1], 4096),
             SimPool("c", profile, 1, 4, 4096)]     # a one-replica pool: no dispatch choice
    return dict(pools=pools, requests=_edge_requests(21, 3000, rate),
                router=LengthRouter([0, 1024, 2048, 4096], ["c", "a", "b"]), dispatch=dispatch, horizon_s=horizon,
                warmup_s=warmup, cap_changes=list(cap_changes))


@needs_build
@pytest.mark.parametrize("profile", [CURVE, COMPUTE], ids=["curve", "compute"])
@pytest.mark.parametrize("horizon,warmup", [(None, 0.0), (None, 4.0), (30.0, 4.0), (12.0, 0.0)],
                         ids=["drained", "warm-up", "horizon", "short-horizon"])
def test_compiled_loop_runs_the_same(profile, horizon, warmup, monkeypatch):
    compiled, python, runs = _both(_case(profile, horizon, warmup), monkeypatch)
    assert runs == 1
    assert compiled["completed"] > 300               # loaded enough to queue at the caps
    assert compiled == python


@needs_build
@pytest.mark.parametrize("seed", range(6))
def test_compiled_loop_on_random_fleets(seed, monkeypatch):
    """Random caps, replica counts, loads and horizons, one pool or several."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 4))
    edges = [0] + sorted(int(x) for x in rng.choice(np.arange(256, 3072, 128), k - 1, replace=False)) + [4096]
    pools = [SimPool(f"p{q}", CURVE if rng.random() < 0.5 else COMPUTE, int(rng.integers(1, 5)),
                     int(rng.integers(1, 20)), 4096) for q in range(k)]
    case = dict(pools=pools, requests=_edge_requests(100 + seed, 2000, float(rng.uniform(10, 120))),
                router=LengthRouter(edges, [p.name for p in pools]),
                horizon_s=None if rng.random() < 0.5 else float(rng.uniform(5, 40)),
                warmup_s=float(rng.uniform(0, 3)))
    compiled, python, runs = _both(case, monkeypatch)
    assert runs == 1
    assert compiled == python


@needs_build
@pytest.mark.parametrize("case", ["least-queue", "activity", "cap-change"])
def test_other_runs_keep_the_python_loop(case, monkeypatch):
    """Another dispatch, an activity-metered profile or a cap change: the compiled loop is not used."""
    kwargs = {"least-queue": _case(CURVE, None, 0.0, dispatch=LeastQueue()),
              "activity": _case(ACTIVE, None, 0.0),
              "cap-change": _case(CURVE, None, 0.0, cap_changes=[CapChange(10.0, "a", 3)])}[case]
    compiled, python, runs = _both(kwargs, monkeypatch)
    assert runs == 0 and compiled == python


@needs_build
def test_simulate_reports_the_same_either_way(repo_root, monkeypatch):
    """A whole ``simulate`` of calibrated H100 pools on LMSYS lengths (two replications on the compiled loop):
    the report, every figure, either way."""
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    plans = plans_from_spec(inst, "0-2048:h100x2,2048-65536:h100x3")

    def report() -> str:
        out = simulate_plan(inst, plans, SimOptions(requests=20_000, replications=2, seed=9), workers=1).to_json()
        out.pop("wall_seconds")
        return json.dumps(out, sort_keys=True)

    runs = _count_compiled_runs(monkeypatch)
    compiled = report()
    ran = len(runs)
    assert ran >= 2                # the replications (and any thin pool's dedicated runs) ran the compiled loop
    monkeypatch.setattr(engine, "_COMPILED", False)
    assert report() == compiled
    assert len(runs) == ran        # the second report ran the Python loop only
