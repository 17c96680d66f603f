"""``headroom --range``: each step of the least-cost fleet as a change (what to add), from the previous step or
from the current fleet (``--fleet``), by ``fleetopt diff``'s pool matching.

Seed Puzzle 4 (Azure on the seeds' H100 units, two pools at most, split at 4,096): one H100-80GB replica is a TP=8
server, 8 physical GPUs (``data/catalog/calibrated_profiles.yaml``), priced $4.02/hr as one unit.
"""

from __future__ import annotations

import json
import re

import click
import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.commands.workflows import headroom as headroom_cmd
from fleetopt.optimizer.output.contract import validate_document
from fleetopt.optimizer.workflows.headroom import fleet_steps

PUZZLE4 = ["slo.ttft_model=mean-prefill", "workload.cdf=builtin:azure", "pools.max_context=8192",
           "pools.boundaries=[4096]", "gpus=[{name: h100, profile: H100-80GB}]"]
PHYSICAL_PER_REPLICA = 8
UNIT_PER_HR = 4.02
CURRENT = "0-4096:h100x2,4096-8192:h100x2"


@pytest.fixture(scope="module")
def instance(repo_root):
    return api.load(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml", PUZZLE4)


def _replicas(spec: str) -> int:
    """Replicas of a fleet spec, read off its text: the sum of its xN."""
    return sum(int(n) for n in re.findall(r"x(\d+)", spec))


def _by_hardware(change: dict) -> dict:
    return {h["hardware"]: h["physical_gpus_delta"] for h in change["hardware"]}


def test_steps_from_the_previous_one_add_up_to_the_final_fleet(instance):
    s = fleet_steps(instance, 25, 52).to_json()
    assert len(s["steps"]) >= 2 and s["reference"] == "previous step" and s["current_fleet"] is None
    first, last = s["plateaus"][0], s["plateaus"][-1]
    total = _replicas(first["fleet"]) * PHYSICAL_PER_REPLICA
    for st in s["steps"]:
        assert st["change"] == st["change_from_previous"]
        added = _by_hardware(st["change"])
        assert set(added) == {"H100-80GB"}
        total += added["H100-80GB"]
        grown = _replicas(st["after"]["fleet"]) - _replicas(st["before"]["fleet"])
        assert added["H100-80GB"] == grown * PHYSICAL_PER_REPLICA
        assert st["change"]["cost_per_hr_delta"] == pytest.approx(grown * UNIT_PER_HR)
        assert st["change"]["hardware"][0]["action"] == ("buy" if grown > 0 else "release" if grown < 0 else "keep")
    assert total == _replicas(last["fleet"]) * PHYSICAL_PER_REPLICA == last["physical_gpus"]


def test_steps_from_the_current_fleet(instance):
    s = fleet_steps(instance, 60, 70, current=CURRENT).to_json()
    assert s["reference"] == "current fleet" and s["current_fleet"]["fleet"] == CURRENT
    now = _replicas(CURRENT) * PHYSICAL_PER_REPLICA                                   # 4 replicas: 32 GPUs
    assert s["current_fleet"]["physical_gpus"] == now == 32
    assert s["steps"]
    for st in s["steps"]:
        target = _replicas(st["after"]["fleet"])
        assert _by_hardware(st["change"]) == {"H100-80GB": target * PHYSICAL_PER_REPLICA - now}
        assert st["change"]["cost_per_hr_delta"] == pytest.approx((target - 4) * UNIT_PER_HR)
        assert _by_hardware(st["change_from_previous"]) == {
            "H100-80GB": (target - _replicas(st["before"]["fleet"])) * PHYSICAL_PER_REPLICA}
    for p in s["plateaus"]:
        assert _by_hardware(p["change"]) == {"H100-80GB": _replicas(p["fleet"]) * PHYSICAL_PER_REPLICA - now}


def test_cli_range_with_fleet_keeps_the_old_fields_and_validates(repo_root):
    group = click.Group(commands={"headroom": headroom_cmd})
    args = ["headroom", str(repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml"),
            *sum((["--set", o] for o in PUZZLE4), []), "--range", "60:70", "--fleet", CURRENT]
    res = CliRunner().invoke(group, [*args, "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    validate_document(doc)
    for key in ("range", "steps", "plateaus", "solved"):
        assert key in doc
    assert {"arrival_rate", "before", "after", "change", "change_from_previous"} <= set(doc["steps"][0])
    res = CliRunner().invoke(group, [*args, "--format", "plain"])
    assert res.exit_code == 0 and "change from current fleet" in res.stdout and "buy 8 H100-80GB" in res.stdout
