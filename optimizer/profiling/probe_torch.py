"""The probe's decoder on a CUDA GPU with PyTorch, board energy from NVML (the ``probe`` extra).

The method of the shipped measurements (``data/measurements/README.md``): the model's decoder layers with random
weights in bf16 (RMSNorm, fused QKV, attention by ``scaled_dot_product_attention`` over a contiguous KV cache,
output projection, SwiGLU MLP; final norm and LM head), the new token's K/V written into the cache each
iteration, one CUDA graph per decode point; prefill runs the same layers over the whole prompt with causal
attention. The arithmetic is that of :func:`fleetopt.optimizer.profiling.probe.numpy_forward` (the tests compare the
two on the CPU where PyTorch is installed). Importing this module needs PyTorch; :func:`open_backend` says in one
line what is missing.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.profiling.probe import ModelShape, _reason, decoder_shapes

__all__ = ["KV_RESERVE_FRACTION", "NVML_FUNCTIONS", "TorchBackend", "open_backend"]

KV_RESERVE_FRACTION = 0.1
"""Share of the device memory left free after the weights and the KV cache (activations, CUDA graphs, the
allocator's slack); the KV budget is the rest."""


def _torch():
    try:
        import torch  # pyright: ignore[reportMissingImports]  # the optional probe extra, absent where CI type-checks
    except ImportError:
        raise InstanceError("profile probe: PyTorch is not installed; install the probe extra "
                            "(pip install 'fleetopt[probe]') on the machine with the GPU") from None
    return torch


NVML_FUNCTIONS = ("nvmlInit", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetTotalEnergyConsumption",
                  "nvmlDeviceGetEnforcedPowerLimit")
"""Every ``pynvml`` function the probe calls (``nvidia-ml-py``); the tests check each exists in the real module."""


class _Nvml:
    """The board's energy counter and power limit through NVML (``nvidia-ml-py``), or nothing: ``reason`` then
    says why (NVML not installed, or not usable here)."""

    def __init__(self, index: int):
        self.handle, self.reason = None, None
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py (pynvml) is not installed"
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nvml = pynvml
        except Exception as err:       # NVML present but not usable (a container without the driver's library)
            self.handle, self.reason = None, f"NVML is not usable ({_reason(err)})"

    def energy_j(self) -> float | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3    # mJ -> J

    def limit_w(self) -> float | None:
        if self.handle is None:
            return None
        return self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3   # mW -> W


class TorchBackend:
    """:class:`fleetopt.optimizer.profiling.probe.ProbeBackend` on ``device`` (``"cuda"``; ``"cpu"`` runs the same
    arithmetic without CUDA graphs or energy, for checks against the numpy reference)."""

    def __init__(self, shape: ModelShape, dtype: str = "bf16", device: str = "cuda", seed: int = 0,
                 weights: dict | None = None):
        torch = _torch()
        self.torch, self.shape, self.device = torch, shape, torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        self.seed = seed
        if weights is None:        # drawn on the device: an 8B model's weights would not fit the host as float32
            gen = torch.Generator(device=self.device).manual_seed(seed)

            def drawn(dims):
                if len(dims) == 1:
                    return torch.ones(dims, device=self.device, dtype=self.dtype)
                return torch.randn(dims, generator=gen, device=self.device, dtype=self.dtype) / math.sqrt(dims[0])
            put, host = drawn, decoder_shapes(shape)
        else:
            def given(a: np.ndarray):
                return torch.from_numpy(np.ascontiguousarray(a)).to(self.device, self.dtype)
            put, host = given, weights
        self.layers = [{k: put(v) for k, v in w.items()} for w in host["layers"]]
        self.norm, self.lm_head = put(host["norm"]), put(host["lm_head"])
        del host
        self.nvml = _Nvml(self.device.index or 0) if self.cuda else None
        self._built = None

    # ---- the decoder -------------------------------------------------------------------------

    def forward(self, x, caches: list, pos: int):
        """:func:`fleetopt.optimizer.profiling.probe.numpy_forward` in torch: ``x`` (B, T, d), caches of (B, H_kv, Tmax,
        dh); returns the last token's logits."""
        F = self.torch.nn.functional
        s = self.shape
        h, kv, dh = s.heads, s.kv_heads, s.head_dim
        B, T, d = x.shape
        for w, (K, V) in zip(self.layers, caches):
            a = F.rms_norm(x, (d,), w["norm1"], 1e-5) @ w["qkv"]
            q = a[..., :h * dh].reshape(B, T, h, dh).transpose(1, 2)
            K[:, :, pos:pos + T] = a[..., h * dh:(h + kv) * dh].reshape(B, T, kv, dh).transpose(1, 2)
            V[:, :, pos:pos + T] = a[..., (h + kv) * dh:].reshape(B, T, kv, dh).transpose(1, 2)
            att = F.scaled_dot_product_attention(q, K[:, :, :pos + T], V[:, :, :pos + T], is_causal=T > 1,
                                                 enable_gqa=h != kv)
            x = x + att.transpose(1, 2).reshape(B, T, h * dh) @ w["o"]
            gu = F.rms_norm(x, (d,), w["norm2"], 1e-5) @ w["gate_up"]
            x = x + (F.silu(gu[..., :s.ffn]) * gu[..., s.ffn:]) @ w["down"]
        return F.rms_norm(x[:, -1], (d,), self.norm, 1e-5) @ self.lm_head

    def _caches(self, batch: int, tokens: int) -> list:
        s, torch = self.shape, self.torch
        gen = torch.Generator(device=self.device).manual_seed(self.seed + 1)
        return [tuple(torch.randn(batch, s.kv_heads, tokens, s.head_dim, generator=gen, device=self.device,
                                  dtype=self.dtype) for _ in range(2)) for _ in range(s.layers)]

    # ---- ProbeBackend ------------------------------------------------------------------------

    def describe(self) -> dict:
        """The device, its memory and board limit and the software versions. A field that cannot be read is None
        and a line in ``warnings`` says why: metadata never stops a probe."""
        torch = self.torch
        out, warnings = {"torch": torch.__version__}, []

        def read(key: str, get) -> None:
            try:
                out[key] = get()
            except Exception as err:        # a driver call or attribute that fails: the run goes on
                out[key] = None
                warnings.append(f"{key}: cannot be read ({_reason(err)})")

        if self.cuda:
            assert self.nvml is not None            # opened for every CUDA device (__init__)
            read("device_name", lambda: torch.cuda.get_device_properties(self.device).name)
            read("multiprocessors", lambda: torch.cuda.get_device_properties(self.device).multi_processor_count)
            read("memory_gib", lambda: round(torch.cuda.get_device_properties(self.device).total_memory / 2**30, 2))
            read("board_power_limit_w", self.nvml.limit_w)
            read("cuda", lambda: torch.version.cuda)
            if self.nvml.reason is not None:
                warnings.append(f"board energy counter: {self.nvml.reason}; no power is measured")
        else:
            out["device_name"] = "cpu (torch)"
        if warnings:
            out["warnings"] = warnings
        return out

    def kv_tokens(self) -> int:
        if not self.cuda:
            raise InstanceError("profile probe: the KV budget is a GPU's; the CPU backend takes it from the caller")
        free, total = self.torch.cuda.mem_get_info(self.device)
        per_token = self.shape.kv_bytes_per_token(self.torch.finfo(self.dtype).bits // 8)
        return max(0, int(math.floor((free - KV_RESERVE_FRACTION * total) / per_token)))

    def decode(self, batch: int, context_tokens: int) -> Callable[[], None]:
        torch = self.torch
        caches = self._caches(batch, context_tokens + 1)
        gen = torch.Generator(device=self.device).manual_seed(self.seed + 2)
        x = torch.randn(batch, 1, self.shape.hidden, generator=gen, device=self.device, dtype=self.dtype)
        with torch.inference_mode():
            if not self.cuda:
                self._built = (caches, x)
                return lambda: self._run(x, caches, context_tokens)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):          # warm-up outside the graph (allocations, kernel choice)
                for _ in range(2):
                    self.forward(x, caches, context_tokens)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.forward(x, caches, context_tokens)
        self._built = (caches, x, graph, out)
        return graph.replay

    def _run(self, x, caches, pos: int) -> None:
        with self.torch.inference_mode():
            self.forward(x, caches, pos)

    def prefill(self, prompt_tokens: int) -> Callable[[], None]:
        torch = self.torch
        caches = self._caches(1, prompt_tokens)
        gen = torch.Generator(device=self.device).manual_seed(self.seed + 3)
        x = torch.randn(1, prompt_tokens, self.shape.hidden, generator=gen, device=self.device, dtype=self.dtype)
        self._built = (caches, x)
        return lambda: self._run(x, caches, 0)

    def synchronize(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def energy_j(self) -> float | None:
        return None if self.nvml is None else self.nvml.energy_j()

    def release(self) -> None:
        self._built = None
        if self.cuda:
            self.torch.cuda.empty_cache()


def open_backend(shape: ModelShape, dtype: str = "bf16", seed: int = 0) -> TorchBackend:
    """The GPU backend, or one :class:`~fleetopt.optimizer.errors.InstanceError` line saying what is missing
    (PyTorch, a CUDA GPU, memory for the weights)."""
    torch = _torch()
    if not torch.cuda.is_available():
        raise InstanceError("profile probe: no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is "
                            "False); the probe measures a GPU")
    free, _ = torch.cuda.mem_get_info()
    need = shape.params * 2
    if need > free:
        raise InstanceError(f"profile probe: the model's weights ({need / 1e9:.1f} GB) do not fit in the GPU's "
                            f"free memory ({free / 1e9:.1f} GB)")
    return TorchBackend(shape, dtype, "cuda", seed)
