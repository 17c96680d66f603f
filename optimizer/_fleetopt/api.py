"""The notebook API: ``import fleetopt`` (or ``from fleetopt import api``).

``fleetopt.load``, ``fleetopt.solve``, ``fleetopt.evaluate``, ``fleetopt.simulate`` and ``fleetopt.verify``
are the functions below (the package root forwards them on first use, so ``import fleetopt`` stays cheap).
Each takes explicit keyword arguments and returns a report with ``to_json()`` (the CLI's JSON contract),
``to_frame()`` (a pandas table: ``pip install "fleetopt[frames]"``) and ``_repr_html_`` (a table in a
notebook); ``docs/api.md`` has a worked example.

The other names are those of :mod:`fleetopt.optimizer.api` (the CLI is a thin layer over the same calls):

>>> from fleetopt import api
>>> from fleetopt.optimizer import api as pipeline
>>> api.load is pipeline.load and api.solve is pipeline.solve and api.verify is pipeline.verify
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from fleetopt.optimizer.api import *  # noqa: F401,F403  (the public names, listed in its __all__)
from fleetopt.optimizer.api import __all__ as _pipeline_all
from fleetopt.optimizer.api import EvaluationReport, evaluate_report, simulate_report
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.errors import FleetoptError, InstanceError
from fleetopt.optimizer.simulation.options import EngineOptions, SimOptions

__all__ = [*_pipeline_all, "evaluate", "simulate", "NOTEBOOK", "FleetoptError", "InstanceError"]

NOTEBOOK = ("load", "solve", "evaluate", "simulate", "verify")
"""The notebook functions, also reachable as ``fleetopt.<name>``."""


def evaluate(instance: Instance, fleet: str | Sequence[str]) -> EvaluationReport:
    """Price one fleet spec (``"0-4096:a100x3,4096-65536:a100"``) or several, analytically, next to the
    homogeneous baseline: :func:`fleetopt.optimizer.api.evaluate_report` (``fleetopt evaluate``)."""
    return evaluate_report(instance, fleet)


def simulate(instance: Instance, fleet: str | None = None, *, plan_file: str | Path | None = None,
             rank: int | None = None, requests: int = SimOptions.requests,
             replications: int = SimOptions.replications, seed: int = SimOptions.seed,
             mode: str = SimOptions.mode, router: str = SimOptions.router, dispatch: str = SimOptions.dispatch,
             arrivals: str = SimOptions.arrivals, precision: float | None = SimOptions.precision,
             engine: EngineOptions = EngineOptions(), keep_requests: bool = False,  # noqa: B008 frozen dataclass default
             progress: Callable[[int, int], None] | None = None):
    """Simulate a fleet spec or a plan of a ``solve --json`` file (``plan_file``, solution ``rank``):
    :func:`fleetopt.optimizer.api.simulate_report` (``fleetopt simulate``) with these settings of
    :class:`~fleetopt.optimizer.simulation.options.SimOptions` (the rest at their defaults).

    ``keep_requests=True`` keeps every measured request's TTFT and TPOT, per pool, for plotting:
    ``report.latencies()``. Returns a :class:`fleetopt.optimizer.simulation.records.SimReport`.
    """
    options = SimOptions(requests=requests, replications=replications, seed=seed, mode=mode, router=router,
                         dispatch=dispatch, arrivals=arrivals, precision=precision, engine=engine)
    return simulate_report(instance, fleet, options, plan_file=plan_file, rank=rank, progress=progress,
                           keep_requests=keep_requests)
