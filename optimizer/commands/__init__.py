"""Click command groups beside the main ``fleetopt`` command (wired into :mod:`fleetopt.optimizer.cli`)."""
