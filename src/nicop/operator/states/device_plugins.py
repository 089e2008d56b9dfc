"""What the two device plugin states share: the config ConfigMap and the plugin DaemonSet."""

from __future__ import annotations

from typing import Any

from nicop.api.agents import METRICS_PORTS, uses_nicop
from nicop.api.labels import OWNER_LABEL
from nicop.kube.resources import Obj
from nicop.operator.states.base import (
    AFTER_DRIVER,
    EVENTS_RULE,
    Context,
    agent_container,
    cluster_rbac,
    config_map,
    container,
    daemonset,
    host_path,
    image,
    json_config,
    service_account,
)


def device_plugin(
    ctx: Context,
    spec: Obj,
    path: str,
    *,
    name: str,
    container_name: str,
    app: str,
    config_map_name: str,
    config_dir: str,
    host_dirs: dict[str, str],
    args: list[str],
    agent: str,
    selector: dict[str, str] | None = None,
    pod_labels: dict[str, str] | None = None,
    host_types: dict[str, str] | None = None,
    cdi_dirs: dict[str, tuple[str, str]] | None = None,
    service_account_name: str | None = None,
) -> list[Obj]:
    """The plugin's ConfigMap (from the section's JSON `config`) and its DaemonSet, which starts
    only where the driver is ready and rolls when the config changes. With `image: nicop` the
    container runs nicop's `agent` command, on the same mounts and config file, as a
    ServiceAccount `name` that may record Events (a config file it cannot use).

    `selector` is upstream's DaemonSet selector, `host_types` upstream's hostPath types by
    volume, `cdi_dirs` the extra host directories (volume -> (host, mount)) upstream mounts with
    `useCdi`, and `service_account_name` the ServiceAccount upstream runs the plugin as."""
    config = json_config(spec, path)
    objects = []
    volumes, mounts = [], []
    extra_dirs = {k: (v, v) for k, v in host_dirs.items()}
    if spec.get("useCdi"):
        extra_dirs.update(cdi_dirs or {})
    for volume_name, (host, mount_path) in extra_dirs.items():
        volume, mount = host_path(volume_name, host, mount_path,
                                  type_=(host_types or {}).get(volume_name))
        volumes.append(volume)
        mounts.append(mount)
    if config is not None:
        objects.append(config_map(ctx, config_map_name, {"config.json": spec["config"]}))
        volumes.append({"name": "config", "configMap": {"name": config_map_name, "items": [
            {"key": "config.json", "path": "config.json"}]}})
        mounts.append({"name": "config", "mountPath": config_dir})
    if spec.get("useCdi"):
        args = [*args, "--use-cdi"]
    account = service_account_name
    if account:
        objects.append(service_account(ctx, account))
    if uses_nicop(spec):
        # Upstream's arguments (--use-cdi, --log-dir, ...): nicop's agents take them alike.
        extra: dict[str, Any] = {"args": args} if args else {}
        plugin = agent_container(ctx, container_name, spec, [agent], mounts=mounts,
                                 metrics_port=METRICS_PORTS[agent], **extra)
        if account is None:
            account = name
            objects.append(service_account(ctx, name))
        objects += cluster_rbac(ctx, account, [EVENTS_RULE])
    else:
        plugin = container(container_name, image(ctx, spec, path), spec, mounts=mounts,
                           privileged=True, args=args)
    objects.append(daemonset(
        ctx, name, spec, [plugin],
        app=app, node_selector=AFTER_DRIVER, volumes=volumes, config=config,
        service_account_name=account, selector=selector,
        pod_labels={**(pod_labels or {}), OWNER_LABEL: ctx.owner},
    ))
    return objects
