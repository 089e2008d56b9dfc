"""`k8s.cni.cncf.io/v1` NetworkAttachmentDefinition, the object Multus reads.

The CRD belongs to Multus (the Network Plumbing Working Group); nicop installs it only when the
cluster lacks it, because the network kinds render into it.
"""

from __future__ import annotations

from pydantic import Field

from nicop.api.common import ApiModel, CrdInfo, KubeObject


class NetworkAttachmentDefinitionSpec(ApiModel):
    """The network's CNI configuration."""

    config: str | None = None
    """CNI configuration of the network, as JSON."""


class NetworkAttachmentDefinition(KubeObject):
    """A secondary network that pods request by name in the k8s.v1.cni.cncf.io/networks
    annotation."""

    crd = CrdInfo(
        "k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition", "network-attachment-definitions",
        namespaced=True, short_names=("net-attach-def",), status_subresource=False,
        install_only_if_absent=True, singular="network-attachment-definition",
    )

    spec: NetworkAttachmentDefinitionSpec = Field(default_factory=NetworkAttachmentDefinitionSpec)
