r"""Measuring a GPU the way the shipped figures were measured (``fleetopt profile probe``).

The shipped measurements (``data/measurements/``, its README) time a model-shaped decoder with random weights:
one decode iteration of ``batch`` sequences that all sit at ``context_tokens`` cached tokens, a whole-prompt
prefill of one sequence, and the board's mean power from its energy counter. This module is the harness around
a *backend* that runs such a decoder (:class:`ProbeBackend`): the grid of points (:func:`probe_grid`), the timing
and power protocol (:func:`run_probe`) and the files that ``fleetopt profile fit`` reads
(:func:`write_probe_files`, the layout of :mod:`fleetopt.optimizer.profiling.measurements`). Backends:

* :class:`fleetopt.optimizer.profiling.probe_torch.TorchBackend` (the ``probe`` extra: PyTorch and a CUDA GPU, energy
  from NVML): what ``fleetopt profile probe`` runs;
* :class:`NumpyBackend`: the same decoder in numpy on the CPU, without power. It is the reference the torch
  backend's arithmetic is checked against, and lets the harness run end to end where there is no GPU (tests).

Grid (:func:`probe_grid`)
-------------------------
Contexts :math:`C \in` :data:`PROBE_CONTEXTS` up to the model's window; at each, the batches
:math:`1, 2, 4, \dots` while :math:`b\,C \le K` and the full-occupancy batch :math:`\lfloor K / C \rfloor`,
:math:`K` the KV tokens that fit on the device next to the weights. Prefill: one sequence of each prompt length
in :data:`PROBE_PROMPTS` up to the window and :math:`K`. With :math:`K = 393{,}216` this is exactly the shipped
H100 grid (49 decode and 7 prefill points).

Protocol (:func:`run_probe`)
----------------------------
Per point the backend builds the work once (a decode step over freshly allocated KV caches, captured as one
CUDA graph by the torch backend; a prefill over a random prompt), then:

1. *time*: :data:`WARMUP_REPLAYS` replays, then ``repeats`` timed replays (:data:`DECODE_REPEATS` decode,
   :data:`PREFILL_REPEATS` prefill), each from the clock before it is launched to the device's synchronisation
   after it; the file gets their median and minimum;
2. *power* (where the backend reads an energy counter): :math:`\lceil 0.7\,s / t_{med} \rceil` replays of
   warm-up, then :math:`m = \lceil 2.5\,s / t_{med} \rceil` back-to-back replays; the board's mean power is
   :math:`(E_1 - E_0) / (t_1 - t_0)` over them (:data:`POWER_WARMUP_S`, :data:`POWER_WINDOW_S`).

Idle power comes first, before any point loads the device: :data:`IDLE_SETTLE_S` of quiet (the board's clocks
and power fall back after the weights are drawn on it), then the energy counter over :data:`IDLE_WINDOW_S` with
nothing running. The meta file records the device, its memory and board limit, the idle power, the model's shape,
the software versions and the run's settings (``probe``: repeats, power, the KV budget and window of its grid).
Device metadata that cannot be read is null in the meta file and a warning, never the end of a run.

Files (:func:`measure`)
-----------------------
The meta file and the two CSVs' headers are written once the idle power is read, and each CSV is rewritten
(atomically) after every point, so a run that breaks keeps every point measured before it. Run again with
``resume=True`` (``--resume``) and the same settings: the grid is the one recorded in the meta file and only the
points missing from the CSVs are measured.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from fleetopt.models.hardware import ModelSpec

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.profiling.measurements import DECODE_COLUMNS, DECODE_OPTIONAL, PREFILL_COLUMNS, PREFILL_OPTIONAL
from fleetopt.optimizer.output.writes import write_text

__all__ = ["PROBE_CONTEXTS", "PROBE_PROMPTS", "DECODE_REPEATS", "PREFILL_REPEATS", "WARMUP_REPLAYS",
           "POWER_WARMUP_S", "POWER_WINDOW_S", "IDLE_WINDOW_S", "IDLE_SETTLE_S", "DTYPE_BYTES", "ModelShape",
           "ProbeGrid",
           "ProbeSettings", "DecodeRecord", "PrefillRecord", "ProbeResult", "ProbeBackend", "NumpyBackend",
           "probe_grid", "run_probe", "measure", "probe_stem", "probe_files", "write_probe_files", "decoder_shapes",
           "decoder_weights", "numpy_attention", "numpy_forward"]

PROBE_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""Decode contexts (tokens cached per sequence), as in the shipped files."""
PROBE_PROMPTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Prefill prompt lengths, as in the shipped files."""
DECODE_REPEATS = 15
"""Timed replays per decode point (median and minimum in the file)."""
PREFILL_REPEATS = 5
"""Timed runs per prefill point."""
WARMUP_REPLAYS = 3
"""Untimed replays before a point's timed ones."""
POWER_WARMUP_S = 0.7
"""Back-to-back work before a power window opens (s)."""
POWER_WINDOW_S = 2.5
"""Length of a power window (s): the energy counter is read at its two ends."""
IDLE_WINDOW_S = 3.0
"""Idle power window (s)."""
IDLE_SETTLE_S = 5.0
"""Quiet time before the idle window opens (s; ``--idle-settle-s``)."""
DTYPE_BYTES = {"bf16": 2, "fp16": 2}
"""Dtypes the probe runs its decoder in, and their bytes per element."""


@dataclass(frozen=True)
class ModelShape:
    """The decoder a probe runs: the layers, final norm and LM head of a dense model (no embedding table: the
    inputs are random hidden states, as in the shipped measurements)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    def __post_init__(self) -> None:
        for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"model shape: {k} must be a whole number >= 1; got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model shape: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @classmethod
    def of(cls, model: ModelSpec) -> ModelShape:
        """The shape of a catalogue model (its ``config.json`` figures)."""
        return cls(model.layers, model.hidden_size, model.attention_heads, model.kv_heads, model.head_dim,
                   model.intermediate_size, model.vocab_size)

    @property
    def params(self) -> int:
        """Weights of the probe's decoder:
        :math:`\\ell\\,(d (h + 2 h_{kv}) d_h + h d_h d + 3 d f + 2 d) + d + V d` (fused QKV, output projection,
        SwiGLU gate, up and down, two RMSNorms per layer; the final norm and the LM head)."""
        d, dh = self.hidden, self.head_dim
        per_layer = d * (self.heads + 2 * self.kv_heads) * dh + self.heads * dh * d + 3 * d * self.ffn + 2 * d
        return self.layers * per_layer + d + self.vocab * d

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of every layer: :math:`2 \\ell h_{kv} d_h s`."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def to_json(self) -> dict:
        return {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "ffn": self.ffn, "vocab": self.vocab}


@dataclass(frozen=True)
class ProbeGrid:
    """The points of a probe: ``decode`` as ``(batch, context_tokens)`` pairs, ``prefill`` as prompt lengths."""

    decode: tuple[tuple[int, int], ...]
    prefill: tuple[int, ...]
    kv_tokens: int | None = None
    """The KV budget the grid was drawn for (None: a grid given by hand)."""
    window_tokens: int | None = None
    """The largest context and prompt allowed (None: a grid given by hand)."""


def probe_grid(kv_tokens: int, max_context: int, contexts: Sequence[int] = PROBE_CONTEXTS,
               prompts: Sequence[int] = PROBE_PROMPTS) -> ProbeGrid:
    """The probe's points for a device that holds ``kv_tokens`` KV tokens (module docstring, "Grid").

    Examples
    --------
    >>> g = probe_grid(393_216, 131_072)
    >>> len(g.decode), g.decode[:3], g.decode[9], g.decode[-1], g.prefill[-1]
    (49, ((1, 1024), (2, 1024), (4, 1024)), (384, 1024), (6, 65536), 32768)
    """
    if kv_tokens < 1:
        raise ValueError(f"kv_tokens must be >= 1; got {kv_tokens}")
    decode = []
    for c in sorted(contexts):
        if c > max_context or c > kv_tokens:
            continue
        b = 1
        while b * c <= kv_tokens:
            decode.append((b, c))
            b *= 2
        full = kv_tokens // c
        if full != b // 2:
            decode.append((full, c))
    prefill = tuple(p for p in sorted(prompts) if p <= min(max_context, kv_tokens))
    return ProbeGrid(tuple(decode), prefill, int(kv_tokens), int(max_context))


@dataclass(frozen=True)
class ProbeSettings:
    """What a probe measures and how (one record; the CLI's options)."""

    hardware: str
    """Catalogue name of the GPU measured (the files' ``hardware`` column)."""
    model: str
    """Catalogue name of the model whose shape the decoder takes."""
    dtype: str = "bf16"
    tp: int = 1
    decode_repeats: int = DECODE_REPEATS
    prefill_repeats: int = PREFILL_REPEATS
    power: bool = True
    """Read the energy counter (where the backend has one)."""
    max_context: int | None = None
    """Largest decode context and prompt (default: the model's window)."""
    idle_settle_s: float = IDLE_SETTLE_S
    """Quiet time before the idle power window (s)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise InstanceError(f"--dtype: {self.dtype!r} is not one the probe runs; choose {', '.join(DTYPE_BYTES)}")
        if self.tp != 1:
            raise InstanceError(f"--tp: {self.tp}: the probe measures one GPU (tp 1); a TP > 1 replica needs "
                                "its collectives measured on its own GPUs")
        for k in ("decode_repeats", "prefill_repeats"):
            if getattr(self, k) < 1:
                raise InstanceError(f"--{k.replace('_', '-')}: must be >= 1; got {getattr(self, k)}")
        if not (math.isfinite(self.idle_settle_s) and self.idle_settle_s >= 0):
            raise InstanceError(f"--idle-settle-s: must be a finite number >= 0; got {self.idle_settle_s}")


@dataclass(frozen=True)
class DecodeRecord:
    batch: int
    context_tokens: int
    median_s: float
    min_s: float
    power_w: float | None


@dataclass(frozen=True)
class PrefillRecord:
    prompt_tokens: int
    median_s: float
    min_s: float
    power_w: float | None


@dataclass(frozen=True)
class ProbeResult:
    settings: ProbeSettings
    decode: tuple[DecodeRecord, ...]
    prefill: tuple[PrefillRecord, ...]
    meta: dict = field(default_factory=dict)


class ProbeBackend(Protocol):
    """What :func:`run_probe` needs of a device running the decoder."""

    def describe(self) -> dict:
        """``device_name``, ``memory_gib``, ``board_power_limit_w`` (None if unknown) and software versions;
        ``warnings``, where present, lists what could not be read."""
        ...

    def kv_tokens(self) -> int:
        """KV tokens that fit on the device now, next to the weights and a working reserve."""
        ...

    def decode(self, batch: int, context_tokens: int) -> Callable[[], None]:
        """Build one decode iteration (caches allocated) and return a function that replays it."""
        ...

    def prefill(self, prompt_tokens: int) -> Callable[[], None]:
        """Build one whole-prompt prefill and return a function that runs it."""
        ...

    def synchronize(self) -> None:
        """Wait until the device has finished the work launched so far."""

    def energy_j(self) -> float | None:
        """The board's cumulative energy counter (J), or None without one."""

    def release(self) -> None:
        """Free what the last point built."""


def _timed(run: Callable[[], None], sync: Callable[[], None], repeats: int, clock) -> tuple[float, float]:
    """Median and minimum of ``repeats`` replays, each timed from launch to synchronisation (after warm-up)."""
    for _ in range(WARMUP_REPLAYS):
        run()
    sync()
    times = []
    for _ in range(repeats):
        t0 = clock()
        run()
        sync()
        times.append(clock() - t0)
    return statistics.median(times), min(times)


def _reason(err: BaseException) -> str:
    """``Type: message`` of an exception, even one whose message cannot be formatted."""
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:
        return type(err).__name__


class _Energy:
    """The backend's energy counter for one run: a read that fails is a warning, and no power is read after it
    (the run goes on without power rather than ending)."""

    def __init__(self, backend: ProbeBackend, enabled: bool, warn: Callable[[str], None]):
        self.backend, self.enabled, self.warn = backend, enabled, warn

    def read_j(self) -> float | None:
        if not self.enabled:
            return None
        try:
            value = self.backend.energy_j()
        except Exception as err:       # a driver call that fails: the points go on, without power
            self.warn(f"board energy counter: cannot be read ({_reason(err)}); no power is measured "
                      "from here on")
            value = None
        self.enabled = value is not None
        return value


def _power_w(run: Callable[[], None], backend: ProbeBackend, energy: _Energy, median_s: float,
             clock) -> float | None:
    """Mean board power over back-to-back replays (module docstring, "Protocol" 2), None without a counter."""
    if energy.read_j() is None:
        return None
    for _ in range(max(1, math.ceil(POWER_WARMUP_S / median_s))):
        run()
    backend.synchronize()
    e0, t0 = energy.read_j(), clock()
    for _ in range(max(1, math.ceil(POWER_WINDOW_S / median_s))):
        run()
    backend.synchronize()
    e1, t1 = energy.read_j(), clock()
    return (e1 - e0) / (t1 - t0) if e0 is not None and e1 is not None and t1 > t0 else None


def _describe(backend: ProbeBackend, warn: Callable[[str], None]) -> dict:
    """``backend.describe()`` with its ``warnings`` said through ``warn``; a describe that fails is a warning and
    no fields."""
    try:
        info = dict(backend.describe())
    except Exception as err:           # metadata never ends a run
        warn(f"device metadata: cannot be read ({_reason(err)}); the meta file lacks it")
        return {}
    for line in info.get("warnings") or ():
        warn(f"device metadata: {line}; null in the meta file")
    return info


def _idle_w(backend: ProbeBackend, energy: _Energy, settle_s: float, clock, sleep) -> float | None:
    """Board power with nothing running, after ``settle_s`` of quiet (module docstring, "Protocol")."""
    if energy.read_j() is None:
        return None
    backend.synchronize()
    sleep(settle_s)
    e0, t0 = energy.read_j(), clock()
    sleep(IDLE_WINDOW_S)
    e1, t1 = energy.read_j(), clock()
    return (e1 - e0) / (t1 - t0) if e0 is not None and e1 is not None and t1 > t0 else None


def probe_meta(backend: ProbeBackend, settings: ProbeSettings, grid: ProbeGrid, shape: ModelShape, *,
               clock=time.perf_counter, sleep=time.sleep, warn: Callable[[str], None] | None = None) -> dict:
    """The meta file of a new run: the device (``backend.describe()``), the idle power (measured here, first,
    after ``settings.idle_settle_s`` of quiet), the model and the run's settings (``probe``, what a resumed run
    must match). Fields that cannot be read are null and each a ``warn(line)``."""
    lines: list[str] = []

    def note(line: str) -> None:
        lines.append(line)
        if warn is not None:
            warn(line)

    info = _describe(backend, note)
    info.pop("warnings", None)
    energy = _Energy(backend, settings.power, note)
    idle = _idle_w(backend, energy, settings.idle_settle_s, clock, sleep) if settings.power else None
    dtype_bytes = DTYPE_BYTES[settings.dtype]
    meta = {"hardware": settings.hardware, **info, "weights_gb": round(shape.params * dtype_bytes / 1e9, 4),
            "model": settings.model, "model_shape": shape.to_json(), "dtype": settings.dtype, "tp": settings.tp,
            "measured_on": datetime.date.today().isoformat(),
            "method": "fleetopt profile probe: model-shaped decoder with random weights (data/measurements/README.md)",
            "probe": {"decode_repeats": settings.decode_repeats, "prefill_repeats": settings.prefill_repeats,
                      "power": settings.power, "idle_settle_s": settings.idle_settle_s,
                      "kv_tokens": grid.kv_tokens, "window_tokens": grid.window_tokens}}
    if idle is not None:
        meta["idle_power_w"] = idle
    if lines:
        meta["warnings"] = lines
    return meta


def run_probe(backend: ProbeBackend, settings: ProbeSettings, grid: ProbeGrid, shape: ModelShape,
              progress: Callable[[str], None] | None = None, clock=time.perf_counter, sleep=time.sleep, *,
              warn: Callable[[str], None] | None = None, meta: dict | None = None,
              done: tuple[Sequence[DecodeRecord], Sequence[PrefillRecord]] = ((), ()),
              on_update: Callable[[ProbeResult], None] | None = None) -> ProbeResult:
    """Measure the points of ``grid`` on ``backend`` (module docstring, "Protocol"); ``progress(message)`` after
    each point.

    A new run starts with :func:`probe_meta` (the idle power, before any point); a resumed one passes the
    ``meta`` of its files and the records already measured (``done``: decode, prefill), which are kept and not
    measured again. ``on_update(result so far)`` is called once the meta is ready and after every point (the
    files are written there). ``warn(line)``: what could not be read (the run goes on without it).
    """
    step = progress if progress is not None else (lambda message: None)
    if meta is None:
        meta = probe_meta(backend, settings, grid, shape, clock=clock, sleep=sleep, warn=warn)

    def say(line: str) -> None:          # kept in the meta file too
        meta.setdefault("warnings", []).append(line)
        if warn is not None:
            warn(line)

    energy = _Energy(backend, settings.power, say)
    have_decode = {(r.batch, r.context_tokens): r for r in done[0]}
    have_prefill = {r.prompt_tokens: r for r in done[1]}
    total = len(grid.decode) + len(grid.prefill)
    decode, prefill = [], []

    def update() -> None:
        if on_update is not None:
            on_update(ProbeResult(settings, tuple(decode), tuple(prefill), meta))

    if have_decode or have_prefill:
        step(f"probe: resuming; {len(have_decode) + len(have_prefill)} of {total} points are in the files")
    update()
    for k, (b, c) in enumerate(grid.decode, start=1):
        if (b, c) in have_decode:
            decode.append(have_decode[(b, c)])
            continue
        run = backend.decode(b, c)
        med, low = _timed(run, backend.synchronize, settings.decode_repeats, clock)
        pw = _power_w(run, backend, energy, med, clock)
        backend.release()
        decode.append(DecodeRecord(b, c, med, low, pw))
        update()
        step(f"probe {k}/{total}: decode batch {b} at {c:,} tokens: {med * 1e3:.4f} ms"
             + ("" if pw is None else f", {pw:.1f} W"))
    for k, p in enumerate(grid.prefill, start=len(grid.decode) + 1):
        if p in have_prefill:
            prefill.append(have_prefill[p])
            continue
        run = backend.prefill(p)
        med, low = _timed(run, backend.synchronize, settings.prefill_repeats, clock)
        pw = _power_w(run, backend, energy, med, clock)
        backend.release()
        prefill.append(PrefillRecord(p, med, low, pw))
        update()
        step(f"probe {k}/{total}: prefill of {p:,} tokens: {med * 1e3:.3f} ms"
             + ("" if pw is None else f", {pw:.1f} W"))
    return ProbeResult(settings, tuple(decode), tuple(prefill), meta)


def probe_stem(hardware: str, model: str) -> str:
    """File name stem of a probe's files: ``h100-sxm-80gb_llama-3.1-8b``.

    >>> probe_stem("H100-SXM-80GB", "Llama-3.1-8B")
    'h100-sxm-80gb_llama-3.1-8b'
    """
    def clean(s: str) -> str:
        return "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in s.strip().lower())

    return f"{clean(hardware)}_{clean(model)}"


def probe_files(folder: str | Path, stem: str) -> tuple[Path, Path, Path]:
    """The decode CSV, prefill CSV and meta JSON a probe writes into ``folder``."""
    base = Path(folder)
    return base / f"{stem}_decode.csv", base / f"{stem}_prefill.csv", base / f"{stem}_meta.json"


def _cell(x: float | None, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def _decode_csv(result: ProbeResult) -> str:
    s = result.settings
    ident = f"{s.hardware},{s.model},{s.dtype},{s.tp}"
    lines = [",".join(DECODE_COLUMNS + DECODE_OPTIONAL)]
    lines += [f"{ident},{r.batch},{r.context_tokens},{_cell(r.median_s, 8)},{_cell(r.min_s, 8)},{_cell(r.power_w, 5)}"
              for r in result.decode]
    return "\n".join(lines) + "\n"


def _prefill_csv(result: ProbeResult) -> str:
    s = result.settings
    ident = f"{s.hardware},{s.model},{s.dtype},{s.tp}"
    lines = [",".join(PREFILL_COLUMNS + PREFILL_OPTIONAL)]
    lines += [f"{ident},{r.prompt_tokens},{_cell(r.median_s, 8)},{_cell(r.min_s, 8)},{_cell(r.power_w, 5)}"
              for r in result.prefill]
    return "\n".join(lines) + "\n"


def _write(result: ProbeResult, paths: tuple[Path, Path, Path]) -> None:
    """The three files of ``result`` as it stands, each replaced atomically."""
    write_text(_decode_csv(result), paths[0], "-o")
    write_text(_prefill_csv(result), paths[1], "-o")
    write_text(json.dumps(result.meta, indent=1) + "\n", paths[2], "-o")


def _refuse_taken(paths: tuple[Path, Path, Path], folder: str | Path) -> None:
    if not Path(folder).is_dir():
        raise InstanceError(f"-o: {folder}: folder does not exist")
    taken = [p for p in paths if p.exists()]
    if taken:
        raise InstanceError(f"-o: {taken[0]}: exists; the probe does not overwrite files (choose another folder, "
                            "or give --resume to finish a broken run of the same settings)")


def write_probe_files(result: ProbeResult, folder: str | Path, stem: str | None = None) -> tuple[Path, Path, Path]:
    """Write the probe's files in the layout ``fleetopt profile fit`` reads (each atomically); refuses to
    overwrite a file that exists (one line naming it)."""
    s = result.settings
    paths = probe_files(folder, stem or probe_stem(s.hardware, s.model))
    _refuse_taken(paths, folder)
    _write(result, paths)
    return paths


def _previous_meta(path: Path, settings: ProbeSettings, shape: ModelShape, window: int) -> dict:
    """The meta file of a run to resume, checked against this run's settings (one line per difference)."""
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InstanceError(f"--resume: {path}: not a probe's meta file ({err})") from None
    run = meta.get("probe") if isinstance(meta, dict) else None
    if not isinstance(run, dict) or not all(isinstance(run.get(k), int) and not isinstance(run.get(k), bool)
                                            and run[k] >= 1 for k in ("kv_tokens", "window_tokens")):
        raise InstanceError(f"--resume: {path}: probe: missing or incomplete (kv_tokens, window_tokens); not a "
                            "file this probe wrote; choose another folder")
    want = {"hardware": settings.hardware, "model": settings.model, "dtype": settings.dtype, "tp": settings.tp,
            "model_shape": shape.to_json()}
    got = {k: meta.get(k) for k in want}
    want.update({"probe.decode_repeats": settings.decode_repeats, "probe.prefill_repeats": settings.prefill_repeats,
                 "probe.power": settings.power, "probe.window_tokens": window})
    got.update({f"probe.{k}": run.get(k) for k in ("decode_repeats", "prefill_repeats", "power", "window_tokens")})
    problems = [f"--resume: {path}: {k}: the files were measured with {got[k]!r}, this run asks for {want[k]!r}; "
                "resume with the same settings or choose another folder" for k in want if got[k] != want[k]]
    if problems:
        raise InstanceError(problems)
    return meta


def _previous_points(path: Path, kind: str, settings: ProbeSettings, grid: ProbeGrid) -> list:
    """The records in a run's CSV (none where it is missing), each checked to be a point of ``grid``."""
    if not path.exists():
        return []
    header = list(DECODE_COLUMNS + DECODE_OPTIONAL) if kind == "decode" else list(PREFILL_COLUMNS + PREFILL_OPTIONAL)
    ident = [settings.hardware, settings.model, settings.dtype, str(settings.tp)]
    points = set(grid.decode) if kind == "decode" else set(grid.prefill)
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != header:
        raise InstanceError(f"--resume: {path}: row 1: the header is not the probe's ({','.join(header)})")
    records = []
    for row, cells in enumerate(rows[1:], start=2):
        try:
            if len(cells) != len(header) or cells[:4] != ident:
                raise ValueError("not a point of this run")
            key = (int(cells[4]), int(cells[5])) if kind == "decode" else int(cells[4])
            times = [float(x) for x in cells[-3:-1]]
            power = float(cells[-1]) if cells[-1] else None
            if key not in points:
                raise ValueError(f"{key} is not a point of the recorded grid")
            if not all(math.isfinite(t) and t > 0 for t in times):
                raise ValueError("times must be numbers > 0")
        except ValueError as err:
            raise InstanceError(f"--resume: {path}: row {row}: {err}") from None
        median_s, min_s = times
        if isinstance(key, tuple):                  # a decode point: (batch, context_tokens)
            records.append(DecodeRecord(key[0], key[1], median_s, min_s, power))
        else:
            records.append(PrefillRecord(key, median_s, min_s, power))
    return records


def measure(settings: ProbeSettings, folder: str | Path, open_backend: Callable[[ModelShape, str], ProbeBackend], *,
            shape: ModelShape | None = None, on_step: Callable[[str], None] | None = None,
            warn: Callable[[str], None] | None = None, resume: bool = False, clock=time.perf_counter,
            sleep=time.sleep) -> tuple[ProbeResult, tuple[Path, Path, Path]]:
    """``fleetopt profile probe``: check the request, measure, write the files; returns the result and the paths.

    ``settings.hardware`` and ``settings.model`` must be catalogue names (aliases allowed; the files carry the
    canonical ones); the model must be dense. The output folder and file names are checked *before* the backend
    is opened (a probe takes minutes). ``open_backend(shape, dtype)`` gives the device
    (:func:`fleetopt.optimizer.profiling.probe_torch.open_backend` for the GPU, which says in one line what is missing);
    ``shape`` defaults to the catalogue model's. The files are written as the run goes (module docstring,
    "Files"); ``resume``: files that exist are a run to finish (same settings, else one line per difference),
    not a refusal. ``warn(line)``: metadata that could not be read.
    """
    from dataclasses import replace

    from fleetopt.optimizer.io.catalog import load_catalog

    catalog = load_catalog()
    problems = []
    try:
        hw = catalog.find("hardware", settings.hardware).name
    except KeyError as err:
        problems.append(f"--hardware: {err.args[0]}")
        hw = settings.hardware
    try:
        model = catalog.find("models", settings.model)
    except KeyError as err:
        problems.append(f"--model: {err.args[0]}")
        model = None
    if model is not None and model.is_moe:
        problems.append(f"--model: {model.name} is a mixture of experts; the probe's decoder is dense")
    if problems:
        raise InstanceError(problems)
    assert model is not None                        # an unknown model raised above
    settings = replace(settings, hardware=hw, model=model.name)
    paths = probe_files(folder, probe_stem(hw, model.name))
    shape = shape if shape is not None else ModelShape.of(model)
    window = settings.max_context or model.max_position_embeddings
    previous = None
    if resume and Path(folder).is_dir() and any(p.exists() for p in paths):
        if not paths[2].exists():
            raise InstanceError(f"--resume: {paths[2]}: missing; without the meta file of the broken run the "
                                "probe cannot resume it (choose another folder)")
        previous = _previous_meta(paths[2], settings, shape, window)
    else:
        _refuse_taken(paths, folder)
    backend = open_backend(shape, settings.dtype)
    if previous is None:
        grid = probe_grid(backend.kv_tokens(), window)
        done: tuple = ((), ())
    else:
        grid = probe_grid(previous["probe"]["kv_tokens"], window)
        done = (_previous_points(paths[0], "decode", settings, grid),
                _previous_points(paths[1], "prefill", settings, grid))
        was, now = previous.get("device_name"), _describe(backend, lambda line: None).get("device_name")
        if was is not None and now is not None and was != now:
            raise InstanceError(f"--resume: {paths[2]}: device_name: the files were measured on {was!r}, this "
                                f"machine has {now!r}; choose another folder")
    if not grid.decode:
        raise InstanceError(f"profile probe: not one sequence of {min(PROBE_CONTEXTS):,} tokens fits in the KV memory "
                            "left next to the weights")
    result = run_probe(backend, settings, grid, shape, on_step, clock, sleep, warn=warn, meta=previous, done=done,
                       on_update=lambda partial: _write(partial, paths))
    return result, paths


# --------------------------------------------------------------------------------------------
# The numpy backend (the reference decoder)
# --------------------------------------------------------------------------------------------


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """RMSNorm: :math:`x / \\sqrt{\\overline{x^2} + \\epsilon} \\cdot w` over the last axis."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def decoder_shapes(shape: ModelShape) -> dict:
    """The shapes of the decoder's tensors: per layer ``norm1`` (d), ``qkv`` (d, (H + 2 H_kv) dh), ``o``
    (H dh, d), ``norm2`` (d), ``gate_up`` (d, 2 f), ``down`` (f, d); then ``norm`` (d) and ``lm_head`` (d, V)."""
    d, dh, h, kv, f = shape.hidden, shape.head_dim, shape.heads, shape.kv_heads, shape.ffn
    layer = {"norm1": (d,), "qkv": (d, (h + 2 * kv) * dh), "o": (h * dh, d), "norm2": (d,), "gate_up": (d, 2 * f),
             "down": (f, d)}
    return {"layers": [dict(layer) for _ in range(shape.layers)], "norm": (d,), "lm_head": (d, shape.vocab)}


def decoder_weights(shape: ModelShape, seed: int = 0, dtype=np.float32) -> dict:
    """Random weights of the probe's decoder (:func:`decoder_shapes`): matrices :math:`N(0, 1/\text{rows})`, so
    activations stay O(1), and norms 1. A backend given these arrays computes the function of
    :func:`numpy_forward`."""
    rng = np.random.default_rng(seed)

    def draw(dims):
        if len(dims) == 1:
            return np.ones(dims, dtype)
        return (rng.standard_normal(dims) / math.sqrt(dims[0])).astype(dtype)

    shapes = decoder_shapes(shape)
    return {"layers": [{k: draw(v) for k, v in layer.items()} for layer in shapes["layers"]],
            "norm": draw(shapes["norm"]), "lm_head": draw(shapes["lm_head"])}


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """Grouped-query attention: ``q`` (B, H, Tq, dh), ``k``/``v`` (B, H_kv, Tk, dh) -> (B, H, Tq, dh); query head
    :math:`i` reads KV head :math:`\\lfloor i / (H / H_{kv}) \\rfloor`; causal: query :math:`t` sees keys up to
    :math:`T_k - T_q + t`."""
    B, H, Tq, dh = q.shape
    kvh, Tk = k.shape[1], k.shape[2]
    g = H // kvh
    qg = q.reshape(B, kvh, g, Tq, dh)
    s = np.einsum("bkgqd,bktd->bkgqt", qg, k) / math.sqrt(dh)
    if causal:
        mask = np.arange(Tk)[None, :] > (Tk - Tq + np.arange(Tq))[:, None]
        s = np.where(mask, -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bkgqt,bktd->bkgqd", p, v).reshape(B, H, Tq, dh)


def numpy_forward(shape: ModelShape, weights: dict, x: np.ndarray, caches: list, pos: int) -> np.ndarray:
    """One pass of the decoder over ``x`` (B, T, d): the T new tokens of each sequence take positions
    ``pos .. pos + T - 1``; their K/V are written into ``caches`` (per layer a (K, V) pair of (B, H_kv, Tmax, dh))
    and attention reads positions ``0 .. pos + T - 1`` (causal within the new tokens). Returns the logits of the
    last token, (B, V)."""
    B, T, _ = x.shape
    h, kv, dh = shape.heads, shape.kv_heads, shape.head_dim
    for w, (K, V) in zip(weights["layers"], caches):
        a = _rms_norm(x, w["norm1"]) @ w["qkv"]
        q = a[..., :h * dh].reshape(B, T, h, dh).transpose(0, 2, 1, 3)
        K[:, :, pos:pos + T] = a[..., h * dh:(h + kv) * dh].reshape(B, T, kv, dh).transpose(0, 2, 1, 3)
        V[:, :, pos:pos + T] = a[..., (h + kv) * dh:].reshape(B, T, kv, dh).transpose(0, 2, 1, 3)
        att = numpy_attention(q, K[:, :, :pos + T], V[:, :, :pos + T], causal=T > 1)
        x = x + att.transpose(0, 2, 1, 3).reshape(B, T, h * dh) @ w["o"]
        gu = _rms_norm(x, w["norm2"]) @ w["gate_up"]
        x = x + (_silu(gu[..., :shape.ffn]) * gu[..., shape.ffn:]) @ w["down"]
    return _rms_norm(x[:, -1], weights["norm"]) @ weights["lm_head"]


class NumpyBackend:
    """The probe's decoder in numpy (float32) on the CPU: no energy counter, so no power. A reference for the
    torch backend and a way to run the harness without a GPU; ``kv_tokens`` is given, since host memory says
    nothing about a GPU's."""

    def __init__(self, shape: ModelShape, kv_tokens: int, seed: int = 0):
        self.shape, self._kv_tokens, self.seed = shape, int(kv_tokens), seed
        self.weights = decoder_weights(shape, seed)
        self._built = None

    def describe(self) -> dict:
        return {"device_name": "cpu (numpy reference decoder)", "numpy": np.__version__}

    def kv_tokens(self) -> int:
        return self._kv_tokens

    def _caches(self, batch: int, tokens: int) -> list:
        s = self.shape
        return [(np.zeros((batch, s.kv_heads, tokens, s.head_dim), np.float32),
                 np.zeros((batch, s.kv_heads, tokens, s.head_dim), np.float32)) for _ in range(s.layers)]

    def decode(self, batch: int, context_tokens: int) -> Callable[[], None]:
        rng = np.random.default_rng(self.seed + 1)
        caches = self._caches(batch, context_tokens + 1)
        for K, V in caches:      # the cached context: random keys and values
            K[:, :, :context_tokens] = rng.standard_normal(K[:, :, :context_tokens].shape)
            V[:, :, :context_tokens] = rng.standard_normal(V[:, :, :context_tokens].shape)
        x = rng.standard_normal((batch, 1, self.shape.hidden)).astype(np.float32)
        self._built = (caches, x)

        def run() -> None:
            numpy_forward(self.shape, self.weights, x, caches, context_tokens)

        return run

    def prefill(self, prompt_tokens: int) -> Callable[[], None]:
        rng = np.random.default_rng(self.seed + 2)
        caches = self._caches(1, prompt_tokens)
        x = rng.standard_normal((1, prompt_tokens, self.shape.hidden)).astype(np.float32)
        self._built = (caches, x)

        def run() -> None:
            numpy_forward(self.shape, self.weights, x, caches, 0)

        return run

    def synchronize(self) -> None:
        return None

    def energy_j(self) -> float | None:
        return None

    def release(self) -> None:
        self._built = None
