"""Turn results into the stable JSON contract and into readable tables.

Every number carries its provenance: ``source`` says analytic / MIP /
simulated and ``quality`` the profile quality its inputs rest on.
"""

from __future__ import annotations

import csv
import io
import math
import shlex
import textwrap
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass

from rich.cells import cell_len
from rich.console import Console
from rich.errors import MarkupError
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.service import ContextPoint
from fleetopt.models.units import P99_TAIL

from fleetopt.optimizer.io.contract import (envelope, fleet_analytic, physical_gpus, pool_analytic, pool_identity,
                                             replica_unit, served_model)
from fleetopt.optimizer.io.instance import gpu_warnings
from fleetopt.optimizer.io.output import FORMATS
from fleetopt.optimizer.plan.evaluate import fleet_name_ambiguities, fleet_spec, limit_violations
from fleetopt.optimizer.io.overrides import set_flags
from fleetopt.optimizer.simulation.options import EngineOptions, SimOptions

__all__ = ["fleet_json", "pool_json", "fleet_table", "fleet_notes", "tpw_json", "tpw_table", "fmt_ms", "solve_json",
           "render_solve", "render_evaluation", "render_summary", "render_verification", "render_simulation",
           "sim_options_line", "progress_bar", "FORMATS", "Output", "Grid", "table_grid", "table_width", "layout_table",
           "objective_line", "violations_lines", "instance_warnings", "unit_lines"]

ANALYTIC = "analytic"

_POOL_KEYS = ("min_tokens", "max_tokens", "gpu", "replicas", "gpus", "arrival_rate", "utilization", "ttft_p99_ms",
              "power_w", "slo_met")


def _per_replica(instance) -> dict:
    """Each GPU option's :func:`~fleetopt.optimizer.io.contract.replica_unit` by name (empty without an
    instance: read from the pools)."""
    return {} if instance is None else {g.name: replica_unit(g.profile) for g in instance.gpus}


def pool_json(p: PoolResult, source: str = ANALYTIC, unit=None) -> dict:
    """The contract keys first (:class:`fleetopt.optimizer.io.contract.Pool`: what it serves and what a replica
    is, the ``analytic`` sub-object, no ``simulated`` one), then the details; the flat figures are the
    deprecated 1.0 aliases of ``analytic``'s. ``unit``: the pool's profile's
    :func:`~fleetopt.optimizer.io.contract.replica_unit`, when known."""
    d = asdict(p)
    out = {k: d.pop(k) for k in _POOL_KEYS}
    d.pop("model")
    out.update(pool_identity(p, unit))
    out.update(analytic=pool_analytic(p), simulated=None)
    out.update(d)
    # utilization null: an unstable queue; capacity_load says by how much
    out["overloaded"] = not math.isfinite(p.utilization)
    out["source"] = source
    return out


def fleet_json(r: FleetResult, source: str = ANALYTIC, violations=None, instance=None) -> dict:
    """A fleet's contract keys. With ``violations`` (the instance limits it breaks,
    :func:`fleetopt.optimizer.plan.evaluate.limit_violations`) they are listed under ``violations`` and
    ``feasible`` is true only when the SLO is met and none is broken. With ``instance``, each pool's
    ``gpus_per_replica`` is its profile's (else read from the pool)."""
    per = _per_replica(instance)
    out = {
        "cost_per_hr": r.cost_per_hr,
        "cost_per_year": r.cost_per_year,
        "total_replicas": r.total_replicas,
        "total_gpus": r.total_gpus,
        "physical_gpus": physical_gpus(r, per),
        "power_kw": r.power_kw,
        "tok_per_watt": r.tok_per_watt,
        "slo_met": r.slo_met,
        "feasible": r.feasible,
        "scope": r.scope,
        "ttft_p99_ms": r.ttft_p99_ms,
        "slo_miss_share": r.slo_miss_share,
        "pools": [pool_json(p, source, per.get(p.gpu)) for p in r.pools],
        "analytic": fleet_analytic(r),
        "simulated": None,
        "source": source,
    }
    if violations is not None:
        out["feasible"] = bool(r.feasible and not violations)
        out["violations"] = list(violations)
    return out


def fmt_ms(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:,.1f}"


def unit_lines(r: FleetResult, instance=None) -> list[str]:
    """What one replica of each GPU option of a fleet is, one entry per kind of replica, naming its options:
    ``a100, h100: 1 replica = 1 billing unit = 8 physical GPUs (...)``."""
    per = _per_replica(instance)
    by_text: dict[str, list[str]] = {}
    for p in r.pools:
        u = pool_identity(p, per.get(p.gpu))
        names = by_text.setdefault(u["unit_note"], [])
        if p.gpu not in names:
            names.append(p.gpu)
    return [f"{', '.join(names)}: {text}" for text, names in by_text.items()]


def fleet_table(title: str, r: FleetResult, slo_ms: float, source: str = ANALYTIC, instance=None) -> Table:
    """A fleet's pools and totals. Its title says what one replica of each GPU option is; ``replicas (GPUs)``
    counts the GPUs priced and powered (what the limits count), ``physical GPUs`` the GPUs the replicas stand
    for (they differ for the seeds' calibrated TP=8 units); ``model`` is the model each pool serves."""
    per = _per_replica(instance)
    t = Table(title=f"{title}  [P99 TTFT SLO {slo_ms:,.0f} ms]; " + "; ".join(unit_lines(r, instance)),
              title_justify="left", show_footer=True)
    t.add_column("tokens", footer="fleet", no_wrap=True)
    t.add_column("gpu", footer="")
    t.add_column("model", footer="")
    t.add_column("replicas (GPUs)", justify="right", footer=f"{r.total_replicas} ({r.total_gpus})", no_wrap=True)
    t.add_column("physical GPUs", justify="right", footer=f"{physical_gpus(r, per):,}", no_wrap=True)
    t.add_column("req/s", justify="right", footer=f"{sum(p.arrival_rate for p in r.pools):,.1f}")
    t.add_column("util", justify="right")
    t.add_column("P99 TTFT ms", justify="right", footer=fmt_ms(r.ttft_p99_ms))
    t.add_column("miss %", justify="right", footer=f"{100 * r.slo_miss_share:.2f}")
    t.add_column("power W", justify="right", footer=f"{r.power_kw * 1000:,.0f}")
    t.add_column("tok/W", justify="right", footer=f"{r.tok_per_watt:.2f}")
    t.add_column("$/hr", justify="right", footer=f"{r.cost_per_hr:,.2f}")
    t.add_column("SLO", footer=_slo_word(r.slo_met, all(p.utilization_ok for p in r.pools))
                 + (" (fleet)" if r.scope == "fleet" else ""))
    for p in r.pools:
        sized = "*" if p.sized else ""
        if r.scope == "fleet":
            status = "MISSED" if p.utilization >= 1 else "-" if p.utilization_ok else UTIL_CAP
        else:
            status = _slo_word(p.slo_met, p.utilization_ok)
        band = f" (+@{p.compress_gamma:g})" if p.compress_gamma > 1 else ""
        t.add_row(f"{p.min_tokens:,}-{p.max_tokens:,}{band}", p.gpu, served_model(p.model) or "unknown",
                  f"{p.replicas}{sized} ({p.gpus})", f"{pool_identity(p, per.get(p.gpu))['physical_gpus']:,}",
                  f"{p.arrival_rate:,.2f}", util_text(p), fmt_ms(p.ttft_p99_ms),
                  f"{100 * p.slo_miss_prob:.2f}", f"{p.power_w:,.0f}", f"{p.tok_per_watt:.2f}", f"{p.cost_per_hr:,.2f}",
                  status)
    return t


def util_text(p: PoolResult) -> str:
    """A pool's ``util`` cell: its utilisation, or for an overloaded pool (an unstable queue, utilisation
    infinite) its offered load over its capacity, marked: ``1.22 overloaded``."""
    if math.isfinite(p.utilization):
        return f"{p.utilization:.2f}"
    load = p.capacity_load
    return f"{load:.2f} overloaded" if math.isfinite(load) else "overloaded"


UTIL_CAP = "UTIL CAP"
"""Status of a pool (or fleet) that meets the TTFT SLO but runs above ``constraints.max_utilization``: a broken
limit, not a missed SLO (the JSON: ``slo_met`` true, ``feasible`` false)."""


def _slo_word(slo_met: bool, utilization_ok: bool) -> str:
    """The SLO column: ``MISSED`` only when the TTFT (or TPOT) SLO is missed; a utilisation-cap breach alone
    is :data:`UTIL_CAP`."""
    if not slo_met:
        return "MISSED" if utilization_ok else f"MISSED, {UTIL_CAP}"
    return "met" if utilization_ok else UTIL_CAP


MODEL_SOURCES = {
    "batched": "TTFT model 'batched': continuous-batching replicas at their realised occupancy, a birth-death "
               "chain over the pool's requests with arrivals clustered by prefill stalls and unequal requests, a "
               "two-moment wait once every batch place is taken",
    "tail": "TTFT model 'tail': M/G/c per KV slot at full-batch iteration time, Erlang-C with Kimura tail",
    "mean-prefill": "TTFT model 'mean-prefill', the seeds' convention: M/G/c per KV slot, P99 wait + mean prefill",
}
"""What each TTFT model's analytic numbers rest on, for the provenance line under a table."""


def fleet_notes(r: FleetResult, ttft_model: str) -> list[str]:
    """Provenance and caveat lines printed under a fleet table."""
    lines = [f"source: analytic ({MODEL_SOURCES.get(ttft_model, ttft_model)}); "
             f"cost/yr ${r.cost_per_year:,.0f}; * = sized to the minimum count"]
    if any(p.compress_gamma > 1 for p in r.pools):
        lines.append("  (+@g): the pool also serves requests up to g x its window, prompt-compressed to fit "
                     "(output kept), when compression succeeds")
    seen = {}
    for p in r.pools:
        seen.setdefault(p.gpu, (p.profile, p.model, p.quality))
    for gpu, (prof, model, q) in seen.items():
        lines.append(f"  {gpu}: profile {prof} serving {model}; {q}")
    if len({m for _, m, _ in seen.values()}) > 1:
        lines.append("  note: these pools serve different models; compare their costs with care")
    if r.scope == "fleet":
        lines.append(f"  fleet-scope SLO: {100 * r.slo_miss_share:.3f} % of all requests exceed the TTFT SLO "
                     f"(budget 1 %); fleet-wide P99 TTFT {fmt_ms(r.ttft_p99_ms)} ms")
        for p in r.pools:
            if p.slo_miss_prob > P99_TAIL:
                share = p.arrival_rate * p.slo_miss_prob / max(sum(q.arrival_rate for q in r.pools), 1e-300)
                lines.append(f"  {p.min_tokens:,}-{p.max_tokens:,} on {p.gpu}: {100 * p.slo_miss_prob:.1f} % of its "
                             f"requests are slow ({100 * share:.3f} % of all)"
                             + (f"; {p.miss_reason}" if p.miss_reason else ""))
        return lines
    for p in r.pools:
        if p.miss_reason:
            lines.append(f"  {p.min_tokens:,}-{p.max_tokens:,} on {p.gpu}: {p.miss_reason}")
    return lines


def tpw_json(rows: list[ContextPoint]) -> dict:
    """The ``tpw`` document (:class:`fleetopt.optimizer.io.contract.TpwDocument`)."""
    return {**envelope("tpw", None),
            "rows": [{"profile": r.profile, "model": r.model, "context": r.context_tokens, "n_slots": r.n_slots,
                      "iter_latency_ms": r.iter_latency_ms, "tok_per_s": r.tok_per_s, "power_w": r.power_w,
                      "tok_per_watt": r.tok_per_watt, "quality": r.quality, "source": ANALYTIC} for r in rows]}


def render_fields(c: Console, kinds: dict, schema_version: str) -> None:
    """``fleetopt schema --fields``: per document kind, its top-level contract fields
    (:func:`fleetopt.optimizer.io.contract.top_level_fields`)."""
    for kind, fields in kinds.items():
        t = Table(title=f"{kind} (schema_version {schema_version}; more keys may follow)", title_justify="left")
        for name in ("field", "type", "required", "meaning"):
            t.add_column(name)
        for name, kind_text, required, note in fields:
            t.add_row(name, kind_text, "yes" if required else "no", note)
        c.print(t)


def tpw_table(rows: list[ContextPoint]) -> Table:
    t = Table(title="one replica at full concurrency (mean sequence = context/2) - analytic",
              title_justify="left")
    for name, just in (("profile", "left"), ("model", "left"), ("context", "right"), ("n_slots", "right"),
                       ("iter ms", "right"), ("tok/s", "right"), ("power W", "right"), ("tok/W", "right"),
                       ("quality", "left")):
        t.add_column(name, justify=just)
    for r in rows:
        t.add_row(r.profile, r.model, f"{r.context_tokens:,}", str(r.n_slots), f"{r.iter_latency_ms:.3f}",
                  f"{r.tok_per_s:,.1f}", f"{r.power_w:,.1f}", f"{r.tok_per_watt:.3f}", r.quality)
    return t


PIPE_COLUMNS = 140
"""Width of ``table`` output that is not a terminal (a pipe or a file): wide enough for every table unsqueezed."""



class _Console(Console):
    """A rich console that lets a closed output pipe surface as :class:`BrokenPipeError` (the command decides the
    exit: :mod:`fleetopt.optimizer.cli`) instead of rich's own ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("the reader closed the output pipe")


def console() -> Console:
    """Rich console; output that is not a terminal gets :data:`PIPE_COLUMNS` columns so tables are not squeezed."""
    import sys

    return _Console(soft_wrap=True, width=None if sys.stdout.isatty() else PIPE_COLUMNS)


class Output:
    """Where a command's text goes, in one of :data:`FORMATS`.

    Renderers call :meth:`print` with a rich :class:`~rich.table.Table` or a line of text, as they would a
    :class:`~rich.console.Console`; the format decides the layout. In ``table`` format a table that fits the
    console's width prints boxed as built; a wider one is laid out narrow (:func:`layout_table`), so a cell is
    never shortened to an ellipsis (rich's own way to squeeze a table).
    """

    def __init__(self, fmt: str = "table", con: Console | None = None):
        if fmt not in FORMATS:
            raise ValueError(f"format: {fmt!r} is not one of {', '.join(FORMATS)}")
        self.format = fmt
        self.console = console() if con is None else con
        self._tables = 0

    @property
    def width(self) -> int:
        return self.console.width

    def print(self, obj="", **kwargs) -> None:
        if isinstance(obj, Table):
            self._table(obj)
        elif self.format == "table":
            self.console.print(obj, **kwargs)
        else:
            text = obj.plain if isinstance(obj, Text) else (str(obj) if kwargs.get("markup") is False
                                                            else _plain_text(obj))
            prefix = "# " if self.format == "csv" else ""
            self._write("\n".join(prefix + line for line in text.splitlines() or [""]))
            if self.format == "markdown":
                self._write("")  # each print its own paragraph

    def _write(self, line: str) -> None:
        self.console.file.write(line + "\n")

    def _table(self, t: Table) -> None:
        grid = table_grid(t)
        if self.format == "table":
            for part in layout_table(self.console, t, grid):
                self.console.print(part)
            return
        if self._tables and self.format == "csv":
            self._write("")
        self._tables += 1
        lines = {"plain": _plain_lines, "markdown": _markdown_lines, "csv": _csv_lines}[self.format](grid)
        for line in lines:
            self._write(line)


@dataclass(frozen=True)
class Grid:
    """A table's text: title, headers, justification per column, rows, footer (None without) and caption."""

    title: str
    headers: tuple[str, ...]
    justify: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    footer: tuple[str, ...] | None
    caption: str


def _plain_text(obj) -> str:
    """What rich would show of ``obj`` (a str holds markup), without the markup."""
    if isinstance(obj, Text):
        return obj.plain
    if obj is None:
        return ""
    if not isinstance(obj, str):
        return str(obj)
    try:
        return Text.from_markup(obj).plain
    except MarkupError:
        return obj


def table_grid(t: Table) -> Grid:
    """The text of a rich table (its public ``columns``: header, cells, footer, justification)."""
    cols = t.columns
    cells = [[_plain_text(x) for x in c.cells] for c in cols]
    rows = tuple(tuple(col[k] for col in cells) for k in range(max((len(c) for c in cells), default=0)))
    return Grid(_plain_text(t.title), tuple(_plain_text(c.header) for c in cols),
                tuple(c.justify or "left" for c in cols), rows,
                tuple(_plain_text(c.footer) for c in cols) if t.show_footer else None, _plain_text(t.caption))


def table_width(c: Console, t: Table) -> int:
    """Columns a table needs to show every cell on one line (rich's own measure, borders and padding included)."""
    return Measurement.get(c, c.options.update(width=10**6), t).maximum


def layout_table(c: Console, t: Table, grid: Grid | None = None) -> list:
    """Renderables showing ``t`` within ``c.width`` with no cell shortened.

    The table as built when it fits; else its columns split into groups, each repeating the first (key) column,
    greedily in order while a group fits; else (a key and one column do not fit side by side) stacked: per row, its
    key on a line and one ``header  value`` line per column.
    """
    if table_width(c, t) <= c.width:
        return [t]
    grid = table_grid(t) if grid is None else grid
    width = _group_width(c, t, grid)
    groups = _column_groups(width, len(grid.headers), c.width)
    if groups is None:
        return _stacked(grid)
    low, high = 1, c.width  # the narrowest cap giving as few groups: balanced groups
    while low < high:
        mid = (low + high) // 2
        trial = _column_groups(width, len(grid.headers), mid)
        if trial is not None and len(trial) <= len(groups):
            high = mid
        else:
            low = mid + 1
    groups = _column_groups(width, len(grid.headers), high)
    out = [_sub_table(t, grid, g, grid.title if n == 0 else f"{grid.title} (continued)" if grid.title else "")
           for n, g in enumerate(groups)]
    if grid.caption:
        out.append(Text(grid.caption, style="dim"))
    return out


def _group_width(c: Console, t: Table, grid: Grid) -> Callable[[list[int]], int]:
    """The width of the sub-table of some columns (:func:`_sub_table`), without building it: its columns'
    widths (the widest of header, cells and footer) plus the borders and padding, which grow by the same amount
    per column; that affine part is measured once by rich on the sub-tables of the key column and of the first
    two columns, so the sum equals :func:`table_width` of the sub-table."""
    rows = [grid.headers, *grid.rows] + ([grid.footer] if grid.footer else [])
    col = [max(cell_len(r[k]) for r in rows) for k in range(len(grid.headers))]
    one = table_width(c, _sub_table(t, grid, [0], "")) - col[0]
    per = (table_width(c, _sub_table(t, grid, [0, 1], "")) - col[0] - col[1] - one) if len(col) > 1 else 0
    return lambda columns: sum(col[k] for k in columns) + one + per * (len(columns) - 1)


def _column_groups(width: Callable[[list[int]], int], n_columns: int, cap: int) -> list[list[int]] | None:
    """Column indices per group, each group the key column 0 and the next columns in order while the group fits
    ``cap`` (``width``: :func:`_group_width`); None when the key and one column do not fit side by side."""
    groups, current = [], [0]
    for k in range(1, n_columns):
        if width(current + [k]) <= cap:
            current.append(k)
            continue
        if len(current) == 1:
            return None
        groups.append(current)
        current = [0, k]
        if width(current) > cap:
            return None
    groups.append(current)
    return groups


def _sub_table(t: Table, grid: Grid, columns: list[int], title: str) -> Table:
    s = Table(title=Text(title) if title else None, title_justify="left", show_footer=grid.footer is not None,
              box=t.box, pad_edge=t.pad_edge, show_lines=t.show_lines)
    for k in columns:
        s.add_column(Text(grid.headers[k]), footer=Text(grid.footer[k]) if grid.footer else "",
                     justify=grid.justify[k], no_wrap=True)
    for row in grid.rows:
        s.add_row(*(Text(row[k]) for k in columns))
    return s


def _stacked(grid: Grid) -> list:
    """One block per row: its key column's header and value, then ``header  value`` per other column (the footer
    row last, under its own key)."""
    width = max((len(h) for h in grid.headers[1:]), default=0)
    out = [Text(grid.title, style="italic")] if grid.title else []
    keyed = [(f"{grid.headers[0]} {row[0]}", row) for row in grid.rows]
    for key, row in keyed + ([(grid.footer[0], grid.footer)] if grid.footer else []):
        out.append(Text(key, style="bold"))
        out += [Text(f"  {h:<{width}}  {v}") for h, v in zip(grid.headers[1:], row[1:]) if v != ""]
    if grid.caption:
        out.append(Text(grid.caption, style="dim"))
    return out


def _plain_lines(grid: Grid) -> list[str]:
    """Aligned columns, two spaces apart, a dashed rule under the header and above the footer; never cut."""
    rows = [grid.headers, *grid.rows] + ([grid.footer] if grid.footer else [])
    widths = [max(len(r[k]) for r in rows) for k in range(len(grid.headers))]

    def line(r):
        return "  ".join(v.rjust(w) if j == "right" else v.center(w) if j == "center" else v.ljust(w)
                         for v, w, j in zip(r, widths, grid.justify)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    body = [line(grid.headers), rule] + [line(r) for r in grid.rows]
    if grid.footer:
        body += [rule, line(grid.footer)]
    return ([grid.title] if grid.title else []) + body + ([grid.caption] if grid.caption else []) + [""]


def _markdown_lines(grid: Grid) -> list[str]:
    def cells(r):
        return "| " + " | ".join(v.replace("|", "\\|") for v in r) + " |"

    align = {"right": "---:", "center": ":---:"}
    out = [f"**{grid.title}**", ""] if grid.title else []
    out += [cells(grid.headers), "| " + " | ".join(align.get(j, "---") for j in grid.justify) + " |"]
    out += [cells(r) for r in grid.rows]
    if grid.footer:
        out.append(cells([f"**{v}**" if v else "" for v in grid.footer]))
    return out + ([""] + [grid.caption] if grid.caption else []) + [""]


def _csv_lines(grid: Grid) -> list[str]:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(grid.headers)
    w.writerows(grid.rows)
    if grid.footer:
        w.writerow(grid.footer)
    head = [f"# {grid.title}"] if grid.title else []
    return head + buf.getvalue().splitlines() + ([f"# {grid.caption}"] if grid.caption else [])


def render_summary(c: Console, s: dict) -> None:
    w = s["workload"]
    c.print(f"[bold]{s['name']}[/bold]: valid")
    c.print(f"  workload: {w['kind']} {w['source']}, {w['arrival_rate']:,.2f} req/s"
            + (f", input fraction {w['input_fraction']}" if w["input_fraction"] is not None else "")
            + (f"; {w['truncated_share']:.4%} of requests exceed max_context and are truncated"
               if w["truncated_share"] > 0 else ""))
    slo = s["slo"]
    margin = slo.get("ttft_margin") or 0.0      # the sizing target is the instance's (api.summarize_instance)
    c.print(f"  SLO: P99 TTFT {slo['ttft_p99_ms']:,.0f} ms ({slo['ttft_model']}, scope {slo['scope']})"
            + (f", P99 TPOT {slo['tpot_p99_ms']:,.0f} ms" if slo["tpot_p99_ms"] else "")
            + (f"; plans sized to {slo['ttft_sizing_ms']:,.0f} ms (ttft_margin {100 * margin:g} %)"
               if margin else ""))
    p = s["pools"]
    c.print(f"  pools: up to {p['max_pools']}, max context {p['max_context']:,}, {len(p['boundaries'])} "
            f"boundaries, routing {p['routing']}; objective {s['objective']}")
    t = Table(title="GPU options (GPUs/replica: the GPUs a replica is priced and powered as, and the limits count; "
                    "physical: the GPUs its constants describe)", title_justify="left")
    for col in ("name", "profile", "model", "GPUs/replica", "physical GPUs/replica", "$/hr/replica",
                "slots @max ctx", "max GPUs", "availability", "quality"):
        t.add_column(col)
    for g in s["gpus"]:
        t.add_row(g["name"], g["profile"], g["model"], str(g["gpus_per_replica"]), str(g["physical_gpus_per_replica"]),
                  f"{g['cost_per_hr']:.2f}", str(g["n_slots_at_max_context"]),
                  "-" if g["max_count"] is None else str(g["max_count"]), f"{g['availability']:g}", g["quality"])
    c.print(t)
    for g in s["gpus"]:
        c.print(f"  {g['name']}: {g['unit_note']}", markup=False)
    for line in s.get("warnings", ()):
        c.print(f"  warning: {line}")


def render_evaluation(c: Console, report) -> None:
    """Print an :class:`fleetopt.optimizer.api.EvaluationReport`: each fleet, the baseline and the saving."""
    inst = report.instance
    slo_ms = inst.slo.ttft_p99_s * 1000.0
    for k, (text, r) in enumerate(report.fleets):
        c.print(fleet_table(f"fleet {text}", r, slo_ms, instance=inst))
        for line in fleet_notes(r, inst.slo.ttft_model):
            c.print(line, markup=False)
        for line in violations_lines(r, report.fleet_violations(k)):
            c.print(line, markup=False)
    b = report.baseline
    if b is not None:
        c.print(fleet_table("homogeneous baseline (cheapest single pool)", b, slo_ms, instance=inst))
        for line in fleet_notes(b, inst.slo.ttft_model)[1:]:
            c.print(line, markup=False)
        for line in violations_lines(b, report.baseline_violations, "baseline"):
            c.print(line, markup=False)
        for k, (text, r) in enumerate(report.fleets):
            if not (b.feasible and not report.baseline_violations):
                c.print(f"fleet {text}: ${r.cost_per_year:,.0f}/yr; no saving against the baseline is claimed: "
                        "no single pool meets the SLO within the instance's limits", markup=False)
            else:
                c.print(f"fleet {text}: ${r.cost_per_year:,.0f}/yr vs baseline ${b.cost_per_year:,.0f}/yr; "
                        f"{saving_claim(inst, r, b, report.fleet_violations(k))}", markup=False)
    sized = [p for _, r in report.fleets for p in r.pools] + ([] if b is None else list(b.pools))
    if inst.slo.ttft_margin and any(p.sized for p in sized):
        c.print(f"note: * {margin_note(inst.slo)}", markup=False)
    if inst.workload.truncated_share > 0:
        c.print(f"note: {inst.workload.truncated_share:.4%} of requests are longer than the largest context "
                "window and are served truncated to it")


def _pool_contract(p: PoolResult, source: str, instance=None) -> dict:
    d = pool_json(p, source, _per_replica(instance).get(p.gpu))
    d["routing_share"] = p.routing_share
    return d


def _sim_pools(vp) -> list:
    """The simulated pools of a verified plan, in the plan's order (a split plan may hold two pools of one range
    and GPU, so they are matched by position)."""
    n = len(vp.plan.fleet.pools)
    return list(vp.sim.pools) if len(vp.sim.pools) == n else [None] * n


def trim_json(trim, plan, instance) -> dict | None:
    """The ``trim`` block of a verification (:mod:`fleetopt.optimizer.simulation.trim`); every count in it is
    simulated."""
    if trim is None:
        return None
    pools = []
    for p, n, u, s, conf in zip(plan.fleet.pools, trim.counts, trim.up_counts, trim.sim.pools,
                                trim.confirmation.pools):
        pools.append({"min_tokens": p.min_tokens, "max_tokens": p.max_tokens, "gpu": p.gpu, "replicas": n,
                      "replicas_up": u, "replicas_verified": p.replicas, "ttft_p99_ms_sim": s.ttft_p99_ms_sim,
                      "ttft_p99_ci_ms": list(s.ttft_p99_ci_ms), "ttft_p99_ms_confirmation": conf.ttft_p99_ms_sim,
                      "ttft_p99_ms_analytic": s.analytic.ttft_p99_ms, "slo_met_analytic": s.analytic.slo_met})
    return {"source": "simulated", "confirmed": trim.confirmed, "cost_per_hr": trim.cost_per_hr,
            "verified_cost_per_hr": trim.verified_cost_per_hr, "savings": trim.savings,
            "ttft_p99_ms_sim": trim.sim.ttft_p99_ms, "ttft_p99_ms_confirmation": trim.confirmation.ttft_p99_ms,
            "fleet": fleet_spec(instance, trim.sim.analytic, trim.counts),
            "fleet_simulated": fleet_spec(instance, trim.sim.analytic), "trials": len(trim.steps),
            "requests_per_trial": trim.requests_per_trial, "pools": pools, "options": trim.sim.options.to_json()}


def verification_json(v, instance) -> dict:
    """The ``verification`` block of ``solve --verify-top N``: every simulated plan, per round (and the trim)."""
    plans = []
    for vp in v.plans:
        pools = []
        for p, s in zip(vp.plan.fleet.pools, _sim_pools(vp)):
            key = (p.min_tokens, p.max_tokens, p.gpu)
            pools.append({"min_tokens": p.min_tokens, "max_tokens": p.max_tokens, "gpu": p.gpu, "replicas": p.replicas,
                          "ttft_p99_ms_analytic": p.ttft_p99_ms,
                          "ttft_p99_ms_sim": None if s is None else s.ttft_p99_ms_sim,
                          "ttft_p99_ci_ms": None if s is None else list(s.ttft_p99_ci_ms),
                          "slo_met_sim": key not in vp.failing_pools and key not in vp.undecided_pools,
                          "outcome": ("fail" if key in vp.failing_pools else "undecided"
                                      if key in vp.undecided_pools or key in vp.thin_pools else "pass"),
                          "too_few_requests": (p.min_tokens, p.max_tokens, p.gpu) in vp.thin_pools,
                          "requests_measured": None if s is None else s.requests,
                          "preemptions": None if s is None else s.preemptions})
        plans.append({"round": vp.round, "rank": vp.rank, "cost_per_hr": vp.plan.fleet.cost_per_hr, "passed": vp.passed,
                      "outcome": vp.outcome, "accepted": vp.accepted, "verdict": vp.verdict(),
                      "ttft_p99_ms_sim": vp.sim.ttft_p99_ms, "ttft_p99_ci_ms": list(vp.sim.ttft_p99_ci_ms),
                      "requests_simulated": vp.sim.requests_simulated, "cached": vp.cached, "pools": pools})
    sizing = [{"min_tokens": z.candidate.lo_tokens, "max_tokens": z.candidate.hi_tokens, "gpu": z.candidate.gpu,
               "max_num_seqs": z.candidate.max_num_seqs, "least_replicas": z.least_replicas,
               "cap_replicas": z.cap_replicas, "reason": z.reason,
               "trials": [{"replicas": t.replicas, "passed": t.passed, "outcome": t.outcome,
                           "ttft_p99_ms_sim": t.ttft_p99_ms_sim, "ttft_p99_ci_ms": list(t.ttft_p99_ci_ms),
                           "requests": t.requests, "requests_simulated": t.requests_simulated, "source": t.source}
                          for t in z.trials]} for z in v.sizings]
    return {"rule": v.rule, "rounds": v.rounds, "cuts": list(v.cuts), "plans": plans, "reason": v.reason,
            "pool_sizing": sizing, "solves": v.solves, "plan_simulations": v.plan_simulations,
            "pool_simulations": v.pool_simulations, "pool_runs": v.pool_runs,
            "engine": v.plans[0].sim.engine.to_json() if v.plans else None, "options": v.options.to_json(),
            "outcome": v.outcome, "verdict": None if v.chosen is None else v.chosen.verdict(),
            "chosen_rank": None if v.chosen is None else v.chosen.rank,
            "chosen_round": None if v.chosen is None else v.chosen.round,
            "trim": None if v.chosen is None else trim_json(v.trim, v.chosen.plan, instance)}


def routing_json(routing) -> dict | None:
    """A split-routing plan's routing (:class:`fleetopt.optimizer.plan.split_candidates.SplitRouting`): per
    elementary length segment, the rate in req/s sent to each pool (columns in the order of the plan's pools);
    None under length routing."""
    if routing is None:
        return None
    return {"boundaries_tokens": list(routing.boundaries_tokens),
            "rate_req_per_s": [list(row) for row in routing.rate_req_per_s], "source": "MIP"}


def solve_json(report, verification=None) -> dict:
    """The stable JSON contract of ``fleetopt solve`` (see README); with a verification, its chosen plan heads it."""
    inst = report.instance
    unit = OBJECTIVE_UNITS[inst.objective]
    best = report.best
    if verification is not None and verification.chosen is not None:
        best = verification.chosen.plan
    out = {**envelope("solve", inst.name), "overrides": list(inst.overrides),
           "status": str(report.status), "method": report.method,
           "solver": report.solver, "explanation": report.explanation,
           "objective": {"name": inst.objective, "value": None if best is None else best.objective, "unit": unit,
                         "bound": report.bound, "lp_bound": report.lp_bound,
                         "minimizes": OBJECTIVE_MEANINGS[inst.objective]}}
    fleet = fleet_json(best.fleet, "analytic", instance=inst) if best else {k: None for k in (
        "cost_per_hr", "cost_per_year", "total_replicas", "total_gpus", "physical_gpus", "power_kw", "tok_per_watt",
        "slo_met", "feasible", "pools", "analytic", "simulated")}
    if best:
        fleet["pools"] = [_pool_contract(p, "analytic", inst) for p in best.fleet.pools]
    fleet["fleet"] = fleet_spec(inst, best.fleet) if best else None
    fleet["routing"] = routing_json(best.routing) if best else None
    out.update(fleet)
    out["baseline"] = (None if report.baseline is None else
                       fleet_json(report.baseline, violations=limit_violations(inst, report.baseline), instance=inst))
    out["warnings"] = solve_warnings(report)
    out.update({
        "solve_seconds": report.solve_seconds, "mip_gap": report.mip_gap,
        "ttft_model": inst.slo.ttft_model, "slo_ttft_p99_ms": inst.slo.ttft_p99_s * 1000.0,
        "ttft_margin": inst.slo.ttft_margin, "ttft_sizing_ms": inst.slo.ttft_sizing_s * 1000.0,
        "power_linearization_error_w": report.power_error_w,
        "candidates": {"generated": report.candidates_generated, "feasible": report.candidates_feasible,
                       "after_pruning": report.candidates_after_pruning, "dropped": list(report.dropped_reasons)},
        "solutions": [{"rank": p.rank, "objective": p.objective, **fleet_json(p.fleet, instance=inst),
                       "fleet": fleet_spec(inst, p.fleet), "routing": routing_json(p.routing)} for p in report.plans],
        "verified": None if verification is None else verification.verified,
        **({} if verification is None else {"verification": verification_json(verification, inst)}),
        "provenance": {"selection": report.method, "numbers": "analytic re-evaluation of the selected pools",
                       "profiles": sorted({f"{p.gpu}: {p.quality}" for p in (best.fleet.pools if best else ())})},
    })
    return out


def instance_warnings(inst) -> list[str]:
    """Caveats about an instance itself, for ``validate`` and ``solve``: GPU options that count a replica
    differently or serve an unknown model (:func:`fleetopt.optimizer.io.instance.gpu_warnings`), and option
    names a ``--fleet`` spec reads two ways (:func:`fleetopt.optimizer.plan.evaluate.fleet_name_ambiguities`)."""
    return gpu_warnings(inst) + fleet_name_ambiguities(inst)


def solve_warnings(report) -> list[str]:
    """Caveats a reader of a plan must see: the instance's own (:func:`instance_warnings`), mixed models,
    truncated requests, a baseline that misses."""
    out = instance_warnings(report.instance)
    best = report.best
    plan_models = sorted({p.model for p in best.fleet.pools}) if best else []
    if len(plan_models) > 1:
        out.append("the plan's pools serve different models: " + "; ".join(plan_models))
    if best and report.baseline is not None:
        base_models = sorted({p.model for p in report.baseline.pools})
        if base_models != plan_models:
            out.append(f"the plan serves {', '.join(plan_models)} but the baseline serves {', '.join(base_models)}: "
                       "the saving compares different models")
        if not report.baseline.slo_met:
            out.append("the homogeneous baseline misses the SLO")
        broken = limit_violations(report.instance, report.baseline)
        if broken:
            out.append("the homogeneous baseline breaks the instance's limits (" + "; ".join(broken)
                       + "): no saving against it is claimed")
    share = report.instance.workload.truncated_share
    if share > 0:
        out.append(f"{share:.4%} of requests exceed max_context and are served truncated")
    return out


def render_verification(c: Console, v, slo_ms: float, instance=None) -> None:
    """Analytic vs simulated P99 per pool for every simulated plan, and the verdict."""
    t = Table(title=f"verification (rule {v.rule}): analytic vs simulated P99 TTFT, SLO {slo_ms:,.0f} ms",
              title_justify="left")
    for col in ("round", "plan", "$/hr", "pool", "replicas", "analytic ms", "simulated ms (95% CI)", "verdict"):
        t.add_column(col)
    for vp in v.plans:
        for k, (p, s) in enumerate(zip(vp.plan.fleet.pools, _sim_pools(vp))):
            sim_txt = "-" if s is None else (f"{s.ttft_p99_ms_sim:,.1f} ({s.ttft_p99_ci_ms[0]:,.1f}-"
                                             f"{s.ttft_p99_ci_ms[1]:,.1f})")
            key = (p.min_tokens, p.max_tokens, p.gpu)
            verdict = ("MISSES" if key in vp.failing_pools else "too few requests" if key in vp.thin_pools
                       else "undecided" if key in vp.undecided_pools else "ok")
            rank = f"{vp.rank} (judged before)" if vp.cached else str(vp.rank)
            t.add_row(str(vp.round) if k == 0 else "", rank if k == 0 else "",
                      f"{vp.plan.fleet.cost_per_hr:,.2f}" if k == 0 else "",
                      f"{p.min_tokens:,}-{p.max_tokens:,} {p.gpu}",
                      str(p.replicas), fmt_ms(p.ttft_p99_ms), sim_txt, verdict)
    c.print(t)
    _say(c, f"simulated with {sim_options_line(v.options)}")
    for cut in v.cuts:
        _say(c, f"cut {cut}")
    _say(c, f"{v.solves} solve(s), {v.plan_simulations} plan simulation(s), {v.pool_simulations} single-pool "
         "simulation(s)")
    if v.chosen is None and v.reason is not None:
        _say(c, f"infeasible in simulation: {v.reason}")
    elif v.chosen is None:
        _say(c, f"no plan met the SLO in simulation within {v.rounds} round(s)")
    else:
        _say(c, f"chosen: round {v.chosen.round}, plan {v.chosen.rank}, ${v.chosen.plan.fleet.cost_per_hr:,.2f}/hr "
             f"(simulated fleet P99 {v.chosen.sim.ttft_p99_ms:,.1f} ms, {v.chosen.sim.requests_simulated:,} requests)"
             + ("" if v.chosen.passed else f"; {v.chosen.verdict()}: every pool's P99 point estimate meets the SLO, "
                "its interval straddles it"))
        if v.trim is not None:
            render_trim(c, v.trim, v.chosen.plan, instance)


_ENGINE_DEFAULTS = EngineOptions().to_json()


def render_trim(c: Console, trim, plan, instance=None) -> None:
    """The chosen plan trimmed by simulation (:mod:`fleetopt.optimizer.simulation.trim`): counts, P99s and the
    confirmation."""
    pools = ", ".join(f"{p.min_tokens:,}-{p.max_tokens:,} {p.gpu} {v} -> {n}" + (f" ({u} up)" if u != n else "")
                      for p, v, n, u in zip(plan.fleet.pools, trim.verified_counts, trim.counts, trim.up_counts))
    if trim.counts == trim.verified_counts:
        lucky = any(s.passed and s.pool >= 0 for s in trim.steps)
        if lucky:
            why = "trimmed counts passed with the search seed but missed with an independent seed: verified counts kept"
        elif any(s.pool >= 0 for s in trim.steps):
            why = "no pool could lose a replica and still meet the SLO"
        else:
            why = "every pool is at its load floor (offered load over its slots at max_utilization)"
        _say(c, f"trim (simulated): {why} ({len(trim.steps)} trials of {trim.requests_per_trial:,} requests; "
             f"independent seed: {'met' if trim.confirmed else 'MISSED'}, P99 {trim.confirmation.ttft_p99_ms:,.1f} ms)")
        return
    missed = [f"{p.min_tokens:,}-{p.max_tokens:,}" for p, s in zip(plan.fleet.pools, trim.sim.pools)
              if not s.analytic.slo_met]
    _say(c, f"trim (simulated, {len(trim.steps)} trials of {trim.requests_per_trial:,} requests): {pools}; "
         f"${trim.cost_per_hr:,.2f}/hr, "
         f"{trim.savings:.1%} below the verified plan; simulated fleet P99 {trim.sim.ttft_p99_ms:,.1f} ms, "
         f"{trim.confirmation.ttft_p99_ms:,.1f} ms with an independent seed"
         + (f"; analytically these pools miss: {', '.join(missed)}" if missed else ""))
    spec = None if instance is None else fleet_spec(instance, trim.sim.analytic)
    if spec is not None:
        e = trim.sim.engine
        flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in e.to_json().items()
                        if v is not None and v != _ENGINE_DEFAULTS.get(k))
        if trim.sim.options.replications != SimOptions().replications:
            flags += f" --replications {trim.sim.options.replications}"
        sets = set_flags(instance.overrides)
        c.print(f"check the trimmed plan: fleetopt simulate {shlex.quote(str(instance.path or instance.name))} "
                + (f"{sets} " if sets else "")
                + f"--fleet '{spec}'{flags} --requests {trim.sim.requests_simulated} "
                f"--seed {trim.confirmation.seed + 1}",
                soft_wrap=True, highlight=False)


OBJECTIVE_UNITS = {"cost": "usd_per_hr", "power": "kw", "tok_per_watt": "kw", "cost+power": "usd_per_hr"}
"""Unit of the solver's objective value per objective (the JSON's ``objective.unit``)."""
OBJECTIVE_MEANINGS = {"cost": "fleet cost in $/hr",
                      "power": "fleet power in kW",
                      "tok_per_watt": "fleet power in kW (the served tokens/s are fixed by the workload, so the "
                                      "least power is the most tokens per watt)",
                      "cost+power": "fleet cost plus energy in $/hr (usd_per_kwh x PUE x kW)"}
"""What the solver minimises per objective (the JSON's ``objective.minimizes``): tok_per_watt is solved as least
power (:meth:`fleetopt.solvers.problem.FleetProblem.choice_objective`)."""


def objective_line(inst, value: float, fleet: FleetResult) -> str:
    """The objective of a plan with its unit, saying what was minimised (the solver's value, ``source: MIP``
    or oracle) and, for tok_per_watt, the fleet's tokens per watt (analytic).

    Examples
    --------
    >>> class I: objective = "tok_per_watt"
    >>> class F: tok_per_watt = 16.2169
    >>> objective_line(I, 8.4061, F)
    'objective tok_per_watt: least power 8.406 kW -> 16.22 tok/W'
    """
    name = inst.objective
    if name == "cost":
        return f"objective cost = ${value:,.2f}/hr"
    if name == "power":
        return f"objective power = {value:,.4g} kW"
    if name == "tok_per_watt":
        return f"objective tok_per_watt: least power {value:,.4g} kW -> {fleet.tok_per_watt:.2f} tok/W"
    return f"objective cost+power = ${value:,.2f}/hr (GPUs + energy)"


def saving_claim(inst, fleet: FleetResult, base: FleetResult, fleet_broken=(), base_broken=()) -> str:
    """What ``fleet`` saves against the homogeneous baseline, on the quantity the instance's objective minimises
    (cost; power for ``power`` and ``tok_per_watt``; cost with energy for ``cost+power``), each figure named;
    or why no saving is claimed: the fleet misses its SLO or breaks a limit (``fleet_broken``), or the baseline
    does (``base_broken``).

    Examples
    --------
    >>> class I: objective, pue, energy_usd_per_kwh = "power", 1.0, None
    >>> class F: cost_per_hr, power_kw, slo_met, feasible = 12.0, 3.0, True, True
    >>> class B: cost_per_hr, power_kw, slo_met, feasible = 10.0, 4.0, True, True
    >>> print(saving_claim(I, F, B))
    saves 25.0% of power against the homogeneous baseline; its cost is 20.0% above the baseline's
    """
    if not fleet.slo_met or not fleet.feasible or fleet_broken:
        why = "; ".join((["it misses the SLO"] if not fleet.slo_met else [])
                        + ([f"it breaks {len(fleet_broken)} limit(s) of the instance"] if fleet_broken else [])
                        + (["a pool runs above its utilisation cap"]
                           if fleet.slo_met and not fleet.feasible and not fleet_broken else []))
        return f"no saving is claimed: {why}"
    if not base.slo_met or not base.feasible or base_broken:
        return "no saving is claimed: no single pool meets the SLO within the instance's limits"
    energy = (inst.energy_usd_per_kwh or 0.0) * inst.pue
    name = inst.objective
    what, ours, theirs = {"power": ("power", fleet.power_kw, base.power_kw),
                          "tok_per_watt": ("power", fleet.power_kw, base.power_kw),
                          "cost+power": ("cost with energy", fleet.cost_per_hr + energy * fleet.power_kw,
                                         base.cost_per_hr + energy * base.power_kw)}.get(
        name, ("cost", fleet.cost_per_hr, base.cost_per_hr))
    if theirs <= 0:
        return f"no saving is claimed: the baseline's {what} is zero"
    share = 1 - ours / theirs
    text = (f"saves {share:.1%} of {what} against the homogeneous baseline" if share >= 0 else
            f"needs {-share:.1%} more {what} than the homogeneous baseline")
    if what != "cost" and base.cost_per_hr > 0:
        cost = fleet.cost_per_hr / base.cost_per_hr - 1
        text += f"; its cost is {abs(cost):.1%} {'above' if cost > 0 else 'below'} the baseline's"
    return text


def violations_lines(r: FleetResult, violations, label: str = "fleet") -> list[str]:
    """Lines under a fleet's table naming each instance limit it breaks (empty when none): the first says the
    fleet is infeasible, one line per limit follows."""
    if not violations:
        return []
    return [f"{label} is infeasible: it breaks {len(violations)} limit(s) of the instance"
            + ("" if r.slo_met else ", and misses the SLO")] + [f"  breaks {v}" for v in violations]


def margin_note(slo) -> str:
    """What the sizing margin did, under a solve's plans (``slo.ttft_margin`` > 0)."""
    return (f"pools sized to P99 TTFT <= {slo.sizing_text()}, for the model's error and a simulation's "
            "resolution; --set slo.ttft_margin=0 sizes to the SLO itself")


def render_solve(c: Console, report, verification=None) -> None:
    inst = report.instance
    slo_ms = inst.slo.ttft_p99_s * 1000.0
    gap = "-" if report.mip_gap is None else f"{report.mip_gap:.2%}"
    c.print(f"[bold]{inst.name}[/bold]: {report.status} ({report.method}, {report.solver}; gap {gap}; "
            f"{report.solve_seconds:.2f} s; candidates {report.candidates_generated} -> feasible "
            f"{report.candidates_feasible} -> after pruning {report.candidates_after_pruning})")
    if not report.plans:
        c.print(f"no plan: {report.explanation}")
        if verification is not None:       # the cuts of a verification may be why: it says which and why
            render_verification(c, verification, slo_ms, inst)
        return
    for plan in report.plans:
        c.print(fleet_table(f"plan {plan.rank}: {objective_line(inst, plan.objective, plan.fleet)}", plan.fleet,
                            slo_ms, instance=inst))
        for line in fleet_notes(plan.fleet, inst.slo.ttft_model):
            c.print(line.replace("source: analytic", f"selected by {report.method}; numbers analytic", 1),
                    markup=False)
    if inst.slo.ttft_margin:
        c.print(f"note: {margin_note(inst.slo)}, --verify-top checks in simulation instead", markup=False)
    b = report.baseline
    if b is not None:
        best = report.best.fleet
        broken = limit_violations(inst, b)
        why = "; ".join((["misses the SLO"] if not b.slo_met else [])
                        + ([f"breaks {', '.join(v.split(':', 1)[0] for v in broken)}"] if broken else []))
        c.print(f"homogeneous baseline (analytic): {b.pools[0].gpu} x {b.total_replicas} "
                f"on 0-{b.pools[0].max_tokens:,}, "
                f"${b.cost_per_year:,.0f}/yr, {b.power_kw:,.1f} kW, {b.tok_per_watt:.2f} tok/W"
                + (f" -> plan 1 {saving_claim(inst, best, b, limit_violations(inst, best))}" if not why else "")
                + (f" - infeasible: {why}; no single pool meets the SLO within the instance's limits, so no saving "
                   "is claimed" if why else ""), markup=False)
    for w in solve_warnings(report):
        c.print(f"note: {w}")
    if report.plans and report.status == "time_limit" and report.explanation:
        c.print(f"note: {report.explanation}", markup=False)     # e.g. which GPU options the time limit left out
    if verification is not None:
        render_verification(c, verification, slo_ms, inst)
        return
    spec = fleet_spec(inst, report.best.fleet)
    flags = set_flags(inst.overrides)  # the overrides the plan was solved with: the command must carry them
    where = shlex.quote(str(inst.path or inst.name)) + (f" {flags}" if flags else "")
    if spec is not None:
        c.print(f"check it in simulation: fleetopt simulate {where} --fleet '{spec}'", soft_wrap=True,
                highlight=False)
    elif report.best.routing is not None:
        c.print(f"split routing: the JSON (--json FILE) holds each plan's req/s per length segment and pool; check it "
                f"in simulation: fleetopt simulate {where} --plan FILE", soft_wrap=True, highlight=False)


def render_simulation(c: Console, rep) -> None:
    """Print an :class:`fleetopt.optimizer.simulation.records.SimReport`: per pool, analytic next to simulated,
    then provenance."""

    def ms(x: float) -> str:
        """A time in ms: ``-`` when nothing was measured (NaN), ``inf`` when unbounded."""
        return "-" if math.isnan(x) else ("inf" if x == math.inf else f"{x:,.1f}")

    def ci(bounds: tuple[float, float]) -> str:
        return "" if all(math.isnan(x) for x in bounds) else f" [{ms(bounds[0])}, {ms(bounds[1])}]"

    t = Table(title=f"{rep.instance_name}: simulated vs analytic  [P99 TTFT SLO {rep.slo_ttft_p99_ms:,.0f} ms, "
                    f"scope {rep.scope}]", title_justify="left", show_footer=True, pad_edge=False,
              caption="util, batch, power W: analytic / simulated; TTFT, TPOT: P99 in ms", caption_justify="left")
    a = rep.analytic
    cols = [("tokens", "fleet"), ("gpu", ""), ("repl.", str(a.total_replicas)), ("util", ""), ("batch", ""),
            ("TTFT an", ms(a.ttft_p99_ms)), ("TTFT sim [95% CI]", ms(rep.ttft_p99_ms) + ci(rep.ttft_p99_ci_ms)),
            ("attain %", f"{100 * rep.slo_attainment:.2f}"), ("TPOT sim", ms(rep.tpot_p99_ms)),
            ("power W", f"{a.power_kw * 1000:,.0f} / {rep.power_kw * 1000:,.0f}"),
            ("SLO", "met" if rep.slo_met else "MISSED")]
    rows = []
    for p in rep.pools:
        q = p.analytic
        rows.append((f"{q.min_tokens:,}-{q.max_tokens:,}"
                     + (f" (+@{q.compress_gamma:g})" if q.compress_gamma > 1 else ""),
                     q.gpu, str(q.replicas), f"{q.utilization:.2f} / {p.utilization_sim:.2f}",
                     f"{q.mean_batch:,.1f} / {p.mean_batch:,.1f}", ms(q.ttft_p99_ms),
                     ms(p.ttft_p99_ms_sim) + ci(p.ttft_p99_ci_ms),
                     "-" if math.isnan(p.slo_attainment) else f"{100 * p.slo_attainment:.2f}", ms(p.tpot_p99_ms_sim),
                     f"{q.power_w:,.0f} / {p.power_w_sim:,.0f}",
                     ("MISSED, " if not p.slo_met_sim else "") + "too few requests" if p.too_few_requests
                     else ("met" if p.slo_met_sim else "MISSED")
                     + (" (dedicated run)" if p.p99_source == "dedicated run" else "")))
    for k, (name, footer) in enumerate(cols):  # a narrow terminal wraps a cell in two at a space, never cuts digits
        t.add_column(name, footer=footer, no_wrap=name == "tokens", overflow="fold",
                     min_width=max(_two_line_width(x) for x in [footer] + [r[k] for r in rows]),
                     justify="left" if name in ("tokens", "gpu", "SLO") else "right")
    for r in rows:
        t.add_row(*r)
    c.print(t)
    e = rep.energy_per_output_token_j
    _say(c, f"simulated: {rep.requests_simulated:,} requests ({rep.requests_measured:,} measured), "
         f"{rep.replications} replications; CI {rep.ci_method}, stopped by {rep.stopped_by}; "
         f"{rep.simulated_seconds:,.0f} s simulated in {rep.wall_seconds:,.2f} s; analytic numbers from models/")
    _say(c, sim_options_line(rep.options), "  ")
    ea = rep.energy_per_token_j
    _say(c, f"energy per output token {'-' if math.isnan(e) else f'{e:.3f} J'}, per token (prompt + output) "
         f"{'-' if math.isnan(ea) else f'{ea:.4f} J'} (simulated); Little's law error "
         f"{rep.littles_law_rel_error:.1e}; unfinished {rep.unfinished:,}, rejected {rep.rejected:,}; "
         f"SLO on the CI upper bound (point estimate: {'met' if rep.slo_met_point else 'MISSED'})", "  ")
    eng = rep.engine
    if eng.kv == "paged" or eng.max_batched_tokens is not None or eng.availability == "sampled":
        per_pool = "; ".join(
            f"{p.min_tokens:,}-{p.max_tokens:,}: max_num_seqs {p.max_num_seqs_sim}, preemptions {p.preemptions:,}"
            + (f", replicas up {p.replicas_up_mean:.2f} of {p.replicas}" if eng.availability == "sampled" else "")
            for p in rep.pools)
        budget = "" if eng.max_batched_tokens is None else f", token budget {eng.max_batched_tokens:,}/iteration"
        _say(c, f"engine: kv {eng.kv}{budget}, availability {eng.availability} (simulated) - {per_pool}", "  ")
    if rep.router == "spillover":
        spilled = "; ".join(f"{p.min_tokens:,}-{p.max_tokens:,}: {p.spilled:,}" for p in rep.pools)
        _say(c, f"simulated spills to the next pool up (bound {rep.spill_bound}, all replications) - {spilled}", "  ")
    for line in [*rep.undecided_notes(), *rep.notes]:
        _say(c, f"note: {line}", "  ")


def _say(c: Console, text: str, indent: str = "") -> None:
    """Print a paragraph wrapped at the console's width at its spaces, its continuation lines indented two more."""
    c.print(textwrap.fill(text, width=max(c.width, 40), initial_indent=indent, subsequent_indent=indent + "  ",
                          break_long_words=False, break_on_hyphens=False), markup=False)


def _two_line_width(text: str) -> int:
    """The least width at which ``text`` wraps at one of its spaces into at most two lines."""
    cuts = [max(len(text[:k].rstrip()), len(text[k + 1:])) for k, ch in enumerate(text) if ch == " "]
    return min(cuts + [len(text)])


def sim_options_line(o: SimOptions) -> str:
    """A run's settings in one line, ``options: field=value ...`` (a
    :class:`fleetopt.optimizer.simulation.options.SimOptions`; the fields that apply to it: an arrival process's
    parameters, the spill bound, the precision cap and the engine caps only where they are used; the JSON's
    ``options`` holds every field).

    Examples
    --------
    >>> from fleetopt.optimizer.simulation.options import SimOptions
    >>> sim_options_line(SimOptions(requests=20_000, arrivals="mmpp", precision=0.05))
    'options: requests=20000 replications=5 seed=0 warmup_share=0.1 mode=iteration router=auto dispatch=jsq
    arrivals=mmpp peak_to_mean=2 mean_dwell_s=10 precision=0.05 max_requests=1000000 engine.kv=reserve
    engine.availability=all-up'
    """
    parts = {"requests": o.requests, "replications": o.replications, "seed": o.seed,
             "warmup_share": f"{o.warmup_share:g}", "mode": o.mode, "router": o.router}
    if o.mode == "iteration":
        parts["dispatch"] = o.dispatch
    parts["arrivals"] = o.arrivals
    if o.arrivals in ("mmpp", "diurnal"):
        parts["peak_to_mean"] = f"{o.peak_to_mean:g}"
    if o.arrivals == "mmpp":
        parts["mean_dwell_s"] = f"{o.mean_dwell_s:g}"
    if o.arrivals == "diurnal":
        parts["period_s"] = "None" if o.period_s is None else f"{o.period_s:g}"
    if o.spill_bound is not None:
        parts["spill_bound"] = o.spill_bound
    if o.precision is not None:
        parts.update(precision=f"{o.precision:g}", max_requests=o.max_requests)
    e = o.engine
    parts["engine.kv"] = e.kv
    for name in ("max_num_seqs", "max_batched_tokens"):
        if getattr(e, name) is not None:
            parts[f"engine.{name}"] = getattr(e, name)
    parts["engine.availability"] = e.availability
    return "options: " + " ".join(f"{k}={v}" for k, v in parts.items())


def progress_bar(enabled: bool):
    """A rich progress bar on stderr yielding ``progress(done, total)``, or None when not ``enabled``.

    A context manager: ``with progress_bar(sys.stderr.isatty()) as progress: ...``.
    """

    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    @contextmanager
    def bar():
        with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as shown:
            task = shown.add_task("simulate", total=None)
            yield lambda done, total: shown.update(task, completed=done, total=total)

    return bar()


# --------------------------------------------------------------------------------------------
# gridflex, tpw --rho-sweep, simulate --routers (issue 13, commands 5-7)
# --------------------------------------------------------------------------------------------


def _ms_cell(x: float) -> str:
    """A time in ms for a table: ``-`` when not measured (NaN), ``inf`` when unbounded."""
    return "-" if math.isnan(x) else ("inf" if x == math.inf else f"{x:,.1f}")


def render_gridflex(c, g) -> None:
    """Print a :class:`fleetopt.optimizer.workflows.gridflex.GridFlex`: one row per depth, then provenance."""
    seed = g.convention == "seed"
    t = Table(title=f"{g.instance}: demand response of {g.fleet} at {g.arrival_rate:g} req/s  [P99 TTFT SLO "
                    f"{g.slo_ttft_p99_ms:,.0f} ms, scope {g.scope}, ttft_model {g.ttft_model}]", title_justify="left")
    cols = ["depth %", "lever", "fleet kW", "delivered %", "P99 ms analytic", "P99 ms event [95% CI]",
            "event kW sim", "delivered % sim", "drain s", "sustained", "event"]
    for name in cols:
        t.add_column(name, justify="left" if name == "lever" else "right", no_wrap=name != "lever")

    def pct(x):
        return "-" if math.isnan(x) else f"{100 * x:,.1f}"

    for r in g.depths:
        ci = ("" if not r.simulated
              else f" [{_ms_cell(r.ttft_p99_ci_ms_event[0])}, {_ms_cell(r.ttft_p99_ci_ms_event[1])}]")
        t.add_row(f"{r.depth:g}", r.lever, f"{r.power_kw:,.2f}", pct(r.delivered_reduction),
                  _ms_cell(r.ttft_p99_ms_analytic), _ms_cell(r.ttft_p99_ms_event) + ci,
                  "-" if math.isnan(r.power_kw_event) else f"{r.power_kw_event:,.2f}", pct(r.event_delivered_reduction),
                  "-" if math.isnan(r.drain_s_event) else f"{r.drain_s_event:,.1f}",
                  "ok" if r.sustained_ok else ("BREACH" if r.delivers else "BREACH (not reached)"),
                  "-" if not r.event_verdict else ("ok" if r.event_ok else
                                                   ("undecided" if r.event_verdict == "undecided" else "BREACH")))
    c.print(t)

    def depth(x, which):
        if x is None:
            return "none (the shallowest depth already breaches)"
        r = g.safe_row(which)
        got = ("" if r is None else f", delivering {100 * r.delivered_reduction:,.1f} % "
               f"({r.uncurtailed_draw_kw - r.power_kw:,.2f} kW)")
        return f"{x:g} %{got}"

    c.print(f"convention: {g.convention_label}", markup=False)
    c.print(f"max safe depth: sustained {depth(g.max_safe_depth_sustained, 'sustained')} (analytic steady state), "
            + ("event not simulated" if g.depths and not g.depths[0].event_verdict else
               f"event {depth(g.max_safe_depth_event, 'event')} (simulated {g.event_s / 60:g}-minute event)")
            + "; a depth is "
            "safe when it and every shallower depth of the sweep are ok", markup=False)
    undecided = sorted({x for r in g.depths for x in r.undecided_pools})
    if undecided:
        c.print(f"undecided: pool {', '.join(undecided)}: too few measured requests for an event P99 (lengthen "
                "--event-minutes or add --replications); not counted as safe", markup=False)
    if seed:
        c.print("lever: batch cap = largest batch whose per-replica power (decode power curve at half the window) is "
                "at most (1 - depth) x the power at the uncapped cap (its peak in W/replica); delivered %: 1 - fleet "
                "kW / the uncurtailed fleet kW, which the per-GPU cap does not promise", markup=False)
    else:
        c.print("lever: per depth, the in-SLO mix of replicas out of service (powered down) and batch caps with the "
                "least P99 whose analytic draw is at most (1 - depth) x the uncurtailed draw; delivered %: 1 - fleet "
                "kW / the uncurtailed fleet kW", markup=False)
    c.print("fleet kW: analytic mean power (an unstable pool at its cap); P99 analytic: steady state (inf: "
            "unstable); event: simulated, SLO on the CI upper end; drain s: simulated, the longest a replica's batch "
            "(and draw) stays above its cap after t0", markup=False)
    c.print(f"event: {g.replications} replications (seed {g.seed}, the same streams at every depth), warm-up "
            f"{g.warmup_s:,.0f} s uncapped, then {g.event_s:,.0f} s measured + {g.tail_s:,.0f} s tail capped; "
            f"{g.wall_s:,.1f} s wall", markup=False)
    c.print(f"event model: {g.event_model}", markup=False)


def gridflex_csv(g) -> str:
    """The depth rows of a gridflex sweep as CSV (one line per depth)."""
    buf = io.StringIO()
    rows = g.to_csv_rows()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["depth"], lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def render_rho_sweep(c, s) -> None:
    """Print a :class:`fleetopt.optimizer.workflows.rho_sweep.RhoSweep`: tok/W and $/Mtok per pool and for the
    fleet against the utilisation."""
    t = Table(title=f"{s.instance}: tok/W and $ per million output tokens against utilisation, {s.fleet} "
                    f"(analytic, ttft_model {s.ttft_model})", title_justify="left")
    t.add_column("pool", justify="left", no_wrap=True)
    t.add_column("", justify="left", no_wrap=True)
    for r in s.rhos:
        t.add_column(f"rho={r:g}", justify="right", no_wrap=True)
    t.add_column(f"now ({s.arrival_rate:g} req/s)", justify="right", no_wrap=True)
    for p in s.pools:
        t.add_row(p.label, "tok/W", *[f"{q.tok_per_watt:.3f}" for q in p.points], f"{p.now.tok_per_watt:.3f}")
        t.add_row("", "$/Mtok", *[f"{q.usd_per_mtok:.3f}" for q in p.points], f"{p.now.usd_per_mtok:.3f}")
        t.add_row("", "fleet req/s", *[f"{q.fleet_arrival_rate:,.1f}" for q in p.points],
                  f"{p.now.fleet_arrival_rate:,.1f}")
        t.add_row("", "util", *[f"{q.utilization:.3f}" for q in p.points], f"{p.now.utilization:.3f}")
    t.add_row("fleet", "tok/W", *[f"{f.tok_per_watt:.3f}" for f in s.fleet_points], f"{s.fleet_now.tok_per_watt:.3f}")
    t.add_row("", "$/Mtok", *[f"{f.usd_per_mtok:.3f}" for f in s.fleet_points], f"{s.fleet_now.usd_per_mtok:.3f}")
    c.print(t)
    c.print("each pool brought to utilisation rho (mean batch over its cap, the analytic evaluation) by scaling the "
            "fleet's arrival rate ('fleet req/s'); tok/W = output tok/s / mean power, $/Mtok = $/hr / (3600 x "
            "output tok/s) x 1e6; fleet row: every pool at its own rho at once", markup=False)
    low = [p.label for p in s.pools if "power measured" not in p.quality]
    if low:
        c.print(f"power of {', '.join(low)} is not measured: tok/W there rests on a projected or one-anchor curve",
                markup=False)


def render_routers(c, cmp) -> None:
    """Print a :class:`fleetopt.optimizer.workflows.routers.RouterComparison`: one column group per router."""
    t = Table(title=f"{cmp.instance}: routers side by side on {cmp.fleet}  [P99 TTFT SLO "
                    f"{cmp.slo_ttft_p99_ms:,.0f} ms; simulated, common random numbers]", title_justify="left")
    t.add_column("pool", justify="left", no_wrap=True)
    for r in cmp.runs:
        for what in ("P99 ms", "attain %", "util"):
            t.add_column(f"{r.router} {what}", justify="right", no_wrap=True)
    pools = cmp.runs[0].report.pools if cmp.runs else ()
    for k, p in enumerate(pools):
        row = [f"{p.analytic.min_tokens:,}-{p.analytic.max_tokens:,}:{p.analytic.gpu}x{p.analytic.replicas}"]
        for r in cmp.runs:
            q = r.report.pools[k]
            row += [_ms_cell(q.ttft_p99_ms_sim),
                    "-" if math.isnan(q.slo_attainment) else f"{100 * q.slo_attainment:.2f}",
                    f"{q.utilization_sim:.3f}"]
        t.add_row(*row)
    row = ["fleet"]
    for r in cmp.runs:
        row += [_ms_cell(r.report.ttft_p99_ms), f"{100 * r.report.slo_attainment:.2f}", f"{r.utilization_sim:.3f}"]
    t.add_row(*row)
    c.print(t)
    verdict = ", ".join(f"{r.router} {'met' if r.report.slo_met else 'MISSED'}" for r in cmp.runs)
    c.print(f"SLO (CI upper end, as simulate judges): {verdict}", markup=False)
    o = cmp.runs[0].report if cmp.runs else None
    if o is not None:
        c.print(f"every router: {o.requests_simulated:,} requests in {o.replications} replications, seed "
                f"{cmp.options.seed}, the same request stream (sha256 {cmp.stream_sha256[:16]}...); fleet util: "
                "pools' simulated utilisation weighted by batch places", markup=False)
    for r in cmp.runs:
        if r.note:
            c.print(f"note: {r.router}: {r.note}", markup=False)
