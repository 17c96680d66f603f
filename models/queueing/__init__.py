"""The station models: how a pool of replicas queues its requests and what its time to first token is.

``erlang`` (the slot models: Erlang-C, waiting-time tails, P99 TTFT and minimum replica counts),
``batched`` (continuous-batching replicas at their realised occupancy, the default TTFT model),
``dispersion`` (the batched count's dispersion from its requests' transforms), ``ttft`` (one object per
``slo.ttft_model`` answering sizing and evaluation) and ``disagg`` (a disaggregated prefill/decode pair: the
prefill and decode stations, the KV transfer, and the reference tool's convention). They read the
iteration-time model (``service``) and the segments' statistics (``segments``) of :mod:`fleetopt.models`;
:mod:`fleetopt.models.fleet` evaluates a fleet with them.
"""
