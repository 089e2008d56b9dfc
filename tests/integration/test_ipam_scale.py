"""A pool whose first blocks are excluded, on a 1000-node cluster: every node gets a usable block.

The IPAM controller needs only Node objects (names and labels), so the nodes are created directly
through the API server; no kubelet or kwok plays them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from tests.eventually import eventually
from tests.integration.test_ipam_pools import IPPool, allocations, controller, create

__all__ = ["controller"]  # the fixture, used by name

NODES = 1000
LABEL = "nicop.test/ipam-scale"


@pytest.fixture
def many_nodes(client: Client, namespace: str) -> Iterator[list[str]]:
    names = [f"scale-{namespace}-{i:04d}" for i in range(NODES)]

    def make(name: str) -> None:
        client.create(Node(metadata=ObjectMeta(name=name, labels={LABEL: namespace})))

    def remove(name: str) -> None:
        with contextlib.suppress(ApiError):
            client.delete(Node, name)

    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, names))
        yield names
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(remove, names))


def test_an_exclusion_over_the_first_blocks_on_1000_nodes(
        client: Client, namespace: str, many_nodes: list[str], controller: Any) -> None:
    """10.0.0.1-10.0.3.255 excluded in a /16 of 32-address blocks: the first 31 blocks are
    excluded entirely and go to no node; the 1000 nodes, in name order, get the blocks from
    10.0.3.225 on (the 32nd block, only partly excluded), one each, none excluded."""
    began = time.monotonic()
    create(client, IPPool, "scale", namespace, {
        "subnet": "10.0.0.0/16", "perNodeBlockSize": 32, "gateway": "10.0.0.1",
        "exclusions": [{"startIP": "10.0.0.1", "endIP": "10.0.3.255"}],
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": LABEL, "operator": "In", "values": [namespace]}]}]}})

    def allocated() -> list[dict[str, Any]] | None:
        obj = client.get(IPPool, "scale", namespace=namespace)
        status = obj.get("status") or {}
        ok = any(c["type"] == "Allocated" and c["status"] == "True"
                 for c in status.get("conditions") or [])
        blocks = status.get("allocations") or []
        return blocks if ok and len(blocks) == NODES else None

    blocks = eventually(allocated, 120, "a block for each of the 1000 nodes")
    took = time.monotonic() - began
    first = int(ipaddress.ip_address("10.0.3.225"))
    assert [b["nodeName"] for b in blocks] == many_nodes
    assert [(b["startIP"], b["endIP"]) for b in blocks] == [
        (str(ipaddress.ip_address(first + 32 * i)), str(ipaddress.ip_address(first + 32 * i + 31)))
        for i in range(NODES)]
    assert allocations(client, IPPool, "scale", namespace) == blocks
    print(f"\n1000 nodes got their blocks {took:.1f} s after the pool was created")
