"""`sriovnetwork.openshift.io/v1`: the SR-IOV network operator's kinds, all namespaced.

Policies, node states, the operator config and pool configs live in the operator namespace;
networks may live in any namespace. Upstream checks most rules in its webhooks; here the static
ones are CEL rules in the schema, and the ones that need other objects (nodes, other policies,
the NIC list) are checked by the operator.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from nicop.api.common import (
    ApiModel,
    Conditions,
    CrdInfo,
    IntOrPercent,
    JsonObject,
    JsonObjects,
    KubeObject,
    LabelSelector,
    PrinterColumn,
)

GROUP = "sriovnetwork.openshift.io"
VERSION = "v1"

MAX_MTU = 65535
"""The largest MTU Linux allows on an Ethernet or IPoIB interface."""

RESOURCE_NAME_PATTERN = r"^[a-zA-Z0-9]([a-zA-Z0-9_-]*[a-zA-Z0-9])?$"
VF_RANGE = r"^[^#]+#[0-9]+-[0-9]+$"
"""A PF name with a VF range, `name#first-last` (inclusive)."""

LinkType = Literal["eth", "ETH", "ib", "IB"]
DeviceType = Literal["netdevice", "vfio-pci"]
ESwitchMode = Literal["legacy", "switchdev"]
VdpaType = Literal["virtio", "vhost"]
RdmaMode = Literal["shared", "exclusive"]
LinkState = Literal["auto", "enable", "disable"]
OnOff = Literal["on", "off"]

AGE = PrinterColumn("Age", ".metadata.creationTimestamp", "date")
READY = PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status')
PROGRESSING = PrinterColumn("Progressing", '.status.conditions[?(@.type=="Progressing")].status')
DEGRADED = PrinterColumn("Degraded", '.status.conditions[?(@.type=="Degraded")].status')

PfName = Annotated[
    str,
    Field(
        max_length=128,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": f"!self.contains('#') || (self.matches(r'{VF_RANGE}') "
                    "&& int(self.split('#')[1].split('-')[0]) "
                    "<= int(self.split('#')[1].split('-')[1]))",
                    "message": "must be a PF name or name#first-last with first <= last, "
                    "e.g. ens1f0#0-7",
                }
            ]
        },
    ),
]


class SriovNetworkNicSelector(ApiModel):
    """Which PFs a policy configures; a PF must match every field that is set."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.vendor) || has(self.deviceID) || has(self.pfNames) "
                    "|| has(self.rootDevices) || has(self.netFilter)",
                    "message": "set at least one of vendor, deviceID, pfNames, rootDevices or "
                    "netFilter",
                },
                {
                    "rule": "!has(self.netFilter) || !(has(self.vendor) || has(self.deviceID) "
                    "|| has(self.pfNames) || has(self.rootDevices))",
                    "message": "netFilter cannot be combined with other selectors",
                    "fieldPath": ".netFilter",
                },
            ]
        }
    )

    vendor: str | None = None
    """Vendor ID of the PF in hex, e.g. 15b3 (NVIDIA) or 8086 (Intel)."""
    device_id: str | None = Field(default=None, alias="deviceID")
    """Device ID of the PF in hex, e.g. 101d (ConnectX-6 Dx)."""
    root_devices: list[str] | None = None
    """PCI addresses of the PFs, e.g. 0000:3b:00.0."""
    pf_names: list[PfName] | None = Field(default=None, max_length=256)
    """Interface names of the PFs, optionally with a VF range: ens1f0#0-7."""
    net_filter: str | None = None
    """Infrastructure network filter, e.g. openstack/NetworkID:<uuid>."""


class OVSBridgeConfig(ApiModel):
    """Bridge-level OVS settings."""

    datapath_type: str | None = None
    """datapath_type of the Bridge table in OVSDB."""
    external_ids: dict[str, str] | None = Field(default=None, alias="externalIDs")
    """external_ids of the Bridge table."""
    other_config: dict[str, str] | None = None
    """other_config of the Bridge table."""
    fail_mode: Literal["secure", "standalone"] | None = None
    """fail_mode of the Bridge table."""


class OVSInterfaceConfig(ApiModel):
    """Settings of the PF interface in the OVS bridge."""

    type: str | None = None
    """type of the Interface table."""
    options: dict[str, str] | None = None
    """options of the Interface table."""
    external_ids: dict[str, str] | None = Field(default=None, alias="externalIDs")
    """external_ids of the Interface table."""
    other_config: dict[str, str] | None = None
    """other_config of the Interface table."""
    mtu_request: int | None = None
    """mtu_request of the Interface table."""


class OVSUplinkConfig(ApiModel):
    """Settings of the uplink (PF) of an OVS bridge."""

    interface: OVSInterfaceConfig | None = None
    """The PF interface in the bridge."""


class OVSConfig(ApiModel):
    """An OVS bridge for the PFs of a switchdev policy."""

    bridge: OVSBridgeConfig | None = None
    """Bridge-level settings."""
    uplink: OVSUplinkConfig | None = None
    """Uplink settings."""


class Bridge(ApiModel):
    """Software bridge for the PFs (switchdev only)."""

    ovs: OVSConfig | None = None
    """An OVS bridge."""


class SriovNetworkNodePolicySpec(ApiModel):
    """How many VFs to create on which PFs of which nodes, and how to expose them."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.nicSelector.pfNames) || self.nicSelector.pfNames.all(p, "
                    f"!p.matches(r'{VF_RANGE}') "
                    "|| int(p.split('#')[1].split('-')[1]) < self.numVfs)",
                    "message": "the last VF of a range name#first-last must be less than numVfs",
                    "fieldPath": ".nicSelector.pfNames",
                },
                {
                    "rule": "!(self.deviceType == 'vfio-pci' && self.isRdma)",
                    "message": "isRdma cannot be used with deviceType vfio-pci",
                    "fieldPath": ".isRdma",
                },
                {
                    "rule": "!has(self.eSwitchMode) || self.eSwitchMode != 'switchdev' "
                    "|| !has(self.linkType) || self.linkType.lowerAscii() == 'eth'",
                    "message": "eSwitchMode switchdev needs linkType eth",
                    "fieldPath": ".eSwitchMode",
                },
                {
                    "rule": "!has(self.vdpaType) || (self.deviceType == 'netdevice' "
                    "&& has(self.eSwitchMode) && self.eSwitchMode == 'switchdev')",
                    "message": "vdpaType needs deviceType netdevice and eSwitchMode switchdev",
                    "fieldPath": ".vdpaType",
                },
                {
                    "rule": "!has(self.bridge) || (has(self.eSwitchMode) "
                    "&& self.eSwitchMode == 'switchdev' "
                    "&& !(has(self.externallyManaged) && self.externallyManaged))",
                    "message": "bridge needs eSwitchMode switchdev and cannot be used with "
                    "externallyManaged",
                    "fieldPath": ".bridge",
                },
                {
                    "rule": "!has(self.nicSelector.netFilter) || (!has(self.eSwitchMode) "
                    "&& !has(self.bridge) && (!has(self.linkType) "
                    "|| self.linkType.lowerAscii() == 'eth'))",
                    "message": "a netFilter policy cannot set eSwitchMode or bridge, and its "
                    "linkType must be eth",
                    "fieldPath": ".nicSelector.netFilter",
                },
            ]
        }
    )

    resource_name: str = Field(min_length=1, max_length=63, pattern=RESOURCE_NAME_PATTERN)
    """Device plugin resource of the VFs; the resource prefix is prepended."""
    node_selector: dict[str, str]
    """Labels of the nodes to configure."""
    priority: int = Field(default=99, ge=0, le=99)
    """Priority of the policy: 0 is the highest; a higher priority wins on a shared PF."""
    mtu: int | None = Field(default=None, ge=1, le=MAX_MTU)
    """MTU of the VFs."""
    num_vfs: int = Field(
        ge=0,
        json_schema_extra={
            "x-kubernetes-validations": [{"rule": "self > 0", "message": "must be greater than 0"}]
        },
    )
    """Number of VFs for each PF."""
    nic_selector: SriovNetworkNicSelector
    """The PFs to configure."""
    device_type: DeviceType = "netdevice"
    """Driver of the VFs: the kernel driver (netdevice) or vfio-pci for DPDK."""
    is_rdma: bool = False
    """Expose the VFs' RDMA devices."""
    need_vhost_net: bool | None = None
    """Mount /dev/vhost-net into the pods."""
    link_type: LinkType | None = None
    """Link type of the PFs: eth or ib."""
    e_switch_mode: ESwitchMode | None = None
    """E-switch mode of the NIC."""
    vdpa_type: VdpaType | None = None
    """vDPA device type of the VFs."""
    exclude_topology: bool | None = None
    """Do not advertise the NUMA node of the VFs."""
    externally_managed: bool | None = None
    """The VFs are created outside the operator; it only hands them to the device plugin."""
    bridge: Bridge | None = None
    """Software bridge for the PFs (switchdev only)."""


class EmptyStatus(ApiModel):
    """Upstream keeps no status for this kind (a policy's outcome shows in the node states)."""


class SriovNetworkNodePolicyStatus(ApiModel):
    """nicop addition: whether the policy was accepted, and if not, which rule it breaks."""

    conditions: Conditions = None
    """Accepted: False names the policies it overlaps or the limit it exceeds."""


class SriovNetworkNodePolicy(KubeObject):
    """Creates and exposes SR-IOV VFs on the PFs it selects, on the nodes it selects."""

    crd = CrdInfo(
        GROUP, VERSION, "SriovNetworkNodePolicy", "sriovnetworknodepolicies", namespaced=True,
        printer_columns=(
            PrinterColumn("Resource", ".spec.resourceName"),
            PrinterColumn("VFs", ".spec.numVfs", "integer"),
            PrinterColumn("Priority", ".spec.priority", "integer"),
            AGE,
        ),
    )

    # Optional as in upstream's schema; the operator refuses a policy without one.
    spec: SriovNetworkNodePolicySpec | None = None
    status: SriovNetworkNodePolicyStatus | None = None


class NetworkStatus(ApiModel):
    """Observed state of a network: a Ready condition about its NetworkAttachmentDefinition."""

    conditions: Conditions = None
    """Ready, with reason NetworkReady or why not."""


class SriovNetworkSpec(ApiModel):
    """An SR-IOV network; rendered as a NetworkAttachmentDefinition for the sriov CNI."""

    network_namespace: str | None = None
    """Namespace of the NetworkAttachmentDefinition (only for networks in the operator
    namespace)."""
    resource_name: str
    """Device plugin resource of the VFs, as in the policy."""
    capabilities: JsonObject | None = None
    """CNI capabilities, as JSON, e.g. {"mac": true, "ips": true}."""
    ipam: JsonObject | None = None
    """IPAM configuration, as JSON."""
    vlan: int | None = Field(default=None, ge=0, le=4094)
    """VLAN ID of the VF; 0 means none."""
    vlan_qos: int | None = Field(default=None, ge=0, le=7, alias="vlanQoS")
    """VLAN QoS (priority) of the VF."""
    vlan_proto: Literal["802.1q", "802.1Q", "802.1ad", "802.1AD"] | None = None
    """VLAN protocol of the VF."""
    spoof_chk: OnOff | None = None
    """VF spoof checking."""
    trust: OnOff | None = None
    """VF trust mode."""
    link_state: LinkState | None = None
    """VF link state."""
    min_tx_rate: int | None = Field(default=None, ge=0)
    """Minimum TX rate of the VF in Mbps; 0 means no limit."""
    max_tx_rate: int | None = Field(default=None, ge=0)
    """Maximum TX rate of the VF in Mbps; 0 means no limit."""
    meta_plugins: JsonObjects | None = None
    """CNI plugins chained after sriov: JSON objects separated by commas."""
    log_level: Literal["panic", "error", "warning", "info", "debug", ""] = "info"
    """Log level of the sriov CNI plugin."""
    log_file: str | None = None
    """Log file of the sriov CNI plugin."""


class SriovNetwork(KubeObject):
    """An Ethernet SR-IOV secondary network."""

    crd = CrdInfo(
        GROUP, VERSION, "SriovNetwork", "sriovnetworks", namespaced=True,
        printer_columns=(PrinterColumn("Resource", ".spec.resourceName"), READY, AGE),
    )

    # Optional as in upstream's schema; without one the network says what is missing.
    spec: SriovNetworkSpec | None = None
    status: NetworkStatus | None = None


class SriovIBNetworkSpec(ApiModel):
    """An InfiniBand SR-IOV network; rendered for the ib-sriov CNI."""

    network_namespace: str | None = None
    """Namespace of the NetworkAttachmentDefinition (only for networks in the operator
    namespace)."""
    resource_name: str
    """Device plugin resource of the VFs, as in the policy."""
    capabilities: JsonObject | None = None
    """CNI capabilities, as JSON, e.g. {"infinibandGUID": true}."""
    ipam: JsonObject | None = None
    """IPAM configuration, as JSON."""
    link_state: LinkState | None = None
    """VF link state."""
    meta_plugins: JsonObjects | None = None
    """CNI plugins chained after ib-sriov: JSON objects separated by commas."""


class SriovIBNetwork(KubeObject):
    """An InfiniBand SR-IOV secondary network."""

    crd = CrdInfo(
        GROUP, VERSION, "SriovIBNetwork", "sriovibnetworks", namespaced=True,
        printer_columns=(PrinterColumn("Resource", ".spec.resourceName"), READY, AGE),
    )

    # Optional as in upstream's schema; without one the network says what is missing.
    spec: SriovIBNetworkSpec | None = None
    status: NetworkStatus | None = None


class TrunkConfig(ApiModel):
    """VLANs an OVS port trunks: one `id`, or the range `minID` to `maxID`."""

    min_id: int | None = Field(default=None, ge=0, le=4095, alias="minID")
    """First VLAN of a range."""
    max_id: int | None = Field(default=None, ge=0, le=4095, alias="maxID")
    """Last VLAN of a range."""
    id: int | None = Field(default=None, ge=0, le=4095)
    """A single VLAN."""


class OVSNetworkSpec(ApiModel):
    """A network on the OVS bridge of switchdev VFs; rendered for the ovs CNI."""

    network_namespace: str | None = None
    """Namespace of the NetworkAttachmentDefinition (only for networks in the operator
    namespace)."""
    resource_name: str
    """Device plugin resource of the switchdev VFs, as in the policy."""
    capabilities: JsonObject | None = None
    """CNI capabilities, as JSON, e.g. {"mac": true}."""
    ipam: JsonObject | None = None
    """IPAM configuration, as JSON."""
    meta_plugins: JsonObjects | None = None
    """CNI plugins chained after ovs: JSON objects separated by commas."""
    bridge: str | None = None
    """OVS bridge of the port; unset, ovs-cni picks the bridge of the VF's PF."""
    vlan: int | None = Field(default=None, ge=0, le=4095)
    """VLAN tag of the port; 0 means none."""
    mtu: int | None = Field(default=None, ge=0)
    """MTU of the port; 0 means the bridge's."""
    trunk: list[TrunkConfig] | None = None
    """VLANs the port trunks."""
    interface_type: str | None = None
    """OVS interface type of the port, e.g. dpdk."""


class OVSNetwork(KubeObject):
    """A secondary network of switchdev VFs plugged into an OVS bridge (hardware offload)."""

    crd = CrdInfo(
        GROUP, VERSION, "OVSNetwork", "ovsnetworks", namespaced=True,
        printer_columns=(READY, DEGRADED, AGE),
    )

    # Optional as in upstream's schema; without one the network says what is missing.
    spec: OVSNetworkSpec | None = None
    status: NetworkStatus | None = None


class VfGroup(ApiModel):
    """A range of VFs of one PF with the same configuration."""

    resource_name: str | None = None
    """Device plugin resource of the VFs."""
    device_type: str | None = None
    """Driver of the VFs: netdevice or vfio-pci."""
    vf_range: str | None = None
    """The VF indexes, first-last."""
    policy_name: str | None = None
    """The policy this group comes from."""
    mtu: int | None = None
    """MTU of the VFs."""
    is_rdma: bool | None = None
    """RDMA is enabled on the VFs."""
    vdpa_type: str | None = None
    """vDPA type of the VFs."""


class Interface(ApiModel):
    """Desired configuration of one PF."""

    pci_address: str
    """PCI address of the PF."""
    num_vfs: int | None = None
    """Number of VFs."""
    mtu: int | None = None
    """MTU of the PF."""
    name: str | None = None
    """Interface name of the PF."""
    link_type: str | None = None
    """Link type: eth or ib."""
    e_switch_mode: str | None = None
    """E-switch mode."""
    externally_managed: bool | None = None
    """The VFs are created outside the operator."""
    vf_groups: list[VfGroup] | None = None
    """The VFs, grouped by configuration."""


class VirtualFunction(ApiModel):
    """A VF found on the node."""

    name: str | None = None
    mac: str | None = None
    assigned: str | None = None
    driver: str | None = None
    pci_address: str
    vendor: str | None = None
    device_id: str | None = Field(default=None, alias="deviceID")
    vlan: int | None = Field(default=None, alias="Vlan")
    mtu: int | None = None
    vf_id: int = Field(alias="vfID")
    vdpa_type: str | None = None
    representor_name: str | None = None
    guid: str | None = None


class InterfaceExt(ApiModel):
    """A PF found on the node, with its VFs."""

    name: str | None = None
    mac: str | None = None
    driver: str | None = None
    pci_address: str
    vendor: str | None = None
    device_id: str | None = Field(default=None, alias="deviceID")
    net_filter: str | None = None
    mtu: int | None = None
    num_vfs: int | None = None
    link_speed: str | None = None
    link_type: str | None = None
    """ETH or IB."""
    link_admin_state: str | None = None
    e_switch_mode: str | None = None
    externally_managed: bool | None = None
    totalvfs: int | None = None
    """The most VFs the PF supports."""
    vfs: list[VirtualFunction] | None = Field(default=None, alias="Vfs")
    alt_names: list[str] | None = None


class OVSUplinkConfigExt(ApiModel):
    """The uplink (PF) of an OVS bridge on the node."""

    pci_address: str
    name: str | None = None
    interface: OVSInterfaceConfig | None = None


class OVSConfigExt(ApiModel):
    """An OVS bridge on the node."""

    name: str
    bridge: OVSBridgeConfig | None = None
    uplinks: list[OVSUplinkConfigExt] | None = None


class Bridges(ApiModel):
    """Software bridges on the node."""

    ovs: list[OVSConfigExt] | None = None


class System(ApiModel):
    """Node-wide settings."""

    rdma_mode: RdmaMode | None = None
    """RDMA subsystem mode."""
    ovs_config: dict[str, str] | None = None
    """other_config of ovs-vswitchd."""


class SriovNetworkNodeStateSpec(ApiModel):
    """What the config daemon must apply on the node; written by the operator."""

    interfaces: list[Interface] | None = None
    """The PFs to configure."""
    bridges: Bridges | None = None
    """Software bridges."""
    system: System | None = None
    """Node-wide settings."""


class SriovNetworkNodeStateStatus(ApiModel):
    """What the config daemon found and did on the node."""

    interfaces: list[InterfaceExt] | None = None
    """The SR-IOV capable PFs of the node."""
    bridges: Bridges | None = None
    """Software bridges."""
    system: System | None = None
    """Node-wide settings."""
    sync_status: str | None = None
    """InProgress, Succeeded or Failed."""
    last_sync_error: str | None = None
    """The error of the last failed sync."""
    conditions: Conditions = None
    """Ready, Progressing, Draining, ..."""


class SriovNetworkNodeState(KubeObject):
    """One node's SR-IOV configuration, desired and found; named after the node."""

    crd = CrdInfo(
        GROUP, VERSION, "SriovNetworkNodeState", "sriovnetworknodestates", namespaced=True,
        printer_columns=(
            PrinterColumn("Sync Status", ".status.syncStatus"),
            READY,
            PROGRESSING,
            PrinterColumn("Draining", '.status.conditions[?(@.type=="Draining")].status'),
            PrinterColumn(
                "Desired Sync State",
                r".metadata.annotations.sriovnetwork\.openshift\.io/desired-state",
            ),
            PrinterColumn(
                "Current Sync State",
                r".metadata.annotations.sriovnetwork\.openshift\.io/current-state",
            ),
            AGE,
        ),
    )

    spec: SriovNetworkNodeStateSpec = Field(default_factory=SriovNetworkNodeStateSpec)
    status: SriovNetworkNodeStateStatus | None = None


class LogConfig(ApiModel):
    """Persistent logs of the config daemon on the host."""

    enabled: bool | None = None
    """Keep logs on the host (default true)."""
    max_size_mb: int | None = Field(default=None, ge=1, le=1024, alias="maxSizeMB")
    """Size of a log file before rotation, in MB (default 100)."""
    max_files: int | None = Field(default=None, ge=1, le=20)
    """Rotated files kept (default 5)."""
    max_age_days: int | None = Field(default=None, ge=0, le=365)
    """Days rotated files are kept; 0 keeps them regardless of age (default 30)."""
    compress: bool | None = None
    """Gzip rotated files (default true)."""
    host_path: str | None = None
    """Directory under /var/log for the files (default /var/log/sriov-network-config-daemon)."""


class SriovOperatorConfigSpec(ApiModel):
    """Operator-wide settings."""

    config_daemon_node_selector: dict[str, str] | None = None
    """Labels of the nodes the config daemon runs on."""
    enable_injector: bool | None = None
    """Deploy the network resources injector webhook."""
    enable_operator_webhook: bool | None = None
    """Deploy the operator's admission webhook."""
    log_level: int | None = Field(default=None, ge=0, le=2)
    """Log verbosity of the operator, 0 to 2."""
    disable_drain: bool | None = None
    """Do not drain nodes before configuring them."""
    enable_ovs_offload: bool | None = None
    """Enable OVS hardware offload."""
    configuration_mode: Literal["daemon", "systemd"] | None = None
    """Apply the configuration from the daemon (default) or from a systemd service at boot."""
    use_cdi: bool | None = Field(default=None, alias="useCDI")
    """Run the device plugin in Container Device Interface mode."""
    disable_plugins: list[Literal["mellanox"]] | None = None
    """Config daemon plugins to disable."""
    feature_gates: dict[str, bool] | None = None
    """Experimental features to enable."""
    config_daemon_env_vars: dict[str, str] | None = None
    """Extra environment variables of the config daemon."""
    log_config: LogConfig | None = None
    """Persistent logs of the config daemon."""


class SriovOperatorConfigStatus(ApiModel):
    """Observed state of the operator."""

    injector: str | None = None
    """State of the network resources injector."""
    operator_webhook: str | None = None
    """State of the operator webhook."""
    conditions: Conditions = None
    """Ready and friends."""


def operator_settings(config: dict[str, Any] | None) -> SriovOperatorConfigSpec:
    """A SriovOperatorConfig's spec as its model; with none, upstream's defaults."""
    return SriovOperatorConfigSpec.model_validate((config or {}).get("spec") or {})


class SriovOperatorConfig(KubeObject):
    """The operator's settings; the one object is named default."""

    metadata_name_schema: ClassVar[dict[str, Any]] = {"enum": ["default"]}

    crd = CrdInfo(
        GROUP, VERSION, "SriovOperatorConfig", "sriovoperatorconfigs", namespaced=True,
        printer_columns=(READY, PROGRESSING, DEGRADED, AGE),
    )

    spec: SriovOperatorConfigSpec = Field(default_factory=SriovOperatorConfigSpec)
    status: SriovOperatorConfigStatus | None = None


class OvsHardwareOffloadConfig(ApiModel):
    """OVS hardware offload for the pool."""

    name: str | None = None
    """Name of the configuration (on OpenShift, the MachineConfigPool)."""
    other_config: dict[str, str] = Field(default={"hw-offload": "true"})
    """other_config of ovs-vswitchd."""


class SriovNetworkPoolConfigSpec(ApiModel):
    """A pool of nodes with a limit on how many are configured (drained) at once."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.ovsHardwareOffloadConfig) "
                    "|| !has(self.ovsHardwareOffloadConfig.name) "
                    "|| !(has(self.maxUnavailable) || has(self.nodeSelector))",
                    "message": "ovsHardwareOffloadConfig cannot be combined with maxUnavailable "
                    "or nodeSelector",
                    "fieldPath": ".ovsHardwareOffloadConfig",
                }
            ]
        }
    )

    ovs_hardware_offload_config: OvsHardwareOffloadConfig | None = None
    """OVS hardware offload for the pool (OpenShift)."""
    node_selector: LabelSelector | None = None
    """The nodes of the pool."""
    max_unavailable: IntOrPercent | None = None
    """How many nodes (or what percentage) may be unavailable at once; unset means no limit."""
    rdma_mode: RdmaMode | None = None
    """RDMA subsystem mode of the nodes."""


def pool_settings(pool: dict[str, Any] | None) -> SriovNetworkPoolConfigSpec:
    """A SriovNetworkPoolConfig's spec as its model; the default pool (None) has no limit set
    and no RDMA mode."""
    return SriovNetworkPoolConfigSpec.model_validate((pool or {}).get("spec") or {})


class SriovNetworkPoolConfig(KubeObject):
    """Groups nodes so that configuration changes drain only some of them at a time."""

    crd = CrdInfo(
        GROUP, VERSION, "SriovNetworkPoolConfig", "sriovnetworkpoolconfigs", namespaced=True,
        printer_columns=(PrinterColumn("Max Unavailable", ".spec.maxUnavailable"), AGE),
    )

    spec: SriovNetworkPoolConfigSpec = Field(default_factory=SriovNetworkPoolConfigSpec)
    status: EmptyStatus | None = None
