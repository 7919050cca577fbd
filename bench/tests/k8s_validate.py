#!/usr/bin/env python3
"""Validate Kubernetes manifests offline.

Core kinds against Kubernetes' own JSON schemas (PyPI kubernetes-validate, strict: unknown
fields are errors, as `kubectl apply` makes them); Volcano, Kueue, JobSet and MPI Operator
kinds against the openAPIV3Schema of the upstream CRDs in --crds (made strict the same way:
an object schema without additionalProperties or x-kubernetes-preserve-unknown-fields
accepts no other field). A ConfigMap key ending in .yaml that holds manifests (the nightly's
job template) is validated too, with @RUN@ replaced by a time stamp. Volcano Jobs also get
the checks of Volcano's admission policy and webhook that a schema cannot express.

  k8s_validate.py --crds DIR FILE...        exit 0: all valid; 1: errors (listed); 2: usage
Lines starting with "skip:" say what could not be checked here and why.
"""

import argparse
import copy
import glob
import os
import re
import sys

try:
    import yaml
except ImportError:  # pragma: no cover
    print("skip: PyYAML is not installed (apt-get install python3-yaml)")
    sys.exit(0)
try:
    import jsonschema
except ImportError:  # pragma: no cover
    jsonschema = None
try:
    import kubernetes_validate
except ImportError:  # pragma: no cover
    kubernetes_validate = None

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
VOLCANO_EVENTS = {"*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted",
                  "TaskFailed", "JobUpdated"}
VOLCANO_ACTIONS = {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition",
                   "TerminateJob", "CompleteJob", "ResumeJob"}


def strict(schema):
    """The schema with additionalProperties: false wherever Kubernetes would prune."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def load_crds(root):
    """{(group/version, kind): schema}"""
    crds = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "*.yaml"), recursive=True)):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                spec = doc["spec"]
                for v in spec.get("versions", []):
                    schema = (v.get("schema") or {}).get("openAPIV3Schema")
                    if schema and v.get("served", True):
                        key = (f"{spec['group']}/{v['name']}", spec["names"]["kind"])
                        crds[key] = strict(schema)
    return crds


def volcano_checks(doc):
    """What Volcano's ValidatingAdmissionPolicy and webhook refuse, beyond the schema."""
    errs = []
    name = doc.get("metadata", {}).get("name", "")
    spec = doc.get("spec", {})
    tasks = spec.get("tasks", [])
    if not tasks:
        errs.append("no tasks")
    total = 0
    names = set()
    for t in tasks:
        tn = t.get("name", "")
        if not DNS_LABEL.match(tn):
            errs.append(f"task name {tn!r} is not a DNS-1123 label")
        if tn in names:
            errs.append(f"duplicate task name {tn!r}")
        names.add(tn)
        replicas = t.get("replicas", 0)
        total += replicas
        if t.get("minAvailable", replicas) > replicas:
            errs.append(f"task {tn}: minAvailable over replicas")
        longest = f"{name}-{tn}-{max(replicas - 1, 0)}"
        if len(longest) > 63 and "@RUN@" not in name:
            errs.append(f"pod name {longest} over 63 characters")
        errs += policy_checks(t.get("policies", []), f"task {tn}")
    if spec.get("minAvailable", 0) > total:
        errs.append(f"minAvailable {spec.get('minAvailable')} over the {total} replicas")
    errs += policy_checks(spec.get("policies", []), "job")
    plugins = spec.get("plugins", {}) or {}
    if "mpi" in plugins and "master" not in names:
        errs.append("the mpi plugin needs a master task")
    if "pytorch" in plugins:
        master = next((a.split("=", 1)[1] for a in plugins["pytorch"] if a.startswith("--master=")),
                      "master")
        if master not in names:
            errs.append(f"the pytorch plugin's master task {master!r} is missing")
    nt = spec.get("networkTopology")
    if nt and "highestTierAllowed" in nt and "highestTierName" in nt:
        errs.append("networkTopology: highestTierAllowed and highestTierName exclude each other")
    return errs


def policy_checks(policies, where):
    errs = []
    seen = set()
    for p in policies:
        ev = ([p["event"]] if "event" in p else []) + list(p.get("events", []))
        if ev and "exitCode" in p:
            errs.append(f"{where}: a policy has both event and exitCode")
        if not ev and "exitCode" not in p:
            errs.append(f"{where}: a policy needs an event or an exitCode")
        if p.get("exitCode") == 0:
            errs.append(f"{where}: exitCode 0 is not allowed")
        for e in ev:
            if e not in VOLCANO_EVENTS:
                errs.append(f"{where}: unknown event {e}")
            if e in seen:
                errs.append(f"{where}: duplicate event {e}")
            seen.add(e)
        if "*" in seen and len(seen) > 1:
            errs.append(f"{where}: event * excludes the others")
        if p.get("action") not in VOLCANO_ACTIONS:
            errs.append(f"{where}: unknown action {p.get('action')}")
    return errs


def validate_doc(doc, where, crds, version, skipped, counts):
    kind = doc.get("kind")
    api = doc.get("apiVersion", "")
    name = (doc.get("metadata") or {}).get("name", "?")
    label = f"{where}: {kind} {name}"
    errs = []
    if (api, kind) in crds:
        if jsonschema is None:
            skipped.add("CRD kinds: python3 jsonschema is not installed")
            return []
        v = jsonschema.Draft7Validator(crds[(api, kind)])
        for e in sorted(v.iter_errors(doc), key=lambda e: list(e.path)):
            path = "/".join(str(p) for p in e.path)
            errs.append(f"{label}: {path}: {e.message}")
        if api.startswith("batch.volcano.sh/") and kind == "Job":
            errs += [f"{label}: {e}" for e in volcano_checks(doc)]
        counts["crd"] += 1
    elif "." in api.split("/")[0] and api.split("/")[0] not in (
            "rbac.authorization.k8s.io", "batch", "apps", "networking.k8s.io",
            "scheduling.k8s.io", "policy", "storage.k8s.io", "autoscaling"):
        errs.append(f"{label}: no CRD for {api} {kind} in --crds and not a core kind")
    elif kubernetes_validate is None:
        skipped.add("core kinds: PyPI kubernetes-validate is not installed "
                    "(pip install kubernetes-validate)")
    else:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            counts["core"] += 1
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            errs.append(f"{label}: {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            errs.append(f"{label}: no schema: {e}")
    if kind == "ConfigMap":
        for key, text in (doc.get("data") or {}).items():
            if key.endswith(".yaml"):
                text = text.replace("@RUN@", "20260101-020000")
                for i, inner in enumerate(yaml.safe_load_all(text)):
                    if inner:
                        errs += validate_doc(inner, f"{label} data[{key}] #{i}", crds, version,
                                             skipped, counts)
    return errs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--crds", required=True)
    ap.add_argument("--k8s-version", default=None)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    crds = load_crds(a.crds)
    if not crds:
        print(f"no CRDs under {a.crds}", file=sys.stderr)
        return 2
    version = a.k8s_version or (kubernetes_validate.latest_version() if kubernetes_validate else "")
    skipped = set()
    counts = {"core": 0, "crd": 0}
    errs = []
    for path in a.files:
        with open(path) as f:
            try:
                docs = list(yaml.safe_load_all(f))
            except yaml.YAMLError as e:
                errs.append(f"{path}: not YAML: {e}")
                continue
        for i, doc in enumerate(docs):
            if doc is None:
                continue
            if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
                errs.append(f"{path} #{i}: not a Kubernetes object")
                continue
            errs += validate_doc(doc, f"{path} #{i}", crds, version, skipped, counts)
    for s in sorted(skipped):
        print(f"skip: {s}")
    print(f"validated {counts['core']} core and {counts['crd']} custom objects "
          f"(Kubernetes {version or '-'}, {len(crds)} CRD versions)")
    for e in errs:
        print(f"error: {e}")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
