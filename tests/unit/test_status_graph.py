"""`nicop status --graph` on snapshots built here: the picture names every component and node,
colours each box by its state, stays valid XML and valid dot whatever the names hold, and groups
the nodes of a large cluster."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nicop import status, status_graph
from nicop.cli import app
from nicop.status_graph import COLOURS, ERROR, IGNORED, NOT_READY, READY

NS = "nvidia-network-operator"
STATE = "nvidia.network-operator.state"
MANAGED = {"feature.node.kubernetes.io/pci-15b3.present": "true"}
SVG = "{http://www.w3.org/2000/svg}"
Obj = dict[str, Any]


def node(name: str, labels: Obj | None = None, ready: bool = True) -> Obj:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/os": "linux",
                                                   **(labels if labels is not None else MANAGED)}},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def pod(name: str, node_name: str, owner: str, *, kind: str = "DaemonSet", ready: bool = True,
        waiting: str | None = None) -> Obj:
    state: Obj = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {},
                     "ownerReferences": [{"kind": kind, "name": owner, "controller": True}]},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "c", "ready": ready, "restartCount": 0,
                                          "state": state}]},
    }


def daemonset(name: str, state: str, wanted: int, ready: int, owner: str | None = None) -> Obj:
    labels = {STATE: state, **({"ds-owner": owner} if owner else {})}
    return {"metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {}, "status": {"desiredNumberScheduled": wanted, "numberReady": ready,
                                   "updatedNumberScheduled": wanted}}


def policy(name: str, state: str, components: dict[str, str], kind: str = "") -> Obj:
    return {"metadata": {"name": name, "generation": 1},
            "spec": {"nodeSelector": {"pool": "b"}} if kind else {},
            "status": {"state": state, "observedGeneration": 1,
                       "appliedStates": [{"name": n, "state": s,
                                          "message": f"{n} is {s}" if s != "ready" else ""}
                                         for n, s in components.items()]}}


def snapshot(nodes: list[Obj], pods: list[Obj], daemonsets: list[Obj], **extra: Any) -> Obj:
    return {"collectedAt": "2026-09-01T12:00:00Z", "namespace": NS,
            "lease": {"metadata": {"name": "12620820.mellanox.com"},
                      "spec": {"holderIdentity": "nicop-operator-1", "leaseDurationSeconds": 15,
                               "renewTime": "2026-09-01T11:59:59.000000Z"}},
            "nodes": nodes, "pods": pods, "daemonSets": daemonsets, "nodeStates": [],
            "ipPools": [], "cidrPools": [], "nodeFeatures": [], "errors": [],
            "deployments": [], "nodePolicies": [], **extra}


def troubled_cluster() -> Obj:
    """node-2's driver crash-loops, so the RDMA plugin waits there; node-3 has a NIC but no
    label; a NicNodePolicy's driver runs on node-5; nv-ipam's controller is a Deployment."""
    nodes = [node("node-1"), node("node-2"),
             node("node-3", {"feature.node.kubernetes.io/pci-0200_15b3.present": "true"}),
             node("node-4", {}), node("node-5", {**MANAGED, "pool": "b"})]
    ncp = policy("nic-cluster-policy", "notReady", {
        "state-OFED": "notReady", "state-RDMA-device-plugin": "notReady",
        "state-nv-ipam-cni": "ready", "state-SRIOV-device-plugin": "ignore",
        "state-multus-cni": "error"})
    nnp = policy("pool-b", "ready", {"state-OFED": "ready"}, kind="NicNodePolicy")
    pods = [
        pod("mofed-a", "node-1", "mofed-ubuntu24.04-abc-ds"),
        pod("mofed-b", "node-2", "mofed-ubuntu24.04-abc-ds", ready=False,
            waiting="CrashLoopBackOff"),
        pod("rdma-a", "node-1", "rdma-shared-dp-ds"),
        pod("rdma-b", "node-2", "rdma-shared-dp-ds", ready=False, waiting="PodInitializing"),
        pod("ipam-ctrl-7f9c-x", "node-1", "nv-ipam-controller-7f9c", kind="ReplicaSet"),
        pod("mofed-pool-b", "node-5", "mofed-pool-b-ubuntu24.04-abc-ds"),
    ]
    daemonsets = [daemonset("mofed-ubuntu24.04-abc-ds", "state-OFED", 2, 1),
                  daemonset("rdma-shared-dp-ds", "state-RDMA-device-plugin", 2, 1),
                  daemonset("mofed-pool-b-ubuntu24.04-abc-ds", "state-OFED", 1, 1,
                            owner="nnp-pool-b")]
    deployment = {"metadata": {"name": "nv-ipam-controller", "namespace": NS,
                               "labels": {STATE: "state-nv-ipam-cni"}},
                  "spec": {"replicas": 1}, "status": {"readyReplicas": 1, "updatedReplicas": 1}}
    return snapshot(nodes, pods, daemonsets, policies=[ncp], nodePolicies=[nnp],
                    deployments=[deployment])


def graph_of(snap: Obj) -> status_graph.Graph:
    return status_graph.build(snap, status.summarize(snap))


def svg_boxes(text: str) -> dict[str, tuple[str, str, list[str]]]:
    """Box title -> (state, fill, its text lines), from the SVG as a viewer reads it; two
    policies' components of one name under the box id instead."""
    root = ET.fromstring(text)
    out = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "box":
            continue
        lines = ["".join(t.itertext()) for t in g.iter(f"{SVG}text")]
        rect = g.find(f"{SVG}rect")
        assert rect is not None
        key = lines[0] if lines[0] not in out else str(g.get("data-id"))
        out[key] = (str(g.get("data-state")), str(rect.get("fill")), lines)
    return out


def parse_dot(text: str) -> tuple[set[str], list[tuple[str, str]]]:
    """Declared node ids and edges of the dot file; fails on unbalanced braces or quotes."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            assert depth >= 0, "a } closes nothing"
    assert depth == 0 and not in_string, "unbalanced braces or an unterminated string"
    quoted = r'"((?:[^"\\]|\\.)*)"'
    declared = set(re.findall(rf"^\s*{quoted} \[label=", text, re.M))
    edges = re.findall(rf"^\s*{quoted} -> {quoted} \[", text, re.M)
    return declared, edges


def test_the_picture_names_every_component_workload_and_node() -> None:
    snap = troubled_cluster()
    boxes = svg_boxes(status_graph.to_svg(graph_of(snap)))
    for name in ("state-OFED", "state-RDMA-device-plugin", "state-nv-ipam-cni",
                 "state-SRIOV-device-plugin", "state-multus-cni"):
        assert name in boxes
    for name in ("node-1", "node-2", "node-3", "node-4", "node-5"):
        assert name in boxes
    assert "NicClusterPolicy nic-cluster-policy" in boxes
    assert "NicNodePolicy pool-b" in boxes
    assert "DaemonSet mofed-ubuntu24.04-abc-ds" in boxes
    assert "Deployment nv-ipam-controller" in boxes
    assert "nicop operator" in boxes


def test_each_box_is_coloured_by_its_state() -> None:
    boxes = svg_boxes(status_graph.to_svg(graph_of(troubled_cluster())))
    expected = {
        "state-nv-ipam-cni": READY, "state-OFED": NOT_READY,
        "state-SRIOV-device-plugin": IGNORED, "state-multus-cni": ERROR,
        "NicClusterPolicy nic-cluster-policy": NOT_READY, "NicNodePolicy pool-b": READY,
        "component:nnp-pool-b/state-OFED": READY,
        "Deployment nv-ipam-controller": READY,
        # a crash-looping pod is an error; its DaemonSet too
        "DaemonSet mofed-ubuntu24.04-abc-ds": ERROR, "node-2": ERROR,
        "DaemonSet rdma-shared-dp-ds": NOT_READY,
        "node-1": READY, "node-5": READY,
        "node-3": ERROR,  # a Mellanox NIC without the label: where the chain breaks
        "node-4": IGNORED,  # no NIC, nothing of nicop's
    }
    for title, state in expected.items():
        got_state, fill, _ = boxes[title]
        assert (got_state, fill) == (state, COLOURS[state][0]), title
    # The legend shows all four colours.
    root = ET.fromstring(status_graph.to_svg(graph_of(troubled_cluster())))
    legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    assert {r.get("fill") for r in legend.iter(f"{SVG}rect")} == {f for f, _ in COLOURS.values()}


def test_a_node_box_says_which_pod_is_not_ready_and_why() -> None:
    boxes = svg_boxes(status_graph.to_svg(graph_of(troubled_cluster())))
    lines = " ".join(boxes["node-2"][2])
    assert "mofed-ubuntu24.04-abc-ds: CrashLoopBackOff" in lines
    assert "rdma-shared-dp-ds: PodInitializing" in lines
    assert boxes["node-3"][2][1:] == ["Mellanox NIC but not managed:",
                                      "no label pci-15b3.present=true"]


def test_the_chain_runs_from_operator_to_nodes() -> None:
    graph = graph_of(troubled_cluster())
    edges = {(e.source, e.target) for e in graph.edges}
    assert ("operator", "policy:NicClusterPolicy/nic-cluster-policy") in edges
    assert ("policy:NicNodePolicy/pool-b", "component:nnp-pool-b/state-OFED") in edges
    assert ("component:NicClusterPolicy/state-OFED",
            "workload:DaemonSet/mofed-ubuntu24.04-abc-ds") in edges
    assert ("component:nnp-pool-b/state-OFED",
            "workload:DaemonSet/mofed-pool-b-ubuntu24.04-abc-ds") in edges
    assert ("component:NicClusterPolicy/state-nv-ipam-cni",
            "workload:Deployment/nv-ipam-controller") in edges
    assert ("workload:DaemonSet/rdma-shared-dp-ds", "node:node-2") in edges
    assert ("workload:Deployment/nv-ipam-controller", "node:node-1") in edges
    # Every edge joins two boxes of the picture.
    ids = {b.id for b in graph.boxes}
    assert all(e.source in ids and e.target in ids for e in graph.edges)


def test_dot_output_is_well_formed() -> None:
    graph = graph_of(troubled_cluster())
    text = status_graph.to_dot(graph)
    assert text.startswith("digraph nicop {")
    declared, edges = parse_dot(text)
    assert declared == {b.id for b in graph.boxes}
    assert edges and all(a in declared and b in declared for a, b in edges)
    assert len(edges) == len(graph.edges)
    for box in graph.boxes:
        assert f'fillcolor="{COLOURS[box.state][0]}"' in text


def test_names_with_markup_characters_are_escaped() -> None:
    odd = 'r&d <"lab"> \'x\' \\n'
    snap = troubled_cluster()
    snap["nodes"].append(node(odd))
    snap["pods"].append(pod("odd", odd, "rdma-shared-dp-ds", ready=False,
                            waiting='Err <"&">'))
    snap["policies"][0]["status"]["appliedStates"].append(
        {"name": "state-<&>", "state": "error", "message": 'bad "config" & <more>'})
    graph = graph_of(snap)
    svg = status_graph.to_svg(graph)
    boxes = svg_boxes(svg)  # parses: the names did not break the XML
    assert odd in boxes and "state-<&>" in boxes
    assert 'bad "config" & <more>' in boxes["state-<&>"][2]
    declared, edges = parse_dot(status_graph.to_dot(graph))
    assert f"node:{odd}".replace("\\", "\\\\").replace('"', '\\"') in declared
    assert all(a in declared and b in declared for a, b in edges)


def test_a_large_cluster_is_grouped_per_daemonset_naming_the_nodes_not_ready() -> None:
    count = 1000
    nodes = [node(f"node-{i}") for i in range(1, count + 1)]
    nodes.append(node("gpu-only", {}))
    broken = {"node-17": "CrashLoopBackOff", "node-512": "ImagePullBackOff"}
    pods = []
    for i in range(1, count + 1):
        name = f"node-{i}"
        pods.append(pod(f"mofed-{i}", name, "mofed-ds", ready=name not in broken,
                        waiting=broken.get(name)))
        pods.append(pod(f"rdma-{i}", name, "rdma-ds", ready=name != "node-900",
                        waiting="PodInitializing" if name == "node-900" else None))
    ncp = policy("nic-cluster-policy", "notReady",
                 {"state-OFED": "notReady", "state-RDMA-device-plugin": "notReady"})
    snap = snapshot(nodes, pods, [daemonset("mofed-ds", "state-OFED", count, count - 2),
                                  daemonset("rdma-ds", "state-RDMA-device-plugin", count,
                                            count - 1)], policies=[ncp])
    graph = graph_of(snap)
    assert graph.grouped
    boxes = svg_boxes(status_graph.to_svg(graph))
    assert boxes["998 nodes ready / 2 not"][0] == ERROR
    assert boxes["999 nodes ready / 1 not"][0] == NOT_READY
    assert {"node-17", "node-512", "node-900"} <= set(boxes)
    assert "node-1" not in boxes and "node-18" not in boxes
    assert boxes["1 node not managed"][0] == IGNORED
    assert len([b for b in graph.boxes if b.layer == "nodes"]) == 6
    # The broken nodes hang off the DaemonSet whose pod is not ready there.
    edges = {(e.source, e.target): e.state for e in graph.edges}
    assert edges[("workload:DaemonSet/mofed-ds", "node:node-17")] == ERROR
    assert ("workload:DaemonSet/rdma-ds", "node:node-17") not in edges
    assert edges[("workload:DaemonSet/rdma-ds", "node:node-900")] == NOT_READY


def test_up_to_the_threshold_every_node_has_its_box() -> None:
    count = status_graph.GROUP_THRESHOLD
    nodes = [node(f"node-{i}") for i in range(1, count + 1)]
    pods = [pod(f"mofed-{i}", f"node-{i}", "mofed-ds") for i in range(1, count + 1)]
    snap = snapshot(nodes, pods, [daemonset("mofed-ds", "state-OFED", count, count)],
                    policies=[policy("nic-cluster-policy", "ready", {"state-OFED": "ready"})])
    graph = graph_of(snap)
    assert not graph.grouped
    assert {b.title for b in graph.boxes if b.layer == "nodes"} == {n["metadata"]["name"]
                                                                    for n in nodes}


def test_no_policy_and_no_leader_are_red() -> None:
    snap = snapshot([node("node-1")], [], [], policies=[])
    snap["lease"] = None
    boxes = svg_boxes(status_graph.to_svg(graph_of(snap)))
    assert boxes["NicClusterPolicy nic-cluster-policy"][0] == ERROR
    assert boxes["nicop operator"][0] == ERROR


@pytest.mark.parametrize("name", ["loop.svg", "loop.SVG", "loop.dot", "loop.gv"])
def test_the_command_writes_the_format_its_suffix_names(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status, "read_cluster",
                        lambda kubeconfig, collect, context=None: troubled_cluster())
    target = tmp_path / name
    result = CliRunner().invoke(app, ["status", "-o", "json", "--graph", str(target)])
    assert result.exit_code == 0, result.output
    text = target.read_text()
    if name.lower().endswith(".svg"):
        assert "node-3" in svg_boxes(text)
    else:
        assert text.startswith("digraph") and parse_dot(text)[0]


def test_the_command_refuses_other_suffixes_before_reading_the_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def read_cluster(*args: Any, **kwargs: Any) -> Obj:
        raise AssertionError("the cluster was read")

    monkeypatch.setattr(status, "read_cluster", read_cluster)
    for name in ("loop.png", "loop"):
        result = CliRunner().invoke(app, ["status", "--graph", str(tmp_path / name)])
        assert result.exit_code == 1
        assert ".svg" in result.output and ".dot" in result.output and ".gv" in result.output
        assert not (tmp_path / name).exists()
    result = CliRunner().invoke(app, ["status", "--watch", "--graph", "x.svg"])
    assert result.exit_code == 1 and "--watch" in result.output


def test_help_shows_a_graph_example() -> None:
    result = CliRunner().invoke(app, ["status", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "--graph" in result.stdout and "nicop status --graph loop.svg" in result.stdout
