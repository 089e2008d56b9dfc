"""SR-IOV end to end on the real control plane: policies to configured VFs on simulated
ConnectX-6 Dx nodes, VFs to the kubelet's allocatable, networks to NADs.

Everything SR-IOV runs in this process against the shared test cluster: the operator's three
SR-IOV controllers (on their own Manager, the test's namespace as operator namespace), and per
node a simulated hardware root, a config daemon, the SR-IOV device plugin fed from the
`device-plugin-config` ConfigMap (as its ConfigMap volume would be), and the kubelet stand-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from tests.eventually import until

from nicop.api.labels import CURRENT_STATE, DESIRED_STATE, NODE_STATE_ANNOTATION
from nicop.kube.client import ApiClient
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Manager
from nicop.kube.resources import CONFIGMAP, EVENT, NODE, Obj
from nicop.kube.resources import NETWORK_ATTACHMENT_DEFINITION as NAD
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.deviceplugin.sriov import SriovAgent
from nicop.node.sriov_daemon import DaemonOptions, SriovConfigDaemon
from nicop.operator.sriov import (
    CONFIG_MAP_NAME,
    DEVICE_PLUGIN_LABEL,
    KEEP_UNTIL_ANNOTATION,
    POLICY,
    SriovPolicyController,
)
from nicop.operator.sriov_drain import (
    CORDONED_ANNOTATION,
    NODE_STATE,
    OPERATOR_CONFIG,
    POOL_CONFIG,
    SriovDrainController,
)
from nicop.operator.sriov_networks import (
    SRIOV_IB_NETWORK,
    SRIOV_NETWORK,
    SriovNetworkController,
)
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import Kubelet

ROOT = Path(__file__).resolve().parents[2]
NODE_NAME = "node-2"  # a ConnectX-6 Dx node of the shared cluster
PF0 = "enp59s0f0np0"  # the cx6dx profile's first port (the docs' ens1f0)
PCI0 = "0000:3b:00.0"
PREFIX = "nvidia.com"
TEST_LABEL = "nicop.io/sriov-test"


@dataclass
class SimNode:
    """One simulated node: hardware, config daemon, device plugin, kubelet stand-in."""

    name: str
    root: Path
    host: SimulatedHost
    kubelet: Kubelet | None = None
    agent_task: asyncio.Task[None] | None = None
    config_text: str | None = None


@dataclass
class Rig:
    """The SR-IOV stack of `nodes`, with `namespace` as the operator namespace."""

    kubeconfig: Path
    namespace: str
    nodes: list[str]
    daemon: DaemonOptions = field(default_factory=lambda: DaemonOptions(
        node_name="", resync_interval=2.0, max_attempts=2, retry_delay=0.2,
        failed_retry_interval=1.0, drain_timeout=120.0))
    stale_state_delay: float = 600.0
    plugin_poll: float = 0.3
    sim: dict[str, SimNode] = field(default_factory=dict)
    daemons: dict[str, SriovConfigDaemon] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _clients: list[ApiClient] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> Rig:
        self.api = self._client()
        manager = Manager(self._client())
        recorder = EventRecorder(manager.client)
        SriovPolicyController(manager, self.namespace, recorder,
                              stale_state_delay=self.stale_state_delay)
        SriovDrainController(manager, self.namespace, recorder)
        SriovNetworkController(manager, self.namespace, recorder)
        self._tasks.append(asyncio.create_task(manager.run()))
        for i, name in enumerate(self.nodes):
            root = Path(tempfile.mkdtemp(prefix=f"sr{i}-", dir="/tmp"))  # short socket paths
            node = SimNode(name, root, SimulatedHost.build(root, "cx6dx", seed=40 + i))
            self.sim[name] = node
            options = replace(self.daemon, node_name=name, namespace=self.namespace,
                              store_dir="/etc/sriov-operator/pci")
            daemon = SriovConfigDaemon(self._client(), node.host, options)
            self.daemons[name] = daemon
            self._tasks.append(asyncio.create_task(daemon.run(self._stop)))
            node.kubelet = Kubelet(node.host.path(DEVICE_PLUGIN_PATH), node_name=name,
                                   kubeconfig=self.kubeconfig)
            await node.kubelet.start()
            self._tasks.append(asyncio.create_task(self._feed_plugin(node)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop everything; a background task that crashed fails the test that ran it."""
        self._stop.set()
        for task in self._tasks:
            if not task.done() and task is not self._tasks[0]:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(task), 10)
        crashed = [task for task in [*self._tasks, *(n.agent_task for n in self.sim.values()
                                                     if n.agent_task is not None)]
                   if task.done() and not task.cancelled() and task.exception() is not None]
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for node in self.sim.values():
            if node.agent_task is not None and not node.agent_task.done():
                node.agent_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await node.agent_task
            if node.kubelet is not None:
                await node.kubelet.close()
            shutil.rmtree(node.root, ignore_errors=True)
        for client in self._clients:
            await client.close()
        if crashed and exc[0] is None:
            raise crashed[0].exception()  # type: ignore[misc]

    def _client(self) -> ApiClient:
        client = ApiClient(self.kubeconfig)
        self._clients.append(client)
        return client

    async def _feed_plugin(self, node: SimNode) -> None:
        """Copy the node's key of the ConfigMap to the plugin's config file (what a ConfigMap
        volume does), and start the plugin once it has resources to serve."""
        path = node.root / "pcidp.json"
        while not self._stop.is_set():
            cm = await self.api.get_or_none(CONFIGMAP, CONFIG_MAP_NAME, self.namespace)
            text = ((cm or {}).get("data") or {}).get(node.name)
            if text is not None and text != node.config_text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(path)
                node.config_text = text
            if node.agent_task is None and text and json.loads(text).get("resourceList"):
                agent = SriovAgent(path, node.host, node.host.path(DEVICE_PLUGIN_PATH),
                                   default_prefix=PREFIX, poll_interval=self.plugin_poll)
                node.agent_task = asyncio.create_task(agent.run(self._stop))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.plugin_poll)

    # ------------------------------------------------------------------ helpers
    async def apply(self, obj: Obj) -> Obj:
        from nicop.kube.resources import Resource

        kinds: dict[str, Resource] = {r.kind: r for r in (
            POLICY, NODE_STATE, OPERATOR_CONFIG, POOL_CONFIG, SRIOV_NETWORK, SRIOV_IB_NETWORK)}
        obj.setdefault("apiVersion", "sriovnetwork.openshift.io/v1")
        obj["metadata"].setdefault("namespace", self.namespace)
        return await self.api.apply(obj, res=kinds[obj["kind"]])

    async def state(self, node: str) -> Obj | None:
        return await self.api.get_or_none(NODE_STATE, node, self.namespace)

    async def synced(self, node: str, numvfs: int) -> Obj | None:
        """The node state once the daemon reports Succeeded with `numvfs` VFs on PF0."""
        state = await self.state(node)
        status = (state or {}).get("status") or {}
        pf = next((i for i in status.get("interfaces") or [] if i["pciAddress"] == PCI0), {})
        if status.get("syncStatus") == "Succeeded" and len(pf.get("Vfs") or []) == numvfs \
                and pf.get("numVfs") == numvfs and _spec_vfs(state) == numvfs:
            return state
        return None

    async def allocatable(self, node: str, resource: str) -> str | None:
        obj = await self.api.get(NODE, node)
        return ((obj.get("status") or {}).get("allocatable") or {}).get(f"{PREFIX}/{resource}")


def _spec_vfs(state: Obj | None) -> int:
    interfaces = ((state or {}).get("spec") or {}).get("interfaces") or []
    return next((i.get("numVfs", 0) for i in interfaces if i["pciAddress"] == PCI0), 0)


def policy(name: str, numvfs: int, pf_names: list[str], resource: str,
           selector: dict[str, str], **spec: Any) -> Obj:
    return {"kind": "SriovNetworkNodePolicy", "metadata": {"name": name}, "spec": {
        "resourceName": resource, "nodeSelector": selector, "numVfs": numvfs,
        "nicSelector": {"vendor": "15b3", "pfNames": pf_names}, **spec}}


def operator_config(selector: dict[str, str], **spec: Any) -> Obj:
    return {"kind": "SriovOperatorConfig", "metadata": {"name": "default"},
            "spec": {"configDaemonNodeSelector": selector, **spec}}


def clean_node(client: Client, name: str) -> None:
    """Leave the shared node as the cluster made it."""
    node = client.get(Node, name)
    annotations = node.metadata.annotations or {}
    client.patch(Node, name, {
        "metadata": {
            "labels": {TEST_LABEL: None, DEVICE_PLUGIN_LABEL: None},
            "annotations": {k: None for k in (NODE_STATE_ANNOTATION, CORDONED_ANNOTATION)
                            if k in annotations},
        },
        "spec": {"unschedulable": None},
    })


@pytest.fixture
def selected(client: Client, namespace: str, crds: list[str]) -> Iterator[dict[str, str]]:
    """node-2, labelled for this test: the selector of the config daemons and the policies."""
    client.patch(Node, NODE_NAME, {"metadata": {"labels": {TEST_LABEL: namespace}}})
    yield {TEST_LABEL: namespace}
    clean_node(client, NODE_NAME)


def scheduled_on(client: Client, namespace: str, name: str) -> str | None:
    spec = client.get(Pod, name, namespace=namespace).spec
    return spec.nodeName if spec else None


def test_policy_creates_vfs_that_a_pod_gets_scheduled_on(
    client: Client, kubeconfig: Path, namespace: str, selected: dict[str, str]
) -> None:
    resource = f"cx6dx_vf_{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        async with Rig(kubeconfig, namespace, [NODE_NAME]) as rig:
            await rig.apply(operator_config(selected))
            await rig.apply(policy("cx6dx-vf", 8, [PF0], resource, selected, mtu=9000))
            state = await until(lambda: rig.synced(NODE_NAME, 8), 60, "8 VFs configured")
            (iface,) = state["spec"]["interfaces"]
            assert iface["vfGroups"] == [{"resourceName": resource, "deviceType": "netdevice",
                                          "vfRange": "0-7", "policyName": "cx6dx-vf",
                                          "mtu": 9000}]
            pf = next(i for i in state["status"]["interfaces"] if i["name"] == PF0)
            assert pf["totalvfs"] == 8 and pf["mtu"] == 9000
            assert [vf["vfID"] for vf in pf["Vfs"]] == list(range(8))
            assert state["status"]["lastSyncError"] == ""
            host = rig.sim[NODE_NAME].host
            assert len(host.vfs(PF0)) == 8 and host.read(f"/sys/class/net/{PF0}/mtu") == "9000"
            await until(lambda: _equals(rig.allocatable(NODE_NAME, resource), "8"), 60,
                        f"{PREFIX}/{resource}: 8 on the node")
            node = await rig.api.get(NODE, NODE_NAME)
            assert node["metadata"]["labels"][DEVICE_PLUGIN_LABEL] == "Enabled"
            assert not (node.get("spec") or {}).get("unschedulable"), "0 -> 8 needs no drain"

            await asyncio.to_thread(client.create, Pod(
                metadata=ObjectMeta(name="vf-user", namespace=namespace),
                spec=PodSpec(containers=[Container(
                    name="c", image="busybox", resources=ResourceRequirements(
                        requests={f"{PREFIX}/{resource}": "1"},
                        limits={f"{PREFIX}/{resource}": "1"}))])))
            placed = await until(
                lambda: asyncio.to_thread(scheduled_on, client, namespace, "vf-user"), 30,
                "the pod to be scheduled")
            assert placed == NODE_NAME

            # Applying the same spec again (a resync, a restarted daemon) writes nothing. First
            # the controllers' follow-ups to the sync settle (on a busy machine they can come
            # after the pod is placed): the state unchanged over a second; a daemon that wrote
            # on every resync would never settle.
            before = host.read(f"/sys/bus/pci/devices/{PCI0}/sriov_numvfs")

            async def version() -> str:
                state = await rig.state(NODE_NAME)
                assert state is not None
                return str(state["metadata"]["resourceVersion"])

            deadline = time.monotonic() + 30
            rv = await version()
            while True:
                await asyncio.sleep(1.0)  # the quiet period that counts as settled
                latest = await version()
                if latest == rv:
                    break
                assert time.monotonic() < deadline, "the node state never stopped changing"
                rv = latest
            passes = rig.daemons[NODE_NAME].passes
            await until(lambda: rig.daemons[NODE_NAME].passes >= passes + 2, 30,
                        "two more passes of the daemon (resyncs)")
            assert await version() == rv
            assert host.read(f"/sys/bus/pci/devices/{PCI0}/sriov_numvfs") == before

    asyncio.run(main())


async def _equals(value: Awaitable[Any], wanted: Any) -> bool:
    return await value == wanted


def test_two_policies_split_a_pf_and_an_overlapping_one_is_refused(
    client: Client, kubeconfig: Path, namespace: str, selected: dict[str, str]
) -> None:
    tag = uuid.uuid4().hex[:6]
    res_a, res_b, res_c = f"split_a_{tag}", f"split_b_{tag}", f"split_c_{tag}"

    async def main() -> None:
        async with Rig(kubeconfig, namespace, [NODE_NAME]) as rig:
            await rig.apply(operator_config(selected))
            await rig.apply(policy("split-a", 8, [f"{PF0}#0-3"], res_a, selected))
            await rig.apply(policy("split-b", 8, [f"{PF0}#4-7"], res_b, selected))
            state = await until(lambda: rig.synced(NODE_NAME, 8), 60, "8 VFs configured")
            groups = state["spec"]["interfaces"][0]["vfGroups"]
            assert sorted((g["resourceName"], g["vfRange"]) for g in groups) == [
                (res_a, "0-3"), (res_b, "4-7")]
            for res in (res_a, res_b):
                await until(lambda res=res: _equals(rig.allocatable(NODE_NAME, res), "4"), 60,
                            f"{PREFIX}/{res}: 4 on the node")

            await rig.apply(policy("split-c", 8, [f"{PF0}#2-5"], res_c, selected))

            async def refused() -> Obj | None:
                obj = await rig.api.get(POLICY, "split-c", namespace)
                return next((c for c in (obj.get("status") or {}).get("conditions") or []
                             if c["type"] == "Accepted" and c["status"] == "False"), None)

            condition = await until(refused, 30, "split-c to be refused")
            assert condition["reason"] == "OverlappingVfRange"
            assert "existing policy split-a" in condition["message"]
            assert "existing policy split-b" in condition["message"]
            events, _ = await rig.api.list(EVENT, namespace)
            assert any(e["involvedObject"]["name"] == "split-c" and e["reason"] ==
                       "PolicyRefused" and "split-a" in e["message"] for e in events)
            for name in ("split-a", "split-b"):
                obj = await rig.api.get(POLICY, name, namespace)
                accepted = obj["status"]["conditions"][0]
                assert (accepted["type"], accepted["status"]) == ("Accepted", "True")
            # Not applied: neither in the node state nor in the device plugin config.
            state = await rig.state(NODE_NAME)
            assert state is not None
            assert {g["policyName"] for g in state["spec"]["interfaces"][0]["vfGroups"]} == {
                "split-a", "split-b"}
            cm = await rig.api.get(CONFIGMAP, CONFIG_MAP_NAME, namespace)
            listed = json.loads(cm["data"][NODE_NAME])["resourceList"]
            assert sorted(r["resourceName"] for r in listed) == [res_a, res_b]

    asyncio.run(main())


def test_a_failing_write_is_reported_and_recovers_once_fixed(
    client: Client, kubeconfig: Path, namespace: str, selected: dict[str, str]
) -> None:
    async def main() -> None:
        async with Rig(kubeconfig, namespace, [NODE_NAME]) as rig:
            host = rig.sim[NODE_NAME].host
            host.fail_numvfs_writes(PF0, errno.EBUSY)
            await rig.apply(operator_config(selected))
            await rig.apply(policy("busy", 8, [PF0], "busy_vf", selected))

            async def failed() -> Obj | None:
                state = await rig.state(NODE_NAME)
                status = (state or {}).get("status") or {}
                return status if status.get("syncStatus") == "Failed" else None

            status = await until(failed, 60, "syncStatus Failed")
            assert status["lastSyncError"] == (
                f"PF {PF0} ({PCI0}): creating 8 VFs (writing 8 to sriov_numvfs) failed: "
                "Device or resource busy")
            host.fail_numvfs_writes(PF0, None)  # the cause is fixed
            await until(lambda: rig.synced(NODE_NAME, 8), 30, "Succeeded after the fix")

            # A failure that happens after a drain leaves no node cordoned.
            host.fail_numvfs_writes(PF0, errno.EBUSY)
            await rig.apply(policy("busy", 4, [PF0], "busy_vf", selected))
            status = await until(failed, 60, "syncStatus Failed after the drain")
            assert "removing its VFs (writing 0 to sriov_numvfs)" in status["lastSyncError"]

            async def idle_and_uncordoned() -> bool:
                state = await rig.state(NODE_NAME)
                node = await rig.api.get(NODE, NODE_NAME)
                ann = (state or {})["metadata"].get("annotations") or {}
                return (ann.get(DESIRED_STATE), ann.get(CURRENT_STATE)) == ("Idle", "Idle") \
                    and not (node.get("spec") or {}).get("unschedulable")

            await until(idle_and_uncordoned, 30, "the node Idle and uncordoned")
            host.fail_numvfs_writes(PF0, None)
            await until(lambda: rig.synced(NODE_NAME, 4), 60, "4 VFs after the fix")
            await until(idle_and_uncordoned, 30, "the node Idle and uncordoned at the end")

    asyncio.run(main())


def test_node_states_of_unselected_nodes_go_after_the_keep_delay(
    client: Client, kubeconfig: Path, namespace: str, selected: dict[str, str]
) -> None:
    async def main() -> None:
        async with Rig(kubeconfig, namespace, [NODE_NAME], stale_state_delay=3.0) as rig:
            await rig.apply(operator_config(selected))
            await until(lambda: rig.state(NODE_NAME), 30, "the node state to be created")
            await rig.apply(operator_config({TEST_LABEL: "nobody"}))

            async def kept_until() -> str | None:
                state = await rig.state(NODE_NAME)
                return ((state or {})["metadata"].get("annotations") or {}).get(
                    KEEP_UNTIL_ANNOTATION)

            await until(kept_until, 30, "the keep-state-until annotation")
            assert await rig.state(NODE_NAME) is not None  # kept for now
            await until(lambda: _none(rig.state(NODE_NAME)), 30, "the node state to go")
            node = await rig.api.get(NODE, NODE_NAME)
            assert DEVICE_PLUGIN_LABEL not in node["metadata"]["labels"]

    asyncio.run(main())


async def _none(value: Awaitable[Any]) -> bool:
    return await value is None


# ------------------------------------------------------------------------------ networks

def example(name: str) -> Obj:
    obj: Obj = yaml.safe_load((ROOT / "examples" / name).read_text())
    return obj


def test_sriov_networks_become_their_nads(
    client: Client, kubeconfig: Path, namespace: str, crds: list[str]
) -> None:
    target = f"t-{uuid.uuid4().hex[:8]}"
    missing = f"t-{uuid.uuid4().hex[:8]}"
    client.create(Namespace(metadata=ObjectMeta(name=target)))

    async def nad(rig: Rig, ns: str, name: str) -> Obj | None:
        return await rig.api.get_or_none(NAD, name, ns)

    async def main() -> None:
        async with Rig(kubeconfig, namespace, []) as rig:
            eth = example("sriovnetwork.yaml")
            ib = example("sriovibnetwork.yaml")
            for cr in (eth, ib):
                cr["metadata"]["namespace"] = namespace
                cr["spec"]["networkNamespace"] = target
                await rig.apply(cr)
            eth_nad = await until(lambda: nad(rig, target, "roce-vlan100"), 30, "the NAD")
            assert eth_nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == \
                f"{PREFIX}/cx6dx_vf"
            assert json.loads(eth_nad["spec"]["config"]) == {
                "cniVersion": "1.0.0", "name": "roce-vlan100", "plugins": [
                    {"type": "sriov", "vlan": 100, "spoofchk": "on", "trust": "off",
                     "vlanQoS": 3, "capabilities": {"mac": True, "ips": True},
                     "link_state": "auto", "logLevel": "info",
                     "ipam": {"type": "nv-ipam", "poolName": "rdma-pool"}},
                    {"type": "tuning", "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}}]}
            ib_nad = await until(lambda: nad(rig, target, "ib-sriov"), 30, "the IB NAD")
            assert json.loads(ib_nad["spec"]["config"]) == {
                "cniVersion": "1.0.0", "name": "ib-sriov", "type": "ib-sriov",
                "capabilities": {"infinibandGUID": True}, "link_state": "enable",
                "ipam": {"type": "nv-ipam", "poolName": "ib-pool"}}
            status = (await rig.api.get(SRIOV_NETWORK, "roce-vlan100", namespace))["status"]
            assert status["conditions"][0]["reason"] == "NetworkReady"

            # A network whose target namespace does not exist yet waits for it.
            later = {"kind": "SriovNetwork", "metadata": {"name": "later"},
                     "spec": {"resourceName": "vf", "networkNamespace": missing}}
            await rig.apply(later)

            async def waiting() -> bool:
                obj = await rig.api.get(SRIOV_NETWORK, "later", namespace)
                conditions = (obj.get("status") or {}).get("conditions") or []
                return any(c["reason"] == "NamespaceNotFound" for c in conditions)

            await until(waiting, 30, "reason NamespaceNotFound")
            await asyncio.to_thread(client.create, Namespace(metadata=ObjectMeta(name=missing)))
            later_nad = await until(lambda: nad(rig, missing, "later"), 30, "the late NAD")
            assert json.loads(later_nad["spec"]["config"]) == {
                "cniVersion": "1.0.0", "name": "later", "type": "sriov", "vlan": 0,
                "vlanQoS": 0, "logLevel": "info", "ipam": {}}

            # Deleting a network deletes its NAD, in whatever namespace it is.
            for kind, name in ((SRIOV_NETWORK, "roce-vlan100"), (SRIOV_IB_NETWORK, "ib-sriov"),
                               (SRIOV_NETWORK, "later")):
                await rig.api.delete(kind, name, namespace)
            await until(lambda: _none(nad(rig, target, "roce-vlan100")), 30, "the NAD gone")
            await until(lambda: _none(nad(rig, target, "ib-sriov")), 30, "the IB NAD gone")
            await until(lambda: _none(nad(rig, missing, "later")), 30, "the late NAD gone")
            await until(lambda: _none(rig.api.get_or_none(SRIOV_NETWORK, "later", namespace)),
                        30, "the network itself gone (its finalizer removed)")

    try:
        asyncio.run(main())
    finally:
        for ns in (target, missing):
            with contextlib.suppress(Exception):
                client.delete(Namespace, ns)
