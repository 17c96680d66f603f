r"""Tokens per watt and dollars per million output tokens against utilisation (``fleetopt tpw --rho-sweep``).

For a fixed fleet (a ``--fleet`` spec, counts fixed as ``fleetopt evaluate`` sizes them at the instance's rate)
and each target utilisation :math:`\rho`, every pool :math:`p` is brought to :math:`\rho` on its own: under
length routing it receives the fixed share :math:`s_p` of the fleet rate, so the fleet rate
:math:`\lambda_p(\rho)` with

.. math:: u_p\big(s_p\, \lambda_p(\rho)\big) = \rho

is found by Brent's method (:func:`scipy.optimize.brentq`, to :data:`RHO_TOLERANCE`) on the analytic
evaluation (:func:`fleetopt.optimizer.plan.evaluate.evaluate_plans`), where :math:`u_p` is the pool's evaluated
utilisation ``PoolResult.utilization`` (the batched model: mean batch over the batch cap,
:math:`\bar b / n`; the slot models: :math:`\lambda E[S] / (N n)`). An unstable pool (:math:`u = \infty`) is read
as :math:`1 + (\rho_f - 1)` with :math:`\rho_f` its capacity load, which joins :math:`u \to 1` at the
saturation point continuously, so the root is bracketed. At that rate

.. math::

    \mathrm{tok/W}_p = \frac{\lambda_p E[l_{out}]_p}{P_p}, \qquad
    \$/\mathrm{Mtok}_p = \frac{C_p}{3600\, \lambda_p E[l_{out}]_p} \cdot 10^6

with :math:`P_p` the pool's analytic mean power (W), :math:`C_p` its cost ($/hr) and :math:`\lambda_p E[l_{out}]_p`
its output tokens per second (the 1/W paper's Eq. 4 per pool). The *fleet* row puts every pool at its own
:math:`\rho` at once (so the fleet's traffic mix there is not the instance's unless every pool reaches
:math:`\rho` at the same fleet rate):

.. math:: \mathrm{tok/W}_{fleet} = \frac{\sum_p \lambda_p E[l_{out}]_p}{\sum_p P_p}, \qquad
          \$/\mathrm{Mtok}_{fleet} = \frac{\sum_p C_p}{3600 \sum_p \lambda_p E[l_{out}]_p} \cdot 10^6 .

The row ``now`` is the fleet at the instance's own rate. Power rises with the batch along the logistic curve
(:class:`fleetopt.models.power.PowerCurve`) more slowly than the tokens, so tok/W rises with :math:`\rho` (the
seed's Puzzle 9: the idle floor is paid whatever the load).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from fleetopt.models.fleet import FleetResult, PoolResult

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance
from fleetopt.optimizer.plan.evaluate import evaluate_plans
from fleetopt.optimizer.workflows.headroom import at_rate, fixed_pools

__all__ = ["SCHEMA_VERSION", "DEFAULT_RHOS", "RHO_TOLERANCE", "SECONDS_PER_HOUR", "TOKENS_PER_MTOK", "RhoPoint",
           "PoolSweep", "FleetPoint", "RhoSweep", "parse_rhos", "usd_per_mtok", "rho_sweep"]

from fleetopt.optimizer.output.contract import SCHEMA_VERSION  # noqa: E402 (one contract version)
from fleetopt.optimizer.output.figures import usd_per_million_output_tokens  # noqa: E402 (one formula)
from fleetopt.optimizer.output.contract import build  # noqa: E402
from fleetopt.optimizer.output.contract.workflows import (RhoSweepDocument, _RhoPoint, _RhoPool,  # noqa: E402
                                                          _RhoPoolPoint)
DEFAULT_RHOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
RHO_TOLERANCE = 1e-9
"""The root's utilisation is within this of the target (checked after the search)."""
SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MTOK = 1.0e6
_MAX_RATE = 1.0e9
_RHOS_RE = re.compile(r"^\s*(\d+(\.\d*)?|\.\d+)\s*$")


def usd_per_mtok(cost_per_hr: float, output_tok_per_s: float) -> float:
    """Dollars per million output tokens, :math:`C / (3600\\, r) \\cdot 10^6` (inf without output;
    :func:`fleetopt.optimizer.output.figures.usd_per_million_output_tokens`, the one definition).

    Examples
    --------
    An H100 unit at $4.02/hr writing 1,000 tokens/s: 4.02 / 3.6 = $1.1167 per million.

    >>> round(usd_per_mtok(4.02, 1000.0), 4)
    1.1167
    """
    return usd_per_million_output_tokens(cost_per_hr, output_tok_per_s)


@dataclass(frozen=True)
class RhoPoint:
    """One pool brought to a utilisation (``rho``; ``now``: the instance's own rate)."""

    rho: float | None
    fleet_arrival_rate: float
    arrival_rate: float
    """The pool's own req/s there."""
    utilization: float
    mean_batch: float
    power_w: float
    output_tok_per_s: float
    tok_per_watt: float
    usd_per_mtok: float
    cost_per_hr: float
    ttft_p99_ms: float
    slo_met: bool

    @classmethod
    def of(cls, rho, fleet_rate: float, p: PoolResult) -> RhoPoint:
        return cls(rho, fleet_rate, p.arrival_rate, p.utilization, p.mean_batch, p.power_w, p.output_tok_per_s,
                   p.tok_per_watt, usd_per_mtok(p.cost_per_hr, p.output_tok_per_s), p.cost_per_hr, p.ttft_p99_ms,
                   bool(p.slo_met))

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._RhoPoolPoint`) from these
        fields."""
        return build(_RhoPoolPoint, self)


@dataclass(frozen=True)
class PoolSweep:
    label: str
    gpu: str
    replicas: int
    batch_cap: int
    quality: str
    routing_share: float
    points: tuple[RhoPoint, ...]
    now: RhoPoint

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._RhoPool`)."""
        return build(_RhoPool, self, pool=self.label, points=[q.to_json() for q in self.points],
                     now=self.now.to_json())


@dataclass(frozen=True)
class FleetPoint:
    """Every pool at its own ``rho`` at once (``now``: the instance's rate)."""

    rho: float | None
    power_w: float
    output_tok_per_s: float
    tok_per_watt: float
    usd_per_mtok: float

    def to_json(self) -> dict:
        """Built by its model (:class:`fleetopt.optimizer.output.contract.workflows._RhoPoint`) from these fields."""
        return build(_RhoPoint, self)


@dataclass(frozen=True)
class RhoSweep:
    instance: str
    fleet: str
    arrival_rate: float
    ttft_model: str
    rhos: tuple[float, ...]
    pools: tuple[PoolSweep, ...]
    fleet_points: tuple[FleetPoint, ...]
    fleet_now: FleetPoint
    overrides: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """The document, built by its model (:class:`fleetopt.optimizer.output.contract.workflows.RhoSweepDocument`)."""
        return build(RhoSweepDocument, self, schema_version=SCHEMA_VERSION, command="tpw --rho-sweep",
                     source="analytic", pools=[p.to_json() for p in self.pools],
                     fleet_points=[f.to_json() for f in self.fleet_points], fleet_now=self.fleet_now.to_json())


def parse_rhos(text: str | None, field: str = "--rho") -> tuple[float, ...]:
    """``"0.2,0.5"`` -> ``(0.2, 0.5)``: utilisations in (0, 1), sorted, without repeats; None: :data:`DEFAULT_RHOS`.

    Examples
    --------
    >>> parse_rhos("0.5, 0.2")
    (0.2, 0.5)
    """
    if text is None:
        return DEFAULT_RHOS
    parts = [x for x in str(text).split(",") if x.strip()]
    if not parts or not all(_RHOS_RE.match(x) for x in parts):
        raise InstanceError(f"{field}: {text!r} is not a comma-separated list of utilisations (e.g. 0.2,0.5,0.8)")
    out = sorted({float(x) for x in parts})
    bad = [x for x in out if not 0.0 < x < 1.0]
    if bad:
        raise InstanceError(f"{field}: {bad[0]:g} is not a utilisation in (0, 1)")
    return tuple(out)


def _fleet_point(rho, pools: list[RhoPoint]) -> FleetPoint:
    power = sum(q.power_w for q in pools)
    out = sum(q.output_tok_per_s for q in pools)
    cost = sum(q.cost_per_hr for q in pools)
    return FleetPoint(rho, power, out, out / power if power > 0 else 0.0, usd_per_mtok(cost, out))


def rho_sweep(instance: Instance, fleet: str, rhos=DEFAULT_RHOS) -> RhoSweep:
    """The sweep of ``fleet`` on ``instance`` over the utilisations ``rhos`` (module docstring).

    Raises
    ------
    InstanceError
        A bad fleet spec or utilisation, or a pool whose utilisation cannot reach a target (no traffic).
    """
    from scipy import optimize   # here: after fleetopt.models.numerics has loaded scipy.special lean

    rhos = tuple(sorted({float(r) for r in rhos}))
    if not rhos or not all(0.0 < r < 1.0 for r in rhos):
        raise InstanceError(f"--rho: {rhos!r}: give utilisations in (0, 1)")
    plans, now = fixed_pools(instance, fleet)
    cache: dict[float, FleetResult] = {}

    def result(lam: float) -> FleetResult:
        if lam not in cache:
            cache[lam] = evaluate_plans(at_rate(instance, lam), plans)
        return cache[lam]

    def excess(lam: float, k: int, rho: float) -> float:
        p = result(lam).pools[k]
        u = p.utilization if math.isfinite(p.utilization) else 1.0 + max(p.capacity_load - 1.0, 0.0)
        return u - rho

    base = instance.workload.arrival_rate_req_per_s
    pools, table = [], []
    for k, p in enumerate(now.pools):
        label = f"{p.min_tokens}-{p.max_tokens}:{p.gpu}x{p.replicas}"
        if not p.routing_share > 0:
            raise InstanceError(f"--fleet: pool {label} receives no traffic; no rate brings it to a utilisation")
        points = []
        for rho in rhos:
            lo, hi = 0.0, max(base, 1.0)
            while excess(hi, k, rho) < 0:
                lo, hi = hi, 2.0 * hi
                if hi > _MAX_RATE:
                    raise InstanceError(f"--rho: pool {label} does not reach utilisation {rho:g} below "
                                        f"{_MAX_RATE:g} req/s")
            # scipy ships no stubs: rtol's type is inferred from its float64 default, the result as either return
            lam = optimize.brentq(excess, lo, hi, args=(k, rho), xtol=1e-14, rtol=np.float64(1e-15), maxiter=500)
            assert not isinstance(lam, tuple)       # without full_output, the root alone
            if abs(excess(lam, k, rho)) > RHO_TOLERANCE:    # brentq's last step may land beside a kink
                raise InstanceError(f"--rho: pool {label}: no rate gives utilisation {rho:g} within "
                                    f"{RHO_TOLERANCE:g} (the utilisation jumps there)")
            points.append(RhoPoint.of(rho, lam, result(lam).pools[k]))
        pools.append(PoolSweep(label, p.gpu, p.replicas, p.max_num_seqs, p.quality, p.routing_share, tuple(points),
                               RhoPoint.of(None, base, p)))
        table.append(points)
    fleet_points = tuple(_fleet_point(rho, [pts[j] for pts in table]) for j, rho in enumerate(rhos))
    spec = ",".join(q.label for q in pools)
    return RhoSweep(instance.name, spec, base, instance.slo.ttft_model, rhos, tuple(pools), fleet_points,
                    _fleet_point(None, [q.now for q in pools]), tuple(instance.overrides))

