"""The fleetopt pipeline and user surface: instances, evaluation, reports, CLI."""
