"""state-nv-ipam-cni: the nv-ipam controller (carves pools per node) and its node agent."""

from __future__ import annotations

from nicop.api.mellanox import NVIPAMSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    CONTROL_PLANE_TOLERATION,
    GPU_TOLERATION,
    MASTER_TOLERATION,
    Context,
    State,
    cluster_rbac,
    container,
    daemonset,
    deployment,
    host_path,
    image,
    resources,
    service_account,
    typed,
)

CONTROLLER = "nv-ipam-controller"
NODE = "nv-ipam-node"
POOLS = {"apiGroups": ["nv-ipam.nvidia.com"], "resources": ["ippools", "cidrpools",
                                                           "ippools/status",
                                                           "cidrpools/status"],
         "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    spec = typed(NVIPAMSpec, section, path)
    ref = image(ctx, spec, path)
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
        node_agent(ctx, spec, ref),
    ]


def node_agent(ctx: Context, spec: NVIPAMSpec, ref: str) -> Obj:
    """Upstream's nv-ipam-node (manifests/state-nv-ipam-cni/040-nv-ipam-node.yaml): the node
    daemon and its CNI shim, installed into the host's CNI directories, in the pod network."""
    dirs = [("cnibin", ctx.cni_bin_dir, "/opt/cni/bin"),
            ("cniconf", f"{ctx.cni_network_dir}/nv-ipam.d", "/etc/cni/net.d/nv-ipam.d"),
            ("daemonstate", "/var/lib/cni/nv-ipam/", "/var/lib/cni/nv-ipam/")]
    volumes, mounts = zip(*(host_path(name, host, mount, type_="DirectoryOrCreate")
                            for name, host, mount in dirs), strict=True)
    socket = "unix:///var/lib/cni/nv-ipam/daemon.sock"
    args = ["--node-name=$(NODE_NAME)", "--v=1", "--logging-format=json",
            f"--bind-address={socket}", "--store-file=/var/lib/cni/nv-ipam/store",
            f"--cni-daemon-socket={socket}", "--cni-daemon-call-timeout=5",
            "--cni-bin-dir=/opt/cni/bin", "--cni-conf-dir=/etc/cni/net.d/nv-ipam.d",
            "--cni-log-file=/var/log/nv-ipam-cni.log", "--cni-log-level=info",
            "--ippools-namespace=$(IPPOOLS_NAMESPACE)"]
    env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "IPPOOLS_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    agent = container(NODE, ref, spec, env=env, command=["/ipam-node"], args=args,
                      default_resources=resources("100m", "50Mi", "300m", "300Mi"),
                      securityContext={"privileged": True, "runAsUser": 0},
                      mounts=list(mounts))
    return daemonset(ctx, NODE, spec, [agent], app="nv-ipam", volumes=list(volumes),
                     service_account_name=NODE, host_network=False, grace_period=10,
                     selector={"name": NODE}, pod_labels={"component": NODE})


def controller(ctx: Context, spec: NVIPAMSpec, ref: str) -> Obj:
    """Two leader-electing replicas, as upstream's (040-nv-ipam-controller.yaml): on different
    nodes where the scheduler can, so a node lost does not stop pool allocation for new
    nodes."""
    namespace = {"name": "POD_NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    args = ["--leader-elect=true", "--leader-elect-namespace=$(POD_NAMESPACE)",
            "--ippools-namespace=$(POD_NAMESPACE)"]
    if spec.enable_webhook:
        args.append("--webhook=true")
    manager = container(
        CONTROLLER, ref, spec, command=["/ipam-controller"], args=args, env=[namespace],
        securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        livenessProbe={"httpGet": {"path": "/healthz", "port": 8081},
                       "initialDelaySeconds": 15, "periodSeconds": 20},
        readinessProbe={"httpGet": {"path": "/readyz", "port": 8081},
                        "initialDelaySeconds": 5, "periodSeconds": 10},
        default_resources=resources("100m", "300Mi"))
    obj = deployment(ctx, CONTROLLER, spec, [manager],
                     tolerations=[GPU_TOLERATION, MASTER_TOLERATION, CONTROL_PLANE_TOLERATION],
                     service_account_name=CONTROLLER, selector={"name": CONTROLLER},
                     pod_labels={"component": CONTROLLER, "app": "nv-ipam"})
    obj["spec"]["replicas"] = 2
    obj["spec"]["strategy"] = {"type": "RollingUpdate"}
    obj["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"] = {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchExpressions": [
                    {"key": "name", "operator": "In", "values": [CONTROLLER]}]},
                "topologyKey": "kubernetes.io/hostname"}}]}
    return obj


STATE = State("state-nv-ipam-cni", ("nvIpam",), "NVIPAMReady", render)
