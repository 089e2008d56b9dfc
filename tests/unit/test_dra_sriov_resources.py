"""SR-IOV resources served by DRA (draDriver.sriovResources): the VFs a policy makes carry its
resourceName, the DeviceClass of `nvidia.com/<resourceName>` selects exactly them, and without
the option the DRA driver leaves a policy's NIC to the device plugin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nicop.api import dra
from nicop.node.discovery import scan
from nicop.node.dra.devices import node_devices
from nicop.node.dra.vf_plan import plan_of
from nicop_sim.hardware import SimulatedHost

PF, PF_NAME = "0000:3b:00.0", "enp59s0f0np0"  # the first port of a ConnectX-6 Dx


def node_state() -> dict[str, Any]:
    """Two policies' ranges of one PF (upstream's `pfNames: [enp59s0f0np0#0-1]` and `#2-3`)."""
    return {"metadata": {"name": "node-1", "namespace": "nicop"},
            "spec": {"interfaces": [{"pciAddress": PF, "name": PF_NAME, "numVfs": 4,
                                     "vfGroups": [
                                         {"resourceName": "train_vf", "policyName": "a",
                                          "deviceType": "netdevice", "vfRange": "0-1"},
                                         {"resourceName": "storage_vf", "policyName": "b",
                                          "deviceType": "netdevice", "vfRange": "2-3"}]}]},
            "status": {"syncStatus": "Succeeded"}}


def test_each_vf_carries_the_resource_name_of_its_range(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs(PF_NAME, 4)
    devices = {d.name: d.attributes for d in node_devices(scan(host), host,
                                                          plan=plan_of(node_state()))}
    names = {name: attrs[dra.RESOURCE_NAME]["string"] for name, attrs in devices.items()
             if dra.RESOURCE_NAME in attrs}
    assert names == {"vf-0000-3b-00-2": "train_vf", "vf-0000-3b-00-3": "train_vf",
                     "vf-0000-3b-00-4": "storage_vf", "vf-0000-3b-00-5": "storage_vf"}
    assert dra.RESOURCE_NAME not in devices["pf-0000-3b-00-0"]


def test_without_sriov_resources_the_policys_nic_is_left_to_the_device_plugin(
        tmp_path: Path) -> None:
    """Neither the PF nor its VFs: the SR-IOV device plugin serves them, and a claim must not
    get what a device plugin hands out too. The other port, no policy's, stays published."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs(PF_NAME, 4)
    plan = plan_of(node_state())
    names = {d.name for d in node_devices(scan(host), host, plan=plan, sriov_resources=False)}
    assert names == {"pf-0000-3b-00-1"}
    assert len(node_devices(scan(host), host, plan=plan, sriov_resources=True)) == 6


def test_the_device_class_maps_the_device_plugins_resource_to_its_vfs() -> None:
    """What a pod asks (`nvidia.com/train_vf: 1`) is the class's extendedResourceName; the
    class selects this driver's VFs of that resourceName and only those (has(): VFs without
    one, made by hand, have no such attribute); the pod's variable is the device plugin's."""
    body = dra.sriov_class("nvidia.com", "train_vf", {"app.kubernetes.io/managed-by": "nicop"})
    assert body["metadata"]["name"].startswith("train-vf-")  # upstream allows _, DNS not
    assert body["metadata"]["name"].endswith(".sriov.rdma.nicop.io")
    assert dra.sriov_class_name("train-vf") == "train-vf.sriov.rdma.nicop.io"
    assert body["spec"]["extendedResourceName"] == "nvidia.com/train_vf"
    expressions = [s["cel"]["expression"] for s in body["spec"]["selectors"]]
    assert 'device.attributes["rdma.nicop.io"].kind == "vf"' in expressions[0]
    assert expressions[1] == ('has(device.attributes["rdma.nicop.io"].resourceName) && '
                              'device.attributes["rdma.nicop.io"].resourceName == "train_vf"')
    # upstream's sriov-network-device-plugin: PCIDEVICE_ + the resource, . and / as _
    assert dra.device_plugin_env("nvidia.com/train_vf") == "PCIDEVICE_NVIDIA_COM_TRAIN_VF"
