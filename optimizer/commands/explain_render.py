"""Rendering of ``fleetopt solve --explain`` (:func:`fleetopt.optimizer.plan.explain.explain_plan`): the limits
that bind and what relaxing each is worth, then each pool's bottleneck and headroom, then, for each pool on a
``gpus`` entry with ``tp``/``dtype`` lists, its configurations compared and why the chosen one wins.
:func:`explain_with_headroom` is the call the ``solve`` command makes (it passes the headroom bisection of the
workflows layer down to the plan layer)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from fleetopt.optimizer.plan.explain import Explanation, explain_plan
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance
from fleetopt.optimizer.workflows.headroom import headroom

__all__ = ["render_explanation", "explain_with_headroom"]


def explain_with_headroom(instance, report, options=None) -> Explanation:
    """:func:`explain_plan` with re-solves by :func:`solve_instance` (``options``, without the baseline) and each
    pool's headroom from :func:`fleetopt.optimizer.workflows.headroom.headroom`."""
    from dataclasses import replace

    if instance.semantic is not None:
        from fleetopt.optimizer.errors import InstanceError

        raise InstanceError("--explain: explaining a semantic (multi-model) plan is not supported yet; solve without "
                            "--explain")
    opts = SolveOptions(compute_baseline=False) if options is None else replace(options, compute_baseline=False, top=1)
    return explain_plan(instance, report, resolve=lambda inst: solve_instance(inst, opts), headroom=headroom)


def _num(x, digits: int = 2) -> str:
    if x is None:
        return "-"
    return "none" if not math.isfinite(x) else f"{x:,.{digits}f}"


def render_explanation(console: Console, explanation: Explanation) -> None:
    """Two tables: relaxations (each an optimal re-solve) and pool bottlenecks (analytic)."""
    e = explanation
    unit = e.objective_unit
    t = Table(title=f"{e.instance}: what relaxing each limit is worth (objective {e.objective} = "
                    f"{e.objective_value:,.4g} {unit}; each row an optimal re-solve with the --set shown)",
              title_justify="left")
    for name in ("limit", "now", "relaxed to", f"objective {unit}", f"worth {unit}", "binds", "re-solved with"):
        t.add_column(name, justify="left" if name in ("limit", "binds", "re-solved with") else "right", no_wrap=True)
    for r in e.relaxations:
        t.add_row(r.limit, f"{r.now:,.6g}", f"{r.relaxed:,.6g}", _num(r.objective, 4), _num(r.worth, 4),
                  "-" if r.binding is None else ("yes" if r.binding else "no"),
                  f"--set '{r.override}'" + ("" if r.objective is not None else f" ({r.status})"))
    console.print(t)
    p = Table(title=f"pool bottlenecks of {e.fleet} (analytic: what fails with one replica fewer; headroom: "
                    f"largest fleet req/s the pool carries at its count, now {e.arrival_rate:g})", title_justify="left")
    for name in ("pool", "bottleneck", "why", "max req/s", "then limited by"):
        p.add_column(name, justify="right" if name == "max req/s" else "left", no_wrap=name != "why")
    for b in e.pools:
        p.add_row(b.pool, b.bottleneck, b.detail, _num(b.max_arrival_rate), b.limited_by or "-")
    console.print(p)
    for pc in e.configurations:
        c = Table(title=f"pool {pc.pool}: the tp/dtype configurations of gpus entry {pc.entry} in its place (each "
                        "sized to its least count on the pool's range; analytic)", title_justify="left")
        for name in ("configuration", "replicas", "GPUs", "$/hr", "kW", "verdict"):
            c.add_column(name, justify="left" if name in ("configuration", "verdict") else "right",
                         no_wrap=name != "verdict")
        for o in pc.options:
            c.add_row(o.option + (" *" if o.chosen else ""), _num(o.replicas, 0), _num(o.gpus, 0),
                      _num(o.cost_per_hr), _num(o.power_kw), o.verdict)
        console.print(c)
        console.print(f"  why {pc.chosen}: {pc.why}", markup=False)
    binding = ", ".join(r.limit for r in e.binding) or "none"
    console.print(f"binding limits (relaxing lowers the objective): {binding}", markup=False)
