"""state-nic-feature-discovery: labels nodes with NIC features for NFD."""

from __future__ import annotations

from nicop.api.mellanox import ImageSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    Context,
    State,
    container,
    daemonset,
    host_path,
    image,
    typed,
)


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    spec = typed(ImageSpec, section, path)
    volume, mount = host_path("features-d", "/etc/kubernetes/node-feature-discovery/features.d",
                              type_="DirectoryOrCreate")
    return [daemonset(
        ctx, "nic-feature-discovery-ds", spec,
        [container("nic-feature-discovery", image(ctx, spec, path), spec, mounts=[mount])],
        app="nic-feature-discovery", volumes=[volume],
        selector={"name": "nic-feature-discovery"}, pod_labels={"tier": "node"},
    )]


STATE = State("state-nic-feature-discovery", ("nicFeatureDiscovery",),
              "NICFeatureDiscoveryReady", render)
