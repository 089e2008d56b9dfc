"""A stand-in for the kubelet's device manager, for nodes that have no kubelet (kwok nodes, tests).

It does what the kubelet does with device plugins, over the same gRPC API on real unix sockets:
serves `Registration` on kubelet.sock, validates the version and the extended resource name,
dials the plugin's socket, asks for its options, then follows its ListAndWatch stream; `allocate`
calls GetPreferredAllocation, Allocate and PreStartContainer as the kubelet would for a container.
`restart` removes every socket in the directory, as a starting kubelet does. With a kubeconfig, it
writes each resource's device count to the node's status.capacity and its healthy count to
status.allocatable (a lost plugin keeps its capacity and drops to 0 allocatable, like the kubelet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import api_pb2_grpc as pb_grpc
from nicop.node.deviceplugin.server import HEALTHY, KUBELET_SOCKET, VERSION

log = logging.getLogger(__name__)

CHECKPOINT = "kubelet_internal_checkpoint"
DEVICES_ANNOTATION = "nicop.io/devices"
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def extended_resource_error(name: str) -> str | None:
    """Why the kubelet would refuse `name` as an extended resource name, or None."""
    if "/" not in name:
        return f"{name!r} has no domain prefix (expected <domain>/<name>)"
    prefix, _, short = name.partition("/")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or name.startswith(
            "requests."):
        return f"{name!r} is in a reserved namespace"
    if not (len(short) <= 63 and _NAME.match(short)):
        return (f"{short!r} must be at most 63 letters, digits, '-', '_' or '.', "
                "beginning and ending with a letter or digit")
    if len(prefix) > 253 or not all(_DNS_LABEL.match(p) for p in prefix.split(".")):
        return f"{prefix!r} is not a DNS subdomain"
    return None


@dataclass
class Resource:
    """What the kubelet knows of one registered resource."""

    name: str
    endpoint: str
    options: pb.DevicePluginOptions
    devices: dict[str, pb.Device] = field(default_factory=dict)
    connected: bool = False
    channel: aio.Channel | None = None
    watcher: asyncio.Task[None] | None = None

    @property
    def capacity(self) -> int:
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        if not self.connected:
            return 0
        return sum(d.health == HEALTHY for d in self.devices.values())


class Kubelet:
    """The device manager half of a kubelet, on `socket_dir` (.../device-plugins)."""

    def __init__(
        self,
        socket_dir: Path,
        node_name: str | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.socket_dir = socket_dir
        self.socket_path = socket_dir / KUBELET_SOCKET
        self.node_name = node_name
        self.kubeconfig = kubeconfig
        self.resources: dict[str, Resource] = {}
        self.on_update: Callable[[str, list[pb.Device]], None] | None = None
        self._server: aio.Server | None = None
        self._changed = asyncio.Condition()
        self._patcher: asyncio.Task[None] | None = None
        self._admitter: asyncio.Task[None] | None = None
        # resource -> device IDs held by pods of this node, pod uid -> what it holds
        self._in_use: dict[str, set[str]] = {}
        self._held: dict[str, list[tuple[str, list[str]]]] = {}
        self._dirty = asyncio.Event()
        self._patched: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Clean the directory of sockets (kubelet's CleanupPluginDirectory), then serve."""
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.socket_dir.iterdir():
            if entry.name != CHECKPOINT and stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
        server = aio.server()
        handler = grpc.method_handlers_generic_handler("v1beta1.Registration", {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register,
                request_deserializer=pb.RegisterRequest.FromString,
                response_serializer=pb.Empty.SerializeToString,
            ),
        })
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        if self.kubeconfig is not None and self._patcher is None:
            self._patcher = asyncio.create_task(self._patch_node_loop())
            self._admitter = asyncio.create_task(self._admit_pods_loop())
        log.info("kubelet: serving Registration on %s", self.socket_path)

    async def stop(self) -> None:
        """Stop serving and drop every plugin connection (their resources go unallocatable)."""
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None
        for res in self.resources.values():
            await self._disconnect(res)
        await self._notify()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def drop(self, resource: str) -> None:
        """Lose a plugin's ListAndWatch stream without a restart, as a kubelet can
        (kubernetes#125501): the resource stays, unallocatable, until the plugin registers again."""
        await self._disconnect(self.resources[resource])
        await self._notify()

    async def close(self) -> None:
        """Stop, and stop patching the node."""
        await self.stop()
        for task in (self._patcher, self._admitter):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._patcher = self._admitter = None

    # ------------------------------------------------------------------ what tests look at
    def capacity(self) -> dict[str, int]:
        return {n: r.capacity for n, r in self.resources.items()}

    def allocatable(self) -> dict[str, int]:
        return {n: r.allocatable for n, r in self.resources.items()}

    def health(self, resource: str) -> dict[str, str]:
        res = self.resources.get(resource)
        return {i: d.health for i, d in res.devices.items()} if res else {}

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until `predicate()` holds; it is re-checked at every plugin update."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout)

    async def allocate(self, resource: str, ids: list[str] | None = None,
                       count: int = 1) -> pb.ContainerAllocateResponse:
        """Allocate for one container like the kubelet: pick `count` healthy devices (asking the
        plugin for its preference when it offers one) unless `ids` are given."""
        res = self.resources[resource]
        if not res.connected or res.channel is None:
            raise RuntimeError(f"resource {resource} has no connected plugin")
        stub = pb_grpc.DevicePluginStub(res.channel)  # type: ignore[no-untyped-call]
        if ids is None:
            healthy = sorted(i for i, d in res.devices.items() if d.health == HEALTHY)
            if len(healthy) < count:
                raise RuntimeError(f"{resource}: {count} wanted, {len(healthy)} healthy")
            ids = healthy[:count]
            if res.options.get_preferred_allocation_available:
                preferred = await stub.GetPreferredAllocation(pb.PreferredAllocationRequest(
                    container_requests=[pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=healthy, allocation_size=count)]))
                ids = list(preferred.container_responses[0].deviceIDs) or ids
        response = await stub.Allocate(pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]))
        if res.options.pre_start_required:
            await stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids))
        return response.container_responses[0]  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ Registration
    async def _register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        problem = None
        if request.version != VERSION:
            problem = f"version {request.version!r} is not supported (supported: {VERSION})"
        else:
            problem = extended_resource_error(request.resource_name)
        if problem:
            log.warning("kubelet: refused registration of %s: %s", request.resource_name, problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        old = self.resources.get(request.resource_name)
        if old is not None:
            await self._disconnect(old)
        res = Resource(request.resource_name, request.endpoint, pb.DevicePluginOptions(),
                       devices=old.devices if old else {})
        res.channel = aio.insecure_channel(f"unix://{self.socket_dir / request.endpoint}")
        try:
            stub = pb_grpc.DevicePluginStub(res.channel)  # type: ignore[no-untyped-call]
            res.options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
        except aio.AioRpcError as e:
            await res.channel.close()
            await context.abort(grpc.StatusCode.UNKNOWN,
                                f"cannot reach plugin at {request.endpoint}: {e.details()}")
        self.resources[request.resource_name] = res
        res.connected = True
        res.watcher = asyncio.create_task(self._watch(res, stub))
        log.info("kubelet: registered %s at %s", res.name, res.endpoint)
        return pb.Empty()

    async def _watch(self, res: Resource, stub: Any) -> None:
        try:
            async for update in stub.ListAndWatch(pb.Empty()):
                res.devices = {d.ID: d for d in update.devices}
                if self.on_update is not None:
                    self.on_update(res.name, list(update.devices))
                await self._notify()
        except aio.AioRpcError as e:
            log.info("kubelet: ListAndWatch of %s ended: %s", res.name, e.code().name)
        res.connected = False
        await self._notify()

    async def _disconnect(self, res: Resource) -> None:
        res.connected = False
        if res.watcher is not None and res.watcher is not asyncio.current_task():
            res.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await res.watcher
        if res.channel is not None:
            await res.channel.close()
            res.channel = None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
        self._dirty.set()

    # ------------------------------------------------------------------ node status
    async def _patch_node_loop(self) -> None:
        """Keep the node's capacity and allocatable in step with the plugins (at most 10/s)."""
        from lightkube import AsyncClient, KubeConfig
        from lightkube.resources.core_v1 import Node
        from lightkube.types import PatchType

        assert self.kubeconfig is not None and self.node_name
        client = AsyncClient(config=KubeConfig.from_file(self.kubeconfig),
                             field_manager="nicop-kubelet")
        try:
            while True:
                await self._dirty.wait()
                self._dirty.clear()
                wanted = {n: (r.capacity, r.allocatable) for n, r in self.resources.items()}
                if wanted != self._patched:
                    body = {"status": {
                        "capacity": {n: str(c) for n, (c, _) in wanted.items()},
                        "allocatable": {n: str(a) for n, (_, a) in wanted.items()},
                    }}
                    try:
                        await client.patch(Node.Status, self.node_name, body,
                                           patch_type=PatchType.MERGE)
                        self._patched = wanted
                        log.info("kubelet: node %s allocatable %s", self.node_name,
                                 {n: a for n, (_, a) in wanted.items()})
                    except Exception as e:  # the API server may be restarting: retry
                        log.warning("kubelet: cannot patch node %s: %s", self.node_name, e)
                        self._dirty.set()
                        await asyncio.sleep(1.0)
                await asyncio.sleep(0.1)
        finally:
            await client.close()


    # ------------------------------------------------------------------ pods
    async def _admit_pods_loop(self) -> None:
        """Allocate devices to the pods bound to this node, as the kubelet does when it starts
        their containers, and record the result on the pod (annotation nicop.io/devices), since
        no container runtime exists to receive it."""
        from lightkube import AsyncClient, KubeConfig
        from lightkube.resources.core_v1 import Pod

        assert self.kubeconfig is not None and self.node_name
        client = AsyncClient(config=KubeConfig.from_file(self.kubeconfig),
                             field_manager="nicop-kubelet")
        try:
            while True:
                try:
                    async for event, pod in client.watch(
                        Pod, namespace="*", fields={"spec.nodeName": self.node_name}
                    ):
                        meta = pod.metadata
                        assert meta is not None and meta.uid is not None
                        if event == "DELETED" or meta.deletionTimestamp:
                            for resource, ids in self._held.pop(meta.uid, []):
                                self._in_use.get(resource, set()).difference_update(ids)
                        elif meta.uid not in self._held and not (
                                pod.status and pod.status.phase in ("Failed", "Succeeded")):
                            recorded = (meta.annotations or {}).get(DEVICES_ANNOTATION)
                            if recorded:  # allocated before a restart: hold it again
                                self._hold(meta.uid, json.loads(recorded))
                            else:
                                await self._admit(client, pod)
                except Exception as e:  # the API server may be restarting: watch again
                    log.warning("kubelet: pod watch on %s: %s", self.node_name, e)
                    await asyncio.sleep(1.0)
        finally:
            await client.close()

    def _hold(self, uid: str, record: dict[str, dict[str, Any]]) -> None:
        held = [(resource, list(entry.get("ids", [])))
                for container in record.values() for resource, entry in container.items()]
        for resource, ids in held:
            self._in_use.setdefault(resource, set()).update(ids)
        self._held[uid] = held

    @staticmethod
    async def _reject(client: Any, pod: Any, why: str) -> None:
        """Fail the pod as the kubelet does when a device plugin cannot allocate (a plugin that
        restarted between scheduling and start): its controller makes another, which the
        scheduler places once the node advertises the devices again."""
        from lightkube.resources.core_v1 import Pod

        try:
            await client.patch(Pod.Status, pod.metadata.name, namespace=pod.metadata.namespace,
                               obj={"status": {
                                   "phase": "Failed", "reason": "UnexpectedAdmissionError",
                                   "message": f"Allocate failed due to {why}, which is "
                                              "unexpected"}})
        except Exception as e:  # gone meanwhile, or the API server is restarting
            log.warning("kubelet: could not fail pod %s/%s: %s", pod.metadata.namespace,
                        pod.metadata.name, e)

    async def _admit(self, client: Any, pod: Any) -> None:
        from lightkube.resources.core_v1 import Pod

        meta = pod.metadata
        record: dict[str, dict[str, Any]] = {}
        held: list[tuple[str, list[str]]] = []
        for container in pod.spec.containers:
            wanted = {**((container.resources and container.resources.requests) or {}),
                      **((container.resources and container.resources.limits) or {})}
            for resource, amount in wanted.items():
                if resource not in self.resources:
                    continue
                in_use = self._in_use.setdefault(resource, set())
                free = sorted(i for i, d in self.resources[resource].devices.items()
                              if d.health == HEALTHY and i not in in_use)
                ids = free[: int(amount)]
                try:
                    if len(ids) < int(amount):
                        raise RuntimeError(f"{resource}: {amount} wanted, {len(free)} free")
                    answer = await self.allocate(resource, ids=ids)
                except (RuntimeError, grpc.RpcError) as e:
                    log.warning("kubelet: pod %s/%s: %s", meta.namespace, meta.name, e)
                    for taken_resource, taken in held:
                        self._in_use[taken_resource].difference_update(taken)
                    await self._reject(client, pod, str(e))
                    return
                in_use.update(ids)
                held.append((resource, ids))
                record.setdefault(container.name, {})[resource] = {
                    "ids": ids,
                    "devices": [d.host_path for d in answer.devices],
                    "env": dict(answer.envs),
                    "mounts": [m.host_path for m in answer.mounts],
                }
        if not record:
            return
        self._held[meta.uid] = held
        await client.patch(Pod, meta.name, namespace=meta.namespace,
                           obj={"metadata": {"annotations": {
                               DEVICES_ANNOTATION: json.dumps(record, sort_keys=True)}}})
        log.info("kubelet: allocated %s to pod %s/%s", sorted(
            {r for c in record.values() for r in c}), meta.namespace, meta.name)


async def serve(
    socket_dir: Path, stop: asyncio.Event, node_name: str | None = None,
    kubeconfig: Path | None = None,
) -> None:
    """Run a kubelet stand-in until `stop` is set (the `nicop sim-kubelet` command)."""
    kubelet = Kubelet(socket_dir, node_name, kubeconfig)
    await kubelet.start()
    try:
        await stop.wait()
    finally:
        await kubelet.close()
