"""What a process start loads: ``import fleetopt`` and ``fleetopt --help`` stay off numpy, YAML and the package
metadata, and a solve loads the disaggregated pairs' model only for an instance that allows pairs. Each check runs
a fresh interpreter from an empty folder (``sys.modules`` of the test process says nothing)."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _loaded(code: str, names, cwd) -> list[str]:
    """The modules of ``names`` that are loaded after ``code`` runs in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {sorted(names)!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=cwd)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_fleetopt_reads_the_version_only_when_asked(tmp_path):
    assert _loaded("import fleetopt", ["importlib.metadata", "email"], tmp_path) == []
    assert _loaded("import fleetopt; fleetopt.__version__", ["importlib.metadata"], tmp_path) == ["importlib.metadata"]
    code = "import fleetopt; print(fleetopt.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == version("fleetopt")


def test_cli_start_up_leaves_numpy_yaml_and_the_metadata_unloaded(tmp_path):
    """``fleetopt --help`` pays for what the CLI module imports: the simulation flags' names come without
    SimOptions (numpy), the YAML and TOML parsers load with the first file read."""
    heavy = ["numpy", "yaml", "tomllib", "importlib.metadata", "fleetopt.optimizer.simulation.options",
             "fleetopt.solvers.des.state"]
    assert _loaded("import fleetopt.optimizer.cli", heavy, tmp_path) == []


def test_a_solve_without_pairs_leaves_the_disaggregated_model_unloaded(tmp_path):
    """A plain solve loads neither the P/D pairs' model nor the files only some instances name (a model_config
    or profile_file entry, a computed profile's roofline); the oracle that picks Puzzle 10's fleet runs without
    Pyomo and without networkx (a test dependency: the oracle's independent reference)."""
    code = ("import sys\nfrom fleetopt.optimizer.cli import main\n"
            f"sys.argv = ['fleetopt', 'solve', {str(REPO / 'instances' / 'ref_puzzle10_lmsys.yaml')!r}, '--json', "
            f"{str(tmp_path / 'out.json')!r}]\n"
            "try:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0, done.code")
    unused = ["fleetopt.models.queueing.disagg", "fleetopt.optimizer.io.hf_config",
              "fleetopt.optimizer.io.profile_file", "fleetopt.models.roofline",
              "fleetopt.optimizer.simulation.simulate", "pyomo"]
    out = tmp_path / "out.json"
    assert _loaded(code, unused + ["networkx", "fleetopt.solvers.oracle"], tmp_path) == ["fleetopt.solvers.oracle"]
    assert json.loads(out.read_text())["method"] == "oracle"


def test_a_solve_printing_tables_builds_no_contract_models(tmp_path):
    """The contract's models (about a hundred pydantic classes) load where a document is written: a solve that
    prints tables reads its figures from ``fleetopt.optimizer.output.figures``; with ``--json`` the contract
    loads."""
    def code(*extra):
        return ("import sys\nfrom fleetopt.optimizer.cli import main\n"
                f"sys.argv = ['fleetopt', 'solve', {str(REPO / 'instances' / 'ref_puzzle10_lmsys.yaml')!r}, "
                f"*{list(extra)!r}]\n"
                "try:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0, done.code")
    names = ["fleetopt.optimizer.output.contract", "fleetopt.optimizer.output.contract.plan",
             "fleetopt.optimizer.output.contract.simulation", "fleetopt.optimizer.output.contract.workflows",
             "fleetopt.optimizer.output.figures"]
    assert _loaded(code(), names, tmp_path) == ["fleetopt.optimizer.output.figures"]
    # with --json, the solve document's module alone: not the other commands' documents
    assert _loaded(code("--json", str(tmp_path / "o.json")), names, tmp_path) == [
        "fleetopt.optimizer.output.contract", "fleetopt.optimizer.output.contract.plan",
        "fleetopt.optimizer.output.figures"]


def test_a_process_run_freezes_the_heap_at_exit_and_a_caller_keeps_its_collector(tmp_path):
    """The ``fleetopt`` process skips the interpreter's full collections at exit (``cli._freeze_at_exit``) and runs
    with a larger young generation (``cli.PROCESS_GC_THRESHOLD``); a caller that passes arguments (a test runner, a
    script) gets its own collector settings back and nothing frozen."""
    import gc

    from click.testing import CliRunner

    from fleetopt.optimizer.cli import main

    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))   # runs after fleetopt's own\n"
            "from fleetopt.optimizer.cli import main\n"
            "sys.argv = ['fleetopt', '--version']\n"
            "main()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "frozen True"
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert CliRunner().invoke(main, ["--version"]).exit_code == 0
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in Linux's /proc")
@pytest.mark.parametrize("preset", [None, "", "2"])
def test_a_process_run_loads_blas_with_one_thread_unless_told(tmp_path, preset):
    """A ``fleetopt`` process sets ``OPENBLAS_NUM_THREADS`` to 1 before NumPy loads (``cli.PROCESS_BLAS_THREADS``):
    after a solve (NumPy's and SciPy's OpenBLAS loaded) it runs one thread, where each OpenBLAS would start one
    more per further core; a value the environment sets is kept (an empty one is OpenBLAS's default, as if unset),
    and a caller passing arguments gets no change."""
    from click.testing import CliRunner

    from fleetopt.optimizer.cli import main

    code = ("import atexit, os, sys\n"
            "atexit.register(lambda: print('blas', os.environ.get('OPENBLAS_NUM_THREADS'),"
            " len(os.listdir('/proc/self/task'))))\n"
            "from fleetopt.optimizer.cli import main\n"
            f"sys.argv = ['fleetopt', 'solve', {str(REPO / 'instances' / 'ref_puzzle10_lmsys.yaml')!r}]\n"
            "main()")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    _, value, threads = out.stdout.splitlines()[-1].split()
    assert value == (preset or "1")     # empty: OpenBLAS's default, as unset
    if not preset:
        assert threads == "1"
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    assert CliRunner().invoke(main, ["--version"]).exit_code == 0
    assert os.environ.get("OPENBLAS_NUM_THREADS") == before


def test_a_solve_loads_no_simulation_settings_and_the_api_still_hands_them_out(tmp_path):
    """``fleetopt solve`` never simulates: the simulation's settings (and the simulator's records they import) stay
    unloaded; ``api.SimOptions``, ``api.EngineOptions`` and ``api.VERIFY_SIM_OPTIONS`` load them on first use."""
    code = ("import sys\nfrom fleetopt.optimizer.cli import main\n"
            f"sys.argv = ['fleetopt', 'solve', {str(REPO / 'instances' / 'ref_puzzle10_lmsys.yaml')!r}, '--json', "
            f"{str(tmp_path / 'out.json')!r}]\n"
            "try:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0, done.code")
    names = ["fleetopt.optimizer.simulation.options", "fleetopt.solvers.des.state", "fleetopt.solvers.des.records"]
    assert _loaded(code, names, tmp_path) == []
    from fleetopt.optimizer import api
    from fleetopt.optimizer.simulation import options

    assert api.SimOptions is options.SimOptions and api.EngineOptions is options.EngineOptions
    assert api.VERIFY_SIM_OPTIONS is options.VERIFY_SIM_OPTIONS and api.VERIFY_SIM_OPTIONS.requests == 100_000
    with pytest.raises(AttributeError, match="no_such_name"):
        api.no_such_name  # noqa: B018


def test_a_mip_proven_at_the_root_loads_no_pyomo_and_keeps_stdout_one_document(tmp_path):
    """The stress instance's MIP is proven optimal by its LP relaxation, solved from the formulation's matrix
    through highspy: the process loads HiGHS but not Pyomo, and HiGHS's banner (printed by the first solver
    object a process makes, highspy 1.9+) does not reach stdout, where the document is the whole output. With the
    power cap at 50.3 kW its relaxation is fractional: branch and bound on the Pyomo model, stdout still one
    document; with ``--verbose`` HiGHS's log goes to stderr on either path."""
    stress = str(REPO / "instances" / "ref_units_stress_60x8.yaml")
    code = ("import sys\nfrom fleetopt.optimizer.cli import main\n"
            f"sys.argv = ['fleetopt', 'solve', {stress!r}, '--json', {str(tmp_path / 'out.json')!r}]\n"
            "try:\n    main()\nexcept SystemExit as done:\n    assert done.code == 0, done.code")
    assert _loaded(code, ["pyomo", "highspy", "fleetopt.solvers.mip"], tmp_path) == ["fleetopt.solvers.mip",
                                                                                      "highspy"]
    assert json.loads((tmp_path / "out.json").read_text())["method"] == "mip"
    capped = code.replace("'--json'", "'--set', 'constraints.max_power_kw=50.3', '--json'")
    assert _loaded(capped, ["pyomo"], tmp_path) == ["pyomo"]
    for args in ([], ["--set", "constraints.max_power_kw=50.3"], ["--verbose"],
                 ["--verbose", "--set", "constraints.max_power_kw=50.3"]):
        probe = ("import runpy, sys\nsys.argv = ['fleetopt', 'solve', *sys.argv[1:]]\n"
                 "runpy.run_module('fleetopt.optimizer.cli', run_name='__main__')")
        out = subprocess.run([sys.executable, "-c", probe, stress, *args, "--json", "-"], capture_output=True,
                             text=True, check=True, cwd=tmp_path)
        assert json.loads(out.stdout)["status"] == "optimal"
        # --verbose with the document on stdout: HiGHS's log (the relaxation's, and branch and bound's) on stderr
        assert ("Model status" in out.stderr) == ("--verbose" in args), out.stderr[-2000:]
