"""state-container-networking-plugins: the reference CNI plugins copied onto every node."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State, container, daemonset, host_path, image


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    volume, mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    return [daemonset(
        ctx, "cni-plugins-ds", spec,
        [container("cni-plugins", image(ctx, spec, path), spec, mounts=[mount],
                   privileged=True)],
        app="cni-plugins", volumes=[volume], managed_only=False,
        selector={"name": "cni-plugins"}, pod_labels={"tier": "node"},
    )]


STATE = State("state-container-networking-plugins", ("secondaryNetwork", "cniPlugins"),
              "CNIPluginsReady", render)
