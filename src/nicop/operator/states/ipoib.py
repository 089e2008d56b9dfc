"""state-ipoib-cni: the IPoIB CNI plugin on the nodes nicop manages."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State, container, daemonset, host_path, image


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    volume, mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    return [daemonset(
        ctx, "kube-ipoib-cni-ds", spec,
        [container("ipoib-cni", image(ctx, spec, path), spec, mounts=[mount], privileged=True)],
        app="ipoib-cni", volumes=[volume],
        selector={"name": "ipoib-cni"}, pod_labels={"tier": "node"},
    )]


STATE = State("state-ipoib-cni", ("secondaryNetwork", "ipoib"), "IPoIBCNIReady", render)
