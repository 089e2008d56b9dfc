"""What a claim tells nicop's DRA driver about its VFs: the opaque configuration
(`spec.devices.config[].opaque` with `driver: rdma.nicop.io`, or a DeviceClass's) that names the
network a VF joins in the pod and its interface name there.

The parameters are those of the SR-IOV DRA driver's `VfConfig`
(k8snetworkplumbingwg/dra-driver-sriov, pkg/api/virtualfunction/v1alpha1: `ifName`,
`netAttachDefName`, `netAttachDefNamespace`), under nicop's group or that driver's, so a claim
written for it keeps its parameters:

    opaque:
      driver: rdma.nicop.io
      parameters: {apiVersion: rdma.nicop.io/v1alpha1, kind: VfConfig, ifName: net1,
                   netAttachDefName: vf-test1}

The allocation carries the class's config first and the claim's after; a later config overrides
the fields it sets, as upstream's `Override` does. Both readers use this module: the kubelet
plugin (a VF with a network is left in the node's namespace for the CNI) and nicop's Multus
(which attaches it, runs the network's IPAM and writes what the pod got into the claim).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from nicop.api.dra import DRIVER

VF_CONFIG_KIND = "VfConfig"
API_VERSIONS = (f"{DRIVER}/v1alpha1", "sriovnetwork.k8snetworkplumbingwg.io/v1alpha1")
# What the SR-IOV DRA driver's VfConfig has and nicop does not do: it binds no VF to another
# driver and mounts no vhost-net (nicop's VFs stay on mlx5_core, the RDMA path).
UNSUPPORTED = {"driver": "nicop keeps VFs on their RDMA driver (mlx5_core); remove `driver`",
               "addVhostMount": "nicop mounts no /dev/vhost-net; remove `addVhostMount`"}
FIELDS = {"ifName": "if_name", "netAttachDefName": "network",
          "netAttachDefNamespace": "network_namespace"}


class ConfigError(ValueError):
    """A claim's configuration for this driver cannot be read; the message names the claim's
    config entry, the field and the fix."""


@dataclass(frozen=True)
class VfConfig:
    if_name: str = ""
    network: str = ""  # a NetworkAttachmentDefinition's name; empty: no network, no CNI
    network_namespace: str = ""  # empty: the claim's namespace

    def network_key(self, claim_namespace: str) -> str:
        return f"{self.network_namespace or claim_namespace}/{self.network}"


def parse(parameters: Any, where: str) -> VfConfig:
    """One opaque `parameters` object; `where` names it in errors."""
    if not isinstance(parameters, Mapping):
        raise ConfigError(f"{where}: parameters must be an object (apiVersion "
                          f"{API_VERSIONS[0]}, kind {VF_CONFIG_KIND})")
    kind, version = parameters.get("kind"), parameters.get("apiVersion")
    if kind != VF_CONFIG_KIND or version not in API_VERSIONS:
        raise ConfigError(f"{where}: apiVersion {version!r}, kind {kind!r} is not a config of "
                          f"{DRIVER}; use apiVersion {API_VERSIONS[0]}, kind {VF_CONFIG_KIND}")
    config = VfConfig()
    for key, value in parameters.items():
        if key in ("apiVersion", "kind"):
            continue
        if key in UNSUPPORTED:
            if value:
                raise ConfigError(f"{where}: {key}: {UNSUPPORTED[key]}")
            continue
        if key not in FIELDS:
            raise ConfigError(f"{where}: unknown field {key!r} (known: "
                              f"{', '.join(sorted(FIELDS))})")
        if not isinstance(value, str):
            raise ConfigError(f"{where}: {key} must be a string")
        if key == "ifName" and value and (len(value) > 15 or any(
                c.isspace() or c in "/:" for c in value)):
            raise ConfigError(f"{where}: ifName {value!r} is not an interface name (at most 15 "
                              "characters, without '/', ':' or spaces)")
        if value:
            config = replace(config, **{FIELDS[key]: value})
    return config


def vf_configs(claim: Mapping[str, Any]) -> dict[str, VfConfig]:
    """The config of each request of an allocated claim that has one for this driver, by
    request name (a sub-request's result `req/sub` reads `req`'s unless it has its own)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    entries = (allocation.get("devices") or {}).get("config") or []
    requests = [r.get("request", "") for r in (allocation.get("devices") or {}).get("results")
                or []]
    meta = claim.get("metadata") or {}
    configs: dict[str, VfConfig] = {}
    for index, entry in enumerate(entries):
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != DRIVER:
            continue
        where = (f"claim {meta.get('namespace')}/{meta.get('name')}: config[{index}] "
                 f"({entry.get('source', 'FromClaim')})")
        config = parse(opaque.get("parameters"), where)
        applies = entry.get("requests") or requests
        for request in {r for name in applies for r in requests
                        if r == name or r.split("/")[0] == name}:
            configs[request] = _override(configs.get(request), config)
    return configs


def _override(base: VfConfig | None, other: VfConfig) -> VfConfig:
    if base is None:
        return other
    return VfConfig(if_name=other.if_name or base.if_name, network=other.network or base.network,
                    network_namespace=other.network_namespace or base.network_namespace)
