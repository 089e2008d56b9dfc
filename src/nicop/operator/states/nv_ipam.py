"""state-nv-ipam-cni: the nv-ipam controller (carves pools per node) and its node agent."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    Context,
    State,
    cluster_rbac,
    container,
    daemonset,
    deployment,
    host_path,
    image,
    service_account,
)

CONTROLLER = "nv-ipam-controller"
NODE = "nv-ipam-node"
POOLS = {"apiGroups": ["nv-ipam.nvidia.com"], "resources": ["ippools", "cidrpools",
                                                           "ippools/status",
                                                           "cidrpools/status"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    ref = image(ctx, spec, path)
    cni_bin, cni_bin_mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin",
                                       type_="DirectoryOrCreate")
    state_dir, state_mount = host_path("nv-ipam-state", "/var/lib/cni/nv-ipam",
                                       type_="DirectoryOrCreate")
    nodes_rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    pods_rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    return [
        service_account(ctx, CONTROLLER),
        *cluster_rbac(ctx, CONTROLLER, [POOLS, nodes_rule,
                                        {"apiGroups": ["coordination.k8s.io"],
                                         "resources": ["leases"], "verbs": ["*"]}]),
        controller(ctx, spec, ref),
        service_account(ctx, NODE),
        *cluster_rbac(ctx, NODE, [POOLS, nodes_rule, pods_rule]),
        daemonset(ctx, NODE, spec,
                  [container(NODE, ref, spec, command=["/ipam-node"],
                             mounts=[cni_bin_mount, state_mount], privileged=True,
                             args=[f"--ippools-namespace={ctx.namespace}"])],
                  app="nv-ipam", volumes=[cni_bin, state_dir], service_account_name=NODE,
                  selector={"name": NODE}, pod_labels={"component": NODE}),
    ]


def controller(ctx: Context, spec: Obj, ref: str) -> Obj:
    """Two leader-electing replicas, as upstream's: on different nodes where the scheduler can,
    so a node lost does not stop pool allocation for new nodes."""
    obj = deployment(ctx, CONTROLLER, spec,
                     [container(CONTROLLER, ref, spec, command=["/ipam-controller"],
                                args=["--leader-elect=true",
                                      f"--ippools-namespace={ctx.namespace}"])],
                     service_account_name=CONTROLLER, selector={"name": CONTROLLER},
                     pod_labels={"component": CONTROLLER, "app": "nv-ipam"})
    obj["spec"]["replicas"] = 2
    obj["spec"]["template"]["spec"].setdefault("affinity", {})["podAntiAffinity"] = {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchLabels": {"name": CONTROLLER}},
                "topologyKey": "kubernetes.io/hostname"}}]}
    return obj


STATE = State("state-nv-ipam-cni", ("nvIpam",), "NVIPAMReady", render)
