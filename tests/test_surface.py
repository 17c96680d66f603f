"""The user surface an operator can trust (issue 12): tables that never elide a number in an ordinary terminal,
``--format``, objective units, exit codes that gate CI, limits in ``evaluate`` and in the baseline, repeated
flags, broken pipes and normalised paths.

The terminal tests run the installed ``fleetopt`` console script in a real pseudo-terminal (``os.openpty``: its
stdout and stderr are a TTY of the given size, COLUMNS/LINES set as a shell sets them).
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import EXIT_CODES
from fleetopt.optimizer.output.tables import FORMATS, Output

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ELLIPSIS = "\u2026"
QUICK_PLAN = "0-1536:a100x1,1536-8192:h100x1,8192-65536:h100x2"   # what `solve` returns


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def run_in_terminal(args, columns: int, cwd: Path, lines: int = 50, timeout_s: float = 120.0) -> tuple[int, str, str]:
    """Run ``args`` with stdout and stderr on a pseudo-terminal of ``columns`` x ``lines``; (exit code, text
    without ANSI codes, raw text)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": str(lines), "TERM": "xterm-256color"}
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        env.pop(name, None)
    proc = subprocess.Popen([str(a) for a in args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
                            cwd=cwd, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    raw = b"".join(chunks).decode("utf-8", errors="replace").replace("\r\n", "\n")
    return code, ANSI.sub("", raw), raw


def lmsys_limits_yaml(tmp_path: Path, constraints: str = "{max_total_gpus: 30, max_power_kw: 1, max_cost_per_hr: 5}"):
    """The LMSYS lambda=300 instance of issue 12 (items 4 and 5): 16 H100 in stock, A100 unlimited, caps."""
    path = tmp_path / "lmsys300.yaml"
    path.write_text("name: lmsys300\n"
                    "workload: {cdf: 'builtin:lmsys', arrival_rate: 300}\n"
                    "slo: {ttft_p99_ms: 500}\n"
                    "gpus:\n"
                    "  - {name: h100, profile: H100-80GB, max_count: 16}\n"
                    "  - {name: a100, profile: A100-80GB}\n"
                    "pools: {max_pools: 2, max_context: 65536}\n"
                    f"constraints: {constraints}\n")
    return path


def csv_blocks(text: str) -> list[tuple[str, list[list[str]]]]:
    """The tables of ``--format csv`` output: (title, rows with the header first)."""
    blocks, title, rows = [], "", []
    for line in text.splitlines() + [""]:
        if line.startswith("#") or not line:
            if rows:
                blocks.append((title, rows))
                rows = []
            if line.startswith("#") and not rows:
                title = line[2:]
            continue
        rows.append(next(csv.reader([line])))
    return blocks


# --- 1. tables readable in an ordinary terminal ---------------------------------------------------------------


TERMINAL_COMMANDS = {
    "validate": ["validate", "instances/ref_1w_table3_lmsys.yaml"],
    "evaluate": ["evaluate", "instances/ref_units_lmsys_a100_h100.yaml", "--fleet", QUICK_PLAN, "--fleet",
                 "0-65536:h100"],
    "solve": ["solve", "instances/ref_units_lmsys_a100_h100.yaml"],
    "simulate": ["simulate", "instances/ref_units_lmsys_a100_h100.yaml", "--fleet", QUICK_PLAN, "--requests", "2000",
                 "--replications", "2"],
    "tpw": ["tpw", "--profile", "H100-80GB,A100-80GB", "--contexts", "2048,65536"],
    "bench": ["bench", "--quick", "--agreement-pools", "0"],
}
"""Every command with a table; its exit code may be 0 or a fleet verdict (5, 6). Each run starts a process
(1-5 s on a loaded machine): solve runs in the default set, the others are marked slow."""


@pytest.mark.parametrize("columns", [80, pytest.param(100, marks=pytest.mark.slow)])
@pytest.mark.parametrize("command", [k if k == "solve" else pytest.param(k, marks=pytest.mark.slow)
                                     for k in TERMINAL_COMMANDS])
def test_no_cell_is_elided_in_a_terminal(repo_root, tmp_path, command, columns, fleetopt_script):
    """Issue 12, item 1: on an 80- or 100-column TTY no cell is shortened to an ellipsis, no line is wider than
    the terminal's table width, and the numbers of the JSON (the same run) are all on the screen."""
    out = tmp_path / "r.json"
    # bench --quick alone runs for about two minutes on a loaded 2-core machine
    code, text, raw = run_in_terminal([fleetopt_script, *TERMINAL_COMMANDS[command], "--json", out], columns, repo_root,
                                      timeout_s=600.0 if command == "bench" else 120.0)
    assert code in (0, EXIT_CODES["slo_missed"], EXIT_CODES["limits_broken"]), text
    assert "\x1b[" in raw, "stdout was not treated as a terminal"
    assert ELLIPSIS not in text, text
    table_lines = [line for line in text.splitlines() if line[:1] in "┏┃┡│├└"]
    if not table_lines:      # too many columns for even two side by side: one block per row, fields indented
        # (numbers must fit; a free-text field such as the bench's ``detail`` may run on, as prose does)
        table_lines = [line for line in text.splitlines() if line.startswith("  ") and "  " in line.strip()
                       and not line.strip().startswith("detail")]
    assert table_lines and max(len(line) for line in table_lines) <= columns, text
    data = json.loads(out.read_text())
    fleets = {"solve": [data], "evaluate": data.get("fleets", [])}.get(command, [])
    for fleet in fleets:  # every pool's and the fleet's power and cost, as the table formats them
        numbers = [f"{fleet['power_kw']:,.2f}", f"{fleet['cost_per_hr']:,.2f}", f"{fleet['physical_gpus']:,}"]
        numbers += [f"{p['power_w'] / 1000:,.2f}" for p in fleet["pools"]] + [f"{p['gpu']}" for p in fleet["pools"]]
        for number in numbers:
            assert re.search(rf"(?<![\d,.]){re.escape(number)}(?![\d,])", text), (number, text)
    if command == "validate":
        for g in data["gpus"]:
            assert g["profile"] in text and g["quality"] in text  # profile names are not cut


def _wide_table() -> Table:
    t = Table(title="wide", title_justify="left", show_footer=True)
    for k in range(12):
        t.add_column(f"column {k}", footer=f"{k * 1_111_111.11:,.2f}", justify="right" if k else "left")
    for r in range(3):
        t.add_row(*[f"{r}-{k}:{(r + 1) * (k + 1) * 98_765.4321:,.3f}" for k in range(12)])
    return t


@pytest.mark.parametrize("width", [30, 48, 80, 100, 120, 400])
def test_layout_never_cuts_a_cell_at_any_width(width):
    """A table wider than the console is split into column groups (or stacked): every cell, header and footer
    is printed whole, and no line is wider than the console."""
    buf = io.StringIO()
    out = Output("table", Console(file=buf, width=width, color_system=None, soft_wrap=True))
    t = _wide_table()
    out.print(t)
    text = buf.getvalue()
    assert ELLIPSIS not in text
    for col in t.columns:
        for cell in [col.header, col.footer, *col.cells]:
            assert cell in text, (cell, text)
    if width >= 48:  # groups of columns; narrower, stacked lines are soft-wrapped by the terminal, never cut
        assert max(len(line) for line in text.splitlines()) <= width
    else:
        assert "column 5   " in text and "┃" not in text
    if width == 400:  # it fits: printed as built, one table
        assert text.count("wide") == 1 and "continued" not in text



def test_group_widths_are_rich_measurements():
    """The column-group search adds column widths instead of measuring every candidate group: the sum equals
    rich's own measure of the group's table, for every group of the key column and some others."""
    import itertools

    from fleetopt.optimizer.output.tables import _group_width, _sub_table, table_grid, table_width

    c = Console(file=io.StringIO(), width=80)
    t = _wide_table()
    t.add_row(*["x" * (k % 4) for k in range(12)])      # uneven and empty cells
    grid = table_grid(t)
    width = _group_width(c, t, grid)
    for size in (1, 2, 3, 5):
        for cols in itertools.combinations(range(1, 12), size - 1):
            group = [0, *cols]
            assert width(group) == table_width(c, _sub_table(t, grid, group, "")), group


def test_plain_markdown_and_csv_hold_every_cell():
    """The non-terminal formats keep every cell whole: csv parses back to the table, markdown has one pipe row per
    row, plain one aligned line per row (the header's columns in order)."""
    t = _wide_table()
    header = [c.header for c in t.columns]
    rows = [list(r) for r in zip(*[list(c.cells) for c in t.columns])]
    texts = {}
    for fmt in ("plain", "markdown", "csv"):
        buf = io.StringIO()
        Output(fmt, Console(file=buf, width=80)).print(t)
        Output(fmt, Console(file=buf, width=80)).print("a [bold]note[/bold]")
        texts[fmt] = buf.getvalue()
    from fleetopt.optimizer.output.tables import csv_header

    numbers = [f"{k * 1_111_111.11:.2f}" for k in range(12)]   # csv: one plain number per cell (issue 31)
    assert csv_blocks(texts["csv"]) == [("wide", [[csv_header(h) for h in header], *rows, numbers])]
    assert texts["csv"].splitlines()[-1] == "# a note"
    md = [line for line in texts["markdown"].splitlines() if line.startswith("|")]
    assert md[0] == "| " + " | ".join(header) + " |" and len(md) == 2 + len(rows) + 1
    assert md[1].split("|")[1:3] == [" --- ", " ---: "]
    plain = texts["plain"].splitlines()
    for row in rows:
        (line,) = [x for x in plain if x.startswith(row[0])]
        assert re.split(r"\s{2,}", line.strip()) == row
    assert "a note" in plain and not any("[bold]" in x for x in texts.values())


def test_every_command_takes_format():
    """Every command that prints a table takes --format (the lazily loaded ones included: list_commands names all).
    ``export``'s --format is the deployment format it writes (vllm | k8s), ``report`` writes one HTML page, and
    the groups (``profile``, ``catalog``) are checked through their table subcommands."""
    import click

    ctx = click.Context(main)
    checked = 0
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        if isinstance(command, click.Group):
            commands = list(command.commands.values())
        elif name == "export":
            (opt,) = [p for p in command.params if p.name == "fmt"]
            assert list(opt.type.choices) == ["vllm", "k8s"]
            continue
        elif name == "report":
            continue
        else:
            commands = [command]
        for cmd in commands:
            opts = [p for p in cmd.params if p.name == "fmt"]
            if not opts and isinstance(command, click.Group):
                continue
            (opt,) = opts
            assert list(opt.type.choices) == list(FORMATS) and opt.default == "table", name
            checked += 1
    assert checked >= 12


def test_solve_csv_rows_are_the_plan(repo_root):
    """``--format csv``: the plan's table parses to one row per pool whose cells are the JSON's numbers."""
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    data = json.loads(run("solve", inst, "--json", "-").stdout)
    res = run("solve", inst, "--format", "csv")
    assert res.exit_code == 0, res.output
    title, rows = csv_blocks(res.stdout)[0]
    assert title.startswith("plan 1: objective cost = $")
    head, body = rows[0], rows[1:]
    assert head[0] == "row" and body[-1][0] == "fleet" and len(body) == len(data["pools"]) + 1
    for row, pool in zip(body, data["pools"]):     # one value per cell, no thousands separators (issue 31)
        cells = dict(zip(head, row))
        assert cells["gpu"] == pool["gpu"] and cells["cost_per_hr"] == f"{pool['cost_per_hr']:.2f}"
        assert (int(cells["min_tokens"]), int(cells["max_tokens"])) == (pool["min_tokens"], pool["max_tokens"])
    assert dict(zip(head, body[-1]))["cost_per_hr"] == f"{data['cost_per_hr']:.2f}"


# --- 2. the objective carries its unit ------------------------------------------------------------------------


def test_tok_per_watt_objective_is_printed_as_the_power_it_minimises(repo_root):
    """Issue 12, item 2: the tok_per_watt objective's value is the fleet's power in kW (the solver minimises
    power); the line says kW and shows the fleet's tok/W, which is not the objective value."""
    inst = repo_root / "instances" / "ref_1w_table3_lmsys.yaml"
    data = json.loads(run("solve", inst, "--json", "-").stdout)
    value = data["objective"]["value"]
    assert data["objective"]["name"] == "tok_per_watt" and data["objective"]["unit"] == "kw"
    assert value == pytest.approx(data["power_kw"], rel=1e-6)  # the same pools re-evaluated: the same kW
    assert "power in kW" in data["objective"]["minimizes"]
    res = run("solve", inst, "--format", "plain")
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("plan 1: objective")]
    assert f"{value:,.4g} kW" in line and f"{data['tok_per_watt']:.2f} tok/W" in line
    assert f"objective tok_per_watt = {value:,.4g}" not in line


def test_cost_objective_line_is_in_dollars_per_hour(repo_root):
    data = json.loads(run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--json", "-").stdout)
    res = run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--format", "plain")
    assert f"plan 1: objective cost = ${data['objective']['value']:,.2f}/hr" in res.stdout


# --- 9. exit codes that gate CI -------------------------------------------------------------------------------


def test_evaluate_exits_5_when_a_fleet_misses_its_slo(repo_root):
    """One A100 replica cannot serve 100 req/s of LMSYS: the fleet misses its SLO and the exit code says so."""
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    res = run("evaluate", inst, "--fleet", "0-65536:a100x1", "--json", "-")
    data = json.loads(res.stdout)
    assert data["slo_met"] is False and data["feasible"] is False
    assert res.exit_code == EXIT_CODES["slo_missed"] == 5
    res = run("evaluate", inst, "--fleet", "0-65536:a100x1", "--fleet", QUICK_PLAN, "--json", "-")  # one misses: 5
    assert [(f["fleet"], f["slo_met"]) for f in json.loads(res.stdout)["fleets"]] == [
        ("0-65536:a100x1", False), (QUICK_PLAN, True)]
    assert res.exit_code == 5


def test_evaluate_exits_0_for_the_solved_plan(repo_root):
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    plan = json.loads(run("solve", inst, "--json", "-").stdout)["fleet"]
    res = run("evaluate", inst, "--fleet", plan, "--json", "-")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["feasible"] is True and data["violations"] == []


def test_simulate_exits_5_when_the_fleet_misses(repo_root):
    """One A100 replica at 100 req/s is overloaded in simulation too: the document says the SLO is missed (on the
    interval and on the point estimate) and the exit code follows it."""
    res = run("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet", "0-65536:a100x1",
              "--requests", 1000, "--replications", 1, "--json", "-")
    assert res.exit_code == EXIT_CODES["slo_missed"], res.output
    data = json.loads(res.stdout)
    assert data["slo_met"] is False and data["slo_met_point"] is False and data["pools"][0]["slo_met_sim"] is False
    assert "error" not in res.stderr


def test_exit_codes_are_documented():
    from fleetopt.optimizer import cli, errors

    assert EXIT_CODES["slo_missed"] == 5 and EXIT_CODES["limits_broken"] == 6 and EXIT_CODES["broken_pipe"] == 141
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    for code, key in ((5, "slo_missed"), (6, "limits_broken"), (141, "broken_pipe")):
        assert re.search(rf"^{code}\s+``{key}``", errors.__doc__, re.M), key
        assert re.search(rf"\b{code} ", cli.__doc__), code


# --- 6. repeated flags ----------------------------------------------------------------------------------------


def test_simulate_refuses_repeated_fleets(repo_root):
    """Issue 12, item 6: two --fleet flags are refused in one line (exit 2), not silently cut to the last."""
    res = run("simulate", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--fleet", "0-65536:h100x8",
              "--fleet",
              "0-65536:a100x1", "--requests", 1000)
    assert res.exit_code == 2 and res.stdout == ""
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: --fleet: given 2 times")


# --- 4. evaluate checks every limit ---------------------------------------------------------------------------


def test_evaluate_names_every_broken_limit(tmp_path):
    """Issue 12, item 4: 20 H100 against 16 in stock, a 1 kW power cap and a $5/hr budget: each breach is named,
    the fleet is infeasible, and the exit code is 6 (the SLO itself is met)."""
    path = lmsys_limits_yaml(tmp_path)
    res = run("evaluate", path, "--fleet", "0-65536:h100x20", "--json", "-")
    data = json.loads(res.stdout)
    assert data["total_gpus"] == 20 and data["power_kw"] > 1 and data["cost_per_hr"] > 5  # facts of the fleet
    fields = sorted(v.split(":", 1)[0] for v in data["violations"])
    assert fields == ["constraints.max_cost_per_hr", "constraints.max_power_kw", "gpus.h100.max_count"]
    assert data["slo_met"] is True and data["feasible"] is False
    assert res.exit_code == EXIT_CODES["limits_broken"]
    text = run("evaluate", path, "--fleet", "0-65536:h100x20", "--format", "plain").stdout
    for field in fields:
        assert f"breaks {field}: " in text
    assert "20 GPUs of h100, above its inventory of 16" in text


def test_evaluate_counts_total_gpus_and_pools(tmp_path):
    """40 A100 break the 30-GPU cap; three pools break pools.max_pools 2."""
    path = lmsys_limits_yaml(tmp_path, "{max_total_gpus: 30}")
    data = json.loads(run("evaluate", path, "--fleet", "0-65536:a100x40", "--json", "-").stdout)
    assert "constraints.max_total_gpus: 40 GPUs, above the cap of 30" in data["violations"]
    data = json.loads(run("evaluate", path, "--fleet", "0-2048:a100x8,2048-8192:a100x8,8192-65536:a100x8",
                          "--json", "-").stdout)
    assert "pools.max_pools" in [v.split(":", 1)[0] for v in data["violations"]]


# --- 5. the baseline respects the limits ----------------------------------------------------------------------


def test_baseline_within_limits_or_marked_infeasible(tmp_path):
    """Issue 12, item 5: with 16 H100 in stock and a 30-GPU cap no single pool is possible (the H100 pool needs
    more than 16, the A100 pool more than 30), so the baseline is infeasible and no saving is claimed."""
    path = lmsys_limits_yaml(tmp_path, "{max_total_gpus: 30}")
    data = json.loads(run("solve", path, "--json", "-").stdout)
    b = data["baseline"]
    assert data["status"] == "optimal" and data["total_gpus"] <= 30
    gpu = b["pools"][0]["gpu"]
    assert (gpu == "h100" and b["total_gpus"] > 16) or (gpu == "a100" and b["total_gpus"] > 30)
    assert b["feasible"] is False and b["violations"]
    assert any("baseline breaks" in w for w in data["warnings"])
    text = run("solve", path, "--format", "plain").stdout
    (line,) = [x for x in text.splitlines() if x.startswith("homogeneous baseline")]
    assert "saves" not in line and "infeasible" in line and "no saving is claimed" in line


def test_baseline_without_limits_still_claims_its_saving(repo_root):
    data = json.loads(run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--json", "-").stdout)
    assert data["baseline"]["feasible"] is True and data["baseline"]["violations"] == []
    text = run("solve", repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml", "--format", "plain").stdout
    saving = 1 - data["cost_per_hr"] / data["baseline"]["cost_per_hr"]
    assert f"plan 1 saves {saving:.1%} of cost" in text


# --- 10. broken pipes, paths, utilisation-cap breaches --------------------------------------------------------


@pytest.mark.slow
def test_closed_pipe_exits_quietly(repo_root, fleetopt_script):
    """``fleetopt solve ... | head -0``: the reader is gone before the first write; the command stops quietly
    with 141 (128 + SIGPIPE), nothing on stderr."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([str(fleetopt_script), "solve", "instances/ref_units_lmsys_a100_h100.yaml"], stdout=write,
                          stderr=subprocess.PIPE, cwd=repo_root, timeout=120)
    os.close(write)
    assert proc.returncode == EXIT_CODES["broken_pipe"] == 141
    assert proc.stderr == b""


def test_validate_prints_normalised_paths(repo_root):
    """The workload file of instances/ref_1w_table3_lmsys.yaml is ../data/...: shown without the '..' detour."""
    res = run("validate", repo_root / "instances" / "ref_1w_table3_lmsys.yaml", "--json", "-")
    source = json.loads(res.stdout)["workload"]["source"]
    assert ".." not in Path(source).parts
    assert Path(source).resolve() == (repo_root / "data" / "workloads" / "lmsys_cdf.json").resolve()
    text = run("validate", repo_root / "instances" / "ref_1w_table3_lmsys.yaml", "--format", "plain").stdout
    assert source in text and "/../" not in text


def test_utilisation_cap_breach_is_named_not_called_an_slo_miss(repo_root):
    """Issue 12, item 10: a pool that meets its TTFT SLO above max_utilization is a broken limit (UTIL CAP,
    exit 6, ``slo_met`` true, ``feasible`` false), not 'SLO MISSED'."""
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    args = ["evaluate", inst, "--fleet", QUICK_PLAN, "--set", "constraints.max_utilization=0.3"]
    res = run(*args, "--json", "-")
    data = json.loads(res.stdout)
    breached = [p for p in data["pools"] if not p["utilization_ok"]]
    assert breached and all(p["capacity_load"] > 0.3 for p in breached)  # the fact the cap is about
    assert data["slo_met"] is True and data["feasible"] is False and res.exit_code == 6
    assert sum("constraints.max_utilization" in v for v in data["violations"]) == len(breached)
    res = run(*args, "--format", "csv")
    head, *body = csv_blocks(res.stdout)[0][1]
    lo, hi = head.index("min_tokens"), head.index("max_tokens")
    status = {(row[lo], row[hi]) if row[0] == "pool" else row[0]: row[head.index("slo")] for row in body}
    for p in data["pools"]:
        expected = "met" if p["utilization_ok"] else "UTIL CAP"
        assert status[(str(p["min_tokens"]), str(p["max_tokens"]))] == expected
    assert status["fleet"] == "UTIL CAP" and "MISSED" not in res.stdout


def test_simulate_says_when_an_interval_straddles_the_slo(repo_root, tmp_path):
    """A pool whose P99 interval contains the SLO is not shown to meet it (the verdict is on the upper bound), and
    the report says the run cannot decide and what precision would. A 50.1 ms SLO lies inside the first pool's
    interval in this run (seed 3); the notes expected are computed from the run's own JSON."""
    inst = repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"
    out = tmp_path / "sim.json"
    res = run("simulate", inst, "--fleet", QUICK_PLAN, "--requests", 20000, "--seed", 3,
              "--set", "slo.ttft_p99_ms=50.1", "--json", out)
    assert res.exit_code == EXIT_CODES["slo_missed"], res.output
    text = " ".join(res.stdout.split())
    pools = json.loads(out.read_text())["pools"]
    straddling = [p for p in pools if p["ttft_p99_ci_ms"][0] <= 50.1 < p["ttft_p99_ci_ms"][1]]
    assert [p["min_tokens"] for p in straddling] == [0]
    for p in straddling:
        (lo, hi), point = p["ttft_p99_ci_ms"], p["ttft_p99_ms_sim"]
        need = math.floor(1000 * abs(50.1 - point) / point) / 10
        assert (f"pool {p['min_tokens']:,}-{p['max_tokens']:,}: its P99 TTFT interval [{lo:,.1f}, {hi:,.1f}] ms "
                f"straddles the 50.1 ms SLO, so this run cannot tell whether it meets it; --precision {need:g} runs "
                "until the interval is narrow enough to decide (up to --max-requests)") in text
    assert text.count("straddles") == len(straddling)
    notes = json.loads(out.read_text())["notes"]      # the JSON says it too
    assert sum("straddles the 50.1 ms SLO" in n for n in notes) == len(straddling)


def test_straddle_notes_by_hand():
    """Which pools get the straddle note, and its advice: a point of 450 ms against 500 ms asks for
    --precision 11.1 (the distance in % of the point, rounded down); an unbounded point (a request without a first
    token) cannot say how far it is; an interval wholly below the SLO, or a pool flagged for too few requests, gets
    none."""
    from types import SimpleNamespace as NS

    from fleetopt.optimizer.simulation.records import SimReport

    def pool(lo, hi, point, few=False, start=0):
        return NS(ttft_p99_ci_ms=(lo, hi), ttft_p99_ms_sim=point, too_few_requests=few,
                  analytic=NS(min_tokens=start, max_tokens=start + 1000))
    rep = NS(slo_ttft_p99_ms=500.0, pools=[pool(400.0, 560.0, 450.0), pool(480.0, math.inf, math.inf, start=1000),
                                           pool(300.0, 499.0, 400.0, start=2000),
                                           pool(400.0, 600.0, 450.0, few=True, start=3000)])
    notes = SimReport.undecided_notes(rep)
    assert len(notes) == 2
    assert notes[0].startswith("pool 0-1,000: its P99 TTFT interval [400.0, 560.0] ms straddles the 500 ms SLO")
    assert "--precision 11.1 runs" in notes[0]          # (500 - 450) / 450 = 11.1 %
    assert notes[1].startswith("pool 1,000-2,000:") and "a longer run (--requests) may decide" in notes[1]
