"""Labels, annotations and fixed names that the operator, the node agents and the readers
(`nicop status`, `nicop diagnose`) share. Most are upstream's: a cluster moving from the upstream
operator keeps them, so they must not change."""

from __future__ import annotations

NFD = "feature.node.kubernetes.io"

# The policy and its leader election.
POLICY_NAME = "nic-cluster-policy"  # the only NicClusterPolicy acted on, as upstream
LEASE_NAME = "12620820.mellanox.com"  # upstream's leader election ID: only one of both runs

# On the objects a policy renders.
STATE_LABEL = "nvidia.network-operator.state"
OWNER_LABEL = "ds-owner"
OWNER_VALUE = "NicClusterPolicy"
REVISION_ANNOTATION = "nvidia.network-operator.revision"
CONFIG_HASH_ANNOTATION = "nvidia.network-operator.config-hash"
# On every object nicop renders: what tells nicop's own objects from those another operator
# left (only its own are ever deleted).
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "nicop"

# On nodes: which are managed, and whether their driver is ready.
MELLANOX_LABEL = f"{NFD}/pci-15b3.present"
OPT_IN_LABEL = "nvidia.com/network-operator"
MOFED_WAIT_LABEL = "network.nvidia.com/operator.mofed.wait"

# The driver: its pods, the node labels its DaemonSets are pooled by, its readiness file.
DRIVER_LABEL = "nvidia.com/ofed-driver"
DRIVER_CONTAINER = "mofed-container"
OS_LABEL = f"{NFD}/system-os_release.ID"
OS_VERSION_LABEL = f"{NFD}/system-os_release.VERSION_ID"
KERNEL_LABEL = f"{NFD}/kernel-version.full"
ARCH_LABEL = "kubernetes.io/arch"
POOL_LABELS = (OS_LABEL, OS_VERSION_LABEL, KERNEL_LABEL)
DRIVER_READY_FILE = "/run/mellanox/drivers/.driver-ready"
SAFE_LOAD_ANNOTATION = "nvidia.com/ofed-driver-upgrade.driver-wait-for-safe-load"

# On nodes, by the operator: whether the SR-IOV device plugin runs there (upstream's).
DEVICE_PLUGIN_LABEL = "sriovnetwork.openshift.io/device-plugin"
# On the DRA driver's pods of a section with sriovResources: where they run, SR-IOV
# resources are served by DRA, not by the SR-IOV device plugin (nicop.operator.sriov).
SRIOV_BY_DRA_LABEL = "nicop.io/sriov-resources-by-dra"

# Networks.
RESOURCE_NAME_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
IPAM_USAGE_ANNOTATION = "nicop.io/ipam-usage"  # on a Node: what its CNI daemon handed out

# SR-IOV: the drain handshake between the config daemon and the operator (upstream's), and
# nicop's note of what blocks a drain.
NODE_STATE_ANNOTATION = "sriovnetwork.openshift.io/state"  # on the Node, by the daemon
DESIRED_STATE = "sriovnetwork.openshift.io/desired-state"  # on the node state, by the daemon
CURRENT_STATE = "sriovnetwork.openshift.io/current-state"  # on the node state, by the operator
IDLE = "Idle"
DRAIN_REQUIRED = "Drain_Required"
REBOOT_REQUIRED = "Reboot_Required"
DRAINING = "Draining"
DRAIN_COMPLETE = "DrainComplete"
# nicop addition: what holds a drain up, which the daemon reports in lastSyncError.
BLOCKED_ANNOTATION = "nicop.io/sriov-drain-blocked"
