"""``fleetopt profile``: serving profiles from measurements.

``fleetopt profile probe --hardware NAME --model NAME [-o DIR] [--resume]`` measures this machine's GPU into the
files that ``fit`` reads, writing each point as it is measured (:mod:`fleetopt.optimizer.profiling.probe`; the ``probe``
extra: PyTorch and a CUDA GPU).
``fleetopt profile fit MEASUREMENTS... [-o FILE] [--json FILE|-]`` reads decode and prefill CSVs and an optional
meta JSON (:mod:`fleetopt.optimizer.profiling.measurements`), fits the iteration-time and power coefficients
(:mod:`fleetopt.models.calibration`), prints every measured point next to the fit's prediction and writes the
profile YAML that instances name as ``gpus[i].profile_file``. Exit codes as for ``fleetopt``
(:mod:`fleetopt.optimizer.errors`): 2 for invalid measurement files.
"""

from __future__ import annotations

import datetime
import math

import click
from rich.console import Console, JustifyMethod
from rich.table import Table

from fleetopt.models.calibration import DEFAULT_MAX_REL_ERROR, ProfileFit
from fleetopt.models.power import ActivityPower

from fleetopt.optimizer.commands import guard as _guard
from fleetopt.optimizer.commands.progress import QUIET_HELP, reporter
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.profiling.measurements import (build_profile, fit_measurements, profile_document,
                                                       read_measurements, write_profile_file)
from fleetopt.optimizer.output.contract import envelope
from fleetopt.optimizer.profiling.probe import IDLE_SETTLE_S
from fleetopt.optimizer.output.writes import write_document
from fleetopt.optimizer.output.tables import console

__all__ = ["profile", "fit", "fit_report", "probe"]


def fit_report(fit: ProfileFit, document: dict) -> dict:
    """The ``--json`` document (:class:`fleetopt.optimizer.output.contract.workflows.ProfileFitDocument`): the
    envelope, the coefficients, every point, the summaries and the profile file's content."""
    it = fit.iteration
    points = []
    for p in fit.points:
        row = {"kind": p.kind, "phase": p.phase, "batch": p.batch}
        row.update({"context_tokens": p.context_tokens} if p.context_tokens is not None
                   else {"prompt_tokens": p.prompt_tokens})
        row.update({"measured": p.measured, "predicted": p.predicted, "rel_error": p.rel_error, "unit": p.unit})
        points.append(row)
    power = fit.power
    return {
        **envelope("profile fit", None),
        "coefficients": {"W_s": it.W_s, "h_s_per_token": it.h_s_per_token,
                         "H_s": it.h_s_per_token * document["latency"]["calibration_ctx_tokens"],
                         "calibration_ctx_tokens": document["latency"]["calibration_ctx_tokens"],
                         "g_s": it.g_s, "prefill_a_s": it.prefill_a_s, "prefill_b_s": it.prefill_b_s},
        "power": None if power is None else {"form": "activity", "idle_w": power.idle_w, "limit_w": power.limit_w,
                                             "weights_w": power.weights_w, "kv_w": power.kv_w,
                                             "compute_w": power.compute_w, "quality": power.quality},
        "fit": {"max_rel_error": it.max_rel_error, "chebyshev_rel_error": it.chebyshev_rel_error,
                "tolerance_met": it.tolerance_met},
        "summary": {s.kind: {"points": s.points, "median_abs_rel_error": s.median_abs_rel_error,
                             "worst_abs_rel_error": s.worst_abs_rel_error} for s in fit.summaries},
        "points": points,
        "profile": document,
    }


def _render(c: Console, fit: ProfileFit, document: dict) -> None:
    it, sources = fit.iteration, ", ".join(s["file"] for s in document["provenance"]["sources"])
    c.print(f"[bold]{document['name']}[/bold]: fitted to {sources}")
    c.print(f"  iteration time: W = {it.W_s * 1e3:.4f} ms, h = {it.h_s_per_token:.4g} s per KV token "
            f"(H = {document['latency']['H_s'] * 1e3:.4f} ms at {document['latency']['calibration_ctx_tokens']:,}), "
            f"g = {it.g_s * 1e6:.3f} us per sequence, a = {it.prefill_a_s * 1e6:.3f} us per prompt token, "
            f"b = {it.prefill_b_s:.4g} s per token^2")
    c.print(f"  fit: worst relative error of the Chebyshev fit {it.chebyshev_rel_error:.2%}; tolerance "
            f"{it.max_rel_error:.0%} " + ("met (least squares within it)" if it.tolerance_met
                                          else "NOT met: the Chebyshev fit is used"))
    power = fit.power
    if isinstance(power, ActivityPower):
        c.print(f"  power (fit to the power_w cells): idle {power.idle_w:.1f} W, limit {power.limit_w:.1f} W, "
                f"weights {power.weights_w:.1f} W, KV {power.kv_w:.1f} W, compute {power.compute_w:.1f} W")
    else:
        c.print(f"  power: not fitted (too few power_w cells); the profile uses the catalogue curve "
                f"({document['power']['quality']})")
    t = Table(title="measured (median) vs fitted, per point", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("kind", "left"), ("phase", "left"), ("batch", "right"), ("context", "right"), ("prompt", "right"),
        ("measured", "right"), ("predicted", "right"), ("error", "right"))
    for name, just in columns:
        t.add_column(name, justify=just)
    for p in fit.points:
        scale, unit = (1e3, "ms") if p.unit == "s" else (1.0, "W")
        t.add_row(p.kind, p.phase, str(p.batch), "" if p.context_tokens is None else f"{p.context_tokens:,}",
                  "" if p.prompt_tokens is None else f"{p.prompt_tokens:,}", f"{p.measured * scale:,.3f} {unit}",
                  f"{p.predicted * scale:,.3f} {unit}", f"{p.rel_error:+.1%}")
    c.print(t)
    s = Table(title="fit quality per kind (absolute relative error)", title_justify="left")
    for name in ("kind", "points", "median", "worst"):
        s.add_column(name, justify="left" if name == "kind" else "right")
    for k in fit.summaries:
        s.add_row(k.kind, str(k.points), f"{k.median_abs_rel_error:.2%}", f"{k.worst_abs_rel_error:.2%}")
    c.print(s)


class _FiniteRange(click.FloatRange):
    """``click.FloatRange`` that also refuses nan, which passes every range check (its comparisons are all
    false): a usage error naming the flag, exit 2, as for a number out of range."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number", param, ctx)
        return number


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def profile():
    """Serving profiles from measurements."""


@profile.command()
@click.argument("measurements", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("-o", "--output", "output", metavar="FILE", help="Write the fitted profile YAML here (atomically).")
@click.option("--json", "json_out", metavar="FILE", help="Also write the fit as JSON ('-' = stdout).")
@click.option("--max-rel-error", type=_FiniteRange(0.0, 1.0, min_open=True), default=DEFAULT_MAX_REL_ERROR,
              show_default=True, help="Tolerance of the time fit: every point within it when any fit can be.")
@click.option("--chunk-tokens", type=click.IntRange(1), help="Prefill chunk (default: vLLM's max_num_batched_tokens).")
@click.option("--max-slots", type=click.IntRange(1), help="Sequence cap (default: vLLM's max_num_seqs).")
@click.option("--name", help="Profile name (default HARDWARE_MODEL_tpN).")
@_guard
def fit(measurements, output, json_out, max_rel_error, chunk_tokens, max_slots, name):
    """Fit a serving profile to MEASUREMENTS (decode CSV, prefill CSV, meta JSON)."""
    measured = read_measurements(measurements)
    try:
        result = fit_measurements(measured, max_rel_error)
        built = build_profile(measured, result, chunk_tokens=chunk_tokens, max_slots=max_slots, name=name)
    except (ValueError, ZeroDivisionError, OverflowError, FloatingPointError) as err:
        # measurements that read but fit no physical profile (a zero prefill cost, a degenerate grid)
        raise InstanceError(f"{measurements[0]}: the measurements fit no usable profile: "
                            f"{' '.join(str(err).split())}; check the measured times") from None
    document = profile_document(measured, result, built, datetime.date.today().isoformat())
    if json_out != "-":
        _render(console(), result, document)
    if output:
        write_profile_file(document, output, protect=measurements)
    if json_out:
        write_document(fit_report(result, document), json_out, protect=tuple(measurements))


@profile.command()
@click.option("--hardware", required=True, metavar="NAME",
              help="Catalogue name of the GPU measured (e.g. H100-SXM-80GB).")
@click.option("--model", required=True, metavar="NAME", help="Catalogue model whose shape the decoder takes (dense).")
@click.option("--dtype", type=click.Choice(["bf16", "fp16"]), default="bf16", show_default=True)
@click.option("--tp", type=int, default=1, show_default=True,
              help="Tensor parallelism: the probe measures one GPU (1).")
@click.option("-o", "--output-dir", "folder", default=".", show_default=True, metavar="DIR",
              help="Folder for the decode CSV, prefill CSV and meta JSON (existing files are not overwritten; see "
                   "--resume).")
@click.option("--max-context", type=click.IntRange(1), help="Largest context and prompt (default: the model's window).")
@click.option("--no-power", is_flag=True, help="Skip the energy-counter windows (about 3 s per point).")
@click.option("--idle-settle-s", type=_FiniteRange(0.0, 600.0), default=IDLE_SETTLE_S, show_default=True,
              metavar="S", help="Quiet time before the idle power window, which comes before any point.")
@click.option("--resume", is_flag=True,
              help="Finish a broken run: keep the points in the files of -o and measure only the missing ones "
                   "(same settings; without files, a new run).")
@click.option("--quiet", is_flag=True, help=QUIET_HELP)
@_guard
def probe(hardware, model, dtype, tp, folder, max_context, no_power, idle_settle_s, resume, quiet):
    """Measure this machine's GPU for `profile fit` (needs the probe extra: PyTorch, a CUDA GPU).

    Times a model-shaped decoder with random weights as the shipped measurements were: decode iterations over
    batch x context, whole-prompt prefills, and board power from the NVML energy counter
    (fleetopt.optimizer.profiling.probe has the protocol).
    """
    from fleetopt.optimizer.profiling.probe import ProbeSettings, measure

    def gpu(shape, dtype_name):
        from fleetopt.optimizer.profiling.probe_torch import open_backend     # needs PyTorch: loaded only here

        return open_backend(shape, dtype_name)

    def warn(line: str) -> None:
        click.echo(f"warning: {line}", err=True)

    settings = ProbeSettings(hardware, model, dtype, tp, power=not no_power, max_context=max_context,
                             idle_settle_s=idle_settle_s)
    with reporter(quiet) as rep:
        result, paths = measure(settings, folder, gpu, on_step=rep.step, warn=warn, resume=resume)
    c = console()
    c.print(f"{result.settings.hardware} / {result.settings.model}: {len(result.decode)} decode and "
            f"{len(result.prefill)} prefill points measured (medians); wrote {', '.join(map(str, paths))}",
            markup=False)
    c.print(f"next: fleetopt profile fit {' '.join(map(str, paths))} -o {paths[0].parent / 'profile.yaml'}",
            markup=False)
