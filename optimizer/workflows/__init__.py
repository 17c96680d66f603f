"""Operator workflows over the solver and simulator: split tables, frontiers, headroom."""
