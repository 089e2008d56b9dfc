"""What a state does with objects it no longer renders, against the real API server: it deletes
only what nicop made, never a CRD (its custom resources would go with it), never an object
another operator made; what it keeps it names in its message. A CRD is never owned by the
policy, so deleting the policy cannot take custom resources with it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.eventually import until

from nicop.api.labels import OWNER_LABEL, OWNER_VALUE, STATE_LABEL
from nicop.kube.client import ApiClient
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Manager
from nicop.kube.resources import CONFIGMAP, CRD, NIC_CLUSTER_POLICY, Obj
from nicop.operator.state_sync import Applied, StateSync
from nicop.operator.states.base import Context, State, config_map
from nicop.operator.states.component_crds import preserved_crd

STATE = "state-test-objects"
GROUP = "objects.test.nicop.io"
RENDERED_CRD = f"widgets.{GROUP}"
UPSTREAM_CRD = f"gadgets.{GROUP}"


class Rig:
    """A StateSync with its informers running, and a render that can shrink."""

    def __init__(self, client: ApiClient, namespace: str, policy: Obj) -> None:
        self.client, self.namespace, self.policy = client, namespace, policy
        self.manager = Manager(client)
        self.sync = StateSync(self.manager, namespace, EventRecorder(client))
        self.rendered: list[str] = []  # what the state renders now: "crd", "configmap"

    def render(self, ctx: Context, section: Obj, path: str) -> list[Obj]:
        objects = []
        if "crd" in self.rendered:
            objects.append(preserved_crd(ctx, GROUP, "v1", "Widget", "widgets"))
        if "configmap" in self.rendered:
            objects.append(config_map(ctx, "nicop-made", {"k": "v"}))
        return objects

    async def apply(self, removed: bool = False) -> Applied:
        """A reconcile of the state; `removed`: its section is gone from the policy."""
        state = State(STATE, ("test",), "TestReady", self.render)
        ctx = Context(self.policy, self.namespace)
        return await self.sync.sync(state, ctx, [], NIC_CLUSTER_POLICY, None if removed else {})

    def cached(self, res: Any, key: str) -> Obj | None:
        return self.sync.owned[res].store.get(key)


@contextlib.asynccontextmanager
async def running_rig(kubeconfig: Path, namespace: str) -> AsyncIterator[Rig]:
    client = ApiClient(kubeconfig)
    policy = await client.apply({"apiVersion": "mellanox.com/v1alpha1",
                                 "kind": "NicClusterPolicy",
                                 "metadata": {"name": "state-objects-test"}, "spec": {}},
                                res=NIC_CLUSTER_POLICY)
    rig = Rig(client, namespace, policy)
    task = asyncio.create_task(rig.manager.run())
    await until(lambda: all(i.synced.is_set() for i in rig.manager.informers.values()))
    try:
        yield rig
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for name in (RENDERED_CRD, UPSTREAM_CRD):
            with contextlib.suppress(Exception):
                await client.delete(CRD, name)
        with contextlib.suppress(Exception):
            await client.delete(NIC_CLUSTER_POLICY, "state-objects-test")
        await client.close()


def owner_ref(policy: Obj) -> list[Obj]:
    return [{"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
             "name": policy["metadata"]["name"], "uid": policy["metadata"]["uid"],
             "controller": True, "blockOwnerDeletion": True}]


def test_a_shrinking_state_deletes_only_what_nicop_made(
        kubeconfig: Path, namespace: str, crds: list[str]) -> None:
    """Another operator's ConfigMap and CRD of the state (labelled and owned as upstream's
    states make them) and the state's own CRD stay when the state stops rendering them, and
    the message names them; nicop's own ConfigMap goes."""
    asyncio.run(shrink(kubeconfig, namespace))


async def shrink(kubeconfig: Path, namespace: str) -> None:
    async with running_rig(kubeconfig, namespace) as rig:
        labels = {STATE_LABEL: STATE, OWNER_LABEL: OWNER_VALUE}
        theirs = await rig.client.apply({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "upstream-made", "namespace": rig.namespace, "labels": labels,
                         "ownerReferences": owner_ref(rig.policy)}})
        upstream_crd = preserved_crd(Context(rig.policy, rig.namespace), GROUP, "v1", "Gadget",
                                     "gadgets")
        upstream_crd["metadata"] = {"name": UPSTREAM_CRD, "labels": labels,
                                    "ownerReferences": owner_ref(rig.policy)}
        await rig.client.apply(upstream_crd)

        rig.rendered = ["crd", "configmap"]
        await until(lambda: rig.cached(CONFIGMAP, f"{rig.namespace}/upstream-made")
                         and rig.cached(CRD, UPSTREAM_CRD))
        first = await rig.apply()
        crd = await rig.client.get(CRD, RENDERED_CRD)
        assert not crd["metadata"].get("ownerReferences"), "a CRD is never owned by the policy"
        assert "nicop-made" in str(await rig.client.get(CONFIGMAP, "nicop-made", rig.namespace))
        assert UPSTREAM_CRD in first.message and "upstream-made" in first.message

        rig.rendered = []  # the state shrinks to nothing
        applied = await rig.apply()
        assert applied.message == "deleting 1 stale objects"
        await until(lambda: rig.cached(CONFIGMAP, f"{rig.namespace}/nicop-made") is None)
        applied = await rig.apply()
        assert applied.state == "ready"
        assert f"CustomResourceDefinition {RENDERED_CRD} is kept" in applied.message
        assert f"CustomResourceDefinition {UPSTREAM_CRD} is kept" in applied.message
        assert f"ConfigMap {rig.namespace}/upstream-made is left in place" in applied.message
        same = await rig.client.get(CRD, RENDERED_CRD)
        assert same["metadata"]["uid"] == crd["metadata"]["uid"]
        assert (await rig.client.get(CONFIGMAP, "upstream-made", rig.namespace))["metadata"][
            "uid"] == theirs["metadata"]["uid"]
        kept = await rig.client.get(CRD, UPSTREAM_CRD)
        assert not kept["metadata"].get("ownerReferences"), "released from the policy"

        # The section removed: the CRDs still stay, and are named.
        applied = await rig.apply(removed=True)
        assert applied.state == "ignore"
        assert RENDERED_CRD in applied.message and UPSTREAM_CRD in applied.message
        assert await rig.client.get_or_none(CRD, RENDERED_CRD) is not None
