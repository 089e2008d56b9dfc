"""The VFs this node's SR-IOV configuration is about to make, read from its SriovNetworkNodeState.

The operator writes what each PF should have into the node state's spec (numVfs, and per VF
range the deviceType) before the config daemon has made it: the DRA plugin publishes those VFs
at once, with binding conditions (KEP-5007), so the scheduler can allocate a VF while it is being
created, and waits to bind the pod until the plugin says the VF is ready (nicop.node.dra.binding).
When the daemon gives up (syncStatus Failed, its lastSyncError naming the PF), the PF's VFs that
are not ready are marked failed: claims holding one fail their binding with the daemon's words,
and the devices are tainted so the scheduler moves on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from nicop.kube.client import ApiClient
from nicop.kube.informer import Informer
from nicop.kube.resources import SRIOV_NODE_STATE, Obj

VFIO = "vfio-pci"
FAILED = "Failed"


@dataclass(frozen=True)
class PlannedPf:
    """One PF of the node state's spec: how many VFs it gets, which of them go to vfio-pci, the
    SR-IOV resourceName of each VF range, and the daemon's error when it gave up on this PF."""

    address: str
    num_vfs: int
    vfio: frozenset[int] = field(default_factory=frozenset)  # VF indexes of vfio-pci groups
    failure: str | None = None
    resources: tuple[tuple[int, int, str], ...] = ()  # (first, last VF index, resourceName)

    def resource_of(self, vf_index: int | None) -> str | None:
        """The resourceName of the policy that gave this PF its VF `vf_index`."""
        return next((name for first, last, name in self.resources
                     if vf_index is not None and first <= vf_index <= last), None)


def plan_of(state: Obj | None) -> dict[str, PlannedPf]:
    """The PFs the node state's spec gives VFs, by PCI address; externally managed PFs are the
    admin's to make, so their VFs are only what exists."""
    if not state:
        return {}
    status = state.get("status") or {}
    error = str(status.get("lastSyncError") or "") if status.get("syncStatus") == FAILED else ""
    result = {}
    for iface in (state.get("spec") or {}).get("interfaces") or []:
        address, count = iface.get("pciAddress"), int(iface.get("numVfs") or 0)
        if not address or count <= 0 or iface.get("externallyManaged"):
            continue
        vfio: set[int] = set()
        resources = []
        for group in iface.get("vfGroups") or []:
            first, _, last = str(group.get("vfRange") or "").partition("-")
            if not (first.isdigit() and last.isdigit()):
                continue
            if group.get("deviceType") == VFIO:
                vfio.update(range(int(first), int(last) + 1))
            if group.get("resourceName"):
                resources.append((int(first), int(last), str(group["resourceName"])))
        names = {address, iface.get("name")} - {None}
        failure = error if error and any(n in error for n in names) else None
        result[address] = PlannedPf(address, count, frozenset(vfio), failure, tuple(resources))
    return result


class VfPlanWatch:
    """The node's SriovNetworkNodeState, watched. Without the SR-IOV CRDs there is no plan: VFs
    are then only what the node has."""

    def __init__(self, client: ApiClient, namespace: str, node_name: str) -> None:
        self.node_name = node_name
        self.informer = Informer(client, SRIOV_NODE_STATE, namespace, optional=True,
                                 field_selector=f"metadata.name={node_name}")

    async def run(self) -> None:
        await self.informer.run()

    def plan(self) -> Mapping[str, PlannedPf]:
        return plan_of(self.informer.store.get(f"{self.informer.namespace}/{self.node_name}"))
