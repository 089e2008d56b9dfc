"""The requestor side of NodeMaintenance, as upstream's driver upgrade uses it when a maintenance
operator is installed (MAINTENANCE_OPERATOR_ENABLED): instead of cordoning and draining a node
itself, the upgrade asks for `<prefix>-<node>` with its drain settings and waits for it to be
Ready. A NodeMaintenance another requestor already holds for the node is joined (our ID in its
additionalRequestors), so one drain serves both; leaving it removes our ID, and only its owner
deletes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nicop import logs
from nicop.api import maintenance as m
from nicop.api.labels import OWNER_VALUE
from nicop.api.upgrade import DRAIN_SKIP_LABEL
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.manager import Manager
from nicop.kube.resources import NODE_MAINTENANCE, Obj
from nicop.operator.maintenance import reason_of

log = logging.getLogger(__name__)

# Upstream's defaults: network-operator's chart requestor ID, k8s-operator-libs' name prefix.
DEFAULT_REQUESTOR_ID = "nvidia.doca-driver-upgrade"
DEFAULT_PREFIX = "nvidia-operator"


@dataclass(frozen=True)
class RequestorOptions:
    requestor_id: str = DEFAULT_REQUESTOR_ID
    namespace: str = "default"
    prefix: str = DEFAULT_PREFIX

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RequestorOptions | None:
        """Upstream's variables; None unless MAINTENANCE_OPERATOR_ENABLED is "true"."""
        if env.get("MAINTENANCE_OPERATOR_ENABLED") != "true":
            return None
        return cls(env.get("MAINTENANCE_OPERATOR_REQUESTOR_ID") or DEFAULT_REQUESTOR_ID,
                   env.get("MAINTENANCE_OPERATOR_REQUESTOR_NAMESPACE") or "default",
                   env.get("MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX") or DEFAULT_PREFIX)


def maintenance_spec(upgrade_policy: Obj) -> Obj:
    """The upgradePolicy's drain and wait settings as a NodeMaintenance asks for them. The
    driver upgrade's drain-skip label keeps its pods (the operator's) where they are."""
    spec: Obj = {}
    drain = upgrade_policy.get("drain") or {}
    if drain.get("enable", True):
        selector = ",".join(s for s in (drain.get("podSelector"), f"{DRAIN_SKIP_LABEL}!=true")
                            if s)
        spec["drainSpec"] = {"force": bool(drain.get("force")), "podSelector": selector,
                             "timeoutSeconds": int(drain.get("timeoutSeconds", 300)),
                             "deleteEmptyDir": bool(drain.get("deleteEmptyDir"))}
    wait = upgrade_policy.get("waitForCompletion")
    if wait:
        spec["waitForPodCompletion"] = {"podSelector": wait.get("podSelector") or "",
                                        "timeoutSeconds": int(wait.get("timeoutSeconds") or 0)}
    return spec


class Requestor:
    def __init__(self, manager: Manager, options: RequestorOptions,
                 on_change: Callable[[], None]) -> None:
        self.client: ApiClient = manager.client
        self.options = options
        self.items = manager.informer(NODE_MAINTENANCE, options.namespace)
        self.items.on_change(lambda ev, obj, old: on_change())

    def requestor_id(self, pool: str) -> str:
        """A NicNodePolicy's pool requests as `<id>-nnp-<name>`, as upstream."""
        base = self.options.requestor_id
        return base if pool == OWNER_VALUE else f"{base}-{pool}"

    def name(self, node: str) -> str:
        return f"{self.options.prefix}-{node}"

    def get(self, node: str) -> Obj | None:
        return self.items.store.get(f"{self.options.namespace}/{self.name(node)}")

    def ready(self, node: str) -> bool:
        nm = self.get(node)
        return nm is not None and reason_of(nm) == m.READY

    async def request(self, node: str, pool: str, upgrade_policy: Obj) -> None:
        """Ask for the node's maintenance, or join the one another requestor asked for."""
        me = self.requestor_id(pool)
        existing = self.get(node)
        if existing is None:
            body = {"apiVersion": NODE_MAINTENANCE.api_version, "kind": NODE_MAINTENANCE.kind,
                    "metadata": {"name": self.name(node), "namespace": self.options.namespace},
                    "spec": {"requestorID": me, "nodeName": node, "cordon": True,
                             **maintenance_spec(upgrade_policy)}}
            try:
                self.items.assume(await self.client.create(body, res=NODE_MAINTENANCE))
            except ApiError as e:
                if e.code != 409:  # there already: joined at the next reconcile
                    raise
            log.info("requested NodeMaintenance %s as %s", self.name(node), me,
                     extra=logs.about("Node", node))
            return
        spec = existing["spec"]
        others = list(spec.get("additionalRequestors") or [])
        if spec["requestorID"] == me or me in others:
            return
        await self._requestors(existing, [*others, me])
        log.info("joined NodeMaintenance %s of %s as %s", self.name(node), spec["requestorID"],
                 me, extra=logs.about("Node", node))

    async def release(self, node: str, pool: str) -> None:
        """Done with the node: the owner deletes the NodeMaintenance, a joined requestor takes
        its ID out (the maintenance operator releases the node when nobody is left)."""
        me = self.requestor_id(pool)
        existing = self.get(node)
        if existing is None:
            return
        meta, spec = existing["metadata"], existing["spec"]
        if spec["requestorID"] == me:
            if not meta.get("deletionTimestamp"):
                await self.client.delete(NODE_MAINTENANCE, meta["name"], meta["namespace"])
            return
        others = list(spec.get("additionalRequestors") or [])
        if me in others:
            await self._requestors(existing, [r for r in others if r != me])

    async def _requestors(self, nm: Obj, requestors: list[str]) -> None:
        """The whole list at once, on the version read (a conflict retries with the next
        reconcile), as the maintenance operator asks of requestors."""
        meta = nm["metadata"]
        updated = await self.client.patch(NODE_MAINTENANCE, meta["name"], {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "spec": {"additionalRequestors": requestors or None}}, meta["namespace"])
        self.items.assume(updated)
