"""`nicop bundle replay`: a local cluster shaped like a support bundle's, with the operator running.

From the bundle: every node with its labels, annotations, taints and device resources; each
node's NIC hardware (the simulated profile it names, else the ports its SR-IOV config daemon
reported, else none);
the operator namespace; and every custom resource a user makes (policies, networks, IP pools,
SR-IOV policies and configs), without status. The operator then renders and runs what it
would, so a support engineer sees the customer's `nicop status` and `nicop diagnose` and can try
a fix with `nicop plan`. What a bundle does not hold is said first (NOT_REPLAYED).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tarfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nicop.api.kinds import KINDS
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import NAMESPACE, NODE
from nicop.plan import resource_for
from nicop_sim import hardware
from nicop_sim.cluster import LocalCluster, Progress, free_port

NOT_REPLAYED = (
    "workload pods and their claims (the bundle holds only the operator namespace's pods; the "
    "replay runs what the operator deploys)",
    "Secret values (the bundle lists Secrets by name only; the replay creates none)",
    "events and logs (read them in the bundle, or its report.html)",
    "objects of other operators and namespaces besides the CRs of nicop's kinds",
)
# Kinds the operator or the agents write: replaying them would fight what the operator does.
WRITTEN_BY_NICOP = ("SriovNetworkNodeState",)
# Fields of `nicop status -o json` a replay cannot have the same: when it was read, the
# operator process (its leader identity and pods), and what the API server generates (pod
# names, the policy's generation: the replay's policy was written once).
STATUS_DIFFERS = ("collectedAt", "operator", "policy.generation", "policy.observedGeneration",
                  "nodes[].driver.pod")
SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields",
                 "ownerReferences", "selfLink", "deletionTimestamp", "deletionGracePeriodSeconds")
NODE_KEEP = ("name", "labels", "annotations")


class ReplayError(Exception):
    """The file is not a nicop bundle."""


@dataclass
class Bundle:
    files: dict[str, str]

    @classmethod
    def read(cls, path: Path) -> Bundle:
        try:
            with tarfile.open(path) as tar:
                files = {m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                         .decode(errors="replace") for m in tar.getmembers() if m.isfile()}
        except (OSError, tarfile.TarError) as e:
            raise ReplayError(f"{path}: not a readable nicop bundle ({e})") from None
        if "manifest.json" not in files or "nodes/nodes.yaml" not in files:
            raise ReplayError(f"{path}: not a nicop bundle (no manifest.json or "
                              "nodes/nodes.yaml); `nicop bundle` makes one")
        return cls(files)

    @property
    def manifest(self) -> dict[str, Any]:
        return json.loads(self.files["manifest.json"])  # type: ignore[no-any-return]

    @property
    def status(self) -> dict[str, Any] | None:
        text = self.files.get("status.json")
        return json.loads(text) if text else None

    def objects(self, path: str) -> list[dict[str, Any]]:
        value = yaml.safe_load(self.files.get(path) or "[]")
        return value if isinstance(value, list) else []


def nodes(bundle: Bundle) -> list[dict[str, Any]]:
    """The bundle's Nodes, each with the hardware profile its stand-in builds."""
    reported: dict[str, list[dict[str, Any]]] = {
        s["metadata"]["name"]: (s.get("status") or {}).get("interfaces") or []
        for s in bundle.objects("resources/sriovnetworknodestates.sriovnetwork.openshift.io.yaml")}
    out = []
    for node in bundle.objects("nodes/nodes.yaml"):
        meta = {k: v for k, v in node["metadata"].items() if k in NODE_KEEP}
        annotations = dict(meta.get("annotations") or {})
        profile = annotations.get(hardware.PROFILE_ANNOTATION, "")
        if hardware.profile_named(profile) is None:
            annotations[hardware.PROFILE_ANNOTATION] = profile_of(reported.get(meta["name"], []))
        meta["annotations"] = annotations
        spec = {k: v for k, v in (node.get("spec") or {}).items()
                if k in ("taints", "unschedulable")}
        out.append({"metadata": meta, "spec": spec})
    return out


def profile_of(ports: list[dict[str, Any]]) -> str:
    """A node's NICs as its config daemon reported them (status.interfaces), as a profile: one
    NIC per PCI bus, its ports the functions there."""
    by_bus: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for port in ports:
        address = str(port.get("pciAddress") or "")
        if address.count(":") == 2 and port.get("deviceID"):
            by_bus[address.rsplit(":", 1)[0]].append(port)
    nics = [{"model": f"Mellanox {ports[0]['deviceID']}", "deviceID": ports[0]["deviceID"],
             "ports": len(ports), "bus": int(bus.split(":")[1], 16),
             "linkType": "ib" if str(ports[0].get("linkType", "")).upper() == "IB" else "eth",
             "totalVfs": int(ports[0].get("totalvfs") or 0)}
            for bus, ports in sorted(by_bus.items())]
    return json.dumps({"nics": nics}, separators=(",", ":")) if nics else "cpu"


def custom_resources(bundle: Bundle) -> list[dict[str, Any]]:
    """Every CR of nicop's kinds a user makes, without status and server fields; NADs the
    operator renders (owned by a network CR) are left to it."""
    objects = []
    for model in KINDS:
        info = model.crd
        if info.kind in WRITTEN_BY_NICOP:
            continue
        for obj in bundle.objects(f"resources/{info.plural}.{info.group}.yaml"):
            meta = obj.get("metadata") or {}
            if meta.get("ownerReferences"):
                continue
            clean = {k: v for k, v in obj.items() if k != "status"}
            clean["metadata"] = {k: v for k, v in meta.items() if k not in SERVER_FIELDS}
            clean.setdefault("apiVersion", info.api_version)
            clean.setdefault("kind", info.kind)
            objects.append(clean)
    return objects


def replay(bundle: Bundle, cluster: LocalCluster, progress: Progress) -> Path:
    """Start the cluster shaped like the bundle's and its operator; returns the kubeconfig."""
    from nicop.operator.crds import install_crds

    namespace = str(bundle.manifest.get("namespace") or "nvidia-network-operator")
    cluster.up(nodes=0, node_agents=False, progress=progress)
    names = cluster.add_nodes(nodes(bundle), progress)
    install_crds(cluster.kubeconfig)
    resources = custom_resources(bundle)
    asyncio.run(_create(cluster.kubeconfig, namespace, resources, bundle))
    cluster.start_node_agents(names, progress=progress)
    progress(f"{len(resources)} custom resources applied")
    cluster.start_process("operator", [
        sys.executable, "-m", "nicop", "operator", "--kubeconfig", str(cluster.kubeconfig),
        "--namespace", namespace, "--health-port", str(free_port()), "--log-format", "json"])
    progress("nicop operator running")
    return cluster.kubeconfig


def extended_resources(node: dict[str, Any]) -> dict[str, Any]:
    """The node's device resources as its kubelet last reported them (`vendor/name` keys): a
    plugin that ran once leaves its resource in capacity, and `nicop status` shows it."""
    status = node.get("status") or {}
    return {section: {k: v for k, v in (status.get(section) or {}).items() if "/" in k}
            for section in ("capacity", "allocatable")}


async def _create(kubeconfig: Path, namespace: str, objects: list[dict[str, Any]],
                  bundle: Bundle) -> None:
    """The nodes' device resources, the namespaces, then every object (applied, as its owner
    would)."""
    client = ApiClient(kubeconfig)
    try:
        for node in bundle.objects("nodes/nodes.yaml"):
            if any((found := extended_resources(node)).values()):
                await client.patch(NODE, node["metadata"]["name"], {"status": found},
                                   subresource="status")
        for name in sorted({namespace, *(str(o["metadata"]["namespace"]) for o in objects
                                         if o["metadata"].get("namespace"))}):
            try:
                await client.create({"apiVersion": "v1", "kind": "Namespace",
                                     "metadata": {"name": name}}, res=NAMESPACE)
            except ApiError as e:
                if e.code != 409:
                    raise
        for obj in objects:
            await client.apply(obj, res=resource_for(obj), manager="nicop-replay")
    finally:
        await client.close()


def comparable(status: dict[str, Any]) -> dict[str, Any]:
    """`nicop status -o json` without the fields STATUS_DIFFERS names."""
    out = {k: v for k, v in status.items() if k not in ("collectedAt", "operator")}
    if out.get("policy"):
        out["policy"] = {k: v for k, v in out["policy"].items()
                         if k not in ("generation", "observedGeneration")}
    out["nodes"] = [{**n, "driver": {k: v for k, v in (n.get("driver") or {}).items()
                                     if k != "pod"} if n.get("driver") else None}
                    for n in status.get("nodes") or []]
    return out


def differences(bundle_status: dict[str, Any], replayed: dict[str, Any]) -> list[str]:
    """Top-level fields (and nodes, by name) where the replay's status differs, apart from
    STATUS_DIFFERS."""
    a, b = comparable(bundle_status), comparable(replayed)
    found = []
    for key in sorted(a.keys() | b.keys()):
        if key == "nodes":
            left = {n["name"]: n for n in a.get("nodes") or []}
            right = {n["name"]: n for n in b.get("nodes") or []}
            for name in sorted(left.keys() | right.keys()):
                one, other = left.get(name), right.get(name)
                if one is None or other is None:
                    found.append(f"nodes[{name}]")
                    continue
                found += [f"nodes[{name}].{k}" for k in sorted(one.keys() | other.keys())
                          if one.get(k) != other.get(k)]
        elif isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            found += [f"{key}.{k}" for k in sorted(a[key].keys() | b[key].keys())
                      if a[key].get(k) != b[key].get(k)]
        elif a.get(key) != b.get(key):
            found.append(key)
    return found
