"""A node's devices as ResourceSlices, and the writes that keep the API's slices in step."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from nicop.api import dra
from nicop.node.discovery import scan
from nicop.node.dra.devices import node_pool
from nicop.node.dra.slices import PoolContent, SlicePlan, build_slices, plan, slice_name
from nicop_sim.gpu_dra import GPU_DRIVER, gpu_slices
from nicop_sim.hardware import SimulatedHost

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def device(i: int, up: bool = True) -> dict[str, Any]:
    return {"name": f"vf-{i:04d}", "attributes": {"linkUp": {"bool": up}}}


class Api:
    """The slices in the API server, changed by a plan as the writes would change them."""

    def __init__(self) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.version = 0

    def apply(self, p: SlicePlan) -> None:
        for obj in [*p.create, *p.update]:
            self.version += 1
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = str(self.version)
            self.slices[obj["metadata"]["name"]] = stored
        for name in p.delete:
            del self.slices[name]

    def sync(self, devices: list[dict[str, Any]], node: str = "worker-1") -> SlicePlan:
        p = plan(dra.DRIVER, node, PoolContent(devices), list(self.slices.values()))
        self.apply(p)
        return p


def test_300_devices_make_three_slices_of_one_pool() -> None:
    devices = [device(i) for i in reversed(range(300))]
    slices = build_slices(dra.DRIVER, "worker-1", PoolContent(devices), generation=4)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert [s["metadata"]["name"] for s in slices] == [
        "rdma.nicop.io-worker-1-0", "rdma.nicop.io-worker-1-1", "rdma.nicop.io-worker-1-2"]
    for s in slices:
        assert (s["apiVersion"], s["kind"]) == ("resource.k8s.io/v1", "ResourceSlice")
        assert s["spec"]["driver"] == "rdma.nicop.io" and s["spec"]["nodeName"] == "worker-1"
        assert s["spec"]["pool"] == {"name": "worker-1", "generation": 4,
                                     "resourceSliceCount": 3}
    published = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert published == sorted(d["name"] for d in devices)  # the same order whatever the input
    assert build_slices(dra.DRIVER, "worker-1", PoolContent(devices[::-1]), 4) == slices


def test_a_node_without_devices_still_publishes_its_empty_pool() -> None:
    (only,) = build_slices(dra.DRIVER, "cpu-1", PoolContent([]), generation=1)
    assert only["spec"]["devices"] == [] and only["spec"]["pool"]["resourceSliceCount"] == 1


def test_counter_sets_come_first_in_slices_of_their_own_and_devices_that_consume_them_64_a_slice(
        tmp_path: Path) -> None:
    """A slice holds devices or counter sets, not both; at most 8 counter sets, and 64 devices
    when they consume counters (resource.k8s.io/v1 validation)."""
    host = SimulatedHost.build(tmp_path, "dgx")
    for pf in host.pfs():
        host.set_numvfs(pf, 8)
    pool = node_pool(scan(host), host)
    slices = build_slices(dra.DRIVER, "dgx-0", pool, 1)
    assert [(len(s["spec"].get("sharedCounters", [])), len(s["spec"].get("devices", [])))
            for s in slices] == [(8, 0), (0, 64), (0, 8)]
    assert all(s["spec"]["pool"]["resourceSliceCount"] == 3 for s in slices)
    sets = {c["name"] for c in slices[0]["spec"]["sharedCounters"]}
    assert {c["counterSet"] for s in slices[1:] for d in s["spec"]["devices"]
            for c in d["consumesCounters"]} == sets
    many = PoolContent([], [{"name": f"pf-{i}", "counters": {"vfs": {"value": "1"}}}
                            for i in range(9)])
    assert [len(s["spec"].get("sharedCounters", [])) for s in
            build_slices(dra.DRIVER, "n", many, 1)] == [8, 1]


def test_the_generation_moves_only_when_the_devices_change() -> None:
    api = Api()
    devices = [device(i) for i in range(200)]
    first = api.sync(devices)
    assert (first.generation, len(first.create), first.update, first.delete) == (1, 2, [], [])
    again = api.sync(devices)
    assert again.noop and again.generation == 1

    devices[5] = device(5, up=False)  # one attribute changed: both slices carry the new gen
    changed = api.sync(devices)
    assert changed.generation == 2 and changed.create == [] and len(changed.update) == 2
    assert all(u["metadata"]["resourceVersion"] for u in changed.update)
    assert {s["spec"]["pool"]["generation"] for s in api.slices.values()} == {2}

    shrunk = api.sync(devices[:100])  # fits one slice now: the second goes
    assert shrunk.generation == 3 and shrunk.delete == ["rdma.nicop.io-worker-1-1"]
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in api.slices.values()] == [1]
    assert api.sync(devices[:100]).noop


def test_a_taint_keeps_the_api_servers_time_and_an_unchanged_one_writes_nothing() -> None:
    """The API server sets timeAdded on a taint that arrives without one (resource.k8s.io/v1
    DeviceTaint): the next plan neither rewrites the slice for it nor drops it."""
    api = Api()
    devices = [device(i) for i in range(3)]
    devices[1]["taints"] = [{"key": "rdma.nicop.io/link-down", "value": "ibp64s0",
                             "effect": "NoSchedule"}]
    api.sync(devices)
    stored = api.slices["rdma.nicop.io-worker-1-0"]["spec"]["devices"][1]
    stored["taints"][0]["timeAdded"] = "2026-12-05T07:40:00Z"  # as the API server does
    assert api.sync(devices).noop
    devices[2] = {**devices[2], "taints": [{"key": "rdma.nicop.io/link-down", "value": "x",
                                            "effect": "NoSchedule"}]}
    changed = api.sync(devices)
    [written] = changed.update
    assert written["spec"]["devices"][1]["taints"][0]["timeAdded"] == "2026-12-05T07:40:00Z"
    assert "timeAdded" not in written["spec"]["devices"][2]["taints"][0]


def test_a_deleted_slice_comes_back_in_its_generation_an_edited_one_gets_a_new_one() -> None:
    api = Api()
    devices = [device(i) for i in range(300)]
    api.sync(devices)
    del api.slices["rdma.nicop.io-worker-1-1"]
    repaired = api.sync(devices)  # what is left is still right: no mix of old and new
    assert repaired.generation == 1 and repaired.update == repaired.delete == []
    assert [c["metadata"]["name"] for c in repaired.create] == ["rdma.nicop.io-worker-1-1"]

    api.slices["rdma.nicop.io-worker-1-2"]["spec"]["devices"].pop()
    fixed = api.sync(devices)  # a slice of the pool is wrong: the whole pool moves on
    assert fixed.generation == 2 and len(fixed.update) == 3 and fixed.create == []
    assert api.sync(devices).noop


def test_other_drivers_and_nodes_slices_are_left_alone() -> None:
    api = Api()
    api.slices["gpu"] = build_slices(GPU_DRIVER, "worker-1", PoolContent([device(1)]), 9)[0]
    api.slices["other-node"] = build_slices(dra.DRIVER, "worker-2", PoolContent([device(1)]), 9)[0]
    p = api.sync([device(1)])
    assert p.generation == 1 and p.delete == [] and len(p.create) == 1
    assert set(api.slices) == {"gpu", "other-node", "rdma.nicop.io-worker-1-0"}


def test_slices_are_owned_by_the_node_and_named_within_the_limits() -> None:
    node = {"metadata": {"name": "worker-1", "uid": "1234"}}
    (s,) = build_slices(dra.DRIVER, "worker-1", PoolContent([device(1)]), 1, owner=node)
    assert s["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": "1234",
         "controller": True}]
    long_node = "n" * 240 + ".example.com"
    names = {slice_name(dra.DRIVER, long_node, i) for i in range(3)}
    assert len(names) == 3
    assert all(len(n) <= 253 and DNS_SUBDOMAIN.fullmatch(n) for n in names)
    assert slice_name(dra.DRIVER, long_node, 0) != slice_name(dra.DRIVER, long_node[:-1] + "x", 0)


def test_a_dgx_nodes_nic_and_gpu_slices(tmp_path: Path) -> None:
    host = SimulatedHost.build(tmp_path, "dgx")
    nics = plan(dra.DRIVER, "dgx-0", node_pool(scan(host), host), [])
    (nic_slice,) = nics.create
    (gpu_slice,) = gpu_slices(host, "dgx-0")
    assert gpu_slice["spec"]["driver"] == "gpu.nvidia.com"
    assert gpu_slice["spec"]["pool"] == {"name": "dgx-0", "generation": 1,
                                         "resourceSliceCount": 1}
    assert gpu_slice["metadata"]["name"] == "gpu.nvidia.com-dgx-0-0"

    def roots(s: dict[str, Any]) -> list[str]:
        return sorted(d["attributes"][dra.PCIE_ROOT]["string"] for d in s["spec"]["devices"])

    assert roots(nic_slice) == roots(gpu_slice) and len(set(roots(nic_slice))) == 8


def test_while_the_driver_reloads_the_devices_last_seen_stay_published_tainted() -> None:
    """The driver unloaded takes the RDMA devices (and VFs) out of a scan; the plugin keeps
    publishing what it saw with the driver up, each device tainted driver-not-ready, and the
    scan again once the driver is back."""
    from nicop.node.dra.driver_state import held_while_reloading

    class Watch:  # what DriverWatch reads from the node's mofed.wait label
        node_name = "node-1"
        reloading = False

    scans = iter([[device(1), device(2)], [device(1)], [], [device(3)]])
    watch = Watch()
    read = held_while_reloading(lambda: PoolContent(next(scans)), watch)
    assert read() == PoolContent([device(1), device(2)])
    watch.reloading = True
    taint = {"key": "rdma.nicop.io/driver-not-ready", "value": "node-1", "effect": "NoSchedule"}
    for _ in range(2):  # the scan loses devices while the driver is down: the last ones stay
        held = read()
        assert [d["name"] for d in held.devices] == ["vf-0001", "vf-0002"]
        assert all(d["taints"] == [taint] for d in held.devices)
    watch.reloading = False
    assert read() == PoolContent([device(3)])
