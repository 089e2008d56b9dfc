"""The machine a node agent works on, in one seam: its filesystem, how a driver is installed
and loaded, how a VF is programmed through its PF.

On a node that is `HostPlatform`: the filesystem through the container's mounts, the distro's
package manager and modprobe, netlink on the PF. A distribution may bring another machine under
the entry point group `nicop.platforms` (nicop-sim brings the simulated ConnectX hardware and
kernel); `$NICOP_PLATFORM` names the one an agent uses, and nothing else selects it, so an
install of nicop alone always works on the node it runs on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nicop.cni.rdma import RdmaControl
    from nicop.cni.vf import VfControl
    from nicop.node.dra.publisher import PoolSource
    from nicop.node.driver_backends import DriverBackend
    from nicop.node.host import Host

PLATFORM_ENV = "NICOP_PLATFORM"
GROUP = "nicop.platforms"


class PlatformError(Exception):
    """The platform named in $NICOP_PLATFORM is not installed."""


class HostPlatform:
    """A real node."""

    name = "host"

    def host(self, host_root: Path) -> Host:
        from nicop.node.host import Host

        return Host.in_container(host_root)

    def driver_backend(self, host: Host, version: str, **options: Any) -> DriverBackend:
        """`options`: HostBackend's sources, inventory and nfsrdma."""
        from nicop.node import driver
        from nicop.node.driver_backends import HostBackend

        return HostBackend(driver.os_id(host), options["sources"], options["inventory"],
                           nfsrdma=options["nfsrdma"])

    def pf_controls(self) -> tuple[VfControl, RdmaControl] | None:
        """How VF settings and RDMA namespace moves reach the PF (None: netlink, as on a
        node)."""
        return None

    def vf_vlan(self) -> Callable[[str, int], int | None] | None:
        """How the SR-IOV config daemon reads a VF's VLAN back (None: it does not)."""
        return None

    def extra_dra_pools(self, host: Host) -> dict[str, PoolSource]:
        """DRA drivers besides nicop's whose devices this machine publishes (none on a node:
        the GPU operator publishes its GPUs)."""
        return {}


def current() -> HostPlatform:
    """The platform $NICOP_PLATFORM names ("host" when unset)."""
    name = os.environ.get(PLATFORM_ENV, HostPlatform.name)
    if name == HostPlatform.name:
        return HostPlatform()
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    if name not in found:
        raise PlatformError(
            f"${PLATFORM_ENV} is {name!r}, which is not installed (installed: "
            f"{', '.join([HostPlatform.name, *sorted(found)])}); unset it on a real node")
    platform: HostPlatform = found[name].load()()
    return platform
