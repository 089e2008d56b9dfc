"""nicop's CNI plugins on the nodes: deployed while networks use them.

When any NetworkAttachmentDefinition (rendered by nicop from a network CR, or written by hand)
names a plugin nicop implements (`sriov`, `ib-sriov`, `host-device`, or IPAM `nv-ipam`), the
DaemonSet `nicop-cni-daemon` runs `nicop cni-daemon` on the nodes where such pods can land: nodes
nicop manages (they carry the mofed.wait label) and nodes with SR-IOV resources (labelled
`sriovnetwork.openshift.io/device-plugin=Enabled`). Its init container installs the plugins
those networks use into the node's CNI bin dir, each a small executable that forwards the call
to the daemon. When the last such network goes, so does the DaemonSet.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from nicop import logs
from nicop.api.agents import CNI_PLUGINS, CNI_SOCKET, METRICS_PORTS, SOCKET_DIR, own_image
from nicop.api.labels import DEVICE_PLUGIN_LABEL, MOFED_WAIT_LABEL
from nicop.kube.client import ApiClient
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import NETWORK_ATTACHMENT_DEFINITION as NAD
from nicop.kube.resources import Obj
from nicop.operator.components import Components
from nicop.operator.states.base import (
    Context,
    agent_container,
    cluster_rbac,
    daemonset,
    host_path,
    service_account,
)

log = logging.getLogger(__name__)

NAME = "nicop-cni-daemon"
SOCKET = CNI_SOCKET
ROLLOUT_RECHECK = 10.0


def plugin_types(config: str) -> set[str]:
    """The plugin and IPAM types a NAD's CNI config names (a conflist's plugins too)."""
    try:
        doc = json.loads(config or "{}")
    except ValueError:
        return set()
    if not isinstance(doc, dict):
        return set()
    found = set()
    for plugin in [doc, *(p for p in doc.get("plugins") or [] if isinstance(p, dict))]:
        if isinstance(plugin.get("type"), str):
            found.add(plugin["type"])
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and isinstance(ipam.get("type"), str):
            found.add(ipam["type"])
    return found


def used_plugins(nads: Iterable[Obj]) -> list[str]:
    used: set[str] = set()
    for nad in nads:
        used |= plugin_types((nad.get("spec") or {}).get("config") or "")
    return sorted(used & set(CNI_PLUGINS))


def render(ctx: Context, plugins: list[str]) -> list[Obj]:
    volumes, mounts = [], []
    for name, path, type_ in (("socket-dir", SOCKET_DIR, "DirectoryOrCreate"),
                              ("cni-state", "/var/lib/cni", "DirectoryOrCreate"),
                              ("netns", "/var/run/netns", "DirectoryOrCreate")):
        volume, mount = host_path(name, path, type_=type_)
        if name == "netns":  # namespaces the runtime mounts later must show inside
            mount["mountPropagation"] = "HostToContainer"
        volumes.append(volume)
        mounts.append(mount)
    bin_volume, bin_mount = host_path("cni-bin", ctx.cni_bin_dir, f"/host{ctx.cni_bin_dir}",
                                      type_="DirectoryOrCreate")
    volumes.append(bin_volume)
    # The node's other CNI plugins, where CNI_PATH names them: the IPAM a network delegates to
    # (host-local, whereabouts) runs from the daemon.
    mounts.append({"name": "cni-bin", "mountPath": ctx.cni_bin_dir, "readOnly": True})
    install = agent_container(
        ctx, "cni-install", None,
        ["cni-install", "--host-root", "/host", "--cni-bin-dir", ctx.cni_bin_dir,
         "--socket", SOCKET, *(f"--plugin={p}" for p in plugins)],
        mounts=[bin_mount], ready_probe=False)
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {
               "fieldPath": "metadata.namespace"}}}]
    ds = daemonset(
        ctx, NAME, None,
        [agent_container(ctx, "cni-daemon", None, ["cni-daemon", "--socket", SOCKET],
                         mounts=mounts, env=env, metrics_port=METRICS_PORTS["cni-daemon"])],
        app=NAME, volumes=volumes, service_account_name=NAME, managed_only=False,
        tolerations=[{"operator": "Exists"}], init_containers=[install],
    )
    pod = ds["spec"]["template"]["spec"]
    pod["hostPID"] = True
    pod["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": MOFED_WAIT_LABEL, "operator": "Exists"}]},
            {"matchExpressions": [{"key": DEVICE_PLUGIN_LABEL, "operator": "In",
                                   "values": ["Enabled"]}]},
        ]}}}
    return [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": ["nv-ipam.nvidia.com"], "resources": ["ippools", "cidrpools"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    ]), ds]


class CniDaemonController:
    KEY = "cni-daemon"

    def __init__(self, manager: Manager, namespace: str, cni_bin_dir: str) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.cni_bin_dir = cni_bin_dir
        self.nads = manager.informer(NAD)
        self.controller = manager.add(Controller(self.KEY, self.reconcile))
        self.nads.on_change(self._nad_changed)
        self.components = Components(manager, namespace, (NAME,),
                                     lambda name: self.controller.queue.add(self.KEY))
        self.controller.queue.add(self.KEY)

    def _nad_changed(self, event: str, nad: Obj, old: Obj | None) -> None:
        if (old is None or event == "DELETED"
                or (nad.get("spec") or {}).get("config") != (old.get("spec") or {}).get("config")):
            self.controller.queue.add(self.KEY)

    async def reconcile(self, key: str) -> Result | None:
        plugins = used_plugins(self.nads.store.items())
        if not plugins:
            if await self.components.remove(NAME):
                log.info("no network uses nicop's CNI plugins: removed the CNI daemon",
                         extra=logs.about("DaemonSet", NAME, self.namespace))
            return None
        ctx = Context({"spec": {}}, self.namespace, cni_bin_dir=self.cni_bin_dir,
                      agent_image=own_image())
        problems = await self.components.sync(NAME, render(ctx, plugins))
        return Result(requeue_after=ROLLOUT_RECHECK) if problems else None
