"""Why a DRA claim is not allocated, from the scheduler's own inputs: the claim of
examples/dra/, the DeviceClasses, the simulated DGX's slices and the devices claims hold."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nicop import claims
from nicop.api import dra
from nicop.node import discovery
from nicop.node.dra.devices import node_devices, node_pool
from nicop.node.dra.slices import PoolContent, build_slices
from nicop_sim import gpu_dra
from nicop_sim.hardware import SimulatedHost

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dra"
NODE = "node-1"


@pytest.fixture(scope="module")
def dgx() -> Iterator[SimulatedHost]:
    root = Path(tempfile.mkdtemp(prefix="dgx-", dir="/tmp"))
    yield SimulatedHost.build(root, "dgx", seed=1)
    shutil.rmtree(root)


def template_spec(name: str) -> dict[str, Any]:
    return dict(next(yaml.safe_load_all((EXAMPLES / name).read_text()))["spec"]["spec"])


def classes() -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in [*dra.device_classes(),
                                              gpu_dra.gpu_device_class()]}


def slices(host: SimulatedHost) -> list[dict[str, Any]]:
    return [*build_slices(dra.DRIVER, NODE, node_pool(discovery.scan(host), host), 1),
            *build_slices(gpu_dra.GPU_DRIVER, NODE, PoolContent(gpu_dra.gpu_devices(host)), 1)]


def holding(*devices: tuple[str, str]) -> dict[str, Any]:
    """A claim allocated these (driver, device) on NODE."""
    return {"status": {"allocation": {"devices": {"results": [
        {"request": f"r{i}", "driver": driver, "pool": NODE, "device": device}
        for i, (driver, device) in enumerate(devices)]}}}}


def roots(host: SimulatedHost) -> tuple[dict[str, str], dict[str, str]]:
    """PCIe root -> GPU and PCIe root -> NIC device name."""
    gpus = {d["attributes"][dra.PCIE_ROOT]["string"]: d["name"] for d in gpu_dra.gpu_devices(host)}
    nics = {d.attributes[dra.PCIE_ROOT]["string"]: d.name
            for d in node_devices(discovery.scan(host), host)}
    return gpus, nics


def test_a_free_dgx_fits_a_gpu_and_nic_pair(dgx: SimulatedHost) -> None:
    requests, [node], unknown = claims.fits(template_spec("gpu-and-nic.yaml"), classes(),
                                            slices(dgx), [])
    assert [(r.name, r.device_class) for r in requests] == [
        ("gpu", gpu_dra.GPU_CLASS), ("nic", dra.PF_CLASS)]
    assert (node.node, node.fits, node.free) == (NODE, True, {"gpu": 8, "nic": 8})
    assert unknown == []


def test_every_pair_taken_says_how_many_are_free_of_how_many(dgx: SimulatedHost) -> None:
    gpus, nics = roots(dgx)
    taken = [holding((gpu_dra.GPU_DRIVER, gpus[r]), (dra.DRIVER, nics[r])) for r in gpus]
    _, [node], _ = claims.fits(template_spec("gpu-and-nic.yaml"), classes(), slices(dgx), taken)
    assert not node.fits
    assert node.why == (f"gpu: 0 free of 8 {gpu_dra.GPU_CLASS}, 1 wanted; "
                        f"nic: 0 free of 8 {dra.PF_CLASS}, 1 wanted")


def test_free_gpus_and_nics_on_different_roots_break_the_constraint(dgx: SimulatedHost) -> None:
    """Four GPUs and the NICs of the four other roots are taken: four of each are free, but
    no free GPU shares a root with a free NIC."""
    gpus, nics = roots(dgx)
    ordered = sorted(gpus)
    taken = [holding(*[(gpu_dra.GPU_DRIVER, gpus[r]) for r in ordered[:4]],
                     *[(dra.DRIVER, nics[r]) for r in ordered[4:]])]
    _, [node], _ = claims.fits(template_spec("gpu-and-nic.yaml"), classes(), slices(dgx), taken)
    assert node.free == {"gpu": 4, "nic": 4}
    assert not node.fits
    assert node.why == f"no {dra.PCIE_ROOT} value has free devices for all of gpu, nic"


def test_a_pf_and_its_vfs_are_not_free_while_the_other_is_allocated(tmp_path: Path) -> None:
    """They share a counter set, as the scheduler counts it: the PF cannot be had while one of
    its VFs is held, nor its VFs while it is, and the reason names the device."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_numvfs("enp59s0f0np0", 2)

    def request(device_class: str, count: int) -> dict[str, Any]:
        return {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": device_class, "count": count}}]}}

    _, [node], _ = claims.fits(request(dra.PF_CLASS, 2), classes(), slices(host), [
        holding((dra.DRIVER, "vf-0000-3b-00-2"))])
    assert (node.free, node.fits) == ({"r": 1}, False)
    assert node.why == (f"r: 1 free of 2 {dra.PF_CLASS}, 2 wanted (pf-0000-3b-00-0 not free: "
                        "a PF is not free while some of its VFs are allocated, nor its VFs "
                        "while it is)")
    _, [node], _ = claims.fits(request(dra.VF_CLASS, 1), classes(), slices(host), [
        holding((dra.DRIVER, "pf-0000-3b-00-0"))])
    assert (node.free, node.total, node.fits) == ({"r": 0}, {"r": 2}, False)
    _, [node], _ = claims.fits(request(dra.VF_CLASS, 1), classes(), slices(host), [
        holding((dra.DRIVER, "pf-0000-3b-00-1"))])
    assert node.fits  # the other PF has no VFs to share with


def test_class_and_claim_selectors_are_evaluated(dgx: SimulatedHost) -> None:
    """The VF class selects no PF; the claim's linkType/linkUp test is understood."""
    _, [node], unknown = claims.fits(template_spec("two-ib-vfs.yaml"), classes(),
                                     slices(dgx), [])
    assert unknown == []
    assert node.total == {"vfs": 0} and not node.fits
    assert node.why == f"vfs: 0 free of 0 {dra.VF_CLASS}, 2 wanted"
    _, [nic], _ = claims.fits(template_spec("one-ib-nic.yaml"), classes(), slices(dgx), [])
    assert nic.total == {"nic": 4}  # the DGX's NICs on NUMA node 0


def test_cel_it_cannot_evaluate_is_named_and_not_held_against_a_device(dgx: SimulatedHost) -> None:
    spec = {"devices": {"requests": [{"name": "nic", "exactly": {
        "deviceClassName": dra.PF_CLASS,
        "selectors": [{"cel": {"expression": 'device.attributes["rdma.nicop.io"].numaNode > 0'}}],
    }}]}}
    _, [node], unknown = claims.fits(spec, classes(), slices(dgx), [])
    assert unknown == ['device.attributes["rdma.nicop.io"].numaNode > 0']
    assert node.total == {"nic": 8}


def test_status_counts_a_nodes_devices_of_the_newest_generation_and_those_held(
        dgx: SimulatedHost) -> None:
    """`nicop status` per node: devices per driver, an older generation of the pool ignored."""
    from nicop.status import dra_devices

    gpus, nics = roots(dgx)
    old = build_slices(dra.DRIVER, NODE, PoolContent([{"name": "pf-gone", "attributes": {}}]), 1)
    for s in old:
        s["metadata"]["name"] += "-old"
    newer = [s for s in slices(dgx) if s["spec"]["driver"] == dra.DRIVER]
    for s in newer:
        s["spec"]["pool"]["generation"] = 2
    gpu_slices = [s for s in slices(dgx) if s["spec"]["driver"] == gpu_dra.GPU_DRIVER]
    root = sorted(gpus)[0]
    snap = {"resourceSlices": [*old, *newer, *gpu_slices],
            "resourceClaims": [holding((gpu_dra.GPU_DRIVER, gpus[root]), (dra.DRIVER, nics[root]))]}
    assert dra_devices(snap, NODE) == [
        {"driver": gpu_dra.GPU_DRIVER, "devices": 8, "allocated": 1},
        {"driver": dra.DRIVER, "devices": 8, "allocated": 1}]
    assert dra_devices(snap, "node-2") == []


def test_the_deviceclasses_file_users_apply_is_the_drivers() -> None:
    """examples/dra/deviceclasses.yaml is what nicop.api.dra defines."""
    assert list(yaml.safe_load_all((EXAMPLES / "deviceclasses.yaml").read_text())) == \
        dra.device_classes()


def test_a_pf_whose_link_is_down_is_tainted_and_not_free_unless_tolerated(
        tmp_path: Path) -> None:
    """A taint (resource.k8s.io/v1 DeviceTaint, NoSchedule) keeps a request off the device, as
    the scheduler does; the reason names the device and its taint, and a
    request that tolerates it (DeviceToleration, operator Exists) may have it. (What the taint
    means is diagnose's to add: test_dra_deployed.)"""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    host.set_link("enp59s0f1np1", False)
    claim = {"devices": {"requests": [{"name": "r", "exactly": {
        "deviceClassName": dra.PF_CLASS, "count": 2}}]}}
    _, [node], _ = claims.fits(claim, classes(), slices(host), [])
    assert (node.free, node.total, node.fits) == ({"r": 1}, {"r": 2}, False)
    assert node.why == (
        f"r: 1 free of 2 {dra.PF_CLASS}, 2 wanted (pf-0000-3b-00-1 tainted "
        "rdma.nicop.io/link-down=enp59s0f1np1:NoSchedule)")
    claim["devices"]["requests"][0]["exactly"]["tolerations"] = [
        {"key": dra.TAINT_LINK_DOWN, "operator": "Exists", "effect": "NoSchedule"}]
    _, [node], _ = claims.fits(claim, classes(), slices(host), [])
    assert node.fits


def test_a_shared_port_is_free_until_its_pods_capacity_is_used_up(tmp_path: Path) -> None:
    """A shared port (allowMultipleAllocations) is free for as long as the claims holding it
    leave capacity for one more (their allocation results' consumedCapacity); then the reason
    says it is full and how much is taken."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    pool = node_pool(discovery.scan(host), host, shared=True)
    shared_slices = build_slices(dra.DRIVER, NODE, pool, 1)
    claim = {"devices": {"requests": [{"name": "r", "exactly": {
        "deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"pods": "1"}},
        "selectors": [{"cel": {"expression": (
            f'device.attributes["{dra.DRIVER}"].{dra.PCI_ADDRESS} == "0000:3b:00.0"')}}]}}]}}

    def holders(count: int) -> list[dict[str, Any]]:
        return [{"status": {"allocation": {"devices": {"results": [{
            "request": "r", "driver": dra.DRIVER, "pool": NODE, "device": "shared-0000-3b-00-0",
            "shareID": f"share-{i}", "consumedCapacity": {"pods": "1"}}]}}}}
            for i in range(count)]

    _, [node], _ = claims.fits(claim, classes(), shared_slices, holders(62))
    assert node.fits
    _, [node], _ = claims.fits(claim, classes(), shared_slices, holders(63))
    assert not node.fits
    assert node.why == (f"r: 0 free of 1 {dra.SHARED_CLASS}, 1 wanted (shared-0000-3b-00-0 "
                        "full, pods: 63 of 63 taken)")
