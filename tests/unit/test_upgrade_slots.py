"""Which waiting nodes a driver upgrade starts, on upstream's own cases.

The cases are the slot cases of NVIDIA/k8s-operator-libs pkg/upgrade/upgrade_state_test.go
("should schedule upgrade on all nodes if maxParallel upgrades is set to 0", "should start upgrade
on limited amount of nodes if maxParallel upgrades is less than node count", "... and
maxUnavailable are less than node count", "should start additional upgrades if
maxParallelUpgrades [and maxUnavailable] limit[s] [is|are] not reached", "should schedule upgrade
all nodes if maxParallel upgrades is set to 0 and maxUnavailable is set to 100%", "... 50%",
"should schedule upgrade based on 50% maxUnavailable, with some unavailable nodes already
upgraded"), whose rules are GetUpgradesAvailable in pkg/upgrade/common_manager.go and
ProcessUpgradeRequiredNodes in pkg/upgrade/upgrade_inplace.go; plus the failed-node case those
rules imply (an upgrade-failed node holds its slot).
"""

from __future__ import annotations

from typing import Any

import pytest

from nicop.api.upgrade import STATE_LABEL
from nicop.operator.upgrade import NodeView, nodes_to_start, upgrade_slots


def node(name: str, state: str, cordoned: bool = False) -> NodeView:
    return NodeView({"metadata": {"name": name, "labels": {STATE_LABEL: state}},
                     "spec": {"unschedulable": cordoned},
                     "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                    None, True)


def nodes(*specs: tuple[str, bool]) -> list[NodeView]:
    return [node(f"node{i + 1}", state, cordoned) for i, (state, cordoned) in enumerate(specs)]


REQ = ("upgrade-required", False)
REQ_CORDONED = ("upgrade-required", True)
CORDON = ("cordon-required", False)
DONE_CORDONED = ("upgrade-done", True)

CASES: list[tuple[str, list[NodeView], int, Any, list[str]]] = [
    ("maxParallelUpgrades 0 starts every waiting node",
     nodes(*[REQ] * 5), 0, None, ["node1", "node2", "node3", "node4", "node5"]),
    ("maxParallelUpgrades 3 of 5 waiting",
     nodes(*[REQ] * 5), 3, None, ["node1", "node2", "node3"]),
    ("maxParallelUpgrades 4 with 3 already cordon-required",
     nodes(REQ, REQ, CORDON, CORDON, CORDON), 4, None, ["node1"]),
    ("maxParallelUpgrades 0, maxUnavailable 100%, two nodes already cordoned",
     nodes(REQ, REQ, REQ, REQ_CORDONED, REQ_CORDONED), 0, "100%",
     ["node1", "node2", "node3", "node4", "node5"]),
    ("maxParallelUpgrades 0, maxUnavailable 50%: one slot, the cordoned nodes go anyway",
     nodes(REQ, REQ, REQ, REQ_CORDONED, REQ_CORDONED), 0, "50%", ["node1", "node4", "node5"]),
    ("maxUnavailable 50% with two done nodes still cordoned",
     nodes(REQ, REQ, REQ, DONE_CORDONED, DONE_CORDONED), 0, "50%", ["node1"]),
    ("maxParallelUpgrades 3, maxUnavailable 2",
     nodes(*[REQ] * 5), 3, 2, ["node1", "node2"]),
    ("maxParallelUpgrades 4, maxUnavailable 4 with 3 already cordon-required",
     nodes(REQ, REQ, CORDON, CORDON, CORDON), 4, 4, ["node1"]),
    ("a failed node holds its slot: 10 nodes, maxParallelUpgrades 3, one failed, two draining",
     nodes(("upgrade-failed", True), ("drain-required", True), ("drain-required", True),
           *[REQ] * 7), 3, None, []),
    ("the failed node's slot is the only one taken: two start",
     nodes(("upgrade-failed", True), *[("upgrade-done", False)] * 2, *[REQ] * 7), 3, None,
     ["node4", "node5"]),
]


@pytest.mark.parametrize(("views", "parallel", "unavailable", "started"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_nodes_started_as_upstream_starts_them(
    views: list[NodeView], parallel: int, unavailable: Any, started: list[str]
) -> None:
    assert [v.name for v in nodes_to_start(views, parallel, unavailable)] == started


def test_skipped_nodes_are_counted_but_never_started() -> None:
    views = nodes(REQ, REQ, REQ)
    views[0].node["metadata"]["labels"]["nvidia.com/ofed-driver-upgrade.skip"] = "true"
    assert [v.name for v in nodes_to_start(views, 1, None)] == ["node2"]


def test_a_not_ready_node_counts_as_unavailable() -> None:
    views = nodes(REQ, REQ, REQ, REQ)
    views[3].node["status"]["conditions"][0]["status"] = "False"
    # maxUnavailable 2 of 4: one node is down already, so one may start.
    assert upgrade_slots(views, 0, 2) == 1
