"""`nicop diagnose` on recorded snapshots: every planted fault is found, with its cause and fix,
and healthy things pass."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rich.console import Console
from tests.unit.test_status import NS, cluster_snapshot

from nicop import diagnose as dg
from nicop import status
from nicop.kube.scheduling import tolerates

Obj = dict[str, Any]


def checks_of(snap: Obj, kind: str | None = None, name: str | None = None) -> list[dg.Check]:
    return dg.diagnose(snap, dg.Target.parse(kind, name))


def find(checks: list[dg.Check], subject: str, name: str) -> dg.Check:
    found = [c for c in checks if c.subject == subject and c.name == name]
    assert found, f"no check {subject} {name} in:\n" + "\n".join(dg.as_lines(checks))
    return found[0]


def pod_snapshot(name: str) -> Obj:
    snap = cluster_snapshot()
    snap["pod"] = next(p for p in snap["pods"] if p["metadata"]["name"] == name)
    snap["events"] = [e for e in snap["events"] if e["involvedObject"]["name"] == name]
    return snap


# ------------------------------------------------------------------ the cluster


def test_the_cluster_checklist_finds_every_planted_fault_with_its_fix() -> None:
    checks = checks_of(cluster_snapshot())
    assert dg.failed(checks)

    operator = find(checks, "cluster", "operator")
    assert operator.result == "pass" and "nicop-operator-7d9f8" in operator.message

    unlabelled = find(checks, "node/node-4", "managed")
    assert unlabelled.result == "fail"
    assert "pci-0200_15b3.present" in unlabelled.message
    assert unlabelled.fix is not None and unlabelled.fix.startswith(
        "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true")

    driver = find(checks, "node/node-2", "driver")
    assert driver.result == "fail" and "CrashLoopBackOff" in driver.message
    assert "4 restarts" in driver.message and ".driver-ready" in driver.message
    assert driver.fix is not None and driver.fix.startswith(
        f"kubectl -n {NS} logs mofed-ubuntu24.04-ds-bbbbb -c mofed-container --previous")
    assert find(checks, "node/node-2", "driver upgrade").result == "fail"
    assert find(checks, "node/node-2", "mofed.wait").result == "fail"

    # The driver's failure keeps the device plugins off node-2, and says so.
    waiting = find(checks, "node/node-2", "RDMA shared device plugin")
    assert waiting.result == "fail" and "it waits for the driver" in waiting.message

    # node-3's taint keeps the RDMA plugin away although the policy says ready.
    tainted = find(checks, "node/node-3", "RDMA shared device plugin")
    assert tainted.result == "fail"
    assert "taint example.com/dedicated=storage:NoSchedule" in tainted.message
    assert tainted.fix is not None and "spec.tolerations" in tainted.fix
    assert "kubectl taint node node-3 example.com/dedicated-" in tainted.fix

    full = find(checks, "node/node-3", "resource nvidia.com/cx6dx_vf")
    assert full.result == "warn" and "all 8 in use" in full.message
    assert find(checks, "node/node-3", "VFs").result == "pass"

    assert find(checks, "node/node-1", "driver").result == "pass"
    assert find(checks, "node/node-1", "resource nvidia.com/rdma").message == \
        "nvidia.com/rdma: 63 allocatable, 3 in use"

    pending = find(checks, "cluster", "pod default/bad-rdma")
    assert pending.result == "warn" and "Insufficient rdma/hca_shared_devices_b" in \
        pending.message
    assert pending.fix == "nicop diagnose pod default/bad-rdma"

    component = find(checks, "cluster", "component state-OFED")
    assert component.result == "fail" and "1 of 2 pods available" in component.message


def test_a_healthy_node_passes_everything() -> None:
    checks = checks_of(cluster_snapshot(), "node", "node-1")
    assert [c.result for c in checks if c.result != "pass"] == ["warn"]  # SR-IOV: no devices
    assert find(checks, "node/node-1", "resources").message.startswith(
        "the SR-IOV device plugin advertises none of nvidia.com/cx6dx_vf")


def test_no_operator_is_a_failure_that_says_how_to_start_one() -> None:
    snap = cluster_snapshot()
    snap["lease"] = None
    snap["pods"] = [p for p in snap["pods"] if not p["metadata"]["name"].startswith("nicop-")]
    check = find(checks_of(snap), "cluster", "operator")
    assert check.result == "fail" and "nobody holds the Lease" in check.message
    assert check.fix is not None and f"nicop operator --namespace {NS}" in check.fix


def test_a_crashing_operator_pod_is_named_with_its_logs_command() -> None:
    snap = cluster_snapshot()
    snap["lease"]["spec"]["renewTime"] = "2026-09-01T11:50:00Z"
    operator = next(p for p in snap["pods"] if p["metadata"]["name"].startswith("nicop-"))
    operator["status"]["conditions"][0]["status"] = "False"
    operator["status"]["containerStatuses"][0].update(
        ready=False, state={"waiting": {"reason": "CrashLoopBackOff"}})
    check = find(checks_of(snap), "cluster", "operator")
    assert check.result == "fail" and "ran out 600s ago" in check.message
    assert "nicop-operator-7d9f8 (CrashLoopBackOff)" in check.message
    assert check.fix == f"kubectl -n {NS} logs nicop-operator-7d9f8"


def test_a_policy_with_another_name_and_no_real_policy() -> None:
    snap = cluster_snapshot()
    snap["policies"][0]["metadata"]["name"] = "my-policy"
    checks = checks_of(snap)
    assert find(checks, "cluster", "policy name").result == "fail"
    assert "is ignored" in find(checks, "cluster", "policy name").message
    assert find(checks, "cluster", "policy").result == "fail"


def test_no_mellanox_node_at_all_points_at_nfd() -> None:
    snap = cluster_snapshot()
    for node in snap["nodes"]:
        node["metadata"]["labels"] = {"kubernetes.io/hostname": node["metadata"]["name"]}
    check = find(checks_of(snap), "cluster", "mellanox nodes")
    assert check.result == "fail" and check.fix is not None and "Node Feature Discovery" in \
        check.fix


def test_an_unknown_node_fails() -> None:
    checks = checks_of(cluster_snapshot(), "node", "node-9")
    assert [(c.name, c.result) for c in checks] == [("node", "fail")]


def test_failed_vf_configuration_names_the_pf_limit() -> None:
    snap = cluster_snapshot()
    state = snap["nodeStates"][0]
    state["spec"]["interfaces"][0]["numVfs"] = 16
    state["status"].update(syncStatus="Failed", lastSyncError="write sriov_numvfs: invalid")
    checks = checks_of(snap, "node", "node-3")
    vfs = [c for c in checks if c.name == "VFs"]
    assert [c.result for c in vfs] == ["fail", "fail"]
    assert "16 VFs are wanted on PF ens1f0, which supports 8" in vfs[0].message
    assert "write sriov_numvfs: invalid" in vfs[1].message


def test_vfs_still_being_created_are_a_warning() -> None:
    snap = cluster_snapshot()
    state = snap["nodeStates"][0]
    state["status"]["syncStatus"] = "InProgress"
    state["status"]["interfaces"][0]["Vfs"] = state["status"]["interfaces"][0]["Vfs"][:3]
    vfs = find(checks_of(snap, "node", "node-3"), "node/node-3", "VFs")
    assert vfs.result == "warn" and "3 of 8 VFs configured" in vfs.message


def test_a_driver_of_another_version_than_the_policy_asks_for() -> None:
    snap = cluster_snapshot()
    snap["policies"][0]["spec"]["ofedDriver"]["version"] = "doca3.6.0-26.10-0.1.0.0-0"
    snap["policies"][0]["spec"]["ofedDriver"]["upgradePolicy"]["autoUpgrade"] = False
    driver = find(checks_of(snap, "node", "node-1"), "node/node-1", "driver")
    assert driver.result == "warn" and "asks for doca3.6.0-26.10-0.1.0.0-0" in driver.message
    assert driver.fix is not None and "delete pod mofed-ubuntu22.04-ds-aaaaa" in driver.fix


def test_a_missing_driver_pod_on_a_node_without_os_labels() -> None:
    snap = cluster_snapshot()
    node = snap["nodes"][0]
    del node["metadata"]["labels"]["feature.node.kubernetes.io/system-os_release.VERSION_ID"]
    driver_pod = "mofed-ubuntu22.04-ds-aaaaa"
    snap["pods"] = [p for p in snap["pods"] if p["metadata"]["name"] != driver_pod]
    driver = find(checks_of(snap, "node", "node-1"), "node/node-1", "driver")
    assert driver.result == "fail" and "match no driver pool" in driver.message
    assert "system-os_release.VERSION_ID=<unset>" in driver.message


# ------------------------------------------------------------------ pods


def test_a_pod_asking_for_a_resource_no_node_advertises() -> None:
    checks = checks_of(pod_snapshot("bad-rdma"), "pod", "default/bad-rdma")
    subject = "pod/default/bad-rdma"
    assert find(checks, subject, "pod").result == "fail"
    devices = find(checks, subject, "devices rdma/hca_shared_devices_b")
    assert devices.result == "fail"
    assert "no node advertises rdma/hca_shared_devices_b" in devices.message
    assert devices.fix is not None and "nvidia.com/rdma" in devices.fix  # what does exist
    event = find(checks, subject, "event FailedScheduling")
    assert event.result == "fail"
    assert "4 node(s) lack rdma/hca_shared_devices_b: no node advertises it" in event.message
    assert "(3 times)" in event.message and "claims" not in event.message


def test_a_pod_naming_a_missing_nad_and_not_requesting_a_nads_device() -> None:
    checks = checks_of(pod_snapshot("lost-net"), "pod", "default/lost-net")
    subject = "pod/default/lost-net"
    missing = find(checks, subject, "network default/missing-net")
    assert missing.result == "fail"
    assert "NetworkAttachmentDefinition default/missing-net does not exist" in missing.message
    assert missing.fix is not None and "HostDeviceNetwork" in missing.fix
    device = find(checks, subject, "network default/hostdev-net")
    assert device.result == "fail" and "does not request one" in device.message
    assert device.fix is not None and "nvidia.com/cx6dx_vf" in device.fix
    assert find(checks, subject, "events").result == "pass"


def test_a_nad_in_another_namespace_is_suggested() -> None:
    snap = pod_snapshot("lost-net")
    snap["pod"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] = \
        '[{"name": "hostdev-net", "namespace": "team-a"}]'
    check = find(checks_of(snap, "pod", "default/lost-net"), "pod/default/lost-net",
                 "network team-a/hostdev-net")
    assert check.result == "fail" and check.fix is not None and "default/hostdev-net" in check.fix


def test_a_pod_whose_devices_are_all_taken() -> None:
    snap = cluster_snapshot()
    pod = copy.deepcopy(next(p for p in snap["pods"] if p["metadata"]["name"] == "bad-rdma"))
    pod["metadata"].update(name="wants-rdma", uid="uid-wants-rdma")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/rdma": "61"}}
    snap["pod"] = pod
    snap["events"] = []
    devices = find(checks_of(snap, "pod", "default/wants-rdma"), "pod/default/wants-rdma",
                   "devices nvidia.com/rdma")
    assert devices.result == "fail" and "node-1 60 of 63 free" in devices.message
    pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/rdma": "2"}}
    devices = find(checks_of(snap, "pod", "default/wants-rdma"), "pod/default/wants-rdma",
                   "devices nvidia.com/rdma")
    assert devices.result == "pass"


def test_a_running_pod_with_its_devices_passes() -> None:
    checks = checks_of(pod_snapshot("train-1"), "pod", "default/train-1")
    assert not dg.failed(checks)
    assert find(checks, "pod/default/train-1", "devices nvidia.com/rdma").message == \
        "scheduled on node node-1, which has 63 nvidia.com/rdma"


def test_a_missing_pod() -> None:
    snap = cluster_snapshot()
    snap["pod"] = None
    checks = checks_of(snap, "pod", "default/nope")
    assert [(c.name, c.result) for c in checks] == [("pod", "fail")]


@pytest.mark.parametrize(("value", "reason"), [
    ('[{"namespace": "x"}]', 'each element needs a "name"'),
    ("[not json", "not valid JSON"),
    ('{"name": "roce"}', "the JSON form is a list of objects"),
    ("root@someIP/root@someOtherIP/root@thirdIP", "more than one '/'"),
])
def test_an_annotation_the_cni_cannot_read_fails_with_the_cnis_reason(value: str,
                                                                       reason: str) -> None:
    """diagnose reads the networks annotation with the meta-plugin's own parser (the last row
    is from Multus' own test table, as tests/unit/test_multus_selections.py), so it names
    the reason the CNI refuses the pod with."""
    snap = pod_snapshot("lost-net")
    snap["pod"]["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] = value
    check = find(checks_of(snap, "pod", "default/lost-net"), "pod/default/lost-net", "networks")
    assert check.result == "fail" and reason in check.message, check


def test_scheduler_messages_in_words() -> None:
    snap = cluster_snapshot()
    pod = snap["pods"][0]
    text, fix = dg.explain_event(snap, pod, {
        "reason": "FailedScheduling",
        "message": "0/4 nodes are available: 1 node(s) had untolerated taint "
                   "{example.com/dedicated: storage}, 1 node(s) were unschedulable, 2 "
                   "Insufficient nvidia.com/rdma. preemption: not eligible."})
    assert "1 node(s) have a taint the pod does not tolerate (example.com/dedicated: storage)" \
        in text
    assert "are cordoned" in text and "2 node(s) have no free nvidia.com/rdma" in text
    assert "kubectl uncordon" in fix and "add a toleration" in fix


@pytest.mark.parametrize(("toleration", "ok"), [
    ({"key": "example.com/dedicated", "operator": "Exists"}, True),
    ({"operator": "Exists"}, True),
    ({"key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule"}, True),
    ({"key": "example.com/dedicated", "value": "db"}, False),
    ({"key": "example.com/dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
])
def test_toleration_matching(toleration: Obj, ok: bool) -> None:
    taint = {"key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule"}
    assert tolerates([toleration], taint) is ok


# ------------------------------------------------------------------ the report


def test_report_counts_and_renders_fixes() -> None:
    snap = cluster_snapshot()
    target = dg.Target.parse(None, None)
    checks = dg.diagnose(snap, target)
    result = dg.report(snap, target, checks)
    assert result["result"] == "fail" and result["target"] == "cluster"
    assert result["summary"]["fail"] == sum(c.result == "fail" for c in checks)
    console = Console(record=True, width=300)
    console.print(dg.render(result))
    text = console.export_text()
    assert "FAIL  managed: node node-4 has a Mellanox NIC" in text
    assert "fix: kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true" in \
        text
    assert f"{result['summary']['fail']} failed" in text


@pytest.mark.parametrize(("args", "expected"), [
    ((None, None), "cluster"), (("node", "node-2"), "node/node-2"),
    (("pod", "ns/p"), "pod/ns/p"), (("pod", "p"), "pod/default/p"),
])
def test_targets(args: tuple[str | None, str | None], expected: str) -> None:
    assert str(dg.Target.parse(*args)) == expected


def test_bad_target() -> None:
    with pytest.raises(ValueError, match="node NAME"):
        dg.Target.parse("pod", None)


def test_the_command_exits_1_on_a_failure_and_0_without(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from nicop import status
    from nicop.cli import app

    snap = pod_snapshot("train-1")
    monkeypatch.setattr(status, "read_cluster", lambda kubeconfig, collect, context=None: snap)
    ok = CliRunner().invoke(app, ["diagnose", "pod", "default/train-1", "-o", "json"])
    assert ok.exit_code == 0 and json.loads(ok.stdout)["result"] == "pass"
    bad = CliRunner().invoke(app, ["diagnose"])
    assert bad.exit_code == 1 and "FAIL  managed: node node-4" in bad.stdout
    usage = CliRunner().invoke(app, ["diagnose", "pod"])
    assert usage.exit_code == 1 and "pod NAMESPACE/NAME" in usage.output


def test_a_crash_looping_agent_of_the_operator_is_named_with_its_last_error() -> None:
    """The SR-IOV config daemon's pod on node-3 exits at start: `diagnose node` names the pod,
    the back-off and the agent's last words, and how to read its log."""
    snap = cluster_snapshot()
    snap["pods"].append({
        "metadata": {"name": "sriov-network-config-daemon-x1", "namespace": NS,
                     "ownerReferences": [{"kind": "DaemonSet",
                                          "name": "sriov-network-config-daemon",
                                          "controller": True}]},
        "spec": {"nodeName": "node-3", "containers": [{"name": "sriov-network-config-daemon"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                   "containerStatuses": [{
                       "name": "sriov-network-config-daemon", "ready": False, "restartCount": 3,
                       "state": {"waiting": {"reason": "CrashLoopBackOff",
                                             "message": "back-off 40s restarting failed"}},
                       "lastState": {"terminated": {"exitCode": 1, "message":
                                                    "starting\nerror: the node's name is needed: "
                                                    "set NODE_NAME or --node-name"}}}]},
    })
    check = find(checks_of(snap, "node", "node-3"), "node/node-3",
                 "sriov-network-config-daemon")
    assert check.result == "fail"
    assert "sriov-network-config-daemon-x1" in check.message
    assert "CrashLoopBackOff" in check.message and "last exit 1" in check.message
    assert "the node's name is needed" in check.message
    assert check.fix == f"kubectl -n {NS} logs sriov-network-config-daemon-x1 --previous"


# ------------------------------------------------------------------ a NIC node not managed


def _unlabel(snap: Obj, node: str) -> Obj:
    for n in snap["nodes"]:
        if n["metadata"]["name"] == node:
            n["metadata"]["labels"].pop("feature.node.kubernetes.io/pci-15b3.present")
            return n
    raise AssertionError(node)


def test_a_node_that_lost_its_nfd_label_but_still_shows_its_nic_fails_with_the_fix() -> None:
    """node-1 lost pci-15b3.present, while its kubelet still advertises nvidia.com/rdma, it
    carries the driver's upgrade state and mofed.wait labels and runs the driver pod."""
    snap = cluster_snapshot()
    _unlabel(snap, "node-1")
    checks = checks_of(snap)
    assert dg.failed(checks)
    managed = find(checks, "node/node-1", "managed")
    assert managed.result == "fail"
    assert "node node-1 shows a Mellanox NIC" in managed.message
    for sign in ("advertises nvidia.com/rdma", "nvidia.com/ofed-driver-upgrade-state",
                 "network.nvidia.com/operator.mofed.wait", "mofed-ubuntu22.04-ds-aaaaa"):
        assert sign in managed.message
    assert "nvidia.com/gpu" not in managed.message  # the GPU operator's resource is no sign
    assert managed.fix is not None and managed.fix.startswith(
        "kubectl label node node-1 feature.node.kubernetes.io/pci-15b3.present=true")
    assert "Node Feature Discovery" in managed.fix
    # The node-level run says the same (it used to warn that NFD found no NIC).
    alone = find(checks_of(snap, "node", "node-1"), "node/node-1", "managed")
    assert (alone.result, alone.fix) == ("fail", managed.fix)


@pytest.mark.parametrize("sign", [
    {"labels": {"feature.node.kubernetes.io/pci-15b3.sriov.capable": "true"}},
    {"labels": {"feature.node.kubernetes.io/pci-0207_15b3_1021.present": "true"}},
    {"labels": {"nvidia.com/ofed-driver-upgrade-state": "upgrade-done"}},
    {"annotations": {"nvidia.com/ofed-driver-upgrade.driver-wait-for-safe-load": "true"}},
    {"allocatable": {"rdma/hca_shared_devices_a": "63"}},
    {"nodeFeature": "101d"},
])
def test_each_sign_of_a_nic_on_an_unlabelled_node_is_a_failure(sign: Obj) -> None:
    snap = cluster_snapshot()
    snap["nodes"].append(_bare_node("node-5"))
    node = snap["nodes"][-1]
    node["metadata"]["labels"].update(sign.get("labels", {}))
    node["metadata"]["annotations"].update(sign.get("annotations", {}))
    node["status"]["allocatable"].update(sign.get("allocatable", {}))
    if device := sign.get("nodeFeature"):  # NFD's NodeFeature object, as nfd-worker writes it
        snap["nodeFeatures"] = [{
            "metadata": {"name": "node-5", "namespace": "node-feature-discovery",
                         "labels": {"nfd.node.kubernetes.io/node-name": "node-5"}},
            "spec": {"features": {"instances": {"pci.device": {"elements": [
                {"attributes": {"class": "0200", "vendor": "15b3", "device": device}}]}}}}}]
    check = find(checks_of(snap), "node/node-5", "managed")
    assert check.result == "fail" and "node node-5 shows a Mellanox NIC" in check.message
    assert status.summarize(snap)["nodes"][-1]["unmanagedReason"].startswith(
        "node node-5 shows a Mellanox NIC")


def test_a_node_without_any_sign_of_a_nic_is_left_alone() -> None:
    snap = cluster_snapshot()
    snap["nodes"].append(_bare_node("node-5"))
    snap["nodes"][-1]["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    checks = checks_of(snap)
    assert not [c for c in checks if c.subject == "node/node-5"]
    assert status.summarize(snap)["nodes"][-1]["unmanagedReason"] is None


def _bare_node(name: str) -> Obj:
    resources = {"cpu": "64"}
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                         "annotations": {}},
            "spec": {},
            "status": {"capacity": dict(resources), "allocatable": dict(resources),
                       "conditions": [{"type": "Ready", "status": "True"}]}}


# ------------------------------------------------------------------ pods bound but not running


def test_a_bound_pod_stuck_on_a_missing_network_fails_cluster_wide() -> None:
    snap = cluster_snapshot()
    pod = next(p for p in snap["pods"] if p["metadata"]["name"] == "lost-net")
    pod["status"] = {"phase": "Pending", "containerStatuses": [
        {"name": "c", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    stuck = [c for c in checks_of(snap) if c.name == "pod default/lost-net"]
    assert {c.result for c in stuck} == {"fail"}
    missing = next(c for c in stuck if "missing-net" in c.message)
    assert "on node node-1 does not start" in missing.message
    assert "NetworkAttachmentDefinition default/missing-net does not exist" in missing.message
    assert missing.fix is not None and "network-attachment-definitions -A" in missing.fix
    # Its other network takes a VF the pod does not request: said too.
    assert any("does not request one" in c.message for c in stuck)


def test_a_bound_rdma_pod_stuck_for_another_reason_points_at_diagnose_pod() -> None:
    snap = cluster_snapshot()
    pod = next(p for p in snap["pods"] if p["metadata"]["name"] == "train-1")
    pod["status"] = {"phase": "Pending", "containerStatuses": [
        {"name": "c", "ready": False, "restartCount": 0,
         "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    check = find(checks_of(snap), "cluster", "pod default/train-1")
    assert check.result == "warn" and "ContainerCreating" in check.message
    assert check.fix == "nicop diagnose pod default/train-1"
    # Running, it is not mentioned.
    assert not [c for c in checks_of(cluster_snapshot()) if c.name == "pod default/train-1"]


def test_the_policy_reads_the_signs_a_cached_node_carries() -> None:
    """The operator caches nodes without their status: its reason (in the policy's Ready
    message) comes from labels and annotations alone."""
    from nicop.api.nodes import unmanaged_reason

    snap = cluster_snapshot()
    node = _unlabel(snap, "node-2")
    reason = unmanaged_reason({"metadata": node["metadata"]})
    assert reason is not None and reason.startswith("node node-2 shows a Mellanox NIC")
    assert "kubectl label node node-2 feature.node.kubernetes.io/pci-15b3.present=true" in reason
    assert unmanaged_reason(_bare_node("node-5")) is None


# ------------------------------------------------------------------ the registry


def test_every_check_is_registered_once_and_the_registry_decides_what_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A check added to the registry runs for its target (a managed node's check gets the node
    and the policy) and for no other; names are unique per target."""
    kinds = [(r.applies_to, r.name) for r in dg.REGISTRY]
    assert len(kinds) == len(set(kinds)), kinds
    seen: list[tuple[str, str]] = []

    def extra(snap: Obj, node: Obj, policy: Obj) -> list[dg.Check]:
        seen.append((node["metadata"]["name"], policy["metadata"]["name"]))
        return [dg.Check(f"node/{node['metadata']['name']}", "extra", "warn", "added")]

    monkeypatch.setattr(dg.check, "REGISTRY",
                        [*dg.REGISTRY, dg.Registered("extra", "managed node", extra)])
    checks = checks_of(cluster_snapshot(), "node", "node-1")
    assert find(checks, "node/node-1", "extra").message == "added"
    assert seen == [("node-1", "nic-cluster-policy")]
    assert not [c for c in checks_of(pod_snapshot("bad-rdma"), "pod", "default/bad-rdma")
                if c.name == "extra"]
