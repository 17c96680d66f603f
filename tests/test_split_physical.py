"""Split routing on computed (physical) profiles: the MIP's operating points come from the instance's own TTFT
model, so the plan it calls optimal meets the SLO when re-evaluated pool by pool.

Before: the operating points came from the slot model alone, whose capacity ignores the batch stalls that
prefill compute causes; on 70B TP=8 servers the "optimal" split plan ran pools at 1.42 and 1.02 of their
capacity.
"""

from __future__ import annotations

import numpy as np
import pytest

from fleetopt.models.queueing.ttft import ttft_model
from fleetopt.models.segments import raw_between, segment_basis, stats_from_raw
from fleetopt.optimizer.io.instance import load_instance
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance

PHYSICAL = ['gpus=[{name: a100, hardware: A100-SXM-80GB, model: Llama-3.1-70B, tp: 8, dtype: fp16}, '
            '{name: h100, hardware: H100-SXM-80GB, model: Llama-3.1-70B, tp: 8, dtype: fp16}]',
            "slo.ttft_p99_ms=3000"]


def _instance(overrides):
    return load_instance("instances/ref_units_agent_split.yaml", overrides=overrides)


def test_a_physical_split_plan_meets_its_slo_when_re_evaluated():
    report = solve_instance(_instance(PHYSICAL), SolveOptions(compute_baseline=False))
    fleet = report.best.fleet
    assert report.status == "optimal"
    assert fleet.slo_met and fleet.feasible
    assert all(p.capacity_load <= 0.85 + 1e-9 for p in fleet.pools), [p.capacity_load for p in fleet.pools]


@pytest.mark.parametrize("rate", [0.5, 2.0, 6.0])
def test_carries_is_the_least_count_test_at_one_count(rate):
    """``carries`` at N holds exactly from the least count ``min_replicas`` finds (searching), upward."""
    inst = _instance(PHYSICAL)
    prof = inst.gpus[1].profile
    b = np.array([0.0, 8192.0, 65536.0])
    basis = segment_basis(inst.workload.lengths, b, prof.chunk_tokens, inst.workload.input_fraction)
    stats = stats_from_raw(raw_between(basis, [0], [1]), b[:1], b[1:2], prof, n_slots=[prof.n_slots(8192)])
    model = ttft_model("batched")
    traffic = model.traffic(stats, [rate])
    least = int(model.min_replicas(traffic, 3.0, 0.85).replicas[0])
    counts = np.arange(1, least + 4)
    got = np.array([bool(model.carries(traffic, [n], 3.0, 0.85)[0]) for n in counts])
    assert np.array_equal(got, counts >= least), (least, got)
