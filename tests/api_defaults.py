"""The defaults the API server fills into a pod template, taken out again, so that a rendered
template compares with one read back from a cluster without starting a control plane.

The values are Kubernetes' own (k8s.io/kubernetes pkg/apis/core/v1/defaults.go, apps/v1
defaults.go); the integration tests compare through the real API server instead.
"""

from __future__ import annotations

import copy
from typing import Any

Obj = dict[str, Any]

POD_DEFAULTS = {"dnsPolicy": "ClusterFirst", "restartPolicy": "Always",
                "schedulerName": "default-scheduler", "securityContext": {},
                "terminationGracePeriodSeconds": 30}
CONTAINER_DEFAULTS = {"terminationMessagePath": "/dev/termination-log",
                      "terminationMessagePolicy": "File", "resources": {}}
PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
                  "failureThreshold": 3}


def without_defaults(template: Obj) -> Obj:
    """`template` with every field that holds its API default removed."""
    out = copy.deepcopy(template)
    spec = out.get("spec") or {}
    _drop(spec, POD_DEFAULTS)
    spec.pop("serviceAccount", None)  # the deprecated alias of serviceAccountName
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            _drop(c, CONTAINER_DEFAULTS)
            tag = c.get("image", "").rsplit("/", 1)[-1]
            latest = "@" not in tag and (":" not in tag or tag.endswith(":latest"))
            if c.get("imagePullPolicy") == ("Always" if latest else "IfNotPresent"):
                del c["imagePullPolicy"]
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe in c:
                    _drop(c[probe], PROBE_DEFAULTS)
                    if (c[probe].get("httpGet") or {}).get("scheme") == "HTTP":
                        del c[probe]["httpGet"]["scheme"]
            for port in c.get("ports") or []:
                if port.get("protocol") == "TCP":
                    del port["protocol"]
            for env in c.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("fieldRef") or {}
                if ref.get("apiVersion") == "v1":
                    del ref["apiVersion"]
            for mount in c.get("volumeMounts") or []:
                if mount.get("readOnly") is False:
                    del mount["readOnly"]
    for volume in spec.get("volumes") or []:
        if (volume.get("hostPath") or {}).get("type") == "":
            del volume["hostPath"]["type"]
        for source in ("configMap", "secret"):
            if (volume.get(source) or {}).get("defaultMode") == 420:
                del volume[source]["defaultMode"]
    return out


def _drop(obj: Obj, defaults: Obj) -> None:
    for key, value in defaults.items():
        if obj.get(key) == value:
            del obj[key]


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as paths with both sides."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]
