"""state-multus-cni: the Multus meta-plugin on every Linux node."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    NODE_CRITICAL,
    Context,
    State,
    cluster_rbac,
    config_map,
    container,
    daemonset,
    host_path,
    image,
    resources,
    service_account,
)

NAME = "multus"
CONF_DIR = "/tmp/multus-conf"  # where the configured file is mounted in the container
CONF_FILE = "00-multus.conf"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    objects = [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "update"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
         "verbs": ["create", "patch", "update"]},
    ])]
    cni_conf, cni_conf_mount = host_path("cninetwork", ctx.cni_network_dir,
                                         "/host/etc/cni/net.d")
    cni_bin, cni_bin_mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    volumes, mounts = [cni_conf, cni_bin], [cni_conf_mount, cni_bin_mount]
    conf_file = "auto"
    config = spec.get("config")
    if config:
        objects.append(config_map(ctx, "multus-cni-config", {"cni-conf.json": config}))
        volumes.append({"name": "multus-cni-config", "configMap": {
            "name": "multus-cni-config", "items": [{"key": "cni-conf.json",
                                                    "path": CONF_FILE}]}})
        mounts.append({"name": "multus-cni-config", "mountPath": CONF_DIR})
        conf_file = f"{CONF_DIR}/{CONF_FILE}"
    ref = image(ctx, spec, path)
    # The thin plugin: an init container copies the multus binary onto the host, the daemon
    # writes the configuration that points the runtime at it (upstream's
    # manifests/state-multus-cni/0050-multus-ds.yml, whose containers run as root and set
    # no pull policy).
    as_root = {"privileged": True, "runAsUser": 0}
    install = container(
        "install-multus-binary", ref, {}, pull_policy=None,
        mounts=[{**cni_bin_mount, "mountPropagation": "Bidirectional"}],
        command=["/install_multus"], args=["--type", "thin"],
        resources={"requests": {"cpu": "10m", "memory": "15Mi"}},
        securityContext=as_root, terminationMessagePolicy="FallbackToLogsOnError")
    args = [
        f"--multus-conf-file={conf_file}",
        "--multus-autoconfig-dir=/host/etc/cni/net.d",
        "--cni-conf-dir=/host/etc/cni/net.d",
        "--cleanup-config-on-exit",
        "--skip-config-watch",
        "--cni-bin-dir=/host/opt/cni/bin",
        f"--multus-kubeconfig-file-host={ctx.cni_network_dir}/multus.d/multus.kubeconfig",
    ]
    objects.append(daemonset(
        ctx, "kube-multus-ds", spec,
        [container("kube-multus", ref, spec, mounts=mounts, pull_policy=None,
                   command=["/thin_entrypoint"], args=args,
                   default_resources=resources("100m", "50Mi", "100m", "50Mi"),
                   securityContext=as_root, terminationMessagePolicy="FallbackToLogsOnError")],
        app="multus", volumes=volumes, service_account_name=NAME, config=config or None,
        managed_only=False, init_containers=[install], priority_class=NODE_CRITICAL,
        grace_period=10, selector={"name": "multus"}, pod_labels={"tier": "node"},
    ))
    return objects


STATE = State("state-multus-cni", ("secondaryNetwork", "multus"), "MultusCNIReady", render)
