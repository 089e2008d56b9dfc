"""What `nicop bundle replay` takes from a bundle: nodes with their labels, taints and hardware
(the simulated profile they name, else the ports their SR-IOV config daemon reported, built
into the stand-in's sysfs tree), and the CRs a user makes, without status or server fields.
The replay of a live cluster's bundle, status compared, is in
tests/integration/test_support_tools.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from nicop.node.discovery import nic_report, scan
from nicop_sim import hardware
from nicop_sim.replay import Bundle, custom_resources, differences, nodes

STATE = {"metadata": {"name": "gpu-7", "namespace": "nvidia-network-operator"},
         "status": {"interfaces": [
             {"name": "ens1f0", "pciAddress": "0000:5e:00.0", "deviceID": "101d",
              "vendor": "15b3", "linkType": "ETH", "totalvfs": 16},
             {"name": "ens1f1", "pciAddress": "0000:5e:00.1", "deviceID": "101d",
              "vendor": "15b3", "linkType": "ETH", "totalvfs": 16}]}}
BUNDLE = Bundle({
    "manifest.json": json.dumps({"namespace": "nvidia-network-operator"}),
    "nodes/nodes.yaml": yaml.safe_dump([
        {"metadata": {"name": "gpu-7", "uid": "u1", "labels": {"zone": "a"},
                      "resourceVersion": "5"},
         "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}], "podCIDR": "10.0.0.0/24"},
         "status": {"capacity": {}}},
        {"metadata": {"name": "sim-2", "annotations": {hardware.PROFILE_ANNOTATION: "cx6dx"}}}]),
    "resources/sriovnetworknodestates.sriovnetwork.openshift.io.yaml": yaml.safe_dump([STATE]),
    "resources/nicclusterpolicies.mellanox.com.yaml": yaml.safe_dump([
        {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
         "metadata": {"name": "nic-cluster-policy", "uid": "x", "generation": 4,
                      "managedFields": [{}]}, "spec": {"ofedDriver": {"version": "1"}},
         "status": {"state": "ready"}}]),
    "resources/network-attachment-definitions.k8s.cni.cncf.io.yaml": yaml.safe_dump([
        {"metadata": {"name": "rendered", "namespace": "default",
                      "ownerReferences": [{"kind": "MacvlanNetwork"}]}, "spec": {}}]),
})


def test_nodes_keep_labels_taints_and_get_the_hardware_their_agents_reported(
        tmp_path: Path) -> None:
    gpu, sim = nodes(BUNDLE)
    assert gpu["metadata"]["labels"] == {"zone": "a"} and "uid" not in gpu["metadata"]
    assert gpu["spec"] == {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}
    assert sim["metadata"]["annotations"][hardware.PROFILE_ANNOTATION] == "cx6dx"
    profile = hardware.profile_named(gpu["metadata"]["annotations"][hardware.PROFILE_ANNOTATION])
    assert profile is not None
    host = hardware.SimulatedHost.build(tmp_path, profile)
    assert [(p["pciAddress"], p["deviceID"], p["linkType"], p["totalVfs"])
            for p in nic_report(scan(host))] == [("0000:5e:00.0", "101d", "ethernet", 16),
                                                ("0000:5e:00.1", "101d", "ethernet", 16)]


def test_only_what_a_user_makes_is_replayed_without_status_or_server_fields() -> None:
    assert custom_resources(BUNDLE) == [
        {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
         "metadata": {"name": "nic-cluster-policy"}, "spec": {"ofedDriver": {"version": "1"}}}]


def test_status_differences_leave_out_what_a_replay_cannot_share() -> None:
    node = {"name": "n", "driver": {"pod": "mofed-abc", "version": "1"}}
    a = {"collectedAt": "t1", "operator": {"leader": "x"}, "nodes": [node],
         "policy": {"state": "ready", "generation": 4, "observedGeneration": 4}}
    b = {"collectedAt": "t2", "operator": {"leader": "y"},
         "nodes": [{**node, "driver": {"pod": "mofed-xyz", "version": "1"}}],
         "policy": {"state": "ready", "generation": 1, "observedGeneration": 1}}
    assert differences(a, b) == []
    assert differences(a, {**b, "policy": {"state": "error"}}) == ["policy.state"]
