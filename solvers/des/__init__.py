"""The discrete-event simulator of continuous-batching LLM serving pools.

``engine`` (:func:`~fleetopt.solvers.des.engine.simulate`, the event loop and
the iteration-mode station), ``state`` (pool configuration and run-time
state), ``records`` (one record per request and the run's integrals),
``slot``, ``kv`` and ``budget`` (stations and handler variants), ``routing``,
``routers`` and ``spill`` (routers and dispatch), ``arrivals`` (arrival
processes), ``metrics`` (estimators and confidence intervals).

Apart from the MIP family of :mod:`fleetopt.solvers`: neither imports the other.
"""
