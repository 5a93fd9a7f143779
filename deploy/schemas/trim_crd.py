"""Trim an operator's CRD to the JSON Schema that checks this folder's manifest offline.

A CRD's ``openAPIV3Schema`` holds the whole Kubernetes PodSpec (half a megabyte); the
manifests use a few dozen fields. The trimmed schema keeps, from one CRD version:

- full depth along the fields the manifest uses (``KEEP`` below), with their types,
  bounds, enums and required lists;
- every other field by name and type only (so a correct name passes, a misspelt one not);
- unknown fields rejected (``additionalProperties: false``), as the API server's strict
  field validation (kubectl's default) rejects them;
- ``apiVersion`` and ``kind`` fixed to the CRD's (the API server routes by them);
- no descriptions, defaults or CEL rules (the API server's, not a schema's, to check).

Run it again when moving to another release of the operator, e.g.:

    crd=manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml
    git -C trainer show v2.3.0:$crd > /tmp/trainjobs.yaml
    python deploy/schemas/trim_crd.py trainjob /tmp/trainjobs.yaml "kubeflow/trainer v2.3.0, $crd"
"""
import json
import sys
from pathlib import Path

import yaml

ALL = True  # keep this field's whole subtree
# The fields each manifest uses: {field: ALL | {field: ...}}; "*" stands for a map's values
# (additionalProperties); an array's keep-tree applies to its items.
CONTAINER = {"name": ALL, "image": ALL, "command": ALL, "args": ALL,
             "env": {"name": ALL, "value": ALL}, "resources": {"limits": ALL, "requests": ALL},
             "volumeMounts": ALL}
POD_VOLUMES = {"name": ALL, "persistentVolumeClaim": ALL}
KEEP = {
    "trainjob": ("v1alpha1", "trainjob.schema.json", {
        "apiVersion": ALL, "kind": ALL, "metadata": ALL,
        "spec": {
            "runtimeRef": ALL,
            "trainer": {"image": ALL, "command": ALL, "args": ALL, "numNodes": ALL,
                        "numProcPerNode": ALL, "env": {"name": ALL, "value": ALL},
                        "resourcesPerNode": {"limits": ALL, "requests": ALL}},
            "runtimePatches": {"manager": ALL, "trainingRuntimeSpec": {"template": {"spec": {
                "replicatedJobs": {"name": ALL, "template": {"spec": {"template": {"spec": {
                    "volumes": POD_VOLUMES,
                    "containers": {"name": ALL, "volumeMounts": ALL}}}}}}}}}},
        }}),
    "pytorchjob": ("v1", "pytorchjob.schema.json", {
        "apiVersion": ALL, "kind": ALL, "metadata": ALL,
        "spec": {
            "elasticPolicy": {"rdzvBackend": ALL, "minReplicas": ALL, "maxReplicas": ALL,
                              "maxRestarts": ALL, "rdzvConf": ALL},
            "nprocPerNode": ALL,
            "pytorchReplicaSpecs": {"*": {"replicas": ALL, "restartPolicy": ALL, "template": {
                "spec": {"containers": CONTAINER, "volumes": POD_VOLUMES}}}},
        }}),
}
# OpenAPI keywords that mean the same in JSON Schema and constrain a value.
CHECKED = ("type", "enum", "format", "minimum", "maximum", "minLength", "maxLength",
           "pattern", "minItems", "maxItems", "required")


def shallow(schema):
    """A field the manifest does not use: its type only."""
    if schema.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    return {"type": schema["type"]} if "type" in schema else {}


def trim(schema, keep):
    """``schema`` kept to the depth ``keep`` asks for (ALL: everything below)."""
    if schema.get("x-kubernetes-int-or-string"):
        return shallow(schema)
    out = {k: schema[k] for k in CHECKED if k in schema}
    if "items" in schema:
        out["items"] = trim(schema["items"], keep)
    if isinstance(schema.get("additionalProperties"), dict):
        values = keep if keep is ALL else keep.get("*")
        out["additionalProperties"] = (trim(schema["additionalProperties"], values)
                                       if values else shallow(schema["additionalProperties"]))
    if "properties" in schema:
        unknown = set() if keep is ALL else set(keep) - set(schema["properties"]) - {"*"}
        if unknown:  # this release of the CRD has no such field: the manifest needs a change
            raise SystemExit(f"not in the CRD: {', '.join(sorted(unknown))}")
        out["properties"] = {
            name: trim(sub, ALL if keep is ALL else keep[name]) if keep is ALL or name in keep
            else shallow(sub)
            for name, sub in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


def main(kind, crd_path, source):
    version, name, keep = KEEP[kind]
    crd = yaml.safe_load(Path(crd_path).read_text())
    served = {v["name"]: v for v in crd["spec"]["versions"]}
    schema = trim(served[version]["schema"]["openAPIV3Schema"], keep)
    kind_name = crd["spec"]["names"]["kind"]
    schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{version}"}
    schema["properties"]["kind"] = {"const": kind_name}
    schema["required"] = ["apiVersion", "kind", *schema.get("required", [])]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"{kind_name} {crd['spec']['group']}/{version}: trimmed by "
                    f"deploy/schemas/trim_crd.py from the CRD in {source}. Full depth only "
                    f"for the fields the manifest uses; other fields by name and type.",
        **schema,
    }
    out = Path(__file__).with_name(name)
    out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:])
