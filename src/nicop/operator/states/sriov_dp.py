"""state-SRIOV-device-plugin: the SR-IOV network device plugin and its config."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import Context, State
from nicop.operator.states.device_plugins import device_plugin

NAME = "network-operator-sriov-device-plugin"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    """As upstream's manifests/state-sriov-device-plugin/. For a NicNodePolicy, upstream names
    the DaemonSet by the policy's name hash and the ConfigMap by its name; the ServiceAccount
    is shared."""
    name = f"{NAME}{ctx.name_hash_suffix}"
    return device_plugin(
        ctx, spec, path, name=name,
        container_name="kube-sriovdp", app="sriovdp",
        config_map_name=f"network-operator-sriovdp-config{ctx.name_suffix}",
        config_volume="config-volume", config_dir="/etc/pcidp",
        host_dirs={"devicesock": ("/var/lib/kubelet/device-plugins",
                                  "/var/lib/kubelet/device-plugins", None),
                   "plugins-registry": ("/var/lib/kubelet/plugins_registry",
                                        "/var/lib/kubelet/plugins_registry", None),
                   "log": ("/var/log", "/var/log", None),
                   "device-info": ("/var/run/k8s.cni.cncf.io/devinfo/dp",
                                   "/var/run/k8s.cni.cncf.io/devinfo/dp",
                                   "DirectoryOrCreate")},
        mount_order=["devicesock", "plugins-registry", "log", "config-volume", "device-info"],
        volume_order=["devicesock", "plugins-registry", "log", "device-info", "config-volume"],
        # With CDI the plugin writes its specs and reads the host's /etc/pcidp.
        cdi_dirs={"dynamic-cdi": ("/var/run/cdi", "/var/run/cdi", "DirectoryOrCreate"),
                  "host-config-volume": ("/etc/pcidp", "/host/etc/pcidp/",
                                         "DirectoryOrCreate")},
        args=["--log-dir=sriovdp", "--log-level=10"], agent="sriov-device-plugin",
        selector={"name": name}, pod_labels={"tier": "node"}, service_account_name=NAME,
    )


STATE = State("state-SRIOV-device-plugin", ("sriovDevicePlugin",), "SRIOVDevicePluginReady",
              render)
