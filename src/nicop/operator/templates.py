"""Whether two pod templates run their pods differently, so that nicop replaces pods only then.

A DaemonSet or Deployment replaces every pod when any byte of its template changes: a label,
an annotation, a probe's period. Taking over another operator's objects, or a nicop release
that renders a label differently, must not cost a node its pods (nor its driver: the driver
DaemonSet's pods restart through the rolling upgrade, which reloads the driver). Both sides
compared here are as the API server stores them, defaults filled in, so a field one side
leaves to its default and the other sets to that default is the same.
"""

from __future__ import annotations

import copy

from nicop.api.labels import CONFIG_HASH_ANNOTATION
from nicop.kube.resources import Obj

PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
# Annotations whose change is meant to replace the pods: a config file they read at start
# (upstream's config hash), and `kubectl rollout restart`.
RESTART_ANNOTATIONS = (CONFIG_HASH_ANNOTATION, "kubectl.kubernetes.io/restartedAt")
# What the driver container runs: its image, command, environment, mounts and the security
# settings and host namespaces it runs with. Placement (node selector, affinity, tolerations,
# priority) and grace periods decide where and how long, not what: a change there reloads no
# driver on a node the pod stays on.
WHAT_RUNS = ("containers", "initContainers", "volumes", "hostNetwork", "hostPID", "hostIPC",
             "securityContext", "runtimeClassName")


def substance(template: Obj) -> Obj:
    """The pod template without what changes no running pod: its labels, other annotations,
    and the containers' probes."""
    spec = copy.deepcopy(template.get("spec") or {})
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            for probe in PROBES:
                container.pop(probe, None)
    return {"spec": spec, "annotations": _restart_annotations(template)}


def what_runs(template: Obj) -> Obj:
    """The part of a driver pod's template whose change means reloading the driver."""
    spec = substance(template)["spec"]
    return {"spec": {k: spec[k] for k in WHAT_RUNS if k in spec},
            "annotations": _restart_annotations(template)}


def _restart_annotations(template: Obj) -> dict[str, str]:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    return {k: annotations[k] for k in RESTART_ANNOTATIONS if k in annotations}
