"""``fleetopt export``: vLLM command lines and Kubernetes manifests from a solve's JSON.

The Kubernetes output is checked against a compact JSON Schema of the required parts of an ``apps/v1``
Deployment, written here from the published Kubernetes API reference (kubernetes.io/docs/reference/kubernetes-api/
workload-resources/deployment-v1/, .../pod-v1/#Container, and the object-names page for DNS-1123 names and label
syntax), with a small validator (``jsonschema`` is not a dependency). The vLLM lines are parsed back with shlex.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABELS = {"type": "object", "additionalProperties": {"type": "string", "pattern": LABEL_VALUE, "maxLength": 63}}
QUANTITY = {"anyOf": [{"type": "integer", "minimum": 0},
                      {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?[a-zA-Z]*$"}]}

DEPLOYMENT_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "apps/v1"},
        "kind": {"const": "Deployment"},
        "metadata": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string", "pattern": DNS1123_SUBDOMAIN, "maxLength": 253},
                                    "labels": LABELS,
                                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {"type": "object", "required": ["selector", "template"], "properties": {
            "replicas": {"type": "integer", "minimum": 0},
            "selector": {"type": "object", "required": ["matchLabels"], "properties": {"matchLabels": LABELS}},
            "template": {"type": "object", "required": ["metadata", "spec"], "properties": {
                "metadata": {"type": "object", "required": ["labels"], "properties": {"labels": LABELS}},
                "spec": {"type": "object", "required": ["containers"], "properties": {
                    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "containers": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["name", "image"], "properties": {
                            "name": {"type": "string", "pattern": DNS1123_LABEL, "maxLength": 63},
                            "image": {"type": "string", "minLength": 1},
                            "args": {"type": "array", "items": {"type": "string"}},
                            "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"],
                                                                 "properties": {"containerPort": {
                                                                     "type": "integer", "minimum": 1,
                                                                     "maximum": 65535}}}},
                            "resources": {"type": "object", "required": ["limits"], "properties": {
                                "limits": {"type": "object", "additionalProperties": QUANTITY}}}}}}}}}}}}},
}

_TYPES = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool}


def validate(value, schema, where="$") -> list[str]:
    """Every violation of ``schema`` (the subset of JSON Schema used above) by ``value``, one line each."""
    errors = []
    if "anyOf" in schema:
        if all(validate(value, s, where) for s in schema["anyOf"]):
            errors.append(f"{where}: matches none of anyOf")
        return errors
    if "const" in schema and value != schema["const"]:
        return [f"{where}: {value!r} != {schema['const']!r}"]
    kind = schema.get("type")
    if kind:
        ok = isinstance(value, _TYPES[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            return [f"{where}: expected {kind}, got {type(value).__name__}"]
    if isinstance(value, dict):
        errors += [f"{where}: missing {k}" for k in schema.get("required", ()) if k not in value]
        for k, v in value.items():
            sub = schema.get("properties", {}).get(k, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                errors += validate(v, sub, f"{where}.{k}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: fewer than {schema['minItems']} items")
        for i, v in enumerate(value):
            errors += validate(v, schema.get("items", {}), f"{where}[{i}]")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{where}: {value!r} does not match {schema['pattern']}")
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: length {len(value)} out of range")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            errors.append(f"{where}: {value} out of range")
    return errors


def deployment_problems(doc: dict) -> list[str]:
    """Schema violations plus the API server's cross-field rule: the selector matches the template's labels."""
    errors = validate(doc, DEPLOYMENT_SCHEMA)
    if not errors:
        match = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        if not match or any(labels.get(k) != v for k, v in match.items()):
            errors.append("$.spec.selector.matchLabels: does not match spec.template.metadata.labels")
    return errors


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart instance solved once (the real solver), as (path, JSON)."""
    path = tmp_path_factory.mktemp("solve") / "q.json"
    res = run("solve", "instances/quickstart.yaml", "--json", path)
    assert res.exit_code == 0, res.output
    return path, json.loads(path.read_text())


def _pool(lo, hi, gpu, replicas, gpus, seqs, profile, model="Llama-3.1-70B"):
    return {"min_tokens": lo, "max_tokens": hi, "gpu": gpu, "replicas": replicas, "gpus": gpus, "max_num_seqs": seqs,
            "profile": profile, "model": model}


def _write(tmp_path, data, name="r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_quickstart_k8s_validates_against_the_deployment_schema(quickstart, tmp_path):
    path, plan = quickstart
    out = tmp_path / "k8s.yaml"
    res = run("export", path, "--format", "k8s", "-o", out, "--gpu-label", "nvidia.com/gpu.product")
    assert res.exit_code == 0, res.output
    docs = list(yaml.safe_load_all(out.read_text()))
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == len(plan["pools"]) >= 2
    for doc, pool in zip(deployments, plan["pools"]):
        assert deployment_problems(doc) == []
        assert doc["spec"]["replicas"] == pool["replicas"]
        container = doc["spec"]["template"]["spec"]["containers"][0]
        assert container["image"].startswith("vllm/vllm-openai")
        assert container["resources"]["limits"]["nvidia.com/gpu"] == pool["physical_gpus_per_replica"]
        args = container["args"]
        assert int(args[args.index("--max-model-len") + 1]) == pool["max_tokens"]
        assert int(args[args.index("--max-num-seqs") + 1]) == pool["max_num_seqs"]
        labels = doc["metadata"]["labels"]
        assert (labels["fleetopt.io/min-tokens"], labels["fleetopt.io/max-tokens"]) == (
            str(pool["min_tokens"]), str(pool["max_tokens"]))
        assert doc["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": pool["profile"]}
    # one Service per pool, named as the Deployment; the router maps the pools' bands to them
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert services == {d["metadata"]["name"] for d in deployments}
    router = yaml.safe_load((tmp_path / "k8s.router.yaml").read_text())["router"]
    assert [(r["min_tokens"], r["max_tokens"]) for r in router["routes"]] == [
        (p["min_tokens"], p["max_tokens"]) for p in plan["pools"]]
    assert all(len(r["backends"]) == 1 and r["backends"][0]["weight"] == 1.0 and r["backends"][0]["service"]
               in services for r in router["routes"])
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    assert yaml.safe_load(configmap["data"]["router.yaml"]) == {"router": router}


def test_the_schema_check_rejects_broken_deployments(quickstart):
    """The validator above is not vacuous: each broken field is reported."""
    path, _ = quickstart
    res = run("export", path, "--format", "k8s")
    doc = next(d for d in yaml.safe_load_all(res.stdout) if d["kind"] == "Deployment")
    for mutate, phrase in [(lambda d: d["spec"].update(replicas=-1), "spec.replicas"),
                           (lambda d: d["spec"].update(replicas=1.5), "expected integer"),
                           (lambda d: d["metadata"].update(name="Pool_1"), "metadata.name"),
                           (lambda d: d["spec"]["selector"]["matchLabels"].update(x="y"), "does not match"),
                           (lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("image"), "missing image"),
                           (lambda d: d.update(apiVersion="v1"), "apiVersion")]:
        broken = json.loads(json.dumps(doc))
        mutate(broken)
        assert any(phrase in e for e in deployment_problems(broken)), phrase


def test_quickstart_vllm_lines_parse_back_to_the_plan(quickstart):
    path, plan = quickstart
    res = run("export", path, "--format", "vllm", "--model", "meta-llama/Llama-3.1-70B")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("vllm ")]
    assert len(lines) == len(plan["pools"])
    comments = [ln for ln in res.stdout.splitlines() if ln.startswith("# pool ")]
    for line, comment, pool in zip(lines, comments, plan["pools"]):
        words = shlex.split(line)
        assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
        opts = dict(zip(words[3::2], words[4::2]))
        assert int(opts["--max-model-len"]) == pool["max_tokens"]
        assert int(opts["--max-num-seqs"]) == pool["max_num_seqs"]
        assert int(opts["--tensor-parallel-size"]) == pool["physical_gpus_per_replica"]
        assert f"{pool['replicas']} replica(s)" in comment


def test_computed_pools_take_tp_dtype_and_the_catalogue_id(tmp_path):
    data = {"command": "solve", "instance": "gen", "status": "optimal", "pools": [
        _pool(0, 4096, "h100x8", 2, 16, 300, "H100-SXM-80GB/Llama-3.1-70B/tp8/fp16"),
        _pool(4096, 8192, "b200x8", 3, 24, 100, "B200-SXM/Llama-3.1-70B/tp8/fp8")]}
    res = run("export", _write(tmp_path, data), "--format", "vllm")
    assert res.exit_code == 0, res.output
    lines = [shlex.split(ln) for ln in res.stdout.splitlines() if ln.startswith("vllm ")]
    assert lines == [
        ["vllm", "serve", "meta-llama/Llama-3.1-70B", "--max-model-len", "4096", "--max-num-seqs", "300",
         "--tensor-parallel-size", "8", "--dtype", "float16"],
        ["vllm", "serve", "meta-llama/Llama-3.1-70B", "--max-model-len", "8192", "--max-num-seqs", "100",
         "--tensor-parallel-size", "8", "--quantization", "fp8"]]
    assert "2 replica(s) x 8 H100-SXM-80GB GPU(s)" in res.stdout
    assert "warning" not in res.output


def test_split_plan_router_weights(tmp_path):
    """Band (2048, 8192] carries 1 + 3 req/s: weights 1/4 and 3/4; band (0, 2048] only pool 1."""
    data = {"command": "solve", "instance": "split", "status": "optimal",
            "pools": [_pool(0, 8192, "a", 1, 1, 64, "H100-80GB"), _pool(2048, 65536, "b", 2, 2, 16, "H100-80GB")],
            "routing": {"boundaries_tokens": [0, 2048, 8192, 65536],
                        "rate_req_per_s": [[3.0, 0.0], [1.0, 3.0], [0.0, 0.5]]}}
    out = tmp_path / "router.yaml"
    res = run("export", _write(tmp_path, data), "--format", "k8s", "--router", out, "--model", "org/m")
    assert res.exit_code == 0, res.output
    routes = yaml.safe_load(out.read_text())["router"]["routes"]
    got = [(r["min_tokens"], r["max_tokens"], [(b["service"], b["weight"]) for b in r["backends"]]) for r in routes]
    assert got == [(0, 2048, [("split-pool1-a", 1.0)]),
                   (2048, 8192, [("split-pool1-a", 0.25), ("split-pool2-b", 0.75)]),
                   (8192, 65536, [("split-pool2-b", 1.0)])]


def test_output_folder_gets_both_files_and_input_is_protected(quickstart, tmp_path):
    path, _ = quickstart
    res = run("export", path, "--format", "vllm", "-o", tmp_path)
    assert res.exit_code == 0, res.output
    assert (tmp_path / "vllm.sh").read_text().startswith("#!/bin/sh")
    assert "routes" in yaml.safe_load((tmp_path / "router.yaml").read_text())["router"]
    before = path.read_text()
    res = run("export", path, "--format", "vllm", "-o", path)
    assert res.exit_code == 2 and "refusing to overwrite an input file" in res.output
    assert path.read_text() == before


@pytest.mark.parametrize("content,args,phrase", [
    ("{not json", (), "not JSON (line 1"),
    (json.dumps({"command": "simulate", "pools": []}), (), "command: not the JSON output of 'fleetopt solve'"),
    (json.dumps({"command": "solve", "status": "infeasible", "pools": []}), (), "pools: the solve found no plan"),
    (json.dumps({"command": "solve", "pools": [_pool(0, 10, "a", 1, 1, 4, "A10G")], "solutions": []}),
     ("--plan", "2"), "solutions: --plan 2: the file holds 0 solution(s)"),
    (json.dumps({"command": "solve", "pools": [{**_pool(0, 10, "a", 1, 1, 4, "A10G"), "replicas": 1.5}]}), (),
     "pools[0].replicas: the number 1.5 is not allowed"),
    (json.dumps({"command": "solve", "pools": [_pool(0, 10, "a", 2, 3, 4, "A10G")]}), (),
     "pools[0].gpus: 3 GPUs do not split into 2 equal replicas"),
])
def test_bad_result_files_one_line_exit_2(tmp_path, content, args, phrase):
    path = _write(tmp_path, content)
    res = run("export", path, "--format", "vllm", *args)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and phrase in lines[0], res.output


def test_missing_file_exit_2(tmp_path):
    res = run("export", tmp_path / "nothere.json", "--format", "k8s")
    assert res.exit_code == 2 and "no such file" in res.output
