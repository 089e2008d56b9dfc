"""Network CRs become NetworkAttachmentDefinitions through the running operator."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from tests.eventually import eventually
from tests.integration.operator_process import NAMESPACE, OperatorProcess, nicop_plan

ROOT = Path(__file__).resolve().parents[2]
NAD = create_namespaced_resource("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition",
                                 "network-attachment-definitions")
OVS_NETWORK = create_namespaced_resource("sriovnetwork.openshift.io", "v1", "OVSNetwork",
                                        "ovsnetworks")
KINDS = {
    "MacvlanNetwork": create_global_resource("mellanox.com", "v1alpha1", "MacvlanNetwork",
                                             "macvlannetworks"),
    "HostDeviceNetwork": create_global_resource("mellanox.com", "v1alpha1", "HostDeviceNetwork",
                                                "hostdevicenetworks"),
    "IPoIBNetwork": create_global_resource("mellanox.com", "v1alpha1", "IPoIBNetwork",
                                           "ipoibnetworks"),
}


def apply(client: Client, body: dict[str, Any]) -> None:
    client.apply(KINDS[body["kind"]](**body), field_manager="test", force=True)


def nad_config(client: Client, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        nad = client.get(NAD, name, namespace=namespace)
    except ApiError:
        return None
    return json.loads(nad["spec"]["config"])  # type: ignore[no-any-return]


def test_each_network_example_produces_its_nad(
    client: Client, operator: OperatorProcess, namespace: str
) -> None:
    expected = {
        "macvlannetwork.yaml": {"cniVersion": "0.3.1", "name": "rdma-macvlan",
                                "type": "macvlan", "master": "ens1f0", "mode": "bridge",
                                "mtu": 9000,
                                "ipam": {"type": "nv-ipam", "poolName": "rdma-pool"}},
        "hostdevicenetwork.yaml": {"cniVersion": "0.3.1", "name": "hostdev-net",
                                   "type": "host-device",
                                   "ipam": {"type": "nv-ipam", "poolName": "rdma-pool"}},
        "ipoibnetwork.yaml": {"cniVersion": "0.3.1", "name": "ipoib-net", "type": "ipoib",
                              "master": "ibp12s0",
                              "ipam": {"type": "nv-ipam", "poolName": "ib-pool"}},
    }
    for file, config in expected.items():
        body = yaml.safe_load((ROOT / "examples" / file).read_text())
        body["spec"]["networkNamespace"] = namespace
        apply(client, body)
        name = body["metadata"]["name"]
        try:
            got = eventually(lambda n=name: nad_config(client, n, namespace), 30, f"NAD {name}")
            assert got == config
            status = eventually(lambda b=body: client.get(KINDS[b["kind"]], b["metadata"]["name"])
                                .get("status"), 30, "status")
            assert status["state"] == "ready"
            link = f"k8s.cni.cncf.io/v1/namespaces/{namespace}/NetworkAttachmentDefinition/{name}"
            assert link in status.values()
            if body["kind"] == "HostDeviceNetwork":
                nad = client.get(NAD, name, namespace=namespace)
                annotations = nad["metadata"]["annotations"]
                assert annotations["k8s.v1.cni.cncf.io/resourceName"] == "nvidia.com/cx6dx_vf"
        finally:
            client.delete(KINDS[body["kind"]], name)
        eventually(lambda n=name: nad_config(client, n, namespace) is None, 30,
                   f"NAD {name} to go with its network")


def planned(kubeconfig: Path, path: Path, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """`nicop plan -o json` of `body`: its exit code and the plan."""
    path.write_text(yaml.safe_dump(body))
    proc = nicop_plan(kubeconfig, path, NAMESPACE, "-o", "json")
    assert proc.returncode in (0, 1, 2), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_namespace_move_and_bad_ipam(
    client: Client, operator: OperatorProcess, namespace: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """Also `nicop plan` of each change first: the NAD it would create in the new namespace,
    nothing for an unchanged network, and the operator's refusal of JSON that is not JSON."""
    body = {"apiVersion": "mellanox.com/v1alpha1", "kind": "MacvlanNetwork",
            "metadata": {"name": f"mv-{namespace}"},
            "spec": {"networkNamespace": "default", "master": "ens1f0", "mode": "bridge"}}
    name = body["metadata"]["name"]
    apply(client, body)
    try:
        eventually(lambda: nad_config(client, name, "default"), 30, "NAD in default")
        code, plan = planned(kubeconfig, tmp_path / "same.yaml", body)
        assert code == 0 and plan["operatorObjects"] == [], plan
        body["spec"]["networkNamespace"] = namespace
        code, plan = planned(kubeconfig, tmp_path / "move.yaml", body)
        assert code == 0 and plan["operatorObjects"] == [{
            "action": "create", "kind": "NetworkAttachmentDefinition", "name": name,
            "namespace": namespace}], plan
        apply(client, body)
        eventually(lambda: nad_config(client, name, namespace), 30, "NAD in the new namespace")
        eventually(lambda: nad_config(client, name, "default") is None, 30, "old NAD removed")

        body["spec"]["ipam"] = '{"type": "nv-ipam", "poolName": }'
        code, plan = planned(kubeconfig, tmp_path / "bad.yaml", body)
        assert code == 1 and "the operator would refuse it: spec.ipam is not valid JSON" in \
            plan["refused"][0], plan
        apply(client, body)
        status = eventually(lambda: (s := client.get(KINDS["MacvlanNetwork"], name).get("status"))
                            and s.get("state") == "error" and s, 30, "error status")
        assert "spec.ipam is not valid JSON" in status["reason"]
    finally:
        client.delete(KINDS["MacvlanNetwork"], name)


def test_second_replica_takes_over_when_the_leader_dies(
    client: Client, operator: OperatorProcess, kubeconfig: Path, tmp_path: Path,
    namespace: str,
) -> None:
    from lightkube.resources.coordination_v1 import Lease

    standby = OperatorProcess(kubeconfig, NAMESPACE, tmp_path / "standby.log")
    try:
        eventually(lambda: standby.get("/readyz")[0] == 200, 30, "the standby ready")
        # Evidence it had its chance: more tries for the lease (one each 0.53 s) than fit in
        # one lease duration (4 s) while the leader renews.
        eventually(lambda: standby.requests("get", "leases") >= 10, 30,
                   "the standby to try for the lease ten times")
        assert not standby.leading(), "a standby waits for the lease"
        holder = client.get(Lease, "12620820.mellanox.com", namespace=NAMESPACE).spec.holderIdentity
        assert holder.endswith(f"_{operator.proc.pid}")
        operator.stop(signal.SIGKILL)  # no clean release: the lease must expire
        killed = time.monotonic()
        standby.wait_ready(20)
        took = time.monotonic() - killed
        assert took < 4 + 2 + 1, f"took over after {took:.1f}s (lease 4s)"
        lease = client.get(Lease, "12620820.mellanox.com", namespace=NAMESPACE)
        assert lease.spec.holderIdentity.endswith(f"_{standby.proc.pid}")
        # The new leader does the work.
        body = {"apiVersion": "mellanox.com/v1alpha1", "kind": "IPoIBNetwork",
                "metadata": {"name": f"ib-{namespace}"},
                "spec": {"networkNamespace": namespace, "master": "ib0"}}
        apply(client, body)
        try:
            eventually(lambda: nad_config(client, body["metadata"]["name"], namespace), 30,
                       "the NAD made by the new leader")
        finally:
            client.delete(KINDS["IPoIBNetwork"], body["metadata"]["name"])
    finally:
        standby.stop()
        operator.restart()


def ready_condition(client: Client, name: str) -> dict[str, Any] | None:
    status = client.get(OVS_NETWORK, name, namespace=NAMESPACE).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), None)


def test_ovs_network_example_produces_its_nad(
    client: Client, operator: OperatorProcess, namespace: str
) -> None:
    """examples/ovsnetwork.yaml (sriov-network-operator's doc/ovs-hw-offload.md) in the operator
    namespace becomes the NAD upstream renders in the namespace it names, reports Ready, and
    takes its NAD with it when deleted (its finalizer); one without spec says what it lacks."""
    body = yaml.safe_load((ROOT / "examples" / "ovsnetwork.yaml").read_text())
    body["metadata"]["name"] = name = f"ovs-{namespace}"
    body["spec"]["networkNamespace"] = namespace
    bare = {"apiVersion": body["apiVersion"], "kind": "OVSNetwork",
            "metadata": {"name": f"bare-{namespace}", "namespace": NAMESPACE}}
    client.create(OVS_NETWORK(**body))
    client.create(OVS_NETWORK(**bare))
    try:
        got = eventually(lambda: nad_config(client, name, namespace), 30, f"NAD {name}")
        assert got == {"cniVersion": "1.0.0", "name": name, "type": "ovs", "vlan": 200,
                       "ipam": {"type": "nv-ipam", "poolName": "pool1"}}
        annotations = client.get(NAD, name, namespace=namespace)["metadata"]["annotations"]
        assert annotations["k8s.v1.cni.cncf.io/resourceName"] == "nvidia.com/switchdev"
        assert annotations["sriovnetwork.openshift.io/owner-ref"] == \
            f"OVSNetwork.sriovnetwork.openshift.io/{NAMESPACE}/{name}"
        ready = eventually(lambda: ready_condition(client, name), 30, "the Ready condition")
        assert (ready["status"], ready["reason"]) == ("True", "NetworkReady")

        refused = eventually(lambda: ready_condition(client, bare["metadata"]["name"]), 30,
                             "the Ready condition of the network without spec")
        assert refused["status"] == "False"
        assert "spec.resourceName is missing" in refused["message"]
    finally:
        client.delete(OVS_NETWORK, name, namespace=NAMESPACE)
        client.delete(OVS_NETWORK, bare["metadata"]["name"], namespace=NAMESPACE)
    eventually(lambda: nad_config(client, name, namespace) is None, 30, "the NAD to go")
    eventually(lambda: not any(o.metadata.name in (name, bare["metadata"]["name"])
                             for o in client.list(OVS_NETWORK, namespace=NAMESPACE)), 30,
               "the networks themselves gone (their finalizers removed)")
