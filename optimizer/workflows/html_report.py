"""The self-contained HTML report of a result (``fleetopt report RESULT.json -o report.html``): builds the page,
prints and writes nothing.

One page, readable without a network: inline CSS, the figures as inline SVG (:mod:`fleetopt.optimizer.workflows.plots`,
text as ``<text>`` so it is searchable, element ids prefixed per figure so figures never share one), no script,
no font, no image or style sheet fetched from anywhere. The kind of result is read from its ``command`` key
(:data:`KINDS`; the JSON of ``tpw``, which has none, from its rows):

* ``solve``: the plan (pools, GPUs, replicas, cost, power, tok/W, P99 TTFT), a diagram of the pools along the
  request-length axis (:func:`pool_diagram`), the homogeneous baseline, the verification when ``--verify-top``
  ran, the figure of each pool's P99 against the SLO, and with ``sim`` (the ``simulate`` JSON of the same plan)
  the simulated pools and their TTFT distributions;
* ``pareto --axes cost,AXIS``: the frontier page (:func:`_frontier`): the recommended point's headline, the curve
  with the SLO line and the recommended point marked, and a table of every point's plan (its pools, physical
  GPUs, $/hr, $/yr, kW, worst P99 TTFT, the SLO verdict; the recommended row has id ``frontier-recommended``);
* ``simulate``, ``pareto --split-table``, ``whatif``, ``gridflex``, ``headroom`` (and ``headroom --range``),
  ``tpw``: the command's table and figure.

Every number says where it comes from: each table and figure carries its source (analytic with the TTFT model,
the selecting method: graph oracle or MIP, simulated with its requests, replications and seed), and a
provenance table lists them with the profile quality labels as the JSON has them. Machine-readable values sit in
``data-value`` attributes (the JSON's own number) next to the rounded text; the key ones have ids
(``total-physical-gpus``, ``total-cost-per-hr``, ``total-cost-per-year``, ``total-power-kw``,
``usd-per-million-output-tokens``, ``fleet-ttft-p99-ms``, ``pool-K-replicas``, ``pool-K-physical-gpus``). The
headline is in physical GPUs, $/hr, $/yr, kW, tok/W and $ per million output tokens; a fleet of the seeds'
calibrated units (``seed_unit``) says how many units it prices.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable, Mapping, Sequence

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.output.export import fleetopt_version

__all__ = ["KINDS", "detect_kind", "build_html", "pool_diagram", "same_plan", "hover_titles"]

KINDS = ("solve", "simulate", "pareto --split-table", "pareto --axes cost,power", "pareto --axes cost,ttft",
         "pareto --axes cost,pools", "whatif", "gridflex", "headroom", "headroom --range", "tpw")
"""Result kinds the report renders (the JSON's ``command`` key; ``tpw`` has none and is told by its rows)."""

DIAGRAM_WIDTH_PX = 900
"""Width of the pool diagram's drawing area (px)."""
_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#e15759", "#9c755f")

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.4;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.9em}th,td{padding:.25em .6em;border-bottom:1px solid #eee}
th{background:#f5f5f5;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
.met{color:#2e7d32;font-weight:600}.missed{color:#c62828;font-weight:600}.src{color:#666;font-size:.85em}
.kpi{display:flex;flex-wrap:wrap;gap:1em;margin:1em 0}.kpi div{background:#f7f9fc;border:1px solid #e3e8f0;
border-radius:6px;padding:.5em .9em}.kpi b{display:block;font-size:1.3em}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{color:#555;font-size:.85em}
.note{background:#fff8e1;border-left:3px solid #f9a825;padding:.4em .8em}code{font-size:.9em}
"""


# --------------------------------------------------------------------------------------------
# Kinds and checks
# --------------------------------------------------------------------------------------------


def detect_kind(data, source: str = "") -> str:
    """The kind of a result JSON (:data:`KINDS`).

    Raises
    ------
    InstanceError
        Not a JSON object, or no known ``command`` (one line naming ``source`` and the field).
    """
    where = f"{source}: " if source else ""
    if not isinstance(data, Mapping):
        raise InstanceError(f"{where}not a JSON object (a fleetopt result file holds one)")
    command = data.get("command")
    if command is None:
        rows = data.get("rows")
        if isinstance(rows, list) and rows and all(isinstance(r, Mapping) and {"context", "tok_per_watt"} <= set(r)
                                                   for r in rows):
            return "tpw"
        raise InstanceError(f"{where}command: missing; not a fleetopt result (expected one of {', '.join(KINDS)})")
    if command not in KINDS:
        raise InstanceError(f"{where}command: {command!r} has no report; known: {', '.join(KINDS)}")
    return command


_REQUIRED = {
    "solve": ("instance", "status", "pools", "cost_per_hr", "slo_ttft_p99_ms"),
    "simulate": ("instance", "pools", "ttft_p99_ms", "slo_ttft_p99_ms", "latency_ms"),
    "pareto --split-table": ("instance", "gpu", "rows", "baseline", "recommended", "slo_ttft_p99_ms"),
    **{kind: ("instance", "axes", "points", "recommended") for kind in KINDS if kind.startswith("pareto --axes")},
    "whatif": ("instance", "sweeps", "scenarios", "base", "slo_ttft_p99_ms"),
    "gridflex": ("instance", "fleet", "depths", "slo_ttft_p99_ms"),
    "headroom": ("instance", "fleet", "pools", "arrival_rate", "max_arrival_rate"),
    "headroom --range": ("instance", "range", "steps", "solved"),
    "tpw": ("rows",),
}
_POOL_KEYS = ("min_tokens", "max_tokens", "gpu", "replicas")


def _check(data: Mapping, kind: str, source: str) -> None:
    where = f"{source}: " if source else ""
    missing = [k for k in _REQUIRED[kind] if k not in data]
    if missing:
        raise InstanceError(f"{where}{missing[0]}: missing from a {kind} result")
    pools = data.get("pools")
    if kind in ("solve", "simulate", "headroom") and pools is not None:
        if not isinstance(pools, list):
            raise InstanceError(f"{where}pools: expected a list, got {type(pools).__name__}")
        for k, p in enumerate(pools):
            gone = [f for f in _POOL_KEYS if not isinstance(p, Mapping) or f not in p]
            if gone:
                raise InstanceError(f"{where}pools[{k}].{gone[0]}: missing")
    for key in ("rows", "scenarios", "depths", "solved", "points"):
        if key in _REQUIRED[kind] and not isinstance(data.get(key), list):
            raise InstanceError(f"{where}{key}: expected a list, got {type(data.get(key)).__name__}")


def same_plan(solve: Mapping, sim: Mapping) -> str:
    """Why ``sim`` (a ``simulate`` JSON) is not a simulation of ``solve``'s plan; empty when its pools are the plan's
    (same ranges, GPU options and replica counts, in order)."""
    a = [tuple(p.get(k) for k in _POOL_KEYS) for p in solve.get("pools") or []]
    b = [tuple(p.get(k) for k in _POOL_KEYS) for p in sim.get("pools") or []]
    if a == b:
        return ""
    show = lambda pools: ",".join(f"{lo}-{hi}:{g}x{n}" for lo, hi, g, n in pools)  # noqa: E731
    return f"pools {show(b) or '(none)'} are not the solve's plan {show(a) or '(none)'}"


# --------------------------------------------------------------------------------------------
# Small HTML pieces
# --------------------------------------------------------------------------------------------


def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _fmt(x, spec: str = ",.1f", none: str = "-") -> str:
    if x is None:
        return none
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return "inf" if isinstance(x, float) and math.isinf(x) else format(x, spec)
    return str(x)


def _td(x, spec: str = ",.1f", none: str = "-", ident: str | None = None) -> str:
    """A numeric cell: the rounded text, the JSON's number in ``data-value``."""
    attrs = f' id="{_e(ident)}"' if ident else ""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        attrs += f' data-value="{x!r}"'
    return f'<td class="n"{attrs}>{_e(_fmt(x, spec, none))}</td>'


def _verdict(ok) -> str:
    if ok is None:
        return "<td>-</td>"
    return '<td class="met">met</td>' if ok else '<td class="missed">MISSED</td>'


def _table(head: Sequence[str], rows: Sequence[str], caption: str) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(f"<tr>{r}</tr>" for r in rows)
    return (f'<table><caption class="src">{_e(caption)}</caption><thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _kpi(label: str, value, spec: str, unit: str, ident: str, source: str) -> str:
    data = f' data-value="{value!r}"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    return (f'<div><span>{_e(label)}</span><b><span id="{_e(ident)}"{data}>{_e(_fmt(value, spec))}</span> '
            f'{_e(unit)}</b><span class="src">{_e(source)}</span></div>')


def _tokens(x) -> str:
    return _fmt(x, ",d") if isinstance(x, int) else _fmt(x, ",.0f")


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


class _Figures:
    """Numbers the page's figures and records each one's source for the provenance table."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.count = 0
        self.sources: list[tuple[str, str]] = []
        self.missing_reason = ""

    def add(self, title: str, source: str, build: Callable, *args, **kwargs) -> str:
        self.count += 1
        n = self.count
        self.sources.append((f"Figure {n}: {title}", source))
        caption = f"<figcaption><b>Figure {n}.</b> {_e(title)}. Source: {_e(source)}.</figcaption>"
        if not self.enabled:
            return f'<figure><p class="note">figure not drawn: {_e(self.missing_reason)}</p>{caption}</figure>'
        from fleetopt.optimizer.workflows import plots

        svg = plots.render(build(*args, **kwargs), "svg", text_as_paths=False).decode("utf-8")
        return f"<figure>{_inline_svg(svg, f'f{n}-')}{caption}</figure>"


def _inline_svg(svg: str, prefix: str) -> str:
    """A matplotlib SVG document as an element to inline in HTML: no XML declaration, DOCTYPE (an external DTD)
    or namespace declarations (the HTML parser puts ``<svg>`` in the SVG namespace itself), every id prefixed
    with ``prefix`` (and every ``#id`` reference with it) so that figures on one page never share an id."""
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m[1]}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m[1]})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m[1]}"', svg)
    return svg.strip()


def hover_titles(figure: str, gid: str, titles: Sequence[str]) -> str:
    """``figure`` (inline SVG) with a ``<title>`` (the browser's hover tooltip, no script) on each of the first
    ``len(titles)`` markers (``<use .../>``) of the group ``id="gid"``, in order; unchanged without that group.

    Examples
    --------
    >>> hover_titles('<g id="p"><use x="1"/><use x="2"/></g>', "p", ["a", "b<c"])
    '<g id="p"><use x="1"><title>a</title></use><use x="2"><title>b&lt;c</title></use></g>'
    """
    start = figure.find(f'<g id="{gid}">')
    if start < 0:
        return figure
    out, pos = [figure[:start]], start
    for title, m in zip(titles, re.finditer(r"<use\b([^>]*?)\s*/>", figure[start:])):
        out.append(figure[pos:start + m.start()])
        out.append(f"<use{m.group(1)}><title>{_e(title)}</title></use>")
        pos = start + m.end()
    out.append(figure[pos:])
    return "".join(out)


def pool_diagram(pools: Sequence[Mapping], width_px: int = DIAGRAM_WIDTH_PX) -> str:
    r"""The pools along the request-length axis as inline SVG: one band per pool, its width proportional to the
    logarithm of its token range,

    .. math:: x(t) = W \, \frac{\ln(1 + t)}{\ln(1 + T)}, \qquad T = \max_p \mathrm{max\_tokens}_p,

    (:math:`\ln(1 + t)` so that a pool starting at 0 tokens has a finite edge), labelled with its GPU option,
    replica count, token range and routing share. Pools that tile the axis share one strip; overlapping pools
    (split routing) get one lane each. Ticks at powers of 4 tokens."""
    if not pools:
        return ""
    top = max(float(p["max_tokens"]) for p in pools)
    scale = math.log1p(top) if top > 0 else 1.0
    x = lambda t: 10.0 + width_px * math.log1p(max(float(t), 0.0)) / scale  # noqa: E731
    ordered = sorted(range(len(pools)), key=lambda k: (pools[k]["min_tokens"], pools[k]["max_tokens"]))
    tiles = all(pools[ordered[j]]["min_tokens"] == pools[ordered[j - 1]]["max_tokens"] for j in range(1, len(ordered)))
    lane_h, gap = 46, 10
    lanes = 1 if tiles else len(pools)
    gpus = sorted({p["gpu"] for p in pools})
    color = {g: _PALETTE[k % len(_PALETTE)] for k, g in enumerate(gpus)}
    height = 24 + lanes * (lane_h + gap) + 36
    parts = [f'<svg class="pools" viewBox="0 0 {width_px + 20} {height}" width="{width_px + 20}" height="{height}" '
             'role="img" aria-label="pools along the request length axis">']
    for j, k in enumerate(ordered):
        p = pools[k]
        lane = 0 if tiles else j
        y = 24 + lane * (lane_h + gap)
        x0, x1 = x(p["min_tokens"]), x(p["max_tokens"])
        share = p.get("routing_share")
        parts.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1.0):.1f}" height="{lane_h}" '
                     f'fill="{color[p["gpu"]]}" stroke="#fff" stroke-width="2"><title>{_e(_pool_name(p))}'
                     f'{"" if share is None else f", {100 * share:.1f} % of requests"}</title></rect>')
        label = f'{p["gpu"]} x{p["replicas"]}'
        sub = f'{_tokens(p["min_tokens"])}-{_tokens(p["max_tokens"])}'
        if share is not None:
            sub += f" ({100 * share:.1f} %)"
        cx = (x0 + x1) / 2
        if x1 - x0 >= 7.0 * max(len(sub), len(label)):
            parts.append(f'<text x="{cx:.1f}" y="{y + 19}" text-anchor="middle" fill="#fff" font-size="13" '
                         f'font-weight="600">{_e(label)}</text>')
            parts.append(f'<text x="{cx:.1f}" y="{y + 36}" text-anchor="middle" fill="#fff" font-size="11">'
                         f'{_e(sub)}</text>')
        else:
            parts.append(f'<text x="{cx:.1f}" y="{y - 4}" text-anchor="middle" fill="#222" font-size="11">'
                         f'{_e(label)} {_e(sub)}</text>')
    axis_y = 24 + lanes * (lane_h + gap)
    parts.append(f'<line x1="10" y1="{axis_y}" x2="{width_px + 10}" y2="{axis_y}" stroke="#444"/>')
    tick = 1
    while tick <= top:
        tx = x(tick)
        text = f"{tick // 1024:,}K" if tick >= 1024 else str(tick)
        parts.append(f'<line x1="{tx:.1f}" y1="{axis_y}" x2="{tx:.1f}" y2="{axis_y + 5}" stroke="#444"/>'
                     f'<text x="{tx:.1f}" y="{axis_y + 17}" text-anchor="middle" font-size="10" fill="#444">'
                     f'{text}</text>')
        tick *= 4
    parts.append(f'<text x="{width_px + 10}" y="{axis_y + 31}" text-anchor="end" font-size="10" fill="#444">'
                 'request length (tokens, log(1 + t) scale)</text></svg>')
    return "".join(parts)


def _pool_name(p: Mapping) -> str:
    return f'{_tokens(p["min_tokens"])}-{_tokens(p["max_tokens"])} {p["gpu"]} x{p["replicas"]}'


# --------------------------------------------------------------------------------------------
# Sections per kind
# --------------------------------------------------------------------------------------------


def _solve(q: Mapping, sim: Mapping | None, figs: _Figures, prov: list) -> str:
    from fleetopt.optimizer.workflows import plots

    out = []
    method = q.get("method") or "?"
    selected = f"selected by {method} ({q.get('solver', '')}), status {q.get('status')}"
    model = f"analytic, ttft_model {q.get('ttft_model', '?')}"
    gap = q.get("mip_gap")
    prov.append(("Plan selection", f"{selected}; MIP gap {_fmt(None if gap is None else 100 * gap, '.2f')} %; "
                                   f"{(q.get('candidates') or {}).get('after_pruning', '?')} candidate pools after "
                                   "pruning"))
    prov.append(("Plan numbers (cost, power, tok/W, P99 TTFT, utilisation)",
                 (q.get("provenance") or {}).get("numbers", "analytic") + f" ({model})"))
    for line in (q.get("provenance") or {}).get("profiles") or []:
        prov.append(("Profile quality", line))
    pools = q.get("pools")
    if pools is None:
        out.append(f'<p class="note">No plan: status {_e(q.get("status"))}. {_e(q.get("explanation") or "")}</p>')
        return "".join(out)
    out.append('<div class="kpi">')
    out.append(_headline_kpis(q, model, selected))
    out.append(_kpi("fleet P99 TTFT", q.get("ttft_p99_ms"), ",.1f", f'ms (SLO {_fmt(q.get("slo_ttft_p99_ms"), ",.0f")} '
                    "ms)", "fleet-ttft-p99-ms", model))
    out.append("</div>")
    out.append(f'<p>SLO: <b>{"met" if q.get("slo_met") else "MISSED"}</b> (scope {_e(q.get("scope", "?"))}); '
               f'fleet spec <code>{_e(q.get("fleet") or "-")}</code></p>')
    out.append("<h2>Pools</h2>")
    rows = []
    for k, p in enumerate(pools):
        rows.append(f'<td>{_e(_tokens(p["min_tokens"]))}-{_e(_tokens(p["max_tokens"]))}</td><td>{_e(p["gpu"])}</td>'
                    f'<td>{_e(p.get("profile", ""))}</td>' + _td(p["replicas"], ",d", ident=f"pool-{k}-replicas")
                    + _td(p.get("physical_gpus", p.get("gpus")), ",d", ident=f"pool-{k}-physical-gpus")
                    + _td(p.get("arrival_rate"), ",.2f")
                    + _td(None if p.get("routing_share") is None else 100 * p["routing_share"], ",.2f")
                    + _td(p.get("utilization"), ".2f") + _td(p.get("ttft_p99_ms"), ",.1f", none="unbounded",
                                                             ident=f"pool-{k}-ttft-p99-ms")
                    + _td(None if p.get("power_w") is None else p["power_w"] / 1000.0, ",.2f")
                    + _td(p.get("tok_per_watt"), ",.2f")
                    + _td(p.get("cost_per_hr"), ",.2f", ident=f"pool-{k}-cost-per-hr")
                    + _td((p.get("analytic") or {}).get("usd_per_million_output_tokens"), ",.2f")
                    + _verdict(p.get("slo_met"))
                    + f'<td class="src">{_e(p.get("quality", ""))}</td>')
    seed = _seed_units(pools)
    out.append(_table(["tokens", "gpu", "profile", "replicas", "GPUs", "req/s", "share %", "util", "P99 TTFT ms",
                       "kW", "tok/W", "US$/hr", "US$/Mtok", "SLO", "profile quality"], rows,
                      f"every number {model}; pools {selected}; GPUs: physical GPUs"
                      + ("; seed-unit pools price and power each TP=8 server as one GPU" if seed else "")
                      + "; US$/Mtok: US$ per million output tokens; profile quality as the profile states it"))
    out.append("<h2>Pools along the request length</h2>")
    out.append(pool_diagram(pools))
    out.append('<p class="src">Bands: the plan\'s pools (boundaries chosen by the '
               f'{_e(method)}), width proportional to the log of the token range; share: analytic routing share.</p>')
    prov.append(("Pool diagram", f"the plan's boundaries and counts ({selected}); routing shares analytic"))
    b = q.get("baseline")
    if b:
        out.append("<h2>Homogeneous baseline</h2>")
        bp = (b.get("pools") or [{}])
        rows = [f'<td>{_e(", ".join(_pool_name(p) for p in bp if p))}</td>' + _td(b.get("total_replicas"), ",d")
                + _td(b.get("physical_gpus"), ",d") + _td(b.get("cost_per_hr"), ",.2f")
                + _td(b.get("cost_per_year"), ",.0f") + _td(b.get("power_kw"), ",.2f")
                + _td(b.get("tok_per_watt"), ",.2f") + _td(b.get("usd_per_million_output_tokens"), ",.2f")
                + _td(b.get("ttft_p99_ms"), ",.1f", none="unbounded") + _verdict(b.get("slo_met"))
                + _td(None if not b.get("cost_per_year") else
                      100 * (1 - q["cost_per_year"] / b["cost_per_year"]), "+.1f")]
        out.append(_table(["fleet", "replicas", "GPUs", "US$/hr", "US$/yr", "kW", "tok/W", "US$/Mtok", "P99 TTFT ms",
                           "SLO", "plan saves %"], rows,
                          "analytic: one pool of one GPU option over the whole length range, sized the same way"))
        prov.append(("Homogeneous baseline", "analytic"))
    v = q.get("verification")
    source_sim = None
    if v:
        out.append(_verification(q, v))
        opts = v.get("options") or {}
        source_sim = (f"simulated (verification: {opts.get('requests', '?'):,} requests per plan, "
                      f"{opts.get('replications', '?')} replications, seed {opts.get('seed', '?')}, rule "
                      f"{v.get('rule', '?')})" if isinstance(opts.get("requests"), int) else "simulated (verification)")
        prov.append(("Verification", source_sim))
    if sim is not None:
        source_sim = _sim_source(sim)
    fig_source = f"bars {model}" + (f"; diamonds {source_sim}" if source_sim else "")
    out.append(figs.add("P99 TTFT per pool against the SLO", fig_source, plots.plan_figure, q, sim=sim))
    if sim is not None:
        out.append("<h2>Simulated (the same plan)</h2>")
        out.append(_simulate(sim, figs, prov, heading=False))
    return "".join(out)


def _seed_units(pools) -> int:
    """Replicas of a fleet's pools that are the seeds' calibrated units (``unit: seed_unit``)."""
    return sum(int(p.get("replicas") or 0) for p in pools or () if isinstance(p, Mapping)
               and p.get("unit") == "seed_unit")


def _headline_kpis(f: Mapping, model: str, selected: str, prefix: str = "") -> str:
    """A fleet's headline in physical GPUs (``analytic`` of a 2.2 document, else the flat keys): GPUs, $/hr,
    $/yr, kW, tok/W and $ per million output tokens. A fleet of the seeds' calibrated units says how many units
    it prices (a TP=8 server priced and powered as one GPU, ``seed_unit``). ``prefix``: of the element ids."""
    analytic = f.get("analytic")
    a = analytic if isinstance(analytic, Mapping) else {}
    get = lambda key: a.get(key, f.get(key))  # noqa: E731
    gpus = get("physical_gpus")
    units = _seed_units(f.get("pools"))
    unit_text = (f"physical ({_fmt(get('total_replicas'), ',d')} replicas; {units:,} seed units, each a calibrated "
                 "TP=8 server priced and powered as one GPU)") if units else \
        f"physical ({_fmt(get('total_replicas'), ',d')} replicas)"
    return "".join([
        _kpi("GPUs", gpus, ",d", unit_text, prefix + "total-physical-gpus", selected),
        _kpi("cost", get("cost_per_hr"), ",.2f", "US$/hr", prefix + "total-cost-per-hr", model),
        _kpi("cost per year", get("cost_per_year"), ",.0f", "US$/yr", prefix + "total-cost-per-year", model),
        _kpi("power", get("power_kw"), ",.2f", "kW", prefix + "total-power-kw", model),
        _kpi("tokens per watt", get("tok_per_watt"), ",.2f", "tok/W", prefix + "tok-per-watt", model),
        _kpi("per million output tokens", get("usd_per_million_output_tokens"), ",.2f", "US$",
             prefix + "usd-per-million-output-tokens", model)])


def _verification(q: Mapping, v: Mapping) -> str:
    rows = []
    for p in v.get("plans") or []:
        ci = p.get("ttft_p99_ci_ms") or [None, None]
        chosen = p.get("rank") == v.get("chosen_rank") and p.get("round") == v.get("chosen_round")
        rows.append(_td(p.get("round"), "d") + _td(p.get("rank"), "d") + _td(p.get("cost_per_hr"), ",.2f")
                    + _td(p.get("ttft_p99_ms_sim"), ",.1f", none="unbounded")
                    + f'<td class="n">{_e(_fmt(ci[0]))} - {_e(_fmt(ci[1], none="unbounded"))}</td>'
                    + _verdict(p.get("passed")) + _td(p.get("requests_simulated"), ",d")
                    + f"<td>{'chosen' if chosen else ''}</td>")
    verdict = "verified" if q.get("verified") else "not verified"
    cuts = "".join(f"<li>{_e(c)}</li>" for c in v.get("cuts") or [])
    return ("<h2>Verification in simulation</h2>"
            f"<p>{_e(verdict)} after {_e(v.get('rounds'))} round(s); rule {_e(v.get('rule'))}; "
            f"{_e(v.get('plan_simulations', '?'))} plan simulations, {_e(v.get('solves', '?'))} solves.</p>"
            + _table(["round", "rank", "US$/hr", "sim P99 TTFT ms", "95 % interval ms", "passed", "requests", ""], rows,
                     "simulated: each plan run by the simulator fleetopt simulate uses; US$/hr analytic")
            + (f"<p>Cuts between rounds:</p><ul>{cuts}</ul>" if cuts else ""))


def _sim_source(s: Mapping) -> str:
    opts = s.get("options") or {}
    return (f"simulated ({_fmt(s.get('requests_simulated'), ',d')} requests, "
            f"{opts.get('replications', s.get('replications', '?'))} replications, seed {s.get('seed', '?')}, "
            f"router {s.get('router', '?')}, dispatch {s.get('dispatch', '?')}, arrivals {s.get('arrivals', '?')}; "
            f"CI by {s.get('ci_method', '?')})")


def _simulate(s: Mapping, figs: _Figures, prov: list, heading: bool = True) -> str:
    from fleetopt.optimizer.workflows import plots

    src = _sim_source(s)
    prov.append(("Simulation", src))
    out = []
    if heading:
        a = s.get("analytic") if isinstance(s.get("analytic"), Mapping) else None
        if a is not None:
            out.append('<div class="kpi">')
            out.append(_headline_kpis({**a, "pools": s.get("pools")},
                                      f"analytic (ttft_model {s.get('ttft_model', '?')})", "the fleet given",
                                      prefix="analytic-"))
            out.append("</div>")
        out.append('<div class="kpi">')
        out.append(_kpi("fleet P99 TTFT (simulated)", s.get("ttft_p99_ms"), ",.1f",
                        f'ms (SLO {_fmt(s.get("slo_ttft_p99_ms"), ",.0f")} ms)', "fleet-ttft-p99-ms", src))
        out.append(_kpi("power (simulated)", s.get("power_kw"), ",.2f", "kW", "total-power-kw", src))
        out.append(_kpi("SLO attainment", None if s.get("slo_attainment") is None else 100 * s["slo_attainment"],
                        ",.2f", "%", "slo-attainment", src))
        out.append("</div>")
    ci = s.get("ttft_p99_ci_ms") or [None, None]
    out.append(f'<p>Simulated fleet P99 TTFT <span id="sim-fleet-ttft-p99-ms" data-value="{s.get("ttft_p99_ms")!r}">'
               f'{_e(_fmt(s.get("ttft_p99_ms"), none="unbounded"))}</span> ms (95 % interval {_e(_fmt(ci[0]))} - '
               f'{_e(_fmt(ci[1], none="unbounded"))} ms); SLO {"met" if s.get("slo_met") else "MISSED"} on the '
               f"interval's upper end; {_e(_fmt(s.get('requests_measured'), ',d'))} requests measured.</p>")
    rows = []
    for k, p in enumerate(s.get("pools") or []):
        ci = p.get("ttft_p99_ci_ms") or [None, None]
        t = (p.get("latency_ms") or {}).get("ttft") or {}
        rows.append(f'<td>{_e(_tokens(p["min_tokens"]))}-{_e(_tokens(p["max_tokens"]))}</td><td>{_e(p["gpu"])}</td>'
                    + _td(p["replicas"], ",d", ident=None if not heading else f"pool-{k}-replicas")
                    + _td(p.get("ttft_p99_ms"), ",.1f", none="unbounded") + _td(t.get("p50"), ",.1f")
                    + _td(t.get("p90"), ",.1f") + _td(p.get("ttft_p99_ms_sim"), ",.1f", none="unbounded")
                    + f'<td class="n">{_e(_fmt(ci[0]))} - {_e(_fmt(ci[1], none="unbounded"))}</td>'
                    + _td(None if p.get("slo_attainment") is None else 100 * p["slo_attainment"], ",.2f")
                    + _td(p.get("power_w_sim"), ",.0f") + _td(p.get("requests"), ",d") + _verdict(p.get("slo_met_sim"))
                    + f'<td class="src">{_e(p.get("quality", ""))}</td>')
    out.append(_table(["tokens", "gpu", "replicas", "P99 TTFT ms analytic", "P50 ms sim", "P90 ms sim",
                       "P99 ms sim", "95 % interval ms", "attain %", "power W sim", "requests", "SLO sim",
                       "profile quality"], rows,
                      f"'analytic' columns: the analytic model (ttft_model {s.get('ttft_model', '?')}); "
                      f"the rest {src}"))
    for note in s.get("notes") or []:
        out.append(f'<p class="src">note: {_e(note)}</p>')
    out.append(figs.add("simulated TTFT per pool (quantiles P50/P90/P99 and the P99 interval; the JSON holds no "
                        "per-request latencies)", src, plots.ttft_figure, s))
    return "".join(out)


def _split_table(t: Mapping, figs: _Figures, prov: list) -> str:
    from fleetopt.optimizer.workflows import plots

    src = f"analytic (ttft_model {t.get('ttft_model', '?')}; each pool sized to its least count meeting the SLO)"
    prov.append(("Split table", src))
    rows = []
    for k, r in enumerate(t["rows"]):
        rec = k == t.get("recommended")
        rows.append(_td(r.get("boundary_tokens"), ",d") + _td(100 * _num(r.get("share_short")), ".1f")
                    + _td(r.get("replicas_short"), "d") + _td(r.get("replicas_long"), "d")
                    + _td(r.get("total_gpus"), "d")
                    + _td(r.get("cost_per_year"), ",.0f") + _td(r.get("saving_pct"), "+.1f")
                    + _td(r.get("ttft_p99_ms_short"), ",.1f", none="unbounded")
                    + _td(r.get("ttft_p99_ms_long"), ",.1f", none="unbounded") + _verdict(r.get("slo_met"))
                    + f"<td>{'*' if r.get('pareto') else ''}</td><td>{'recommended' if rec else ''}</td>")
    b = t["baseline"]
    out = [f"<p>Two pools of <b>{_e(t['gpu'])}</b> split at each boundary B, {_e(_fmt(t.get('arrival_rate'), 'g'))} "
           f"req/s; homogeneous baseline <code>{_e(b.get('fleet'))}</code>: {_e(_fmt(b.get('total_gpus'), 'd'))} GPUs, "
           f"US$ {_e(_fmt(b.get('cost_per_year'), ',.0f'))}/yr, P99 {_e(_fmt(b.get('ttft_p99_ms'), none='unbounded'))} "
           "ms (analytic).</p>",
           _table(["B tokens", "short %", "n_short", "n_long", "GPUs", "US$/yr", "saving %", "P99 short ms",
                   "P99 long ms", "SLO", "Pareto", ""], rows, src),
           figs.add("cost against the worst pool's P99 TTFT per boundary (Pareto rows joined; baseline and "
                    "recommended row marked)", src, plots.split_table_figure, t)]
    return "".join(out)


def _num(x) -> float:
    return math.nan if x is None else float(x)


def _frontier(f: Mapping, figs: _Figures, prov: list) -> str:
    """``pareto --axes cost,AXIS``: the recommended point's headline, the curve (with the SLO line and the
    recommended point) and every point's plan in a table, one pool a line."""
    from fleetopt.optimizer.workflows import plots

    axis = (f.get("axes") or ["cost", "?"])[-1]
    unit = f.get("axis_unit", "")
    src = str(f.get("source") or "analytic; each point an optimal re-solve")
    prov.append(("Frontier points", f"{src} ({f.get('sweep', '?')} sweep, {_fmt(f.get('solves'), 'd')} solves); "
                                    "each re-judged on the instance's own SLO and limits"))
    pts = f["points"]
    rec = f.get("recommended")
    out = []
    if rec is not None and 0 <= rec < len(pts):
        r = pts[rec]
        out.append('<div class="kpi">'
                   + _kpi("recommended point", rec + 1, "d", f"of {len(pts)}", "frontier-recommended-rank", src)
                   + _kpi("GPUs", r.get("physical_gpus"), ",d", "physical", "total-physical-gpus", src)
                   + _kpi("cost", r.get("cost_per_hr"), ",.2f", "US$/hr", "total-cost-per-hr", src)
                   + _kpi("cost per year", r.get("cost_per_year"), ",.0f", "US$/yr", "total-cost-per-year", src)
                   + _kpi("power", r.get("power_kw"), ",.2f", "kW", "total-power-kw", src)
                   + _kpi("worst pool P99 TTFT", r.get("worst_ttft_p99_ms"), ",.1f", "ms", "frontier-worst-ttft-ms",
                          src) + "</div>")
        out.append(f"<p>Recommended: point {rec + 1}, <code>{_e(r.get('fleet'))}</code> "
                   f"({_e(f.get('recommended_reason', ''))}).</p>")
    else:
        out.append(f'<p class="note">No point recommended: {_e(f.get("recommended_reason", ""))}</p>')
    knee = f.get("knee_index")
    if knee is not None and 0 <= knee < len(pts) and knee != rec:
        out.append(f"<p>Knee (an alternative): point {knee + 1}, <code>{_e(pts[knee].get('fleet'))}</code>: the most "
                   f"US$ saved per {_e(unit)} given up from the least-{_e(axis)} point.</p>")
    slo = f.get("slo") or (f"P99 TTFT <= {_fmt(f.get('slo_ttft_p99_ms'), ',.0f')} ms"
                           if f.get("slo_ttft_p99_ms") is not None else "the instance's SLO")
    figure = figs.add(f"least cost against {axis} ({unit}), the SLO ({slo}) and the recommended point; hover a "
                      "point for its plan", src, plots.frontier_figure, f)
    titles = [f"point {k + 1}{' (recommended)' if k == rec else ''}: {p.get('fleet')}; {_fmt(p.get('pools'), 'd')} "
              f"pool{'' if p.get('pools') == 1 else 's'}, {_fmt(p.get('physical_gpus'), ',d')} GPUs, "
              f"US$ {_fmt(p.get('cost_per_hr'), ',.2f')}/hr, "
              f"{_fmt(p.get('power_kw'), ',.2f')} kW, worst P99 TTFT "
              f"{_fmt(p.get('worst_ttft_p99_ms'), ',.1f', 'unbounded')} ms, SLO "
              f"{'met' if p.get('slo_met') and not p.get('violations') else 'MISSED'}" for k, p in enumerate(pts)]
    out.append(hover_titles(figure, f"f{figs.count}-{plots.FRONTIER_POINTS_GID}", titles))
    axis_head = axis if unit == axis else f"{axis} {unit}"
    own_column = axis not in ("power", "pools", "ttft")   # those axes are the kW, pools and P99 columns
    rows = []
    for k, p in enumerate(pts):
        pools = "<br>".join(_e(x) for x in str(p.get("fleet") or "-").split(","))
        mark = ["recommended"] * (k == rec) + ["knee"] * (k == knee)
        ident = ' id="frontier-recommended"' if k == rec else ""
        rows.append(f'<td class="n"{ident}>{k + 1}</td><td><code>{pools}</code></td>' + _td(p.get("pools"), "d")
                    + _td(p.get("physical_gpus"), ",d") + _td(p.get("cost_per_hr"), ",.2f")
                    + _td(p.get("cost_per_year"), ",.0f") + _td(p.get("power_kw"), ",.2f")
                    + (_td(p.get("axis_value"), ",.1f") if own_column else "")
                    + _td(p.get("worst_ttft_p99_ms"), ",.1f", none="unbounded")
                    + _verdict(bool(p.get("slo_met")) and not p.get("violations"))
                    + f"<td><code>--set {_e(p.get('constraint', ''))}</code></td><td>{_e(', '.join(mark))}</td>")
    head = ["#", "pools (tokens:GPU x replicas)", "pools", "GPUs", "US$/hr", "US$/yr", "kW"]
    head += [axis_head] * own_column + ["worst P99 TTFT ms", "SLO", "solved with", ""]
    out.append("<h2>Every point's plan</h2>")
    out.append(_table(head, rows, f"{src}; GPUs: physical GPUs; SLO: {slo} and the instance's limits, re-judged "
                                  "at each plan's counts; solved with: fleetopt solve INSTANCE --set ... reproduces "
                                  "the point"))
    b = f.get("baseline")
    if b:
        out.append(f"<p>Homogeneous baseline (analytic): <code>{_e(b.get('fleet'))}</code>, "
                   f"{_e(_fmt(b.get('physical_gpus'), ',d'))} GPUs, US$ {_e(_fmt(b.get('cost_per_year'), ',.0f'))}/yr, "
                   f"{_e(_fmt(b.get('power_kw'), ',.2f'))} kW; "
                   f"{'dominated by the frontier' if f.get('baseline_dominated') else 'not dominated'}.</p>")
    return "".join(out)


def _whatif(w: Mapping, figs: _Figures, prov: list) -> str:
    from fleetopt.optimizer.workflows import plots

    src = str(w.get("source") or "analytic")
    prov.append(("What-if scenarios", src))
    paths = [s["path"] for s in w["sweeps"]]
    rows = []
    for r in w["scenarios"]:
        d = r.get("deltas") or {}
        rows.append("".join(f"<td>{_e(r['overrides'].get(p))}</td>" for p in paths) + f"<td>{_e(r.get('status'))}</td>"
                    + _td(r.get("cost_per_year"), ",.0f") + _td(d.get("cost_per_year"), "+,.0f")
                    + _td(r.get("total_replicas"), "d") + f"<td><code>{_e(r.get('fleet') or '-')}</code></td>"
                    + ("" if r.get("sim") is None else _verdict(r["sim"].get("slo_met"))))
    head = paths + ["status", "US$/yr", "delta US$/yr", "replicas", "fleet"]
    if any(r.get("sim") is not None for r in w["scenarios"]):
        head.append("sim SLO")
    base = w["base"]
    return (f"<p>Base (the --set overrides alone): <code>{_e(base.get('fleet') or '-')}</code>, US$ "
            f"{_e(_fmt(base.get('cost_per_year'), ',.0f'))}/yr.</p>" + _table(head, rows, src)
            + figs.add("least cost against the swept value (steps: the fleet changes)", src, plots.whatif_figure, w))


def _gridflex(g: Mapping, figs: _Figures, prov: list) -> str:
    from fleetopt.optimizer.workflows import plots

    srcs = g.get("source") or {}
    sim_src = (f"simulated event ({g.get('replications', '?')} replications, seed {g.get('seed', '?')}, "
               f"{_fmt(g.get('event_seconds'), 'g')} s events)")
    prov.append(("Demand response: power, analytic P99", f"{srcs.get('power_kw', 'analytic')}; "
                                                          f"{srcs.get('ttft_p99_ms_analytic', 'analytic')}"))
    prov.append(("Demand response: event P99", sim_src))
    rows = []
    for r in g["depths"]:
        ci = r.get("ttft_p99_ci_ms_event") or [None, None]
        rows.append(_td(r.get("depth"), "g") + _td(r.get("batch_cap"), "d") + _td(r.get("power_kw"), ",.2f")
                    + _td(r.get("ttft_p99_ms_analytic"), ",.1f", none="unbounded")
                    + _td(r.get("ttft_p99_ms_event"), ",.1f", none="unbounded")
                    + f'<td class="n">{_e(_fmt(ci[0], none="unbounded"))} - {_e(_fmt(ci[1], none="unbounded"))}</td>'
                    + _verdict(r.get("sustained_ok")) + _verdict(r.get("event_ok")))
    return (f"<p>Fleet <code>{_e(g['fleet'])}</code> at {_e(_fmt(g.get('arrival_rate'), 'g'))} req/s; max safe depth "
            f"sustained {_e(_fmt(g.get('max_safe_depth_sustained'), 'g', 'none'))} %, per event "
            f"{_e(_fmt(g.get('max_safe_depth_event'), 'g', 'none'))} %.</p>"
            + _table(["depth %", "batch cap", "kW", "P99 ms analytic", "P99 ms event", "event 95 % interval ms",
                      "sustained", "event"], rows, f"analytic columns: {srcs.get('power_kw', 'analytic')}; event "
                                                   f"columns: {sim_src}")
            + f'<p class="src">{_e(g.get("event_model", ""))}</p>'
            + figs.add("power and P99 TTFT against the curtailment depth", f"analytic and {sim_src}",
                       plots.gridflex_figure, g))


def _headroom(h: Mapping, figs: _Figures, prov: list) -> str:
    from fleetopt.optimizer.workflows import plots

    if h.get("command") == "headroom --range":
        src = str(h.get("source") or "analytic")
        prov.append(("Step schedule", src))
        rows = [_td(p.get("arrival_rate"), "g") + f"<td><code>{_e(p.get('fleet') or '-')}</code></td>"
                + _td(p.get("total_gpus"), "d") + _td(p.get("cost_per_year"), ",.0f")
                + _td(p.get("add_capacity_before"), "g") for p in h.get("plateaus") or []]
        return (_table(["from req/s", "fleet", "GPUs", "US$/yr", "add capacity before req/s"], rows, src)
                + figs.add("least cost against the arrival rate", src, plots.headroom_figure, h))
    src = f"analytic (ttft_model {h.get('ttft_model', '?')}, utilisation cap {h.get('max_utilization', '?')})"
    prov.append(("Headroom", src + ("; simulated bracket per pool with --verify" if h.get("sim") else "")))
    sims = (h.get("sim") or {}).get("pools") or []
    rows = []
    for k, p in enumerate(h["pools"]):
        q = sims[k] if k < len(sims) else {}
        rows.append(f"<td>{_e(_pool_name(p))}</td>" + _td(100 * _num(p.get("routing_share")), ".2f")
                    + _td(p.get("max_arrival_rate"), ",.2f", none="none") + f"<td>{_e(p.get('limited_by') or '-')}</td>"
                    + _td(q.get("max_arrival_rate_sim"), ",.0f") + _td(q.get("min_failing_rate_sim"), ",.0f"))
    return (f"<p>Max arrival rate (analytic) {_e(_fmt(h.get('max_arrival_rate'), ',.2f', 'none'))} req/s, binding pool "
            f"{_e(h.get('binding_pool') or '-')} ({_e(h.get('limited_by') or '-')}); now "
            f"{_e(_fmt(h.get('arrival_rate'), 'g'))} req/s.</p>"
            + _table(["pool", "share %", "max req/s", "limited by", "max req/s sim", "first miss sim"], rows, src)
            + figs.add("largest fleet arrival rate each pool carries", src, plots.headroom_figure, h))


def _tpw(t: Mapping, figs: _Figures, prov: list) -> str:
    from fleetopt.optimizer.workflows import plots

    src = "analytic (one replica, every KV slot of the window busy)"
    prov.append(("Tokens per watt", src))
    for q in sorted({str(r.get("quality", "")) for r in t["rows"]}):
        prov.append(("Profile quality", q))
    rows = [f"<td>{_e(r.get('profile', ''))}</td>" + _td(r.get("context"), ",d") + _td(r.get("n_slots"), ",d")
            + _td(r.get("tok_per_s"), ",.1f") + _td(r.get("power_w"), ",.1f") + _td(r.get("tok_per_watt"), ",.3f")
            + f'<td class="src">{_e(r.get("quality", ""))}</td>' for r in t["rows"]]
    return (_table(["profile", "context tokens", "KV slots", "tok/s", "power W", "tok/W", "profile quality"], rows, src)
            + figs.add("tokens per watt against the context window", src, plots.tpw_figure, t))


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------


_TITLES = {"solve": "fleet plan", "simulate": "simulation", "pareto --split-table": "two-pool split table",
           **{kind: f"least cost against {kind.rsplit(',', 1)[-1]} (Pareto frontier)" for kind in KINDS
              if kind.startswith("pareto --axes")},
           "whatif": "what-if sweep", "gridflex": "demand response", "headroom": "headroom",
           "headroom --range": "capacity steps", "tpw": "tokens per watt"}


def build_html(data: Mapping, *, sim: Mapping | None = None, source: str = "", sim_source: str = "--sim",
               inputs: Sequence[tuple[str, str]] = ()) -> str:
    """The report page of one result JSON (module docstring).

    Parameters
    ----------
    data : mapping
        A result JSON as a fleetopt command wrote it (:data:`KINDS`).
    sim : mapping, optional
        With a ``solve`` result: the ``simulate`` JSON of the same plan.
    source, sim_source : str
        Names of the inputs for error lines.
    inputs : sequence of (name, SHA-256 hex digest)
        The files the page was built from; the provenance table names each with its digest and the fleetopt
        version that wrote the page (:func:`fleetopt.optimizer.output.export.fleetopt_version`).

    Raises
    ------
    InstanceError
        An input that is no result fleetopt reports on, or a ``sim`` that is not the plan's simulation (one line).
    """
    kind = detect_kind(data, source)
    _check(data, kind, source)
    if sim is not None:
        if kind != "solve":
            raise InstanceError(f"{sim_source}: applies to a solve result; {source or 'the input'} is a {kind} result")
        if detect_kind(sim, sim_source) != "simulate":
            raise InstanceError(f"{sim_source}: command: {sim.get('command')!r}; expected a simulate result")
        _check(sim, "simulate", sim_source)
        why = same_plan(data, sim)
        if why:
            raise InstanceError(f"{sim_source}: pools: {why}")
    figs = _Figures(enabled=True)
    try:
        from fleetopt.optimizer.workflows.plots import require_matplotlib

        require_matplotlib("report")
    except InstanceError as err:
        figs.enabled, figs.missing_reason = False, str(err)
    prov: list[tuple[str, str]] = []
    if kind == "solve":
        body = _solve(data, sim, figs, prov)
    elif kind == "simulate":
        body = _simulate(data, figs, prov)
    elif kind == "pareto --split-table":
        body = _split_table(data, figs, prov)
    elif kind.startswith("pareto --axes"):
        body = _frontier(data, figs, prov)
    elif kind == "whatif":
        body = _whatif(data, figs, prov)
    elif kind == "gridflex":
        body = _gridflex(data, figs, prov)
    elif kind in ("headroom", "headroom --range"):
        body = _headroom(data, figs, prov)
    else:
        body = _tpw(data, figs, prov)
    name = data.get("instance") or "tpw"
    title = f"{name}: {_TITLES[kind]}"
    slo = data.get("slo_ttft_p99_ms")
    sub = [f"from <code>{_e(kind)}</code>"]
    if slo is not None:
        sub.append(f"P99 TTFT SLO {_e(_fmt(slo, ',.0f'))} ms")
    if data.get("ttft_margin") and data.get("ttft_sizing_ms") is not None:   # solve: sized to the SLO less a margin
        sub.append(f"pools sized to {_e(_fmt(data['ttft_sizing_ms'], ',.0f'))} ms (a "
                   f"{_e(_fmt(100 * data['ttft_margin'], 'g'))} % margin)")
    if data.get("ttft_model"):
        sub.append(f"ttft_model {_e(data['ttft_model'])}")
    if data.get("overrides"):
        sub.append("overrides " + ", ".join(f"<code>--set {_e(o)}</code>" for o in data["overrides"]))
    warnings = "".join(f'<p class="note">warning: {_e(w)}</p>' for w in data.get("warnings") or [])
    made = [("page written by", f"fleetopt {fleetopt_version()}")] if inputs else []
    made += [(f"input {name}", f"SHA-256 {digest}") for name, digest in inputs]
    prov_rows = [f"<td>{_e(what)}</td><td>{_e(src)}</td>" for what, src in prov + figs.sources + made]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
            f"<h1>{_e(title)}</h1><p class=\"src\">{'; '.join(sub)}</p>{warnings}{body}"
            "<h2>Provenance</h2>" + _table(["what", "source"], prov_rows,
                                           "where every number and figure of this page comes from")
            + '<p class="src">Written by fleetopt report from the JSON named above; self-contained: no script, '
              "font, image or style sheet is fetched.</p></body></html>\n")
