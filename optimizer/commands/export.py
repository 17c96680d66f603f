"""``fleetopt export RESULT.json --format vllm|k8s [-o FILE|DIR]``: deployment files from a solve's JSON.

The plan (the selected one, or ``--plan N`` of ``solutions``) is read and checked by
:func:`fleetopt.optimizer.output.export.read_plan`; the files are rendered by :mod:`fleetopt.optimizer.output.export`
(docs/export.md). Output: without ``-o`` the vLLM script or the Kubernetes YAML on stdout; ``-o DIR`` (an existing
folder) writes ``vllm.sh`` or ``k8s.yaml`` and ``router.yaml`` into it; ``-o FILE`` writes FILE and the router
configuration beside it as ``FILE-STEM.router.yaml``; ``--router FILE|-`` puts the router configuration elsewhere.
Every file is written atomically and never over RESULT.json. Exit codes: 0, 2 for a bad RESULT file or option
(one line), 1 internal error.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from fleetopt.optimizer.commands import guard
from fleetopt.optimizer.errors import InstanceError
from fleetopt.optimizer.output.export import (DEFAULT_IMAGE, FORMATS, k8s_documents, read_plan, router_config,
                                          vllm_script, write_text, yaml_documents)
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


def _targets(output: str | None, router: str | None, fmt: str) -> tuple[str, str | None]:
    """Where the main file and the router configuration go ('-' = stdout; None = not written)."""
    if output is None:
        return "-", router
    path = Path(output)
    if output.endswith(("/", os.sep)) and not path.is_dir():
        raise InstanceError(f"-o: {output}: folder {output} does not exist; create it or give a file name")
    if path.is_dir():
        return str(path / _MAIN_FILE[fmt]), router or str(path / "router.yaml")
    return output, router or str(path.with_name(f"{path.stem}.router.yaml"))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("result", type=click.Path(dir_okay=True))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="vllm: one 'vllm serve' line per pool; k8s: apps/v1 Deployments, Services and a router ConfigMap.")
@click.option("-o", "--output", metavar="FILE|DIR", help="Write here (atomically) instead of stdout; a folder gets "
              "vllm.sh or k8s.yaml and router.yaml.")
@click.option("--router", metavar="FILE", help="Write the router configuration here ('-' = stdout).")
@click.option("--plan", "plan", type=click.IntRange(1), help="Export solutions[N-1] (solve --top N) instead of the "
              "selected plan.")
@click.option("--model", "models", multiple=True, metavar="GPU=HF_ID",
              help="Model to serve on a GPU option's pools (a bare HF_ID: every pool); default the catalogue's "
              "Hugging Face id.")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Container image (k8s).")
@click.option("--gpu-label", metavar="KEY", help="Node label key to select the GPU type on (k8s nodeSelector); "
              "without it the type is an annotation only.")
@click.option("--name", help="Prefix of the Kubernetes names (default: the instance's name).")
@guard
def export(result, fmt, output, router, plan, models, image, gpu_label, name):
    """Deployment files (vLLM command lines or Kubernetes manifests) for the plan in RESULT (solve --json)."""
    exported = read_plan(result, plan, _models(models), name)
    main_text = vllm_script(exported) if fmt == "vllm" else yaml_documents(k8s_documents(exported, image, gpu_label))
    main_target, router_target = _targets(output, router, fmt)
    protect = (Path(result),)
    if router_target is not None and router_target != "-" and main_target != "-" \
            and Path(router_target).resolve() == Path(main_target).resolve():
        raise InstanceError(f"--router: {router_target}: the same file as -o; give another")
    write_text(main_text, main_target, protect, "-o", SCRIPT_MODE if fmt == "vllm" else TEXT_MODE)
    if router_target is not None:
        write_text(yaml_documents([router_config(exported)]), router_target, protect, "--router")
    for warning in exported.warnings:
        click.echo(f"warning: {warning}", err=True)
    written = [t for t in (main_target, router_target) if t not in (None, "-")]
    if written:
        click.echo(f"{exported.plan} of {result}: {len(exported.pools)} pool(s), {exported.policy} routing -> "
                   + ", ".join(written), err=True)
