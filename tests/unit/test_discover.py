"""`nicop discover`'s suggestion from the NICs found: a new policy that selects exactly them, a
running one kept where it already selects them, and SR-IOV policies only where the ports allow
the VFs asked. The whole command against a cluster (discovery pods on the stand-ins, --apply
through plan) is in tests/integration/test_support_tools.py."""

from __future__ import annotations

import json
from typing import Any

import yaml

from nicop.discover import Found, suggest


def port(device: str, link: str, netdev: str, total_vfs: int = 16) -> dict[str, Any]:
    return {"pciAddress": f"0000:{netdev[-2:]}:00.0", "vendor": "15b3", "deviceID": device,
            "linkType": link, "netdev": netdev, "totalVfs": total_vfs}


FOUND = Found(ports={"gpu-1": [port("1021", "infiniband", "ibp0s1"),
                               port("1021", "infiniband", "ibp0s2")],
                     "gpu-2": [port("101d", "ethernet", "ens1f0", total_vfs=0)]},
              failed={"gpu-3": "its discovery pod did not finish within 120s"})


def resources(policy: dict[str, Any]) -> dict[str, Any]:
    config = json.loads(policy["spec"]["rdmaSharedDevicePlugin"]["config"])
    return {r["resourceName"]: r["selectors"] for r in config["configList"]}


def test_without_a_policy_one_resource_per_link_type_selects_exactly_the_nics_found() -> None:
    s = suggest(FOUND, None, "nvidia-network-operator")
    assert s.policy["metadata"]["name"] == "nic-cluster-policy"
    assert resources(s.policy) == {
        "rdma_roce": {"vendors": ["15b3"], "deviceIDs": ["101d"], "linkTypes": ["ethernet"]},
        "rdma_ib": {"vendors": ["15b3"], "deviceIDs": ["1021"], "linkTypes": ["infiniband"]}}
    text = s.yaml()
    assert "# node gpu-3 is not included: its discovery pod did not finish" in text
    assert [d["kind"] for d in yaml.safe_load_all(text)] == ["NicClusterPolicy"]


def test_a_running_policy_that_selects_every_nic_comes_back_unchanged() -> None:
    config = json.dumps({"configList": [{"resourceName": "rdma", "rdmaHcaMax": 63, "selectors": {
        "ifNames": ["ibp0s1", "ibp0s2", "ens1f0"]}}]})
    live = {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
            "metadata": {"name": "nic-cluster-policy", "uid": "u", "resourceVersion": "9"},
            "spec": {"rdmaSharedDevicePlugin": {"config": config}, "ofedDriver": {"x": 1}},
            "status": {"state": "ready"}}
    s = suggest(FOUND, live, "nvidia-network-operator")
    assert s.policy == {"apiVersion": live["apiVersion"], "kind": live["kind"],
                        "metadata": {"name": "nic-cluster-policy"}, "spec": live["spec"]}
    assert "15b3:101d (ethernet): already selected by RDMA resource rdma" in s.notes


def test_an_interface_a_selector_misses_gets_its_model_added_to_the_same_link_type() -> None:
    config = json.dumps({"configList": [{"resourceName": "rdma", "selectors": {
        "vendors": ["15b3"], "deviceIDs": ["101e"], "linkTypes": ["infiniband"]}}]})
    live = {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
            "metadata": {"name": "nic-cluster-policy"},
            "spec": {"rdmaSharedDevicePlugin": {"config": config}}}
    s = suggest(FOUND, live, "nvidia-network-operator")
    assert resources(s.policy)["rdma"]["deviceIDs"] == ["101e", "1021"]
    assert any(n.startswith("15b3:1021 (infiniband): added to RDMA resource rdma") for n in s.notes)


def test_sriov_policies_only_for_models_whose_ports_allow_the_vfs() -> None:
    s = suggest(FOUND, None, "network-operator", vfs=8)
    assert [p["metadata"] for p in s.sriov] == [
        {"name": "sriov-ib-1021", "namespace": "network-operator"}]
    assert s.sriov[0]["spec"]["nicSelector"] == {"vendor": "15b3", "deviceID": "1021"}
    assert s.sriov[0]["spec"]["numVfs"] == 8 and s.sriov[0]["spec"]["linkType"] == "ib"
    assert any("15b3:101d (ethernet): no SR-IOV policy: its ports allow at most 0 VFs" in n
               for n in s.notes)
