"""`nicop multus-daemon` against the real API server, called as a container runtime calls it:
the `multus` executable installed by multus-install, the 00-multus.conf the daemon wrote, the
socket between them. The delegates are the recording fake plugin of tests/fake_cni.py (the
runtime's network namespaces play no part at this level), and the pod's allocated devices come
from a stub `devices` callable standing in for the kubelet's PodResources API (its client is
tested against a gRPC server in tests/unit/test_podresources.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Pod, ServiceAccount
from tests.eventually import eventually
from tests.fake_cni import calls, install_fake

from nicop.cni.install import install_multus
from nicop.cni.multus import CACHE_DIR
from nicop.cni.multus_daemon import CONF_FILE, MultusDaemon, MultusOptions
from nicop.operator.crds import install_crds
from nicop_sim.cluster import LocalCluster, running_cluster

NAD = create_namespaced_resource("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition",
                                 "network-attachment-definitions")
SRIOV_RESOURCE = "nvidia.com/sriov_a"
DEFAULT_NETWORK = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [
    {"type": "fakebridge", "address": "10.244.1.5/24"}, {"type": "faketuning", "addDns": True}]}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, controlplane_bin: Path
        ) -> Iterator[LocalCluster]:
    with running_cluster(tmp_path_factory.mktemp("multus-cluster"), controlplane_bin, nodes=0,
                         node_agents=False) as cluster:  # the test is the node
        install_crds(cluster.kubeconfig)
        yield cluster


@pytest.fixture
def namespace(api: LocalCluster) -> Iterator[str]:
    client: Client = api.client()
    name = f"m-{uuid.uuid4().hex[:8]}"
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    eventually(lambda: _exists(client, ServiceAccount, "default", name), 30, "default SA")
    yield name
    client.delete(Namespace, name)


def _exists(client: Client, kind: Any, name: str, namespace: str) -> bool:
    try:
        client.get(kind, name, namespace=namespace)
    except ApiError:
        return False
    return True


class MultusNode:
    """A node's CNI dirs in a temporary root, and `nicop multus-daemon` for it on its own event
    loop thread; `devices` is what the kubelet allocated, by (namespace, pod name)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="multus-", dir="/tmp"))
        self.log = self.root / "calls.jsonl"
        self.bin = self.root / "opt/cni/bin"
        self.conf_dir = self.root / "etc/cni/net.d"
        self.conf_dir.mkdir(parents=True)
        (self.conf_dir / "10-cbr0.conflist").write_text(json.dumps(DEFAULT_NETWORK))
        (self.conf_dir / "99-loopback.conf").write_text(json.dumps(
            {"cniVersion": "1.0.0", "name": "lo", "type": "loopback"}))
        install_fake(self.bin, sys.executable, "fakebridge", "faketuning", "fakesriov")
        install_multus(self.bin, str(self.root / "run/nicop/multus.sock"), sys.executable)
        self.devices: dict[tuple[str, str], dict[str, list[str]]] = {}
        self.asked: list[tuple[str, str]] = []
        self.options = MultusOptions(host_root=self.root, kubeconfig=kubeconfig,
                                     cleanup_config_on_exit=True, poll_interval=0.2)
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _devices(self, namespace: str, name: str) -> dict[str, list[str]]:
        self.asked.append((namespace, name))
        return self.devices.get((namespace, name), {})

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            daemon = MultusDaemon(self.options, devices=self._devices,
                                  extra_env={"FAKE_CNI_LOG": str(self.log)})
            await daemon.run(self._stop)

        try:
            asyncio.run(main())
        except BaseException as e:
            self._error = e

    def start(self) -> None:
        self._thread.start()
        eventually(lambda: ((self.root / "run/nicop/multus.sock").exists()
                          and (self.conf_dir / CONF_FILE).exists()) or self._error, 30,
                   "the multus daemon's socket and 00-multus.conf")
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._error is not None:
            raise self._error

    def cni(self, command: str, pod: Any, container_id: str, uid: str | None = None
            ) -> tuple[int, Any]:
        """One call of the `multus` executable as the runtime makes it, with 00-multus.conf."""
        meta = pod.metadata
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id,
               "CNI_NETNS": f"/var/run/netns/cni-{container_id}", "CNI_IFNAME": "eth0",
               "CNI_PATH": str(self.bin), "PATH": os.environ["PATH"],
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={meta.namespace};"
                           f"K8S_POD_NAME={meta.name};K8S_POD_INFRA_CONTAINER_ID={container_id};"
                           f"K8S_POD_UID={uid if uid is not None else meta.uid}"}
        proc = subprocess.run([str(self.bin / "multus")], env=env, capture_output=True,
                              input=(self.conf_dir / CONF_FILE).read_bytes(), timeout=120,
                              check=False)
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None

    def calls(self) -> list[tuple[str, str, str]]:
        """(plugin, command, ifname) of the delegate calls since the last look."""
        out = calls(self.log)
        self.log.unlink(missing_ok=True)
        self.last = out
        return [(c["plugin"], c["command"], c["ifname"]) for c in out]

    def cache(self, container_id: str) -> Path:
        return self.root / CACHE_DIR.lstrip("/") / container_id

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def node(api: LocalCluster) -> Iterator[MultusNode]:
    n = MultusNode(api.kubeconfig)
    n.start()
    yield n
    n.close()


def nad(client: Client, namespace: str, name: str, config: dict[str, Any],
        resource: str | None = None) -> None:
    annotations = {"k8s.v1.cni.cncf.io/resourceName": resource} if resource else {}
    client.create(NAD(metadata=ObjectMeta(name=name, namespace=namespace,
                                          annotations=annotations),
                      spec={"config": json.dumps(config)}))


def pod(client: Client, namespace: str, name: str, networks: str) -> Any:
    return client.create(Pod(
        metadata=ObjectMeta(name=name, namespace=namespace,
                            annotations={"k8s.v1.cni.cncf.io/networks": networks}),
        spec=PodSpec(containers=[Container(name="c", image="busybox")])))


SRIOV = {"cniVersion": "1.0.0", "type": "fakesriov", "address": "192.168.1.10/24",
         "capabilities": {"deviceID": True, "mac": True}}
PLAIN = {"cniVersion": "0.4.0", "name": "plain-net", "plugins": [
    {"type": "fakebridge", "address": "192.168.2.10/24"}]}


def test_the_daemon_wraps_the_default_network_in_00_multus_conf(node: MultusNode) -> None:
    conf = json.loads((node.conf_dir / CONF_FILE).read_text())
    assert conf == {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus",
                    "delegates": [DEFAULT_NETWORK]}
    # The default network changes: so does 00-multus.conf.
    changed = {**DEFAULT_NETWORK, "plugins": DEFAULT_NETWORK["plugins"][:1]}
    (node.conf_dir / "10-cbr0.conflist").write_text(json.dumps(changed))
    eventually(lambda: json.loads((node.conf_dir / CONF_FILE).read_text())["delegates"]
               == [changed], 10, "00-multus.conf to follow the default network")
    node.stop()
    assert not (node.conf_dir / CONF_FILE).exists(), "--cleanup-config-on-exit"
    assert not (node.root / "run/nicop/multus.sock").exists()


def test_a_pod_gets_its_networks_devices_and_network_status(
        api: LocalCluster, namespace: str, node: MultusNode) -> None:
    client: Client = api.client()
    nad(client, namespace, "sriov-a", SRIOV, resource=SRIOV_RESOURCE)
    nad(client, namespace, "plain", PLAIN)
    p = pod(client, namespace, "trainer", json.dumps([
        {"name": "sriov-a", "mac": "02:aa:00:00:00:01"},
        {"name": "plain", "interface": "data0"},
        {"name": "sriov-a", "namespace": namespace}]))
    node.devices[(namespace, "trainer")] = {SRIOV_RESOURCE: ["0000:03:00.2", "0000:03:00.3"],
                                            "rdma/hca": ["x"]}
    rc, out = node.cni("ADD", p, "c0ffee")
    assert rc == 0, out
    assert out == {"cniVersion": "1.0.0", "dns": {"nameservers": ["10.0.0.53"]},
                   "interfaces": [{"mac": "02:00:00:00:00:01", "name": "eth0",
                                   "sandbox": "/var/run/netns/cni-c0ffee"}],
                   "ips": [{"address": "10.244.1.5/24", "interface": 0}]}
    assert node.calls() == [("fakebridge", "ADD", "eth0"), ("faketuning", "ADD", "eth0"),
                            ("fakesriov", "ADD", "net1"), ("fakebridge", "ADD", "data0"),
                            ("fakesriov", "ADD", "net3")]
    net1, data0, net3 = (c["config"] for c in node.last[2:])
    assert (net1["deviceID"], net1["pciBusID"]) == ("0000:03:00.2", "0000:03:00.2")
    assert net1["runtimeConfig"] == {"mac": "02:aa:00:00:00:01", "deviceID": "0000:03:00.2"}
    assert net1["name"] == "sriov-a"  # the definition's name, its config having none
    assert (net3["deviceID"], net3["runtimeConfig"]) == ("0000:03:00.3",
                                                         {"deviceID": "0000:03:00.3"})
    assert (data0["name"], data0["cniVersion"]) == ("plain-net", "0.4.0")
    assert "deviceID" not in data0
    assert node.last[2]["args"] == (
        f"IgnoreUnknown=true;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME=trainer;"
        f"K8S_POD_INFRA_CONTAINER_ID=c0ffee;K8S_POD_UID={p.metadata.uid}")
    assert node.asked == [(namespace, "trainer")]  # once per pod, not per network

    annotations = client.get(Pod, "trainer", namespace=namespace).metadata.annotations
    status = json.loads(annotations["k8s.v1.cni.cncf.io/network-status"])
    assert status == [
        {"name": "cbr0", "interface": "eth0", "ips": ["10.244.1.5"], "mac": "02:00:00:00:00:01",
         "default": True, "dns": {"nameservers": ["10.0.0.53"]}},
        {"name": f"{namespace}/sriov-a", "interface": "net1", "ips": ["192.168.1.10"],
         "mac": "02:aa:00:00:00:01", "dns": {}, "device-info": {
             "type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:03:00.2"}}},
        {"name": f"{namespace}/plain", "interface": "data0", "ips": ["192.168.2.10"],
         "mac": "02:00:00:00:00:01", "dns": {}},
        {"name": f"{namespace}/sriov-a", "interface": "net3", "ips": ["192.168.1.10"],
         "mac": "02:00:00:00:00:01", "dns": {}, "device-info": {
             "type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:03:00.3"}}}]
    def added() -> list[str] | None:
        found = sorted(e.message for e in client.list(Event, namespace=namespace)
                       if e.reason == "AddedInterface" and e.involvedObject.name == "trainer")
        return found if len(found) == 4 else None

    assert eventually(added, 20, "an AddedInterface event per interface") == [
        f"Add data0 [192.168.2.10/24] from {namespace}/plain",
        "Add eth0 [10.244.1.5/24] from cbr0",
        f"Add net1 [192.168.1.10/24] from {namespace}/sriov-a",
        f"Add net3 [192.168.1.10/24] from {namespace}/sriov-a"]
    assert node.cache("c0ffee").exists()

    # The pod goes first (as when the node's kubelet tears the sandbox down late): DEL works
    # from what ADD recorded, last network first.
    client.delete(Pod, "trainer", namespace=namespace, grace_period=0)
    eventually(lambda: not _exists(client, Pod, "trainer", namespace), 30, "the pod to go")
    assert node.cni("DEL", p, "c0ffee") == (0, None)
    assert node.calls() == [("fakesriov", "DEL", "net3"), ("fakebridge", "DEL", "data0"),
                            ("fakesriov", "DEL", "net1"), ("faketuning", "DEL", "eth0"),
                            ("fakebridge", "DEL", "eth0")]
    assert node.last[0]["config"]["deviceID"] == "0000:03:00.3"
    assert node.last[1]["config"]["prevResult"]["ips"][0]["address"] == "192.168.2.10/24"
    assert not node.cache("c0ffee").exists()
    assert node.cni("DEL", p, "c0ffee") == (0, None)  # again: the default network only
    assert node.calls() == [("faketuning", "DEL", "eth0"), ("fakebridge", "DEL", "eth0")]


def test_a_failing_network_undoes_the_others(
        api: LocalCluster, namespace: str, node: MultusNode) -> None:
    client: Client = api.client()
    nad(client, namespace, "plain", PLAIN)
    nad(client, namespace, "busy", {**SRIOV, "fail": {"ADD": "VF 0000:03:00.2 is in use"}},
        resource=SRIOV_RESOURCE)
    p = pod(client, namespace, "p1", "plain, busy@ib0")
    node.devices[(namespace, "p1")] = {SRIOV_RESOURCE: ["0000:03:00.2"]}
    rc, out = node.cni("ADD", p, "c1")
    assert rc == 1 and out["code"] == 7
    assert out["msg"] == (f"[{namespace}/p1/{p.metadata.uid}:{namespace}/busy]: error adding "
                          f"container to network \"{namespace}/busy\": VF 0000:03:00.2 is in use")
    assert node.calls() == [("fakebridge", "ADD", "eth0"), ("faketuning", "ADD", "eth0"),
                            ("fakebridge", "ADD", "net1"), ("fakesriov", "ADD", "ib0"),
                            ("fakesriov", "DEL", "ib0"), ("fakebridge", "DEL", "net1"),
                            ("faketuning", "DEL", "eth0"), ("fakebridge", "DEL", "eth0")]
    assert not node.cache("c1").exists()
    annotations = client.get(Pod, "p1", namespace=namespace).metadata.annotations
    assert "k8s.v1.cni.cncf.io/network-status" not in annotations


def test_what_multus_refuses_before_calling_any_delegate(
        api: LocalCluster, namespace: str, node: MultusNode) -> None:
    client: Client = api.client()
    nad(client, namespace, "sriov-a", SRIOV, resource=SRIOV_RESOURCE)
    p = pod(client, namespace, "p2", "sriov-a")
    rc, out = node.cni("ADD", p, "c2", uid="0000-stale")
    assert rc == 1 and out["msg"] == (f"pod {namespace}/p2: expected UID 0000-stale but the "
                                      f"API server has {p.metadata.uid}")
    ghost = Pod(metadata=ObjectMeta(name="ghost", namespace=namespace, uid="u"))
    rc, out = node.cni("ADD", ghost, "c3")
    assert rc == 1 and out["msg"] == f"pod {namespace}/ghost not found"
    rc, out = node.cni("ADD", p, "c2")  # no device of the resource was allocated
    assert rc == 1 and out["msg"] == (
        f"network {namespace}/sriov-a needs a device of {SRIOV_RESOURCE} (its "
        f"k8s.v1.cni.cncf.io/resourceName) but pod {namespace}/p2 was given none for 1 "
        "network(s)")
    p3 = pod(client, namespace, "p3", "missing")
    rc, out = node.cni("ADD", p3, "c4")
    assert rc == 1 and out["msg"] == (f"network {namespace}/missing: cannot find a "
                                      f"NetworkAttachmentDefinition missing in namespace "
                                      f"{namespace}")
    p4 = pod(client, namespace, "p4", "Bad_Name")
    rc, out = node.cni("ADD", p4, "c5")
    assert rc == 1 and out["msg"].startswith(
        f"pod {namespace}/p4: annotation k8s.v1.cni.cncf.io/networks: 'Bad_Name': ")
    assert node.calls() == []
    for container in ("c2", "c3", "c4", "c5"):
        assert not node.cache(container).exists()


# ------------------------------------------------------------------ VFs of DRA claims

ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")
NODE_NAME = "dra-node"
VF_DEVICE, VF_ADDRESS = "vf-0000-18-00-2", "0000:18:00.2"


def node_pod(client: Client, namespace: str, name: str, networks: str = "",
             claims: list[dict[str, str]] | None = None, extended: str = "") -> Any:
    """A pod bound to NODE_NAME (as the scheduler leaves it), with `claims` as its
    resourceClaims and `extended` as the limit of its container."""
    container: dict[str, Any] = {"name": "c", "image": "busybox"}
    if extended:
        container["resources"] = {"limits": {extended: "1"}}
    if claims:
        container["resources"] = {"claims": [{"name": c["name"]} for c in claims]}
    return client.create(Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "annotations": {"k8s.v1.cni.cncf.io/networks": networks} if networks
                     else {}},
        "spec": {"nodeName": NODE_NAME, "containers": [container],
                 "resourceClaims": claims or []}}))


def allocated_claim(client: Client, namespace: str, name: str, request: str,
                    config: list[dict[str, Any]] | None = None,
                    annotations: dict[str, str] | None = None) -> Any:
    """A claim the scheduler allocated one of nicop's VFs on NODE_NAME to (its status written
    as the scheduler writes it), with `config` as the claim's configs."""
    spec: dict[str, Any] = {"devices": {"requests": [
        {"name": request, "exactly": {"deviceClassName": "vf.rdma.nicop.io"}}]}}
    if config:
        spec["devices"]["config"] = config
    client.create(ResourceClaim(metadata=ObjectMeta(name=name, namespace=namespace,
                                                    annotations=annotations),
                                spec=spec))
    client.patch(ResourceClaim.Status, name, {"status": {"allocation": {"devices": {
        "results": [{"request": request, "driver": "rdma.nicop.io", "pool": NODE_NAME,
                     "device": VF_DEVICE}],
        "config": [{**c, "source": "FromClaim"} for c in config or []]}}}},
        namespace=namespace)
    return client.get(ResourceClaim, name, namespace=namespace)


def vf_config(**fields: str) -> list[dict[str, Any]]:
    return [{"requests": ["vf"], "opaque": {"driver": "rdma.nicop.io", "parameters": {
        "apiVersion": "rdma.nicop.io/v1alpha1", "kind": "VfConfig", **fields}}}]


def test_a_dra_claims_vf_joins_the_network_its_vfconfig_names_and_the_claim_shows_it(
        api: LocalCluster, namespace: str, node: MultusNode) -> None:
    """The VfConfig of examples/dra/vf-on-a-network.yaml (the SR-IOV DRA driver's fields):
    after the annotation's networks, the VF joins `netAttachDefName` as `ifName` with its PCI
    address as the delegate's deviceID; the claim's status.devices[] then holds its
    networkData (interface, addresses in CIDR form, MAC), written by the real API server's
    rules. A config nicop cannot honour fails the ADD naming the claim and field."""
    client: Client = api.client()
    nad(client, namespace, "plain", PLAIN)
    nad(client, namespace, "vf-test1", {**SRIOV, "mac": "5e:81:2a:10:00:01"})
    allocated_claim(client, namespace, "one-vf", "vf",
                    vf_config(ifName="rdma0", netAttachDefName="vf-test1"))
    p = node_pod(client, namespace, "vf-user", "plain",
                 claims=[{"name": "vf", "resourceClaimName": "one-vf"}])
    rc, out = node.cni("ADD", p, "d1")
    assert rc == 0, out
    assert node.calls() == [("fakebridge", "ADD", "eth0"), ("faketuning", "ADD", "eth0"),
                            ("fakebridge", "ADD", "net1"), ("fakesriov", "ADD", "rdma0")]
    assert (node.last[3]["config"]["deviceID"], node.last[3]["config"]["runtimeConfig"]) == (
        VF_ADDRESS, {"deviceID": VF_ADDRESS})
    [entry] = client.get(ResourceClaim, "one-vf", namespace=namespace)["status"]["devices"]
    assert {k: v for k, v in entry.items() if v is not None} == {
        "driver": "rdma.nicop.io", "pool": NODE_NAME, "device": VF_DEVICE,
        "networkData": {"interfaceName": "rdma0", "ips": ["192.168.1.10/24"],
                        "hardwareAddress": "5e:81:2a:10:00:01"}}
    status = json.loads(client.get(Pod, "vf-user", namespace=namespace)
                        .metadata.annotations["k8s.v1.cni.cncf.io/network-status"])
    assert status[-1]["name"] == f"{namespace}/vf-test1"
    assert status[-1]["device-info"]["pci"]["pci-address"] == VF_ADDRESS
    assert node.cni("DEL", p, "d1") == (0, None)
    assert node.calls()[0] == ("fakesriov", "DEL", "rdma0")

    allocated_claim(client, namespace, "bad-vf", "vf",
                    vf_config(netAttachDefName="vf-test1", driver="vfio-pci"))
    bad = node_pod(client, namespace, "bad-user",
                   claims=[{"name": "vf", "resourceClaimName": "bad-vf"}])
    rc, out = node.cni("ADD", bad, "d2")
    assert rc == 1 and out["msg"] == (
        f"pod {namespace}/bad-user: claim {namespace}/bad-vf: config[0] (FromClaim): driver: "
        "nicop keeps VFs on their RDMA driver (mlx5_core); remove `driver`"), out
    assert [c for c in node.calls() if c[0] == "fakesriov"] == []


def test_a_network_of_an_sriov_resource_dra_served_gets_the_vf_of_the_pods_extended_claim(
        api: LocalCluster, namespace: str, node: MultusNode) -> None:
    """Zero-change migration with networks: a pod asks `nvidia.com/sriov_a: 1` and names the
    SriovNetwork's definition (annotated with that resourceName) as on a device plugin node;
    on a node where nicop's DRA driver serves the resource the kubelet has no device plugin
    device for it, and Multus takes the VF from the claim the scheduler made
    (pod.status.extendedResourceClaimStatus, KEP-5004)."""
    client: Client = api.client()
    nad(client, namespace, "sriov-a", SRIOV, resource=SRIOV_RESOURCE)
    p = node_pod(client, namespace, "migrated", "sriov-a", extended=SRIOV_RESOURCE)
    request = "container-0-request-0"
    allocated_claim(client, namespace, "migrated-extended-resources-x1", request,
                    annotations={"resource.kubernetes.io/extended-resource-claim": "true"})
    client.patch(Pod.Status, "migrated", {"status": {"extendedResourceClaimStatus": {
        "resourceClaimName": "migrated-extended-resources-x1",
        "requestMappings": [{"containerName": "c", "resourceName": SRIOV_RESOURCE,
                             "requestName": request}]}}}, namespace=namespace)
    rc, out = node.cni("ADD", p, "e1")
    assert rc == 0, out
    assert node.calls()[-1] == ("fakesriov", "ADD", "net1")
    assert node.last[-1]["config"]["deviceID"] == VF_ADDRESS
    status = json.loads(client.get(Pod, "migrated", namespace=namespace)
                        .metadata.annotations["k8s.v1.cni.cncf.io/network-status"])
    assert status[-1]["device-info"]["pci"]["pci-address"] == VF_ADDRESS
    [entry] = client.get(ResourceClaim, "migrated-extended-resources-x1",
                         namespace=namespace)["status"]["devices"]
    assert entry["networkData"] == {"interfaceName": "net1", "ips": ["192.168.1.10/24"],
                                    "hardwareAddress": "02:00:00:00:00:01"}
