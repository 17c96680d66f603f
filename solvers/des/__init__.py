"""The discrete-event simulator of continuous-batching LLM serving pools.

``engine`` (:func:`~fleetopt.solvers.des.engine.simulate`, the event loop and
the iteration-mode station), ``state`` (pool configuration and run-time
state), ``records`` (one record per request and the run's integrals),
``slot``, ``kv`` and ``budget`` (stations and handler variants), ``routing``,
``routers`` and ``spill`` (routers and dispatch), ``arrivals`` (arrival
processes), ``metrics`` (estimators and confidence intervals), ``disagg``
(:func:`~fleetopt.solvers.des.disagg.simulate_disaggregated`, a disaggregated
prefill/decode pair: a prefill station, the KV transfer, a decode station).

Apart from the MIP family of :mod:`fleetopt.solvers`: neither imports the other.
"""
