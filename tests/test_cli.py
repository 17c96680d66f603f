"""The CLI surface: JSON contracts, determinism, exit codes and output safety."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_tpw_profile_rows_are_table1(tmp_path):
    out = tmp_path / "t.json"
    res = run("tpw", "--profile", "h100-80gb", "--contexts", "2048,65536", "--json", out)
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["context"], r["n_slots"], round(r["tok_per_watt"], 2)) for r in rows] == [(2048, 512, 35.0),
                                                                                       (65536, 16, 1.5)]
    assert set(rows[0]) >= {"profile", "model", "context", "n_slots", "iter_latency_ms", "tok_per_s", "power_w",
                            "tok_per_watt", "quality", "source"}
    assert rows[0]["quality"] == "latency calibrated / power measured"


def test_tpw_computed_architecture_comparison():
    res = run("tpw", "--hardware", "H100-SXM-80GB", "--models", "Llama-3.1-8B,Llama-3.1-70B", "--tp", "8",
              "--kv-layout", "replicated", "--context", "8192", "--json", "-")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows[1]["model"] == "Llama-3.1-70B" and rows[1]["n_slots"] == 22  # paper Table 5: 22 at 8K
    assert rows[1]["quality"].startswith("latency roofline")


@pytest.mark.parametrize("args,phrase", [
    (["tpw", "--profile", "X100"], "unknown profile 'X100'"),
    (["tpw", "--hardware", "H100"], "go together"),
    (["tpw", "--hardware", "Z9", "--models", "Llama-3.1-8B"], "unknown hardware 'Z9'"),
    (["tpw", "--profile", "A10G", "--contexts", "2k"], "--contexts"),
    (["tpw", "--hardware", "A10G", "--models", "Llama-3.1-8B", "--dtype", "fp8"], "fp8"),
])
def test_tpw_errors_are_one_line(args, phrase):
    res = run(*args)
    assert res.exit_code == 2 and phrase in res.stderr and "Traceback" not in res.output


def test_validate_json(repo_root, tmp_path):
    res = run("validate", repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--json", "-")
    assert res.exit_code == 0
    s = json.loads(res.stdout)
    assert s["valid"] and [g["n_slots_at_max_context"] for g in s["gpus"]] == [8, 16, 16]
    assert s["slo"]["ttft_margin"] == 0.03                 # the batched model's default
    text = run("validate", repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--format", "plain").stdout
    assert "SLO: P99 TTFT 500 ms (batched, scope pool); plans sized to 485 ms (ttft_margin 3 %)" in text
    mean = run("validate", repo_root / "instances" / "ref_puzzle6_lmsys_mixed.yaml", "--set",
               "slo.ttft_model=mean-prefill",
               "--json", tmp_path / "mean.json")
    slo = json.loads((tmp_path / "mean.json").read_text())["slo"]
    assert (slo["ttft_margin"], slo["ttft_sizing_ms"]) == (0.0, 500.0)   # mean-prefill: no margin, sized to the SLO
    assert "plans sized to" not in mean.stdout                            # so the table claims none


@pytest.mark.slow
def test_evaluate_is_deterministic(repo_root, tmp_path):
    args = ["evaluate", repo_root / "tests" / "data" / "azure_trace_h100_units.yaml", "--fleet",
            "0-2048:h100,2048-16384:h100"]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run(*args, "--json", a).exit_code == 0 and run(*args, "--json", b).exit_code == 0
    assert a.read_bytes() == b.read_bytes()


def test_json_never_overwrites_the_instance(repo_root, tmp_path):
    inst = tmp_path / "i.yaml"
    inst.write_text((repo_root / "instances" / "ref_puzzle1_lmsys_a100.yaml").read_text()
                    .replace("../data/workloads/lmsys_cdf.json", "builtin:lmsys"))
    before = inst.read_bytes()
    res = run("validate", inst, "--json", inst)
    assert res.exit_code == 2 and "refusing to overwrite" in res.stderr
    assert inst.read_bytes() == before
    res = run("validate", inst, "--json", tmp_path / "missing" / "x.json")
    assert res.exit_code == 2 and "does not exist" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["i.yaml"]  # no temp files left behind
