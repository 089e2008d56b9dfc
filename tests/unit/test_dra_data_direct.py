"""GPU-NIC alignment on a GB300-like node, whose ConnectX-8s reach their GPUs through a Data
Direct function behind the GPU's PCIe root: the root nicop publishes for a NIC is that
function's, and the NIC's own root would have paired it with no GPU."""

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
from nicop.node.dra import data_direct
from nicop.node.dra.devices import node_devices, node_pool, pcie_root
from nicop.node.dra.slices import PoolContent, build_slices
from nicop_sim import gpu_dra
from nicop_sim.hardware import SimulatedHost

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "dra"
NODE = "node-1"
PAIRS = 4


@pytest.fixture(scope="module")
def gb300() -> Iterator[SimulatedHost]:
    root = Path(tempfile.mkdtemp(prefix="gb300-", dir="/tmp"))
    yield SimulatedHost.build(root, "gb300", seed=1)
    shutil.rmtree(root)


def string(device: dict[str, Any], name: str) -> str | None:
    value = device["attributes"].get(name)
    return value["string"] if value else None


def nics(host: SimulatedHost) -> list[dict[str, Any]]:
    return [d.to_api() for d in node_devices(discovery.scan(host), host)]


def gpu_and_nic() -> dict[str, Any]:
    """The claim of examples/dra/gpu-and-nic.yaml: a GPU and a NIC matching on pcieRoot."""
    doc = next(yaml.safe_load_all((EXAMPLES / "gpu-and-nic.yaml").read_text()))
    return dict(doc["spec"]["spec"])


def classes() -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in [*dra.device_classes(),
                                              gpu_dra.gpu_device_class()]}


def slices(host: SimulatedHost, nic_devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pool = node_pool(discovery.scan(host), host)
    return [*build_slices(dra.DRIVER, NODE, PoolContent(nic_devices, pool.counter_sets), 1),
            *build_slices(gpu_dra.GPU_DRIVER, NODE, PoolContent(gpu_dra.gpu_devices(host)), 1)]


def test_each_of_the_four_nics_publishes_the_root_of_its_gpu_not_its_own(
        gb300: SimulatedHost) -> None:
    published = nics(gb300)
    gpu_roots = {string(g, dra.PCIE_ROOT): g for g in gpu_dra.gpu_devices(gb300)}
    assert len(published) == len(gpu_roots) == PAIRS
    for nic in published:
        address = string(nic, dra.PCI_ADDRESS)
        assert address is not None
        own = pcie_root(gb300, address)
        direct = string(nic, dra.DATA_DIRECT)
        assert direct is not None
        gpu = gpu_roots[string(nic, dra.PCIE_ROOT)]  # one GPU shares the published root ...
        assert string(nic, dra.PCIE_ROOT) == pcie_root(gb300, direct)
        assert own not in gpu_roots  # ... and none the NIC's own
        assert string(nic, dra.NIC_PCIE_ROOT) == own
        # The Data Direct function, the GPU and the NIC are on one NUMA node.
        for other in (direct, string(gpu, dra.PCI_BUS_ID)):
            assert gb300.read(f"/sys/bus/pci/devices/{other}/numa_node") == str(
                nic["attributes"][dra.NUMA_NODE]["int"])
    assert len({string(n, dra.PCIE_ROOT) for n in published}) == PAIRS


def test_the_scheduler_pairs_all_four_only_by_the_data_direct_root(
        gb300: SimulatedHost) -> None:
    """With the published slices, a GPU-and-NIC claim fits 4 times over, each pair on its own
    root; with the NICs' own roots in their place (what a driver reading the PF's path
    publishes), it never fits."""
    published = nics(gb300)
    taken: list[dict[str, Any]] = []
    gpus = {string(g, dra.PCIE_ROOT): g["name"] for g in gpu_dra.gpu_devices(gb300)}
    for nic in published:
        _, [node], _ = claims.fits(gpu_and_nic(), classes(), slices(gb300, published), taken)
        assert node.fits, node.why
        taken.append({"status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": gpu_dra.GPU_DRIVER, "pool": NODE,
             "device": gpus[string(nic, dra.PCIE_ROOT)]},
            {"request": "nic", "driver": dra.DRIVER, "pool": NODE, "device": nic["name"]}]}}}})
    _, [node], _ = claims.fits(gpu_and_nic(), classes(), slices(gb300, published), taken)
    assert not node.fits

    own_roots = [{**nic, "attributes": {
        **nic["attributes"], dra.PCIE_ROOT: nic["attributes"][dra.NIC_PCIE_ROOT]}}
        for nic in published]
    _, [node], _ = claims.fits(gpu_and_nic(), classes(), slices(gb300, own_roots), [])
    assert node.free == {"gpu": PAIRS, "nic": PAIRS}
    assert not node.fits
    assert node.why == f"no {dra.PCIE_ROOT} value has free devices for all of gpu, nic"


def test_a_nic_without_a_data_direct_function_keeps_its_own_root(tmp_path: Path) -> None:
    """The DGX's ConnectX-7s: their own root, no Data Direct attributes (and no VPD read)."""
    host = SimulatedHost.build(tmp_path, "dgx")
    for nic in nics(host):
        address = string(nic, dra.PCI_ADDRESS)
        assert address is not None
        assert string(nic, dra.PCIE_ROOT) == pcie_root(host, address)
        assert dra.DATA_DIRECT not in nic["attributes"]
        assert dra.NIC_PCIE_ROOT not in nic["attributes"]


def test_a_pf_whose_v3_two_data_direct_functions_carry_gets_neither(tmp_path: Path) -> None:
    """Two Data Direct functions with the PF's V3 cannot both be its: nicop does not guess."""
    host = SimulatedHost.build(tmp_path, "gb300")
    first, second = "0000:03:00.0", "0002:03:00.0"
    vpd = host.path(f"/sys/bus/pci/devices/{first}/vpd").read_bytes()
    host.path("/sys/bus/pci/devices/0009:03:00.0/vpd").write_bytes(vpd)
    by_address = {string(n, dra.PCI_ADDRESS): n for n in nics(host)}
    assert string(by_address[first], dra.PCIE_ROOT) == "pci0000:00"
    assert dra.DATA_DIRECT not in by_address[first]["attributes"]
    # The second NIC lost its function to the ambiguity too; the other two keep theirs.
    assert dra.DATA_DIRECT not in by_address[second]["attributes"]
    assert string(by_address["0010:03:00.0"], dra.DATA_DIRECT) == "0018:03:00.0"


def test_vpd_read_only_keywords_are_read_as_the_pci_format_lays_them_out() -> None:
    vpd = (b"\x82\x0a\x00ConnectX-8"  # identifier string
           b"\x90\x11\x00SN\x03MT1V3\x04abcdRV\x01\x00"  # read-only: SN, V3, checksum
           b"\x91\x05\x00V1\x02xy"  # read-write: not read
           b"\x78")
    assert data_direct.read_only_keywords(vpd) == {"SN": b"MT1", "V3": b"abcd", "RV": b"\x00"}
    assert data_direct.read_only_keywords(b"\x90\xff\xff") == {}  # cut short: nothing
