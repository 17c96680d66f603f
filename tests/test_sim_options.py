"""``SimOptions``: the one frozen record of a simulation run's settings, validated once when built.

Every field rejects its bad values with a ``ValueError`` (a :class:`SimOptionsError`) naming the field, the value
and what is allowed; ``dataclasses.replace`` builds a new record, so it validates too; the JSON of a record
(``dataclasses.asdict``) gives the same record back.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.simulation.options import (
    MIN_REQUESTS_PER_REPLICATION,
    EngineOptions,
    SimOptions,
    SimOptionsError,
)

# (field as named in the error, the settings, a phrase of what is allowed)
BAD = [
    ("requests", {"requests": 0}, "whole number >= 1"),
    ("requests", {"requests": -5}, "whole number >= 1"),
    ("requests", {"requests": 1000.0}, "whole number >= 1"),
    ("requests", {"requests": True}, "whole number >= 1"),
    ("requests", {"requests": "1000"}, "whole number >= 1"),
    ("requests", {"requests": 400, "replications": 5}, "give at least 500"),
    ("replications", {"replications": 0}, "whole number >= 1"),
    ("replications", {"replications": 2.0}, "whole number >= 1"),
    ("seed", {"seed": -1}, "whole number >= 0"),
    ("seed", {"seed": None}, "whole number >= 0"),
    ("seed", {"seed": 1.5}, "whole number >= 0"),
    ("warmup_share", {"warmup_share": -0.1}, "[0, 0.5]"),
    ("warmup_share", {"warmup_share": 0.6}, "[0, 0.5]"),
    ("warmup_share", {"warmup_share": math.nan}, "[0, 0.5]"),
    ("warmup_share", {"warmup_share": "0.1"}, "[0, 0.5]"),
    ("mode", {"mode": "batch"}, "slot, iteration"),
    ("router", {"router": "magic"}, "auto, length, split, random, compress, spillover"),
    ("dispatch", {"dispatch": "random"}, "jsq, round-robin"),
    ("arrivals", {"arrivals": "bursty"}, "poisson, trace, mmpp, diurnal"),
    ("peak_to_mean", {"peak_to_mean": 0.5}, ">= 1"),
    ("peak_to_mean", {"peak_to_mean": math.inf}, "finite"),
    ("peak_to_mean", {"peak_to_mean": math.nan}, "finite"),
    ("peak_to_mean", {"arrivals": "diurnal", "peak_to_mean": 3.0}, "above 2"),
    ("mean_dwell_s", {"mean_dwell_s": 0.0}, "> 0"),
    ("mean_dwell_s", {"mean_dwell_s": math.inf}, "finite"),
    ("period_s", {"period_s": 0.0}, "> 0"),
    ("period_s", {"period_s": -60.0}, "> 0"),
    ("spill_bound", {"router": "spillover", "spill_bound": -1}, "whole number >= 0"),
    ("spill_bound", {"router": "spillover", "spill_bound": 1.5}, "whole number >= 0"),
    ("spill_bound", {"router": "spillover", "spill_bound": True}, "whole number >= 0"),
    ("spill_bound", {"router": "length", "spill_bound": 4}, "router 'spillover' only"),
    ("precision", {"precision": 0.0}, "fraction in (0, 1)"),
    ("precision", {"precision": 1.0}, "fraction in (0, 1)"),
    ("precision", {"precision": "5%"}, "fraction in (0, 1)"),
    ("max_requests", {"max_requests": 0}, "whole number >= 1"),
    ("max_requests", {"requests": 20_000, "precision": 0.05, "max_requests": 10_000}, "below requests 20000"),
    ("engine", {"engine": "paged"}, "not an EngineOptions"),
    ("engine.kv", {"engine": EngineOptions(kv="lazy")}, "reserve, paged"),
    ("engine.availability", {"engine": EngineOptions(availability="sometimes")}, "all-up, sampled"),
    ("engine.max_num_seqs", {"engine": EngineOptions(kv="paged", max_num_seqs=0)}, "whole number in [1, "),
    ("engine.max_num_seqs", {"engine": EngineOptions(max_num_seqs=64)}, "batch cap of kv 'paged'"),
    ("engine.max_batched_tokens", {"engine": EngineOptions(max_batched_tokens=0)}, "whole number in [1, "),
    ("engine.max_batched_tokens", {"engine": EngineOptions(kv="paged", max_batched_tokens=4096)},
     "not supported with kv 'paged'"),
    ("mode", {"mode": "slot", "engine": EngineOptions(kv="paged")}, "need mode 'iteration'"),
    ("mode", {"mode": "slot", "engine": EngineOptions(max_batched_tokens=4096)}, "need mode 'iteration'"),
]


@pytest.mark.parametrize("field, settings, allowed", BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_each_bad_value_names_its_field_value_and_what_is_allowed(field, settings, allowed):
    with pytest.raises(ValueError) as err:
        SimOptions(**settings)
    assert isinstance(err.value, SimOptionsError) and isinstance(err.value, InstanceError)
    ((named, text),) = err.value.by_field                     # one problem, on that field
    assert named == field and allowed in text
    if field.startswith("engine."):
        value = getattr(settings["engine"], field.removeprefix("engine."))
    else:
        value = settings.get(field)
    if field != "mode":                                         # the slot-mode line names the engine settings
        assert repr(value) in text or f"{value:g}" in text, text
    assert str(err.value) == f"{field}: {text}"


def test_every_field_has_a_bad_value_above():
    fields = {f.name for f in dataclasses.fields(SimOptions)}
    fields |= {f"engine.{f.name}" for f in dataclasses.fields(EngineOptions)}
    assert fields <= {field for field, _, _ in BAD}


def test_replace_validates_again():
    good = SimOptions(requests=2000, replications=2)
    assert dataclasses.replace(good, seed=7).seed == 7
    for bad in ({"replications": 0}, {"requests": 150}, {"router": "length", "spill_bound": 3},
                {"engine": EngineOptions(kv="paged"), "mode": "slot"}):
        with pytest.raises(ValueError):
            dataclasses.replace(good, **bad)


def test_every_problem_is_collected_into_one_error():
    with pytest.raises(SimOptionsError) as err:
        SimOptions(router="magic", arrivals="diurnal", peak_to_mean=3.0, requests=50, warmup_share=0.9,
                   engine=EngineOptions(kv="lazy"))
    assert [f for f, _ in err.value.by_field] == ["router", "requests", "warmup_share", "peak_to_mean", "engine.kv"]
    assert len(str(err.value).splitlines()) == 5 and err.value.problems == str(err.value).splitlines()


def test_limits_and_other_number_types_are_accepted():
    SimOptions(warmup_share=0.0)
    SimOptions(warmup_share=0.5, peak_to_mean=1.0, arrivals="mmpp")
    SimOptions(arrivals="diurnal", peak_to_mean=2.0, period_s=3600.0)
    SimOptions(router="spillover", spill_bound=0)
    o = SimOptions(requests=np.int64(MIN_REQUESTS_PER_REPLICATION), replications=np.int64(1), seed=np.int64(3),
                   warmup_share=np.float64(0.2))
    assert type(o.seed) is int and type(o.warmup_share) is float and json.dumps(o.to_json())  # plain numbers
    SimOptions(requests=MIN_REQUESTS_PER_REPLICATION, replications=9, arrivals="trace")   # a replay runs one
    SimOptions(precision=0.05, requests=1000, max_requests=1000)
    SimOptions(engine=EngineOptions(kv="paged", max_num_seqs=128, availability="sampled"))


def test_json_round_trip_gives_the_same_record():
    o = SimOptions(requests=12_345, replications=3, seed=9, warmup_share=0.2, mode="iteration", router="spillover",
                   dispatch="round-robin", arrivals="diurnal", peak_to_mean=1.5, mean_dwell_s=4.0, period_s=600.0,
                   spill_bound=2, precision=0.05, max_requests=200_000,
                   engine=EngineOptions(kv="reserve", max_batched_tokens=2048, availability="sampled"))
    data = o.to_json()
    assert data == dataclasses.asdict(o) and data["engine"] == o.engine.to_json()
    assert SimOptions.from_json(json.loads(json.dumps(data))) == o
    assert SimOptions.from_json(dataclasses.asdict(SimOptions())) == SimOptions()
    assert SimOptions.from_json({"seed": 4}) == SimOptions(seed=4)
    with pytest.raises(SimOptionsError, match="warmup: is not a setting of SimOptions"):
        SimOptions.from_json({"warmup": 0.2})


def test_the_record_is_frozen_and_hashable():
    o = SimOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.seed = 1
    assert hash(o) == hash(SimOptions()) and o != SimOptions(seed=1)


def test_cli_names_its_own_flags(repo_root):
    """The record names its fields; each command reports them under its flags."""
    path = str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    r = CliRunner().invoke(main, ["solve", path, "--verify-top", "1", "--sim-requests", "1000",
                                  "--sim-replications", "20"])
    assert r.exit_code == 2 and r.output.strip() == (
        "error: --sim-requests: 1000 leaves fewer than 100 requests per replication (20 replications); give at "
        "least 2000")
    r = CliRunner().invoke(main, ["simulate", path, "--fleet", "0-65536:h100x8", "--max-num-seqs", "64"])
    assert r.exit_code == 2 and r.output.strip().startswith("error: --max-num-seqs: 64 sets the batch cap of kv")
    r = CliRunner().invoke(main, ["simulate", path, "--fleet", "0-65536:h100x8", "--requests", "200"])
    assert r.exit_code == 2 and r.output.strip().startswith("error: --requests: 200 leaves fewer than 100")
