"""``fleetopt profile probe``: the grid, the timing and power protocol, the files, the decoder's arithmetic.

No GPU here (CI never has one): the harness runs on a synthetic device whose clock and energy counter follow
closed forms (the fit must then recover those coefficients exactly), and on the numpy reference decoder. The
torch decoder is compared with the numpy one on the CPU where PyTorch is installed (the optional probe extra).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.profiling.measurements import fit_measurements, read_measurements
from fleetopt.optimizer.profiling.probe import (DECODE_REPEATS, IDLE_WINDOW_S, POWER_WINDOW_S, ModelShape, NumpyBackend,
                                         ProbeGrid,
                                         ProbeSettings, decoder_weights, measure, numpy_attention, numpy_forward,
                                         probe_files, probe_grid, probe_stem, run_probe, write_probe_files)

HAS_TORCH = importlib.util.find_spec("torch") is not None
TINY = ModelShape(layers=2, hidden=64, heads=8, kv_heads=2, head_dim=16, ffn=96, vocab=50)


# --- the grid ---------------------------------------------------------------------------------------------------

def test_grid_is_the_shipped_h100_grid(repo_root):
    # The shipped H100 file's full-occupancy batches (384 x 1,024 = 393,216 tokens) give its KV budget; the grid
    # rule must then reproduce every (batch, context) point of the file, and its prompt lengths.
    with open(repo_root / "data" / "measurements" / "h100_llama31_8b_decode.csv", newline="") as f:
        shipped = {(int(r["batch"]), int(r["context_tokens"])) for r in csv.DictReader(f)}
    with open(repo_root / "data" / "measurements" / "h100_llama31_8b_prefill.csv", newline="") as f:
        prompts = [int(r["prompt_tokens"]) for r in csv.DictReader(f)]
    g = probe_grid(393_216, 131_072)
    assert set(g.decode) == shipped and len(g.decode) == len(shipped) == 49
    assert list(g.prefill) == prompts


@pytest.mark.parametrize("kv, window", [(1, 4096), (1023, 4096), (1024, 4096), (50_000, 8192), (10**7, 131_072)])
def test_grid_fits_the_budget_and_reaches_full_occupancy(kv, window):
    g = probe_grid(kv, window)
    assert all(b * c <= kv and c <= window for b, c in g.decode)
    for c in {c for _, c in g.decode}:
        assert max(b for b, cc in g.decode if cc == c) == kv // c
    assert all(p <= min(kv, window) for p in g.prefill)
    assert len(set(g.decode)) == len(g.decode)


# --- the protocol on a synthetic device ---------------------------------------------------------------------------

W, H, G, A, B = 6.4e-3, 4.5e-8, 2.5e-5, 2.65e-5, 7.4e-10


class ClosedFormDevice:
    """A device whose work advances a clock by closed-form times and its energy counter by closed-form power."""

    idle_w = 70.0

    def __init__(self, kv_tokens: int):
        self.t, self.e, self._kv = 100.0, 5_000.0, kv_tokens

    @staticmethod
    def decode_s(b, c):
        return W + H * b * c + G * b

    @staticmethod
    def decode_w(b, c):
        return 300.0 + 2.0 * b + 0.002 * c

    def _work(self, dt, watts):
        def run():
            self.t += dt
            self.e += watts * dt
        return run

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += s
        self.e += self.idle_w * s

    def describe(self):
        return {"device_name": "closed-form device", "memory_gib": 80.0, "board_power_limit_w": 700.0}

    def kv_tokens(self):
        return self._kv

    def decode(self, b, c):
        return self._work(self.decode_s(b, c), self.decode_w(b, c))

    def prefill(self, p):
        return self._work(W + A * p + B * p * p, 650.0)     # one pass streams the weights once

    def synchronize(self):
        pass

    def energy_j(self):
        return self.e

    def release(self):
        pass


def test_protocol_recovers_the_device_and_the_fit_its_coefficients(tmp_path):
    dev = ClosedFormDevice(65_536)
    settings = ProbeSettings("H100-SXM-80GB", "Llama-3.1-8B")
    grid = probe_grid(dev.kv_tokens(), 131_072)
    res = run_probe(dev, settings, grid, TINY, clock=dev.clock, sleep=dev.sleep)
    assert res.meta["idle_power_w"] == pytest.approx(ClosedFormDevice.idle_w, rel=1e-9)
    for r in res.decode:
        assert r.median_s == pytest.approx(dev.decode_s(r.batch, r.context_tokens), rel=1e-9)
        assert r.min_s == pytest.approx(r.median_s, rel=1e-9)
        assert r.power_w == pytest.approx(dev.decode_w(r.batch, r.context_tokens), rel=1e-9)
    for r in res.prefill:
        assert r.median_s == pytest.approx(W + A * r.prompt_tokens + B * r.prompt_tokens ** 2, rel=1e-9)
        assert r.power_w == pytest.approx(650.0, rel=1e-9)
    paths = write_probe_files(res, tmp_path)
    m = read_measurements([str(p) for p in paths])
    assert len(m.decode) == len(grid.decode) and len(m.prefill) == len(grid.prefill)
    it = fit_measurements(m).iteration
    assert (it.W_s, it.h_s_per_token, it.g_s) == pytest.approx((W, H, G), rel=1e-5)
    assert (it.prefill_a_s, it.prefill_b_s) == pytest.approx((A, B), rel=1e-5)


def test_power_window_lasts_its_length():
    # The power window replays back to back for at least POWER_WINDOW_S: the energy read spans that long.
    dev = ClosedFormDevice(4096)
    calls = []
    inner = dev._work

    def counting(dt, watts):
        run = inner(dt, watts)

        def wrapped():
            calls.append(dt)
            run()
        return wrapped

    dev._work = counting
    run_probe(dev, ProbeSettings("H100-SXM-80GB", "Llama-3.1-8B"), ProbeGrid(((1, 1024),), ()), TINY,
              clock=dev.clock, sleep=dev.sleep)
    t = dev.decode_s(1, 1024)
    timed = 3 + DECODE_REPEATS                   # warm-up and timed replays
    window = len(calls) - timed - math.ceil(0.7 / t)
    assert window == math.ceil(POWER_WINDOW_S / t) and window * t >= POWER_WINDOW_S


# --- the numpy reference decoder ----------------------------------------------------------------------------------

def test_grouped_attention_is_attention_with_repeated_kv_heads():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 8, 5, 16))
    k, v = rng.standard_normal((2, 2, 9, 16)), rng.standard_normal((2, 2, 9, 16))
    rep_k, rep_v = np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1)
    for causal in (False, True):
        s = np.einsum("bhqd,bhtd->bhqt", q, rep_k) / 4.0
        if causal:
            s = np.where(np.arange(9)[None, :] > (4 + np.arange(5))[:, None], -np.inf, s)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("bhqt,bhtd->bhqd", p / p.sum(-1, keepdims=True), rep_v)
        np.testing.assert_allclose(numpy_attention(q, k, v, causal), want, rtol=1e-12)


def test_decode_after_prefill_equals_the_longer_prefill():
    # KV-cache consistency: prefilling P-1 tokens and decoding the P-th from the cache gives the logits of
    # prefilling all P tokens at once.
    w = decoder_weights(TINY, 3, dtype=np.float64)
    rng = np.random.default_rng(2)
    P = 12
    x = rng.standard_normal((1, P, TINY.hidden))

    def caches():
        return [(np.zeros((1, 2, P, 16)), np.zeros((1, 2, P, 16))) for _ in range(TINY.layers)]

    whole = numpy_forward(TINY, w, x, caches(), 0)
    c = caches()
    numpy_forward(TINY, w, x[:, :P - 1], c, 0)
    step = numpy_forward(TINY, w, x[:, P - 1:], c, P - 1)
    np.testing.assert_allclose(step, whole, rtol=1e-10, atol=1e-12)


def test_params_are_the_catalogue_models_weights(catalog):
    # Llama-3.1-8B without its embedding table: 8.03e9 - 128,256 x 4,096 parameters, 15.01 GB in bf16 (the meta)
    shape = ModelShape.of(catalog.models["Llama-3.1-8B"])
    assert shape.params * 2 / 1e9 == pytest.approx(15.01, abs=0.01)
    assert shape.kv_bytes_per_token(2) == catalog.models["Llama-3.1-8B"].kv_bytes_per_token_fp16


@pytest.mark.slow
def test_measure_on_the_numpy_decoder_writes_files_the_fit_reads(tmp_path):
    opened = []

    def numpy_device(shape, dtype):
        opened.append((shape, dtype))
        return NumpyBackend(shape, kv_tokens=3072)

    settings = ProbeSettings("h100", "llama-3.1-8b", decode_repeats=3, prefill_repeats=2, max_context=1024)
    steps = []
    res, paths = measure(settings, tmp_path, numpy_device, shape=TINY, on_step=steps.append)
    assert opened == [(TINY, "bf16")]
    assert paths == probe_files(tmp_path, probe_stem("H100-SXM-80GB", "Llama-3.1-8B"))
    assert res.settings.hardware == "H100-SXM-80GB" and res.settings.model == "Llama-3.1-8B"   # canonical names
    assert [(r.batch, r.context_tokens) for r in res.decode] == list(probe_grid(3072, 1024).decode)
    assert len(steps) == len(res.decode) + len(res.prefill)
    assert all(0 < r.min_s <= r.median_s and r.power_w is None for r in res.decode + res.prefill)
    m = read_measurements([str(p) for p in paths])
    assert [p.seconds for p in m.decode] == pytest.approx([r.median_s for r in res.decode], rel=1e-7)
    meta = json.loads(paths[2].read_text())
    assert meta["model_shape"] == TINY.to_json() and "idle_power_w" not in meta
    with pytest.raises(InstanceError, match="exists; the probe does not overwrite"):
        measure(settings, tmp_path, numpy_device, shape=TINY)
    assert len(opened) == 1                      # refused before the device was opened


@pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed (the optional probe extra)")
def test_torch_decoder_computes_the_numpy_reference():
    import torch

    from fleetopt.optimizer.profiling.probe_torch import TorchBackend

    w = decoder_weights(TINY, 3)
    tb = TorchBackend(TINY, "fp32", "cpu", weights=w)
    rng = np.random.default_rng(0)
    for T, pos in ((1, 20), (17, 0)):
        caches = [tuple(rng.standard_normal((3 if T == 1 else 1, 2, pos + T, 16)).astype(np.float32)
                        for _ in range(2)) for _ in range(TINY.layers)]
        x = rng.standard_normal((len(caches[0][0]), T, TINY.hidden)).astype(np.float32)
        tc = [tuple(torch.from_numpy(a.copy()) for a in kv) for kv in caches]
        want = numpy_forward(TINY, w, x, caches, pos)
        got = tb.forward(torch.from_numpy(x), tc, pos).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# --- the command --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--tp", "2"], "--tp: 2: the probe measures one GPU"),
    (["--hardware", "XYZ"], "--hardware: unknown hardware 'XYZ'"),
    (["--model", "DeepSeek-V3"], "--model: DeepSeek-V3 is a mixture of experts"),
])
def test_probe_refuses_bad_requests_in_one_line(args, message, tmp_path):
    base = {"--hardware": "H100-SXM-80GB", "--model": "Llama-3.1-8B"}
    extra = dict(zip(args[::2], args[1::2]))
    argv = ["profile", "probe", "-o", str(tmp_path)] + [x for k, v in {**base, **extra}.items() for x in (k, v)]
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_probe_checks_its_output_before_measuring(tmp_path):
    taken = probe_files(tmp_path, probe_stem("H100-SXM-80GB", "Llama-3.1-8B"))[1]
    taken.write_text("mine\n")
    r = CliRunner().invoke(main, ["profile", "probe", "--hardware", "H100-SXM-80GB", "--model", "Llama-3.1-8B",
                                  "-o", str(tmp_path)])
    assert r.exit_code == 2 and "exists; the probe does not overwrite" in r.stderr
    assert taken.read_text() == "mine\n"


@pytest.mark.skipif(HAS_TORCH, reason="checks the message where PyTorch is absent")
def test_probe_without_torch_says_so_in_one_line(tmp_path):
    r = CliRunner().invoke(main, ["profile", "probe", "--hardware", "H100-SXM-80GB", "--model", "Llama-3.1-8B",
                                  "-o", str(tmp_path)])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "PyTorch is not installed" in r.stderr and "fleetopt[probe]" in r.stderr
    assert list(tmp_path.iterdir()) == []


# --- NVML: the names the GPU backend calls are the real module's -------------------------------------------------

PROBE_TORCH = Path(__file__).resolve().parents[1] / "optimizer" / "profiling" / "probe_torch.py"


def test_every_nvml_name_the_backend_uses_is_in_nvidia_ml_py():
    # A fake NVML once shared a misspelt name with the code; the real module (nvidia-ml-py, the test extra,
    # installs without a GPU) is the reference for every name the source calls.
    import pynvml

    from fleetopt.optimizer.profiling.probe_torch import NVML_FUNCTIONS

    used = set(re.findall(r"\.(nvml[A-Z]\w*)\b", PROBE_TORCH.read_text()))
    assert "nvmlDeviceGetTotalEnergyConsumption" in used and "nvmlDeviceGetEnforcedPowerLimit" in used
    assert used <= set(NVML_FUNCTIONS)
    assert [name for name in NVML_FUNCTIONS if not callable(getattr(pynvml, name, None))] == []


def _fake_pynvml(**impl):
    """A stand-in for pynvml holding only functions the real module has (a misspelt name is absent here too)."""
    import pynvml as real

    fake = types.ModuleType("pynvml")
    for name, fn in impl.items():
        if hasattr(real, name):
            setattr(fake, name, fn)
    return fake


NVML_OK = {"nvmlInit": lambda: None, "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
           "nvmlDeviceGetTotalEnergyConsumption": lambda h: 123_456,        # mJ
           "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000}            # mW


def test_nvml_reads_energy_and_limit_through_the_real_names(monkeypatch):
    from fleetopt.optimizer.profiling.probe_torch import _Nvml

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(**NVML_OK))
    nvml = _Nvml(0)
    assert nvml.reason is None
    assert nvml.energy_j() == 123.456 and nvml.limit_w() == 700.0


def test_torch_backend_metadata_that_cannot_be_read_is_null_and_a_warning(monkeypatch):
    # No torch here: the describe() of a CUDA backend over a stand-in torch, with NVML's limit failing.
    import pynvml as real

    from fleetopt.optimizer.profiling.probe_torch import TorchBackend, _Nvml

    def refuse(handle):
        raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(**{**NVML_OK, "nvmlDeviceGetEnforcedPowerLimit": refuse}))
    props = types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, total_memory=150 * 2**30)
    backend = object.__new__(TorchBackend)
    backend.torch = types.SimpleNamespace(__version__="2.9", version=types.SimpleNamespace(cuda="12.8"),
                                          cuda=types.SimpleNamespace(get_device_properties=lambda d: props))
    backend.cuda, backend.device, backend.nvml = True, "cuda:0", _Nvml(0)
    info = backend.describe()
    assert info["device_name"] == "NVIDIA H200" and info["memory_gib"] == 150.0
    assert info["board_power_limit_w"] is None
    assert len(info["warnings"]) == 1 and info["warnings"][0].startswith("board_power_limit_w: cannot be read")


# --- files written as the run goes, and resumed -----------------------------------------------------------------

HW, MODEL = "H100-SXM-80GB", "Llama-3.1-8B"


class BrokenDevice(ClosedFormDevice):
    """Dies (an exception from the driver) when asked to build its ``fail_at``-th point; counts the points built."""

    def __init__(self, kv_tokens, fail_at=None):
        super().__init__(kv_tokens)
        self.fail_at, self.built = fail_at, 0

    def _build(self):
        if self.fail_at is not None and self.built + 1 == self.fail_at:
            raise RuntimeError("CUDA error: device lost")
        self.built += 1

    def decode(self, b, c):
        self._build()
        return super().decode(b, c)

    def prefill(self, p):
        self._build()
        return super().prefill(p)


def _probe(folder, device, resume=False, warn=None, **settings):
    s = ProbeSettings(HW, MODEL, max_context=8192, **settings)
    return measure(s, folder, lambda shape, dtype: device, shape=TINY, resume=resume, warn=warn,
                   clock=device.clock, sleep=device.sleep)


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("fail_at", [1, 6, 17])       # before any point, in decode, in prefill
def test_a_broken_run_keeps_its_points_and_resume_measures_only_the_rest(tmp_path, fail_at):
    full_dir, broken_dir = tmp_path / "full", tmp_path / "broken"
    full_dir.mkdir(), broken_dir.mkdir()
    grid = probe_grid(16_384, 8192)               # 14 decode and 5 prefill points
    total = len(grid.decode) + len(grid.prefill)
    assert total == 19
    _, paths = _probe(full_dir, BrokenDevice(16_384))
    with pytest.raises(RuntimeError, match="device lost"):
        _probe(broken_dir, BrokenDevice(16_384, fail_at=fail_at))
    files = probe_files(broken_dir, probe_stem(HW, MODEL))
    kept = len(_csv_rows(files[0])) + len(_csv_rows(files[1]))
    assert kept == fail_at - 1                    # every point measured before the failure is in the files
    meta = json.loads(files[2].read_text())
    assert meta["idle_power_w"] == pytest.approx(ClosedFormDevice.idle_w)
    again = BrokenDevice(16_384)
    _probe(broken_dir, again, resume=True)
    assert again.built == total - kept            # only the missing points were measured
    for ours, theirs in zip(files[:2], paths[:2]):
        a, b = _csv_rows(ours), _csv_rows(theirs)
        assert [{k: v for k, v in r.items() if not k.startswith(("iteration_s", "time_s", "power"))} for r in a] == \
               [{k: v for k, v in r.items() if not k.startswith(("iteration_s", "time_s", "power"))} for r in b]
        for r, s in zip(a, b):
            assert {k: float(v) for k, v in r.items() if k.endswith(("_median", "_min", "_w"))} == pytest.approx(
                {k: float(v) for k, v in s.items() if k.endswith(("_median", "_min", "_w"))}, rel=1e-7)
    assert {(int(r["batch"]), int(r["context_tokens"])) for r in _csv_rows(files[0])} == set(grid.decode)


def test_resume_refuses_files_of_other_settings_before_opening_the_device(tmp_path):
    with pytest.raises(RuntimeError):
        _probe(tmp_path, BrokenDevice(16_384, fail_at=4))
    opened = []

    def device(shape, dtype):
        opened.append(dtype)
        return BrokenDevice(16_384)

    s = ProbeSettings(HW, MODEL, max_context=8192, decode_repeats=3)
    with pytest.raises(InstanceError) as err:
        measure(s, tmp_path, device, shape=TINY, resume=True)
    assert str(err.value).count("\n") == 0 and "probe.decode_repeats: the files were measured with 15" in str(err.value)
    assert opened == []


def test_probe_cli_resume_with_another_dtype_is_one_line(tmp_path, catalog):
    shape = ModelShape.of(catalog.models[MODEL])      # the shape the command takes from the catalogue
    dev = BrokenDevice(16_384, fail_at=3)
    with pytest.raises(RuntimeError):
        measure(ProbeSettings(HW, MODEL), tmp_path, lambda s, d: dev, shape=shape, clock=dev.clock, sleep=dev.sleep)
    base = ["profile", "probe", "--hardware", HW, "--model", MODEL, "-o", str(tmp_path)]
    r = CliRunner().invoke(main, base + ["--resume", "--dtype", "fp16"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "dtype: the files were measured with 'bf16', this run asks for 'fp16'" in r.stderr
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 2 and "--resume" in r.stderr


class DescribeFails(ClosedFormDevice):
    def describe(self):
        raise AttributeError("module 'pynvml' has no attribute 'nvmlDeviceGetSomething'")


class LimitUnreadable(ClosedFormDevice):
    def describe(self):
        return {"device_name": "closed-form device", "memory_gib": 80.0, "board_power_limit_w": None,
                "warnings": ["board_power_limit_w: cannot be read (NVMLError_NotSupported: Not Supported)"]}


@pytest.mark.parametrize("device_class", [DescribeFails, LimitUnreadable])
def test_metadata_that_cannot_be_read_is_a_warning_and_the_run_is_complete(tmp_path, device_class):
    warnings = []
    dev = device_class(16_384)
    _, paths = _probe(tmp_path, dev, warn=warnings.append)
    assert len(warnings) == 1 and warnings[0].startswith("device metadata: ")
    assert len(_csv_rows(paths[0])) == 14 and len(_csv_rows(paths[1])) == 5
    meta = json.loads(paths[2].read_text())
    assert meta["warnings"] == warnings and meta["idle_power_w"] == pytest.approx(70.0)
    assert meta.get("board_power_limit_w", "absent") in (None, "absent")
    m = read_measurements([str(p) for p in paths])          # null: not read; the catalogue's limit stands in
    assert m.idle_w == pytest.approx(70.0) and len(m.decode) == 14


class EnergyFailsLater(ClosedFormDevice):
    reads_left = 12

    def energy_j(self):
        self.reads_left -= 1
        if self.reads_left < 0:
            raise OSError("NVML: GPU is lost")
        return super().energy_j()


def test_an_energy_counter_that_fails_mid_run_leaves_the_rest_without_power(tmp_path):
    warnings = []
    _, paths = _probe(tmp_path, EnergyFailsLater(16_384), warn=warnings.append)
    rows = _csv_rows(paths[0]) + _csv_rows(paths[1])
    assert len(rows) == 19 and len(warnings) == 1 and "GPU is lost" in warnings[0]
    powered = [r["power_w"] != "" for r in rows]
    # 3 reads for idle (check, start, end), then 3 per point: points 1-3 have power, the 4th fails at its end
    assert powered == [True] * 3 + [False] * 16


class CoolingDevice(ClosedFormDevice):
    """Draws ``hot_w`` until ``cool_s`` after its last work (weights drawn at start count as work), then
    ``idle_w``; logs what it is asked to do."""

    hot_w, cool_s = 125.0, 4.0

    def __init__(self, kv_tokens):
        super().__init__(kv_tokens)
        self.hot_until, self.log = self.t + self.cool_s, []

    def _work(self, dt, watts):
        run = super()._work(dt, watts)

        def hot_run():
            run()
            self.hot_until = self.t + self.cool_s
        return hot_run

    def decode(self, b, c):
        self.log.append("load")
        return super().decode(b, c)

    def sleep(self, s):
        self.log.append(("sleep", s))
        hot = min(s, max(0.0, self.hot_until - self.t))
        self.e += self.hot_w * hot + self.idle_w * (s - hot)
        self.t += s


@pytest.mark.parametrize("settle_s, idle_w", [(5.0, 70.0), (0.0, 125.0), (2.5, (1.5 * 125 + 1.5 * 70) / 3)])
def test_idle_power_is_read_first_after_the_settle_time(tmp_path, settle_s, idle_w):
    dev = CoolingDevice(16_384)
    _, paths = _probe(tmp_path, dev, idle_settle_s=settle_s)
    assert json.loads(paths[2].read_text())["idle_power_w"] == pytest.approx(idle_w, rel=1e-9)
    assert dev.log[:3] == [("sleep", settle_s), ("sleep", IDLE_WINDOW_S), "load"]


def test_settle_time_must_be_finite_and_not_negative():
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(InstanceError, match="--idle-settle-s"):
            ProbeSettings(HW, MODEL, idle_settle_s=bad)
