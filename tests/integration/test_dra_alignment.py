"""nicop's DRA driver piece by piece on the real control plane, beside the cluster's own
nodes: the `nicop dra-plugin` process publishing a simulated DGX's NICs and GPUs, the real
scheduler pairing a GB300's GPUs and NICs through the NICs' Data Direct functions, the kubelet
plugin preparing a claim's VFs as CDI devices across a restart, and the node stand-in preparing
a pod's claim through the plugin. test_dra_deployed.py runs the same driver as the operator
deploys it (GPU-NIC alignment, VFs from an SR-IOV policy, device plugins side by side)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.eventually import until

from nicop.api import dra
from nicop.kube.client import ApiClient
from nicop.kube.resources import DEVICE_CLASS, POD, RESOURCE_SLICE, Resource
from nicop.node import discovery
from nicop.node.dra.devices import node_devices, node_pool, pcie_root
from nicop.node.dra.publisher import SlicePublisher
from nicop.node.dra.slices import PoolContent
from nicop_sim import gpu_dra
from nicop_sim.cluster import LocalCluster
from nicop_sim.dra_kubelet import ANNOTATION
from nicop_sim.hardware import SimulatedHost

NODE = "node-1"  # the DGX of the test cluster's layout
CLAIM_TEMPLATE = Resource("resource.k8s.io", "v1", "ResourceClaimTemplate",
                          "resourceclaimtemplates")
CLAIM = Resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
PAIRS = 8
GB300_PAIRS = 4  # the gb300 profile's GPU-NIC pairs, joined through Data Direct functions
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dra"


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dgx-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def example(name: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The claim template of examples/dra/<name> and the pod that uses it, in `namespace`."""
    docs = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    return docs[0], docs[1] if len(docs) > 1 else None


async def trainers_placed(api: ApiClient, namespace: str, node: str,
                          pairs: int) -> list[dict[str, Any]]:
    """Wait until `pairs` of examples/dra/gpu-and-nic.yaml's pods run on `node` and one more is
    unschedulable; the placed ones."""
    async def pods() -> list[dict[str, Any]]:
        items, _ = await api.list(POD, namespace, label_selector="app=dra-train")
        return items

    def unschedulable(pod: dict[str, Any]) -> bool:
        return any(c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in (pod.get("status") or {}).get("conditions") or [])

    async def placed() -> bool:
        items = await pods()
        return (sum(p["spec"].get("nodeName") == node for p in items) == pairs
                and sum(map(unschedulable, items)) == 1)
    await until(placed, 120, f"{pairs} pods scheduled and one unschedulable")
    return [p for p in await pods() if p["spec"].get("nodeName") == node]


def pod_named(pod: dict[str, Any] | None, name: str) -> dict[str, Any]:
    assert pod is not None
    copy = json.loads(json.dumps(pod))
    copy["metadata"].update(name=name, labels={"app": "dra-train"})
    return copy


def nic_devices(host: SimulatedHost) -> Callable[[], PoolContent]:
    """What nicop's driver publishes for the node, read again at each call."""
    return lambda: node_pool(discovery.scan(host), host)


@contextlib.asynccontextmanager
async def device_classes(client: ApiClient,
                         classes: list[dict[str, Any]] | None = None) -> AsyncIterator[None]:
    classes = classes or dra.device_classes()
    for obj in classes:
        await client.apply(obj, res=DEVICE_CLASS)
    try:
        yield
    finally:
        for obj in classes:
            await client.delete(DEVICE_CLASS, obj["metadata"]["name"])


@contextlib.asynccontextmanager
async def publishing(*publishers: SlicePublisher) -> AsyncIterator[None]:
    """The publishers run; afterwards their slices are withdrawn."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(stop)) for p in publishers]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for publisher in publishers:
            await publisher.withdraw()


@contextlib.asynccontextmanager
async def vf_user(client: ApiClient, namespace: str) -> AsyncIterator[None]:
    """The claim template and the pod of examples/dra/two-ib-vfs.yaml (pod `vf-user`)."""
    template, user = example("two-ib-vfs.yaml", namespace)
    assert user is not None
    await client.create(template, res=CLAIM_TEMPLATE)
    await client.create(user)
    try:
        yield
    finally:
        await client.delete(POD, "vf-user", namespace, grace_seconds=0)
        await client.delete(CLAIM_TEMPLATE, "two-ib-vfs", namespace)



def simulated(root: Path) -> dict[str, str]:
    """The environment a simulated node gives its agents: its hardware is the tree at root."""
    return {**os.environ, "NICOP_PLATFORM": "sim", "NICOP_SIM_ROOT": str(root)}

def test_the_dra_plugin_process_publishes_the_nodes_devices_and_withdraws_them_on_sigterm(
    kubeconfig: Path, root: Path
) -> None:
    """`nicop dra-plugin` on a simulated DGX: the NICs (rdma.nicop.io) and the simulated GPUs
    (gpu.nvidia.com) appear as the node's slices; SIGTERM takes them away and exits 0."""
    SimulatedHost.build(root, "dgx", seed=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nicop", "dra-plugin", "--node-name", NODE,
         "--kubeconfig", str(kubeconfig), "--poll-interval", "0.5"],
        env=simulated(root), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    async def devices() -> dict[str, int]:
        client = ApiClient(kubeconfig)
        try:
            slices, _ = await client.list(RESOURCE_SLICE, field_selector=f"spec.nodeName={NODE}")
        finally:
            await client.close()
        counts: dict[str, int] = {}
        for s in slices:
            counts[s["spec"]["driver"]] = counts.get(s["spec"]["driver"], 0) + len(
                s["spec"].get("devices") or [])
        return counts

    async def main() -> None:
        async def published() -> bool:
            return await devices() == {dra.DRIVER: PAIRS, gpu_dra.GPU_DRIVER: PAIRS}
        await until(published, 60, "the plugin's slices")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0, proc.stdout.read() if proc.stdout \
            else ""

        async def withdrawn() -> bool:
            return await devices() == {}
        await until(withdrawn, 10, "the slices to be withdrawn")

    try:
        asyncio.run(main())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_gb300s_four_gpu_nic_pairs_align_through_data_direct_and_a_fifth_waits(
    kubeconfig: Path, namespace: str, root: Path
) -> None:
    """`nicop dra-plugin` on a simulated GB300 (as node-1): its ConnectX-8s publish the PCIe
    root of their Data Direct functions, which their GPUs share. 5 pods claim a GPU and a NIC
    on one root (examples/dra/gpu-and-nic.yaml): the real scheduler places 4, each pair on one
    root, and the 5th stays unschedulable. Each NIC's own root (its PF's, nicPcieRoot) is no
    GPU's: aligned by it, no pair would have been found."""
    host = SimulatedHost.build(root, "gb300", seed=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nicop", "dra-plugin", "--node-name", NODE,
         "--kubeconfig", str(kubeconfig), "--poll-interval", "0.5"],
        env=simulated(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def node_slices(api: ApiClient) -> list[dict[str, Any]]:
        items, _ = await api.list(RESOURCE_SLICE, field_selector=f"spec.nodeName={NODE}")
        return items

    async def main() -> None:
        api = ApiClient(kubeconfig)
        try:
            async with device_classes(api):
                await pairs(api)
        finally:
            items, _ = await api.list(POD, namespace, label_selector="app=dra-train")
            for pod in items:
                await api.delete(POD, pod["metadata"]["name"], namespace, grace_seconds=0)
            await api.delete(CLAIM_TEMPLATE, "gpu-nic", namespace)
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)

            async def withdrawn() -> bool:
                return not await node_slices(api)
            await until(withdrawn, 30, "the GB300's slices to be withdrawn")
            await api.close()

    async def pairs(api: ApiClient) -> None:
        async def devices() -> dict[str, dict[str, Any]]:
            return {d["name"]: d for s in await node_slices(api)
                    for d in s["spec"].get("devices") or []}

        expected = {d.name for d in node_devices(discovery.scan(host), host)} | {
            d["name"] for d in gpu_dra.gpu_devices(host)}
        assert len(expected) == 2 * GB300_PAIRS

        async def published() -> bool:  # the GB300's own, not a node-1 of an earlier test
            return set(await devices()) == expected
        await until(published, 60, "the GB300's NICs and GPUs in its slices")
        attrs = {name: d["attributes"] for name, d in (await devices()).items()}
        roots = {name: a[dra.PCIE_ROOT]["string"] for name, a in attrs.items()}
        gpu_roots = {roots[name] for name in roots if name.startswith("gpu-")}

        template, pod = example("gpu-and-nic.yaml", namespace)
        await api.create(template, res=CLAIM_TEMPLATE)
        for i in range(GB300_PAIRS + 1):
            pinned = pod_named(pod, f"train-{i}")  # other nodes may publish GPU-NIC pairs too
            pinned["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
            await api.create(pinned)

        gpus, nics = set(), set()
        for scheduled in await trainers_placed(api, namespace, NODE, GB300_PAIRS):
            [status] = scheduled["status"]["resourceClaimStatuses"]
            claim = await api.get(CLAIM, status["resourceClaimName"], namespace)
            results = {r["request"]: r for r in
                       claim["status"]["allocation"]["devices"]["results"]}
            gpu, nic = results["gpu"], results["nic"]
            assert (gpu["driver"], nic["driver"]) == (gpu_dra.GPU_DRIVER, dra.DRIVER)
            assert roots[gpu["device"]] == roots[nic["device"]], (gpu, nic)
            # The NIC's own root, as the PF's sysfs path has it: no GPU's.
            own = attrs[nic["device"]][dra.NIC_PCIE_ROOT]["string"]
            assert own == pcie_root(host, attrs[nic["device"]][dra.PCI_ADDRESS]["string"])
            assert own != roots[gpu["device"]] and own not in gpu_roots, (own, gpu_roots)
            gpus.add(gpu["device"])
            nics.add(nic["device"])
        assert len(gpus) == len(nics) == GB300_PAIRS

    try:
        asyncio.run(main())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_kubelet_plugin_prepares_a_claims_vfs_as_cdi_devices_and_survives_a_restart(
    kubeconfig: Path, namespace: str, root: Path
) -> None:
    """The test plays the kubelet: it finds the plugin's registration socket, takes its info,
    and calls NodePrepareResources for the allocated 2-VF claim of examples/dra/two-ib-vfs.yaml.
    The CDI spec names each VF's /dev/infiniband nodes and rdma_cm, the PCI addresses in
    PCIDEVICE_RDMA_NICOP_IO_VFS and the VF netdevs; a second call answers the same; a restarted
    plugin still knows the claim from its checkpoint after the claim left the API, and
    unprepares it, removing the spec."""
    import grpc.aio

    from nicop.node.dra import dra_pb2 as pb
    from nicop.node.dra import dra_pb2_grpc, registration_pb2_grpc
    from nicop.node.dra import registration_pb2 as reg
    from nicop.node.dra.plugin import DraPlugin

    host = SimulatedHost.build(root, "dgx", seed=1)
    host.set_numvfs("ibp24s0", 4)

    async def main() -> None:
        client = ApiClient(kubeconfig)
        publisher = SlicePublisher(client, dra.DRIVER, NODE, nic_devices(host), interval=0.5)
        plugins = [DraPlugin(client, NODE, host)]
        await plugins[0].start()
        try:
            async with device_classes(client), publishing(publisher), vf_user(client, namespace):
                await prepare(client, plugins)
        finally:
            await plugins[-1].stop()
            await client.close()

    async def prepare(client: ApiClient, plugins: list[DraPlugin]) -> None:
        plugin = plugins[0]
        async def allocated() -> dict[str, Any] | None:
            pod = await client.get(POD, "vf-user", namespace)
            statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
            if not pod["spec"].get("nodeName") or not statuses:
                return None
            claim = await client.get(CLAIM, statuses[0]["resourceClaimName"], namespace)
            return claim if (claim.get("status") or {}).get("allocation") else None

        async def is_allocated() -> bool:
            return await allocated() is not None
        await until(is_allocated, 60, "the claim to be allocated")
        claim = await allocated()
        assert claim is not None
        meta = claim["metadata"]
        request = pb.NodePrepareResourcesRequest(claims=[pb.Claim(
            namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])])

        # Registration, as the kubelet's plugin watcher does it.
        async with grpc.aio.insecure_channel(
                f"unix://{host.path(plugin.registration)}") as channel:
            registration = registration_pb2_grpc.RegistrationStub(channel)
            info = await registration.GetInfo(reg.InfoRequest())
            assert (info.type, info.name, list(info.supported_versions)) == (
                "DRAPlugin", dra.DRIVER, ["v1.DRAPlugin"])
            assert info.endpoint == f"/var/lib/kubelet/plugins/{dra.DRIVER}/dra.sock"
            await registration.NotifyRegistrationStatus(
                reg.RegistrationStatus(plugin_registered=True))
        assert plugin.registered is True

        async def prepare(plugin_endpoint: str) -> pb.NodePrepareResourceResponse:
            async with grpc.aio.insecure_channel(
                    f"unix://{host.path(plugin_endpoint)}") as channel:
                answer = await dra_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    request)
            return answer.claims[meta["uid"]]

        first = await prepare(info.endpoint)
        assert first.error == ""
        taken = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
        assert sorted(d.device_name for d in first.devices) == taken
        spec_path = host.path(f"/var/run/cdi/{dra.DRIVER}-{meta['uid']}.json")
        spec = json.loads(spec_path.read_text())
        assert spec["kind"] == f"{dra.DRIVER}/device"
        ids = {i for d in first.devices for i in d.cdi_device_ids}
        assert ids == {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
        inventory = discovery.scan(host)
        by_name = {d.name: d for d in node_devices(inventory, host)}
        addresses = sorted(by_name[name].attributes[dra.PCI_ADDRESS]["string"]
                           for name in taken)
        for device in spec["devices"]:
            edits = device["containerEdits"]
            name = device["name"].removeprefix(f"{meta['uid']}-")
            fn = inventory.functions[by_name[name].attributes[dra.PCI_ADDRESS]["string"]]
            nodes = {n["path"] for n in edits["deviceNodes"]}
            assert nodes == {*(p for r in fn.rdma for p in r.char_devices),
                             "/dev/infiniband/rdma_cm"}
            assert any(p.startswith("/dev/infiniband/uverbs") for p in nodes)
            [env] = edits["env"]
            assert env == f"PCIDEVICE_RDMA_NICOP_IO_VFS={','.join(addresses)}"
            assert edits["netDevices"] == [{"hostInterfaceName": fn.netdev.name,
                                            "name": fn.netdev.name}]

        assert await prepare(info.endpoint) == first  # idempotent

        await plugin.stop()  # a restart: a new process, the same node
        await client.delete(POD, "vf-user", namespace, grace_seconds=0)

        async def claim_gone() -> bool:
            return await client.get_or_none(CLAIM, meta["name"], namespace) is None
        await until(claim_gone, 60, "the pod's claim to be deleted with it")
        plugins.append(DraPlugin(client, NODE, host))
        plugin = plugins[-1]
        await plugin.start()
        # The API no longer has the claim: the answer comes from the checkpoint.
        assert await prepare(info.endpoint) == first
        async with grpc.aio.insecure_channel(
                f"unix://{host.path(info.endpoint)}") as channel:
            stub = dra_pb2_grpc.DRAPluginStub(channel)
            undo = pb.NodeUnprepareResourcesRequest(claims=request.claims)
            for _ in range(2):  # idempotent too
                answer = await stub.NodeUnprepareResources(undo)
                assert answer.claims[meta["uid"]].error == ""
        assert not spec_path.exists()

    asyncio.run(main())


def test_the_node_prepares_a_pods_claim_through_the_plugin_and_unprepares_it_when_it_goes(
    kubeconfig: Path, namespace: str, cluster: LocalCluster
) -> None:
    """`nicop dra-plugin` on the DGX's node stand-in: the stand-in, as the kubelet, registers it,
    and for a pod with the 2-VF claim calls NodePrepareResources and records the CDI devices on
    the pod (what a runtime would inject); deleting the pod unprepares (the spec goes)."""
    root = cluster.node_root(NODE)
    host = SimulatedHost(root)
    pf = "ibp24s0"
    deadline = time.monotonic() + 60
    # The stand-in builds the node's tree, boots its kernel, then starts its kubelet.
    while not host.exists("/var/lib/kubelet/device-plugins/kubelet.sock"):
        assert time.monotonic() < deadline, f"the stand-in of {NODE} did not start"
        time.sleep(0.2)
    host.set_numvfs(pf, 4)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nicop", "dra-plugin", "--node-name", NODE,
         "--kubeconfig", str(kubeconfig), "--poll-interval", "0.5"],
        env=simulated(root), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def main() -> None:
        client = ApiClient(kubeconfig)
        try:
            async with device_classes(client), vf_user(client, namespace):
                await prepared_by_the_node(client)
        finally:
            await client.close()

    async def prepared_by_the_node(client: ApiClient) -> None:
        async def recorded() -> dict[str, Any] | None:
            pod = await client.get(POD, "vf-user", namespace)
            text = (pod["metadata"].get("annotations") or {}).get(ANNOTATION)
            return json.loads(text) if text else None

        async def prepared() -> bool:
            record = await recorded()
            return bool(record and not record.get("error") and record["devices"]["vfs"])
        await until(prepared, 60, "the node to prepare the pod's claim")
        record = await recorded()
        assert record is not None
        [uid] = {i.split("=")[1][:36] for i in record["devices"]["vfs"]}
        assert len(record["devices"]["vfs"]) == 2
        assert all(i.startswith(f"{dra.DRIVER}/device={uid}-vf-")
                   for i in record["devices"]["vfs"])
        spec = host.path(f"/var/run/cdi/{dra.DRIVER}-{uid}.json")
        assert spec.exists()

        await client.delete(POD, "vf-user", namespace, grace_seconds=0)

        async def unprepared() -> bool:
            return not spec.exists()
        await until(unprepared, 60, "the node to unprepare the claim of the deleted pod")

    try:
        asyncio.run(main())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        host.set_numvfs(pf, 0)
