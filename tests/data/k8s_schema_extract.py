"""Rebuild tests/data/k8s_schema.json: the Kubernetes schema subset tests/test_export.py validates exports against.

Usage: python k8s_schema_extract.py SWAGGER.json LWS_CRD.yaml COMMENT OUT.json, with SWAGGER.json the Kubernetes
OpenAPI v2 document (kubernetes-client/python kubernetes/swagger.json.unprocessed, from kubernetes/kubernetes
api/openapi-spec/swagger.json) and LWS_CRD.yaml kubernetes-sigs/lws config/crd/bases/
leaderworkerset.x-k8s.io_leaderworkersets.yaml. Keeps the definitions reachable from Deployment, Service, ConfigMap
and PodTemplateSpec; drops descriptions and x-kubernetes-* annotations; int-or-string becomes string or integer;
every object with properties gets additionalProperties false (an unknown field is an error, as under kubectl's
strict field validation); the LeaderWorkerSet's two pod templates refer to core/v1 PodTemplateSpec.
"""
import json
import sys

import yaml

sw = json.load(open(sys.argv[1]))
crd = yaml.safe_load(open(sys.argv[2]))
defs = sw["definitions"]
DROP = {"description", "x-kubernetes-group-version-kind", "x-kubernetes-list-map-keys", "x-kubernetes-list-type",
        "x-kubernetes-patch-merge-key", "x-kubernetes-patch-strategy", "x-kubernetes-map-type", "x-kubernetes-unions",
        "x-kubernetes-preserve-unknown-fields", "x-kubernetes-validations", "format", "x-kubernetes-embedded-resource"}
INT_OR_STRING = {"oneOf": [{"type": "string"}, {"type": "integer"}]}


def clean(node):
    if isinstance(node, dict):
        if node.get("format") == "int-or-string" or node.get("x-kubernetes-int-or-string"):
            return dict(INT_OR_STRING)
        out = {k: clean(v) for k, v in node.items() if k not in DROP and k != "x-kubernetes-int-or-string"}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False          # strict: unknown fields are errors (kubectl --validate=strict)
        return out
    if isinstance(node, list):
        return [clean(v) for v in node]
    return node


def refs(node, found):
    if isinstance(node, dict):
        r = node.get("$ref")
        if r:
            found.add(r.split("/")[-1])
        for v in node.values():
            refs(v, found)
    elif isinstance(node, list):
        for v in node:
            refs(v, found)


roots = ["io.k8s.api.apps.v1.Deployment", "io.k8s.api.core.v1.Service", "io.k8s.api.core.v1.ConfigMap",
         "io.k8s.api.core.v1.PodTemplateSpec"]
keep, todo = set(), list(roots)
while todo:
    name = todo.pop()
    if name in keep:
        continue
    keep.add(name)
    found = set()
    refs(defs[name], found)
    todo.extend(found - keep)
out = {name: clean(defs[name]) for name in sorted(keep)}
for name, (group, version, kind) in {"io.k8s.api.apps.v1.Deployment": ("apps", "v1", "Deployment"),
                                      "io.k8s.api.core.v1.Service": ("", "v1", "Service"),
                                      "io.k8s.api.core.v1.ConfigMap": ("", "v1", "ConfigMap")}.items():
    out[name]["required"] = sorted(set(out[name].get("required", [])) | {"apiVersion", "kind", "metadata"})
    out[name]["properties"]["apiVersion"] = {"enum": [f"{group}/{version}" if group else version]}
    out[name]["properties"]["kind"] = {"enum": [kind]}
ver = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
lws = clean(ver["schema"]["openAPIV3Schema"])
lwt = lws["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
for key in ("leaderTemplate", "workerTemplate"):
    lwt[key] = {"$ref": "#/definitions/io.k8s.api.core.v1.PodTemplateSpec"}
lws["properties"]["metadata"] = {"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}
lws["properties"].pop("status", None)
lws["required"] = ["apiVersion", "kind", "metadata", "spec"]
lws["properties"]["apiVersion"] = {"enum": ["leaderworkerset.x-k8s.io/v1"]}
lws["properties"]["kind"] = {"enum": ["LeaderWorkerSet"]}
out["io.x-k8s.leaderworkerset.v1.LeaderWorkerSet"] = lws
doc = {"$comment": sys.argv[3], "definitions": out}
json.dump(doc, open(sys.argv[4], "w"), separators=(",", ":"), sort_keys=True)
print(len(out), "definitions")
