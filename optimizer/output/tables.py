"""The table-layout engine of every command's text output: the ``--format`` layouts (:data:`FORMATS`), the
console, and :class:`Output`, which prints a rich table whole when it fits, else in column groups that each repeat
the row's key, else stacked one row per block (a cell is never cut); ``plain``, ``markdown`` and ``csv`` lay the
same grid out as text.
"""

from __future__ import annotations

import csv
import io
import os
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from rich.cells import cell_len
from rich.console import Console
from rich.errors import MarkupError
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import JustifyMethod

FORMATS = ("table", "plain", "markdown", "csv")
"""Values of every command's ``--format``: ``table`` (boxed; a table wider than the terminal is split into
column groups that each repeat the row's key, or stacked one row per block when even that does not fit: a cell is
never cut), ``plain`` (aligned columns, no box, colour or markup, never wrapped), ``markdown`` (pipe tables) and
``csv`` (one CSV block per table, its title and every prose line as a ``#`` comment line)."""

__all__ = ["FORMATS", "Grid", "Output", "console", "console_width", "csv_grid", "csv_header", "layout_table",
           "table_grid", "table_width", "wrap_prose"]

PIPE_COLUMNS = 140
"""Width of ``table`` output that is not a terminal (a pipe or a file) when ``COLUMNS`` is not set: wide enough for
every table unsqueezed."""


class _Console(Console):
    """A rich console that lets a closed output pipe surface as :class:`BrokenPipeError` (the command decides the
    exit: :mod:`fleetopt.optimizer.cli`) instead of rich's own ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("the reader closed the output pipe")


def console_width(environ=None, tty: bool = False) -> int | None:
    """The width of the console: ``COLUMNS`` when set to a positive whole number (a pipe too: ``COLUMNS=80
    fleetopt solve ... | less``), else None on a terminal (rich measures it), else :data:`PIPE_COLUMNS`.

    Examples
    --------
    >>> console_width({"COLUMNS": "80"}), console_width({}, tty=True), console_width({"COLUMNS": "x"})
    (80, None, 140)
    """
    value = str((os.environ if environ is None else environ).get("COLUMNS", "")).strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return None if tty else PIPE_COLUMNS


def console() -> Console:
    """Rich console of :func:`console_width` columns (tables wider than it are laid out narrow, never cut)."""
    import sys

    return _Console(soft_wrap=True, width=console_width(tty=sys.stdout.isatty()))


def wrap_prose(text: str, width: int) -> str:
    """``text`` wrapped at its spaces to ``width`` columns, line by line: each line keeps its indent and its
    continuation lines are indented two more; a word longer than the width (a path, a URL) is never broken.

    Examples
    --------
    >>> print(wrap_prose("  note: one two three four", 14))
      note: one
        two three
        four
    """
    out = []
    for line in text.splitlines() or [""]:
        indent = line[:len(line) - len(line.lstrip(" "))]
        out.append(textwrap.fill(line.strip(), width=max(width, 20), initial_indent=indent,
                                 subsequent_indent=indent + "  ", break_long_words=False, break_on_hyphens=False)
                   if line.strip() else "")
    return "\n".join(out)


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

    def print(self, obj: Table | Text | str = "", **kwargs) -> None:
        if isinstance(obj, Table):
            self._table(obj)
        elif self.format == "table":
            if isinstance(obj, str) and not kwargs.get("soft_wrap"):   # prose: wrapped to the width
                if kwargs.get("markup") is False:
                    obj = wrap_prose(obj, self.width)
                elif not set(kwargs) - {"markup"}:
                    try:
                        lines = Text.from_markup(obj).wrap(self.console, self.width)
                    except MarkupError:
                        lines = None
                    if lines is not None:      # rich wraps the markup's text at its spaces; no trailing blanks
                        for line in lines:
                            line.rstrip()
                            self.console.print(line)
                        return
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
            for part in layout_table(self.console, t, grid):   # titles and captions wrap to the width
                if isinstance(part, Table) and part.title:      # a title wider than its table: the console's width
                    title, part.title = part.title, None
                    self.console.print(Text(wrap_prose(_plain_text(title), self.width), style="table.title"))
                    self.console.print(part, soft_wrap=False)
                    part.title = title
                elif isinstance(part, Text):                    # a caption: wrapped, no trailing blanks
                    for line in part.wrap(self.console, self.width):
                        line.rstrip()
                        self.console.print(line)
                else:
                    self.console.print(part, soft_wrap=False)
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
    justify: tuple[JustifyMethod, ...]
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
    assert groups is not None       # high is a cap the search found groups for (or c.width, which has them)
    out: list[Table | Text] = [
        _sub_table(t, grid, g, grid.title if n == 0 else f"{grid.title} (continued)" if grid.title else "")
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
    grid = csv_grid(grid)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(grid.headers)
    w.writerows(grid.rows)
    if grid.footer:
        w.writerow(grid.footer)
    head = [f"# {grid.title}"] if grid.title else []
    return head + buf.getvalue().splitlines() + ([f"# {grid.caption}"] if grid.caption else [])


_HEADER_NAMES = {"TTFT an": "p99_ttft_ms_analytic", "TTFT sim [95% CI]": "p99_ttft_ms_simulated",
                 "TPOT sim": "p99_tpot_ms_simulated", "attain %": "attainment_pct", "util": "utilization",
                 "batch": "mean_batch", "repl.": "replicas", "kW": "power_kw", "GPUs": "gpus", "#": "point",
                 "": "note", "B tokens": "boundary_tokens", "Pareto": "pareto"}
"""CSV names of display headers that the generic rule of :func:`csv_header` would name less clearly."""
_HEADER_WORDS = (("Δ", "delta "), ("$/hr", "cost_per_hr"), ("$/yr", "cost_per_yr"), ("$/Mtok", "usd_per_mtok"),
                 ("tok/W", "tok_per_w"), ("req/s", "req_per_s"), ("%", " pct"), ("kW", "power_kw"))


def csv_header(name: str) -> str:
    """A display header as a CSV column name: lower-case words joined by ``_``, its unit spelled out
    (``$/hr`` -> ``cost_per_hr``, ``kW`` -> ``power_kw``, ``%`` -> ``pct``, ``ms`` kept), a bracketed remark
    dropped.

    Examples
    --------
    >>> [csv_header(h) for h in ("P99 TTFT ms", "$/hr", "kW", "miss %", "Δ $/yr", "simulated ms (95% CI)")]
    ['p99_ttft_ms', 'cost_per_hr', 'power_kw', 'miss_pct', 'delta_cost_per_yr', 'simulated_ms']
    """
    if name in _HEADER_NAMES:
        return _HEADER_NAMES[name]
    text = re.sub(r"\s*[\[(][^\])]*[\])]\s*", " ", name)
    for word, spelled in _HEADER_WORDS:
        text = text.replace(word, f" {spelled} ")
    text = re.sub(r"\bpower power_kw\b", "power_kw", text)
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_").lower() or "note"


_NUM = r"[+-]?\$?\d[\d,]*(?:\.\d+)?"
_NUMBER = re.compile(r"^([+-]?)\$?(\d[\d,]*(?:\.\d+)?)([KM]?)(%?)(\*?)$")
_RANGE = re.compile(r"^(\d[\d,]*)-(\d[\d,]*)(?:\s+(.+))?$")
_INTERVAL = re.compile(rf"^(?:([A-Za-z]+) )?({_NUM}|inf|-)\s*[\[(]({_NUM}|inf)(?:, |-)({_NUM}|inf)[\])]$")
_PAIR = re.compile(r"^(\S+) / (\S+)$")
_NUMBER_NOTE = re.compile(rf"^({_NUM}|inf)\s+(.+)$")
_LABEL_NOTE = re.compile(r"^(.*?)\s*\((.+)\)$")
_ROLES = ("metric", "", "min", "max", "detail", "ci_low", "ci_high", "analytic", "simulated", "sized", "note")


def _csv_number(text: str) -> str | None:
    """A display number as a plain CSV number (``1,594`` -> ``1594``, ``$1,282K`` -> ``1282000``, ``+0.0%`` ->
    ``0.0``); None when ``text`` is not one."""
    if text in ("inf", "-inf", "nan"):
        return text
    m = _NUMBER.match(text)
    if m is None:
        return None
    sign, digits, scale, _, _ = m.groups()
    digits = digits.replace(",", "")
    if scale:
        from decimal import Decimal

        digits = format(Decimal(digits) * (1000 if scale == "K" else 1_000_000), "f")
    return ("-" if sign == "-" else "") + digits


def _csv_parts(cell: str) -> dict[str, str]:
    """One display cell as its separate values, by role (:data:`_ROLES`): a number, a range's two bounds and what
    follows them, a value and its interval, an analytic / simulated pair, the ``*`` sized mark, a remark."""
    text = cell.strip()
    if text in ("", "-"):
        return {}
    number = _csv_number(text)
    if number is not None:
        return {"": number, **({"sized": "yes"} if text.endswith("*") else {})}
    m = _PAIR.match(text)
    if m and all(_csv_number(x) is not None or x == "-" for x in m.groups()):
        return {k: v for k, x in zip(("analytic", "simulated"), m.groups()) if (v := _csv_number(x) or "")}
    m = _INTERVAL.match(text)
    if m:
        metric, value, low, high = m.groups()
        got = {"": _csv_number(value) or "", "ci_low": _csv_number(low), "ci_high": _csv_number(high)}
        return {k: v for k, v in {**got, **({"metric": metric} if metric else {})}.items() if v}
    m = _RANGE.match(text)
    if m:
        low, high, rest = m.groups()
        # digits and commas, which are always a number
        got = {"min": cast(str, _csv_number(low)), "max": cast(str, _csv_number(high))}
        if rest:
            got["detail"] = _csv_label(rest.strip("()"))
        return got
    m = _NUMBER_NOTE.match(text)
    if m and _csv_number(m.group(1)) is not None:
        return {"": cast(str, _csv_number(m.group(1))), "note": _csv_label(m.group(2).strip("()"))}
    if text.startswith("(") and text.endswith(")") and "(" not in text[1:]:
        return {"": _csv_label(text[1:-1])}
    m = _LABEL_NOTE.match(text)
    if m and m.group(1) and "(" not in m.group(1):
        return {"": _csv_label(m.group(1)), "note": _csv_label(m.group(2))}
    return {"": _csv_label(text)}


def _csv_label(text: str) -> str:
    """A label without a list's commas-and-spaces (``MISSED, UTIL CAP`` -> ``MISSED; UTIL CAP``) or an arrow."""
    text = text.replace(", ", "; ").strip()
    return text[3:] if text.startswith("<- ") else text


def _role_name(base: str, role: str, first: bool) -> str:
    if role in ("min", "max"):
        return f"{role}_tokens" if base.endswith("tokens") or base == "pool" else f"{base}_{role}"
    if role == "":
        return base
    if role == "detail" and base.endswith("tokens"):
        return "pool_detail"
    return f"{base}_{role}"


def csv_grid(grid: Grid) -> Grid:
    """The grid a spreadsheet reads: one value per cell (the display's combined cells split by role, each role
    its own column: a token range into ``min_tokens`` and ``max_tokens``, ``123.4 (114.6-133.3)`` into the value
    and ``_ci_low``/``_ci_high``, ``analytic / simulated`` into two columns, the ``*`` sized mark into
    ``_sized``), numbers without thousands separators, ``$`` or ``K`` (``$1,282K`` -> ``1282000``), ``-`` as an
    empty cell, and the units in the headers (:func:`csv_header`). The footer is the last row; title and caption
    stay ``#`` lines.

    Examples
    --------
    >>> g = Grid("", ("tokens", "replicas", "$/hr"), ("left",) * 3, (("0-1,536", "3*", "1,093.44"),),
    ...          ("fleet", "3", "1,093.44"), "")
    >>> c = csv_grid(g)
    >>> c.headers
    ('row', 'min_tokens', 'max_tokens', 'replicas', 'replicas_sized', 'cost_per_hr')
    >>> c.rows
    (('pool', '0', '1536', '3', 'yes', '1093.44'), ('fleet', '', '', '3', '', '1093.44'))
    """
    rows = list(grid.rows) + ([grid.footer] if grid.footer else [])
    headers, columns = [], []
    for k, name in enumerate(grid.headers):
        base = csv_header(name)
        if any(r[k].strip().endswith("%") for r in rows if k < len(r)) and not base.endswith("pct"):
            base += "_pct"      # '+20.0%' cells: the unit goes to the header
        parts = [_csv_parts(r[k]) if k < len(r) else {} for r in rows]
        roles = [role for role in _ROLES if any(role in p for p in parts)] or [""]
        for role in roles:
            headers.append("row" if role == "" and "min" in roles else _role_name(base, role, k == 0))
            columns.append([p.get(role, "pool" if role == "" and "min" in p else "") for p in parts]
                           if "min" in roles else [p.get(role, "") for p in parts])
    seen: dict[str, int] = {}
    unique = []
    for h in headers:
        seen[h] = seen.get(h, 0) + 1
        unique.append(h if seen[h] == 1 else f"{h}_{seen[h]}")
    out_rows = tuple(tuple(col[r] for col in columns) for r in range(len(rows)))
    return Grid(grid.title, tuple(unique), ("left",) * len(unique), out_rows, None, grid.caption)
