"""state-RDMA-device-plugin: the RDMA shared device plugin and its config, after the driver."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State
from nicop.operator.states.device_plugins import device_plugin


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    """As upstream's manifests/state-rdma-shared-device-plugin/. For a NicNodePolicy, upstream
    names the DaemonSet by the policy's name hash and the ConfigMap and `app` label by its
    name."""
    app = f"rdma-shared-dp{ctx.name_suffix}"
    return device_plugin(
        ctx, spec, path, name=f"rdma-shared-dp-ds{ctx.name_hash_suffix}",
        container_name="rdma-shared-dp", app=app,
        config_map_name=f"rdma-devices{ctx.name_suffix}", config_volume="config",
        config_dir="/k8s-rdma-shared-dev-plugin",
        host_dirs={"device-plugin": ("/var/lib/kubelet/device-plugins",
                                     "/var/lib/kubelet/device-plugins", None),
                   "plugins-registry": ("/var/lib/kubelet/plugins_registry",
                                        "/var/lib/kubelet/plugins_registry", None),
                   "devs": ("/dev/", "/dev/", None)},
        mount_order=["device-plugin", "plugins-registry", "config", "devs"],
        volume_order=["device-plugin", "plugins-registry", "config", "devs"],
        # With CDI the plugin writes its specs and reads the host's /etc/pcidp.
        cdi_dirs={"dynamic-cdi": ("/var/run/cdi", "/var/run/cdi", "DirectoryOrCreate"),
                  "host-config-volume": ("/etc/pcidp", "/host/etc/pcidp/",
                                         "DirectoryOrCreate")},
        command=["/bin/k8s-rdma-shared-dp"], args=[], agent="rdma-device-plugin",
        selector={"app": app},
    )


STATE = State("state-RDMA-device-plugin", ("rdmaSharedDevicePlugin",),
              "RDMASharedDevicePluginReady", render)
