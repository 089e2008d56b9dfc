"""How SriovNetworkNodePolicies become a node's SriovNetworkNodeState spec and device plugin
config, and which policies are refused (upstream's webhook rules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from nicop.node.sriov_daemon import discover
from nicop.operator.sriov import (
    NodePolicy,
    device_plugin_config,
    judge,
    node_state_spec,
    read_policies,
)
from nicop_sim.hardware import SimulatedHost

ROOT = Path(__file__).resolve().parents[2]
PF0, PF1 = "enp59s0f0np0", "enp59s0f1np1"  # the two ports of the cx6dx profile
NODE = {"metadata": {"name": "node-2", "labels": {"sriov": "yes", "kubernetes.io/os": "linux"}}}


def policy(name: str, numvfs: int = 8, priority: int = 99, created: str = "2025-01-01T00:00:00Z",
           **spec: Any) -> dict[str, Any]:
    nic = spec.pop("nicSelector", {"pfNames": [PF0]})
    return {"metadata": {"name": name, "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"resourceName": spec.pop("resourceName", name.replace("-", "_")),
                     "nodeSelector": {"sriov": "yes"}, "numVfs": numvfs, "priority": priority,
                     "deviceType": "netdevice", "nicSelector": nic, **spec}}


def read(*objs: dict[str, Any]) -> list[NodePolicy]:
    """The policies as the controller reads them (each one readable)."""
    policies, refused = read_policies(objs)
    assert not refused
    return policies


def refusals(objs: list[dict[str, Any]], nodes: list[dict[str, Any]],
             nics: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[str, str]]:
    """What the controller refuses, and why: unreadable policies and failed checks."""
    return judge(read_policies(objs), nodes, nics)[1]


def found(tmp_path: Path, numvfs: int = 0) -> list[dict[str, Any]]:
    """What a config daemon reports for a ConnectX-6 Dx node."""
    host = SimulatedHost.build(tmp_path, "cx6dx")
    if numvfs:
        host.set_numvfs(PF0, numvfs)
    return discover(host)


def test_one_policy_configures_the_selected_pf(tmp_path: Path) -> None:
    spec = node_state_spec(read(policy("cx6dx-vf", mtu=9000, isRdma=True)), NODE, found(tmp_path))
    assert spec == {"interfaces": [{
        "pciAddress": "0000:3b:00.0", "numVfs": 8, "mtu": 9000, "name": PF0,
        "vfGroups": [{"resourceName": "cx6dx_vf", "deviceType": "netdevice", "vfRange": "0-7",
                      "policyName": "cx6dx-vf", "mtu": 9000, "isRdma": True}],
    }]}


def test_a_policy_for_other_nodes_or_nics_configures_nothing(tmp_path: Path) -> None:
    other_node = policy("a", nodeSelector={"sriov": "no"})
    intel = policy("b", nicSelector={"vendor": "8086"})
    assert node_state_spec(read(other_node, intel), NODE, found(tmp_path)) == {"interfaces": []}


def test_vf_ranges_of_one_pf_become_separate_groups(tmp_path: Path) -> None:
    a = policy("split-a", nicSelector={"pfNames": [f"{PF0}#0-3"]})
    b = policy("split-b", nicSelector={"pfNames": [f"{PF0}#4-7"]})
    (iface,) = node_state_spec(read(a, b), NODE, found(tmp_path))["interfaces"]
    assert iface["numVfs"] == 8
    assert sorted((g["resourceName"], g["vfRange"]) for g in iface["vfGroups"]) == [
        ("split_a", "0-3"), ("split_b", "4-7")]


def test_the_highest_priority_wins_a_shared_pf(tmp_path: Path) -> None:
    low = policy("low", numvfs=8, priority=50, mtu=9000)
    high = policy("high", numvfs=4, priority=10, mtu=1500)
    (iface,) = node_state_spec(read(high, low), NODE, found(tmp_path))["interfaces"]
    assert (iface["numVfs"], iface["mtu"]) == (4, 1500)
    assert [g["policyName"] for g in iface["vfGroups"]] == ["high"]


def test_equal_priorities_take_the_largest_numvfs_and_mtu(tmp_path: Path) -> None:
    a = policy("a", numvfs=4, mtu=9000, resourceName="same")
    b = policy("b", numvfs=8, mtu=1500, resourceName="same")
    (iface,) = node_state_spec(read(a, b), NODE, found(tmp_path))["interfaces"]
    assert (iface["numVfs"], iface["mtu"]) == (8, 9000)


def test_overlapping_ranges_refuse_the_later_policy_naming_both(tmp_path: Path) -> None:
    a = policy("split-a", nicSelector={"pfNames": [f"{PF0}#0-3"]}, created="2025-01-01T00:00:00Z")
    b = policy("split-b", nicSelector={"pfNames": [f"{PF0}#4-7"]}, created="2025-01-01T00:00:01Z")
    c = policy("split-c", nicSelector={"pfNames": [f"{PF0}#2-5"]}, created="2025-01-01T00:00:02Z")
    refused = refusals([c, b, a], [NODE], {"node-2": found(tmp_path)})
    assert set(refused) == {"split-c"}
    reason, message = refused["split-c"]
    assert reason == "OverlappingVfRange"
    assert f"VF index range in {PF0}#2-5 is overlapped with existing policy split-a" in message
    assert "existing policy split-b" in message


def test_policies_on_different_nodes_never_conflict(tmp_path: Path) -> None:
    a = policy("a", nicSelector={"pfNames": [f"{PF0}#0-3"]})
    b = policy("b", nicSelector={"pfNames": [f"{PF0}#0-3"]}, nodeSelector={"sriov": "other"})
    other = {"metadata": {"name": "node-3", "labels": {"sriov": "other"}}}
    assert refusals([a, b], [NODE, other], {"node-2": found(tmp_path)}) == {}


def test_more_vfs_than_the_nic_supports_is_refused(tmp_path: Path) -> None:
    refused = refusals([policy("big", numvfs=16)], [NODE], {"node-2": found(tmp_path)})
    reason, message = refused["big"]
    assert reason == "TooManyVfs"
    assert "numVfs(16) in CR big exceed the maximum allowed value(8)" in message
    assert PF0 in message and "node-2" in message


def test_a_policy_without_spec_is_refused_and_the_others_still_apply(tmp_path: Path) -> None:
    """Upstream's schema admits a policy without spec; it must configure nothing, not select
    every node with an empty nodeSelector, and say what it lacks."""
    bare = {"metadata": {"name": "bare", "uid": "uid-bare",
                         "creationTimestamp": "2025-01-01T00:00:00Z"}}
    good = policy("good")
    nics = {"node-2": found(tmp_path)}
    refused = refusals([bare, good], [NODE], nics)
    assert set(refused) == {"bare"}
    reason, message = refused["bare"]
    assert reason == "MissingFields"
    assert "spec.resourceName, spec.nodeSelector, spec.numVfs, spec.nicSelector missing" in message
    applied = node_state_spec(read(good), NODE, nics["node-2"])["interfaces"]
    assert [i["pciAddress"] for i in applied]


def test_device_plugin_config_maps_each_resource_to_its_vfs(tmp_path: Path) -> None:
    a = policy("split-a", nicSelector={"vendor": "15b3", "deviceID": "101d",
                                       "pfNames": [f"{PF0}#0-3"]}, isRdma=True, linkType="eth")
    b = policy("split-b", nicSelector={"pfNames": [f"{PF0}#4-7"]}, deviceType="vfio-pci")
    config = device_plugin_config(read(b, a), NODE, found(tmp_path, 8))
    assert config == {"resourceList": [
        {"resourceName": "split_a", "selectors": {
            "vendors": ["15b3"], "devices": ["101e"], "pfNames": [f"{PF0}#0-3"],
            "linkTypes": ["ether"], "IsRdma": True}},
        {"resourceName": "split_b", "selectors": {
            "pfNames": [f"{PF0}#4-7"], "drivers": ["vfio-pci"], "IsRdma": False}},
    ]}


def test_policies_sharing_a_resource_share_one_entry(tmp_path: Path) -> None:
    a = policy("port0", resourceName="vf", nicSelector={"pfNames": [PF0]})
    b = policy("port1", resourceName="vf", nicSelector={"pfNames": [PF1]})
    config = device_plugin_config(read(a, b), NODE, found(tmp_path))
    assert config["resourceList"] == [
        {"resourceName": "vf", "selectors": {"pfNames": [PF0, PF1], "IsRdma": False}}]


def test_the_example_policy_renders_for_the_example_nic(tmp_path: Path) -> None:
    example = yaml.safe_load((ROOT / "examples" / "sriovnetworknodepolicy.yaml").read_text())
    node = {"metadata": {"name": "n", "labels": example["spec"]["nodeSelector"]}}
    interfaces = found(tmp_path)
    for iface in interfaces:  # the example names the ports ens1f0 and ens1f1
        iface["name"] = {PF0: "ens1f0", PF1: "ens1f1"}[iface["name"]]
    spec = node_state_spec(read(example), node, interfaces)
    assert [(i["name"], i["numVfs"], i["mtu"]) for i in spec["interfaces"]] == [
        ("ens1f0", 8, 9000), ("ens1f1", 8, 9000)]
    config = device_plugin_config(read(example), node, interfaces)
    assert json.loads(json.dumps(config))["resourceList"][0]["selectors"]["devices"] == ["101e"]


def test_a_value_the_model_refuses_is_refused_naming_the_field(tmp_path: Path) -> None:
    """A policy stored before the schema held it (a deviceType no driver has) is read as its
    model: refused with the field named, while the others apply."""
    odd = policy("odd", deviceType="igb_uio")
    good = policy("good", nicSelector={"pfNames": [PF1]})
    nics = {"node-2": found(tmp_path)}
    refused = refusals([odd, good], [NODE], nics)
    assert set(refused) == {"odd"}
    reason, message = refused["odd"]
    assert reason == "InvalidSpec" and message.startswith("spec.deviceType in CR odd: ")
    assert "'netdevice' or 'vfio-pci'" in message


def test_the_old_default_policy_is_refused_saying_to_delete_it(tmp_path: Path) -> None:
    """Older releases created a policy named `default` that configures nothing: it is never
    applied (not even to every node by its empty selectors), and its status says so."""
    default = policy("default", nodeSelector={}, nicSelector={"pfNames": [PF0]})
    nics = {"node-2": found(tmp_path)}
    accepted, refused = judge(read_policies([default]), [NODE], nics)
    assert accepted == []
    assert refused["default"][0] == "DeprecatedDefaultPolicy"
    assert "delete it" in refused["default"][1]
