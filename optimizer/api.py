"""The Python API behind the CLI (usable from a notebook).

>>> from fleetopt import api                                     # doctest: +SKIP
>>> inst = api.load("instances/ref_puzzle1_lmsys_a100.yaml")                  # doctest: +SKIP
>>> api.evaluate_report(inst, ["0-8192:a100,8192-65536:a100"])    # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from fleetopt.models.fleet import FleetResult
from fleetopt.models.units import MS_PER_S

from fleetopt.optimizer.io.catalog import load_catalog
from fleetopt.optimizer.errors import EXIT_CODES, FleetoptError, InstanceError
from fleetopt.optimizer.plan.evaluate import baseline, context_sweep, evaluate, limit_violations, parse_fleet
from fleetopt.optimizer.io.instance import Instance, instance_from_dict, load_instance
from fleetopt.models.profiles import replica_unit
from fleetopt.optimizer.output.documents import fleet_json, instance_warnings

if TYPE_CHECKING:
    from fleetopt.optimizer.plan.solve import SolveReport
    from fleetopt.optimizer.simulation.options import VERIFY_SIM_OPTIONS, EngineOptions, SimOptions
    from fleetopt.optimizer.simulation.verify import Verification

__all__ = ["load", "summarize_instance", "evaluate_report", "EvaluationReport", "solve", "verify", "exit_code",
           "fleet_exit_code", "evaluation_exit_code", "simulation_exit_code", "tpw_rows", "simulate_report",
           "simulate_plan", "SimOptions", "EngineOptions", "VERIFY_SIM_OPTIONS", "VerifyReport", "DICT_LABEL",
           "prefill_warnings", "diff"]

DEFAULT_CONTEXTS = "2048,4096,8192,16384,32768,65536,131072"

_SIMULATION_NAMES = ("SimOptions", "EngineOptions", "VERIFY_SIM_OPTIONS")
"""Names of :mod:`fleetopt.optimizer.simulation.options` this module hands out on first use (:func:`__getattr__`)."""


def __getattr__(name: str):
    """``SimOptions``, ``EngineOptions`` and ``VERIFY_SIM_OPTIONS`` (the verification's default settings), from
    :mod:`fleetopt.optimizer.simulation.options` on first use: the simulation's settings and the simulator's records
    they import stay out of the commands that never simulate (about 5 ms of a solve's start on 2 cores)."""
    if name in _SIMULATION_NAMES:
        from fleetopt.optimizer.simulation import options

        return getattr(options, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


DICT_LABEL = "<dict>"
"""What error lines name as the file of an instance given as a mapping."""


def load(path: str | Path | Mapping, overrides=()) -> Instance:
    """Load and validate an instance file, or a mapping shaped like one (validated the same way; its error lines
    name :data:`DICT_LABEL` as the file and its relative paths resolve against the current folder); raises
    :class:`~fleetopt.optimizer.errors.InstanceError`."""
    if isinstance(path, Mapping):
        return instance_from_dict(path, None, overrides, label=DICT_LABEL)
    return load_instance(path, overrides)


def summarize_instance(inst: Instance) -> dict:
    """What the instance asks for, with the derived facts a planner checks first: the body of ``validate``'s
    document, built by its model (:class:`fleetopt.optimizer.output.contract.plan.InstanceSummary`: its keys, types
    and order)."""
    from fleetopt.optimizer.output.contract import build
    from fleetopt.optimizer.output.contract.plan import InstanceSummary

    w, slo = inst.workload, inst.slo
    top = inst.pools.max_context_tokens
    gpus = [{"name": g.name, "profile": g.profile.name, "kind": g.kind, "model": g.profile.model_name,
             **replica_unit(g.profile).to_json(), "cost_per_hr": g.profile.cost_usd_per_hr,
             "n_slots_at_max_context": int(g.profile.n_slots(top)), "max_count": g.max_count,
             "availability": g.availability,
             "quality": f"latency {g.profile.latency_quality} / power {g.profile.power.quality}"}
            for g in inst.gpus]
    return build(
        InstanceSummary, name=inst.name,
        workload={"kind": w.kind, "source": _normalized(w.source), "arrival_rate": w.arrival_rate_req_per_s,
                  "input_fraction": w.input_fraction if w.kind == "cdf" else None,
                  "truncated_share": w.truncated_share},
        slo={"ttft_p99_ms": slo.ttft_p99_s * MS_PER_S, "ttft_model": slo.ttft_model, "scope": slo.scope,
             "tpot_p99_ms": None if slo.tpot_p99_s is None else slo.tpot_p99_s * MS_PER_S,
             "ttft_margin": slo.ttft_margin, "ttft_sizing_ms": slo.ttft_sizing_s * MS_PER_S},
        gpus=gpus,
        pools={"max_pools": inst.pools.max_pools, "max_context": top, "routing": inst.pools.routing,
               "boundaries": list(inst.pools.boundaries)},
        constraints=asdict(inst.constraints),
        objective=inst.objective, valid=True, warnings=prefill_warnings(inst) + instance_warnings(inst))


LONG_CONTEXT_TOKENS = 16_384
"""Pools above this window rest visibly on the prefill model (a 16K prompt is ~0.5 s of compute for an 8B model
on an H100, measured: ``data/measurements/README.md``)."""


def prefill_warnings(inst: Instance) -> list[str]:
    """One line per GPU option that would serve long prompts with a profile that ignores prefill compute (the
    seeds' calibrated units price a chunk like a decode step: ``docs/profiles.md``)."""
    top = inst.pools.max_context_tokens
    if top < LONG_CONTEXT_TOKENS:
        return []
    return [f"gpus[{i}] {g.name}: profile {g.profile.name} ignores prefill compute (the seeds' convention: a "
            f"{g.profile.chunk_tokens:,}-token chunk costs one iteration), so prompts up to {top:,} tokens are priced "
            "optimistically; fit a measured profile (fleetopt profile fit) or use hardware + model"
            for i, g in enumerate(inst.gpus) if not (g.profile.prefill_a_s or g.profile.prefill_b_s)]


@dataclass(frozen=True)
class EvaluationReport:
    """Analytic results of one or more fleets plus the homogeneous baseline."""

    instance: Instance
    fleets: tuple[tuple[str, FleetResult], ...]
    baseline: FleetResult | None
    violations: tuple[tuple[str, ...], ...] = ()
    """Per fleet (in ``fleets`` order), every instance limit it breaks
    (:func:`fleetopt.optimizer.plan.evaluate.limit_violations`); empty: none, or not checked."""
    baseline_violations: tuple[str, ...] = ()
    """The limits the baseline breaks (it does only when every single-pool option breaks one)."""

    def fleet_violations(self, k: int) -> tuple[str, ...]:
        return self.violations[k] if k < len(self.violations) else ()

    def to_json(self) -> dict:
        """The stable JSON contract (:class:`fleetopt.optimizer.output.contract.plan.EvaluateDocument`): always a
        ``fleets`` list; with one fleet its keys also sit at top level (the deprecated 1.0 layout). ``feasible``
        is true when the fleet meets its SLO and breaks no limit, ``violations`` names each limit it breaks."""
        from fleetopt.optimizer.output.contract import build, envelope
        from fleetopt.optimizer.output.contract.plan import EvaluatedFleet, EvaluateDocument

        inst = self.instance
        results = [fleet_json(r, violations=self.fleet_violations(k), instance=inst, model=EvaluatedFleet, fleet=text)
                   for k, (text, r) in enumerate(self.fleets)]
        return build(EvaluateDocument, **envelope("evaluate", inst.name), ttft_model=inst.slo.ttft_model,
                     slo_ttft_p99_ms=inst.slo.ttft_p99_s * MS_PER_S,
                     max_utilization=inst.constraints.max_utilization,
                     truncated_share=inst.workload.truncated_share, **(results[0] if len(results) == 1 else {}),
                     fleets=results, baseline=None if self.baseline is None else fleet_json(
                         self.baseline, instance=inst, violations=self.baseline_violations))

    def rows(self) -> list[dict]:
        """One row per pool of every fleet (its spec first), then the baseline's (fleet ``baseline``); analytic."""
        from fleetopt.optimizer.plan.solve import pool_row

        named = list(self.fleets) + ([("baseline", self.baseline)] if self.baseline is not None else [])
        return [{"fleet": text, **pool_row(p)} for text, r in named for p in r.pools]

    def to_frame(self):
        """:meth:`rows` as a ``pandas.DataFrame`` (the optional extra ``fleetopt[frames]``)."""
        from fleetopt.optimizer.plan.solve import POOL_COLUMNS, table_frame

        return table_frame(self.rows(), ["fleet", *POOL_COLUMNS])

    def _repr_html_(self) -> str:
        from fleetopt.optimizer.plan.solve import POOL_COLUMNS, table_html

        verdicts = "; ".join(f"{text}: ${r.cost_per_hr:,.2f}/hr, SLO {'met' if r.slo_met else 'missed'}"
                             + (f", breaks {len(self.fleet_violations(k))} limit(s)" if self.fleet_violations(k)
                                else "")
                             for k, (text, r) in enumerate(self.fleets))
        return table_html(f"{self.instance.name}: evaluate (analytic) - {verdicts}", self.rows(),
                          ["fleet", *POOL_COLUMNS])


def evaluate_report(inst: Instance, fleets) -> EvaluationReport:
    """Evaluate each fleet spec (``"0-4096:a100x3,4096-65536:a100"``) and the homogeneous baseline."""
    if isinstance(fleets, str):
        fleets = [fleets]
    if inst.semantic is not None:
        from fleetopt.optimizer.simulation.guards import refuse_semantic

        refuse_semantic(inst, "evaluate --fleet")
    problems, specs = [], []
    for k, text in enumerate(fleets):
        try:
            specs.append(parse_fleet(text, inst, "--fleet" if len(fleets) == 1 else f"--fleet[{k}]"))
        except InstanceError as err:
            problems += err.problems
    if problems:
        raise InstanceError(problems)
    results = tuple((spec.text, evaluate(inst, spec).result) for spec in specs)
    base = baseline(inst)
    return EvaluationReport(inst, results, base, tuple(limit_violations(inst, r) for _, r in results),
                            () if base is None else limit_violations(inst, base))


def fleet_exit_code(slo_met: bool, violations=()) -> int:
    """The documented exit code of a judged fleet (:mod:`fleetopt.optimizer.errors`): 5 (``slo_missed``) when it
    misses its SLO, else 6 (``limits_broken``) when it breaks a limit of the instance, else 0."""
    if not slo_met:
        return EXIT_CODES["slo_missed"]
    return EXIT_CODES["limits_broken"] if violations else EXIT_CODES["ok"]


def evaluation_exit_code(report: EvaluationReport) -> int:
    """``fleetopt evaluate``'s exit code: the worst of its fleets' :func:`fleet_exit_code` (5 before 6 before 0;
    the baseline is not judged)."""
    codes = [fleet_exit_code(r.slo_met, report.fleet_violations(k)) for k, (_, r) in enumerate(report.fleets)]
    for code in (EXIT_CODES["slo_missed"], EXIT_CODES["limits_broken"]):
        if code in codes:
            return code
    return EXIT_CODES["ok"]


def simulation_exit_code(rep) -> int:
    """``fleetopt simulate``'s exit code: 5 (``slo_missed``) when the simulated fleet misses its SLO (the
    report's ``slo_met``, judged on the CI upper bound), else 0."""
    return fleet_exit_code(bool(rep.slo_met))


def _normalized(source: str) -> str:
    """A workload source as a user reads it: a file path without ``..`` detours; ``builtin:NAME`` unchanged."""
    return source if source.startswith("builtin:") else os.path.normpath(source)


def solve(inst: Instance, *, top: int = 1, time_limit_s: float | None = None, mip_gap: float = 0.0,
          threads: int | None = None, method: str = "auto", verbose: bool = False):
    """Optimal fleet(s) of ``inst`` (see :func:`fleetopt.optimizer.plan.solve.solve_instance`)."""
    from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance

    return solve_instance(inst, SolveOptions(top=top, time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads,
                                             verbose=verbose, method=method))


def verify(inst: Instance, sim_options: SimOptions | None = None, *, verify_top: int = 3,
           rule: str = "ci-upper", max_rounds: int = 3, time_limit_s: float | None = None, mip_gap: float = 0.0,
           threads: int | None = None, method: str = "auto", verbose=False, cuts: str = "pool", trim: bool = False,
           progress=None, on_step=None, workers: int = 1, scheduler=None):
    """Solve for the ``verify_top`` best plans and verify them by simulation (see
    :mod:`fleetopt.optimizer.simulation.verify`);
    returns (solve report, verification). ``sim_options`` (:class:`~fleetopt.optimizer.simulation.options.SimOptions`)
    are the settings of every simulation: requests, replications, seed, the engine's KV admission, token budget and
    availability, ... (default :data:`VERIFY_SIM_OPTIONS`); ``cuts`` is ``pool`` (per-pool simulated sizing),
    ``count`` or ``window`` (:mod:`fleetopt.optimizer.simulation.verify`, "Cuts"); ``trim`` lowers the chosen
    plan's counts while its simulation
    passes (:mod:`fleetopt.optimizer.simulation.trim`). ``progress(done, total)`` and ``on_step(message)``
    report progress (:func:`fleetopt.optimizer.simulation.verify.verify`). ``workers`` local processes or the Dask
    cluster at ``scheduler`` simulate the plans of a round side by side (:mod:`fleetopt.optimizer.workflows.executor`;
    the same results as one process: every plan runs on the same seed)."""
    from fleetopt.optimizer.plan.solve import SolveOptions
    from fleetopt.optimizer.simulation.options import VERIFY_SIM_OPTIONS
    from fleetopt.optimizer.simulation.verify import verify as run

    sim_options = VERIFY_SIM_OPTIONS if sim_options is None else sim_options

    options = SolveOptions(time_limit_s=time_limit_s, mip_gap=mip_gap, threads=threads, verbose=verbose,
                           method="mip" if method == "auto" else method)
    map_plans = None
    if workers != 1 or scheduler is not None:
        from fleetopt.optimizer.workflows.executor import Backend, map_ordered

        backend = Backend(workers=workers, scheduler=scheduler)
        map_plans = lambda fn, args: map_ordered(fn, args, backend)  # noqa: E731
    return VerifyReport(*run(inst, options, sim_options, top=verify_top, rule=rule, max_rounds=max_rounds, cuts=cuts,
                             trim=trim, progress=progress, on_step=on_step, map_plans=map_plans))


class VerifyReport(NamedTuple):
    """What :func:`verify` returns: the last round's solve report and the verification record (it unpacks as
    the pair ``report, verification``)."""

    report: SolveReport
    """The last round's :class:`fleetopt.optimizer.plan.solve.SolveReport`."""
    verification: Verification
    """The :class:`fleetopt.optimizer.simulation.verify.Verification` (``chosen`` is the verified plan, if any)."""

    def to_json(self) -> dict:
        """The JSON of ``solve --verify-top`` (:func:`fleetopt.optimizer.output.documents.solve_json`)."""
        from fleetopt.optimizer.output.documents import solve_json

        return solve_json(self.report, self.verification)

    def rows(self) -> list[dict]:
        """One row per pool of every plan simulated (round, rank, verdict), analytic next to simulated P99 TTFT."""
        from fleetopt.optimizer.plan.solve import pool_row

        out = []
        for vp in self.verification.plans:
            sims = {(p.min_tokens, p.max_tokens, p.gpu): p for p in getattr(vp.sim, "pools", ())}
            for pool in vp.plan.fleet.pools:
                s = sims.get((pool.min_tokens, pool.max_tokens, pool.gpu))
                out.append({"round": vp.round, "rank": vp.rank, "passed": vp.passed, **pool_row(pool),
                            "ttft_p99_ms_sim": None if s is None else s.ttft_p99_ms_sim})
        return out

    def to_frame(self):
        """:meth:`rows` as a ``pandas.DataFrame`` (the optional extra ``fleetopt[frames]``)."""
        from fleetopt.optimizer.plan.solve import POOL_COLUMNS, table_frame

        return table_frame(self.rows(), ["round", "rank", "passed", *POOL_COLUMNS, "ttft_p99_ms_sim"])

    def _repr_html_(self) -> str:
        from fleetopt.optimizer.plan.solve import POOL_COLUMNS, table_html

        v = self.verification
        chosen = v.chosen
        head = (f"{self.report.instance.name}: verified (rule {v.rule}) - "
                + (f"round {chosen.round} plan {chosen.rank}, ${chosen.plan.fleet.cost_per_hr:,.2f}/hr"
                   if chosen is not None else "no plan verified"))
        return table_html(head, self.rows(), ["round", "rank", "passed", *POOL_COLUMNS, "ttft_p99_ms_sim"],
                          v.reason or "")


def simulate_report(inst: Instance, fleet: str | None = None, options: SimOptions | None = None, *, plan_file=None,
                    rank: int | None = None, progress=None, keep_requests: bool = False):
    """Simulate one fleet spec (``"0-4096:a100x3,4096-65536:a100"``; no ``xN`` = sized analytically first) or a
    plan of a ``solve --json`` file (``plan_file``, solution ``rank``; :mod:`fleetopt.optimizer.simulation.plan_files`).

    ``options`` (:class:`~fleetopt.optimizer.simulation.options.SimOptions`; None: its defaults) are the run's
    settings; their default ``router="auto"`` is the router the plan needs (its own split routing,
    compress-and-route for ``@gamma`` pools, else length). ``keep_requests`` keeps the measured requests' latencies
    (``SimReport.latencies()``).
    """
    from fleetopt.optimizer.simulation.options import SimOptions
    from fleetopt.optimizer.simulation.plan_files import SolvedPlan, load_solved_plan
    from fleetopt.optimizer.simulation.simulate import plans_from_spec, simulate_plan

    options = SimOptions() if options is None else options

    if (fleet is None) == (plan_file is None):
        raise InstanceError("--fleet / --plan: give exactly one of them")
    if rank is not None and plan_file is None:
        raise InstanceError("--rank: picks a solution of --plan FILE")
    if plan_file is not None:
        solved = load_solved_plan(plan_file, inst, rank)
    elif inst.semantic is not None:
        from fleetopt.optimizer.simulation.guards import refuse_semantic

        refuse_semantic(inst, "simulate --fleet", "simulate a solved plan with --plan FILE")
    else:
        assert fleet is not None        # exactly one of fleet / plan_file (checked above)
        solved = SolvedPlan(plans_from_spec(inst, fleet), None, None)
    if solved.routing is not None and options.router not in ("auto", "split"):
        raise InstanceError(f"--router: {options.router!r}: a split-routing plan runs with its own routing "
                            "(auto or split)")
    return simulate_plan(inst, solved.pools, options, routing=solved.routing, progress=progress,
                         keep_requests=keep_requests, semantic=solved.semantic)


def simulate_plan(inst: Instance, pools, options: SimOptions | None = None, **per_call):
    """Simulate pools (``fleetopt.models.fleet.PoolPlan``) of a plan with ``options`` (None: the defaults of
    :class:`~fleetopt.optimizer.simulation.options.SimOptions`); ``per_call`` are ``routing``, ``split_shares`` and
    ``progress`` (see :func:`fleetopt.optimizer.simulation.simulate.simulate_plan`)."""
    from fleetopt.optimizer.simulation.options import SimOptions
    from fleetopt.optimizer.simulation.simulate import simulate_plan as run

    return run(inst, pools, SimOptions() if options is None else options, **per_call)


def diff(path_a: str | Path, path_b: str | Path, plan_a: int | None = None, plan_b: int | None = None):
    """What changes from plan ``plan_a`` of the result file ``path_a`` to plan ``plan_b`` of ``path_b``
    (``fleetopt diff``): a :class:`fleetopt.optimizer.workflows.diff.PlanDiff` (pools added, removed, resized or
    moved, GPUs to buy or release per hardware, ``delta()`` of the headline figures, ``to_json()``)."""
    from fleetopt.optimizer.workflows.diff import diff_files   # the workflow loads on first use

    return diff_files(path_a, path_b, plan_a, plan_b)


def exit_code(report, verification=None) -> int:
    """The documented exit code of a solve report (:mod:`fleetopt.optimizer.errors`): 0 with a plan (a limit
    with an incumbent included), otherwise that of the typed error
    :func:`~fleetopt.optimizer.plan.solve.require_plan` raises for its status.

    With a ``verification`` (``solve --verify-top``, :mod:`fleetopt.optimizer.simulation.verify`) the plan must
    also be verified: 0 when it is; when the cuts left the solver without a plan, the code of the last solve's
    status (3, infeasible: ``verification.reason`` says which requests no pool can serve and why); when the
    rounds ran out with plans still missing in simulation, 4 (a limit was reached before a verified plan was
    found; one may exist: raise ``--max-rounds``)."""
    from fleetopt.optimizer.plan.solve import require_plan

    try:
        require_plan(report)
    except FleetoptError as err:
        return err.exit_code
    if verification is not None and not verification.verified:
        return EXIT_CODES["time_limit"]
    return EXIT_CODES["ok"]


def tpw_rows(profiles: str | None, hardware: str | None, models: str | None, tp: int = 1, dtype: str = "fp16",
             kv_layout: str = "sharded", contexts: str = DEFAULT_CONTEXTS):
    """Rows of the context sweep for calibrated profiles and/or computed (hardware x model) profiles."""
    cat = load_catalog()
    problems, chosen = [], []
    try:
        ctx = [int(c) for c in str(contexts).split(",") if c.strip()]
        if not ctx or min(ctx) < 1:
            raise ValueError
    except ValueError:
        problems.append(f"--contexts: '{contexts}' is not a comma-separated list of positive token counts")
        ctx = []
    for name in [p.strip() for p in (profiles or "").split(",") if p.strip()]:
        try:
            chosen.append(cat.find("profiles", name))
        except KeyError as err:
            problems.append(f"--profile: {err.args[0]}")
    if bool(hardware) != bool(models):
        problems.append("--hardware and --models go together")
    elif hardware:
        chosen += _computed(cat, hardware, models, tp, dtype, kv_layout, problems)
    if not chosen and not problems:
        problems.append("--profile or --hardware with --models: give at least one profile")
    if problems:
        raise InstanceError(problems)
    return context_sweep(chosen, ctx)


def _computed(cat, hardware, models, tp, dtype, kv_layout, problems):
    from fleetopt.models.roofline import computed_profile

    out = []
    try:
        hw = cat.find("hardware", hardware)
    except KeyError as err:
        problems.append(f"--hardware: {err.args[0]}")
        return out
    for name in [m.strip() for m in models.split(",") if m.strip()]:
        try:
            md = cat.find("models", name)
            out.append(computed_profile(hw, md, tp=tp, dtype=dtype, kv_layout=kv_layout, defaults=cat.defaults))
        except KeyError as err:
            problems.append(f"--models: {err.args[0]}")
        except ValueError as err:
            problems.append(f"--models: {name}: {err}")
    return out
