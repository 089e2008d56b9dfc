"""`nicop status`: the state of the whole stack in one read, for people and for scripts.

Three steps, kept apart so each can be tested without a cluster: `collect` reads every object
it needs once into a plain snapshot of dicts; `summarize` turns a snapshot into the documented
status (docs/status-schema.json, what `-o json` prints); `render` draws that status with rich.
`nicop diagnose` runs its checks on the same snapshot and reuses the helpers below, so both
commands always agree on what "allocatable", "in use" or "driver ready" mean.

The driver's readiness file (/run/mellanox/drivers/.driver-ready) lives on the node, out of the
API's sight; its startup probe ties the driver container's Ready to that file, so the container's
Ready is what is reported as "driver ready".
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nicop import claims
from nicop.api import labels as ofed
from nicop.api import nodes as node_rules
from nicop.api import upgrade
from nicop.api.agents import is_nicop_image
from nicop.api.labels import (
    DEVICE_PLUGIN_LABEL,
    DRIVER_CONTAINER,
    LEASE_NAME,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    POLICY_NAME,
    SRIOV_BY_DRA_LABEL,
    STATE_LABEL,
)
from nicop.kube.client import ApiClient, ApiError, Unreachable
from nicop.kube.resources import (
    CIDRPOOL,
    DAEMONSET,
    DEPLOYMENT,
    IPPOOL,
    LEASE,
    NETWORK_ATTACHMENT_DEFINITION,
    NODE,
    POD,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    SRIOV_NODE_STATE,
    Obj,
    quantity,
)
from nicop.kube.resources import NIC_CLUSTER_POLICY as NCP
from nicop.kube.resources import Resource as Kind
from nicop.kube.times import parse, stamp

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


# ------------------------------------------------------------------ collection

async def _list(client: ApiClient, kind: Kind, namespace: str | None, errors: list[str], *,
                label_selector: str | None = None,
                field_selector: str | None = None) -> list[Obj]:
    """Objects of a kind; a kind the cluster does not serve (CRD not installed) is empty."""
    try:
        items, _ = await client.list(kind, namespace, label_selector=label_selector,
                                     field_selector=field_selector)
    except ApiError as e:
        if e.code != 404:
            where = f" in namespace {namespace}" if namespace and kind.namespaced else ""
            errors.append(f"cannot list {kind.plural}{where}: {e.code} {e.reason}: {e.message}")
        return []
    return items


async def collect(client: ApiClient, namespace: str, *, nads: bool = False,
                  graph: bool = False) -> Snapshot:
    """Read everything status and diagnose look at, concurrently, into a snapshot of dicts.

    Pods are read across all namespaces (without finished ones): "in use" is the sum of what
    every running pod on a node requests, whoever owns it. `graph` adds what only the picture
    of `--graph` shows: the policies' Deployments and the NicNodePolicies.
    """
    errors: list[str] = []
    lease: Obj | None
    try:
        lease = await client.get_or_none(LEASE, LEASE_NAME, namespace)
    except Unreachable:
        raise  # nothing else will answer either
    except ApiError as e:
        errors.append(f"cannot read Lease {namespace}/{LEASE_NAME}: {e.code} {e.reason}")
        lease = None
    running = ",".join(f"status.phase!={p}" for p in TERMINATED)
    reads = [
        _list(client, NODE, None, errors),
        _list(client, POD, None, errors, field_selector=running),
        _list(client, NCP, None, errors),
        _list(client, DAEMONSET, namespace, errors, label_selector=STATE_LABEL),
        _list(client, SRIOV_NODE_STATE, None, errors),
        _list(client, IPPOOL, namespace, errors),
        _list(client, CIDRPOOL, namespace, errors),
        _list(client, NODE_FEATURE, None, errors),
        _list(client, RESOURCE_SLICE, None, errors),
        _list(client, RESOURCE_CLAIM, None, errors),
    ]
    if nads:
        reads.append(_list(client, NETWORK_ATTACHMENT_DEFINITION, None, errors))
    if graph:
        reads.append(_list(client, DEPLOYMENT, namespace, errors, label_selector=STATE_LABEL))
        reads.append(_list(client, NIC_NODE_POLICY, None, errors))
    results = await asyncio.gather(*reads)
    snap: Snapshot = {
        "collectedAt": stamp(),
        "namespace": namespace,
        "lease": lease,
        "nodes": results[0],
        "pods": results[1],
        "policies": results[2],
        "daemonSets": results[3],
        "nodeStates": results[4],
        "ipPools": results[5],
        "cidrPools": results[6],
        "nodeFeatures": results[7],
        "resourceSlices": results[8],
        "resourceClaims": results[9],
        "errors": errors,
    }
    extra = iter(results[10:])
    if nads:
        snap["nads"] = next(extra)
    if graph:
        snap["deployments"] = next(extra)
        snap["nodePolicies"] = next(extra)
    return snap


class ClusterReadError(Exception):
    """The cluster could not be read: no kubeconfig, API server unreachable, access denied."""


def read_cluster(kubeconfig: str | Path | None,
                 collect: Callable[[ApiClient], Awaitable[Snapshot]],
                 context: str | None = None) -> Snapshot:
    """Run an async `collect(client)` with a client of the cluster (for the CLI); `context`
    picks a kubeconfig context other than the current one."""
    from nicop.kube.kubeconfig import KubeconfigError

    async def main() -> Snapshot:
        client = ApiClient(kubeconfig, context=context)
        try:
            return await collect(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except (KubeconfigError, ApiError, OSError) as e:
        raise ClusterReadError(str(e)) from None


# ------------------------------------------------------------------ helpers shared with diagnose

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


# ------------------------------------------------------------------ summary

def summarize(snap: Snapshot) -> Obj:
    """The documented status of a snapshot (docs/status-schema.json)."""
    policy = policy_of(snap)
    configured = configured_resources(policy)
    expected = sorted({n for names in configured.values() for n in names})
    leader = leader_of(snap)
    nodes = sorted(snap.get("nodes") or [], key=name_of)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "collectedAt": snap["collectedAt"],
        "namespace": snap["namespace"],
        "operator": {
            "leader": leader,
            "pods": [_operator_pod(p, leader) for p in operator_pods(snap)],
        },
        "policy": summarize_policy(policy) if policy else None,
        "ignoredPolicies": sorted(name_of(p) for p in snap.get("policies") or []
                                  if name_of(p) != POLICY_NAME),
        "nodes": [_node(snap, n, expected) for n in nodes],
        "ipamPools": _pools(snap),
        "driverUpgrade": upgrade.progress(nodes),
        "errors": list(snap.get("errors") or []),
    }


def _operator_pod(pod: Obj, leader: Obj | None) -> Obj:
    name = name_of(pod)
    identity = (leader or {}).get("identity", "")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    problems = [p for c in statuses if not c.get("ready") and (p := container_problem(c))]
    return {
        "name": name,
        "node": (pod.get("spec") or {}).get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase", "Unknown"),
        "ready": pod_ready(pod),
        "restarts": sum(int(c.get("restartCount", 0)) for c in statuses),
        "leader": bool(identity) and (identity == name or identity.startswith(name + "_")),
        "problem": problems[0] if problems else None,
    }


def summarize_policy(policy: Obj) -> Obj:
    """The policy part of the status: state, components and the Ready message."""
    status = policy.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return {
        "name": name_of(policy),
        "state": status.get("state"),
        "reason": status.get("reason"),
        "generation": int((policy.get("metadata") or {}).get("generation", 0)),
        "observedGeneration": status.get("observedGeneration"),
        "message": (ready or {}).get("message"),
        "components": [
            {"name": a.get("name", ""), "state": a.get("state", ""),
             "message": a.get("message") or None}
            for a in status.get("appliedStates") or []
        ],
    }


def _node(snap: Snapshot, node: Obj, expected: list[str]) -> Obj:
    name = name_of(node)
    labels = labels_of(node)
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    managed = node_rules.is_managed(node)
    return {
        "name": name,
        "ready": node_ready(node),
        "mellanoxNic": has_mellanox_nic(node) or bool(nic_signs(snap, node)),
        "managed": managed,
        "unmanagedReason": unmanaged_nic(snap, node),
        "driver": driver_of(snap, node),
        "upgradeState": labels.get(upgrade.STATE_LABEL),
        "drainBlocked": annotations.get(upgrade.DRAIN_BLOCKED_ANNOTATION),
        "drainStarted": annotations.get(upgrade.DRAIN_START_ANNOTATION),
        "mofedWait": labels.get(MOFED_WAIT_LABEL),
        "resources": node_resources(snap, node, expected if managed else ()),
        "sriov": sriov_of(node_state_of(snap, name), sriov_served_by(snap, node)),
        "draDevices": dra_devices(snap, name),
    }


def dra_devices(snap: Snapshot, node: str) -> list[Obj]:
    """The node's DRA devices per driver (newest pool generation) and how many claims hold."""
    taken = claims.allocated(snap.get("resourceClaims") or [])
    counts: dict[str, list[int]] = {}
    for driver, pool, device in claims.node_devices(snap.get("resourceSlices") or []).get(
            node, []):
        count = counts.setdefault(driver, [0, 0])
        count[0] += 1
        count[1] += (driver, pool, device["name"]) in taken
    return [{"driver": d, "devices": n, "allocated": a} for d, (n, a) in sorted(counts.items())]


def _pools(snap: Snapshot) -> list[Obj]:
    """Each IPPool and CIDRPool with the usage its nodes' CNI daemons publish."""

    usage = {name_of(n): node_rules.ipam_usage(n) for n in snap.get("nodes") or []}
    out = []
    for kind, pools, network_field in (("IPPool", snap.get("ipPools") or [], "subnet"),
                                       ("CIDRPool", snap.get("cidrPools") or [], "cidr")):
        for pool in sorted(pools, key=name_of):
            name = name_of(pool)
            blocks = (pool.get("status") or {}).get("allocations") or []
            nodes: list[Obj] = []
            for block in sorted(blocks, key=lambda b: str(b.get("nodeName"))):
                node = str(block.get("nodeName"))
                used = (usage.get(node) or {}).get(name) or {}
                nodes.append({
                    "name": node,
                    "block": block.get("prefix") or
                    (f"{block.get('startIP')}-{block.get('endIP')}" if block.get("startIP")
                     else None),
                    "allocated": _int_or_none(used.get("allocated")),
                    "size": _int_or_none(used.get("size")),
                })
            known = [n for n in nodes if n["allocated"] is not None]
            allocated = sum(int(n["allocated"]) for n in known)
            size = sum(int(n["size"] or 0) for n in known)
            out.append({
                "name": name,
                "namespace": (pool.get("metadata") or {}).get("namespace"),
                "kind": kind,
                "network": (pool.get("spec") or {}).get(network_field),
                "allocated": allocated if known else None,
                "size": size if known else None,
                "nodes": nodes,
            })
    return out


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# ------------------------------------------------------------------ rendering

STATE_STYLE = {"ready": "green", "ignore": "dim", "notReady": "yellow", "error": "red"}


def _table(*headers: str) -> Table:
    """A borderless table whose long values wrap instead of being cut off."""
    table = Table(box=None, pad_edge=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def _yes(ok: bool, yes: str = "yes", no: str = "no") -> Text:
    return Text(yes, style="green") if ok else Text(no, style="red")


def _ago(seconds: int | None) -> str:
    return "never" if seconds is None else f"{seconds}s ago"


def render(status: Obj) -> RenderableType:
    """The status as rich tables: operator, policy, nodes, IPAM pools, driver upgrade."""
    parts: list[RenderableType] = []
    parts.append(Text(f"nicop status  (namespace {status['namespace']}, "
                      f"read at {status['collectedAt']})", style="bold"))
    parts.extend(_render_operator(status))
    parts.extend(_render_policy(status))
    parts.extend(_render_nodes(status))
    parts.extend(_render_pools(status))
    parts.extend(_render_upgrade(status))
    for error in status.get("errors") or []:
        parts.append(Text(f"warning: {error}", style="yellow"))
    return Group(*parts)


def _render_operator(status: Obj) -> list[RenderableType]:
    op = status["operator"]
    leader = op["leader"]
    if leader is None:
        line = Text.from_markup("[red]no leader[/red]: nobody holds the operator's Lease")
    elif not leader["active"]:
        line = Text.from_markup(f"[red]leader lease expired[/red]: last held by "
                                f"{escape(leader['identity'])}, renewed "
                                f"{_ago(leader['secondsSinceRenewal'])}")
    else:
        line = Text.from_markup(f"leader [green]{escape(leader['identity'])}[/green] "
                                f"(renewed {_ago(leader['secondsSinceRenewal'])})")
    out: list[RenderableType] = [Text(""), Text("Operator", style="bold underline"), line]
    if op["pods"]:
        table = _table("pod", "node", "phase", "ready", "restarts", "leader", "problem")
        for p in op["pods"]:
            table.add_row(p["name"], p["node"] or "-", p["phase"], _yes(p["ready"]),
                          str(p["restarts"]), "*" if p["leader"] else "",
                          p["problem"] or "")
        out.append(table)
    else:
        out.append(Text(f"no operator pod in namespace {status['namespace']}"
                        + (" (the leader runs outside the cluster)" if leader else ""),
                        style="dim"))
    return out


def _render_policy(status: Obj) -> list[RenderableType]:
    out: list[RenderableType] = [Text(""), Text("NicClusterPolicy", style="bold underline")]
    policy = status["policy"]
    for name in status.get("ignoredPolicies") or []:
        out.append(Text(f"NicClusterPolicy {name} is ignored: only {POLICY_NAME} is acted on",
                        style="yellow"))
    if policy is None:
        out.append(Text(f"no NicClusterPolicy {POLICY_NAME}: nothing is deployed", style="red"))
        return out
    state = policy["state"] or "unknown"
    line = Text.assemble(f"{policy['name']}: ", (state, STATE_STYLE.get(state, "yellow")))
    observed = policy["observedGeneration"]
    if observed is None or observed < policy["generation"]:
        line.append(f"  (generation {policy['generation']} not yet processed by the operator)",
                    style="yellow")
    out.append(line)
    table = _table("component", "state", "message")
    for c in policy["components"]:
        table.add_row(c["name"], Text(c["state"], style=STATE_STYLE.get(c["state"], "")),
                      c["message"] or "")
    out.append(table)
    return out


def _render_nodes(status: Obj) -> list[RenderableType]:
    out: list[RenderableType] = [Text(""), Text("Nodes", style="bold underline")]
    table = _table("node", "managed", "driver", "driver ready", "upgrade", "mofed.wait",
                   "resources (allocatable / in use)", "VFs", "SR-IOV sync")
    if any(n["draDevices"] for n in status["nodes"]):
        table.add_column("DRA devices (allocated / all)")
    notes = []
    for n in status["nodes"]:
        driver = n["driver"]
        if driver is None:
            version: Text | str = "-"
            ready: Text | str = "-"
        else:
            version = driver["version"] or driver["image"]
            ready = _yes(driver["ready"], "yes", "no: " + (driver["problem"] or "not ready"))
        resources = ", ".join(f"{r['name']} {r['allocatable']}/{r['inUse']}"
                              for r in n["resources"]) or "-"
        sriov = n["sriov"]
        vfs = "-"
        if sriov:
            by = {"dra": " by DRA", "device-plugin": " by device plugin"}.get(
                sriov["servedBy"] or "", "")
            vfs = f"{sriov['vfsConfigured']}/{sriov['vfsWanted']}{by}"
        sync: Text | str = "-"
        if sriov and sriov["syncStatus"]:
            sync = Text(sriov["syncStatus"], style={"Succeeded": "green", "Failed": "red"}.get(
                sriov["syncStatus"], "yellow"))
        if n["managed"]:
            managed = Text("yes", style="green")
        elif n["unmanagedReason"]:
            managed = Text("no (see below)", style="red")
        else:
            managed = Text("no", style="dim")
        wait = n["mofedWait"] or "-"
        row = [n["name"] + ("" if n["ready"] else " (NotReady)"), managed, version, ready,
               n["upgradeState"] or "-", Text(wait, style="yellow") if wait == "true" else wait,
               resources, vfs, sync]
        if len(table.columns) > len(row):
            row.append(", ".join(f"{d['driver']} {d['allocated']}/{d['devices']}"
                                 for d in n["draDevices"]) or "-")
        table.add_row(*row)
        if n["unmanagedReason"]:
            notes.append(Text(n["unmanagedReason"], style="red"))
        if sriov and sriov["lastSyncError"]:
            notes.append(Text(f"node {n['name']}: SR-IOV sync error: {sriov['lastSyncError']}",
                              style="red"))
    out.append(table)
    out.extend(notes)
    if any(n["driver"] is not None for n in status["nodes"]):
        out.append(Text(f"driver ready = container {DRIVER_CONTAINER} Ready; its startup probe "
                        f"checks {READY_FILE} on the node, which the API cannot show",
                        style="dim"))
    return out


def _render_pools(status: Obj) -> list[RenderableType]:
    pools = status["ipamPools"]
    if not pools:
        return []
    table = _table("pool", "kind", "network", "allocated / size", "nodes")
    for p in pools:
        used = ("-" if p["allocated"] is None else f"{p['allocated']}/{p['size']}")
        per_node = ", ".join(
            f"{n['name']} {n['allocated']}/{n['size']}" if n["allocated"] is not None
            else f"{n['name']} (no usage published)" for n in p["nodes"]) or "no blocks yet"
        table.add_row(p["name"], p["kind"], p["network"] or "-", used, per_node)
    return [Text(""), Text("IPAM pools", style="bold underline"), table]


def _render_upgrade(status: Obj) -> list[RenderableType]:
    progress = status["driverUpgrade"]
    if not progress:
        return []
    line = Text(f"done {progress['done']}, in progress {progress['inProgress']}, "
                f"waiting {progress['waiting']}, failed {progress['failed']}")
    out: list[RenderableType] = [Text(""), Text("Driver upgrade", style="bold underline"), line]
    if progress.get("inProgressNodes"):
        out.append(Text("in progress: " + ", ".join(progress["inProgressNodes"])))
    for node in status["nodes"]:
        if node["drainBlocked"]:
            out.append(Text(f"draining {node['name']} since {node['drainStarted']}, cannot "
                            f"evict: {node['drainBlocked']}", style="yellow"))
    for failed in progress.get("failedNodes") or []:
        then = (f"retried at {failed['nextRetry']}" if failed.get("nextRetry") else
                f"no automatic retry left: nicop upgrade retry {failed['name']}")
        out.append(Text(f"failed: {failed['name']}"
                        + (f": {failed['reason']}" if failed.get("reason") else "")
                        + f" ({failed['attempts']} attempt(s); {then})", style="red"))
    return out
