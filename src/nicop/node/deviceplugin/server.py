"""A kubelet device plugin for one extended resource: the v1beta1 `DevicePlugin` gRPC service on
a unix socket in the kubelet's device plugin directory, registered with the kubelet and kept
registered.

The kubelet deletes every socket in that directory when it restarts and forgets plugins whose
ListAndWatch stream it lost; upstream plugins notice the first after up to 5 s and never the
second (their users' top complaint: resources drop to 0 after a kubelet restart). Each server here
checks every `poll_interval` that its socket is still there, that kubelet.sock is the one it
registered with, and that the kubelet is watching, and serves and registers again otherwise.
Each server keeps its resource's metrics (nicop.node.deviceplugin.metrics) current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from nicop.node.agent import RegistrationRejected
from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import api_pb2_grpc as pb_grpc
from nicop.node.deviceplugin import metrics
from nicop.node.pacing import Pacer
from nicop.node.readiness import Readiness

log = logging.getLogger(__name__)

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT = 5.0
# How long a registered plugin waits for the kubelet's ListAndWatch before registering again.
STREAM_GRACE = 5.0
MAX_SOCKET_PATH = 105  # what gRPC binds (measured; sun_path itself holds 107 and a NUL)


@dataclass(frozen=True)
class Device:
    """One device as the kubelet sees it: an ID (stable across restarts), health, NUMA node."""

    id: str
    healthy: bool = True
    numa_node: int | None = None

    def to_pb(self) -> pb.Device:
        device = pb.Device(ID=self.id, health=HEALTHY if self.healthy else UNHEALTHY)
        if self.numa_node is not None:
            device.topology.nodes.add(ID=self.numa_node)
        return device


Allocator = Callable[[Sequence[str]], pb.ContainerAllocateResponse]


class AllocationError(Exception):
    """The devices asked for cannot be given; the message is returned to the kubelet."""


class DevicePluginServer:
    """Serves one resource; `update()` sets its devices, `run()` serves until cancelled."""

    def __init__(
        self,
        resource_name: str,
        socket_dir: Path,
        socket_name: str,
        allocate: Allocator,
        *,
        preferred_allocation: bool = False,
        poll_interval: float = 0.5,
    ) -> None:
        self.resource_name = resource_name
        self.socket_dir = socket_dir
        self.socket_name = socket_name
        self.socket_path = socket_dir / socket_name
        self.kubelet_socket = socket_dir / KUBELET_SOCKET
        self.options = pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=preferred_allocation
        )
        self.poll_interval = poll_interval
        self.allocate = allocate
        self._devices: tuple[Device, ...] = ()
        self._changed = asyncio.Event()
        self._streams = 0
        self._server: aio.Server | None = None
        self._socket_id: tuple[int, int] | None = None
        self._kubelet_id: tuple[int, int] | None = None
        self._registered_at: float | None = None
        self._handed_out: set[str] = set()  # device IDs Allocate gave (releases are not told)
        self._waiting = False  # for a kubelet that does not answer; logged once
        metrics.REGISTERED.labels(resource_name).set(0)
        metrics.REGISTRATIONS.labels(resource_name)  # a series at 0 before the first one
        if len(str(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket path {self.socket_path} is {len(str(self.socket_path))} bytes, more "
                f"than gRPC binds ({MAX_SOCKET_PATH}); use a shorter resourceName or host root"
            )

    # ------------------------------------------------------------------ state
    @property
    def registered(self) -> bool:
        return self._registered_at is not None

    def _set_registered(self, at: float | None) -> None:
        self._registered_at = at
        metrics.REGISTERED.labels(self.resource_name).set(0 if at is None else 1)

    def _count_allocated(self) -> None:
        ids = {d.id for d in self._devices}
        metrics.ALLOCATED.labels(self.resource_name).set(len(self._handed_out & ids))

    def update(self, devices: Iterable[Device]) -> bool:
        """Set the device list; ListAndWatch streams send it when it differs. True if changed."""
        new = tuple(sorted(devices, key=lambda d: d.id))
        if new == self._devices:
            return False
        self._devices = new
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        healthy = sum(d.healthy for d in new)
        metrics.DEVICES.labels(self.resource_name).set(len(new))
        metrics.HEALTHY.labels(self.resource_name).set(healthy)
        self._count_allocated()
        log.info("%s: %d devices, %d healthy", self.resource_name, len(new), healthy,
                 extra={"resource": self.resource_name})
        return True

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve and stay registered until cancelled; removes the socket when done."""
        await self._listen()
        try:
            while True:
                await self.check()
                await asyncio.sleep(self.poll_interval)
        finally:
            self._set_registered(None)
            await self._close()

    async def check(self) -> None:
        """One round of the watchdog: re-listen and re-register when needed."""
        if _identity(self.socket_path) != self._socket_id:
            log.warning("%s: socket %s was removed (kubelet restart?); serving it again",
                        self.resource_name, self.socket_path,
                        extra={"resource": self.resource_name})
            await self._close()
            await self._listen()
            self._set_registered(None)
        kubelet = _identity(self.kubelet_socket)
        if kubelet is None or kubelet != self._kubelet_id:
            self._set_registered(None)
        now = asyncio.get_running_loop().time()
        if self._registered_at is not None and self._streams == 0 \
                and now - self._registered_at > STREAM_GRACE:
            log.warning("%s: the kubelet is not watching the device list; registering again",
                        self.resource_name, extra={"resource": self.resource_name})
            self._set_registered(None)
        if self._registered_at is None and kubelet is not None and await self._register():
            self._set_registered(now)
            self._kubelet_id = kubelet

    async def _listen(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self._socket_id = _identity(self.socket_path)
        log.info("%s: serving on %s", self.resource_name, self.socket_path,
                 extra={"resource": self.resource_name})

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        if self._socket_id is not None and _identity(self.socket_path) == self._socket_id:
            self.socket_path.unlink()
        self._socket_id = None

    async def _register(self) -> bool:
        request = pb.RegisterRequest(
            version=VERSION, endpoint=self.socket_name, resource_name=self.resource_name,
            options=self.options,
        )
        try:
            async with aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
                await stub.Register(request, timeout=REGISTER_TIMEOUT)
        except aio.AioRpcError as e:
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                if not self._waiting:
                    log.info("%s: kubelet at %s does not answer yet (%s); retrying",
                             self.resource_name, self.kubelet_socket, e.details(),
                             extra={"resource": self.resource_name})
                self._waiting = True
                return False
            raise RegistrationRejected(
                f"the kubelet rejected resource {self.resource_name}: {e.details()}"
            ) from None
        log.info("%s: registered with the kubelet", self.resource_name,
                 extra={"resource": self.resource_name})
        metrics.REGISTRATIONS.labels(self.resource_name).inc()
        self._waiting = False
        return True

    # ------------------------------------------------------------------ the gRPC service
    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: Any
    ) -> pb.DevicePluginOptions:
        return self.options

    async def ListAndWatch(
        self, request: pb.Empty, context: Any
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        self._streams += 1
        try:
            while True:
                changed = self._changed  # taken before the list: no update slips in between
                yield pb.ListAndWatchResponse(devices=[d.to_pb() for d in self._devices])
                await changed.wait()
        finally:
            self._streams -= 1

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        response = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            response.container_responses.add(deviceIDs=self.preferred(
                req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size))
        return response

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        start = time.perf_counter()
        response = pb.AllocateResponse()
        known = {d.id for d in self._devices}
        try:
            for req in request.container_requests:
                unknown = [i for i in req.devices_ids if i not in known]
                try:
                    if unknown:
                        raise AllocationError(f"unknown device(s) {', '.join(unknown)}")
                    response.container_responses.append(self.allocate(list(req.devices_ids)))
                except AllocationError as e:
                    log.error("%s: allocate %s failed: %s", self.resource_name,
                              ",".join(req.devices_ids), e,
                              extra={"resource": self.resource_name})
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"{self.resource_name}: {e}")
                self._handed_out.update(req.devices_ids)
        finally:
            metrics.ALLOCATE_SECONDS.labels(self.resource_name).observe(
                time.perf_counter() - start)
            self._count_allocated()
        return response

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()

    def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        """`must`, then devices on the NUMA node already chosen (or the best stocked one)."""
        numa = {d.id: d.numa_node for d in self._devices}
        chosen = list(must)
        rest = [i for i in available if i not in chosen]
        nodes = Counter(numa.get(i) for i in (chosen or rest))
        target = nodes.most_common(1)[0][0] if nodes else None
        rest.sort(key=lambda i: (numa.get(i) != target, i))
        return (chosen + rest)[:max(size, len(chosen))]


class ServerSet:
    """The servers of one agent, each running as a task; a rejected registration stops all."""

    def __init__(self) -> None:
        self.servers: dict[str, DevicePluginServer] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._failure: BaseException | None = None

    def start(self, server: DevicePluginServer) -> None:
        self.servers[server.resource_name] = server
        task = asyncio.create_task(server.run(), name=f"plugin {server.resource_name}")
        task.add_done_callback(self._done)
        self._tasks[server.resource_name] = task

    def _done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def stop(self, resource_name: str) -> None:
        self.servers.pop(resource_name, None)
        task = self._tasks.pop(resource_name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        metrics.forget(resource_name)

    async def stop_all(self) -> None:
        for name in list(self._tasks):
            await self.stop(name)


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file is at `path` now: inode numbers are reused, so the change time counts too."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


async def run_agent(
    servers: ServerSet, tick: Callable[[], Awaitable[object]], poll_interval: float,
    stop: asyncio.Event,
) -> None:
    """Call `tick` (rescan, update devices; it returns what it saw) until `stop` is set: every
    `poll_interval` while the host changes or a resource waits for the kubelet, less often while
    the host is at rest (nicop.node.pacing).

    A tick of a node with eight NICs and 64 VFs reads a few hundred small files. The agent is
    ready while the kubelet has every one of its resources registered.
    """
    readiness = Readiness()
    pacer = Pacer(poll_interval)
    try:
        while not stop.is_set():
            seen = await tick()
            servers.raise_failure()
            waiting = sorted(n for n, s in servers.servers.items() if not s.registered)
            readiness.set(not waiting, f"not registered with the kubelet: {', '.join(waiting)}")
            delay = pacer.after(seen if not waiting else None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll_interval if waiting else delay)
    finally:
        readiness.clear()
        await servers.stop_all()
