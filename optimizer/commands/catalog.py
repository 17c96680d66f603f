"""``fleetopt catalog list [--kind profiles|hardware|models] [--catalog FILE ...] [--json FILE|-]``: what the
catalogue holds.

Names to use in an instance (``gpus[i].profile``, ``hardware``, ``model``), with the figures that matter for
planning, their units and provenance (``source`` and quality labels), from ``data/catalog/*.yaml`` and the user
catalogue files of ``--catalog`` (their entries marked user-supplied, with the file)
(:func:`fleetopt.optimizer.io.catalog.catalog_listing`). Exit codes: 0, 2 for a bad option or catalogue file,
1 internal error.
"""

from __future__ import annotations

import click
from rich.table import Table

from fleetopt.optimizer.commands import catalog_option, guard
from fleetopt.optimizer.io.catalog import CATALOG_KINDS, catalog_listing
from fleetopt.optimizer.output.contract import envelope
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.output.tables import FORMATS, Output

__all__ = ["catalog", "list_catalog"]

_GIB = 2**30


def _table(title: str, columns: tuple[str, ...], rows: list[tuple]) -> Table:
    t = Table(title=title, title_justify="left")
    for name in columns:
        t.add_column(name, justify="left" if name in ("name", "model", "hf id", "family", "quality", "source",
                                                      "aliases", "attention", "latency", "power") else "right")
    for row in rows:
        t.add_row(*(("" if v is None else str(v)) for v in row))
    return t


def _render(out: Output, listing: dict) -> None:
    if "profiles" in listing:
        out.print(_table("calibrated profiles (data/catalog/calibrated_profiles.yaml; instance key gpus: profile)",
                         ("name", "model", "W ms", "H ms @ctx", "ctx", "slots @ctx", "$/hr", "latency", "power",
                          "source"),
                         [(p["name"], p["model"], f"{p['W_s'] * 1e3:.3f}", f"{p['H_s'] * 1e3:.3f}",
                           f"{p['calibration_ctx_tokens']:,}", p["max_slots"], f"{p['cost_usd_per_hr']:.2f}",
                           p["latency_quality"], p["power_quality"], p["source"]) for p in listing["profiles"]]))
    if "hardware" in listing:
        out.print(_table("hardware (data/catalog/hardware.yaml; instance key gpus: hardware, aliases accepted)",
                         ("name", "memory GiB", "TB/s", "FP16 TFLOPS", "FP8 TFLOPS", "TDP W", "$/GPU-hr",
                          "quality", "source", "aliases"),
                         [(h["name"], f"{h['memory_bytes'] / _GIB:.0f}",
                           f"{h['memory_bandwidth_bytes_per_s'] / 1e12:.2f}", f"{h['fp16_dense_tflops']:g}",
                           "-" if h["fp8_dense_tflops"] is None else f"{h['fp8_dense_tflops']:g}", f"{h['tdp_w']:g}",
                           f"{h['usd_per_gpu_hour']:.2f}", f"power {h['power_quality']}", h["source"],
                           ", ".join(h["aliases"])) for h in listing["hardware"]]))
    if "models" in listing:
        user = any(m.get("supplied_by") == "user" for m in listing["models"])   # their provenance is shown
        out.print(_table("models (data/catalog/models.yaml; instance key gpus: model, or model_config: a config.json)",
                         ("name", "hf id", "family", "attention", "layers", "params B", "active B", "card B",
                          "KV B/token", "max ctx") + ("source",) * user,
                         [(m["name"], m["hf_id"], m["family"], m["attention"], m["layers"],
                           f"{m['params_computed'] / 1e9:.2f}", f"{m['active_params_computed'] / 1e9:.2f}",
                           m["params_model_card_b"], f"{m['kv_bytes_per_token_fp16']:,}",
                           f"{m['max_position_embeddings']:,}") + (m["source"],) * user for m in listing["models"]]))
        out.print("params/active B: counted from the architecture (every matrix, embedding, untied LM head, norms); "
                  "card B: the model card's rounded figure; KV B/token: whole model at 16 bit")


def list_catalog(kind: str | None) -> dict:
    """The ``--json`` document of ``catalog list``
    (:class:`fleetopt.optimizer.output.contract.workflows.CatalogDocument`): the envelope, ``kinds`` and the listing."""
    kinds = CATALOG_KINDS if kind is None else (kind,)
    return {**envelope("catalog list", None), "kinds": list(kinds), **catalog_listing(kinds)}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def catalog():
    """What the catalogue holds: GPUs, models and profiles, with provenance."""


@catalog.command("list", params=[catalog_option()])
@click.option("--kind", type=click.Choice(CATALOG_KINDS), help="Only this kind (default: all three).")
@click.option("--json", "json_out", metavar="FILE", help="Also write the listing as JSON ('-' = stdout).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Text layout.")
@guard
def list_command(kind, json_out, fmt):
    """List calibrated profiles, hardware and models with units and provenance (user catalogue files' entries
    marked user-supplied)."""
    listing = list_catalog(kind)
    if json_out != "-":
        _render(Output(fmt), listing)
    if json_out:
        write_document(listing, json_out)
