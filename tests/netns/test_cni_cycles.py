"""Many pods on one node: repeated ADD/DEL, concurrent ADDs, a daemon killed in the middle."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tests.netns.cni_harness import (
    CniCall,
    DaemonProcess,
    Namespaces,
    Node,
    build_node,
    links,
    remove_node,
)

from nicop.api.agents import AGENT_MEMORY
from nicop.kube.resources import quantity

pytestmark = pytest.mark.netns


def sriov(node: Node, vf: int) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "sriov-net", "type": "sriov",
            "deviceID": node.vfs[vf].pci, "vlan": 10 + vf,
            "mac": f"02:00:00:00:01:{vf:02x}",
            "ipam": {"type": "nv-ipam", "poolName": "pool1"}}


def assert_node_clean(node: Node, pods: list[str]) -> None:
    """Every VF back under its name and MAC, pods empty, no cache file, no allocation."""
    on_node = links(node.netns)
    for vf in node.vfs:
        assert on_node[vf.netdev]["address"] == vf.mac, vf.netdev
    for pod in pods:
        assert list(links(pod)) == ["lo"], f"{pod} still has {list(links(pod))}"
    assert node.cache_files() == []
    assert node.allocations() == {}


def test_100_add_del_cycles_leave_nothing_behind(node: Node) -> None:
    """100 cycles over 4 workers (as many as `make test`'s time allows)."""
    workers, total = 4, 100
    pods = [node.pod() for _ in range(workers)]

    def cycles(worker: int) -> list[str]:
        failures = []
        for i in range(total // workers):
            cid = f"w{worker}c{i}"
            add = node.cni("sriov", "ADD", sriov(node, worker), netns=pods[worker],
                           container_id=cid, pod=f"pod-{cid}")
            if add.rc != 0:
                failures.append(f"ADD {cid}: {add.out}")
            delete = node.cni("sriov", "DEL", sriov(node, worker), netns=pods[worker],
                              container_id=cid, pod=f"pod-{cid}")
            if delete.rc != 0:
                failures.append(f"DEL {cid}: {delete.out}")
        return failures

    with ThreadPoolExecutor(workers) as pool:
        failures = [f for fs in pool.map(cycles, range(workers)) for f in fs]
    assert failures == []
    assert_node_clean(node, pods)
    calls = node.pf_calls()
    assert len([c for c in calls if c.startswith("LinkSetVfVlanQosProto")]) == 2 * total  # ADD, DEL


def test_50_concurrent_adds_get_50_addresses_and_50_vfs_within_the_daemons_memory_limit(
        node_without_daemon: Node, tmp_path: Path) -> None:
    """The CNI daemon's busiest moment, in its own process as on a node: 50 pods' ADDs at once
    (as many as the node has VFs). Each gets its VF and an address of its own, and the daemon's
    peak memory stays under the limit its DaemonSet sets (nicop.api.agents.AGENT_MEMORY)."""
    node = node_without_daemon
    daemon = DaemonProcess(node, tmp_path / "daemon.log")
    node.daemon = daemon
    daemon.start()
    pods = [node.pod() for _ in range(50)]

    def add(i: int) -> CniCall:
        return node.cni("sriov", "ADD", sriov(node, i), netns=pods[i], container_id=f"c{i}",
                        pod=f"pod{i}")

    with ThreadPoolExecutor(50) as pool:
        calls = list(pool.map(add, range(50)))
    assert [c.rc for c in calls] == [0] * 50, [c.out for c in calls if c.rc]
    ips = [c.out["ips"][0]["address"] for c in calls]
    assert len(set(ips)) == 50
    assert node.allocations() == {f"pool1/c{i}_net1": ips[i].split("/")[0] for i in range(50)}
    for i, pod in enumerate(pods):
        assert links(pod)["net1"]["address"] == f"02:00:00:00:01:{i:02x}"
    on_node = links(node.netns)
    assert [vf.netdev in on_node for vf in node.vfs] == [False] * 50
    assert daemon.proc is not None and daemon.proc.poll() is None
    limit = quantity(AGENT_MEMORY["cni-daemon"][1])
    peak = peak_rss(daemon.proc.pid)
    print(f"\ncni-daemon peak RSS after 50 concurrent ADDs: {peak / 2**20:.1f} MiB "
          f"(limit {limit / 2**20:.0f} MiB)")
    assert peak < limit

    def delete(i: int) -> CniCall:
        return node.cni("sriov", "DEL", sriov(node, i), netns=pods[i], container_id=f"c{i}",
                        pod=f"pod{i}")

    with ThreadPoolExecutor(50) as pool:
        assert [c.rc for c in pool.map(delete, range(50))] == [0] * 50
    assert_node_clean(node, pods)


def peak_rss(pid: int) -> int:
    """Bytes: the process's VmHWM."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


@pytest.fixture
def node_without_daemon(tmp_path: Path) -> Iterator[Node]:
    namespaces = Namespaces()
    node = None
    try:
        node = build_node(namespaces, vfs=50)
        yield node
    finally:
        if node is not None:
            remove_node(node)
        namespaces.close()


def test_a_daemon_killed_during_50_adds_loses_no_allocation(
    node_without_daemon: Node, tmp_path: Path
) -> None:
    node = node_without_daemon
    daemon = DaemonProcess(node, tmp_path / "daemon.log")
    node.daemon = daemon
    daemon.start()
    pods = [node.pod() for _ in range(50)]
    answered: dict[int, str] = {}
    attempts = [0] * 50

    def add_until_done(i: int) -> str:
        """As a runtime does: an ADD that failed is tried again until it succeeds."""
        while True:
            attempts[i] += 1
            call = node.cni("sriov", "ADD", sriov(node, i), netns=pods[i], container_id=f"c{i}",
                            pod=f"pod{i}")
            if call.rc == 0:
                answered[i] = call.out["ips"][0]["address"].split("/")[0]
                return answered[i]
            assert call.out["code"] == 11, call.out  # daemon gone: try again later
            assert attempts[i] < 100, call.out
            time.sleep(0.1)

    with ThreadPoolExecutor(50) as pool:
        futures = [pool.submit(add_until_done, i) for i in range(50)]
        while len(answered) < 10:
            time.sleep(0.01)
        before_kill = dict(answered)
        daemon.kill()
        time.sleep(0.3)
        daemon.start()
        ips = [f.result(timeout=120) for f in futures]

    assert any(a > 1 for a in attempts), "the kill interrupted some ADDs"
    assert len(set(ips)) == 50
    stored = node.allocations()
    assert stored == {f"pool1/c{i}_net1": ips[i] for i in range(50)}
    for i, ip in before_kill.items():
        assert stored[f"pool1/c{i}_net1"] == ip, "an address a pod was given before the kill"
    for i, pod in enumerate(pods):
        assert "net1" in links(pod), f"pod {i} has its VF"
    on_node = links(node.netns)
    assert not any(vf.netdev in on_node for vf in node.vfs), "every VF is in its pod"
    assert not any(name.startswith("nctmp") for name in on_node), "no VF left half-moved"

    for i in range(50):
        call = node.cni("sriov", "DEL", sriov(node, i), netns=pods[i], container_id=f"c{i}",
                        pod=f"pod{i}")
        assert call.rc == 0, call.out
    assert_node_clean(node, pods)
