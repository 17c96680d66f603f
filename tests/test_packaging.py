"""Installed, the project owns one import name, ``fleetopt``, and the wheel carries its data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest


def test_every_package_folder_is_in_the_build(repo_root):
    """A folder of modules left out of ``[tool.setuptools] packages`` would be missing from the wheel."""
    config = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, roots = set(config["packages"]), config["package-dir"]
    for package, folder in roots.items():
        if package == "fleetopt.data":
            continue
        for init in (repo_root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(repo_root / folder).parts
            if rel and rel[0] == "_fleetopt":
                continue
            assert ".".join([package, *rel]) in listed, f"{init.parent.relative_to(repo_root)} is not in the build"


@pytest.fixture(scope="module")
def wheel(repo_root, tmp_path_factory):
    """Built from a clean copy of the source: setuptools' in-tree build/ folder could carry stale modules into
    the wheel, and the checkout stays untouched."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "fleetopt"
    shutil.copytree(repo_root, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__",
                                                                  ".hypothesis", ".venv", "venv", "tests", "*.so"))
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return next(out.glob("fleetopt-*.whl"))


@pytest.mark.slow
def test_wheel_has_one_top_level_package_and_ships_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"fleetopt"}
    for path in ("fleetopt/__init__.py", "fleetopt/api.py", "fleetopt/models/queueing/erlang.py",
                 "fleetopt/solvers/mip.py", "fleetopt/solvers/des/engine.py", "fleetopt/optimizer/cli.py",
                 "fleetopt/optimizer/io/instance.py", "fleetopt/optimizer/plan/solve.py",
                 "fleetopt/optimizer/simulation/verify.py", "fleetopt/data/catalog/hardware.yaml",
                 "fleetopt/data/catalog/calibrated_profiles.yaml", "fleetopt/data/catalog/README.md",
                 "fleetopt/data/workloads/lmsys_cdf.json", "fleetopt/data/workloads/azure_conv_trace.csv"):
        assert path in names, path
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    if os.environ.get("FLEETOPT_REQUIRE_COMPILED") == "1":    # CI: a C compiler is there, so the wheel has the loop
        assert any(n.startswith("fleetopt/solvers/des/_cloop.") and n.endswith((".so", ".pyd")) for n in names)


@pytest.mark.slow
def test_installed_wheel_works_beside_foreign_models_and_solvers_packages(wheel, repo_root, tmp_path):
    """From a folder with its own ``models/`` and ``solvers/`` packages (common in ML repositories) the
    installed package still imports and solves: nothing of it is a top-level ``models`` or ``solvers``."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    assert not {"models", "solvers", "optimizer"} & {p.name for p in target.iterdir()}
    work = tmp_path / "ml-project"
    for pkg in ("models", "solvers", "optimizer"):
        (work / pkg).mkdir(parents=True)
        (work / pkg / "__init__.py").write_text("raise ImportError('the user project, not fleetopt')\n")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    code = ("import fleetopt, fleetopt.api, sys; assert fleetopt.__file__.startswith(sys.argv[1]), fleetopt.__file__; "
            "from fleetopt.optimizer.cli import main; "
            "sys.argv = ['fleetopt', 'solve', sys.argv[2], '--json', '-']; main()")
    quickstart = repo_root / "instances" / "quickstart.yaml"
    res = subprocess.run([sys.executable, "-c", code, str(target), str(quickstart)], cwd=work, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["status"] == "optimal"


def test_the_api_facade_offers_every_public_function_of_the_pipeline_api():
    """``from fleetopt import api`` gives the notebook user everything ``fleetopt.optimizer.api`` defines."""
    import inspect

    import fleetopt
    from fleetopt import api
    from fleetopt.optimizer import api as pipeline

    defined = {name for name, obj in vars(pipeline).items() if not name.startswith("_")
               and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == pipeline.__name__}
    assert defined <= set(pipeline.__all__), defined - set(pipeline.__all__)
    for name in pipeline.__all__:
        assert getattr(api, name) is getattr(pipeline, name), name
    assert fleetopt.api is api


@pytest.mark.slow
def test_the_readme_quickstart_returns_a_plan_its_simulator_accepts(repo_root):
    """README quickstart, line 1 (after its install step): the main job runs, exits 0, and the plan it returns is
    one the simulator accepted (``solve --verify-top``), not only the analytic optimum."""
    import shlex

    from click.testing import CliRunner

    from fleetopt.optimizer.cli import main

    text = (repo_root / "README.md").read_text()
    block = text.split("<!-- quickstart -->", 1)[1].split("```", 2)[1]
    first = [line for line in block.splitlines() if line.strip()][0]
    command = shlex.split(first.split("&&", 1)[1])
    assert command[:2] == ["fleetopt", "solve"] and "--verify-top" in command
    result = CliRunner().invoke(main, command[1:] + ["--quiet", "--json", "-"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    v = data["verification"]
    chosen = [p for p in v["plans"] if (p["round"], p["rank"]) == (v["chosen_round"], v["chosen_rank"])]
    assert v["chosen_rank"] is not None and len(chosen) == 1 and chosen[0]["passed"] is True
    def pools(plan):
        return [(q["min_tokens"], q["max_tokens"], q["gpu"], q["replicas"]) for q in plan["pools"]]

    assert pools(data) == pools(chosen[0])                       # the plan the command returns is the accepted one
