"""Solvers: the fleet MIP (Pyomo + HiGHS), the split-routing MIP and the exact graph oracle (networkx).

The discrete-event simulator lives in its own subpackage, :mod:`fleetopt.solvers.des`.
"""
