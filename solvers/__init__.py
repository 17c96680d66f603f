"""Solvers: the fleet MIP (Pyomo + HiGHS), the split-routing MIP and the exact path-search oracle; the exact
second-order oracle of a replica's count (:mod:`fleetopt.solvers.count_oracle`), the batched model's reference.

The discrete-event simulator lives in its own subpackage, :mod:`fleetopt.solvers.des`.
"""
