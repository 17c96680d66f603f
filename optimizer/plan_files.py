"""A solved plan read back from ``fleetopt solve --json`` output, for ``fleetopt simulate --plan FILE``.

A length-routing plan could be retyped as a ``--fleet`` spec (``solve`` prints it), but a split-routing
plan cannot: its pools may overlap and its routing (req/s per elementary segment and pool) is a table. The
solve JSON holds both, so ``simulate`` reads them back: ``rank`` picks a solution (default: the plan at the
JSON's top level, which is the verified choice after ``--verify-top``). Every problem is one line naming the
file and the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from models.fleet import PoolPlan

from .errors import InstanceError, format_problem
from .instance import Instance
from .split import SplitRouting

__all__ = ["SolvedPlan", "load_solved_plan"]


class SolvedPlan:
    """The pools of one solved plan (replicas, batch caps and compression fixed) and its routing (or None)."""

    def __init__(self, pools: list[PoolPlan], routing: SplitRouting | None, rank: int | None) -> None:
        self.pools = pools
        self.routing = routing
        self.rank = rank

    @property
    def router(self) -> str:
        """The router the plan was solved for: ``split``, ``compress`` (a pool has ``@gamma``) or ``length``."""
        if self.routing is not None:
            return "split"
        return "compress" if any(p.compress_gamma > 1 for p in self.pools) else "length"


def load_solved_plan(path: str | Path, instance: Instance, rank: int | None = None) -> SolvedPlan:
    """Read plan ``rank`` (1-based; None: the top-level plan) of a ``solve --json`` file for ``instance``."""
    path = Path(path)

    def fail(field: str, message: str) -> InstanceError:
        return InstanceError(format_problem(path, field, message))

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise fail("", "no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise fail("", f"cannot read it ({err.__class__.__name__})") from None
    except json.JSONDecodeError as err:
        raise fail("", f"not JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict) or data.get("command") != "solve":
        raise fail("command", "not the JSON output of 'fleetopt solve'")
    if data.get("instance") != instance.name:
        raise fail("instance", f"the plan was solved for instance '{data.get('instance')}', not '{instance.name}'")
    if rank is None:
        plan, field = data, ""
        if not data.get("pools"):
            raise fail("pools", f"the solve found no plan (status {data.get('status')})")
    else:
        solutions = data.get("solutions") or []
        if not 1 <= rank <= len(solutions):
            raise fail("solutions", f"--rank {rank}: the file holds {len(solutions)} solution(s)")
        plan, field = solutions[rank - 1], f"solutions[{rank - 1}]."
    pools = []
    for k, p in enumerate(plan.get("pools") or []):
        where = f"{field}pools[{k}]"
        try:
            lo, hi, gpu = int(p["min_tokens"]), int(p["max_tokens"]), str(p["gpu"])
            replicas, cap = int(p["replicas"]), int(p["max_num_seqs"])
            gamma = float(p.get("compress_gamma", 1.0))
        except (KeyError, TypeError, ValueError) as err:
            raise fail(where, f"needs min_tokens, max_tokens, gpu, replicas and max_num_seqs ({err})") from None
        if gpu.lower() not in {o.name.lower() for o in instance.gpus}:
            raise fail(f"{where}.gpu", f"'{gpu}' is not a GPU of instance '{instance.name}'")
        g = instance.gpu(gpu)
        if replicas < 1 or cap < 1 or not math.isfinite(gamma) or gamma < 1:
            raise fail(where, "replicas and max_num_seqs must be >= 1 and compress_gamma >= 1")
        pools.append(PoolPlan(lo, hi, g.name, g.profile, replicas, g.availability, gamma, cap))
    routing = plan.get("routing")
    if routing is not None:
        try:
            routing = SplitRouting.from_array(routing["boundaries_tokens"], routing["rate_req_per_s"])
        except (KeyError, TypeError, ValueError) as err:
            raise fail(f"{field}routing", f"needs boundaries_tokens and rate_req_per_s tables ({err})") from None
    return SolvedPlan(pools, routing, rank)
