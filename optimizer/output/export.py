"""Deployment files from a solve's JSON: vLLM command lines, Kubernetes manifests and router configurations.

:func:`read_plan` reads one plan of a ``fleetopt solve --json`` file (the selected plan at the top level, or
``solutions[N-1]``; :func:`fleetopt.optimizer.io.solve_json.read_solve_plan`, the reader ``simulate --plan``
shares) into an :class:`ExportPlan`, checking every field it uses (one line naming the file and the field per
problem). The renderers are pure functions of that record (docs/export.md):

* :func:`vllm_args` / :func:`vllm_script`: per pool ``vllm serve HF_ID`` with ``--tensor-parallel-size``,
  ``--max-model-len`` (the pool's window), ``--max-num-seqs`` (its batch cap), ``--max-num-batched-tokens`` (its
  prefill chunk), ``--dtype``, ``--quantization`` / ``--kv-cache-dtype`` for a quantised configuration and
  ``--kv-transfer-config`` for a prefill or decode pool (disaggregated serving);
* :func:`k8s_documents`: per pool an ``apps/v1`` Deployment, or a ``leaderworkerset.x-k8s.io/v1``
  LeaderWorkerSet when one replica spans nodes, and a ``v1`` Service; a ConfigMap with the router files;
* :func:`semantic_router_config`: the vLLM Semantic Router's context (token-count) signals and decisions, one
  per length band; :func:`route_table`: the same bands as a plain tab-separated table for any other router.

Every file starts with a comment naming the fleetopt version and the SHA-256 of the plan file
(:func:`header_lines`). Text files are written atomically (:func:`write_text`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.io.catalog import catalog_documents
from fleetopt.optimizer.io.solve_json import json_kind, read_solve_plan, whole_number
from fleetopt.optimizer.output.writes import TEXT_MODE
from fleetopt.optimizer.output.writes import write_text as _write

__all__ = ["ExportPool", "ExportPlan", "RouteBand", "read_plan", "vllm_args", "vllm_script", "k8s_documents",
           "semantic_router_config", "semantic_router_text", "route_table", "header_lines", "yaml_documents",
           "write_text", "dns_label", "fleetopt_version", "DEFAULT_IMAGE", "DEFAULT_HF_TOKEN_SECRET",
           "DEFAULT_KV_CONNECTOR", "GPUS_PER_NODE", "GPU_LABEL", "SERVICE_PORT", "FORMATS", "PHASE_KV_ROLES",
           "ROUTE_COLUMNS"]

FORMATS = ("vllm", "k8s")
DEFAULT_IMAGE = "vllm/vllm-openai:latest"
"""Container image of the Kubernetes workloads (``--image`` to pin a version)."""
SERVICE_PORT = 8000
"""Port vLLM's OpenAI-compatible server listens on (its default); ``/health`` answers 200 there once loaded."""
GPU_LABEL = "nvidia.com/gpu.product"
"""Node label NVIDIA's GPU feature discovery sets to the GPU's product name (``gfd_product`` in hardware.yaml)."""
GPUS_PER_NODE = 8
"""GPUs of one node: a replica needing more is a LeaderWorkerSet of ``ceil(gpus / 8)`` pods."""
DEFAULT_HF_TOKEN_SECRET = "hf-token"
"""Secret holding the Hugging Face token under the key ``token`` (``--hf-token-secret`` to rename)."""
DEFAULT_KV_CONNECTOR = "NixlConnector"
"""vLLM KV connector of a disaggregated prefill/decode pool (``--kv-connector`` to change)."""
HF_CACHE_PATH = "/root/.cache/huggingface"
"""Where the vLLM image's Hugging Face cache lives (``HF_HOME``); the model-cache volume mounts here."""

PHASE_KV_ROLES = {"both": None, "prefill": "kv_producer", "decode": "kv_consumer"}
"""A pool's ``phase`` -> the ``kv_role`` of vLLM's ``--kv-transfer-config`` (``vllm/config/kv_transfer.py``,
KVTransferConfig, v0.11-v0.12: ``kv_producer`` sends the KV cache a prefill computes, ``kv_consumer`` receives
it and decodes); ``both`` (or no ``phase``): a pool that does both, no KV transfer."""

_DTYPES = {"fp16": ("float16", None, None), "bf16": ("bfloat16", None, None), "fp8": ("auto", "fp8", "fp8"),
           "int4": ("float16", None, None)}
"""Weight dtype of a computed profile -> vLLM ``--dtype``, ``--quantization``, ``--kv-cache-dtype``. fp8: vLLM's
online FP8 weight quantisation with an FP8 KV cache, activations in the checkpoint's 16-bit dtype (``auto``);
int4: a pre-quantised AWQ/GPTQ checkpoint (``--model``) whose ``quantization_config`` vLLM reads itself, run in
float16 (vLLM's advice for AWQ); fp16/bf16: unquantised."""
_KV_DTYPES = {"fp8": "fp8", "fp16": None, "bf16": None}
"""A profile's ``kv-DTYPE`` option -> ``--kv-cache-dtype`` (None: the model's dtype, vLLM's ``auto``)."""
_MAX_WHOLE = 2**31


@dataclass(frozen=True)
class ExportPool:
    """One pool of the plan as deployed: window, batch cap, replicas of ``tp`` GPUs, model, GPU type and role."""

    index: int
    min_tokens: int
    max_tokens: int
    gpu: str
    gpu_type: str
    gfd_product: str | None
    profile: str
    model: str
    model_id: str
    dtype: str | None
    kv_dtype: str | None
    tp: int
    replicas: int
    max_num_seqs: int
    chunk_tokens: int | None
    compress_gamma: float
    phase: str
    service: str


@dataclass(frozen=True)
class RouteBand:
    """Requests of total length in ``(min_tokens, max_tokens]`` go to ``backends`` (service, weight) pairs."""

    min_tokens: int
    max_tokens: int
    backends: tuple[tuple[str, float], ...]
    note: str = ""


@dataclass(frozen=True)
class ExportPlan:
    """One solved plan, ready to render; ``sha256`` is the plan file's, ``version`` fleetopt's."""

    source: str
    sha256: str
    version: str
    instance: str
    name: str
    plan: str
    policy: str
    pools: tuple[ExportPool, ...]
    bands: tuple[RouteBand, ...]
    warnings: tuple[str, ...]


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as an RFC 1035 label (Kubernetes Service and Deployment names): lower case, ``[a-z0-9-]``, starts
    with a letter, ends alphanumeric, at most ``limit`` characters.

    >>> dns_label("Quickstart_A100.x"), dns_label("8b-plan")
    ('quickstart-a100-x', 'p-8b-plan')
    """
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    out = re.sub(r"-{2,}", "-", out) or "plan"
    if not out[0].isalpha():
        out = "p-" + out
    return out[:limit].rstrip("-")


def fleetopt_version() -> str:
    """The installed fleetopt's version (``unknown`` when it is not installed as a package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fleetopt")
    except PackageNotFoundError:
        return "unknown"


_kind = json_kind


def _whole(value, low: int) -> int | None:
    """``value`` as an int when it is a whole number in ``[low, 2**31)`` (:func:`whole_number`)."""
    return whole_number(value, low, _MAX_WHOLE - 1)


def _catalogue() -> tuple[dict[str, str], dict[str, str], dict[str, int]]:
    """Model name -> Hugging Face id (``models.yaml`` ``hf_id``); GPU name or alias -> ``(name, gfd_product)``
    (``hardware.yaml``); calibrated profile -> its prefill chunk (``calibrated_profiles.yaml`` ``chunk``). Keys
    in lower case."""
    docs = catalog_documents()
    hf_ids = {name.lower(): str(d["hf_id"]) for name, d in docs["models"]["models"].items() if d.get("hf_id")}
    gpus = {}
    for name, d in docs["hardware"]["gpus"].items():
        for key in [name, *(d.get("aliases") or [])]:
            gpus[str(key).lower()] = (name, d.get("gfd_product"))
    chunks = {name.lower(): int(d["chunk"]) for name, d in docs["profiles"]["profiles"].items() if "chunk" in d}
    return hf_ids, gpus, chunks


def _computed_chunk_tokens() -> int:
    """The prefill chunk of a computed profile built without a ``chunk`` option (the roofline's default)."""
    from fleetopt.models.roofline import computed_profile

    return int(inspect.signature(computed_profile).parameters["chunk_tokens"].default)


def _profile_parts(profile: str) -> tuple[str, str | None, str | None, bool]:
    """GPU type, weight dtype, KV dtype and whether the profile is computed, from the pool's profile name.

    A computed profile is named ``HARDWARE/MODEL/tpN/DTYPE[/kv-KVDTYPE][/...]``
    (:func:`fleetopt.models.roofline.computed_profile`; the KV dtype is named only where it is not the weight
    dtype's default: fp8 for fp8 weights, the 16-bit dtype otherwise); a calibrated or fitted one by its own name.

    >>> _profile_parts("H100-SXM-80GB/Llama-3.1-70B/tp8/fp8"), _profile_parts("A100-80GB")[3]
    (('H100-SXM-80GB', 'fp8', 'fp8', True), False)
    """
    parts = profile.split("/")
    tp_at = next((i for i, part in enumerate(parts) if i >= 2 and re.fullmatch(r"tp\d+", part)), None)
    if tp_at is None or tp_at + 1 >= len(parts):
        return profile, None, None, False
    dtype = parts[tp_at + 1]
    kv = next((part[3:] for part in parts[tp_at + 2:] if part.startswith("kv-") and part[3:] in _KV_DTYPES),
              "fp8" if dtype == "fp8" else None)
    return parts[0], dtype, _KV_DTYPES.get(kv or "", None), True


def read_plan(path: str | Path, plan: int | None = None, models: dict[str, str] | None = None,
              name: str | None = None) -> ExportPlan:
    """Plan ``plan`` (1-based index into ``solutions``; None: the selected plan at the top level) of a
    ``fleetopt solve --json`` file, as an :class:`ExportPlan`.

    ``models`` maps a pool's GPU option name (or ``*``: every pool) to the Hugging Face id to serve; without an
    entry a catalogue model is served under its ``hf_id``. A pool with neither, or an int4 pool without an entry
    (it needs a pre-quantised checkpoint), is refused. ``name`` prefixes the Kubernetes names (default: the
    instance's name). Raises :class:`InstanceError`, one line naming the file and the field, for anything else
    than a solve result with that plan.
    """
    read = read_solve_plan(path, plan, flag="--plan")
    path, fail, field, label = read.path, read.problem, read.field, read.label
    chosen, instance = read.plan, read.instance
    prefix = dns_label(name or instance, 40)
    catalogue, models = _catalogue(), {k.lower(): v for k, v in (models or {}).items()}
    pools, warnings = [], []
    for k, p in enumerate(read.pools):
        pool, notes = _pool(p, k, f"{field}pools[{k}]", prefix, catalogue, models, fail)
        pools.append(pool)
        warnings.extend(n for n in notes if n not in warnings)
    unknown = sorted(set(models) - {p.gpu.lower() for p in pools} - {"*"})
    if unknown:
        raise fail("", f"--model {unknown[0]}=...: no pool of {label} runs on GPU option {unknown[0]!r}; known: "
                       f"{', '.join(sorted({p.gpu for p in pools}))}")
    names = [p.service for p in pools]
    if len(set(names)) != len(names):
        raise fail(f"{field}pools", "two pools map to the same Kubernetes name; give --name")
    for pre, dec in _pairs(pools):
        warnings.append(f"pools {pre.index} and {dec.index} are a prefill/decode pair on {pre.min_tokens:,}-"
                        f"{pre.max_tokens:,} tokens: the router files send the band to the prefill pool "
                        f"({pre.service}), where a P/D proxy must stand that forwards each request to it and then "
                        f"to {dec.service} (routes.tsv's decode_url); fleetopt writes no proxy (vLLM's "
                        "disaggregated-serving proxy or llm-d's)")
    routing = chosen.get("routing")
    if routing is None:
        bands, policy = _length_bands(pools), "length"
    else:
        bands, policy = _split_bands(routing, pools, f"{field}routing", fail), "split"
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return ExportPlan(str(path), digest, fleetopt_version(), str(instance), prefix, label, policy, tuple(pools),
                      tuple(bands), tuple(warnings))


def _pool(p, k: int, where: str, prefix: str, catalogue, models: dict[str, str], fail):
    """One pool of the plan file, checked (whole numbers, GPUs a multiple of replicas, strings named, a model id,
    a known phase)."""
    if not isinstance(p, dict):
        raise fail(where, f"must be a mapping with min_tokens, max_tokens, gpu, replicas, gpus and max_num_seqs; "
                          f"got {_kind(p)}")
    missing = [key for key in ("min_tokens", "max_tokens", "gpu", "replicas", "gpus", "max_num_seqs", "profile")
               if key not in p]
    if missing:
        raise fail(where, f"missing {', '.join(missing)}; is this a 'fleetopt solve --json' file?")
    counts = {}
    for key, low in (("min_tokens", 0), ("max_tokens", 1), ("replicas", 1), ("gpus", 1), ("max_num_seqs", 1)):
        counts[key] = _whole(p[key], low)
        if counts[key] is None:
            raise fail(f"{where}.{key}", f"{_kind(p[key])} is not allowed; give a whole number >= {low}")
    if counts["max_tokens"] <= counts["min_tokens"]:
        raise fail(where, f"the pool {counts['min_tokens']}-{counts['max_tokens']} is empty")
    if counts["gpus"] % counts["replicas"]:
        raise fail(f"{where}.gpus", f"{counts['gpus']} GPUs do not split into {counts['replicas']} equal replicas")
    for key in ("gpu", "profile"):
        if not isinstance(p[key], str) or not p[key].strip():
            raise fail(f"{where}.{key}", f"{_kind(p[key])} is not allowed; give a name")
    gamma = p.get("compress_gamma", 1.0)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not (math.isfinite(gamma) and gamma >= 1):
        raise fail(f"{where}.compress_gamma", f"{_kind(gamma)} is not allowed; give a finite number >= 1")
    phase = p.get("phase", "both")
    if phase not in PHASE_KV_ROLES:
        shown = repr(phase) if isinstance(phase, str) else _kind(phase)
        raise fail(f"{where}.phase", f"{shown} is not allowed; give one of {', '.join(PHASE_KV_ROLES)}")
    hf_ids, gpus, chunks = catalogue
    gpu, profile = p["gpu"], p["profile"]
    model = p.get("model")
    if not isinstance(model, str):
        model = ""
    gpu_type, dtype, kv_dtype, computed = _profile_parts(profile)
    hardware, gfd_product = gpus.get(gpu_type.lower(), (gpu_type, None))
    tp = counts["gpus"] // counts["replicas"]
    physical = _whole(p.get("physical_gpus_per_replica"), 1)   # schema 2.1: what one replica is in physical GPUs
    stated = physical is not None
    if physical is not None:
        tp = physical
    notes = []
    given = models.get(gpu.lower()) or models.get("*")
    if dtype == "int4" and not given:
        raise fail(f"{where}.profile", f"{profile!r} serves int4 weights, which need a pre-quantised (AWQ or GPTQ) "
                                       f"checkpoint; pass --model {gpu}=ORG/NAME-AWQ (or -GPTQ)")
    model_id = given or hf_ids.get(model.lower(), "")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", model_id):
        shown = f"model {model!r}" if model else "no model"
        raise fail(f"{where}.model", f"{shown} has no Hugging Face id in the catalogue (data/catalog/models.yaml "
                                     f"hf_id); pass --model {gpu}=ORG/NAME")
    chunk = _whole(p.get("chunk_tokens"), 1)
    if chunk is None:
        chunk = _computed_chunk_tokens() if computed else chunks.get(profile.lower())
        if chunk is not None:
            notes.append(f"the plan file does not record the prefill chunk; --max-num-batched-tokens is the "
                         f"{'computed' if computed else 'calibrated'} profile's {chunk} (an instance's 'chunk' "
                         "option is not in the plan)")
    if gfd_product is None:
        notes.append(f"GPU option {gpu}: no GPU feature discovery product name for {gpu_type!r} in the catalogue; "
                     "the Kubernetes workload gets no nodeSelector")
    if not computed and not stated:
        notes.append(f"GPU option {gpu}: profile {profile!r} is a calibrated unit ({model or 'model unknown'}) that "
                     f"the plan counts as {tp} GPU(s) per replica; --tensor-parallel-size {tp} is the plan's count, "
                     "not necessarily the unit's own TP")
    service = dns_label(f"{prefix}-pool{k + 1}-{gpu}")
    return ExportPool(index=k + 1, min_tokens=counts["min_tokens"], max_tokens=counts["max_tokens"], gpu=gpu,
                      gpu_type=hardware, gfd_product=gfd_product, profile=profile, model=model, model_id=model_id,
                      dtype=dtype, kv_dtype=kv_dtype, tp=tp, replicas=counts["replicas"],
                      max_num_seqs=counts["max_num_seqs"], chunk_tokens=chunk, compress_gamma=float(gamma),
                      phase=phase, service=service), notes


def _pairs(pools) -> list[tuple[ExportPool, ExportPool]]:
    """The plan's disaggregated pairs: each prefill pool with the decode pool of the same window."""
    decode = {(p.min_tokens, p.max_tokens): p for p in pools if p.phase == "decode"}
    return [(p, decode[p.min_tokens, p.max_tokens]) for p in pools
            if p.phase == "prefill" and (p.min_tokens, p.max_tokens) in decode]


def _length_bands(pools: list[ExportPool]) -> list[RouteBand]:
    """A length plan: each pool's window is one band with one backend. A decode pool is no band: its requests
    enter at their prefill pool, whose KV cache goes to the decode pool (a disaggregated pair)."""
    return [RouteBand(p.min_tokens, p.max_tokens, ((p.service, 1.0),))
            for p in sorted(pools, key=lambda q: q.min_tokens) if p.phase != "decode"]


def _split_bands(routing, pools: list[ExportPool], where: str, fail) -> list[RouteBand]:
    """A split plan: band i of ``boundaries_tokens`` goes to pool j with weight ``rate[i][j] / sum_j rate[i][j]``.

    A band with no planned traffic goes whole to the narrowest pool whose window holds it (said in its note).
    """
    if not isinstance(routing, dict) or not {"boundaries_tokens", "rate_req_per_s"} <= routing.keys():
        raise fail(where, f"must be a mapping with boundaries_tokens and rate_req_per_s; got {_kind(routing)}")
    edges = routing["boundaries_tokens"]
    if not isinstance(edges, list) or len(edges) < 2 or any(_whole(x, 0) is None for x in edges) \
            or any(b <= a for a, b in zip(edges, edges[1:])):
        raise fail(f"{where}.boundaries_tokens", "give an increasing list of at least two whole token counts")
    rates = routing["rate_req_per_s"]
    if not isinstance(rates, list) or len(rates) != len(edges) - 1 or not all(
            isinstance(row, list) and len(row) == len(pools)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                    for v in row) for row in rates):
        raise fail(f"{where}.rate_req_per_s", f"give {len(edges) - 1} rows (one per band) of {len(pools)} "
                                              "non-negative req/s (one per pool)")
    bands = []
    for i, (lo, hi, row) in enumerate(zip(edges, edges[1:], rates)):
        for j, rate in enumerate(row):
            if rate > 0 and not (pools[j].min_tokens <= lo and hi <= pools[j].max_tokens):
                raise fail(f"{where}.rate_req_per_s[{i}][{j}]", f"band {lo}-{hi} is routed to pool {j + 1}, whose "
                                                                f"window {pools[j].min_tokens}-{pools[j].max_tokens} "
                                                                "does not hold it")
        total = float(sum(row))
        if total > 0:
            bands.append(RouteBand(lo, hi, tuple((pools[j].service, rate / total) for j, rate in enumerate(row)
                                                 if rate > 0)))
            continue
        holders = [p for p in pools if p.min_tokens <= lo and hi <= p.max_tokens]
        if holders:
            best = min(holders, key=lambda p: p.max_tokens - p.min_tokens)
            bands.append(RouteBand(lo, hi, ((best.service, 1.0),),
                                   "no planned traffic; the narrowest pool whose window holds the band"))
    return bands


def vllm_args(pool: ExportPool, kv_connector: str = DEFAULT_KV_CONNECTOR, nodes: int = 1) -> list[str]:
    """The ``vllm serve`` arguments of one pool after the model (docs/export.md, "Where each number comes from").

    ``--tensor-parallel-size`` is the replica's GPUs; a replica over ``nodes`` > 1 nodes is tensor-parallel
    inside a node and pipeline-parallel across nodes (``--tensor-parallel-size tp / nodes
    --pipeline-parallel-size nodes``, vLLM's multi-node recipe). ``--max-num-batched-tokens`` is the pool's
    prefill chunk, raised to ``--max-num-seqs`` where the chunk is smaller (vLLM's SchedulerConfig refuses a
    token budget below the sequence cap: every running sequence decodes one token per step); omitted when the
    plan's profile has no known chunk.
    """
    weights, quantization, kv = _DTYPES.get(pool.dtype or "", ("auto", None, None))
    kv = pool.kv_dtype if pool.dtype is not None else kv
    args = ["--served-model-name", pool.model_id, pool.service, "--tensor-parallel-size", str(pool.tp // nodes)]
    if nodes > 1:
        args += ["--pipeline-parallel-size", str(nodes)]
    args += ["--max-model-len", str(pool.max_tokens), "--max-num-seqs", str(pool.max_num_seqs)]
    if pool.chunk_tokens is not None:
        args += ["--max-num-batched-tokens", str(max(pool.chunk_tokens, pool.max_num_seqs))]
    args += ["--dtype", weights]
    if quantization:
        args += ["--quantization", quantization]
    if kv:
        args += ["--kv-cache-dtype", kv]
    role = PHASE_KV_ROLES[pool.phase]
    if role:
        args += ["--kv-transfer-config", json.dumps({"kv_connector": kv_connector, "kv_role": role},
                                                    separators=(",", ":"))]
    return args


def header_lines(plan: ExportPlan, what: str, comment: str = "#") -> list[str]:
    """The comment every exported file starts with: fleetopt's version, the plan and its file's SHA-256."""
    lines = [f"{comment} {what}: fleetopt {plan.version} export of {plan.plan} of {plan.source}",
             f"{comment} input sha256 {plan.sha256}; instance {plan.instance}, {plan.policy} routing, "
             f"{len(plan.pools)} pool(s)"]
    return lines + [f"{comment} warning: {w}" for w in plan.warnings]


def vllm_script(plan: ExportPlan, kv_connector: str = DEFAULT_KV_CONNECTOR) -> str:
    """One ``vllm serve`` line per pool (shell-quoted), each after a comment with its replicas, GPU type and
    role; the token is read from ``HF_TOKEN`` (vLLM's Hugging Face client does so by itself)."""
    lines = ["#!/bin/sh", *header_lines(plan, "vLLM launch lines"),
             "# run each line once per replica; export HF_TOKEN first for gated models"]
    for p in plan.pools:
        role = "" if p.phase == "both" else f", {p.phase} role ({PHASE_KV_ROLES[p.phase]})"
        lines.append(f"# pool {p.index}: tokens {p.min_tokens}-{p.max_tokens}, {p.replicas} replica(s) x "
                     f"{p.tp} {p.gpu_type} GPU(s) (option {p.gpu}, profile {p.profile}){role}; "
                     f"service {p.service}")
        lines.append(shlex.join(["vllm", "serve", p.model_id, *vllm_args(p, kv_connector)]))
    return "\n".join(lines) + "\n"


def _labels(plan: ExportPlan, p: ExportPool) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": p.service,
            "app.kubernetes.io/part-of": dns_label(plan.instance), "app.kubernetes.io/managed-by": "fleetopt",
            "fleetopt.io/pool": str(p.index), "fleetopt.io/min-tokens": str(p.min_tokens),
            "fleetopt.io/max-tokens": str(p.max_tokens), "fleetopt.io/gpu": dns_label(p.gpu),
            "fleetopt.io/phase": p.phase}


def _probe(period_s: int, failures: int) -> dict:
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": period_s,
            "failureThreshold": failures}


def _pod_spec(p: ExportPool, container: dict, gpus: int, gpu_label: str | None, model_cache_pvc: str | None) -> dict:
    """A pod of ``gpus`` GPUs: the container, its /dev/shm (tensor parallelism over shared memory: NCCL) and
    cache volumes, and the GPU node selector."""
    mounts, volumes = [], []
    if p.tp > 1:
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    if model_cache_pvc:
        mounts.append({"name": "model-cache", "mountPath": HF_CACHE_PATH})
        volumes.append({"name": "model-cache", "persistentVolumeClaim": {"claimName": model_cache_pvc}})
    gpu_quantity = {"nvidia.com/gpu": str(gpus)}
    container = {**container, "resources": {"limits": gpu_quantity, "requests": dict(gpu_quantity)}}
    if mounts:
        container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"containers": [container]}
    if volumes:
        pod["volumes"] = volumes
    if gpu_label and p.gfd_product:
        pod["nodeSelector"] = {gpu_label: p.gfd_product}
    return pod


def k8s_documents(plan: ExportPlan, image: str = DEFAULT_IMAGE, gpu_label: str | None = GPU_LABEL, *,
                  hf_token_secret: str = DEFAULT_HF_TOKEN_SECRET, model_cache_pvc: str | None = None,
                  kv_connector: str = DEFAULT_KV_CONNECTOR, gpus_per_node: int = GPUS_PER_NODE) -> list[dict]:
    """Per pool a workload and a ``v1`` Service, then a ConfigMap with the router files.

    The workload is an ``apps/v1`` Deployment whose pod holds the replica's ``tp`` GPUs, or, where a replica
    needs more GPUs than a node has (``tp > gpus_per_node``), a ``leaderworkerset.x-k8s.io/v1`` LeaderWorkerSet
    of ``ceil(tp / gpus_per_node)`` pods per replica joined by Ray (vLLM's multi-node recipe). Every pod:
    ``nvidia.com/gpu`` limits and requests equal to its GPUs (strings), the token from the Secret
    ``hf_token_secret`` (key ``token``) as ``HF_TOKEN``, startup/readiness/liveness probes on ``/health``, an
    in-memory ``/dev/shm`` for TP > 1, the optional model cache PVC at the Hugging Face cache, and a
    ``nodeSelector`` on ``gpu_label`` (GPU feature discovery's ``nvidia.com/gpu.product``) where the catalogue
    knows the GPU's product name.
    """
    docs = []
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": hf_token_secret, "key": "token"}}},
           {"name": "HF_HOME", "value": HF_CACHE_PATH}]
    for p in plan.pools:
        labels = _labels(plan, p)
        selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
        annotations = {"fleetopt.io/gpu-type": p.gpu_type, "fleetopt.io/profile": p.profile,
                       "fleetopt.io/model": p.model_id, "fleetopt.io/source": f"{plan.plan} of {plan.source}",
                       "fleetopt.io/input-sha256": plan.sha256, "fleetopt.io/version": plan.version}
        serve = ["--model", p.model_id, "--port", str(SERVICE_PORT)] + vllm_args(p, kv_connector)
        http = {"ports": [{"name": "http", "containerPort": SERVICE_PORT}], "env": env,
                "startupProbe": _probe(10, 180), "readinessProbe": _probe(10, 3), "livenessProbe": _probe(30, 3)}
        meta = {"name": p.service, "labels": labels, "annotations": annotations}
        if p.tp <= gpus_per_node:
            container = {"name": "vllm", "image": image, "args": serve, **http}
            pod = _pod_spec(p, container, p.tp, gpu_label, model_cache_pvc)
            docs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                         "spec": {"replicas": p.replicas, "selector": {"matchLabels": selector},
                                  "template": {"metadata": {"labels": labels, "annotations": annotations},
                                               "spec": pod}}})
            service_selector = selector
        else:
            nodes = math.ceil(p.tp / gpus_per_node)
            if p.tp % nodes:
                raise InstanceError(f"{plan.source}: pools[{p.index - 1}]: {p.tp} GPUs per replica do not split "
                                    f"into {nodes} nodes of at most {gpus_per_node} GPUs evenly; give "
                                    "--gpus-per-node")
            per_pod = p.tp // nodes
            script = ("S=/vllm-workspace/examples/online_serving/multi-node-serving.sh; [ -f $S ] || "
                      "S=/vllm-workspace/examples/ray_serving/multi-node-serving.sh; bash $S")
            leader = {"name": "vllm-leader", "image": image, "command": ["sh", "-c"],
                      "args": [f"{script} leader --ray_cluster_size=$(LWS_GROUP_SIZE); exec "
                               + shlex.join(["vllm", "serve", p.model_id, "--port", str(SERVICE_PORT),
                                             *vllm_args(p, kv_connector, nodes), "--distributed-executor-backend",
                                             "ray"])], **http}
            worker = {"name": "vllm-worker", "image": image, "command": ["sh", "-c"],
                      "args": [f"{script} worker --ray_address=$(LWS_LEADER_ADDRESS)"], "env": env}
            docs.append({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": meta,
                         "spec": {"replicas": p.replicas, "leaderWorkerTemplate": {
                             "size": nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                             "leaderTemplate": {"metadata": {"labels": labels, "annotations": annotations},
                                                "spec": _pod_spec(p, leader, per_pod, gpu_label, model_cache_pvc)},
                             "workerTemplate": {"metadata": {"labels": labels},
                                                "spec": _pod_spec(p, worker, per_pod, gpu_label,
                                                                  model_cache_pvc)}}}})
            service_selector = {**selector, "leaderworkerset.sigs.k8s.io/worker-index": "0"}
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": p.service, "labels": labels},
                     "spec": {"selector": service_selector,
                              "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http"}]}})
    docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": dns_label(f"{plan.name}-router"),
                              "labels": {"app.kubernetes.io/part-of": dns_label(plan.instance),
                                         "app.kubernetes.io/managed-by": "fleetopt"},
                              "annotations": {"fleetopt.io/input-sha256": plan.sha256,
                                              "fleetopt.io/version": plan.version}},
                 "data": {"config.yaml": semantic_router_text(plan, header=False),
                          "routes.tsv": route_table(plan, header=False)}})
    return docs


def _band_name(b: RouteBand) -> str:
    return f"tokens-{b.min_tokens}-{b.max_tokens}"


def semantic_router_config(plan: ExportPlan) -> dict:
    """The vLLM Semantic Router (vllm-project/semantic-router) configuration of the plan's length bands.

    One ``signals.context`` rule per band (``min_tokens``/``max_tokens``: the router's token-count signal) and
    one decision routing it to the band's pools; each pool is an endpoint (its Service) serving a model named as
    the Service (``--served-model-name``), so ``modelRefs`` name pools. A split band lists every pool with
    planned traffic; the plan's weights are in :func:`route_table`. The router counts prompt tokens, the plan's
    bands total tokens (prompt + output): docs/export.md says what that means.
    """
    widest = max(plan.pools, key=lambda p: (p.max_tokens, -p.index))
    return {
        "vllm_endpoints": [{"name": p.service, "address": p.service, "port": SERVICE_PORT, "weight": 1}
                           for p in plan.pools],
        "model_config": {p.service: {"preferred_endpoints": [p.service]} for p in plan.pools},
        "default_model": widest.service,
        "signals": {"context": [{"name": _band_name(b), "min_tokens": str(b.min_tokens),
                                 "max_tokens": str(b.max_tokens),
                                 "description": f"fleetopt band {b.min_tokens}-{b.max_tokens} tokens"
                                                + (f" ({b.note})" if b.note else "")} for b in plan.bands]},
        "decisions": [{"name": _band_name(b), "priority": 10,
                       "rules": {"operator": "AND", "conditions": [{"type": "context", "name": _band_name(b)}]},
                       "modelRefs": [{"model": s} for s, _ in b.backends]} for b in plan.bands],
    }


def semantic_router_text(plan: ExportPlan, header: bool = True) -> str:
    """:func:`semantic_router_config` as the router's ``config.yaml`` text, after comments saying what to fill in:
    the router accepts only IP addresses for ``vllm_endpoints``, so each endpoint's ``address`` (its Service's
    name here) is to be replaced by the Service's ClusterIP once the Services exist."""
    names = " ".join(p.service for p in plan.pools)
    lines = header_lines(plan, "vLLM Semantic Router config.yaml") if header else []
    lines += ["# vllm_endpoints[].address must be an IP address: after 'kubectl apply', replace each Service name by "
              "its ClusterIP:",
              f"#   for s in {names}; do ip=$(kubectl get svc $s -o jsonpath='{{.spec.clusterIP}}'); "
              "sed -i \"s/address: $s$/address: $ip/\" config.yaml; done",
              "# signals.context counts prompt tokens; the bands are the plan's total tokens (prompt + output): "
              "docs/export.md"]
    return "\n".join(lines) + "\n" + yaml_documents([semantic_router_config(plan)], explicit_start=False)


ROUTE_COLUMNS = ("min_tokens", "max_tokens", "service", "url", "weight", "phase", "max_model_len", "max_num_seqs",
                 "compress_gamma", "decode_url")
"""Columns of :func:`route_table`: a request of total length L (prompt + output tokens) with
``min_tokens < L <= max_tokens`` goes to ``service`` with probability ``weight``; ``decode_url``, on the prefill
pool of a disaggregated pair, is its decode pool, where a P/D proxy sends the request next (empty otherwise)."""


def route_table(plan: ExportPlan, header: bool = True) -> str:
    """The bands as a tab-separated table (one row per band and backend; ``#`` comment lines first), for any
    router that can measure a request's length."""
    by_service = {p.service: p for p in plan.pools}
    decode = {pre.service: dec.service for pre, dec in _pairs(plan.pools)}
    lines = header_lines(plan, "length routes") if header else []
    lines.append("\t".join(ROUTE_COLUMNS))
    for b in plan.bands:
        for s, w in b.backends:
            p = by_service[s]
            lines.append("\t".join(str(v) for v in (b.min_tokens, b.max_tokens, s,
                                                     f"http://{s}:{SERVICE_PORT}/v1", round(w, 6), p.phase,
                                                     p.max_tokens, p.max_num_seqs, p.compress_gamma,
                                                     f"http://{decode[s]}:{SERVICE_PORT}/v1" if s in decode
                                                     else "")))
    return "\n".join(lines) + "\n"


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the router ConfigMap's file) as literal blocks and no anchors."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def yaml_documents(docs: list[dict], explicit_start: bool = True) -> str:
    """Documents as multi-document YAML (keys in the order given, multi-line strings as literal blocks)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         explicit_start=explicit_start, width=120, allow_unicode=True)


def write_text(text: str, target: str | Path, protect: tuple[Path, ...] = (), flag: str = "-o",
               mode: int = TEXT_MODE) -> None:
    """Write ``text`` atomically, never over the plan file being exported
    (:func:`fleetopt.optimizer.output.writes.write_text`);
    ``mode``: a new file's mode before the umask (:data:`fleetopt.optimizer.output.writes.SCRIPT_MODE` for a script)."""
    _write(text, target, flag, protect, mode)
