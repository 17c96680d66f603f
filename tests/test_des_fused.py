"""The engine's inlined plain loop (:func:`fleetopt.solvers.des.engine._plain_loop`) against the station's
closures, and the replications of ``simulate`` on forked workers against the same replications in one process.

Both are meant to change nothing: every case runs both ways and the records, integrals and event counts must be
equal bit for bit (the regression fingerprint of ``tests/test_des_regression.py``), so neither side is an
expected value produced by the code under test alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.optimizer import api
from fleetopt.optimizer import forked
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan
from fleetopt.solvers.des import engine
from fleetopt.solvers.des.routing import (JoinShortestQueue, LeastQueue, LengthRouter, Requests, RoundRobin,
                                          poisson_arrivals)
from fleetopt.solvers.des.state import CapChange, SimPool
from tests.test_des_regression import CASES, fingerprint

CURVE = CalibratedProfile("curve", "toy", 0.006, 0.0004, 4096, 256, 16, 1 << 16, 64, 1.0, 1,
                          PowerCurve(300.0, 700.0, 1.0, 4.0, "none"))
ACTIVE = CalibratedProfile("active", "toy", 0.00643, 4.5e-8 * 8192, 8192, 512, 16, 1 << 16, 256, 3.0, 1,
                           ActivityPower(idle_w=90.0, limit_w=700.0, weights_w=400.0, kv_w=650.0, compute_w=900.0),
                           g_s=2.5e-5, prefill_a_s=26.5e-6, prefill_b_s=7.4e-10)


def _both(kwargs_factory, monkeypatch) -> tuple[dict, dict, int]:
    """The run's fingerprint with the inlined loop where it applies, then with the closures; and how many times the
    inlined loop ran."""
    loops = []
    real = engine._plain_loop
    monkeypatch.setattr(engine, "_plain_loop", lambda *a: loops.append(1) or real(*a))
    fused = fingerprint(engine.simulate(**kwargs_factory()))
    monkeypatch.setattr(engine, "_FUSED", False)
    closures = fingerprint(engine.simulate(**kwargs_factory()))
    monkeypatch.setattr(engine, "_FUSED", True)
    return fused, closures, len(loops)


@pytest.mark.parametrize("case", sorted(CASES))
def test_regression_cases_run_the_same_either_way(case, monkeypatch):
    fused, closures, loops = _both(CASES[case], monkeypatch)
    assert loops == (1 if case.startswith("plain") else 0)      # KV, budget and live routing keep the closures
    assert fused == closures


def _edge_requests(seed: int, n: int, rate: float) -> Requests:
    """Poisson arrivals with prompts and outputs of every kind: no prompt (decoding from the start), no output
    (completes at its prefill's end), one chunk, many chunks."""
    rng = np.random.default_rng(seed)
    arrival = poisson_arrivals(rate, n, rng)
    prompt = rng.integers(0, 3000, n)
    output = rng.integers(0, 200, n)
    prompt[::7] = 0
    output[3::11] = 0
    output[prompt + output < 1] = 1
    return Requests(arrival, prompt, output)


@pytest.mark.parametrize("dispatch", [JoinShortestQueue(), LeastQueue(), RoundRobin()], ids=lambda d: d.name)
@pytest.mark.parametrize("profile", [CURVE, ACTIVE], ids=["curve", "activity"])
@pytest.mark.parametrize("horizon", [None, 30.0], ids=["drained", "horizon"])
def test_edge_streams_run_the_same_either_way(dispatch, profile, horizon, monkeypatch):
    def case():
        pools = [SimPool("a", profile, 2, 10, 2048), SimPool("b", profile, 3, 6, 4096)]
        return dict(pools=pools, requests=_edge_requests(21, 3000, 70.0),
                    router=LengthRouter([0, 2048, 4096], ["a", "b"]), dispatch=dispatch, horizon_s=horizon,
                    warmup_s=4.0, cap_changes=[CapChange(10.0, "a", 3), CapChange(18.0, "a", 10)])

    fused, closures, loops = _both(case, monkeypatch)
    assert loops == 1
    assert fused["completed"] > 1000                  # the run is loaded and long enough to queue
    assert fused == closures


def _report(inst, fleet: str, workers: int) -> dict:
    rep = simulate_plan(inst, plans_from_spec(inst, fleet), SimOptions(requests=12_000, replications=3, seed=4),
                        workers=workers)
    out = rep.to_json()
    out.pop("wall_seconds")
    return out


def test_forked_replications_give_the_same_report(repo_root, monkeypatch):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    fleet = "0-2048:h100x2,2048-65536:h100x2"
    here = _report(inst, fleet, 1)
    monkeypatch.setattr(forked, "MIN_FORKED_REQUESTS", 1)
    assert forked.workers_for(3, 4000, 2) == (2 if forked.sys.platform == "linux" else 1)
    there = _report(inst, fleet, 2)
    assert json.dumps(here, sort_keys=True) == json.dumps(there, sort_keys=True)


def test_workers_for_rules(monkeypatch):
    monkeypatch.setattr(forked.sys, "platform", "linux")
    monkeypatch.setattr(forked, "usable_cpus", lambda: 2)
    assert forked.workers_for(1, 10**6) == 1                              # one replication: nothing to share
    assert forked.workers_for(5, forked.MIN_FORKED_REQUESTS - 1) == 1     # too short to pay for the workers
    assert forked.workers_for(5, 40_000) == 5                             # one each, up to 4 per core
    assert forked.workers_for(20, 40_000) == 8
    assert forked.workers_for(5, 40_000, 1) == 1 and forked.workers_for(5, 10, 3) == 3
    monkeypatch.setattr(forked.sys, "platform", "darwin")
    assert forked.workers_for(5, 40_000, 3) == 1
