"""The one part of the build that pyproject.toml does not declare: the simulator's plain event loop, compiled.

``solvers/des/_cloop.c`` is an *optional* extension: where no C compiler is found the package installs without it
and runs the Python loop (``fleetopt.solvers.des.engine._plain_loop``), which stays the reference the compiled
loop is tested against bit for bit (``tests/test_des_compiled.py``). ``-ffp-contract=off``: no fused multiply-add,
so every operation rounds as Python's does. Everything else about the package is in ``pyproject.toml``.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("fleetopt.solvers.des._cloop", ["solvers/des/_cloop.c"],
                             extra_compile_args=["-O2", "-ffp-contract=off"], optional=True)])
