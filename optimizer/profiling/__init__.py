"""The profiling stage: measure a GPU (``fleetopt profile probe``) and fit a serving profile from the
measurements (``fleetopt profile fit``), written as a profile file that instances and catalogues name.

Above :mod:`fleetopt.optimizer.io` (it reads the catalogue and reads profile files back through
:mod:`fleetopt.optimizer.io.profile_file`) and :mod:`fleetopt.optimizer.output` (it writes files safely)."""
