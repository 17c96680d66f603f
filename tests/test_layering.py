"""The layering of the package, read from the source with ``ast`` (function-level imports included).

Every module of ``models/``, ``solvers/``, ``optimizer/`` (every subfolder, recursively) belongs to one
layer below. A module imports the standard library, the third-party packages its layer allows, its own
layer and the layers below it, never a layer above, never a sibling of the same rank (the MIP family and the
simulator do not import each other). The import graph of the whole project has no cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"models": "fleetopt.models", "solvers": "fleetopt.solvers", "optimizer": "fleetopt.optimizer"}
ROOT_PACKAGE_DIR = "optimizer/_fleetopt"    # installs as the package root ``fleetopt`` (pyproject package-dir)

# (layer, rank, third-party packages it may import). A module's layer is the longest prefix that matches.
SCIENCE = {"numpy", "scipy"}
PIPELINE = SCIENCE | {"yaml", "pydantic", "rich", "click", "pyomo", "highspy"}
SCALE_OUT = {"dask", "distributed", "matplotlib"}     # optional extras (scale, plot), imported where used
FRAMES = {"pandas"}                                     # optional extra (frames): to_frame() on reports
PROBE = {"torch", "pynvml"}                             # optional extra (probe): the GPU backend of profile probe
LAYERS = {
    "fleetopt.models": (0, SCIENCE),
    "fleetopt.solvers": (1, SCIENCE | {"pyomo", "highspy"}),
    "fleetopt.solvers.des": (1, SCIENCE),
    "fleetopt.optimizer.errors": (2, set()),
    "fleetopt.optimizer.forked": (2, set()),   # independent tasks on forked workers (stdlib): sizing, replications
    "fleetopt.optimizer.io": (3, PIPELINE),
    "fleetopt.optimizer.output": (4, PIPELINE),     # the contract, safe writes, deployment files, table layout
    "fleetopt.optimizer.profiling": (5, PIPELINE),  # measures a GPU, fits a profile: reads the catalogue, writes
    "fleetopt.optimizer.profiling.probe_torch": (6, PIPELINE | PROBE),   # above the probe harness it plugs into
    "fleetopt.optimizer.plan": (5, PIPELINE | FRAMES),
    "fleetopt.optimizer.simulation": (6, PIPELINE | FRAMES),
    "fleetopt.optimizer.output.documents": (7, PIPELINE),   # a result's JSON: above the stages it reports
    "fleetopt.optimizer.workflows": (7, PIPELINE | SCALE_OUT),
    "fleetopt.optimizer.output.render": (8, PIPELINE),      # a result as tables: its documents' notes and warnings
    "fleetopt.optimizer.api": (8, PIPELINE | FRAMES),
    "fleetopt.optimizer.bench": (8, PIPELINE),
    "fleetopt.optimizer.commands": (9, PIPELINE | SCALE_OUT),
    "fleetopt.optimizer.cli": (10, PIPELINE),        # the entry point: loads the commands' modules on first use
    "fleetopt.optimizer": (11, set()),      # the package's own __init__ (a docstring)
    "fleetopt": (12, set()),                # the root __init__ and the api facade
}


def _modules() -> dict[str, Path]:
    """Installed module name -> source file, for every .py file of the source roots."""
    out = {}
    for folder, package in SOURCE_ROOTS.items():
        for f in sorted((REPO / folder).rglob("*.py")):
            rel = f.relative_to(REPO / folder).with_suffix("")
            if rel.parts[0] == "_fleetopt":
                continue
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = f
    for f in sorted((REPO / ROOT_PACKAGE_DIR).glob("*.py")):
        out["fleetopt" if f.stem == "__init__" else f"fleetopt.{f.stem}"] = f
    return out


MODULES = _modules()


def _layer(module: str) -> str:
    match = [layer for layer in LAYERS if module == layer or module.startswith(layer + ".")]
    assert match, f"{module} belongs to no layer: add its folder to LAYERS"
    return max(match, key=len)


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (read by type checkers, never run)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return ids


def _imports(module: str, path: Path, runtime_only: bool = False):
    """(imported name, line) of every import in the file, relative ones resolved; ``runtime_only``: not those
    under ``if TYPE_CHECKING:``, which no run executes (an annotation may name a module that imports this one)."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), node.lineno


def _project_target(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_every_source_file_is_a_module_of_a_layer():
    assert len(MODULES) > 50   # discovery found the tree
    for module in MODULES:
        _layer(module)
    for folder in SOURCE_ROOTS:
        for d in (REPO / folder).rglob("*"):
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                assert (d / "__init__.py").is_file(), f"{d.relative_to(REPO)} has modules but no __init__.py"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_downward(module):
    layer = _layer(module)
    rank, third_party = LAYERS[layer]
    for name, line in _imports(module, MODULES[module]):
        top = name.split(".")[0]
        where = f"{MODULES[module].relative_to(REPO)}:{line} imports {name}"
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        if top != "fleetopt":
            assert top in third_party, f"{where}: {layer} may use only {sorted(third_party) or 'the stdlib'}"
            continue
        target = _project_target(name)
        assert target is not None, f"{where}: no such module in the project"
        other = _layer(target)
        other_rank = LAYERS[other][0]
        assert other_rank < rank or other == layer, (f"{where}: {layer} (rank {rank}) imports {other} "
                                                     f"(rank {other_rank})")


def test_the_project_has_no_import_cycle():
    graph = nx.DiGraph()
    for module, path in MODULES.items():
        graph.add_node(module)
        for name, _ in _imports(module, path, runtime_only=True):
            target = _project_target(name) if name.startswith("fleetopt") else None
            if target and target != module and not module.startswith(target + "."):
                graph.add_edge(module, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + [c[0]]) for c in cycles[:5])


MAX_FLAT_MODULES = 12


def test_no_package_folder_holds_more_than_twelve_modules():
    """A folder is one stage; one that outgrows a dozen modules holds more than one (``optimizer/io/`` once held
    sixteen, the profiling probe and the output documents among them)."""
    for folder in SOURCE_ROOTS:
        for d in [REPO / folder, *(p for p in (REPO / folder).rglob("*") if p.is_dir())]:
            flat = [f.name for f in d.glob("*.py") if f.name != "__init__.py"]
            assert len(flat) <= MAX_FLAT_MODULES, f"{d.relative_to(REPO)} holds {len(flat)} modules: {sorted(flat)}"


def test_models_do_no_io_or_printing():
    for module, f in MODULES.items():
        if _layer(module) != "fleetopt.models":
            continue
        src = f.read_text()
        for word in ("open(", "print(", "read_text(", "np.random.seed", "random.seed", "default_rng("):
            assert word not in src, f"{f.name} uses {word}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_sources_compile_without_warnings(module):
    """No invalid escape sequences (LaTeX in a non-raw docstring turns \\t, \\b, \\f into control characters)."""
    f = MODULES[module]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(f.read_text(), str(f), "exec")


LETTER_ESCAPES = {"\a", "\b", "\f", "\v"}   # what ``\\alpha``, ``\\beta``, ``\\frac``, ``\\vec`` turn into


def _control_characters(source: str) -> list[tuple[int, str]]:
    """(line, character) of every bell, backspace, form feed or vertical tab in the value of a string literal of
    ``source``, f-strings' literal parts included: LaTeX (``\\alpha``, ``\\beta``, ``\\frac``, ``\\vec``) in a
    non-raw string. A deliberate control character (``"\\0"`` in a file-name check) is none of these."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            found += [(node.lineno + value[:value.index(ch)].count("\n"), ch) for ch in sorted(set(value))
                      if ch in LETTER_ESCAPES]
    return sorted(found)


def test_the_scan_finds_control_characters():
    assert _control_characters('x = 1\ny = "a\\bc"\n') == [(2, "\b")]
    assert _control_characters('def f():\n    """\n    \\alpha \\vec \\frac\n    """\n') == [
        (3, "\x07"), (3, "\x0b"), (3, "\x0c")]
    assert _control_characters('y = r"\\beta"  # raw\nz = "\\\\beta"  # escaped\nw = "a\\tb\\n\\0"\n') == []
    assert _control_characters('x = 2\nf"{x}\\f{x}"\n') == [(2, "\x0c")]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_string_literals_hold_no_control_characters(module):
    """A valid escape in a non-raw string (``\\b`` of ``\\beta``, ``\\v`` of ``\\vec``) compiles without a warning,
    so the compile check above misses it: the docstring then holds a backspace or a vertical tab."""
    f = MODULES[module]
    found = _control_characters(f.read_text())
    assert not found, f"{f.relative_to(REPO)}: " + ", ".join(f"line {line}: {ch!r}" for line, ch in found)


def test_cli_start_up_leaves_the_solver_and_simulator_pipeline_unloaded(tmp_path):
    """Every command pays for what ``fleetopt.optimizer.cli`` imports at start-up: the MIP (Pyomo) and the
    simulation pipeline (scipy.stats via its metrics) load only in the commands that use them. Run from an
    empty folder, so nothing but the installed package can be imported."""
    heavy = ("pyomo", "fleetopt.optimizer.simulation.simulate", "fleetopt.solvers.des.metrics", "scipy.stats")
    code = f"import sys, fleetopt.optimizer.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "[]", out.stdout
