"""Constants used across fleetopt, each defined once."""

HOURS_PER_YEAR = 8760.0
"""Hours in a (non-leap) year; converts $/hr to $/yr as the seed scenarios do."""

MS_PER_S = 1000.0
"""Milliseconds per second (the CLI speaks ms, the models speak seconds)."""

P99 = 0.99
"""The quantile every SLO in fleetopt refers to."""
