#!/usr/bin/env python3
"""Resolve a kustomization without kustomize: every resource, patch and component it names
exists (recursing into directories) and every YAML file parses. The fallback of
bench/tests/k8s.rs where kubectl is absent.  k8s_kustomize_check.py DIR"""

import os
import sys

import yaml


def check(d, seen, errs):
    d = os.path.normpath(d)
    if d in seen:
        return
    seen.add(d)
    path = os.path.join(d, "kustomization.yaml")
    if not os.path.isfile(path):
        errs.append(f"{d}: no kustomization.yaml")
        return
    with open(path) as f:
        k = yaml.safe_load(f) or {}
    if k.get("kind") not in ("Kustomization", "Component"):
        errs.append(f"{path}: kind {k.get('kind')!r}")
    refs = list(k.get("resources", [])) + list(k.get("components", []))
    refs += [p["path"] for p in k.get("patches", []) if isinstance(p, dict) and "path" in p]
    for r in refs:
        full = os.path.join(d, r)
        if os.path.isdir(full):
            check(full, seen, errs)
        elif os.path.isfile(full):
            with open(full) as f:
                try:
                    list(yaml.safe_load_all(f))
                except yaml.YAMLError as e:
                    errs.append(f"{full}: {e}")
        else:
            errs.append(f"{path}: {r} does not exist")


errs = []
check(sys.argv[1], set(), errs)
for e in errs:
    print(e)
sys.exit(1 if errs else 0)
