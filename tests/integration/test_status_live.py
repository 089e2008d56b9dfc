"""`nicop status` against the real control plane with the operator and a policy: the JSON keeps
to the documented schema, and the tables show what a user looks for."""

from __future__ import annotations

import contextlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding
from tests.eventually import eventually
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from typer.testing import CliRunner

from nicop.cli import app

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "status-schema.json").read_text())
VERSION = "doca3.5.0-26.07-0.7.0.0-0"
NicClusterPolicy = create_global_resource(
    "mellanox.com", "v1alpha1", "NicClusterPolicy", "nicclusterpolicies")


def status(kubeconfig: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["status", *args, "--kubeconfig", str(kubeconfig),
                                      "--namespace", NAMESPACE])
    assert result.exit_code == 0, result.output
    return result.stdout


def state(client: Client) -> str | None:
    try:
        return (client.get(NicClusterPolicy, "nic-cluster-policy").get("status") or {}).get(
            "state")
    except ApiError:
        return None


def apply_example_policy(client: Client) -> None:
    """The InfiniBand example policy, applied and ready."""
    body = yaml.safe_load((ROOT / "examples" / "nicclusterpolicy-infiniband.yaml").read_text())
    client.apply(NicClusterPolicy(**body), field_manager="test", force=True)
    eventually(lambda: state(client) == "ready", 90, "the InfiniBand policy to be ready")


def remove_policy(client: Client) -> None:
    """Delete the policy and its objects. Garbage collection would get there too, but only once
    the controller-manager's discovery has caught up with the CRD (tens of seconds on a fresh
    cluster); the next test module should find a clean cluster at once."""
    client.delete(NicClusterPolicy, "nic-cluster-policy")
    owned = {"nvidia.network-operator.state": None}
    for kind in (DaemonSet, Deployment, ConfigMap, ServiceAccount):
        for obj in client.list(kind, namespace=NAMESPACE, labels=owned):
            with contextlib.suppress(ApiError):
                client.delete(kind, obj.metadata.name, namespace=NAMESPACE)
    for cluster_kind in (ClusterRole, ClusterRoleBinding):
        for obj in client.list(cluster_kind, labels=owned):
            with contextlib.suppress(ApiError):
                client.delete(cluster_kind, obj.metadata.name)
    eventually(lambda: not list(client.list(DaemonSet, namespace=NAMESPACE, labels=owned)), 30,
               "the policy's DaemonSets to be gone")


@pytest.fixture(scope="module")
def policy(client: Client, operator: OperatorProcess) -> Iterator[None]:
    apply_example_policy(client)
    yield
    remove_policy(client)


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


def test_json_of_the_live_cluster_validates_and_tells_the_state(
    kubeconfig: Path, policy: None
) -> None:
    document = json.loads(status(kubeconfig, "-o", "json"))
    errors = list(Draft202012Validator(SCHEMA).iter_errors(document))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]

    assert document["operator"]["leader"]["active"]
    assert document["policy"]["state"] == "ready"
    assert by_name(document["policy"]["components"])["state-OFED"]["state"] == "ready"
    nodes = by_name(document["nodes"])
    for name in ("node-1", "node-2", "node-3"):
        node = nodes[name]
        assert node["managed"] and node["mofedWait"] == "false"
        assert node["driver"]["ready"] and node["driver"]["version"] == VERSION
        assert node["upgradeState"] == "upgrade-done"  # autoUpgrade is on in this policy
    assert not nodes["node-4"]["managed"] and nodes["node-4"]["mellanoxNic"]
    assert "kubectl label node node-4" in nodes["node-4"]["unmanagedReason"]
    assert document["driverUpgrade"] == {"done": 3, "inProgress": 0, "waiting": 0, "failed": 0}

    # YAML carries the same document.
    assert yaml.safe_load(status(kubeconfig, "-o", "yaml"))["nodes"] == document["nodes"]


def test_tables_for_people(kubeconfig: Path, policy: None) -> None:
    text = status(kubeconfig)
    assert "nic-cluster-policy: ready" in text
    assert VERSION in text and "state-RDMA-device-plugin" in text
    assert "kubectl label node node-4 feature.node.kubernetes.io/pci-15b3.present=true" in text


def test_graph_names_every_component_and_node_coloured_by_state(
    kubeconfig: Path, client: Client, policy: None, tmp_path: Path
) -> None:
    picture = tmp_path / "loop.svg"
    document = json.loads(status(kubeconfig, "-o", "json", "--graph", str(picture)))
    svg = "{http://www.w3.org/2000/svg}"
    boxes = {}
    for g in ET.parse(picture).getroot().iter(f"{svg}g"):
        if g.get("class") == "box":
            boxes["".join(next(g.iter(f"{svg}text")).itertext())] = g.get("data-state")

    components = by_name(document["policy"]["components"])
    assert components and set(components) <= set(boxes)
    for name, component in components.items():
        assert boxes[name] == component["state"]
    assert {n["name"] for n in document["nodes"]} <= set(boxes)
    assert boxes["NicClusterPolicy nic-cluster-policy"] == "ready"
    for node in ("node-1", "node-2", "node-3"):
        assert boxes[node] == "ready"
    assert boxes["node-4"] == "error"  # a ConnectX NIC without the label the policy selects by
    owned = {"nvidia.network-operator.state": None}
    workloads = [f"DaemonSet {d.metadata.name}"
                 for d in client.list(DaemonSet, namespace=NAMESPACE, labels=owned)]
    workloads += [f"Deployment {d.metadata.name}"
                  for d in client.list(Deployment, namespace=NAMESPACE, labels=owned)]
    assert any(w.startswith("Deployment ") for w in workloads)  # ib-kubernetes, nv-ipam
    assert set(workloads) <= set(boxes)
