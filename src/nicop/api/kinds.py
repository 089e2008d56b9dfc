"""Every kind nicop has a CRD for, and parsing any object into its model."""

from __future__ import annotations

from nicop.api.common import KubeObject
from nicop.api.maintenance import MaintenanceOperatorConfig, NodeMaintenance
from nicop.api.mellanox import (
    HostDeviceNetwork,
    IPoIBNetwork,
    MacvlanNetwork,
    NicClusterPolicy,
    NicNodePolicy,
)
from nicop.api.nad import NetworkAttachmentDefinition
from nicop.api.nvipam import CIDRPool, IPPool
from nicop.api.sriovdra import DeviceAttributes, SriovResourcePolicy
from nicop.api.sriovnetwork import (
    OVSNetwork,
    SriovIBNetwork,
    SriovNetwork,
    SriovNetworkNodePolicy,
    SriovNetworkNodeState,
    SriovNetworkPoolConfig,
    SriovOperatorConfig,
)

KINDS: tuple[type[KubeObject], ...] = (
    NicClusterPolicy,
    NicNodePolicy,
    MacvlanNetwork,
    HostDeviceNetwork,
    IPoIBNetwork,
    SriovNetworkNodePolicy,
    SriovNetwork,
    SriovIBNetwork,
    OVSNetwork,
    SriovNetworkNodeState,
    SriovOperatorConfig,
    SriovNetworkPoolConfig,
    IPPool,
    CIDRPool,
    NodeMaintenance,
    MaintenanceOperatorConfig,
    SriovResourcePolicy,
    DeviceAttributes,
    NetworkAttachmentDefinition,
)
"""Every kind nicop has a CRD for, in install order."""


def kind_for(api_version: str, kind: str) -> type[KubeObject]:
    """The model of an object's apiVersion and kind; KeyError names what is unknown."""
    for model in KINDS:
        if model.crd.api_version == api_version and model.crd.kind == kind:
            return model
    raise KeyError(f"nicop has no model for {kind} in {api_version}")


def parse(obj: dict[str, object]) -> KubeObject:
    """Parse an object of any nicop kind into its model."""
    return kind_for(str(obj.get("apiVersion")), str(obj.get("kind"))).model_validate(obj)
