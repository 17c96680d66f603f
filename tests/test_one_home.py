"""One home per concept: the KV capacity, the solve-JSON reader, the simulation flags' errors, a replica's
physical GPUs and the keyword-only construction of the batched model's traffic.

Every expected figure is a closed form with the catalogue's literals written out: H100-SXM-80GB has
85,899,345,920 bytes (80 GiB), Llama-3.1-8B 8,030,261,248 parameters and 2 x 32 layers x 8 KV heads x 128 x
2 bytes = 131,072 KV bytes per token in bf16; vLLM's memory share is 0.9; the NCCL workspace is 392 MiB =
411,041,792 bytes per GPU at TP=4.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fleetopt.models.queueing.batched import BatchedTraffic
from fleetopt.models.roofline import computed_profile, kv_capacity_tokens
from fleetopt.optimizer.cli import main
from fleetopt.optimizer.commands.sim_flags import VERIFY_FLAGS, sim_options
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.profiling import measurements
from fleetopt.optimizer.io.catalog import bundled_catalog
from fleetopt.models.profiles import replica_unit
from fleetopt.optimizer.io.solve_json import read_solve_plan

MEMORY = 85_899_345_920
WEIGHTS = 2 * 8_030_261_248           # bf16
KV_PER_TOKEN = 2 * 32 * 8 * 128 * 2   # 131,072
NCCL_TP4 = 411_041_792


# --- KV capacity: one convention --------------------------------------------------------------------------------


def test_kv_capacity_closed_form_h100_llama8b():
    # TP=1, no NCCL workspace: (0.9 x 85,899,345,920 - 16,060,522,496) / 131,072 = 467,291.9
    assert kv_capacity_tokens(MEMORY, WEIGHTS, KV_PER_TOKEN, gpu_memory_utilization=0.9, reserve_bytes=0) == 467_291
    # TP=4 replica: (4 x 0.9 x M - W - 4 x 411,041,792) / 131,072 = 2,224,219.9
    assert kv_capacity_tokens(4 * MEMORY, WEIGHTS, KV_PER_TOKEN, gpu_memory_utilization=0.9,
                              reserve_bytes=4 * NCCL_TP4) == 2_224_219
    assert measurements.kv_capacity_tokens(4 * MEMORY, WEIGHTS, KV_PER_TOKEN, 4 * NCCL_TP4) == 2_224_219


def test_computed_and_measured_profiles_share_the_nccl_reserve():
    """A computed TP=4 replica's KV blocks are the measured path's tokens in blocks of 16: per GPU
    0.9 x M - W/4 - 411,041,792 = 72,883,238,912 bytes over 32,768 bytes per token (2 of 8 KV heads)."""
    c = bundled_catalog()
    p = computed_profile(c.hardware["H100-SXM-80GB"], c.models["Llama-3.1-8B"], tp=4, dtype="bf16",
                         defaults=c.defaults)
    assert p.kv_budget_bytes == 72_883_238_912
    assert p.total_kv_blocks == 72_883_238_912 // (32_768 * 16) == 139_013
    assert measurements.kv_capacity_tokens(4 * MEMORY, WEIGHTS, KV_PER_TOKEN, 4 * NCCL_TP4) // 16 == 139_013


# --- the solve-JSON reader -------------------------------------------------------------------------------------

_POOL = {"min_tokens": 0, "max_tokens": 65536, "gpu": "h100", "replicas": 2, "gpus": 2, "max_num_seqs": 8,
         "profile": "H100-80GB"}


def _file(tmp_path, doc) -> str:
    path = tmp_path / "solve.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("doc, rank, field, phrase", [
    ({"command": "solve", "instance": "x", "pools": [_POOL]}, 1, "solutions",
     "must be a list of solutions; got null"),
    ({"command": "solve", "instance": 5, "pools": [_POOL]}, None, "instance", "the number 5 is not allowed"),
    ({"command": "solve", "instance": "x", "pools": [_POOL], "solutions": [{"pools": []}]}, 1,
     "solutions[0].pools", "got an empty list"),
    ({"command": "solve", "instance": "x", "pools": [_POOL], "solutions": [{"pools": [_POOL]}]}, 3,
     "solutions", "--rank 3: the file holds 1 solution(s) (solve with --top N for more)"),
    ({"command": "solve", "instance": "x", "status": "infeasible", "pools": None}, None, "pools",
     "the solve found no plan (status 'infeasible')"),
    ({"command": "evaluate"}, None, "command", "write one with fleetopt solve INSTANCE --json FILE"),
], ids=["no-solutions", "instance-number", "empty-pools", "rank-past-end", "no-plan", "not-solve"])
def test_the_reader_refuses_with_one_line(tmp_path, doc, rank, field, phrase):
    path = _file(tmp_path, doc)
    with pytest.raises(InstanceError) as err:
        read_solve_plan(path, rank)
    (line,) = err.value.problems
    assert line.startswith(f"{path}: {field}: ") and phrase in line, line


def test_the_reader_checks_the_instance_when_asked(tmp_path):
    path = _file(tmp_path, {"command": "solve", "instance": "other", "pools": [_POOL]})
    assert read_solve_plan(path).instance == "other"
    with pytest.raises(InstanceError, match="solved for instance 'other', not 'quickstart'"):
        read_solve_plan(path, instance="quickstart")


def test_export_and_simulate_refuse_a_file_without_solutions_alike(repo_root, tmp_path):
    """Before, simulate --plan read a missing solutions list as 0 solutions while export refused it."""
    path = _file(tmp_path, {"command": "solve", "instance": "lmsys-a100-h100-units", "overrides": [], "pools": [_POOL]})
    runs = [CliRunner().invoke(main, ["export", path, "--format", "vllm", "--plan", "1"]),
            CliRunner().invoke(main, ["simulate", str(repo_root / "instances" / "ref_units_lmsys_a100_h100.yaml"),
                                      "--plan", path,
                                      "--rank", "1"])]
    for res in runs:
        assert res.exit_code == 2, res.output
        assert f"{path}: solutions: must be a list of solutions; got null" in res.output, res.output


# --- the simulation flags ----------------------------------------------------------------------------------------


def test_a_bad_seed_names_the_seed_flag():
    """whatif and headroom called it --sim-seed, a flag they do not have."""
    with pytest.raises(InstanceError) as err:
        sim_options(VERIFY_FLAGS, requests=20_000, replications=5, seed=-1)
    assert err.value.problems[0].startswith("--seed: ")


# --- a replica's physical GPUs ----------------------------------------------------------------------------------


def test_physical_gpus_are_a_field_of_the_profile():
    c = bundled_catalog()
    seed = c.profiles["H100-80GB"]      # the seeds' TP=8 unit, counted as one GPU
    assert (seed.gpus_per_replica, seed.physical_gpus_per_replica) == (1, 8)
    assert replica_unit(seed).unit == "seed_unit"
    tp4 = computed_profile(c.hardware["H100-SXM-80GB"], c.models["Llama-3.1-8B"], tp=4, dtype="bf16",
                           defaults=c.defaults)
    assert (tp4.gpus_per_replica, tp4.physical_gpus_per_replica) == (4, 4)
    assert replica_unit(tp4).unit == "gpu"
    assert c.profiles["A10G"].physical_gpus_per_replica == 1


# --- keyword-only construction ------------------------------------------------------------------------------------


def test_from_stats_takes_the_cap_by_name_only():
    with pytest.raises(TypeError):
        BatchedTraffic.from_stats(None, 1.0, 8)
