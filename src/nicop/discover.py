"""`nicop discover`: the cluster's NICs, and a policy that selects exactly them.

The NICs come from what nicop's agents already report: each node's SriovNetworkNodeState (its
config daemon's scan) or the PFs of its DRA ResourceSlices. A node neither reports is asked by
a short-lived pod of nicop's image on it (`nicop discover-node`, privileged and on the host
network, so it sees the node's PCI devices and interfaces), whose answer is its termination
message; the pod is deleted afterwards.

The suggestion starts from the running NicClusterPolicy when there is one, so a cluster whose
policy already selects every NIC gets that policy back unchanged (and `nicop plan` of it is
empty); a NIC model no RDMA resource selects is added to the resource of its link type, or gets
one of its own. Without a policy the suggestion is a new one with one shared RDMA resource per
link type. With a VF count, an SR-IOV node policy per SR-IOV capable model. Every choice is
said in a comment.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from nicop.api import dra
from nicop.api.labels import MELLANOX_LABEL, POLICY_NAME
from nicop.api.nodes import is_managed, label_signs
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import (
    NIC_CLUSTER_POLICY,
    NODE,
    POD,
    RESOURCE_SLICE,
    SRIOV_NODE_STATE,
    Obj,
)

POD_PREFIX = "nicop-discover-"
APP_LABEL, APP = "app.kubernetes.io/name", "nicop-discover"
POD_TIMEOUT = 120.0
RDMA_PLUGIN_PATH = ("spec", "rdmaSharedDevicePlugin", "config")
LINK_SUFFIX = {"infiniband": "ib", "ethernet": "roce"}


@dataclass(frozen=True)
class Model:
    """A NIC model as policies select it."""

    vendor: str
    device: str
    link: str  # infiniband | ethernet

    @property
    def title(self) -> str:
        return f"{self.vendor}:{self.device} ({self.link})"


@dataclass
class Found:
    """Each node's NIC ports, and where they were learnt."""

    ports: dict[str, list[Obj]] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # node -> why it could not be asked

    def models(self) -> dict[Model, list[str]]:
        """Each model, with the nodes that have it."""
        seen: dict[Model, list[str]] = {}
        for node, ports in sorted(self.ports.items()):
            for port in ports:
                if node not in seen.setdefault(model_of(port), []):
                    seen[model_of(port)].append(node)
        return dict(sorted(seen.items(), key=lambda kv: (kv[0].link, kv[0].device)))

    def ports_of(self, model: Model) -> list[Obj]:
        return [p for ports in self.ports.values() for p in ports if model_of(p) == model]


def model_of(port: Obj) -> Model:
    return Model(str(port.get("vendor") or "15b3"), str(port.get("deviceID")),
                 str(port.get("linkType") or "ethernet"))


def nic_nodes(nodes: list[Obj]) -> list[Obj]:
    """Nodes with a Mellanox NIC by their labels, or managed."""
    return [n for n in nodes if is_managed(n) or label_signs(n)
            or (n["metadata"].get("labels") or {}).get(MELLANOX_LABEL) == "true"]


def _from_node_state(state: Obj) -> list[Obj]:
    return [{"pciAddress": i.get("pciAddress"), "vendor": i.get("vendor") or "15b3",
             "deviceID": i.get("deviceID"), "linkType": "infiniband" if str(
                 i.get("linkType", "")).upper() == "IB" else "ethernet",
             "netdev": i.get("name"), "totalVfs": int(i.get("totalvfs") or 0),
             "numVfs": int(i.get("numVfs") or 0)}
            for i in (state.get("status") or {}).get("interfaces") or [] if i.get("deviceID")]


def _from_slice(resource_slice: Obj) -> list[Obj]:
    ports = []
    for device in (resource_slice.get("spec") or {}).get("devices") or []:
        attrs = {k: next(iter(v.values()), None) for k, v in
                 (device.get("attributes") or {}).items() if isinstance(v, dict)}
        if attrs.get(dra.KIND) != dra.KIND_PF:
            continue
        ports.append({"pciAddress": attrs.get(dra.PCI_ADDRESS),
                      "vendor": attrs.get(dra.VENDOR_ID) or "15b3",
                      "deviceID": attrs.get(dra.DEVICE_ID), "linkType": attrs.get(dra.LINK_TYPE),
                      "netdev": attrs.get(dra.NETDEV)})
    return ports


async def find(client: ApiClient, namespace: str, image: str,
               progress: Callable[[str], None] = lambda _: None,
               timeout: float = POD_TIMEOUT) -> Found:
    nodes = nic_nodes((await client.list(NODE))[0])
    found = Found()
    names = {n["metadata"]["name"] for n in nodes}
    for state in await _optional_list(client, SRIOV_NODE_STATE):
        name = state["metadata"]["name"]
        if name in names and (ports := _from_node_state(state)):
            found.ports[name], found.source[name] = ports, "SriovNetworkNodeState"
    for resource_slice in await _optional_list(client, RESOURCE_SLICE):
        spec = resource_slice.get("spec") or {}
        name = str(spec.get("nodeName") or "")
        if spec.get("driver") != dra.DRIVER or name not in names or \
                found.source.get(name, "ResourceSlice") != "ResourceSlice":
            continue
        if ports := _from_slice(resource_slice):  # a node's devices may span several slices
            found.ports.setdefault(name, []).extend(ports)
            found.source[name] = "ResourceSlice"
    unasked = sorted(names - set(found.ports))
    if unasked:
        progress(f"asking {len(unasked)} nodes with a discovery pod: {', '.join(unasked)}")
        await _ask(client, namespace, image, unasked, found, timeout)
    return found


async def _optional_list(client: ApiClient, res: Any) -> list[Obj]:
    try:
        return (await client.list(res))[0]
    except ApiError as e:
        if e.code in (403, 404):
            return []  # not served, or not ours to read: the pods ask instead
        raise


def discovery_pod(node: str, namespace: str, image: str) -> Obj:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD_PREFIX + node, "namespace": namespace,
                     "labels": {APP_LABEL: APP}},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "hostNetwork": True,
            "tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "discover", "image": image,
                            "command": ["nicop", "discover-node"],
                            "securityContext": {"privileged": True},
                            "terminationMessagePolicy": "FallbackToLogsOnError"}],
        },
    }


async def _ask(client: ApiClient, namespace: str, image: str, nodes: list[str], found: Found,
               timeout: float) -> None:
    created = []
    for node in nodes:
        pod = discovery_pod(node, namespace, image)
        try:
            try:
                await client.create(pod, res=POD)
            except ApiError as e:
                if e.code != 409:
                    raise
                # One an interrupted run left: its answer may be stale, ask again.
                await client.delete(POD, POD_PREFIX + node, namespace, grace_seconds=0)
                await _gone(client, POD_PREFIX + node, namespace)
                await client.create(pod, res=POD)
            created.append(node)
        except ApiError as e:
            found.failed[node] = f"could not create its discovery pod: {e.message}"
    try:
        deadline = time.monotonic() + timeout
        waiting = set(created)
        while waiting and time.monotonic() < deadline:
            pods, _ = await client.list(POD, namespace, label_selector=f"{APP_LABEL}={APP}")
            by_name = {p["metadata"]["name"]: p for p in pods}  # one read a round, any size
            for node in sorted(waiting):
                if (answer := _answer(by_name.get(POD_PREFIX + node))) is None:
                    continue
                waiting.discard(node)
                ok, value = answer
                if ok:
                    found.ports[node], found.source[node] = value, "discovery pod"
                else:
                    found.failed[node] = value
            if waiting:
                await asyncio.sleep(1.0)
        for node in waiting:
            found.failed[node] = (f"its discovery pod did not finish within {timeout:g}s (is "
                                  f"image {image} pullable there? kubectl -n {namespace} "
                                  f"describe pod {POD_PREFIX}{node})")
    finally:
        for node in created:
            await client.delete(POD, POD_PREFIX + node, namespace, grace_seconds=0)


async def _gone(client: ApiClient, name: str, namespace: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while await client.get_or_none(POD, name, namespace) is not None:
        if time.monotonic() > deadline:
            return  # creating it again says what is wrong
        await asyncio.sleep(0.5)


def _answer(pod: Obj | None) -> tuple[bool, Any] | None:
    """(True, ports) or (False, why) once the pod's container ended; None before."""
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        ended = (status.get("state") or {}).get("terminated")
        if not ended:
            continue
        message = str(ended.get("message") or "")
        if ended.get("exitCode") != 0:
            return False, f"its discovery pod failed ({ended.get('exitCode')}): {message[-300:]}"
        try:
            return True, json.loads(message)
        except ValueError:
            return False, f"its discovery pod answered something else: {message[:200]}"
    return None


# ------------------------------------------------------------------ the suggestion


@dataclass
class Suggestion:
    policy: Obj
    sriov: list[Obj]
    notes: list[str]

    def yaml(self) -> str:
        header = "".join(f"# {line}\n" for line in self.notes)
        docs = [self.policy, *self.sriov]
        return header + "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def suggest(found: Found, live: Obj | None, namespace: str, vfs: int = 0) -> Suggestion:
    models = found.models()
    notes = ["Suggested by `nicop discover` from the NICs of "
             f"{_count(list(found.ports), 'node')}; check it with `nicop plan -f FILE` "
             "before applying."]
    for model, nodes in models.items():
        notes.append(f"NIC model {model.title}: on {_count(nodes, 'node')} ({', '.join(nodes)})")
    for node, why in sorted(found.failed.items()):
        notes.append(f"node {node} is not included: {why}")
    if live is not None:
        policy = {"apiVersion": live["apiVersion"], "kind": live["kind"],
                  "metadata": {k: v for k, v in live["metadata"].items()
                               if k in ("name", "labels", "annotations")},
                  "spec": copy.deepcopy(live.get("spec") or {})}
        (policy["metadata"].get("annotations") or {}).pop(
            "kubectl.kubernetes.io/last-applied-configuration", None)
        if not policy["metadata"].get("annotations"):
            policy["metadata"].pop("annotations", None)
        notes.append(f"Based on the running NicClusterPolicy {live['metadata']['name']}: "
                     "everything but the RDMA resources' NIC selection is kept as it is.")
    else:
        policy = {"apiVersion": NIC_CLUSTER_POLICY.api_version, "kind": NIC_CLUSTER_POLICY.kind,
                  "metadata": {"name": POLICY_NAME}, "spec": {}}
        notes.append("No NicClusterPolicy runs: a new one with the shared RDMA device plugin, "
                     "one resource per link type; add the driver and networks you need.")
    _select_every_model(policy, found, notes)
    sriov = _sriov_policies(found, vfs, namespace, notes) if vfs else []
    return Suggestion(policy, sriov, notes)


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _plugin_resources(policy: Obj) -> tuple[Obj, list[Obj]] | None:
    """The RDMA shared device plugin's section and its parsed resourceList, if any."""
    section = (policy.get("spec") or {}).get("rdmaSharedDevicePlugin")
    if not isinstance(section, dict):
        return None
    try:
        config = json.loads(section.get("config") or "{}")
    except ValueError:
        return None
    return section, config.get("configList") or []


def selects(resource: Obj, port: Obj) -> bool:
    """The shared RDMA plugin's selectors would take this port (an empty selector field takes
    everything, as the plugin reads them; `drivers` is left out: every port here is mlx5)."""
    s = resource.get("selectors") or {}
    return ((not s.get("vendors") or port.get("vendor") in s["vendors"])
            and (not s.get("deviceIDs") or port.get("deviceID") in s["deviceIDs"])
            and (not s.get("linkTypes") or port.get("linkType") in s["linkTypes"])
            and (not s.get("ifNames") or port.get("netdev") in s["ifNames"])
            and (not s.get("rootDevices") or port.get("pciAddress") in s["rootDevices"]))


def _select_every_model(policy: Obj, found_nics: Found, notes: list[str]) -> None:
    found = _plugin_resources(policy)
    if found is None:
        section: Obj = {"image": "k8s-rdma-shared-dev-plugin",
                        "repository": "ghcr.io/mellanox", "version": "v1.5.3"}
        policy["spec"]["rdmaSharedDevicePlugin"] = section
        resources: list[Obj] = []
        notes.append("rdmaSharedDevicePlugin: added (upstream's image; nicop's agent is used "
                     "when the operator runs with its own images)")
    else:
        section, resources = found
    changed = found is None
    for model, nodes in found_nics.models().items():
        ports = found_nics.ports_of(model)
        unselected = [p for p in ports if not any(selects(r, p) for r in resources)]
        if not unselected:
            names = sorted({str(r.get("resourceName")) for p in ports for r in resources
                            if selects(r, p)})
            notes.append(f"{model.title}: already selected by RDMA resource "
                         f"{', '.join(names)}")
            continue
        same_link = next((r for r in resources
                          if model.link in ((r.get("selectors") or {}).get("linkTypes") or [])),
                         None)
        if same_link is not None:
            selectors = same_link.setdefault("selectors", {})
            selectors.setdefault("deviceIDs", []).append(model.device)
            if selectors.get("vendors") and model.vendor not in selectors["vendors"]:
                selectors["vendors"].append(model.vendor)
            notes.append(f"{model.title}: added to RDMA resource {same_link['resourceName']}, "
                         f"which selects {model.link} NICs (new on {', '.join(nodes)})")
        else:
            name = f"rdma_{LINK_SUFFIX.get(model.link, model.link)}"
            if any(r.get("resourceName") == name for r in resources):
                name += f"_{model.device}"
            resources.append({"resourceName": name, "rdmaHcaMax": 63, "selectors": {
                "vendors": [model.vendor], "deviceIDs": [model.device],
                "linkTypes": [model.link]}})
            notes.append(f"{model.title}: new RDMA resource {name} (63 pods share each NIC, "
                         "upstream's default)")
        changed = True
    if changed:
        section["config"] = json.dumps({"configList": resources}, indent=2)


def _sriov_policies(found: Found, vfs: int, namespace: str, notes: list[str]) -> list[Obj]:
    policies = []
    for model in found.models():
        ports = found.ports_of(model)
        capable = [p for p in ports if int(p.get("totalVfs") or 0) >= vfs]
        if not capable:
            most = max((int(p.get("totalVfs") or 0) for p in ports), default=0)
            notes.append(f"{model.title}: no SR-IOV policy: its ports allow at most {most} VFs "
                         f"(asked {vfs}); enable SR-IOV in the firmware or ask fewer")
            continue
        name = f"sriov-{LINK_SUFFIX.get(model.link, model.link)}-{model.device}"
        policies.append({
            "apiVersion": "sriovnetwork.openshift.io/v1", "kind": "SriovNetworkNodePolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"resourceName": name.replace("-", "_"), "numVfs": vfs, "isRdma": True,
                     "linkType": "ib" if model.link == "infiniband" else "eth",
                     "nicSelector": {"vendor": model.vendor, "deviceID": model.device},
                     "nodeSelector": {MELLANOX_LABEL: "true"}}})
        notes.append(f"{model.title}: SR-IOV policy {name}, {vfs} VFs on each of its "
                     f"{_count(capable, 'port')}" + (f" ({len(ports) - len(capable)} ports allow "
                                                "fewer and are left out by the operator)"
                                                if len(capable) < len(ports) else ""))
    return policies
