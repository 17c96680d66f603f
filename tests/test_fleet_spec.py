"""The ``--fleet`` spec a solve prints round-trips: evaluating it gives the plan the solver chose."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer import api
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.plan.evaluate import evaluate, fleet_spec, parse_fleet
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance


@pytest.mark.parametrize("name, overrides", [
    ("ref_units_lmsys_a100_h100.yaml", []),
    ("ref_units_lmsys_a100_h100.yaml", ["slo.tpot_p99_ms=30"]),     # TPOT caps below the slots must travel in the spec
    ("ref_puzzle6_lmsys_mixed.yaml", []),
    ("ref_1w_table3_azure.yaml", []),                      # compress-and-route pools (@gamma)
])
def test_solved_plans_round_trip_through_their_spec(repo_root, name, overrides):
    inst = api.load(repo_root / "instances" / name, overrides)
    report = solve_instance(inst, SolveOptions(top=3))
    assert report.plans
    for plan in report.plans:
        spec = fleet_spec(inst, plan.fleet)
        again = evaluate(inst, parse_fleet(spec, inst)).result
        assert [(p.min_tokens, p.max_tokens, p.gpu, p.replicas, p.max_num_seqs, p.compress_gamma)
                for p in again.pools] == [(p.min_tokens, p.max_tokens, p.gpu, p.replicas, p.max_num_seqs,
                                           p.compress_gamma) for p in plan.fleet.pools]
        assert again.cost_per_hr == pytest.approx(plan.fleet.cost_per_hr, rel=1e-12)
        assert again.ttft_p99_ms == pytest.approx(plan.fleet.ttft_p99_ms, rel=1e-9)
    if overrides:
        assert "#" in fleet_spec(inst, report.plans[0].fleet)


def test_batch_cap_in_the_spec_is_checked(repo_root):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    held = inst.gpu("h100").profile.n_slots(65536)
    assert parse_fleet(f"0-65536:h100#{held}", inst).pools[0][5] == held
    with pytest.raises(InstanceError) as err:
        parse_fleet(f"0-65536:h100#{held + 1}", inst)
    assert f"[1, {held}]" in str(err.value)
    lowered = evaluate(inst, parse_fleet("0-65536:h100#4", inst)).result.pools[0]
    assert lowered.max_num_seqs == 4


def test_solve_json_and_text_carry_the_spec(repo_root, tmp_path):
    out = tmp_path / "s.json"
    path = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    r = CliRunner().invoke(main, ["solve", str(path), "--top", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["fleet"] == d["solutions"][0]["fleet"]
    assert all(s["fleet"].count(",") + 1 == len(s["pools"]) for s in d["solutions"])
    assert f"--fleet '{d['fleet']}'" in r.output


def test_replica_counts_are_bounded(repo_root):
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    for n in (100_001, 10 ** 30):
        with pytest.raises(InstanceError, match=r"replicas must lie in \[1, 100,000\]"):
            parse_fleet(f"0-65536:h100x{n}", inst)
    with pytest.raises(InstanceError, match="needs at least one replica"):
        parse_fleet("0-65536:h100x0", inst)
    assert parse_fleet("0-65536:h100x100000", inst).pools[0][3] == 100_000


def test_a_spec_with_a_line_break_is_one_line(repo_root):
    """Found by fuzzing: a spec holding a newline was echoed as typed, a two-line error."""
    inst = api.load(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml")
    with pytest.raises(InstanceError) as info:
        parse_fleet("0\n0", inst)
    assert all("\n" not in line for line in info.value.problems)
    assert any("'0\\n0' is not LO-HI:GPU" in line for line in info.value.problems)
