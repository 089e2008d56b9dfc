"""The `nicop` command: every agent, the local cluster, status and diagnosis."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nicop.sim import hardware
from nicop.sim.cluster import ClusterError, LocalCluster, default_bin_dir, default_state_dir

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="nicop: RDMA and SR-IOV networking for Kubernetes.",
)
cluster_app = typer.Typer(
    no_args_is_help=True,
    help="A local Kubernetes control plane (real etcd, kube-apiserver, controller-manager, "
    "scheduler) with simulated GPU nodes run by kwok.",
)
app.add_typer(cluster_app, name="cluster")

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="NICOP_CLUSTER_DIR",
        help="Directory holding the cluster's certificates, data, logs and kubeconfig.",
    ),
]
BinDir = Annotated[
    Path,
    typer.Option(
        "--bin-dir",
        envvar="NICOP_CONTROLPLANE_BIN",
        help="Directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok.",
    ),
]


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}")
    return typer.Exit(1)


@cluster_app.command("up")
def cluster_up(
    nodes: Annotated[int, typer.Option(min=1, help="Number of simulated nodes.")] = 4,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            help="Hardware profile of the nodes, repeated in turn (default: "
            + ", ".join(hardware.DEFAULT_LAYOUT)
            + "). Known: "
            + ", ".join(hardware.PROFILES),
        ),
    ] = None,
    apiserver_port: Annotated[
        int, typer.Option(help="Port of kube-apiserver on 127.0.0.1; 0 picks a free one.")
    ] = 0,
    state_dir: StateDir = default_state_dir(),  # noqa: B008
    bin_dir: BinDir = default_bin_dir(),  # noqa: B008
) -> None:
    """Start the local cluster and create its nodes; prints the time until all nodes are Ready."""
    cluster = LocalCluster(state_dir, bin_dir)
    try:
        result = cluster.up(
            nodes=nodes,
            profiles=profile,
            apiserver_port=apiserver_port,
            progress=lambda line: console.print(f"  {line}"),
        )
    except (ClusterError, ValueError) as e:
        raise _fail(str(e)) from None
    if result.already_running:
        console.print(f"The cluster in {cluster.state_dir} is already up ({cluster.server}).")
    else:
        console.print(
            f"Cluster up in {result.seconds:.1f}s: {len(result.nodes)} nodes Ready at "
            f"{cluster.server}"
        )
    console.print(f"  export KUBECONFIG={cluster.kubeconfig}")


@cluster_app.command("down")
def cluster_down(state_dir: StateDir = default_state_dir()) -> None:  # noqa: B008
    """Stop every process of the local cluster; its data stays for the next `up`."""
    cluster = LocalCluster(state_dir)
    lines = cluster.down()
    if not lines:
        console.print(f"No cluster is running in {cluster.state_dir}.")
    for line in lines:
        console.print(f"  {line}")


@cluster_app.command("status")
def cluster_status(state_dir: StateDir = default_state_dir()) -> None:  # noqa: B008
    """Show which components (and demo agents) run; exits 1 unless the control plane does."""
    cluster = LocalCluster(state_dir)
    state = cluster.state()
    running = cluster.running()
    extras = {name: p.alive() for name, p in state.processes.items() if name not in running}
    for name, up in {**running, **extras}.items():
        proc = state.processes.get(name)
        if up and proc:
            console.print(f"  {name:<24} [green]running[/green]  pid {proc.pid}")
        elif proc:
            console.print(f"  {name:<24} [red]exited[/red]   see {proc.log}")
        else:
            console.print(f"  {name:<24} stopped")
    if all(running.values()):
        console.print(f"API server {cluster.server}; kubeconfig {cluster.kubeconfig}")
    else:
        raise typer.Exit(1)


@cluster_app.command("kubeconfig")
def cluster_kubeconfig(state_dir: StateDir = default_state_dir()) -> None:  # noqa: B008
    """Print the kubeconfig path: export KUBECONFIG=$(nicop cluster kubeconfig)."""
    cluster = LocalCluster(state_dir)
    if not cluster.kubeconfig.exists():
        raise _fail(f"no kubeconfig in {cluster.state_dir}; run `nicop cluster up` first")
    print(cluster.kubeconfig)


@app.command("operator")
def operator(
    namespace: Annotated[
        str,
        typer.Option(envvar="POD_NAMESPACE", help="Namespace of the operator and its components."),
    ] = "nvidia-network-operator",
    kubeconfig: Annotated[
        Path | None,
        typer.Option(envvar="KUBECONFIG", help="Kubeconfig; in-cluster config when unset."),
    ] = None,
    leader_elect: Annotated[
        bool, typer.Option(help="Run only while holding the leader Lease.")
    ] = True,
    health_port: Annotated[
        int, typer.Option(help="Port of /healthz, /readyz, /metrics; 0: off.")
    ] = 8081,
    lease_duration: Annotated[float, typer.Option(help="Leader lease duration in seconds.")] = 15.0,
    log_format: Annotated[str, typer.Option(help="text or json (one object per line).")] = "text",
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
) -> None:
    """Run the operator: NicClusterPolicy and network controllers, leader-elected."""
    from nicop import logs
    from nicop.operator import run

    logs.setup(log_level, log_format)
    with contextlib.suppress(KeyboardInterrupt):
        run.main(namespace, kubeconfig, leader_elect, health_port, lease_duration)


def main() -> None:
    app()


@app.command("demo")
def demo(
    nodes: Annotated[int, typer.Option(min=1, help="Number of simulated nodes.")] = 4,
    profile: Annotated[
        list[str] | None,
        typer.Option(
            help="Hardware profile of the nodes, repeated in turn. Known: "
            + ", ".join(hardware.PROFILES)
        ),
    ] = None,
    state_dir: StateDir = default_state_dir(),  # noqa: B008
    bin_dir: BinDir = default_bin_dir(),  # noqa: B008
) -> None:
    """Run nicop end to end on this machine with simulated GPU nodes."""
    from nicop import demo as demo_module

    try:
        demo_module.run(console, nodes, profile, state_dir, bin_dir)
    except (ClusterError, ValueError) as e:
        raise _fail(str(e)) from None


# --- crds: the CustomResourceDefinitions generated from nicop.api -----------------------------

crds_app = typer.Typer(
    no_args_is_help=True,
    help="The CRDs of every kind nicop reads, generated from its API models.",
)
app.add_typer(crds_app, name="crds")


@crds_app.command("generate")
def crds_generate(
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Directory of the CRD files.")] = Path(
        "deploy/crds"
    ),
    check: Annotated[
        bool, typer.Option("--check", help="Write nothing; exit 1 if a file is out of date.")
    ] = False,
) -> None:
    """Write one CRD file per kind (<group>_<plural>.yaml) from the models."""
    from nicop.api import crdgen

    if check:
        problems = crdgen.stale(out_dir)
        for line in problems:
            err.print(f"  {line}")
        if problems:
            raise _fail("CRD files are out of date; run `nicop crds generate`")
        console.print(f"CRD files in {out_dir} are up to date.")
        return
    changed = crdgen.generate(out_dir)
    for path in changed:
        console.print(f"  wrote {path}")
    console.print(f"{len(changed)} of the CRD files in {out_dir} changed.")


@crds_app.command("install")
def crds_install(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            envvar="KUBECONFIG", help="Kubeconfig of the cluster (default ~/.kube/config)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each CRD.")] = 60.0,
) -> None:
    """Apply the CRDs to the cluster and wait until the API server serves them."""
    import httpx2
    from lightkube import ApiError, Client, KubeConfig
    from lightkube.core.exceptions import ConfigError

    from nicop.api.install import CrdInstallError, install_crds

    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
        client = Client(config=config, field_manager="nicop")
        names = install_crds(
            client, progress=lambda line: console.print(f"  {line}"), timeout=timeout
        )
    except httpx2.TransportError as e:
        current = config.get()
        server = f" {current.cluster.server}" if current else ""
        raise _fail(f"cannot reach the API server{server}: {e}") from None
    except (CrdInstallError, ApiError, ConfigError, OSError) as e:
        raise _fail(str(e)) from None
    console.print(f"{len(names)} CRDs installed and established.")


# --- node agents: device plugins, and the simulated hardware and kubelet they run against -----

HostRoot = Annotated[
    Path,
    typer.Option(
        "--host-root",
        envvar="NICOP_HOST_ROOT",
        help="Where the node's filesystem is (sysfs, /dev, /var/lib/kubelet): / on a node, "
        "a simulated node's root in tests.",
    ),
]
DevicePluginDir = Annotated[
    str,
    typer.Option("--device-plugin-dir", help="The kubelet's device plugin directory, on the host."),
]
PollInterval = Annotated[
    float,
    typer.Option(min=0.05, help="Seconds between rescans of the host (links, VFs, RDMA devices)."),
]
LogFormat = Annotated[
    str, typer.Option("--log-format", help="text, or json (one object per line).")
]


def _agent_fail(message: str) -> typer.Exit:
    """_fail for messages that quote config values: brackets in them are not rich markup."""
    from rich.markup import escape

    return _fail(escape(message))


def _run_agent(main: object, log_format: str) -> None:
    """Run an agent's `main(stop)` until SIGTERM; exit 1 with the reason if it must give up."""
    from nicop.node import agent

    reason = agent.run_process(main, log_format)  # type: ignore[arg-type]
    if reason:
        raise _agent_fail(reason)


@app.command("rdma-device-plugin")
def rdma_device_plugin(
    config_file: Annotated[
        Path, typer.Option("--config-file", help="configList JSON, as for the upstream plugin.")
    ] = Path("/k8s-rdma-shared-dev-plugin/config.json"),
    host_root: HostRoot = Path("/"),
    device_plugin_dir: DevicePluginDir = "/var/lib/kubelet/device-plugins",
    poll_interval: PollInterval = 0.5,
    log_format: LogFormat = "text",
) -> None:
    """Share each NIC's RDMA devices with pods (drop-in for k8s-rdma-shared-dev-plugin)."""
    from nicop.node.deviceplugin.config import ConfigError
    from nicop.node.deviceplugin.rdma import RdmaAgent, load_config
    from nicop.node.host import Host

    try:
        config = load_config(config_file)
    except ConfigError as e:
        raise _agent_fail(str(e)) from None
    host = Host(host_root)
    agent = RdmaAgent(config, host, host.path(device_plugin_dir), poll_interval)
    _run_agent(agent.run, log_format)


@app.command("sriov-device-plugin")
def sriov_device_plugin(
    config_file: Annotated[
        Path, typer.Option("--config-file", help="resourceList JSON, as for the upstream plugin.")
    ] = Path("/etc/pcidp/config.json"),
    resource_prefix: Annotated[
        str, typer.Option("--resource-prefix", help="Prefix of resources that set none.")
    ] = "intel.com",
    host_root: HostRoot = Path("/"),
    device_plugin_dir: DevicePluginDir = "/var/lib/kubelet/device-plugins",
    poll_interval: PollInterval = 0.5,
    log_format: LogFormat = "text",
) -> None:
    """Give pods SR-IOV VFs and scalable functions (drop-in for sriov-network-device-plugin);
    picks up new VFs and config changes without a restart."""
    from nicop.node.deviceplugin.config import ConfigError
    from nicop.node.deviceplugin.sriov import SriovAgent
    from nicop.node.host import Host

    host = Host(host_root)
    try:
        agent = SriovAgent(
            config_file,
            host,
            host.path(device_plugin_dir),
            default_prefix=resource_prefix,
            poll_interval=poll_interval,
        )
    except ConfigError as e:
        raise _agent_fail(str(e)) from None
    _run_agent(agent.run, log_format)


@app.command("sim-kubelet")
def sim_kubelet(
    host_root: HostRoot,
    node_name: Annotated[
        str | None, typer.Option(help="Node whose status to patch (with --kubeconfig).")
    ] = None,
    kubeconfig: Annotated[
        Path | None, typer.Option(help="Patch the node's capacity and allocatable there.")
    ] = None,
    device_plugin_dir: DevicePluginDir = "/var/lib/kubelet/device-plugins",
    log_format: LogFormat = "text",
) -> None:
    """Stand in for a simulated node's kubelet: register device plugins, follow their devices."""
    from nicop.node import agent  # first: it quiets gRPC's C core, which reads that at import
    from nicop.node.host import Host
    from nicop.sim.kubelet import serve

    if kubeconfig is not None and not node_name:
        raise _fail("--kubeconfig needs --node-name (the node whose status to patch)")
    socket_dir = Host(host_root).path(device_plugin_dir)
    reason = agent.run_process(lambda stop: serve(socket_dir, stop, node_name, kubeconfig),
                               log_format)
    if reason:
        raise _agent_fail(reason)


sim_host_app = typer.Typer(no_args_is_help=True, help="Simulated NIC hardware of a node.")
app.add_typer(sim_host_app, name="sim-host")


@sim_host_app.command("build")
def sim_host_build(
    root: Annotated[Path, typer.Argument(help="Directory to create the node's tree in.")],
    profile: Annotated[
        str, typer.Option(help="Hardware profile: " + ", ".join(hardware.PROFILES))
    ] = "cx6dx",
    seed: Annotated[int, typer.Option(help="Varies MACs and GUIDs between nodes.")] = 0,
) -> None:
    """Create the sysfs and /dev tree of a node with the profile's NICs."""
    if profile not in hardware.PROFILES:
        raise _fail(f"unknown profile {profile!r}; known: {', '.join(hardware.PROFILES)}")
    host = hardware.SimulatedHost.build(root, profile, seed)
    for pf in host.pfs():
        console.print(f"  {pf}  {host.netdev(pf) or '-':<16} {host.rdma_device(pf) or '-'}")


@sim_host_app.command("link")
def sim_host_link(
    root: Annotated[Path, typer.Argument(help="The node's tree.")],
    ifname: Annotated[str, typer.Argument(help="Netdev to change.")],
    state: Annotated[str, typer.Argument(help="up or down")],
) -> None:
    """Take a link up or down (its VFs follow a PF)."""
    if state not in ("up", "down"):
        raise _fail(f"state must be up or down, not {state!r}")
    try:
        hardware.SimulatedHost(root).set_link(ifname, state == "up")
    except OSError as e:
        raise _agent_fail(str(e)) from None


@sim_host_app.command("numvfs")
def sim_host_numvfs(
    root: Annotated[Path, typer.Argument(help="The node's tree.")],
    pf: Annotated[str, typer.Argument(help="PF netdev or PCI address.")],
    count: Annotated[int, typer.Argument(help="VFs wanted (0 removes them).")],
) -> None:
    """Write sriov_numvfs as the kernel would take it (0 first, then N)."""
    try:
        hardware.SimulatedHost(root).set_numvfs(pf, count)
    except OSError as e:
        raise _agent_fail(str(e)) from None


# --- CNI plugins: the node daemon and the installer of the plugin executables -----------------

CniSocket = Annotated[
    str,
    typer.Option("--socket", help="Unix socket of the daemon, a path on the node (under "
                 "--host-root)."),
]


@app.command("cni-daemon")
def cni_daemon(
    host_root: HostRoot = Path("/"),
    socket: CniSocket = "/run/nicop/cni.sock",
    node_name: Annotated[
        str, typer.Option(envvar="NODE_NAME", help="This node (its blocks of the pools).")
    ] = "",
    kubeconfig: Annotated[
        Path | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig of the cluster.")
    ] = None,
    api: Annotated[
        bool | None,
        typer.Option("--api/--no-api", help="Follow IPPools/CIDRPools in the API server; "
                     "default: when a kubeconfig is given or in a pod."),
    ] = None,
    pools_namespace: Annotated[
        str, typer.Option(envvar="POD_NAMESPACE", help="Namespace of the IPPools/CIDRPools.")
    ] = "nvidia-network-operator",
    pools_file: Annotated[
        Path | None,
        typer.Option(help="Pools of this node as JSON {name: {subnet, startIP, endIP, "
                     "gateway}}, for nodes without an API server."),
    ] = None,
    host_netns: Annotated[
        str | None,
        typer.Option(help="Network namespace holding the node's devices (default: the "
                     "daemon's own)."),
    ] = None,
    pf_recorder: Annotated[
        Path | None,
        typer.Option(help="Record PF-side VF settings in this directory instead of "
                     "programming the PF (nodes without SR-IOV hardware)."),
    ] = None,
    cleaner_interval: Annotated[
        float, typer.Option(help="Seconds between checks for addresses of deleted pods.")
    ] = 60.0,
    cleaner_checks: Annotated[
        int, typer.Option(min=1, help="Checks a pod must be missing before its address is "
                          "freed.")
    ] = 3,
    health_port: Annotated[int, typer.Option(help="Port of /healthz, /metrics; 0: off.")] = 0,
    log_format: LogFormat = "text",
) -> None:
    """Serve the sriov, ib-sriov, host-device and nv-ipam CNI plugins of this node."""
    import asyncio
    import os

    from nicop.cni.daemon import CniDaemon, DaemonOptions
    from nicop.cni.store import StoreError

    if api is None:
        api = kubeconfig is not None or "KUBERNETES_SERVICE_HOST" in os.environ
    options = DaemonOptions(
        host_root=host_root, socket=socket, node_name=node_name, kubeconfig=kubeconfig,
        use_api=api, pools_namespace=pools_namespace, pools_file=pools_file,
        host_netns=host_netns, pf_recorder=pf_recorder, cleaner_interval=cleaner_interval,
        cleaner_checks=cleaner_checks, health_port=health_port,
    )

    async def main(stop: asyncio.Event) -> None:
        await CniDaemon(options).run(stop)

    try:
        _run_agent(main, log_format)
    except (StoreError, ValueError, OSError) as e:
        raise _agent_fail(str(e)) from None


@app.command("cni-install")
def cni_install(
    cni_bin_dir: Annotated[
        str, typer.Option(help="CNI bin dir on the node (under --host-root).")
    ] = "/opt/cni/bin",
    host_root: HostRoot = Path("/"),
    socket: CniSocket = "/run/nicop/cni.sock",
    python: Annotated[
        str, typer.Option(help="Python 3 of the node that runs the plugin executables.")
    ] = "/usr/bin/python3",
    plugin: Annotated[
        list[str] | None, typer.Option(help="Plugins to install (default: all).")
    ] = None,
) -> None:
    """Install the CNI plugin executables that forward to `nicop cni-daemon`."""
    from nicop.cni.install import PLUGINS, install
    from nicop.node.host import Host

    unknown = sorted(set(plugin or ()) - set(PLUGINS))
    if unknown:
        raise _fail(f"unknown plugin(s) {unknown}; known: {', '.join(PLUGINS)}")
    host = Host(host_root)
    for path in install(host.path(cni_bin_dir), socket, python, tuple(plugin or PLUGINS)):
        console.print(f"  wrote {path}")


# --- driver: the NIC driver container's entrypoint and its probes -----------------------------

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
    backend: Annotated[
        str,
        typer.Option(help="host: package manager and modprobe; sim: the simulated kernel of "
                     "the node under --host-root."),
    ] = "host",
    sim_build_seconds: Annotated[
        float,
        typer.Option(help="With --backend sim: build from sources taking this long (0: the "
                     "version is precompiled)."),
    ] = 0.0,
    log_format: LogFormat = "text",
) -> None:
    """Install and load the driver version, validate it, write the readiness file; on SIGTERM
    remove it (and restore the inbox driver with RESTORE_DRIVER_ON_POD_TERMINATION=true)."""
    import asyncio
    import os
    import signal

    from nicop import logs
    from nicop.node import driver
    from nicop.node.driver_backends import DriverBackend, HostBackend
    from nicop.node.host import Host

    logs.setup("info", log_format)
    annotation = driver.SAFE_LOAD_ANNOTATION
    try:
        if init_config is not None:
            from_file, annotation = driver.load_init_config(init_config)
            safe_load = from_file if safe_load is None else safe_load
        cfg = driver.DriverConfig.from_env(
            os.environ, version=version, node_name=node_name, ready_file=ready_file,
            validation_timeout=validation_timeout, safe_load=bool(safe_load),
            safe_load_annotation=annotation,
        )
    except driver.DriverError as e:
        raise _agent_fail(str(e)) from None
    if cfg.safe_load and not cfg.node_name:
        raise _fail("safe load needs the node's name: set NODE_NAME or --node-name")
    host = Host(host_root)
    chosen: DriverBackend
    if backend == "sim":
        from nicop.sim.kernel import SimulatedBackend, SimulatedKernel

        chosen = SimulatedBackend(
            SimulatedKernel(host_root),
            precompiled=[] if sim_build_seconds > 0 else [cfg.version],
            build_seconds=sim_build_seconds,
        )
    elif backend == "host":
        chosen = HostBackend(driver.os_id(host), sources, inventory, nfsrdma=cfg.enable_nfsrdma)
    else:
        raise _fail(f"--backend must be host or sim, not {backend!r}")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        client = None
        if cfg.safe_load:
            from nicop.kube.client import ApiClient

            client = ApiClient(kubeconfig)
        try:
            safe = (driver.SafeLoad(client, cfg.node_name or "", cfg.safe_load_annotation)
                    if client is not None else None)
            await driver.DriverAgent(cfg, host, chosen, safe).run(stop)
        finally:
            if client is not None:
                await client.close()

    try:
        asyncio.run(main())
    except driver.DriverError as e:
        driver.log.error("driver not ready: %s", e)
        raise _agent_fail(str(e)) from None


@driver_app.command("probe")
def driver_probe(
    kind: Annotated[str, typer.Argument(help="startup, liveness or readiness.")],
    host_root: HostRoot = Path("/"),
    ready_file: ReadyFilePath = "/run/mellanox/drivers/.driver-ready",
    version: DriverVersion = None,
) -> None:
    """Exit 0 or 1 with a one-line reason, for the driver DaemonSet's probes."""
    from nicop.node import driver
    from nicop.node.host import Host

    try:
        ok, reason = driver.probe(Host(host_root), kind, ready_file, version)
    except ValueError as e:
        raise _fail(str(e)) from None
    print(reason)
    if not ok:
        raise typer.Exit(1)


# --- status and diagnose: what the stack is doing, and what is wrong with it ------------------

OutputFormat = Annotated[
    str, typer.Option("--output", "-o", help="table (for people), json or yaml (for scripts).")
]
StatusKubeconfig = Annotated[
    Path | None,
    typer.Option(envvar="KUBECONFIG", help="Kubeconfig; ~/.kube/config or in-cluster when unset."),
]
OperatorNamespace = Annotated[
    str,
    typer.Option("--namespace", "-n", envvar="POD_NAMESPACE",
                 help="Namespace of the operator and its components."),
]


def _print_data(data: object, output: str) -> None:
    import json

    import yaml

    if output == "json":
        print(json.dumps(data, indent=2))
    else:
        print(yaml.safe_dump(data, sort_keys=False), end="")


@app.command("status")
def status(
    output: OutputFormat = "table",
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep refreshing the tables.")
    ] = False,
    interval: Annotated[
        float, typer.Option(min=0.5, help="Seconds between refreshes with --watch.")
    ] = 2.0,
    kubeconfig: StatusKubeconfig = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Operator and leader, policy components, every node's driver, resources and VFs, IPAM
    pools and driver upgrade progress (-o json follows docs/status-schema.json)."""
    from nicop import status as status_module

    if output not in ("table", "json", "yaml"):
        raise _fail(f"--output must be table, json or yaml, not {output!r}")
    if watch and output != "table":
        raise _fail("--watch refreshes the tables; for scripts, run -o json repeatedly")

    def read() -> dict[str, object]:
        try:
            snap = status_module.read_cluster(
                kubeconfig, lambda client: status_module.collect(client, namespace))
        except status_module.ClusterReadError as e:
            raise _agent_fail(str(e)) from None
        return status_module.summarize(snap)

    if not watch:
        summary = read()
        if output == "table":
            # Piped into a file or a pager: as wide as the tables need, not 80 columns.
            out = console if console.is_terminal else Console(
                width=max(console.width, 240), highlight=False, soft_wrap=True)
            out.print(status_module.render(summary))
        else:
            _print_data(summary, output)
        return
    import time

    from rich.console import RenderableType
    from rich.live import Live
    from rich.text import Text

    def view() -> RenderableType:
        """The tables, or why the cluster could not be read this time (the watch goes on)."""
        try:
            snap = status_module.read_cluster(
                kubeconfig, lambda client: status_module.collect(client, namespace))
        except status_module.ClusterReadError as e:
            return Text(f"cannot read the cluster: {e}; trying again every {interval:g}s",
                        style="red")
        return status_module.render(status_module.summarize(snap))

    with contextlib.suppress(KeyboardInterrupt), Live(
        view(), console=console, auto_refresh=False, screen=False
    ) as live:
        while True:
            time.sleep(interval)
            live.update(view(), refresh=True)


@app.command("diagnose")
def diagnose(
    kind: Annotated[
        str | None,
        typer.Argument(metavar="node|pod",
                       help="node or pod; leave out to check the whole cluster."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="NAME of the node, or NAMESPACE/NAME of the pod."),
    ] = None,
    output: OutputFormat = "table",
    kubeconfig: StatusKubeconfig = None,
    namespace: OperatorNamespace = "nvidia-network-operator",
) -> None:
    """Run the troubleshooting checklist on the cluster, a node or a pod; every failure names
    its cause and fix. Exits 1 when a check fails."""
    from nicop import diagnose as diagnose_module
    from nicop import status as status_module

    if output not in ("table", "json", "yaml"):
        raise _fail(f"--output must be table, json or yaml, not {output!r}")
    try:
        target = diagnose_module.Target.parse(kind, name)
    except ValueError as e:
        raise _fail(str(e)) from None
    try:
        snap = status_module.read_cluster(
            kubeconfig, lambda client: diagnose_module.collect(client, namespace, target))
    except status_module.ClusterReadError as e:
        raise _agent_fail(str(e)) from None
    checks = diagnose_module.diagnose(snap, target)
    result = diagnose_module.report(snap, target, checks)
    if output == "table":
        console.print(diagnose_module.render(result))
    else:
        _print_data(result, output)
    if diagnose_module.failed(checks):
        raise typer.Exit(1)


# --- SR-IOV config daemon: applies the node's SriovNetworkNodeState to the host ----------------

@app.command("sriov-config-daemon")
def sriov_config_daemon(
    node_name: Annotated[
        str, typer.Option(envvar="NODE_NAME", help="This node (its SriovNetworkNodeState).")
    ] = "",
    namespace: Annotated[
        str, typer.Option(envvar="NAMESPACE", help="Namespace of the node states (the operator's).")
    ] = "nvidia-network-operator",
    kubeconfig: Annotated[
        Path | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig; in-cluster when unset.")
    ] = None,
    host_root: HostRoot = Path("/"),
    resync_interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between checks of the host for drift.")
    ] = 30.0,
    max_attempts: Annotated[
        int, typer.Option(min=1, help="Tries of one configuration before syncStatus Failed.")
    ] = 3,
    retry_delay: Annotated[
        float, typer.Option(min=0.0, help="Seconds before the second try; doubles each time.")
    ] = 2.0,
    failed_retry_interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds before a Failed configuration is tried "
                            "again (a changed spec is tried at once).")
    ] = 120.0,
    drain_timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds to wait for the node's drain.")
    ] = 900.0,
    pf_recorder: Annotated[
        Path | None,
        typer.Option(help="Read the VFs' VLANs from the cni-daemon's recorder directory "
                     "instead of the PFs (nodes without SR-IOV hardware)."),
    ] = None,
    sim_host: Annotated[
        bool, typer.Option(help="--host-root is a simulated node (nicop sim-host build): "
                           "writes to sriov_numvfs create VFs there as the kernel would.")
    ] = False,
    log_format: LogFormat = "text",
) -> None:
    """Configure this node's SR-IOV PFs and VFs as its SriovNetworkNodeState asks (drop-in for
    sriov-network-config-daemon); reports Failed with the PF and the step instead of retrying
    forever."""
    import asyncio

    from nicop.kube.client import ApiClient
    from nicop.node.host import Host
    from nicop.node.sriov_daemon import DaemonOptions, SriovConfigDaemon, VfVlan

    if not node_name:
        raise _fail("the node's name is needed: set NODE_NAME or --node-name")
    vf_vlan: VfVlan | None = None
    if pf_recorder is not None:
        from nicop.cni.vf import RecordingVfControl

        recorder = RecordingVfControl(pf_recorder)

        def vf_vlan(pf: str, vf: int) -> int | None:
            return recorder.get(pf, vf).vlan
    options = DaemonOptions(
        node_name=node_name, namespace=namespace, resync_interval=resync_interval,
        max_attempts=max_attempts, retry_delay=retry_delay,
        failed_retry_interval=failed_retry_interval, drain_timeout=drain_timeout,
    )

    async def main(stop: asyncio.Event) -> None:
        client = ApiClient(kubeconfig)
        try:
            host = hardware.SimulatedHost(host_root) if sim_host else Host(host_root)
            await SriovConfigDaemon(client, host, options, vf_vlan=vf_vlan).run(stop)
        finally:
            await client.close()

    _run_agent(main, log_format)
