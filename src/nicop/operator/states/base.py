"""What every component state shares: the render context, image names, and object builders.

A state turns one section of the NicClusterPolicy into the objects upstream renders for it.
It only renders; `operator.policy` applies, deletes stale objects and judges readiness, so a
new component is one new module with one `render` function.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from nicop.api.agents import (
    AGENT_CPU_REQUEST,
    AGENT_MEMORY,
    METRICS_PORT_NAME,
    POD_ENV,
    READY_FILE,
    READY_FILE_ENV,
    READY_PROBE,
    own_image,
)
from nicop.api.labels import (
    CONFIG_HASH_ANNOTATION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    OWNER_VALUE,
)
from nicop.api.mellanox import DRADriverSpec, GlobalConfig, ImageSpec
from nicop.kube.resources import Obj

M = TypeVar("M", bound=BaseModel)
Section = ImageSpec | DRADriverSpec
"""A section that names containers' resources and pull secrets (the DRA driver's has no image:
it runs nicop's)."""
OFED_INIT_IMAGE_ENV = "OFED_INIT_CONTAINER_IMAGE"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class RenderError(Exception):
    """The policy cannot be rendered; `field` is the spec path to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def typed(model: type[M], section: Obj, path: str) -> M:
    """The section as its model, validated once per render. The API server's schema already
    holds it; a value the model still refuses is the policy's error, naming the field."""
    try:
        return model.model_validate(section)
    except ValidationError as e:
        error = e.errors()[0]
        raise RenderError(".".join([path, *map(str, error["loc"])]), error["msg"]) from None


@dataclass
class Context:
    """Everything a state may look at besides its own section."""

    policy: Obj
    """The policy as stored. The states read their own section typed (`typed`); the
    policy-wide tolerations and affinities are copied into pod templates as written (a model
    round trip could reorder or fill them, and a changed template restarts every pod)."""
    namespace: str
    managed_nodes: list[Obj] = field(default_factory=list)
    cni_bin_dir: str = "/opt/cni/bin"
    cni_network_dir: str = "/etc/cni/net.d"
    agent_image: str = field(default_factory=own_image)
    """The image of nicop's agents: the operator's own."""
    ofed_init_image: str | None = field(
        default_factory=lambda: os.environ.get(OFED_INIT_IMAGE_ENV) or None)
    """Upstream's driver init container image (operator env, set by the Helm chart); without
    it the driver pods have no init container, as upstream."""
    opt_in_used: bool = False
    """Some node carries nvidia.com/network-operator (opted in or out): the driver DaemonSets
    then select managed nodes by nicop's rule rather than by the NIC label alone."""
    node_policy: str | None = None
    """The NicNodePolicy these objects are rendered for (None: the NicClusterPolicy). Its
    objects get upstream's per-policy names, its nodeSelector and `ds-owner: nnp-<name>`."""

    @property
    def spec(self) -> Obj:
        return self.policy.get("spec") or {}

    @cached_property
    def global_config(self) -> GlobalConfig:
        """`spec.global`: the image defaults of every section."""
        return typed(GlobalConfig, self.spec.get("global") or {}, "spec.global")

    @property
    def owner(self) -> str:
        """The `ds-owner` label of the objects rendered for this policy."""
        return f"nnp-{self.node_policy}" if self.node_policy else OWNER_VALUE

    @property
    def name_hash_suffix(self) -> str:
        """Upstream's suffix of a NicNodePolicy's DaemonSet names: `-<hash of its name>`."""
        return f"-{name_hash(self.node_policy)}" if self.node_policy else ""

    @property
    def name_suffix(self) -> str:
        """Upstream's suffix of a NicNodePolicy's ConfigMaps and selectors: `-<its name>`."""
        return f"-{self.node_policy}" if self.node_policy else ""

    @property
    def node_selector(self) -> dict[str, str]:
        """A NicNodePolicy's nodeSelector, added to every node DaemonSet it renders."""
        if not self.node_policy:
            return {}
        return dict(self.spec.get("nodeSelector") or {})


Render = Callable[[Context, Obj, str], list[Obj]]


@dataclass(frozen=True)
class State:
    """One component: its upstream state name, spec section, condition type and renderer.

    `render(ctx, section, path)` gets the section and its spec path (for error messages).
    """

    name: str
    section: tuple[str, ...]
    condition: str
    render: Render

    @property
    def path(self) -> str:
        return "spec." + ".".join(self.section)

    def section_of(self, policy: Obj) -> Obj | None:
        node: Any = policy.get("spec") or {}
        for key in self.section:
            if not isinstance(node, dict):
                return None
            node = node.get(key)
        return node if isinstance(node, dict) else None


def name_hash(value: str) -> str:
    """Upstream's short name suffix for a driver pool or node policy: the decimal FNV-1a 32 of
    `value` with each digit spelled as Kubernetes' SafeEncodeString does (0-9 -> 456789bcdf), so
    nicop names the DaemonSets of a running upstream install as upstream did."""
    h = 0x811C9DC5
    for byte in value.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return str(h).translate(_SAFE_DIGITS)


_SAFE_DIGITS = str.maketrans("0123456789", "456789bcdf")


def content_hash(value: Any) -> str:
    """A stable short hash of JSON-able content (object revisions, config hashes)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def image(ctx: Context, spec: ImageSpec, path: str) -> str:
    """`repository/image:version` (or `@sha256:...`), with `spec.global` filling the gaps."""
    name = spec.image
    repository = spec.repository or ctx.global_config.repository
    version = spec.version or ctx.global_config.version
    if not repository:
        raise RenderError(f"{path}.repository", "is empty and spec.global.repository is not set")
    if not version:
        raise RenderError(f"{path}.version", "is empty and spec.global.version is not set")
    if version.startswith("sha256:"):
        return f"{repository}/{name}@{version}"
    return f"{repository}/{name}:{version}"


def pull_secrets(ctx: Context, spec: Section | None) -> list[Obj]:
    names = (spec.image_pull_secrets if spec else None) or ctx.global_config.image_pull_secrets
    names = names or []
    return [{"name": n} for n in names]


def metadata(
    ctx: Context, name: str, labels: dict[str, str] | None = None, namespaced: bool = True
) -> Obj:
    m: Obj = {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE, **(labels or {})}}
    if namespaced:
        m["namespace"] = ctx.namespace
    return m


def config_map(ctx: Context, name: str, data: dict[str, str]) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(ctx, name),
            "data": data}


def service_account(ctx: Context, name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(ctx, name)}


# Agents record what they cannot fix as Events on their own pod (nicop.node.report).
EVENTS_RULE: Obj = {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}


def cluster_rbac(ctx: Context, name: str, rules: list[Obj]) -> list[Obj]:
    """ClusterRole `name` with `rules`, bound to the ServiceAccount `name`."""
    group = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": f"{group}/v1", "kind": "ClusterRole",
         "metadata": metadata(ctx, name, namespaced=False), "rules": rules},
        {"apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding",
         "metadata": metadata(ctx, name, namespaced=False),
         "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}]},
    ]


def json_config(raw: str, path: str) -> Obj | None:
    """A section's `config` JSON string parsed, or None when absent; bad JSON is a RenderError."""
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError as e:
        raise RenderError(f"{path}.config", f"is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise RenderError(f"{path}.config", "must be a JSON object")
    return parsed


def host_path(name: str, path: str, mount: str | None = None,
              type_: str | None = None, read_only: bool | None = None) -> tuple[Obj, Obj]:
    """A hostPath volume and its mount (`readOnly` only where given: upstream's manifests
    spell it on some mounts, and a template that differs from theirs rolls their pods)."""
    volume: Obj = {"name": name, "hostPath": {"path": path}}
    if type_:
        volume["hostPath"]["type"] = type_
    volume_mount: Obj = {"name": name, "mountPath": mount or path}
    if read_only is not None:
        volume_mount["readOnly"] = read_only
    return volume, volume_mount


def container(
    name: str,
    image_name: str,
    section: Section | None,
    *,
    mounts: list[Obj] | None = None,
    privileged: bool = False,
    default_resources: Obj | None = None,
    pull_policy: str | None = "IfNotPresent",
    **extra: Any,
) -> Obj:
    """A container; the section's `containerResources` entry of the same name sets resources.

    `default_resources` are upstream's for the container, which its manifests give only when
    the section lists no containerResources at all (an entry for another container leaves
    this one without), and nicop renders the same."""
    c: Obj = {"name": name, "image": image_name}
    if pull_policy:
        c["imagePullPolicy"] = pull_policy
    given = (section.container_resources if section else None) or []
    entry = next((r for r in given if r.name == name), None)
    if entry is not None:
        c["resources"] = {k: v for k, v in (("requests", entry.requests),
                                            ("limits", entry.limits)) if v}
    elif not given and default_resources:
        c["resources"] = default_resources
    if mounts:
        c["volumeMounts"] = mounts
    if privileged:
        c["securityContext"] = {"privileged": True}
    c.update(extra)
    return c


def resources(cpu: str, memory: str, cpu_limit: str | None = None,
              memory_limit: str | None = None) -> Obj:
    """Requests, and limits when given (upstream's defaults spell both)."""
    out: Obj = {"requests": {"cpu": cpu, "memory": memory}}
    if cpu_limit or memory_limit:
        out["limits"] = {"cpu": cpu_limit or cpu, "memory": memory_limit or memory}
    return out


def agent_container(
    ctx: Context,
    name: str,
    section: Section | None,
    command: list[str],
    *,
    mounts: list[Obj] | None = None,
    env: list[Obj] | None = None,
    ready_probe: bool = True,
    metrics_port: int | None = None,
    **extra: Any,
) -> Obj:
    """A privileged container running `nicop <command>` from the operator's own image.

    Its readiness probe asks the agent (/readyz on its metrics port, else `nicop probe-ready`),
    a crash shows the end of its log in the container's last state (FallbackToLogsOnError),
    and it knows its pod (POD_ENV).
    With `metrics_port` it declares the port `metrics` and the agent serves /metrics there, on
    the pod's IP (what a PodMonitor scrapes). Its requests and limits are the agent's budget
    (nicop.api.agents.AGENT_MEMORY) unless the section's containerResources name it.
    """
    if metrics_port is not None:
        command = [*command, f"--metrics-port={metrics_port}"]
        extra.setdefault("ports", [{"name": METRICS_PORT_NAME, "containerPort": metrics_port,
                                    "protocol": "TCP"}])
    env = list(env or [])
    given = {e["name"] for e in env}
    env += [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": v}}}
            for k, v in POD_ENV.items() if k not in given]
    if ready_probe and metrics_port is not None:
        # An HTTP GET costs the node nothing: often enough for a new agent to be Ready soon.
        extra.setdefault("readinessProbe", {
            "httpGet": {"path": "/readyz", "port": METRICS_PORT_NAME},
            "initialDelaySeconds": 1, "periodSeconds": 5, "timeoutSeconds": 5,
            "failureThreshold": 3})
    elif ready_probe:
        env.insert(0, {"name": READY_FILE_ENV, "value": READY_FILE})
        extra.setdefault("readinessProbe", {
            "exec": {"command": READY_PROBE}, "initialDelaySeconds": 1, "periodSeconds": 10,
            "timeoutSeconds": 10, "failureThreshold": 3})
    if budget := AGENT_MEMORY.get(command[0]):
        extra.setdefault("default_resources", {
            "requests": {"cpu": AGENT_CPU_REQUEST, "memory": budget[0]},
            "limits": {"memory": budget[1]}})
    return container(name, ctx.agent_image, section, mounts=mounts, privileged=True,
                     command=["nicop", *command], env=env,
                     terminationMessagePolicy="FallbackToLogsOnError", **extra)


def daemonset(
    ctx: Context,
    name: str,
    section: Section | None,
    containers: list[Obj],
    *,
    app: str,
    node_selector: dict[str, str] | None = None,
    volumes: list[Obj] | None = None,
    service_account_name: str | None = None,
    host_network: bool = True,
    config: str | None = None,
    labels: dict[str, str] | None = None,
    update_strategy: str = "RollingUpdate",
    managed_only: bool = True,
    tolerations: list[Obj] | None = None,
    init_containers: list[Obj] | None = None,
    selector: dict[str, str] | None = None,
    pod_labels: dict[str, str] | None = None,
    priority_class: str | None = None,
    grace_period: int | None = None,
) -> Obj:
    """A node DaemonSet in upstream's shape: the policy's tolerations (then upstream's GPU
    toleration), nodeAffinity and pull secrets; a nodeSelector and priority class only where
    upstream's manifest has them. For a running upstream install nicop then renders the pod
    template upstream rendered, and takes it over without replacing a pod.

    `managed_only` keeps it off nodes that opted out of nicop: with opt-in labels in use, its
    pods need mofed.wait, which only managed nodes carry (without them the policy's affinity
    selects, as upstream's). `config` (a section's config string) is hashed onto the pod
    template as upstream hashes it, so a config change rolls the pods. `selector` is upstream's
    `spec.selector.matchLabels` (immutable: it must equal upstream's for nicop to take over its
    DaemonSet); the pods carry it, `app` and `pod_labels`.
    """
    match = selector or {"app": app}
    pod_labels = {**match, "app": app, **(pod_labels or {}), **(labels or {})}
    pod: Obj = {"hostNetwork": True} if host_network else {}
    if priority_class:
        pod["priorityClassName"] = priority_class
    if selected := {**(node_selector or {}), **ctx.node_selector}:
        pod["nodeSelector"] = selected
    pod["tolerations"] = tolerations if tolerations is not None else [
        *(ctx.spec.get("tolerations") or []), GPU_TOLERATION]
    pod["containers"] = containers
    if init_containers:
        pod["initContainers"] = init_containers
    if affinity := node_affinity(ctx, managed_only and ctx.opt_in_used):
        pod["affinity"] = {"nodeAffinity": affinity}
    if volumes:
        pod["volumes"] = volumes
    if service_account_name:
        pod["serviceAccountName"] = service_account_name
    if secrets := pull_secrets(ctx, section):
        pod["imagePullSecrets"] = secrets
    if grace_period is not None:
        pod["terminationGracePeriodSeconds"] = grace_period
    template_meta: Obj = {"labels": pod_labels}
    if config is not None:
        template_meta["annotations"] = {CONFIG_HASH_ANNOTATION: config_hash(config)}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": metadata(ctx, name, labels),
        "spec": {
            "selector": {"matchLabels": match},
            "updateStrategy": {"type": update_strategy},
            "template": {"metadata": template_meta, "spec": pod},
        },
    }


def config_hash(config: str) -> str:
    """Upstream's config hash: base64 of the SHA-256 of the section's config string."""
    return base64.b64encode(hashlib.sha256(config.encode()).digest()).decode()


# Upstream's cluster-level Deployments tolerate and prefer the control plane's nodes.
MASTER_TOLERATION = {"key": "node-role.kubernetes.io/master", "operator": "Exists",
                     "effect": "NoSchedule"}
CONTROL_PLANE_TOLERATION = {"key": "node-role.kubernetes.io/control-plane",
                            "operator": "Exists", "effect": "NoSchedule"}


def deployment(
    ctx: Context,
    name: str,
    section: Section,
    containers: list[Obj],
    *,
    tolerations: list[Obj],
    service_account_name: str | None = None,
    selector: dict[str, str] | None = None,
    pod_labels: dict[str, str] | None = None,
) -> Obj:
    """A cluster-level Deployment in upstream's shape: cluster-critical, preferring control
    plane nodes, `tolerations` (each manifest has its own order) then the policy's
    deploymentTolerations, deploymentNodeAffinity added to the preference; `selector` is
    upstream's (immutable), carried by the pods with `pod_labels`."""
    match = selector or {"app": name}
    pod: Obj = {
        "priorityClassName": "system-cluster-critical",
        "containers": containers,
        "tolerations": [*tolerations, *(ctx.spec.get("deploymentTolerations") or [])],
        "affinity": {"nodeAffinity": control_plane_affinity(ctx)},
    }
    if service_account_name:
        pod["serviceAccountName"] = service_account_name
    if secrets := pull_secrets(ctx, section):
        pod["imagePullSecrets"] = secrets
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ctx, name),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": match},
            "template": {"metadata": {"labels": {**match, **(pod_labels or {})}},
                         "spec": pod},
        },
    }


def control_plane_affinity(ctx: Context) -> Obj:
    """Upstream's: prefer master and control-plane nodes (weight 1 each), then the policy's
    deploymentNodeAffinity preferences; its required terms as they are."""
    given = ctx.spec.get("deploymentNodeAffinity") or {}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [
        {"key": f"node-role.kubernetes.io/{role}", "operator": "In", "values": [""]}]}}
        for role in ("master", "control-plane")]
    affinity: Obj = {"preferredDuringSchedulingIgnoredDuringExecution": [
        *preferred, *(given.get("preferredDuringSchedulingIgnoredDuringExecution") or [])]}
    if required := given.get("requiredDuringSchedulingIgnoredDuringExecution"):
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    return affinity


def node_affinity(ctx: Context, managed_only: bool) -> Obj | None:
    """The policy's nodeAffinity, with "managed by nicop" ANDed into every required term."""
    affinity = json.loads(json.dumps(ctx.spec.get("nodeAffinity") or {}))
    if not managed_only:
        return affinity or None
    managed = {"key": MOFED_WAIT_LABEL, "operator": "Exists"}
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    for term in terms:
        term.setdefault("matchExpressions", []).append(managed)
    return affinity  # type: ignore[no-any-return]


# Device plugins and telemetry wait for the driver container on their node.
AFTER_DRIVER = {MOFED_WAIT_LABEL: "false"}
# nicop's own agents run on Linux nodes only, at the node-critical priority.
LINUX = {"kubernetes.io/os": "linux"}
NODE_CRITICAL = "system-node-critical"


def nic_nodes(ctx: Context) -> dict[str, str]:
    """Upstream's selector of the nodes with a ConnectX NIC; with nicop's opt-in labels in use
    a node may be managed without it (its components then select on mofed.wait alone)."""
    return {} if ctx.opt_in_used else {MELLANOX_LABEL: "true"}
