"""state-spectrum-x-operator: the Spectrum-X flow controller on every node with a Mellanox NIC,
its RBAC and the SpectrumXRailPoolConfig CRD, as upstream renders them
(Mellanox/network-operator manifests/state-spectrum-x-operator). nicop has no agent of its own
for it: it runs upstream's image."""

from __future__ import annotations

from nicop.api.labels import MELLANOX_LABEL
from nicop.api.mellanox import SpectrumXOperatorSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    Context,
    State,
    cluster_rbac,
    container,
    daemonset,
    host_path,
    image,
    service_account,
    typed,
)
from nicop.operator.states.component_crds import preserved_crd

NAME = "spectrum-x-operator"
FLOW_CONTROLLER = "spectrum-x-flowcontroller"
SELECTOR = {"control-plane": FLOW_CONTROLLER}
ALL = ["create", "delete", "get", "list", "patch", "update", "watch"]
RULES: list[Obj] = [
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ALL},
    {"apiGroups": [""], "resources": ["pods/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ALL},
    {"apiGroups": ["spectrumx.nvidia.com"], "resources": ["spectrumxrailpoolconfigs"],
     "verbs": ALL},
    {"apiGroups": ["spectrumx.nvidia.com"], "resources": ["spectrumxrailpoolconfigs/finalizers"],
     "verbs": ["update"]},
    {"apiGroups": ["spectrumx.nvidia.com"], "resources": ["spectrumxrailpoolconfigs/status"],
     "verbs": ["get", "patch", "update"]},
    {"apiGroups": ["sriovnetwork.openshift.io"],
     "resources": ["ovsnetworks", "sriovnetworknodepolicies", "sriovnetworkpoolconfigs"],
     "verbs": ALL},
    {"apiGroups": ["sriovnetwork.openshift.io"], "resources": ["sriovnetworknodestates"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["nv-ipam.nvidia.com"], "resources": ["cidrpools"], "verbs": ALL},
]


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    spec = typed(SpectrumXOperatorSpec, section, path)
    env: list[Obj] = []
    xplane = spec.x_plane
    if xplane and xplane.version:
        env += [{"name": "XPLANE_REPOSITORY", "value": xplane.repository or ""},
                {"name": "XPLANE_IMAGE", "value": xplane.image},
                {"name": "XPLANE_VERSION", "value": xplane.version},
                {"name": "IMAGE_PULL_SECRETS", "value": ",".join(xplane.image_pull_secrets)}]
    env += [{"name": "POD_NAMESPACE",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    host = [host_path("proc", "/proc"), host_path("sys", "/sys"),
            host_path("ovs", "/var/run/openvswitch/"),
            host_path("ovs-systemd-config", "/etc/default/openvswitch-switch",
                      type_="FileOrCreate"),
            host_path("spectrum-x-lib", "/var/lib/spectrum-x", type_="DirectoryOrCreate"),
            host_path("ovs-vswitchd-dropin", "/etc/systemd/system/ovs-vswitchd.service.d",
                      type_="DirectoryOrCreate")]
    cni_bin, _ = host_path("host-cni-bin", ctx.cni_bin_dir, type_="DirectoryOrCreate")
    flow = container(
        FLOW_CONTROLLER, image(ctx, spec, path), spec, mounts=[m for _, m in host],
        command=["/flowcontroller"],
        args=["--metrics-bind-address=0", "--health-probe-bind-address=0"], env=env,
        securityContext={"privileged": True, "runAsUser": 0, "runAsGroup": 0,
                         "capabilities": {"drop": ["ALL"]}})
    ds = daemonset(ctx, FLOW_CONTROLLER, spec, [flow], app=FLOW_CONTROLLER,
                   node_selector={MELLANOX_LABEL: "true"}, managed_only=False,
                   volumes=[*(v for v, _ in host), cni_bin], service_account_name=NAME)
    ds["metadata"]["labels"].update({**SELECTOR, "app.kubernetes.io/name": NAME})
    ds["spec"]["selector"] = {"matchLabels": SELECTOR}
    ds["spec"]["template"]["metadata"] = {
        "labels": dict(SELECTOR),
        "annotations": {"kubectl.kubernetes.io/default-container": FLOW_CONTROLLER}}
    pod = ds["spec"]["template"]["spec"]
    pod["nodeSelector"] = {MELLANOX_LABEL: "true"}
    pod["securityContext"] = {"runAsNonRoot": False}
    pod["terminationGracePeriodSeconds"] = 10
    return [
        preserved_crd(ctx, "spectrumx.nvidia.com", "v1alpha2", "SpectrumXRailPoolConfig",
                      "spectrumxrailpoolconfigs"),
        service_account(ctx, NAME),
        *cluster_rbac(ctx, NAME, RULES),
        ds,
    ]


STATE = State("state-spectrum-x-operator", ("spectrumXOperator",), "SpectrumXOperatorReady",
              render)
