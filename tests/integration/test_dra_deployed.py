"""nicop's DRA driver as a user deploys it: a NicNodePolicy with `draDriver` for the GPU nodes
and one with the RDMA shared device plugin for the storage nodes (the heterogeneous cluster of
upstream's "NCP + NNP deployment flow", Mellanox/network-operator-docs
docs/customizations/nic-node-policy.rst). The operator renders the plugin's DaemonSet and the
DeviceClasses; the node stand-in runs the DaemonSet's pod as `nicop dra-plugin`, registers it
as the kubelet does, and the real kube-scheduler allocates claims from the slices it publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType
from tests.eventually import eventually
from tests.integration.agent_loop import agents, allocatable, delete
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from tests.integration.test_dra_alignment import (
    CLAIM,
    CLAIM_TEMPLATE,
    example,
    pod_named,
    trainers_placed,
)
from tests.integration.test_operator_node_policy import nnp_status, pod_nodes
from tests.integration.watching import Watch

from nicop.api import dra
from nicop.api.labels import MOFED_WAIT_LABEL
from nicop.kube.client import ApiClient
from nicop.kube.resources import POD
from nicop.operator.states.base import name_hash
from nicop_sim import gpu_dra
from nicop_sim.cluster import LocalCluster
from nicop_sim.dra_kubelet import ANNOTATION
from nicop_sim.hardware import SimulatedHost

NicNodePolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicNodePolicy", "nicnodepolicies")
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice",
                                       "resourceslices")
DeviceClass = create_global_resource("resource.k8s.io", "v1", "DeviceClass", "deviceclasses")
ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim",
                                           "resourceclaims")
ResourceClaimTemplate = create_namespaced_resource("resource.k8s.io", "v1",
                                                   "ResourceClaimTemplate",
                                                   "resourceclaimtemplates")
OperatorConfig = create_namespaced_resource("sriovnetwork.openshift.io", "v1",
                                            "SriovOperatorConfig", "sriovoperatorconfigs")
SriovPolicy = create_namespaced_resource("sriovnetwork.openshift.io", "v1",
                                         "SriovNetworkNodePolicy", "sriovnetworknodepolicies")
NodeState = create_namespaced_resource("sriovnetwork.openshift.io", "v1",
                                       "SriovNetworkNodeState", "sriovnetworknodestates")
SriovResourcePolicy = create_namespaced_resource(
    "sriovnetwork.k8snetworkplumbingwg.io", "v1alpha1", "SriovResourcePolicy",
    "sriovresourcepolicies")
DeviceAttributes = create_namespaced_resource(
    "sriovnetwork.k8snetworkplumbingwg.io", "v1alpha1", "DeviceAttributes", "deviceattributes")
ROOT = Path(__file__).resolve().parents[2]
GPU, STORAGE = "node-role.kubernetes.io/gpu", "node-role.kubernetes.io/storage"
DRA_NODE, PLUGIN_NODE = "node-1", "node-2"  # the DGX, and a ConnectX-6 Dx node
DRA_POLICY = "dra-gpu-nodes"
PLUGIN_POLICY = "rdma-storage-nodes"
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
PAIRS = 8
SRIOV_PF, SRIOV_PF_NAME = "0000:18:00.0", "ibp24s0"  # the DGX's first InfiniBand NIC
# The storage nodes' policy: upstream's gpu-nodes example's plugin section, with nicop's agent.
PLUGIN_NNP: dict[str, Any] = {
    "apiVersion": "mellanox.com/v1alpha1", "kind": "NicNodePolicy",
    "metadata": {"name": PLUGIN_POLICY},
    "spec": {"nodeSelector": {STORAGE: ""}, "rdmaSharedDevicePlugin": {
        "image": "nicop", "config": json.dumps({"configList": [{
            "resourceName": "rdma_shared_device_a", "rdmaHcaMax": 63,
            "selectors": {"vendors": ["15b3"]}}]})}},
}
DRA_DS = f"nicop-dra-driver-ds-{name_hash(DRA_POLICY)}"
PLUGIN_DS = f"rdma-shared-dp-ds-{name_hash(PLUGIN_POLICY)}"


def apply_nnp(client: Client, body: dict[str, Any]) -> None:
    client.apply(NicNodePolicy(**body), field_manager="test", force=True)


def slices(client: Client, driver: str) -> dict[str, int]:
    """Devices published by `driver`, by node."""
    found: dict[str, int] = {}
    for s in client.list(ResourceSlice):
        if s["spec"]["driver"] == driver:
            node = s["spec"]["nodeName"]
            found[node] = found.get(node, 0) + len(s["spec"].get("devices") or [])
    return found


def classes(client: Client) -> set[str]:
    return {c["metadata"]["name"] for c in client.list(DeviceClass)}


def nic_user(namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The claim template of examples/dra/one-ib-nic.yaml and a pod `nic-user` claiming it."""
    template, _ = example("one-ib-nic.yaml", namespace)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "nic-user", "namespace": namespace},
           "spec": {"resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "one-ib-nic"}],
                    "containers": [{"name": "app", "image": "registry.local/train:1",
                                    "resources": {"claims": [{"name": "nic"}]}}]}}
    return template, pod


def create(kubeconfig: Path, template: dict[str, Any], pod: dict[str, Any]) -> None:
    """A claim template and the pod that uses it, as a user applies them."""
    async def main() -> None:
        api = ApiClient(kubeconfig)
        try:
            await api.create(template, res=CLAIM_TEMPLATE)
            await api.create(pod)
        finally:
            await api.close()
    asyncio.run(main())


def diagnose_pod(kubeconfig: Path, namespace: str, name: str) -> str:
    """What `nicop diagnose pod` says of a pod it finds a problem with (exit 1), on one line."""
    done = subprocess.run(
        [sys.executable, "-m", "nicop", "diagnose", "pod", f"{namespace}/{name}",
         "--kubeconfig", str(kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    return " ".join(done.stdout.split())


def prepared(client: Client, name: str, namespace: str) -> Pod | None:
    """The pod once the node has prepared its claims (the stand-in retries errors meanwhile)."""
    pod = client.get(Pod, name, namespace=namespace)
    record = json.loads((pod.metadata.annotations or {}).get(ANNOTATION) or "null")
    return pod if record and not record.get("error") else None


@pytest.fixture(scope="module")
def deployed(client: Client, operator: OperatorProcess, cluster: LocalCluster) -> Iterator[None]:
    """Both node groups with their policies applied and ready."""
    groups = {DRA_NODE: GPU, PLUGIN_NODE: STORAGE}
    for node, label in groups.items():
        client.patch(Node, node, {"metadata": {"labels": {label: ""}}})
    dra_nnp = yaml.safe_load((ROOT / "examples" / "nicnodepolicy-dra-gpu-nodes.yaml").read_text())
    apply_nnp(client, dra_nnp)
    apply_nnp(client, PLUGIN_NNP)
    for name in (DRA_POLICY, PLUGIN_POLICY):
        try:
            eventually(lambda n=name: nnp_status(client, n).get("state") == "ready",  # type: ignore[misc]
                       180, f"NicNodePolicy {name} to become ready")
        except AssertionError as e:
            logs = "".join(f"\n--- {p}\n" + p.read_text()[-3000:]
                           for p in cluster.state_dir.rglob("*.log") if "dra" in str(p))
            raise AssertionError(f"{e}; its status: {nnp_status(client, name)}{logs}") from None
    yield
    for name in (DRA_POLICY, PLUGIN_POLICY):
        delete(client, NicNodePolicy, name)
    for node, label in groups.items():
        client.patch(Node, node, {"metadata": {"labels": {label: None}}})
    eventually(lambda: not agents(cluster) and not slices(client, dra.DRIVER), 120,
               "the policies' agents and slices to go")
    delete(client, OperatorConfig, "default", NAMESPACE)  # made with the SR-IOV policy


def test_device_plugins_and_the_dra_driver_run_side_by_side_on_different_nodes(
    client: Client, kubeconfig: Path, cluster: LocalCluster, namespace: str, deployed: None
) -> None:
    """The GPU node runs the DRA driver and no device plugin, the storage node the reverse; a
    pod claiming an InfiniBand NIC (examples/dra/one-ib-nic.yaml) lands on the GPU node and is
    prepared by the DaemonSet's plugin, a pod requesting the plugin's resource lands on the
    storage node and gets its devices."""
    assert pod_nodes(client, DRA_DS) == {DRA_NODE}
    assert pod_nodes(client, PLUGIN_DS) == {PLUGIN_NODE}
    assert {a.command for a in agents(cluster, DRA_NODE)} >= {"dra-plugin"}
    assert "dra-plugin" not in {a.command for a in agents(cluster, PLUGIN_NODE)}
    assert slices(client, dra.DRIVER) == {DRA_NODE: PAIRS}
    assert {dra.PF_CLASS, dra.VF_CLASS} <= classes(client)
    assert allocatable(client, PLUGIN_NODE, RDMA_RESOURCE) == 63
    assert allocatable(client, DRA_NODE, RDMA_RESOURCE) == 0
    states = {s["name"]: s["state"] for s in nnp_status(client, DRA_POLICY)["appliedStates"]}
    assert states["state-DRA-driver"] == "ready"
    states = {s["name"]: s["state"] for s in nnp_status(client, PLUGIN_POLICY)["appliedStates"]}
    assert (states["state-DRA-driver"], states["state-RDMA-device-plugin"]) == ("ignore", "ready")

    limits = {RDMA_RESOURCE: "1"}
    client.create(Pod(metadata=ObjectMeta(name="plugin-user", namespace=namespace),
                      spec=PodSpec(containers=[Container(
                          name="app", image="mellanox/rping-test",
                          resources=ResourceRequirements(requests=limits, limits=limits))])))
    create(kubeconfig, *nic_user(namespace))

    pod = eventually(lambda: prepared(client, "nic-user", namespace), 60,
                     "the claim's CDI devices on its pod")
    assert pod.spec.nodeName == DRA_NODE
    [cdi] = json.loads(pod.metadata.annotations[ANNOTATION])["devices"]["nic"]
    assert cdi.startswith(f"{dra.DRIVER}/device="), cdi

    def handed_out() -> Any:
        pod = client.get(Pod, "plugin-user", namespace=namespace)
        record = (pod.metadata.annotations or {}).get("nicop.io/devices")
        return json.loads(record) if record else None
    got = eventually(handed_out, 60, "the plugin's devices on its pod")
    assert client.get(Pod, "plugin-user", namespace=namespace).spec.nodeName == PLUGIN_NODE
    assert got["app"][RDMA_RESOURCE]["devices"]
    assert all(d.startswith("/dev/infiniband/") for d in got["app"][RDMA_RESOURCE]["devices"])


def test_the_deployed_plugin_writes_the_cdi_spec_and_releases_it_after_a_restart(
    client: Client, kubeconfig: Path, cluster: LocalCluster, namespace: str, deployed: None
) -> None:
    """The DaemonSet's plugin prepares a pod's NIC claim (examples/dra/one-ib-nic.yaml) as a CDI
    spec naming that NIC's /dev/infiniband nodes. Then the plugin is killed and the pod deleted
    while it is down: once the node stand-in has restarted it (its checkpoint holds what it
    prepared), the kubelet's retried NodeUnprepareResources removes the spec, and the claim
    goes with the pod."""
    create(kubeconfig, *nic_user(namespace))
    pod = eventually(lambda: prepared(client, "nic-user", namespace), 60,
                     "the claim prepared on its pod")
    claim_name = pod.status.resourceClaimStatuses[0].resourceClaimName
    claim = client.get(ResourceClaim, claim_name, namespace=namespace)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    root = cluster.node_root(DRA_NODE)
    spec_file = root / f"var/run/cdi/{dra.DRIVER}-{claim['metadata']['uid']}.json"
    [device] = json.loads(spec_file.read_text())["devices"]
    nodes = [n["path"] for n in device["containerEdits"]["deviceNodes"]]
    ibdev = next(d["attributes"][dra.RDMA_DEVICE]["string"] for s in client.list(ResourceSlice)
                 if s["spec"]["driver"] == dra.DRIVER for d in s["spec"]["devices"]
                 if d["name"] == result["device"])
    verbs = [n for n in nodes if Path(n).name.startswith("uverbs")]
    assert len(verbs) == 1, nodes
    assert (root / "sys/class/infiniband_verbs" / Path(verbs[0]).name / "ibdev").read_text(
        ).strip() == ibdev
    assert all(n.startswith("/dev/infiniband/") and (root / n.lstrip("/")).exists()
               for n in nodes), nodes

    [plugin] = [a for a in agents(cluster, DRA_NODE) if a.command == "dra-plugin"]
    os.kill(plugin.pid, signal.SIGKILL)
    delete(client, Pod, "nic-user", namespace)
    eventually(lambda: [a for a in agents(cluster, DRA_NODE)
                      if a.command == "dra-plugin" and a.pid != plugin.pid], 60,
               "the node stand-in to restart the plugin")
    eventually(lambda: not spec_file.exists(), 60, "the CDI spec removed once the plugin is back")

    def claim_gone() -> bool:
        try:
            client.get(ResourceClaim, claim_name, namespace=namespace)
        except ApiError as e:
            return e.status.code == 404
        return False
    eventually(claim_gone, 60, "the pod's claim to go with it")


def test_eight_gpu_nic_pairs_on_the_dgx_share_their_pcie_root_and_a_ninth_waits(
    client: Client, kubeconfig: Path, namespace: str, deployed: None
) -> None:
    """8 pods each claim a GPU and a NIC on one PCIe root (examples/dra/gpu-and-nic.yaml): all 8
    are scheduled to the DGX, each pair on one root, no NIC or GPU twice; the 9th stays Pending,
    unschedulable, and `nicop diagnose pod` says that no GPU or NIC of the DGX is free; `nicop
    status` counts them. The GPUs are published by the plugin pod too (the simulated NVIDIA GPU
    driver); the local cluster installed their DeviceClass, as the GPU driver's chart does."""
    assert gpu_dra.GPU_CLASS in classes(client)
    published = [s.to_dict() if hasattr(s, "to_dict") else dict(s)
                 for s in client.list(ResourceSlice)]
    roots = {d["name"]: d["attributes"][dra.PCIE_ROOT]["string"]
             for s in published if s["spec"]["nodeName"] == DRA_NODE
             for d in s["spec"].get("devices") or []}
    assert len(roots) == 2 * PAIRS
    nic_slices = [s for s in published if s["spec"]["driver"] == dra.DRIVER]
    print(f"\nNIC ResourceSlices of the DGX: {len(nic_slices)}, "
          f"{sum(len(json.dumps(s)) for s in nic_slices)} bytes as JSON")

    async def main() -> None:
        api = ApiClient(kubeconfig)
        try:
            await trainers(api)
        finally:
            items, _ = await api.list(POD, namespace, label_selector="app=dra-train")
            for pod in items:
                await api.delete(POD, pod["metadata"]["name"], namespace, grace_seconds=0)
            await api.delete(CLAIM_TEMPLATE, "gpu-nic", namespace)
            await api.close()

    async def trainers(api: ApiClient) -> None:
        template, pod = example("gpu-and-nic.yaml", namespace)
        await api.create(template, res=CLAIM_TEMPLATE)
        started = time.monotonic()
        for i in range(PAIRS + 1):
            await api.create(pod_named(pod, f"train-{i}"))

        placed = await trainers_placed(api, namespace, DRA_NODE, PAIRS)
        print(f"{PAIRS} GPU-NIC pods scheduled in {time.monotonic() - started:.1f}s")

        gpus, nics = [], []
        for pod in placed:
            [status] = pod["status"]["resourceClaimStatuses"]
            claim = await api.get(CLAIM, status["resourceClaimName"], namespace)
            results = {r["request"]: r for r in
                       claim["status"]["allocation"]["devices"]["results"]}
            gpu, nic = results["gpu"], results["nic"]
            assert (gpu["driver"], nic["driver"]) == (gpu_dra.GPU_DRIVER, dra.DRIVER)
            assert roots[gpu["device"]] == roots[nic["device"]], (gpu, nic)
            gpus.append(gpu["device"])
            nics.append(nic["device"])
        assert len(set(gpus)) == len(set(nics)) == PAIRS
        items, _ = await api.list(POD, namespace, label_selector="app=dra-train")
        [waiting] = [p for p in items if not p["spec"].get("nodeName")]
        condition = next(c for c in waiting["status"]["conditions"]
                         if c["type"] == "PodScheduled")
        assert "claim" in condition["message"].lower(), condition
        # nicop diagnose says which node comes closest and what it lacks.
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "nicop", "diagnose", "pod",
                             f"{namespace}/{waiting['metadata']['name']}",
                             "--kubeconfig", str(kubeconfig)],
            capture_output=True, text=True, timeout=120, check=False)
        said = " ".join(done.stdout.split())
        assert done.returncode == 1, done.stdout + done.stderr
        assert f"node {DRA_NODE}: gpu: 0 free of 8 gpu.nvidia.com" in said, said
        assert "nic: 0 free of 8 rdma.nicop.io" in said, said
        # nicop status counts the node's DRA devices, allocated and all.
        shown = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "nicop", "status", "-o", "json",
                             "--kubeconfig", str(kubeconfig)],
            capture_output=True, text=True, timeout=120, check=False)
        [node] = [n for n in json.loads(shown.stdout)["nodes"] if n["name"] == DRA_NODE]
        assert node["draDevices"] == [
            {"driver": gpu_dra.GPU_DRIVER, "devices": PAIRS, "allocated": PAIRS},
            {"driver": dra.DRIVER, "devices": PAIRS, "allocated": PAIRS}]

    asyncio.run(main())


def test_vfs_the_sriov_policy_creates_are_claimable_and_leave_the_slice_when_the_link_goes_down(
    client: Client, kubeconfig: Path, cluster: LocalCluster, namespace: str, deployed: None
) -> None:
    """A claim for 2 VFs on InfiniBand PFs with link up (examples/dra/two-ib-vfs.yaml) stays
    Pending until an SriovNetworkNodePolicy makes the config daemon create VFs on the DGX; the
    plugin pod then publishes them and the scheduler allocates two. A claim for their PF then
    waits, and `nicop diagnose pod` says it shares its port with VFs in use, until the VFs' pod
    goes. The PF's link going down (a cable pulled: the simulated hardware changes) takes its VFs
    out of the slice within a rescan (at most 5 s on a node at rest)."""
    template, user = example("two-ib-vfs.yaml", namespace)
    assert user is not None
    numvfs = cluster.node_root(DRA_NODE) / f"sys/bus/pci/devices/{SRIOV_PF}/sriov_numvfs"

    def vfs_published() -> list[dict[str, Any]]:
        return [d for s in client.list(ResourceSlice)
                if s["spec"]["driver"] == dra.DRIVER and s["spec"]["nodeName"] == DRA_NODE
                for d in s["spec"].get("devices") or []
                if d["attributes"][dra.KIND]["string"] == dra.KIND_VF]

    def pod() -> Pod:
        return client.get(Pod, "vf-user", namespace=namespace)

    create(kubeconfig, template, user)
    eventually(lambda: any(c.reason == "Unschedulable" for c in pod().status.conditions or []),
               60, "the claim to find no VFs")
    client.apply(SriovPolicy(metadata=ObjectMeta(name="dgx-ib-vfs", namespace=NAMESPACE), spec={
        "resourceName": "dgx_ib_vf", "nodeSelector": {"kubernetes.io/hostname": DRA_NODE},
        "numVfs": 4, "nicSelector": {"pfNames": [SRIOV_PF_NAME]}, "isRdma": True,
        "linkType": "ib"}), field_manager="test", force=True)
    try:
        eventually(lambda: numvfs.read_text().strip() == "4", 180, "the config daemon's VFs")
        created = time.monotonic()
        eventually(lambda: len(vfs_published()) == 4, 10, "the VFs in the slice")
        print(f"\nVFs created to slice update: {time.monotonic() - created:.2f}s")
        eventually(lambda: pod().spec.nodeName == DRA_NODE, 60, "the pod scheduled with two VFs")
        taken = {r["device"] for r in _allocation(client, pod(), namespace)}
        by_name = {d["name"]: d for d in vfs_published()}
        assert len(taken) == 2 and taken <= set(by_name)
        assert {by_name[d]["attributes"][dra.PF_NAME]["string"] for d in taken} == {SRIOV_PF_NAME}
        # Prepared: the claim's status.devices names each VF's interface and MAC as the node has
        # them, written by the plugin pod under its own node-bound, driver-scoped rights.
        eventually(lambda: prepared(client, "vf-user", namespace), 60, "the VFs prepared")
        reported = eventually(lambda: _device_status(client, pod(), namespace), 30,
                              "the claim's device status")
        root = cluster.node_root(DRA_NODE)
        assert {r["device"] for r in reported} == taken
        for entry in reported:
            netdev = by_name[entry["device"]]["attributes"][dra.NETDEV]["string"]
            mac = (root / f"sys/class/net/{netdev}/address").read_text().strip()
            assert entry["networkData"] == {"interfaceName": netdev, "hardwareAddress": mac}
            conditions = {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}
            assert conditions["Ready"] == ("True", "Prepared")
            assert set(conditions) <= {"Ready", dra.CONDITION_VF_READY}

        create(kubeconfig, *pf_user(namespace))
        eventually(lambda: any(c.reason == "Unschedulable" for c in client.get(
            Pod, "pf-user", namespace=namespace).status.conditions or []),
            60, "the claim for the PF of allocated VFs to wait")
        said = diagnose_pod(kubeconfig, namespace, "pf-user")
        assert (f"node {DRA_NODE}: nic: 0 free of 1 rdma.nicop.io, 1 wanted "
                "(pf-0000-18-00-0 not free: a PF is not free while some of its VFs are "
                "allocated") in said, said

        host = SimulatedHost(cluster.node_root(DRA_NODE))
        down = time.monotonic()
        host.set_link(SRIOV_PF_NAME, False)
        try:
            eventually(lambda: not vfs_published(), 10,
                       "the VFs of the PF whose link went down to leave the slice")
            print(f"PF link down to VFs out of the slice: {time.monotonic() - down:.2f}s")
        finally:
            host.set_link(SRIOV_PF_NAME, True)
        eventually(lambda: len(vfs_published()) == 4, 10, "the VFs back in the slice")
        assert not client.get(Pod, "pf-user", namespace=namespace).spec.nodeName
        delete(client, Pod, "vf-user", namespace)
        eventually(lambda: client.get(Pod, "pf-user", namespace=namespace).spec.nodeName
                   == DRA_NODE, 60, "the PF's claim allocated once its VFs are released")
        [pf] = _allocation(client, client.get(Pod, "pf-user", namespace=namespace), namespace)
        assert pf["device"] == "pf-0000-18-00-0"
    finally:
        delete(client, Pod, "vf-user", namespace)
        delete(client, Pod, "pf-user", namespace)
        delete(client, SriovPolicy, "dgx-ib-vfs", NAMESPACE)
        eventually(lambda: numvfs.read_text().strip() == "0", 120, "the VFs to be removed")


def vf_user(namespace: str, pf_name: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim template for one VF of the PF `pf_name`, and a pod `name` claiming it."""
    template = {
        "apiVersion": dra.RESOURCE_API, "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "vf", "exactly": {
            "deviceClassName": dra.VF_CLASS, "selectors": [{"cel": {"expression": (
                f'device.attributes["{dra.DRIVER}"].{dra.PF_NAME} == "{pf_name}"')}}],
        }}]}}}}
    _, pod = pf_user(namespace, name=name)
    return template, pod


def test_a_vf_claim_made_before_its_policy_binds_once_the_vf_is_ready_or_fails_saying_why(
    client: Client, kubeconfig: Path, cluster: LocalCluster, namespace: str, deployed: None
) -> None:
    """Binding conditions (KEP-5007). A claim for a VF of ibp24s0 waits, Unschedulable, while no
    policy makes VFs. A vfio-pci SriovNetworkNodePolicy then plans 2: the plugin publishes them
    at once and the real scheduler allocates one, but binds the pod only when the plugin says
    `VFReady`: the config daemon is held (SIGSTOP) so the VFs do not exist yet when the scheduler
    says it waits, and the pod is bound once the daemon goes on and has made them and bound them
    to vfio-pci. On a second PF with IOMMU off (vfio-pci refuses the
    VFs) the daemon gives up: the claim's VF fails its binding with `VFFailed` and the daemon's
    words, the scheduler frees it, the VFs are tainted `rdma.nicop.io/vf-failed`, the pod waits
    and `nicop diagnose pod` says why."""
    other_pf, other_name = "0000:40:00.0", "ibp64s0"  # the DGX's second InfiniBand NIC
    host = SimulatedHost(cluster.node_root(DRA_NODE))
    root = cluster.node_root(DRA_NODE) / "sys/bus/pci/devices"
    seen: list[dict[str, Any]] = []  # every version of the namespace's claims
    watch = Watch(lambda: client.watch(ResourceClaim, namespace=namespace), seen.append)

    def pod(name: str) -> Pod:
        return client.get(Pod, name, namespace=namespace)

    def claim_of(name: str) -> dict[str, Any] | None:
        statuses = pod(name).status.resourceClaimStatuses or []
        return (client.get(ResourceClaim, statuses[0].resourceClaimName, namespace=namespace)
                if statuses else None)

    def config_daemon() -> int | None:
        return next((a.pid for a in agents(cluster, DRA_NODE)
                     if a.command == "sriov-config-daemon"), None)

    def scheduler_waits(name: str) -> bool:
        return any(e.reason == "BindingConditionsPending" for e in client.list(
            Event, namespace=namespace, fields={"involvedObject.name": name}))

    def policy(name: str, pf_name: str) -> SriovPolicy:
        return SriovPolicy(metadata=ObjectMeta(name=name, namespace=NAMESPACE), spec={
            "resourceName": name.replace("-", "_"), "numVfs": 2, "deviceType": "vfio-pci",
            "nodeSelector": {"kubernetes.io/hostname": DRA_NODE}, "linkType": "ib",
            "nicSelector": {"pfNames": [pf_name]}})

    # A config daemon of an earlier test may still be on its way out: the one held below must
    # be the one that makes this test's VFs.
    eventually(lambda: config_daemon() is None, 120, "no config daemon left from before")
    create(kubeconfig, *vf_user(namespace, SRIOV_PF_NAME, "vf-early"))
    try:
        eventually(lambda: any(c.reason == "Unschedulable"
                             for c in pod("vf-early").status.conditions or []),
                   60, "the claim to find no VF")
        # The config daemons run while a policy exists: one that selects no PF starts them.
        client.apply(policy("no-vfs", "no-such-pf"), field_manager="test", force=True)
        daemon = eventually(config_daemon, 120, f"the config daemon on {DRA_NODE}")
        eventually(lambda: (client.get(NodeState, DRA_NODE, namespace=NAMESPACE).get("status")
                          or {}).get("syncStatus") == "Succeeded", 60,
                   "the daemon to report the node's PFs (the operator plans from them)")
        os.kill(daemon, signal.SIGSTOP)
        client.apply(policy("early-vfs", SRIOV_PF_NAME), field_manager="test", force=True)
        claim = eventually(lambda: (c := claim_of("vf-early")) and
                           (c.get("status") or {}).get("allocation") and c,
                           60, "the claim allocated a planned VF")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert result["bindingConditions"] == [dra.CONDITION_VF_READY]
        eventually(lambda: scheduler_waits("vf-early"), 60, "the scheduler to wait for the VF")
        vf = result["device"].removeprefix("vf-").replace("-", ":", 2).replace("-", ".")
        assert not (root / vf).exists()
        assert not pod("vf-early").spec.nodeName, "bound before its VF exists"
        os.kill(daemon, signal.SIGCONT)
        eventually(lambda: pod("vf-early").spec.nodeName == DRA_NODE, 60,
                   "the pod bound once its VF is ready")
        assert os.path.basename(os.readlink(root / vf / "driver")) == "vfio-pci"
        [entry] = _device_status(client, pod("vf-early"), namespace)
        assert {(c["type"], c["status"]) for c in entry["conditions"]} >= {
            (dra.CONDITION_VF_READY, "True")}

        host.set_iommu(False)
        create(kubeconfig, *vf_user(namespace, other_name, "vf-doomed"))
        client.apply(policy("doomed-vfs", other_name), field_manager="test", force=True)

        def failed() -> dict[str, Any] | None:
            return next((c for obj in list(seen)
                         for d in (obj.get("status") or {}).get("devices") or []
                         for c in d.get("conditions") or []
                         if c["type"] == dra.CONDITION_VF_FAILED), None)

        condition = eventually(failed, 120, "the VF's binding to fail")
        assert condition["status"] == "True" and "IOMMU" in condition["message"], condition
        assert other_name in condition["message"], condition
        eventually(lambda: not ((claim_of("vf-doomed") or {}).get("status") or {}).get(
            "allocation"), 60, "the scheduler to free the claim")
        said = diagnose_pod(kubeconfig, namespace, "vf-doomed")
        assert dra.TAINT_VF_FAILED in said, said
        assert not pod("vf-doomed").spec.nodeName
    finally:
        watch.stop()
        host.set_iommu(True)
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(config_daemon(), signal.SIGCONT)  # type: ignore[arg-type]
        for name in ("vf-early", "vf-doomed"):
            delete(client, Pod, name, namespace)
        delete(client, SriovPolicy, "early-vfs", NAMESPACE)
        delete(client, SriovPolicy, "no-vfs", NAMESPACE)
        delete(client, SriovPolicy, "doomed-vfs", NAMESPACE)
        for pf in (SRIOV_PF, other_pf):
            eventually(lambda pf=pf: (root / pf / "sriov_numvfs").read_text().strip() == "0",  # type: ignore[misc]
                       120, f"the VFs of {pf} to be removed")


def test_upstreams_sriov_resource_policy_chooses_the_vfs_and_their_attributes(
    client: Client, cluster: LocalCluster, deployed: None
) -> None:
    """The SR-IOV DRA driver's own API, as its README documents it (a DeviceAttributes labelled
    `pool`, a SriovResourcePolicy whose config selects it and filters VFs by vendor, PF name
    and PCI address): of the DGX's 4 VFs on ibp24s0 the plugin pod publishes only the 2 the
    policy names, each with the attribute `k8s.cni.cncf.io/resourceName`; the policy deleted,
    all 4 are back, without it."""
    numvfs = cluster.node_root(DRA_NODE) / f"sys/bus/pci/devices/{SRIOV_PF}/sriov_numvfs"

    def vfs() -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in client.list(ResourceSlice)
                if s["spec"]["driver"] == dra.DRIVER and s["spec"]["nodeName"] == DRA_NODE
                for d in s["spec"].get("devices") or []
                if d["attributes"][dra.KIND]["string"] == dra.KIND_VF}

    client.apply(SriovPolicy(metadata=ObjectMeta(name="dgx-ib-vfs", namespace=NAMESPACE), spec={
        "resourceName": "dgx_ib_vf", "nodeSelector": {"kubernetes.io/hostname": DRA_NODE},
        "numVfs": 4, "nicSelector": {"pfNames": [SRIOV_PF_NAME]}, "isRdma": True,
        "linkType": "ib"}), field_manager="test", force=True)
    try:
        eventually(lambda: len(vfs()) == 4, 180, "the 4 VFs published")
        chosen = sorted(d["attributes"][dra.PCI_ADDRESS]["string"] for d in vfs().values())[:2]
        client.apply(DeviceAttributes(
            metadata=ObjectMeta(name="ib-attrs", namespace=NAMESPACE,
                                labels={"pool": "ib-resource"}),
            spec={"attributes": {"k8s.cni.cncf.io/resourceName": {"string": "ib_resource"}}}),
            field_manager="test", force=True)
        client.apply(SriovResourcePolicy(
            metadata=ObjectMeta(name="ib-policy", namespace=NAMESPACE),
            spec={"configs": [{
                "deviceAttributesSelector": {"matchLabels": {"pool": "ib-resource"}},
                "resourceFilters": [{"vendors": ["15b3"], "pfNames": [SRIOV_PF_NAME],
                                     "pciAddresses": chosen}]}]}),
            field_manager="test", force=True)
        published = eventually(lambda: (v := vfs()) and len(v) == 2 and v, 30,
                               "only the policy's 2 VFs published")
        assert sorted(d["attributes"][dra.PCI_ADDRESS]["string"]
                      for d in published.values()) == chosen
        assert all(d["attributes"]["k8s.cni.cncf.io/resourceName"] == {"string": "ib_resource"}
                   for d in published.values())
        delete(client, SriovResourcePolicy, "ib-policy", NAMESPACE)
        eventually(lambda: len(vfs()) == 4 and not any(
            "k8s.cni.cncf.io/resourceName" in d["attributes"] for d in vfs().values()),
            30, "all 4 VFs back without the attribute")
    finally:
        delete(client, SriovResourcePolicy, "ib-policy", NAMESPACE)
        delete(client, DeviceAttributes, "ib-attrs", NAMESPACE)
        delete(client, SriovPolicy, "dgx-ib-vfs", NAMESPACE)
        eventually(lambda: numvfs.read_text().strip() == "0", 120, "the VFs to be removed")


def pf_user(namespace: str, address: str = SRIOV_PF, name: str = "pf-user"
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim template for one of the DGX's InfiniBand PFs (the first), by its PCI address,
    and a pod `name` claiming it."""
    template = {
        "apiVersion": dra.RESOURCE_API, "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "nic", "exactly": {
            "deviceClassName": dra.PF_CLASS, "selectors": [{"cel": {"expression": (
                f'device.attributes["{dra.DRIVER}"].{dra.PCI_ADDRESS} == "{address}"')}}],
        }}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"resourceClaims": [{"name": "nic", "resourceClaimTemplateName": name}],
                    "containers": [{"name": "app", "image": "registry.local/app:1",
                                    "resources": {"claims": [{"name": "nic"}]}}]}}
    return template, pod


def test_a_pf_whose_link_goes_down_is_tainted_and_a_claim_only_it_could_serve_waits(
    client: Client, kubeconfig: Path, cluster: LocalCluster, namespace: str, deployed: None
) -> None:
    """The DGX's second InfiniBand port loses its link (the simulated hardware changes): at the
    plugin's next rescan (1 s; the time is printed) its slice carries the taint
    rdma.nicop.io/link-down (NoSchedule) on that PF;
    a claim for it stays Pending under the real scheduler and `nicop diagnose pod` names the
    taint and what it means; with the link back the taint goes and the claim is allocated."""
    address, ifname, device = "0000:40:00.0", "ibp64s0", "pf-0000-40-00-0"

    def taints() -> list[dict[str, Any]] | None:
        for s in client.list(ResourceSlice):
            if s["spec"]["driver"] == dra.DRIVER and s["spec"]["nodeName"] == DRA_NODE:
                for d in s["spec"].get("devices") or []:
                    if d["name"] == device:
                        return list(d.get("taints") or [])
        return None

    def pod() -> Pod:
        return client.get(Pod, "down-pf-user", namespace=namespace)

    assert taints() == []
    host = SimulatedHost(cluster.node_root(DRA_NODE))
    down = time.monotonic()
    host.set_link(ifname, False)
    try:
        [taint] = eventually(taints, 10, f"{device} tainted")
        print(f"\nlink down to taint: {time.monotonic() - down:.2f}s")
        assert (taint["key"], taint["value"], taint["effect"]) == (
            dra.TAINT_LINK_DOWN, ifname, "NoSchedule")
        assert taint.get("timeAdded"), "set by the API server"
        create(kubeconfig, *pf_user(namespace, address, "down-pf-user"))
        eventually(lambda: any(c.reason == "Unschedulable" for c in pod().status.conditions or []),
                   60, "the claim for the tainted PF to wait")
        said = diagnose_pod(kubeconfig, namespace, "down-pf-user")
        assert (f"node {DRA_NODE}: nic: 0 free of 1 rdma.nicop.io, 1 wanted ({device} tainted "
                f"{dra.TAINT_LINK_DOWN}={ifname}:NoSchedule)") in said, said
        assert f"{dra.TAINT_LINK_DOWN}: the port's link is down" in said, said
    finally:
        host.set_link(ifname, True)
    try:
        eventually(lambda: taints() == [], 10, "the taint to go with the link back")
        eventually(lambda: pod().spec.nodeName == DRA_NODE, 60, "the claim allocated")
        [result] = _allocation(client, pod(), namespace)
        assert result["device"] == device
    finally:
        delete(client, Pod, "down-pf-user", namespace)


def test_while_the_driver_container_is_not_ready_the_nics_stay_published_and_tainted(
    client: Client, cluster: LocalCluster, deployed: None
) -> None:
    """The DGX's driver container stops being Ready (its readiness probe failing, as while the
    driver reloads): the operator sets mofed.wait "true" on the node, the DRA plugin pod stays
    (the device plugins' pods would leave), and its NICs stay in the slice under the same names,
    each tainted rdma.nicop.io/driver-not-ready; the driver Ready again, the taints go."""
    def driver_pod() -> Pod:
        [pod] = [p for p in client.list(Pod, namespace=NAMESPACE)
                 if p.spec.nodeName == DRA_NODE and "doca-driver" in p.spec.containers[0].image]
        return pod

    def nics() -> dict[str, list[str]]:
        return {d["name"]: [t["key"] for t in d.get("taints") or []]
                for s in client.list(ResourceSlice)
                if s["spec"]["driver"] == dra.DRIVER and s["spec"]["nodeName"] == DRA_NODE
                for d in s["spec"].get("devices") or []}

    def plugin_pods() -> set[str]:
        return {p.metadata.uid for p in client.list(Pod, namespace=NAMESPACE)
                if p.spec.nodeName == DRA_NODE and p.metadata.name.startswith(DRA_DS)}

    def set_ready(ready: bool) -> None:
        pod = driver_pod()
        status = pod.status.to_dict()
        for c in status["conditions"]:
            if c["type"] in ("Ready", "ContainersReady"):
                c["status"] = "True" if ready else "False"
        for c in status["containerStatuses"]:
            c["ready"] = ready
        client.patch(Pod.Status, pod.metadata.name, {"status": {
            "conditions": status["conditions"],
            "containerStatuses": status["containerStatuses"]}},
            namespace=NAMESPACE, patch_type=PatchType.MERGE)

    def mofed_wait() -> str | None:
        return (client.get(Node, DRA_NODE).metadata.labels or {}).get(MOFED_WAIT_LABEL)

    before, plugin = nics(), plugin_pods()
    assert len(before) == PAIRS and not any(before.values()) and len(plugin) == 1
    set_ready(False)
    try:
        eventually(lambda: mofed_wait() == "true", 30, "the operator's mofed.wait=true")
        waiting = time.monotonic()
        eventually(lambda: nics() == {name: [dra.TAINT_DRIVER_NOT_READY] for name in before},
                   30, "every NIC of the node tainted driver-not-ready")
        print(f"\nmofed.wait true to NICs tainted: {time.monotonic() - waiting:.2f}s")
        assert plugin_pods() == plugin, "the DRA plugin's pod stays through a driver reload"
    finally:
        set_ready(True)
    eventually(lambda: mofed_wait() == "false", 30, "the operator's mofed.wait=false")
    eventually(lambda: nics() == before, 30, "the taints gone with the driver Ready")
    assert plugin_pods() == plugin


def _device_status(client: Client, pod: Pod, namespace: str) -> list[dict[str, Any]]:
    [status] = pod.status.resourceClaimStatuses
    claim = client.get(ResourceClaim, status.resourceClaimName, namespace=namespace)
    return [d for d in (claim.get("status") or {}).get("devices") or []
            if d["driver"] == dra.DRIVER]


def _allocation(client: Client, pod: Pod, namespace: str) -> list[dict[str, Any]]:
    [status] = pod.status.resourceClaimStatuses
    claim = client.get(ResourceClaim, status.resourceClaimName, namespace=namespace)
    return list(claim["status"]["allocation"]["devices"]["results"])


def test_64_pods_sharing_one_roce_port_the_64th_waits_until_one_goes(
    client: Client, kubeconfig: Path, namespace: str, deployed: None
) -> None:
    """draDriver.sharedRdma on the GPU nodes' policy, and a ConnectX-6 Dx node joins the GPU
    node group: its RoCE ports become shared devices of 63 `pods` each (a 128-entry GID table,
    two entries a pod, two the port's own). 64 pods each claim a share of one port
    (examples/dra/shared-roce-port.yaml, pinned to the first port): the real scheduler puts 63
    on it and the 64th waits, Unschedulable; one deleted, the 64th is scheduled."""
    node, device = "node-3", "shared-0000-3b-00-0"
    template, user = example("shared-roce-port.yaml", namespace)
    assert user is not None
    template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"].append(
        {"cel": {"expression": (f'device.attributes["{dra.DRIVER}"].{dra.PCI_ADDRESS} == '
                                '"0000:3b:00.0"')}})

    def shared() -> dict[str, Any] | None:
        return next((d for s in client.list(ResourceSlice)
                     if s["spec"]["driver"] == dra.DRIVER and s["spec"]["nodeName"] == node
                     for d in s["spec"].get("devices") or []
                     if d["name"] == device and not d.get("taints")), None)

    def pods() -> list[Pod]:
        return list(client.list(Pod, namespace=namespace, labels={"app": "roce-share"}))

    def unschedulable(pod: Pod) -> bool:
        return any(c.reason == "Unschedulable" for c in pod.status.conditions or [])

    client.patch(NicNodePolicy, DRA_POLICY, {"spec": {"draDriver": {"sharedRdma": True}}},
                 patch_type=PatchType.MERGE)
    client.patch(Node, node, {"metadata": {"labels": {GPU: ""}}})
    try:
        published = eventually(shared, 120, f"{node}'s first RoCE port published as shared")
        assert published["allowMultipleAllocations"] is True
        assert published["capacity"]["pods"]["value"] == "63"

        async def sixty_four() -> None:
            api = ApiClient(kubeconfig)
            try:
                await api.create(template, res=CLAIM_TEMPLATE)
                for i in range(64):
                    body = json.loads(json.dumps(user))
                    body["metadata"].update(name=f"roce-{i}", labels={"app": "roce-share"})
                    await api.create(body)
            finally:
                await api.close()
        asyncio.run(sixty_four())

        def placed() -> list[Pod] | None:
            now = pods()
            waiting = [p for p in now if unschedulable(p)]
            on_node = [p for p in now if p.spec.nodeName == node]
            return waiting if len(on_node) == 63 and len(waiting) == 1 else None

        [waiting] = eventually(placed, 180, "63 pods on the port and the 64th unschedulable")
        first = next(p for p in pods() if p.spec.nodeName == node)
        delete(client, Pod, first.metadata.name, namespace)
        eventually(lambda: client.get(Pod, waiting.metadata.name, namespace=namespace)
                   .spec.nodeName == node, 60, "the 64th scheduled once a share is free")
    finally:
        for pod in pods():
            client.delete(Pod, pod.metadata.name, namespace=namespace, grace_period=0)
        with contextlib.suppress(ApiError):
            client.delete(ResourceClaimTemplate, "roce-share", namespace=namespace)
        client.patch(NicNodePolicy, DRA_POLICY, {"spec": {"draDriver": {"sharedRdma": None}}},
                     patch_type=PatchType.MERGE)
        client.patch(Node, node, {"metadata": {"labels": {GPU: None}}})
        eventually(lambda: not pods() and node not in slices(client, dra.DRIVER)
                   and "pf-0000-40-00-0" in {d["name"] for s in client.list(ResourceSlice)
                                           for d in s["spec"].get("devices") or []},
                   120, "the pods gone and the policy back to whole PFs")


def test_a_deployment_asking_for_an_sriov_resource_gets_it_by_dra_or_the_device_plugin(
    client: Client, kubeconfig: Path, cluster: LocalCluster, namespace: str, deployed: None
) -> None:
    """Zero-change migration (KEP-5004). One SriovNetworkNodePolicy (resourceName `moving_vf`;
    nicSelector vendor and pfNames, isRdma: upstream's fields, sriov-network-operator
    api/v1/sriovnetworknodepolicy_types.go) makes VFs on the GPU node, whose DRA driver serves
    SR-IOV resources (examples/nicnodepolicy-dra-gpu-nodes.yaml: `sriovResources: true`), and on the
    storage node. A Deployment whose pods ask `nvidia.com/moving_vf: 1`, spread one per node:
    the storage node's pod gets a VF from the SR-IOV device plugin, the GPU node's from the DRA
    driver through the claim the real scheduler makes (the operator's DeviceClass maps the
    resource); both see their VF's address in PCIDEVICE_NVIDIA_COM_MOVING_VF. The GPU node runs
    no SR-IOV device plugin and advertises no such resource; `nicop status` says which node serves
    it which way."""
    resource, variable = "nvidia.com/moving_vf", "PCIDEVICE_NVIDIA_COM_MOVING_VF"
    storage_pf, storage_pf_name = "0000:3b:00.0", "enp59s0f0np0"  # node-2's first port
    group = "nicop.io/migration-test"
    roots = {DRA_NODE: cluster.node_root(DRA_NODE), PLUGIN_NODE: cluster.node_root(PLUGIN_NODE)}
    pfs = {DRA_NODE: SRIOV_PF, PLUGIN_NODE: storage_pf}

    def numvfs(node: str) -> str:
        return (roots[node] / f"sys/bus/pci/devices/{pfs[node]}/sriov_numvfs").read_text().strip()

    def vfs_of(node: str) -> set[str]:
        pf = roots[node] / f"sys/bus/pci/devices/{pfs[node]}"
        return {os.path.basename(os.readlink(v)) for v in pf.glob("virtfn*")}

    for node in roots:
        client.patch(Node, node, {"metadata": {"labels": {group: ""}}})
    client.apply(SriovPolicy(metadata=ObjectMeta(name="moving-vfs", namespace=NAMESPACE), spec={
        "resourceName": "moving_vf", "nodeSelector": {group: ""}, "numVfs": 2,
        "nicSelector": {"vendor": "15b3", "pfNames": [SRIOV_PF_NAME, storage_pf_name]},
        "isRdma": True}), field_manager="test", force=True)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "migrating", "namespace": namespace},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "migrating"}},
                 "template": {"metadata": {"labels": {"app": "migrating"}}, "spec": {
                     "affinity": {"podAntiAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": [{
                             "labelSelector": {"matchLabels": {"app": "migrating"}},
                             "topologyKey": "kubernetes.io/hostname"}]}},
                     "containers": [{"name": "app", "image": "registry.local/train:1",
                                     "resources": {"limits": {resource: "1"}}}]}}}}
    try:
        for node in roots:
            eventually(lambda n=node: numvfs(n) == "2", 180, f"the VFs on {node}")  # type: ignore[misc]
        eventually(lambda: allocatable(client, PLUGIN_NODE, resource) == 2, 60,
                   f"{resource} advertised by the storage node's device plugin")
        eventually(lambda: dra.sriov_class_name("moving_vf") in classes(client), 30,
                   "the operator's DeviceClass of the resource")
        create_object(kubeconfig, deployment)

        def placed() -> dict[str, dict[str, Any]] | None:
            pods = [p for p in client.list(Pod, namespace=namespace,
                                           labels={"app": "migrating"})
                    if p.spec.nodeName and not p.metadata.deletionTimestamp]
            by_node = {p.spec.nodeName: p.to_dict() for p in pods}
            return by_node if set(by_node) == {DRA_NODE, PLUGIN_NODE} else None

        eventually(placed, 90, "a pod on each node")

        def from_device_plugin() -> dict[str, Any] | None:
            record = (placed() or {}).get(PLUGIN_NODE, {}).get("metadata", {}).get(
                "annotations", {}).get("nicop.io/devices")
            return json.loads(record)["app"][resource] if record else None

        given = eventually(from_device_plugin, 60, "the device plugin's VF on the storage pod")
        assert given["env"][variable] in vfs_of(PLUGIN_NODE), given

        def by_dra() -> tuple[dict[str, Any], dict[str, Any]] | None:
            pod = (placed() or {}).get(DRA_NODE)
            record = json.loads(((pod or {}).get("metadata", {}).get("annotations") or {}).get(
                ANNOTATION) or "null")
            if not record or record.get("error") or resource not in record["devices"]:
                return None
            return pod, record  # type: ignore[return-value]

        pod, record = eventually(by_dra, 90, "the GPU node's pod prepared by the DRA driver")
        extended = pod["status"]["extendedResourceClaimStatus"]
        assert extended["requestMappings"] == [{"containerName": "app", "resourceName": resource,
                                                "requestName": "container-0-request-0"}]
        claim = client.get(ResourceClaim, extended["resourceClaimName"], namespace=namespace)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (dra.DRIVER, DRA_NODE)
        [cdi] = record["devices"][resource]
        assert cdi.startswith(f"{dra.DRIVER}/device="), cdi
        spec = json.loads((roots[DRA_NODE] / "var/run/cdi" /
                           f"{dra.DRIVER}-{claim['metadata']['uid']}.json").read_text())
        [device] = spec["devices"]
        env = dict(e.split("=", 1) for e in device["containerEdits"]["env"])
        assert env[variable] in vfs_of(DRA_NODE), env

        assert allocatable(client, DRA_NODE, resource) == 0
        assert "sriov-device-plugin" not in {a.command for a in agents(cluster, DRA_NODE)}
        assert "sriov-device-plugin" in {a.command for a in agents(cluster, PLUGIN_NODE)}
        shown = subprocess.run(
            [sys.executable, "-m", "nicop", "status", "-o", "json", "--kubeconfig",
             str(kubeconfig)], capture_output=True, text=True, timeout=120, check=False)
        served = {n["name"]: (n["sriov"] or {}).get("servedBy")
                  for n in json.loads(shown.stdout)["nodes"]}
        assert (served[DRA_NODE], served[PLUGIN_NODE]) == ("dra", "device-plugin"), served
    finally:
        with contextlib.suppress(ApiError):
            client.delete(Deployment, "migrating", namespace=namespace)
        eventually(lambda: not list(client.list(Pod, namespace=namespace,
                                              labels={"app": "migrating"})),
                   60, "the Deployment's pods to go")
        delete(client, SriovPolicy, "moving-vfs", NAMESPACE)
        for node in roots:
            client.patch(Node, node, {"metadata": {"labels": {group: None}}})
            eventually(lambda n=node: numvfs(n) == "0", 120, f"the VFs of {node} removed")  # type: ignore[misc]


def create_object(kubeconfig: Path, body: dict[str, Any]) -> None:
    """An object as a user applies it."""
    async def main() -> None:
        api = ApiClient(kubeconfig)
        try:
            await api.create(body)
        finally:
            await api.close()
    asyncio.run(main())


def test_removing_the_dra_policy_removes_the_driver_its_slices_and_classes(
    client: Client, cluster: LocalCluster, deployed: None
) -> None:
    """Deleting the GPU nodes' policy stops the plugin (it withdraws its slices), and its
    DaemonSet and DeviceClasses go; the storage nodes' device plugin keeps serving."""
    delete(client, NicNodePolicy, DRA_POLICY)

    def left() -> dict[str, Any]:
        return {k: v for k, v in {
            "slices": slices(client, dra.DRIVER), "pods": pod_nodes(client, DRA_DS),
            "classes": {dra.PF_CLASS, dra.VF_CLASS} & classes(client),
            "agents": [a for a in agents(cluster, DRA_NODE) if a.command == "dra-plugin"],
        }.items() if v}
    deadline = time.monotonic() + 60
    while remaining := left():
        assert time.monotonic() < deadline, f"60 s after the policy was deleted: {remaining}"
        time.sleep(0.2)
    assert allocatable(client, PLUGIN_NODE, RDMA_RESOURCE) == 63
    assert nnp_status(client, PLUGIN_POLICY).get("state") == "ready"
