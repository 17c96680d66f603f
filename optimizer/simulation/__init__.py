"""Stage 3: plans through the discrete-event simulator.

``options`` (the frozen simulation and engine settings), ``simulate`` (the
pipeline: replications, confidence intervals, precision stopping),
``records`` (the report records), ``verify`` (simulate the best plans, cut and
re-solve), ``trim`` (lower a verified plan's counts while the SLO holds),
``plan_files`` (solved plans read back from JSON). Imports ``plan``, ``io`` and
the layers below.

This file holds the names a simulation setting takes and the spillover default: plain constants, without numpy
or the simulator, so that :mod:`fleetopt.optimizer.cli` declares its flags with them at start-up and loads
``options`` (which imports both) only in the commands that simulate. ``options`` re-exports each of them and
validates a :class:`~fleetopt.optimizer.simulation.options.SimOptions` against them.
"""

__all__ = ["KV_MODES", "AVAILABILITY_MODES", "ROUTERS", "DISPATCHES", "ARRIVALS", "DEFAULT_SPILL_BOUND"]

KV_MODES = ("reserve", "paged")
AVAILABILITY_MODES = ("all-up", "sampled")
ROUTERS = ("length", "split", "random", "compress", "spillover")
"""The routers between pools; :class:`~fleetopt.optimizer.simulation.options.SimOptions` also takes ``"auto"``,
the one the plan was solved for."""
DISPATCHES = ("jsq", "round-robin", "least-queue")
"""Replica choice within a pool: join-shortest-queue (fewest running plus waiting), round robin, or least-queue
(fewest waiting, the reference tool's rule); :mod:`fleetopt.solvers.des.routing`."""
ARRIVALS = ("poisson", "trace", "mmpp", "diurnal")
DEFAULT_SPILL_BOUND = 8
"""``router="spillover"``: requests waiting in a pool beyond which an arrival spills to the next pool up
(``spill_bound=None`` in :func:`fleetopt.optimizer.simulation.simulate.simulate_plan`)."""
