"""``fleetopt export RESULT.json --format vllm|k8s [-o FILE|DIR]``: deployment files from a solve's JSON.

The plan (the selected one, or ``--plan N`` of ``solutions``) is read and checked by
:func:`fleetopt.optimizer.output.export.read_plan`; the files are rendered by :mod:`fleetopt.optimizer.output.export`
(docs/export.md). Three outputs, each its own stream:

* the main file: the vLLM script (mode 0755) or the Kubernetes YAML; stdout without ``-o``;
* the router configuration (the vLLM Semantic Router's ``config.yaml``): ``--router FILE|-``;
* the plain route table (tab-separated): ``--router-table FILE|-``.

``-o DIR`` (an existing folder) writes ``vllm.sh`` or ``k8s.yaml``, ``router.yaml`` and ``routes.tsv`` into it;
``-o FILE`` writes FILE and the router files beside it as ``FILE-STEM.router.yaml`` and ``FILE-STEM.routes.tsv``.
At most one output may be ``-`` (stdout). Every file is written atomically (0644; the script 0755) and never over
RESULT.json. Exit codes: 0, 2 for a bad RESULT file or option (one line), 1 internal error.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from fleetopt.optimizer.commands import guard
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.output.export import (DEFAULT_HF_TOKEN_SECRET, DEFAULT_IMAGE, DEFAULT_KV_CONNECTOR, FORMATS,
                                          GPU_LABEL, GPUS_PER_NODE, header_lines, k8s_documents, read_plan,
                                          route_table, semantic_router_text, vllm_script, write_text,
                                          yaml_documents)
from fleetopt.optimizer.output.writes import SCRIPT_MODE, TEXT_MODE

__all__ = ["export"]


_MAIN_FILE = {"vllm": "vllm.sh", "k8s": "k8s.yaml"}


def _models(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--model GPU=HF_ID`` (or a bare ``HF_ID`` for every pool) as a mapping; a malformed one is one line."""
    out = {}
    for text in pairs:
        gpu, sep, model = text.partition("=")
        gpu, model = (gpu.strip(), model.strip()) if sep else ("*", text.strip())
        if not gpu or not model:
            raise InstanceError(f"--model {text!r}: give GPU=ORG/NAME (a GPU option of the plan) or ORG/NAME")
        out[gpu] = model
    return out


def _targets(output: str | None, router: str | None, table: str | None, fmt: str):
    """Where the main file, the router configuration and the route table go ('-' = stdout; None = not written)."""
    if output is None:
        return "-", router, table
    path = Path(output)
    if output.endswith(("/", os.sep)) and not path.is_dir():
        raise InstanceError(f"-o: {output}: folder {output} does not exist; create it or give a file name")
    if path.is_dir():
        return str(path / _MAIN_FILE[fmt]), router or str(path / "router.yaml"), table or str(path / "routes.tsv")
    return (output, router or str(path.with_name(f"{path.stem}.router.yaml")),
            table or str(path.with_name(f"{path.stem}.routes.tsv")))


def _check_targets(targets: list[tuple[str, str | None]]) -> None:
    """At most one output on stdout, no two outputs in one file."""
    stdout = [flag for flag, t in targets if t == "-"]
    if len(stdout) > 1:
        raise InstanceError(f"{stdout[1]} -: {' and '.join(stdout)} would both write to stdout; give "
                            f"{stdout[1]} a file (or -o FILE|DIR for the main file)")
    seen = {}
    for flag, t in targets:
        if t in (None, "-"):
            continue
        key = Path(t).resolve()
        if key in seen:
            raise InstanceError(f"{flag}: {t}: the same file as {seen[key]}; give another")
        seen[key] = flag


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("result", type=click.Path(dir_okay=True))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="vllm: one 'vllm serve' line per pool; k8s: Deployments (LeaderWorkerSets for replicas wider "
                   "than a node), Services and a router ConfigMap.")
@click.option("-o", "--output", metavar="FILE|DIR", help="Write here (atomically) instead of stdout; a folder gets "
              "vllm.sh or k8s.yaml, router.yaml and routes.tsv.")
@click.option("--router", metavar="FILE|-", help="Write the vLLM Semantic Router configuration (token-count "
              "routes) here ('-' = stdout).")
@click.option("--router-table", "table", metavar="FILE|-", help="Write the plain route table (tab-separated, for "
              "any router) here ('-' = stdout).")
@click.option("--plan", "plan", type=click.IntRange(1), help="Export solutions[N-1] (solve --top N) instead of the "
              "selected plan.")
@click.option("--model", "models", multiple=True, metavar="GPU=HF_ID",
              help="Model to serve on a GPU option's pools (a bare HF_ID: every pool); default the catalogue's "
              "Hugging Face id. Required for int4 pools (a pre-quantised AWQ/GPTQ checkpoint).")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Container image (k8s).")
@click.option("--gpu-label", default=GPU_LABEL, show_default=True, metavar="KEY",
              help="Node label key the GPU's product name is selected on (GPU feature discovery's); '' for none.")
@click.option("--hf-token-secret", default=DEFAULT_HF_TOKEN_SECRET, show_default=True, metavar="NAME",
              help="Secret holding the Hugging Face token under the key 'token' (k8s).")
@click.option("--model-cache-pvc", metavar="NAME", help="PersistentVolumeClaim to keep the Hugging Face cache on "
              "(k8s); without it every pod downloads the weights.")
@click.option("--kv-connector", default=DEFAULT_KV_CONNECTOR, show_default=True, metavar="NAME",
              help="vLLM KV connector of prefill/decode pools (plans with a phase per pool).")
@click.option("--gpus-per-node", type=click.IntRange(1), default=GPUS_PER_NODE, show_default=True,
              help="GPUs of one node: a replica needing more is a LeaderWorkerSet spanning nodes (k8s).")
@click.option("--name", help="Prefix of the Kubernetes names (default: the instance's name).")
@guard
def export(result, fmt, output, router, table, plan, models, image, gpu_label, hf_token_secret, model_cache_pvc,
           kv_connector, gpus_per_node, name):
    """Deployment files (vLLM command lines or Kubernetes manifests) for the plan in RESULT (solve --json)."""
    main_target, router_target, table_target = _targets(output, router, table, fmt)
    _check_targets([("-o", main_target), ("--router", router_target), ("--router-table", table_target)])
    exported = read_plan(result, plan, _models(models), name)
    if fmt == "vllm":
        main_text = vllm_script(exported, kv_connector)
    else:
        docs = k8s_documents(exported, image, gpu_label or None, hf_token_secret=hf_token_secret,
                             model_cache_pvc=model_cache_pvc, kv_connector=kv_connector,
                             gpus_per_node=gpus_per_node)
        main_text = "\n".join(header_lines(exported, "Kubernetes manifests")) + "\n" + yaml_documents(docs)
    protect = (Path(result),)
    write_text(main_text, main_target, protect, "-o", SCRIPT_MODE if fmt == "vllm" else TEXT_MODE)
    if router_target is not None:
        write_text(semantic_router_text(exported), router_target, protect, "--router")
    if table_target is not None:
        write_text(route_table(exported), table_target, protect, "--router-table")
    for warning in exported.warnings:
        click.echo(f"warning: {warning}", err=True)
    written = [t for t in (main_target, router_target, table_target) if t not in (None, "-")]
    if written:
        click.echo(f"{exported.plan} of {result}: {len(exported.pools)} pool(s), {exported.policy} routing -> "
                   + ", ".join(written), err=True)
