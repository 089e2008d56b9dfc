"""Which VFs the DRA plugin advertises, and with which extra attributes, from the SR-IOV DRA
driver's SriovResourcePolicies and DeviceAttributes (nicop.api.sriovdra) in the plugin's
namespace, read as upstream reads them (dra-driver-sriov pkg/controller/resourcepolicycontroller):

- no policy in the namespace: every VF is advertised, as nicop does without upstream's API;
- otherwise only VFs a policy applying to the node selects (upstream's opt-in): policies in name
  order, their configs in order, the first that selects a VF takes it; a config without filters
  selects every VF, a filter every VF whose values are in each list it gives (`drivers` is
  accepted and, as upstream, not used);
- a VF gets the attributes of the DeviceAttributes its config selects by label, merged in name
  order (a later object's value wins), beside nicop's own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nicop.api import dra
from nicop.kube import selectors
from nicop.kube.client import ApiClient
from nicop.kube.informer import Informer
from nicop.kube.resources import DEVICE_ATTRIBUTES, SRIOV_RESOURCE_POLICY

log = logging.getLogger(__name__)

Obj = dict[str, Any]
LINK_TYPES = {"eth": dra.LINK_ETHERNET, "ethernet": dra.LINK_ETHERNET,
              "ib": dra.LINK_INFINIBAND, "infiniband": dra.LINK_INFINIBAND}


@dataclass(frozen=True)
class Vf:
    """What a filter looks at."""

    vendor: str
    device: str
    address: str
    pf_name: str | None
    pf_address: str
    link_type: str


@dataclass(frozen=True)
class VfPolicy:
    """The configs that apply to this node, in order, each with its attributes."""

    configs: tuple[tuple[tuple[Obj, ...], Mapping[str, Obj]], ...]

    def attributes(self, vf: Vf) -> Mapping[str, Obj] | None:
        """The extra attributes of an advertised VF; None: it is not advertised."""
        for filters, attributes in self.configs:
            if not filters or any(_selects(f, vf) for f in filters):
                return attributes
        return None


def vf_policy(policies: Sequence[Obj], attribute_sets: Sequence[Obj],
              node_labels: Mapping[str, str]) -> VfPolicy | None:
    """The node's VF policy; None when no SriovResourcePolicy exists (every VF advertised)."""
    if not policies:
        return None
    configs = []
    for policy in sorted(policies, key=lambda p: p["metadata"]["name"]):
        spec = policy.get("spec") or {}
        if not _on_node(spec.get("nodeSelector"), node_labels):
            continue
        for config in spec.get("configs") or []:
            configs.append((tuple(config.get("resourceFilters") or ()),
                            _attributes(config.get("deviceAttributesSelector"), attribute_sets)))
    return VfPolicy(tuple(configs))


def _on_node(selector: Obj | None, labels: Mapping[str, str]) -> bool:
    if not selector or not selector.get("nodeSelectorTerms"):
        return True
    return selectors.matches_node_selector(selector, {"metadata": {"labels": dict(labels)}})


def _attributes(selector: Obj | None, attribute_sets: Sequence[Obj]) -> Mapping[str, Obj]:
    if selector is None:
        return {}
    merged: dict[str, Obj] = {}
    for obj in sorted(attribute_sets, key=lambda o: o["metadata"]["name"]):
        try:
            chosen = selectors.matches_label_selector(selector,
                                                      obj["metadata"].get("labels") or {})
        except selectors.SelectorError as e:
            log.warning("deviceAttributesSelector %s: %s", selector, e)
            return {}
        if chosen:
            merged.update((obj.get("spec") or {}).get("attributes") or {})
    return merged


def _selects(f: Obj, vf: Vf) -> bool:
    checks = ((f.get("vendors"), vf.vendor), (f.get("devices"), vf.device),
              (f.get("pciAddresses"), vf.address), (f.get("pfNames"), vf.pf_name),
              (f.get("pfPciAddresses"), vf.pf_address))
    if any(wanted and value not in wanted for wanted, value in checks):
        return False
    link = f.get("linkType")
    return not link or LINK_TYPES.get(str(link).lower(), str(link).lower()) == vf.link_type


class VfPolicyWatch:
    """The namespace's SriovResourcePolicies and DeviceAttributes, watched. A cluster without
    their CRDs reads as having none."""

    def __init__(self, client: ApiClient, namespace: str) -> None:
        self.policies = Informer(client, SRIOV_RESOURCE_POLICY, namespace, optional=True)
        self.attributes = Informer(client, DEVICE_ATTRIBUTES, namespace, optional=True)

    async def run(self) -> None:
        await asyncio.gather(self.policies.run(), self.attributes.run())

    async def synced(self) -> None:
        await asyncio.gather(self.policies.synced.wait(), self.attributes.synced.wait())

    def policy(self, node_labels: Mapping[str, str]) -> VfPolicy | None:
        return vf_policy(self.policies.store.items(), self.attributes.store.items(), node_labels)
