"""Stage 2: a validated instance becomes plans, analytically.

``candidates`` sizes every candidate pool with queueing theory,
``split_candidates`` builds the split-routing problem, ``solve`` runs the MIP or
the graph oracle and re-evaluates plans exactly, ``evaluate`` evaluates a given
fleet, ``explain`` says why an instance is infeasible. Imports ``io`` and the
layers below, never ``simulation``.
"""
