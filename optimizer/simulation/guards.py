"""Refusals of commands that cannot take an instance as it is, kept light (no simulator import) so that the
command layer can call them before anything heavy loads."""

from __future__ import annotations

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.instance import Instance

__all__ = ["refuse_semantic"]


def refuse_semantic(instance: Instance, command: str, instead: str = "") -> None:
    """Raise the one-line refusal (exit 2) of a command that routes one workload by length, for an ``instance``
    with a ``semantic`` section (a fleet spec or a what-if has no model classes); nothing otherwise."""
    if instance.semantic is None:
        return
    spec, tail = instance.semantic, f"; {instead}" if instead else ""
    raise InstanceError(f"semantic: {command} routes the whole workload by length and cannot take this instance's "
                        f"semantic section (a share of the requests to {spec.small_model}, the rest to "
                        f"{spec.large_model}){tail}")
