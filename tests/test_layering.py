"""models/ is pure: it imports only the standard library, numpy, scipy and itself; solvers/ never imports optimizer/."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ALLOWED = {
    "models": {"numpy", "scipy", "models"},
    "solvers": {"numpy", "scipy", "models", "solvers", "networkx", "pyomo", "highspy"},
}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_stay_in_their_layer(package):
    files = sorted((REPO / package).glob("*.py"))
    assert files or package == "solvers"
    for f in files:
        for name in _imports(f):
            assert name in sys.stdlib_module_names or name in ALLOWED[package], f"{f.name} imports {name}"


def test_models_do_no_io_or_printing():
    for f in sorted((REPO / "models").glob("*.py")):
        src = f.read_text()
        for word in ("open(", "print(", "read_text(", "np.random.seed", "random.seed"):
            assert word not in src, f"{f.name} uses {word}"


@pytest.mark.parametrize("package", ["models", "solvers", "optimizer"])
def test_sources_compile_without_warnings(package):
    """No invalid escape sequences (LaTeX in a non-raw docstring turns \\t, \\b, \\f into control characters)."""
    import warnings

    for f in sorted((REPO / package).glob("*.py")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compile(f.read_text(), str(f), "exec")


def test_cli_start_up_leaves_the_solver_and_simulator_pipeline_unloaded():
    """Every command pays for what ``optimizer.cli`` imports at start-up: the MIP (Pyomo) and the simulation
    pipeline (scipy.stats via its metrics) load only in the commands that use them."""
    import subprocess

    code = ("import sys, optimizer.cli; "
            "print(sorted(m for m in ('pyomo', 'optimizer.simulate', 'solvers.des_metrics', 'scipy.stats') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    assert out.stdout.strip() == "[]", out.stdout
