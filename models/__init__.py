"""Pure performance models for LLM serving fleets.

Everything here is a function of its arguments: no file or network I/O, no
printing, no randomness. Only the standard library, numpy and scipy are
imported (a test enforces it).

Modules
-------
units      constants defined once (hours per year, the P99 and its tail mass, ...)
numerics   one vectorised bisection (to float resolution) shared by every inverse
power      logistic power curve and its inverse
hardware   GPU and LLM catalogue records
profiles   serving profiles: calibrated (measured constants) and computed (roofline)
service    the iteration/service-time model shared by every profile
workload   request-length distributions, traces and exact segment statistics
segments   exact service and context-work moments of length segments
queueing/  the station models: erlang (Erlang-C, waiting-time tails, P99 TTFT and minimum replica counts:
           the slot models), batched (continuous-batching replicas at their realised occupancy: the default
           TTFT model), dispersion (the batched count's variance from its requests' transforms), ttft (one
           object per ``slo.ttft_model``), disagg (the prefill and decode stations of a disaggregated pair and
           the KV transfer between them)
semantic   semantic (multi-model) routing: each model class's exact length distribution under a classifier's
           share rule
fleet      analytic evaluation of a fleet of pools (cost, power, tok/W, SLO), aggregated or disaggregated
"""
