"""Fixed-seed runs of the iteration-mode engine against figures pinned from an earlier engine.

The other DES tests assert closed forms and step-by-step references; these pin the exact floats of a few
seeded runs, one per path of an iteration-mode replica (plain, KV overcommit, token budget) and the features
that hook into it (cap changes, live routing, dispatch by waiting count, activity power, compute terms, a
horizon with a warm-up), so that a restructuring of the engine that is meant to change nothing provably
changes nothing, bit for bit. The figures were produced by the pre-refactor engine at commit e475ff8
(``_iteration_station``, the closure version); a deliberate change of the engine's results has to
re-derive them, and say so.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from fleetopt.models.power import ActivityPower, PowerCurve
from fleetopt.models.profiles import CalibratedProfile
from fleetopt.solvers.des.engine import simulate
from fleetopt.solvers.des.records import Outcome
from fleetopt.solvers.des.routers import SpilloverRouter
from fleetopt.solvers.des.routing import LeastQueue, LengthRouter, Requests, poisson_arrivals
from fleetopt.solvers.des.state import CapChange, SimPool

# Profiles built here (not read from the catalog), so a change of the shipped data cannot move the figures.
CURVE = CalibratedProfile("curve", "toy", 0.006, 0.0004, 4096, 256, 16, 1 << 16, 64, 1.0, 1,
                          PowerCurve(300.0, 700.0, 1.0, 4.0, "none"))
ACTIVE = CalibratedProfile("active", "toy", 0.00643, 4.5e-8 * 8192, 8192, 512, 16, 1 << 16, 256, 3.0, 1,
                           ActivityPower(idle_w=90.0, limit_w=700.0, weights_w=400.0, kv_w=650.0, compute_w=900.0),
                           g_s=2.5e-5, prefill_a_s=26.5e-6, prefill_b_s=7.4e-10)
TIGHT = CalibratedProfile("tight", "toy", 0.01, 0.004, 512, 16, 4, 40, 512, 1.0, 1,
                          ActivityPower(idle_w=70.0, limit_w=1e6, weights_w=400.0, kv_w=700.0, compute_w=800.0),
                          g_s=2e-4, prefill_a_s=3e-5, prefill_b_s=4e-8)


def _requests(seed: int, n: int, rate: float, max_in: int, max_out: int) -> Requests:
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    arrival = poisson_arrivals(rate, n, rng)
    return Requests(arrival, rng.integers(0, max_in, n), rng.integers(1, max_out, n))


def _plain_curve():
    """Two plain pools with a power curve, JSQ, run to the last completion; a cap cut and restore."""
    pools = [SimPool("short", CURVE, 2, 12, 2048), SimPool("long", CURVE, 3, 8, 4096)]
    return dict(pools=pools, requests=_requests(11, 2500, 40.0, 2500, 300),
                router=LengthRouter([0, 2048, 4096], ["short", "long"]),
                cap_changes=[CapChange(20.0, "short", 4), CapChange(35.0, "short", 12)])


def _plain_active():
    """A plain pool with compute terms and activity power, least-queue dispatch, a horizon and a warm-up."""
    return dict(pools=[SimPool("p", ACTIVE, 3, 24, 8192)], requests=_requests(12, 3000, 60.0, 6000, 400),
                router=LengthRouter([0, 8192], ["p"]), dispatch=LeastQueue(), horizon_s=40.0, warmup_s=5.0)


def _kv():
    """An overcommitted pool (KV blocks run out, sequences are preempted) with compute terms and activity power."""
    pool = SimPool("p", TIGHT, 2, 6, 128, allow_overcommit=True)
    assert pool.overcommitted
    return dict(pools=[pool], requests=_requests(13, 600, 8.0, 80, 40), router=LengthRouter([0, 128], ["p"]))


def _budget():
    """A pool whose token budget binds, with compute terms and activity power, and a horizon."""
    pool = SimPool("p", ACTIVE, 2, 16, 8192, max_batched_tokens=700)
    assert pool.budget_binds
    return dict(pools=[pool], requests=_requests(14, 2000, 30.0, 3000, 200), router=LengthRouter([0, 8192], ["p"]),
                horizon_s=50.0)


def _spillover():
    """A short pool too small for its traffic spilling to a budgeted long pool (live routing, reroutes)."""
    pools = [SimPool("short", CURVE, 1, 6, 2048), SimPool("long", ACTIVE, 2, 16, 8192, max_batched_tokens=900)]
    return dict(pools=pools, requests=_requests(15, 2500, 35.0, 4000, 250),
                router=SpilloverRouter([0, 2048, 8192], ["short", "long"], 3))


CASES = {"plain-curve": _plain_curve, "plain-active": _plain_active, "kv": _kv, "budget": _budget,
         "spillover": _spillover}


def fingerprint(res) -> dict:
    """Exact figures of a run: counts, sums of the time columns, per-replica integrals, and a digest of every
    column and integral's bytes (float sums as ``repr``, which round-trips)."""
    digest = hashlib.sha256()
    for name in ("start_at_s", "first_token_at_s", "end_at_s", "pool", "replica", "outcome", "pool_mean_in_system",
                 "pool_busy_slot_s", "replica_mean_batch", "replica_energy_j", "preemptions", "spilled"):
        digest.update(np.ascontiguousarray(getattr(res, name)).tobytes())
    return {
        "events": int(res.events),
        "completed": int(res.count(Outcome.COMPLETED)),
        "start_sum_s": repr(float(np.nansum(res.start_at_s))),
        "first_sum_s": repr(float(np.nansum(res.first_token_at_s))),
        "end_sum_s": repr(float(np.nansum(res.end_at_s))),
        "energy_j": [repr(float(x)) for x in res.replica_energy_j],
        "mean_batch": [repr(float(x)) for x in res.replica_mean_batch],
        "preemptions": [int(x) for x in res.preemptions],
        "spilled": [int(x) for x in res.spilled],
        "sha256": digest.hexdigest(),
    }


# Produced by the pre-refactor engine at commit e475ff8 (run this module as a script to print them).
PINNED: dict[str, dict] = {'budget': {'events': 4020,
            'completed': 1044,
            'start_sum_s': '26928.487026303133',
            'first_sum_s': '26925.632991612085',
            'end_sum_s': '26901.0907969117',
            'energy_j': ['31211.47525051481', '31132.612877508283'],
            'mean_batch': ['15.750698714663608', '15.701376697507719'],
            'preemptions': [0],
            'spilled': [0],
            'sha256': '5c29d274baccb35729bb0bf50a67d3a0caa3e5aae4c27da4ae23e023e33485a3'},
 'kv': {'events': 2381,
        'completed': 600,
        'start_sum_s': '23296.257241607906',
        'first_sum_s': '23318.977026025517',
        'end_sum_s': '23456.341601803317',
        'energy_j': ['27013.870213708826', '23988.353580116604'],
        'mean_batch': ['1.130473177492097', '0.8883025678528991'],
        'preemptions': [153],
        'spilled': [0],
        'sha256': '58ab47a9744691ce446d5e42520bd1327aab67ae2ce97eade1714559b4f640ea'},
 'plain-active': {'events': 3534,
                  'completed': 621,
                  'start_sum_s': '13543.885949670708',
                  'first_sum_s': '13563.855514446097',
                  'end_sum_s': '13489.411660933101',
                  'energy_j': ['22856.262675644808', '22958.654382331977', '23035.43240703195'],
                  'mean_batch': ['23.999999999999993', '23.999999999999986', '24.000000000000007'],
                  'preemptions': [0],
                  'spilled': [0],
                  'sha256': 'fe38c3ea0bffb09a79a1bdd40501b433d577ada412d5c2cfc0f82e7322c9e60b'},
 'plain-curve': {'events': 7816,
                 'completed': 2500,
                 'start_sum_s': '114154.39579091706',
                 'first_sum_s': '114247.6532399405',
                 'end_sum_s': '116926.02292382723',
                 'energy_j': ['43727.2016453439',
                              '43223.38812351274',
                              '32712.186624297185',
                              '32469.258442077728',
                              '32246.831933071502'],
                 'mean_batch': ['10.684850684134295',
                                '10.300813862725745',
                                '2.48512349312173',
                                '2.310943517989274',
                                '2.1596834345304567'],
                 'preemptions': [0, 0],
                 'spilled': [0, 0],
                 'sha256': '5db5d828178612cb0d322edce4514b637eb619314225eb2e84093613d05b522a'},
 'spillover': {'events': 8522,
               'completed': 2500,
               'start_sum_s': '152248.14175603102',
               'first_sum_s': '152547.18164615',
               'end_sum_s': '156950.66818475127',
               'energy_j': ['46794.64486980037', '87208.64405610722', '85154.984585634'],
               'mean_batch': ['3.160742902354423', '15.748293773248154', '15.372024668412143'],
               'preemptions': [0, 0],
               'spilled': [688, 0],
               'sha256': '562f61c6f3c0a900898ded63536d79c01ef4a310ef40095e6597715b6c2e3ee5'}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fixed_seed_runs_match_the_pinned_figures(case):
    got = fingerprint(simulate(**CASES[case]()))
    assert got == PINNED[case]


def test_each_case_exercises_its_path():
    # The pinned cases would pin little if their paths sat idle: preemptions, spills and a binding budget.
    assert PINNED["kv"]["preemptions"][0] > 0
    assert PINNED["spillover"]["spilled"][0] > 0
    assert PINNED["plain-active"]["completed"] < 3000    # the horizon cuts the run


if __name__ == "__main__":
    import pprint

    pprint.pprint({k: fingerprint(simulate(**CASES[k]())) for k in sorted(CASES)}, width=120, sort_dicts=False)
