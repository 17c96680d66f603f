"""The ``fleetopt`` command: a thin layer over :mod:`fleetopt.optimizer.api`.

Exit codes: 0 success, 2 invalid input, 3 infeasible, 4 time or iteration limit
without a plan, 5 the evaluated or simulated fleet misses its SLO (``evaluate``,
``simulate``), 6 the given fleet meets its SLO but breaks a limit of the
instance (``evaluate``, ``headroom --fleet``), 130 interrupted (Ctrl-C, any
command), 141 the reader closed the output pipe early (``| head``: the command
stops quietly, as a Unix tool killed by SIGPIPE), 1 internal or solver error
(:mod:`fleetopt.optimizer.errors`, README).

Every command takes ``--format table|plain|markdown|csv``
(:data:`fleetopt.optimizer.output.tables.FORMATS`); ``table`` never shortens a cell: a
table wider than the terminal is printed in column groups, or stacked.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys

import click

from fleetopt.optimizer.commands import (CONTEXT_SETTINGS, OUTPUT_PARAMS, catalog_option, check_outputs, format_option,
                                         guard, output)
from fleetopt.optimizer.errors import EXIT_CODES, InstanceError
from fleetopt.optimizer.io.files import input_scope
from fleetopt.optimizer.output.writes import write_document, write_json
# the flags' names alone: SimOptions (numpy, the simulator's records) loads in the commands that simulate
from fleetopt.optimizer.simulation import DEFAULT_SPILL_BOUND, DISPATCHES

_json_opt = click.option("--json", "json_out", metavar="FILE", help="Also write the result as JSON ('-' = stdout).")
_set_opt = click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
                        help="Override an instance field, e.g. constraints.max_utilization=0.8 (repeatable).")
_instance_arg = click.argument("instance", type=click.Path(dir_okay=False))
_SIMULATE_FLAGS = {"requests": "--requests", "replications": "--replications", "seed": "--seed", "mode": "--mode",
                   "router": "--router", "dispatch": "--dispatch", "arrivals": "--arrivals",
                   "peak_to_mean": "--peak-to-mean", "spill_bound": "--spill-bound", "precision": "--precision",
                   "max_requests": "--max-requests", "engine.kv": "--kv", "engine.max_num_seqs": "--max-num-seqs",
                   "engine.max_batched_tokens": "--max-batched-tokens", "engine.availability": "--availability"}
"""``simulate``: the flag of each :class:`SimOptions` field it sets."""
_VERIFY_FLAGS = {"requests": "--sim-requests", "replications": "--sim-replications", "seed": "--seed",
                 "engine.kv": "--sim-kv", "engine.availability": "--sim-availability"}
"""``solve --verify-top``: the flag of each :class:`SimOptions` field it sets."""


class _Lazy:
    """A module imported on first use: start-up and ``--help`` do not pay for the pipeline (``api`` loads the
    performance models, ``report`` rich's tables and the evaluation)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        import importlib

        return getattr(importlib.import_module(self._name), attr)


api = _Lazy("fleetopt.optimizer.api")
documents = _Lazy("fleetopt.optimizer.output.documents")
rendering = _Lazy("fleetopt.optimizer.output.render")
contract = _Lazy("fleetopt.optimizer.output.contract")


def _inputs(inst, *files) -> tuple:
    """The files a run reads, which ``--json`` never writes over: the instance, its workload file (not a
    ``builtin:``) and ``files`` (e.g. ``--plan``)."""
    source = inst.workload.source
    read = (inst.path, None if source.startswith("builtin:") else source, *files)
    return tuple(f for f in read if f is not None)


def _emit(table_fn, data: dict | None, json_out: str | None, protect=(), fmt: str = "table") -> None:
    """Print the table unless the JSON goes to stdout; write ``data`` (a document of the contract,
    :mod:`fleetopt.optimizer.output.contract`, checked against its model) atomically to ``json_out``, never over
    a file in ``protect``."""
    if json_out != "-":
        table_fn(output(fmt))
    if json_out:
        assert data is not None, "a command that writes JSON builds its document"
        write_document(data, json_out, protect)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that nothing more (Python's flush at exit included) fails on a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass  # not a file descriptor (a test runner's buffer): nothing to protect


def _outputs_checked(callback):
    """``callback`` run after :func:`fleetopt.optimizer.commands.check_outputs` (a refusal: one line, exit 2)."""

    @guard
    def checked(*args, **kwargs):
        check_outputs(click.get_current_context())
        return callback(*args, **kwargs)

    checked._checked = True
    return checked


PROCESS_GC_THRESHOLD = 10_000
"""Allocations between two young-generation collections in a ``fleetopt`` process (Python's default: 700). Start-up
creates a few hundred thousand objects that live as long as the process (modules, classes, pydantic and click
schemas) and almost no cyclic garbage, so at the default the collector ran about 200 times during a small solve,
its older generations 18 times, for about 0.07 s CPU of 0.9 s and nothing found; a command's own cyclic garbage
waits for at most this many allocations."""


PROCESS_BLAS_THREADS = "1"
"""``OPENBLAS_NUM_THREADS`` of a ``fleetopt`` process unless the environment sets it (to a non-empty value). NumPy
and SciPy each load an OpenBLAS that starts a worker thread per further core at import; the workers spin, waiting
for work, for about 0.1 s each (on 2 cores a small solve used 0.64 s CPU for 0.49 s of wall time; 0.48 s with one
thread, wall 0.97 of it, paired). fleetopt's arrays are elementwise and small-matrix work that a single thread
does, and its parallel work runs on forked workers, one per core (:mod:`fleetopt.optimizer.forked`), that the
spinning threads would compete with. Processes it starts (a Dask cluster's workers) inherit it."""


def _freeze_at_exit() -> None:
    """At interpreter exit, move every object to the collector's permanent generation (:func:`gc.freeze`): the
    interpreter's finalization otherwise runs full collections over the whole heap (about 0.1 s CPU after a small
    solve) whose memory the operating system takes back anyway. The other atexit handlers, the flushing of the
    standard streams and the deallocation of what module teardown releases still run; only garbage held in
    reference cycles is left unfinalized (every file fleetopt writes is closed by then)."""
    gc.freeze()


class _Commands(click.Group):
    """The command group; a reader that closes the pipe early (``fleetopt solve ... | head -1``) ends the command
    quietly with exit code 141 (``broken_pipe``: 128 + SIGPIPE, what a shell reports for a Unix tool the closed
    pipe stopped), not with a traceback or error text. The commands of :mod:`fleetopt.optimizer.commands` load on
    first use (:data:`LAZY`), so start-up and ``--help`` do not pay for the workflow and profile-fitting pipelines."""

    LAZY = {"profile": ("fleetopt.optimizer.commands.profile", "profile", "Serving profiles from measurements."),
            "pareto": ("fleetopt.optimizer.commands.workflows", "pareto",
                       "Cost against latency over split boundaries (--split-table)."),
            "headroom": ("fleetopt.optimizer.commands.workflows", "headroom",
                         "The largest arrival rate a fleet carries within its SLO."),
            "whatif": ("fleetopt.optimizer.commands.whatif", "whatif",
                       "Solve a grid of scenarios (--sweep PATH=v1,v2,...) and show what changes."),
            "gridflex": ("fleetopt.optimizer.commands.gridflex", "gridflex",
                         "Demand response: the deepest safe power curtailment, sustained and per event."),
            "export": ("fleetopt.optimizer.commands.export", "export",
                       "Deployment files from a solve's JSON: vLLM command lines or Kubernetes manifests."),
            "catalog": ("fleetopt.optimizer.commands.catalog", "catalog",
                        "What the catalogue holds: GPUs, models and profiles, with provenance."),
            "report": ("fleetopt.optimizer.commands.report_html", "report",
                       "A self-contained HTML page of a result: plan, plots, provenance."),
            "diff": ("fleetopt.optimizer.commands.diff", "diff",
                     "What changes between two plans: pools, GPUs to buy or release, cost, power, SLO.")}

    def add_command(self, cmd, name=None):
        """Every command that loads an instance (it takes ``--set``) also takes ``--catalog FILE``
        (:func:`fleetopt.optimizer.commands.catalog_option`): user catalogue files for its names. Every command
        checks its output files before its work (:func:`fleetopt.optimizer.commands.check_outputs`)."""
        names = {p.name for p in cmd.params}
        if "overrides" in names and "catalog_files" not in names:
            cmd.params.append(catalog_option())
        if cmd.callback is not None and names & set(OUTPUT_PARAMS) and not getattr(cmd.callback, "_checked", False):
            cmd.callback = _outputs_checked(cmd.callback)
        super().add_command(cmd, name)

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            import importlib

            module, attr, _ = self.LAZY[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def format_commands(self, ctx, formatter):
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, self.LAZY[n][2] if n in self.LAZY and n not in self.commands
                 else self.commands[n].get_short_help_str(limit)) for n in names
                if n in self.LAZY or not self.commands[n].hidden]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _silence_stdout()
            raise click.exceptions.Exit(EXIT_CODES["broken_pipe"]) from None
        except KeyboardInterrupt:  # Ctrl-C / SIGINT: the documented 130 (128 + SIGINT), not click's "Aborted!" 1
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(EXIT_CODES["interrupted"]) from None

    def main(self, *args, **kwargs):
        """The command, run; as the process itself (the ``fleetopt`` script calls this without arguments; a test
        runner or a caller passes them) with the garbage collector tuned for a short run (:data:`PROCESS_GC_THRESHOLD`
        and :func:`_freeze_at_exit`) and one BLAS thread (:data:`PROCESS_BLAS_THREADS`)."""
        process = not args and not kwargs
        before = gc.get_threshold()
        if process:
            if not os.environ.get("OPENBLAS_NUM_THREADS"):     # unset or empty (OpenBLAS's default), before numpy
                os.environ["OPENBLAS_NUM_THREADS"] = PROCESS_BLAS_THREADS
            gc.set_threshold(PROCESS_GC_THRESHOLD, *before[1:])
            atexit.register(_freeze_at_exit)
        try:
            return super().main(*args, **kwargs)
        except SystemExit as done:
            try:  # output still buffered for a pipe is written here: the pipe may be closed by now
                sys.stdout.flush()
            except BrokenPipeError:
                _silence_stdout()
                raise SystemExit(EXIT_CODES["broken_pipe"]) from None
            except (OSError, ValueError):
                pass
            raise done
        finally:
            gc.set_threshold(*before)


@click.group(cls=_Commands, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="fleetopt")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Plan GPU fleets for LLM inference: pools, context splits, GPU types and replica counts."""
    # every file the command reads is recorded, and no output of it is written over one (io.files.input_scope)
    ctx.with_resource(input_scope())


@main.command()
@_instance_arg
@_set_opt
@_json_opt
@format_option
@guard
def validate(instance, overrides, json_out, fmt):
    """Check INSTANCE and summarize what it asks for."""
    inst = api.load(instance, overrides)
    summary = api.summarize_instance(inst)
    _emit(lambda c: rendering.render_summary(c, summary), contract.with_envelope(summary, "validate", inst.name),
          json_out, _inputs(inst), fmt)


@main.command()
@_instance_arg
@click.option("--fleet", "fleets", multiple=True, required=True, metavar="SPEC",
              help="Pools as LO-HI:GPU[xN],... e.g. '0-4096:a100x3,4096-65536:a100' (repeatable to compare).")
@click.option("--verbose", is_flag=True, help="Also say what the TTFT model rests on.")
@_set_opt
@_json_opt
@format_option
@guard
def evaluate(instance, fleets, verbose, overrides, json_out, fmt):
    """Evaluate given fleets analytically, next to the homogeneous baseline.

    Exits 5 when a fleet misses its SLO, 6 when one meets it but breaks a limit of the instance."""
    inst = api.load(instance, overrides)
    result = api.evaluate_report(inst, fleets)
    _emit(lambda c: rendering.render_evaluation(c, result, verbose=verbose), result.to_json(), json_out,
          _inputs(inst), fmt)
    raise click.exceptions.Exit(api.evaluation_exit_code(result))


@main.command()
@_instance_arg
@click.option("--top", type=click.IntRange(1, 100), default=1, show_default=True,
              help="Return the N best distinct fleets.")
@click.option("--max-pools", type=click.IntRange(1, 64), help="Override pools.max_pools.")
@click.option("--objective", type=click.Choice(["cost", "power", "tok_per_watt", "cost+power"]),
              help="Override the objective (cost+power needs an energy section).")
@click.option("--time-limit", type=click.FloatRange(0, min_open=True), metavar="SECONDS", help="Solver time limit.")
@click.option("--mip-gap", type=click.FloatRange(0, 1), default=0.0, show_default=True, help="Relative MIP gap.")
@click.option("--threads", type=click.IntRange(1, 256), help="Solver threads.")
@click.option("--method", type=click.Choice(["auto", "mip", "oracle"]), default="auto", show_default=True,
              help="auto: exact graph oracle when only the tiling binds, else the MIP.")
@click.option("--verbose", is_flag=True, help="Show the HiGHS log and what the TTFT model rests on.")
@click.option("--verify-top", type=click.IntRange(1, 20), help="Simulate the N best plans; keep the cheapest that "
              "meets the SLO in simulation (cut and re-solve otherwise).")
@click.option("--verify-rule", type=click.Choice(["ci-upper", "point", "attainment"]), default="ci-upper",
              show_default=True, help="What 'meets the SLO in simulation' means.")
@click.option("--max-rounds", type=click.IntRange(1, 20), default=3, show_default=True, help="Verification rounds.")
@click.option("--verify-cuts", type=click.Choice(["pool", "count", "window"]), default="pool", show_default=True,
              help="How a failing pool is cut: pool sizes it alone by simulation to its least passing count "
              "(length routing; split routing gets count cuts); count raises its count by 10 %; window also "
              "raises every pool with its window and a lower start on its GPU.")
@click.option("--trim", is_flag=True, help="After --verify-top: lower the chosen plan's replica counts while its "
              "simulation still meets the SLO (confirmed with an independent seed).")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Simulation seed.")
@click.option("--sim-requests", type=click.IntRange(1000), default=100_000, show_default=True,
              help="Requests simulated per plan when verifying (over all replications).")
@click.option("--sim-replications", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Independent replications per simulated plan when verifying (1: batch means).")
@click.option("--sim-kv", type=click.Choice(["reserve", "paged"]), default="reserve", show_default=True,
              help="KV admission when verifying (see simulate --kv).")
@click.option("--sim-availability", type=click.Choice(["all-up", "sampled"]), default="all-up", show_default=True,
              help="Replica availability when verifying (see simulate --availability).")
@click.option("--explain", is_flag=True, help="Also say which limits bind and what relaxing each is worth (optimal "
              "re-solves), and each pool's bottleneck and headroom (analytic).")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="--verify-top: local processes to simulate a round's plans on, side by side (same results).")
@click.option("--scheduler", metavar="ADDRESS", help="--verify-top: simulate a round's plans on the Dask cluster at "
              "ADDRESS (tcp://HOST:8786; needs pip install 'fleetopt[scale]').")
@click.option("--quiet", is_flag=True, help="No progress of --verify-top rounds and --trim trials on stderr (by "
              "default: a status line on a terminal, else one line per step).")
@_set_opt
@_json_opt
@format_option
@guard
def solve(instance, top, max_pools, objective, time_limit, mip_gap, threads, method, verbose, verify_top, verify_rule,
          max_rounds, verify_cuts, trim, seed, sim_requests, sim_replications, sim_kv, sim_availability, explain,
          workers, scheduler, quiet, overrides, json_out, fmt):
    """Find the cheapest (or least-power) fleet: pools, splits, GPU types and replica counts."""
    if (workers != 1 or scheduler is not None) and not verify_top:
        raise InstanceError("--workers / --scheduler: simulate the plans of --verify-top; give --verify-top")
    extra = [f"pools.max_pools={max_pools}"] * (max_pools is not None) + [f"objective={objective}"] * bool(objective)
    inst = api.load(instance, list(overrides) + extra)
    # the HiGHS log goes to stderr when stdout carries the JSON
    tee = [sys.stderr] if (verbose and json_out == "-") else verbose
    kwargs = dict(time_limit_s=time_limit, mip_gap=mip_gap, threads=threads, method=method, verbose=tee)
    if verify_top:
        from fleetopt.optimizer.commands.sim_flags import sim_options
        from fleetopt.optimizer.simulation.options import EngineOptions

        sim = sim_options(_VERIFY_FLAGS, requests=sim_requests, replications=sim_replications, seed=seed,
                          engine=EngineOptions(kv=sim_kv, availability=sim_availability))
        from fleetopt.optimizer.commands.progress import reporter

        with reporter(quiet, closes=True, first="verify round 1: solve 1") as shown:   # each step closed
            rep, ver = api.verify(inst, sim, verify_top=verify_top, rule=verify_rule, max_rounds=max_rounds,
                                  cuts=verify_cuts, trim=trim, progress=shown.requests, on_step=shown.step,
                                  workers=workers, scheduler=scheduler, **kwargs)
    else:
        if trim:
            raise InstanceError("--trim: trims the plan --verify-top N chose; give --verify-top")
        rep, ver = api.solve(inst, top=top, **kwargs), None
    # the document only where it is written (the tables need none of the contract's models)
    doc = documents.solve_json(rep, ver) if json_out else None
    shown = dict(verbose=verbose, json_path=json_out)
    render = lambda c: rendering.render_solve(c, rep, ver, **shown)  # noqa: E731
    if explain and rep.plans:
        from fleetopt.optimizer.commands.explain_render import explain_with_headroom, render_explanation

        why = explain_with_headroom(inst, rep)
        if doc is not None:
            doc["explain"] = why.to_json()
        render = lambda c: (rendering.render_solve(c, rep, ver, answer=False, **shown),  # noqa: E731
                            render_explanation(c, why), rendering.render_solve_answer(c, rep, ver, json_path=json_out))
    _emit(render, doc, json_out, _inputs(inst), fmt)
    raise click.exceptions.Exit(api.exit_code(rep, ver))  # no (verified) plan: its code (the report explains it)


@main.command()
@click.argument("instance", required=False, type=click.Path(dir_okay=False))
@click.option("--profile", "profiles", metavar="NAMES", help="Calibrated profiles, comma-separated (e.g. H100-80GB).")
@click.option("--hardware", metavar="NAME", help="Hardware for computed profiles (e.g. H100-SXM-80GB).")
@click.option("--models", metavar="NAMES", help="LLMs for computed profiles, comma-separated.")
@click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help="Tensor parallelism.")
@click.option("--dtype", type=click.Choice(["fp16", "bf16", "fp8", "int4"]), default="fp16", show_default=True)
@click.option("--kv-layout", type=click.Choice(["sharded", "replicated"]), default="sharded", show_default=True,
              help="KV cache split across TP ranks (vLLM) or whole on every GPU (the 1/W paper's Tables 2 and 5).")
@click.option("--contexts", "--context", "contexts", default="2048,4096,8192,16384,32768,65536,131072",
              show_default=True, metavar="TOKENS", help="Context windows, comma-separated.")
@click.option("--fleet", metavar="SPEC", help="With INSTANCE and --rho-sweep: the fleet, LO-HI:GPU[xN],...")
@click.option("--rho-sweep", is_flag=True, help="With INSTANCE --fleet: tok/W and $/Mtok of each pool and the fleet "
              "against utilisation (each pool brought to rho by scaling the arrival rate; analytic).")
@click.option("--rho", "rhos", metavar="R1,R2,...", help="--rho-sweep: utilisations in (0, 1) [default: 0.1,...,0.9].")
@_set_opt
@_json_opt
@format_option
@guard
def tpw(instance, profiles, hardware, models, tp, dtype, kv_layout, contexts, fleet, rho_sweep, rhos, overrides,
        json_out, fmt):
    """Tokens per watt of one replica at full concurrency, per context window (the 1/W law); or, with INSTANCE
    --fleet SPEC --rho-sweep, of a fleet's pools against utilisation."""
    if instance is None and not (rho_sweep or fleet or rhos or overrides):
        rows = api.tpw_rows(profiles, hardware, models, tp, dtype, kv_layout, contexts)
        _emit(lambda c: c.print(rendering.tpw_table(rows)), documents.tpw_json(rows), json_out, (), fmt)
        return
    from fleetopt.optimizer.workflows.rho_sweep import parse_rhos, rho_sweep as sweep

    if not (instance and fleet and rho_sweep) or profiles or hardware or models:
        raise InstanceError("tpw: give either --profile/--hardware (the context sweep) or INSTANCE --fleet SPEC "
                            "--rho-sweep (the utilisation sweep)")
    inst = api.load(instance, overrides)
    result = sweep(inst, fleet, parse_rhos(rhos))
    _emit(lambda c: rendering.render_rho_sweep(c, result), result.to_json(), json_out, _inputs(inst), fmt)


@main.command()
@_instance_arg
@click.option("--fleet", "fleets", metavar="SPEC", multiple=True,
              help="Pools as LO-HI:GPU[xN][@GAMMA][#SEQS],... (no xN: sized analytically first); one fleet per run.")
@click.option("--plan", "plan_file", type=click.Path(dir_okay=False), metavar="FILE",
              help="Instead of --fleet: a plan of a 'fleetopt solve --json' file (split-routing plans too).")
@click.option("--rank", type=click.IntRange(1), help="With --plan: the solution's rank (default: the chosen plan).")
@click.option("--requests", "n_requests", type=click.IntRange(100), default=50_000, show_default=True,
              help="Requests per round, over all replications.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True, help="Root of the replications' seeds.")
@click.option("--router", type=click.Choice(["auto", "length", "split", "random", "compress", "spillover"]),
              default="auto", show_default=True,
              help="Routing between pools (auto: what the plan was solved for - its split routing, compress for "
              "@GAMMA pools, else length; spillover: length, then the next pool up when a pool's queue is long; "
              "random: baseline).")
@click.option("--spill-bound", type=click.IntRange(0), default=None,
              help="With --router spillover: requests waiting in a pool beyond which an arrival spills "
              f"[default: {DEFAULT_SPILL_BOUND}].")
@click.option("--dispatch", type=click.Choice(list(DISPATCHES)), default="jsq", show_default=True,
              help="Replica choice within a pool: join-shortest-queue (running + waiting), round-robin, or "
              "least-queue (fewest waiting; the reference tool's rule).")
@click.option("--arrivals", type=click.Choice(["poisson", "trace", "mmpp", "diurnal"]), default="poisson",
              show_default=True, help="Arrival process at the instance's rate (trace: replay its own instants).")
@click.option("--peak-to-mean", type=click.FloatRange(1.0), default=2.0, show_default=True,
              help="Burstiness of mmpp and diurnal arrivals (diurnal: at most 2).")
@click.option("--mode", type=click.Choice(["iteration", "slot"]), default="iteration", show_default=True,
              help="Continuous batching per iteration, or the analytic model's slot view.")
@click.option("--precision", metavar="PCT", help="Double the requests until the P99 TTFT CI half-width is below "
              "PCT % of it (e.g. 5%).")
@click.option("--max-requests", type=click.IntRange(100), default=1_000_000, show_default=True,
              help="Cap on the requests of a round with --precision.")
@click.option("--replications", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Independent replications (1: batch means).")
@click.option("--kv", type=click.Choice(["reserve", "paged"]), default="reserve", show_default=True,
              help="KV admission: a reserved slot of the window per sequence (the analytic view), or vLLM's paged "
              "admission by blocks with preemption.")
@click.option("--max-num-seqs", type=click.IntRange(1, 65_536), default=None,
              help="Batch cap per replica with --kv paged (default 256, vLLM's; a plan's TPOT cap is kept).")
@click.option("--max-batched-tokens", type=click.IntRange(1), default=None,
              help="Per-iteration token budget per replica (vLLM's max_num_batched_tokens); default none.")
@click.option("--availability", type=click.Choice(["all-up", "sampled"]), default="all-up", show_default=True,
              help="Simulate every replica, or draw the replicas up per replication from gpus[].availability.")
@click.option("--routers", metavar="R1,R2,...", help="Instead of --router: one run per router (length, compress, "
              "random, spillover) on the same request stream, side by side.")
@_set_opt
@_json_opt
@format_option
@guard
def simulate(instance, fleets, plan_file, rank, n_requests, seed, router, spill_bound, dispatch, arrivals,
             peak_to_mean, mode, precision, max_requests, replications, kv, max_num_seqs, max_batched_tokens,
             availability, routers, overrides, json_out, fmt):
    """Simulate a fleet (--fleet SPEC, or --plan of a solve's JSON) next to its analytic numbers.

    Exits 5 when the simulated fleet misses its SLO (with --routers: when every router misses it)."""
    from fleetopt.optimizer.commands.progress import progress_bar
    from fleetopt.optimizer.commands.sim_flags import sim_options
    from fleetopt.optimizer.output.render import render_simulation
    from fleetopt.optimizer.simulation.options import EngineOptions, parse_precision

    if len(fleets) > 1:
        raise InstanceError(f"--fleet: given {len(fleets)} times; simulate runs one fleet (run it once per fleet, "
                            "or compare fleets analytically with: fleetopt evaluate ... --fleet A --fleet B)")
    fleet = fleets[0] if fleets else None
    inst = api.load(instance, overrides)
    if fleet is not None:
        from fleetopt.optimizer.simulation.guards import refuse_semantic

        refuse_semantic(inst, "simulate --fleet", "simulate a solved plan with --plan FILE")
    if routers is not None:
        return _simulate_routers(inst, fleet, plan_file, router, routers, spill_bound, json_out, fmt,
                                 requests=n_requests, replications=replications, seed=seed, mode=mode,
                                 dispatch=dispatch, arrivals=arrivals, peak_to_mean=peak_to_mean,
                                 precision=parse_precision(precision), max_requests=max_requests,
                                 engine=EngineOptions(kv, max_num_seqs, max_batched_tokens, availability))
    options = sim_options(_SIMULATE_FLAGS, requests=n_requests, replications=replications, seed=seed, mode=mode,
                          router=router, dispatch=dispatch, arrivals=arrivals, peak_to_mean=peak_to_mean,
                          spill_bound=spill_bound, precision=parse_precision(precision), max_requests=max_requests,
                          engine=EngineOptions(kv, max_num_seqs, max_batched_tokens, availability))
    with progress_bar(sys.stderr.isatty()) as progress:
        rep = api.simulate_report(inst, fleet, options, plan_file=plan_file, rank=rank, progress=progress)
    _emit(lambda c: render_simulation(c, rep), rep.to_json(), json_out, _inputs(inst, plan_file), fmt)
    raise click.exceptions.Exit(api.simulation_exit_code(rep))


def _simulate_routers(inst, fleet, plan_file, router, routers, spill_bound, json_out, fmt, **settings) -> None:
    """``simulate --routers``: every router on the same stream (:mod:`fleetopt.optimizer.workflows.routers`)."""
    from fleetopt.optimizer.commands.sim_flags import sim_options
    from fleetopt.optimizer.workflows.routers import compare_routers, parse_routers

    if plan_file is not None or fleet is None or router != "auto":
        raise InstanceError("--routers: compares routers on one --fleet SPEC; give --fleet (not --plan) and no "
                            "--router")
    cmp = compare_routers(inst, fleet, parse_routers(routers), sim_options(_SIMULATE_FLAGS, **settings),
                          spill_bound=spill_bound)
    _emit(lambda c: rendering.render_routers(c, cmp),
          contract.with_envelope(cmp.to_json(), "simulate --routers", inst.name),
          json_out, _inputs(inst), fmt)
    raise click.exceptions.Exit(0 if any(r.report.slo_met for r in cmp.runs) else EXIT_CODES["slo_missed"])


@main.command()
@click.option("--quick", is_flag=True, help="Fewer repetitions (smoke run).")
@click.option("--agreement-pools", type=click.IntRange(min=0), default=None, metavar="N",
              help="Random pools of the analytic-vs-simulated agreement run (default 200, 12 with --quick; 0 skips).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
              help="Local processes for the agreement run's pools (the same records; the timed rows stay serial).")
@click.option("--agreement-precision", default=None, metavar="PCT",
              help="Double each agreement pool's run (up to 2 million requests) until its P99 TTFT interval is "
                   "within this percentage of it (default 5%, half the +-10% band it is judged by; none with "
                   "--quick; 'off': fixed-length runs).")
@click.option("--reference-sim", default=None, metavar="CMD",
              help="The reference tool's simulator command (e.g. vllm-sr-sim): its 'simulate' of the same fleet runs "
                   "beside fleetopt's, and the simulate row gives the ratio.")
@_json_opt
@format_option
@guard
def bench(quick, json_out, agreement_pools, workers, agreement_precision, reference_sim, fmt):
    """Run the benchmarks, print a table of medians and write JSON."""
    from fleetopt.optimizer.bench import run_benchmarks, render_bench
    from fleetopt.optimizer.simulation.options import parse_precision

    pools = (12 if quick else 200) if agreement_pools is None else agreement_pools
    if agreement_precision is None:
        precision = None if quick else 0.05
    elif str(agreement_precision).strip().lower() == "off":
        precision = None
    else:
        precision = parse_precision(agreement_precision, "--agreement-precision")
    result = run_benchmarks(repeats=1 if quick else 5, enumeration_limit_s=5.0 if quick else 60.0, memory=not quick,
                            heavy=not quick,
                            agreement_pools=pools, agreement_requests=20_000 if quick else 50_000,
                            agreement_workers=workers, agreement_precision=precision, reference_sim=reference_sim)
    _emit(lambda c: render_bench(c, result), contract.with_envelope(result, "bench", None), json_out, (), fmt)


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("command", nargs=-1)
@click.option("--fields", is_flag=True, help="Instead of the JSON Schema: a table of each document's top-level "
              "fields (type, required, meaning).")
@click.option("--json", "json_out", metavar="FILE", default="-", show_default=True,
              help="Write the JSON Schema here instead of stdout ('-').")
@format_option
@guard
def schema(command, fields, json_out, fmt):
    """Print the JSON Schema of COMMAND's --json documents (every command's without COMMAND).

    COMMAND is a command (tpw: both its documents) or one document kind ('tpw --rho-sweep', 'profile fit')."""
    name = " ".join(command) or None
    COMMANDS, KINDS = contract.COMMANDS, contract.KINDS
    if name is not None and name not in COMMANDS and name not in KINDS:
        known = ", ".join(sorted(set(COMMANDS) | set(KINDS)))
        raise InstanceError(f"COMMAND: unknown command {name!r}; known: {known}")
    if fields:
        kinds = COMMANDS.get(name, (name,)) if name else KINDS
        rendering.render_fields(output(fmt), {kind: contract.top_level_fields(kind) for kind in kinds},
                             contract.SCHEMA_VERSION)
        return
    write_json(contract.schema_for(name), json_out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
