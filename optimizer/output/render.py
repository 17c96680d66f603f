"""Each result rendered for people: the fleet tables and notes, ``validate``'s summary, ``evaluate``, ``solve``
(verification, trim, the objective and the saving it claims), ``simulate``, ``gridflex``, ``tpw --rho-sweep`` and
``simulate --routers``, laid out by :mod:`fleetopt.optimizer.output.tables`.
"""

from __future__ import annotations

import math
import shlex
import textwrap
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.profiles import served_model
from fleetopt.models.service import ContextPoint
from fleetopt.models.units import P99_TAIL

from fleetopt.optimizer.output.figures import (fleet_output_tok_per_s, physical_gpus, pool_identity,
                                               usd_per_million_output_tokens)
from fleetopt.optimizer.plan.evaluate import fleet_spec, limit_violations
from fleetopt.optimizer.io.overrides import set_flags
from fleetopt.optimizer.output.documents import (ANALYTIC, dropped_summary, replica_units, simulated_pools,
                                                 solve_warnings)

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from fleetopt.optimizer.simulation.options import SimOptions

__all__ = ["answer_lines", "gpu_configuration", "render_answer", "render_solve_answer", "fleet_notes", "fleet_table",
           "fmt_ms", "fmt_usd_per_mtok", "headline", "margin_note", "objective_line", "dropped_lines",
           "render_evaluation", "render_fields", "render_gridflex", "render_rho_sweep", "render_routers",
           "render_simulation", "render_solve", "render_summary", "render_trim", "render_verification", "saving_claim",
           "semantic_lines", "sim_options_line", "tpw_table", "unit_lines", "util_text", "violations_lines"]


def fmt_ms(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:,.1f}"


def unit_lines(r: FleetResult, instance=None) -> list[str]:
    """What one replica of each GPU option of a fleet is, one entry per kind of replica, naming its options:
    ``h100: 1 replica = 8 physical GPUs (TP=8)``; the seeds' calibrated units are labelled ``seed_unit``."""
    per = replica_units(instance)
    by_text: dict[str, list[str]] = {}
    for p in r.pools:
        u = pool_identity(p, per.get(p.gpu))
        text = u["unit_note"] + (" (seed_unit)" if u["unit"] == "seed_unit" else "")
        names = by_text.setdefault(text, [])
        if p.gpu not in names:
            names.append(p.gpu)
    return [f"{', '.join(names)}: {text}" for text, names in by_text.items()]


def fmt_usd_per_mtok(x: float) -> str:
    """$ per million output tokens for a table: ``-`` without output (inf)."""
    return "-" if not math.isfinite(x) else f"{x:,.2f}"


def headline(r: FleetResult, instance=None) -> str:
    """A fleet's headline in physical GPUs: GPUs (and replicas), $/hr, $/yr, kW, tok/W and $ per million output
    tokens (:func:`fleetopt.optimizer.output.figures.usd_per_million_output_tokens`). A fleet with the seeds'
    calibrated units says how many units it prices (a unit: a TP=8 server priced and powered as one GPU).

    Examples
    --------
    >>> from types import SimpleNamespace as F
    >>> pool = F(gpu="h100", model="Llama-3.1-70B", replicas=2, gpus=16, output_tok_per_s=2000.0, profile="-")
    >>> fleet = F(pools=(pool,), total_replicas=2, total_gpus=16, cost_per_hr=64.32, cost_per_year=563_443.2,
    ...           power_kw=11.2, tok_per_watt=0.18)
    >>> headline(fleet)
    'fleet: 16 GPUs (2 replicas), $64.32/hr, $563,443/yr, 11.20 kW, 0.18 tok/W, $8.93 per million output tokens'
    """
    per = replica_units(instance)
    n = physical_gpus(r, per)
    seed = [p for p in r.pools if pool_identity(p, per.get(p.gpu))["unit"] == "seed_unit"]
    units = (f", {sum(int(p.replicas) for p in seed):,} of them seed units: calibrated TP=8 servers priced and "
             "powered as one GPU each") if seed else ""
    usd = usd_per_million_output_tokens(r.cost_per_hr, fleet_output_tok_per_s(r))
    return (f"fleet: {n:,} GPUs ({r.total_replicas:,} replicas{units}), ${r.cost_per_hr:,.2f}/hr, "
            f"${r.cost_per_year:,.0f}/yr, {r.power_kw:,.2f} kW, {r.tok_per_watt:.2f} tok/W, "
            + (f"${usd:,.2f} per million output tokens" if math.isfinite(usd)
               else "no $ per million output tokens (no steady output)"))


def fleet_table(title: str, r: FleetResult, slo_ms: float, source: str = ANALYTIC, instance=None) -> Table:
    """A fleet's pools and totals in physical GPUs, its headline (:func:`headline`) as the caption. Its title
    says what one replica of each GPU option is; ``GPUs`` counts physical GPUs; ``seed units`` (only when a pool
    runs the seeds' calibrated TP=8 units) the units priced and powered as one GPU each, which the limits count;
    ``model`` is the model each pool serves; ``$/Mtok``: $ per million output tokens."""
    per = replica_units(instance)
    seed = any(pool_identity(p, per.get(p.gpu))["unit"] == "seed_unit" for p in r.pools)
    t = Table(title=f"{title}  [P99 TTFT SLO {slo_ms:,.0f} ms]; " + "; ".join(unit_lines(r, instance)),
              title_justify="left", show_footer=True, caption=headline(r, instance), caption_justify="left")
    t.add_column("tokens", footer="fleet", no_wrap=True)
    t.add_column("gpu", footer="")
    t.add_column("model", footer="")
    t.add_column("replicas", justify="right", footer=f"{r.total_replicas:,}", no_wrap=True)
    t.add_column("GPUs", justify="right", footer=f"{physical_gpus(r, per):,}", no_wrap=True)
    if seed:
        t.add_column("seed units", justify="right", footer=f"{r.total_gpus:,}", no_wrap=True)
    pair = any(p.phase != "both" for p in r.pools)   # a disaggregated pair: its decode row repeats the rate
    if pair:
        t.add_column("phase", footer="")
    t.add_column("req/s", justify="right",
                 footer=f"{sum(p.arrival_rate for p in r.pools if p.phase != 'decode'):,.1f}")
    t.add_column("util", justify="right")
    t.add_column("P99 TTFT ms", justify="right", footer=fmt_ms(r.ttft_p99_ms))
    t.add_column("miss %", justify="right", footer=f"{100 * r.slo_miss_share:.2f}")
    t.add_column("kW", justify="right", footer=f"{r.power_kw:,.2f}")
    t.add_column("tok/W", justify="right", footer=f"{r.tok_per_watt:.2f}")
    t.add_column("$/hr", justify="right", footer=f"{r.cost_per_hr:,.2f}")
    t.add_column("$/Mtok", justify="right",
                 footer=fmt_usd_per_mtok(usd_per_million_output_tokens(r.cost_per_hr, fleet_output_tok_per_s(r))))
    t.add_column("SLO", footer=_slo_word(r.slo_met, all(p.utilization_ok for p in r.pools))
                 + (" (fleet)" if r.scope == "fleet" else ""))
    for p in r.pools:
        sized = "*" if p.sized else ""
        if r.scope == "fleet":
            status = "MISSED" if p.utilization >= 1 else "-" if p.utilization_ok else UTIL_CAP
        else:
            status = _slo_word(p.slo_met, p.utilization_ok)
        band = f" (+@{p.compress_gamma:g})" if p.compress_gamma > 1 else ""
        ident = pool_identity(p, per.get(p.gpu))
        units = [f"{p.gpus:,}" if ident["unit"] == "seed_unit" else "-"] if seed else []
        t.add_row(f"{p.min_tokens:,}-{p.max_tokens:,}{band}", p.gpu, served_model(p.model) or "unknown",
                  f"{p.replicas}{sized}", f"{ident['physical_gpus']:,}", *units, *([p.phase] if pair else []),
                  f"{p.arrival_rate:,.2f}", util_text(p), fmt_ms(p.ttft_p99_ms) if p.phase != "decode" else "-",
                  f"{100 * p.slo_miss_prob:.2f}", f"{p.power_w / 1000:,.2f}", f"{p.tok_per_watt:.2f}",
                  f"{p.cost_per_hr:,.2f}", fmt_usd_per_mtok(usd_per_million_output_tokens(p.cost_per_hr,
                                                                                         p.output_tok_per_s)),
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


MODEL_NAMES = {"batched": "TTFT model 'batched'", "tail": "TTFT model 'tail'",
               "mean-prefill": "TTFT model 'mean-prefill'"}
"""The short name of each TTFT model, for the provenance line (the description is :data:`MODEL_SOURCES`,
shown with ``--verbose``)."""

MODEL_SOURCES = {
    "batched": "TTFT model 'batched': continuous-batching replicas at their realised occupancy, a birth-death "
               "chain over the pool's requests with arrivals clustered by prefill stalls and unequal requests, a "
               "two-moment wait once every batch place is taken",
    "tail": "TTFT model 'tail': M/G/c per KV slot at full-batch iteration time, Erlang-C with Kimura tail",
    "mean-prefill": "TTFT model 'mean-prefill', the seeds' convention: M/G/c per KV slot, P99 wait + mean prefill",
}
"""What each TTFT model's analytic numbers rest on, for the provenance line under a table."""


def fleet_notes(r: FleetResult, ttft_model: str, verbose: bool = False) -> list[str]:
    """Provenance and caveat lines printed under a fleet table: the TTFT model by name (what it rests on with
    ``verbose``), the ``*`` legend only when a pool is marked with it."""
    model = (MODEL_SOURCES if verbose else MODEL_NAMES).get(ttft_model, f"TTFT model {ttft_model!r}")
    legend = "; * = sized to the minimum count" if any(p.sized for p in r.pools) else ""
    lines = [f"source: analytic ({model}){legend}"]
    if any(p.compress_gamma > 1 for p in r.pools):
        lines.append("  (+@g): the pool also serves requests up to g x its window, prompt-compressed to fit "
                     "(output kept), when compression succeeds")
    seen = {}
    for p in r.pools:
        seen.setdefault(p.gpu, (p.profile, p.model, p.quality))
    for gpu, (prof, model, q) in seen.items():
        lines.append(f"  {gpu}: profile {prof} serving {model}; {q}")
    if len({m for _, m, _ in seen.values()}) > 1:
        lines.append("  note: these pools serve different models: their cost and tok/W compare different models' "
                     "outputs")
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


def render_fields(c: Console, kinds: dict, schema_version: str) -> None:
    """``fleetopt schema --fields``: per document kind, its top-level contract fields
    (:func:`fleetopt.optimizer.output.contract.top_level_fields`)."""
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
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("profile", "left"), ("model", "left"), ("context", "right"), ("n_slots", "right"), ("iter ms", "right"),
        ("tok/s", "right"), ("power W", "right"), ("tok/W", "right"), ("quality", "left"))
    for name, just in columns:
        t.add_column(name, justify=just)
    for r in rows:
        t.add_row(r.profile, r.model, f"{r.context_tokens:,}", str(r.n_slots), f"{r.iter_latency_ms:.3f}",
                  f"{r.tok_per_s:,.1f}", f"{r.power_w:,.1f}", f"{r.tok_per_watt:.3f}", r.quality)
    return t


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


def render_evaluation(c: Console, report, *, verbose: bool = False) -> None:
    """Print an :class:`fleetopt.optimizer.api.EvaluationReport`: each fleet, the baseline and the saving, then
    the answer (:func:`answer_lines`: the cheapest given fleet that meets its SLO within the limits, else the
    first); ``verbose``: what the TTFT model rests on."""
    inst = report.instance
    slo_ms = inst.slo.ttft_p99_s * 1000.0
    for k, (text, r) in enumerate(report.fleets):
        c.print(fleet_table(f"fleet {text}", r, slo_ms, instance=inst))
        for line in fleet_notes(r, inst.slo.ttft_model, verbose):
            c.print(line, markup=False)
        for line in violations_lines(r, report.fleet_violations(k)):
            c.print(line, markup=False)
    b = report.baseline
    if b is not None:
        c.print(fleet_table("homogeneous baseline (cheapest single pool)", b, slo_ms, instance=inst))
        for line in fleet_notes(b, inst.slo.ttft_model, verbose)[1:]:
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
    if report.fleets:
        ok = [k for k, (_, r) in enumerate(report.fleets) if r.slo_met and r.feasible
              and not report.fleet_violations(k)]
        k = min(ok, key=lambda j: report.fleets[j][1].cost_per_hr) if ok else 0
        text, r = report.fleets[k]
        what = (f"fleet {k + 1} of {len(report.fleets)}" if len(report.fleets) > 1 else "the fleet") + (
            ", the cheapest that meets the SLO" if ok and len(report.fleets) > 1 else "")
        verdict = "met" if r.slo_met and r.feasible and not report.fleet_violations(k) else (
            "MISSED" if not r.slo_met else "met, but breaks a limit of the instance")
        spec = fleet_spec(inst, r) or text
        slo = f"P99 TTFT {slo_ms:,.0f} ms"
        where = shlex.quote(str(inst.path or inst.name))
        sim = "sim.json"
        nxt = [f"fleetopt simulate {where} --json {shlex.quote(sim)} \\", f"  --fleet {shlex.quote(spec)}",
               f"fleetopt report {shlex.quote(sim)} -o {shlex.quote(sim.rsplit('.', 1)[0] + '.html')}"]
        render_answer(c, answer_lines(inst, r, title=f"answer: {what} (evaluated analytically)",
                                      verdict=f"{slo}: {verdict} (analytic, fleet P99 {fmt_ms(r.ttft_p99_ms)} ms)",
                                      next_commands=nxt,
                                      width=c.width))


def render_verification(c: Console, v, slo_ms: float, instance=None) -> None:
    """Analytic vs simulated P99 per pool for every simulated plan, and the verdict."""
    t = Table(title=f"verification (rule {v.rule}): analytic vs simulated P99 TTFT, SLO {slo_ms:,.0f} ms",
              title_justify="left")
    for col in ("round", "plan", "$/hr", "pool", "replicas", "analytic ms", "simulated ms (95% CI)", "verdict"):
        t.add_column(col)
    for vp in v.plans:
        for k, (p, s) in enumerate(zip(vp.plan.fleet.pools, simulated_pools(vp))):
            sim_txt = "-" if s is None else (f"{s.ttft_p99_ms_sim:,.1f} ({s.ttft_p99_ci_ms[0]:,.1f}-"
                                             f"{s.ttft_p99_ci_ms[1]:,.1f})")
            phase = getattr(p, "phase", "both")     # a P/D pair's decode row is judged on its P99 TPOT
            if phase == "decode" and s is not None:
                sim_txt = f"TPOT {s.tpot_p99_ms_sim:,.1f} ({s.tpot_p99_ci_ms[0]:,.1f}-{s.tpot_p99_ci_ms[1]:,.1f})"
            key = (p.min_tokens, p.max_tokens, p.gpu)
            verdict = ("MISSES" if key in vp.failing_pools else "too few requests" if key in vp.thin_pools
                       else "undecided" if key in vp.undecided_pools else "ok")
            rank = f"{vp.rank} (judged before)" if vp.cached else str(vp.rank)
            t.add_row(str(vp.round) if k == 0 else "", rank if k == 0 else "",
                      f"{vp.plan.fleet.cost_per_hr:,.2f}" if k == 0 else "",
                      f"{p.min_tokens:,}-{p.max_tokens:,} {p.gpu}" + ("" if phase == "both" else f" {phase}"),
                      str(p.replicas), (f"TPOT {fmt_ms(p.tpot_p99_ms)}" if phase == "decode"   # P/D decode row
                                        else fmt_ms(p.ttft_p99_ms)), sim_txt, verdict)
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
        from fleetopt.optimizer.simulation.options import EngineOptions, SimOptions

        assert instance is not None         # the spec comes from the instance
        e, defaults = trim.sim.engine, EngineOptions().to_json()
        flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in e.to_json().items()
                        if v is not None and v != defaults.get(k))
        if trim.sim.options.replications != SimOptions().replications:
            flags += f" --replications {trim.sim.options.replications}"
        sets = set_flags(instance.overrides)
        c.print(f"check the trimmed plan: fleetopt simulate {shlex.quote(str(instance.path or instance.name))} "
                + (f"{sets} " if sets else "")
                + f"--fleet '{spec}'{flags} --requests {trim.sim.requests_simulated} "
                f"--seed {trim.confirmation.seed + 1}",
                soft_wrap=True, highlight=False)


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


def semantic_lines(sem) -> list[str]:
    """A semantic plan's rule, the large model's share it delivers, each class's totals and every candidate
    rule's outcome (:class:`fleetopt.optimizer.plan.semantic.SemanticPlan`), under its table."""
    floor = "" if sem.min_large_share is None else f" (at least {sem.min_large_share:.0%} asked)"
    out = [f"semantic routing: share {sem.share} of the requests to {sem.small_model}; {sem.large_share:.1%} reach "
           f"{sem.large_model}{floor}"]
    for k in sem.classes:
        out.append(f"  {k.role} ({k.model}): {k.rate_share:.1%} of requests ({k.arrival_rate:,.2f} req/s), "
                   f"{k.pools} pool{'s' * (k.pools != 1)}, {k.physical_gpus:,} GPUs, ${k.cost_per_hr:,.2f}/hr, "
                   f"{k.power_kw:,.2f} kW, {k.tok_per_watt:.2f} tok/W")
    if len(sem.tried) > 1 or sem.dropped:
        out.append("  shares tried: " + "; ".join(
            f"{t.label} -> " + (f"{t.objective:,.4g} ({t.status})" if t.objective is not None else t.status)
            for t in sem.tried) + "".join(f"; {d}: below the quality floor" for d in sem.dropped))
    return out


def dropped_lines(reasons) -> list[str]:
    """The dropped candidates in a few lines (``solve --verbose``): the total, then per GPU option how many and
    its most frequent reason, with an example (:func:`fleetopt.optimizer.output.documents.dropped_summary`, what
    the JSON's ``candidates`` holds)."""
    s = dropped_summary(reasons)
    if not s["dropped_total"]:
        return []
    lines = [f"dropped {s['dropped_total']:,} candidates (no replica count meets the SLO):"]
    for o in s["dropped_by_option"]:
        top = o["reasons"][0]
        lines.append(f"  {o['gpu']}: {o['dropped']:,} dropped, {top['count']:,} of them like {top['example']}")
    return lines


def _unsized_note(report) -> str:
    n = report.candidates_left_unsized
    return f" ({n} unsized: cheaper feasible candidates of their segment rule them out)" if n else ""


def render_solve(c: Console, report, verification=None, *, verbose: bool = False, json_path: str | None = None,
                 answer: bool = True) -> None:
    """Print a solve (and its verification): each plan's table and notes, the baseline, the verification, and
    last the answer block (:func:`render_solve_answer`; ``answer=False``: the caller prints it after more).
    ``verbose``: what the TTFT model rests on."""
    inst = report.instance
    slo_ms = inst.slo.ttft_p99_s * 1000.0
    gap = "-" if report.mip_gap is None else f"{report.mip_gap:.2%}"
    c.print(f"[bold]{inst.name}[/bold]: {report.status} ({report.method}, {report.solver}; gap {gap}; "
            f"{report.solve_seconds:.2f} s; candidates {report.candidates_generated} -> feasible "
            f"{report.candidates_feasible}{_unsized_note(report)} -> after pruning {report.candidates_after_pruning})")
    if verbose:
        for line in dropped_lines(report.dropped_reasons):
            c.print(line, markup=False)
    if not report.plans:
        c.print(f"no plan: {report.explanation}")
        if verification is not None:       # the cuts of a verification may be why: it says which and why
            render_verification(c, verification, slo_ms, inst)
        if answer:
            render_solve_answer(c, report, verification, json_path=json_path)
        return
    for plan in report.plans:
        c.print(fleet_table(f"plan {plan.rank}: {objective_line(inst, plan.objective, plan.fleet)}", plan.fleet,
                            slo_ms, instance=inst))
        for line in fleet_notes(plan.fleet, inst.slo.ttft_model, verbose):
            c.print(line.replace("source: analytic", f"selected by {report.method}; numbers analytic", 1),
                    markup=False)
        for line in semantic_lines(plan.semantic) if plan.semantic is not None else ():
            c.print(line, markup=False)
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
    elif report.best.semantic is not None:     # no --fleet spec holds the model classes: the JSON does
        c.print("semantic routing: check it in simulation with solve --verify-top N, or fleetopt simulate INSTANCE "
                "--plan FILE (the JSON of --json FILE)", markup=False)
    else:
        _check_line(c, inst, report)
    if answer:
        render_solve_answer(c, report, verification, json_path=json_path)


def _check_line(c: Console, inst, report) -> None:
    """The command that checks the chosen plan in simulation (one line, never wrapped: it is pasted)."""
    spec = fleet_spec(inst, report.best.fleet)
    flags = set_flags(inst.overrides)  # the overrides the plan was solved with: the command must carry them
    where = shlex.quote(str(inst.path or inst.name)) + (f" {flags}" if flags else "")
    if spec is not None:
        c.print(f"check it in simulation: fleetopt simulate {where} --fleet '{spec}'", soft_wrap=True,
                highlight=False)
    elif report.best.routing is not None:
        c.print(f"split routing: the JSON (--json FILE) holds each plan's req/s per length segment and pool; check it "
                f"in simulation: fleetopt simulate {where} --plan FILE", soft_wrap=True, highlight=False)


ANSWER_WIDTH = 80
"""The widest the answer block is laid out (a narrower console: narrower, its rows stacked)."""


def gpu_configuration(p: PoolResult, instance=None) -> str:
    """What a pool's replicas run: hardware, model, tensor parallelism and dtype (``A100-SXM-80GB
    Llama-3.1-70B TP8 fp16``) from its GPU option's profile; a calibrated profile without them: its name and
    the model it serves."""
    prof = None
    for g in getattr(instance, "gpus", ()) or ():
        if g.name == p.gpu:
            prof = g.profile
    hardware, tp, dtype = (getattr(prof, k, None) for k in ("hardware_name", "tp", "dtype"))
    model = served_model(p.model) or getattr(prof, "model_name", None) or "unknown model"
    if hardware and tp and dtype:
        return f"{hardware} {model} TP{tp} {dtype}"
    return f"{p.profile} {model}"


def answer_lines(instance, fleet: FleetResult, *, title: str, verdict: str, next_commands: list[str],
                 width: int = ANSWER_WIDTH) -> list[str]:
    """The answer in one compact block of at most :data:`ANSWER_WIDTH` columns: ``title``, one row per pool
    (tokens, phase of a P/D pair, GPU option, its configuration by :func:`gpu_configuration`, replicas, physical
    GPUs), the fleet's $/yr and $/hr, $ per million output tokens, kW, tok/W and physical GPUs, the SLO
    ``verdict`` (with its source), and ``next_commands``. A row wider than the block is stacked on two lines.

    Examples
    --------
    >>> from types import SimpleNamespace as F
    >>> pool = F(gpu="h100", model="Llama-3.1-70B", replicas=2, gpus=2, min_tokens=0, max_tokens=8192,
    ...          phase="both", profile="H100/70B", output_tok_per_s=2000.0)
    >>> fleet = F(pools=(pool,), total_replicas=2, cost_per_hr=64.32, cost_per_year=563_443.2, power_kw=11.2,
    ...           tok_per_watt=0.18, ttft_p99_ms=300.0)
    >>> print("\\n".join(answer_lines(None, fleet, title="answer", verdict="met", next_commands=["fleetopt x"])))
    answer
      tokens   gpu   configuration          replicas  GPUs
      0-8,192  h100  H100/70B Llama-3.1-70B        2     2
      $563,443/yr ($64.32/hr), $8.93/Mtok, 11.20 kW, 0.18 tok/W, 2 GPUs
      SLO met
      next: fleetopt x
    """
    width = min(width, ANSWER_WIDTH)
    per = replica_units(instance)
    rows = [(f"{p.min_tokens:,}-{p.max_tokens:,}" + ("" if getattr(p, "phase", "both") == "both" else f" {p.phase}"),
             p.gpu, gpu_configuration(p, instance), f"{int(p.replicas):,}",
             f"{pool_identity(p, per.get(p.gpu))['physical_gpus']:,}") for p in fleet.pools]
    head = ("tokens", "gpu", "configuration", "replicas", "GPUs")
    w = [max(len(r[k]) for r in [head, *rows]) for k in range(5)]

    def line(r) -> str:
        return (f"  {r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:>{w[3]}}  {r[4]:>{w[4]}}").rstrip()

    out = [title]
    if len(line(head)) <= width:
        out += [line(head)] + [line(r) for r in rows]
    else:                                   # narrow: each pool on two lines
        for r in rows:
            out += [f"  {r[0]}  {r[1]}  x{r[3]} = {r[4]} GPUs", f"    {r[2]}"]
    usd = usd_per_million_output_tokens(fleet.cost_per_hr, fleet_output_tok_per_s(fleet))
    mtok = f"${usd:,.2f}/Mtok" if math.isfinite(usd) else "no $/Mtok (no output)"
    out += textwrap.wrap(f"${fleet.cost_per_year:,.0f}/yr (${fleet.cost_per_hr:,.2f}/hr), {mtok}, "
                         f"{fleet.power_kw:,.2f} kW, {fleet.tok_per_watt:.2f} tok/W, "
                         f"{physical_gpus(fleet, per):,} GPUs", width, initial_indent="  ", subsequent_indent="    ")
    out += textwrap.wrap(f"SLO {verdict}", width, initial_indent="  ", subsequent_indent="    ")
    for k, cmd in enumerate(next_commands):
        out.append(("  next: " if k == 0 else "        ") + cmd)
    return out


def render_answer(c: Console, lines: list[str]) -> None:
    """Print the answer block (:func:`answer_lines`): a blank line, then its lines, none wrapped (the commands are
    pasted)."""
    c.print("", markup=False)
    for k, text in enumerate(lines):
        c.print(f"[bold]{text}[/bold]" if k == 0 and getattr(c, "format", "table") == "table" else text,
                markup=k == 0, soft_wrap=True, highlight=False)


def _next_commands(inst, json_path: str | None, plan_rank: int | None = None) -> list[str]:
    """``export`` and ``report`` of a solve's JSON: ``json_path`` when the run wrote one, else ``plan.json`` (add
    ``--json plan.json`` to the run)."""
    path = json_path if json_path not in (None, "-") else "plan.json"
    q = shlex.quote(path)
    flag = "" if plan_rank in (None, 1) else f" --plan {plan_rank}"
    first = [] if json_path not in (None, "-") else [f"add --json {q} to this command, then:"]
    return first + [f"fleetopt export {q}{flag} --format vllm   # or --format k8s",
                    f"fleetopt report {q} -o {shlex.quote(path.rsplit('.', 1)[0] + '.html')}"]


def render_solve_answer(c: Console, report, verification=None, *, json_path: str | None = None) -> None:
    """The last block of ``solve`` (and ``solve --verify-top``): the chosen plan, what it costs and draws, its SLO
    verdict and where that comes from (analytic, or the simulation with its interval), and the next commands;
    without a plan, one line saying so."""
    inst = report.instance
    slo = f"P99 TTFT {inst.slo.ttft_p99_s * 1000.0:,.0f} ms"
    if verification is not None:
        v = verification
        if v.chosen is None:
            render_answer(c, [f"answer: no plan met the SLO ({slo}) in simulation; see the verification above"])
            return
        fleet, rank = v.chosen.plan.fleet, v.chosen.rank
        sim = v.chosen.sim
        trimmed = v.trim is not None and v.trim.counts != v.trim.verified_counts and v.trim.confirmed
        if trimmed:     # the trimmed counts, judged by the independent seed's run (the one that decides)
            assert v.trim is not None       # trimmed says so
            fleet, sim = v.trim.sim.analytic, v.trim.confirmation
        low, high = sim.ttft_p99_ci_ms
        word = "met" if v.chosen.passed else "undecided (the interval straddles the SLO)"
        verdict = (f"{slo}: {word} (simulated, fleet P99 {fmt_ms(sim.ttft_p99_ms)} ms, 95% CI "
                   f"{fmt_ms(low)}-{fmt_ms(high)}; {sim.requests_simulated:,} requests, rule {v.rule})"
                   + ("; the trim's independent seed MISSED it (above)" if v.trim is not None
                      and not v.trim.confirmed else ""))
        title = (f"answer: plan {rank}, verified in simulation (round {v.chosen.round})"
                 + (", trimmed (independent seed)" if trimmed else ""))
        render_answer(c, answer_lines(inst, fleet, title=title, verdict=verdict,
                                      next_commands=_next_commands(inst, json_path, None), width=c.width))
        return
    if not report.plans:
        render_answer(c, [f"answer: no plan ({report.status}); see above"])
        return
    best = report.best
    verdict = (f"{slo}: " + ("met" if best.fleet.slo_met else "MISSED")
               + f" (analytic, fleet P99 {fmt_ms(best.fleet.ttft_p99_ms)} ms; --verify-top 3 simulates it)")
    title = f"answer: plan {best.rank} ({report.status}, {report.method})"
    render_answer(c, answer_lines(inst, best.fleet, title=title, verdict=verdict,
                                  next_commands=_next_commands(inst, json_path), width=c.width))


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
    cols = [("tokens", "fleet"), ("gpu", ""), ("repl.", str(a.total_replicas)), ("GPUs", f"{physical_gpus(a):,}"),
            ("util", ""), ("batch", ""),
            ("TTFT an", ms(a.ttft_p99_ms)), ("TTFT sim [95% CI]", ms(rep.ttft_p99_ms) + ci(rep.ttft_p99_ci_ms)),
            ("attain %", f"{100 * rep.slo_attainment:.2f}"), ("TPOT sim", ms(rep.tpot_p99_ms)),
            ("power W", f"{a.power_kw * 1000:,.0f} / {rep.power_kw * 1000:,.0f}"),
            ("SLO", "met" if rep.slo_met else "MISSED")]
    rows = []
    for p in rep.pools:
        q = p.analytic
        rows.append((f"{q.min_tokens:,}-{q.max_tokens:,}"
                     + (f" (+@{q.compress_gamma:g})" if q.compress_gamma > 1 else "")
                     + (f" {q.phase}" if getattr(q, "phase", "both") != "both" else ""),   # a P/D pair's phase
                     q.gpu, str(q.replicas), f"{pool_identity(q)['physical_gpus']:,}",
                     f"{q.utilization:.2f} / {p.utilization_sim:.2f}",
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
    _say(c, f"{headline(a)} (analytic; simulated draw {rep.power_kw:,.2f} kW)")
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
