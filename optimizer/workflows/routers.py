r"""Routers side by side (``fleetopt simulate --routers length,compress,random,spillover``).

One fleet, one simulation per router, all through
:func:`fleetopt.optimizer.simulation.simulate.simulate_plan` with the same options and the same seed. That is
common random numbers: each replication's generator is the same child of ``SeedSequence(seed)`` for every
router, and the request stream (arrival instants, then lengths) is drawn from it *before* the router draws
anything (:func:`fleetopt.optimizer.simulation.simulate._replication`), so every router sees the same requests
and differences come from the routing alone. The shared stream is recorded: ``simulated_seconds`` (the sum of the
replications' last-arrival instants, read from the engine's runs) must agree across routers, and
``stream_sha256`` is a digest of every replication's arrival instants and lengths as drawn for the seed.

Fleets with compress-and-route pools (``@GAMMA``): ``length`` and ``spillover`` cannot route the compressed
band, so they run the same pools with the same replica counts and no ``@GAMMA`` (the band goes to the pool above,
as a length router sends it); ``compress`` runs the fleet as given. A fleet without ``@GAMMA`` gives
``compress`` nothing to compress: it routes as ``length`` (a note says so).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

import numpy as np

from fleetopt.models.fleet import PoolPlan

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.simulation.options import SimOptions
from fleetopt.optimizer.simulation.records import SimReport
from fleetopt.optimizer.simulation.simulate import _stream, plans_from_spec, simulate_plan

__all__ = ["SIDE_BY_SIDE_ROUTERS", "RouterRun", "RouterComparison", "parse_routers", "stream_digest",
           "compare_routers"]

SIDE_BY_SIDE_ROUTERS = ("length", "compress", "random", "spillover")
"""The routers ``--routers`` takes (``split`` needs a share matrix or a split plan: simulate it alone)."""


@dataclass(frozen=True)
class RouterRun:
    router: str
    report: SimReport
    note: str = ""

    @property
    def utilization_sim(self) -> float:
        """Fleet utilisation: the pools' simulated utilisations weighted by their batch places (replicas x cap)."""
        w = np.array([p.analytic.replicas * p.analytic.max_num_seqs for p in self.report.pools], dtype=float)
        u = np.array([p.utilization_sim for p in self.report.pools], dtype=float)
        return float(np.dot(w, u) / w.sum()) if w.sum() > 0 else float("nan")

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.simulation._RouterRun`)."""
        from fleetopt.optimizer.output.contract import build
        from fleetopt.optimizer.output.contract.simulation import _RouterPool, _RouterRun

        r = self.report
        return build(_RouterRun, r, router=self.router, utilization=self.utilization_sim, note=self.note,
                     pools=[build(_RouterPool, pool=f"{p.analytic.min_tokens}-{p.analytic.max_tokens}:{p.analytic.gpu}",
                                  replicas=p.analytic.replicas, ttft_p99_ms=p.ttft_p99_ms_sim,
                                  ttft_p99_ci_ms=p.ttft_p99_ci_ms, slo_attainment=p.slo_attainment,
                                  utilization=p.utilization_sim, slo_met=p.slo_met_sim) for p in r.pools],
                     report=r.to_json())


@dataclass(frozen=True)
class RouterComparison:
    instance: str
    fleet: str
    slo_ttft_p99_ms: float
    options: SimOptions
    stream_sha256: str
    runs: tuple[RouterRun, ...]

    def to_json(self) -> dict:
        """The document, built by its model
        (:class:`fleetopt.optimizer.output.contract.simulation.SimulateRoutersDocument`)."""
        from fleetopt.optimizer.output.contract import build, envelope
        from fleetopt.optimizer.output.contract.simulation import SimulateRoutersDocument

        return build(SimulateRoutersDocument, self, **envelope("simulate --routers", self.instance),
                     source="simulated (common random numbers)", seed=self.options.seed,
                     options=self.options.to_json(), routers=[r.to_json() for r in self.runs])


def parse_routers(text: str, field: str = "--routers") -> tuple[str, ...]:
    """``"length,random"`` -> ``("length", "random")`` (order kept, repeats dropped), each one of
    :data:`SIDE_BY_SIDE_ROUTERS`.

    Examples
    --------
    >>> parse_routers("length, random,length")
    ('length', 'random')
    """
    names = [x.strip() for x in str(text).split(",") if x.strip()]
    bad = [x for x in names if x not in SIDE_BY_SIDE_ROUTERS]
    if not names or bad:
        what = f"unknown router {bad[0]!r}" if bad else "no router given"
        raise InstanceError(f"{field}: {what}; give a comma-separated list of {', '.join(SIDE_BY_SIDE_ROUTERS)}")
    return tuple(dict.fromkeys(names))


def stream_digest(instance: Instance, options: SimOptions, requests_per_replication: int) -> str:
    """SHA-256 of the request streams of every replication (arrival instants, prompt and output tokens), drawn as
    :func:`~fleetopt.optimizer.simulation.simulate.simulate_plan` draws them for ``options.seed``."""
    h = hashlib.sha256()
    for child in np.random.SeedSequence(options.seed).spawn(int(options.replications)):
        req = _stream(instance, requests_per_replication, np.random.default_rng(child), options)
        for a in (req.arrival_at_s, req.prompt_tokens, req.output_tokens):
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def compare_routers(instance: Instance, fleet: str, routers, options: SimOptions = SimOptions(), *,  # noqa: B008 frozen dataclass default
                    spill_bound: int | None = None, progress=None) -> RouterComparison:
    """Simulate ``fleet`` once per router of ``routers`` with ``options`` (its ``router`` is replaced; module
    docstring); ``spill_bound`` is the spillover run's (None: the default). ``progress(router)`` is called
    before each run.

    Raises
    ------
    InstanceError
        An unknown router, options with a precision target (each router would stop at its own length, so the
        streams would differ) or a trace replay, or a fleet the simulator cannot run.
    """
    routers = parse_routers(",".join(routers))
    if options.precision is not None:
        raise InstanceError("--precision: each router would double its own requests; give --requests instead "
                            "with --routers (the routers must see the same stream)")
    if options.arrivals == "trace":
        raise InstanceError("--arrivals: a trace replay is one deterministic run; --routers compares routers on "
                            "a random stream (poisson, mmpp or diurnal)")
    plans = plans_from_spec(instance, fleet)
    fixed = evaluate_plans(instance, plans)
    counted = [replace(p, replicas=q.replicas) for p, q in zip(plans, fixed.pools)]
    has_gamma = any(p.compress_gamma > 1 for p in plans)
    runs = []
    for name in routers:
        note = ""
        pools: list[PoolPlan] = plans
        if has_gamma and name in ("length", "spillover"):
            pools = [replace(p, compress_gamma=1.0) for p in counted]
            note = "ran without @GAMMA (same replicas): the compressed band goes to the pool above"
        elif name == "compress" and not has_gamma:
            note = "no @GAMMA pool: nothing to compress, routes as length"
        opts = replace(options, router=name, spill_bound=spill_bound if name == "spillover" else None)
        if progress is not None:
            progress(name)
        runs.append(RouterRun(name, simulate_plan(instance, pools, opts), note))
    digest = stream_digest(instance, options, int(np.ceil(options.requests / options.replications)))
    spec = ",".join(f"{q.min_tokens}-{q.max_tokens}:{q.gpu}x{q.replicas}"
                    + (f"@{q.compress_gamma:g}" if q.compress_gamma > 1 else "") for q in fixed.pools)
    return RouterComparison(instance.name, spec, instance.slo.ttft_p99_s * 1000.0, options, digest, tuple(runs))
