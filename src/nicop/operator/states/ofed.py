"""state-OFED: the driver container, one DaemonSet per (OS, OS version, kernel, arch) pool.

Pools exist because a driver is built for one kernel. Each DaemonSet uses OnDelete, so a new
driver version reaches a node only when the upgrade controller restarts its pod. With
`image: nicop` the container is nicop's driver agent (`nicop driver run`, the operator's own
image for every pool), which installs `version` itself.
"""

from __future__ import annotations

from collections import defaultdict

from nicop.api.agents import uses_nicop
from nicop.api.labels import (
    ARCH_LABEL,
    DRIVER_CONTAINER,
    DRIVER_LABEL,
    DRIVER_READY_FILE,
    KERNEL_LABEL,
    OS_LABEL,
    OS_VERSION_LABEL,
    POOL_LABELS,
)
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    Context,
    RenderError,
    State,
    agent_container,
    cluster_rbac,
    container,
    content_hash,
    daemonset,
    host_path,
    image,
    service_account,
)

NAME = "ofed-driver"
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


def pools(nodes: list[Obj]) -> tuple[dict[tuple[str, str, str, str], list[str]], list[str]]:
    """Managed nodes grouped by their pool key, and the nodes that lack an NFD label for it."""
    grouped: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    missing = []
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if any(not labels.get(k) for k in POOL_LABELS):
            missing.append(node["metadata"]["name"])
            continue
        key = (labels[OS_LABEL], labels[OS_VERSION_LABEL], labels[KERNEL_LABEL],
               labels.get(ARCH_LABEL, "amd64"))
        grouped[key].append(node["metadata"]["name"])
    return dict(sorted(grouped.items())), missing


def probe(spec: Obj, kind: str, command: list[str]) -> Obj:
    delay, period, failures, timeout = PROBE_DEFAULTS[kind]
    given = spec.get(kind) or {}

    def pick(key: str, default: int) -> int:
        value = given.get(key)
        return value if isinstance(value, int) and value >= 1 else default

    return {
        "exec": {"command": command},
        "initialDelaySeconds": pick("initialDelaySeconds", delay),
        "periodSeconds": pick("periodSeconds", period),
        "failureThreshold": pick("failureThreshold", failures),
        "timeoutSeconds": pick("timeoutSeconds", timeout),
    }


def driver_image(ctx: Context, spec: Obj, path: str, os_id: str, os_version: str,
                 arch: str) -> str:
    ref = image(ctx, spec, path)
    if "@sha256:" in ref:
        return ref
    return f"{ref}-{os_id}{os_version}-{arch}"


def render(ctx: Context, spec: Obj, path: str) -> list[Obj]:
    grouped, _ = pools(ctx.managed_nodes)
    objects: list[Obj] = [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ])]
    env = [
        {"name": "CREATE_IFNAMES_UDEV", "value": "true"},
        {"name": "NVIDIA_NIC_DRIVERS_INVENTORY_PATH", "value": "/mnt/drivers-inventory"},
        # Upstream images know their version; nicop's image reads it (and its node, for
        # safe load) from here.
        {"name": "NVIDIA_NIC_DRIVER_VER", "value": str(spec.get("version", ""))},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        *(spec.get("env") or []),
    ]
    for (os_id, os_version, kernel, arch), _nodes in grouped.items():
        volumes, mounts = [], []
        for name, host, mount in (
            ("run-mlnx-ofed", "/run/mellanox/drivers", "/run/mellanox/drivers"),
            ("etc-network", "/etc/network", "/etc/network"),
            ("host-etc", "/etc", "/host/etc"),
            ("host-usr", "/usr", "/host/usr"),
            ("host-udev", "/lib/udev", "/host/lib/udev"),
            ("host-run-udev", "/run/udev", "/run/udev"),
            ("host-lib-modules", "/lib/modules", "/host/lib/modules"),
            ("drivers-inventory", "/var/opt/mofed-container/inventory", "/mnt/drivers-inventory"),
            ("dev-infiniband", "/dev/infiniband", "/dev/infiniband"),
        ):
            volume, volume_mount = host_path(name, host, mount)
            volumes.append(volume)
            mounts.append(volume_mount)
        mounts[0]["mountPropagation"] = "Bidirectional"
        for field, dirs, volume_name in (("certConfig", CERT_DIRS, "cert-config"),
                                         ("repoConfig", REPO_DIRS, "repo-config")):
            ref = (spec.get(field) or {}).get("name")
            if not ref:
                continue
            if os_id not in dirs:
                raise RenderError(f"{path}.{field}", f"is not supported on {os_id} nodes "
                                  f"(supported: {', '.join(sorted(dirs))})")
            volumes.append({"name": volume_name, "configMap": {"name": ref}})
            mounts.append({"name": volume_name, "mountPath": dirs[os_id], "readOnly": True})
        pool = f"{os_id}{os_version}-{content_hash(kernel)[:8]}"
        ds = daemonset(
            ctx, f"mofed-{pool}-ds", spec,
            [driver_container(ctx, spec, path, mounts, env, (os_id, os_version, arch))],
            app=f"mofed-{pool}",
            node_selector={OS_LABEL: os_id, OS_VERSION_LABEL: os_version,
                           KERNEL_LABEL: kernel, ARCH_LABEL: arch},
            volumes=volumes, service_account_name=NAME,
            labels={DRIVER_LABEL: "", "mofed-ds-format-version": "1"},
            update_strategy="OnDelete",
        )
        pod = ds["spec"]["template"]["spec"]
        pod["terminationGracePeriodSeconds"] = spec.get("terminationGracePeriodSeconds", 300)
        pod.setdefault("affinity", {})["podAntiAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [
                    {"key": DRIVER_LABEL, "operator": "Exists"}]},
                "topologyKey": "kubernetes.io/hostname",
            }]}
        objects.append(ds)
    return objects


def driver_container(ctx: Context, spec: Obj, path: str, mounts: list[Obj], env: list[Obj],
                     pool: tuple[str, str, str]) -> Obj:
    """Upstream's driver container, or nicop's driver agent (`image: nicop`) with probes that
    ask it, from the same mounts, environment and probe timings."""
    if uses_nicop(spec):
        if not spec.get("version"):
            raise RenderError(f"{path}.version", "is the driver version nicop's driver agent "
                              "installs (e.g. 25.10-1.2.8.0); set it")
        upgrade = spec.get("upgradePolicy") or {}
        safe_load = bool(upgrade.get("autoUpgrade") and upgrade.get("safeLoad"))
        return agent_container(
            ctx, DRIVER_CONTAINER, spec,
            ["driver", "run", *(["--safe-load"] if safe_load else [])],
            mounts=mounts, env=env, ready_probe=False,
            startupProbe=probe(spec, "startupProbe", ["nicop", "driver", "probe", "startup"]),
            livenessProbe=probe(spec, "livenessProbe", ["nicop", "driver", "probe", "liveness"]),
            readinessProbe=probe(spec, "readinessProbe",
                                 ["nicop", "driver", "probe", "readiness"]))
    return container(
        DRIVER_CONTAINER, driver_image(ctx, spec, path, *pool), spec,
        mounts=mounts, privileged=True, env=env,
        startupProbe=probe(spec, "startupProbe", ["sh", "-c", f"ls {DRIVER_READY_FILE}"]),
        livenessProbe=probe(spec, "livenessProbe", ["sh", "-c", "lsmod | grep mlx5_core"]),
        readinessProbe=probe(spec, "readinessProbe", ["sh", "-c", "lsmod | grep mlx5_core"]),
    )


STATE = State("state-OFED", ("ofedDriver",), "OFEDDriverReady", render)
