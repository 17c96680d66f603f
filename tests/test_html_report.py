"""``fleetopt report RESULT.json -o report.html`` (issue 13, "Around them"): the self-contained page, opened in a
real headless Chromium.

The quickstart's solve JSON is made by ``fleetopt solve`` here; the numbers the page must show are read from that
JSON (the solver's contract), and the page is read back from the DOM the browser built, not from the HTML text.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.commands.report_html import report
from fleetopt.optimizer.workflows.html_report import build_html, pool_diagram
from fleetopt.optimizer.workflows.split_table import SplitBaseline, SplitRow, SplitTable

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
GROUP = click.Group(commands={"report": report})


def _browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


@pytest.fixture(scope="module")
def solve_json(repo_root, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "q.json"
    res = CliRunner().invoke(main, ["solve", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"), "--json",
                                    str(path)])
    assert res.exit_code == 0, res.output
    return path


@pytest.fixture(scope="module")
def page(solve_json) -> Path:
    out = solve_json.with_name("report.html")
    res = CliRunner().invoke(GROUP, ["report", str(solve_json), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


class _Ids(HTMLParser):
    """id -> (text, data-value) of every element with an id; counts of tags."""

    def __init__(self):
        super().__init__()
        self.ids, self.tags, self._open = {}, {}, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] = self.tags.get(tag, 0) + 1
        self._open.append((tag, a.get("id"), a.get("data-value"), []))

    def handle_endtag(self, tag):
        while self._open:
            t, ident, value, text = self._open.pop()
            if self._open:
                self._open[-1][3].extend(text)
            if ident:
                self.ids[ident] = ("".join(text).strip(), value)
            if t == tag:
                break

    def handle_data(self, data):
        if self._open:
            self._open[-1][3].append(data)


def _parse(text: str) -> _Ids:
    p = _Ids()
    p.feed(text)
    return p


def _open_in_browser(exe: str, page: Path, profile: Path) -> tuple[str, list[str]]:
    """The DOM Chromium built for ``page`` and the console lines it logged (every network name unresolvable)."""
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0", "--dump-dom",
           "--virtual-time-budget=2000", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    return proc.stdout, console


# --------------------------------------------------------------------------------------------
# In the browser
# --------------------------------------------------------------------------------------------


def test_report_renders_in_chromium_with_the_plan_numbers(page, solve_json, tmp_path):
    exe = _browser()
    if exe is None:
        pytest.skip("chromium not installed")
    dom, console = _open_in_browser(exe, page, tmp_path / "profile")
    assert console == [], console                   # no console message at all: no error, no blocked fetch
    got = _parse(dom)
    q = json.loads(solve_json.read_text())
    assert got.ids["total-cost-per-hr"] == (f"{q['cost_per_hr']:,.2f}", repr(q["cost_per_hr"]))
    assert got.ids["total-cost-per-year"][1] == repr(q["cost_per_year"])
    assert got.ids["fleet-ttft-p99-ms"] == (f"{q['ttft_p99_ms']:,.1f}", repr(q["ttft_p99_ms"]))
    for k, p in enumerate(q["pools"]):
        assert got.ids[f"pool-{k}-replicas"] == (str(p["replicas"]), repr(p["replicas"]))
    assert got.tags.get("svg", 0) >= 2 and got.tags.get("figure", 0) >= 1     # the diagram and a figure


def test_the_console_check_catches_a_script_error(tmp_path):
    """The browser check can fail: a page with an uncaught error and a blocked fetch is caught."""
    exe = _browser()
    if exe is None:
        pytest.skip("chromium not installed")
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><img src="https://example.invalid/x.png">'
                   "<script>no_such_function();</script></body></html>")
    _, console = _open_in_browser(exe, bad, tmp_path / "profile")
    assert any("Uncaught" in ln for ln in console), console


# --------------------------------------------------------------------------------------------
# Without a browser
# --------------------------------------------------------------------------------------------


def test_report_is_self_contained(page):
    text = page.read_text()
    assert "http://" not in text and "https://" not in text
    assert not re.search(r"<(script|link|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"""\b(src|href)\s*=\s*["'](?!#|data:)""", text, re.I)
    assert not re.search(r"url\((?!#)", text) and "@import" not in text
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids))                                      # figures never share an id


def test_pool_diagram_bands_are_proportional_to_log_tokens():
    pools = [{"min_tokens": 0, "max_tokens": 1023, "gpu": "a", "replicas": 1},
             {"min_tokens": 1023, "max_tokens": 65535, "gpu": "b", "replicas": 2}]
    widths = [float(w) for w in re.findall(r'<rect x="[^"]+" y="[^"]+" width="([^"]+)"', pool_diagram(pools, 600))]
    # ln(1 + t) / ln(65536) x 600: 1,024 = 2^10 and 65,536 = 2^16, so the bands are 10/16 and 6/16 of 600 px
    assert widths == [pytest.approx(375.0, abs=0.05), pytest.approx(225.0, abs=0.05)]


def _split_table_json() -> dict:
    row = SplitRow(boundary_tokens=2048, share_short=0.948, replicas_short=1, replicas_long=7, total_gpus=8,
                   cost_per_hr=17.68, cost_per_year=154_876.8, saving_pct=38.5, ttft_p99_ms_short=11.7,
                   ttft_p99_ms_long=64.1, slo_met=True, pareto=True, fleet="0-2048:a100x1,2048-65536:a100x7")
    base = SplitBaseline(13, 13, 28.73, 251_674.8, 14.4, True, "0-65536:a100x13")
    return SplitTable("hand", "a100", 100.0, 500.0, "mean-prefill", 0.85, 65536, base, (row,), 0).to_json()


def test_split_table_json_gets_its_table_and_figure():
    text = build_html(_split_table_json())
    assert "two-pool split table" in text and "154,877" in text and "recommended" in text
    assert text.count("<figure>") == 1 and "analytic (ttft_model mean-prefill" in text


def _one_error_line(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_exits_2_with_one_line(tmp_path, solve_json):
    out = str(tmp_path / "r.html")
    not_json = tmp_path / "bad.json"
    not_json.write_text("{not json")
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"command": "bench"}))
    broken = tmp_path / "broken.json"
    q = json.loads(solve_json.read_text())
    del q["pools"][1]["replicas"]
    broken.write_text(json.dumps(q))
    other_plan = tmp_path / "sim.json"
    other_plan.write_text(json.dumps({"command": "simulate", "schema_version": "2.0",   # an earlier contract's
                                      "instance": "quickstart", "ttft_p99_ms": 1.0,
                                      "slo_ttft_p99_ms": 500.0, "latency_ms": {},
                                      "pools": [{"min_tokens": 0, "max_tokens": 65536, "gpu": "h100", "replicas": 7}]}))
    cases = [([str(tmp_path / "missing.json"), "-o", out], "no such file"),
             ([str(not_json), "-o", out], "not JSON"),
             ([str(foreign), "-o", out], "'bench' has no report"),
             ([str(broken), "-o", out], "pools[1].replicas: missing"),
             ([str(solve_json), "--sim", str(other_plan), "-o", out], "not the solve's plan"),
             ([str(solve_json), "-o", str(solve_json)], "refusing to overwrite")]
    before = solve_json.read_bytes()
    for args, words in cases:
        line = _one_error_line(CliRunner().invoke(GROUP, ["report", *args]))
        assert words in line, line
    assert solve_json.read_bytes() == before and not Path(out).exists()


def test_report_with_the_simulation_of_the_same_plan(solve_json, tmp_path):
    q = json.loads(solve_json.read_text())
    pools = [{**{k: p[k] for k in ("min_tokens", "max_tokens", "gpu", "replicas")}, "ttft_p99_ms": p["ttft_p99_ms"],
              "ttft_p99_ms_sim": 25.0 + k, "ttft_p99_ci_ms": [20.0, 30.0 + k],
              "latency_ms": {"ttft": {"p50": 5.0, "p90": 10.0, "p99": 25.0 + k}}} for k, p in enumerate(q["pools"])]
    sim = {"command": "simulate", "instance": q["instance"], "ttft_p99_ms": 27.5, "ttft_p99_ci_ms": [21.0, 33.0],
           "slo_ttft_p99_ms": 500.0, "latency_ms": {"ttft": {"p50": 5.0, "p90": 10.0, "p99": 27.5}}, "pools": pools,
           "requests_simulated": 1000, "seed": 3, "options": {"replications": 2}}
    text = build_html(q, sim=sim)
    assert 'id="sim-fleet-ttft-p99-ms" data-value="27.5"' in text
    assert "1,000 requests, 2 replications, seed 3" in text                     # the figure's source says so
    assert text.count("<figure>") == 2


def test_report_says_what_the_plans_were_sized_to(solve_json):
    """The quickstart's plans carry the batched model's 3 % margin: the page's heading says so; a document
    without a margin (a verified solve's) says nothing of one."""
    q = json.loads(solve_json.read_text())
    assert "pools sized to 485 ms (a 3 % margin)" in build_html(q)
    assert "pools sized to" not in build_html({**q, "ttft_margin": 0.0, "ttft_sizing_ms": 500.0})


# --------------------------------------------------------------------------------------------
# Figures measured in the browser: labels present, inside their figure, never on each other
# --------------------------------------------------------------------------------------------

_MEASURE = """<script>
const out = [];
document.querySelectorAll('svg').forEach((svg, k) => {
  const b = svg.getBoundingClientRect();
  const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim()).map(t => {
    const r = t.getBoundingClientRect();
    return {text: t.textContent.trim(), box: [r.left, r.top, r.right, r.bottom]};
  });
  const hover = [...svg.querySelectorAll('use > title')].map(t => t.textContent);
  out.push({svg: k, box: [b.left, b.top, b.right, b.bottom], texts: texts, hover: hover});
});
const pre = document.createElement('pre');
pre.id = 'measured';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _measure_in_browser(exe: str, page: Path, tmp: Path) -> list[dict]:
    """Each ``<svg>`` of ``page`` as Chromium lays it out: its box and every non-empty ``<text>``'s box (CSS px,
    from ``getBoundingClientRect``), measured by a script added to a copy of the page (the page has none)."""
    probe = tmp / f"measure-{page.name}"
    probe.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    dom, _ = _open_in_browser(exe, probe, tmp / "profile-measure")
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-500:]
    import html

    return json.loads(html.unescape(found.group(1)))


def _screenshot(exe: str, page: Path, png: Path, profile: Path) -> None:
    cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--hide-scrollbars", "--window-size=1200,2400",
           f"--screenshot={png}", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.is_file(), proc.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1000
    assert float(pixels[..., :3].std()) > 0.02          # not a blank page: text, tables and figures drawn


def _overlaps(texts: list[dict], tol_px: float = 1.0) -> list[tuple[str, str]]:
    out = []
    for k, a in enumerate(texts):
        for b in texts[k + 1:]:
            w = min(a["box"][2], b["box"][2]) - max(a["box"][0], b["box"][0])
            h = min(a["box"][3], b["box"][3]) - max(a["box"][1], b["box"][1])
            if w > tol_px and h > tol_px:
                out.append((a["text"], b["text"]))
    return out


def _headroom_range_json() -> dict:
    """A step schedule whose steps at 162, 164, 165 and 168 req/s lie 1-3 req/s apart on a 20-200 req/s axis."""
    steps = [40.0, 46.0, 63.0, 89.0, 92.0, 108.0, 119.0, 147.0, 162.0, 164.0, 165.0, 168.0, 187.0]
    rates = sorted({20.0, 200.0, *steps, *(s - 1.0 for s in steps)})
    solved = [{"arrival_rate": r, "cost_per_year": 50_000.0 + 10_000.0 * sum(r >= s for s in steps)} for r in rates]
    return {"command": "headroom --range", "instance": "hand", "range": [20.0, 200.0],
            "steps": [{"arrival_rate": s} for s in steps], "plateaus": [], "solved": solved}


@pytest.fixture(scope="module")
def frontier_json(repo_root, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("frontier") / "pools.json"
    res = CliRunner().invoke(main, ["pareto", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"),
                                    "--axes", "cost,pools", "--json", str(path), "--quiet"])
    assert res.exit_code == 0, res.output
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["solve", "pareto --axes cost,pools", "headroom --range"])
def test_figures_in_chromium_have_their_labels_and_no_overprint(kind, solve_json, frontier_json, tmp_path):
    """Each page rendered by ``fleetopt report``, screenshotted and measured in Chromium: the figure's labels are
    there (axis labels, the SLO line, the recommended point, several tick labels on the solve's log axis, every
    step's rate), every text lies inside its figure, and no two texts of a figure overlap by more than 1 px."""
    exe = _browser()
    if exe is None:
        pytest.skip("chromium not installed")
    out = tmp_path / "page.html"
    if kind == "headroom --range":        # the figure's input only (the steps' fleets and changes left out)
        src = tmp_path / "range.json"
        src.write_text(json.dumps(_headroom_range_json()))
        out.write_text(build_html(json.loads(src.read_text())))
    else:
        src = solve_json if kind == "solve" else frontier_json
        res = CliRunner().invoke(GROUP, ["report", str(src), "-o", str(out)])
        assert res.exit_code == 0, res.output
    _screenshot(exe, out, tmp_path / "page.png", tmp_path / "profile-shot")
    figures = [f for f in _measure_in_browser(exe, out, tmp_path) if f["texts"]]
    data = json.loads(src.read_text())
    words = {t["text"] for f in figures for t in f["texts"]}
    if kind == "solve":
        assert "P99 time to first token (ms)" in words and "P99 TTFT SLO 500 ms" in words
        ticks = {w for w in words if w.replace(",", "").isdigit()}
        assert {"100", "200", "500"} <= ticks, sorted(ticks)     # the pools' P99s span 68-454 ms: three labels
    elif kind.startswith("pareto"):
        rec = data["recommended"]
        assert {"pools in the plan (count)", "P99 TTFT (ms)", "P99 TTFT SLO 500 ms",
                f"recommended (point {rec + 1}): {data['points'][rec]['fleet']}"} <= words
        assert 'id="frontier-recommended"' in out.read_text()
        hover = [h for f in figures for h in f["hover"]]           # each point's plan as its marker's tooltip
        assert [h.split(":", 1)[0] for h in hover] == [f"point {k + 1}" + (" (recommended)" if k == rec else "")
                                                        for k in range(len(data["points"]))]
        assert all(p["fleet"] in h for p, h in zip(data["points"], hover))
    else:
        assert {f"{s['arrival_rate']:g}" for s in data["steps"]} <= {w.split()[-1] for w in words}  # each step's rate
    for f in figures:
        x0, y0, x1, y1 = f["box"]
        outside = [t["text"] for t in f["texts"] if t["box"][0] < x0 - 1 or t["box"][2] > x1 + 1
                   or t["box"][1] < y0 - 1 or t["box"][3] > y1 + 1]
        assert outside == [], (f["svg"], outside)
        assert _overlaps(f["texts"]) == [], (f["svg"], _overlaps(f["texts"]))


def test_the_page_names_fleetopt_s_version_and_each_input_s_sha256(page, solve_json):
    """Provenance of the page itself: the fleetopt that wrote it and the SHA-256 of the JSON it was built from
    (computed here from the file's bytes)."""
    import hashlib
    from importlib.metadata import version

    text = page.read_text()
    digest = hashlib.sha256(solve_json.read_bytes()).hexdigest()
    assert f"<td>input {solve_json.name}</td><td>SHA-256 {digest}</td>" in text
    assert f"<td>page written by</td><td>fleetopt {version('fleetopt')}</td>" in text
