"""Serving profiles: what one replica of a model on some GPUs can do.

A *replica* (the seeds call it a "unit" or "GPU") is one serving engine
instance; it may span several physical GPUs under tensor parallelism. Every
profile answers the same questions (:class:`ServingProfile`):

* ``n_slots(ctx)`` - sequences the replica holds at once when its context
  window is ``ctx`` tokens (KV-cache and compute limits);
* the iteration-latency constants ``W_s`` and ``H_s`` at ``calibration_ctx_tokens``,
  the per-sequence compute ``g_s``, the prefill compute ``prefill_a_s`` (per prompt
  token) and ``prefill_b_s`` (per token squared, causal attention), and the prefill
  chunk, used by :mod:`fleetopt.models.service` (the seeds' calibrated profiles have
  ``g_s = prefill_a_s = prefill_b_s = 0``: their convention);
* price, power curve and GPU count per replica (``gpus_per_replica``, what it is priced and counted
  as; ``physical_gpus_per_replica``, the GPUs its constants describe), with quality labels.

Two kinds exist: :class:`CalibratedProfile` (constants measured or fitted
elsewhere, e.g. the seeds' A100/H100 units) and ``ComputedProfile`` in
:mod:`fleetopt.models.roofline` (derived from hardware x model x serving config).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, overload, runtime_checkable

import numpy as np

from fleetopt.models.power import ActivityPower, PowerCurve

__all__ = ["ServingProfile", "CalibratedProfile", "quality_label", "UNITS", "ReplicaUnit", "replica_unit",
           "served_model"]

LATENCY_QUALITIES = ("measured", "calibrated", "one-anchor", "projected", "roofline")


@runtime_checkable
class ServingProfile(Protocol):
    """The interface every profile offers (see module docstring)."""

    name: str
    model_name: str
    W_s: float
    H_s: float
    calibration_ctx_tokens: int
    chunk_tokens: int
    blk_size_tokens: int
    cost_usd_per_hr: float
    gpus_per_replica: int
    physical_gpus_per_replica: int
    power: PowerCurve | ActivityPower
    latency_quality: str
    g_s: float
    prefill_a_s: float
    prefill_b_s: float

    @overload
    def n_slots(self, ctx_tokens: float) -> int: ...
    @overload
    def n_slots(self, ctx_tokens: np.ndarray) -> np.ndarray: ...


def quality_label(profile: ServingProfile) -> str:
    """A short label of where a profile's numbers come from, e.g. ``latency calibrated / power measured``."""
    return f"latency {profile.latency_quality} / power {profile.power.quality}"


def _ceil_div(a, b):
    return -(-np.asarray(a, dtype=np.int64) // b)


@dataclass(frozen=True)
class CalibratedProfile:
    """A profile given by constants (the seeds' "manual" profiles).

    .. math::

        n_{slots}(B) = \\min\\left(\\left\\lfloor \\frac{m \\, B_{cal}}{B} \\right\\rfloor,
        \\left\\lfloor \\frac{K}{\\lceil B / b \\rceil} \\right\\rfloor\\right)

    with :math:`m` = ``max_slots`` (concurrency cap at the calibration context
    :math:`B_{cal}`), :math:`K` = ``total_kv_blocks`` of :math:`b` tokens each.

    Examples
    --------
    >>> from fleetopt.models.power import ActivityPower, PowerCurve
    >>> h100 = CalibratedProfile("H100-80GB", "Llama-3-70B-class (TP=8)", 0.004, 0.00032, 8192, 1024,
    ...     16, 65536, 256, 4.02, 1, PowerCurve(300, 600, 1.0, 4.2, "measured"), "calibrated")
    >>> [int(h100.n_slots(c)) for c in (2048, 8192, 65536)]
    [512, 128, 16]
    """

    name: str
    model_name: str
    W_s: float
    H_s: float
    calibration_ctx_tokens: int
    chunk_tokens: int
    blk_size_tokens: int
    total_kv_blocks: int
    max_slots: int
    cost_usd_per_hr: float
    gpus_per_replica: int
    power: PowerCurve | ActivityPower
    latency_quality: str = "calibrated"
    source: str = ""
    note: str = ""
    g_s: float = 0.0
    prefill_a_s: float = 0.0
    prefill_b_s: float = 0.0
    physical_gpus_per_replica: int | None = None
    """Physical GPUs one replica's constants describe (its tensor-parallel group): ``gpus_per_replica`` when
    not given; 8 for the seeds' calibrated TP=8 units, which count (price and power) as one GPU."""

    def __post_init__(self) -> None:
        if self.physical_gpus_per_replica is None:
            object.__setattr__(self, "physical_gpus_per_replica", self.gpus_per_replica)
        for attr in ("W_s", "H_s"):
            if not getattr(self, attr) > 0:
                raise ValueError(f"profile {self.name}: {attr} must be > 0; got {getattr(self, attr)}")
        for attr in ("g_s", "prefill_a_s", "prefill_b_s"):
            if not getattr(self, attr) >= 0:
                raise ValueError(f"profile {self.name}: {attr} must be >= 0; got {getattr(self, attr)}")
        for attr in ("calibration_ctx_tokens", "chunk_tokens", "blk_size_tokens", "total_kv_blocks",
                     "max_slots", "gpus_per_replica"):
            if not getattr(self, attr) >= 1:
                raise ValueError(f"profile {self.name}: {attr} must be >= 1; got {getattr(self, attr)}")
        assert self.physical_gpus_per_replica is not None     # set above
        if not self.physical_gpus_per_replica >= self.gpus_per_replica:
            raise ValueError(f"profile {self.name}: physical_gpus_per_replica must be >= gpus_per_replica "
                             f"{self.gpus_per_replica}; got {self.physical_gpus_per_replica}")
        if self.latency_quality not in LATENCY_QUALITIES:
            raise ValueError(f"profile {self.name}: latency_quality must be one of {LATENCY_QUALITIES}")

    @overload
    def n_slots(self, ctx_tokens: float) -> int: ...
    @overload
    def n_slots(self, ctx_tokens: np.ndarray) -> np.ndarray: ...
    def n_slots(self, ctx_tokens: float | np.ndarray) -> int | np.ndarray:
        """Sequences held at context window ``ctx_tokens`` (array-aware)."""
        ctx = np.asarray(ctx_tokens, dtype=np.int64)
        if np.any(ctx < 1):
            raise ValueError("ctx_tokens must be >= 1")
        compute_cap = self.max_slots * self.calibration_ctx_tokens // ctx
        kv_cap = self.total_kv_blocks // _ceil_div(ctx, self.blk_size_tokens)
        out = np.minimum(compute_cap, kv_cap)
        return out if out.ndim else int(out)


UNITS = ("gpu", "seed_unit")
"""What one replica is priced and powered as: ``gpu``, its physical GPUs (computed, fitted and most calibrated
profiles); ``seed_unit``, the seeds' calibrated convention: a TP=N server priced and powered as fewer GPUs
(one)."""

_UNKNOWN_MODELS = ("", "unspecified", "unknown")


@dataclass(frozen=True)
class ReplicaUnit:
    """What one replica of a profile is: the GPUs it is priced, powered and counted as (``gpus_per_replica``,
    what ``gpus`` and the limits count) and the physical GPUs its constants describe."""

    gpus_per_replica: int
    physical_gpus_per_replica: int

    @property
    def unit(self) -> str:
        """``gpu`` when a counted GPU is a physical one, else ``seed_unit`` (:data:`UNITS`)."""
        return "gpu" if self.physical_gpus_per_replica == self.gpus_per_replica else "seed_unit"

    @property
    def text(self) -> str:
        """One replica in words, e.g. ``1 replica = 8 physical GPUs (TP=8)``."""
        n, b = self.physical_gpus_per_replica, self.gpus_per_replica
        if self.unit == "gpu":
            return f"1 replica = {n} physical GPU" + (f"s (TP={n})" if n > 1 else "")
        return (f"1 replica = {b} billing unit{'s' if b > 1 else ''} = {n} physical GPUs (the seeds' calibrated "
                f"TP={n} server, priced and powered as {b} GPU{'s' if b > 1 else ''})")

    def to_json(self) -> dict:
        return {"gpus_per_replica": self.gpus_per_replica,
                "physical_gpus_per_replica": self.physical_gpus_per_replica, "unit": self.unit,
                "unit_note": self.text}


def replica_unit(profile) -> ReplicaUnit:
    """What one replica of ``profile`` is: the GPUs it counts per replica and the physical GPUs its constants
    describe, both fields of the profile (:class:`fleetopt.models.profiles.ServingProfile`): a replica that
    describes more physical GPUs than it counts (the seeds' calibrated TP=8 units, counted as one GPU) is a
    ``seed_unit``; otherwise a counted GPU is a physical one.

    Examples
    --------
    >>> from types import SimpleNamespace as P
    >>> replica_unit(P(gpus_per_replica=1, physical_gpus_per_replica=8)).unit
    'seed_unit'
    >>> replica_unit(P(gpus_per_replica=8, physical_gpus_per_replica=8)).unit
    'gpu'
    """
    return ReplicaUnit(int(profile.gpus_per_replica), int(profile.physical_gpus_per_replica))


def served_model(model_name: str) -> str | None:
    """The model a profile serves, as compared between GPU options: its label without a trailing
    parenthesis (the serving details: ``Llama-3.1-8B (bf16, TP=1)`` serves ``Llama-3.1-8B``); None when the
    label names no model (``unspecified``).

    Examples
    --------
    >>> served_model("Llama-3-70B-class (TP=8 unit)"), served_model("Llama-3.1-70B"), served_model("unspecified")
    ('Llama-3-70B-class', 'Llama-3.1-70B', None)
    """
    name = re.sub(r"\s*\([^()]*\)\s*$", "", str(model_name or "")).strip()
    return None if name.lower() in _UNKNOWN_MODELS else name
