"""The node agents: device plugins, the SR-IOV config daemon, the CNI and multus daemons and
their installers.

Each runs as a container of a DaemonSet the operator renders. Paths given to them are paths in
their container (`in_container` finds them on a simulated node); `--host-root` is where the
node's filesystem is mounted in the container.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nicop.api.agents import CNI_SOCKET, MULTUS_SOCKET
from nicop.cli.common import (
    HostRoot,
    Kubeconfig,
    LogFormat,
    MetricsPort,
    app,
    console,
    fail,
    fail_plain,
    in_container,
    platform,
    run_agent,
)

DevicePluginDir = Annotated[
    str,
    typer.Option("--device-plugin-dir", help="The kubelet's device plugin directory, on the host."),
]
PollInterval = Annotated[
    float,
    typer.Option(min=0.05, help="Seconds between rescans of the host (links, VFs, RDMA devices)."),
]
LogLevel = Annotated[
    str,
    typer.Option("--log-level", help="debug, info, warning or error; a number is glog's -v "
                 "(upstream's DaemonSets pass one): 4 and above is debug."),
]
LogDir = Annotated[
    str | None,
    typer.Option("--log-dir", "--log_dir",
                 help="Also write the log to <dir>/<agent>.log; a relative dir is under /var/log "
                 "(as upstream's entrypoint takes it). Without it, stderr only (kubectl logs)."),
]
LogMaxSize = Annotated[
    int, typer.Option("--log-max-size", min=1, help="With --log-dir: MB before the file rotates.")
]
LogMaxFiles = Annotated[
    int, typer.Option("--log-max-files", min=1, help="With --log-dir: rotated files kept.")
]
LogMaxAge = Annotated[
    int, typer.Option("--log-max-age", help="Accepted for upstream's DaemonSets (days); files "
                      "are kept by --log-max-files.")
]
UseCdi = Annotated[
    bool,
    typer.Option("--use-cdi", help="Describe devices in CDI spec files (/var/run/cdi) and hand "
                 "them to containers by CDI name, as upstream's --use-cdi."),
]
NodeName = Annotated[str, typer.Option(envvar="NODE_NAME", help="This node.")]


def _level(value: str) -> str:
    if value.isdigit():
        return "debug" if int(value) >= 4 else "info"
    return value


def _log_file(log_dir: str | None, name: str, max_mb: int, files: int) -> None:
    """Also log to `<log_dir>/<name>.log`, rotated at `max_mb`, keeping `files` old ones."""
    if log_dir is None:
        return
    import logging
    from logging.handlers import RotatingFileHandler

    from nicop.cli.common import in_container

    directory = in_container(Path(log_dir if log_dir.startswith("/") else f"/var/log/{log_dir}"))
    directory.mkdir(parents=True, exist_ok=True)
    handler = RotatingFileHandler(directory / f"{name}.log", maxBytes=max_mb * 1024 * 1024,
                                  backupCount=files)
    handler.setFormatter(logging.getLogger().handlers[0].formatter)
    logging.getLogger().addHandler(handler)


@app.command("rdma-device-plugin")
def rdma_device_plugin(
    config_file: Annotated[
        Path, typer.Option("--config-file", help="configList JSON, as for the upstream plugin.")
    ] = Path("/k8s-rdma-shared-dev-plugin/config.json"),
    host_root: HostRoot = Path("/"),
    device_plugin_dir: DevicePluginDir = "/var/lib/kubelet/device-plugins",
    poll_interval: PollInterval = 0.5,
    log_format: LogFormat = "text",
    log_level: LogLevel = "info",
    log_dir: LogDir = None,
    log_max_size: LogMaxSize = 100,
    log_max_files: LogMaxFiles = 5,
    use_cdi: UseCdi = False,
    metrics_port: MetricsPort = 0,
) -> None:
    """Share each NIC's RDMA devices with pods (drop-in for k8s-rdma-shared-dev-plugin)."""
    from nicop.node.deviceplugin.config import ConfigError
    from nicop.node.deviceplugin.rdma import RdmaAgent, check_netns_mode, load_config
    from nicop.node.host import Host
    from nicop.node.report import Reporter

    real = in_container(config_file)
    host = Host.in_container(host_root)
    try:
        config = load_config(real)
        check_netns_mode(host)
    except ConfigError as e:  # named as the container sees it
        raise fail_plain(str(e).replace(str(real), str(config_file))) from None
    agent = RdmaAgent(config, host, host.path(device_plugin_dir), poll_interval,
                      config_path=real, reporter=Reporter.from_env(), use_cdi=use_cdi)
    run_agent(agent.run, log_format, _level(log_level),
              lambda: _log_file(log_dir, "rdma-shared-dp", log_max_size, log_max_files),
              metrics_port)


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
    log_level: LogLevel = "info",
    log_dir: LogDir = None,
    log_max_size: LogMaxSize = 100,
    log_max_files: LogMaxFiles = 5,
    log_max_age: LogMaxAge = 30,
    use_cdi: UseCdi = False,
    metrics_port: MetricsPort = 0,
) -> None:
    """Give pods SR-IOV VFs and scalable functions (drop-in for sriov-network-device-plugin);
    picks up new VFs and config changes without a restart."""
    from nicop.node.deviceplugin.config import ConfigError
    from nicop.node.deviceplugin.sriov import SriovAgent
    from nicop.node.host import Host
    from nicop.node.report import Reporter

    host = Host.in_container(host_root)
    real = in_container(config_file)
    try:
        agent = SriovAgent(
            real,
            host,
            host.path(device_plugin_dir),
            default_prefix=resource_prefix,
            poll_interval=poll_interval,
            reporter=Reporter.from_env(),
            use_cdi=use_cdi,
        )
    except ConfigError as e:  # named as the container sees it
        raise fail_plain(str(e).replace(str(real), str(config_file))) from None
    run_agent(agent.run, log_format, _level(log_level),
              lambda: _log_file(log_dir, "sriovdp", log_max_size, log_max_files), metrics_port)


@app.command("sriov-config-daemon")
def sriov_config_daemon(
    node_name: NodeName = "",
    namespace: Annotated[
        str, typer.Option(envvar="NAMESPACE", help="Namespace of the node states (the operator's).")
    ] = "nvidia-network-operator",
    kubeconfig: Kubeconfig = None,
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
    log_format: LogFormat = "text",
    metrics_port: MetricsPort = 0,
) -> None:
    """Configure this node's SR-IOV PFs and VFs as its SriovNetworkNodeState asks (drop-in for
    sriov-network-config-daemon); reports Failed with the PF and the step instead of retrying
    forever."""
    import asyncio

    from nicop.kube.client import ApiClient
    from nicop.node.sriov_daemon import DaemonOptions, SriovConfigDaemon

    if not node_name:
        raise fail("the node's name is needed: set NODE_NAME or --node-name")
    options = DaemonOptions(
        node_name=node_name, namespace=namespace, resync_interval=resync_interval,
        max_attempts=max_attempts, retry_delay=retry_delay,
        failed_retry_interval=failed_retry_interval, drain_timeout=drain_timeout,
    )
    machine = platform()
    host = machine.host(host_root)
    vf_vlan = machine.vf_vlan()

    async def main(stop: asyncio.Event) -> None:
        client = ApiClient(kubeconfig)
        try:
            await SriovConfigDaemon(client, host, options, vf_vlan=vf_vlan).run(stop)
        finally:
            await client.close()

    run_agent(main, log_format, metrics_port=metrics_port)


@app.command("dra-plugin")
def dra_plugin(
    node_name: NodeName = "",
    namespace: Annotated[str, typer.Option(
        envvar="POD_NAMESPACE", help="Where the SR-IOV DRA driver's SriovResourcePolicies and "
        "DeviceAttributes, and the node's SriovNetworkNodeState, are read (the pod's "
        "namespace, the operator's).")] = "default",
    kubeconfig: Kubeconfig = None,
    host_root: HostRoot = Path("/"),
    poll_interval: PollInterval = 1.0,
    shared_rdma: Annotated[bool, typer.Option(
        "--shared-rdma", help="Publish each port without VFs as one shared device many claims "
        "hold, each taking one of its `pods` capacity, instead of a whole PF for one claim.")
    ] = False,
    sriov_resources: Annotated[bool, typer.Option(
        "--sriov-resources", help="Publish the VFs SriovNetworkNodePolicies make (attribute "
        "resourceName): this node serves their resources by DRA, not the SR-IOV device plugin. "
        "Without it those VFs are left to the device plugin.")] = False,
    log_format: LogFormat = "text",
    metrics_port: MetricsPort = 0,
) -> None:
    """Publish this node's RDMA NICs and VFs as DRA devices (driver rdma.nicop.io): one
    ResourceSlice pool per node, rescanned as the device plugins do; removed when it stops.
    Serves the kubelet's DRA plugin API (registration in /var/lib/kubelet/plugins_registry),
    preparing allocated claims as CDI specs in /var/run/cdi. While the node's NIC driver is
    not ready (its mofed.wait label "true") the NICs stay published, tainted
    rdma.nicop.io/driver-not-ready. VFs that the node's SriovNetworkNodeState plans are
    published before they are made, with binding conditions the plugin sets once each VF is
    ready. On a simulated node (nicop-sim's
    platform) the node's simulated GPUs are published too, as the NVIDIA GPU DRA driver
    (gpu.nvidia.com) would, so GPU-NIC claims can be tried.

    Example: nicop dra-plugin --node-name node-1 --kubeconfig ~/.kube/config
    """
    import asyncio

    from nicop.api import dra
    from nicop.kube.client import ApiClient
    from nicop.node import discovery
    from nicop.node.dra.binding import Binder
    from nicop.node.dra.devices import Device, node_devices, pool_content
    from nicop.node.dra.driver_state import DriverWatch, held_while_reloading
    from nicop.node.dra.plugin import DraPlugin
    from nicop.node.dra.publisher import PoolSource, SlicePublisher
    from nicop.node.dra.slices import PoolContent
    from nicop.node.dra.vf_plan import VfPlanWatch
    from nicop.node.dra.vf_policy import VfPolicyWatch
    from nicop.node.readiness import Readiness

    if not node_name:
        raise fail("the node's name is needed: set NODE_NAME or --node-name")
    machine = platform()
    host = machine.host(host_root)
    sources: dict[str, PoolSource] = dict(machine.extra_dra_pools(host))

    async def main(stop: asyncio.Event) -> None:
        client = ApiClient(kubeconfig)
        driver = DriverWatch(client, node_name)
        vfs = VfPolicyWatch(client, namespace)
        planned = VfPlanWatch(client, namespace, node_name)
        scanned: dict[str, Device] | None = None

        def nics() -> PoolContent:
            nonlocal scanned
            inventory, plan = discovery.scan(host), planned.plan()
            devices = node_devices(inventory, host, shared=shared_rdma,
                                   vfs=vfs.policy(driver.labels), plan=plan,
                                   sriov_resources=sriov_resources)
            scanned = {d.name: d for d in devices}
            return pool_content(devices, inventory, plan)

        sources[dra.DRIVER] = held_while_reloading(nics, driver)
        binder = Binder(client, node_name, lambda: scanned, interval=poll_interval)
        watching = [asyncio.create_task(driver.run()), asyncio.create_task(vfs.run()),
                    asyncio.create_task(planned.run())]
        await asyncio.gather(driver.informer.synced.wait(), vfs.synced(),
                             planned.informer.synced.wait())
        publishers = [SlicePublisher(client, name, node_name, source, interval=poll_interval)
                      for name, source in sources.items()]

        def poke(*_: object) -> None:
            for publisher in publishers:
                publisher.poke()

        for informer in (driver.informer, vfs.policies, vfs.attributes, planned.informer):
            informer.on_change(poke)
        plugin = DraPlugin(client, node_name, host)
        readiness = Readiness()

        async def ready_once_published() -> None:
            await asyncio.gather(*(p.published.wait() for p in publishers))
            readiness.set(True)

        await plugin.start()
        marking = asyncio.create_task(ready_once_published())
        try:
            await asyncio.gather(binder.run(stop), *(p.run(stop) for p in publishers))
        finally:
            marking.cancel()
            for task in watching:
                task.cancel()
            readiness.clear()
            await plugin.stop()
            for publisher in publishers:
                await publisher.withdraw()
            await client.close()

    run_agent(main, log_format, metrics_port=metrics_port)


# --- CNI plugins: the node daemon and the installer of the plugin executables -----------------

CniSocket = Annotated[
    str,
    typer.Option("--socket", help="Unix socket of the daemon, a path on the node (under "
                 "--host-root)."),
]
CniBinDir = Annotated[str, typer.Option(help="CNI bin dir on the node (under --host-root).")]
NodePython = Annotated[
    str, typer.Option(help="Python 3 of the node that runs the plugin executables.")]


@app.command("cni-daemon")
def cni_daemon(
    host_root: HostRoot = Path("/"),
    socket: CniSocket = CNI_SOCKET,
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
        typer.Option(envvar="NICOP_HOST_NETNS",
                     help="Network namespace holding the node's devices (default: the "
                     "daemon's own; simulated nodes set it)."),
    ] = None,
    cleaner_interval: Annotated[
        float, typer.Option(help="Seconds between checks for addresses of deleted pods.")
    ] = 60.0,
    cleaner_checks: Annotated[
        int, typer.Option(min=1, help="Checks a pod must be missing before its address is "
                          "freed.")
    ] = 3,
    health_port: Annotated[int, typer.Option(
        "--metrics-port", "--health-port", min=0,
        help="Serve Prometheus /metrics (and /healthz, /readyz) on this port of the pod's IP "
        "($POD_IP, else every address); 0: off.")] = 0,
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
        use_api=api, pools_namespace=pools_namespace,
        pools_file=in_container(pools_file) if pools_file else None,
        host_netns=host_netns, cleaner_interval=cleaner_interval,
        cleaner_checks=cleaner_checks, health_port=health_port,
    )
    if controls := platform().pf_controls():
        options.vfs, options.rdma = controls

    async def main(stop: asyncio.Event) -> None:
        await CniDaemon(options).run(stop)

    try:
        run_agent(main, log_format)
    except (StoreError, ValueError, OSError) as e:
        raise fail_plain(str(e)) from None


@app.command("cni-install")
def cni_install(
    cni_bin_dir: CniBinDir = "/opt/cni/bin",
    host_root: HostRoot = Path("/"),
    socket: CniSocket = CNI_SOCKET,
    python: NodePython = "/usr/bin/python3",
    plugin: Annotated[
        list[str] | None, typer.Option(help="Plugins to install (default: all).")
    ] = None,
) -> None:
    """Install the CNI plugin executables that forward to `nicop cni-daemon`."""
    from nicop.api.agents import CNI_PLUGINS as PLUGINS
    from nicop.cni.install import install
    from nicop.node.host import Host

    unknown = sorted(set(plugin or ()) - set(PLUGINS))
    if unknown:
        raise fail(f"unknown plugin(s) {unknown}; known: {', '.join(PLUGINS)}")
    host = Host.in_container(host_root)
    for path in install(host.path(cni_bin_dir), socket, python, tuple(plugin or PLUGINS)):
        console.print(f"  wrote {path}")


@app.command("multus-daemon")
def multus_daemon(
    host_root: HostRoot = Path("/"),
    socket: CniSocket = MULTUS_SOCKET,
    cni_conf_dir: Annotated[
        str, typer.Option(help="CNI conf dir on the node (under --host-root): where "
                          "00-multus.conf goes and the default network's config is found.")
    ] = "/etc/cni/net.d",
    cni_bin_dir: Annotated[
        str, typer.Option(help="CNI bin dir on the node (under --host-root): the delegates.")
    ] = "/opt/cni/bin",
    multus_conf_file: Annotated[
        str, typer.Option(help="`auto`: wrap the conf dir's first other config as the default "
                          "network; else a file (in this container) written as 00-multus.conf "
                          "as it is.")
    ] = "auto",
    multus_kubeconfig_file_host: Annotated[
        str, typer.Option(help="`kubeconfig` recorded in a generated 00-multus.conf (this "
                          "daemon uses --kubeconfig).")
    ] = "",
    cleanup_config_on_exit: Annotated[
        bool, typer.Option(help="Remove 00-multus.conf when the daemon stops.")
    ] = False,
    kubeconfig: Kubeconfig = None,
    pod_resources_socket: Annotated[
        str, typer.Option(help="The kubelet's PodResources socket on the node (under "
                          "--host-root): the devices allocated to each pod.")
    ] = "/var/lib/kubelet/pod-resources/kubelet.sock",
    metrics_port: MetricsPort = 0,
    log_format: LogFormat = "text",
    log_level: LogLevel = "info",
) -> None:
    """Serve the `multus` CNI plugin (a Multus-compatible thick meta-plugin): the default
    network, then each NetworkAttachmentDefinition a pod's k8s.v1.cni.cncf.io/networks selects,
    with the pod's allocated devices as deviceID; writes the pod's network-status."""
    import asyncio

    from nicop.cni.multus_daemon import MultusDaemon, MultusOptions
    from nicop.kube.kubeconfig import KubeconfigError

    options = MultusOptions(
        host_root=host_root, socket=socket, cni_conf_dir=cni_conf_dir, cni_bin_dir=cni_bin_dir,
        multus_conf_file=multus_conf_file, multus_kubeconfig=multus_kubeconfig_file_host,
        kubeconfig=kubeconfig, cleanup_config_on_exit=cleanup_config_on_exit,
        pod_resources_socket=pod_resources_socket, health_port=metrics_port)

    async def main(stop: asyncio.Event) -> None:
        await MultusDaemon(options).run(stop)

    try:
        run_agent(main, log_format, _level(log_level))
    except (KubeconfigError, ValueError, OSError) as e:
        raise fail_plain(f"multus-daemon: {e}") from None


@app.command("multus-install")
def multus_install(
    cni_bin_dir: CniBinDir = "/opt/cni/bin",
    host_root: HostRoot = Path("/"),
    socket: CniSocket = MULTUS_SOCKET,
    python: NodePython = "/usr/bin/python3",
) -> None:
    """Install the `multus` CNI plugin executable that forwards to `nicop multus-daemon`
    (with nicop-multus.conf naming its socket)."""
    from nicop.cni.install import install_multus
    from nicop.node.host import Host

    host = Host.in_container(host_root)
    for path in install_multus(host.path(cni_bin_dir), socket, python):
        console.print(f"  wrote {path}")


@app.command("discover-node")
def discover_node(host_root: HostRoot = Path("/")) -> None:
    """Print this node's Mellanox NIC ports as JSON, and leave them as the container's
    termination message: what `nicop discover` runs on a node no agent reports yet."""
    import contextlib
    import json

    from nicop.node import discovery
    from nicop.node.host import Host

    report = json.dumps(discovery.nic_report(discovery.scan(Host.in_container(host_root))),
                        separators=(",", ":"))
    print(report)
    termination = in_container(Path("/dev/termination-log"))
    if termination.parent.is_dir():
        with contextlib.suppress(OSError):  # outside a container: printed is enough
            termination.write_text(report)


@app.command("probe-ready")
def probe_ready() -> None:
    """Exit 0 while this container's agent is ready, else 1 with the reason (the readiness
    probe of nicop's agent DaemonSets; the agent keeps the file named by $NICOP_READY_FILE)."""
    from nicop.node.readiness import probe

    ok, reason = probe()
    print(reason)
    if not ok:
        raise typer.Exit(1)
