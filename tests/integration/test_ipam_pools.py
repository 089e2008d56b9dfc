"""IPPool/CIDRPool blocks carved by the controller on the real API server, used by node daemons,
and freed by the cleaner when a pod goes."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType
from tests.integration.operator_process import wait_for
from tests.netns.cni_harness import DaemonThread

from nicop.api.nodes import ipam_usage
from nicop.cni.daemon import CniDaemon, DaemonOptions
from nicop.kube.client import ApiClient
from nicop.kube.manager import Manager
from nicop.operator.ipam import IpamController

IPPool = create_namespaced_resource("nv-ipam.nvidia.com", "v1alpha1", "IPPool", "ippools")
CIDRPool = create_namespaced_resource("nv-ipam.nvidia.com", "v1alpha1", "CIDRPool", "cidrpools")
MELLANOX = "feature.node.kubernetes.io/pci-15b3.present"


class ControllerThread:
    """The operator's IPAM controller on its own event loop, against the test cluster."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            client = ApiClient(self.kubeconfig)
            manager = Manager(client)
            IpamController(manager, self.namespace)
            self.loop = asyncio.get_running_loop()
            self.task = asyncio.current_task()  # type: ignore[assignment]
            try:
                await manager.run()
            finally:
                await client.close()

        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(main())

    def __enter__(self) -> ControllerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.loop is not None and self.task is not None:
            self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(30)


@pytest.fixture
def controller(kubeconfig: Path, namespace: str, crds: list[str]) -> Iterator[ControllerThread]:
    with ControllerThread(kubeconfig, namespace) as c:
        yield c


class NodeDaemon:
    """A node's cni-daemon (in this process) following the pools of `namespace`."""

    def __init__(self, kubeconfig: Path, namespace: str, node: str, **options: Any) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ipam-", dir="/tmp"))
        self.node = node
        self.thread = DaemonThread(DaemonOptions(
            host_root=self.root, socket="/run/cni.sock", node_name=node, kubeconfig=kubeconfig,
            use_api=True, pools_namespace=namespace, **options))
        self.thread.start()

    @property
    def daemon(self) -> CniDaemon:
        assert self.thread.daemon is not None
        return self.thread.daemon

    def add(self, pool: str, container_id: str, pod: str = "p", namespace: str = "default",
            uid: str = "", pool_type: str = "ippool") -> tuple[int, Any]:
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": container_id, "CNI_NETNS": "/x",
               "CNI_PATH": "/opt/cni/bin", "CNI_IFNAME": "net1",
               "CNI_ARGS": f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_UID={uid}"}
        config = {"cniVersion": "1.0.0", "name": "net",
                  "ipam": {"type": "nv-ipam", "poolName": pool, "poolType": pool_type}}
        rc, out = self.daemon.handle("nv-ipam", env, json.dumps(config).encode())
        return rc, json.loads(out)

    def close(self) -> None:
        self.thread.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def allocations(client: Client, kind: Any, name: str, namespace: str) -> list[dict[str, str]]:
    obj = client.get(kind, name, namespace=namespace)
    return list((obj.get("status") or {}).get("allocations") or [])


def create(client: Client, kind: Any, name: str, namespace: str, spec: dict[str, Any]) -> None:
    client.create(kind(metadata={"name": name, "namespace": namespace}, spec=spec))


def test_nodes_get_disjoint_blocks_and_allocate_from_them(
    client: Client, kubeconfig: Path, namespace: str, controller: ControllerThread
) -> None:
    by_label = {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": MELLANOX, "operator": "In", "values": ["true"]}]}]}
    create(client, IPPool, "rdma-pool", namespace, {
        "subnet": "192.168.0.0/16", "perNodeBlockSize": 254, "gateway": "192.168.0.1",
        "nodeSelector": by_label})
    blocks = wait_for(lambda: allocations(client, IPPool, "rdma-pool", namespace), 30,
                      "IPPool blocks")
    labelled = sorted(n.metadata.name for n in client.list(Node)
                      if (n.metadata.labels or {}).get(MELLANOX) == "true")
    assert [b["nodeName"] for b in blocks] == labelled, "a block per selected node"
    ranges = [(int(ipaddress.ip_address(b["startIP"])), int(ipaddress.ip_address(b["endIP"])))
              for b in blocks]
    assert all(end - start == 253 for start, end in ranges)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), "disjoint"
    assert blocks[0]["startIP"] == "192.168.0.1"

    first, second = (NodeDaemon(kubeconfig, namespace, n) for n in labelled[:2])
    try:
        got = {}
        for daemon, block in zip((first, second), blocks, strict=False):
            rc, out = wait_for(lambda d=daemon: (r := d.add("rdma-pool", "c1"))[0] == 0 and r,
                               30, f"an address on {daemon.node}")
            address = ipaddress.ip_interface(out["ips"][0]["address"])
            start, end = (ipaddress.ip_address(block[k]) for k in ("startIP", "endIP"))
            assert start <= address.ip <= end and address.network.prefixlen == 16
            assert out["ips"][0]["gateway"] == "192.168.0.1"
            got[daemon.node] = str(address.ip)
        assert got == {labelled[0]: "192.168.0.2", labelled[1]: "192.168.0.255"}

        rc, out = first.add("missing-pool", "c2")
        assert (rc, out["code"]) == (1, 7)
        assert out["msg"] == f"ipam.poolName: no IPPool named 'missing-pool' in namespace " \
                             f"{namespace}"

        # A pool picking nodes by name; the selector grows, existing blocks stay.
        by_name = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [labelled[1]]}]}]}
        create(client, IPPool, "small", namespace, {"subnet": "10.0.0.0/24",
                                                    "perNodeBlockSize": 16,
                                                    "nodeSelector": by_name})
        wait_for(lambda: allocations(client, IPPool, "small", namespace), 30, "small pool")
        rc, out = first.add("small", "c3")
        assert (rc, out["code"]) == (1, 11), "the first node has no block of it"
        assert out["msg"] == f"IPPool {namespace}/small has no block for node {first.node} yet"
        by_name["nodeSelectorTerms"][0]["matchFields"][0]["values"].append(labelled[0])
        client.patch(IPPool, "small", {"spec": {"nodeSelector": by_name}}, namespace=namespace,
                     patch_type=PatchType.MERGE)
        small = wait_for(lambda: len(b := allocations(client, IPPool, "small", namespace)) == 2
                         and b, 30, "a block for the newly selected node")
        assert {b["nodeName"]: b["startIP"] for b in small} == {
            labelled[1]: "10.0.0.1", labelled[0]: "10.0.0.17"}
        rc, out = wait_for(lambda: (r := first.add("small", "c3"))[0] == 0 and r, 30,
                           "an address from the new block")
        assert out["ips"][0]["address"] == "10.0.0.17/24"
    finally:
        first.close()
        second.close()


def test_cidrpool_prefixes(
    client: Client, kubeconfig: Path, namespace: str, controller: ControllerThread
) -> None:
    create(client, CIDRPool, "ib-pool", namespace, {
        "cidr": "10.10.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 1,
        "routes": [{"dst": "10.200.0.0/16"}],
        "staticAllocations": [{"nodeName": "node-2", "prefix": "10.10.255.0/24"}]})
    prefixes = wait_for(lambda: len(a := allocations(client, CIDRPool, "ib-pool", namespace))
                        == 4 and a, 30, "CIDRPool prefixes")
    assert {a["nodeName"]: (a["prefix"], a["gateway"]) for a in prefixes} == {
        "node-1": ("10.10.0.0/24", "10.10.0.1"), "node-2": ("10.10.255.0/24", "10.10.255.1"),
        "node-3": ("10.10.1.0/24", "10.10.1.1"), "node-4": ("10.10.2.0/24", "10.10.2.1")}
    daemon = NodeDaemon(kubeconfig, namespace, "node-2")
    try:
        _, out = wait_for(lambda: (r := daemon.add("ib-pool", "c1", pool_type="cidrpool"))[0]
                           == 0 and r, 30, "an address from the CIDRPool")
        assert out["ips"] == [{"address": "10.10.255.2/24", "gateway": "10.10.255.1"}]
        assert out["routes"] == [{"dst": "10.200.0.0/16", "gw": "10.10.255.1"}]
    finally:
        daemon.close()


def test_the_cleaner_frees_the_address_of_a_deleted_pod(
    client: Client, kubeconfig: Path, namespace: str, controller: ControllerThread
) -> None:
    create(client, IPPool, "pool", namespace, {"subnet": "10.20.0.0/16", "perNodeBlockSize": 100})
    wait_for(lambda: allocations(client, IPPool, "pool", namespace), 30, "blocks")
    pod = client.create(Pod(metadata=ObjectMeta(name="worker", namespace=namespace),
                            spec=PodSpec(nodeName="node-1", containers=[
                                Container(name="c", image="busybox")])))
    assert pod.metadata is not None
    uid = pod.metadata.uid or ""
    daemon = NodeDaemon(kubeconfig, namespace, "node-1", cleaner_interval=0.2, cleaner_checks=2)
    try:
        wait_for(lambda: daemon.add("pool", "alive", "worker", namespace, uid)[0] == 0, 30,
                 "an address")
        # Same name, another UID: the pod it was given to was replaced by a new one.
        assert daemon.add("pool", "replaced", "worker", namespace, "old-uid")[0] == 0
        assert daemon.add("pool", "gone", "never-existed", namespace, "x")[0] == 0

        def holders() -> set[str]:
            return {r.container_id for r in daemon.daemon.store.snapshot()["pool"]}

        wait_for(lambda: holders() == {"alive"}, 30, "stale addresses freed")
        usage = wait_for(lambda: ipam_usage(client.get(Node, "node-1").to_dict()).get("pool"),
                         30, "usage on the node")
        assert usage == {"allocated": 1, "size": 100}

        client.delete(Pod, "worker", namespace=namespace, grace_period=0)
        wait_for(lambda: holders() == set(), 60, "the deleted pod's address freed")
        assert daemon.add("pool", "next", "other", namespace)[0] == 0
    finally:
        daemon.close()
