"""The devices a pod was given, asked of the kubelet's PodResources API.

A meta-plugin that attaches a pod to an SR-IOV network must know which VF the device plugin
handed the pod: the kubelet's `List` names every pod on the node with, per container, the
resource and device IDs it allocated. Containers are read in the kubelet's order, so the n-th
network asking for a resource gets the n-th device of it (as Multus hands them out).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from nicop.node.podresources import api_pb2 as pb
from nicop.node.podresources import api_pb2_grpc as pb_grpc

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""Where the kubelet serves the API, on the node."""


class PodResourcesError(Exception):
    """The kubelet could not be asked (not running, socket not mounted, API refused)."""


class PodResources:
    """A client of the kubelet's PodResourcesLister on a unix socket: a `devices` callable."""

    def __init__(self, socket: Path | str, timeout: float = 10.0) -> None:
        self.socket = str(socket)
        self.timeout = timeout

    def __call__(self, namespace: str, name: str) -> dict[str, list[str]]:
        return self.devices(namespace, name)

    def devices(self, namespace: str, name: str) -> dict[str, list[str]]:
        """Device IDs by resource name allocated to the pod, its containers' in order; empty
        when the kubelet knows of none (the pod asked for no device)."""
        try:
            with grpc.insecure_channel(f"unix://{self.socket}") as channel:
                stub = pb_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
                reply = stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise PodResourcesError(
                f"cannot list pod resources on {self.socket}: {e.code().name}: {e.details()}"
            ) from None
        out: dict[str, list[str]] = {}
        for pod in reply.pod_resources:
            if pod.namespace != namespace or pod.name != name:
                continue
            for container in pod.containers:
                for devices in container.devices:
                    out.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return out
