"""state-ipoib-cni: the IPoIB CNI plugin, on the nodes the policy's affinity selects."""

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

NAME = "ipoib-cni"


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    """As upstream's manifests/state-ipoib-cni/ (no pull policy of its own: the image's tag
    decides it, as there)."""
    spec = typed(ImageSpec, section, path)
    volume, mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    return [daemonset(
        ctx, "kube-ipoib-cni-ds", spec,
        [container(NAME, image(ctx, spec, path), spec, mounts=[mount], privileged=True,
                   pull_policy=None,
                   default_resources=resources("100m", "50Mi", "100m", "50Mi"))],
        app=NAME, volumes=[volume], selector={"name": NAME}, pod_labels={"tier": "node"},
    )]


STATE = State("state-ipoib-cni", ("secondaryNetwork", "ipoib"), "IPoIBCNIReady", render)
