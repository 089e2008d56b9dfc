"""`nicop driver`: the NIC driver container's entrypoint and its probes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.common import (
    HostRoot,
    LogFormat,
    MetricsPort,
    app,
    fail,
    fail_plain,
    in_container,
    platform,
)

driver_app = typer.Typer(
    no_args_is_help=True,
    help="The NVIDIA NIC driver container: install, load, validate and keep the driver "
    "(drop-in for the upstream driver container's entrypoint).",
)
app.add_typer(driver_app, name="driver")

DriverVersion = Annotated[
    str | None,
    typer.Option(
        "--version",
        envvar="NVIDIA_NIC_DRIVER_VER",
        help="Driver version to run, e.g. 24.10-1.1.4.0.",
        show_default=False,
    ),
]
ReadyFilePath = Annotated[
    str,
    typer.Option("--ready-file", envvar="DRIVER_READY_PATH", help="Readiness file, on the host."),
]


@driver_app.command("run")
def driver_run(
    version: DriverVersion = None,
    host_root: HostRoot = Path("/"),
    node_name: Annotated[
        str | None, typer.Option(envvar="NODE_NAME", help="This node, for safe load.")
    ] = None,
    safe_load: Annotated[
        bool | None,
        typer.Option(
            "--safe-load/--no-safe-load",
            help="Annotate the node and wait for the upgrade controller before unloading "
            "(default: safeDriverLoad.enable of --init-config, else off).",
            show_default=False,
        ),
    ] = None,
    init_config: Annotated[
        Path | None,
        typer.Option(help="The init container config (ConfigMap ofed-init-container-config)."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(envvar="KUBECONFIG", help="Kubeconfig; in-cluster config when unset."),
    ] = None,
    sources: Annotated[
        Path | None,
        typer.Option(envvar="NVIDIA_NIC_DRIVER_PATH", help="Driver sources (with install.pl)."),
    ] = None,
    inventory: Annotated[
        Path | None,
        typer.Option(
            envvar="NVIDIA_NIC_DRIVERS_INVENTORY_PATH",
            help="Keeps built packages per kernel and version, so a restart does not compile.",
        ),
    ] = None,
    ready_file: ReadyFilePath = "/run/mellanox/drivers/.driver-ready",
    validation_timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for every device to come back.")
    ] = 120.0,
    preflight_interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between checks of a held reload (what "
                            "holds it is on the node's nicop.io/ofed-driver-preflight).")
    ] = 10.0,
    force_precompiled: Annotated[
        bool, typer.Option(help="Never build the driver on the node: without precompiled "
                           "packages for the running kernel, hold and say so (forcePrecompiled).")
    ] = False,
    log_format: LogFormat = "text",
    metrics_port: MetricsPort = 0,
) -> None:
    """Install and load the driver version, validate it, write the readiness file; on SIGTERM
    remove it (and restore the inbox driver with RESTORE_DRIVER_ON_POD_TERMINATION=true)."""
    import asyncio
    import os
    import signal

    from nicop import logs
    from nicop.api.labels import SAFE_LOAD_ANNOTATION
    from nicop.node import driver, preflight
    from nicop.node.metrics import serve_metrics

    logs.setup("info", log_format)
    annotation = SAFE_LOAD_ANNOTATION
    try:
        if init_config is not None:
            from_file, annotation = driver.load_init_config(in_container(init_config))
            safe_load = from_file if safe_load is None else safe_load
        cfg = driver.DriverConfig.from_env(
            os.environ, version=version, node_name=node_name, ready_file=ready_file,
            validation_timeout=validation_timeout, safe_load=bool(safe_load),
            safe_load_annotation=annotation, force_precompiled=force_precompiled or None,
            preflight_interval=preflight_interval,
        )
    except driver.DriverError as e:
        raise fail_plain(str(e)) from None
    if cfg.safe_load and not cfg.node_name:
        raise fail("safe load needs the node's name: set NODE_NAME or --node-name")
    # The machine's kernel (modules, release) and files as the driver sees them: on a node
    # with simulated hardware, the simulated kernel's.
    machine = platform()
    host = machine.host(host_root)
    chosen = machine.driver_backend(host, cfg.version, sources=sources,
                                    inventory=inventory, nfsrdma=cfg.enable_nfsrdma)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # Its readiness is its exec probes' (the loaded driver), not a /readyz.
        metrics = await serve_metrics(metrics_port, ready=lambda: True)
        client = None
        # Safe load needs the API server; preflight uses it to show a refusal on the node.
        if cfg.safe_load or (cfg.node_name and (kubeconfig is not None
                                                or "KUBERNETES_SERVICE_HOST" in os.environ)):
            from nicop.kube.client import ApiClient

            client = ApiClient(kubeconfig)
        try:
            safe = (driver.SafeLoad(client, cfg.node_name or "", cfg.safe_load_annotation)
                    if client is not None and cfg.safe_load else None)
            reporter = preflight.Reporter(client, cfg.node_name)
            await driver.DriverAgent(cfg, host, chosen, safe, reporter).run(stop)
        finally:
            if client is not None:
                await client.close()
            if metrics is not None:
                metrics.close()

    try:
        asyncio.run(main())
    except driver.DriverError as e:
        driver.log.error("driver not ready: %s", e)
        raise fail_plain(str(e)) from None


@driver_app.command("probe")
def driver_probe(
    kind: Annotated[str, typer.Argument(help="startup, liveness or readiness.")],
    host_root: HostRoot = Path("/"),
    ready_file: ReadyFilePath = "/run/mellanox/drivers/.driver-ready",
    version: DriverVersion = None,
) -> None:
    """Exit 0 or 1 with a one-line reason, for the driver DaemonSet's probes."""
    from nicop.node.kernel import probe

    try:
        ok, reason = probe(platform().host(host_root), kind, ready_file, version)
    except ValueError as e:
        raise fail(str(e)) from None
    print(reason)
    if not ok:
        raise typer.Exit(1)

