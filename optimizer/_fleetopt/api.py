"""The notebook API: ``from fleetopt import api``.

The functions are those of :mod:`fleetopt.optimizer.api` (the CLI is a thin
layer over the same calls); this module only gives them the short import path.

>>> from fleetopt import api
>>> from fleetopt.optimizer import api as pipeline
>>> api.load is pipeline.load
True
"""

from __future__ import annotations

from fleetopt.optimizer.api import *  # noqa: F401,F403  (the public names, listed in its __all__)
from fleetopt.optimizer.api import __all__  # noqa: F401
