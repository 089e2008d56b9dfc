"""state-multus-cni: the Multus meta-plugin on every Linux node.

Upstream's image runs Multus' thin plugin as upstream's manifest does. With `image: nicop` the
same DaemonSet runs nicop's own meta-plugin instead: an init container installs the `multus`
executable into the node's CNI bin dir, and `nicop multus-daemon` (host network, privileged)
serves it and writes 00-multus.conf, seeing the CNI dirs, the pods' network namespaces, the CNI
state and the kubelet's PodResources socket (which devices each pod got). Its ServiceAccount
may read pods and NetworkAttachmentDefinitions, patch pods (network-status) and record Events;
for the VFs of nicop's DRA claims that name a network, read the claims and write, on its own
node only, the networkData of nicop's driver into their status.
"""

from __future__ import annotations

from nicop.api.agents import METRICS_PORTS, MULTUS_SOCKET, SOCKET_DIR, uses_nicop
from nicop.api.dra import DRIVER
from nicop.api.mellanox import MultusSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    EVENTS_RULE,
    LINUX,
    NODE_CRITICAL,
    Context,
    State,
    agent_container,
    cluster_rbac,
    config_map,
    container,
    daemonset,
    host_path,
    image,
    resources,
    service_account,
    typed,
)

NAME = "multus"
CONF_DIR = "/tmp/multus-conf"  # where the configured file is mounted in the container
CONF_FILE = "00-multus.conf"


def policy_config(ctx: Context, spec: MultusSpec, objects: list[Obj], volumes: list[Obj],
                  mounts: list[Obj]) -> str:
    """The policy's own Multus config (`config`) as a ConfigMap mounted where Multus reads it;
    the daemon's --multus-conf-file (`auto`, a config made from the node's, without one)."""
    config = spec.config
    if not config:
        return "auto"
    objects.append(config_map(ctx, "multus-cni-config", {"cni-conf.json": config}))
    volumes.append({"name": "multus-cni-config", "configMap": {
        "name": "multus-cni-config", "items": [{"key": "cni-conf.json", "path": CONF_FILE}]}})
    mounts.append({"name": "multus-cni-config", "mountPath": CONF_DIR})
    return f"{CONF_DIR}/{CONF_FILE}"


def render(ctx: Context, section: Obj, path: str) -> list[Obj]:
    spec = typed(MultusSpec, section, path)
    if uses_nicop(spec.image):
        return render_nicop(ctx, spec)
    objects = [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "update"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
         "verbs": ["create", "patch", "update"]},
    ])]
    cni_conf, cni_conf_mount = host_path("cninetwork", ctx.cni_network_dir,
                                         "/host/etc/cni/net.d")
    cni_bin, cni_bin_mount = host_path("cnibin", ctx.cni_bin_dir, "/host/opt/cni/bin")
    volumes, mounts = [cni_conf, cni_bin], [cni_conf_mount, cni_bin_mount]
    conf_file = policy_config(ctx, spec, objects, volumes, mounts)
    ref = image(ctx, spec, path)
    # The thin plugin: an init container copies the multus binary onto the host, the daemon
    # writes the configuration that points the runtime at it (upstream's
    # manifests/state-multus-cni/0050-multus-ds.yml, whose containers run as root and set
    # no pull policy).
    as_root = {"privileged": True, "runAsUser": 0}
    install = container(
        "install-multus-binary", ref, None, pull_policy=None,
        mounts=[{**cni_bin_mount, "mountPropagation": "Bidirectional"}],
        command=["/install_multus"], args=["--type", "thin"],
        resources={"requests": {"cpu": "10m", "memory": "15Mi"}},
        securityContext=as_root, terminationMessagePolicy="FallbackToLogsOnError")
    args = [
        f"--multus-conf-file={conf_file}",
        "--multus-autoconfig-dir=/host/etc/cni/net.d",
        "--cni-conf-dir=/host/etc/cni/net.d",
        "--cleanup-config-on-exit",
        "--skip-config-watch",
        "--cni-bin-dir=/host/opt/cni/bin",
        f"--multus-kubeconfig-file-host={ctx.cni_network_dir}/multus.d/multus.kubeconfig",
    ]
    objects.append(daemonset(
        ctx, "kube-multus-ds", spec,
        [container("kube-multus", ref, spec, mounts=mounts, pull_policy=None,
                   command=["/thin_entrypoint"], args=args,
                   default_resources=resources("100m", "50Mi", "100m", "50Mi"),
                   securityContext=as_root, terminationMessagePolicy="FallbackToLogsOnError")],
        app="multus", volumes=volumes, service_account_name=NAME, config=spec.config or None,
        managed_only=False, init_containers=[install], priority_class=NODE_CRITICAL,
        grace_period=10, selector={"name": "multus"}, pod_labels={"tier": "node"},
    ))
    return objects


def render_nicop(ctx: Context, spec: MultusSpec) -> list[Obj]:
    """kube-multus-ds with nicop's multus daemon (upstream's selector and labels, so it takes
    over upstream's DaemonSet in place)."""
    objects = [service_account(ctx, NAME), *cluster_rbac(ctx, NAME, [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
         "verbs": ["patch"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
         "resourceNames": [DRIVER], "verbs": ["associated-node:patch"]},
        EVENTS_RULE,
    ])]
    volumes, mounts = [], []
    for name, host_dir in (("cni-conf", ctx.cni_network_dir), ("cni-bin", ctx.cni_bin_dir),
                           ("socket-dir", SOCKET_DIR), ("netns", "/var/run/netns"),
                           ("cni-state", "/var/lib/cni"),
                           ("pod-resources", "/var/lib/kubelet/pod-resources")):
        volume, mount = host_path(name, host_dir, type_="DirectoryOrCreate")
        if name == "netns":
            mount["mountPropagation"] = "HostToContainer"
        volumes.append(volume)
        mounts.append(mount)
    conf_file = policy_config(ctx, spec, objects, volumes, mounts)
    install = agent_container(
        ctx, "install-multus-shim", None,
        ["multus-install", "--host-root", "/host", "--cni-bin-dir", ctx.cni_bin_dir,
         "--socket", MULTUS_SOCKET],
        mounts=[{"name": "cni-bin", "mountPath": f"/host{ctx.cni_bin_dir}"}], ready_probe=False)
    daemon = agent_container(
        ctx, "kube-multus", spec,
        ["multus-daemon", "--socket", MULTUS_SOCKET, "--cni-conf-dir", ctx.cni_network_dir,
         "--cni-bin-dir", ctx.cni_bin_dir, f"--multus-conf-file={conf_file}",
         "--cleanup-config-on-exit"],
        mounts=mounts, metrics_port=METRICS_PORTS["multus-daemon"])
    objects.append(daemonset(
        ctx, "kube-multus-ds", spec, [daemon],
        app="multus", node_selector=LINUX, volumes=volumes, service_account_name=NAME,
        config=spec.config or None, managed_only=False, init_containers=[install],
        priority_class=NODE_CRITICAL, grace_period=10, selector={"name": "multus"},
        pod_labels={"tier": "node"},
    ))
    return objects


STATE = State("state-multus-cni", ("secondaryNetwork", "multus"), "MultusCNIReady", render)
