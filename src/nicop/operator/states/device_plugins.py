"""What the two device plugin states share: the config ConfigMap and the plugin DaemonSet."""

from __future__ import annotations

from typing import Any

from nicop.api.agents import METRICS_PORTS, uses_nicop
from nicop.api.labels import OWNER_LABEL
from nicop.api.mellanox import DevicePluginSpec
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    AFTER_DRIVER,
    EVENTS_RULE,
    LINUX,
    NODE_CRITICAL,
    Context,
    agent_container,
    cluster_rbac,
    config_map,
    container,
    daemonset,
    host_path,
    image,
    json_config,
    nic_nodes,
    service_account,
    typed,
)

HostDir = tuple[str, str, str | None]  # host path, mount path, hostPath type


def device_plugin(
    ctx: Context,
    section: Obj,
    path: str,
    *,
    name: str,
    container_name: str,
    app: str,
    config_map_name: str,
    config_volume: str,
    config_dir: str,
    host_dirs: dict[str, HostDir],
    mount_order: list[str],
    volume_order: list[str],
    cdi_dirs: dict[str, HostDir],
    args: list[str],
    agent: str,
    command: list[str] | None = None,
    selector: dict[str, str] | None = None,
    pod_labels: dict[str, str] | None = None,
    service_account_name: str | None = None,
) -> list[Obj]:
    """The plugin's ConfigMap (from the section's JSON `config`) and its DaemonSet, which starts
    only where the driver is ready and rolls when the config changes. With `image: nicop` the
    container runs nicop's `agent` command, on the same mounts and config file, as a
    ServiceAccount `name` that may record Events (a config file it cannot use).

    Volumes and mounts come in upstream's orders (`mount_order`, `volume_order`, by volume
    name, the config volume among them), `cdi_dirs` after them with `useCdi`; `selector` is
    upstream's DaemonSet selector and `service_account_name` the ServiceAccount upstream runs
    the plugin as. Without `config` nicop mounts no config volume (upstream's pod would wait
    for a ConfigMap it does not render)."""
    spec = typed(DevicePluginSpec, section, path)
    raw = spec.config or ""
    config = json_config(raw, path)
    dirs = dict(host_dirs)
    mount_names, volume_names = list(mount_order), list(volume_order)
    if spec.use_cdi:
        dirs.update(cdi_dirs)
        mount_names += list(cdi_dirs)
        volume_names += list(cdi_dirs)
        args = [*args, "--use-cdi"]
    objects = []
    volumes: dict[str, Obj] = {}
    mounts: dict[str, Obj] = {}
    for volume_name, (host, mount_path, type_) in dirs.items():
        volumes[volume_name], mounts[volume_name] = host_path(volume_name, host, mount_path,
                                                              type_=type_)
    if config is not None:
        objects.append(config_map(ctx, config_map_name, {"config.json": raw}))
        volumes[config_volume] = {"name": config_volume, "configMap": {
            "name": config_map_name, "items": [{"key": "config.json", "path": "config.json"}]}}
        mounts[config_volume] = {"name": config_volume, "mountPath": config_dir}
    ordered_mounts = [mounts[n] for n in mount_names if n in mounts]
    ordered_volumes = [volumes[n] for n in volume_names if n in volumes]
    account = service_account_name
    if account:
        objects.append(service_account(ctx, account))
    node_selector = {**nic_nodes(ctx), **AFTER_DRIVER}
    if uses_nicop(spec.image):
        # Upstream's arguments (--use-cdi, --log-dir, ...): nicop's agents take them alike.
        extra: dict[str, Any] = {"args": args} if args else {}
        plugin = agent_container(ctx, container_name, spec, [agent], mounts=ordered_mounts,
                                 metrics_port=METRICS_PORTS[agent], **extra)
        if account is None:
            account = name
            objects.append(service_account(ctx, name))
        if not ctx.node_policy:
            # A NicNodePolicy's names carry its hash, which RBAC cannot name ahead of time (the
            # chart lets the operator write only its components' fixed ClusterRole names):
            # the plugins of a node policy report to their log, not in Events.
            objects += cluster_rbac(ctx, account, [EVENTS_RULE])
        node_selector.update(LINUX)
    else:
        extra = {"command": command} if command else {}
        if args:
            extra["args"] = args
        plugin = container(container_name, image(ctx, spec, path), spec, mounts=ordered_mounts,
                           privileged=True, **extra)
    objects.append(daemonset(
        ctx, name, spec, [plugin],
        app=app, node_selector=node_selector, volumes=ordered_volumes,
        config=raw if config is not None else None,
        service_account_name=account, selector=selector, priority_class=NODE_CRITICAL,
        pod_labels={**(pod_labels or {}), OWNER_LABEL: ctx.owner},
    ))
    return objects
