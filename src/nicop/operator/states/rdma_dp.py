"""state-RDMA-device-plugin: the RDMA shared device plugin and its config, after the driver."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    AFTER_DRIVER,
    Context,
    State,
    config_map,
    container,
    daemonset,
    host_path,
    image,
    json_config,
)

CONFIG_MAP = "rdma-devices"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    config = json_config(spec, path)
    objects = []
    volumes, mounts = [], []
    for name, host in (("device-plugin", "/var/lib/kubelet/device-plugins"),
                       ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
                       ("devs", "/dev/"), ("cdi", "/var/run/cdi")):
        volume, mount = host_path(name, host)
        volumes.append(volume)
        mounts.append(mount)
    if config is not None:
        objects.append(config_map(ctx, CONFIG_MAP, {"config.json": spec["config"]}))
        volumes.append({"name": "config", "configMap": {"name": CONFIG_MAP, "items": [
            {"key": "config.json", "path": "config.json"}]}})
        mounts.append({"name": "config", "mountPath": "/k8s-rdma-shared-dev-plugin"})
    args = ["--use-cdi"] if spec.get("useCdi") else []
    objects.append(daemonset(
        ctx, "rdma-shared-dp-ds", spec,
        [container("rdma-shared-dp", image(ctx, spec, path), spec, mounts=mounts,
                   privileged=True, args=args)],
        app="rdma-shared-dp", node_selector=AFTER_DRIVER, volumes=volumes, config=config,
    ))
    return objects


STATE = State("state-RDMA-device-plugin", ("rdmaSharedDevicePlugin",),
              "RDMASharedDevicePluginReady", render)
