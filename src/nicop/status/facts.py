"""What `nicop status` and `nicop diagnose` both read off a snapshot, so they always agree
on what "allocatable", "in use" or "driver ready" mean."""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from nicop.api import labels as ofed
from nicop.api import nodes as node_rules
from nicop.api import upgrade
from nicop.api.agents import is_nicop_image
from nicop.api.labels import (
    DEVICE_PLUGIN_LABEL,
    DRIVER_CONTAINER,
    MELLANOX_LABEL,
    POLICY_NAME,
    SRIOV_BY_DRA_LABEL,
)
from nicop.kube.resources import (
    Obj,
    quantity,
)
from nicop.kube.resources import Resource as Kind
from nicop.kube.times import parse

Snapshot = dict[str, Any]

SCHEMA_VERSION = 1
DEFAULT_NAMESPACE = "nvidia-network-operator"
READY_FILE = ofed.DRIVER_READY_FILE
# Resources shown per node: the RDMA shared device plugin's default prefix and nvidia.com
# (both device plugins as the operator configures them), but not the GPU operator's GPUs.
RESOURCE_PREFIXES = ("rdma/", "nvidia.com/")
EXCLUDED_RESOURCES = frozenset({"nvidia.com/gpu"})
DEVICE_PLUGIN_STATES = {
    "state-RDMA-device-plugin": ("rdmaSharedDevicePlugin", "configList", "rdma"),
    "state-SRIOV-device-plugin": ("sriovDevicePlugin", "resourceList", "intel.com"),
}
OPERATOR_APP_NAMES = ("network-operator", "nicop")
# NFD's per-node feature objects (NFD v0.14 on): the PCI devices it found, with their vendor.
NODE_FEATURE = Kind("nfd.k8s-sigs.io", "v1alpha1", "NodeFeature", "nodefeatures")
NODE_FEATURE_NODE_LABEL = "nfd.node.kubernetes.io/node-name"
NIC_NODE_POLICY = Kind("mellanox.com", "v1alpha1", "NicNodePolicy", "nicnodepolicies",
                       namespaced=False)
MELLANOX_VENDOR = "15b3"
# Device resources of other NVIDIA products (the GPU operator's): no sign of a NIC.
NON_NIC_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-", "nvidia.com/vgpu", "nvidia.com/pgpu")
TERMINATED = ("Succeeded", "Failed")



def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def labels_of(obj: Obj) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def policy_of(snap: Snapshot) -> Obj | None:
    """The NicClusterPolicy the operator acts on (only `nic-cluster-policy` is)."""
    return next((p for p in snap.get("policies") or [] if name_of(p) == POLICY_NAME), None)


def pod_requests(pod: Obj) -> dict[str, int]:
    """What a pod takes from its node, as the scheduler counts it: the containers' requests
    added up, or the largest init container's if that is more (limits stand in for requests,
    as the API server defaults them for extended resources)."""
    spec = pod.get("spec") or {}

    def of(container: Obj) -> dict[str, int]:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: quantity(v) for k, v in wanted.items()}

    total: dict[str, int] = defaultdict(int)
    for c in spec.get("containers") or []:
        for k, v in of(c).items():
            total[k] += v
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total[k], v)
    return dict(total)


def is_device_resource(name: str) -> bool:
    return name.startswith(RESOURCE_PREFIXES) and name not in EXCLUDED_RESOURCES


def pods_on(snap: Snapshot, node: str) -> list[Obj]:
    return [p for p in snap.get("pods") or []
            if (p.get("spec") or {}).get("nodeName") == node
            and (p.get("status") or {}).get("phase") not in TERMINATED]


def in_use(snap: Snapshot, node: str, exclude_uid: str | None = None) -> dict[str, int]:
    """Requests of the non-terminated pods bound to a node, by resource."""
    used: dict[str, int] = defaultdict(int)
    for pod in pods_on(snap, node):
        if exclude_uid and (pod.get("metadata") or {}).get("uid") == exclude_uid:
            continue
        for k, v in pod_requests(pod).items():
            used[k] += v
    return dict(used)


def configured_resources(policy: Obj | None) -> dict[str, list[str]]:
    """The resource names each device plugin of the policy advertises, by state name."""
    out: dict[str, list[str]] = {}
    spec = (policy or {}).get("spec") or {}
    for state, (section, key, default_prefix) in DEVICE_PLUGIN_STATES.items():
        plugin = spec.get(section)
        if not isinstance(plugin, dict):
            continue
        try:
            config = json.loads(plugin.get("config") or "{}")
        except ValueError:
            config = {}
        names = []
        for entry in (config.get(key) if isinstance(config, dict) else None) or []:
            if isinstance(entry, dict) and entry.get("resourceName"):
                prefix = entry.get("resourcePrefix") or default_prefix
                names.append(f"{prefix}/{entry['resourceName']}")
        out[state] = names
    return out


def node_resources(snap: Snapshot, node: Obj, extra: Iterable[str] = ()) -> list[Obj]:
    """Device resources of a node: capacity, allocatable and in use, by name."""
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    used = in_use(snap, name_of(node))
    names = {n for n in (*capacity, *allocatable, *used) if is_device_resource(n)}
    names.update(extra)
    return [
        {"name": n, "capacity": quantity(capacity.get(n, 0)),
         "allocatable": quantity(allocatable.get(n, 0)), "inUse": used.get(n, 0)}
        for n in sorted(names)
    ]


def container_status(pod: Obj, name: str) -> Obj | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == name:
            return c  # type: ignore[no-any-return]
    return None


def container_problem(status: Obj | None) -> str | None:
    """Why a container is not running well, in the kubelet's words (CrashLoopBackOff, ...)."""
    if status is None:
        return "no status yet"
    state = status.get("state") or {}
    if waiting := state.get("waiting"):
        reason = waiting.get("reason") or "Waiting"
        text = f"{reason}: {waiting['message']}" if waiting.get("message") else str(reason)
        last = (status.get("lastState") or {}).get("terminated")
        if last:
            lines = [line for line in str(last.get("message") or "").splitlines() if line.strip()]
            text += f"; last exit {last.get('exitCode')}" + (
                f": {lines[-1][-300:]}" if lines else "")
        return text
    if terminated := state.get("terminated"):
        why = terminated.get("reason") or f"exit {terminated.get('exitCode')}"
        return f"terminated ({why})"
    last = (status.get("lastState") or {}).get("terminated")
    if last and not status.get("ready"):
        return f"last exit: {last.get('reason') or last.get('exitCode')}"
    return None


def owner_name(pod: Obj, kind: str) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == kind:
            return str(ref.get("name"))
    return None


def driver_pod(snap: Snapshot, node: str) -> Obj | None:
    """The driver pod of a node (pods labelled nvidia.com/ofed-driver in the operator
    namespace); a pod being deleted only when no other exists."""
    pods = [p for p in pods_on(snap, node)
            if (p.get("metadata") or {}).get("namespace") == snap["namespace"]
            and ofed.DRIVER_LABEL in labels_of(p)]
    pods.sort(key=lambda p: bool((p.get("metadata") or {}).get("deletionTimestamp")))
    return pods[0] if pods else None


def image_tag(image: str) -> str:
    if "@" in image:
        return image.split("@", 1)[1]
    last = image.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else "latest"


def driver_version(image: str, node: Obj) -> str:
    """The driver version in a driver image: its tag without the `-<os><version>-<arch>`
    suffix the operator adds (and the kernel of a precompiled image)."""
    tag = image_tag(image)
    if tag.startswith("sha256:"):
        return tag
    labels = labels_of(node)
    suffix = (f"-{labels.get(ofed.OS_LABEL, '')}{labels.get(ofed.OS_VERSION_LABEL, '')}"
              f"-{labels.get(ofed.ARCH_LABEL, 'amd64')}")
    if tag.endswith(suffix):
        tag = tag[: -len(suffix)]
        kernel = labels.get(ofed.KERNEL_LABEL)
        if kernel and tag.endswith(f"-{kernel}"):
            tag = tag[: -len(kernel) - 1]
    return tag


def driver_of(snap: Snapshot, node: Obj) -> Obj | None:
    pod = driver_pod(snap, name_of(node))
    if pod is None:
        return None
    container = next((c for c in (pod.get("spec") or {}).get("containers") or []
                      if c.get("name") == DRIVER_CONTAINER), None)
    image = str((container or {}).get("image", ""))
    status = container_status(pod, DRIVER_CONTAINER)
    version = driver_version(image, node) if image else ""
    if is_nicop_image(image):  # nicop's agent: one image, the version it installs in its env
        version = next((str(e.get("value", "")) for e in (container or {}).get("env") or []
                        if e.get("name") == "NVIDIA_NIC_DRIVER_VER"), "")
    ready = bool(status and status.get("ready")) and not (
        (pod.get("metadata") or {}).get("deletionTimestamp"))
    held = [] if ready else upgrade.held_reload(node)
    return {
        "pod": name_of(pod),
        "image": image,
        "version": version,
        "ready": ready,
        "restarts": int((status or {}).get("restartCount", 0)),
        "problem": None if ready else (
            "reload held: " + "; ".join(h["cause"] for h in held) if held
            else container_problem(status)),
        "heldReload": held,
    }


def node_state_of(snap: Snapshot, node: str) -> Obj | None:
    """The SriovNetworkNodeState of a node (named after it), preferring the operator's
    namespace."""
    states = [s for s in snap.get("nodeStates") or [] if name_of(s) == node]
    states.sort(key=lambda s: (s.get("metadata") or {}).get("namespace") != snap["namespace"])
    return states[0] if states else None


def sriov_served_by(snap: Snapshot, node: Obj) -> str | None:
    """dra where a DRA driver pod serving SR-IOV resources runs, device-plugin where the node
    is labelled for the SR-IOV device plugin (the operator never does both)."""
    if any(SRIOV_BY_DRA_LABEL in labels_of(p) for p in pods_on(snap, name_of(node))):
        return "dra"
    return "device-plugin" if labels_of(node).get(DEVICE_PLUGIN_LABEL) == "Enabled" else None


def sriov_of(state: Obj | None, served_by: str | None = None) -> Obj | None:
    if state is None:
        return None
    status = state.get("status") or {}
    wanted = sum(int(i.get("numVfs") or 0) for i in (state.get("spec") or {}).get("interfaces")
                 or [])
    configured = sum(len(i.get("Vfs") or []) for i in status.get("interfaces") or [])
    return {
        "syncStatus": status.get("syncStatus") or None,
        "lastSyncError": status.get("lastSyncError") or None,
        "vfsConfigured": configured,
        "vfsWanted": wanted,
        "servedBy": served_by,
    }


def node_ready(node: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def has_mellanox_nic(node: Obj) -> bool:
    """Whether NFD found a Mellanox NIC: the operator's label, or NFD's class+vendor label."""
    labels = labels_of(node)
    return labels.get(MELLANOX_LABEL) == "true" or any(
        node_rules.CLASS_VENDOR_LABEL.match(k) and v for k, v in labels.items())


def nic_signs(snap: Snapshot, node: Obj) -> list[str]:
    """Everything that says a node has a Mellanox NIC besides the label the operator selects by:
    NFD labels naming vendor 15b3 in any form, NFD's NodeFeature object, the driver's upgrade
    labels and mofed.wait, NIC resources its kubelet advertises, and pods of the operator's
    DaemonSets (the driver's among them) on it. Each sign in words; empty when none."""
    name = name_of(node)
    signs = node_rules.label_signs(node)
    for feature in snap.get("nodeFeatures") or []:
        if labels_of(feature).get(NODE_FEATURE_NODE_LABEL) != name:
            continue
        spec = feature.get("spec") or {}
        devices = ((spec.get("features") or {}).get("instances") or {}).get("pci.device") or {}
        found = sorted({str(attrs.get("device", "?"))
                        for e in devices.get("elements") or []
                        if (attrs := e.get("attributes") or {}).get("vendor") == MELLANOX_VENDOR})
        if found:
            meta = feature.get("metadata") or {}
            signs.append(f"NodeFeature {meta.get('namespace')}/{meta.get('name')} lists PCI "
                         f"device(s) {', '.join(f'{MELLANOX_VENDOR}:{d}' for d in found)}")
    status = node.get("status") or {}
    advertised = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    resources = sorted(r for r, v in advertised.items()
                       if is_device_resource(r) and not r.startswith(NON_NIC_RESOURCES)
                       and quantity(v) > 0)
    if resources:
        signs.append("advertises " + ", ".join(resources))
    policy_daemonsets = {name_of(ds) for ds in snap.get("daemonSets") or []}
    agents = sorted(name_of(p) for p in pods_on(snap, name)
                    if (p.get("metadata") or {}).get("namespace") == snap.get("namespace")
                    and (ofed.DRIVER_LABEL in labels_of(p)
                         or owner_name(p, "DaemonSet") in policy_daemonsets))
    if agents:
        signs.append("runs operator pod(s) " + ", ".join(agents))
    return signs


def unmanaged_nic(snap: Snapshot, node: Obj) -> str | None:
    """Why a node with a Mellanox NIC is not managed, with the fix (as node_rules'
    unmanaged_reason, adding the signs only the whole cluster shows); None if not such a node."""
    labels = labels_of(node)
    if node_rules.is_managed(node) or labels.get(ofed.OPT_IN_LABEL) == "false" or any(
            node_rules.CLASS_VENDOR_LABEL.match(k) for k in labels):
        return node_rules.unmanaged_reason(node)
    signs = nic_signs(snap, node)
    return node_rules.unmanaged_with_signs(name_of(node), signs) if signs else None


def leader_of(snap: Snapshot) -> Obj | None:
    """The operator's leader from its Lease; `active` while the lease has not run out."""
    lease = snap.get("lease")
    if not lease:
        return None
    spec = lease.get("spec") or {}
    identity = spec.get("holderIdentity") or ""
    if not identity:
        return None
    duration = int(spec.get("leaseDurationSeconds") or 15)
    renewed = parse(spec.get("renewTime") or spec.get("acquireTime"))
    now = parse(snap.get("collectedAt")) or datetime.datetime.now(datetime.UTC)
    age = (now - renewed).total_seconds() if renewed else None
    return {
        "identity": identity,
        "renewTime": spec.get("renewTime"),
        "leaseDurationSeconds": duration,
        "secondsSinceRenewal": None if age is None else max(0, round(age)),
        "active": age is not None and age <= duration,
    }


def operator_pods(snap: Snapshot) -> list[Obj]:
    """Pods of the operator: labelled as its Deployment labels them, or named by the lease
    holder (a pod's hostname is its name; identities are `<hostname>_<suffix>` or the name)."""
    leader = leader_of(snap)
    holder = (leader or {}).get("identity", "")
    out = []
    for pod in snap.get("pods") or []:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != snap["namespace"]:
            continue
        name = str(meta.get("name"))
        labelled = labels_of(pod).get("app.kubernetes.io/name") in OPERATOR_APP_NAMES
        is_holder = bool(holder) and (holder == name or holder.startswith(name + "_"))
        if labelled or is_holder:
            out.append(pod)
    return out


def pod_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])
