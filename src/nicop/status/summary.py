"""The documented status (docs/status-schema.json, what `-o json` prints) of a snapshot."""

from __future__ import annotations

from typing import Any

from nicop import claims
from nicop.api import nodes as node_rules
from nicop.api import upgrade
from nicop.api.labels import (
    MOFED_WAIT_LABEL,
    POLICY_NAME,
)
from nicop.kube.resources import (
    Obj,
)
from nicop.status.facts import (
    SCHEMA_VERSION,
    Snapshot,
    configured_resources,
    container_problem,
    driver_of,
    has_mellanox_nic,
    labels_of,
    leader_of,
    name_of,
    nic_signs,
    node_ready,
    node_resources,
    node_state_of,
    operator_pods,
    pod_ready,
    policy_of,
    sriov_of,
    sriov_served_by,
    unmanaged_nic,
)


def summarize(snap: Snapshot) -> Obj:
    """The documented status of a snapshot (docs/status-schema.json)."""
    policy = policy_of(snap)
    configured = configured_resources(policy)
    expected = sorted({n for names in configured.values() for n in names})
    leader = leader_of(snap)
    nodes = sorted(snap.get("nodes") or [], key=name_of)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "collectedAt": snap["collectedAt"],
        "namespace": snap["namespace"],
        "operator": {
            "leader": leader,
            "pods": [_operator_pod(p, leader) for p in operator_pods(snap)],
        },
        "policy": summarize_policy(policy) if policy else None,
        "ignoredPolicies": sorted(name_of(p) for p in snap.get("policies") or []
                                  if name_of(p) != POLICY_NAME),
        "nodes": [_node(snap, n, expected) for n in nodes],
        "ipamPools": _pools(snap),
        "driverUpgrade": upgrade.progress(nodes),
        "errors": list(snap.get("errors") or []),
    }


def _operator_pod(pod: Obj, leader: Obj | None) -> Obj:
    name = name_of(pod)
    identity = (leader or {}).get("identity", "")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    problems = [p for c in statuses if not c.get("ready") and (p := container_problem(c))]
    return {
        "name": name,
        "node": (pod.get("spec") or {}).get("nodeName"),
        "phase": (pod.get("status") or {}).get("phase", "Unknown"),
        "ready": pod_ready(pod),
        "restarts": sum(int(c.get("restartCount", 0)) for c in statuses),
        "leader": bool(identity) and (identity == name or identity.startswith(name + "_")),
        "problem": problems[0] if problems else None,
    }


def summarize_policy(policy: Obj) -> Obj:
    """The policy part of the status: state, components and the Ready message."""
    status = policy.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    return {
        "name": name_of(policy),
        "state": status.get("state"),
        "reason": status.get("reason"),
        "generation": int((policy.get("metadata") or {}).get("generation", 0)),
        "observedGeneration": status.get("observedGeneration"),
        "message": (ready or {}).get("message"),
        "components": [
            {"name": a.get("name", ""), "state": a.get("state", ""),
             "message": a.get("message") or None}
            for a in status.get("appliedStates") or []
        ],
    }


def _node(snap: Snapshot, node: Obj, expected: list[str]) -> Obj:
    name = name_of(node)
    labels = labels_of(node)
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    managed = node_rules.is_managed(node)
    return {
        "name": name,
        "ready": node_ready(node),
        "mellanoxNic": has_mellanox_nic(node) or bool(nic_signs(snap, node)),
        "managed": managed,
        "unmanagedReason": unmanaged_nic(snap, node),
        "driver": driver_of(snap, node),
        "upgradeState": labels.get(upgrade.STATE_LABEL),
        "drainBlocked": annotations.get(upgrade.DRAIN_BLOCKED_ANNOTATION),
        "drainStarted": annotations.get(upgrade.DRAIN_START_ANNOTATION),
        "mofedWait": labels.get(MOFED_WAIT_LABEL),
        "resources": node_resources(snap, node, expected if managed else ()),
        "sriov": sriov_of(node_state_of(snap, name), sriov_served_by(snap, node)),
        "draDevices": dra_devices(snap, name),
    }


def dra_devices(snap: Snapshot, node: str) -> list[Obj]:
    """The node's DRA devices per driver (newest pool generation) and how many claims hold."""
    taken = claims.allocated(snap.get("resourceClaims") or [])
    counts: dict[str, list[int]] = {}
    for driver, pool, device in claims.node_devices(snap.get("resourceSlices") or []).get(
            node, []):
        count = counts.setdefault(driver, [0, 0])
        count[0] += 1
        count[1] += (driver, pool, device["name"]) in taken
    return [{"driver": d, "devices": n, "allocated": a} for d, (n, a) in sorted(counts.items())]


def _pools(snap: Snapshot) -> list[Obj]:
    """Each IPPool and CIDRPool with the usage its nodes' CNI daemons publish."""

    usage = {name_of(n): node_rules.ipam_usage(n) for n in snap.get("nodes") or []}
    out = []
    for kind, pools, network_field in (("IPPool", snap.get("ipPools") or [], "subnet"),
                                       ("CIDRPool", snap.get("cidrPools") or [], "cidr")):
        for pool in sorted(pools, key=name_of):
            name = name_of(pool)
            blocks = (pool.get("status") or {}).get("allocations") or []
            nodes: list[Obj] = []
            for block in sorted(blocks, key=lambda b: str(b.get("nodeName"))):
                node = str(block.get("nodeName"))
                used = (usage.get(node) or {}).get(name) or {}
                nodes.append({
                    "name": node,
                    "block": block.get("prefix") or
                    (f"{block.get('startIP')}-{block.get('endIP')}" if block.get("startIP")
                     else None),
                    "allocated": _int_or_none(used.get("allocated")),
                    "size": _int_or_none(used.get("size")),
                })
            known = [n for n in nodes if n["allocated"] is not None]
            allocated = sum(int(n["allocated"]) for n in known)
            size = sum(int(n["size"] or 0) for n in known)
            out.append({
                "name": name,
                "namespace": (pool.get("metadata") or {}).get("namespace"),
                "kind": kind,
                "network": (pool.get("spec") or {}).get(network_field),
                "allocated": allocated if known else None,
                "size": size if known else None,
                "nodes": nodes,
            })
    return out


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
