"""Quality of verified plans: against the cheapest plan that meets the SLO in simulation, found by enumeration.

On small random instances (at most 6 boundaries, at most 3 GPU options, at most 2 pools) ``solve --verify-top 3``
must return a plan whose cost is within 5 % of the exhaustive optimum: every one- and two-pool plan on the
instance's boundaries and GPU options, each pool at the least replica count that meets the SLO in simulation
alone (the verifier's own rule, ``ci-upper``, with the same settings and seed), and a plan that would beat the
solver's confirmed by a long simulation (:func:`_confirmed_optimum`). The enumeration is the
independent part: it looks at every plan, where the solver looks at a MIP's best few and cuts. The sizing rule of
a pool (:class:`fleetopt.optimizer.simulation.pool_sizing.PoolSizer`) is shared on purpose, so that both sides
judge a pool alike; the utilisation cap is lifted (``max_utilization: 1``) because the enumeration knows only
the SLO.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from fleetopt.optimizer import api
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.pool_sizing import PoolCandidate, PoolSizer, pool_misses

OPTIONS = SimOptions(requests=100_000)
LONG = 600_000
"""Requests of the confirming simulation of a plan that would beat the solver's."""
GPUS = {"a10g": "A10G", "a100": "A100-80GB", "h100": "H100-80GB"}
TOP = 8192


def _instance(seed: int, folder: Path):
    rng = np.random.default_rng(seed)
    workload = str(rng.choice(["azure", "lmsys"]))
    names = sorted(rng.choice(list(GPUS), size=int(rng.integers(1, 4)), replace=False))
    bounds = sorted(int(b) for b in rng.choice([1024, 2048, 3072, 4096, 6144], size=int(rng.integers(1, 6)),
                                               replace=False))
    rate = float(np.round(rng.uniform(8.0, 40.0), 1))
    slo = int(rng.choice([400, 600, 1000]))
    gpus = ", ".join(f"{{name: {n}, profile: {GPUS[n]}}}" for n in names)
    text = (f"name: quality-{seed}\nworkload: {{cdf: builtin:{workload}, arrival_rate: {rate}}}\n"
            f"slo: {{ttft_p99_ms: {slo}}}\ngpus: [{gpus}]\n"
            f"pools: {{max_pools: 2, max_context: {TOP}, boundaries: {bounds}}}\n"
            "constraints: {max_utilization: 1.0}\nallow_mixed_models: true\n")
    path = folder / f"quality_{seed}.yaml"
    path.write_text(text)
    return api.load(path), names, bounds


def _exhaustive(inst, names, bounds, sizer) -> tuple[float, list]:
    """The least cost per hour over every one- and two-pool plan, each pool at its least passing count."""
    least = {}

    def pool(lo: int, hi: int, gpu: str):
        if (lo, hi, gpu) not in least:
            profile = inst.gpu(gpu).profile
            cand = PoolCandidate(lo, hi, gpu, int(profile.n_slots(hi)))
            z = sizer.size(cand, 0, analytic_replicas=32)
            least[(lo, hi, gpu)] = (cand, z.least_replicas, np.inf if not z.feasible
                                    else z.least_replicas * profile.cost_usd_per_hr)
        return least[(lo, hi, gpu)]

    plans = [[(0, TOP, g)] for g in names]
    plans += [[(0, b, g1), (b, TOP, g2)] for b in bounds for g1, g2 in itertools.product(names, repeat=2)]
    costed = [(sum(pool(*p)[2] for p in plan), [pool(*p) for p in plan]) for plan in plans]
    return min(costed, key=lambda c: c[0])


def _confirmed_optimum(inst, names, bounds, below: float) -> float:
    """The exhaustive optimum, each plan cheaper than ``below`` confirmed by a long simulation of the whole plan.

    A pool alone on a short run can pass where a long one misses: a single replica near saturation has rare
    congestion episodes that 20,000 requests may not contain (measured: 2,048-8,192 on one H100 in seed 14
    passes alone, and misses with 1.2-1.8 s P99 on 600,000). A plan that would beat the solver's is simulated
    with ``LONG`` requests; a pool that misses there gets its count marked failing and is sized again.
    """
    sizer = PoolSizer(inst, OPTIONS, "ci-upper")
    slo_ms = inst.slo.ttft_p99_s * 1000.0
    for _ in range(12):
        cost, pools = _exhaustive(inst, names, bounds, sizer)
        if not cost < below:
            return cost
        spec = ",".join(f"{c.lo_tokens}-{c.hi_tokens}:{c.gpu}x{n}" for c, n, _ in pools)
        long = api.simulate_report(inst, spec, SimOptions(requests=LONG, seed=5))
        missed = [(c, n, p) for (c, n, _), p in zip(pools, long.pools) if pool_misses(p, "ci-upper", slo_ms)]
        if not missed:
            return cost                       # a cheaper plan that passes a long run: a real quality gap
        for c, n, p in missed:
            sizer.record_miss(c, n, p)
    raise AssertionError("the confirmation did not settle in 12 rounds")


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_verified_plan_is_within_5_percent_of_the_exhaustive_optimum(seed, tmp_path):
    inst, names, bounds = _instance(seed, tmp_path)
    _, v = api.verify(inst, OPTIONS, verify_top=3, max_rounds=4)
    cost = v.chosen.plan.fleet.cost_per_hr if v.verified else np.inf
    best = _confirmed_optimum(inst, names, bounds, below=cost / 1.05)
    if not np.isfinite(best):
        assert not v.verified
        return
    assert v.verified, v
    assert cost <= best * 1.05 + 1e-9, (cost, best)
