"""state-ib-kubernetes: the Deployment that manages InfiniBand PKeys and GUIDs through UFM."""

from __future__ import annotations

from nicop.api.mellanox import IBKubernetesSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    CONTROL_PLANE_TOLERATION,
    GPU_TOLERATION,
    MASTER_TOLERATION,
    Context,
    RenderError,
    State,
    cluster_rbac,
    container,
    deployment,
    image,
    resources,
    service_account,
    typed,
)

NAME = "ib-kubernetes"


def field_ref(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    """As upstream's manifests/state-ib-kubernetes/: one replica, replaced (never two at once:
    both would program the same PKeys), on the host network."""
    spec = typed(IBKubernetesSpec, section, path)
    secret = spec.ufm_secret
    if not secret:
        raise RenderError(f"{path}.ufmSecret", "must name the Secret with the UFM credentials")
    env = [
        field_ref("K8S_NODE", "spec.nodeName"),
        field_ref("POD_NAMESPACE", "metadata.namespace"),
        field_ref("POD_UID", "metadata.uid"),
        {"name": "DAEMON_SM_PLUGIN", "value": "ufm"},
        {"name": "DAEMON_PERIODIC_UPDATE", "value": str(spec.periodic_update_seconds)},
        {"name": "GUID_POOL_RANGE_START", "value": spec.p_key_guid_pool_range_start},
        {"name": "GUID_POOL_RANGE_END", "value": spec.p_key_guid_pool_range_end},
    ] + [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key,
                                                     **({"optional": True} if optional else {})}}}
        for key, optional in (
            ("UFM_USERNAME", False), ("UFM_PASSWORD", False), ("UFM_ADDRESS", False),
            ("UFM_HTTP_SCHEMA", True), ("UFM_PORT", True), ("UFM_CERTIFICATE", True),
        )
    ]
    deploy = deployment(
        ctx, NAME, spec,
        [container(NAME, image(ctx, spec, path), spec, command=["/ib-kubernetes"], env=env,
                   default_resources=resources("100m", "300Mi"))],
        tolerations=[MASTER_TOLERATION, CONTROL_PLANE_TOLERATION, GPU_TOLERATION],
        service_account_name=NAME, selector={"name": NAME},
        pod_labels={"component": "network", "type": "infra", "kubernetes.io/os": "linux"})
    deploy["spec"]["strategy"] = {"type": "Recreate"}
    deploy["spec"]["template"]["spec"]["hostNetwork"] = True
    return [
        service_account(ctx, NAME),
        *cluster_rbac(ctx, NAME, [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch",
                                                                 "update", "patch"]},
            {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
             "verbs": ["get", "list", "watch"]},
        ]),
        deploy,
    ]


STATE = State("state-ib-kubernetes", ("ibKubernetes",), "IBKubernetesReady", render)
