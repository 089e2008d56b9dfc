"""state-SRIOV-device-plugin: the SR-IOV network device plugin and its config."""

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

CONFIG_MAP = "network-operator-sriovdp-config"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    config = json_config(spec, path)
    objects = []
    volumes, mounts = [], []
    for name, host in (("devicesock", "/var/lib/kubelet/device-plugins"),
                       ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
                       ("log", "/var/log"), ("device-info", "/var/run/k8s.cni.cncf.io/devinfo/dp"),
                       ("cdi", "/var/run/cdi")):
        volume, mount = host_path(name, host)
        volumes.append(volume)
        mounts.append(mount)
    if config is not None:
        objects.append(config_map(ctx, CONFIG_MAP, {"config.json": spec["config"]}))
        volumes.append({"name": "config-volume", "configMap": {"name": CONFIG_MAP, "items": [
            {"key": "config.json", "path": "config.json"}]}})
        mounts.append({"name": "config-volume", "mountPath": "/etc/pcidp"})
    args = ["--log-dir=sriovdp", "--log-level=10"] + (["--use-cdi"] if spec.get("useCdi") else [])
    objects.append(daemonset(
        ctx, "network-operator-sriov-device-plugin", spec,
        [container("kube-sriovdp", image(ctx, spec, path), spec, mounts=mounts,
                   privileged=True, args=args)],
        app="sriovdp", node_selector=AFTER_DRIVER, volumes=volumes, config=config,
    ))
    return objects


STATE = State("state-SRIOV-device-plugin", ("sriovDevicePlugin",), "SRIOVDevicePluginReady",
              render)
