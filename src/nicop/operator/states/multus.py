"""state-multus-cni: the Multus meta-plugin on every Linux node."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    Context,
    State,
    cluster_rbac,
    config_map,
    container,
    daemonset,
    host_path,
    image,
    service_account,
)

NAME = "multus"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    objects = [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "update"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
         "verbs": ["create", "patch", "update"]},
    ])]
    cni_conf, cni_conf_mount = host_path("cni", ctx.cni_network_dir, "/host/etc/cni/net.d")
    cni_bin, cni_bin_mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    volumes, mounts = [cni_conf, cni_bin], [cni_conf_mount, cni_bin_mount]
    args = ["--multus-conf-file=auto", "--cni-version=0.3.1"]
    config = spec.get("config")
    if config:
        objects.append(config_map(ctx, "multus-cni-config", {"cni-conf.json": config}))
        volumes.append({"name": "multus-cfg", "configMap": {
            "name": "multus-cni-config", "items": [{"key": "cni-conf.json",
                                                    "path": "70-multus.conf"}]}})
        mounts.append({"name": "multus-cfg", "mountPath": "/tmp/multus-conf"})
        args = ["--multus-conf-file=/tmp/multus-conf/70-multus.conf"]
    objects.append(daemonset(
        ctx, "kube-multus-ds", spec,
        [container("kube-multus", image(ctx, spec, path), spec, mounts=mounts, privileged=True,
                   command=["/thin_entrypoint"], args=args)],
        app="multus", volumes=volumes, service_account_name=NAME, config=config,
        managed_only=False,
    ))
    return objects


STATE = State("state-multus-cni", ("secondaryNetwork", "multus"), "MultusCNIReady", render)
