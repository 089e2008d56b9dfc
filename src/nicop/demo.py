"""`nicop demo`: the whole system on one machine, step by step, with simulated GPU nodes."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from nicop.sim import hardware
from nicop.sim.cluster import PROFILE_ANNOTATION, LocalCluster


def run(
    console: Console, nodes: int, profiles: list[str] | None, state_dir: Path, bin_dir: Path
) -> None:
    """Bring the local cluster up and show its nodes as nicop sees them."""
    cluster = LocalCluster(state_dir, bin_dir)
    console.rule("[bold]1. A local cluster with simulated GPU nodes")
    result = cluster.up(
        nodes=nodes, profiles=profiles, progress=lambda line: console.print(f"  {line}")
    )
    if result.already_running:
        console.print(f"  already up at {cluster.server}")
    else:
        console.print(f"  up in {result.seconds:.1f}s at {cluster.server}")
    show_nodes(console, cluster)
    console.rule("[bold]Explore")
    console.print(f"  export KUBECONFIG={cluster.kubeconfig}")
    console.print("  kubectl get nodes --show-labels")
    console.print("  nicop cluster status")
    console.print("  nicop cluster down      # stops every process; data stays for the next run")


def show_nodes(console: Console, cluster: LocalCluster) -> None:
    from lightkube.resources.core_v1 import Node

    table = Table("node", "profile", "NICs", f"label {hardware.MELLANOX_PRESENT_LABEL}", "Ready")
    for node in cluster.client().list(Node):
        labels = node.metadata.labels or {}
        profile = hardware.PROFILES.get(
            (node.metadata.annotations or {}).get(PROFILE_ANNOTATION, "")
        )
        nics = ", ".join(f"{n.model} ({n.link_type})" for n in profile.nics) if profile else "?"
        labelled = labels.get(hardware.MELLANOX_PRESENT_LABEL) == "true"
        note = (
            "true"
            if labelled
            else (
                "[yellow]missing: label it or run NFD[/yellow]"
                if profile and profile.has_mellanox_nic
                else "-"
            )
        )
        ready = any(
            c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])
        )
        table.add_row(
            node.metadata.name,
            profile.name if profile else "?",
            nics or "none",
            note,
            "yes" if ready else "no",
        )
    console.print(table)
