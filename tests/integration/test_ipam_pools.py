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
from tests.eventually import eventually
from tests.netns.cni_harness import DaemonThread

from nicop.api.nodes import ipam_usage
from nicop.cni.daemon import CniDaemon, DaemonOptions
from nicop.cni.store import PoolEntries, Reservation
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
        return self.call("ADD", pool, container_id, pod, namespace, uid, pool_type)

    def call(self, command: str, pool: str, container_id: str, pod: str = "p",
             namespace: str = "default", uid: str = "", pool_type: str = "ippool",
             ifname: str = "net1") -> tuple[int, Any]:
        """One nv-ipam call as the runtime makes it; (exit code, the JSON printed or None)."""
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": "/x",
               "CNI_PATH": "/opt/cni/bin", "CNI_IFNAME": ifname,
               "CNI_ARGS": f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_UID={uid}"}
        config = {"cniVersion": "1.0.0", "name": "net",
                  "ipam": {"type": "nv-ipam", "poolName": pool, "poolType": pool_type}}
        rc, out = self.daemon.handle("nv-ipam", env, json.dumps(config).encode())
        return rc, json.loads(out) if out else None

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
    blocks = eventually(lambda: allocations(client, IPPool, "rdma-pool", namespace), 30,
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
            rc, out = eventually(lambda d=daemon: (r := d.add("rdma-pool", "c1"))[0] == 0 and r,
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
        eventually(lambda: allocations(client, IPPool, "small", namespace), 30, "small pool")
        rc, out = first.add("small", "c3")
        assert (rc, out["code"]) == (1, 11), "the first node has no block of it"
        assert out["msg"] == f"IPPool {namespace}/small has no block for node {first.node} yet"
        # one name per term: a node field selector takes a single value, as in Kubernetes
        by_name["nodeSelectorTerms"].append({"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [labelled[0]]}]})
        client.patch(IPPool, "small", {"spec": {"nodeSelector": by_name}}, namespace=namespace,
                     patch_type=PatchType.MERGE)
        small = eventually(lambda: len(b := allocations(client, IPPool, "small", namespace)) == 2
                           and b, 30, "a block for the newly selected node")
        assert {b["nodeName"]: b["startIP"] for b in small} == {
            labelled[1]: "10.0.0.1", labelled[0]: "10.0.0.17"}
        rc, out = eventually(lambda: (r := first.add("small", "c3"))[0] == 0 and r, 30,
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
    prefixes = eventually(lambda: len(a := allocations(client, CIDRPool, "ib-pool", namespace))
                          == 4 and a, 30, "CIDRPool prefixes")
    assert {a["nodeName"]: (a["prefix"], a["gateway"]) for a in prefixes} == {
        "node-1": ("10.10.0.0/24", "10.10.0.1"), "node-2": ("10.10.255.0/24", "10.10.255.1"),
        "node-3": ("10.10.1.0/24", "10.10.1.1"), "node-4": ("10.10.2.0/24", "10.10.2.1")}
    daemon = NodeDaemon(kubeconfig, namespace, "node-2")
    try:
        _, out = eventually(lambda: (r := daemon.add("ib-pool", "c1", pool_type="cidrpool"))[0]
                           == 0 and r, 30, "an address from the CIDRPool")
        assert out["ips"] == [{"address": "10.10.255.2/24", "gateway": "10.10.255.1"}]
        assert out["routes"] == [{"dst": "10.200.0.0/16", "gw": "10.10.255.1"}]
    finally:
        daemon.close()


def test_the_cleaner_frees_the_address_of_a_deleted_pod(
    client: Client, kubeconfig: Path, namespace: str, controller: ControllerThread
) -> None:
    create(client, IPPool, "pool", namespace, {"subnet": "10.20.0.0/16", "perNodeBlockSize": 100})
    eventually(lambda: allocations(client, IPPool, "pool", namespace), 30, "blocks")
    pod = client.create(Pod(metadata=ObjectMeta(name="worker", namespace=namespace),
                            spec=PodSpec(nodeName="node-1", containers=[
                                Container(name="c", image="busybox")])))
    assert pod.metadata is not None
    uid = pod.metadata.uid or ""
    daemon = NodeDaemon(kubeconfig, namespace, "node-1", cleaner_interval=0.2, cleaner_checks=2)
    try:
        eventually(lambda: daemon.add("pool", "alive", "worker", namespace, uid)[0] == 0, 30,
                   "an address")
        # Same name, another UID: the pod it was given to was replaced by a new one.
        assert daemon.add("pool", "replaced", "worker", namespace, "old-uid")[0] == 0
        assert daemon.add("pool", "gone", "never-existed", namespace, "x")[0] == 0

        def holders() -> set[str]:
            return {r.container_id for r in daemon.daemon.store.snapshot()["pool"]}

        eventually(lambda: holders() == {"alive"}, 30, "stale addresses freed")
        usage = eventually(lambda: ipam_usage(client.get(Node, "node-1").to_dict()).get("pool"),
                           30, "usage on the node")
        assert usage == {"allocated": 1, "size": 100}

        client.delete(Pod, "worker", namespace=namespace, grace_period=0)
        eventually(lambda: holders() == set(), 60, "the deleted pod's address freed")
        assert daemon.add("pool", "next", "other", namespace)[0] == 0
    finally:
        daemon.close()


def with_status(client: Client, kind: Any, name: str, namespace: str, spec: dict[str, Any],
                allocations: list[dict[str, str]]) -> None:
    """A pool whose status holds `allocations`, written through the status subresource as a
    controller writes it."""
    create(client, kind, name, namespace, spec)
    client.patch(kind.Status, name, {"status": {"allocations": allocations}},
                 namespace=namespace, patch_type=PatchType.MERGE)


def test_node_main_flows(client: Client, kubeconfig: Path, namespace: str,
                         crds: list[str]) -> None:
    """Mellanox/nvidia-k8s-ipam cmd/ipam-node/app/app_test.go, Describe "IPAM Node daemon", It
    "Validate main flows": with blocks written into the pools' status (no controller), a pod
    of two IPPools, then of two CIDRPools: CHECK finds nothing, ADD gives one address per pool,
    CHECK finds them, DEL frees them (twice, idempotent), CHECK finds nothing again."""
    node = "node-1"
    with_status(client, IPPool, "my-pool-1", namespace, {
        "subnet": "192.168.0.0/16", "perNodeBlockSize": 252, "gateway": "192.168.0.1"},
        [{"nodeName": node, "startIP": "192.168.0.2", "endIP": "192.168.0.254"}])
    with_status(client, IPPool, "my-pool-2", namespace, {
        "subnet": "10.100.0.0/16", "perNodeBlockSize": 252, "gateway": "10.100.0.1"},
        [{"nodeName": node, "startIP": "10.100.0.2", "endIP": "10.100.0.254"}])
    with_status(client, CIDRPool, "my-pool-1", namespace, {
        "cidr": "192.100.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 24,
        "exclusions": [{"startIP": "192.100.0.1", "endIP": "192.100.0.10"}]},
        [{"nodeName": node, "prefix": "192.100.0.0/24", "gateway": "192.100.0.1"}])
    with_status(client, CIDRPool, "my-pool-2", namespace, {
        "cidr": "10.200.0.0/24", "perNodeNetworkPrefix": 31},
        [{"nodeName": node, "prefix": "10.200.0.0/31"}])
    pod = client.create(Pod(metadata=ObjectMeta(name="test-pod", namespace=namespace),
                            spec=PodSpec(containers=[Container(name="name", image="image")])))
    assert pod.metadata is not None
    daemon = NodeDaemon(kubeconfig, namespace, node)
    expected = {"ippool": [{"address": "192.168.0.2/16", "gateway": "192.168.0.1"},
                           {"address": "10.100.0.2/16", "gateway": "10.100.0.1"}],
                "cidrpool": [{"address": "192.100.0.11/24", "gateway": "192.100.0.1"},
                             {"address": "10.200.0.0/31"}]}
    try:
        pools = daemon.daemon.ipam.pools
        # Both kinds listed (the IPPools and CIDRPools share names: known() counts 2 of each).
        eventually(lambda: pools.synced and len(pools.known()) == 2, 30, "the node's blocks")
        for pool_type, ips in expected.items():
            def call(command: str, t: str = pool_type) -> tuple[int, Any]:
                return daemon.call(command, "my-pool-1,my-pool-2", "id1", "test-pod", namespace,
                                   pod.metadata.uid or "", t, ifname="net0")
            rc, out = call("CHECK")
            assert (rc, out["msg"]) == (1, f'reservation for pool "my-pool-1", poolType '
                                           f'"{pool_type}" not found')
            rc, out = call("ADD")
            assert (rc, out["ips"]) == (0, ips), pool_type
            assert call("CHECK") == (0, None)
            assert call("DEL") == (0, None)
            assert call("DEL") == (0, None)
            assert call("CHECK")[0] == 1
    finally:
        daemon.close()


def test_the_cleaner_keeps_and_frees_as_nv_ipam(client: Client, kubeconfig: Path,
                                                 namespace: str, crds: list[str]) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/cleaner/cleaner_test.go, Describe "Cleaner", It
    "Cleanup test": kept are the address of a pod that exists with its UID and one without pod
    metadata; freed are those of unknown pods and of a pod recreated under another UID; an
    emptied pool without configuration leaves the store, an empty one the API still has (with
    a block for the node) stays."""
    node = "node-2"
    with_status(client, IPPool, "pool3", namespace, {"subnet": "192.168.33.0/24",
                                                     "perNodeBlockSize": 100},
                [{"nodeName": node, "startIP": "192.168.33.1", "endIP": "192.168.33.100"}])
    uids = {}
    for name in ("test-pod1", "test-pod2"):
        pod = client.create(Pod(metadata=ObjectMeta(name=name, namespace=namespace),
                                spec=PodSpec(containers=[Container(name="c", image="i")])))
        assert pod.metadata is not None
        uids[name] = pod.metadata.uid or ""
    daemon = NodeDaemon(kubeconfig, namespace, node, cleaner_interval=0.2, cleaner_checks=2)
    store = daemon.daemon.store
    try:
        eventually(lambda: "pool3" in daemon.daemon.ipam.pools.known(), 30, "pool3's block")
        with daemon.daemon.ipam.lock, store.transaction():
            store.reserve("pool1", Reservation("id1", "net0", "192.168.1.100", "test-pod1",
                                               namespace, uids["test-pod1"]))
            store.reserve("pool1", Reservation("id2", "net0", "192.168.1.101"))
            store.reserve("pool1", Reservation("id3", "net0", "192.168.1.102", "unknown",
                                               namespace))
            store.reserve("pool2", Reservation("id4", "net0", "192.168.2.100", "unknown2",
                                               namespace))
            store.reserve("pool2", Reservation("id5", "net0", "192.168.2.101", "test-pod2",
                                               namespace, "something"))
            store.pools["pool3"] = PoolEntries("pool3", last_reserved_ip="192.168.33.100")

        def state() -> tuple[set[str], list[str]]:
            snap = store.snapshot()
            return {r.container_id for rs in snap.values() for r in rs}, sorted(snap)

        eventually(lambda: state() == ({"id1", "id2"}, ["pool1", "pool3"]), 30,
                   "stale reservations freed and pool2 removed")
        data = json.loads(store.path.read_text())
        assert sorted(data["pools"]) == ["pool1", "pool3"]
        assert data["pools"]["pool3"]["last_reserved_ip"] == "192.168.33.100"
    finally:
        daemon.close()


def label(client: Client, node: str, key: str, value: str | None) -> None:
    client.patch(Node, node, {"metadata": {"labels": {key: value}}}, patch_type=PatchType.MERGE)


def pool_status(client: Client, kind: Any, name: str, namespace: str) -> dict[str, Any]:
    return dict(client.get(kind, name, namespace=namespace).get("status") or {})


def allocated(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Allocated"), {})


@pytest.fixture
def selector_key(client: Client, namespace: str) -> Iterator[str]:
    """A node label of this test's own, taken off every node afterwards."""
    key = f"nicop.test/pool-{namespace}"
    yield key
    for node in client.list(Node):
        assert node.metadata is not None and node.metadata.name is not None
        if key in (node.metadata.labels or {}):
            label(client, node.metadata.name, key, None)


def test_controller_ippool_flows(client: Client, kubeconfig: Path, namespace: str,
                                 crds: list[str], selector_key: str) -> None:
    """Mellanox/nvidia-k8s-ipam cmd/ipam-controller/app/app_test.go, Describe "App", It "IPPool
    Basic tests" (its three nodes are this cluster's four): blocks stored before the controller
    starts are kept where valid (node-1's) and replaced where not (node-2's block of the wrong
    size); an invalid spec empties the status, saying which field; a pool whose selector picks
    no node has no block until nodes get the label, the third node waits for a free block
    (NoFreeRanges) and takes the one a node leaves when its label goes."""
    node1 = {"my-pool-1": {"nodeName": "node-1", "startIP": "192.168.0.11",
                           "endIP": "192.168.0.20"},
             "my-pool-2": {"nodeName": "node-1", "startIP": "172.16.0.1", "endIP": "172.16.0.50"}}
    with_status(client, IPPool, "my-pool-1", namespace, {
        "subnet": "192.168.0.0/16", "gateway": "192.168.0.1", "perNodeBlockSize": 10},
        [node1["my-pool-1"], {"nodeName": "node-2", "startIP": "192.168.0.11",
                              "endIP": "192.168.0.14"}])
    with_status(client, IPPool, "my-pool-2", namespace, {
        "subnet": "172.16.0.0/16", "gateway": "172.16.0.1", "perNodeBlockSize": 50},
        [node1["my-pool-2"]])
    with ControllerThread(kubeconfig, namespace):  # started once the blocks are stored
        ippool_flows(client, namespace, selector_key, node1)


def ippool_flows(client: Client, namespace: str, selector_key: str,
                 node1: dict[str, dict[str, str]]) -> None:
    nodes = sorted(n.metadata.name for n in client.list(Node) if n.metadata and n.metadata.name)
    for name in ("my-pool-1", "my-pool-2"):
        blocks = eventually(lambda n=name: len(a := allocations(client, IPPool, n, namespace))
                            == len(nodes) and a, 30, f"{name}: a block per node")
        assert node1[name] in blocks, "node-1 keeps its block"
        ends = [b[k] for b in blocks for k in ("startIP", "endIP")]
        assert len(set(ends)) == 2 * len(nodes), "the blocks are disjoint"

    client.patch(IPPool, "my-pool-1", {"spec": {"gateway": "10.10.0.1"}}, namespace=namespace,
                 patch_type=PatchType.MERGE)
    status = eventually(lambda: (s := pool_status(client, IPPool, "my-pool-1", namespace))
                        .get("allocations") == [] and s, 30, "an invalid pool's blocks taken back")
    assert allocated(status)["reason"] == "InvalidSpec"
    assert allocated(status)["message"] == "spec.gateway: 10.10.0.1 is not in the subnet " \
                                           "192.168.0.0/16"

    create(client, IPPool, "my-pool-3", namespace, {
        "subnet": "172.17.0.0/24", "gateway": "172.17.0.1", "perNodeBlockSize": 100,
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": selector_key, "operator": "In", "values": ["true"]}]}]}})
    status = eventually(lambda: allocated(pool_status(client, IPPool, "my-pool-3", namespace))
                        and pool_status(client, IPPool, "my-pool-3", namespace), 30,
                        "the pool reconciled")
    assert status["allocations"] == []
    assert allocated(status)["message"] == "all 0 selected nodes have a block"

    def block_of(node: str) -> str | None:
        return next((f"{a['startIP']}-{a['endIP']}" for a in allocations(
            client, IPPool, "my-pool-3", namespace) if a["nodeName"] == node), None)

    label(client, "node-1", selector_key, "true")
    assert eventually(lambda: block_of("node-1"), 30, "node-1's block") == \
        "172.17.0.1-172.17.0.100"
    label(client, "node-2", selector_key, "true")
    assert eventually(lambda: block_of("node-2"), 30, "node-2's block") == \
        "172.17.0.101-172.17.0.200"
    label(client, "node-3", selector_key, "true")
    status = eventually(lambda: allocated(s := pool_status(client, IPPool, "my-pool-3", namespace))
                        .get("reason") == "NoFreeRanges" and s, 30, "node-3 waiting for a block")
    assert block_of("node-3") is None
    assert allocated(status)["message"].startswith("1 of 3 selected nodes have no block (node-3)")
    label(client, "node-2", selector_key, None)
    assert eventually(lambda: block_of("node-3"), 30, "node-3's block") == \
        "172.17.0.101-172.17.0.200", "node-3 takes the block node-2 left"


def test_controller_cidrpool_flows(client: Client, kubeconfig: Path, namespace: str,
                                   crds: list[str], selector_key: str) -> None:
    """Mellanox/nvidia-k8s-ipam cmd/ipam-controller/app/app_test.go, Describe "App", It
    "CIDRPool Basic tests": node-3's static prefix with its own gateway, node-1's stored
    prefixes kept, node-2's (outside the CIDR) replaced; an invalid spec empties the status; a
    selector's third node waits and takes the prefix a node leaves."""
    node1 = {"my-pool-1": {"nodeName": "node-1", "prefix": "10.10.0.0/24",
                           "gateway": "10.10.0.1"},
             "my-pool-2": {"nodeName": "node-1", "prefix": "192.168.100.0/31",
                           "gateway": "192.168.100.1"}}
    with_status(client, CIDRPool, "my-pool-1", namespace, {
        "cidr": "10.10.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 24,
        "exclusions": [{"startIP": "10.10.1.22", "endIP": "10.10.1.30"}],
        "staticAllocations": [{"nodeName": "node-3", "prefix": "10.10.100.0/24",
                               "gateway": "10.10.100.10"}, {"prefix": "10.10.1.0/24"}]},
        [node1["my-pool-1"], {"nodeName": "node-2", "prefix": "10.33.33.0/24",
                              "gateway": "10.33.33.1"}])
    with_status(client, CIDRPool, "my-pool-2", namespace, {
        "cidr": "192.168.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 31},
        [node1["my-pool-2"]])
    with ControllerThread(kubeconfig, namespace):  # started once the prefixes are stored
        cidrpool_flows(client, namespace, selector_key, node1)


def cidrpool_flows(client: Client, namespace: str, selector_key: str,
                   node1: dict[str, dict[str, str]]) -> None:
    nodes = sorted(n.metadata.name for n in client.list(Node) if n.metadata and n.metadata.name)
    for name in ("my-pool-1", "my-pool-2"):
        got = eventually(lambda n=name: len(a := allocations(client, CIDRPool, n, namespace))
                         == len(nodes) and a, 30, f"{name}: a prefix per node")
        assert node1[name] in got, "node-1 keeps its prefix"
    pool1 = allocations(client, CIDRPool, "my-pool-1", namespace)
    assert {"nodeName": "node-3", "prefix": "10.10.100.0/24", "gateway": "10.10.100.10"} in pool1
    assert all(a["prefix"] != "10.10.1.0/24" for a in pool1), "the unassigned static prefix"

    client.patch(CIDRPool, "my-pool-1", {"spec": {
        "cidr": "192.168.0.0/16", "perNodeNetworkPrefix": 99, "gatewayIndex": None,
        "exclusions": None, "staticAllocations": None}}, namespace=namespace,
        patch_type=PatchType.MERGE)
    status = eventually(lambda: (s := pool_status(client, CIDRPool, "my-pool-1", namespace))
                        .get("allocations") == [] and s, 30,
                        "an invalid pool's prefixes taken back")
    assert allocated(status)["message"] == ("spec.perNodeNetworkPrefix: 99 must be between 16 "
                                            "(the prefix length of spec.cidr) and 32")

    create(client, CIDRPool, "my-pool-3", namespace, {
        "cidr": "10.10.0.0/24", "gatewayIndex": 1, "perNodeNetworkPrefix": 25,
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": selector_key, "operator": "In", "values": ["true"]}]}]}})

    def prefix_of(node: str) -> str | None:
        return next((a["prefix"] for a in allocations(client, CIDRPool, "my-pool-3", namespace)
                     if a["nodeName"] == node), None)

    label(client, "node-1", selector_key, "true")
    assert eventually(lambda: prefix_of("node-1"), 30, "node-1's prefix") == "10.10.0.0/25"
    label(client, "node-2", selector_key, "true")
    assert eventually(lambda: prefix_of("node-2"), 30, "node-2's prefix") == "10.10.0.128/25"
    label(client, "node-3", selector_key, "true")
    eventually(lambda: allocated(pool_status(client, CIDRPool, "my-pool-3", namespace))
               .get("reason") == "NoFreePrefixes", 30, "node-3 waiting for a prefix")
    assert prefix_of("node-3") is None
    label(client, "node-2", selector_key, None)
    assert eventually(lambda: prefix_of("node-3"), 30, "node-3's prefix") == "10.10.0.128/25"
