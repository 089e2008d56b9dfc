"""state-container-networking-plugins: the reference CNI plugins copied onto every node."""

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
    resources,
    typed,
)

NAME = "cni-plugins"


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    """As upstream's manifests/state-container-networking-plugins/: on every node the policy's
    affinity selects, with upstream's default resources."""
    spec = typed(ImageSpec, section, path)
    volume, mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    return [daemonset(
        ctx, "cni-plugins-ds", spec,
        [container(NAME, image(ctx, spec, path), spec, mounts=[mount], privileged=True,
                   default_resources=resources("100m", "50Mi", "100m", "50Mi"))],
        app=NAME, volumes=[volume], managed_only=False,
        selector={"name": NAME}, pod_labels={"tier": "node"},
    )]


STATE = State("state-container-networking-plugins", ("secondaryNetwork", "cniPlugins"),
              "CNIPluginsReady", render)
