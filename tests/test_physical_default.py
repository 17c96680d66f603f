"""Physical GPUs are the default currency (issue 30, part 1).

The quickstart plans in physical GPUs priced at the catalogue's $/GPU-hour (read here from
``data/catalog/hardware.yaml``, not from fleetopt); every bundled instance whose name does not mark it as being in
the reference scenarios' calibrated units (``ref_*``) uses physical serving configurations; the headline figures
(physical GPUs, $/hr, $/yr, kW, tok/W, $ per million output tokens) are in the solve JSON and its table, and the
calibrated "unit" convention shows, labelled ``seed_unit``, only where a calibrated profile is used.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.output.contract import validate_document

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "instances" / "quickstart.yaml"
HOURS_PER_YEAR = 8760
HEADLINE = ("physical_gpus", "cost_per_hr", "cost_per_year", "power_kw", "tok_per_watt",
            "usd_per_million_output_tokens")


def _catalogue_price_per_gpu_hour(hardware: str) -> float:
    """The catalogue's $/GPU-hour of ``hardware`` (its name or an alias), read from the shipped YAML file."""
    gpus = yaml.safe_load((REPO / "data" / "catalog" / "hardware.yaml").read_text())["gpus"]
    for name, entry in gpus.items():
        if hardware == name or hardware in (entry.get("aliases") or ()):
            return float(entry["price"]["usd_per_gpu_hour"])
    raise KeyError(hardware)


def _calibrated_profiles() -> set[str]:
    return set(yaml.safe_load((REPO / "data" / "catalog" / "calibrated_profiles.yaml").read_text())["profiles"])


def _run(*args):
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res


@pytest.fixture(scope="module")
def quickstart_solve() -> dict:
    res = _run("solve", QUICKSTART, "--json", "-")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    validate_document(doc)
    return doc


def test_the_quickstart_plan_is_in_physical_gpus_at_the_catalogue_price(quickstart_solve):
    doc = quickstart_solve
    options = {g["name"]: g for g in yaml.safe_load(QUICKSTART.read_text())["gpus"]}
    assert all("hardware" in g and "profile" not in g for g in options.values())
    expected_cost = 0.0
    for pool in doc["pools"]:
        tp = options[pool["gpu"]]["tp"]
        assert (pool["unit"], pool["gpus_per_replica"], pool["physical_gpus_per_replica"]) == ("gpu", tp, tp)
        assert pool["physical_gpus"] == pool["gpus"] == pool["replicas"] * tp
        price = _catalogue_price_per_gpu_hour(options[pool["gpu"]]["hardware"])
        # $/GPU-hour of the pool: its cost over its physical GPUs is the catalogue's price of its hardware
        assert pool["analytic"]["cost_per_hr"] / pool["physical_gpus"] == pytest.approx(price, rel=1e-9)
        expected_cost += price * pool["physical_gpus"]
    head = doc["analytic"]
    assert head["physical_gpus"] == doc["physical_gpus"] == sum(p["physical_gpus"] for p in doc["pools"])
    assert head["physical_gpus"] == head["total_gpus"]          # no seed unit: a counted GPU is a physical one
    assert head["cost_per_hr"] == pytest.approx(expected_cost, rel=1e-9)
    hardware = {options[p["gpu"]]["hardware"] for p in doc["pools"]}
    if len(hardware) == 1:      # one GPU type: the fleet's $/GPU-hour is its catalogue price
        assert head["cost_per_hr"] / head["physical_gpus"] == pytest.approx(
            _catalogue_price_per_gpu_hour(hardware.pop()), rel=1e-9)


def test_the_solve_json_carries_the_headline(quickstart_solve):
    doc = quickstart_solve
    head = doc["analytic"]
    for key in HEADLINE:
        assert isinstance(head[key], (int, float)) and head[key] > 0, key
    assert isinstance(head["physical_gpus"], int)
    assert head["cost_per_year"] == pytest.approx(head["cost_per_hr"] * HOURS_PER_YEAR, rel=1e-12)
    # $ per million output tokens: $/hr over the output tokens of an hour, per million
    assert head["usd_per_million_output_tokens"] == pytest.approx(
        head["cost_per_hr"] / (3600 * head["output_tok_per_s"]) * 1e6, rel=1e-12)
    assert head["tok_per_watt"] == pytest.approx(head["output_tok_per_s"] / (1000 * head["power_kw"]), rel=1e-12)
    assert doc["usd_per_million_output_tokens"] == head["usd_per_million_output_tokens"]
    for pool in doc["pools"]:
        a = pool["analytic"]
        assert pool["physical_gpus"] > 0 and a["cost_per_hr"] > 0
        assert a["power_kw"] == pytest.approx(a["power_w"] / 1000, rel=1e-12)
    assert sum(p["analytic"]["cost_per_hr"] for p in doc["pools"]) == pytest.approx(head["cost_per_hr"], rel=1e-12)
    assert sum(p["analytic"]["power_kw"] for p in doc["pools"]) == pytest.approx(head["power_kw"], rel=1e-12)
    base = doc["baseline"]
    assert all(base["analytic"][k] is not None for k in HEADLINE) and base["physical_gpus"] > 0


def test_the_table_gives_the_headline_in_physical_gpus(quickstart_solve):
    doc = quickstart_solve
    text = _run("solve", QUICKSTART, "--format", "plain").output
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("tokens"))
    for column in ("GPUs", "kW", "tok/W", "$/hr", "$/Mtok"):
        assert f" {column} " in f" {header} ", column
    assert "seed units" not in header and "billing unit" not in text and "seed_unit" not in text
    head = doc["analytic"]
    fleet_row = next(line for line in lines if line.startswith("fleet "))
    assert f" {head['physical_gpus']:,} " in fleet_row and f"{head['cost_per_hr']:,.2f}" in fleet_row
    (headline,) = [line for line in lines if line.startswith("fleet: ")]
    assert headline == (f"fleet: {head['physical_gpus']:,} GPUs ({head['total_replicas']:,} replicas), "
                        f"${head['cost_per_hr']:,.2f}/hr, ${head['cost_per_year']:,.0f}/yr, "
                        f"{head['power_kw']:,.2f} kW, {head['tok_per_watt']:.2f} tok/W, "
                        f"${head['usd_per_million_output_tokens']:,.2f} per million output tokens")


def test_the_unit_convention_shows_only_where_a_calibrated_profile_is_used():
    """A reference-unit instance labels its units (``seed_unit``, a ``seed units`` column, the count of units in
    the headline) and still counts 8 physical GPUs per replica."""
    path = REPO / "instances" / "ref_puzzle1_lmsys_a100.yaml"
    text = _run("solve", path, "--format", "plain").output
    assert "(seed_unit)" in text and "seed units" in text
    doc = json.loads(_run("solve", path, "--json", "-").stdout)
    assert all(p["unit"] == "seed_unit" and p["physical_gpus"] == 8 * p["replicas"] for p in doc["pools"])
    (headline,) = [line for line in text.splitlines() if line.startswith("fleet: ")]
    assert headline.startswith(f"fleet: {doc['physical_gpus']:,} GPUs ({doc['total_replicas']:,} replicas, "
                               f"{doc['total_replicas']:,} of them seed units")


def _instances():
    return sorted((REPO / "instances").glob("*.yaml"))


@pytest.mark.parametrize("path", [p for p in _instances() if not p.name.startswith("ref_")], ids=lambda p: p.name)
def test_instances_not_marked_as_reference_use_physical_configurations(path):
    """No calibrated seed profile (``profile:`` naming one of data/catalog/calibrated_profiles.yaml); every option
    is priced and powered per physical GPU (``validate``'s ``unit: gpu``)."""
    calibrated = _calibrated_profiles()
    data = yaml.safe_load(path.read_text())
    for g in data["gpus"]:
        assert g.get("profile") not in calibrated, (path.name, g)
    doc = json.loads(_run("validate", path, "--json", "-").stdout)
    assert all(g["unit"] == "gpu" and g["gpus_per_replica"] == g["physical_gpus_per_replica"] for g in doc["gpus"])


@pytest.mark.parametrize("path", [p for p in _instances() if p.name.startswith("ref_")], ids=lambda p: p.name)
def test_reference_instances_say_so_in_their_header(path):
    """A ``ref_*`` file's first comment line says it reproduces a reference or runs in the reference's units."""
    first = path.read_text().splitlines()[0].lower()
    assert first.startswith("#") and "reference" in first and ("reproduc" in first or "units" in first), first


def test_the_report_page_leads_with_the_headline(quickstart_solve):
    """``fleetopt report``'s page of the quickstart: its key figures carry the JSON's headline numbers."""
    import re

    from fleetopt.optimizer.workflows.html_report import build_html

    page = build_html(quickstart_solve)
    head = quickstart_solve["analytic"]
    for ident, key in (("total-physical-gpus", "physical_gpus"), ("total-cost-per-hr", "cost_per_hr"),
                       ("total-cost-per-year", "cost_per_year"), ("total-power-kw", "power_kw"),
                       ("tok-per-watt", "tok_per_watt"), ("usd-per-million-output-tokens",
                                                          "usd_per_million_output_tokens")):
        (value,) = re.findall(rf'id="{ident}" data-value="([^"]+)"', page)
        assert value == repr(head[key]), (ident, value)
