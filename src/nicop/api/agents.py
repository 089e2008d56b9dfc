"""Names the operator and the nodes share about nicop's own node agents.

The operator renders a component with nicop's agent when the policy section's `image` is
`nicop`; every agent then runs from one image, the operator's own (`NICOP_IMAGE`, set by the
Helm chart to the chart's image). A node runs a container as nicop's agent when the image's
name (the last path component of its repository) is `nicop`, whatever registry it comes from.
"""

from __future__ import annotations

import os
import re

IMAGE_NAME = "nicop"
IMAGE_ENV = "NICOP_IMAGE"
# A container image reference whose name is `nicop`: [registry/path/]nicop[:tag][@digest].
_NICOP_REF = re.compile(r"^(?:.+/)?nicop(?::[^/@]+)?(?:@.+)?$")
# The same rule as a jq expression over a pod, for kwok's stage selectors
# (nicop_sim/kwok-stages.yaml).
NICOP_POD_JQ = ('[(.spec.initContainers // [])[], (.spec.containers // [])[]] '
                '| any(.image | test("^(.+/)?nicop(:[^/@]+)?(@.+)?$"))')

# The CNI plugins (and IPAM) nicop's CNI daemon implements, by their CNI `type`.
CNI_PLUGINS = ("sriov", "ib-sriov", "host-device", "nv-ipam")
# The node's directory of nicop's sockets: where the CNI daemon serves the plugins above (the
# shim each plugin executable is keeps its own copy: it imports nothing of nicop) and where
# nicop's multus daemon serves the `multus` plugin.
SOCKET_DIR = "/run/nicop"
CNI_SOCKET = f"{SOCKET_DIR}/cni.sock"
MULTUS_SOCKET = f"{SOCKET_DIR}/multus.sock"

# The file an agent keeps while it is ready (inside its container), and the probe that reads it.
READY_FILE_ENV = "NICOP_READY_FILE"
READY_FILE = "/run/nicop-agent/ready"
READY_PROBE = ["nicop", "probe-ready"]

# Who the agent is (the downward API), so it can record Events on its own pod; its IP is the
# address it serves /metrics on (a hostNetwork pod's IP is its node's).
POD_IP_ENV = "POD_IP"
POD_ENV = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
           "POD_UID": "metadata.uid", POD_IP_ENV: "status.podIP"}

# Each agent serves Prometheus /metrics on a port its container declares by this name; the
# ports differ per component because every agent of a node shares the node's network.
METRICS_PORT_NAME = "metrics"
METRICS_PORTS = {
    "driver": 9530,
    "rdma-device-plugin": 9531,
    "sriov-device-plugin": 9532,  # NicClusterPolicy's sriovDevicePlugin
    "sriov-config-daemon": 9533,
    "cni-daemon": 9534,
    "sriov-operator-device-plugin": 9535,  # the SR-IOV policies' device plugin DaemonSet
    "dra-plugin": 9536,
    "multus-daemon": 9537,  # NicClusterPolicy's secondaryNetwork.multus with `image: nicop`
}

# What each agent's container asks of its node: memory from bench_node_footprint (RSS on a
# DGX-like node with every agent running, rounded up with a fifth or more of headroom), a limit
# that leaves room for the agent's busiest moments without letting a leak take the node, and a
# CPU request that covers a paced rescan. No CPU limit: throttling would slow an agent exactly
# when pods start. A section's containerResources replaces these, as upstream's do.
AGENT_CPU_REQUEST = "10m"
AGENT_MEMORY = {  # command: (request, limit)
    "driver": ("64Mi", "256Mi"),
    "rdma-device-plugin": ("80Mi", "256Mi"),
    "sriov-device-plugin": ("80Mi", "256Mi"),
    "sriov-config-daemon": ("96Mi", "256Mi"),
    "cni-daemon": ("80Mi", "256Mi"),
    "dra-plugin": ("80Mi", "256Mi"),
    "multus-daemon": ("80Mi", "256Mi"),
}


def is_nicop_image(ref: str) -> bool:
    return bool(_NICOP_REF.match(ref))


def own_image() -> str:
    """The image the operator deploys nicop's agents from: $NICOP_IMAGE, else nicop:<version>."""
    if env := os.environ.get(IMAGE_ENV):
        return env
    from importlib.metadata import version

    return f"{IMAGE_NAME}:{version('nicop')}"


def uses_nicop(image_name: str | None) -> bool:
    """Whether a NicClusterPolicy section's `image` asks for nicop's agent (`image: nicop`)."""
    return image_name == IMAGE_NAME
