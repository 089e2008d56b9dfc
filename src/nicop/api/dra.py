"""Names of nicop's DRA driver that the node plugin publishes and the operator renders: the
driver, its DeviceClasses, its device attributes, and the DeviceClass objects themselves.

Users write these names into ResourceClaims (`deviceClassName: vf.rdma.nicop.io`, CEL on
`device.attributes["rdma.nicop.io"].linkType`, `matchAttribute: resource.kubernetes.io/pcieRoot`),
so they are an API: renaming one breaks claims already written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

RESOURCE_API = "resource.k8s.io/v1"
DRIVER = "rdma.nicop.io"

# DeviceClasses: whole physical functions, SR-IOV virtual functions, and shared ports.
PF_CLASS = DRIVER
VF_CLASS = f"vf.{DRIVER}"
SHARED_CLASS = f"shared.{DRIVER}"

# Kubernetes' standard attributes (k8s.io/dynamic-resource-allocation deviceattribute), shared
# with other drivers: the NVIDIA GPU driver publishes the same two, so a claim can ask for a GPU
# and a NIC behind one PCIe root complex.
STANDARD_DOMAIN = "resource.kubernetes.io"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"  # "pci0000:15"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"  # "0000:18:00.0"
# The NUMA node, standard for comparing across drivers (as dra-driver-sriov, CPU and memory
# drivers publish it): int, left out where the firmware gives none.
STANDARD_NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"

# The driver's own attributes. A ResourceSlice names them without domain (the driver's domain
# is implied); CEL reads them as device.attributes["rdma.nicop.io"].<name>.
KIND = "kind"  # string: KIND_PF or KIND_VF
PCI_ADDRESS = "pciAddress"  # string, dddd:bb:dd.f
NUMA_NODE = "numaNode"  # int, -1 when the firmware gives none
VENDOR_ID = "vendorID"  # string, 4 hex digits ("15b3")
DEVICE_ID = "deviceID"  # string, 4 hex digits ("1021", "101e")
LINK_TYPE = "linkType"  # string: LINK_INFINIBAND or LINK_ETHERNET
LINK_UP = "linkUp"  # bool
PORT_GUID = "portGUID"  # string, InfiniBand only ("b83f:d203:0000:0000")
MAC_ADDRESS = "macAddress"  # string, Ethernet only
RDMA_DEVICE = "rdmaDevice"  # string ("mlx5_3"), when an RDMA device is attached
NETDEV = "netdev"  # string: the function's own interface, when it has one
PF_NAME = "pfName"  # string, VFs only: the netdev of the VF's PF
VF_INDEX = "vfIndex"  # int, VFs only: N of the PF's virtfnN
# string, VFs an SriovNetworkNodePolicy made: its resourceName (without prefix), what the SR-IOV
# device plugin advertises them as, and what an extended-resource DeviceClass selects them by.
RESOURCE_NAME = "resourceName"
FIRMWARE_VERSION = "firmwareVersion"  # version (semver: leading zeros dropped, 22.38.1900)
DRIVER_VERSION = "driverVersion"  # string, of the NVIDIA driver package ("25.10-1.2.8.0")
# PFs with a Data Direct function (ConnectX-8 on GB300 and later), whose PCIE_ROOT is that
# function's, the root the NIC shares with its GPU: the function and the PF's own root.
DATA_DIRECT = "dataDirect"  # string, the function's PCI address ("0008:03:00.0")
NIC_PCIE_ROOT = "nicPcieRoot"  # string, the PF's own root ("pci0000:00")

KIND_PF, KIND_VF, KIND_SHARED = "pf", "vf", "shared"

# A shared port (draDriver.sharedRdma, what the RDMA shared device plugin gives as one resource):
# one device per port that many claims hold at once (DRAConsumableCapacity, beta and on since
# Kubernetes 1.34: allowMultipleAllocations), each taking one of its `pods`. On RoCE each pod's
# address takes a RoCE v1 and a v2 entry of the port's GID table, whose first two are the
# port's own link-local address: (GID table length - 2) / 2 pods, 63 of a 128-entry table. On
# InfiniBand pods share the port's GID, and the number is nicop's: IB_SHARED_PODS.
POD_CAPACITY = "pods"
GIDS_PER_POD = 2
IB_SHARED_PODS = 1000

# Device taints (resource.k8s.io/v1, DRADeviceTaints: beta and on since Kubernetes 1.35): a
# device that cannot carry traffic now keeps its name and allocations but takes no new claim.
# NoSchedule, not NoExecute: a link that flaps comes back, and evicting the pods using it would
# turn a short outage into lost training steps. A claim that wants the device anyway tolerates
# the key.
TAINT_LINK_DOWN = f"{DRIVER}/link-down"
TAINT_DRIVER_NOT_READY = f"{DRIVER}/driver-not-ready"
TAINT_RDMA_MISSING = f"{DRIVER}/rdma-missing"
TAINT_VF_FAILED = f"{DRIVER}/vf-failed"
TAINT_NO_SCHEDULE = "NoSchedule"
# What each taint means, and what makes it go, as `nicop diagnose` explains it.
TAINT_MEANINGS = {
    TAINT_LINK_DOWN: "the port's link is down (cable, switch port or subnet manager); the taint "
                     "goes when it is up",
    TAINT_DRIVER_NOT_READY: "the node's NIC driver is being loaded or upgraded (its driver "
                            "container is not Ready); the taint goes when it is",
    TAINT_RDMA_MISSING: "the port has its netdev but no RDMA device (mlx5_ib not loaded, or "
                        "the RDMA device was removed): pods would get no /dev/infiniband; the "
                        "taint goes when it is back",
    TAINT_VF_FAILED: "the SR-IOV config daemon could not make this planned VF (its node "
                     "state's lastSyncError says why: kubectl get sriovnetworknodestates -A); "
                     "the taint goes when it tries again",
}

# Binding conditions (KEP-5007, DRADeviceBindingConditions: beta and on since Kubernetes 1.36)
# of a VF published before it is ready: the scheduler allocates it but binds the pod only once
# the plugin sets CONDITION_VF_READY in the claim's status.devices, and gives the device up when
# it sets CONDITION_VF_FAILED (nicop.node.dra.binding).
CONDITION_VF_READY = f"{DRIVER}/VFReady"
CONDITION_VF_FAILED = f"{DRIVER}/VFFailed"

# Where the plugin meets the kubelet and the container runtime, on the node (its DaemonSet
# mounts them): its socket under the plugins directory, its registration socket, CDI specs.
PLUGINS_DIR = "/var/lib/kubelet/plugins"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_DIR = "/var/run/cdi"
LINK_INFINIBAND, LINK_ETHERNET = "infiniband", "ethernet"

# A PF and its VFs share one port, so a claim may have the PF or some of its VFs, never both
# (DRAPartitionableDevices, beta and on by default since Kubernetes 1.35): each PF with VFs has
# a counter set, named as its device, holding `vfs` = its sriov_numvfs; the PF consumes all of
# it and each VF one.
VF_COUNTER = "vfs"

# ResourceSlice limits (resource.k8s.io/v1 validation).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_COUNTERS = 64  # when a device of the slice consumes counters
MAX_COUNTER_SETS_PER_SLICE = 8  # a slice has either devices or counter sets
MAX_ATTRIBUTES_PER_DEVICE = 32  # attributes and capacities together
MAX_STRING_LENGTH = 64


def device_class(name: str, kind: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The DeviceClass selecting this driver's devices of `kind`."""
    expression = (f'device.driver == "{DRIVER}" && '
                  f'device.attributes["{DRIVER}"].{KIND} == "{kind}"')
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": metadata,
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def device_classes(labels: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The driver's DeviceClasses, for the operator to apply (with its own labels)."""
    return [device_class(PF_CLASS, KIND_PF, labels), device_class(VF_CLASS, KIND_VF, labels),
            device_class(SHARED_CLASS, KIND_SHARED, labels)]


# Extended resources served by DRA (KEP-5004, DRAExtendedResource: beta and on since Kubernetes
# 1.36): a DeviceClass with `extendedResourceName` lets a pod that asks for an SR-IOV resource
# (`nvidia.com/<resourceName>: 1`) get it from this driver on nodes where no device plugin
# advertises it, and from the device plugin elsewhere. The scheduler makes the claim (annotated
# EXTENDED_CLAIM_ANNOTATION); its requests name the class, the class the resource.
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
SRIOV_CLASS_SUFFIX = f"sriov.{DRIVER}"


def sriov_class_name(resource_name: str) -> str:
    """The DeviceClass of the VFs of one SR-IOV resourceName. Upstream allows `_` and capitals,
    which object names do not: such a name is lowered, `_` made `-`, and a hash of the
    original added, so `mlnx_vf` and `mlnx-vf` get classes of their own."""
    name = resource_name.lower().replace("_", "-")
    if name != resource_name:
        name += "-" + hashlib.sha256(resource_name.encode()).hexdigest()[:8]
    return f"{name}.{SRIOV_CLASS_SUFFIX}"


def sriov_class(prefix: str, resource_name: str,
                labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The DeviceClass serving `<prefix>/<resource_name>` with the VFs an SriovNetworkNodePolicy
    of that resourceName made."""
    body = device_class(sriov_class_name(resource_name), KIND_VF, labels)
    attribute = f'device.attributes["{DRIVER}"].{RESOURCE_NAME}'
    body["spec"]["selectors"].append({"cel": {"expression": (
        f'has({attribute}) && {attribute} == "{resource_name}"')}})
    body["spec"]["extendedResourceName"] = f"{prefix}/{resource_name}"
    return body


def device_plugin_env(resource: str) -> str:
    """The variable the SR-IOV device plugin gives a container the PCI addresses of `resource`
    (`nvidia.com/mlnx_vf`) in: PCIDEVICE_NVIDIA_COM_MLNX_VF."""
    return "PCIDEVICE_" + "".join(c if c.isalnum() else "_" for c in resource).upper()
