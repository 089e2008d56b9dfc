"""The simulated parts of a node: its NIC hardware, and the node stand-in that runs nicop's
pods on it (`sim-node`) or only its kubelet's device manager (`sim-kubelet`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.common import HostRoot, LogFormat, app, console, fail, fail_plain

DevicePluginDir = Annotated[
    str,
    typer.Option("--device-plugin-dir", help="The kubelet's device plugin directory, on the host."),
]


@app.command("sim-node")
def sim_node(
    node_name: Annotated[str, typer.Option(help="The simulated node (a kwok node).")],
    kubeconfig: Annotated[Path, typer.Option(help="Kubeconfig of the local cluster.")],
    root: Annotated[Path, typer.Option(help="The node's filesystem; built from the node's "
                                       "hardware profile when it does not exist yet.")],
    pods_dir: Annotated[Path, typer.Option(help="Where the node keeps its pods' volumes, "
                                           "container roots and logs.")],
    netns: Annotated[
        str | None, typer.Option(help="Network namespace of the node, for its hostNetwork pods "
                                 "(root only); default: this process's own.")
    ] = None,
    crash_backoff: Annotated[
        float, typer.Option(min=0.1, help="First back-off in seconds before restarting a "
                            "crashed container (the kubelet's 10 s; doubles up to 300 s).")
    ] = 10.0,
    log_format: LogFormat = "text",
) -> None:
    """Stand in for a simulated node's kubelet: run the pods of nicop's image bound to the node
    as processes on its simulated hardware, register device plugins, report the node's devices."""
    from nicop.node import agent  # first: it quiets gRPC's C core, which reads that at import
    from nicop_sim import node

    options = node.NodeOptions(node_name, kubeconfig, root, pods_dir, netns, crash_backoff)
    reason = agent.run_process(lambda stop: node.run(options, stop), log_format)
    if reason:
        raise fail_plain(reason)


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
    """Only the device manager of a kubelet: register device plugins and follow their devices
    (with --kubeconfig, report them on the node and hand them to its pods)."""
    from nicop.node import agent  # first: it quiets gRPC's C core, which reads that at import
    from nicop.node.host import Host
    from nicop_sim.kubelet import serve

    if kubeconfig is not None and not node_name:
        raise fail("--kubeconfig needs --node-name (the node whose status to patch)")
    socket_dir = Host(host_root).path(device_plugin_dir)
    reason = agent.run_process(lambda stop: serve(socket_dir, stop, node_name, kubeconfig),
                               log_format)
    if reason:
        raise fail_plain(reason)


sim_host_app = typer.Typer(no_args_is_help=True, help="Simulated NIC hardware of a node.")
app.add_typer(sim_host_app, name="sim-host")


@sim_host_app.command("build")
def sim_host_build(
    root: Annotated[Path, typer.Argument(help="Directory to create the node's tree in.")],
    profile: Annotated[
        str, typer.Option(help="Hardware profile: dgx, cx6dx, cx7-ib, bf3, cx6dx-unlabelled "
                          "or cpu (the README describes them).")
    ] = "cx6dx",
    seed: Annotated[int, typer.Option(help="Varies MACs and GUIDs between nodes.")] = 0,
) -> None:
    """Create the sysfs and /dev tree of a node with the profile's NICs."""
    from nicop_sim import hardware

    if profile not in hardware.PROFILES:
        raise fail(f"unknown profile {profile!r}; known: {', '.join(hardware.PROFILES)}")
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
    from nicop_sim import hardware

    if state not in ("up", "down"):
        raise fail(f"state must be up or down, not {state!r}")
    try:
        hardware.SimulatedHost(root).set_link(ifname, state == "up")
    except OSError as e:
        raise fail_plain(str(e)) from None


@sim_host_app.command("numvfs")
def sim_host_numvfs(
    root: Annotated[Path, typer.Argument(help="The node's tree.")],
    pf: Annotated[str, typer.Argument(help="PF netdev or PCI address.")],
    count: Annotated[int, typer.Argument(help="VFs wanted (0 removes them).")],
) -> None:
    """Write sriov_numvfs as the kernel would take it (0 first, then N)."""
    from nicop_sim import hardware

    try:
        hardware.SimulatedHost(root).set_numvfs(pf, count)
    except OSError as e:
        raise fail_plain(str(e)) from None

