"""TTFT models as one protocol (fleetopt.models.queueing.ttft), availability inflation, an overloaded pool's reason.

The closed forms of each model live elsewhere and are not repeated here: ``tail`` and ``mean-prefill`` in
``tests/test_formulas.py`` and ``tests/test_queueing.py``, ``batched`` in ``tests/test_batched.py``.
"""

from __future__ import annotations

import math
import re
import typing

import numpy as np
import pytest

from fleetopt.models.fleet import PoolPlan, ServiceLevel, evaluate_fleet, inflate_for_availability
from fleetopt.models.queueing.ttft import TTFT_MODELS, TTFTModel, ttft_model
from fleetopt.models.workload import LengthDistribution
from fleetopt.optimizer.io.schema import RawSlo


def _schema_models() -> tuple[str, ...]:
    return typing.get_args(RawSlo.model_fields["ttft_model"].annotation)


def test_the_mapping_covers_every_model_the_schema_allows_and_no_other():
    allowed = _schema_models()
    assert allowed  # a Literal: the schema enumerates the models
    assert set(TTFT_MODELS) == set(allowed)


@pytest.mark.parametrize("name", _schema_models())
def test_each_model_satisfies_the_protocol_under_its_own_name(name):
    model = ttft_model(name)
    assert isinstance(model, TTFTModel)
    assert model.name == name
    for method in ("traffic", "min_replicas", "miss_probability", "miss_function", "p99_ttft_s",
                   "prefill_miss_share", "prefill_floor_s", "drop_reason", "pool_miss_reason", "load_erlangs",
                   "power_w"):
        assert callable(getattr(model, method)), method
    assert isinstance(model.warm_start, bool)
    assert model.split_point_model in ("tail", "mean-prefill")  # the split MIP's operating points are slot models


def test_an_unknown_model_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="ttft_model must be one of .*'batched'.*got 'fifo'"):
        ttft_model("fifo")


@pytest.mark.parametrize("replicas, availability, expected", [
    (7, 0.99, 8),       # 7.0707... -> 8
    (10, 1.0, 10),
    (99, 0.99, 100),    # 99 / 0.99 is 100 in exact arithmetic
    (21, 0.7, 30),      # 21 / 0.7 = 30.000000000000004 in floating point: still 30
    (0, 0.9, 0),
    (1, 0.5, 2),
])
def test_availability_inflation_is_the_ceiling_of_n_over_a(replicas, availability, expected):
    assert inflate_for_availability(replicas, availability) == expected
    assert isinstance(inflate_for_availability(replicas, availability), int)


def test_availability_inflation_is_array_aware():
    out = inflate_for_availability(np.array([7, 10, 21]), 0.7)
    assert out.tolist() == [10, 15, 30]   # 10.0, 14.29 -> 15, 30.000000000000004 -> 30
    assert out.dtype == np.int64


@pytest.mark.parametrize("name", ["batched", "tail"])
def test_an_overloaded_pool_names_its_load_ratio_not_an_infinite_utilisation(name):
    """One replica given 100x the traffic it can carry: the reason reads 'runs at X of its capacity' with X the
    pool's capacity load as reported (finite, above 1)."""
    from fleetopt.optimizer.io.catalog import load_catalog

    prof = load_catalog().profiles["H100-80GB"]
    dist = LengthDistribution.from_cdf([(256, 0.5), (1024, 1.0)])
    fleet = evaluate_fleet([PoolPlan(0, 1024, "h100", prof, replicas=1)], dist, 2000.0, ServiceLevel(1.0, name))
    pool = fleet.pools[0]
    assert not pool.slo_met
    m = re.fullmatch(r"overloaded: runs at (\S+) of its capacity, the queue grows without bound", pool.miss_reason)
    assert m, pool.miss_reason
    assert math.isfinite(float(m.group(1))) and float(m.group(1)) > 1.0
    assert float(m.group(1)) == pytest.approx(pool.capacity_load, abs=0.005)
    assert "inf" not in pool.miss_reason
