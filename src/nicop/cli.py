"""The `nicop` command: every agent, the local cluster, status and diagnosis."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nicop.sim import hardware
from nicop.sim.cluster import ClusterError, LocalCluster, default_bin_dir, default_state_dir

app = typer.Typer(no_args_is_help=True, help="nicop: RDMA and SR-IOV networking for Kubernetes.")
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
    """Show which components run; exits 1 unless all of them do."""
    cluster = LocalCluster(state_dir)
    state = cluster.state()
    running = cluster.running()
    for name, up in running.items():
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
