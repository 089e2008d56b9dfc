"""state-OFED: the driver container, one DaemonSet per (OS, OS version, kernel) pool.

Pools exist because a driver is built for one kernel. The DaemonSets are named, selected and
labelled as upstream's (`mofed-<ID><VERSION_ID>-<hash of the kernel>-ds`, Mellanox/network-
operator manifests/state-ofed-driver/0050_ofed-driver-ds.yaml), so nicop adopts a running
upstream install in place. Each uses OnDelete, so a new driver version reaches a node only when
the upgrade controller restarts its pod. With `image: nicop` the container is nicop's driver
agent (`nicop driver run`, the operator's own image for every pool), which installs `version`
itself and waits for safe load itself: its pods have no init container.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from nicop.api.agents import METRICS_PORTS, uses_nicop
from nicop.api.labels import (
    ARCH_LABEL,
    DRIVER_CONTAINER,
    DRIVER_LABEL,
    DRIVER_READY_FILE,
    KERNEL_LABEL,
    MELLANOX_LABEL,
    MOFED_WAIT_LABEL,
    OS_LABEL,
    OS_VERSION_LABEL,
    OWNER_LABEL,
    POOL_LABELS,
    SAFE_LOAD_ANNOTATION,
)
from nicop.api.mellanox import DriverUpgradePolicySpec, OFEDDriverSpec, PodProbeSpec
from nicop.kube import selectors
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    GPU_TOLERATION,
    Context,
    RenderError,
    State,
    agent_container,
    cluster_rbac,
    config_map,
    container,
    host_path,
    image,
    metadata,
    name_hash,
    pull_secrets,
    service_account,
    typed,
)

NAME = "ofed-driver"
INIT_CONTAINER = "network-operator-init-container"
INIT_CONFIG_MAP = "ofed-init-container-config"
# The modules the init container checks before the driver container replaces them.
DRIVER_MODULES = ["mlx5_core", "mlx5_ib", "ib_umad", "ib_uverbs", "ib_ipoib", "rdma_cm",
                  "rdma_ucm", "ib_core", "ib_cm"]
PROBE_DEFAULTS = {
    "startupProbe": (30, 10, 120, 10),
    "livenessProbe": (10, 30, 1, 10),
    "readinessProbe": (10, 30, 1, 10),
}
CERT_DIRS = {"ubuntu": "/usr/local/share/ca-certificates",
             "rhcos": "/etc/pki/ca-trust/extracted/pem",
             "rhel": "/etc/pki/ca-trust/extracted/pem", "sles": "/etc/ssl"}
REPO_DIRS = {"ubuntu": "/etc/apt/sources.list.d", "rhcos": "/etc/yum.repos.d",
             "rhel": "/etc/yum.repos.d", "sles": "/etc/zypp/repos.d"}
# (volume, host path, mount path, hostPath type, mount options), in upstream's order.
HOST_MOUNTS: tuple[tuple[str, str, str, str | None, Obj], ...] = (
    ("run-mlnx-ofed", "/run/mellanox/drivers", "/run/mellanox/drivers", None,
     {"mountPropagation": "Bidirectional"}),
    ("etc-network", "/etc/network", "/etc/network", None, {}),
    ("host-etc", "/etc", "/host/etc", None, {}),
    ("host-usr", "/usr", "/host/usr", None, {}),
    ("host-udev", "/lib/udev", "/host/lib/udev", None, {}),
    ("host-run-udev", "/run/udev", "/run/udev", None, {"readOnly": True}),
    ("host-lib-modules", "/lib/modules", "/host/lib/modules", None, {}),
    ("drivers-inventory", "/var/opt/mofed-container/inventory", "/mnt/drivers-inventory",
     "DirectoryOrCreate", {}),
    ("host-ib-core", "/etc/modprobe.d/ib_core.conf", "/etc/modprobe.d/ib_core.conf",
     "FileOrCreate", {}),
    ("dev-infiniband", "/dev/infiniband", "/dev/infiniband", "DirectoryOrCreate", {}),
)
INIT_MOUNTS = (("host-proc", "/proc", "/host/proc"), ("host-sys", "/sys", "/host/sys"))


def pools(nodes: list[Obj]) -> tuple[dict[tuple[str, str, str], list[Obj]], list[str]]:
    """Managed nodes grouped by upstream's pool key (OS, OS version, kernel), and the nodes
    that lack an NFD label for it."""
    grouped: dict[tuple[str, str, str], list[Obj]] = defaultdict(list)
    missing = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        labels = node["metadata"].get("labels") or {}
        if any(not labels.get(k) for k in POOL_LABELS):
            missing.append(node["metadata"]["name"])
            continue
        grouped[labels[OS_LABEL], labels[OS_VERSION_LABEL], labels[KERNEL_LABEL]].append(node)
    return dict(sorted(grouped.items())), missing


def pool_name(os_id: str, os_version: str, kernel: str) -> str:
    """`mofed-<ID><VERSION_ID>-<hash>`: the pool's `app` label; its DaemonSet adds `-ds`."""
    return f"mofed-{os_id}{os_version}-{name_hash(kernel)}"


def probe(given: PodProbeSpec | None, kind: str, command: list[str]) -> Obj:
    """The section's timings of probe `kind` (startupProbe ...), upstream's default for each
    one unset or under 1."""
    delay, period, failures, timeout = PROBE_DEFAULTS[kind]
    given = given or PodProbeSpec(initial_delay_seconds=0, period_seconds=0)

    def pick(value: int | None, default: int) -> int:
        return value if value is not None and value >= 1 else default

    return {
        "exec": {"command": command},
        "initialDelaySeconds": pick(given.initial_delay_seconds, delay),
        "periodSeconds": pick(given.period_seconds, period),
        "failureThreshold": pick(given.failure_threshold, failures),
        "timeoutSeconds": pick(given.timeout_seconds, timeout),
    }


def probes(driver: OFEDDriverSpec, startup: list[str], liveness: list[str],
           readiness: list[str]) -> dict[str, Any]:
    """The driver container's three probes, running these commands."""
    return {"startupProbe": probe(driver.startup_probe, "startupProbe", startup),
            "livenessProbe": probe(driver.liveness_probe, "livenessProbe", liveness),
            "readinessProbe": probe(driver.readiness_probe, "readinessProbe", readiness)}


def driver_image(ctx: Context, driver: OFEDDriverSpec, path: str, os_id: str,
                 os_version: str, kernel: str, arch: str) -> str:
    """Upstream's driver image for a pool: `<version>-<ID><VERSION_ID>-<arch>`, or with
    `forcePrecompiled` the precompiled tag `<version>-<kernel>-<ID><VERSION_ID>-<arch>`.
    nicop polls no registry: without `forcePrecompiled` it uses the image that compiles on the
    node; with it, the precompiled tag (a missing tag shows as the pods' image pull error,
    and the state's status names the image it expects)."""
    ref = image(ctx, driver, path)
    if "@sha256:" in ref:
        return ref
    if driver.force_precompiled:
        return f"{ref}-{kernel}-{os_id}{os_version}-{arch}"
    return f"{ref}-{os_id}{os_version}-{arch}"


def safe_load(driver: OFEDDriverSpec) -> bool:
    """Whether the driver waits for the upgrade controller before it loads (safeLoad counts
    only with autoUpgrade, as upstream's)."""
    upgrade = driver.upgrade_policy
    return upgrade is not None and upgrade.auto_upgrade and upgrade.safe_load


def init_config(driver: OFEDDriverSpec) -> str:
    """The init container's config.json: wait for safe load when the upgrade uses it, check
    the modules the driver replaces (upstream's ofed-init-container-config)."""
    return json.dumps({
        "safeDriverLoad": {"enable": safe_load(driver), "annotation": SAFE_LOAD_ANNOTATION},
        "moduleDependencyCheck": {"modules": DRIVER_MODULES, "hostProcPath": "/host/proc",
                                  "hostSysPath": "/host/sys"},
    })


def check_upgrade_selectors(upgrade: DriverUpgradePolicySpec | None, path: str) -> None:
    """A drain or wait podSelector Kubernetes would refuse is the policy's error, never a
    selector that matches nothing (the upgrade controller holds the pool meanwhile)."""
    if upgrade is None:
        return
    for section, given in (("drain", upgrade.drain), ("waitForCompletion",
                                                      upgrade.wait_for_completion)):
        try:
            selectors.parse((given.pod_selector if given else None) or "")
        except selectors.SelectorError as e:
            raise RenderError(f"{path}.upgradePolicy.{section}.podSelector", str(e)) from None


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    """The section is read as its model, but for the env: rendered as the user wrote it (a
    model round trip could reorder it, and a changed template reloads every driver)."""
    driver = typed(OFEDDriverSpec, section, path)
    env: list[Obj] = section.get("env") or []
    check_upgrade_selectors(driver.upgrade_policy, path)
    grouped, _ = pools(ctx.managed_nodes)
    objects: list[Obj] = [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        # nicop's driver agent records why it holds a reload (nicop.node.preflight).
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ])]
    nicop = uses_nicop(driver.image)
    init_image = None if nicop else ctx.ofed_init_image
    if init_image:
        objects.append(config_map(ctx, INIT_CONFIG_MAP, {"config.json": init_config(driver)}))
    for (os_id, os_version, kernel), nodes in grouped.items():
        volumes, mounts = [], []
        for name, host, mount, type_, options in HOST_MOUNTS:
            volume, volume_mount = host_path(name, host, mount, type_=type_)
            volumes.append(volume)
            mounts.append({**volume_mount, **options})
        for field, given, dirs, volume_name in (
                ("certConfig", driver.cert_config, CERT_DIRS, "cert-config"),
                ("repoConfig", driver.repo_config, REPO_DIRS, "repo-config")):
            ref = given.name if given else None
            if not ref:
                continue
            if os_id not in dirs:
                raise RenderError(f"{path}.{field}", f"is not supported on {os_id} nodes "
                                  f"(supported: {', '.join(sorted(dirs))})")
            volumes.append({"name": volume_name, "configMap": {"name": ref}})
            mounts.append({"name": volume_name, "mountPath": dirs[os_id], "readOnly": True})
        # Upstream's pool key has no architecture; the image is built for the pool's nodes'.
        arch = (nodes[0]["metadata"].get("labels") or {}).get(ARCH_LABEL, "amd64")
        pod_spec: Obj = {
            "priorityClassName": "system-node-critical",
            "tolerations": [*(ctx.spec.get("tolerations") or []), GPU_TOLERATION],
            "serviceAccountName": NAME,
            "hostNetwork": True,
        }
        if secrets := pull_secrets(ctx, driver):
            pod_spec["imagePullSecrets"] = secrets
        if init_image:
            pod_spec["initContainers"] = [init_container(ctx, env, init_image)]
            for name, host, mount in INIT_MOUNTS:
                volumes.append(host_path(name, host, mount, type_="Directory")[0])
        pod_spec["containers"] = [driver_container(
            ctx, driver, env, path, mounts, (os_id, os_version, kernel, arch))]
        pod_spec["terminationGracePeriodSeconds"] = driver.termination_grace_period_seconds
        pod_spec["volumes"] = volumes
        pod_spec["nodeSelector"] = {MELLANOX_LABEL: "true", OS_LABEL: os_id,
                                    OS_VERSION_LABEL: os_version, KERNEL_LABEL: kernel,
                                    **ctx.node_selector}
        node_affinity = json.loads(json.dumps(ctx.spec.get("nodeAffinity") or {}))
        if ctx.opt_in_used:
            # nicop's opt-in and opt-out: managed nodes carry mofed.wait, whatever their NIC label.
            del pod_spec["nodeSelector"][MELLANOX_LABEL]
            required = node_affinity.setdefault(
                "requiredDuringSchedulingIgnoredDuringExecution", {})
            terms = required.setdefault("nodeSelectorTerms", []) or [{}]
            required["nodeSelectorTerms"] = terms
            for term in terms:
                term.setdefault("matchExpressions", []).append(
                    {"key": MOFED_WAIT_LABEL, "operator": "Exists"})
        # Upstream's manifest gives one driver pod per node by pod anti-affinity, and replaces
        # that with the policy's nodeAffinity when there is one (the template's later
        # `affinity` key wins); nicop renders the same, so a taken-over DaemonSet keeps its
        # template. Two driver DaemonSets selecting one node are a conflict nicop reports.
        pod_spec["affinity"] = {"nodeAffinity": node_affinity} if node_affinity else {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [
                    {"key": DRIVER_LABEL, "operator": "Exists"}]},
                "topologyKey": "kubernetes.io/hostname"}]}}
        # A NicNodePolicy's pools add the hash of its name, as upstream's.
        app = pool_name(os_id, os_version, kernel) + ctx.name_hash_suffix
        objects.append({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": metadata(ctx, f"{app}-ds", {
                "app": app, DRIVER_LABEL: "", "mofed-ds-format-version": "1"}),
            "spec": {
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": {"app": app}},
                "template": {
                    "metadata": {"labels": {"app": app, "kernel": kernel, DRIVER_LABEL: "",
                                            OWNER_LABEL: ctx.owner}},
                    "spec": pod_spec,
                },
            },
        })
    return objects


def init_container(ctx: Context, env: list[Obj], ref: str) -> Obj:
    """Upstream's network-operator-init-container: module checks and the safe-load wait."""
    return {
        "name": INIT_CONTAINER, "imagePullPolicy": "IfNotPresent", "image": ref,
        "args": ["--node-name", "$(NODE_NAME)", "--configmap-name", INIT_CONFIG_MAP,
                 "--configmap-namespace", ctx.namespace, "--configmap-key", "config.json"],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                *driver_env(env, False)],
        "volumeMounts": [{"name": name, "mountPath": mount, "readOnly": True}
                         for name, _, mount in INIT_MOUNTS],
    }


def driver_env(given: list[Obj], nicop: bool, version: str = "") -> list[Obj]:
    """The section's `env` with upstream's defaults it does not set: after it, as upstream
    appends them to the section's env (so the init container gets them too). nicop's agent
    also reads its version and node from here, its defaults first (as nicop always rendered
    them: a reordering would read as a new driver)."""
    names = {e.get("name") for e in given}
    defaults: list[Obj] = [
        {"name": "CREATE_IFNAMES_UDEV", "value": "true"},
        {"name": "NVIDIA_NIC_DRIVERS_INVENTORY_PATH", "value": "/mnt/drivers-inventory"},
    ]
    if not nicop:
        return [*given, *(e for e in defaults if e["name"] not in names)]
    defaults += [
        {"name": "NVIDIA_NIC_DRIVER_VER", "value": version},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    return [*(e for e in defaults if e["name"] not in names), *given]


def driver_container(ctx: Context, driver: OFEDDriverSpec, env: list[Obj], path: str,
                     mounts: list[Obj], pool: tuple[str, str, str, str]) -> Obj:
    """Upstream's driver container, or nicop's driver agent (`image: nicop`) with probes that
    ask it, from the same mounts, environment and probe timings."""
    if uses_nicop(driver.image):
        if not driver.version:
            raise RenderError(f"{path}.version", "is the driver version nicop's driver agent "
                              "installs (e.g. 25.10-1.2.8.0); set it")
        return agent_container(
            ctx, DRIVER_CONTAINER, driver,
            ["driver", "run", *(["--safe-load"] if safe_load(driver) else []),
             *(["--force-precompiled"] if driver.force_precompiled else [])],
            mounts=mounts, env=driver_env(env, True, driver.version), ready_probe=False,
            metrics_port=METRICS_PORTS["driver"],
            **probes(driver, ["nicop", "driver", "probe", "startup"],
                     ["nicop", "driver", "probe", "liveness"],
                     ["nicop", "driver", "probe", "readiness"]))
    loaded = ["sh", "-c", "lsmod | grep mlx5_core"]
    c = container(
        DRIVER_CONTAINER, driver_image(ctx, driver, path, *pool), driver,
        mounts=mounts, env=driver_env(env, False),
        **probes(driver, ["sh", "-c", f"ls {DRIVER_READY_FILE}"], loaded, loaded),
    )
    c["securityContext"] = {"privileged": True, "seLinuxOptions": {"level": "s0"}}
    return c


STATE = State("state-OFED", ("ofedDriver",), "OFEDDriverReady", render)
