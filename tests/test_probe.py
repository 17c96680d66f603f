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

import numpy as np
import pytest
from click.testing import CliRunner

from fleetopt.optimizer.cli import main
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.measurements import fit_measurements, read_measurements
from fleetopt.optimizer.io.probe import (DECODE_REPEATS, POWER_WINDOW_S, ModelShape, NumpyBackend, ProbeGrid,
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

    from fleetopt.optimizer.io.probe_torch import TorchBackend

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
