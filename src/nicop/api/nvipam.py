"""`nv-ipam.nvidia.com/v1alpha1`: IPPool and CIDRPool, the pools of the nv-ipam IPAM plugin.

A controller splits each pool into per-node blocks and records them in the status; the node
agent allocates pod addresses from its node's block. Addresses are checked by the API server
with the Kubernetes CEL IP and CIDR functions.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from nicop.api.common import (
    ApiModel,
    Conditions,
    CrdInfo,
    KubeObject,
    NodeSelector,
    PrinterColumn,
)

GROUP = "nv-ipam.nvidia.com"
VERSION = "v1alpha1"

IP = Annotated[
    str,
    Field(
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "isIP(self)", "message": "must be an IP address, e.g. 192.168.0.1"}
            ]
        },
    ),
]
CIDR = Annotated[
    str,
    Field(
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "isCIDR(self)", "message": "must be a CIDR, e.g. 192.168.0.0/16"}
            ]
        },
    ),
]
MAX_ITEMS = 1024
"""Bound on the lists checked by CEL, so the API server can bound the cost of the checks."""
Int32 = Annotated[int, Field(json_schema_extra={"format": "int32"})]


class ExcludeRange(ApiModel):
    """Addresses never handed out, startIP to endIP inclusive."""

    start_ip: IP = Field(alias="startIP")
    end_ip: IP = Field(alias="endIP")


class ExcludeIndexRange(ApiModel):
    """Indexes of every node's block never handed out, startIndex to endIndex inclusive."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.endIndex >= self.startIndex",
                    "message": "endIndex must be greater than or equal to startIndex",
                }
            ]
        }
    )

    start_index: int = Field(ge=0)
    end_index: int = Field(ge=0)


class Route(ApiModel):
    """A static route added to the pods' interfaces."""

    dst: CIDR
    """Destination of the route, in CIDR notation."""


class IPPoolSpec(ApiModel):
    """A subnet handed out to nodes in blocks of perNodeBlockSize addresses."""

    subnet: CIDR
    """Subnet of the pool."""
    per_node_block_size: int = Field(ge=1)
    """Addresses given to each node, at most the subnet's host addresses (1 in a /32, 2 in a
    /31)."""
    gateway: IP | None = None
    """Gateway of the pool."""
    exclusions: list[ExcludeRange] | None = Field(default=None, max_length=MAX_ITEMS)
    """Addresses nv-ipam never hands out."""
    per_node_exclusions: list[ExcludeIndexRange] | None = Field(default=None, max_length=MAX_ITEMS)
    """Indexes in every node's block nv-ipam never hands out."""
    node_selector: NodeSelector | None = None
    """The nodes that get blocks; all nodes when unset."""
    default_gateway: bool | None = None
    """Add the gateway as default route."""
    routes: list[Route] | None = Field(default=None, max_length=MAX_ITEMS)
    """Static routes through the gateway."""


class Allocation(ApiModel):
    """The block of one node."""

    node_name: str
    start_ip: str = Field(alias="startIP")
    end_ip: str = Field(alias="endIP")


class IPPoolStatus(ApiModel):
    """The blocks given to nodes."""

    allocations: list[Allocation]
    conditions: Conditions = None
    """Allocated: whether every selected node has a block (nicop's addition)."""


class IPPool(KubeObject):
    """A pool of addresses for pods, split into per-node blocks."""

    crd = CrdInfo(
        GROUP, VERSION, "IPPool", "ippools", namespaced=True,
        printer_columns=(
            PrinterColumn("Subnet", ".spec.subnet"),
            PrinterColumn("Gateway", ".spec.gateway"),
            PrinterColumn("Block Size", ".spec.perNodeBlockSize", "integer"),
        ),
    )

    spec: IPPoolSpec
    status: IPPoolStatus | None = None


class CIDRPoolStaticAllocation(ApiModel):
    """A prefix reserved up front, for a node or for none."""

    node_name: str | None = None
    """The node the prefix is for; empty only reserves it."""
    gateway: IP | None = None
    """Gateway of the node."""
    prefix: CIDR
    """The prefix."""


class CIDRPoolSpec(ApiModel):
    """A CIDR split into one prefix of perNodeNetworkPrefix bits per node."""

    cidr: CIDR
    """The pool's CIDR."""
    per_node_network_prefix: Int32
    """Prefix length of each node's network."""
    gateway_index: Int32 | None = None
    """Index of the gateway in each node's prefix; no gateway when unset."""
    exclusions: list[ExcludeRange] | None = Field(default=None, max_length=MAX_ITEMS)
    """Addresses nv-ipam never hands out."""
    per_node_exclusions: list[ExcludeIndexRange] | None = Field(default=None, max_length=MAX_ITEMS)
    """Indexes in every node's prefix nv-ipam never hands out."""
    static_allocations: list[CIDRPoolStaticAllocation] | None = Field(
        default=None, max_length=MAX_ITEMS
    )
    """Prefixes reserved up front."""
    node_selector: NodeSelector | None = None
    """The nodes that get prefixes; all nodes when unset."""
    default_gateway: bool | None = None
    """Add the gateway as default route."""
    routes: list[Route] | None = Field(default=None, max_length=MAX_ITEMS)
    """Static routes through each node's gateway."""


class CIDRPoolAllocation(ApiModel):
    """The prefix of one node."""

    node_name: str
    gateway: str | None = None
    prefix: str


class CIDRPoolStatus(ApiModel):
    """The prefixes given to nodes."""

    allocations: list[CIDRPoolAllocation]
    conditions: Conditions = None
    """Allocated: whether every selected node has a prefix (nicop's addition)."""


class CIDRPool(KubeObject):
    """A pool of per-node prefixes for pods."""

    crd = CrdInfo(
        GROUP, VERSION, "CIDRPool", "cidrpools", namespaced=True,
        printer_columns=(
            PrinterColumn("CIDR", ".spec.cidr"),
            PrinterColumn("Gateway index", ".spec.gatewayIndex"),
            PrinterColumn("Per Node Network Prefix", ".spec.perNodeNetworkPrefix", "integer"),
        ),
    )

    spec: CIDRPoolSpec
    status: CIDRPoolStatus | None = None
