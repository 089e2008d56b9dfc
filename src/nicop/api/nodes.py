"""Which nodes nicop manages, and what they say about it.

A node is managed when Node Feature Discovery found a Mellanox NIC
(`feature.node.kubernetes.io/pci-15b3.present=true`) or an admin opted it in
(`nvidia.com/network-operator=true`); `nvidia.com/network-operator=false` opts it out. A node
whose NFD labels name the Mellanox vendor together with a PCI class (NFD's default
`deviceLabelFields`) has the NIC but not the label the operator relies on: that is the most
common reason a policy stays notReady, so it is reported by name. So is a node that lost the
label while other signs of its NIC remain (labels of NFD naming vendor 15b3 in any form, the
driver's upgrade labels and annotations, mofed.wait): its pods lose RDMA at their next restart.
"""

from __future__ import annotations

import json
import re
from typing import Any

from nicop.api.labels import IPAM_USAGE_ANNOTATION, MELLANOX_LABEL, MOFED_WAIT_LABEL, OPT_IN_LABEL

Obj = dict[str, Any]

CLASS_VENDOR_LABEL = re.compile(r"^feature\.node\.kubernetes\.io/pci-[0-9a-f]{4}_15b3\.present$")
# Any NFD label naming the Mellanox PCI vendor: pci-15b3.present, pci-0207_15b3.present,
# pci-15b3.sriov.capable, pci-0200_15b3_101d.present ...
NFD_VENDOR_LABEL = re.compile(r"^feature\.node\.kubernetes\.io/pci-(?:[0-9a-f]{4}_)?15b3[._]")
# Keys the driver and its upgrade (nicop's and the upstream operator's) put only on nodes they
# manage: the upgrade state label and annotations, and mofed.wait.
MANAGED_KEY_PREFIXES = ("nvidia.com/ofed-driver-upgrade", "nvidia.com/ofed-upgrade-state",
                        MOFED_WAIT_LABEL)


def labels_of(node: Obj) -> dict[str, str]:
    meta = node.get("metadata")
    return (meta.get("labels") if meta else None) or {}


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
    if signs := label_signs(node):
        return unmanaged_with_signs(name, signs)
    return None


def label_signs(node: Obj) -> list[str]:
    """What the node's own labels and annotations say about a Mellanox NIC, in words: NFD labels
    naming vendor 15b3, and the keys only a managed node's driver gets. Empty when nothing."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    signs = [f"label {k}={v}" for k, v in sorted(labels.items())
             if NFD_VENDOR_LABEL.match(k) and k != MELLANOX_LABEL]
    signs += [f"label {k}={v}" for k, v in sorted(labels.items())
              if k.startswith(MANAGED_KEY_PREFIXES)]
    signs += [f"annotation {k}" for k in sorted(meta.get("annotations") or {})
              if k.startswith(MANAGED_KEY_PREFIXES)]
    return signs


def unmanaged_with_signs(name: str, signs: list[str]) -> str:
    """The reason and fix for a node that shows a Mellanox NIC but lacks the label."""
    return (
        f"node {name} shows a Mellanox NIC ({'; '.join(signs)}) but is not managed: it lacks "
        f"the label {MELLANOX_LABEL}=true, so the policy deploys no driver, device plugin or CNI "
        f"there and its pods lose RDMA when they restart; label it (kubectl label node {name} "
        f"{MELLANOX_LABEL}=true), and check that Node Feature Discovery runs on it and labels "
        "vendor 15b3 (pci deviceLabelFields [vendor], or a NodeFeatureRule)"
    )


def ipam_usage(node: Obj) -> Obj:
    """A Node's published IPAM usage, `{pool: {"allocated": n, "size": m}}` (empty if none)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    try:
        usage = json.loads(annotations.get(IPAM_USAGE_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return usage if isinstance(usage, dict) else {}
