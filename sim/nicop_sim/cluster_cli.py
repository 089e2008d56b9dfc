"""`nicop cluster`, `nicop demo` and `nicop bundle replay`: the local control plane with
simulated GPU nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nicop.cli.bundle import bundle_app
from nicop.cli.common import StateDir, app, console, fail

cluster_app = typer.Typer(
    no_args_is_help=True,
    help="A local Kubernetes control plane (real etcd, kube-apiserver, controller-manager, "
    "scheduler) with simulated GPU nodes: kwok keeps the nodes, a node stand-in per node runs "
    "nicop's agents on its simulated hardware.",
)
app.add_typer(cluster_app, name="cluster")

BinDir = Annotated[
    Path | None,
    typer.Option(
        "--bin-dir",
        envvar="NICOP_CONTROLPLANE_BIN",
        show_default="~/.cache/nicop/controlplane/current/bin",
        help="Directory with etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok.",
    ),
]
Nodes = Annotated[int, typer.Option(min=1, help="Number of simulated nodes.")]
Profiles = Annotated[
    list[str] | None,
    typer.Option(
        "--profile",
        help="Hardware profile of the nodes, repeated in turn (default: dgx, cx6dx, cx6dx, "
        "cx6dx-unlabelled); `nicop sim-host build --help` lists them.",
    ),
]


@cluster_app.command("up")
def cluster_up(
    nodes: Nodes = 4,
    profile: Profiles = None,
    apiserver_port: Annotated[
        int, typer.Option(help="Port of kube-apiserver on 127.0.0.1; 0 picks a free one.")
    ] = 0,
    node_agents: Annotated[
        bool, typer.Option(help="Start a node stand-in per node (runs the pods of nicop's "
                           "image there); without, nicop's agent pods stay Pending.")
    ] = True,
    real_nodes: Annotated[
        int, typer.Option(min=0, help="Also start this many real nodes (real-1, ...): a real "
                          "kubelet with containerd and runc, running nicop's image on simulated "
                          "NIC hardware (root; `make runtime image` builds what they need).")
    ] = 0,
    real_profile: Annotated[
        str, typer.Option(help="Hardware profile of the real nodes.")
    ] = "cx6dx",
    state_dir: StateDir = None,
    bin_dir: BinDir = None,
) -> None:
    """Start the local cluster and create its nodes; prints the time until all nodes are Ready."""
    from nicop_sim.cluster import ClusterError, LocalCluster

    cluster = LocalCluster(state_dir, bin_dir)
    try:
        result = cluster.up(
            nodes=nodes,
            profiles=profile,
            apiserver_port=apiserver_port,
            node_agents=node_agents,
            real_nodes=real_nodes,
            real_profile=real_profile,
            progress=lambda line: console.print(f"  {line}"),
        )
    except (ClusterError, ValueError) as e:
        raise fail(str(e)) from None
    if result.already_running:
        console.print(f"The cluster in {cluster.state_dir} is already up ({cluster.server}).")
    else:
        console.print(
            f"Cluster up in {result.seconds:.1f}s: {len(result.nodes)} nodes Ready at "
            f"{cluster.server}"
        )
    console.print(f"  export KUBECONFIG={cluster.kubeconfig}")


@cluster_app.command("down")
def cluster_down(state_dir: StateDir = None) -> None:
    """Stop every process of the local cluster; its data stays for the next `up`."""
    from nicop_sim.cluster import LocalCluster

    cluster = LocalCluster(state_dir)
    lines = cluster.down()
    if not lines:
        console.print(f"No cluster is running in {cluster.state_dir}.")
    for line in lines:
        console.print(f"  {line}")


@cluster_app.command("status")
def cluster_status(state_dir: StateDir = None) -> None:
    """Show which components and node stand-ins run; exits 1 unless the control plane does."""
    from nicop_sim.cluster import LocalCluster

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
def cluster_kubeconfig(state_dir: StateDir = None) -> None:
    """Print the kubeconfig path: export KUBECONFIG=$(nicop cluster kubeconfig)."""
    from nicop_sim.cluster import LocalCluster

    cluster = LocalCluster(state_dir)
    if not cluster.kubeconfig.exists():
        raise fail(f"no kubeconfig in {cluster.state_dir}; run `nicop cluster up` first")
    print(cluster.kubeconfig)


@app.command("demo")
def demo(
    nodes: Nodes = 4,
    profile: Profiles = None,
    state_dir: StateDir = None,
    bin_dir: BinDir = None,
    real_node: Annotated[bool | None, typer.Option(
        "--real-node/--no-real-node",
        help="Add real-1, a node run by a real kubelet, containerd and runc (root; make runtime "
             "image). Default: when this machine can, else the demo says why not.")] = None,
) -> None:
    """Run nicop end to end on this machine with simulated GPU nodes."""
    from nicop_sim import demo as demo_module
    from nicop_sim.cluster import ClusterError

    try:
        demo_module.run(console, nodes, profile, state_dir, bin_dir, real_node)
    except (ClusterError, ValueError) as e:
        raise fail(str(e)) from None


@bundle_app.command("replay")
def bundle_replay(
    bundle: Annotated[Path, typer.Argument(metavar="BUNDLE.tar.gz",
                                           help="An archive `nicop bundle` wrote.")],
    timeout: Annotated[float, typer.Option(min=10, help="Seconds to wait for the policy to "
                                           "reach the bundle's state.")] = 300.0,
    state_dir: StateDir = None,
    bin_dir: BinDir = None,
) -> None:
    """A local cluster shaped like the bundle's (its nodes with labels, taints and NIC hardware,
    its policies, networks and pools) with the operator running, to see the customer's
    `nicop status` and `nicop diagnose` and to try a fix with `nicop plan`. Waits until the
    policy reaches the bundle's state, then says where the status still differs. The cluster
    keeps running: `nicop cluster down` stops it."""
    import json
    import time

    from nicop import status as nicop_status
    from nicop_sim.cluster import ClusterError, LocalCluster
    from nicop_sim.replay import NOT_REPLAYED, STATUS_DIFFERS, Bundle, ReplayError, replay
    from nicop_sim.replay import differences as status_differences

    try:
        archive = Bundle.read(bundle)
    except ReplayError as e:
        raise fail(str(e)) from None
    console.print("Not in a bundle, so not replayed:", markup=False)
    for item in NOT_REPLAYED:
        console.print(f"  - {item}", markup=False)
    cluster = LocalCluster(state_dir, bin_dir)
    if any(cluster.running().values()):
        raise fail(f"a cluster already runs in {cluster.state_dir}: `nicop cluster down` it "
                   "or give another --state-dir")
    try:
        kubeconfig = replay(archive, cluster, lambda line: console.print(f"  {line}",
                                                                        markup=False))
    except (ClusterError, ValueError) as e:
        raise fail(str(e)) from None
    wanted = archive.status
    namespace = str(archive.manifest.get("namespace"))
    differs: list[str] = []
    if wanted is not None:
        deadline = time.monotonic() + timeout
        while True:
            try:  # what `nicop status -o json` prints, read here
                snap = nicop_status.read_cluster(
                    kubeconfig, lambda client: nicop_status.collect(client, namespace), None)
            except nicop_status.ClusterReadError as e:
                if time.monotonic() > deadline:
                    differs = [f"status could not be read: {e}"]
                    break
            else:
                printed = json.loads(json.dumps(nicop_status.summarize(snap)))  # as -o json
                differs = status_differences(wanted, printed)
                if not differs or time.monotonic() > deadline:
                    break
            time.sleep(2.0)
        if differs:
            console.print(f"The replay's status differs from the bundle's in: "
                          f"{', '.join(differs)}", markup=False)
        else:
            console.print("The replay's status matches the bundle's (apart from "
                          f"{', '.join(STATUS_DIFFERS)}).", markup=False)
    console.print(f"  export KUBECONFIG={kubeconfig}", markup=False)
    console.print(f"  nicop cluster down --state-dir {cluster.state_dir}   # when done",
                  markup=False)
