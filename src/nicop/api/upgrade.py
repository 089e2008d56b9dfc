"""The rolling driver upgrade as the nodes record it: upstream's upgrade state label and
annotations (k8s-operator-libs), nicop's additions, and the summary `status.driverUpgrade` and
`nicop status` show."""

from __future__ import annotations

from typing import Any

from nicop.api.nodes import labels_of

Obj = dict[str, Any]

STATE_LABEL = "nvidia.com/ofed-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/ofed-driver-upgrade.skip"
DRAIN_SKIP_LABEL = "nvidia.com/ofed-driver-upgrade-drain.skip"
INITIAL_UNSCHEDULABLE_ANNOTATION = "nvidia.com/ofed-driver-upgrade.node-initial-state.unschedulable"
WAIT_START_ANNOTATION = "nvidia.com/ofed-driver-upgrade-wait-for-pod-completion-start-time"
REQUESTED_ANNOTATION = "nvidia.com/ofed-driver-upgrade-requested"
LEGACY_STATE_ANNOTATION = "nvidia.com/ofed-upgrade-state"
# nicop's: when a drain started, and why a node failed.
DRAIN_START_ANNOTATION = "nicop.io/ofed-driver-upgrade-drain-start-time"
FAILURE_ANNOTATION = "nicop.io/ofed-driver-upgrade-failure"
# While a drain cannot finish: the pods it cannot evict and why, and when it times out.
DRAIN_BLOCKED_ANNOTATION = "nicop.io/ofed-driver-upgrade-drain-blocked"
# nicop's automatic retries of a failed node: failed attempts so far, when the next retry is
# due (absent: none left, a person re-arms it with `nicop upgrade retry`), the state it failed in.
ATTEMPTS_ANNOTATION = "nicop.io/ofed-driver-upgrade-attempts"
RETRY_AT_ANNOTATION = "nicop.io/ofed-driver-upgrade-retry-at"
FAILED_IN_ANNOTATION = "nicop.io/ofed-driver-upgrade-failed-in"
RETRY_ANNOTATIONS = (ATTEMPTS_ANNOTATION, RETRY_AT_ANNOTATION, FAILED_IN_ANNOTATION)
# The node's device resources (extended resources) allocatable before its driver reload, as
# JSON {"resource": count}: the node is uncordoned once they are allocatable again.
ALLOCATABLE_ANNOTATION = "nicop.io/ofed-driver-upgrade-allocatable"
# Written by the driver agent: why it does not reload the driver now (nicop.node.preflight), a
# line per cause: "<cause>; fix: <fix>".
PREFLIGHT_ANNOTATION = "nicop.io/ofed-driver-preflight"
FIX_SEPARATOR = "; fix: "

REQUIRED = "upgrade-required"
CORDON = "cordon-required"
WAIT_FOR_JOBS = "wait-for-jobs-required"
DRAIN = "drain-required"
POD_RESTART = "pod-restart-required"
FAILED = "upgrade-failed"
UNCORDON = "uncordon-required"
DONE = "upgrade-done"
# Requestor mode: waiting for the node's NodeMaintenance to be Ready (the maintenance operator
# cordons and drains); the node carries REQUESTOR_MODE_ANNOTATION meanwhile.
NODE_MAINTENANCE = "node-maintenance-required"
REQUESTOR_MODE_ANNOTATION = "nvidia.com/ofed-driver-upgrade-requestor-mode"
IN_PROGRESS = (CORDON, WAIT_FOR_JOBS, DRAIN, NODE_MAINTENANCE, POD_RESTART, UNCORDON)
# Upstream's states nicop does not enter itself; a node an upstream install left in one of them
# is still counted as upstream counts it.
POD_DELETION = "pod-deletion-required"
VALIDATION = "validation-required"
# The nodes holding one of maxParallelUpgrades' slots, as upstream counts them: a failed node
# stays cordoned, so it keeps its slot until it recovers.
HOLDS_SLOT = (*IN_PROGRESS, POD_DELETION, VALIDATION, FAILED)
# The nodes upstream counts as managed (the base of a percentage maxUnavailable).
MANAGED = ("", REQUIRED, DONE, *HOLDS_SLOT)


def attempts(node: Obj) -> int:
    """The node's failed upgrade attempts since its last success (or `nicop upgrade retry`)."""
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(ATTEMPTS_ANNOTATION)
    try:
        return int(value or 0)
    except ValueError:
        return 0


def held_reload(node: Obj) -> list[Obj]:
    """What the node's driver agent says holds its driver reload: each cause with its fix."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(PREFLIGHT_ANNOTATION)
    held = []
    for line in (text or "").splitlines():
        cause, _, fix = line.partition(FIX_SEPARATOR)
        held.append({"cause": cause, "fix": fix})
    return held


def progress(nodes: list[Obj]) -> Obj | None:
    """The rolling-upgrade summary of status.driverUpgrade, from the nodes' upgrade labels."""
    counts = {"done": 0, "inProgress": 0, "waiting": 0, "failed": 0}
    in_progress, failed = [], []
    for node in nodes:
        state = labels_of(node).get(STATE_LABEL)
        if state is None:
            continue
        name = node["metadata"]["name"]
        if state == DONE:
            counts["done"] += 1
        elif state == FAILED:
            counts["failed"] += 1
            annotations = node["metadata"].get("annotations") or {}
            reason = annotations.get(FAILURE_ANNOTATION)
            failed.append({"name": name, **({"reason": reason} if reason else {}),
                           "attempts": attempts(node),
                           **({"nextRetry": annotations[RETRY_AT_ANNOTATION]}
                              if RETRY_AT_ANNOTATION in annotations else {})})
        elif state in IN_PROGRESS:
            counts["inProgress"] += 1
            in_progress.append(name)
        else:
            counts["waiting"] += 1
    if not any(counts.values()):
        return None
    in_progress.sort()
    failed.sort(key=lambda f: f["name"])
    return {**counts, **({"inProgressNodes": in_progress} if in_progress else {}),
            **({"failedNodes": failed} if failed else {})}
