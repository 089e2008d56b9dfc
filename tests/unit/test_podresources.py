"""The kubelet's PodResources API as nicop's multus asks it: a real gRPC server on a unix
socket answering List, as the kubelet does on /var/lib/kubelet/pod-resources/kubelet.sock."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from nicop.node.podresources import api_pb2 as pb
from nicop.node.podresources import api_pb2_grpc as pb_grpc
from nicop.node.podresources.client import PodResources, PodResourcesError


class Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.pods: list[pb.PodResources] = []

    def List(self, request: Any, context: Any) -> Any:
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


@pytest.fixture
def kubelet() -> Iterator[tuple[Lister, Path]]:
    folder = Path(tempfile.mkdtemp(prefix="podres-", dir="/tmp"))
    socket = folder / "kubelet.sock"
    lister = Lister()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    yield lister, socket
    server.stop(0)
    shutil.rmtree(folder)


def devices(resource: str, *ids: str) -> pb.ContainerDevices:
    return pb.ContainerDevices(resource_name=resource, device_ids=list(ids))


def test_the_devices_of_one_pod_by_resource_in_container_order(
        kubelet: tuple[Lister, Path]) -> None:
    lister, socket = kubelet
    lister.pods = [
        pb.PodResources(name="other", namespace="default", containers=[pb.ContainerResources(
            name="c", devices=[devices("nvidia.com/sriov_a", "0000:03:00.9")])]),
        pb.PodResources(name="trainer", namespace="ml", containers=[
            pb.ContainerResources(name="main", devices=[
                devices("nvidia.com/sriov_a", "0000:03:00.2", "0000:03:00.3"),
                devices("rdma/hca", "hca-1")]),
            pb.ContainerResources(name="side", devices=[
                devices("nvidia.com/sriov_a", "0000:03:00.4")]),
        ]),
    ]
    client = PodResources(socket)
    assert client("ml", "trainer") == {
        "nvidia.com/sriov_a": ["0000:03:00.2", "0000:03:00.3", "0000:03:00.4"],
        "rdma/hca": ["hca-1"]}
    assert client("ml", "gone") == {}
    # the method path is the kubelet's
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert [m.name for m in service.methods] == ["List", "GetAllocatableResources", "Get"]


def test_without_the_kubelet() -> None:
    client = PodResources("/tmp/no-such-dir/kubelet.sock", timeout=2)
    with pytest.raises(PodResourcesError, match=r"cannot list pod resources on "
                       r"/tmp/no-such-dir/kubelet\.sock: UNAVAILABLE"):
        client.devices("ml", "trainer")
