"""``fleetopt diff A.json B.json``: what changes from plan A to plan B (:mod:`fleetopt.optimizer.workflows.diff`):
read both plans, render the change, write its JSON. Bad input is one line on stderr, exit 2."""

from __future__ import annotations

import math

import click
from rich.table import Table

from fleetopt.optimizer.commands import CONTEXT_SETTINGS, format_option, guard, output
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.workflows.diff import PlanDiff, PlanSide, diff_files, parse_plan_flag

__all__ = ["diff", "render_diff"]


def _signed(x: float | None, fmt: str = ",.2f", unit: str = "") -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{'+' if x >= 0 else '-'}{unit}{abs(x):{fmt}}"


def _plain(x: float | None, fmt: str = ",.2f") -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:{fmt}}"


def _segment(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None else f"{lo}-{hi}"


def _verdict(s: PlanSide) -> str:
    met = "-" if s.slo_met is None else "met" if s.slo_met else "MISSED"
    if s.slo_source == "simulated" and s.ttft_p99_ci_ms is not None:
        lo, hi = s.ttft_p99_ci_ms
        return f"{met} (simulated, P99 TTFT {_plain(s.ttft_p99_ms, ',.0f')} ms [{_plain(lo, ',.0f')}, " \
               f"{_plain(hi, ',.0f')}])"
    return f"{met} ({s.slo_source}, P99 TTFT {_plain(s.ttft_p99_ms, ',.0f')} ms)"


def render_diff(c, d: PlanDiff) -> None:
    """The pools changed, the GPUs to buy or release, the figures side by side."""
    ch = d.change
    if d.instance_note:
        c.print(f"note: {d.instance_note}", markup=False)
    pools = Table(title=f"pools: A = {d.a.file} ({d.a.label}), B = {d.b.file} ({d.b.label})", title_justify="left")
    for name in ("change", "GPU", "phase", "tokens A", "tokens B", "replicas A", "replicas B", "+/-",
                 "physical GPUs A", "physical GPUs B", "+/- GPUs"):
        pools.add_column(name, justify="left" if name in ("change", "GPU", "phase") else "right", no_wrap=True)
    for p in ch.pools:
        j = p.to_json()
        pools.add_row(p.change, p.row.gpu, p.row.phase, _segment(j["min_tokens_a"], j["max_tokens_a"]),
                      _segment(j["min_tokens_b"], j["max_tokens_b"]), str(j["replicas_a"]), str(j["replicas_b"]),
                      _signed(p.replicas_delta, "d"), str(j["physical_gpus_a"]), str(j["physical_gpus_b"]),
                      _signed(p.physical_gpus_delta, "d"))
    c.print(pools)
    hw = Table(title="GPUs to buy or release (physical GPUs per hardware)", title_justify="left")
    for name in ("hardware", "A", "B", "+/-", "action"):
        hw.add_column(name, justify="left" if name in ("hardware", "action") else "right", no_wrap=True)
    for h in ch.hardware:
        hw.add_row(h.hardware, str(h.physical_gpus_a), str(h.physical_gpus_b), _signed(h.delta, "d"), h.action)
    c.print(hw)
    delta = d.delta()
    figs = Table(title="figures (analytic; the verdict from its source)", title_justify="left")
    for name in ("figure", "A", "B", "B - A"):
        figs.add_column(name, justify="left" if name == "figure" else "right", no_wrap=True)
    a, b = d.a, d.b
    figs.add_row("physical GPUs", str(a.physical_gpus), str(b.physical_gpus), _signed(delta["physical_gpus"], "d"))
    figs.add_row("replicas", str(a.total_replicas), str(b.total_replicas), _signed(delta["total_replicas"], "d"))
    figs.add_row("$/hr", _plain(a.cost_per_hr), _plain(b.cost_per_hr), _signed(delta["cost_per_hr"], ",.2f", "$"))
    figs.add_row("$/yr", _plain(a.cost_per_year, ",.0f"), _plain(b.cost_per_year, ",.0f"),
                 _signed(delta["cost_per_year"], ",.0f", "$"))
    figs.add_row("kW", _plain(a.power_kw, ",.1f"), _plain(b.power_kw, ",.1f"), _signed(delta["power_kw"], ",.1f"))
    figs.add_row("tok/W", _plain(a.tok_per_watt, ".3f"), _plain(b.tok_per_watt, ".3f"),
                 _signed(delta["tok_per_watt"], ".3f"))
    figs.add_row("$/Mtok", _plain(a.usd_per_million_output_tokens, ".3f"),
                 _plain(b.usd_per_million_output_tokens, ".3f"),
                 _signed(delta["usd_per_million_output_tokens"], ".3f", "$"))
    figs.add_row("SLO", _verdict(a), _verdict(b), "")
    c.print(figs)
    if ch.boundary_moves or ch.boundaries_added or ch.boundaries_removed:
        moves = [f"{x:,} -> {y:,}" for x, y in ch.boundary_moves]
        moves += [f"+{x:,}" for x in ch.boundaries_added] + [f"-{x:,}" for x in ch.boundaries_removed]
        c.print(f"boundaries (tokens): {', '.join(moves)}", markup=False)
    c.print(f"change: {'none' if ch.unchanged else ch.summary()}", markup=False)


@click.command(context_settings=CONTEXT_SETTINGS)
@click.argument("plan_a", metavar="A.json", type=click.Path(dir_okay=False))
@click.argument("plan_b", metavar="B.json", type=click.Path(dir_okay=False))
@click.option("--plan", "plan", metavar="N|N:M", help="Which plan of each file: N (both files) or N:M (A's N, B's "
              "M); solve: solutions[N-1] (default the selected plan), evaluate: fleets[N-1] (default the first).")
@click.option("--json", "json_out", metavar="FILE", help="Also write the result as JSON ('-' = stdout).")
@format_option
@guard
def diff(plan_a, plan_b, plan, json_out, fmt):
    """What changes from plan A to plan B (the --json of solve, evaluate or simulate): pools added, removed,
    resized or moved, GPUs to buy or release per hardware, $/hr, $/yr, kW, tok/W, $/Mtok and the SLO verdicts.
    Exit 2 on a file that is not a plan."""
    rank_a, rank_b = parse_plan_flag(plan)
    result = diff_files(plan_a, plan_b, rank_a, rank_b)
    if json_out != "-":
        render_diff(output(fmt), result)
    if json_out:
        write_document(result.to_json(), json_out, (plan_a, plan_b))
