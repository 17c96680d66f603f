"""The simulation settings of a command, built from its flags: :func:`sim_options` turns every bad setting of a
:class:`~fleetopt.optimizer.simulation.options.SimOptions` into one line naming the command's own flag.

A command maps each :class:`SimOptions` field it sets to its flag (:data:`VERIFY_FLAGS` for the ``--verify`` of
``whatif`` and ``headroom``; ``simulate`` and ``solve --verify-top`` keep their maps in
:mod:`fleetopt.optimizer.cli`); a field the map does not name is reported under the field's own name.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.simulation.options import SimOptions, SimOptionsError

__all__ = ["sim_options", "VERIFY_FLAGS"]

VERIFY_FLAGS = {"requests": "--sim-requests", "replications": "--sim-replications", "seed": "--seed"}
"""``whatif --verify`` and ``headroom --verify``: the flag of each :class:`SimOptions` field they set."""


def sim_options(flags: Mapping[str, str], **settings) -> SimOptions:
    """One :class:`SimOptions` of ``settings``; each bad setting is one :class:`InstanceError` line
    ``FLAG: what is wrong``, ``FLAG`` the command's flag of the field (``flags``), else the field's name.

    >>> sim_options(VERIFY_FLAGS, seed=-1)
    Traceback (most recent call last):
    ...
    fleetopt.optimizer.errors.InstanceError: --seed: -1 must be a whole number >= 0
    """
    try:
        return SimOptions(**settings)
    except SimOptionsError as err:
        raise InstanceError([f"{flags.get(field, field)}: {text}" for field, text in err.by_field]) from None
