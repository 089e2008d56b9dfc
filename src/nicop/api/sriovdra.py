"""`sriovnetwork.k8snetworkplumbingwg.io/v1alpha1`: SriovResourcePolicy and DeviceAttributes, the
API of the SR-IOV DRA driver (k8snetworkplumbingwg/dra-driver-sriov) that upstream's network
operator deploys. nicop's DRA driver takes them as its inputs too, so that an upstream DRA SR-IOV
setup moves to nicop unchanged: which VFs are advertised, and with which extra attributes.

Field names and meanings are upstream's (pkg/api/sriovdra/v1alpha1/api.go); nicop reads the
objects of its own namespace, as upstream reads those of the driver's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from nicop.api.common import (
    ApiModel,
    CrdInfo,
    KubeObject,
    LabelSelector,
    NodeSelector,
)

GROUP = "sriovnetwork.k8snetworkplumbingwg.io"
VERSION = "v1alpha1"


class ResourceFilter(ApiModel):
    """Which VFs a config selects: every list given must hold the VF's value (an empty filter
    selects every VF)."""

    vendors: list[str] | None = None
    """VF vendor IDs, 4 hex digits ("15b3")."""
    devices: list[str] | None = None
    """VF device IDs ("101e")."""
    pci_addresses: list[str] | None = None
    """VF PCI addresses ("0000:3b:00.2")."""
    pf_names: list[str] | None = None
    """Interfaces of the VFs' PFs."""
    pf_pci_addresses: list[str] | None = None
    """PCI addresses of the VFs' PFs."""
    drivers: list[str] | None = None
    """Accepted and, as upstream, not used to select."""
    link_type: Literal["eth", "ib", "ethernet", "infiniband"] | None = None
    """The port's link type."""


class Config(ApiModel):
    """A device selection and the extra attributes its VFs get."""

    device_attributes_selector: LabelSelector | None = None
    """DeviceAttributes objects (by label) whose attributes the selected VFs get, merged in
    name order (a later object's value wins)."""
    resource_filters: list[ResourceFilter] | None = None
    """A VF passing any of them is selected; none given selects every VF."""


class SriovResourcePolicySpec(ApiModel):
    """Where the policy applies and what it advertises."""

    node_selector: NodeSelector | None = None
    """The nodes it applies to; every node when unset."""
    configs: list[Config] | None = None
    """The selections, in order: a VF is taken by the first policy (by name) and config that
    selects it."""


class SriovResourcePolicy(KubeObject):
    """Which VFs of which nodes are advertised as DRA devices. Once any policy exists in the
    namespace, a VF no policy selects is not advertised (upstream's opt-in)."""

    crd = CrdInfo(GROUP, VERSION, "SriovResourcePolicy", "sriovresourcepolicies",
                  namespaced=True, status_subresource=False)

    spec: SriovResourcePolicySpec


class DeviceAttribute(ApiModel):
    """One typed value, as resource.k8s.io/v1 DeviceAttribute: exactly one of them."""

    string: str | None = None
    integer: int | None = Field(default=None, alias="int")
    boolean: bool | None = Field(default=None, alias="bool")
    version: str | None = None


class DeviceAttributesSpec(ApiModel):
    """The attributes."""

    attributes: dict[str, DeviceAttribute] | None = None
    """Fully qualified attribute name (`k8s.cni.cncf.io/resourceName`) to value."""


class DeviceAttributes(KubeObject):
    """Attributes that policies selecting this object by label add to their VFs."""

    crd = CrdInfo(GROUP, VERSION, "DeviceAttributes", "deviceattributes", namespaced=True,
                  status_subresource=False, singular="deviceattributes")

    spec: DeviceAttributesSpec
