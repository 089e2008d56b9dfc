"""`nicop status --graph`: the control loop as a picture, so the broken link is seen at once.

Five columns, left to right: the operator, the policies (NicClusterPolicy and NicNodePolicies),
their components (the states in `status.appliedStates`), the DaemonSets and Deployments each
component rendered, and the nodes their pods run on. Every box is coloured by readiness: green
ready, amber not ready yet, red error, grey ignored or not managed.

`build` makes a plain model from the snapshot and summary `nicop status` already has; `to_dot`
and `to_svg` draw it. The SVG is laid out here, column by column, so that no Graphviz is needed;
the dot file is for those who have it. Past GROUP_THRESHOLD nodes a node column would be
unreadable, so each workload gets one "N nodes ready / M not" box and only the nodes that are
not ready are named.
"""

from __future__ import annotations

import html
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from nicop import status as st
from nicop.api.labels import OWNER_LABEL, OWNER_VALUE, POLICY_NAME, STATE_LABEL
from nicop.kube.resources import Obj

READY, NOT_READY, ERROR, IGNORED = "ready", "notReady", "error", "ignore"
STATES = (READY, NOT_READY, ERROR, IGNORED)
LEGEND = {READY: "ready", NOT_READY: "not ready / progressing", ERROR: "error / failed",
          IGNORED: "ignored / not managed"}
# (fill, stroke) per state.
COLOURS = {READY: ("#d8f0d2", "#2e7d32"), NOT_READY: ("#ffe9b3", "#b26a00"),
           ERROR: ("#f8d0cc", "#c62828"), IGNORED: ("#ececec", "#8a8a8a")}
STRUCTURE_EDGE = "#5f6b7a"
LAYERS = ("operator", "policies", "components", "workloads", "nodes")
LAYER_TITLES = ("operator", "policies", "components", "DaemonSets / Deployments", "nodes")
GROUP_THRESHOLD = 20  # more nodes than this: grouped per workload
NAMED_LIMIT = 100  # not-ready nodes named one by one when grouped; the rest are counted
SUFFIXES = {".svg": "svg", ".dot": "dot", ".gv": "dot"}
# Container states that will not get better by waiting.
ERROR_REASONS = ("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                 "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
                 "OOMKilled", "Error", "terminated")


@dataclass
class Box:
    id: str
    layer: str
    title: str
    state: str
    lines: list[str] = field(default_factory=list)


@dataclass
class Edge:
    source: str
    target: str
    state: str | None = None  # a pod's state on the way to its node; None: structure


@dataclass
class Graph:
    title: str
    boxes: list[Box] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    grouped: bool = False

    def box(self, id: str) -> Box | None:
        return next((b for b in self.boxes if b.id == id), None)

    def add(self, box: Box) -> Box:
        if (found := self.box(box.id)) is not None:
            return found
        self.boxes.append(box)
        return box


class UnknownFormat(ValueError):
    """The graph file's suffix names no format nicop writes."""


def format_of(path: Path) -> str:
    """svg or dot, by the file's suffix."""
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise UnknownFormat(f"cannot tell the graph format of {str(path)!r} from its suffix "
                            f"{path.suffix or '(none)'!r}: use .svg (a picture) or .dot/.gv "
                            "(Graphviz)")
    return fmt


def write(graph: Graph, path: Path) -> None:
    text = to_svg(graph) if format_of(path) == "svg" else to_dot(graph)
    path.write_text(text, encoding="utf-8")


# ------------------------------------------------------------------ model

def component_state(value: str | None) -> str:
    return value if value in STATES else NOT_READY


def pod_state(pod: Obj) -> tuple[str, str | None]:
    """A pod's state and, when not ready, why (the kubelet's words)."""
    if st.pod_ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return READY, None
    status = pod.get("status") or {}
    problems = [p for c in status.get("containerStatuses") or []
                if not c.get("ready") and (p := st.container_problem(c))]
    why = problems[0] if problems else str(status.get("phase") or "not ready")
    if status.get("phase") == "Failed" or any(r in why for r in ERROR_REASONS):
        return ERROR, why
    return NOT_READY, why


def _owned_pods(snap: st.Snapshot, workload: Obj, kind: str) -> list[Obj]:
    name = st.name_of(workload)
    out = []
    for pod in snap.get("pods") or []:
        if (pod.get("metadata") or {}).get("namespace") != snap.get("namespace"):
            continue
        if kind == "DaemonSet":
            if st.owner_name(pod, "DaemonSet") == name:
                out.append(pod)
        elif (rs := st.owner_name(pod, "ReplicaSet")) and rs.rsplit("-", 1)[0] == name:
            out.append(pod)
    return out


def _workload_state(workload: Obj, kind: str, pod_states: list[str]) -> tuple[str, str]:
    """The workload's state and its count line, from its status as the controllers keep it."""
    status = workload.get("status") or {}
    if kind == "DaemonSet":
        wanted = int(status.get("desiredNumberScheduled") or 0)
        ready = int(status.get("numberReady") or 0)
        updated = int(status.get("updatedNumberScheduled") or 0)
    else:
        wanted = int((workload.get("spec") or {}).get("replicas", 1))
        ready = int(status.get("readyReplicas") or 0)
        updated = int(status.get("updatedReplicas") or 0)
    line = f"{ready}/{wanted} ready" + (f", {updated} updated" if updated < wanted else "")
    if ERROR in pod_states:
        return ERROR, line
    if kind == "DaemonSet" and wanted == 0:
        return NOT_READY, "matches no node"
    if ready >= wanted and updated >= wanted:
        return READY, line
    return NOT_READY, line


def natural_key(name: str) -> list[object]:
    """node-2 before node-10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def build(snap: st.Snapshot, summary: Obj) -> Graph:
    """The control loop of one `nicop status` read."""
    graph = Graph(title=f"nicop status: namespace {summary['namespace']}, "
                        f"read at {summary['collectedAt']}")
    _operator(graph, summary)
    owners = _policies(graph, snap, summary)
    pods_by_node = _workloads(graph, snap, owners)
    _nodes(graph, summary, pods_by_node)
    return graph


def _operator(graph: Graph, summary: Obj) -> None:
    leader = summary["operator"]["leader"]
    if leader is None:
        state, line = ERROR, "no leader: nobody holds the Lease"
    elif not leader["active"]:
        state, line = ERROR, f"lease expired ({leader['identity']})"
    else:
        state, line = READY, f"leader {leader['identity']}"
    graph.add(Box("operator", "operator", "nicop operator", state, [line]))


def _components(graph: Graph, policy_id: str, owner: str, components: list[Obj]) -> None:
    # Components at work first, the ignored ones (sections not in the policy) below them.
    ordered = sorted(components, key=lambda c: c.get("state") == IGNORED)
    of = [] if owner == OWNER_VALUE else [f"of NicNodePolicy {owner.removeprefix('nnp-')}"]
    for c in ordered:
        message = [str(c["message"])] if c.get("message") else []
        box = graph.add(Box(f"component:{owner}/{c['name']}", "components", str(c["name"]),
                            component_state(c.get("state")), of + message))
        graph.edges.append(Edge(policy_id, box.id))


def _policies(graph: Graph, snap: st.Snapshot, summary: Obj) -> dict[str, str]:
    """Policy and component boxes; the policy box id of each `ds-owner` value."""
    owners: dict[str, str] = {}
    policy = summary["policy"]
    if policy is None:
        graph.add(Box("policy:missing", "policies", f"NicClusterPolicy {POLICY_NAME}", ERROR,
                      ["missing: nothing is deployed"]))
        graph.edges.append(Edge("operator", "policy:missing"))
    else:
        box = graph.add(Box(f"policy:NicClusterPolicy/{policy['name']}", "policies",
                            f"NicClusterPolicy {policy['name']}",
                            component_state(policy["state"]),
                            [f"state {policy['state'] or 'unknown'}"]))
        graph.edges.append(Edge("operator", box.id))
        owners[OWNER_VALUE] = box.id
        _components(graph, box.id, OWNER_VALUE, policy["components"])
    for name in summary.get("ignoredPolicies") or []:
        graph.add(Box(f"policy:NicClusterPolicy/{name}", "policies", f"NicClusterPolicy {name}",
                      IGNORED, [f"ignored: only {POLICY_NAME} is acted on"]))
    for nnp in sorted(snap.get("nodePolicies") or [], key=st.name_of):
        name = st.name_of(nnp)
        summarized = st.summarize_policy(nnp)
        box = graph.add(Box(f"policy:NicNodePolicy/{name}", "policies", f"NicNodePolicy {name}",
                            component_state(summarized["state"]),
                            [f"state {summarized['state'] or 'unknown'}"]))
        graph.edges.append(Edge("operator", box.id))
        owners[f"nnp-{name}"] = box.id
        _components(graph, box.id, f"nnp-{name}", summarized["components"])
    return owners


def _workloads(graph: Graph, snap: st.Snapshot,
               owners: dict[str, str]) -> dict[str, dict[str, tuple[str, str | None]]]:
    """Workload boxes under their components; by node, each workload's pod state there."""
    pods_by_node: dict[str, dict[str, tuple[str, str | None]]] = defaultdict(dict)
    workloads = [("DaemonSet", w) for w in snap.get("daemonSets") or []] + [
        ("Deployment", w) for w in snap.get("deployments") or []]
    order = {b.id: i for i, b in enumerate(graph.boxes)}
    placed = []
    for kind, workload in workloads:
        labels = st.labels_of(workload)
        owner = labels.get(OWNER_LABEL, OWNER_VALUE)
        component_id = f"component:{owner}/{labels.get(STATE_LABEL, '')}"
        if graph.box(component_id) is None:
            # Rendered, but not (or no longer) in a policy's status.
            graph.add(Box(component_id, "components", labels.get(STATE_LABEL, "?"), NOT_READY,
                          [f"not in the status of {owner}"]))
            if owner in owners:
                graph.edges.append(Edge(owners[owner], component_id))
            order[component_id] = len(order)
        placed.append((order.get(component_id, len(order)), kind, workload, component_id))
    for _, kind, workload, component_id in sorted(placed, key=lambda p: (
            p[0], natural_key(st.name_of(p[2])))):
        name = st.name_of(workload)
        pods = _owned_pods(snap, workload, kind)
        states: dict[str, tuple[str, str | None]] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                states[str(node)] = pod_state(pod)
        state, line = _workload_state(workload, kind, [s for s, _ in states.values()])
        box = graph.add(Box(f"workload:{kind}/{name}", "workloads", f"{kind} {name}", state,
                            [line]))
        graph.edges.append(Edge(component_id, box.id))
        for node, found in states.items():
            pods_by_node[node][box.id] = found
    return pods_by_node


def _node_box(node: Obj, pods: dict[str, tuple[str, str | None]]) -> Box:
    """A node's box: its worst pod, NotReady, or a NIC it is not managed for."""
    lines = []
    if not node["ready"]:
        state = ERROR
        lines.append("node NotReady")
    elif node["unmanagedReason"]:
        state = ERROR
        lines.extend(["Mellanox NIC but not managed:", "no label pci-15b3.present=true"])
    elif not pods:
        state = IGNORED if not node["managed"] else NOT_READY
        lines.append("not managed" if not node["managed"] else "managed, no component pod")
    else:
        states = [s for s, _ in pods.values()]
        state = ERROR if ERROR in states else NOT_READY if NOT_READY in states else READY
    bad = [(w.split("/", 1)[1], why) for w, (s, why) in pods.items() if s != READY]
    lines.extend(f"{w}: {why}" for w, why in bad[:3])
    if len(bad) > 3:
        lines.append(f"... {len(bad) - 3} more pods not ready")
    if pods and not bad:
        lines.append(f"{len(pods)} pod(s) ready")
    return Box(f"node:{node['name']}", "nodes", node["name"], state, lines)


def _nodes_count(count: int) -> str:
    return f"{count} node" + ("" if count == 1 else "s")


def _nodes(graph: Graph, summary: Obj,
           pods_by_node: dict[str, dict[str, tuple[str, str | None]]]) -> None:
    nodes = sorted(summary["nodes"], key=lambda n: natural_key(n["name"]))
    boxes = [_node_box(n, pods_by_node.get(n["name"], {})) for n in nodes]
    if len(nodes) <= GROUP_THRESHOLD:
        for box in boxes:
            graph.add(box)
        for node, pods in pods_by_node.items():
            for workload, (state, _) in pods.items():
                if graph.box(f"node:{node}") is not None:
                    graph.edges.append(Edge(workload, f"node:{node}", state))
        return
    graph.grouped = True
    # One box per workload for its nodes; only the nodes that are not ready are named.
    workloads = [b for b in graph.boxes if b.layer == "workloads"]
    for box in workloads:
        states = [pods[box.id][0] for pods in pods_by_node.values() if box.id in pods]
        ready = states.count(READY)
        group = graph.add(Box(
            f"group:{box.id}", "nodes", f"{_nodes_count(ready)} ready / {len(states) - ready} not",
            ERROR if ERROR in states else NOT_READY if ready < len(states) else READY,
            [f"of {box.title.split(' ', 1)[1]}"]))
        graph.edges.append(Edge(box.id, group.id, group.state))
    troubled = [b for b in boxes if b.state in (ERROR, NOT_READY)]
    for node_box in troubled[:NAMED_LIMIT]:
        graph.add(node_box)
        for workload_id, (state, _) in pods_by_node.get(node_box.title, {}).items():
            if state != READY:
                graph.edges.append(Edge(workload_id, node_box.id, state))
    if len(troubled) > NAMED_LIMIT:
        rest = troubled[NAMED_LIMIT:]
        graph.add(Box("nodes:more", "nodes", f"{_nodes_count(len(rest))} more not ready",
                      ERROR if any(b.state == ERROR for b in rest) else NOT_READY,
                      ["nicop status lists them"]))
    quiet = [b for b in boxes if b.state == IGNORED]
    if quiet:
        graph.add(Box("nodes:unmanaged", "nodes", f"{_nodes_count(len(quiet))} not managed",
                      IGNORED,
                      ["no Mellanox NIC seen, no component pod"]))


# ------------------------------------------------------------------ dot

def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(graph: Graph) -> str:
    """Graphviz dot: `dot -Tsvg loop.dot -o loop.svg` lays it out with Graphviz's own care."""
    out = ["digraph nicop {",
           f"  label={_dot_quote(graph.title)};",
           "  labelloc=t; rankdir=LR; nodesep=0.2; ranksep=0.9;",
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
           '  edge [arrowsize=0.6];']
    for layer in LAYERS:
        members = [b for b in graph.boxes if b.layer == layer]
        if not members:
            continue
        out.append(f"  subgraph {_dot_quote('layer_' + layer)} {{")
        out.append("    rank=same;")
        for box in members:
            fill, stroke = COLOURS[box.state]
            label = "\n".join([box.title, *box.lines])
            out.append(f"    {_dot_quote(box.id)} [label={_dot_quote(label)}, "
                       f'fillcolor="{fill}", color="{stroke}"];')
        out.append("  }")
    for edge in graph.edges:
        colour = COLOURS[edge.state][1] if edge.state else STRUCTURE_EDGE
        out.append(f'  {_dot_quote(edge.source)} -> {_dot_quote(edge.target)} '
                   f'[color="{colour}"];')
    out.append("}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ svg

FONT = 12
CHAR = 7.6  # width of one character of the monospace font at FONT, with some room
LINE = 16
PAD = 8
MAX_CHARS = 48  # longer text is cut, the whole of it in the box's tooltip
GAP_X = 70
GAP_Y = 12
MARGIN = 20
TOP = 92  # title, legend and column titles


def _x(text: str) -> str:
    return html.escape(text, quote=True)


def _fit(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 1] + "…"


def _edge_colours() -> dict[str, str]:
    return {"structure": STRUCTURE_EDGE, **{s: stroke for s, (_, stroke) in COLOURS.items()}}


def to_svg(graph: Graph) -> str:
    """A self-contained SVG: one column per layer, boxes stacked, edges as curves."""
    columns = [[b for b in graph.boxes if b.layer == layer] for layer in LAYERS]
    widths = [max([len(_fit(t)) for b in col for t in (b.title, *b.lines)] + [len(title)])
              * CHAR + 2 * PAD for col, title in zip(columns, LAYER_TITLES, strict=True)]
    heights = [[(1 + len(b.lines)) * LINE + PAD for b in col] for col in columns]
    tallest = max([sum(h) + GAP_Y * max(len(h) - 1, 0) for h in heights] + [0])
    places: dict[str, tuple[float, float, float, float]] = {}
    x = float(MARGIN)
    for col, hs, width in zip(columns, heights, widths, strict=True):
        used = sum(hs) + GAP_Y * max(len(hs) - 1, 0)
        y = TOP + (tallest - used) / 2
        for box, h in zip(col, hs, strict=True):
            places[box.id] = (x, y, width, h)
            y += h + GAP_Y
        x += width + GAP_X
    width_total = x - GAP_X + MARGIN
    height_total = TOP + tallest + MARGIN
    legend_width = sum(len(t) * CHAR + 40 for t in LEGEND.values())
    width_total = max(width_total, MARGIN * 2 + legend_width, len(graph.title) * CHAR + 2 * MARGIN)

    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_total:.0f}" '
        f'height="{height_total:.0f}" viewBox="0 0 {width_total:.0f} {height_total:.0f}" '
        f'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="{FONT}">',
        f"<title>{_x(graph.title)}</title>",
        "<defs>",
        *(f'<marker id="arrow-{name}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
          f'markerHeight="7" orient="auto"><path d="M 0 0 L 10 5 L 0 10 z" fill="{colour}"/>'
          "</marker>" for name, colour in _edge_colours().items()),
        "</defs>",
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        f'<text x="{MARGIN}" y="{MARGIN + 4}" font-weight="bold">{_x(graph.title)}</text>',
    ]
    lx = float(MARGIN)
    out.append('<g class="legend">')
    for state, text in LEGEND.items():
        fill, stroke = COLOURS[state]
        out.append(f'<rect x="{lx:.0f}" y="{MARGIN + 16}" width="22" height="14" rx="3" '
                   f'fill="{fill}" stroke="{stroke}" data-state="{state}"/>')
        out.append(f'<text x="{lx + 28:.0f}" y="{MARGIN + 27}">{_x(text)}</text>')
        lx += len(text) * CHAR + 40
    out.append("</g>")
    for i, title in enumerate(LAYER_TITLES):
        if columns[i] and (first := places.get(columns[i][0].id)):
            out.append(f'<text x="{first[0]:.0f}" y="{TOP - 10}" font-weight="bold" '
                       f'fill="#444444">{_x(title)}</text>')
    out.append('<g class="edges" fill="none">')
    for edge in graph.edges:
        a, b = places.get(edge.source), places.get(edge.target)
        if a is None or b is None:
            continue
        x1, y1 = a[0] + a[2], a[1] + a[3] / 2
        x2, y2 = b[0], b[1] + b[3] / 2
        bend = (x2 - x1) / 2
        name = edge.state or "structure"
        dash = ' stroke-dasharray="5 3"' if edge.state in (NOT_READY, ERROR) else ""
        out.append(f'<path d="M {x1:.1f} {y1:.1f} C {x1 + bend:.1f} {y1:.1f} '
                   f'{x2 - bend:.1f} {y2:.1f} {x2:.1f} {y2:.1f}" '
                   f'stroke="{_edge_colours()[name]}" stroke-width="1.3"{dash} '
                   f'marker-end="url(#arrow-{name})"/>')
    out.append("</g>")
    for n, box in enumerate(graph.boxes):
        bx, by, bw, bh = places[box.id]
        fill, stroke = COLOURS[box.state]
        out.append(f'<g class="box" id="box{n}" data-id="{_x(box.id)}" '
                   f'data-state="{box.state}">')
        out.append(f"<title>{_x(chr(10).join([box.title, *box.lines]))}</title>")
        out.append(f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')
        for i, text in enumerate([box.title, *box.lines]):
            weight = ' font-weight="bold"' if i == 0 else ' fill="#333333"'
            out.append(f'<text x="{bx + PAD:.1f}" y="{by + PAD / 2 + LINE * (i + 1) - 4:.1f}"'
                       f'{weight}>{_x(_fit(text))}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
