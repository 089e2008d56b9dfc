"""`nicop plan`'s pure parts: the batches a driver reload starts in (the upgrade controller's own
slot rule, nicop.operator.upgrade.nodes_to_start, played round by round) and the diff of an
object. The plan against a live cluster, compared with the rollout it predicts, is in
tests/integration/test_driver_upgrade_slots.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from nicop.api.upgrade import DONE, STATE_LABEL
from nicop.kube.resources import NIC_CLUSTER_POLICY
from nicop.operator.upgrade import NodeView
from nicop.plan import (
    Cluster,
    DriverRollout,
    NodeReload,
    ObjectChange,
    Plan,
    VfChange,
    _policy_effects,
    batches,
    diff,
    text,
)


def views(count: int, **spec: Any) -> list[NodeView]:
    nodes = [{"metadata": {"name": f"node-{i}", "labels": {STATE_LABEL: DONE}},
              "spec": dict(spec), "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
             for i in range(count)]
    return [NodeView(n, {"metadata": {}}, False) for n in nodes]


def test_a_blocked_node_keeps_its_slot_so_later_batches_are_smaller() -> None:
    """10 nodes, maxParallelUpgrades 3, node-1's drain blocked: it fails holding its slot, as
    upgrade-failed does, so after the first batch of 3 the rollout goes 2 at a time."""
    assert batches(views(10), 3, None, {"node-1"}) == [
        ["node-0", "node-1", "node-2"], ["node-3", "node-4"], ["node-5", "node-6"],
        ["node-7", "node-8"], ["node-9"]]


def test_max_unavailable_bounds_the_batches_and_zero_parallel_means_no_limit() -> None:
    assert batches(views(5), 0, "40%", set()) == [["node-0", "node-1"], ["node-2", "node-3"],
                                                   ["node-4"]]
    assert batches(views(4), 0, None, set()) == [["node-0", "node-1", "node-2", "node-3"]]


def test_nodes_cordoned_before_their_upgrade_start_without_a_slot() -> None:
    """Upstream's in-place rule: a node already unschedulable costs no further availability."""
    nodes = views(4)
    nodes[3].node["spec"]["unschedulable"] = True
    assert batches(nodes, 1, None, set())[0] == ["node-0", "node-3"]


def test_every_node_stuck_ends_the_rollout_with_the_rest_never_started() -> None:
    assert batches(views(3), 1, None, {"node-0"}) == [["node-0"]]


def test_the_diff_shows_only_what_a_user_changed() -> None:
    live = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "a", "resourceVersion": "7", "uid": "u", "managedFields": [{}]},
        "data": {"k": "1"}, "status": {"x": 1}}
    planned = {**live, "metadata": {**live["metadata"], "resourceVersion": "8"},
               "data": {"k": "2"}}
    lines = diff(live, planned)
    assert "-  k: '1'" in lines and "+  k: '2'" in lines
    assert not any("resourceVersion" in line or "managedFields" in line for line in lines)
    assert diff(live, {**live, "status": {"x": 2}}) == []


def test_the_text_names_batches_blocked_pods_and_the_verdict() -> None:
    rollout = DriverRollout("NicClusterPolicy nic-cluster-policy", "ns/mofed", True, 2, None,
                            True, batches=[["a", "b"]], nodes=[
                                NodeReload("a", 1, evicts=["work/x"]),
                                NodeReload("b", 1, blocked=["work/db (PodDisruptionBudget "
                                                            "work/db allows 0 disruptions)"])])
    lines = text(Plan(rollouts=[rollout]))
    assert "  batch 1: a, b" in lines
    assert any("b: drain blocked: work/db (PodDisruptionBudget work/db" in line
               for line in lines)
    assert lines[-1].startswith("Disruptive: NicClusterPolicy nic-cluster-policy: the driver "
                                "reloads on 2 nodes")
    assert text(Plan())[-1] == "Nothing disruptive."
    assert Plan().exit_code() == 0 and Plan(rollouts=[rollout]).exit_code() == 2


SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "plan-schema.json")
                    .read_text())


def test_every_form_of_the_plan_validates_against_its_documented_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)
    rollout = DriverRollout("NicClusterPolicy nic-cluster-policy", "ns/mofed", True, 2, "50%",
                            True, batches=[["a"]], nodes=[NodeReload("a", 1, evicts=["w/x"])],
                            new_nodes=["b"])
    full = Plan(objects=[ObjectChange("change", "NicClusterPolicy", "nic-cluster-policy",
                                      diff=["-a", "+b"]),
                         ObjectChange("refused", "SriovNetwork", "n", "ns", note="why")],
                operator=[ObjectChange("delete", "DaemonSet", "ds", "ns")],
                restarts=["DaemonSet ns/ds: its pod template changes"], rollouts=[rollout],
                vf_changes=[VfChange("a", ["PF x (0000:01:00.0): numVfs 8 -> 4"], True, False,
                                     evicts=["w/y"])],
                requests={"reads": 4, "dryRuns": 1, "writes": 0})
    for plan in (Plan(requests={"reads": 0, "dryRuns": 0, "writes": 0}), full):
        errors = list(Draft202012Validator(SCHEMA).iter_errors(plan.to_json()))
        assert not errors, errors
    assert full.exit_code() == 1  # a refused object: nothing would be applied as written


def test_a_section_the_operator_cannot_render_deletes_nothing_and_is_refused() -> None:
    """The operator puts a state it cannot render in error and keeps its objects (StateSync
    deletes only what a rendered section no longer has): the plan must not call them deleted."""
    config = json.dumps({"configList": [{"resourceName": "rdma", "selectors": {
        "vendors": ["15b3"]}}]})
    live = {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
            "metadata": {"name": "nic-cluster-policy", "uid": "u"},
            "spec": {"rdmaSharedDevicePlugin": {"image": "p", "repository": "r",
                                                "version": "v", "config": config}}}
    broken = {**live, "spec": {"rdmaSharedDevicePlugin": {
        **live["spec"]["rdmaSharedDevicePlugin"], "config": "{not json"}}}
    result, change = Plan(), ObjectChange("change", "NicClusterPolicy", "nic-cluster-policy")
    _policy_effects(result, Cluster([], [], []), live, broken, change, "ns", NIC_CLUSTER_POLICY)
    assert [c for c in result.operator if c.action != "unchanged"] == []
    assert change.action == "refused" and "spec.rdmaSharedDevicePlugin.config" in change.note
