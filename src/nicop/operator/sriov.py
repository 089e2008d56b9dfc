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

from nicop import logs
from nicop.api import dra
from nicop.api.labels import (
    DEVICE_PLUGIN_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    SRIOV_BY_DRA_LABEL,
)
from nicop.api.sriovnetwork import operator_settings, pool_settings
from nicop.kube import selectors
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.conditions import with_condition
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
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
DEFAULT_PRIORITY = 99

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


# ------------------------------------------------------------------------------ selection

def spec_of(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def name_of(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def labels_match(selector: Mapping[str, str], node: Obj) -> bool:
    """Every label of the selector present on the node with that value."""
    return selectors.matches_map(selector, node["metadata"].get("labels") or {})


def selects_node(policy: Obj, node: Obj) -> bool:
    return labels_match(spec_of(policy).get("nodeSelector") or {}, node)


def parse_pf_name(entry: str) -> tuple[str, int, int]:
    """`ens1f0#0-3` -> ("ens1f0", 0, 3); a name without a range gives (-1, -1) as upstream."""
    name, sep, rng = entry.partition("#")
    if not sep:
        return name, -1, -1
    first, _, last = rng.partition("-")
    return name, int(first), int(last)


def nic_selected(selector: Obj, iface: Obj) -> bool:
    """Whether a policy's nicSelector matches a PF the daemon reported (every set field)."""
    if selector.get("vendor") and selector["vendor"] != iface.get("vendor"):
        return False
    if selector.get("deviceID") and selector["deviceID"] != iface.get("deviceID"):
        return False
    if selector.get("rootDevices") and iface.get("pciAddress") not in selector["rootDevices"]:
        return False
    if selector.get("pfNames"):
        names = {parse_pf_name(p)[0] for p in selector["pfNames"]}
        if not names & {iface.get("name"), *(iface.get("altNames") or [])}:
            return False
    net_filter = selector.get("netFilter")
    return not (net_filter and net_filter != iface.get("netFilter"))


def _any_selector(selector: Obj) -> bool:
    return any(selector.get(k) for k in ("vendor", "deviceID", "rootDevices", "pfNames",
                                          "netFilter"))


def by_priority(policies: Iterable[Obj]) -> list[Obj]:
    """Upstream's application order: the largest priority number first, ties by name, so the
    highest priority (the lowest number) is applied last and wins."""
    return sorted(policies, key=lambda p: (-_priority(p), name_of(p)))


def _priority(policy: Obj) -> int:
    value = spec_of(policy).get("priority")
    return DEFAULT_PRIORITY if value is None else int(value)


# ------------------------------------------------------------------------------ merging

def vf_group(policy: Obj, iface: Obj) -> Obj:
    """The VF group a policy gives one PF: its own range of that PF, or all its VFs."""
    spec = spec_of(policy)
    first, last = 0, int(spec["numVfs"]) - 1
    names = {iface.get("name"), *(iface.get("altNames") or [])}
    for entry in spec_of(policy).get("nicSelector", {}).get("pfNames") or []:
        name, a, b = parse_pf_name(entry)
        if name in names:
            if a >= 0:
                first, last = a, b
            break
    group: Obj = {
        "resourceName": spec["resourceName"],
        "deviceType": spec.get("deviceType") or "netdevice",
        "vfRange": f"{first}-{last}",
        "policyName": name_of(policy),
    }
    if spec.get("mtu"):
        group["mtu"] = spec["mtu"]
    if spec.get("isRdma"):
        group["isRdma"] = True
    if spec.get("vdpaType"):
        group["vdpaType"] = spec["vdpaType"]
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


def _apply_policy(policy: Obj, interfaces: list[Obj], found: list[Obj],
                  equal_priority: bool) -> None:
    spec = spec_of(policy)
    selector = spec.get("nicSelector") or {}
    if not _any_selector(selector) or not spec.get("numVfs"):
        return
    for iface in found:
        if not nic_selected(selector, iface):
            continue
        entry: Obj = {"pciAddress": iface["pciAddress"], "numVfs": int(spec["numVfs"])}
        if spec.get("mtu"):
            entry["mtu"] = spec["mtu"]
        if iface.get("name"):
            entry["name"] = iface["name"]
        for key in ("linkType", "eSwitchMode"):
            if spec.get(key):
                entry[key] = spec[key]
        if spec.get("externallyManaged"):
            entry["externallyManaged"] = True
        entry["vfGroups"] = [vf_group(policy, iface)]
        for i, existing in enumerate(interfaces):
            if existing["pciAddress"] == entry["pciAddress"]:
                _merge(existing, entry, equal_priority)
                interfaces[i] = entry
                break
        else:
            interfaces.append(entry)


def node_state_spec(policies: Iterable[Obj], node: Obj, found: list[Obj],
                    rdma_mode: str | None = None) -> Obj:
    """The spec of a node's SriovNetworkNodeState: the accepted policies that select the node,
    applied to the PFs its daemon found (`found`, the node state's status.interfaces)."""
    interfaces: list[Obj] = []
    previous = 100  # no policy has this priority: the first one merges nothing
    for policy in by_priority(policies):
        if name_of(policy) == DEPRECATED_DEFAULT_POLICY or not selects_node(policy, node):
            continue
        _apply_policy(policy, interfaces, found, previous == _priority(policy))
        previous = _priority(policy)
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


def device_plugin_config(policies: Iterable[Obj], node: Obj, found: list[Obj]) -> Obj:
    """The SR-IOV device plugin's config for one node: one resource per resourceName, its
    selectors the union of those of the policies naming it (upstream's rendering)."""
    resources: dict[str, Obj] = {}
    for policy in sorted(policies, key=name_of):
        if name_of(policy) == DEPRECATED_DEFAULT_POLICY or not selects_node(policy, node):
            continue
        spec = spec_of(policy)
        nic = spec.get("nicSelector") or {}
        name = spec["resourceName"]
        res = resources.setdefault(name, {"resourceName": name, "selectors": {}})
        sel: Obj = res["selectors"]
        if nic.get("vendor"):
            _unique_extend(sel.setdefault("vendors", []), [nic["vendor"]])
        if nic.get("deviceID"):
            device = (vf_device_id(nic.get("vendor") or "", nic["deviceID"], found)
                      if spec.get("numVfs") else nic["deviceID"])
            if device:
                _unique_extend(sel.setdefault("devices", []), [device])
        if nic.get("pfNames"):
            _unique_extend(sel.setdefault("pfNames", []), nic["pfNames"])
        if spec.get("deviceType") != "vfio-pci" and spec.get("linkType"):
            link = "infiniband" if spec["linkType"].lower() == "ib" else "ether"
            _unique_extend(sel.setdefault("linkTypes", []), [link])
        if nic.get("rootDevices"):
            _unique_extend(sel.setdefault("rootDevices", []), nic["rootDevices"])
        if spec.get("deviceType") == "vfio-pci":
            _unique_extend(sel.setdefault("drivers", []), ["vfio-pci"])
        if nic.get("netFilter"):
            _unique_extend(sel.setdefault("pciAddresses", []), [
                i["pciAddress"] for i in found if i.get("netFilter") == nic["netFilter"]])
        sel["IsRdma"] = bool(spec.get("isRdma"))
        if spec.get("needVhostNet"):
            sel["needVhostNet"] = True
        if spec.get("vdpaType"):
            sel["vdpaType"] = spec["vdpaType"]
        if spec.get("excludeTopology"):
            res["excludeTopology"] = True
    return {"resourceList": list(resources.values())}


# ------------------------------------------------------------------------------ checks

def _created(obj: Obj) -> str:
    return str(obj["metadata"].get("creationTimestamp") or "")


POLICY_REQUIRED = ("resourceName", "nodeSelector", "numVfs", "nicSelector")
"""The spec fields a policy cannot do without (the schema requires them once `spec` is set)."""


def refusals(policies: list[Obj], nodes: list[Obj], found: Mapping[str, list[Obj]]
             ) -> dict[str, tuple[str, str]]:
    """Policies that must not be applied: name -> (reason, message).

    Policies are checked in creation order, each against the PFs of the nodes it selects and
    against the policies accepted before it that select a node in common.
    """
    accepted: list[tuple[Obj, set[str]]] = []
    result: dict[str, tuple[str, str]] = {}
    for policy in sorted(policies, key=lambda p: (_created(p), name_of(p))):
        name = name_of(policy)
        if name == DEPRECATED_DEFAULT_POLICY:
            continue
        missing = [f"spec.{f}" for f in POLICY_REQUIRED if spec_of(policy).get(f) is None]
        if missing:  # upstream's schema lets a policy have no spec at all
            result[name] = ("MissingFields", f"{', '.join(missing)} missing in CR {name}; a "
                            "policy needs resourceName, nodeSelector, numVfs and nicSelector")
            continue
        selected = {name_of(n) for n in nodes if selects_node(policy, n)}
        problems: list[tuple[str, str]] = []
        problems += _pf_problems(policy, sorted(selected), found)
        for other, other_nodes in accepted:
            if not selected & other_nodes:
                continue
            problems += _conflicts(policy, other)
        if problems:
            reasons = dict.fromkeys(r for r, _ in problems)
            result[name] = (next(iter(reasons)), "; ".join(dict.fromkeys(m for _, m in problems)))
        else:
            accepted.append((policy, selected))
    return result


def _pf_problems(policy: Obj, nodes: list[str], found: Mapping[str, list[Obj]]
                 ) -> list[tuple[str, str]]:
    """numVfs above what a selected PF supports, and externally managed PFs that fall short."""
    spec = spec_of(policy)
    num_vfs = int(spec.get("numVfs") or 0)
    selector = spec.get("nicSelector") or {}
    where: dict[tuple[str, str], list[str]] = {}  # (reason, message) -> nodes
    for node in nodes:
        for iface in found.get(node, []):
            if not nic_selected(selector, iface):
                continue
            pf = f"PF {iface.get('name') or '?'} ({iface['pciAddress']})"
            total = iface.get("totalvfs")
            limit = min(total, MELLANOX_MAX_VFS) if iface.get("vendor") == MELLANOX and \
                total is not None else total
            if limit is not None and num_vfs > limit:
                key = ("TooManyVfs", f"numVfs({num_vfs}) in CR {name_of(policy)} exceed the "
                       f"maximum allowed value({limit}) of {pf}")
                where.setdefault(key, []).append(node)
            if spec.get("externallyManaged"):
                current = int(iface.get("numVfs") or 0)
                if num_vfs > current:
                    key = ("ExternallyManaged", f"{pf} is externally managed and has {current} "
                           f"VFs, fewer than the {num_vfs} of CR {name_of(policy)}; create them "
                           "first or lower numVfs")
                    where.setdefault(key, []).append(node)
                if spec.get("mtu") and iface.get("mtu") and spec["mtu"] > iface["mtu"]:
                    key = ("ExternallyManaged", f"{pf} is externally managed with MTU "
                           f"{iface['mtu']}, below the {spec['mtu']} of CR {name_of(policy)}")
                    where.setdefault(key, []).append(node)
    return [(reason, f"{message} on node {', '.join(on)}")
            for (reason, message), on in where.items()]


def _conflicts(policy: Obj, other: Obj) -> list[tuple[str, str]]:
    """What upstream's webhook refuses between two policies that share a node."""
    spec, other_spec = spec_of(policy), spec_of(other)
    problems = []
    for entry in (spec.get("nicSelector") or {}).get("pfNames") or []:
        name, first, last = parse_pf_name(entry)
        for theirs in (other_spec.get("nicSelector") or {}).get("pfNames") or []:
            other_name, other_first, other_last = parse_pf_name(theirs)
            if name == other_name and not (last < other_first or first > other_last):
                problems.append(("OverlappingVfRange", f"VF index range in {entry} is "
                                 f"overlapped with existing policy {name_of(other)}"))
    if spec.get("resourceName") == other_spec.get("resourceName") and bool(
            spec.get("excludeTopology")) != bool(other_spec.get("excludeTopology")):
        problems.append(("ExcludeTopologyConflict",
                         f"excludeTopology[{str(bool(spec.get('excludeTopology'))).lower()}] "
                         f"field conflicts with policy [{name_of(other)}].ExcludeTopology["
                         f"{str(bool(other_spec.get('excludeTopology'))).lower()}] as they "
                         f"target the same resource[{spec.get('resourceName')}]"))
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
        policies = self.policies.store.items()
        if not policies and config is None and not states:
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
        refused = refusals(policies, nodes, found)
        accepted = [p for p in policies if name_of(p) not in refused]
        await self._sync_classes(accepted)
        await self._policy_status(policies, refused, nodes)

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
                        await self.recorder.emit(policy, "Warning", "NodeStateFailed",
                                                 failed[-1])
        await self._sync_config_map(nodes, accepted, found)
        await self._sync_labels(nodes, accepted)
        wait = await self._stale_states({name_of(n) for n in nodes}, states)
        if failed:
            raise NodeStatesFailed("; ".join(failed))  # tried again, later each time
        return Result(requeue_after=wait) if wait is not None else None

    async def _sync_state(self, node: Obj, state: Obj | None, accepted: list[Obj],
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
            spec = spec_of(state)
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
            if spec_of(state) == spec and same_owner:
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

    async def _sync_config_map(self, nodes: list[Obj], accepted: list[Obj],
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

    async def _sync_labels(self, nodes: list[Obj], accepted: list[Obj]) -> None:
        """`sriovnetwork.openshift.io/device-plugin`: Enabled where a policy gives resources
        and no DRA driver serves them."""
        selected = {name_of(n) for n in nodes}
        by_dra = self._dra_nodes()
        for node in self.nodes.store.items():
            labels = node["metadata"].get("labels") or {}
            wanted: str | None = None
            if name_of(node) in selected:
                enabled = name_of(node) not in by_dra and any(
                    selects_node(p, node) and name_of(p) != DEPRECATED_DEFAULT_POLICY
                    for p in accepted)
                wanted = "Enabled" if enabled else "Disabled"
            if labels.get(DEVICE_PLUGIN_LABEL) != wanted:
                updated = await self.client.patch(NODE, name_of(node), {
                    "metadata": {"labels": {DEVICE_PLUGIN_LABEL: wanted}}})
                self.nodes.assume(updated)

    def _dra_nodes(self) -> set[str]:
        return {node for pod in self.dra_pods.store.items() if (node := dra_node(pod))}

    async def _sync_classes(self, accepted: list[Obj]) -> None:
        """While a DRA driver serves SR-IOV resources anywhere, a DeviceClass per resourceName,
        so a pod that asks for `<prefix>/<resourceName>` gets VFs from DRA where no device
        plugin serves it."""
        wanted: dict[str, Obj] = {}
        if self._dra_nodes():
            prefix = resource_prefix()
            for policy in sorted(accepted, key=name_of):
                name = spec_of(policy).get("resourceName")
                if name and name_of(policy) != DEPRECATED_DEFAULT_POLICY:
                    body = dra.sriov_class(prefix, name, CLASS_LABELS)
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

    async def _policy_status(self, policies: list[Obj], refused: Mapping[str, tuple[str, str]],
                             nodes: list[Obj]) -> None:
        for policy in policies:
            name = name_of(policy)
            if name in refused:
                reason, message = refused[name]
                status, message = "False", f"not applied: {message}"
            else:
                count = sum(selects_node(policy, n) for n in nodes)
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
