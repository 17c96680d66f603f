"""The JSON contract (issue 12, "What to build" 1): every command's ``--json`` document carries the envelope and
validates against its pydantic model (:mod:`fleetopt.optimizer.output.contract`); ``fleetopt schema`` prints the
models' JSON Schema; ``evaluate`` always lists ``fleets``; pools and fleets carry explicit ``analytic`` and
``simulated`` sub-objects next to the deprecated 1.0 keys; ``--json`` never writes over a file the run read.

Each document comes from a real run of the command (CliRunner, in-process) on
``instances/ref_units_lmsys_a100_h100.yaml`` (the quickstart's traffic on the seeds' calibrated units;
``tests/test_physical_default.py`` validates the physical quickstart's documents); validation is pydantic's
(``validate_document``: required keys and strict types; more keys are allowed).
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import EXIT_CODES
from fleetopt.optimizer.output.contract import (COMMANDS, KINDS, MODULES, SCHEMA_VERSION, _undeclared, documents,
                                                schema_for, validate_document)
from fleetopt.optimizer.output.writes import write_document

DOCUMENTS = documents()

QUICK = "instances/ref_units_lmsys_a100_h100.yaml"     # the seeds' units: FLEET's figures are tuned to them
UNITS = "lmsys-a100-h100-units"
FLEET = "0-4096:a100x2,4096-65536:a100x3"
MEAS = "data/measurements/h100_llama31_8b"
SIM = ["--requests", "2000", "--replications", "2"]

RUNS = {  # command kind -> (argv, instance name in the envelope, exit codes a run may end with)
    "validate": (["validate", QUICK], UNITS, (0,)),
    "evaluate": (["evaluate", QUICK, "--fleet", FLEET], UNITS, (0, 5, 6)),
    "solve": (["solve", QUICK, "--top", "2"], UNITS, (0,)),
    "simulate": (["simulate", QUICK, "--fleet", FLEET, *SIM], UNITS, (0, 5)),
    "tpw": (["tpw", "--profile", "H100-80GB,A100-80GB", "--contexts", "2048,65536"], None, (0,)),
    "catalog list": (["catalog", "list"], None, (0,)),
    "simulate --routers": (["simulate", QUICK, "--fleet", FLEET, *SIM, "--routers", "length,random"], UNITS,
                           (0, 5)),
    "pareto --split-table": (["pareto", QUICK, "--split-table", "--gpu", "a100", "--boundaries", "4096"],
                             UNITS, (0,)),
    "whatif": (["whatif", QUICK, "--sweep", "workload.arrival_rate=50"], UNITS, (0,)),
    "gridflex": (["gridflex", QUICK, "--fleet", "0-4096:h100x2,4096-65536:h100x3", "--depths", "0,50",
                  "--event-minutes", "0.2", "--replications", "1", "--set", "workload.arrival_rate=20"],
                 UNITS, (0,)),
    "profile fit": (["profile", "fit", f"{MEAS}_decode.csv", f"{MEAS}_prefill.csv", f"{MEAS}_meta.json"], None,
                    (0,)),
    "diff": (["diff", "tests/data/diff/plan_a.json", "tests/data/diff/plan_b.json"], "toy", (0,)),
}
SLOW_RUNS = {  # 2-5 s each on a shared 2-core machine
    "tpw --rho-sweep": (["tpw", QUICK, "--fleet", FLEET, "--rho-sweep", "--rho", "0.3,0.6"], UNITS, (0,)),
    # FLEET runs its long pool above the instance's utilisation cap: headroom says so and exits 6 (limits_broken)
    "headroom": (["headroom", QUICK, "--fleet", FLEET], UNITS, (6,)),
    "headroom --range": (["headroom", QUICK, "--range", "90:110"], UNITS, (0,)),
    "pareto --axes cost,pools": (["pareto", QUICK, "--axes", "cost,pools", "--quiet"], UNITS, (0,)),
    "pareto --axes cost,power": (["pareto", QUICK, "--axes", "cost,power", "--points", "3", "--quiet"], UNITS, (0,)),
    "pareto --axes cost,ttft": (["pareto", QUICK, "--axes", "cost,ttft", "--points", "3", "--set", "slo.scope=pool",
                                 "--quiet"], UNITS, (0,)),
}


CHECKED_ONLY = {"catalog list", "profile fit"}
"""Documents checked against their model before they are written, not built by it (more keys are theirs)."""


def _run(args, repo_root, monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(repo_root)
    res = CliRunner().invoke(main, [*args, "--json", "-"])
    return res.exit_code, res.stdout


def _document(kind, runs, repo_root, monkeypatch) -> dict:
    args, _, codes = runs[kind]
    code, out = _run(args, repo_root, monkeypatch)
    assert code in codes, out
    return json.loads(out)


@pytest.mark.parametrize("kind", [*RUNS, *(pytest.param(k, marks=pytest.mark.slow) for k in SLOW_RUNS)])
def test_every_document_carries_the_envelope_and_validates(kind, repo_root, monkeypatch):
    runs = {**RUNS, **SLOW_RUNS}
    doc = _document(kind, runs, repo_root, monkeypatch)
    assert list(doc)[:3] == ["schema_version", "command", "instance"]
    assert (doc["schema_version"], doc["command"], doc["instance"]) == (SCHEMA_VERSION, kind, runs[kind][1])
    model = validate_document(doc)
    assert type(model) is DOCUMENTS[kind]
    if kind not in CHECKED_ONLY:        # built by its model: every key, at every depth, is declared
        assert _undeclared(model) == [], kind


@pytest.mark.slow
def test_bench_document_validates(repo_root, monkeypatch):
    """The quick bench without the agreement run (about 3 minutes on 2 shared cores)."""
    code, out = _run(["bench", "--quick", "--agreement-pools", "0"], repo_root, monkeypatch)
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["schema_version"], doc["command"], doc["instance"]) == (SCHEMA_VERSION, "bench", None)
    validate_document(doc)


def test_every_command_kind_has_a_run():
    """Each document kind of the contract is produced by one of the runs above (bench: its own test)."""
    assert set(DOCUMENTS) == set(RUNS) | set(SLOW_RUNS) | {"bench"}
    assert {k for kinds in COMMANDS.values() for k in kinds} == set(DOCUMENTS)


def test_each_module_declares_its_commands_documents_in_order():
    """Each command's documents are declared in the module :data:`MODULES` names for it, and only there; the
    registry's order (``fleetopt schema``'s union) is :data:`COMMANDS`'."""
    import importlib

    for module in set(MODULES.values()):
        declared = importlib.import_module(f"fleetopt.optimizer.output.contract.{module}").DOCUMENTS
        assert set(declared) == {k for c, kinds in COMMANDS.items() if MODULES[c] == module for k in kinds}, module
    assert set(MODULES) == set(COMMANDS)
    assert tuple(DOCUMENTS) == KINDS


def test_evaluate_always_lists_fleets(repo_root, monkeypatch):
    """One fleet or two: a ``fleets`` list in the order given, each named by its spec; the single fleet's keys
    also stay at top level (the deprecated 1.0 layout)."""
    one = json.loads(_run(["evaluate", QUICK, "--fleet", FLEET], repo_root, monkeypatch)[1])
    two = json.loads(_run(["evaluate", QUICK, "--fleet", FLEET, "--fleet", "0-65536:h100"], repo_root,
                          monkeypatch)[1])
    assert [f["fleet"] for f in one["fleets"]] == [FLEET]
    assert [f["fleet"] for f in two["fleets"]] == [FLEET, "0-65536:h100"]
    assert one["cost_per_hr"] == one["fleets"][0]["cost_per_hr"] and "cost_per_hr" not in two
    for doc in (one, two):
        validate_document(doc)
        for f in doc["fleets"]:
            # the fleet's replicas are the pools' (5 = 2 + 3 for FLEET), analytic and alias agree
            assert f["analytic"]["total_replicas"] == sum(p["replicas"] for p in f["pools"])
            assert f["simulated"] is None and all(p["simulated"] is None for p in f["pools"])
    # a100 at $2.21 per seed unit (data/catalog: A100-80GB, a TP=8 server priced as one GPU): 5 replicas are 5
    # units, 40 physical GPUs
    head = one["fleets"][0]["analytic"]
    assert head["cost_per_hr"] == pytest.approx(5 * 2.21)
    assert head["physical_gpus"] == one["fleets"][0]["physical_gpus"] == 40 and head["total_gpus"] == 5
    assert head["usd_per_million_output_tokens"] == pytest.approx(
        head["cost_per_hr"] / (3600 * head["output_tok_per_s"]) * 1e6)


def test_simulate_separates_analytic_from_simulated(repo_root, monkeypatch):
    """Per pool, ``analytic`` holds the figures ``evaluate`` gives for the same fleet and ``simulated`` the
    measured ones; the deprecated flat keys are aliases of the matching sub-object."""
    sim = json.loads(_run(["simulate", QUICK, "--fleet", FLEET, *SIM], repo_root, monkeypatch)[1])
    ev = json.loads(_run(["evaluate", QUICK, "--fleet", FLEET], repo_root, monkeypatch)[1])["fleets"][0]
    assert len(sim["pools"]) == len(ev["pools"]) == 2
    for s, e in zip(sim["pools"], ev["pools"]):
        assert s["analytic"] == e["analytic"]                      # the same analytic model, another command
        assert s["analytic"]["source"] == "analytic" and s["simulated"]["source"] == "simulated"
        assert s["ttft_p99_ms"] == s["analytic"]["ttft_p99_ms"]   # 1.0 alias: analytic
        assert s["ttft_p99_ms_sim"] == s["simulated"]["ttft_p99_ms"]
        lo, hi = s["simulated"]["ttft_p99_ci_ms"]
        p99 = s["simulated"]["ttft_p99_ms"]                       # null: unbounded (inf), as the contract writes it
        assert p99 is None and hi is None or lo <= p99 and (hi is None or p99 <= hi)
        # what the pool's P99 and verdict rest on: the run's own requests, or a dedicated run's for a thin pool
        measured = s["simulated"]
        assert (s["p99_requests"], s["p99_source"]) == (measured["p99_requests"], measured["p99_source"])
        assert measured["too_few_requests"] == (measured["p99_requests"] < 500)      # both pools have traffic
        if measured["p99_source"] == "main run":
            assert measured["p99_requests"] == measured["requests"]
        else:
            assert measured["p99_source"] == "dedicated run" and measured["p99_requests"] > measured["requests"]
    # 4096-65536 gets ~2 % of the stream, a handful of a 2,000-request run: its P99 comes from a dedicated run
    assert sim["pools"][1]["simulated"]["p99_source"] == "dedicated run"
    assert sim["analytic"] == ev["analytic"]
    fleet = sim["simulated"]
    assert (sim["ttft_p99_ms"], sim["slo_met"], sim["power_kw"]) == (fleet["ttft_p99_ms"], fleet["slo_met"],
                                                                      fleet["power_kw"])
    # every measured request is routed to exactly one pool, a thin pool's dedicated run aside
    assert sum(p["simulated"]["requests"] for p in sim["pools"]) == fleet["requests_measured"]
    assert sum(p["rejected"] for p in sim["pools"]) == sim["rejected"]
    assert fleet["power_kw"] * 1000 == pytest.approx(sum(p["simulated"]["power_w"] for p in sim["pools"]), rel=1e-12)


def test_contract_rejects_a_broken_document(repo_root, monkeypatch):
    """Required keys and strict types are checked: a test of the checker on a real document."""
    doc = json.loads(_run(["simulate", QUICK, "--fleet", FLEET, *SIM], repo_root, monkeypatch)[1])
    validate_document(doc)
    for broken in ({k: v for k, v in doc.items() if k != "schema_version"},
                   {**doc, "schema_version": 1},
                   {**doc, "simulated": None},
                   {**doc, "pools": [{k: v for k, v in doc["pools"][0].items() if k != "analytic"}]},
                   {**doc, "pools": [{**doc["pools"][0],
                                      "simulated": {**doc["pools"][0]["simulated"], "p99_source": "elsewhere"}}]},
                   {**doc, "requests_simulated": float(doc["requests_simulated"])},
                   {**doc, "slo_met": int(doc["slo_met"])}):
        with pytest.raises(ValidationError):
            validate_document(broken)
    with pytest.raises(KeyError, match="unknown document kind"):
        validate_document({**doc, "command": "simulat"})
    ev = json.loads(_run(["evaluate", QUICK, "--fleet", FLEET], repo_root, monkeypatch)[1])
    with pytest.raises(ValidationError):
        validate_document({**ev, "fleets": []})


def test_schema_command_prints_the_models_schema(repo_root, monkeypatch):
    code, out = _run(["schema", "evaluate"], repo_root, monkeypatch)
    assert code == 0
    schema = json.loads(out)
    assert schema == json.loads(json.dumps(schema_for("evaluate")))
    assert {"schema_version", "command", "instance", "fleets"} <= set(schema["required"])
    assert schema["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    # a command with two document kinds: told apart by "command"
    tpw = json.loads(_run(["schema", "tpw"], repo_root, monkeypatch)[1])
    assert set(tpw["discriminator"]["mapping"]) == {"tpw", "tpw --rho-sweep"}
    rho = json.loads(_run(["schema", "tpw", "--rho-sweep"], repo_root, monkeypatch)[1])
    assert rho["properties"]["command"]["const"] == "tpw --rho-sweep"
    everything = json.loads(_run(["schema"], repo_root, monkeypatch)[1])
    assert set(everything["discriminator"]["mapping"]) == set(DOCUMENTS)
    # the 1.0 keys kept in 2.0 are marked deprecated
    sim = schema_for("simulate")["$defs"]
    assert sim["SimulateDocument"]["properties"]["ttft_p99_ms"]["deprecated"] is True
    assert "deprecated" not in sim["FleetSimulated"]["properties"]["ttft_p99_ms"]
    res = CliRunner().invoke(main, ["schema", "evalute"])
    assert res.exit_code == EXIT_CODES["invalid_input"]
    assert res.output.count("\n") == 1 and "unknown command 'evalute'" in res.output


def test_json_never_overwrites_an_input(repo_root, tmp_path, monkeypatch):
    """``--json`` refuses the instance, its workload file and a ``--plan`` file, and leaves them as they were."""
    shutil.copy(repo_root / QUICK, tmp_path / "q.yaml")
    cdf = tmp_path / "cdf.json"
    shutil.copy(repo_root / "data" / "workloads" / "lmsys_cdf.json", cdf)
    inst = tmp_path / "q.yaml"
    inst.write_text(inst.read_text().replace("../data/workloads/lmsys_cdf.json", "cdf.json"))
    before = {p: p.read_bytes() for p in (inst, cdf)}
    runner = CliRunner()
    for target in (inst, cdf):
        res = runner.invoke(main, ["evaluate", str(inst), "--fleet", FLEET, "--json", str(target)])
        assert res.exit_code == EXIT_CODES["invalid_input"], res.output
        assert "refusing to overwrite" in res.output
    plan = tmp_path / "plan.json"
    assert runner.invoke(main, ["solve", str(inst), "--json", str(plan)]).exit_code == 0
    before[plan] = plan.read_bytes()
    res = runner.invoke(main, ["simulate", str(inst), "--plan", str(plan), *SIM, "--json", str(plan)])
    assert res.exit_code == EXIT_CODES["invalid_input"] and "refusing to overwrite" in res.output
    assert {p: p.read_bytes() for p in before} == before
    validate_document(json.loads(plan.read_text()))


def test_docs_list_every_documents_fields(repo_root):
    """docs/json.md has a table per document kind naming each of its top-level contract fields, and the
    changelog of the current version."""
    from fleetopt.optimizer.output.contract import top_level_fields

    text = (repo_root / "docs" / "json.md").read_text()
    assert f"### {SCHEMA_VERSION} (this contract)" in text
    for kind in DOCUMENTS:
        section = text.split(f"**{kind} (schema_version {SCHEMA_VERSION}")[1].split("\n\n")[1]
        for name, *_ in top_level_fields(kind):
            assert f"| {name} |" in section, (kind, name)


@pytest.mark.slow
def test_headroom_contract_holds_its_verdicts(repo_root, monkeypatch):
    """A headroom fleet over an instance limit exits 6, and its document's ``slo_met``, ``limits_ok`` and
    ``violations`` are contract: a document without one of them is rejected."""
    monkeypatch.chdir(repo_root)
    res = CliRunner().invoke(main, ["headroom", QUICK, "--fleet", FLEET, "--set", "constraints.max_total_gpus=1",
                                    "--json", "-"])
    assert res.exit_code == EXIT_CODES["limits_broken"], res.output
    doc = json.loads(res.stdout)
    validate_document(doc)
    assert doc["limits_ok"] is False and any("max_total_gpus" in v for v in doc["violations"])
    for key in ("slo_met", "limits_ok", "violations"):
        with pytest.raises(ValidationError):
            validate_document({k: v for k, v in doc.items() if k != key})


def test_a_document_that_breaks_its_contract_is_never_written(tmp_path):
    """Every command writes its --json through write_document, which checks the document against its model
    first: a drift from ``fleetopt schema`` fails every test that writes JSON, and no file is written."""
    target = tmp_path / "tpw.json"
    row = {"profile": "p", "model": "m", "context": 1024, "n_slots": 4, "iter_latency_ms": 10.0,
           "tok_per_s": 400.0, "power_w": float("inf"), "tok_per_watt": 1.0, "quality": "q", "source": "analytic"}
    doc = {"schema_version": SCHEMA_VERSION, "command": "tpw", "instance": None, "rows": [row]}
    with pytest.raises(ValueError, match=r"'tpw' document breaks its contract: rows\.0\.context"):
        write_document({**doc, "rows": [{**row, "context": "wide"}]}, str(target))
    with pytest.raises(ValueError, match="rows.0.source"):
        write_document({**doc, "rows": [{**row, "source": "guessed"}]}, str(target))
    with pytest.raises(ValueError, match="no known kind"):
        write_document({**doc, "command": "tpw --nonsense"}, str(target))
    assert not target.exists()
    write_document(doc, str(target))      # JSON values are checked: inf is written (and checked) as null
    assert json.loads(target.read_text())["rows"][0]["power_w"] is None
