"""Solvers: the fleet MIP (Pyomo + HiGHS), the exact graph oracle (networkx) and the discrete-event simulator."""
