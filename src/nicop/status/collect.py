"""Reading the cluster: every object `nicop status` needs, once, into a plain snapshot of dicts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from nicop.api.labels import (
    LEASE_NAME,
    STATE_LABEL,
)
from nicop.kube.client import ApiClient, ApiError, Unreachable
from nicop.kube.resources import (
    CIDRPOOL,
    DAEMONSET,
    DEPLOYMENT,
    IPPOOL,
    LEASE,
    NETWORK_ATTACHMENT_DEFINITION,
    NODE,
    POD,
    RESOURCE_CLAIM,
    RESOURCE_SLICE,
    SRIOV_NODE_STATE,
    Obj,
)
from nicop.kube.resources import NIC_CLUSTER_POLICY as NCP
from nicop.kube.resources import Resource as Kind
from nicop.kube.times import stamp
from nicop.status.facts import (
    NIC_NODE_POLICY,
    NODE_FEATURE,
    TERMINATED,
    Snapshot,
)


async def _list(client: ApiClient, kind: Kind, namespace: str | None, errors: list[str], *,
                label_selector: str | None = None,
                field_selector: str | None = None) -> list[Obj]:
    """Objects of a kind; a kind the cluster does not serve (CRD not installed) is empty."""
    try:
        items, _ = await client.list(kind, namespace, label_selector=label_selector,
                                     field_selector=field_selector)
    except ApiError as e:
        if e.code != 404:
            where = f" in namespace {namespace}" if namespace and kind.namespaced else ""
            errors.append(f"cannot list {kind.plural}{where}: {e.code} {e.reason}: {e.message}")
        return []
    return items


async def collect(client: ApiClient, namespace: str, *, nads: bool = False,
                  graph: bool = False) -> Snapshot:
    """Read everything status and diagnose look at, concurrently, into a snapshot of dicts.

    Pods are read across all namespaces (without finished ones): "in use" is the sum of what
    every running pod on a node requests, whoever owns it. `graph` adds what only the picture
    of `--graph` shows: the policies' Deployments and the NicNodePolicies.
    """
    errors: list[str] = []
    lease: Obj | None
    try:
        lease = await client.get_or_none(LEASE, LEASE_NAME, namespace)
    except Unreachable:
        raise  # nothing else will answer either
    except ApiError as e:
        errors.append(f"cannot read Lease {namespace}/{LEASE_NAME}: {e.code} {e.reason}")
        lease = None
    running = ",".join(f"status.phase!={p}" for p in TERMINATED)
    reads = [
        _list(client, NODE, None, errors),
        _list(client, POD, None, errors, field_selector=running),
        _list(client, NCP, None, errors),
        _list(client, DAEMONSET, namespace, errors, label_selector=STATE_LABEL),
        _list(client, SRIOV_NODE_STATE, None, errors),
        _list(client, IPPOOL, namespace, errors),
        _list(client, CIDRPOOL, namespace, errors),
        _list(client, NODE_FEATURE, None, errors),
        _list(client, RESOURCE_SLICE, None, errors),
        _list(client, RESOURCE_CLAIM, None, errors),
    ]
    if nads:
        reads.append(_list(client, NETWORK_ATTACHMENT_DEFINITION, None, errors))
    if graph:
        reads.append(_list(client, DEPLOYMENT, namespace, errors, label_selector=STATE_LABEL))
        reads.append(_list(client, NIC_NODE_POLICY, None, errors))
    results = await asyncio.gather(*reads)
    snap: Snapshot = {
        "collectedAt": stamp(),
        "namespace": namespace,
        "lease": lease,
        "nodes": results[0],
        "pods": results[1],
        "policies": results[2],
        "daemonSets": results[3],
        "nodeStates": results[4],
        "ipPools": results[5],
        "cidrPools": results[6],
        "nodeFeatures": results[7],
        "resourceSlices": results[8],
        "resourceClaims": results[9],
        "errors": errors,
    }
    extra = iter(results[10:])
    if nads:
        snap["nads"] = next(extra)
    if graph:
        snap["deployments"] = next(extra)
        snap["nodePolicies"] = next(extra)
    return snap


class ClusterReadError(Exception):
    """The cluster could not be read: no kubeconfig, API server unreachable, access denied."""


def read_cluster(kubeconfig: str | Path | None,
                 collect: Callable[[ApiClient], Awaitable[Snapshot]],
                 context: str | None = None) -> Snapshot:
    """Run an async `collect(client)` with a client of the cluster (for the CLI); `context`
    picks a kubeconfig context other than the current one."""
    from nicop.kube.kubeconfig import KubeconfigError

    async def main() -> Snapshot:
        client = ApiClient(kubeconfig, context=context)
        try:
            return await collect(client)
        finally:
            await client.close()

    try:
        return asyncio.run(main())
    except (KubeconfigError, ApiError, OSError) as e:
        raise ClusterReadError(str(e)) from None
