"""What a drain takes from a node, and how many nodes may be out at once: the rules the driver
upgrade, the NodeMaintenance controller and the SR-IOV drain share, as `kubectl drain` and
Kubernetes' int-or-percent values have them. One place, so the three never judge a pod or a
percentage differently."""

from __future__ import annotations

import math
import re
from typing import Any

from nicop.api.upgrade import DRAIN_SKIP_LABEL
from nicop.kube import selectors
from nicop.kube.resources import Obj


def scaled(value: Any, total: int, round_up: bool) -> int:
    """An int-or-percent as a node count, as Kubernetes' GetScaledValueFromIntOrPercent."""
    if isinstance(value, str) and value.endswith("%"):
        exact = total * float(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)


def max_unavailable(value: Any, total: int) -> int:
    """`maxUnavailable` as a node count: unset is every node, a percentage is rounded up."""
    if value is None or value == "":
        return total
    return scaled(value, total, round_up=True)


def removable(pod: Obj) -> bool:
    """Not a DaemonSet's or mirror pod and not finished: what `kubectl drain` deletes at all."""
    meta = pod["metadata"]
    if any(r.get("kind") == "DaemonSet" for r in meta.get("ownerReferences") or []):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def evictable(pod: Obj, selector: str) -> bool:
    """A pod nicop's own drains evict: removable, selected, and not labelled to stay."""
    labels = pod["metadata"].get("labels") or {}
    return (labels.get(DRAIN_SKIP_LABEL) != "true" and removable(pod)
            and selectors.matches_string(selector, labels))


def requests_matching(pod: Obj, filters: list[str]) -> bool:
    """Whether a container requests a resource whose name one of the regexes finds (Go's
    MatchString: a match anywhere in the name)."""
    requested = {name for c in (pod.get("spec") or {}).get("containers") or []
                 for name in ((c.get("resources") or {}).get("requests") or {})}
    return any(re.search(f, name) for f in filters for name in requested)


def refusal(pod: Obj, force: bool, delete_empty_dir: bool, field: str) -> str | None:
    """Why `kubectl drain` would refuse this pod with these settings, naming the setting under
    `field` that allows it."""
    if not pod["metadata"].get("ownerReferences") and not force:
        return f"is not managed by a controller; set {field}.force"
    volumes = (pod.get("spec") or {}).get("volumes") or []
    if any("emptyDir" in v for v in volumes) and not delete_empty_dir:
        return f"uses emptyDir storage; set {field}.deleteEmptyDir"
    return None


def pod_name(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
