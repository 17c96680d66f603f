r"""What-if sweeps (``fleetopt whatif``): the instance re-solved exactly over a grid of field values.

The grid
--------
Each ``--sweep PATH=v1,v2,...`` names an instance field (any path ``--set`` takes,
:mod:`fleetopt.optimizer.io.overrides`) and its values (YAML, as ``--set`` reads them; commas inside ``[...]``,
``{...}`` or quotes do not split). The scenarios are the Cartesian product of the sweeps, the first sweep
outermost; scenario :math:`s` is the instance loaded with the ``--set`` overrides and then its own value of every
swept path, validated as any instance is. The *base* is the instance with the ``--set`` overrides alone.

Each scenario (and the base) is solved exactly (:func:`fleetopt.optimizer.plan.solve.solve_instance`: the graph
oracle or the MIP over every candidate pool, not a re-sizing of a fixed design), by :func:`solve_scenario`, a
module-level function of the scenario's resolved :class:`~fleetopt.optimizer.io.instance.Instance`, so the
executor (:mod:`fleetopt.optimizer.workflows.executor`) can run the scenarios serially, on local processes or on
a Dask cluster, and stream each record to a JSONL log as it finishes. Every record is a JSON mapping
(:data:`RECORD_KEYS`) with nothing that depends on where or when it ran, so the assembled result is the same
however it was run.

Deltas against the base (:func:`deltas`)
---------------------------------------
:math:`\Delta C = C_s - C_0` in $/yr (and :math:`100\,\Delta C / C_0` %), :math:`\Delta` replicas and GPUs; a
pool is identified by its window and GPU option ``LO-HI:GPU``: *added* (in the scenario's plan, not the
base's), *removed*, or *resized* (in both, another replica count); the GPU options used, added or dropped.

What binds (:func:`binding`)
----------------------------
A :class:`~fleetopt.optimizer.plan.solve.SolveReport` carries no duals or slacks (the oracle has none, and a
MIP's duals say nothing about integer counts), so the binding constraint of each pool is determined directly:
the pool is evaluated analytically (the evaluate path, the instance's ``ttft_model``) with *one deployed replica
fewer*. With availability :math:`A` the solver deploys :math:`\lceil m/A \rceil` for a least count :math:`m`, so
:math:`n - 1` deployed replicas stand for the up count :math:`k = \lfloor (n-1)A \rfloor`; the pool is evaluated
at :math:`k` and every condition it then breaks is named: ``P99 TTFT`` (above the SLO, or unstable),
``TPOT`` (the TPOT SLO) and ``utilization cap`` (capacity load above ``constraints.max_utilization``).
:math:`k = 0` is ``one replica`` (a pool with traffic needs one), and a pool that breaks nothing at :math:`k` is
``above least count`` (a ``min_count``, or an objective other than cost, holds it there). Pools are independent
under length routing, so one evaluation at every pool's :math:`k` gives them all. Under ``slo.scope: fleet`` the
P99 is the fleet's and couples the pools, and split routing's pools share segments: there the per-pool binding
is not determined (said so). Fleet-wide limits *at their bound* (``gpus.NAME.max_count``,
``gpus.NAME.max_pools``, ``pools.max_pools``, ``constraints.max_total_gpus``, ``max_cost_per_hr``,
``max_power_kw``, within :data:`LIMIT_TOLERANCE`) are listed too: active, which a limit must be to bind.

The log and ``--resume``
------------------------
With ``--out FILE.jsonl`` every record is streamed to a log (:class:`~fleetopt.optimizer.workflows.executor
.ResultLog`) as it finishes; ``--resume`` reads the finished records back and solves only the rest. A record
is reused only when it was solved from the same inputs, by content:

* the log's header (:func:`log_header`) holds the run's flags (``--set``, the simulation options, the time
  limit: a log of other flags is refused, exit 2) and the SHA-256 of every input file it names
  (:func:`input_files`: the instance file, each scenario's workload file, builtin ones included, the ``--catalog``
  files and those of the instance's ``catalog:`` key, each GPU option's ``profile_file`` / ``model_config``)
  with the fleetopt version. When one of those differs on resume, every record of the log is stale: the log
  is started anew, one line on stderr names the changed file, and every scenario is solved again;
* each record also holds the SHA-256 of the resolved instance it was solved from (:func:`instance_digest`:
  the workload's lengths, each GPU option's profile as the catalogue built it, every field after the
  overrides), so a record whose scenario now resolves otherwise (a ``config.json`` a catalogue names, a file a
  ``--set`` points to) is solved again too, and said so.

The swept values are in each record's key, so a resumed run may add values to a sweep and reuses the records
of the values it had.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from fleetopt.models.units import MS_PER_S

from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.io.instance import Instance, instance_from_dict
from fleetopt.optimizer.output.writes import to_jsonable
from fleetopt.optimizer.io.overrides import override_settings
from fleetopt.optimizer.io.schema import Problems
from fleetopt.optimizer.io.workloads import read_instance_file
from fleetopt.optimizer.plan.evaluate import evaluate_plans, fleet_spec
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.simulate import plans_from_fleet, simulate_plan
from fleetopt.optimizer.workflows.executor import Backend, ResultLog, Task, iter_results

__all__ = ["SCHEMA_VERSION", "MAX_SCENARIOS", "LIMIT_TOLERANCE", "RECORD_KEYS", "Sweep", "Scenario", "WhatIf",
           "parse_sweep", "split_values", "build_scenarios", "solve_scenario", "binding", "deltas", "run_whatif",
           "log_header", "input_files", "instance_digest", "bench_whatif_sweep", "BASE_KEY",
           "STALE_KEYS"]

from fleetopt.optimizer.output.contract import SCHEMA_VERSION  # noqa: E402 (one contract version)
"""Version of the JSON contract of :meth:`WhatIf.to_json` and of the JSONL records."""
MAX_SCENARIOS = 100_000
"""Largest grid ``--sweep`` may span."""
LIMIT_TOLERANCE = 1e-9
"""Relative slack within which a real-valued fleet limit ($/hr, kW) counts as at its bound."""
BASE_KEY = "base"
"""The key of the base instance's record."""
RECORD_KEYS = ("status", "method", "explanation", "mip_gap", "cost_per_hr", "cost_per_year", "total_replicas",
               "total_gpus", "power_kw", "fleet", "pools", "binding", "limits_at_bound", "binding_note", "sim")
"""Keys of a scenario's record (:func:`solve_scenario`); ``pools`` each ``min_tokens``, ``max_tokens``, ``gpu``,
``replicas``, ``gpus``, ``ttft_p99_ms``, ``capacity_load``, ``cost_per_hr``."""

# --------------------------------------------------------------------------------------------
# Sweeps and scenarios
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sweep:
    """One ``--sweep``: a dotted ``path`` and its values, as given (``texts``) and as YAML reads them."""

    path: str
    texts: tuple[str, ...]
    values: tuple[Any, ...]

    def to_json(self) -> dict:
        return {"path": self.path, "values": list(self.values)}


@dataclass(frozen=True)
class Scenario:
    """One point of the grid: its key, the ``--set``-style strings it adds, and the values by path."""

    index: int
    key: str
    overrides: tuple[str, ...]
    settings: tuple[tuple[str, Any], ...]

    @property
    def settings_map(self) -> dict:
        return dict(self.settings)


def split_values(text: str) -> list[str]:
    """Split ``"1,2,[3, 4]"`` at the commas outside brackets, braces and quotes: ``["1", "2", "[3, 4]"]``.

    Examples
    --------
    >>> split_values("50, 100,[a, b],'x,y'")
    ['50', '100', '[a, b]', "'x,y'"]
    """
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _key_value(value: Any) -> str:
    return json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"), default=str)


def parse_sweep(text: str, flag: str = "--sweep") -> Sweep:
    """``"workload.arrival_rate=50,100"`` -> a :class:`Sweep` (values parsed as ``--set`` parses them).

    Raises
    ------
    InstanceError
        One line naming ``flag``: no ``=``, an empty path or value, a value that is not YAML, a repeated value.
    """
    if "=" not in text:
        raise InstanceError(f"{flag} {text}: no '=' in {text!r}; write PATH=v1,v2,..., e.g. "
                            "workload.arrival_rate=50,100,200")
    path, raw = (s.strip() for s in text.split("=", 1))
    keys = [k.strip() for k in path.split(".")]
    if not path or not all(keys):
        raise InstanceError(f"{flag} {path}: {path!r} is not a dotted path; write e.g. slo.ttft_p99_ms=300,500")
    texts = split_values(raw)
    if not raw or any(not t for t in texts):
        raise InstanceError(f"{flag} {path}: {raw!r} has an empty value; write PATH=v1,v2,...")
    values = []
    for t in texts:
        parsed = override_settings([f"{path}={t}"])
        if path not in parsed:
            raise InstanceError(f"{flag} {path}: the value {t!r} is not valid YAML; quote it")
        values.append(parsed[path])
    seen = [_key_value(v) for v in values]
    if len(set(seen)) != len(seen):
        dup = next(texts[i] for i, s in enumerate(seen) if seen.count(s) > 1)
        raise InstanceError(f"{flag} {path}: the value {dup!r} is given twice")
    return Sweep(".".join(keys), tuple(texts), tuple(values))


def build_scenarios(sweeps: Sequence[Sweep]) -> list[Scenario]:
    """The Cartesian product of ``sweeps``, the first outermost; a scenario's key is ``PATH=VALUE`` per path
    (the value as canonical JSON) joined by ``&``."""
    paths = [s.path for s in sweeps]
    if len(set(paths)) != len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise InstanceError(f"--sweep {dup}: the path is swept twice; give its values in one --sweep")
    size = math.prod(len(s.values) for s in sweeps) if sweeps else 0
    if size > MAX_SCENARIOS:
        raise InstanceError(f"--sweep: the grid has {size:,} scenarios, more than {MAX_SCENARIOS:,}")
    out = []
    for k, combo in enumerate(itertools.product(*[range(len(s.values)) for s in sweeps])):
        picks = [(s, i) for s, i in zip(sweeps, combo)]
        out.append(Scenario(k, "&".join(f"{s.path}={_key_value(s.values[i])}" for s, i in picks),
                            tuple(f"{s.path}={s.texts[i]}" for s, i in picks),
                            tuple((s.path, s.values[i]) for s, i in picks)))
    return out


def _attributed(err: InstanceError, path, label: str) -> list[str]:
    """The lines of ``err`` re-labelled ``<file>: <label>: <field>: <message>`` (an override's own ``--set``
    label replaced)."""
    prefix = f"{path}: " if path is not None else ""
    out = []
    for line in err.problems:
        rest = line[len(prefix):] if prefix and line.startswith(prefix) else line
        if rest.startswith("--set "):
            rest = rest.split(": ", 1)[1] if ": " in rest else rest
        out.append(format_problem(path, label, rest))
    return out


def load_scenarios(path: str | Path, sets: Sequence[str], sweeps: Sequence[Sweep]) \
        -> tuple[Instance, list[Scenario], dict[str, Instance]]:
    """The base instance, the scenarios, and each scenario's validated instance by key (:func:`_load`)."""
    return _load(path, sets, sweeps)[1:]


def _load(path: str | Path, sets: Sequence[str], sweeps: Sequence[Sweep]) \
        -> tuple[dict, Instance, list[Scenario], dict[str, Instance]]:
    """The instance file's parsed content, the base instance, the scenarios, and each scenario's validated
    instance by key.

    Every ``--set`` and every swept value is checked on its own first (after the ``--set`` before it), so a
    problem is one line naming its flag and path: ``<file>: --set PATH: ...`` or ``<file>: --sweep PATH=VALUE:
    <field>: ...``; a combination of valid values that is not (a cross-field rule) names the combination.

    Raises
    ------
    InstanceError
        Every problem found, one line each.
    """
    problems = Problems(path)
    data = read_instance_file(Path(path), problems)
    problems.raise_if_any()
    if data is None:
        raise InstanceError(format_problem(path, "", "the file is empty"))
    base = instance_from_dict(data, path)   # the file's own problems, unlabelled
    for k, text in enumerate(sets):
        try:
            base = instance_from_dict(data, path, list(sets[:k + 1]))
        except InstanceError as err:
            raise InstanceError(_attributed(err, path, f"--set {text.split('=', 1)[0].strip()}")) from None
    lines: list[str] = []
    single: dict[tuple[str, int], Instance] = {}
    for s in sweeps:
        failed: dict[str, list[str]] = {}      # problem (without its label) -> the values that have it
        for i, t in enumerate(s.texts):
            try:
                single[(s.path, i)] = instance_from_dict(data, path, [*sets, f"{s.path}={t}"])
            except InstanceError as err:
                for line in _attributed(err, path, ""):
                    failed.setdefault(line, []).append(t)
        for line, texts in failed.items():   # a problem every value shares (an unknown path) is one line
            label = f"--sweep {s.path}" if len(texts) == len(s.texts) > 1 else f"--sweep {s.path}={','.join(texts)}"
            lines.append(format_problem(path, label, line.removeprefix(f"{path}: ")))
    if lines:
        raise InstanceError(lines)
    scenarios = build_scenarios(sweeps)
    instances: dict[str, Instance] = {}
    for sc in scenarios:
        if len(sweeps) == 1:
            instances[sc.key] = single[(sweeps[0].path, sc.index)]
            continue
        try:
            instances[sc.key] = instance_from_dict(data, path, [*sets, *sc.overrides])
        except InstanceError as err:
            lines += _attributed(err, path, "--sweep " + ", ".join(sc.overrides))
    if lines:
        raise InstanceError(lines)
    return data, base, scenarios, instances


# --------------------------------------------------------------------------------------------
# One scenario
# --------------------------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def binding(instance: Instance, fleet) -> tuple[list[dict], str]:
    """Per pool of ``fleet`` (a :class:`~fleetopt.models.fleet.FleetResult` of ``instance``) what it breaks
    with one deployed replica fewer (module docstring), and a note when that is not determined.

    Each entry: ``pool`` (``LO-HI:GPUxN``), ``binds`` (list of ``P99 TTFT``, ``TPOT``, ``utilization cap``, or
    ``one replica``, or ``above least count``), ``replicas_tested`` (the up count :math:`k`), and the pool's
    ``ttft_p99_ms`` and ``capacity_load`` at :math:`k` (None when not evaluated)."""
    labels = [f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}" for p in fleet.pools]
    if instance.pools.routing == "split":
        return [], "split routing: pools share length segments, the per-pool binding is not determined"
    if instance.slo.scope == "fleet":
        return [], "slo.scope fleet: the fleet-wide P99 couples the pools, the per-pool binding is not determined"
    plans = plans_from_fleet(instance, fleet)
    tested = [math.floor((p.replicas - 1) * instance.gpu(p.gpu).availability + 1e-9) for p in fleet.pools]
    trial = [replace(q, replicas=k if k >= 1 else q.replicas) for q, k in zip(plans, tested)]
    # only the pools are read: the fleet-wide P99 (a root search over every pool) is left out
    below = evaluate_plans(instance, trial, fleet_p99=False).pools if any(k >= 1 for k in tested) else ()
    slo_ms = instance.slo.ttft_p99_s * MS_PER_S
    out = []
    for j, (p, k) in enumerate(zip(fleet.pools, tested)):
        if p.routing_share <= 0:
            out.append({"pool": labels[j], "binds": [], "replicas_tested": None, "ttft_p99_ms": None,
                        "capacity_load": None})
            continue
        if k < 1:
            out.append({"pool": labels[j], "binds": ["one replica"], "replicas_tested": 0, "ttft_p99_ms": None,
                        "capacity_load": None})
            continue
        r = below[j]
        unstable = not r.utilization < 1.0
        binds = []
        if unstable or r.ttft_p99_ms > slo_ms * (1 + 1e-12):
            binds.append("P99 TTFT")
        elif not r.slo_met:
            binds.append("TPOT")
        if unstable or not r.utilization_ok:
            binds.append("utilization cap")
        out.append({"pool": labels[j], "binds": binds or ["above least count"], "replicas_tested": k,
                    "ttft_p99_ms": _finite(r.ttft_p99_ms), "capacity_load": _finite(r.capacity_load)})
    return out, ""


def limits_at_bound(instance: Instance, fleet) -> list[str]:
    """The instance's fleet-wide limits ``fleet`` meets with equality (module docstring), one string each."""
    out = []
    pools = fleet.pools
    for g in instance.gpus:
        mine = [p for p in pools if p.gpu == g.name]
        n_gpus = sum(p.gpus for p in mine)
        if g.max_count is not None and mine and n_gpus >= g.max_count:
            out.append(f"gpus.{g.name}.max_count ({n_gpus} of {g.max_count} GPUs)")
        if g.max_pools is not None and mine and len(mine) >= g.max_pools:
            out.append(f"gpus.{g.name}.max_pools ({len(mine)} of {g.max_pools})")
    if len(pools) >= instance.pools.max_pools:
        out.append(f"pools.max_pools ({len(pools)} of {instance.pools.max_pools})")
    c = instance.constraints
    if c.max_total_gpus is not None and fleet.total_gpus >= c.max_total_gpus:
        out.append(f"constraints.max_total_gpus ({fleet.total_gpus} of {c.max_total_gpus})")
    if c.max_cost_per_hr is not None and fleet.cost_per_hr >= c.max_cost_per_hr * (1 - LIMIT_TOLERANCE):
        out.append(f"constraints.max_cost_per_hr ({fleet.cost_per_hr:.2f} of {c.max_cost_per_hr:g} $/hr)")
    if c.max_power_kw is not None and fleet.power_kw >= c.max_power_kw * (1 - LIMIT_TOLERANCE):
        out.append(f"constraints.max_power_kw ({fleet.power_kw:.2f} of {c.max_power_kw:g} kW)")
    return out


def solve_scenario(instance: Instance, sim_options: SimOptions | None = None,
                   time_limit_s: float | None = None) -> dict:
    """Solve ``instance`` exactly and return its record (:data:`RECORD_KEYS`; JSON-able, no wall times).

    With ``sim_options`` the plan is also simulated (:func:`fleetopt.optimizer.simulation.simulate.simulate_plan`)
    and ``sim`` holds ``slo_met`` (the upper end of the 95 % P99 TTFT interval within the SLO),
    ``ttft_p99_ms``, ``ttft_p99_ci_ms``, ``requests_measured`` and ``seed``."""
    report = solve_instance(instance, SolveOptions(time_limit_s=time_limit_s, compute_baseline=False))
    plan = report.best
    record: dict[str, Any] = {"status": str(report.status), "method": report.method,
                              "explanation": report.explanation, "mip_gap": report.mip_gap,
                              "cost_per_hr": None, "cost_per_year": None, "total_replicas": None,
                              "total_gpus": None, "power_kw": None, "fleet": None, "pools": [], "binding": [],
                              "limits_at_bound": [], "binding_note": "", "sim": None}
    if plan is None:
        return cast(dict, to_jsonable(record))      # to_jsonable maps a dict to a dict
    f = plan.fleet
    pools = [{"min_tokens": p.min_tokens, "max_tokens": p.max_tokens, "gpu": p.gpu, "replicas": p.replicas,
              "gpus": p.gpus, "ttft_p99_ms": p.ttft_p99_ms, "capacity_load": p.capacity_load,
              "cost_per_hr": p.cost_per_hr} for p in f.pools]
    spec = fleet_spec(instance, f) or ",".join(f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}"
                                               for p in f.pools)
    binds, note = binding(instance, f)
    record.update(cost_per_hr=f.cost_per_hr, cost_per_year=f.cost_per_year, total_replicas=f.total_replicas,
                  total_gpus=f.total_gpus, power_kw=f.power_kw, fleet=spec, pools=pools, binding=binds,
                  limits_at_bound=limits_at_bound(instance, f), binding_note=note)
    if sim_options is not None:
        rep = simulate_plan(instance, plans_from_fleet(instance, f), sim_options, routing=plan.routing)
        record["sim"] = {"slo_met": bool(rep.slo_met), "ttft_p99_ms": rep.ttft_p99_ms,
                         "ttft_p99_ci_ms": list(rep.ttft_p99_ci_ms), "requests_measured": rep.requests_measured,
                         "seed": rep.seed}
    return cast(dict, to_jsonable(record))          # to_jsonable maps a dict to a dict


# --------------------------------------------------------------------------------------------
# Deltas and the result
# --------------------------------------------------------------------------------------------


def _pool_ids(record: Mapping) -> dict[str, int]:
    return {f"{p['min_tokens']}-{p['max_tokens']}:{p['gpu']}": p["replicas"] for p in record.get("pools") or []}


def deltas(record: Mapping, base: Mapping) -> dict:
    """The scenario's ``record`` against the ``base`` record (module docstring); None fields where either has no
    plan."""
    have = record.get("fleet") is not None and base.get("fleet") is not None
    if not have:
        return {"cost_per_year": None, "cost_pct": None, "replicas": None, "gpus": None, "pools_added": [],
                "pools_removed": [], "pools_resized": [], "gpu_types_added": [], "gpu_types_removed": [],
                "same_fleet": None}
    mine, theirs = _pool_ids(record), _pool_ids(base)
    gpus_mine = sorted({p["gpu"] for p in record["pools"]})
    gpus_base = sorted({p["gpu"] for p in base["pools"]})
    dc = record["cost_per_year"] - base["cost_per_year"]
    return {"cost_per_year": dc, "cost_pct": 100.0 * dc / base["cost_per_year"] if base["cost_per_year"] else None,
            "replicas": record["total_replicas"] - base["total_replicas"],
            "gpus": record["total_gpus"] - base["total_gpus"],
            "pools_added": [k for k in mine if k not in theirs],
            "pools_removed": [k for k in theirs if k not in mine],
            "pools_resized": [{"pool": k, "replicas_base": theirs[k], "replicas": n}
                              for k, n in mine.items() if k in theirs and theirs[k] != n],
            "gpu_types_added": [g for g in gpus_mine if g not in gpus_base],
            "gpu_types_removed": [g for g in gpus_base if g not in gpus_mine],
            "same_fleet": record["fleet"] == base["fleet"]}


@dataclass(frozen=True)
class WhatIf:
    """A finished sweep: the base record and each scenario's, in grid order (module docstring)."""

    instance: str
    instance_file: str
    sets: tuple[str, ...]
    sweeps: tuple[Sweep, ...]
    scenarios: tuple[Scenario, ...]
    base: dict
    records: tuple[dict, ...]
    """Per scenario (same order) its record (:data:`RECORD_KEYS`)."""
    slo_ttft_p99_ms: float
    ttft_model: str
    sim_options: SimOptions | None = None
    resumed: int = 0
    """Records read back from the log instead of solved (not part of the JSON: the output is the same)."""

    def rows(self) -> list[dict]:
        return [{"index": sc.index, "key": sc.key, "overrides": sc.settings_map, **rec,
                 "deltas": deltas(rec, self.base)} for sc, rec in zip(self.scenarios, self.records)]

    def to_json(self) -> dict:
        """The document, built by its model (:class:`fleetopt.optimizer.output.contract.workflows.WhatIfDocument`)."""
        from fleetopt.optimizer.output.contract import build, envelope
        from fleetopt.optimizer.output.contract.workflows import WhatIfDocument

        return build(WhatIfDocument, self, **envelope("whatif", self.instance),
                     source="analytic (each scenario re-solved exactly: graph oracle or MIP)",
                     overrides=list(self.sets), sweeps=[s.to_json() for s in self.sweeps], scenarios=self.rows(),
                     **({} if self.sim_options is None else {"sim_options": self.sim_options.to_json()}))

    def to_csv(self) -> str:
        cols = [s.path for s in self.sweeps] + ["status", "cost_per_year", "delta_cost_per_year", "total_replicas",
                                               "delta_replicas", "total_gpus", "fleet", "pools_added",
                                               "pools_removed", "binding"]
        lines = [",".join(cols)]
        for row in self.rows():
            d = row["deltas"]
            cells = [row["overrides"][s.path] for s in self.sweeps] + [
                row["status"], row["cost_per_year"], d["cost_per_year"], row["total_replicas"], d["replicas"],
                row["total_gpus"], row["fleet"], " ".join(d["pools_added"]), " ".join(d["pools_removed"]),
                binding_text(row)]
            lines.append(",".join(_csv_cell(c) for c in cells))
        return "\n".join(lines) + "\n"


def binding_text(record: Mapping) -> str:
    """A record's binding in one cell: per pool ``LO-HI:GPU: binds``, then the fleet limits at their bound."""
    parts = [f"{b['pool'].rsplit('x', 1)[0]}: {'+'.join(b['binds'])}" for b in record.get("binding") or []
             if b["binds"]]
    parts += list(record.get("limits_at_bound") or [])
    return "; ".join(parts)


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    text = value if isinstance(value, str) else json.dumps(value)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text


def _normalized(record: Any) -> dict:
    """A record as it reads back from JSON (so solved and resumed records compare and print the same)."""
    return json.loads(json.dumps(to_jsonable(record), allow_nan=False))


def _sha256_file(path: Path) -> str | None:
    """The SHA-256 of the file's bytes, or None when it cannot be read (then the loader has said why)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except (OSError, ValueError):
        return None
    return digest.hexdigest()


def _workload_file(source: str) -> Path | None:
    """The file a resolved workload's ``source`` was read from (:class:`~fleetopt.optimizer.io.instance
    .WorkloadSpec`: ``builtin:NAME``, the resolved path, ``inline`` or ``synthetic: ...``)."""
    from fleetopt.optimizer.io.catalog import BUILTIN_WORKLOADS, data_dir
    from fleetopt.optimizer.io.workloads import BUILTIN_PREFIX

    if source == "inline" or source.startswith("synthetic:"):
        return None
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX):]
        return data_dir() / BUILTIN_WORKLOADS[name] if name in BUILTIN_WORKLOADS else None
    return Path(source)


def input_files(path: str | Path, data: Mapping, instances: Sequence[Instance]) -> list[Path]:
    """The files the ``instances`` of the instance file ``path`` (its parsed content ``data``) are built from,
    each once, absolute: the instance file, each instance's workload file (a builtin one's shipped file), the
    ``--catalog`` files in effect, the files of the instance's ``catalog:`` key and each ``gpus`` entry's
    ``profile_file`` / ``model_config`` (relative ones against the instance file's folder, as the loader reads
    them). What this list misses (a ``config.json`` a catalogue names, a file only a ``--set`` names) is caught by
    :func:`instance_digest`."""
    from fleetopt.optimizer.io.catalog import active_catalog_files

    folder = Path(path).absolute().parent
    out: list[Path] = [Path(path)]
    out += [f for f in (_workload_file(inst.workload.source) for inst in instances) if f is not None]
    out += [Path(f).expanduser() for f in active_catalog_files()]
    section = data.get("catalog")
    named = [section] if isinstance(section, str) else section if isinstance(section, list) else []
    named += [g.get(key) for g in data.get("gpus") or [] if isinstance(g, Mapping)
              for key in ("profile_file", "model_config")]
    out += [folder / Path(f).expanduser() for f in named if isinstance(f, str) and f.strip()]
    unique: dict[str, Path] = {}
    for f in out:
        unique.setdefault(str(f.absolute()), f.absolute())
    return list(unique.values())


def instance_digest(instance: Instance) -> str:
    """The SHA-256 of a resolved instance (its pickle: the workload's lengths, every GPU option's profile, every
    field after the overrides): what a scenario's record was solved from."""
    return hashlib.sha256(pickle.dumps(instance, protocol=4)).hexdigest()


def _fleetopt_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetopt")
    except PackageNotFoundError:
        return "unknown"


STALE_KEYS = ("inputs", "fleetopt_version")
"""The keys of :func:`log_header` that say what the inputs held, not which run it is: a log that differs only
in them is stale, and is started anew on ``--resume`` (module docstring)."""


def log_header(instance_file: str | Path, sets: Sequence[str], sim_options: SimOptions | None,
               time_limit_s: float | None, inputs: Sequence[Path] | None = None) -> dict:
    """What a JSONL log's records depend on besides their own key: the ``--set`` overrides, the simulation
    options and the time limit (the run), and the SHA-256 of each of the ``inputs`` files (default: the
    instance file alone) by absolute path, with the fleetopt version (:data:`STALE_KEYS`)."""
    files = [Path(instance_file)] if inputs is None else list(inputs)
    return {"schema_version": SCHEMA_VERSION, "command": "whatif", "sets": list(sets),
            "sim_options": None if sim_options is None else sim_options.to_json(), "time_limit_s": time_limit_s,
            "inputs": {str(f.absolute()): _sha256_file(f) for f in files},
            "fleetopt_version": _fleetopt_version()}


def _changed_inputs(old: Mapping, new: Mapping) -> str:
    """The inputs that differ between two headers, in words (for the one stderr line)."""
    before, now = old.get("inputs") or {}, new.get("inputs") or {}
    changed = [f for f in now if f in before and before[f] != now[f]]
    added = [f for f in now if f not in before]
    gone = [f for f in before if f not in now]
    parts = [f"{f} changed" for f in changed] + [f"{f} is new" for f in added] + \
            [f"{f} is no longer read" for f in gone]
    if old.get("fleetopt_version") != new.get("fleetopt_version"):
        parts.append(f"fleetopt {old.get('fleetopt_version')} -> {new.get('fleetopt_version')}")
    return "; ".join(parts) or "its inputs changed"


def run_whatif(path: str | Path, sets: Sequence[str], sweep_texts: Sequence[str], *, backend: Backend = Backend(),  # noqa: B008 frozen dataclass default
               sim_options: SimOptions | None = None, time_limit_s: float | None = None,
               out: str | Path | None = None, resume: bool = False,
               on_step: Callable[[str], None] | None = None,
               on_warning: Callable[[str], None] | None = None) -> WhatIf:
    """Load and check the grid (:func:`load_scenarios`), solve the base and every scenario on ``backend``
    (:mod:`fleetopt.optimizer.workflows.executor`), streaming each record to the JSONL log ``out`` as it finishes;
    with ``resume`` the records already in ``out`` that were solved from the same inputs are read back, not solved
    again, and the others are solved again (module docstring, "The log and --resume"). ``on_step(message)``, if
    given, hears of each finished scenario (``scenario 3/100 done: ...``); ``on_warning(line)`` of records
    dropped on resume because their inputs changed (one line naming the changed file).

    Raises
    ------
    InstanceError
        Bad ``--sweep`` / ``--set`` (one line each, naming the flag and path), no sweep, a bad ``--out`` or
        ``--resume`` (:meth:`ResultLog.open`: a log of other flags), an unreachable ``--scheduler``.
    """
    if not sweep_texts:
        raise InstanceError("--sweep: give at least one --sweep PATH=v1,v2,...")
    if resume and out is None:
        raise InstanceError("--resume: continues the log of --out FILE.jsonl; give --out")
    sweeps = [parse_sweep(t) for t in sweep_texts]
    data, base, scenarios, instances = _load(path, sets, sweeps)
    todo = [(BASE_KEY, base)] + [(sc.key, instances[sc.key]) for sc in scenarios]
    settings = {sc.key: sc.settings_map for sc in scenarios}
    settings[BASE_KEY] = {}
    records: dict[str, dict] = {}
    log = None
    if out is not None:
        header = log_header(path, sets, sim_options, time_limit_s, input_files(path, data, [i for _, i in todo]))
        log, finished = ResultLog.open(out, header, resume=resume, stale_keys=STALE_KEYS)
        if log.stale_header is not None and on_warning is not None:
            on_warning(f"--resume: {out}: {_changed_inputs(log.stale_header, header)} since the log was written; "
                       "its records are dropped and every scenario is solved again")
        digests = {key: instance_digest(inst) for key, inst in todo}
        fresh = {k: v for k, v in finished.items() if k in settings and v.get("instance_sha256") == digests[k]}
        stale = sorted(k for k in finished if k in settings and k not in fresh)
        if stale and on_warning is not None:
            on_warning(f"--resume: {out}: {len(stale)} records were solved from other inputs than their scenarios "
                       f"now resolve to (e.g. {stale[0]}; a file the instance or catalogue refers to changed); "
                       "solving them again")
        records.update({k: _normalized(v["result"]) for k, v in fresh.items()})
    resumed = len(records)
    try:
        tasks = [Task(key, solve_scenario, (inst, sim_options, time_limit_s)) for key, inst in todo
                 if key not in records]
        for done, (key, result) in enumerate(iter_results(tasks, backend), start=1):
            rec = _normalized(result)
            if on_step is not None:
                on_step(f"scenario {done}/{len(tasks)} solved: {key} ({rec.get('status', '?')})")
            if log is not None:
                log.append(key, {"overrides": settings[key], "instance_sha256": digests[key], "result": rec})
            records[key] = rec
    finally:
        if log is not None:
            log.close()
    return WhatIf(base.name, str(path), tuple(sets), tuple(sweeps), tuple(scenarios), records[BASE_KEY],
                  tuple(records[sc.key] for sc in scenarios), base.slo.ttft_p99_s * MS_PER_S, base.slo.ttft_model,
                  sim_options, resumed)


# --------------------------------------------------------------------------------------------
# Benchmark
# --------------------------------------------------------------------------------------------

BENCH_INSTANCE = {"name": "azure-3gpu-whatif", "workload": {"cdf": "builtin:azure", "arrival_rate": 100},
                  "slo": {"ttft_p99_ms": 500},
                  "gpus": [{"name": "a10g", "profile": "A10G"}, {"name": "a100", "profile": "A100-80GB"},
                           {"name": "h100", "profile": "H100-80GB"}],
                  "pools": {"max_pools": 3, "max_context": 8192}, "objective": "cost", "allow_mixed_models": True}
"""The benchmark's instance: Azure conversations, A10G / A100 / H100, up to three pools, default TTFT model (the
seeds' Puzzle-3 catalogue: a 7B-class A10G beside 70B-class units, so it opts in to mixed models)."""


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished child processes (0 where the platform does not count them)."""
    try:
        import resource
    except ImportError:     # not on Windows
        return 0.0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_whatif_sweep(scenarios: int = 100, workers: int = 1, folder: str | Path | None = None,
                       target_s: float = 30.0) -> dict:
    """Wall time of a ``scenarios``-point λ sweep (5, 10, ... req/s) of :data:`BENCH_INSTANCE`, without
    simulation, on ``workers`` local processes (1: serial), through :func:`run_whatif` (loading and checking
    the grid included, no JSONL log), against ``target_s``; with the CPU seconds the sweep took, this process's
    and its workers' (``cpu_s``, the workers' where the platform counts a finished child's; ``cpu_s / workers`` is
    about the wall time on as many idle cores, the figure to read when other work shares the machine)."""
    import tempfile

    rates = ",".join(str(5 * (k + 1)) for k in range(scenarios))
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        path = Path(tmp) / "azure_3gpu.json"
        path.write_text(json.dumps(BENCH_INSTANCE))
        t0, cpu0, children0 = time.perf_counter(), time.process_time(), _children_cpu_s()
        result = run_whatif(path, (), [f"workload.arrival_rate={rates}"], backend=Backend(workers=workers))
        wall_s = time.perf_counter() - t0
        # the workers are joined when run_whatif returns
        cpu_s = time.process_time() - cpu0 + _children_cpu_s() - children0
    target = target_s
    return {"name": f"whatif: {scenarios}-scenario arrival-rate sweep (Azure, 3 GPU types, max_pools 3)",
            "scenarios": len(result.records), "workers": workers, "median_s": wall_s, "repeats": 1,
            "target_s": target, "meets_target": wall_s <= target,
            "solved": sum(r["fleet"] is not None for r in result.records),
            "cpu_s": cpu_s, "cpu_s_per_scenario": cpu_s / (len(result.records) + 1)}
