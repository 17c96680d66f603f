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


PAIR_CASES = [
    [],                                                                    # the reference's pair sizing (Puzzle 7)
    ["pools.pd_sizing=model"],
    ["pools.pd_sizing=model", "pools.max_pools=2"],                        # two pairs, tiling 0-8192
    ["pools.pd_sizing=model", "slo.tpot_p99_ms=40"],                       # decode caps below the slots: #SEQS
    ["pools.pd_sizing=model", "pools.max_pools=2", "slo.scope=fleet"],
    ["pools.pd_sizing=model", "gpus[1].availability=0.9"],                # deployed counts above the sized ones
]


@pytest.mark.parametrize("overrides", PAIR_CASES)
def test_solved_pair_plans_round_trip_through_their_spec(repo_root, overrides):
    inst = api.load(repo_root / "instances" / "ref_puzzle7_azure_pd.yaml", overrides)
    report = solve_instance(inst, SolveOptions(top=3))
    assert report.plans
    for plan in report.plans:
        assert any(p.phase == "decode" for p in plan.fleet.pools)
        spec = fleet_spec(inst, plan.fleet)
        assert spec is not None and spec.count("+") == sum(p.phase == "decode" for p in plan.fleet.pools)
        again = evaluate(inst, parse_fleet(spec, inst)).result

        def rows(f):
            return [(p.min_tokens, p.max_tokens, p.gpu, p.phase, p.replicas, p.max_num_seqs) for p in f.pools]

        assert rows(again) == rows(plan.fleet)
        assert again.cost_per_hr == pytest.approx(plan.fleet.cost_per_hr, rel=1e-12)
        assert again.power_kw == pytest.approx(plan.fleet.power_kw, rel=1e-12)
    if "slo.tpot_p99_ms=40" in overrides:
        assert "#" in fleet_spec(inst, report.plans[0].fleet)


def test_pair_spec_grammar(repo_root):
    inst = api.load(repo_root / "instances" / "ref_puzzle7_azure_pd.yaml")
    spec = parse_fleet("0-8k:a100x1+h100x3", inst)
    assert spec.pools == ((0, 8192, "a100", 1, 1.0, None),) and spec.decode == (("h100", 3),)
    spaced = parse_fleet("0-8192: A100 x 2 + h100#16", inst)
    assert spaced.pools == ((0, 8192, "a100", 2, 1.0, 16),) and spaced.decode == (("h100", None),)
    assert parse_fleet("0-8192:h100x6", inst).decode == ()                 # no pair: no decode column
    # a phase without a count is sized by its station: 1 + 3 as given, the rest the least that meets the SLO
    given = evaluate(inst, parse_fleet("0-8192:a100x1+h100x3", inst)).result
    assert [(p.phase, p.gpu, p.replicas) for p in given.pools] == [("prefill", "a100", 1), ("decode", "h100", 3)]
    sized = evaluate(inst, parse_fleet("0-8192:a100+h100x9", inst)).result
    assert sized.pools[0].replicas >= 1 and sized.pools[0].slo_met and sized.pools[1].replicas == 9


@pytest.mark.parametrize("text, message", [
    ("0-8192:a100x1+zz", "unknown gpu 'zz'"),
    ("0-8192:a100x1+h100x0", "decode replicas must lie in [1, 100,000]; got 0"),
    ("0-8192:a100x1+h100x3@2", "nor a prefill/decode pair LO-HI:PREFILL[xN]+DECODE[xN][#SEQS]"),
    ("0-8192:a100x1+h100#100000", "the batch cap must lie in [1, "),
    ("0-8192:a100+", "is not LO-HI:GPU"),
])
def test_bad_pair_specs_are_one_line_errors(repo_root, text, message):
    inst = api.load(repo_root / "instances" / "ref_puzzle7_azure_pd.yaml")
    with pytest.raises(InstanceError) as info:
        parse_fleet(text, inst)
    assert any(message in line for line in info.value.problems), info.value.problems
    assert all(line.startswith("--fleet: ") and "\n" not in line for line in info.value.problems)


def test_a_pair_needs_a_kv_transfer(repo_root):
    inst = api.load(repo_root / "instances" / "ref_puzzle7_azure_pd.yaml", ["pools.disaggregation=none"])
    with pytest.raises(InstanceError, match="has no KV transfer in this instance"):
        parse_fleet("0-8192:a100x1+h100x3", inst)
    r = CliRunner().invoke(main, ["evaluate", str(repo_root / "instances" / "ref_puzzle7_azure_pd.yaml"),
                                  "--set", "pools.disaggregation=none", "--fleet", "0-8192:a100x1+h100x3"])
    assert r.exit_code == 2 and "--fleet" in r.output and "Traceback" not in r.output


def test_solve_prints_the_simulate_line_for_a_pair_plan(repo_root):
    path = repo_root / "instances" / "ref_puzzle7_azure_pd.yaml"
    r = CliRunner().invoke(main, ["solve", str(path)])
    assert r.exit_code == 0, r.output
    assert "--fleet '0-8192:a100x1+h100x3'" in r.output                   # Puzzle 7's reference pair, 1 + 3
