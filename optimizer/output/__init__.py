"""The output stage: what a command writes, and how.

* :mod:`~fleetopt.optimizer.output.contract`: the JSON contract, one pydantic model per document kind
  (``fleetopt schema``), and the helpers that build a document's shared parts from it;
* :mod:`~fleetopt.optimizer.output.writes`: safe writes (atomic, never over a file the command read);
* :mod:`~fleetopt.optimizer.output.export`: deployment files of a solved plan (``fleetopt export``);
* :mod:`~fleetopt.optimizer.output.tables`: the table-layout engine behind every ``--format``;
* :mod:`~fleetopt.optimizer.output.documents`: a result's JSON document, built on the contract;
* :mod:`~fleetopt.optimizer.output.render`: each result rendered as tables and prose.

The first four sit just above :mod:`fleetopt.optimizer.io` (the plan, simulation and profiling stages use them);
``documents`` and ``render`` sit above the stages whose results they report (``tests/test_layering.py``).
"""
