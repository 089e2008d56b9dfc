"""The operator's gauges for dashboards and alerts: policy and component readiness, nodes per
driver upgrade state, and nodes with a Mellanox NIC that nicop does not manage.

Each is set from what a reconcile already holds (the status it computed, the nodes in the
cache), never from API calls of its own, so a scrape costs the same on a thousand nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from prometheus_client import Gauge

from nicop.api import upgrade
from nicop.api.labels import OPT_IN_LABEL, POLICY_NAME
from nicop.api.nodes import labels_of
from nicop.kube.resources import Obj

POLICY_READY = Gauge("nicop_policy_ready", "1 while a policy's state is ready, else 0",
                     ["kind", "name"])
COMPONENT_READY = Gauge("nicop_component_ready",
                        "1 while a component (state) of the NicClusterPolicy is ready, else 0",
                        ["component"])
UPGRADE_NODES = Gauge("nicop_upgrade_nodes", "Nodes per driver upgrade state", ["state"])
UNMANAGED_NIC_NODES = Gauge("nicop_unmanaged_nic_nodes",
                            "Nodes that show a Mellanox NIC but are not managed by nicop")

CLUSTER_POLICY = "NicClusterPolicy"
# Every state of the upgrade state machine has a series from the first count on, so a query
# for one state (upgrade-failed) has a 0 rather than no data.
UPGRADE_STATES = (upgrade.REQUIRED, *upgrade.IN_PROGRESS, upgrade.POD_DELETION,
                  upgrade.VALIDATION, upgrade.FAILED, upgrade.DONE)

_policies: set[tuple[str, str]] = set()
_components: set[str] = set()
_upgrade_states: set[str] = set(UPGRADE_STATES)


def policy_status(kind: str, name: str, status: Obj) -> None:
    """A policy's computed status: its readiness, and for the NicClusterPolicy each of its
    components that its spec asks for (a section left out has no series)."""
    state = status.get("state")
    if state not in ("ready", "notReady", "error"):  # ignored (an unsupported instance)
        forget_policy(kind, name)
        return
    POLICY_READY.labels(kind, name).set(1 if state == "ready" else 0)
    _policies.add((kind, name))
    if kind != CLUSTER_POLICY or name != POLICY_NAME:
        return
    wanted = {s["name"]: s["state"] == "ready" for s in status.get("appliedStates") or []
              if s.get("state") != "ignore"}
    for component in _components - wanted.keys():
        COMPONENT_READY.remove(component)
    for component, ready in wanted.items():
        COMPONENT_READY.labels(component).set(1 if ready else 0)
    _components.clear()
    _components.update(wanted)


def forget_policy(kind: str, name: str) -> None:
    """A policy that is gone (or ignored) has no series."""
    if (kind, name) in _policies:
        POLICY_READY.remove(kind, name)
        _policies.discard((kind, name))
    if kind == CLUSTER_POLICY and name == POLICY_NAME:
        for component in _components:
            COMPONENT_READY.remove(component)
        _components.clear()


def keep_policies(kind: str, names: Iterable[str]) -> None:
    """Drop the series of every policy of this kind not among `names`."""
    keep = set(names)
    for known_kind, name in list(_policies):
        if known_kind == kind and name not in keep:
            forget_policy(kind, name)


def upgrade_states(states: Iterable[str]) -> None:
    """Nodes per upgrade state, from the nodes' upgrade state labels ("" is no state)."""
    counts = Counter(s for s in states if s)
    _upgrade_states.update(counts)
    for state in _upgrade_states:
        UPGRADE_NODES.labels(state).set(counts.get(state, 0))


def unmanaged_nic_nodes(unmanaged: Iterable[Obj]) -> None:
    """The nodes the policy status reports as having a Mellanox NIC but not managed, less
    those an admin opted out on purpose (nvidia.com/network-operator=false): a choice is not
    something to page on."""
    UNMANAGED_NIC_NODES.set(sum(labels_of(n).get(OPT_IN_LABEL) != "false" for n in unmanaged))
