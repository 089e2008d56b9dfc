"""state-DRA-driver: nicop's DRA driver (`nicop dra-plugin`) on every node, and its DeviceClasses.

Upstream has no such component; the section is nicop's own. The plugin publishes the node's
RDMA NICs and VFs as ResourceSlices and prepares the claims the kubelet hands it, so its
DaemonSet mounts the kubelet's plugin directories and the CDI directory. Unlike the device
plugins it does not wait for the driver (mofed.wait "false"): a driver reload would take its pod,
and the node's whole pool, away; it stays and taints the node's NICs while the driver is not
ready (nicop.node.dra.driver_state), which it reads from its Node.
"""

from __future__ import annotations

from nicop.api import dra
from nicop.api.agents import METRICS_PORTS
from nicop.api.labels import OWNER_LABEL, SRIOV_BY_DRA_LABEL
from nicop.api.mellanox import DRADriverSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    EVENTS_RULE,
    Context,
    State,
    agent_container,
    cluster_rbac,
    daemonset,
    host_path,
    metadata,
    service_account,
    typed,
)

NAME = "nicop-dra-driver"
AGENT = "dra-plugin"
RESOURCE_GROUP = "resource.k8s.io"
# What the plugin does in the API: its node's ResourceSlices (owned by the Node), the claims
# it prepares, and Events on its pod.
RULES: list[Obj] = [
    {"apiGroups": [RESOURCE_GROUP], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": [RESOURCE_GROUP], "resources": ["resourceclaims"],
     "verbs": ["get", "list", "watch"]},
    # The prepared devices' status.devices: only this driver's entries, only on its own node
    # (Kubernetes 1.36's granular status authorization).
    {"apiGroups": [RESOURCE_GROUP], "resources": ["resourceclaims/status"],
     "verbs": ["get", "patch"]},
    {"apiGroups": [RESOURCE_GROUP], "resources": ["resourceclaims/driver"],
     "resourceNames": [dra.DRIVER], "verbs": ["associated-node:patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    # Its node's SriovNetworkNodeState: the VFs planned, published before they are made.
    {"apiGroups": ["sriovnetwork.openshift.io"], "resources": ["sriovnetworknodestates"],
     "verbs": ["get", "list", "watch"]},
    # The SR-IOV DRA driver's API: which VFs to advertise, with which attributes.
    {"apiGroups": ["sriovnetwork.k8snetworkplumbingwg.io"],
     "resources": ["sriovresourcepolicies", "deviceattributes"],
     "verbs": ["get", "list", "watch"]},
    # The DeviceClass of a pod's extended resource: its name for the pod's variable.
    {"apiGroups": [RESOURCE_GROUP], "resources": ["deviceclasses"], "verbs": ["get"]},
    EVENTS_RULE,
]
HOST_DIRS = {"plugins": dra.PLUGINS_DIR, "plugins-registry": dra.REGISTRY_DIR, "cdi": dra.CDI_DIR,
             "sys": "/sys", "devs": "/dev"}


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    """The plugin's ServiceAccount and RBAC, its DaemonSet (one per NicNodePolicy, named by the
    policy's hash as the device plugins are) and the two DeviceClasses claims name."""
    spec = typed(DRADriverSpec, section, path)
    volumes, mounts = [], []
    for volume_name, host in HOST_DIRS.items():
        volume, mount = host_path(volume_name, host,
                                  type_="DirectoryOrCreate" if host != "/sys" else None)
        volumes.append(volume)
        mounts.append(mount)
    node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    command = [AGENT, *(["--shared-rdma"] if spec.shared_rdma else []),
               *(["--sriov-resources"] if spec.sriov_resources else [])]
    plugin = agent_container(ctx, "dra-plugin", spec, command, mounts=mounts, env=[node_name],
                             metrics_port=METRICS_PORTS[AGENT])
    app = f"{NAME}{ctx.name_suffix}"
    sriov_by_dra = {SRIOV_BY_DRA_LABEL: "true"} if spec.sriov_resources else {}
    classes = [{**c, "metadata": {**c["metadata"], **metadata(ctx, c["metadata"]["name"],
                                                                namespaced=False)}}
               for c in dra.device_classes()]
    return [
        service_account(ctx, NAME),
        *cluster_rbac(ctx, NAME, RULES),
        daemonset(ctx, f"{NAME}-ds{ctx.name_hash_suffix}", spec, [plugin], app=app,
                  volumes=volumes, service_account_name=NAME,
                  pod_labels={OWNER_LABEL: ctx.owner, **sriov_by_dra}),
        *classes,
    ]


STATE = State("state-DRA-driver", ("draDriver",), "DRADriverReady", render)
