"""`maintenance.nvidia.com/v1alpha1`: NodeMaintenance and MaintenanceOperatorConfig, the API of
NVIDIA's maintenance operator.

Driver upgrades in requestor mode ask for a node's cordon and drain with a NodeMaintenance instead
of doing it themselves, so that several operators sharing a node take turns. nicop serves the
same kinds, with upstream's names and defaults, so requestors written for upstream work unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from nicop.api.common import (
    ApiModel,
    Conditions,
    CrdInfo,
    IntOrPercent,
    KubeObject,
    PrinterColumn,
)

GROUP = "maintenance.nvidia.com"
VERSION = "v1alpha1"

FINALIZER = "maintenance.nvidia.com/finalizer"
READY_TIME_ANNOTATION = "maintenance.nvidia.com/ready-time"
"""When the NodeMaintenance became Ready; maxNodeMaintenanceTimeSeconds counts from it."""
GC_IGNORE_ANNOTATION = "maintenance.nvidia.com/garbage-collector.ignore"
"""On a NodeMaintenance: never removed for having been Ready too long."""
INITIAL_UNSCHEDULABLE_ANNOTATION = "maintenance.nvidia.com/node-initial-state.unschedulable"
"""Whether the node was already cordoned before the maintenance, so it stays so afterwards."""
WAIT_START_ANNOTATION = "maintenance.nvidia.com/wait-pod-completion-start-time"
"""When waiting for the pods of waitForPodCompletion began; its timeout counts from it."""

CONDITION_READY = "Ready"
CONDITION_REQUESTOR_FAILED = "RequestorFailed"

# Reasons of the Ready condition: the phase of the maintenance, in order.
PENDING = "Pending"
SCHEDULED = "Scheduled"
CORDON = "Cordon"
WAIT_FOR_POD_COMPLETION = "WaitForPodCompletion"
DRAINING = "Draining"
READY = "Ready"
REQUESTOR_FAILED = "RequestorFailed"
"""The requestor gave up on the maintenance; the object is then never garbage collected."""
FAILED_MAINTENANCE = "FailedMaintenance"
"""Reason of the RequestorFailed condition."""

CONFIG_NAME = "default"
"""The one MaintenanceOperatorConfig that is read, in the operator's namespace."""

Int32 = Annotated[int, Field(json_schema_extra={"format": "int32"})]
ImmutableStr = Annotated[
    str,
    Field(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "Value is immutable"}
            ]
        }
    ),
]
"""A string that cannot change once the object exists."""
REQUESTOR_ID = (
    r"^([a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?(\.[a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?)*)$"
)
"""Upstream's pattern of requestorID: a domain name (RFC 1035) in either case."""


# --- NodeMaintenance -------------------------------------------------------------------------


class WaitForPodCompletionSpec(ApiModel):
    """Pods to wait for before the node is drained."""

    pod_selector: str | None = None
    """Label selector of the pods on the node to wait for, e.g. app=my-workloads."""
    timeout_seconds: Int32 = Field(default=0, ge=0)
    """How long to wait for the pods to finish before giving up; 0 waits forever."""


class PodEvictionFilterEntry(ApiModel):
    """A filter of the pods evicted by the drain."""

    by_resource_name_regex: str | None = None
    """Regular expression a resource requested by one of the pod's containers must match, e.g.
    nvidia.com/rdma*."""


class DrainSpec(ApiModel):
    """How the node is drained."""

    force: bool = False
    """Drain even pods that no controller manages."""
    pod_selector: str | None = None
    """Label selector of the pods on the node to drain; every pod when empty."""
    timeout_seconds: Int32 = Field(default=300, ge=0)
    """How long to try draining before giving up; 0 tries forever."""
    delete_empty_dir: bool = False
    """Drain even pods with emptyDir volumes, whose data is lost."""
    pod_eviction_filters: list[PodEvictionFilterEntry] | None = None
    """Only pods matching one of these filters are evicted (the filters are ORed); every pod but
    DaemonSet pods when unset."""


class NodeMaintenanceSpec(ApiModel):
    """A request by requestorID to have nodeName cordoned and drained."""

    requestor_id: ImmutableStr = Field(
        alias="requestorID", min_length=2, max_length=63, pattern=REQUESTOR_ID
    )
    """Who asks for the maintenance, in domain name notation (alphanumerics, dashes and dots,
    beginning and ending alphanumeric), e.g. some.one.acme.com. A requestor has at most one
    NodeMaintenance per node. Cannot change."""
    additional_requestors: list[str] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-list-type": "set"}
    )
    """Other requestors sharing this maintenance. The node is released (uncordoned) only when
    the object is deleted with this list empty; update the whole list, retrying on conflicts."""
    node_name: ImmutableStr
    """The node to maintain. Cannot change."""
    cordon: bool = True
    """Mark the node unschedulable during the maintenance."""
    wait_for_pod_completion: WaitForPodCompletionSpec | None = None
    """Pods to wait for before draining; no waiting when unset."""
    drain_spec: DrainSpec | None = None
    """How the node is drained; no drain when unset."""


class DrainStatus(ApiModel):
    """Progress of the drain."""

    total_pods: Int32 = Field(ge=0)
    """Pods on the node when the drain started."""
    eviction_pods: Int32 = Field(ge=0)
    """Pods to evict, counted when the drain started."""
    drain_progress: Int32 = Field(ge=0)
    """Percentage of those pods evicted."""
    wait_for_eviction: list[str] | None = None
    """Pods still to be evicted, as namespace/name."""


class NodeMaintenanceStatus(ApiModel):
    """Where the maintenance stands."""

    conditions: Conditions = None
    """Ready: whether the node is ready for maintenance; its reason is the phase (Pending,
    Scheduled, Cordon, WaitForPodCompletion, Draining, Ready, RequestorFailed). RequestorFailed:
    the requestor's operation on the node failed (reason FailedMaintenance)."""
    wait_for_completion: list[str] | None = None
    """Pods still waited for, as namespace/name."""
    drain: DrainStatus | None = None
    """Progress of the drain."""


class NodeMaintenance(KubeObject):
    """A request to cordon and drain a node for maintenance; the node is ready when the Ready
    condition is True, and released when the object is deleted."""

    crd = CrdInfo(
        GROUP, VERSION, "NodeMaintenance", "nodemaintenances", namespaced=True,
        printer_columns=(
            PrinterColumn("Node", ".spec.nodeName"),
            PrinterColumn("Requestor", ".spec.requestorID"),
            PrinterColumn("Ready", ".status.conditions[?(@.type=='Ready')].status"),
            PrinterColumn("Phase", ".status.conditions[?(@.type=='Ready')].reason"),
        ),
    )

    spec: NodeMaintenanceSpec
    status: NodeMaintenanceStatus | None = None


# --- MaintenanceOperatorConfig ---------------------------------------------------------------


class MaintenanceOperatorConfigSpec(ApiModel):
    """Limits on how many nodes are maintained at once."""

    max_parallel_operations: IntOrPercent = 1
    """How many nodes may be under maintenance at once: a number, 0 for no limit, or a
    percentage of the cluster's nodes, rounded up. maxUnavailable may lower it."""
    max_unavailable: IntOrPercent | None = None
    """How many nodes may be unavailable (unschedulable or not ready) at once: a number or a
    percentage of the cluster's nodes, rounded down; no further maintenance starts while it is
    reached. No limit when unset."""
    log_level: Literal["debug", "info", "error"] = "info"
    """Log verbosity."""
    max_node_maintenance_time_seconds: Int32 = Field(default=3600, ge=0)
    """How long a NodeMaintenance may stay Ready before it is considered stale and deleted; keep
    it below the idle time of any cluster autoscaler."""


class MaintenanceOperatorConfigStatus(ApiModel):
    """Nothing is recorded here."""


class MaintenanceOperatorConfig(KubeObject):
    """The maintenance settings; only the object named default in the operator's namespace is
    read."""

    crd = CrdInfo(GROUP, VERSION, "MaintenanceOperatorConfig", "maintenanceoperatorconfigs",
                  namespaced=True)

    spec: MaintenanceOperatorConfigSpec = Field(default_factory=MaintenanceOperatorConfigSpec)
    status: MaintenanceOperatorConfigStatus | None = None
