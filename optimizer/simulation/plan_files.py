"""A solved plan read back from ``fleetopt solve --json`` output, for ``fleetopt simulate --plan FILE``.

A length-routing plan could be retyped as a ``--fleet`` spec (``solve`` prints it), but a split-routing
plan cannot: its pools may overlap and its routing (req/s per elementary segment and pool) is a table. The
solve JSON holds both, so ``simulate`` reads them back: ``rank`` picks a solution (default: the plan at the
JSON's top level, which is the verified choice after ``--verify-top``). Every problem is one line naming the
file and the field.

The file is checked before anything is simulated: it must come from ``solve`` on the same instance with the
same ``--set`` overrides (its top-level ``overrides``; a file without the key was solved without any), every
pool is a mapping of whole numbers (no booleans, no fractions; the batch cap at most the sequences the pool's
window holds, as ``--fleet ...#SEQS`` requires; a disaggregated pair is its two rows, ``phase`` ``prefill`` then
``decode``, read back as one pool with its decode stage and the instance's KV transfer), and the plan is evaluated
analytically as the simulator will
evaluate it: a length plan's pools must tile ``(0, pools.max_context]``
(:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`), a split plan's routing must fit its pools and the workload
(:func:`fleetopt.optimizer.plan.split_candidates.evaluate_routing`).

A semantic plan (an instance with a ``semantic`` section) is read back with its classes: each pool's ``role``
(``small`` or ``large``; a pool without one takes the class of its GPU option's model, and a role must match
it) and the rule it runs, the ``share`` of the plan's ``semantic`` block (the top-level plan's), or for a
solution without one the instance's rule whose small-model share :math:`\\pi_{small}` equals the plan's small pools'
share of the arrival rate (one rule must match). Each class's pools must tile :math:`(0, B_c]` in order
(:mod:`fleetopt.optimizer.simulation.simulate`, "Semantic plans").
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from fleetopt.models.fleet import PHASES, PoolPlan

from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.plan.evaluate import MAX_FLEET_REPLICAS
from fleetopt.optimizer.io.solve_json import json_kind, read_solve_plan, whole_number
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.io.overrides import override_settings, set_flags
from fleetopt.optimizer.io.schema import MAX_CONTEXT_LIMIT_TOKENS
from fleetopt.optimizer.simulation.pairs import analytic_fleet
from fleetopt.optimizer.simulation.simulate import (SemanticRouting, pair_plan, planned_router, roles_of,
                                                    semantic_problems, semantic_analytic)

if TYPE_CHECKING:   # a split plan's routing loads with the first plan that has one
    from fleetopt.optimizer.plan.split_candidates import SplitRouting

__all__ = ["SolvedPlan", "load_solved_plan", "MAX_REPLICAS"]

MAX_REPLICAS = MAX_FLEET_REPLICAS
"""Largest replica count a plan file may give a pool (the bound of a `--fleet` spec)."""


class SolvedPlan:
    """The pools of one solved plan (replicas, batch caps and compression fixed) and its routing (or None)."""

    def __init__(self, pools: list[PoolPlan], routing: SplitRouting | None, rank: int | None,
                 semantic: SemanticRouting | None = None) -> None:
        self.pools = pools
        self.routing = routing
        self.rank = rank
        self.semantic = semantic
        """A semantic plan's rule and classes (module docstring); None for one model class."""

    @property
    def router(self) -> str:
        """The router the plan was solved for (:func:`fleetopt.optimizer.simulation.simulate.planned_router`)."""
        return planned_router(self.pools, self.routing)


def load_solved_plan(path: str | Path, instance: Instance, rank: int | None = None) -> SolvedPlan:
    """Read plan ``rank`` (1-based; None: the top-level plan) of a ``solve --json`` file for ``instance``
    (:func:`fleetopt.optimizer.io.solve_json.read_solve_plan`, the reader ``export`` shares, then the checks
    against the instance)."""
    read = read_solve_plan(path, rank, flag="--rank", instance=instance.name)
    path, fail, field, raw = read.path, read.problem, read.field, read.pools
    _check_overrides(read.document.get("overrides", []), instance, fail)
    pools = _pools(raw, field, instance, fail)
    routing = _routing(read.plan.get("routing"), f"{field}routing", fail)
    if instance.semantic is not None:
        semantic = _semantic(read.plan, raw, pools, field, instance, fail)
        _check_semantic(instance, pools, semantic, field, path)
        return SolvedPlan(pools, None, rank, semantic)
    if any(isinstance(p, dict) and "role" in p for p in raw):
        raise fail(f"{field}pools", "the plan's pools have roles (a semantic plan), but the instance has no "
                                    "semantic section")
    _check_plan(instance, pools, routing, field, path)
    return SolvedPlan(pools, routing, rank)


_kind, _whole = json_kind, whole_number


def _check_overrides(recorded, instance: Instance, fail) -> None:
    """The plan was solved with the ``--set`` overrides this run loaded the instance with (as sets of values)."""
    if not isinstance(recorded, list) or not all(isinstance(t, str) for t in recorded):
        raise fail("overrides", f"must be a list of PATH=VALUE strings; got {_kind(recorded)}")
    if override_settings(recorded) == override_settings(instance.overrides):
        return
    solved, loaded = set_flags(recorded) or "no --set", set_flags(instance.overrides) or "no --set"
    fix = f"pass {solved}" if recorded else "drop the --set flags"
    raise fail("overrides", f"the plan was solved with {solved}, but the instance was loaded with {loaded}; "
                            f"{fix} to simulate it")


def _pools(raw: list, field: str, instance: Instance, fail) -> list[PoolPlan]:
    """The plan's pools: one PoolPlan per aggregated pool (``phase`` ``both`` or absent), and one per P/D pair, whose
    two rows (``phase`` ``prefill`` then ``decode``, over the same segment) become a PoolPlan with ``decode`` and the
    instance's KV transfer of that pair of options (:func:`fleetopt.optimizer.simulation.simulate.pair_plan`)."""
    out, k = [], 0
    while k < len(raw):
        where = f"{field}pools[{k}]"
        phase = raw[k].get("phase", "both") if isinstance(raw[k], dict) else "both"
        if phase not in PHASES:
            shown = repr(phase) if isinstance(phase, str) else _kind(phase)
            raise fail(f"{where}.phase", f"{shown} is not allowed; give one of {', '.join(PHASES)}")
        if phase == "decode":
            raise fail(f"{where}.phase", "a decode row must follow its pair's prefill row")
        first = _pool(raw[k], where, instance, fail)
        if phase == "both":
            out.append(first)
            k += 1
            continue
        nxt = raw[k + 1] if k + 1 < len(raw) else None
        then = f"{field}pools[{k + 1}]"
        if not isinstance(nxt, dict) or nxt.get("phase") != "decode":
            raise fail(then if nxt is not None else where, "a prefill row must be followed by its pair's decode row "
                                                           "(phase decode, the same min_tokens and max_tokens)")
        second = _pool(nxt, then, instance, fail)
        if (second.lo_tokens, second.hi_tokens) != (first.lo_tokens, first.hi_tokens):
            raise fail(then, f"the decode row serves {second.lo_tokens}-{second.hi_tokens}, its prefill row "
                             f"{first.lo_tokens}-{first.hi_tokens}; a pair's rows serve one segment")
        try:
            out.append(pair_plan(instance, _Row(first), _Row(second), where))
        except InstanceError as err:
            raise fail(where, str(err).removeprefix(f"{where}: ")) from None
        k += 2
    return out


class _Row:
    """A parsed pool as :func:`pair_plan` reads a row (``min_tokens``, ``max_tokens``, ``gpu``, ``replicas``,
    ``max_num_seqs``)."""

    def __init__(self, p: PoolPlan) -> None:
        self.min_tokens, self.max_tokens, self.gpu, self.replicas = p.lo_tokens, p.hi_tokens, p.gpu, p.replicas
        self.max_num_seqs = p.max_num_seqs


def _pool(p, where: str, instance: Instance, fail) -> PoolPlan:
    """One pool of a plan: a mapping of whole numbers, a GPU of the instance and a batch cap its window holds."""
    if not isinstance(p, dict):
        raise fail(where, f"must be a mapping with min_tokens, max_tokens, gpu, replicas and max_num_seqs; "
                          f"got {_kind(p)}")
    missing = [k for k in ("min_tokens", "max_tokens", "gpu", "replicas", "max_num_seqs") if k not in p]
    if missing:
        raise fail(where, f"needs min_tokens, max_tokens, gpu, replicas and max_num_seqs; missing {', '.join(missing)}")
    top = instance.pools.max_context_tokens
    counts = {}
    for key, low, high, allowed in (("min_tokens", 0, top - 1, f"a whole number of tokens in [0, {top})"),
                                    ("max_tokens", 1, top, f"a whole number of tokens in [1, {top}]"),
                                    ("replicas", 1, MAX_REPLICAS, f"a whole number in [1, {MAX_REPLICAS}]"),
                                    ("max_num_seqs", 1, MAX_REPLICAS, "a whole number >= 1")):
        counts[key] = _whole(p[key], low, high)
        if counts[key] is None:
            raise fail(f"{where}.{key}", f"{_kind(p[key])} is not allowed; give {allowed}")
    lo, hi, cap = counts["min_tokens"], counts["max_tokens"], counts["max_num_seqs"]
    if hi <= lo:
        raise fail(where, f"the pool {lo}-{hi} is empty; max_tokens must exceed min_tokens")
    gpu = p["gpu"]
    if not isinstance(gpu, str) or gpu.strip().lower() not in {o.name.lower() for o in instance.gpus}:
        raise fail(f"{where}.gpu", f"{gpu!r} is not a GPU of instance '{instance.name}'; known: "
                                   f"{', '.join(o.name for o in instance.gpus)}")
    g = instance.gpu(gpu)
    gamma = p.get("compress_gamma", 1.0)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (math.isfinite(gamma) and gamma >= 1):
        raise fail(f"{where}.compress_gamma", f"{_kind(gamma)} is not allowed; give a finite number >= 1")
    held = int(g.profile.n_slots(hi))
    if cap > held:
        raise fail(f"{where}.max_num_seqs", f"{cap} is more than the {held} sequences a {hi}-token window holds on "
                                            f"{g.name}; give at most {held}")
    return PoolPlan(lo, hi, g.name, g.profile, counts["replicas"], g.availability, float(gamma), cap)


def _routing(routing, where: str, fail) -> SplitRouting | None:
    """A split plan's routing: whole-number boundaries and a table of real rates (checked further when the
    plan is evaluated); None when the plan has none."""
    if routing is None:
        return None
    if not isinstance(routing, dict) or not {"boundaries_tokens", "rate_req_per_s"} <= routing.keys():
        raise fail(where, f"must be a mapping with boundaries_tokens and rate_req_per_s; got {_kind(routing)}")
    b = routing["boundaries_tokens"]
    if not isinstance(b, list):
        raise fail(f"{where}.boundaries_tokens", f"{_kind(b)} is not allowed; give a list of whole token counts")
    for k, x in enumerate(b):
        if _whole(x, 0, MAX_CONTEXT_LIMIT_TOKENS) is None:
            raise fail(f"{where}.boundaries_tokens[{k}]", f"{_kind(x)} is not allowed; give a whole token count "
                                                          f"in [0, {MAX_CONTEXT_LIMIT_TOKENS}]")
    rates = routing["rate_req_per_s"]
    if not isinstance(rates, list) or not all(
            isinstance(row, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in row)
            for row in rates):
        raise fail(f"{where}.rate_req_per_s", f"{_kind(rates)} is not allowed; give a list of rows of numbers "
                                              "(req/s, one row per length segment, one column per pool)")
    from fleetopt.optimizer.plan.split_candidates import SplitRouting

    try:
        return SplitRouting.from_array(b, rates)
    except ValueError as err:  # ragged rows
        raise fail(f"{where}.rate_req_per_s", f"not a table ({err})") from None


def _semantic(plan: dict, raw: list, pools: list[PoolPlan], field: str, instance: Instance,
              fail) -> SemanticRouting:
    """A semantic plan's classes (module docstring): each pool's role (given, or its option's model) and the rule
    it runs (the plan's ``semantic.share``, or the instance's rule whose small-model share the plan's pools carry)."""
    spec = instance.semantic
    assert spec is not None
    if plan.get("routing") is not None:
        raise fail(f"{field}routing", "a semantic plan routes each model class by length; it has no routing table")
    served = roles_of(instance, pools)
    for k, (p, role) in enumerate(zip(raw, served)):
        given = p.get("role", role)
        if given not in ("small", "large"):
            shown = repr(given) if isinstance(given, str) else _kind(given)
            raise fail(f"{field}pools[{k}].role", f"{shown} is not allowed; give small or large")
        if given != role:
            raise fail(f"{field}pools[{k}].role", f"{given!r}, but {pools[k].gpu} serves the {role} model "
                                                  f"({spec.model_of(role)})")
    block = plan.get("semantic")
    if block is not None:
        share = block.get("share") if isinstance(block, dict) else None
        if not isinstance(share, str) or share not in spec.labels:
            raise fail(f"{field}semantic.share", f"{_kind(share)} is not allowed; give one of the instance's shares "
                                                 f"({', '.join(spec.labels)})")
        return SemanticRouting(spec.rules[spec.labels.index(share)], served, share)
    rates = [p.get("arrival_rate") for p in raw]
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in rates):
        raise fail(f"{field}semantic", "the plan has no semantic block and its pools no arrival_rate to tell which "
                                       "share it runs; give the solve's top-level plan")
    total = sum(rates)
    small = sum(r for r, role in zip(rates, served) if role == "small") / total if total > 0 else 0.0
    match = [k for k, large in enumerate(spec.large_shares) if abs((1.0 - large) - small) <= 1e-6]
    if len(match) != 1:
        raise fail(f"{field}semantic", f"the plan has no semantic block and its small pools carry {small:.4g} of the "
                                       f"requests, which {'no' if not match else 'more than one'} share of the "
                                       f"instance gives ({', '.join(spec.labels)}); give the solve's top-level plan")
    k = match[0]
    return SemanticRouting(spec.rules[k], served, spec.labels[k])


def _check_semantic(instance: Instance, pools: list[PoolPlan], semantic: SemanticRouting, field: str,
                    path: Path) -> None:
    """Evaluate a semantic plan as the simulator will: each class's pools tile its range, then
    :func:`fleetopt.optimizer.plan.semantic.evaluate_semantic`; any problem one ``FILE: field: message`` line."""
    from fleetopt.optimizer.simulation.options import SimOptions

    problems = semantic_problems(instance, pools, SimOptions(router="length"), None, None, semantic)
    if problems:
        raise InstanceError([format_problem(path, f"{field}pools", line.removeprefix("semantic: "))
                             for line in problems])
    try:
        semantic_analytic(instance, pools, semantic)
    except (ValueError, ArithmeticError) as err:
        raise InstanceError(format_problem(path, f"{field}pools", f"the plan cannot be evaluated ({err})")) from None


def _check_plan(instance: Instance, pools: list[PoolPlan], routing, field: str, path: Path) -> None:
    """Evaluate the plan as the simulator will; any problem becomes one ``FILE: field: message`` line."""

    def fail(where: str, message: str) -> InstanceError:
        return InstanceError(format_problem(path, where, message))

    if routing is not None:
        from fleetopt.optimizer.plan.split_candidates import evaluate_routing

        try:
            evaluate_routing(instance, pools, routing)
        except InstanceError as err:
            raise InstanceError([format_problem(path, f"{field}routing", line.removeprefix("routing: "))
                                 for line in err.problems]) from None
        return
    top, edge = instance.pools.max_context_tokens, 0
    for k, p in enumerate(pools):
        if p.lo_tokens != edge:
            raise fail(f"{field}pools[{k}].min_tokens", f"{p.lo_tokens} should be {edge}: without a routing, the "
                                                         f"pools tile (0, {top}] in order")
        edge = p.hi_tokens
    if edge != top:
        raise fail(f"{field}pools[{len(pools) - 1}].max_tokens", f"{edge} should be pools.max_context {top}; "
                                                                 f"without a routing, the pools tile (0, {top}]")
    try:
        analytic_fleet(instance, pools)
    except (ValueError, ArithmeticError) as err:
        raise fail(f"{field}pools", f"the plan cannot be evaluated ({err})") from None
