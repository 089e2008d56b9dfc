"""state-SRIOV-device-plugin: the SR-IOV network device plugin and its config."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State
from nicop.operator.states.device_plugins import device_plugin


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    return device_plugin(
        ctx, spec, path, name="network-operator-sriov-device-plugin",
        container_name="kube-sriovdp", app="sriovdp",
        config_map_name="network-operator-sriovdp-config", config_dir="/etc/pcidp",
        host_dirs={"devicesock": "/var/lib/kubelet/device-plugins",
                   "plugins-registry": "/var/lib/kubelet/plugins_registry",
                   "log": "/var/log", "device-info": "/var/run/k8s.cni.cncf.io/devinfo/dp",
                   "cdi": "/var/run/cdi"},
        args=["--log-dir=sriovdp", "--log-level=10"], agent="sriov-device-plugin",
    )


STATE = State("state-SRIOV-device-plugin", ("sriovDevicePlugin",), "SRIOVDevicePluginReady",
              render)
