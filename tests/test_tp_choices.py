"""Tensor parallelism and quantisation as decisions: a ``gpus`` entry listing ``tp``/``dtype`` values.

* the roofline's tensor-parallel all-reduce and MoE dispatch terms against hand calculations from the catalogue's
  figures (H100: 3.35 TB/s, 989/1,978 TFLOPS, NVLink 450 GB/s; Llama-3.1-70B: 80 layers, hidden 8,192);
* the expansion into named configurations, the ones skipped and why, and the errors of an entry with none that fits;
* the entry's ``max_count``/``max_pools`` binding the sum over its configurations (a case where per-configuration
  caps would allow more);
* the MIP against exhaustive enumeration written out here: every tiling of the boundaries into at most
  ``pools.max_pools`` candidate pools, every replica choice, the shared limits checked from the instance file's
  own entries (by name), never through the solver's problem record.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetopt.models.hardware import HardwareSpec
from fleetopt.models.roofline import computed_profile
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.catalog import load_catalog
from fleetopt.optimizer.io.instance import gpu_warnings, instance_from_dict
from fleetopt.optimizer.plan.candidates import generate_candidates
from fleetopt.optimizer.plan.explain import pool_configurations
from fleetopt.optimizer.plan.solve import SolveOptions, solve_instance

H100 = "H100-SXM-80GB"
L70 = "Llama-3.1-70B"
MM_70B = 70_553_706_496 - 128_256 * 8_192          # matmul weights of a decode token (embedding gathered)


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def build(cat, gpu, model, **kw):
    return computed_profile(cat.hardware[gpu], cat.models[model], defaults=cat.defaults, **kw)


# --- the all-reduce and the dispatch, by hand -----------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_allreduce_against_hand_calculation(cat, tp):
    """2 all-reduces per layer of hidden x 2 B per token, ring 2 (tp-1)/tp over 450 GB/s, 10 us per call."""
    p = build(cat, H100, L70, tp=tp, dtype="fp8")
    per_token = 2 * 80 * (2 * (tp - 1) / tp) * 8_192 * 2 / 450e9
    assert p.tp_allreduce_s_per_token == pytest.approx(per_token, rel=1e-12)
    assert p.tp_allreduce_latency_s == pytest.approx(2 * 80 * 10e-6, rel=1e-12)
    # g and a: the fp8 matmuls (1,978 TFLOPS x 0.60) split over tp, plus the all-reduce per token
    assert p.g_s == pytest.approx(2 * MM_70B / tp / (1978e12 * 0.60) + per_token, rel=1e-12)
    assert p.prefill_a_s == pytest.approx(2 * (MM_70B - 128_256 * 8_192) / tp / (1978e12 * 0.60) + per_token,
                                          rel=1e-12)
    # W: the fp8 weights streamed at 0.75 x 3.35 TB/s, 3 us per layer, 2 x 80 all-reduce latencies
    assert p.W_s == pytest.approx(MM_70B * 1 / tp / (3.35e12 * 0.75) + 80 * 3e-6 + 160 * 10e-6, rel=1e-12)
    assert p.link_bandwidth_bytes_per_s == 450e9


def test_tp1_and_seeds_pay_no_all_reduce(cat):
    one = build(cat, H100, "Llama-3.1-8B", dtype="bf16")
    assert (one.tp_allreduce_s_per_token, one.tp_allreduce_latency_s, one.moe_dispatch_s) == (0.0, 0.0, 0.0)
    assert one.link_bandwidth_bytes_per_s is None
    seeds = computed_profile(cat.hardware[H100], cat.models[L70], tp=8, defaults=cat.defaults.seeds_convention())
    assert seeds.W_s == pytest.approx(70_553_706_496 * 2 / 8 / (3.35e12 * 0.80) + 80 * 3e-6, rel=1e-12)
    assert (seeds.g_s, seeds.tp_allreduce_s_per_token, seeds.tp_allreduce_latency_s) == (0.0, 0.0, 0.0)


def test_moe_dispatch_overhead_against_hand_calculation(cat):
    """Qwen3-30B-A3B on one H100: 48 layers x 20 us of dispatch on top of the active weights' streaming."""
    p = build(cat, H100, "Qwen3-30B-A3B", dtype="bf16")
    m = cat.models["Qwen3-30B-A3B"]
    streamed = m.active_params - m.vocab_size * m.hidden_size * (0 if m.tied_embeddings else 1)
    assert p.moe_dispatch_s == pytest.approx(48 * 20e-6, rel=1e-12)
    assert p.W_s == pytest.approx(streamed * 2 / (3.35e12 * 0.75) + 48 * 3e-6 + 48 * 20e-6, rel=1e-12)
    assert build(cat, H100, "Llama-3.1-8B").moe_dispatch_s == 0.0


def test_link_is_nvlink_else_pcie_else_an_error(cat):
    a10g = build(cat, "A10G", "Llama-3.1-8B", tp=2)        # PCIe only: 32 GB/s
    assert a10g.link_bandwidth_bytes_per_s == 32e9
    assert a10g.tp_allreduce_s_per_token == pytest.approx(2 * 32 * 1.0 * 4_096 * 2 / 32e9, rel=1e-12)
    bare = HardwareSpec("bare", (), 85899345920, 3.35e12, 989.0, None, 700.0, 1.0, None)
    with pytest.raises(ValueError, match="no link bandwidth"):
        computed_profile(bare, cat.models["Llama-3.1-8B"], tp=2, defaults=cat.defaults)
    assert computed_profile(bare, cat.models["Llama-3.1-8B"], tp=1, defaults=cat.defaults).W_s > 0


def test_catalogue_reads_link_bandwidths(cat):
    h = cat.hardware[H100]
    assert (h.nvlink_bandwidth_bytes_per_s, h.inter_node_bandwidth_bytes_per_s, h.pcie_bandwidth_bytes_per_s) == (
        450e9, 50e9, 64e9)
    assert cat.hardware["A10G"].nvlink_bandwidth_bytes_per_s is None
    assert (cat.defaults.p2p_latency_s, cat.defaults.moe_dispatch_s_per_layer, cat.defaults.activation_bytes) == (
        10e-6, 20e-6, 2.0)


# --- expansion ---------------------------------------------------------------------------------------------------


def data(gpus, rate=50.0, slo_ms=2000.0, max_pools=3, context=8192, **pools):
    return {"workload": {"cdf": "builtin:lmsys", "arrival_rate": rate}, "slo": {"ttft_p99_ms": slo_ms},
            "gpus": gpus, "pools": {"max_pools": max_pools, "max_context": context, **pools}}


def test_lists_expand_into_named_configurations_and_record_the_skipped():
    inst = instance_from_dict(data([
        {"name": "a100", "hardware": "A100-SXM-80GB", "model": L70, "tp": [1, 4, 8], "dtype": ["bf16", "fp8"]},
        {"name": "h100", "hardware": H100, "model": L70, "tp": 8, "dtype": "fp8"}]))
    names = [g.name for g in inst.gpus]
    assert names == ["a100/tp4/bf16", "a100/tp8/bf16", "h100"]          # a single-valued entry keeps its name
    a100, h100 = inst.inventories
    assert (a100.name, a100.index, a100.options) == ("a100", 0, ("a100/tp4/bf16", "a100/tp8/bf16"))
    assert (h100.options, h100.configurations) == (("h100",), ())
    skipped = {(c.tp, c.dtype): c.reason for c in a100.configurations if c.option is None}
    assert set(skipped) == {(1, "bf16"), (1, "fp8"), (4, "fp8"), (8, "fp8")}
    assert "no KV cache" in skipped[(1, "bf16")] and "FP8" in skipped[(4, "fp8")]
    assert inst.gpu("a100/tp8/bf16").profile.tp == 8 and inst.inventory("a100/tp4/bf16").name == "a100"
    said = [w for w in gpu_warnings(inst) if w.startswith("gpus[0] a100: 4 of 6 tp/dtype configurations do not fit")]
    assert len(said) == 1 and "tp1/bf16 (no KV cache" in said[0] and "tp8/fp8 (dtype 'fp8'" in said[0]


def test_an_entry_with_no_fitting_combination_is_one_error_naming_tp():
    with pytest.raises(InstanceError) as err:
        instance_from_dict(data([{"name": "a10g", "hardware": "A10G", "model": L70, "tp": [1, 2],
                                  "dtype": ["fp8", "bf16"]}]), path="x.yaml")
    text = str(err.value)
    assert "x.yaml: gpus[0].tp: no combination of tp [1, 2] and dtype ['fp8', 'bf16'] fits" in text
    assert "tp1/fp8" in text and "tp2/bf16: no KV cache" in text and len(text.splitlines()) == 1


def test_a_count_below_one_replica_skips_that_configuration():
    inst = instance_from_dict(data([{"name": "h", "hardware": H100, "model": L70, "tp": [2, 8], "dtype": "fp8",
                                     "max_count": 4}]))
    assert [g.name for g in inst.gpus] == ["h/tp2/fp8"]
    reason = next(c.reason for c in inst.inventories[0].configurations if c.tp == 8)
    assert "needs 8 GPUs, more than max_count 4" in reason


@pytest.mark.parametrize("entry,field,words", [
    ({"tp": [2, 3]}, "gpus[0].tp", "3 in the list is not allowed"),
    ({"dtype": []}, "gpus[0].dtype", "the list is empty"),
    ({"dtype": ["fp8", "fp8"]}, "gpus[0].dtype", "listed twice"),
    ({"tp": [2, 4], "cost_per_hr": 9.0}, "gpus[0].cost_per_hr", "several tensor-parallel degrees"),
])
def test_bad_lists_are_one_line_errors(entry, field, words):
    with pytest.raises(InstanceError, match=rf"{field.replace('[', '.').replace(']', '.')}: .*{words}"):
        instance_from_dict(data([{"name": "h", "hardware": H100, "model": L70, "tp": 8, "dtype": "fp8", **entry}]))


def test_split_routing_refuses_a_shared_inventory():
    with pytest.raises(InstanceError, match=r"gpus\[0\]\.max_count: 'split' routing"):
        instance_from_dict(data([{"name": "h", "hardware": H100, "model": L70, "tp": [4, 8], "dtype": "fp8",
                                  "max_count": 16}], routing="split"))


# --- the shared inventory ------------------------------------------------------------------------------------------


def test_max_count_binds_the_sum_over_configurations():
    """LMSYS at 100 req/s, 2 s: unlimited, the plan runs TP=2 and TP=4 pools on 16 GPUs together. With 12 GPUs
    per configuration (two entries) it still may; with one entry of max_count 12 its GPUs sum to at most 12."""
    conf = {"hardware": H100, "model": L70, "dtype": "fp8"}
    free = solve_instance(instance_from_dict(data([{"name": "h", "tp": [2, 4], **conf}], rate=100)),
                          SolveOptions(compute_baseline=False)).best.fleet
    assert len({p.gpu for p in free.pools}) == 2 and free.total_gpus > 12
    apart = solve_instance(instance_from_dict(data([{"name": "a", "tp": 2, "max_count": 12, **conf},
                                                    {"name": "b", "tp": 4, "max_count": 12, **conf}], rate=100)),
                           SolveOptions(compute_baseline=False)).best.fleet
    assert apart.total_gpus > 12
    shared = solve_instance(instance_from_dict(data([{"name": "h", "tp": [2, 4], "max_count": 12, **conf}],
                                                    rate=100)), SolveOptions(compute_baseline=False))
    if shared.best is not None:
        assert shared.best.fleet.total_gpus <= 12
        assert shared.best.fleet.cost_per_hr >= apart.cost_per_hr - 1e-9
    else:
        assert str(shared.status) == "infeasible"


def test_max_pools_binds_the_sum_over_configurations():
    conf = {"hardware": H100, "model": L70, "dtype": "fp8", "tp": [2, 4, 8]}
    one = solve_instance(instance_from_dict(data([{"name": "h", "max_pools": 1, **conf}], rate=100)),
                         SolveOptions(compute_baseline=False)).best.fleet
    assert len(one.pools) == 1


# --- MIP == exhaustive enumeration ---------------------------------------------------------------------------------


def random_tp_instance(seed: int):
    rng = np.random.default_rng(seed)
    entries = [{"name": "h", "hardware": H100, "model": L70,
                "tp": sorted(int(t) for t in rng.choice([2, 4, 8], size=int(rng.integers(1, 4)), replace=False)),
                "dtype": [str(d) for d in rng.choice(["bf16", "fp8"], size=int(rng.integers(1, 3)), replace=False)]}]
    if rng.random() < 0.6:
        entries.append({"name": "a", "hardware": "A100-SXM-80GB", "model": L70,
                        "tp": [4, 8], "dtype": ["bf16", "fp8"]})      # fp8 does not fit an A100: skipped
    if len(entries[0]["tp"]) * len(entries[0]["dtype"]) == 1 and len(entries) == 1:
        entries[0]["dtype"] = ["bf16", "fp8"]
    inner = sorted(int(b) for b in rng.choice([512, 1024, 2048, 4096], size=int(rng.integers(1, 4)), replace=False))
    d = data(entries, rate=float(rng.choice([60, 150, 300])), slo_ms=float(rng.choice([1000, 2000])),
             max_pools=int(rng.integers(2, 4)), boundaries=inner)
    d["slo"]["ttft_model"] = "tail"
    free = solve_instance(instance_from_dict(d), SolveOptions(compute_baseline=False))
    if free.best is not None:     # caps around what the unlimited plan uses of each entry, so that they bind
        for e in d["gpus"]:
            used = sum(p.gpus for p in free.best.fleet.pools if p.gpu.split("/")[0] == e["name"])
            if rng.random() < 0.8:
                e["max_count"] = int(max(8, round((used or 16) * rng.uniform(0.5, 1.1))))
            if rng.random() < 0.3:
                e["max_pools"] = 1
    return d


def enumerate_by_hand(d: dict, inst) -> float | None:
    """Least cost over every tiling into at most max_pools candidate pools and every replica choice, with each
    file entry's max_count (GPUs) and max_pools summed over the options named after it."""
    c = generate_candidates(inst)
    entry = {g.name: g.name.split("/")[0] for g in inst.gpus}       # configuration names are ENTRY/tpT/DTYPE
    limits = {e["name"]: (e.get("max_count"), e.get("max_pools")) for e in d["gpus"]}
    leaving: dict[int, list[tuple[int, str, float, int]]] = {}
    for ch in range(c.n_choices):
        p = int(c.choice_pool[ch])
        leaving.setdefault(int(c.i[p]), []).append((int(c.j[p]), c.gpu_names[int(c.gpu[p])],
                                                    float(c.choice_cost_per_hr[ch]), int(c.choice_gpus[ch])))
    sink, max_pools = len(c.boundaries) - 1, d["pools"]["max_pools"]
    best = math.inf

    def walk(node, cost, pools, gpus, count):
        nonlocal best
        if node == sink:
            best = min(best, cost)
            return
        if count == max_pools:
            return
        for j, option, price, n_gpus in leaving.get(node, ()):
            e = entry[option]
            cap, pool_cap = limits[e]
            if cap is not None and gpus.get(e, 0) + n_gpus > cap:
                continue
            if pool_cap is not None and pools.get(e, 0) + 1 > pool_cap:
                continue
            walk(j, cost + price, {**pools, e: pools.get(e, 0) + 1}, {**gpus, e: gpus.get(e, 0) + n_gpus},
                 count + 1)

    walk(0, 0.0, {}, {}, 0)
    return None if best == math.inf else best


@pytest.mark.parametrize("seed", [3, 12, 0] + [pytest.param(s, marks=pytest.mark.slow)
                                                for s in range(16) if s not in (3, 12, 0)])
def test_mip_with_tp_dtype_lists_equals_exhaustive_enumeration(seed):
    d = random_tp_instance(seed)
    inst = instance_from_dict(d)
    ref = enumerate_by_hand(d, inst)
    rep = solve_instance(inst, SolveOptions(method="mip", compute_baseline=False))
    if ref is None:
        assert rep.best is None and str(rep.status) == "infeasible"
        return
    assert rep.best is not None and rep.best.objective == pytest.approx(ref, rel=1e-9, abs=1e-9)
    used: dict[str, int] = {}
    for p in rep.best.fleet.pools:
        used[p.gpu.split("/")[0]] = used.get(p.gpu.split("/")[0], 0) + p.gpus
    for e in d["gpus"]:
        if e.get("max_count") is not None:
            assert used.get(e["name"], 0) <= e["max_count"]


# --- the example and --explain -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_example_picks_different_configurations_and_explains_why(repo_root):
    from fleetopt.models.fleet import PoolPlan
    from fleetopt.optimizer.io.instance import load_instance

    inst = load_instance(repo_root / "instances" / "llama70b_tp.yaml")
    rep = solve_instance(inst, SolveOptions(compute_baseline=False))
    pools = rep.best.fleet.pools
    assert len({p.gpu for p in pools}) >= 2                                 # configurations differ per pool
    plans = [PoolPlan(p.min_tokens, p.max_tokens, p.gpu, inst.gpu(p.gpu).profile, p.replicas) for p in pools]
    explained = pool_configurations(inst, plans)
    assert [e.chosen for e in explained] == [p.gpu for p in pools]
    for e, p in zip(explained, pools):
        assert len(e.options) == 6 and sum(o.chosen for o in e.options) == 1
        for o in e.options:
            if o.cost_per_hr is not None:      # priced per physical GPU-hour at the catalogue's $4.02
                assert o.cost_per_hr == pytest.approx(o.replicas * o.tp * 4.02, rel=1e-12)
            if not o.chosen and o.objective is not None:
                assert o.objective >= p.cost_per_hr - 1e-9 and ("dearer" in o.verdict or "as cheap" in o.verdict)
        assert e.chosen in e.why and "cheapest" in e.why


def test_explain_names_the_configurations_of_a_pool():
    inst = instance_from_dict(data([{"name": "h", "hardware": H100, "model": L70, "tp": [2, 8], "dtype": "fp8"}],
                                   rate=20, max_pools=1))
    from fleetopt.models.fleet import PoolPlan

    rep = solve_instance(inst, SolveOptions(compute_baseline=False))
    p = rep.best.fleet.pools[0]
    (e,) = pool_configurations(inst, [PoolPlan(p.min_tokens, p.max_tokens, p.gpu, inst.gpu(p.gpu).profile,
                                               p.replicas)])
    other = next(o for o in e.options if not o.chosen)
    chosen = next(o for o in e.options if o.chosen)
    assert {o.option for o in e.options} == {"h/tp2/fp8", "h/tp8/fp8"} and chosen.option == p.gpu
    assert other.objective is None or other.objective >= chosen.objective - 1e-9
