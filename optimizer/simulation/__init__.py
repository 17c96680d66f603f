"""Stage 3: plans through the discrete-event simulator.

``options`` (the frozen simulation and engine settings), ``simulate`` (the
pipeline: replications, confidence intervals, precision stopping),
``records`` (the report records), ``verify`` (simulate the best plans, cut and
re-solve), ``trim`` (lower a verified plan's counts while the SLO holds),
``plan_files`` (solved plans read back from JSON). Imports ``plan``, ``io`` and
the layers below.
"""
