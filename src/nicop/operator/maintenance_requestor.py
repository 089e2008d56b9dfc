"""The requestor side of NodeMaintenance (maintenance.nvidia.com/v1alpha1). Instead of cordoning
and draining a node itself, a requestor asks for `<prefix>-<node>` with its drain settings and
waits for it to be Ready; when done it lets go: the owner deletes the object, a joined requestor
takes its ID out of additionalRequestors (the maintenance operator releases the node when nobody
is left).

Two requestors use it: the driver upgrade (upstream's MAINTENANCE_OPERATOR_* settings) and the
SR-IOV drain (upstream's external drainer, DRAIN_CONTROLLER_* settings). A node that already has
a NodeMaintenance, whoever asked for it and whatever its name, is joined rather than given a
second one, so one drain serves every requestor of the node.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nicop import logs
from nicop.api import maintenance as m
from nicop.api.labels import OWNER_VALUE
from nicop.api.mellanox import DrainSpec, DriverUpgradePolicySpec
from nicop.api.upgrade import DRAIN_SKIP_LABEL
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.manager import Manager
from nicop.kube.resources import NODE_MAINTENANCE, Obj
from nicop.operator.maintenance import reason_of

log = logging.getLogger(__name__)

# Upstream's defaults: network-operator's chart requestor ID, k8s-operator-libs' name prefix.
DEFAULT_REQUESTOR_ID = "nvidia.doca-driver-upgrade"
DEFAULT_PREFIX = "nvidia-operator"
# nicop's default for the SR-IOV drain (upstream's chart sets it; it has none of its own).
DEFAULT_SRIOV_REQUESTOR_ID = "nvidia.sriov-drain"
SRIOV_DRAIN_TIMEOUT = 90  # seconds, upstream's drain requestor
NODE_INDEX = "node-maintenance-node"  # the store's index of NodeMaintenances by nodeName


@dataclass(frozen=True)
class RequestorOptions:
    requestor_id: str = DEFAULT_REQUESTOR_ID
    namespace: str = "default"
    prefix: str = DEFAULT_PREFIX

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RequestorOptions | None:
        """The driver upgrade's: upstream's variables; None unless MAINTENANCE_OPERATOR_ENABLED
        is "true"."""
        if env.get("MAINTENANCE_OPERATOR_ENABLED") != "true":
            return None
        return cls(env.get("MAINTENANCE_OPERATOR_REQUESTOR_ID") or DEFAULT_REQUESTOR_ID,
                   env.get("MAINTENANCE_OPERATOR_REQUESTOR_NAMESPACE") or "default",
                   env.get("MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX") or DEFAULT_PREFIX)

    @classmethod
    def sriov_from_env(cls, env: Mapping[str, str]) -> RequestorOptions | None:
        """The SR-IOV drain's: upstream's DRAIN_CONTROLLER_* variables; None unless
        DRAIN_CONTROLLER_ENABLED is "true". Its objects are named like the driver upgrade's,
        so the two meet on one name."""
        if env.get("DRAIN_CONTROLLER_ENABLED") != "true":
            return None
        return cls(env.get("DRAIN_CONTROLLER_REQUESTOR_ID") or DEFAULT_SRIOV_REQUESTOR_ID,
                   env.get("DRAIN_CONTROLLER_REQUESTOR_NAMESPACE") or "default",
                   env.get("DRAIN_CONTROLLER_NODE_MAINTENANCE_PREFIX")
                   or env.get("MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX") or DEFAULT_PREFIX)


def maintenance_spec(upgrade_policy: DriverUpgradePolicySpec) -> Obj:
    """The upgradePolicy's drain and wait settings as a NodeMaintenance asks for them. The
    driver upgrade's drain-skip label keeps its pods (the operator's) where they are."""
    spec: Obj = {}
    drain = upgrade_policy.drain or DrainSpec()
    if drain.enable:
        spec["drainSpec"] = drain_spec(drain.pod_selector, drain.force, drain.timeout_seconds,
                                       drain.delete_empty_dir)
    wait = upgrade_policy.wait_for_completion
    if wait is not None and wait.model_fields_set:  # `waitForCompletion: {}` asks for nothing
        spec["waitForPodCompletion"] = {"podSelector": wait.pod_selector or "",
                                        "timeoutSeconds": wait.timeout_seconds}
    return spec


def sriov_maintenance_spec() -> Obj:
    """What an SR-IOV drain asks for: upstream's drain requestor drains every pod, forced,
    emptyDir data deleted, within 90 s."""
    return {"drainSpec": drain_spec(None, True, SRIOV_DRAIN_TIMEOUT, True)}


def drain_spec(selector: str | None, force: bool, timeout: int, delete_empty_dir: bool) -> Obj:
    selector = ",".join(s for s in (selector, f"{DRAIN_SKIP_LABEL}!=true") if s)
    return {"force": force, "podSelector": selector, "timeoutSeconds": timeout,
            "deleteEmptyDir": delete_empty_dir}


def requestors(nm: Obj) -> list[str]:
    spec = nm.get("spec") or {}
    return [spec.get("requestorID", ""), *(spec.get("additionalRequestors") or [])]


def holders(nm: Obj) -> list[str]:
    """Who still holds the node: once the owner deleted the object, only the others."""
    return requestors(nm)[1:] if nm["metadata"].get("deletionTimestamp") else requestors(nm)


class Requestor:
    """One requestor's view of the NodeMaintenances of its namespace."""

    def __init__(self, manager: Manager, options: RequestorOptions,
                 on_change: Callable[[], None]) -> None:
        self.client: ApiClient = manager.client
        self.options = options
        self.items = manager.informer(NODE_MAINTENANCE, options.namespace)
        self.items.store.add_index(NODE_INDEX, lambda nm: [(nm.get("spec") or {}).get(
            "nodeName", "")])
        self.items.on_change(lambda ev, obj, old: on_change())

    def requestor_id(self, pool: str = OWNER_VALUE) -> str:
        """A NicNodePolicy's pool requests as `<id>-nnp-<name>`, as upstream."""
        base = self.options.requestor_id
        return base if pool == OWNER_VALUE else f"{base}-{pool}"

    def name(self, node: str) -> str:
        return f"{self.options.prefix}-{node}"

    def of_node(self, node: str) -> list[Obj]:
        """The node's NodeMaintenances: the one of our name first."""
        ours = self.items.store.get(f"{self.options.namespace}/{self.name(node)}")
        found = [nm for nm in self.items.store.by_index(NODE_INDEX, node) if nm is not ours]
        return [ours, *found] if ours is not None else found

    def held(self, node: str, me: str) -> Obj | None:
        """The node's NodeMaintenance that `me` is a requestor of, if any."""
        return next((nm for nm in self.of_node(node) if me in holders(nm)), None)

    def ready(self, node: str, me: str) -> bool:
        nm = self.held(node, me)
        return nm is not None and reason_of(nm) == m.READY

    async def request(self, node: str, me: str, spec: Obj) -> bool:
        """Ask for the node's maintenance, or join the one another requestor asked for; True
        once `me` holds one. A NodeMaintenance being deleted is waited out (False: ask again
        later)."""
        found = self.of_node(node)
        if any(me in holders(nm) for nm in found):
            return True
        live = [nm for nm in found if not nm["metadata"].get("deletionTimestamp")]
        if live:
            existing = live[0]
            await self._requestors(existing, [*requestors(existing)[1:], me])
            log.info("joined NodeMaintenance %s of %s as %s", existing["metadata"]["name"],
                     existing["spec"]["requestorID"], me, extra=logs.about("Node", node))
            return True
        if found:
            return False
        body = {"apiVersion": NODE_MAINTENANCE.api_version, "kind": NODE_MAINTENANCE.kind,
                "metadata": {"name": self.name(node), "namespace": self.options.namespace},
                "spec": {"requestorID": me, "nodeName": node, "cordon": True, **spec}}
        try:
            self.items.assume(await self.client.create(body, res=NODE_MAINTENANCE))
        except ApiError as e:
            if e.code != 409:  # there already: joined at the next reconcile
                raise
            return False
        log.info("requested NodeMaintenance %s as %s", self.name(node), me,
                 extra=logs.about("Node", node))
        return True

    async def release(self, node: str, me: str) -> None:
        """Done with the node: the owner deletes the NodeMaintenance, a joined requestor takes
        its ID out."""
        nm = self.held(node, me)
        if nm is None:
            return
        meta, spec = nm["metadata"], nm["spec"]
        if spec["requestorID"] == me:
            if not meta.get("deletionTimestamp"):
                try:
                    await self.client.delete(NODE_MAINTENANCE, meta["name"], meta["namespace"])
                except ApiError as e:
                    if e.code != 404:
                        raise
            return
        await self._requestors(nm, [r for r in requestors(nm)[1:] if r != me])

    async def _requestors(self, nm: Obj, additional: list[str]) -> None:
        """The whole list at once, on the version read (a conflict retries with the next
        reconcile), as the maintenance operator asks of requestors."""
        meta = nm["metadata"]
        updated = await self.client.patch(NODE_MAINTENANCE, meta["name"], {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "spec": {"additionalRequestors": additional or None}}, meta["namespace"])
        self.items.assume(updated)
