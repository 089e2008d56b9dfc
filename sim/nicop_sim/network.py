"""The node stand-in's network: the node's network namespace and the container runtime's CNI
calls for the node's pods not on the host network, whether kwok plays them or the stand-in runs
them (a workload of nicop's image; root only: network namespaces need it).

- The node's namespace holds a link for every netdev its simulated sysfs tree shows (a veth
  end named like the netdev, with its MAC), as the kernel would create them: VFs appear there
  once the SR-IOV config daemon writes `sriov_numvfs`.
- For a pod bound to the node that names networks (`k8s.v1.cni.cncf.io/networks`) it does what
  the runtime and Multus do: a network namespace for the pod, then for each network the CNI
  ADD of its NetworkAttachmentDefinition's config, with `deviceID` taken from the devices the
  kubelet allocated for the NAD's `k8s.v1.cni.cncf.io/resourceName`, calling the plugin
  executables in the node's CNI bin dir (installed there by the CNI daemon's init container).
  The results go into the pod's `k8s.v1.cni.cncf.io/network-status` annotation; a failure is a
  `FailedCreatePodSandBox` Event on the pod and is tried again.
- When the pod goes: CNI DEL for each attachment (from what ADD recorded), then its namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

from nicop.api.networks_annotation import Selection, SelectionError, parse_selections
from nicop.cni.multus import network_status
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.resources import NETWORK_ATTACHMENT_DEFINITION as NAD
from nicop.kube.resources import POD, Obj
from nicop_sim.kubelet import DEVICES_ANNOTATION

log = logging.getLogger(__name__)

NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
CNI_BIN_DIR = "/opt/cni/bin"
CNI_SOCKET = "/run/nicop/cni.sock"
RETRY = 2.0
PRIMARY_NETWORK = "etc/cni/net.d/10-kwok-pods.conflist"
PRIMARY_NAME = "kwok-pods"


class CniFailed(Exception):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def write_primary_network(root: Path) -> None:
    """The default network in the node's CNI config dir, as a runtime's node has one, for a
    meta-plugin (nicop's multus daemon) to find and delegate to. kwok gives stand-in pods their
    addresses, so the plugin it names is never called: this stand-in calls only the pods'
    secondary networks, and reports kwok's address as the default network's."""
    path = root / PRIMARY_NETWORK
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"cniVersion": "1.0.0", "name": PRIMARY_NAME,
                                    "plugins": [{"type": "kwok"}]}, indent=2) + "\n")


def ensure_netns(name: str) -> None:
    if not Path(f"/run/netns/{name}").exists():
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")


def add_default_interface(netns: str, node_netns: str, addresses: list[str]) -> str:
    """The pod's eth0 with kwok's addresses, where a runtime's default network puts them: one
    end of a veth pair whose other end is in the node's namespace, as a bridge plugin makes it
    (nothing routes through it here); its MAC."""
    if ip("-n", netns, "link", "show", "eth0", check=False).returncode != 0:
        host_end = f"veth{zlib.crc32(netns.encode()):08x}"
        made = ip("-n", node_netns, "link", "add", host_end, "type", "veth", "peer", "name",
                  "eth0", "netns", netns, check=False)
        if made.returncode != 0:
            raise CniFailed(f"default network: cannot add eth0: {made.stderr.strip()}")
        for address in addresses:
            ip("-n", netns, "addr", "add", f"{address}/{128 if ':' in address else 32}",
               "dev", "eth0", check=False)
        ip("-n", netns, "link", "set", "eth0", "up", check=False)
    shown = json.loads(ip("-n", netns, "-j", "link", "show", "eth0").stdout)
    return str(shown[0]["address"])


def delete_netns(name: str) -> None:
    ip("netns", "del", name, check=False)


def selections(pod: Obj) -> list[Selection]:
    """The pod's network selections, read as nicop's multus reads them."""
    meta = pod["metadata"]
    return parse_selections((meta.get("annotations") or {}).get(NETWORKS_ANNOTATION) or "",
                            meta["namespace"])


def waits_for_devices(pod: Obj) -> bool:
    """True while the kubelet has not yet allocated the extended resources the pod asks for
    (the runtime sets up the sandbox only after that)."""
    if DEVICES_ANNOTATION in (pod["metadata"].get("annotations") or {}):
        return False
    return any("/" in name for c in pod["spec"].get("containers") or []
               for name in {**((c.get("resources") or {}).get("limits") or {}),
                            **((c.get("resources") or {}).get("requests") or {})})


class NodeNetwork:
    def __init__(self, client: ApiClient, node_name: str, node_root: Path, pods_dir: Path,
                 netns: str) -> None:
        self.client = client
        self.node_name = node_name
        self.root = node_root
        self.pods_dir = pods_dir
        self.netns = netns
        self.recorder = EventRecorder(client, component="kubelet")
        self.pods = Informer(client, POD, field_selector=f"spec.nodeName={node_name}")
        self.nads = Informer(client, NAD)
        self.pods.on_change(lambda ev, obj, old: self._wake.set())
        self._wake = asyncio.Event()
        self._links: dict[str, str] = {}  # netdev -> MAC, as made in the node namespace
        self._reported: dict[str, str] = {}  # pod uid -> last failure reported

    # ------------------------------------------------------------------ the node's links
    def sync_links(self) -> None:
        """A link per netdev of the tree; gone with it. Attached VFs are in their pod."""
        attached = {a["host_ifname"] for record in self._records() for a in record["attached"]}
        net = self.root / "sys/class/net"
        present = {}
        for entry in (os.listdir(net) if net.exists() else []):
            address = (net / entry / "address").read_text().strip() if (
                net / entry / "address").exists() else ""
            if len(address.split(":")) == 6:  # Ethernet netdevs; IPoIB has no veth stand-in
                present[entry] = address
        for name in sorted(set(self._links) - set(present)):
            ip("-n", self.netns, "link", "del", name, check=False)
            del self._links[name]
        for name, mac in sorted(present.items()):
            if name in self._links or name in attached:
                continue
            peer = f"sim{zlib.crc32(name.encode()):08x}"
            ip("-n", self.netns, "link", "del", name, check=False)
            made = ip("-n", self.netns, "link", "add", name, "address", mac, "type", "veth",
                      "peer", "name", peer, check=False)
            if made.returncode == 0:
                ip("-n", self.netns, "link", "set", peer, "up", check=False)
                ip("-n", self.netns, "link", "set", name, "up", check=False)
                self._links[name] = mac
            else:
                log.warning("cannot make link %s in %s: %s", name, self.netns,
                            made.stderr.strip())

    # ------------------------------------------------------------------ pods
    def _record_path(self, uid: str) -> Path:
        return self.pods_dir / "networks" / f"{uid}.json"

    def _records(self) -> list[Obj]:
        folder = self.pods_dir / "networks"
        return [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.exists() else []

    async def sync_pods(self) -> None:
        live = {p["metadata"]["uid"]: p for p in self.pods.store.items()
                if not p["metadata"].get("deletionTimestamp")
                and not (p.get("spec") or {}).get("hostNetwork")}
        for record in self._records():
            if record["uid"] not in live:
                await asyncio.to_thread(self._teardown, record)
        for uid, pod in live.items():
            annotation = (pod["metadata"].get("annotations") or {}).get(NETWORKS_ANNOTATION)
            if not (annotation or "").strip() or self._record_path(uid).exists() \
                    or waits_for_devices(pod) or not (pod.get("status") or {}).get("podIPs"):
                continue
            try:
                await self._setup(pod)
                self._reported.pop(uid, None)
            except CniFailed as e:
                if self._reported.get(uid) != str(e):
                    self._reported[uid] = str(e)
                    log.warning("pod %s/%s: %s", pod["metadata"]["namespace"],
                                pod["metadata"]["name"], e)
                    await self.recorder.emit(pod, "Warning", "FailedCreatePodSandBox",
                                             f"Failed to create pod sandbox: {e}")

    async def _setup(self, pod: Obj) -> None:
        meta = pod["metadata"]
        try:
            wanted = selections(pod)
        except SelectionError as e:
            raise CniFailed(f"{NETWORKS_ANNOTATION}: {e}") from None
        devices = json.loads((meta.get("annotations") or {}).get(DEVICES_ANNOTATION) or "{}")
        free: dict[str, list[str]] = {}
        for container in devices.values():
            for resource, got in container.items():
                free.setdefault(resource, []).extend(got.get("ids") or [])
        netns = f"cni-{meta['uid'][:13]}"
        record: Obj = {"uid": meta["uid"], "namespace": meta["namespace"],
                       "name": meta["name"], "netns": netns, "attached": []}
        await asyncio.to_thread(ensure_netns, netns)
        # kwok gave the pod its address on the node's default network (PRIMARY_NETWORK)
        addresses = [a["ip"] for a in pod.get("status", {}).get("podIPs") or []]
        statuses = []
        try:
            mac = await asyncio.to_thread(add_default_interface, netns, self.netns, addresses)
            statuses.append(network_status(PRIMARY_NAME, "eth0", {
                "interfaces": [{"name": "eth0", "mac": mac, "sandbox": f"/run/netns/{netns}"}],
                "ips": [{"address": a, "interface": 0} for a in addresses]}, default=True))
            for index, selection in enumerate(wanted, start=1):
                key = selection.key
                nad = self.nads.store.get(key)
                if nad is None:
                    raise CniFailed(f"network {key}: NetworkAttachmentDefinition not found")
                config = json.loads((nad.get("spec") or {}).get("config") or "{}")
                config.setdefault("name", selection.name)
                resource = (nad["metadata"].get("annotations") or {}).get(RESOURCE_ANNOTATION)
                if resource:
                    if not free.get(resource):
                        raise CniFailed(f"network {key}: the pod has no {resource} device left "
                                        "for it (request the resource in the pod)")
                    config["deviceID"] = free[resource].pop(0)
                ifname = selection.interface or f"net{index}"
                env = self._env(pod, netns, ifname)
                result = await asyncio.to_thread(self._call, "ADD", config, env)
                host_ifname = self._host_ifname(config.get("deviceID"))
                record["attached"].append({"network": key, "ifname": ifname, "config": config,
                                           "host_ifname": host_ifname})
                statuses.append(network_status(key, ifname, result,
                                               device_id=str(config.get("deviceID") or "")))
        except BaseException:
            await asyncio.to_thread(self._teardown, record)
            raise
        path = self._record_path(meta["uid"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
        with contextlib.suppress(ApiError):
            await self.client.patch(POD, meta["name"], {"metadata": {"annotations": {
                STATUS_ANNOTATION: json.dumps(statuses)}}}, meta["namespace"])
        log.info("pod %s/%s: attached %s", meta["namespace"], meta["name"],
                 ", ".join(f"{a['network']} as {a['ifname']}" for a in record["attached"]))

    def _teardown(self, record: Obj) -> None:
        for attached in reversed(record["attached"]):
            env = self._env({"metadata": record}, record["netns"], attached["ifname"])
            try:
                self._call("DEL", attached["config"], env)
            except CniFailed as e:
                log.warning("pod %s/%s: %s", record["namespace"], record["name"], e)
        delete_netns(record["netns"])
        self._record_path(record["uid"]).unlink(missing_ok=True)

    def _env(self, pod: Obj, netns: str, ifname: str) -> dict[str, str]:
        meta = pod["metadata"]
        return {
            "CNI_CONTAINERID": meta["uid"].replace("-", ""), "CNI_NETNS": f"/run/netns/{netns}",
            "CNI_IFNAME": ifname, "CNI_PATH": str(self.root / CNI_BIN_DIR.lstrip("/")),
            "CNI_ARGS": (f"IgnoreUnknown=true;K8S_POD_NAMESPACE={meta['namespace']};"
                         f"K8S_POD_NAME={meta['name']};K8S_POD_UID={meta['uid']};"
                         f"K8S_POD_INFRA_CONTAINER_ID={meta['uid'].replace('-', '')}"),
            "NICOP_CNI_SOCKET": str(self.root / CNI_SOCKET.lstrip("/")),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        }

    def _call(self, command: str, config: Obj, env: dict[str, str]) -> Obj:
        """Run the plugin executable of `config["type"]` as a runtime does."""
        plugin = self.root / CNI_BIN_DIR.lstrip("/") / str(config.get("type", ""))
        if not plugin.exists():
            raise CniFailed(f"CNI plugin {config.get('type')!r} is not installed in "
                            f"{CNI_BIN_DIR} (its DaemonSet has not run on this node yet)")
        done = subprocess.run([sys.executable, str(plugin)], input=json.dumps(config).encode(),
                              env={**env, "CNI_COMMAND": command}, capture_output=True,
                              timeout=120, check=False)
        out: Any = json.loads(done.stdout) if done.stdout.strip() else {}
        if not isinstance(out, dict):
            out = {"msg": str(out)}
        if done.returncode != 0:
            details = f": {out['details']}" if out.get("details") else ""
            raise CniFailed(f"{config.get('type')} {command} failed: {out.get('msg', '')}"
                            f"{details}")
        return dict(out)

    def _host_ifname(self, device_id: str | None) -> str:
        if not device_id:
            return ""
        net = self.root / "sys/bus/pci/devices" / device_id / "net"
        names = sorted(os.listdir(net)) if net.exists() else []
        return names[0] if names else ""

    # ------------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.to_thread(ensure_netns, self.netns)
        tasks = [asyncio.create_task(self.pods.run()), asyncio.create_task(self.nads.run())]
        try:
            while not stop.is_set():
                self._wake.clear()
                await asyncio.to_thread(self.sync_links)
                if self.pods.synced.is_set() and self.nads.synced.is_set():
                    await self.sync_pods()  # (no NAD CRD yet: no pod can name a network)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await asyncio.to_thread(self.close)

    def close(self) -> None:
        """The node goes down: its namespaces go, pods' and its own (their links with them)."""
        for record in self._records():
            delete_netns(record["netns"])
            self._record_path(record["uid"]).unlink(missing_ok=True)
        delete_netns(self.netns)
