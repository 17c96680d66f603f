"""``fleetopt export``: vLLM command lines, Kubernetes manifests and router files from a solve's JSON.

The manifests are validated with ``jsonschema`` against the Kubernetes schema shipped in
``tests/data/k8s_schema.json`` (release-1.36 core/v1 + apps/v1 definitions and the LeaderWorkerSet v1 CRD, strict:
an unknown field is an error; provenance in the file's ``$comment``). Every vLLM flag written is checked against
vLLM's own argument parser when the ``vllm`` package is importable, else against the flag list taken from vLLM's
source (``tests/data/vllm_flags.txt``). Expected values are independent facts: the plan file's own fields, GPU
feature discovery's product names, vLLM's flag spellings, file hashes computed here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
from importlib.metadata import version
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from fleetopt.optimizer.cli import main

DATA = Path(__file__).parent / "data"
SCHEMA = json.loads((DATA / "k8s_schema.json").read_text())
KINDS = {("apps/v1", "Deployment"): "io.k8s.api.apps.v1.Deployment",
         ("v1", "Service"): "io.k8s.api.core.v1.Service", ("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap",
         ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "io.x-k8s.leaderworkerset.v1.LeaderWorkerSet"}


def k8s_problems(doc: dict) -> list[str]:
    """Schema violations of one manifest, plus the API server's cross-field rule for a Deployment: the selector
    matches the template's labels."""
    name = KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    if name is None:
        return [f"unknown apiVersion/kind {doc.get('apiVersion')}/{doc.get('kind')}"]
    validator = jsonschema.Draft7Validator({"$ref": f"#/definitions/{name}", "definitions": SCHEMA["definitions"]})
    errors = [f"$.{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
    if not errors and doc["kind"] == "Deployment":
        match = doc["spec"]["selector"]["matchLabels"]
        labels = doc["spec"]["template"]["metadata"]["labels"]
        if not match or any(labels.get(k) != v for k, v in match.items()):
            errors.append("$.spec.selector.matchLabels: does not match spec.template.metadata.labels")
    return errors


def _vllm_flags() -> dict[str, set[str] | None]:
    """Flag -> accepted values (None: any), from vLLM's parser when installed, else tests/data/vllm_flags.txt."""
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        flags = {}
        for line in (DATA / "vllm_flags.txt").read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                flag, *values = line.split()
                flags[flag] = set(values) or None
        return flags
    del AsyncEngineArgs
    parser = make_arg_parser(FlexibleArgumentParser())
    return {opt: (set(map(str, a.choices)) if a.choices else None) for a in parser._actions
            for opt in a.option_strings}


VLLM_FLAGS = _vllm_flags()


def flag_problems(args: list[str]) -> list[str]:
    """Flags of a vLLM argument list that vLLM does not define, or values it does not accept."""
    out = []
    for i, word in enumerate(args):
        if not word.startswith("--"):
            continue
        if word not in VLLM_FLAGS:
            out.append(f"{word}: not a vLLM flag")
        elif VLLM_FLAGS[word] and args[i + 1] not in VLLM_FLAGS[word]:
            out.append(f"{word} {args[i + 1]}: not among {sorted(VLLM_FLAGS[word])}")
    return out


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart instance solved once (the real solver), as (path, JSON)."""
    path = tmp_path_factory.mktemp("solve") / "q.json"
    res = run("solve", "instances/quickstart.yaml", "--json", path)
    assert res.exit_code == 0, res.output
    return path, json.loads(path.read_text())


def _pool(lo, hi, gpu, replicas, gpus, seqs, profile, model="Llama-3.1-70B", **extra):
    return {"min_tokens": lo, "max_tokens": hi, "gpu": gpu, "replicas": replicas, "gpus": gpus, "max_num_seqs": seqs,
            "profile": profile, "model": model, **extra}


def _plan(*pools, instance="gen", **extra):
    return {"command": "solve", "instance": instance, "status": "optimal", "pools": list(pools), **extra}


def _write(tmp_path, data, name="r.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _serve_args(doc: dict) -> list[str]:
    """The vLLM arguments of a workload's (leader) container."""
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else \
        doc["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    container = spec["containers"][0]
    if container.get("command") == ["sh", "-c"]:
        words = shlex.split(container["args"][0].split("exec ", 1)[1])    # vllm serve MODEL ARGS...
        return ["--model", words[2], *words[3:]]
    return container["args"]


def _opts(args: list[str]) -> dict[str, str]:
    return {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--") and i + 1 < len(args)}


def test_quickstart_k8s_validates_and_deploys_as_written(quickstart, tmp_path):
    path, plan = quickstart
    out = tmp_path / "k8s.yaml"
    res = run("export", path, "--format", "k8s", "-o", out, "--model-cache-pvc", "models", "--hf-token-secret", "hf")
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert f"input sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}" in text.splitlines()[1]
    docs = _docs(text)
    assert all(k8s_problems(d) == [] for d in docs), [k8s_problems(d) for d in docs]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert len(deployments) == len(plan["pools"]) >= 2
    gfd = {"A100-SXM-80GB": "NVIDIA-A100-SXM4-80GB", "H100-SXM-80GB": "NVIDIA-H100-80GB-HBM3"}
    for doc, pool in zip(deployments, plan["pools"]):
        assert doc["spec"]["replicas"] == pool["replicas"]
        pod = doc["spec"]["template"]["spec"]
        container = pod["containers"][0]
        gpus = str(pool["physical_gpus_per_replica"])
        assert container["resources"]["limits"] == {"nvidia.com/gpu": gpus} == container["resources"]["requests"]
        opts = _opts(container["args"])
        assert opts["--model"] == "meta-llama/Llama-3.1-70B"                   # catalogue hf_id, not a label
        assert int(opts["--max-model-len"]) == pool["max_tokens"]
        assert int(opts["--max-num-seqs"]) == pool["max_num_seqs"]
        assert opts["--tensor-parallel-size"] == gpus
        dtype = pool["profile"].split("/")[3]                                   # HARDWARE/MODEL/tpN/DTYPE
        expected = {"fp16": ("float16", None, None), "bf16": ("bfloat16", None, None), "fp8": ("auto", "fp8", "fp8")}
        assert (opts["--dtype"], opts.get("--quantization"), opts.get("--kv-cache-dtype")) == expected[dtype]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": gfd[pool["profile"].split("/")[0]]}
        assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "models"}} in pod["volumes"]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert {"name": "http", "containerPort": 8000} in container["ports"]
        token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
        assert token["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
        assert flag_problems(container["args"]) == []
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert services == {d["metadata"]["name"] for d in deployments}
    table = (tmp_path / "k8s.routes.tsv").read_text().splitlines()
    rows = [r.split("\t") for r in table if not r.startswith("#")]
    assert rows[0][:3] == ["min_tokens", "max_tokens", "service"]
    assert [(int(r[0]), int(r[1])) for r in rows[1:]] == [(p["min_tokens"], p["max_tokens"]) for p in plan["pools"]]
    assert all(r[2] in services and float(r[4]) == 1.0 for r in rows[1:])


def test_the_schema_check_rejects_broken_manifests(quickstart):
    """The validator is not vacuous: each broken field is reported."""
    path, _ = quickstart
    res = run("export", path, "--format", "k8s")
    doc = next(d for d in _docs(res.stdout) if d["kind"] == "Deployment")
    container = ["spec", "template", "spec", "containers", 0]

    def at(d, keys):
        for k in keys:
            d = d[k]
        return d

    for mutate, phrase in [(lambda d: d["spec"].update(replicas=1.5), "replicas"),
                           (lambda d: at(d, container)["resources"]["limits"].update({"nvidia.com/gpu": 8}),
                            "nvidia.com/gpu"),
                           (lambda d: at(d, container).update(gpus=8), "Additional properties"),
                           (lambda d: d["spec"]["selector"]["matchLabels"].update(x="y"), "does not match"),
                           (lambda d: at(d, container).pop("name"), "'name' is a required property"),
                           (lambda d: d.update(apiVersion="apps/v2"), "unknown apiVersion")]:
        broken = json.loads(json.dumps(doc))
        mutate(broken)
        assert any(phrase in e for e in k8s_problems(broken)), (phrase, k8s_problems(broken))


def test_quickstart_vllm_lines_use_real_ids_and_vllm_flags(quickstart, tmp_path):
    path, plan = quickstart
    out = tmp_path / "run.sh"
    res = run("export", path, "--format", "vllm", "-o", out)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm ")]
    assert len(lines) == len(plan["pools"])
    assert f"fleetopt {version('fleetopt')} export" in text.splitlines()[1]
    assert text.splitlines()[2].startswith(f"# input sha256 {hashlib.sha256(path.read_bytes()).hexdigest()};")
    for line, pool in zip(lines, plan["pools"]):
        words = shlex.split(line)
        assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
        assert flag_problems(words[3:]) == []
        opts = _opts(words[3:])
        assert int(opts["--max-model-len"]) == pool["max_tokens"]
        assert int(opts["--max-num-seqs"]) == pool["max_num_seqs"]
        assert int(opts["--tensor-parallel-size"]) == pool["physical_gpus_per_replica"]
        # vLLM refuses a token budget below the sequence cap; the computed profiles' chunk is 512 tokens
        assert int(opts["--max-num-batched-tokens"]) == max(512, pool["max_num_seqs"])


def test_tp8_fp8_and_multinode_plans_validate(tmp_path):
    """A TP=8 fp16 pool (one node), an fp8 pool (quantised weights and KV cache) and a TP=16 pool (two nodes: a
    LeaderWorkerSet of two 8-GPU pods)."""
    data = _plan(_pool(0, 4096, "h100x8", 2, 16, 300, "H100-SXM-80GB/Llama-3.1-70B/tp8/fp16"),
                 _pool(4096, 8192, "b200", 3, 24, 100, "B200-SXM/Llama-3.1-70B/tp8/fp8"),
                 _pool(8192, 131072, "h200", 1, 16, 8, "H200-SXM/Llama-3.1-405B/tp16/fp8", model="Llama-3.1-405B",
                       physical_gpus_per_replica=16))
    path = _write(tmp_path, data)
    res = run("export", path, "--format", "k8s")
    assert res.exit_code == 0, res.output
    docs = _docs(res.stdout)
    assert [k8s_problems(d) for d in docs] == [[] for _ in docs]
    work = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
    assert [d["kind"] for d in work] == ["Deployment", "Deployment", "LeaderWorkerSet"]
    args = [_serve_args(d) for d in work]
    assert all(flag_problems(a) == [] for a in args)
    fp16, fp8, big = (_opts(a) for a in args)
    assert (fp16["--dtype"], "--quantization" in fp16, "--kv-cache-dtype" in fp16) == ("float16", False, False)
    assert (fp8["--quantization"], fp8["--kv-cache-dtype"]) == ("fp8", "fp8")
    assert big["--model"] == "meta-llama/Llama-3.1-405B"
    assert (big["--tensor-parallel-size"], big["--pipeline-parallel-size"]) == ("8", "2")     # 16 GPUs = 2 nodes
    lws = work[2]["spec"]["leaderWorkerTemplate"]
    assert lws["size"] == 2 and work[2]["spec"]["replicas"] == 1
    for template in (lws["leaderTemplate"], lws["workerTemplate"]):
        pod = template["spec"]
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert work[1]["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-B200"}
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == work[2]["metadata"]["name"])
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_int4_needs_a_quantised_checkpoint(tmp_path):
    data = _plan(_pool(0, 8192, "h100", 2, 4, 64, "H100-SXM-80GB/Llama-3.1-70B/tp2/int4"))
    path = _write(tmp_path, data)
    res = run("export", path, "--format", "vllm")
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "pools[0].profile" in lines[0] and "AWQ" in lines[0]
    res = run("export", path, "--format", "vllm", "--model", "h100=org/Llama-3.1-70B-AWQ")
    assert res.exit_code == 0, res.output
    words = shlex.split(next(ln for ln in res.stdout.splitlines() if ln.startswith("vllm ")))
    assert words[2] == "org/Llama-3.1-70B-AWQ" and flag_problems(words[3:]) == []
    opts = _opts(words[3:])
    assert opts["--tensor-parallel-size"] == "2" and opts["--dtype"] == "float16" and "--quantization" not in opts


@pytest.mark.parametrize("fmt", ["vllm", "k8s"])
def test_a_pool_without_a_model_id_is_refused(tmp_path, fmt):
    data = _plan(_pool(0, 4096, "a100", 1, 8, 64, "A100-80GB", model="Llama-3-70B-class (TP=8 unit)"))
    path = _write(tmp_path, data)
    res = run("export", path, "--format", fmt)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith(f"error: {path}: pools[0].model: ") and "--model a100=ORG/NAME" in lines[0]
    assert run("export", path, "--format", fmt, "--model", "org/m").exit_code == 0


def test_prefill_and_decode_pools_get_kv_transfer_roles(tmp_path):
    data = _plan(_pool(0, 8192, "h100", 2, 16, 64, "H100-SXM-80GB/Llama-3.1-70B/tp8/fp16", phase="prefill"),
                 _pool(0, 8192, "h100d", 4, 32, 256, "H100-SXM-80GB/Llama-3.1-70B/tp8/fp16", phase="decode"),
                 _pool(8192, 32768, "h200", 1, 8, 32, "H200-SXM/Llama-3.1-70B/tp8/fp16", phase="both"))
    path = _write(tmp_path, data)
    res = run("export", path, "--format", "vllm", "--kv-connector", "P2pNcclConnector")
    assert res.exit_code == 0, res.output
    lines = [shlex.split(ln) for ln in res.stdout.splitlines() if ln.startswith("vllm ")]
    roles = []
    for words in lines:
        assert flag_problems(words[3:]) == []
        config = _opts(words[3:]).get("--kv-transfer-config")
        roles.append(json.loads(config) if config else None)
    assert roles == [{"kv_connector": "P2pNcclConnector", "kv_role": "kv_producer"},
                     {"kv_connector": "P2pNcclConnector", "kv_role": "kv_consumer"}, None]
    table = tmp_path / "routes.tsv"
    k8s = run("export", path, "--format", "k8s", "--router-table", table)
    assert [k8s_problems(d) for d in _docs(k8s.stdout)] == [[] for _ in _docs(k8s.stdout)]
    rows = [r.split("\t") for r in table.read_text().splitlines() if not r.startswith("#")][1:]
    assert [(r[0], r[1], r[2], r[5]) for r in rows] == [("0", "8192", "gen-pool1-h100", "prefill"),
                                                        ("8192", "32768", "gen-pool3-h200", "both")]
    # the pair's band enters at its prefill pool; its decode pool is where a P/D proxy sends the request next
    assert [r[-1] for r in rows] == ["http://gen-pool2-h100d:8000/v1", ""]
    assert "pools 1 and 2 are a prefill/decode pair on 0-8,192 tokens" in k8s.stderr
    assert "a P/D proxy must stand" in k8s.stderr and "fleetopt writes no proxy" in k8s.stderr
    bad = _write(tmp_path, _plan(_pool(0, 10, "a", 1, 1, 4, "H100-SXM-80GB/Llama-3.1-70B/tp1/fp8", phase="mixed")),
                 "bad.json")
    res = run("export", bad, "--format", "vllm")
    assert res.exit_code == 2 and "pools[0].phase: 'mixed' is not allowed; give one of both, prefill, decode" \
        in res.output


def test_split_plan_router_files(tmp_path):
    """Band (2048, 8192] carries 1 + 3 req/s: weights 1/4 and 3/4 in the table; the Semantic Router config has a
    context signal and a decision per band naming the band's pools."""
    data = _plan(_pool(0, 8192, "a", 1, 1, 64, "H100-SXM-80GB/Llama-3.1-8B/tp1/bf16", model="Llama-3.1-8B"),
                 _pool(2048, 65536, "b", 2, 2, 16, "H100-SXM-80GB/Llama-3.1-8B/tp1/bf16", model="Llama-3.1-8B"),
                 instance="split", routing={"boundaries_tokens": [0, 2048, 8192, 65536],
                                            "rate_req_per_s": [[3.0, 0.0], [1.0, 3.0], [0.0, 0.5]]})
    table, router = tmp_path / "routes.tsv", tmp_path / "router.yaml"
    res = run("export", _write(tmp_path, data), "--format", "k8s", "--router", router, "--router-table", table)
    assert res.exit_code == 0, res.output
    rows = [r.split("\t") for r in table.read_text().splitlines() if not r.startswith("#")][1:]
    assert [(int(r[0]), int(r[1]), r[2], float(r[4])) for r in rows] == [
        (0, 2048, "split-pool1-a", 1.0), (2048, 8192, "split-pool1-a", 0.25), (2048, 8192, "split-pool2-b", 0.75),
        (8192, 65536, "split-pool2-b", 1.0)]
    config = yaml.safe_load(router.read_text())
    assert [(s["min_tokens"], s["max_tokens"]) for s in config["signals"]["context"]] == [
        ("0", "2048"), ("2048", "8192"), ("8192", "65536")]
    assert [[m["model"] for m in d["modelRefs"]] for d in config["decisions"]] == [
        ["split-pool1-a"], ["split-pool1-a", "split-pool2-b"], ["split-pool2-b"]]
    assert all(d["rules"]["conditions"] == [{"type": "context", "name": s["name"]}]
               for d, s in zip(config["decisions"], config["signals"]["context"]))
    assert {e["name"] for e in config["vllm_endpoints"]} == set(config["model_config"]) == {
        "split-pool1-a", "split-pool2-b"}


def test_router_stream_is_never_mixed_with_the_script(quickstart):
    path, _ = quickstart
    res = run("export", path, "--format", "vllm", "--router", "-")
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "stdout" in lines[0], res.output
    res = run("export", path, "--format", "vllm", "-o", "/dev/null", "--router", "-")
    assert res.exit_code == 0 and "vllm serve" not in res.stdout and "decisions:" in res.stdout


def test_output_folder_files_and_modes(quickstart, tmp_path):
    path, _ = quickstart
    old = os.umask(0o022)
    try:
        res = run("export", path, "--format", "vllm", "-o", tmp_path)
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    modes = {f: stat.S_IMODE((tmp_path / f).stat().st_mode) for f in ("vllm.sh", "router.yaml", "routes.tsv")}
    assert modes == {"vllm.sh": 0o755, "router.yaml": 0o644, "routes.tsv": 0o644}
    assert (tmp_path / "vllm.sh").read_text().startswith("#!/bin/sh")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert all(digest in (tmp_path / f).read_text() for f in modes)
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
