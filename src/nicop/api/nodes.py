"""Which nodes nicop manages, and what they say about it.

A node is managed when Node Feature Discovery found a Mellanox NIC
(`feature.node.kubernetes.io/pci-15b3.present=true`) or an admin opted it in
(`nvidia.com/network-operator=true`); `nvidia.com/network-operator=false` opts it out. A node
whose NFD labels name the Mellanox vendor together with a PCI class (NFD's default
`deviceLabelFields`) has the NIC but not the label the operator relies on: that is the most
common reason a policy stays notReady, so it is reported by name.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nicop.api.labels import IPAM_USAGE_ANNOTATION, MELLANOX_LABEL, OPT_IN_LABEL

Obj = dict[str, Any]

CLASS_VENDOR_LABEL = re.compile(r"^feature\.node\.kubernetes\.io/pci-[0-9a-f]{4}_15b3\.present$")


def labels_of(node: Obj) -> dict[str, str]:
    return node.get("metadata", {}).get("labels") or {}


def is_managed(node: Obj) -> bool:
    labels = labels_of(node)
    if labels.get(OPT_IN_LABEL) == "false":
        return False
    return labels.get(MELLANOX_LABEL) == "true" or labels.get(OPT_IN_LABEL) == "true"


def unmanaged_reason(node: Obj) -> str | None:
    """Why a node that has a Mellanox NIC is not managed, with the fix; None if not such a node."""
    labels = labels_of(node)
    name = node["metadata"]["name"]
    if labels.get(OPT_IN_LABEL) == "false" and labels.get(MELLANOX_LABEL) == "true":
        return f"node {name} has a Mellanox NIC but is opted out ({OPT_IN_LABEL}=false)"
    if is_managed(node):
        return None
    class_labels = sorted(k for k, v in labels.items() if CLASS_VENDOR_LABEL.match(k) and v)
    if class_labels:
        return (
            f"node {name} has a Mellanox NIC ({class_labels[0]}) but no label {MELLANOX_LABEL}; "
            f"label it (kubectl label node {name} {MELLANOX_LABEL}=true) or configure NFD "
            "with deviceLabelFields [vendor]"
        )
    return None


def ipam_usage(node: Obj) -> Obj:
    """A Node's published IPAM usage, `{pool: {"allocated": n, "size": m}}` (empty if none)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    try:
        usage = json.loads(annotations.get(IPAM_USAGE_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return usage if isinstance(usage, dict) else {}
