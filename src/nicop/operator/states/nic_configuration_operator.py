"""state-nic-configuration-operator: the NIC configuration operator (firmware and NIC settings
through CRs of configuration.net.nvidia.com) and its node daemon, as upstream renders them
(Mellanox/network-operator manifests/state-nic-configuration-operator). nicop has no agent of
its own for either: they run upstream's images."""

from __future__ import annotations

from nicop.api.mellanox import NicConfigurationOperatorSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    AFTER_DRIVER,
    CONTROL_PLANE_TOLERATION,
    GPU_TOLERATION,
    MASTER_TOLERATION,
    NODE_CRITICAL,
    Context,
    cluster_rbac,
    config_map,
    container,
    daemonset,
    deployment,
    host_path,
    image,
    metadata,
    service_account,
    typed,
)
from nicop.operator.states.component_crds import preserved_crd
from nicop.operator.states.partial import PartialState

NAME = "nic-configuration-operator"
DAEMON = "nic-configuration-daemon"
GROUP = "configuration.net.nvidia.com"
KINDS = {  # kind -> plural, of the five v1alpha1 CRDs upstream ships in this state
    "NicConfigurationTemplate": "nicconfigurationtemplates",
    "NicDevice": "nicdevices",
    "NicFirmwareSource": "nicfirmwaresources",
    "NicFirmwareTemplate": "nicfirmwaretemplates",
    "NicInterfaceNameTemplate": "nicinterfacenametemplates",
}
OPERATOR_SELECTOR = {"app.kubernetes.io/component": NAME}
DAEMON_SELECTOR = {"app.kubernetes.io/name": DAEMON}
# Upstream's resources when the policy sets none for the container.
OPERATOR_RESOURCES = {"limits": {"cpu": "500m", "memory": "128Mi"},
                      "requests": {"cpu": "10m", "memory": "64Mi"}}
DAEMON_RESOURCES = {"limits": {"cpu": "500m", "memory": "1Gi"},
                    "requests": {"cpu": "100m", "memory": "512Mi"}}
SUPPORTED_FIRMWARE_CONFIG_MAP = "nic-configuration-operator-supported-nic-firmware"
ALL = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _rules() -> list[Obj]:
    rules: list[Obj] = [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes"],
         "verbs": ["get", "list", "patch", "update", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ALL},
        {"apiGroups": ["maintenance.nvidia.com"], "resources": ["nodemaintenances"],
         "verbs": ALL},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ALL},
    ]
    for plural in KINDS.values():
        rules += [{"apiGroups": [GROUP], "resources": [plural], "verbs": ALL},
                  {"apiGroups": [GROUP], "resources": [f"{plural}/status"],
                   "verbs": ["get", "patch", "update"]}]
        if plural != "nicinterfacenametemplates":
            rules.append({"apiGroups": [GROUP], "resources": [f"{plural}/finalizers"],
                          "verbs": ["update"]})
    return rules


def _resources(c: Obj, default: Obj) -> Obj:
    c.setdefault("resources", default)
    return c


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    """As upstream's manifests; the env is copied as written (as the driver's)."""
    spec = typed(NicConfigurationOperatorSpec, section, path)
    operator, daemon = spec.operator, spec.configuration_daemon
    env = [{"name": "LOG_LEVEL", "value": spec.log_level}, *(section.get("env") or [])]
    storage = spec.nic_firmware_storage
    objects = [preserved_crd(ctx, GROUP, "v1alpha1", kind, plural)
               for kind, plural in KINDS.items()]
    objects += [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, _rules()),
                # Upstream's image reads the firmware versions it may install from here.
                config_map(ctx, SUPPORTED_FIRMWARE_CONFIG_MAP, {})]
    operator_mounts: list[Obj] = []
    daemon_mounts: list[Obj] = []
    volumes: list[Obj] = []
    if storage is not None:
        claim = storage.pvc_name
        if storage.create:
            pvc: Obj = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "metadata": metadata(ctx, claim),
                        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {
                            "storage": storage.available_storage_size}}}}
            if storage.storage_class_name:
                pvc["spec"]["storageClassName"] = storage.storage_class_name
            objects.append(pvc)
        volumes = [{"name": "firmware-cache", "persistentVolumeClaim": {"claimName": claim}}]
        operator_mounts = [{"name": "firmware-cache", "mountPath": "/nic-firmware",
                            "readOnly": False}]
        daemon_mounts = [{"name": "firmware-cache", "mountPath": "/nic-firmware",
                          "readOnly": True}]

    manager = _resources(container(
        "manager", image(ctx, operator, f"{path}.operator"), operator,
        command=["/manager"], env=env,
        securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        livenessProbe={"httpGet": {"path": "/healthz", "port": 8081},
                       "initialDelaySeconds": 15, "periodSeconds": 20},
        readinessProbe={"httpGet": {"path": "/readyz", "port": 8081},
                        "initialDelaySeconds": 5, "periodSeconds": 10},
        mounts=operator_mounts or None), OPERATOR_RESOURCES)
    deploy = deployment(ctx, NAME, operator, [manager], service_account_name=NAME,
                        tolerations=[MASTER_TOLERATION, CONTROL_PLANE_TOLERATION,
                                     GPU_TOLERATION])
    deploy["metadata"]["labels"].update(OPERATOR_SELECTOR)
    deploy["spec"]["selector"] = {"matchLabels": OPERATOR_SELECTOR}
    pod_meta = deploy["spec"]["template"]["metadata"]
    pod_meta["labels"] = dict(OPERATOR_SELECTOR)
    pod_meta["annotations"] = {"kubectl.kubernetes.io/default-container": "manager"}
    pod = deploy["spec"]["template"]["spec"]
    pod["securityContext"] = {"fsGroup": 65532, "runAsNonRoot": True}
    pod["terminationGracePeriodSeconds"] = 10
    if volumes:
        pod["volumes"] = volumes
    objects.append(deploy)

    host = [host_path("sys", "/sys", read_only=False), host_path("proc", "/proc", read_only=False),
            host_path("host", "/", "/host"), host_path("dev", "/dev")]
    node_env = [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "NAMESPACE",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}, *env]
    agent = _resources(container(
        DAEMON, image(ctx, daemon, f"{path}.configurationDaemon"), daemon,
        mounts=[m for _, m in host] + daemon_mounts, privileged=True, env=node_env),
        DAEMON_RESOURCES)
    ds = daemonset(ctx, DAEMON, daemon, [agent], app=DAEMON, node_selector=AFTER_DRIVER,
                   volumes=[v for v, _ in host] + volumes, service_account_name=NAME,
                   priority_class=NODE_CRITICAL, grace_period=10, managed_only=False)
    ds["metadata"]["labels"].update(DAEMON_SELECTOR)
    ds["spec"]["selector"] = {"matchLabels": DAEMON_SELECTOR}
    ds["spec"]["template"]["metadata"] = {
        "labels": {"nvidia.com/nic-configuration-daemon": "", **DAEMON_SELECTOR},
        "annotations": {"kubectl.kubernetes.io/default-container": DAEMON}}
    pod = ds["spec"]["template"]["spec"]
    ds["spec"]["template"]["spec"]["hostPID"] = True
    objects.append(ds)
    return objects


def unsupported(spec: Obj, path: str) -> list[str]:
    """What nicop does not render as upstream does, said in the policy's status."""
    return [f"{path}: ConfigMap {SUPPORTED_FIRMWARE_CONFIG_MAP} is rendered without upstream's "
            "table of supported NIC firmware per DOCA release (nicop does not ship it); "
            "NicFirmwareTemplates that rely on it find no supported version until it is filled"]


STATE = PartialState("state-nic-configuration-operator", ("nicConfigurationOperator",),
                     "NicConfigurationOperatorReady", render, unsupported)
