"""Profile files read back: the profile YAML that ``fleetopt profile fit`` writes
(:func:`fleetopt.optimizer.profiling.measurements.write_profile_file`; format in ``docs/profile_fit.md``, version
:data:`PROFILE_FORMAT`), which instances name as ``gpus[i].profile_file``.

:func:`profile_file_problems` is the reader the instance checks use (every problem a ``field: problem`` line);
:func:`read_profile` raises them as one :class:`~fleetopt.optimizer.errors.InstanceError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetopt.models.power import QUALITIES, ActivityPower, PowerCurve
from fleetopt.models.profiles import LATENCY_QUALITIES, CalibratedProfile
from fleetopt.optimizer.errors import InstanceError, format_problem
from fleetopt.optimizer.io.files import parse_text, read_text
from fleetopt.optimizer.io.schema import pydantic_field_path, pydantic_message

PROFILE_FORMAT = 1
"""The ``fleetopt_profile`` version a profile file carries."""

_Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Count = Annotated[int, Field(ge=1)]


class _Strict(BaseModel):
    # protected_namespaces=(): fields named model_* (model_name, model_config_file) are ours; pydantic before 2.10
    # warns on them
    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())


class _Latency(_Strict):
    quality: Literal[LATENCY_QUALITIES]  # type: ignore[valid-type]
    W_s: _Pos
    H_s: _Pos
    calibration_ctx_tokens: _Count
    g_s: _NonNeg = 0.0
    prefill_a_s: _NonNeg = 0.0
    prefill_b_s: _NonNeg = 0.0


class _Serving(_Strict):
    chunk_tokens: _Count
    blk_size_tokens: _Count
    total_kv_blocks: _Count
    max_slots: _Count
    gpus_per_replica: _Count
    cost_usd_per_hr: _Pos


class _ActivityBlock(_Strict):
    form: Literal["activity"]
    quality: Literal[QUALITIES]  # type: ignore[valid-type]
    idle_w: _NonNeg
    limit_w: _Pos
    weights_w: _NonNeg
    kv_w: _NonNeg
    compute_w: _NonNeg


class _LogisticBlock(_Strict):
    form: Literal["logistic"]
    quality: Literal[QUALITIES]  # type: ignore[valid-type]
    idle_w: _NonNeg
    nominal_w: _Pos
    logistic_k: _Pos
    logistic_x0: float


class _ProfileFile(_Strict):
    fleetopt_profile: Literal[PROFILE_FORMAT]  # type: ignore[valid-type]
    name: Annotated[str, Field(min_length=1)]
    model_name: str = ""
    hardware: str | None = None
    model: str | None = None
    dtype: str | None = None
    tp: _Count | None = None
    latency: _Latency
    serving: _Serving
    power: Annotated[_ActivityBlock | _LogisticBlock, Field(discriminator="form")]
    provenance: dict = Field(default_factory=dict)


_SECTIONS = {(): _ProfileFile, ("latency",): _Latency, ("serving",): _Serving, ("power",): None}


def _message(error: Mapping[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        names = tuple(p for p in error["loc"][:-1] if isinstance(p, str))
        model = _SECTIONS.get(names[:1] if names else ())
        allowed = ", ".join(model.model_fields) if model is not None else "see docs/profile_fit.md"
        return f"unknown key; allowed: {allowed}"
    if error["type"] == "union_tag_invalid":
        return f"{error.get('input')!r} is not allowed; choose activity or logistic"
    return pydantic_message(error)


def profile_file_problems(path: str | Path) -> tuple[CalibratedProfile | None, list[str]]:
    """The profile in the profile YAML at ``path``, or None and ``field: problem`` lines (the file not named)."""
    path = Path(path)
    text, reason = read_text(path)
    if reason is not None:
        return None, [f"cannot read: {reason}"]
    assert text is not None                         # read_text gives the text exactly when no reason
    data, message = parse_text(text, ".yaml")
    if message is not None:
        return None, [message]
    if not isinstance(data, dict):
        return None, ["the top level must be a mapping (a profile file written by fleetopt profile fit)"]
    try:
        raw = _ProfileFile.model_validate(data)
    except ValidationError as err:
        lines = []
        for e in err.errors(include_url=False):
            loc = tuple(p for p in e["loc"] if p not in ("activity", "logistic"))
            lines.append(f"{pydantic_field_path(loc) or 'file'}: {_message(e)}")
        return None, lines
    p = raw.power
    try:
        power = (ActivityPower(p.idle_w, p.limit_w, p.weights_w, p.kv_w, p.compute_w, p.quality)
                 if p.form == "activity" else PowerCurve(p.idle_w, p.nominal_w, p.logistic_k, p.logistic_x0, p.quality))
    except ValueError as err:
        return None, [f"power: {err}"]
    lat, srv = raw.latency, raw.serving
    sources = raw.provenance.get("sources") if isinstance(raw.provenance, dict) else None
    sources = sources if isinstance(sources, list) else []      # a file may say "sources: null" (fuzzing found it)
    files = ", ".join(str(s.get("file")) for s in sources if isinstance(s, dict))
    profile = CalibratedProfile(
        name=raw.name, model_name=raw.model_name or (raw.model or "unspecified"), W_s=lat.W_s, H_s=lat.H_s,
        calibration_ctx_tokens=lat.calibration_ctx_tokens, chunk_tokens=srv.chunk_tokens,
        blk_size_tokens=srv.blk_size_tokens, total_kv_blocks=srv.total_kv_blocks, max_slots=srv.max_slots,
        cost_usd_per_hr=srv.cost_usd_per_hr, gpus_per_replica=srv.gpus_per_replica, power=power,
        latency_quality=lat.quality, source=f"profile file {path}" + (f" (fit of {files})" if files else ""),
        note=str(raw.provenance.get("fitted_at", "")) if isinstance(raw.provenance, dict) else "",
        g_s=lat.g_s, prefill_a_s=lat.prefill_a_s, prefill_b_s=lat.prefill_b_s)
    return profile, []


def read_profile(path: str | Path) -> CalibratedProfile:
    """The profile in the profile YAML at ``path``.

    Raises
    ------
    InstanceError
        One line per problem: ``FILE: field: problem``.
    """
    profile, lines = profile_file_problems(path)
    if lines:
        raise InstanceError([format_problem(path, "", line) for line in lines])
    assert profile is not None                      # profile_file_problems gives a profile or problem lines
    return profile
