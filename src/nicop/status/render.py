"""The status drawn with rich, for people."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from nicop.api.labels import (
    DRIVER_CONTAINER,
    POLICY_NAME,
)
from nicop.kube.resources import (
    Obj,
)
from nicop.status.facts import (
    READY_FILE,
)

STATE_STYLE = {"ready": "green", "ignore": "dim", "notReady": "yellow", "error": "red"}


def _table(*headers: str) -> Table:
    """A borderless table whose long values wrap instead of being cut off."""
    table = Table(box=None, pad_edge=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    return table


def _yes(ok: bool, yes: str = "yes", no: str = "no") -> Text:
    return Text(yes, style="green") if ok else Text(no, style="red")


def _ago(seconds: int | None) -> str:
    return "never" if seconds is None else f"{seconds}s ago"


def render(status: Obj) -> RenderableType:
    """The status as rich tables: operator, policy, nodes, IPAM pools, driver upgrade."""
    parts: list[RenderableType] = []
    parts.append(Text(f"nicop status  (namespace {status['namespace']}, "
                      f"read at {status['collectedAt']})", style="bold"))
    parts.extend(_render_operator(status))
    parts.extend(_render_policy(status))
    parts.extend(_render_nodes(status))
    parts.extend(_render_pools(status))
    parts.extend(_render_upgrade(status))
    for error in status.get("errors") or []:
        parts.append(Text(f"warning: {error}", style="yellow"))
    return Group(*parts)


def _render_operator(status: Obj) -> list[RenderableType]:
    op = status["operator"]
    leader = op["leader"]
    if leader is None:
        line = Text.from_markup("[red]no leader[/red]: nobody holds the operator's Lease")
    elif not leader["active"]:
        line = Text.from_markup(f"[red]leader lease expired[/red]: last held by "
                                f"{escape(leader['identity'])}, renewed "
                                f"{_ago(leader['secondsSinceRenewal'])}")
    else:
        line = Text.from_markup(f"leader [green]{escape(leader['identity'])}[/green] "
                                f"(renewed {_ago(leader['secondsSinceRenewal'])})")
    out: list[RenderableType] = [Text(""), Text("Operator", style="bold underline"), line]
    if op["pods"]:
        table = _table("pod", "node", "phase", "ready", "restarts", "leader", "problem")
        for p in op["pods"]:
            table.add_row(p["name"], p["node"] or "-", p["phase"], _yes(p["ready"]),
                          str(p["restarts"]), "*" if p["leader"] else "",
                          p["problem"] or "")
        out.append(table)
    else:
        out.append(Text(f"no operator pod in namespace {status['namespace']}"
                        + (" (the leader runs outside the cluster)" if leader else ""),
                        style="dim"))
    return out


def _render_policy(status: Obj) -> list[RenderableType]:
    out: list[RenderableType] = [Text(""), Text("NicClusterPolicy", style="bold underline")]
    policy = status["policy"]
    for name in status.get("ignoredPolicies") or []:
        out.append(Text(f"NicClusterPolicy {name} is ignored: only {POLICY_NAME} is acted on",
                        style="yellow"))
    if policy is None:
        out.append(Text(f"no NicClusterPolicy {POLICY_NAME}: nothing is deployed", style="red"))
        return out
    state = policy["state"] or "unknown"
    line = Text.assemble(f"{policy['name']}: ", (state, STATE_STYLE.get(state, "yellow")))
    observed = policy["observedGeneration"]
    if observed is None or observed < policy["generation"]:
        line.append(f"  (generation {policy['generation']} not yet processed by the operator)",
                    style="yellow")
    out.append(line)
    table = _table("component", "state", "message")
    for c in policy["components"]:
        table.add_row(c["name"], Text(c["state"], style=STATE_STYLE.get(c["state"], "")),
                      c["message"] or "")
    out.append(table)
    return out


def _render_nodes(status: Obj) -> list[RenderableType]:
    out: list[RenderableType] = [Text(""), Text("Nodes", style="bold underline")]
    table = _table("node", "managed", "driver", "driver ready", "upgrade", "mofed.wait",
                   "resources (allocatable / in use)", "VFs", "SR-IOV sync")
    if any(n["draDevices"] for n in status["nodes"]):
        table.add_column("DRA devices (allocated / all)")
    notes = []
    for n in status["nodes"]:
        driver = n["driver"]
        if driver is None:
            version: Text | str = "-"
            ready: Text | str = "-"
        else:
            version = driver["version"] or driver["image"]
            ready = _yes(driver["ready"], "yes", "no: " + (driver["problem"] or "not ready"))
        resources = ", ".join(f"{r['name']} {r['allocatable']}/{r['inUse']}"
                              for r in n["resources"]) or "-"
        sriov = n["sriov"]
        vfs = "-"
        if sriov:
            by = {"dra": " by DRA", "device-plugin": " by device plugin"}.get(
                sriov["servedBy"] or "", "")
            vfs = f"{sriov['vfsConfigured']}/{sriov['vfsWanted']}{by}"
        sync: Text | str = "-"
        if sriov and sriov["syncStatus"]:
            sync = Text(sriov["syncStatus"], style={"Succeeded": "green", "Failed": "red"}.get(
                sriov["syncStatus"], "yellow"))
        if n["managed"]:
            managed = Text("yes", style="green")
        elif n["unmanagedReason"]:
            managed = Text("no (see below)", style="red")
        else:
            managed = Text("no", style="dim")
        wait = n["mofedWait"] or "-"
        row = [n["name"] + ("" if n["ready"] else " (NotReady)"), managed, version, ready,
               n["upgradeState"] or "-", Text(wait, style="yellow") if wait == "true" else wait,
               resources, vfs, sync]
        if len(table.columns) > len(row):
            row.append(", ".join(f"{d['driver']} {d['allocated']}/{d['devices']}"
                                 for d in n["draDevices"]) or "-")
        table.add_row(*row)
        if n["unmanagedReason"]:
            notes.append(Text(n["unmanagedReason"], style="red"))
        if sriov and sriov["lastSyncError"]:
            notes.append(Text(f"node {n['name']}: SR-IOV sync error: {sriov['lastSyncError']}",
                              style="red"))
    out.append(table)
    out.extend(notes)
    if any(n["driver"] is not None for n in status["nodes"]):
        out.append(Text(f"driver ready = container {DRIVER_CONTAINER} Ready; its startup probe "
                        f"checks {READY_FILE} on the node, which the API cannot show",
                        style="dim"))
    return out


def _render_pools(status: Obj) -> list[RenderableType]:
    pools = status["ipamPools"]
    if not pools:
        return []
    table = _table("pool", "kind", "network", "allocated / size", "nodes")
    for p in pools:
        used = ("-" if p["allocated"] is None else f"{p['allocated']}/{p['size']}")
        per_node = ", ".join(
            f"{n['name']} {n['allocated']}/{n['size']}" if n["allocated"] is not None
            else f"{n['name']} (no usage published)" for n in p["nodes"]) or "no blocks yet"
        table.add_row(p["name"], p["kind"], p["network"] or "-", used, per_node)
    return [Text(""), Text("IPAM pools", style="bold underline"), table]


def _render_upgrade(status: Obj) -> list[RenderableType]:
    progress = status["driverUpgrade"]
    if not progress:
        return []
    line = Text(f"done {progress['done']}, in progress {progress['inProgress']}, "
                f"waiting {progress['waiting']}, failed {progress['failed']}")
    out: list[RenderableType] = [Text(""), Text("Driver upgrade", style="bold underline"), line]
    if progress.get("inProgressNodes"):
        out.append(Text("in progress: " + ", ".join(progress["inProgressNodes"])))
    for node in status["nodes"]:
        if node["drainBlocked"]:
            out.append(Text(f"draining {node['name']} since {node['drainStarted']}, cannot "
                            f"evict: {node['drainBlocked']}", style="yellow"))
    for failed in progress.get("failedNodes") or []:
        then = (f"retried at {failed['nextRetry']}" if failed.get("nextRetry") else
                f"no automatic retry left: nicop upgrade retry {failed['name']}")
        out.append(Text(f"failed: {failed['name']}"
                        + (f": {failed['reason']}" if failed.get("reason") else "")
                        + f" ({failed['attempts']} attempt(s); {then})", style="red"))
    return out
