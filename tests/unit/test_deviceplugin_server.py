"""A device plugin server against the kubelet stand-in, over real unix sockets."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin import server as server_module
from nicop.node.deviceplugin.server import (
    AllocationError,
    Device,
    DevicePluginServer,
    RegistrationRejected,
)
from nicop_sim.kubelet import Kubelet, extended_resource_error

RESOURCE = "example.com/nic"


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory: gRPC binds unix socket paths of at most 105 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path / "device-plugins"
    shutil.rmtree(path)


def allocate(ids: Sequence[str]) -> pb.ContainerAllocateResponse:
    if "bad" in ids:
        raise AllocationError("device bad is broken")
    return pb.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})


def plugin(sockdir: Path, name: str = RESOURCE) -> DevicePluginServer:
    server = DevicePluginServer(name, sockdir, "nic.sock", allocate, poll_interval=0.1)
    server.update([Device("a", numa_node=0), Device("b", numa_node=1), Device("bad")])
    return server


def scenario(sockdir: Path, body: Callable[[Kubelet, DevicePluginServer], Awaitable[None]],
             start_kubelet: bool = True) -> None:
    async def main() -> None:
        kubelet = Kubelet(sockdir)
        if start_kubelet:
            await kubelet.start()
        server = plugin(sockdir)
        task = asyncio.create_task(server.run())
        try:
            await body(kubelet, server)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await kubelet.close()
        assert not server.socket_path.exists()  # removed on the way out

    asyncio.run(main())


def test_registers_streams_changes_and_allocates(sockdir: Path) -> None:
    async def body(kubelet: Kubelet, server: DevicePluginServer) -> None:
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RESOURCE: 3})
        res = kubelet.resources[RESOURCE]
        assert res.endpoint == "nic.sock"
        assert [n.ID for n in res.devices["b"].topology.nodes] == [1]
        assert not res.devices["bad"].HasField("topology")

        server.update([Device("a"), Device("b", healthy=False)])
        await kubelet.wait_for(lambda: kubelet.health(RESOURCE) == {
            "a": "Healthy", "b": "Unhealthy"}, timeout=2)
        assert kubelet.capacity() == {RESOURCE: 2} and kubelet.allocatable() == {RESOURCE: 1}

        response = await kubelet.allocate(RESOURCE)
        assert response.envs == {"IDS": "a"}
        with pytest.raises(aio.AioRpcError) as unknown:
            await kubelet.allocate(RESOURCE, ["zzz"])
        assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown device(s) zzz" in (unknown.value.details() or "")

    scenario(sockdir, body)


def test_allocation_errors_reach_the_kubelet(sockdir: Path) -> None:
    async def body(kubelet: Kubelet, server: DevicePluginServer) -> None:
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RESOURCE: 3})
        with pytest.raises(aio.AioRpcError) as failed:
            await kubelet.allocate(RESOURCE, ["bad"])
        assert failed.value.details() == f"{RESOURCE}: device bad is broken"

    scenario(sockdir, body)


def test_kubelet_restart_is_followed_by_registration_within_2s(sockdir: Path) -> None:
    async def body(kubelet: Kubelet, server: DevicePluginServer) -> None:
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RESOURCE: 3})
        for _ in range(2):
            before = server.socket_path.stat()
            started = time.monotonic()
            await kubelet.restart()  # wipes every socket in the directory
            await kubelet.wait_for(lambda: kubelet.resources[RESOURCE].connected
                                   and kubelet.allocatable() == {RESOURCE: 3}, timeout=2)
            assert time.monotonic() - started < 2
            after = server.socket_path.stat()  # a new socket, not the old one
            assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)

    scenario(sockdir, body)


def test_plugin_waits_for_a_kubelet_that_starts_later(sockdir: Path) -> None:
    async def body(kubelet: Kubelet, server: DevicePluginServer) -> None:
        await asyncio.sleep(0.3)
        assert not server.registered
        await kubelet.start()
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RESOURCE: 3}, timeout=2)

    scenario(sockdir, body, start_kubelet=False)


def test_plugin_registers_again_when_the_kubelet_stops_watching(
    sockdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "STREAM_GRACE", 0.3)

    async def body(kubelet: Kubelet, server: DevicePluginServer) -> None:
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RESOURCE: 3})
        await kubelet.drop(RESOURCE)
        assert kubelet.allocatable() == {RESOURCE: 0} and kubelet.capacity() == {RESOURCE: 3}
        await kubelet.wait_for(lambda: kubelet.allocatable() == {RESOURCE: 3}, timeout=2)

    scenario(sockdir, body)


def test_a_refused_registration_stops_the_plugin_with_the_reason(sockdir: Path) -> None:
    async def main() -> None:
        kubelet = Kubelet(sockdir)
        await kubelet.start()
        server = plugin(sockdir, name="no-domain")
        try:
            with pytest.raises(RegistrationRejected, match="no domain prefix"):
                await asyncio.wait_for(server.run(), 5)
        finally:
            await kubelet.close()

    asyncio.run(main())


def test_preferred_allocation_keeps_a_container_on_one_numa_node(sockdir: Path) -> None:
    server = DevicePluginServer(RESOURCE, sockdir, "nic.sock", allocate)
    server.update([Device("a0", numa_node=0), Device("a1", numa_node=0),
                   Device("b0", numa_node=1), Device("b1", numa_node=1),
                   Device("b2", numa_node=1)])
    assert server.preferred(["a0", "a1", "b0", "b1", "b2"], [], 2) == ["b0", "b1"]
    assert server.preferred(["a0", "a1", "b0", "b1", "b2"], ["a1"], 2) == ["a1", "a0"]


def test_socket_path_must_fit_a_unix_socket() -> None:
    with pytest.raises(ValueError, match="shorter resourceName or host root"):
        DevicePluginServer(RESOURCE, Path("/" + "x" * 100), "nic.sock", allocate)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("rdma/hca_shared_devices_a", None),
        ("nvidia.com/sriov_rdma_vf", None),
        ("intel.com/sriov-net_0", None),
        ("hca", "no domain prefix"),
        ("kubernetes.io/nic", "reserved"),
        ("rdma/-hca", "beginning and ending"),
        ("Rdma/hca", "not a DNS subdomain"),
    ],
)
def test_kubelet_checks_extended_resource_names(name: str, problem: str | None) -> None:
    error = extended_resource_error(name)
    assert (error is None) if problem is None else (problem in (error or ""))
