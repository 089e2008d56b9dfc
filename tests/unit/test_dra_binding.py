"""VFs published before they are made (the node state's plan) and the binding conditions the
plugin answers for them (KEP-5007)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from nicop.api import dra
from nicop.node.discovery import scan
from nicop.node.dra.binding import binding_conditions, pending
from nicop.node.dra.devices import Device, node_devices, node_pool
from nicop.node.dra.vf_plan import plan_of
from nicop_sim.hardware import SimulatedHost

PF, PF_NAME = "0000:3b:00.0", "enp59s0f0np0"  # the first port of a ConnectX-6 Dx


def node_state(num_vfs: int, device_type: str = "netdevice", sync: str = "Succeeded",
               error: str = "") -> dict[str, Any]:
    """A SriovNetworkNodeState as the operator writes its spec and the daemon its status."""
    return {"metadata": {"name": "node-1", "namespace": "nicop"},
            "spec": {"interfaces": [{"pciAddress": PF, "name": PF_NAME, "numVfs": num_vfs,
                                     "vfGroups": [{"resourceName": "vfs", "policyName": "p",
                                                   "deviceType": device_type,
                                                   "vfRange": f"0-{num_vfs - 1}"}]}]},
            "status": {"syncStatus": sync, "lastSyncError": error}}


def vfs(host: SimulatedHost, state: dict[str, Any]) -> dict[str, Device]:
    return {d.name: d for d in node_devices(scan(host), host, plan=plan_of(state))
            if d.attributes[dra.KIND] == {"string": dra.KIND_VF}}


def test_planned_vfs_are_published_under_the_names_they_will_have(tmp_path: Path) -> None:
    """Before the daemon writes sriov_numvfs, the 4 VFs of the plan are devices named as the
    PF's SR-IOV capability (offset 2, stride 1) places them, with the PF's root, link and the
    VF device ID, binding conditions, and one each of the PF's counter set of 4; once made and
    bound they are the same devices, without binding conditions."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    state = node_state(4)
    planned = vfs(host, state)
    assert sorted(planned) == [f"vf-0000-3b-00-{i}" for i in range(2, 6)]
    first = planned["vf-0000-3b-00-2"].to_api()
    assert first["bindingConditions"] == [dra.CONDITION_VF_READY]
    assert first["bindingFailureConditions"] == [dra.CONDITION_VF_FAILED]
    attrs = first["attributes"]
    assert (attrs[dra.PCIE_ROOT], attrs[dra.DEVICE_ID], attrs[dra.PF_NAME], attrs[dra.VF_INDEX],
            attrs[dra.LINK_UP], attrs[dra.LINK_TYPE]) == (
        {"string": "pci0000:00"}, {"string": "101e"}, {"string": PF_NAME}, {"int": 0},
        {"bool": True}, {"string": "ethernet"})
    assert "taints" not in first and dra.NETDEV not in attrs
    pool = node_pool(scan(host), host, plan=plan_of(state))
    assert {"name": "pf-0000-3b-00-0", "counters": {"vfs": {"value": "4"}}} in pool.counter_sets

    host.set_numvfs(PF_NAME, 4)
    made = vfs(host, state)
    assert sorted(made) == sorted(planned)
    assert all(d.planned is None and "bindingConditions" not in d.to_api()
               for d in made.values())
    # without the plan: the same devices, but for the policy's resourceName
    assert {name: replace(d, attributes={k: v for k, v in d.attributes.items()
                                         if k != dra.RESOURCE_NAME})
            for name, d in made.items()} == vfs(host, {})
    assert {d.attributes[dra.RESOURCE_NAME]["string"] for d in made.values()} == {"vfs"}


def test_a_vf_is_ready_only_on_the_driver_its_device_type_asks(tmp_path: Path) -> None:
    """A vfio-pci group's VFs stay planned while the kernel driver holds them (as right after
    sriov_numvfs, before the daemon binds them), and are ready on vfio-pci."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs(PF_NAME, 2)
    state = node_state(2, "vfio-pci")
    assert all(d.planned is not None for d in vfs(host, state).values())
    for vf in host.vfs(PF_NAME):
        host.bind_driver(vf, "vfio-pci")
    assert all(d.planned is None for d in vfs(host, state).values())


def test_the_daemons_failure_on_the_pf_taints_its_planned_vfs(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    error = (f"PF {PF_NAME} ({PF}) VF 0 (0000:3b:00.2): binding 0000:3b:00.2 to vfio-pci failed: "
             "Invalid argument; the VF has no IOMMU group")
    failed = vfs(host, node_state(2, "vfio-pci", "Failed", error))
    assert all(d.to_api()["taints"] == [{"key": dra.TAINT_VF_FAILED, "value": name,
                                         "effect": "NoSchedule"}]
               for name, d in failed.items())
    # InProgress with the error of an attempt that will be tried again is no failure yet.
    assert all("taints" not in d.to_api()
               for d in vfs(host, node_state(2, "vfio-pci", "InProgress", error)).values())
    # The failure of another PF is not this one's.
    other = vfs(host, node_state(2, "vfio-pci", "Failed", "PF enp59s0f1np1 (0000:3b:00.1): x"))
    assert all("taints" not in d.to_api() for d in other.values())


def claim(device: str, answered: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}, "status": {
        "allocation": {"allocationTimestamp": "2026-12-05T12:00:00Z", "devices": {"results": [
            {"driver": dra.DRIVER, "pool": "node-1", "device": device, "request": "vf",
             "bindingConditions": [dra.CONDITION_VF_READY],
             "bindingFailureConditions": [dra.CONDITION_VF_FAILED]},
            {"driver": dra.DRIVER, "pool": "node-1", "device": "pf-0000-3b-00-1",
             "request": "pf"}]}},
        "devices": answered or []}}


def test_the_binder_answers_ready_failed_or_not_yet(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "cx6dx")
    name = "vf-0000-3b-00-2"
    assert pending(claim(name), "node-1") == [name]  # the PF has no binding conditions
    assert pending(claim(name), "node-2") == []

    assert binding_conditions(vfs(host, node_state(2))[name], "node-1") is None  # being made
    error = f"PF {PF_NAME} ({PF}): creating 2 VFs failed: Device or resource busy"
    [failed] = binding_conditions(vfs(host, node_state(2, sync="Failed", error=error))[name],
                                  "node-1") or []
    assert (failed["type"], failed["status"], failed["message"]) == (
        dra.CONDITION_VF_FAILED, "True", error)
    [gone] = binding_conditions(None, "node-1") or []
    assert gone["type"] == dra.CONDITION_VF_FAILED and "no longer planned" in gone["message"]
    host.set_numvfs(PF_NAME, 2)
    [ready] = binding_conditions(vfs(host, node_state(2))[name], "node-1") or []
    assert (ready["type"], ready["status"]) == (dra.CONDITION_VF_READY, "True")
    assert pending(claim(name, [{"driver": dra.DRIVER, "pool": "node-1", "device": name,
                                 "conditions": [ready]}]), "node-1") == []
