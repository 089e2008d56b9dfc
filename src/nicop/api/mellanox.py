"""`mellanox.com/v1alpha1`: NicClusterPolicy, NicNodePolicy and the secondary network kinds.

Every kind here is cluster-scoped, as upstream. Defaults, enums and patterns are upstream's schema;
the rules upstream checks in its admission webhook are CEL rules here, so the API server enforces
them without a webhook.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from nicop.api.common import (
    STATUS_AND_AGE,
    ApiModel,
    Conditions,
    CrdInfo,
    EnvVar,
    IntOrPercent,
    JsonObject,
    JsonObjects,
    KubeObject,
    NodeAffinity,
    Quantity,
    Removed,
    RemovedObject,
    Toleration,
)

GROUP = "mellanox.com"
VERSION = "v1alpha1"

State = Literal["ready", "notReady", "ignore", "error"]

OFED_VERSION_PATTERN = (
    r"^(sha256:[a-fA-F0-9]{64}|doca\d+\.\d+(\.\d+)?-\d+\.\d+-\d+\.\d+\.\d+\.\d+-\d+(-[\w\.\-]+)*"
    r"|\d+\.\d+-\d+(\.\d+)*(-\d+)?(-[\w\.\-]+)*)$"
)
GUID_PATTERN = r"^([0-9A-Fa-f]{2}:){7}([0-9A-Fa-f]{2})$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class ResourceRequirements(ApiModel):
    """CPU and memory of one container of a component."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!has(self.{field}) || size(self.{field}) == "
                    f"('cpu' in self.{field} ? 1 : 0) + ('memory' in self.{field} ? 1 : 0)",
                    "message": "only cpu and memory can be set",
                    "fieldPath": f".{field}",
                }
                for field in ("limits", "requests")
            ]
        }
    )

    name: str
    """Name of the container the requirements are set for."""
    limits: dict[str, Quantity] | None = None
    """The most cpu and memory the container may use."""
    requests: dict[str, Quantity] | None = None
    """The cpu and memory the container is scheduled with; defaults to the limits."""


class ImageSpec(ApiModel):
    """Container image of a component; repository and version fall back to `spec.global`."""

    image: str = Field(pattern=r"[a-zA-Z0-9\-]+")
    """Name of the image."""
    repository: str | None = Field(default=None, pattern=r"[a-zA-Z0-9\.\-\/]+")
    """Address of the registry that stores the image."""
    version: str | None = None
    """Version of the image: a tag, or sha256:<digest>."""
    image_pull_secrets: list[str] = Field(default=[])
    """Secrets in the operator namespace to pull the image with."""
    container_resources: list[ResourceRequirements] | None = None
    """Compute resources per container of the component."""


class ImageSpecWithConfig(ImageSpec):
    """Container image of a component plus its configuration."""

    config: JsonObject | None = None
    """Configuration of the component, as JSON."""


class GlobalConfig(ApiModel):
    """Defaults for the image of every component."""

    repository: str | None = Field(default=None, pattern=r"[a-zA-Z0-9\.\-\/]+")
    """Registry of every image that does not set its own."""
    version: str | None = None
    """Version of every image that does not set its own."""
    image_pull_secrets: list[str] | None = None
    """Pull secrets of every image that does not set its own."""


class PodProbeSpec(ApiModel):
    """Timing of a pod probe."""

    initial_delay_seconds: int
    """Seconds after the container started before the probe is first run."""
    period_seconds: int
    """How often, in seconds, the probe runs."""
    failure_threshold: int | None = None
    """Consecutive failures after which the probe counts as failed."""
    timeout_seconds: int | None = None
    """Seconds after which the probe times out."""


class ConfigMapNameReference(ApiModel):
    """A ConfigMap in the operator namespace."""

    name: str | None = None
    """Name of the ConfigMap."""


class WaitForCompletionSpec(ApiModel):
    """Pods to wait for before a node's driver is upgraded."""

    pod_selector: str | None = None
    """Label selector of the pods whose completion is awaited."""
    timeout_seconds: int = Field(default=0, ge=0)
    """Seconds to wait for the pods to complete; 0 waits forever."""


class DrainSpec(ApiModel):
    """How a node is drained before its driver is upgraded."""

    enable: bool = True
    """Drain the node during the upgrade."""
    force: bool = False
    """Evict pods not managed by a controller too."""
    pod_selector: str | None = None
    """Label selector of the pods to drain; empty drains all."""
    timeout_seconds: int = Field(default=300, ge=0)
    """Seconds to wait for the drain; 0 waits forever."""
    delete_empty_dir: bool = False
    """Drain pods that use emptyDir volumes, whose data is lost."""


class DriverUpgradePolicySpec(ApiModel):
    """Automatic driver upgrades, node by node."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.safeLoad) || !self.safeLoad "
                    "|| (has(self.autoUpgrade) && self.autoUpgrade)",
                    "message": "safeLoad requires autoUpgrade to be true",
                    "fieldPath": ".safeLoad",
                }
            ]
        }
    )

    auto_upgrade: bool = False
    """Upgrade drivers automatically; when false every other field is ignored."""
    max_parallel_upgrades: int = Field(default=1, ge=0)
    """How many nodes are upgraded at the same time; 0 means no limit."""
    max_unavailable: IntOrPercent | None = None
    """How many nodes (or what percentage of them) may be unavailable at once during upgrades;
    unset means no limit besides maxParallelUpgrades."""
    wait_for_completion: WaitForCompletionSpec | None = None
    """Pods to wait for before a node is upgraded."""
    drain: DrainSpec | None = None
    """How the node is drained."""
    safe_load: bool = False
    """Cordon and drain the node before the driver is loaded (needs autoUpgrade)."""


def driver_upgrade_policy(policy: dict[str, Any]) -> DriverUpgradePolicySpec:
    """A NicClusterPolicy's or NicNodePolicy's spec.ofedDriver.upgradePolicy as its model,
    defaults applied (unset: no automatic upgrade). Raises pydantic's ValidationError for a
    value the CRD's schema refuses."""
    raw = ((policy.get("spec") or {}).get("ofedDriver") or {}).get("upgradePolicy") or {}
    return DriverUpgradePolicySpec.model_validate(raw)


class OFEDDriverSpec(ImageSpec):
    """The DOCA-OFED driver container."""

    version: str | None = Field(
        default=None,
        max_length=128,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"self.matches(r'{OFED_VERSION_PATTERN}')",
                    "message": "must be a driver version such as doca3.5.0-26.07-0.7.0.0-0 or "
                    "25.04-0.6.1.0-2, or sha256:<digest>",
                }
            ]
        },
    )
    """Version of the driver image."""
    startup_probe: PodProbeSpec | None = None
    """Startup probe of the driver pod."""
    liveness_probe: PodProbeSpec | None = None
    """Liveness probe of the driver pod."""
    readiness_probe: PodProbeSpec | None = None
    """Readiness probe of the driver pod."""
    env: list[EnvVar] | None = None
    """Environment variables of the driver container."""
    upgrade_policy: DriverUpgradePolicySpec | None = None
    """Automatic driver upgrade settings."""
    cert_config: ConfigMapNameReference | None = None
    """ConfigMap with custom TLS certificates for the driver container."""
    repo_config: ConfigMapNameReference | None = None
    """ConfigMap with custom package repositories for the driver container."""
    termination_grace_period_seconds: int = Field(
        default=300, ge=0, json_schema_extra={"format": "int64"}
    )
    """Seconds the driver pod gets to restore the inbox driver when it is stopped."""
    force_precompiled: bool = False
    """Use only precompiled driver images; fail rather than compile on the node."""


class DevicePluginSpec(ImageSpecWithConfig):
    """A device plugin; config is its JSON configuration."""

    use_cdi: bool | None = None
    """Use the Container Device Interface (the runtime must be set up for it)."""


class MultusSpec(ImageSpecWithConfig):
    """Multus; without config the configuration is generated from the node's primary CNI."""


class SecondaryNetworkSpec(ApiModel):
    """The CNI plugins for secondary networks."""

    multus: MultusSpec | None = None
    """Multus, the meta plugin that attaches extra networks to pods."""
    cni_plugins: ImageSpec | None = None
    """The containernetworking CNI plugins."""
    ipoib: ImageSpec | None = None
    """The IPoIB CNI plugin."""
    ipam_plugin: Annotated[
        RemovedObject, Removed("2025-10", "whereabouts is no longer deployed")
    ] = None
    """Deprecated: removed upstream in 2025 (whereabouts is no longer deployed); ignored."""


class IBKubernetesSpec(ImageSpec):
    """ib-kubernetes, which sets InfiniBand PKeys and GUIDs through UFM."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.pKeyGUIDPoolRangeEnd.lowerAscii() "
                    "> self.pKeyGUIDPoolRangeStart.lowerAscii()",
                    "message": "pKeyGUIDPoolRangeEnd must be greater than pKeyGUIDPoolRangeStart",
                    "fieldPath": ".pKeyGUIDPoolRangeEnd",
                }
            ]
        }
    )

    periodic_update_seconds: int = Field(default=5, ge=0)
    """Interval of updates, in seconds."""
    p_key_guid_pool_range_start: str = Field(alias="pKeyGUIDPoolRangeStart", pattern=GUID_PATTERN)
    """The first GUID of the pool, e.g. 02:00:00:00:00:00:00:00."""
    p_key_guid_pool_range_end: str = Field(alias="pKeyGUIDPoolRangeEnd", pattern=GUID_PATTERN)
    """The last GUID of the pool."""
    ufm_secret: str
    """Secret with the UFM credentials (keys UFM_USERNAME and UFM_PASSWORD)."""


class NVIPAMSpec(ImageSpec):
    """nv-ipam, the IPAM plugin with per-node IP blocks."""

    enable_webhook: bool | None = None
    """Deploy the validating webhook of nv-ipam (needs cert-manager)."""


class DOCATelemetryServiceConfig(ApiModel):
    """Where DOCA Telemetry Service gets its configuration."""

    from_config_map: str | None = Field(default=None, max_length=253, pattern=DNS1123_SUBDOMAIN)
    """ConfigMap in the operator namespace with the configuration; no default is deployed then."""


class DOCATelemetryServiceSpec(ImageSpec):
    """DOCA Telemetry Service."""

    config: DOCATelemetryServiceConfig | None = None
    """Custom configuration."""


class NicFirmwareStorageSpec(ApiModel):
    """The volume holding NIC firmware for upgrades."""

    create: bool = True
    """Create the PVC; when false the PVC pvcName must exist in the operator namespace."""
    pvc_name: str = Field(
        default="nic-fw-storage-pvc", min_length=1, max_length=63, pattern=DNS1123_LABEL
    )
    """Name of the PVC."""
    storage_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS1123_LABEL,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "storageClassName is immutable once set; delete nicFirmwareStorage "
                    "and create it again with the new value",
                }
            ]
        },
    )
    """Storage class of the PVC; the cluster default when unset."""
    available_storage_size: str = Field(
        default="1Gi",
        pattern=r"^(\d+)(Ei|Pi|Ti|Gi|Mi|Ki)$",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "availableStorageSize is immutable once set; delete "
                    "nicFirmwareStorage and create it again with the new value",
                }
            ]
        },
    )
    """Size of the PVC (only used with create)."""


class NicConfigurationOperatorSpec(ApiModel):
    """The NIC configuration operator and its node daemon."""

    operator: ImageSpec
    """Image of nic-configuration-operator."""
    configuration_daemon: ImageSpec
    """Image of nic-configuration-daemon."""
    env: list[EnvVar] | None = None
    """Environment variables of the operator and daemon containers."""
    nic_firmware_storage: NicFirmwareStorageSpec | None = None
    """Storage for NIC firmware; not configured when unset."""
    log_level: Literal["info", "debug"] = "info"
    """Log verbosity."""


class SpectrumXOperatorSpec(ImageSpec):
    """The Spectrum-X operator."""

    x_plane: ImageSpec | None = None
    """Image of the cross-plane component."""


class DRADriverSpec(ApiModel):
    """nicop's DRA driver (rdma.nicop.io): RDMA NICs and VFs as Dynamic Resource Allocation
    devices, and the DeviceClasses `rdma.nicop.io` (PFs), `vf.rdma.nicop.io` (VFs) and
    `shared.rdma.nicop.io` (shared ports, with sharedRdma). It runs
    nicop's own image, so there is no image to name. nicop only; upstream has no such section."""

    image_pull_secrets: list[str] = Field(default=[])
    """Secrets in the operator namespace to pull nicop's image with."""
    container_resources: list[ResourceRequirements] | None = Field(default=None, max_length=1)
    """Compute resources of its one container, `dra-plugin`."""
    shared_rdma: bool = False
    """Publish each port without VFs as one shared device (DeviceClass `shared.rdma.nicop.io`)
    that many claims hold at once, each taking one of its `pods` capacity, instead of a whole
    PF for one claim: the RDMA shared device plugin's sharing, with a limit the scheduler
    enforces."""
    sriov_resources: bool = False
    """The VFs of SriovNetworkNodePolicies on these nodes are served by DRA, not by the SR-IOV
    device plugin, which then does not run here: a pod asking for `nvidia.com/<resourceName>`
    is unchanged and gets its VF by DRA here and from the device plugin elsewhere (a DeviceClass
    per resourceName with extendedResourceName). Without it those VFs are the device plugin's
    and the DRA driver leaves them out. Pods attaching an SriovNetwork by its resourceName still
    need the device plugin."""


class NicClusterPolicySpec(ApiModel):
    """Which components run on the cluster, and how."""

    global_: GlobalConfig | None = Field(default=None, alias="global")
    """Image defaults for every component."""
    ofed_driver: OFEDDriverSpec | None = None
    """The DOCA-OFED driver, which replaces the inbox driver of the OS."""
    rdma_shared_device_plugin: DevicePluginSpec | None = None
    """Device plugin exposing RDMA devices shared by pods; config is its JSON configuration
    ({"configList": [...]})."""
    sriov_device_plugin: DevicePluginSpec | None = None
    """Device plugin exposing SR-IOV virtual functions; config is its JSON configuration
    ({"resourceList": [...]})."""
    ib_kubernetes: IBKubernetesSpec | None = None
    """ib-kubernetes, for InfiniBand PKeys and GUIDs through UFM."""
    secondary_network: SecondaryNetworkSpec | None = None
    """CNI plugins for secondary networks."""
    nv_ipam: NVIPAMSpec | None = None
    """nv-ipam."""
    nic_feature_discovery: ImageSpec | None = None
    """NIC feature discovery, which labels nodes with NIC features."""
    doca_telemetry_service: DOCATelemetryServiceSpec | None = None
    """DOCA Telemetry Service."""
    nic_configuration_operator: NicConfigurationOperatorSpec | None = None
    """NIC configuration operator (firmware and NIC settings)."""
    spectrum_x_operator: SpectrumXOperatorSpec | None = None
    """Spectrum-X operator."""
    dra_driver: DRADriverSpec | None = None
    """nicop's DRA driver, publishing RDMA NICs and VFs for ResourceClaims (nicop only)."""
    node_affinity: NodeAffinity | None = None
    """Node affinity of the DaemonSets."""
    tolerations: list[Toleration] | None = None
    """Tolerations of the DaemonSets."""
    deployment_node_affinity: NodeAffinity | None = None
    """Node affinity of the Deployments (ib-kubernetes, nv-ipam controller, ...)."""
    deployment_tolerations: list[Toleration] | None = None
    """Tolerations of the Deployments."""
    psp: Annotated[
        RemovedObject, Removed("2023-09", "PodSecurityPolicy support was dropped")
    ] = None
    """Deprecated: removed upstream in 2023 (PodSecurityPolicy support was dropped); ignored."""
    nv_peer_driver: Annotated[
        RemovedObject, Removed("2023-07", "nv_peer_mem is replaced by the inbox nvidia-peermem")
    ] = None
    """Deprecated: removed upstream in 2023 (nv_peer_mem is replaced by nvidia-peermem); ignored."""


class AppliedState(ApiModel):
    """The state of one component."""

    name: str
    """Name of the component state, e.g. state-OFED."""
    state: State
    """ready, notReady, ignore (not configured) or error."""
    message: str | None = None
    """Why the component is not ready."""


class UpgradeFailure(ApiModel):
    """A node whose driver upgrade failed, and why."""

    name: str
    reason: str | None = None
    attempts: int = 0
    """Failed attempts since its last success; nicop retries a few times by itself."""
    next_retry: str | None = None
    """When nicop retries it; absent with no retry left: `nicop upgrade retry <node>`."""


class DriverUpgradeStatus(ApiModel):
    """Progress of a rolling driver upgrade (nicop addition), from the nodes' upgrade states."""

    done: int = 0
    in_progress: int = 0
    waiting: int = 0
    failed: int = 0
    in_progress_nodes: list[str] | None = None
    """Nodes between cordon and uncordon."""
    failed_nodes: list[UpgradeFailure] | None = None


class NicPolicyStatus(ApiModel):
    """Observed state of a policy: overall, per component, and as conditions."""

    state: State
    """ready once every configured component is ready."""
    reason: str | None = None
    """Why the policy is in this state."""
    applied_states: list[AppliedState] | None = None
    """The state of every component."""
    conditions: Conditions = None
    """A <Component>Ready condition per configured component and an aggregate Ready."""
    observed_generation: int | None = None
    """The spec generation this status describes."""
    driver_upgrade: DriverUpgradeStatus | None = None
    """How far a rolling driver upgrade has come (when autoUpgrade is on)."""


class NicClusterPolicy(KubeObject):
    """The cluster's NIC stack: drivers, device plugins, CNI plugins and IPAM.

    Only the object named nic-cluster-policy is acted on.
    """

    crd = CrdInfo(
        GROUP, VERSION, "NicClusterPolicy", "nicclusterpolicies", namespaced=False,
        short_names=("ncp",), printer_columns=STATUS_AND_AGE,
    )

    spec: NicClusterPolicySpec = Field(default_factory=NicClusterPolicySpec)
    status: NicPolicyStatus | None = None


class NicNodePolicySpec(ApiModel):
    """Components for one group of nodes, instead of NicClusterPolicy's."""

    node_selector: dict[str, str] | None = None
    """Labels of the nodes this policy applies to."""
    labels: dict[str, str] | None = None
    """Labels added to the objects rendered for this policy."""
    annotations: dict[str, str] | None = None
    """Annotations added to the objects rendered for this policy."""
    tolerations: list[Toleration] | None = None
    """Tolerations of the DaemonSets."""
    ofed_driver: OFEDDriverSpec | None = None
    """The DOCA-OFED driver for these nodes."""
    rdma_shared_device_plugin: DevicePluginSpec | None = None
    """The RDMA shared device plugin for these nodes."""
    sriov_device_plugin: DevicePluginSpec | None = None
    """The SR-IOV device plugin for these nodes."""
    dra_driver: DRADriverSpec | None = None
    """nicop's DRA driver for these nodes (nicop only)."""


class NicNodePolicy(KubeObject):
    """Drivers and device plugins for a group of nodes (a heterogeneous cluster).

    A section may be in NicClusterPolicy or in NicNodePolicies, not both, and the node selectors of
    NicNodePolicies must not overlap.
    """

    metadata_name_schema: ClassVar[dict[str, Any]] = {"maxLength": 30}

    crd = CrdInfo(
        GROUP, VERSION, "NicNodePolicy", "nicnodepolicies", namespaced=False,
        short_names=("nicnode", "nnp"), printer_columns=STATUS_AND_AGE,
    )

    spec: NicNodePolicySpec = Field(default_factory=NicNodePolicySpec)
    status: NicPolicyStatus | None = None


class NetworkStatus(ApiModel):
    """Observed state of a network: its NetworkAttachmentDefinition."""

    state: Literal["notReady", "ready", "error"] | None = None
    """ready once the NetworkAttachmentDefinition exists."""
    reason: str | None = None
    """Why the network is not ready."""


class MacvlanNetworkSpec(ApiModel):
    """A macvlan network on a host interface."""

    network_namespace: str | None = None
    """Namespace of the NetworkAttachmentDefinition."""
    master: str | None = None
    """Host interface the macvlan interfaces are created on."""
    mode: Literal["bridge", "private", "vepa", "passthru"] | None = None
    """Macvlan mode."""
    mtu: int | None = Field(default=None, ge=0, le=65535)
    """MTU of the interfaces; 0 takes the master's MTU."""
    ipam: JsonObject | None = None
    """IPAM configuration, as JSON."""
    meta_plugins: JsonObjects | None = None
    """CNI plugins chained after macvlan: JSON objects separated by commas."""


class MacvlanNetworkStatus(NetworkStatus):
    """Observed state of a MacvlanNetwork."""

    macvlan_network_attachment_def: str | None = None
    """Link of the NetworkAttachmentDefinition."""


class MacvlanNetwork(KubeObject):
    """A macvlan secondary network, rendered as a NetworkAttachmentDefinition."""

    crd = CrdInfo(
        GROUP, VERSION, "MacvlanNetwork", "macvlannetworks", namespaced=False,
        printer_columns=STATUS_AND_AGE,
    )

    spec: MacvlanNetworkSpec = Field(default_factory=MacvlanNetworkSpec)
    status: MacvlanNetworkStatus | None = None


class HostDeviceNetworkSpec(ApiModel):
    """A network that moves a whole host device (e.g. a VF) into the pod."""

    network_namespace: str | None = None
    """Namespace of the NetworkAttachmentDefinition."""
    resource_name: str | None = Field(
        default=None, pattern=r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
    )
    """Device plugin resource of the devices; nvidia.com/ is prepended."""
    ipam: JsonObject | None = None
    """IPAM configuration, as JSON."""
    meta_plugins: JsonObjects | None = None
    """CNI plugins chained after host-device: JSON objects separated by commas."""


class HostDeviceNetworkStatus(NetworkStatus):
    """Observed state of a HostDeviceNetwork."""

    host_device_network_attachment_def: str | None = None
    """Link of the NetworkAttachmentDefinition."""
    applied_states: list[AppliedState] | None = None
    """The state of the network's objects."""


class HostDeviceNetwork(KubeObject):
    """A host-device secondary network, rendered as a NetworkAttachmentDefinition."""

    crd = CrdInfo(
        GROUP, VERSION, "HostDeviceNetwork", "hostdevicenetworks", namespaced=False,
        printer_columns=STATUS_AND_AGE,
    )

    spec: HostDeviceNetworkSpec = Field(default_factory=HostDeviceNetworkSpec)
    status: HostDeviceNetworkStatus | None = None


class IPoIBNetworkSpec(ApiModel):
    """An IP-over-InfiniBand network on a host IB interface."""

    network_namespace: str | None = None
    """Namespace of the NetworkAttachmentDefinition."""
    master: str | None = None
    """Host IB interface the IPoIB child interfaces are created on."""
    ipam: JsonObject | None = None
    """IPAM configuration, as JSON."""


class IPoIBNetworkStatus(NetworkStatus):
    """Observed state of an IPoIBNetwork."""

    ipoib_network_attachment_def: str | None = None
    """Link of the NetworkAttachmentDefinition."""


class IPoIBNetwork(KubeObject):
    """An IPoIB secondary network, rendered as a NetworkAttachmentDefinition."""

    crd = CrdInfo(
        GROUP, VERSION, "IPoIBNetwork", "ipoibnetworks", namespaced=False,
        printer_columns=STATUS_AND_AGE,
    )

    spec: IPoIBNetworkSpec = Field(default_factory=IPoIBNetworkSpec)
    status: IPoIBNetworkStatus | None = None

