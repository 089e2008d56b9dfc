"""`nicop cni-daemon`: the node process that does the work of every CNI call.

It serves the sriov, ib-sriov, host-device and nv-ipam plugins on a root-only unix socket (the
shim's protocol and the call handling are nicop.cni.server's). With an API server the daemon also
follows the IPPools and CIDRPools of its node, frees addresses of pods that are gone, and
publishes per-pool usage on its Node (annotation `nicop.io/ipam-usage`) besides the
`nicop_ipam_*` metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from nicop.api.agents import CNI_SOCKET
from nicop.api.labels import IPAM_USAGE_ANNOTATION
from nicop.cni.cleaner import Cleaner
from nicop.cni.hostdevice import HostDevicePlugin
from nicop.cni.ipam import Ipam, NvIpamPlugin
from nicop.cni.netlink import Netns
from nicop.cni.plugin import NodeContext, Plugin
from nicop.cni.pools import FilePools, KubePools, PoolSource
from nicop.cni.rdma import NetlinkRdmaControl, RdmaControl
from nicop.cni.server import CniServer
from nicop.cni.sriov import IbSriovPlugin, SriovPlugin
from nicop.cni.state import KeyedLocks, sweep_temp
from nicop.cni.store import Store
from nicop.cni.vf import NetlinkVfControl, VfControl
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.manager import Manager
from nicop.kube.resources import NODE
from nicop.node.host import Host
from nicop.node.metrics import serve_metrics
from nicop.node.readiness import Readiness

log = logging.getLogger(__name__)

DEFAULT_SOCKET = CNI_SOCKET


@dataclass
class DaemonOptions:
    host_root: Path = Path("/")
    socket: str = DEFAULT_SOCKET
    """Path of the socket on the node (under the Host root)."""
    node_name: str = ""
    kubeconfig: Path | None = None
    use_api: bool = False
    """Follow pools in the API (in-cluster config unless `kubeconfig`)."""
    pools_namespace: str = "nvidia-network-operator"
    pools_file: Path | None = None
    host_netns: str | None = None
    """The namespace holding the node's devices; the daemon's own when unset."""
    vfs: VfControl | None = None
    """How VF settings reach the PF; netlink on the node's PFs when unset."""
    rdma: RdmaControl | None = None
    """How RDMA devices change namespace; RDMA netlink when unset."""
    cleaner_interval: float = 60.0
    cleaner_checks: int = 3
    health_port: int = 0
    """Port of /metrics, /healthz and /readyz on the pod's IP (nicop.node.metrics); 0: off."""
    workers: int = 32


class CniDaemon:
    """The plugins of one node behind one socket."""

    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.host = Host.in_container(options.host_root)
        self.host_ns = Netns(options.host_netns)
        self.client: ApiClient | None = None
        self.manager: Manager | None = None
        pools: PoolSource
        if options.use_api or options.kubeconfig:
            if not options.node_name:
                raise ValueError("--node-name is needed to find the node's blocks of the pools")
            self.client = ApiClient(options.kubeconfig)
            self.manager = Manager(self.client)
            pools = KubePools(self.manager, options.pools_namespace, options.node_name)
        else:
            pools = FilePools(options.pools_file or self.host.path("/etc/nicop/pools.json"))
        self.pools = pools
        self.store = Store(self.host)  # holding its lock, this is the node's only daemon
        for owned in ("sriov", "ib-sriov", "host-device", "nv-ipam"):
            sweep_temp(self.host, f"/var/lib/cni/{owned}")
        self.ipam = Ipam(self.store, pools)
        vfs = options.vfs or NetlinkVfControl(self.host_ns)
        rdma = options.rdma or NetlinkRdmaControl(self.host_ns)
        self.ctx = NodeContext(self.host, self.host_ns, vfs, self.ipam, KeyedLocks(), rdma)
        self.plugins: dict[str, Plugin] = {
            "sriov": SriovPlugin(self.ctx),
            "ib-sriov": IbSriovPlugin(self.ctx),
            "host-device": HostDevicePlugin(self.ctx),
            "nv-ipam": NvIpamPlugin(self.ipam),
        }
        self.server = CniServer(self.plugins, self.host.path(options.socket),
                                workers=options.workers, logger=log)
        self.cleaner = Cleaner(self.client, self.ipam, options.cleaner_interval,
                               options.cleaner_checks) if self.client else None

    @property
    def socket_path(self) -> Path:
        return self.server.socket_path

    def handle(self, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
        """Run one CNI call; returns the plugin's exit code and stdout."""
        return self.server.handle(plugin, env, stdin)

    async def start(self) -> None:
        """Listen on the socket (root only)."""
        await self.server.start()
        self.ipam.update_metrics()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; then close the socket (the file is removed). Ready once
        serving with the node's pools known."""
        tasks: list[asyncio.Task[None]] = []
        health = None
        readiness = Readiness()
        marker: asyncio.Task[None] | None = None
        try:
            if self.manager is not None:
                tasks.append(asyncio.create_task(self.manager.run()))
            await self.start()
            marker = asyncio.create_task(self._ready_when_synced(readiness))
            health = await serve_metrics(self.options.health_port)
            if self.cleaner is not None:
                tasks.append(asyncio.create_task(self.cleaner.run(stop)))
            if self.client is not None:
                tasks.append(asyncio.create_task(self._publish_usage(stop)))
            waiter = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is not waiter:
                    task.result()
        finally:
            readiness.clear()
            if marker is not None:
                marker.cancel()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if health is not None:
                health.close()
            await self.close()

    async def _ready_when_synced(self, readiness: Readiness) -> None:
        if isinstance(self.pools, KubePools):
            await self.pools.wait_synced()
        readiness.set(True)

    async def close(self) -> None:
        await self.server.close()
        self.store.close()
        self.host_ns.close()
        if self.client is not None:
            await self.client.close()

    async def _publish_usage(self, stop: asyncio.Event, every: float = 5.0) -> None:
        """Keep the node's usage annotation current (written only when it changes)."""
        assert self.client is not None
        last = None
        while not stop.is_set():
            usage = await asyncio.to_thread(self.ipam.usage)
            self.ipam.update_metrics(usage)  # pool sizes change as the node's blocks arrive
            text = json.dumps(usage, sort_keys=True, separators=(",", ":"))
            if text != last:
                try:
                    await self.client.patch(NODE, self.options.node_name, {
                        "metadata": {"annotations": {IPAM_USAGE_ANNOTATION: text}}})
                    last = text
                except ApiError as e:
                    log.warning("could not publish IPAM usage on node %s: %s",
                                self.options.node_name, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)


async def run(stop: asyncio.Event, options: DaemonOptions) -> None:
    daemon = CniDaemon(options)
    await daemon.run(stop)
