"""``fleetopt diff A.json B.json``: what changes between two plans.

The hand-written plans (``tests/data/diff/``): A = 0-2,048 a100 x3 (4 GPUs each: 12) + 2,048-65,536 h100 x2 (8
each: 16), $100/hr; B = 0-1,024 l40s x4 (1 each: 4) + 0-4,096 a100 x2 (8) + 4,096-65,536 h100 x3 (24), $130/hr.
By hand: A100 12 -> 8 (release 4), H100 16 -> 24 (buy 8), L40S 0 -> 4 (buy 4); 28 -> 36 physical GPUs; +$30/hr
= +$262,800/yr (8,760 h); the boundary 2,048 moves to 4,096.
"""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.output.contract import validate_document

DATA = "tests/data/diff"


def _diff(repo_root, monkeypatch, *args) -> tuple[int, str, str]:
    monkeypatch.chdir(repo_root)
    res = CliRunner().invoke(main, ["diff", *map(str, args)])
    return res.exit_code, res.stdout, res.stderr


def _json(repo_root, monkeypatch, *args) -> dict:
    code, out, err = _diff(repo_root, monkeypatch, *args, "--json", "-")
    assert code == 0, err
    doc = json.loads(out)
    validate_document(doc)
    return doc


def _write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def test_hand_written_plans(repo_root, monkeypatch):
    d = _json(repo_root, monkeypatch, f"{DATA}/plan_a.json", f"{DATA}/plan_b.json")
    assert d["command"] == "diff" and d["instance"] == "toy" and d["same_instance"] and d["instance_note"] is None
    pools = {(p["gpu"], p["change"]): p for p in d["change"]["pools"]}
    assert set(pools) == {("l40s", "added"), ("a100", "moved"), ("h100", "moved")}
    a100, h100, l40s = pools["a100", "moved"], pools["h100", "moved"], pools["l40s", "added"]
    assert (a100["max_tokens_a"], a100["max_tokens_b"], a100["replicas_delta"], a100["physical_gpus_delta"]) == \
        (2048, 4096, -1, -4)
    assert (h100["min_tokens_a"], h100["min_tokens_b"], h100["replicas_delta"], h100["physical_gpus_delta"]) == \
        (2048, 4096, 1, 8)
    assert (l40s["min_tokens_a"], l40s["replicas_b"], l40s["physical_gpus_delta"]) == (None, 4, 4)
    hw = {h["hardware"]: (h["physical_gpus_delta"], h["action"]) for h in d["change"]["hardware"]}
    assert hw == {"A100-SXM-80GB": (-4, "release"), "H100-SXM-80GB": (8, "buy"), "L40S-48GB": (4, "buy")}
    assert [(m["from_tokens"], m["to_tokens"]) for m in d["change"]["boundary_moves"]] == [(2048, 4096)]
    delta = d["delta"]
    assert (delta["physical_gpus"], delta["total_replicas"]) == (8, 4)
    assert delta["cost_per_hr"] == pytest.approx(30.0) and delta["cost_per_year"] == pytest.approx(262_800.0)
    assert d["change"]["cost_per_year_delta"] == pytest.approx(30.0 * 8760)
    assert delta["power_kw"] == pytest.approx(6.5) and delta["tok_per_watt"] == pytest.approx(0.05)
    assert delta["usd_per_million_output_tokens"] == pytest.approx(-0.5)
    assert (d["a"]["slo_met"], d["a"]["slo_source"]) == (True, "analytic")
    assert (d["b"]["slo_met"], d["b"]["slo_source"], d["b"]["ttft_p99_ci_ms"]) == (False, "simulated", [580, 660])
    assert d["a"]["arrival_rate"] == pytest.approx(100.0) == d["b"]["arrival_rate"]


def test_a_plan_against_itself_changes_nothing(repo_root, monkeypatch):
    d = _json(repo_root, monkeypatch, f"{DATA}/plan_a.json", f"{DATA}/plan_a.json")
    assert d["change"]["unchanged"] and {p["change"] for p in d["change"]["pools"]} == {"unchanged"}
    assert all(h["action"] == "keep" for h in d["change"]["hardware"]) and d["delta"]["cost_per_hr"] == 0


def test_the_table_names_the_purchase(repo_root, monkeypatch):
    code, out, _ = _diff(repo_root, monkeypatch, f"{DATA}/plan_a.json", f"{DATA}/plan_b.json", "--format", "plain")
    assert code == 0
    assert "release 4 A100-SXM-80GB, buy 8 H100-SXM-80GB, buy 4 L40S-48GB; +$30.00/hr" in out
    assert "MISSED (simulated, P99 TTFT 620 ms [580, 660])" in out and "2,048 -> 4,096" in out


def test_different_instances_are_flagged_in_one_line(repo_root, monkeypatch, tmp_path):
    b = json.loads((repo_root / DATA / "plan_b.json").read_text())
    b.update(instance="toy-2", overrides=["workload.arrival_rate=120"], slo_ttft_p99_ms=400.0)
    b["pools"][0]["analytic"]["arrival_rate"] = 30.0                       # 30 + 50 + 40 = 120 req/s
    d = _json(repo_root, monkeypatch, f"{DATA}/plan_a.json", _write(tmp_path / "b.json", b))
    assert d["instance"] is None and not d["same_instance"]
    note = d["instance_note"]
    assert "\n" not in note and "instance toy vs toy-2" in note and "100 vs 120 req/s" in note
    assert "500.0 vs 400.0 ms" in note and "workload.arrival_rate=120" in note
    code, out, _ = _diff(repo_root, monkeypatch, f"{DATA}/plan_a.json", tmp_path / "b.json", "--format", "plain")
    assert code == 0 and sum("different instances" in line for line in out.splitlines()) == 1


def _pd(prefill: int, decode: int) -> dict:
    def pool(phase, n):
        return {"min_tokens": 0, "max_tokens": 65536, "gpu": "h100", "replicas": n, "gpus": 8 * n,
                "physical_gpus_per_replica": 8, "phase": phase, "profile": "H100-SXM-80GB/Llama-3.1-70B/tp8/fp8",
                "analytic": {"arrival_rate": 50.0}}

    return {"command": "solve", "instance": "pd", "overrides": [], "slo_ttft_p99_ms": 500.0,
            "pools": [pool("prefill", prefill), pool("decode", decode)],
            "analytic": {"cost_per_hr": 32.16 * (prefill + decode), "power_kw": 10.0}}


def test_pd_rows_match_by_phase(repo_root, monkeypatch, tmp_path):
    """A: prefill x2, decode x4; B: prefill x3, decode x4 (one segment, one GPU option): only the prefill row
    grows, by one replica of 8 GPUs ($32.16/hr); matched without the phase, A's prefill x2 would pair with
    a decode row."""
    a, b = _write(tmp_path / "a.json", _pd(2, 4)), _write(tmp_path / "b.json", _pd(3, 4))
    d = _json(repo_root, monkeypatch, a, b)
    rows = {p["phase"]: (p["change"], p["replicas_a"], p["replicas_b"], p["physical_gpus_delta"])
            for p in d["change"]["pools"]}
    assert rows == {"prefill": ("resized", 2, 3, 8), "decode": ("unchanged", 4, 4, 0)}
    assert d["delta"]["cost_per_hr"] == pytest.approx(32.16)
    assert d["a"]["arrival_rate"] == pytest.approx(50.0)         # the decode row repeats the rate: counted once
    swapped = _pd(4, 2)                                          # prefill x4, decode x2: both rows resized
    d = _json(repo_root, monkeypatch, a, _write(tmp_path / "c.json", swapped))
    assert {p["phase"]: p["replicas_delta"] for p in d["change"]["pools"]} == {"prefill": 2, "decode": -2}
    assert d["change"]["hardware"][0]["physical_gpus_delta"] == 0


def test_plan_numbers_pick_solutions_and_fleets(repo_root, monkeypatch, tmp_path):
    a = json.loads((repo_root / DATA / "plan_a.json").read_text())
    b = json.loads((repo_root / DATA / "plan_b.json").read_text())
    a["solutions"] = [copy.deepcopy(a), copy.deepcopy(b)]
    path = _write(tmp_path / "two.json", a)
    d = _json(repo_root, monkeypatch, path, path, "--plan", "1:2")
    assert (d["a"]["plan"], d["b"]["plan"], d["delta"]["physical_gpus"]) == ("plan 1", "plan 2", 8)
    evaluate = {"command": "evaluate", "instance": "toy", "slo_ttft_p99_ms": 500.0,
                "fleets": [{k: b[k] for k in ("pools", "analytic")}]}
    d = _json(repo_root, monkeypatch, _write(tmp_path / "e.json", evaluate), f"{DATA}/plan_a.json")
    assert d["a"]["command"] == "evaluate" and d["a"]["plan"] == "fleet 1" and d["delta"]["physical_gpus"] == -8


@pytest.mark.parametrize("make, args, phrase", [
    (None, ["missing.json", "A"], "missing.json: cannot read it"),
    ("not json {", ["BAD", "A"], "not JSON"),
    ([1, 2], ["BAD", "A"], "command: not a plan"),
    ({"command": "tpw", "rows": []}, ["BAD", "A"], "command: not a plan"),
    ({"command": "solve", "instance": "x", "status": "infeasible", "pools": None}, ["BAD", "A"],
     "the solve found no plan"),
    (None, ["A", "A", "--plan", "3"], "solutions: must be a list of solutions"),
    ({"command": "evaluate", "instance": "x", "fleets": [{"pools": [], "analytic": {}}]}, ["BAD", "A", "--plan", "3"],
     "fleets: --plan 3: the file holds 1 fleet(s)"),
    ({"command": "simulate", "instance": "x", "pools": []}, ["BAD", "A", "--plan", "2"],
     "--plan 2: a simulate document holds one fleet"),
    (None, ["A", "A", "--plan", "0"], "--plan: '0' is not N or N:M"),
    ({"command": "solve", "instance": "x", "pools": [{"min_tokens": 0, "max_tokens": 10, "gpu": "a",
                                                      "replicas": -1}], "analytic": {"cost_per_hr": 1.0}},
     ["BAD", "A"], "pools[0].replicas: must be a whole number"),
])
def test_bad_input_is_one_line_exit_2(repo_root, monkeypatch, tmp_path, make, args, phrase):
    bad = tmp_path / "bad.json"
    if make is not None:
        bad.write_text(make if isinstance(make, str) else json.dumps(make))
    argv = [{"A": str(repo_root / DATA / "plan_a.json"), "BAD": str(bad)}.get(x, x) for x in args]
    code, out, err = _diff(repo_root, monkeypatch, *argv)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and phrase in lines[0] and "Traceback" not in err


# --------------------------------------------------------------------------------------------
# a solve at two arrival rates
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_solve_at_two_rates_differs_by_the_plans_own_totals(repo_root, monkeypatch, tmp_path):
    monkeypatch.chdir(repo_root)
    paths = []
    for rate in (60, 140):
        path = tmp_path / f"solve_{rate}.json"
        res = CliRunner().invoke(main, ["solve", "instances/quickstart.yaml", "--set",
                                        f"workload.arrival_rate={rate}", "--json", str(path), "--format", "plain"])
        assert res.exit_code == 0, res.output
        paths.append(path)
    a, b = (json.loads(p.read_text()) for p in paths)
    d = _json(repo_root, monkeypatch, *paths)
    assert d["delta"]["cost_per_hr"] == pytest.approx(b["analytic"]["cost_per_hr"] - a["analytic"]["cost_per_hr"])
    assert d["delta"]["cost_per_year"] == pytest.approx(b["analytic"]["cost_per_year"]
                                                        - a["analytic"]["cost_per_year"])
    assert d["delta"]["physical_gpus"] == b["physical_gpus"] - a["physical_gpus"]
    assert d["delta"]["power_kw"] == pytest.approx(b["analytic"]["power_kw"] - a["analytic"]["power_kw"])

    def per_hardware(doc):
        out = {}
        for p in doc["pools"]:
            hw = p["profile"].split("/")[0]
            out[hw] = out.get(hw, 0) + p["physical_gpus"]
        return out

    ha, hb = per_hardware(a), per_hardware(b)
    assert {h["hardware"]: h["physical_gpus_delta"] for h in d["change"]["hardware"]} == \
        {k: hb.get(k, 0) - ha.get(k, 0) for k in set(ha) | set(hb)}
    assert "arrival rate 60 vs 140 req/s" in d["instance_note"]


def test_the_notebook_api_diffs_like_the_command(tmp_path, repo_root):
    """``fleetopt.api.diff`` is the command's comparison: a plan against itself changes nothing."""
    from fleetopt import api

    out = tmp_path / "q.json"
    res = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "quickstart.yaml"), "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = api.diff(out, out)
    assert d.same_instance and all(v == 0 for v in d.delta().values() if v is not None)
    assert d.to_json()["command"] == "diff"
