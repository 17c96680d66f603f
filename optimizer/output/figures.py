"""The figures every output shows, in an operator's units, without the contract's models.

The JSON contract (:mod:`fleetopt.optimizer.output.contract`) writes these figures into its documents and the
tables (:mod:`fleetopt.optimizer.output.render`) print them; both read them from here, so a command that prints
only tables does not build the contract's models (about 0.1 s of start-up).
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetopt.models.fleet import FleetResult, PoolResult
from fleetopt.models.profiles import ReplicaUnit, replica_unit

__all__ = ["SECONDS_PER_HOUR", "TOKENS_PER_MILLION", "DROPPED_LINES", "usd_per_million_output_tokens",
           "pool_identity", "physical_gpus", "fleet_output_tok_per_s"]

DROPPED_LINES = 12
"""At most this many dropped candidates' reasons are listed in ``candidates.dropped`` (the rest are counted)."""

SECONDS_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1.0e6


def usd_per_million_output_tokens(cost_per_hr: float, output_tok_per_s: float) -> float:
    """Dollars per million output tokens of a pool or fleet, :math:`C / (3600\\, r) \\cdot 10^6` for a cost
    :math:`C` in $/hr and an output rate :math:`r` in tokens/s (inf without output). The cost is what the
    profile prices (physical GPUs x $/GPU-hour for computed and fitted profiles).

    Examples
    --------
    One H100-SXM-80GB replica of Llama-3.1-70B at TP=8 ($4.02/GPU-hour x 8 = $32.16/hr) writing 2,000 tokens/s:
    32.16 / 7.2 = $4.4667 per million.

    >>> round(usd_per_million_output_tokens(32.16, 2000.0), 4)
    4.4667
    >>> usd_per_million_output_tokens(32.16, 0.0)
    inf
    """
    if not output_tok_per_s > 0:
        return float("inf")
    return cost_per_hr / (SECONDS_PER_HOUR * output_tok_per_s) * TOKENS_PER_MILLION

def _pool_unit(p: PoolResult, unit: ReplicaUnit | None) -> ReplicaUnit:
    """A pool's :class:`~fleetopt.models.profiles.ReplicaUnit`: ``unit`` (its profile's, when the caller has it),
    else that of the catalogue profile the pool names, else its GPUs over its replicas (one GPU without a
    replica), each a physical one."""
    if unit is not None:
        return unit
    from fleetopt.optimizer.io.catalog import load_catalog

    profile = load_catalog().profiles.get(p.profile)
    if profile is not None:
        return replica_unit(profile)
    n = p.gpus // p.replicas if p.replicas > 0 else 1
    return ReplicaUnit(n, n)


def pool_identity(p: PoolResult, unit: ReplicaUnit | None = None) -> dict:
    """The keys of a pool that say what it serves and what its replicas are: ``model`` (the profile's model
    label), ``gpus_per_replica``, ``physical_gpus_per_replica``, ``physical_gpus``, ``unit``, ``unit_note``
    (``unit``: the pool's profile's :func:`~fleetopt.models.profiles.replica_unit`, when the caller has it)."""
    u = _pool_unit(p, unit)
    return {"model": p.model, **u.to_json(), "physical_gpus": int(p.replicas) * u.physical_gpus_per_replica}


def physical_gpus(r: FleetResult, units: Mapping[str, ReplicaUnit] | None = None) -> int:
    """The physical GPUs of a fleet: per pool, replicas x the physical GPUs of one
    (:func:`~fleetopt.models.profiles.replica_unit`); ``units`` maps a pool's ``gpu`` to its profile's
    :func:`~fleetopt.models.profiles.replica_unit`, when the caller has them."""
    per = units or {}
    return sum(int(p.replicas) * _pool_unit(p, per.get(p.gpu)).physical_gpus_per_replica for p in r.pools)


def fleet_output_tok_per_s(r: FleetResult) -> float:
    """Output tokens per second of a fleet: the sum over its pools."""
    return float(sum(p.output_tok_per_s for p in r.pools))
