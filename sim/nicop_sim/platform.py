"""A simulated node as the machine nicop's agents work on (entry point `nicop.platforms: sim`,
chosen by NICOP_PLATFORM=sim, which only a simulated node sets for the agents it runs).

- `NICOP_SIM_ROOT`: the node's simulated hardware and kernel (a tree of `nicop_sim.hardware`);
  writes to its `sriov_numvfs` create VFs as the kernel would, the driver agent loads its
  modules into `nicop_sim.kernel`, the DRA driver also publishes its simulated GPUs.
- `NICOP_SIM_SCOPE`: `node` (unset: a stand-in node's agent, whose every path is in the tree)
  or `hardware` (a real node's container: only the tree's hardware and kernel paths are the
  tree's, `nicop_sim.hardware.HARDWARE_PATHS`; its mounts, /run and /var are the container's).
- `NICOP_PF_RECORDER`: where the PF side of its NICs keeps VF settings (`nicop_sim.pf`).
- `NICOP_SIM_BUILD_SECONDS`: a driver version is built from sources taking this long (0 or
  unset: it is precompiled).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nicop.platform import HostPlatform

if TYPE_CHECKING:  # imported where used: exec probes load this platform every few seconds
    from nicop.cni.rdma import RdmaControl
    from nicop.cni.vf import VfControl
    from nicop.node.dra.publisher import PoolSource
    from nicop.node.driver_backends import DriverBackend
    from nicop.node.host import Host

ROOT_ENV = "NICOP_SIM_ROOT"
PF_ENV = "NICOP_PF_RECORDER"
BUILD_ENV = "NICOP_SIM_BUILD_SECONDS"
SCOPE_ENV = "NICOP_SIM_SCOPE"


class SimulatedPlatform(HostPlatform):
    name = "sim"

    def __init__(self) -> None:
        root = os.environ.get(ROOT_ENV)
        self.root = Path(root) if root else None
        recorder = os.environ.get(PF_ENV)
        self.recorder = Path(recorder) if recorder else None
        self.build_seconds = float(os.environ.get(BUILD_ENV) or 0)
        self.hardware_only = os.environ.get(SCOPE_ENV) == "hardware"

    def host(self, host_root: Path) -> Host:
        from nicop_sim.hardware import SimulatedHost, hardware_mounts

        if self.root is None:
            return super().host(host_root)
        if self.hardware_only:
            return SimulatedHost(host_root, hardware_mounts(host_root, self.root))
        return SimulatedHost(self.root)

    def driver_backend(self, host: Host, version: str, **options: Any) -> DriverBackend:
        from nicop_sim.kernel import SimulatedBackend, SimulatedKernel

        return SimulatedBackend(SimulatedKernel(self.root or host.root),
                                precompiled=[] if self.build_seconds > 0 else [version],
                                build_seconds=self.build_seconds)

    def pf_controls(self) -> tuple[VfControl, RdmaControl] | None:
        from nicop_sim.pf import RecordingRdmaControl, RecordingVfControl

        if self.recorder is None:
            return None
        return RecordingVfControl(self.recorder), RecordingRdmaControl(self.recorder)

    def vf_vlan(self) -> Callable[[str, int], int | None] | None:
        from nicop_sim.pf import RecordingVfControl

        if self.recorder is None:
            return None
        recorder = RecordingVfControl(self.recorder)
        return lambda pf, vf: recorder.get(pf, vf).vlan

    def extra_dra_pools(self, host: Host) -> dict[str, PoolSource]:
        from nicop.node.dra.slices import PoolContent
        from nicop_sim import gpu_dra
        from nicop_sim.hardware import SimulatedHost

        if not isinstance(host, SimulatedHost):
            return {}
        return {gpu_dra.GPU_DRIVER: lambda: PoolContent(gpu_dra.gpu_devices(host))}
