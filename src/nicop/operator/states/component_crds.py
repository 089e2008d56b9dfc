"""CRDs a component's own image needs and upstream's operator installs with it, for kinds nicop
has no model of: structural, with the group, version, kind, plural and scope upstream ships,
and a `spec` (and `status`) the API server keeps as given (x-kubernetes-preserve-unknown-fields).
Validation of their content is the component's own business."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, metadata

_OPEN_OBJECT: Obj = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def preserved_crd(ctx: Context, group: str, version: str, kind: str, plural: str) -> Obj:
    """A namespaced CRD for `kind` whose spec and status hold anything."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata(ctx, f"{plural}.{group}", namespaced=False),
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural,
                      "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [{
                "name": version, "served": True, "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": _OPEN_OBJECT, "status": _OPEN_OBJECT}}},
            }],
        },
    }
