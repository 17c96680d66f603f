"""Constants used across fleetopt, each defined once."""

HOURS_PER_YEAR = 8760.0
"""Hours in a (non-leap) year; converts $/hr to $/yr as the seed scenarios do."""

MS_PER_S = 1000.0
"""Milliseconds per second (the CLI speaks ms, the models speak seconds)."""

P99_TAIL = 0.01
"""The probability mass above the 99th percentile, :math:`1 - 0.99`: a P99 SLO is met when
:math:`P(T > T_{SLO}) \\le` ``P99_TAIL``. Written as the literal (``1.0 - P99`` would round to
0.010000000000000009); :data:`P99` is derived from it and is exactly 0.99."""

P99 = 1.0 - P99_TAIL
"""The quantile every SLO in fleetopt refers to (0.99, exactly the float ``0.99``)."""
