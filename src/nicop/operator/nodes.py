"""Which nodes nicop manages, and the labels it keeps on them.

A node is managed when Node Feature Discovery found a Mellanox NIC
(`feature.node.kubernetes.io/pci-15b3.present=true`) or an admin opted it in
(`nvidia.com/network-operator=true`); `nvidia.com/network-operator=false` opts it out. A node
whose NFD labels name the Mellanox vendor together with a PCI class (NFD's default
`deviceLabelFields`) has the NIC but not the label the operator relies on: that is the most
common reason a policy stays notReady, so it is reported by name.
"""

from __future__ import annotations

import re

from nicop.kube.resources import Obj
from nicop.operator.states.base import MELLANOX_LABEL, MOFED_WAIT_LABEL, OPT_IN_LABEL

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


def mofed_wait_value(node: Obj, ofed_configured: bool, driver_ready: dict[str, bool]) -> str | None:
    """The value of network.nvidia.com/operator.mofed.wait this node should carry, or None.

    With a driver section, "false" only once the node's driver container is Ready. Without one,
    managed nodes get "false" (the inbox driver is used) and a node still running an old driver
    pod keeps "true" until it is gone.
    """
    name = node["metadata"]["name"]
    if ofed_configured:
        if not is_managed(node):
            return None
        return "false" if driver_ready.get(name) else "true"
    if name in driver_ready:
        return "true"
    return "false" if is_managed(node) else None


def label_patch(node: Obj, wanted: str | None) -> dict[str, dict[str, str | None]] | None:
    """The merge patch that sets the mofed.wait label to `wanted`, or None if already so."""
    current = labels_of(node).get(MOFED_WAIT_LABEL)
    if current == wanted:
        return None
    return {"labels": {MOFED_WAIT_LABEL: wanted}}
