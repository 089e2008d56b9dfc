"""state-RDMA-device-plugin: the RDMA shared device plugin and its config, after the driver."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State
from nicop.operator.states.device_plugins import device_plugin


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    """For a NicNodePolicy, upstream names the DaemonSet by the policy's name hash and the
    ConfigMap and `app` label by its name."""
    app = f"rdma-shared-dp{ctx.name_suffix}"
    return device_plugin(
        ctx, spec, path, name=f"rdma-shared-dp-ds{ctx.name_hash_suffix}",
        container_name="rdma-shared-dp", app=app,
        config_map_name=f"rdma-devices{ctx.name_suffix}",
        config_dir="/k8s-rdma-shared-dev-plugin",
        host_dirs={"device-plugin": "/var/lib/kubelet/device-plugins",
                   "plugins-registry": "/var/lib/kubelet/plugins_registry",
                   "devs": "/dev/", "cdi": "/var/run/cdi"},
        args=[], agent="rdma-device-plugin", selector={"app": app},
        host_types={"cdi": "DirectoryOrCreate"},
    )


STATE = State("state-RDMA-device-plugin", ("rdmaSharedDevicePlugin",),
              "RDMASharedDevicePluginReady", render)
