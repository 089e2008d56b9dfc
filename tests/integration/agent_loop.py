"""Helpers for the tests of the whole loop: what runs on the simulated nodes, and why."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node, Pod
from prometheus_client.parser import text_string_to_metric_families

from nicop_sim.cluster import Agent, LocalCluster


def agents(cluster: LocalCluster, node: str | None = None) -> list[Agent]:
    """Processes a node stand-in of `cluster` runs for pods, on `node` or any node."""
    return [a for a in cluster.agents() if node is None or a.node == node]


def stand_ins(cluster: LocalCluster) -> dict[int, str]:
    """PID -> node of the cluster's node stand-ins."""
    return {proc.pid: proc.name.split("/")[0] for proc in cluster.state().processes.values()
            if proc.name.endswith("/sim-node")}


def volume_dir(cluster: LocalCluster, pod: Pod, volume: str) -> Path:
    """Where a node stand-in keeps a configMap/emptyDir volume of `pod` (what its containers
    mount)."""
    m = pod.metadata
    return (cluster.state_dir / "p" / pod.spec.nodeName / f"{m.namespace}_{m.name}_{m.uid[:8]}"
            / "volumes" / volume)


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


Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]


def metrics_address(pod: Pod) -> str:
    """Where Prometheus' PodMonitor scrapes the pod's agent: its IP and its port `metrics`."""
    ports = [p.containerPort for c in pod.spec.containers for p in c.ports or []
             if p.name == "metrics"]
    assert ports, f"pod {pod.metadata.name} declares no port named metrics"
    ip = pod.status.podIP or pod.status.hostIP
    assert ip, f"pod {pod.metadata.name} has no IP yet"
    return f"{ip}:{ports[0]}"


def scrape(pod: Pod) -> Metrics:
    """Every sample of the pod's /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://{metrics_address(pod)}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.get((name, frozenset(labels.items())))
