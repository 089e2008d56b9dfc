"""Whether the node's NIC driver is being (re)loaded, for the DRA plugin.

The operator keeps the label network.nvidia.com/operator.mofed.wait "true" on a Node while its
driver container is not Ready: the first install, an upgrade restarting it, a crash. The plugin
runs on through it (its DaemonSet does not wait for the driver, unlike the device plugins, whose
pods leave the node and take its devices with them): its NIC devices stay in the slice as last
seen with the driver up, tainted rdma.nicop.io/driver-not-ready (NoSchedule). Allocations keep
naming them and no new claim lands on a NIC that is going away; the taint goes once the label is
"false" again, with the devices as the driver then shows them.
"""

from __future__ import annotations

from nicop.api import dra
from nicop.api.labels import MOFED_WAIT_LABEL
from nicop.kube.client import ApiClient
from nicop.kube.informer import Informer
from nicop.kube.resources import NODE
from nicop.node.dra.publisher import PoolSource
from nicop.node.dra.slices import PoolContent


class DriverWatch:
    """The plugin's own Node, watched for mofed.wait (and its labels, which policies select
    nodes by)."""

    def __init__(self, client: ApiClient, node_name: str) -> None:
        self.node_name = node_name
        self.informer = Informer(client, NODE, field_selector=f"metadata.name={node_name}")

    async def run(self) -> None:
        await self.informer.run()

    @property
    def labels(self) -> dict[str, str]:
        node = self.informer.store.get(self.node_name)
        return dict((node or {}).get("metadata", {}).get("labels") or {})

    @property
    def reloading(self) -> bool:
        return self.labels.get(MOFED_WAIT_LABEL) == "true"


def held_while_reloading(source: PoolSource, watch: DriverWatch) -> PoolSource:
    """`source`, but while the driver reloads: the devices last read with it up, tainted."""
    last: PoolContent | None = None

    def read() -> PoolContent:
        nonlocal last
        content = source()
        if not watch.reloading:
            last = content
            return content
        return tainted(last if last is not None else content, {
            "key": dra.TAINT_DRIVER_NOT_READY, "value": watch.node_name,
            "effect": dra.TAINT_NO_SCHEDULE})

    return read


def tainted(content: PoolContent, taint: dict[str, str]) -> PoolContent:
    return PoolContent([{**d, "taints": [*(d.get("taints") or []), taint]}
                        for d in content.devices], content.counter_sets)
