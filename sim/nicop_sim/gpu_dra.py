"""The simulated GPUs as the NVIDIA GPU DRA driver (k8s-dra-driver-gpu) publishes real ones:
driver `gpu.nvidia.com`, one device `gpu-<minor>` per GPU with its attributes, and the DeviceClass
`gpu.nvidia.com`.

No machine here has a GPU or that driver, yet claims that align a GPU and a NIC by
`resource.kubernetes.io/pcieRoot` need both drivers' slices; these stand in for the GPU side.
Values NVML would report (UUID, product) come from the simulated tree; versions are fixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nicop.api import dra
from nicop.node.dra.devices import pcie_root
from nicop.node.dra.slices import PoolContent, build_slices
from nicop_sim.hardware import PCI_DEVICES, SimulatedHost

GPU_DRIVER = "gpu.nvidia.com"
GPU_CLASS = GPU_DRIVER
# What NVML reports for an H100 and a GB300 (B300, sm_103; memory as NVIDIA's nvml-mock has it)
# on a current datacenter driver: device ID -> architecture, compute capability, MiB.
ARCHITECTURES = {"2330": ("Hopper", "9.0.0", 81559), "31c2": ("Blackwell", "10.3.0", 284672)}
DRIVER_VERSION, CUDA_DRIVER_VERSION = "570.133.20", "12.8.0"


def gpu_devices(host: SimulatedHost) -> list[dict[str, Any]]:
    """One device per GPU, in PCI order (NVML's index order), in the API's form."""
    devices = []
    for index, address in enumerate(host.gpus()):
        dev = f"{PCI_DEVICES}/{address}"
        device_id = (host.read(f"{dev}/device") or "").removeprefix("0x")
        architecture, compute, memory_mib = ARCHITECTURES.get(device_id, ("Hopper", "9.0.0", 0))
        attributes: dict[str, Any] = {
            "type": {"string": "gpu"},
            "uuid": {"string": host.read(f"{dev}/.sim/gpu_uuid") or ""},
            "index": {"int": index},
            "minor": {"int": index},
            "productName": {"string": host.read(f"{dev}/.sim/gpu_product") or ""},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": architecture},
            "cudaComputeCapability": {"version": compute},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
            dra.PCI_BUS_ID: {"string": address},
        }
        root = pcie_root(host, address)
        if root:  # the real driver leaves it out when it cannot resolve it
            attributes[dra.PCIE_ROOT] = {"string": root}
        device: dict[str, Any] = {"name": f"gpu-{index}", "attributes": attributes}
        if memory_mib:
            device["capacity"] = {"memory": {"value": f"{memory_mib}Mi"}}
        devices.append(device)
    return devices


def gpu_slices(
    host: SimulatedHost, node: str, generation: int = 1, owner: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The GPU driver's ResourceSlices of `node` (pool named after the node)."""
    return build_slices(GPU_DRIVER, node, PoolContent(gpu_devices(host)), generation, owner)


def gpu_device_class() -> dict[str, Any]:
    """The DeviceClass the GPU driver's Helm chart installs for whole GPUs."""
    return {
        "apiVersion": dra.RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": GPU_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{GPU_DRIVER}"'}}]},
    }
