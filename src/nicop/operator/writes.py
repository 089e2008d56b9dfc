"""Writes of rendered objects, with the API server's refusals turned into messages that name
the object, the answer and the fix, and immutable selectors handled on purpose.

A DaemonSet's or Deployment's `spec.selector` cannot change in place (422 `field is
immutable`), as happens when nicop takes over objects another operator created with its own
selector. Such an object is deleted with `propagationPolicy: Orphan`, which keeps its pods
running, and created again: the new object adopts the pods its selector matches (upstream's
pods carry nicop's selector labels) and replaces them under its rollout rules. A recreated
DaemonSet rolls with `maxSurge: 1, maxUnavailable: 0`, so no node is without its pod while the
adopted pods are replaced: each goes once its replacement is Ready (the strategy stays until
the DaemonSet's rendered content next changes). The driver's DaemonSets are the exception:
their pods restart only through the rolling driver upgrade, so nicop never recreates one and
says how to hand it over instead.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nicop.api.labels import DRIVER_LABEL
from nicop.kube.client import ApiClient, ApiError, Unreachable
from nicop.kube.resources import DAEMONSET, DEPLOYMENT, Obj, Resource, key_of, resource_of
from nicop.kube.times import stamp as now

log = logging.getLogger(__name__)

GONE_TIMEOUT = 30.0
TAKEN_OVER_ANNOTATION = "nicop.io/taken-over"


class WriteFailed(Exception):
    """The API server refused (or did not answer) a write; the message says which object, what
    it answered and, where there is one, the fix."""


def describe(obj: Obj) -> str:
    return f"{obj['kind']} {key_of(obj)}"


def immutable_selector(e: ApiError) -> bool:
    return e.code == 422 and "field is immutable" in e.message and "selector" in e.message


def _failed(verb: str, what: str, e: Exception) -> WriteFailed:
    if isinstance(e, Unreachable):
        answer = str(e)
    elif isinstance(e, ApiError):
        answer = f"{e.code} {e.reason}: {e.message}" if e.reason else f"{e.code}: {e.message}"
        if e.code == 403:
            answer += " (the operator's ServiceAccount lacks this permission; see " \
                      "docs/install.md, Permissions)"
    else:
        answer = f"{type(e).__name__}: {e}"
    return WriteFailed(f"{verb} {what} failed: {answer}")


async def apply(client: ApiClient, obj: Obj, *, res: Resource | None = None) -> tuple[Obj, str]:
    """Server-side apply; returns the stored object and what was done beyond the apply ("" or
    why the object was recreated)."""
    res = res or resource_of(obj)
    log.info("applying %s", describe(obj))
    try:
        return await client.apply(obj, res=res), ""
    except ApiError as e:
        if not (res in (DAEMONSET, DEPLOYMENT) and immutable_selector(e)):
            raise _failed("applying", describe(obj), e) from e
        refusal = e
    except OSError as e:
        raise _failed("applying", describe(obj), e) from e
    meta = obj["metadata"]
    if DRIVER_LABEL in (meta.get("labels") or {}):
        raise WriteFailed(
            f"{describe(obj)} exists with another spec.selector, which cannot change in place "
            f"({refusal.message}); nicop does not recreate a driver DaemonSet, whose pods must "
            "restart only through the rolling upgrade. Hand it over: kubectl -n "
            f"{meta.get('namespace')} delete daemonset {meta['name']} --cascade=orphan (its "
            "pods keep running; nicop creates its own DaemonSet and upgrades the nodes one by "
            "one)")
    if res == DAEMONSET and (obj["spec"].get("updateStrategy") or {}).get(
            "type", "RollingUpdate") == "RollingUpdate":
        obj = {**obj, "spec": {**obj["spec"], "updateStrategy": {
            "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}}
    try:
        await client.delete(res, meta["name"], meta.get("namespace"), propagation="Orphan")
        await _gone(client, res, meta["name"], meta.get("namespace"))
        stored = await client.apply(obj, res=res)
        if res == DAEMONSET:
            # The new DaemonSet starts at template generation 1, as the old one may have, and
            # would count the adopted pods as up to date: one more generation replaces them.
            stored = await client.patch(res, meta["name"], {"spec": {"template": {"metadata": {
                "annotations": {TAKEN_OVER_ANNOTATION: now()}}}}}, meta.get("namespace"))
    except (ApiError, OSError) as e:
        raise _failed("recreating", describe(obj), e) from e
    why = (f"{describe(obj)} had another spec.selector, which cannot change in place: deleted "
           "it keeping its pods (cascade=orphan) and created it again; it adopts the pods its "
           "selector matches and replaces them as it rolls out")
    log.warning("%s", why)
    return stored, why


async def delete(client: ApiClient, res: Resource, obj: Obj) -> None:
    meta = obj["metadata"]
    try:
        await client.delete(res, meta["name"], meta.get("namespace"))
    except (ApiError, OSError) as e:
        raise _failed("deleting", describe(obj), e) from e


async def _gone(client: ApiClient, res: Resource, name: str, namespace: str | None) -> None:
    """Until the object is deleted (an orphaning delete takes a moment: its finalizer)."""
    deadline = time.monotonic() + GONE_TIMEOUT
    while await client.get_or_none(res, name, namespace) is not None:
        if time.monotonic() > deadline:
            raise WriteFailed(f"{res.kind} {namespace}/{name} was still being deleted after "
                              f"{GONE_TIMEOUT:.0f}s (its pods are being orphaned)")
        await asyncio.sleep(0.2)
