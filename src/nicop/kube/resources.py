"""Kinds the runtime talks about: where each lives in the API (group, version, plural, scope).

Objects themselves stay plain JSON dicts: controllers render and compare dicts, and nothing pays
for model parsing on the hot path of a 1000-node cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection, or of one object when `name` is given."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base

    def __str__(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


NAMESPACE = Resource("", "v1", "Namespace", "namespaces", namespaced=False)
NODE = Resource("", "v1", "Node", "nodes", namespaced=False)
POD = Resource("", "v1", "Pod", "pods")
CONFIGMAP = Resource("", "v1", "ConfigMap", "configmaps")
SECRET = Resource("", "v1", "Secret", "secrets")
SERVICE = Resource("", "v1", "Service", "services")
SERVICE_ACCOUNT = Resource("", "v1", "ServiceAccount", "serviceaccounts")
EVENT = Resource("", "v1", "Event", "events")
DAEMONSET = Resource("apps", "v1", "DaemonSet", "daemonsets")
DEPLOYMENT = Resource("apps", "v1", "Deployment", "deployments")
CONTROLLER_REVISION = Resource("apps", "v1", "ControllerRevision", "controllerrevisions")
CLUSTER_ROLE = Resource(
    "rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", namespaced=False
)
CLUSTER_ROLE_BINDING = Resource(
    "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings",
    namespaced=False,
)
ROLE = Resource("rbac.authorization.k8s.io", "v1", "Role", "roles")
ROLE_BINDING = Resource("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings")
LEASE = Resource("coordination.k8s.io", "v1", "Lease", "leases")
CRD = Resource(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions",
    namespaced=False,
)
PERSISTENT_VOLUME_CLAIM = Resource("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
POD_DISRUPTION_BUDGET = Resource("policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets")
NETWORK_ATTACHMENT_DEFINITION = Resource(
    "k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition", "network-attachment-definitions"
)

# nicop's kinds (their models and CRDs are in nicop.api).
NIC_CLUSTER_POLICY = Resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                              "nicclusterpolicies", namespaced=False)
IPPOOL = Resource("nv-ipam.nvidia.com", "v1alpha1", "IPPool", "ippools")
CIDRPOOL = Resource("nv-ipam.nvidia.com", "v1alpha1", "CIDRPool", "cidrpools")
SRIOV_GROUP, SRIOV_VERSION = "sriovnetwork.openshift.io", "v1"
SRIOV_NODE_POLICY = Resource(SRIOV_GROUP, SRIOV_VERSION, "SriovNetworkNodePolicy",
                             "sriovnetworknodepolicies")
SRIOV_NODE_STATE = Resource(SRIOV_GROUP, SRIOV_VERSION, "SriovNetworkNodeState",
                            "sriovnetworknodestates")
SRIOV_OPERATOR_CONFIG = Resource(SRIOV_GROUP, SRIOV_VERSION, "SriovOperatorConfig",
                                 "sriovoperatorconfigs")
SRIOV_POOL_CONFIG = Resource(SRIOV_GROUP, SRIOV_VERSION, "SriovNetworkPoolConfig",
                             "sriovnetworkpoolconfigs")
SRIOV_NETWORK = Resource(SRIOV_GROUP, SRIOV_VERSION, "SriovNetwork", "sriovnetworks")
# The SR-IOV DRA driver's API (nicop.api.sriovdra).
SRIOV_DRA_GROUP = "sriovnetwork.k8snetworkplumbingwg.io"
SRIOV_RESOURCE_POLICY = Resource(SRIOV_DRA_GROUP, "v1alpha1", "SriovResourcePolicy",
                                 "sriovresourcepolicies")
DEVICE_ATTRIBUTES = Resource(SRIOV_DRA_GROUP, "v1alpha1", "DeviceAttributes", "deviceattributes")
SRIOV_IB_NETWORK = Resource(SRIOV_GROUP, SRIOV_VERSION, "SriovIBNetwork", "sriovibnetworks")
OVS_NETWORK = Resource(SRIOV_GROUP, SRIOV_VERSION, "OVSNetwork", "ovsnetworks")
MAINTENANCE_GROUP = "maintenance.nvidia.com"
NODE_MAINTENANCE = Resource(MAINTENANCE_GROUP, "v1alpha1", "NodeMaintenance", "nodemaintenances")
MAINTENANCE_CONFIG = Resource(MAINTENANCE_GROUP, "v1alpha1", "MaintenanceOperatorConfig",
                              "maintenanceoperatorconfigs")
RESOURCE_SLICE = Resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices",
                          namespaced=False)
DEVICE_CLASS = Resource("resource.k8s.io", "v1", "DeviceClass", "deviceclasses",
                        namespaced=False)
RESOURCE_CLAIM = Resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
RESOURCE_CLAIM_TEMPLATE = Resource("resource.k8s.io", "v1", "ResourceClaimTemplate",
                                   "resourceclaimtemplates")

BUILTIN = {
    r.api_version + "/" + r.kind: r
    for r in (
        NAMESPACE, NODE, POD, CONFIGMAP, SECRET, SERVICE, SERVICE_ACCOUNT, EVENT, DAEMONSET,
        DEPLOYMENT, CONTROLLER_REVISION, CLUSTER_ROLE, CLUSTER_ROLE_BINDING, ROLE, ROLE_BINDING,
        LEASE, CRD, PERSISTENT_VOLUME_CLAIM,
        POD_DISRUPTION_BUDGET, NETWORK_ATTACHMENT_DEFINITION, RESOURCE_SLICE, DEVICE_CLASS,
        RESOURCE_CLAIM, RESOURCE_CLAIM_TEMPLATE,
    )
}


def resource_of(obj: Obj) -> Resource:
    """The Resource of a rendered object, from its apiVersion and kind."""
    key = f"{obj['apiVersion']}/{obj['kind']}"
    try:
        return BUILTIN[key]
    except KeyError:
        raise KeyError(f"no Resource registered for {key}") from None


def meta(obj: Obj) -> Obj:
    return obj.setdefault("metadata", {})  # type: ignore[no-any-return]


def key_of(obj: Obj) -> str:
    """`namespace/name`, or `name` for cluster-scoped objects: the work-queue key."""
    m = obj.get("metadata", {})
    ns = m.get("namespace")
    return f"{ns}/{m['name']}" if ns else str(m["name"])


# A Kubernetes quantity: a decimal number, then an exponent or one suffix (binary or SI).
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))"
                       r"(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$")
_SUFFIX = {"Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
           "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
           "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
           "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9),
           "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18)}


def quantity(value: Any) -> int:
    """A quantity (`3`, `1k`, `2Ki`) as a whole number, as device counts and counters are; 0
    when it is not a quantity."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return 0
    number, exponent, suffix = match.groups()
    amount = Decimal(number)
    if exponent:
        amount = amount.scaleb(int(exponent))
    elif suffix:
        amount *= _SUFFIX[suffix]
    return int(amount)
