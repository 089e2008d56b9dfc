"""`nicop diagnose`: the troubleshooting checklist, run against one read of the cluster.

Each check says pass, warn or fail, and a failure names its cause and the command or change
that fixes it: the questions people otherwise answer with a dozen kubectl calls (is the
operator running, is this node managed, is its driver loaded, does its device plugin run and
advertise devices, why is this pod Pending). The checks are pure functions of a snapshot
(`nicop.status.collect` plus NADs, the target pod and its events), so they are tested on
recorded snapshots. The package has one room per job: reading the cluster (collect), what a
check is and the registry every check is listed in (check), the checks of the cluster, a node
and a pod (cluster, node, pod), and rendering (render).
"""

from __future__ import annotations

# Importing the checks' modules registers them: the cluster's, a node's, a pod's.
from nicop.diagnose import cluster, node, pod  # noqa: F401
from nicop.diagnose.check import REGISTRY, Check, Registered, Snapshot, Target, checks_for
from nicop.diagnose.collect import collect
from nicop.diagnose.node import node_checks
from nicop.diagnose.pod import explain_event, pod_checks
from nicop.diagnose.render import as_lines, failed, render, report

__all__ = ["REGISTRY", "Check", "Registered", "Snapshot", "Target", "as_lines", "collect",
           "diagnose", "explain_event", "failed", "render", "report"]


def diagnose(snap: Snapshot, target: Target) -> list[Check]:
    """The checklist for a target, reads that failed first (their part was not checked)."""
    checks = [Check("cluster", "access", "warn", f"{error}; problems there are not seen",
                    "grant your user get/list on that kind (kubectl auth can-i list ...)")
              for error in snap.get("errors") or []]
    if target.kind == "node":
        checks.extend(node_checks(snap, target.name, standalone=True))
    elif target.kind == "pod":
        checks.extend(pod_checks(snap, target.namespace, target.name))
    else:
        checks.extend(c for r in checks_for("cluster") for c in r.run(snap))
    return checks


