"""`nicop cni-daemon`: the node process that does the work of every CNI call.

The shim sends `CNI1\\0<plugin>\\0CNI_X=..\\0...\\0\\0<stdin>` over a root-only unix socket and
reads back `<exit code>\\n<stdout>`. Each call runs on a worker thread (netlink and file work
block), so calls for different pods proceed in parallel; the plugins serialize what must not
interleave (one device, one pool). With an API server the daemon also follows the IPPools and
CIDRPools of its node, frees addresses of pods that are gone, and publishes per-pool usage on
its Node (annotation `nicop.io/ipam-usage`) besides the `nicop_ipam_*` metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Counter, Histogram

from nicop.api.labels import IPAM_USAGE_ANNOTATION
from nicop.cni.cleaner import Cleaner
from nicop.cni.hostdevice import HostDevicePlugin
from nicop.cni.ipam import Ipam, NvIpamPlugin
from nicop.cni.netlink import Netns
from nicop.cni.plugin import NodeContext, Plugin
from nicop.cni.pools import FilePools, KubePools, PoolSource
from nicop.cni.rdma import NetlinkRdmaControl, RdmaControl
from nicop.cni.spec import (
    LATEST,
    SUPPORTED_VERSIONS,
    CniError,
    Code,
    parse_request,
    render_result,
    version_reply,
)
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

DEFAULT_SOCKET = "/run/nicop/cni.sock"
MAGIC = b"CNI1"

REQUESTS = Counter("nicop_cni_requests_total", "CNI calls by plugin, command and result",
                   ["plugin", "command", "result"])
SECONDS = Histogram("nicop_cni_request_seconds", "CNI call duration in the daemon, by plugin, "
                    "command and result (ok or error)", ["plugin", "command", "result"],
                    buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))


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


def _version_of(stdin: bytes) -> str:
    try:
        version = json.loads(stdin).get("cniVersion")
    except (ValueError, AttributeError):
        return LATEST
    return version if version in SUPPORTED_VERSIONS else LATEST


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
        self.executor = ThreadPoolExecutor(options.workers, thread_name_prefix="cni")
        self.socket_path = self.host.path(options.socket)
        self.server: asyncio.Server | None = None
        self.cleaner = Cleaner(self.client, self.ipam, options.cleaner_interval,
                               options.cleaner_checks) if self.client else None

    # ------------------------------------------------------------------ one call
    def handle(self, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
        """Run one CNI call; returns the plugin's exit code and stdout."""
        start = time.perf_counter()
        command = env.get("CNI_COMMAND", "")
        version = _version_of(stdin)
        out: object = None
        try:
            req = parse_request(plugin, env, stdin)
            if req.command == "VERSION":
                out = version_reply(req.config)
            else:
                impl = self.plugins.get(plugin)
                if impl is None:
                    raise CniError(Code.INTERNAL, f"nicop cni-daemon has no plugin {plugin!r}",
                                   f"it serves {', '.join(sorted(self.plugins))}")
                if req.command == "ADD":
                    out = render_result(impl.add(req), req.version)
                elif req.command == "DEL":
                    impl.delete(req)
                elif req.command == "CHECK":
                    impl.check(req)
                elif req.command == "STATUS":
                    impl.status(req)
                elif req.command == "GC":
                    impl.gc(req)
            rc, result = 0, "ok"
        except CniError as e:
            out, rc, result = e.to_json(version), 1, f"error {e.code}"
        except Exception as e:
            log.exception("%s %s failed", plugin, command)
            err = CniError(Code.INTERNAL, f"{plugin} {command}: {type(e).__name__}: {e}")
            out, rc, result = err.to_json(version), 1, "error 999"
        elapsed = time.perf_counter() - start
        outcome = "ok" if rc == 0 else "error"
        REQUESTS.labels(plugin, command, outcome).inc()
        SECONDS.labels(plugin, command, outcome).observe(elapsed)
        log.info("%s %s %s/%s netns %s: %s in %.1f ms", plugin, command,
                 env.get("CNI_CONTAINERID", "-"), env.get("CNI_IFNAME", "-"),
                 env.get("CNI_NETNS") or "-", result if rc == 0 else json.dumps(out),
                 elapsed * 1000)
        body = json.dumps(out).encode() + b"\n" if out is not None else b""
        return rc, body

    # ------------------------------------------------------------------ socket
    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid not in (0, os.getuid()):
                log.warning("refused a CNI call from uid %d", uid)
                return
            data = await reader.read()
            header, sep, stdin = data.partition(b"\0\0")
            fields = header.split(b"\0")
            if not sep or len(fields) < 2 or fields[0] != MAGIC:
                writer.write(b"1\n" + json.dumps(CniError(
                    Code.INTERNAL, "nicop cni-daemon got a request it cannot read",
                    "the plugin binaries and the daemon are from different versions; rerun "
                    "nicop cni-install").to_json(LATEST)).encode() + b"\n")
                return
            plugin = fields[1].decode()
            env = dict(f.decode().partition("=")[::2] for f in fields[2:])
            loop = asyncio.get_running_loop()
            rc, out = await loop.run_in_executor(self.executor, self.handle, plugin, env, stdin)
            writer.write(f"{rc}\n".encode() + out)
            await writer.drain()
        except (ConnectionError, OSError) as e:
            log.warning("CNI connection broke: %s", e)
        finally:
            writer.close()

    async def start(self) -> None:
        """Listen on the socket (root only) and start following the API when configured."""
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        old_umask = os.umask(0o177)
        try:
            self.server = await asyncio.start_unix_server(self._connection, path=str(path),
                                                          backlog=512)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        self.ipam.update_metrics()
        log.info("serving CNI calls on %s", path)

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
            health = await serve_metrics(self.options.health_port,
                                         ready=lambda: self.server is not None)
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
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self.executor.shutdown(wait=True)
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
