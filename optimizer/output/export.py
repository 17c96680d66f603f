"""Deployment files from a solve's JSON: vLLM command lines, Kubernetes manifests and a router configuration.

:func:`read_plan` reads one plan of a ``fleetopt solve --json`` file (the selected plan at the top level, or
``solutions[N-1]``; :func:`fleetopt.optimizer.io.solve_json.read_solve_plan`, the reader ``simulate --plan``
shares) into an :class:`ExportPlan`, checking every field it uses (one line naming the file and the field per
problem). The renderers are pure functions of that record:

* :func:`vllm_script`: one ``vllm serve MODEL --max-model-len B --max-num-seqs n --tensor-parallel-size tp``
  line per pool, the replica count, GPU type and pool bounds as comments;
* :func:`k8s_documents`: per pool an ``apps/v1`` Deployment (replicas, the ``vllm/vllm-openai`` image with the
  same arguments, ``nvidia.com/gpu: tp`` limits, the GPU type as an annotation or a ``nodeSelector``) and a
  ``v1`` Service, plus a ConfigMap holding the router configuration;
* :func:`router_config`: the length bands (and, for a split plan, the weight of each pool in a band) mapped to
  the pools' service names.

Where each number comes from (docs/export.md): ``--max-model-len`` is the pool's window ``max_tokens`` (a request
of total length L, prompt + output, goes to the pool with ``min_tokens < L <= max_tokens``), ``--max-num-seqs``
the pool's batch cap ``max_num_seqs``, ``--tensor-parallel-size`` the physical GPUs of one replica
(``physical_gpus_per_replica``, schema 2.1: 8 for the seeds' TP=8 units; ``gpus / replicas`` in older plan
files), the replicas the plan's ``replicas`` (availability inflation included), split weights
``rate_req_per_s`` of a band over the band's total. Text files are written atomically (:func:`write_text`).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from fleetopt.optimizer.io.catalog import catalog_documents
from fleetopt.optimizer.output.writes import TEXT_MODE
from fleetopt.optimizer.output.writes import write_text as _write
from fleetopt.optimizer.io.solve_json import json_kind, read_solve_plan, whole_number

__all__ = ["ExportPool", "ExportPlan", "RouteBand", "read_plan", "vllm_args", "vllm_script", "k8s_documents",
           "router_config", "yaml_documents", "write_text", "dns_label", "DEFAULT_IMAGE", "SERVICE_PORT",
           "FORMATS"]

FORMATS = ("vllm", "k8s")
DEFAULT_IMAGE = "vllm/vllm-openai:latest"
"""Container image of the Kubernetes Deployments (``--image`` to pin a version)."""
SERVICE_PORT = 8000
"""Port vLLM's OpenAI-compatible server listens on (its default)."""

_DTYPE_ARGS = {"fp16": ["--dtype", "float16"], "bf16": ["--dtype", "bfloat16"], "fp8": ["--quantization", "fp8"]}
"""vLLM arguments for the weight dtype of a computed profile (int4 needs a pre-quantised checkpoint: none)."""
_MAX_WHOLE = 2**31


@dataclass(frozen=True)
class ExportPool:
    """One pool of the plan as deployed: window, batch cap, replicas of ``tp`` GPUs, model and GPU type."""

    index: int
    min_tokens: int
    max_tokens: int
    gpu: str
    gpu_type: str
    profile: str
    model: str
    model_id: str
    dtype: str | None
    tp: int
    replicas: int
    max_num_seqs: int
    compress_gamma: float
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
    """One solved plan, ready to render."""

    source: str
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


_kind = json_kind


def _whole(value, low: int) -> int | None:
    """``value`` as an int when it is a whole number in ``[low, 2**31)`` (:func:`whole_number`)."""
    return whole_number(value, low, _MAX_WHOLE - 1)


def _hf_ids() -> dict[str, str]:
    """Catalogue model name (lower case) -> Hugging Face id (``data/catalog/models.yaml`` ``hf_id``)."""
    models = catalog_documents()["models"]["models"]
    return {name.lower(): str(d["hf_id"]) for name, d in models.items() if d.get("hf_id")}


def _gpu_type_and_dtype(profile: str) -> tuple[str, str | None, bool]:
    """GPU type, weight dtype and whether the profile is computed, from the pool's profile name.

    A computed profile is named ``HARDWARE/MODEL/tpN/DTYPE[/...]`` (:func:`fleetopt.models.roofline.computed_profile`);
    a calibrated or fitted one by its own name (the GPU it was measured on).
    """
    parts = profile.split("/")
    tp_at = next((i for i, part in enumerate(parts) if i >= 2 and re.fullmatch(r"tp\d+", part)), None)
    if tp_at is None or tp_at + 1 >= len(parts):
        return profile, None, False
    return parts[0], parts[tp_at + 1], True


def read_plan(path: str | Path, plan: int | None = None, models: dict[str, str] | None = None,
              name: str | None = None) -> ExportPlan:
    """Plan ``plan`` (1-based index into ``solutions``; None: the selected plan at the top level) of a
    ``fleetopt solve --json`` file, as an :class:`ExportPlan`.

    ``models`` maps a pool's GPU option name (or ``*``: every pool) to the Hugging Face id to serve; without an
    entry a catalogue model is served under its ``hf_id``, any other under the name the plan records (with a
    warning when that is not an id). ``name`` prefixes the Kubernetes names (default: the instance's name).
    Raises :class:`InstanceError`, one line naming the file and the field, for anything else than a solve
    result with that plan.
    """
    read = read_solve_plan(path, plan, flag="--plan")
    path, fail, field, label = read.path, read.problem, read.field, read.label
    chosen, instance = read.plan, read.instance
    prefix = dns_label(name or instance, 40)
    hf_ids, models = _hf_ids(), {k.lower(): v for k, v in (models or {}).items()}
    pools, warnings = [], []
    for k, p in enumerate(read.pools):
        pool, notes = _pool(p, k, f"{field}pools[{k}]", prefix, hf_ids, models, fail)
        pools.append(pool)
        warnings.extend(n for n in notes if n not in warnings)
    unknown = sorted(set(models) - {p.gpu.lower() for p in pools} - {"*"})
    if unknown:
        raise fail("", f"--model {unknown[0]}=...: no pool of {label} runs on GPU option {unknown[0]!r}; known: "
                       f"{', '.join(sorted({p.gpu for p in pools}))}")
    names = [p.service for p in pools]
    if len(set(names)) != len(names):
        raise fail(f"{field}pools", "two pools map to the same Kubernetes name; give --name")
    routing = chosen.get("routing")
    if routing is None:
        bands, policy = _length_bands(pools), "length"
    else:
        bands, policy = _split_bands(routing, pools, f"{field}routing", fail), "split"
    return ExportPlan(str(path), str(instance), prefix, label, policy, tuple(pools), tuple(bands), tuple(warnings))


def _pool(p, k: int, where: str, prefix: str, hf_ids: dict[str, str], models: dict[str, str], fail):
    """One pool of the plan file, checked (whole numbers, GPUs a multiple of replicas, strings named)."""
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
    gpu, profile = p["gpu"], p["profile"]
    model = p.get("model") if isinstance(p.get("model"), str) else ""
    gpu_type, dtype, computed = _gpu_type_and_dtype(profile)
    tp = counts["gpus"] // counts["replicas"]
    physical = p.get("physical_gpus_per_replica")        # schema 2.1: what one replica is in physical GPUs
    stated = (isinstance(physical, int) and not isinstance(physical, bool) and physical >= 1)
    if stated:
        tp = physical
    notes = []
    model_id = models.get(gpu.lower()) or models.get("*") or hf_ids.get(model.lower()) or model
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", model_id or ""):
        notes.append(f"GPU option {gpu}: model {model_id!r} is not a Hugging Face id; pass --model {gpu}=ORG/NAME")
    if not computed and not stated:
        notes.append(f"GPU option {gpu}: profile {profile!r} is a calibrated unit ({model or 'model unknown'}) that "
                     f"the plan counts as {tp} GPU(s) per replica; --tensor-parallel-size {tp} is the plan's count, "
                     "not necessarily the unit's own TP")
    service = dns_label(f"{prefix}-pool{k + 1}-{gpu}")
    return ExportPool(k + 1, counts["min_tokens"], counts["max_tokens"], gpu, gpu_type, profile, model, model_id,
                      dtype, tp, counts["replicas"], counts["max_num_seqs"], float(gamma), service), notes


def _length_bands(pools: list[ExportPool]) -> list[RouteBand]:
    """A length plan: each pool's window is one band with one backend."""
    return [RouteBand(p.min_tokens, p.max_tokens, ((p.service, 1.0),))
            for p in sorted(pools, key=lambda q: q.min_tokens)]


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


def vllm_args(pool: ExportPool) -> list[str]:
    """The ``vllm serve`` arguments of one pool (after the model): window, batch cap, TP and the dtype."""
    args = ["--max-model-len", str(pool.max_tokens), "--max-num-seqs", str(pool.max_num_seqs),
            "--tensor-parallel-size", str(pool.tp)]
    return args + _DTYPE_ARGS.get(pool.dtype or "", [])


def _header(plan: ExportPlan, comment: str = "#") -> list[str]:
    lines = [f"{comment} fleetopt export: {plan.plan} of {plan.source} (instance {plan.instance}, "
             f"{plan.policy} routing, {len(plan.pools)} pool(s))",
             f"{comment} --max-model-len = pool window (tokens, prompt + output), --max-num-seqs = pool batch cap, "
             "--tensor-parallel-size = physical GPUs per replica (the plan's physical_gpus_per_replica; "
             "before schema 2.1: gpus / replicas)"]
    return lines + [f"{comment} warning: {w}" for w in plan.warnings]


def vllm_script(plan: ExportPlan) -> str:
    """One ``vllm serve`` line per pool (shell-quoted), each after a comment with its replicas and GPU type."""
    lines = ["#!/bin/sh"] + _header(plan)
    for p in plan.pools:
        lines.append(f"# pool {p.index}: tokens {p.min_tokens}-{p.max_tokens}, {p.replicas} replica(s) x "
                     f"{p.tp} {p.gpu_type} GPU(s) (option {p.gpu}, profile {p.profile}); service {p.service}")
        lines.append(shlex.join(["vllm", "serve", p.model_id] + vllm_args(p)))
    return "\n".join(lines) + "\n"


def _labels(plan: ExportPlan, p: ExportPool) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": p.service,
            "app.kubernetes.io/part-of": dns_label(plan.instance), "app.kubernetes.io/managed-by": "fleetopt",
            "fleetopt.io/pool": str(p.index), "fleetopt.io/min-tokens": str(p.min_tokens),
            "fleetopt.io/max-tokens": str(p.max_tokens), "fleetopt.io/gpu": dns_label(p.gpu)}


def k8s_documents(plan: ExportPlan, image: str = DEFAULT_IMAGE, gpu_label: str | None = None) -> list[dict]:
    """Per pool an ``apps/v1`` Deployment and a ``v1`` Service, then a ConfigMap with the router configuration.

    The GPU type goes into the annotation ``fleetopt.io/gpu-type``; with ``gpu_label`` (a node label key such as
    ``nvidia.com/gpu.product``) also into a ``nodeSelector`` on that key.
    """
    docs = []
    for p in plan.pools:
        labels = _labels(plan, p)
        selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}
        annotations = {"fleetopt.io/gpu-type": p.gpu_type, "fleetopt.io/profile": p.profile,
                       "fleetopt.io/model": p.model_id, "fleetopt.io/source": f"{plan.plan} of {plan.source}"}
        pod = {"containers": [{
            "name": "vllm", "image": image,
            "args": ["--model", p.model_id, "--port", str(SERVICE_PORT)] + vllm_args(p),
            "ports": [{"name": "http", "containerPort": SERVICE_PORT}],
            "resources": {"limits": {"nvidia.com/gpu": p.tp}, "requests": {"nvidia.com/gpu": p.tp}},
        }]}
        if gpu_label:
            pod["nodeSelector"] = {gpu_label: p.gpu_type}
        docs.append({"apiVersion": "apps/v1", "kind": "Deployment",
                     "metadata": {"name": p.service, "labels": labels, "annotations": annotations},
                     "spec": {"replicas": p.replicas, "selector": {"matchLabels": selector},
                              "template": {"metadata": {"labels": labels, "annotations": annotations},
                                           "spec": pod}}})
        docs.append({"apiVersion": "v1", "kind": "Service", "metadata": {"name": p.service, "labels": labels},
                     "spec": {"selector": selector,
                              "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http"}]}})
    docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": dns_label(f"{plan.name}-router"),
                              "labels": {"app.kubernetes.io/part-of": dns_label(plan.instance),
                                         "app.kubernetes.io/managed-by": "fleetopt"}},
                 "data": {"router.yaml": yaml_documents([router_config(plan)])}})
    return docs


def router_config(plan: ExportPlan) -> dict:
    """The router configuration: length bands ``(min_tokens, max_tokens]`` of total tokens (prompt + output) to
    pool services, with split weights (fractions of the band's planned req/s) for a split plan."""
    by_service = {p.service: p for p in plan.pools}
    routes = []
    for b in plan.bands:
        route = {"min_tokens": b.min_tokens, "max_tokens": b.max_tokens,
                 "backends": [{"service": s, "url": f"http://{s}:{SERVICE_PORT}/v1", "weight": round(w, 6)}
                              for s, w in b.backends]}
        gammas = {by_service[s].compress_gamma for s, _ in b.backends}
        if any(g > 1 for g in gammas):
            route["compress_gamma"] = max(gammas)
        if b.note:
            route["note"] = b.note
        routes.append(route)
    return {"router": {
        "instance": plan.instance, "source": f"{plan.plan} of {plan.source}", "policy": plan.policy,
        "length": "total tokens of a request (prompt + maximum output); a request of length L takes the route "
                  "with min_tokens < L <= max_tokens",
        "weights": "fraction of the band's requests per backend (split plans: the plan's req/s per band and pool)",
        "routes": routes,
        "services": [{"service": p.service, "pool": p.index, "gpu": p.gpu, "replicas": p.replicas,
                      "max_model_len": p.max_tokens, "max_num_seqs": p.max_num_seqs} for p in plan.pools],
    }}


class _Dumper(yaml.SafeDumper):
    """Safe YAML with multi-line strings (the router ConfigMap's file) as literal blocks and no anchors."""

    def ignore_aliases(self, data) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, text: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def yaml_documents(docs: list[dict]) -> str:
    """Documents as multi-document YAML (keys in the order given, multi-line strings as literal blocks)."""
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, explicit_start=True,
                         width=120, allow_unicode=True)


def write_text(text: str, target: str | Path, protect: tuple[Path, ...] = (), flag: str = "-o",
               mode: int = TEXT_MODE) -> None:
    """Write ``text`` atomically, never over the plan file being exported
    (:func:`fleetopt.optimizer.output.writes.write_text`);
    ``mode``: a new file's mode before the umask (:data:`fleetopt.optimizer.output.writes.SCRIPT_MODE` for a script)."""
    _write(text, target, flag, protect, mode)
