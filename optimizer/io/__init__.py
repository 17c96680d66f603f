"""Stage 1: an instance file becomes a validated :class:`~fleetopt.optimizer.io.instance.Instance`.

``schema`` (pydantic records of the file), ``workloads`` (CDF and trace files),
``overrides`` (``--set PATH=VALUE``), ``gpu_options`` and ``catalog`` (the
shipped hardware data), ``instance`` (the whole load), ``output`` (atomic
writes). Imports only ``fleetopt.models`` and ``fleetopt.optimizer.errors``.
"""
