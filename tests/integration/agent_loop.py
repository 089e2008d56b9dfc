"""Helpers for the tests of the whole loop: what runs on the simulated nodes, and why."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node, Pod

from nicop.sim.cluster import LocalCluster


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    argv: list[str]
    env: dict[str, str]

    @property
    def command(self) -> str:
        """`nicop <command>` of an agent (`rdma-device-plugin`, `driver run`, ...)."""
        args = self.argv[self.argv.index("nicop") + 1:] if "nicop" in self.argv else self.argv
        return " ".join(a for a in args[:2] if not a.startswith("-"))


def processes() -> list[Process]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")[:-1]
            raw = Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        env = dict(v.partition("=")[::2] for v in raw.split("\0") if "=" in v)
        found.append(Process(int(entry), int(fields[1]), argv, env))
    return found


def agents(cluster: LocalCluster, node: str | None = None) -> list[Process]:
    """Processes a node stand-in of `cluster` runs for pods (their kubeconfig is in its pods
    directory), on `node` or any node."""
    pods = cluster.state_dir / "p"
    where = str(pods / node) if node else str(pods)
    return [p for p in processes()
            if p.env.get("KUBECONFIG", "").startswith(where + "/") and "nicop" in p.argv]


def stand_ins(cluster: LocalCluster) -> dict[int, str]:
    """PID -> node of the cluster's node stand-ins."""
    return {proc.pid: proc.name.split("/")[0] for proc in cluster.state().processes.values()
            if proc.name.endswith("/sim-node")}


def allocatable(client: Client, node: str, resource: str) -> int:
    return int((client.get(Node, node).status.allocatable or {}).get(resource, "0"))


def pods(client: Client, namespace: str, labels: dict[str, Any]) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=namespace, labels=labels)
            if not p.metadata.deletionTimestamp]


def ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def delete(client: Client, kind: Any, name: str, namespace: str | None = None) -> None:
    try:
        client.delete(kind, name, namespace=namespace)
    except ApiError as e:
        if e.status.code != 404:
            raise
