"""The notebook API (``docs/api.md``): the doc's code blocks run, and the report views say what they claim."""

from __future__ import annotations

import html.parser
import os
import re
import subprocess
import sys

import pytest

from fleetopt.optimizer.errors import InstanceError

DOC_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_the_worked_example_runs(repo_root, monkeypatch):
    """Every ```python block of docs/api.md, in order, in one namespace, from the repository root."""
    blocks = DOC_BLOCK.findall((repo_root / "docs" / "api.md").read_text())
    assert len(blocks) >= 4
    monkeypatch.chdir(repo_root)
    namespace: dict = {}
    for k, code in enumerate(blocks):
        exec(compile(code, f"docs/api.md[block {k}]", "exec"), namespace)


@pytest.fixture(scope="module")
def small():
    import fleetopt

    return fleetopt.load({"name": "small", "workload": {"cdf": "builtin:lmsys", "arrival_rate": 50},
                          "slo": {"ttft_p99_ms": 500}, "gpus": [{"name": "a100", "profile": "A100-80GB"}],
                          "pools": {"max_pools": 2, "max_context": 65536}})


def test_root_package_forwards_the_notebook_functions():
    import fleetopt
    from fleetopt import api

    for name in ("load", "solve", "evaluate", "simulate", "verify"):
        assert getattr(fleetopt, name) is getattr(api, name)
    with pytest.raises(AttributeError):
        fleetopt.no_such_function  # noqa: B018


def test_a_mapping_is_validated_like_a_file_and_named_dict():
    import fleetopt

    with pytest.raises(InstanceError) as err:
        fleetopt.load({"workload": {"cdf": "builtin:lmsys", "arrival_rate": 1}, "slo": {"ttft_p99_ms": 500},
                       "gpus": [{"name": "x", "profile": "X100"}], "pools": {"max_context": 1024}, "bogus": 1})
    lines = err.value.problems
    assert all(line.startswith("<dict>: ") for line in lines)
    assert any(line.startswith("<dict>: bogus: unknown key") for line in lines)
    assert any(line.startswith("<dict>: gpus[0].profile: ") and "X100" in line for line in lines)


class _Table(html.parser.HTMLParser):
    """Collects tags, header cells and body rows of an HTML table."""

    def __init__(self):
        super().__init__()
        self.tags, self.head, self.rows, self._cell, self._where = set(), [], [], None, None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag in ("thead", "tbody"):
            self._where = tag
        elif tag == "tr" and self._where == "tbody":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "th":
            self.head.append(self._cell)
        elif tag == "td":
            self.rows[-1].append(self._cell)
        if tag in ("td", "th"):
            self._cell = None


def test_solve_report_html_has_one_row_per_pool_and_no_external_resource(small):
    import fleetopt

    report = fleetopt.solve(small)
    table = _Table()
    table.feed(report._repr_html_())
    assert table.tags <= {"div", "table", "caption", "thead", "tbody", "tr", "th", "td", "p"}
    assert len(table.rows) == len(report.best.fleet.pools)
    col = table.head.index("replicas")
    assert [int(r[col].replace(",", "")) for r in table.rows] == [p.replicas for p in report.best.fleet.pools]


def test_html_escapes_names():
    from fleetopt.optimizer.plan.solve import table_html

    out = table_html("a<b", [{"gpu": "<script>x</script>"}], ["gpu"], note="&")
    assert "<script>" not in out and "&lt;script&gt;" in out and "a&lt;b" in out and "<p>&amp;</p>" in out


def test_evaluation_rows_follow_the_json(small):
    import fleetopt

    ev = fleetopt.evaluate(small, "0-8192:a100x4,8192-65536:a100x3")
    js = ev.to_json()
    rows = [r for r in ev.rows() if r["fleet"] != "baseline"]
    assert [r["replicas"] for r in rows] == [4, 3] == [p["replicas"] for p in js["pools"]]
    assert "<table>" in ev._repr_html_()


def test_latencies_need_keep_requests(small):
    import fleetopt

    sim = fleetopt.simulate(small, "0-8192:a100x4,8192-65536:a100x3", requests=1000, replications=1)
    assert sim.request_latencies is None
    with pytest.raises(ValueError, match="keep_requests=True"):
        sim.latencies()
    rows = sim.rows()
    assert [r["requests"] for r in rows] == [p.requests for p in sim.pools]


def test_latencies_are_the_measured_requests(small):
    """The kept TTFTs give back the report's own P99 (the same requests, the same percentile)."""
    import numpy as np

    import fleetopt
    from fleetopt.solvers.des.metrics import percentile

    sim = fleetopt.simulate(small, "0-8192:a100x4,8192-65536:a100x3", requests=2000, replications=1, seed=3,
                            keep_requests=True)
    lat = sim.latencies()
    assert list(lat) == ["0-8192:a100", "8192-65536:a100"]
    for (_label, v), pool in zip(lat.items(), sim.pools):
        assert len(v["ttft_ms"]) == pool.requests
        assert not np.isnan(v["tpot_ms"]).any()
    ttft = np.concatenate([v["ttft_ms"] for v in lat.values()])
    assert float(percentile(ttft, 50)) == pytest.approx(sim.ttft.p50_ms, rel=1e-12)


def test_to_frame(small):
    import fleetopt

    report = fleetopt.solve(small)
    frame = report.to_frame()            # pandas (the frames extra) is a test dependency
    assert list(frame["replicas"]) == [p.replicas for p in report.best.fleet.pools]


def test_to_frame_without_pandas_names_the_extra(small, monkeypatch):
    """Where pandas is missing, to_frame() says which extra brings it (pandas made unimportable here)."""
    import fleetopt

    report = fleetopt.solve(small)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"fleetopt\[frames\]"):
        report.to_frame()


def test_import_is_light():
    """``import fleetopt`` loads none of numpy, scipy, pydantic or Pyomo (they come with the first call)."""
    code = "import sys, fleetopt; print(sorted(m for m in ('numpy', 'scipy', 'pydantic', 'pyomo') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"}).stdout
    assert out.strip() == "[]"
