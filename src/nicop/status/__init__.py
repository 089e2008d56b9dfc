"""`nicop status`: the state of the whole stack in one read, for people and for scripts.

Three steps, one room each, kept apart so each can be tested without a cluster: `collect` reads
every object it needs once into a plain snapshot of dicts; `summary` turns a snapshot into the
documented status (docs/status-schema.json, what `-o json` prints); `render` draws that status
with rich. `facts` holds what both `nicop status` and `nicop diagnose` read off a snapshot, so
the two commands always agree on what "allocatable", "in use" or "driver ready" mean. This
module is their public face: everything is imported from here.

The driver's readiness file (/run/mellanox/drivers/.driver-ready) lives on the node, out of the
API's sight; its startup probe ties the driver container's Ready to that file, so the container's
Ready is what is reported as "driver ready".
"""

from __future__ import annotations

from nicop.status.collect import (
    ClusterReadError,
    collect,
    read_cluster,
)
from nicop.status.facts import (
    DEFAULT_NAMESPACE,
    DEVICE_PLUGIN_STATES,
    EXCLUDED_RESOURCES,
    MELLANOX_VENDOR,
    NIC_NODE_POLICY,
    NODE_FEATURE,
    NODE_FEATURE_NODE_LABEL,
    NON_NIC_RESOURCES,
    OPERATOR_APP_NAMES,
    READY_FILE,
    RESOURCE_PREFIXES,
    SCHEMA_VERSION,
    TERMINATED,
    Snapshot,
    configured_resources,
    container_problem,
    container_status,
    driver_of,
    driver_pod,
    driver_version,
    has_mellanox_nic,
    image_tag,
    in_use,
    is_device_resource,
    labels_of,
    leader_of,
    name_of,
    nic_signs,
    node_ready,
    node_resources,
    node_state_of,
    operator_pods,
    owner_name,
    pod_ready,
    pod_requests,
    pods_on,
    policy_of,
    sriov_of,
    sriov_served_by,
    unmanaged_nic,
)
from nicop.status.render import (
    STATE_STYLE,
    render,
)
from nicop.status.summary import (
    dra_devices,
    summarize,
    summarize_policy,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEVICE_PLUGIN_STATES",
    "EXCLUDED_RESOURCES",
    "MELLANOX_VENDOR",
    "NIC_NODE_POLICY",
    "NODE_FEATURE",
    "NODE_FEATURE_NODE_LABEL",
    "NON_NIC_RESOURCES",
    "OPERATOR_APP_NAMES",
    "READY_FILE",
    "RESOURCE_PREFIXES",
    "SCHEMA_VERSION",
    "STATE_STYLE",
    "TERMINATED",
    "ClusterReadError",
    "Snapshot",
    "collect",
    "configured_resources",
    "container_problem",
    "container_status",
    "dra_devices",
    "driver_of",
    "driver_pod",
    "driver_version",
    "has_mellanox_nic",
    "image_tag",
    "in_use",
    "is_device_resource",
    "labels_of",
    "leader_of",
    "name_of",
    "nic_signs",
    "node_ready",
    "node_resources",
    "node_state_of",
    "operator_pods",
    "owner_name",
    "pod_ready",
    "pod_requests",
    "pods_on",
    "policy_of",
    "read_cluster",
    "render",
    "sriov_of",
    "sriov_served_by",
    "summarize",
    "summarize_policy",
    "unmanaged_nic",
]
