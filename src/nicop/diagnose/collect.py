"""What `nicop diagnose` reads: the status snapshot, NADs, and the target pod's events."""

from __future__ import annotations

from nicop import status as st
from nicop.diagnose.check import Snapshot, Target
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import (
    DEVICE_CLASS,
    EVENT,
    POD,
    RESOURCE_CLAIM_TEMPLATE,
)


async def collect(client: ApiClient, namespace: str, target: Target) -> Snapshot:
    """The status snapshot plus NADs, and the pod and its events (or, for the cluster, the
    scheduler's complaints about pending pods)."""
    snap = await st.collect(client, namespace, nads=True)
    errors: list[str] = snap["errors"]
    try:
        if target.kind == "pod":
            snap["pod"] = await client.get_or_none(POD, target.name, target.namespace)
            if ((snap["pod"] or {}).get("spec") or {}).get("resourceClaims"):
                await _collect_claims(client, snap, target.namespace)
            events, _ = await client.list(
                EVENT, target.namespace,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={target.name}")
        else:
            events, _ = await client.list(EVENT, None,
                                          field_selector="type=Warning,reason=FailedScheduling")
    except ApiError as e:
        errors.append(f"cannot read pods or events: {e.code} {e.reason}: {e.message}")
        events = []
    snap["events"] = events
    return snap


async def _collect_claims(client: ApiClient, snap: Snapshot, namespace: str) -> None:
    """What the scheduler reads to allocate a pod's claims, beyond the claims and slices the
    status snapshot already holds."""
    try:
        snap["claim_templates"], _ = await client.list(RESOURCE_CLAIM_TEMPLATE, namespace)
        snap["device_classes"], _ = await client.list(DEVICE_CLASS, None)
    except ApiError as e:
        snap["errors"].append(f"cannot read DRA claims, slices or classes: {e.code} {e.reason}: "
                              f"{e.message}")

