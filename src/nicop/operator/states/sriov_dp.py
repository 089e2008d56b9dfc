"""state-SRIOV-device-plugin: the SR-IOV network device plugin and its config."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State
from nicop.operator.states.device_plugins import device_plugin

NAME = "network-operator-sriov-device-plugin"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    return device_plugin(
        ctx, spec, path, name=NAME,
        container_name="kube-sriovdp", app="sriovdp",
        config_map_name="network-operator-sriovdp-config", config_dir="/etc/pcidp",
        host_dirs={"devicesock": "/var/lib/kubelet/device-plugins",
                   "plugins-registry": "/var/lib/kubelet/plugins_registry",
                   "log": "/var/log", "device-info": "/var/run/k8s.cni.cncf.io/devinfo/dp"},
        args=["--log-dir=sriovdp", "--log-level=10"], agent="sriov-device-plugin",
        selector={"name": NAME}, pod_labels={"tier": "node"}, service_account_name=NAME,
        host_types={"device-info": "DirectoryOrCreate", "dynamic-cdi": "DirectoryOrCreate",
                    "host-config-volume": "DirectoryOrCreate"},
        # With CDI the plugin writes its specs and reads the host's /etc/pcidp, as upstream's
        # manifests/state-sriov-device-plugin/0030-sriov-dp-daemonset.yaml mounts them.
        cdi_dirs={"dynamic-cdi": ("/var/run/cdi", "/var/run/cdi"),
                  "host-config-volume": ("/etc/pcidp", "/host/etc/pcidp/")},
    )


STATE = State("state-SRIOV-device-plugin", ("sriovDevicePlugin",), "SRIOVDevicePluginReady",
              render)
