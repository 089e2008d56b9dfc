"""state-ib-kubernetes: the Deployment that manages InfiniBand PKeys and GUIDs through UFM."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    Context,
    RenderError,
    State,
    cluster_rbac,
    container,
    deployment,
    image,
    service_account,
)

NAME = "ib-kubernetes"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    for field in ("pKeyGUIDPoolRangeStart", "pKeyGUIDPoolRangeEnd", "ufmSecret"):
        if not spec.get(field):
            raise RenderError(f"{path}.{field}", "is required")
    secret = spec["ufmSecret"]
    env = [
        {"name": "DAEMON_SM_PLUGIN", "value": "ufm"},
        {"name": "DAEMON_PERIODIC_UPDATE", "value": str(spec.get("periodicUpdateSeconds", 5))},
        {"name": "GUID_POOL_RANGE_START", "value": spec["pKeyGUIDPoolRangeStart"]},
        {"name": "GUID_POOL_RANGE_END", "value": spec["pKeyGUIDPoolRangeEnd"]},
    ] + [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key,
                                                     "optional": key not in required}}}
        for key, required in (
            ("UFM_USERNAME", ("UFM_USERNAME", "UFM_PASSWORD")),
            ("UFM_PASSWORD", ("UFM_USERNAME", "UFM_PASSWORD")),
            ("UFM_ADDRESS", ()), ("UFM_HTTP_SCHEMA", ()), ("UFM_PORT", ()),
            ("UFM_CERTIFICATE", ()),
        )
    ]
    return [
        service_account(ctx, NAME),
        *cluster_rbac(ctx, NAME, [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch",
                                                                 "update", "patch"]},
            {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
             "verbs": ["get", "list", "watch"]},
        ]),
        deployment(ctx, NAME, spec,
                   [container(NAME, image(ctx, spec, path), spec, env=env)],
                   service_account_name=NAME, selector={"name": NAME},
                   pod_labels={"component": "network", "type": "infra",
                               "kubernetes.io/os": "linux"}),
    ]


STATE = State("state-ib-kubernetes", ("ibKubernetes",), "IBKubernetesReady", render)
