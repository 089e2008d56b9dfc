"""With the kubelet stand-in, the plugins' resources reach the node's status in the real API
server, kwok leaves them alone, and the real scheduler places pods by them."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from tests.eventually import until

from nicop.node.deviceplugin.rdma import RdmaAgent, load_config
from nicop.node.deviceplugin.server import DEVICE_PLUGIN_PATH
from nicop.node.deviceplugin.sriov import SriovAgent
from nicop_sim.hardware import SimulatedHost
from nicop_sim.kubelet import DEVICES_ANNOTATION, Kubelet

NODE = "node-2"  # a cx6dx node of the test cluster
RDMA = "rdma/hca_shared_devices_a"
VF = "nvidia.com/sriov_rdma_vf"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="node-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def test_node_status_follows_the_plugins(
    client: Client, kubeconfig: Path, namespace: str, root: Path
) -> None:
    host = SimulatedHost.build(root, "cx6dx", seed=2)
    host.set_numvfs("enp59s0f0np0", 4)
    (root / "rdma.json").write_text(json.dumps({"configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 10,
         "selectors": {"ifNames": ["enp59s0f1np1"]}}]}))
    (root / "sriov.json").write_text(json.dumps({"resourceList": [
        {"resourceName": "sriov_rdma_vf", "resourcePrefix": "nvidia.com",
         "selectors": {"pfNames": ["enp59s0f0np0"], "isRdma": True}}]}))
    sockdir = host.path(DEVICE_PLUGIN_PATH)

    def node_has(wanted: dict[str, str]) -> Callable[[], bool]:
        def check() -> bool:
            status = client.get(Node, NODE).status
            allocatable = (status and status.allocatable) or {}
            return all(allocatable.get(k) == v for k, v in wanted.items())
        return check

    async def main() -> None:
        kubelet = Kubelet(sockdir, node_name=NODE, kubeconfig=kubeconfig)
        await kubelet.start()
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(RdmaAgent(load_config(root / "rdma.json"), host, sockdir,
                                          poll_interval=0.2).run(stop)),
            asyncio.create_task(SriovAgent(root / "sriov.json", host, sockdir,
                                           poll_interval=0.2).run(stop)),
        ]
        try:
            await until(node_has({RDMA: "10", VF: "4"}), 30, "the node's allocatable",
                        blocking=True)
            status = (await asyncio.to_thread(client.get, Node, NODE)).status
            assert status is not None and status.capacity is not None
            assert status.capacity[RDMA] == "10" and status.capacity[VF] == "4"
            assert status.allocatable is not None and status.allocatable["pods"] == "110"

            pod = Pod(metadata=ObjectMeta(name="rdma-test", namespace=namespace),
                      spec=PodSpec(containers=[Container(
                          name="c", image="busybox",
                          resources=ResourceRequirements(
                              requests={RDMA: "1", VF: "1"}, limits={RDMA: "1", VF: "1"}))]))
            await asyncio.to_thread(client.create, pod)

            def scheduled() -> bool:
                spec = client.get(Pod, "rdma-test", namespace=namespace).spec
                return spec is not None and spec.nodeName is not None
            await until(scheduled, 30, "the pod to be scheduled", blocking=True)
            placed = await asyncio.to_thread(client.get, Pod, "rdma-test", namespace=namespace)
            assert placed.spec is not None and placed.spec.nodeName == NODE

            host.set_link("enp59s0f0np0", False)  # the VFs' PF
            await until(node_has({RDMA: "10", VF: "0"}), 10, "the VFs to become unallocatable",
                        blocking=True)
            host.set_link("enp59s0f0np0", True)
            await until(node_has({RDMA: "10", VF: "4"}), 10, "the VFs to come back", blocking=True)
            await asyncio.sleep(5)  # kwok updates nodes on its own; it must keep these
            assert await asyncio.to_thread(node_has({RDMA: "10", VF: "4"}))
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            await kubelet.close()

    asyncio.run(main())


def test_a_pod_bound_while_its_plugin_is_away_fails_and_the_next_gets_devices(
    client: Client, kubeconfig: Path, namespace: str, root: Path
) -> None:
    """A pod placed in the moment its device plugin is restarting cannot be given devices: the
    kubelet fails it (phase Failed, reason UnexpectedAdmissionError, as kubelet's device
    manager does when a resource has no devices to hand out) so its controller makes another,
    rather than leaving it pending forever; once the plugin is back, the next pod is served."""
    host = SimulatedHost.build(root, "cx6dx", seed=2)
    (root / "rdma.json").write_text(json.dumps({"configList": [
        {"resourceName": "hca_shared_devices_a", "rdmaHcaMax": 10,
         "selectors": {"ifNames": ["enp59s0f1np1"]}}]}))
    sockdir = host.path(DEVICE_PLUGIN_PATH)

    def bound_pod(name: str) -> Pod:
        return Pod(metadata=ObjectMeta(name=name, namespace=namespace),
                   spec=PodSpec(nodeName=NODE, containers=[Container(
                       name="c", image="busybox",
                       resources=ResourceRequirements(requests={RDMA: "1"},
                                                      limits={RDMA: "1"}))]))

    def pod_status(name: str) -> tuple[str | None, str | None, str | None]:
        status = client.get(Pod, name, namespace=namespace).status
        return (status.phase, status.reason, status.message) if status else (None, None, None)

    def has_devices(name: str) -> bool:
        annotations = client.get(Pod, name, namespace=namespace).metadata.annotations or {}
        return RDMA in json.loads(annotations.get(DEVICES_ANNOTATION, "{}")).get("c", {})

    def plugin(stop: asyncio.Event) -> asyncio.Task[None]:
        return asyncio.create_task(RdmaAgent(load_config(root / "rdma.json"), host, sockdir,
                                             poll_interval=0.2).run(stop))

    async def main() -> None:
        kubelet = Kubelet(sockdir, node_name=NODE, kubeconfig=kubeconfig)
        await kubelet.start()
        first_stop, second_stop = asyncio.Event(), asyncio.Event()
        tasks = [plugin(first_stop)]
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable().get(RDMA) == 10, 30)
            first_stop.set()  # the plugin restarts: gone ...
            await tasks[0]
            await kubelet.wait_for(lambda: kubelet.allocatable().get(RDMA) == 0, 30)
            await asyncio.to_thread(client.create, bound_pod("in-the-gap"))
            await until(lambda: pod_status("in-the-gap")[0] == "Failed", 30,
                        "the pod bound in the gap to fail", blocking=True)
            _, reason, message = await asyncio.to_thread(pod_status, "in-the-gap")
            assert reason == "UnexpectedAdmissionError"
            assert message and RDMA in message
            assert not await asyncio.to_thread(has_devices, "in-the-gap")

            tasks.append(plugin(second_stop))  # ... and back
            await kubelet.wait_for(lambda: kubelet.allocatable().get(RDMA) == 10, 30)
            await asyncio.to_thread(client.create, bound_pod("after-the-gap"))
            await until(lambda: has_devices("after-the-gap"), 30, "the next pod's devices",
                        blocking=True)
            assert (await asyncio.to_thread(pod_status, "after-the-gap"))[0] != "Failed"
        finally:
            first_stop.set()
            second_stop.set()
            await asyncio.gather(*tasks)
            await kubelet.close()

    asyncio.run(main())
