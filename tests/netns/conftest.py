"""Fixtures of the network-namespace tests: they need root (ip netns, veth pairs)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from tests.netns.cni_harness import Node, node_with_daemon


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="network namespace tests need root")
        for item in items:
            if "netns" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def node() -> Iterator[Node]:
    """A node with 8 VFs (veth pairs in its own namespace) and its cni-daemon running."""
    with node_with_daemon(vfs=8) as n:
        yield n
