"""Status conditions as Kubernetes defines them: one per type, and a transition time that moves
only when the status does."""

from __future__ import annotations

from nicop.kube.resources import Obj
from nicop.kube.times import stamp


def with_condition(conditions: list[Obj], type_: str, ok: bool, reason: str, message: str,
                   generation: int | None = None) -> list[Obj] | None:
    """`conditions` with the `type_` one set as given; None when that changes nothing."""
    status = "True" if ok else "False"
    old = next((c for c in conditions if c.get("type") == type_), None)
    if old and (old.get("status"), old.get("reason"), old.get("message")) == (
            status, reason, message) and (generation is None or old.get(
            "observedGeneration") == generation):
        return None
    condition: Obj = {"type": type_, "status": status, "reason": reason, "message": message,
                      "lastTransitionTime": old["lastTransitionTime"] if old and old.get(
                          "status") == status and old.get("lastTransitionTime") else stamp()}
    if generation is not None:
        condition["observedGeneration"] = generation
    return [*(c for c in conditions if c.get("type") != type_), condition]
