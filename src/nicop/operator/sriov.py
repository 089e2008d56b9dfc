"""SR-IOV node policies become one SriovNetworkNodeState per node and the device plugin config.

Every SriovNetworkNodePolicy in the operator namespace that selects a node (its nodeSelector
labels all present) is applied to the PFs the node's config daemon reported in the node state's
status, with upstream's merge rules: policies are applied from the lowest priority to the
highest (priority 0 is the highest and wins), VF ranges of one PF (`pfNames: [ens1f0#0-3]`) are
kept apart as separate vfGroups, and where groups are kept or priorities are equal the PF gets the
largest numVfs and MTU. The result is written to the node state's spec, which the daemon applies.

The ConfigMap `device-plugin-config` holds the SR-IOV device plugin's `resourceList` for each
node (one key per node name), so each policy's resourceName maps to exactly its VFs; nodes get
the label `sriovnetwork.openshift.io/device-plugin=Enabled` when they have resources, unless
nicop's DRA driver runs there with `sriovResources`: those nodes serve the resources by DRA
(Disabled), through a DeviceClass per resourceName with `extendedResourceName`
(nicop.api.dra.sriov_class), so a pod asking for `nvidia.com/<resourceName>` runs unchanged on
either kind of node. Never both on one node: the scheduler would use the device plugin's count
and one VF could be handed out twice.

Upstream refuses some policies in its admission webhook with checks the CRD schema cannot
express because they need other objects: VF ranges of one PF overlapping another policy's,
numVfs above what the NIC supports, conflicting excludeTopology. nicop has no webhook: such a
policy is not applied, and the reason is its `Accepted` condition and a Warning Event. Of two
conflicting policies, the one created later is refused.

Node states of nodes that are gone or no longer selected are kept until the time in their
`sriovnetwork.openshift.io/keep-state-until` annotation (upstream's default delay: 30 minutes,
`STALE_NODE_STATE_CLEANUP_DELAY_MINUTES`), then deleted.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import ValidationError

from nicop import logs
from nicop.api import dra
from nicop.api.labels import (
    DEVICE_PLUGIN_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    SRIOV_BY_DRA_LABEL,
)
from nicop.api.sriovnetwork import (
    SriovNetworkNicSelector,
    SriovNetworkNodePolicySpec,
    operator_settings,
    pool_settings,
)
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.conditions import with_condition
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.memo import PerObject
from nicop.kube.resources import CONFIGMAP, DEVICE_CLASS, NODE, POD, SRIOV_NODE_POLICY, Obj
from nicop.kube.times import parse, stamp, utcnow
from nicop.operator.sriov_drain import (
    NODE_STATE,
    OPERATOR_CONFIG,
    POOL_CONFIG,
    PoolError,
    apply_log_level,
    operator_config,
    pool_of,
    resource_prefix,
)

log = logging.getLogger(__name__)

POLICY = SRIOV_NODE_POLICY
CONFIG_MAP_NAME = "device-plugin-config"
KEEP_UNTIL_ANNOTATION = "sriovnetwork.openshift.io/keep-state-until"
STALE_DELAY_ENV = "STALE_NODE_STATE_CLEANUP_DELAY_MINUTES"
DEFAULT_STALE_DELAY_MINUTES = 30
# The DeviceClasses serving SR-IOV resources by DRA (dra.sriov_class), this controller's own.
CLASS_LABELS = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, "nicop.io/sriov-resource": "true"}
CLASS_SELECTOR = ",".join(f"{k}={v}" for k, v in CLASS_LABELS.items())
DEFAULT_DAEMON_NODE_SELECTOR = {"node-role.kubernetes.io/worker": "", "kubernetes.io/os": "linux"}
DEPRECATED_DEFAULT_POLICY = "default"
ACCEPTED = "Accepted"
MELLANOX = "15b3"
MELLANOX_MAX_VFS = 128

# PF device -> VF device of the NICs upstream lists in its supported-nic-ids ConfigMap; the
# device plugin selects VFs by their device ID. For other NICs the node state tells.
VF_DEVICE_IDS = {
    ("8086", "158a"): "154c", ("8086", "158b"): "154c", ("8086", "1572"): "154c",
    ("8086", "1583"): "154c", ("8086", "1589"): "154c", ("8086", "37d2"): "37cd",
    ("8086", "1563"): "1565", ("8086", "1592"): "1889", ("8086", "1593"): "1889",
    ("8086", "159b"): "1889",
    ("15b3", "1013"): "1014", ("15b3", "1015"): "1016", ("15b3", "1017"): "1018",
    ("15b3", "1019"): "101a", ("15b3", "101b"): "101c", ("15b3", "101d"): "101e",
    ("15b3", "101f"): "101e", ("15b3", "1021"): "101e", ("15b3", "1023"): "101e",
    ("15b3", "a2d6"): "101e", ("15b3", "a2dc"): "101e",
}


# ------------------------------------------------------------------------------ reading

def name_of(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


@dataclass(frozen=True)
class NodePolicy:
    """A SriovNetworkNodePolicy read once: its object (for its status and Events) and its spec
    as the model. Nodes and the PFs the daemons report stay plain dicts: they are read as the
    API server and the daemon wrote them, once per node per pass."""

    obj: Obj
    spec: SriovNetworkNodePolicySpec

    @property
    def name(self) -> str:
        return name_of(self.obj)

    @property
    def created(self) -> str:
        return str(self.obj["metadata"].get("creationTimestamp") or "")


def read_policy(obj: Obj) -> NodePolicy | tuple[str, str]:
    """The policy as its model, or why it cannot be applied (reason, message naming the
    fields). Upstream's schema lets a policy have no spec at all; the API server's schema
    holds the rest, so a refused value is one stored before it."""
    name = name_of(obj)
    try:
        return NodePolicy(obj, SriovNetworkNodePolicySpec.model_validate(obj.get("spec") or {}))
    except ValidationError as e:
        errors = e.errors()
    missing = [f"spec.{error['loc'][0]}" for error in errors
               if error["type"] == "missing" and len(error["loc"]) == 1]
    if missing:
        return ("MissingFields", f"{', '.join(missing)} missing in CR {name}; a policy needs "
                "resourceName, nodeSelector, numVfs and nicSelector")
    error = errors[0]
    field = ".".join(["spec", *map(str, error["loc"])])
    return ("InvalidSpec", f"{field} in CR {name}: {error['msg']}")


def read_policies(objs: Iterable[Obj]) -> tuple[list[NodePolicy], dict[str, tuple[str, str]]]:
    """The policies that can be read, and the others refused: name -> (reason, message)."""
    return split_read((obj, read_policy(obj)) for obj in objs)


def split_read(pairs: Iterable[tuple[Obj, NodePolicy | tuple[str, str]]]
               ) -> tuple[list[NodePolicy], dict[str, tuple[str, str]]]:
    read: list[NodePolicy] = []
    refused: dict[str, tuple[str, str]] = {}
    for obj, value in pairs:
        if name_of(obj) == DEPRECATED_DEFAULT_POLICY:
            refused[name_of(obj)] = ("DeprecatedDefaultPolicy", "the `default` policy of "
                                     "older releases configures nothing; delete it")
        elif isinstance(value, NodePolicy):
            read.append(value)
        else:
            refused[name_of(obj)] = value
    return read, refused


# ------------------------------------------------------------------------------ selection

def labels_match(selector: Mapping[str, str], node: Obj) -> bool:
    """Every label of the selector present on the node with that value."""
    return selectors.matches_map(selector, node["metadata"].get("labels") or {})


def selects_node(policy: NodePolicy, node: Obj) -> bool:
    return labels_match(policy.spec.node_selector, node)


def parse_pf_name(entry: str) -> tuple[str, int, int]:
    """`ens1f0#0-3` -> ("ens1f0", 0, 3); a name without a range gives (-1, -1) as upstream."""
    name, sep, rng = entry.partition("#")
    if not sep:
        return name, -1, -1
    first, _, last = rng.partition("-")
    return name, int(first), int(last)


def nic_selected(selector: SriovNetworkNicSelector, iface: Obj) -> bool:
    """Whether a policy's nicSelector matches a PF the daemon reported (every set field)."""
    if selector.vendor and selector.vendor != iface.get("vendor"):
        return False
    if selector.device_id and selector.device_id != iface.get("deviceID"):
        return False
    if selector.root_devices and iface.get("pciAddress") not in selector.root_devices:
        return False
    if selector.pf_names:
        names = {parse_pf_name(p)[0] for p in selector.pf_names}
        if not names & {iface.get("name"), *(iface.get("altNames") or [])}:
            return False
    return not (selector.net_filter and selector.net_filter != iface.get("netFilter"))


def _any_selector(selector: SriovNetworkNicSelector) -> bool:
    return any((selector.vendor, selector.device_id, selector.root_devices, selector.pf_names,
                selector.net_filter))


def by_priority(policies: Iterable[NodePolicy]) -> list[NodePolicy]:
    """Upstream's application order: the largest priority number first, ties by name, so the
    highest priority (the lowest number) is applied last and wins."""
    return sorted(policies, key=lambda p: (-p.spec.priority, p.name))


# ------------------------------------------------------------------------------ merging

def vf_group(policy: NodePolicy, iface: Obj) -> Obj:
    """The VF group a policy gives one PF: its own range of that PF, or all its VFs."""
    spec = policy.spec
    first, last = 0, spec.num_vfs - 1
    names = {iface.get("name"), *(iface.get("altNames") or [])}
    for entry in spec.nic_selector.pf_names or []:
        name, a, b = parse_pf_name(entry)
        if name in names:
            if a >= 0:
                first, last = a, b
            break
    group: Obj = {
        "resourceName": spec.resource_name,
        "deviceType": spec.device_type,
        "vfRange": f"{first}-{last}",
        "policyName": policy.name,
    }
    if spec.mtu:
        group["mtu"] = spec.mtu
    if spec.is_rdma:
        group["isRdma"] = True
    if spec.vdpa_type:
        group["vdpaType"] = spec.vdpa_type
    return group


def _range(vf_range: str) -> tuple[int, int]:
    first, _, last = vf_range.partition("-")
    return int(first), int(last)


def ranges_overlap(a: str, b: str) -> bool:
    a0, a1 = _range(a)
    b0, b1 = _range(b)
    return a0 <= b1 and b0 <= a1


def _merge(existing: Obj, new: Obj, equal_priority: bool) -> None:
    """Fold the PF entry an earlier (lower-priority) policy made into the new one.

    The new policy's group wins; earlier groups survive when their resource differs and their
    range does not overlap. With equal priorities or surviving groups, the PF keeps the largest
    numVfs and MTU of both.
    """
    ours = new["vfGroups"][0]
    kept = False
    for group in existing.get("vfGroups") or []:
        if group["resourceName"] == ours["resourceName"] or ranges_overlap(
                group["vfRange"], ours["vfRange"]):
            continue
        new["vfGroups"].append(group)
        kept = True
    if not (equal_priority or kept):
        return
    if existing.get("mtu", 0) > new.get("mtu", 0):
        new["mtu"] = existing["mtu"]
    if existing.get("numVfs", 0) > new.get("numVfs", 0):
        new["numVfs"] = existing["numVfs"]


def _apply_policy(policy: NodePolicy, interfaces: list[Obj], found: list[Obj],
                  equal_priority: bool) -> None:
    spec = policy.spec
    if not _any_selector(spec.nic_selector) or not spec.num_vfs:
        return
    for iface in found:
        if not nic_selected(spec.nic_selector, iface):
            continue
        entry: Obj = {"pciAddress": iface["pciAddress"], "numVfs": spec.num_vfs}
        if spec.mtu:
            entry["mtu"] = spec.mtu
        if iface.get("name"):
            entry["name"] = iface["name"]
        if spec.link_type:
            entry["linkType"] = spec.link_type
        if spec.e_switch_mode:
            entry["eSwitchMode"] = spec.e_switch_mode
        if spec.externally_managed:
            entry["externallyManaged"] = True
        entry["vfGroups"] = [vf_group(policy, iface)]
        for i, existing in enumerate(interfaces):
            if existing["pciAddress"] == entry["pciAddress"]:
                _merge(existing, entry, equal_priority)
                interfaces[i] = entry
                break
        else:
            interfaces.append(entry)


def node_state_spec(policies: Iterable[NodePolicy], node: Obj, found: list[Obj],
                    rdma_mode: str | None = None) -> Obj:
    """The spec of a node's SriovNetworkNodeState: the accepted policies that select the node,
    applied to the PFs its daemon found (`found`, the node state's status.interfaces)."""
    interfaces: list[Obj] = []
    previous = 100  # no policy has this priority: the first one merges nothing
    for policy in by_priority(policies):
        if not selects_node(policy, node):
            continue
        _apply_policy(policy, interfaces, found, previous == policy.spec.priority)
        previous = policy.spec.priority
    # Always a list, also an empty one: the API server reads an applied `spec: {}` as null and
    # refuses it, and an empty list is what tells the daemon to reset the PFs it configured.
    spec: Obj = {"interfaces": sorted(interfaces, key=lambda i: i["pciAddress"])}
    if rdma_mode:
        spec["system"] = {"rdmaMode": rdma_mode}
    return spec


# ------------------------------------------------------------------------------ device plugin

def _unique_extend(values: list[str], more: Iterable[str]) -> None:
    for v in more:
        if v not in values:
            values.append(v)


def vf_device_id(vendor: str, device: str, found: list[Obj]) -> str | None:
    """The device ID of the VFs of PF `vendor:device`: from the table, else from a VF the
    daemon reported."""
    if (vendor, device) in VF_DEVICE_IDS:
        return VF_DEVICE_IDS[vendor, device]
    for iface in found:
        if iface.get("deviceID") == device and (not vendor or iface.get("vendor") == vendor):
            for vf in iface.get("Vfs") or []:
                if vf.get("deviceID"):
                    return str(vf["deviceID"])
    return None


def device_plugin_config(policies: Iterable[NodePolicy], node: Obj, found: list[Obj]) -> Obj:
    """The SR-IOV device plugin's config for one node: one resource per resourceName, its
    selectors the union of those of the policies naming it (upstream's rendering)."""
    resources: dict[str, Obj] = {}
    for policy in sorted(policies, key=lambda p: p.name):
        if not selects_node(policy, node):
            continue
        spec, nic = policy.spec, policy.spec.nic_selector
        name = spec.resource_name
        res = resources.setdefault(name, {"resourceName": name, "selectors": {}})
        sel: Obj = res["selectors"]
        if nic.vendor:
            _unique_extend(sel.setdefault("vendors", []), [nic.vendor])
        if nic.device_id:
            device = (vf_device_id(nic.vendor or "", nic.device_id, found)
                      if spec.num_vfs else nic.device_id)
            if device:
                _unique_extend(sel.setdefault("devices", []), [device])
        if nic.pf_names:
            _unique_extend(sel.setdefault("pfNames", []), nic.pf_names)
        if spec.device_type != "vfio-pci" and spec.link_type:
            link = "infiniband" if spec.link_type.lower() == "ib" else "ether"
            _unique_extend(sel.setdefault("linkTypes", []), [link])
        if nic.root_devices:
            _unique_extend(sel.setdefault("rootDevices", []), nic.root_devices)
        if spec.device_type == "vfio-pci":
            _unique_extend(sel.setdefault("drivers", []), ["vfio-pci"])
        if nic.net_filter:
            _unique_extend(sel.setdefault("pciAddresses", []), [
                i["pciAddress"] for i in found if i.get("netFilter") == nic.net_filter])
        sel["IsRdma"] = spec.is_rdma
        if spec.need_vhost_net:
            sel["needVhostNet"] = True
        if spec.vdpa_type:
            sel["vdpaType"] = spec.vdpa_type
        if spec.exclude_topology:
            res["excludeTopology"] = True
    return {"resourceList": list(resources.values())}


# ------------------------------------------------------------------------------ checks

def judge(read: tuple[list[NodePolicy], dict[str, tuple[str, str]]], nodes: list[Obj],
          found: Mapping[str, list[Obj]]
          ) -> tuple[list[NodePolicy], dict[str, tuple[str, str]]]:
    """The policies to apply, and every other one with why not: those that could not be read
    (`read`, from read_policies) and those refused by the checks."""
    policies, unread = read
    refused = {**unread, **refusals(policies, nodes, found)}
    return [p for p in policies if p.name not in refused], refused


def refusals(policies: list[NodePolicy], nodes: list[Obj], found: Mapping[str, list[Obj]]
             ) -> dict[str, tuple[str, str]]:
    """Policies that must not be applied: name -> (reason, message).

    Policies are checked in creation order, each against the PFs of the nodes it selects and
    against the policies accepted before it that select a node in common.
    """
    accepted: list[tuple[NodePolicy, set[str]]] = []
    result: dict[str, tuple[str, str]] = {}
    for policy in sorted(policies, key=lambda p: (p.created, p.name)):
        selected = {name_of(n) for n in nodes if selects_node(policy, n)}
        problems: list[tuple[str, str]] = []
        problems += _pf_problems(policy, sorted(selected), found)
        for other, other_nodes in accepted:
            if not selected & other_nodes:
                continue
            problems += _conflicts(policy, other)
        if problems:
            reasons = dict.fromkeys(r for r, _ in problems)
            result[policy.name] = (next(iter(reasons)),
                                   "; ".join(dict.fromkeys(m for _, m in problems)))
        else:
            accepted.append((policy, selected))
    return result


def _pf_problems(policy: NodePolicy, nodes: list[str], found: Mapping[str, list[Obj]]
                 ) -> list[tuple[str, str]]:
    """numVfs above what a selected PF supports, and externally managed PFs that fall short."""
    spec = policy.spec
    num_vfs = spec.num_vfs
    where: dict[tuple[str, str], list[str]] = {}  # (reason, message) -> nodes
    for node in nodes:
        for iface in found.get(node, []):
            if not nic_selected(spec.nic_selector, iface):
                continue
            pf = f"PF {iface.get('name') or '?'} ({iface['pciAddress']})"
            total = iface.get("totalvfs")
            limit = min(total, MELLANOX_MAX_VFS) if iface.get("vendor") == MELLANOX and \
                total is not None else total
            if limit is not None and num_vfs > limit:
                key = ("TooManyVfs", f"numVfs({num_vfs}) in CR {policy.name} exceed the "
                       f"maximum allowed value({limit}) of {pf}")
                where.setdefault(key, []).append(node)
            if spec.externally_managed:
                current = int(iface.get("numVfs") or 0)
                if num_vfs > current:
                    key = ("ExternallyManaged", f"{pf} is externally managed and has {current} "
                           f"VFs, fewer than the {num_vfs} of CR {policy.name}; create them "
                           "first or lower numVfs")
                    where.setdefault(key, []).append(node)
                if spec.mtu and iface.get("mtu") and spec.mtu > iface["mtu"]:
                    key = ("ExternallyManaged", f"{pf} is externally managed with MTU "
                           f"{iface['mtu']}, below the {spec.mtu} of CR {policy.name}")
                    where.setdefault(key, []).append(node)
    return [(reason, f"{message} on node {', '.join(on)}")
            for (reason, message), on in where.items()]


def _conflicts(policy: NodePolicy, other: NodePolicy) -> list[tuple[str, str]]:
    """What upstream's webhook refuses between two policies that share a node."""
    spec, other_spec = policy.spec, other.spec
    problems = []
    for entry in spec.nic_selector.pf_names or []:
        name, first, last = parse_pf_name(entry)
        for theirs in other_spec.nic_selector.pf_names or []:
            other_name, other_first, other_last = parse_pf_name(theirs)
            if name == other_name and not (last < other_first or first > other_last):
                problems.append(("OverlappingVfRange", f"VF index range in {entry} is "
                                 f"overlapped with existing policy {other.name}"))
    ours, theirs_excluded = bool(spec.exclude_topology), bool(other_spec.exclude_topology)
    if spec.resource_name == other_spec.resource_name and ours != theirs_excluded:
        problems.append(("ExcludeTopologyConflict",
                         f"excludeTopology[{str(ours).lower()}] "
                         f"field conflicts with policy [{other.name}].ExcludeTopology["
                         f"{str(theirs_excluded).lower()}] as they "
                         f"target the same resource[{spec.resource_name}]"))
    return problems


# ------------------------------------------------------------------------------ the controller

def stale_delay_from_env() -> float:
    """Seconds a node state of a vanished node is kept (upstream's env var, in minutes)."""
    raw = os.environ.get(STALE_DELAY_ENV)
    try:
        minutes = int(raw) if raw is not None else DEFAULT_STALE_DELAY_MINUTES
    except ValueError:
        minutes = DEFAULT_STALE_DELAY_MINUTES
    return 60.0 * (minutes if minutes >= 0 else DEFAULT_STALE_DELAY_MINUTES)


class NodeStatesFailed(Exception):
    """Writes of some node states were refused (each is an Event on the policies concerned)."""


class SriovPolicyController:
    """Policies -> node states, device plugin config, device-plugin node labels, refusals."""

    KEY = "sriov-policies"

    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder, *,
                 stale_state_delay: float | None = None) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.recorder = recorder
        self.stale_delay = stale_delay_from_env() if stale_state_delay is None \
            else stale_state_delay
        self.policies = manager.informer(POLICY, namespace)
        self.states = manager.informer(NODE_STATE, namespace)
        self.nodes = manager.informer(NODE)
        self.configs = manager.informer(OPERATOR_CONFIG, namespace)
        self.pools = manager.informer(POOL_CONFIG, namespace)
        self.config_maps = manager.informer(CONFIGMAP, namespace,
                                            field_selector=f"metadata.name={CONFIG_MAP_NAME}")
        self.dra_pods = manager.informer(POD, namespace, label_selector=SRIOV_BY_DRA_LABEL)
        self.classes = manager.informer(DEVICE_CLASS, label_selector=CLASS_SELECTOR,
                                        optional=True)
        self.controller = manager.add(Controller("sriov-policies", self.reconcile))
        for informer in (self.policies, self.configs, self.pools, self.config_maps,
                         self.classes):
            informer.on_change(lambda ev, obj, old: self.controller.queue.add(self.KEY))
        self.dra_pods.on_change(self._dra_pod_changed)
        self.states.on_change(self._state_changed)
        self.nodes.on_change(self._node_changed)
        self._reported: dict[str, str] = {}  # policy uid -> refusal already announced
        self._read = PerObject(read_policy)  # read again only when a policy changed

    def _state_changed(self, event: str, state: Obj, old: Obj | None) -> None:
        """Only what the daemon found (status.interfaces) and the state's life matter here."""
        if event != "MODIFIED" or old is None or (state.get("status") or {}).get(
                "interfaces") != (old.get("status") or {}).get("interfaces") or state.get(
                "spec") != old.get("spec") or state["metadata"].get("ownerReferences") != old[
                "metadata"].get("ownerReferences"):
            self.controller.queue.add_batched(self.KEY)

    def _dra_pod_changed(self, event: str, pod: Obj, old: Obj | None) -> None:
        if old is None or event != "MODIFIED" or dra_node(pod) != dra_node(old):
            self.controller.queue.add_batched(self.KEY)

    def _node_changed(self, event: str, node: Obj, old: Obj | None) -> None:
        if event != "MODIFIED" or old is None or node["metadata"].get("labels") != old[
                "metadata"].get("labels"):
            self.controller.queue.add_batched(self.KEY)

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: str) -> Result | None:
        config = operator_config(self.configs.store.items(), self.namespace)
        settings = operator_settings(config)
        apply_log_level(settings)
        states = {name_of(s): s for s in self.states.store.items()}
        objs = self.policies.store.items()
        if not objs and config is None and not states:
            # SR-IOV is not in use (no policy, no operator config, no node state left to
            # empty): no node state, label or ConfigMap for a thousand nodes that need none,
            # and no pass over them.
            await self._sync_classes([])
            return None
        selector = settings.config_daemon_node_selector or DEFAULT_DAEMON_NODE_SELECTOR
        nodes = sorted((n for n in self.nodes.store.items() if labels_match(selector, n)),
                       key=name_of)
        found = {name: ((s.get("status") or {}).get("interfaces") or [])
                 for name, s in states.items()}
        accepted, refused = judge(split_read(self._read.each(objs)), nodes, found)
        await self._sync_classes(accepted)
        await self._policy_status(objs, {p.name: p for p in accepted}, refused, nodes)

        owner = _owner_ref(config)
        pools = self.pools.store.items()
        failed = []
        for node in nodes:  # each node on its own: one refused write stops no other node
            try:
                await self._sync_state(node, states.get(name_of(node)), accepted, found, owner,
                                       pools)
            except (ApiError, OSError) as e:
                failed.append(f"writing SriovNetworkNodeState {self.namespace}/"
                              f"{name_of(node)} failed: {e}")
                for policy in accepted:
                    if selects_node(policy, node):
                        await self.recorder.emit(policy.obj, "Warning", "NodeStateFailed",
                                                 failed[-1])
        await self._sync_config_map(nodes, accepted, found)
        await self._sync_labels(nodes, accepted)
        wait = await self._stale_states({name_of(n) for n in nodes}, states)
        if failed:
            raise NodeStatesFailed("; ".join(failed))  # tried again, later each time
        return Result(requeue_after=wait) if wait is not None else None

    async def _sync_state(self, node: Obj, state: Obj | None, accepted: list[NodePolicy],
                          found: Mapping[str, list[Obj]], owner: Obj | None,
                          pools: list[Obj]) -> None:
        name = name_of(node)
        try:
            pool = pool_of(node, pools)
        except PoolError:
            pool = None
        rdma_mode = pool_settings(pool).rdma_mode
        interfaces = found.get(name, [])
        if state is not None and not interfaces:
            # The daemon has not reported the node's PFs yet: nothing to apply them to.
            spec = state.get("spec") or {}
        else:
            spec = node_state_spec(accepted, node, interfaces, rdma_mode)
        metadata: Obj = {"name": name, "namespace": self.namespace}
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        if state is not None:
            same_owner = (state["metadata"].get("ownerReferences") or None) == (
                metadata.get("ownerReferences"))
            keep_until = KEEP_UNTIL_ANNOTATION in (state["metadata"].get("annotations") or {})
            if keep_until:
                await self._patch_state(name, {"metadata": {"annotations": {
                    KEEP_UNTIL_ANNOTATION: None}}})
            if state.get("spec") == spec and same_owner:
                return
        body: Obj = {"apiVersion": NODE_STATE.api_version, "kind": NODE_STATE.kind,
                     "metadata": metadata, "spec": spec}
        updated = await self.client.apply(body, res=NODE_STATE)
        self.states.assume(updated)
        log.info("%s node state: %d PFs to configure", "created" if state is None else "updated",
                 len(spec.get("interfaces") or []),
                 extra=logs.about(NODE_STATE.kind, name, self.namespace))

    async def _patch_state(self, name: str, body: Obj) -> None:
        try:
            updated = await self.client.patch(NODE_STATE, name, body, self.namespace)
        except ApiError as e:
            if e.code == 404:
                return
            raise
        self.states.assume(updated)

    async def _sync_config_map(self, nodes: list[Obj], accepted: list[NodePolicy],
                               found: Mapping[str, list[Obj]]) -> None:
        data = {name_of(n): json.dumps(device_plugin_config(accepted, n, found.get(name_of(n), [])),
                                       separators=(",", ":"))
                for n in nodes}
        current = self.config_maps.store.get(f"{self.namespace}/{CONFIG_MAP_NAME}")
        if ((current.get("data") or {}) if current is not None else {}) == data:
            return  # also: no ConfigMap while no node runs a config daemon
        updated = await self.client.apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP_NAME, "namespace": self.namespace,
                         "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
            "data": data,
        })
        self.config_maps.assume(updated)
        log.info("device plugin config updated for %d nodes", len(data),
                 extra=logs.about("ConfigMap", CONFIG_MAP_NAME, self.namespace))

    async def _sync_labels(self, nodes: list[Obj], accepted: list[NodePolicy]) -> None:
        """`sriovnetwork.openshift.io/device-plugin`: Enabled where a policy gives resources
        and no DRA driver serves them."""
        selected = {name_of(n) for n in nodes}
        by_dra = self._dra_nodes()
        for node in self.nodes.store.items():
            labels = node["metadata"].get("labels") or {}
            wanted: str | None = None
            if name_of(node) in selected:
                enabled = name_of(node) not in by_dra and any(
                    selects_node(p, node) for p in accepted)
                wanted = "Enabled" if enabled else "Disabled"
            if labels.get(DEVICE_PLUGIN_LABEL) != wanted:
                updated = await self.client.patch(NODE, name_of(node), {
                    "metadata": {"labels": {DEVICE_PLUGIN_LABEL: wanted}}})
                self.nodes.assume(updated)

    def _dra_nodes(self) -> set[str]:
        return {node for pod in self.dra_pods.store.items() if (node := dra_node(pod))}

    async def _sync_classes(self, accepted: list[NodePolicy]) -> None:
        """While a DRA driver serves SR-IOV resources anywhere, a DeviceClass per resourceName,
        so a pod that asks for `<prefix>/<resourceName>` gets VFs from DRA where no device
        plugin serves it."""
        wanted: dict[str, Obj] = {}
        if self._dra_nodes():
            prefix = resource_prefix()
            for policy in sorted(accepted, key=lambda p: p.name):
                body = dra.sriov_class(prefix, policy.spec.resource_name, CLASS_LABELS)
                wanted.setdefault(body["metadata"]["name"], body)
        current = {name_of(c): c for c in self.classes.store.items()}
        for name, body in wanted.items():
            have = current.get(name)
            if have is None or have.get("spec") != body["spec"]:
                self.classes.assume(await self.client.apply(body, res=DEVICE_CLASS))
                log.info("DeviceClass %s serves %s by DRA", name,
                         body["spec"]["extendedResourceName"])
        for name in set(current) - set(wanted):
            try:
                await self.client.delete(DEVICE_CLASS, name)
            except ApiError as e:
                if e.code != 404:
                    raise
            log.info("DeviceClass %s removed: no DRA driver or policy for it", name)

    async def _stale_states(self, selected: set[str], states: Mapping[str, Obj]) -> float | None:
        """Mark node states of unselected nodes, delete them once their time has come;
        returns the seconds until the next one is due."""
        due: list[float] = []
        now = utcnow()
        for name, state in states.items():
            if name in selected:
                continue
            until = parse((state["metadata"].get("annotations") or {}).get(KEEP_UNTIL_ANNOTATION))
            if until is None and self.stale_delay > 0:
                until = now + datetime.timedelta(seconds=self.stale_delay)
                await self._patch_state(name, {"metadata": {"annotations": {
                    KEEP_UNTIL_ANNOTATION: stamp(until)}}})
                log.info("node is gone or no longer selected; keeping its node state until %s",
                         stamp(until), extra=logs.about(NODE_STATE.kind, name, self.namespace))
            if until is not None and until > now:
                due.append((until - now).total_seconds() + 0.5)
                continue
            log.info("deleting the node state of a node that is gone or no longer selected",
                     extra=logs.about(NODE_STATE.kind, name, self.namespace))
            await self.client.delete(NODE_STATE, name, self.namespace)
        return min(due) if due else None

    async def _policy_status(self, objs: list[Obj], accepted: Mapping[str, NodePolicy],
                             refused: Mapping[str, tuple[str, str]], nodes: list[Obj]) -> None:
        for policy in objs:
            name = name_of(policy)
            if name in refused:
                reason, message = refused[name]
                status, message = "False", f"not applied: {message}"
            else:
                count = sum(selects_node(accepted[name], n) for n in nodes)
                if count:
                    reason, status = "Applied", "True"
                    message = f"applied to {count} node{'s' if count != 1 else ''}"
                else:
                    reason, status = "NoMatchingNodes", "True"
                    message = ("no node matches the nodeSelector (among the nodes of the "
                               "SriovOperatorConfig's configDaemonNodeSelector)")
            uid = policy["metadata"].get("uid", name)
            # The Event goes first: whoever sees the condition finds the Event too.
            if status == "False" and self._reported.get(uid) != message:
                self._reported[uid] = message
                log.warning("%s", message, extra=logs.about(POLICY.kind, name, self.namespace))
                await self.recorder.emit(policy, "Warning", "PolicyRefused", message)
            elif status == "True":
                self._reported.pop(uid, None)
            await self._set_condition(policy, status, reason, message)

    async def _set_condition(self, policy: Obj, status: str, reason: str, message: str) -> None:
        conditions = with_condition((policy.get("status") or {}).get("conditions") or [],
                                    ACCEPTED, status == "True", reason, message,
                                    policy["metadata"].get("generation"))
        if conditions is None:
            return
        try:
            updated = await self.client.patch(
                POLICY, name_of(policy), {"status": {"conditions": conditions}},
                self.namespace, subresource="status")
        except ApiError as e:
            if e.code == 404:
                return
            raise
        self.policies.assume(updated)


def dra_node(pod: Obj) -> str | None:
    """The node a DRA driver pod is on, unless it is going."""
    if pod["metadata"].get("deletionTimestamp"):
        return None
    return (pod.get("spec") or {}).get("nodeName")


def _owner_ref(config: Obj | None) -> Obj | None:
    """Node states belong to the SriovOperatorConfig `default` (as upstream's do)."""
    if config is None or not config["metadata"].get("uid"):
        return None
    return {"apiVersion": OPERATOR_CONFIG.api_version, "kind": OPERATOR_CONFIG.kind,
            "name": name_of(config), "uid": config["metadata"]["uid"], "controller": True,
            "blockOwnerDeletion": True}
