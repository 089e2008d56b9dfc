"""What a check is, what a diagnosis is about, and the one registry of checks.

Every check is a pure function of one snapshot of the cluster, registered under a name with what
it applies to: the cluster, any node, a node nicop manages under a policy, or a pod. The entry
points (nicop.diagnose) run the registered checks of their target in registration order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from nicop import status as st

Result = Literal["pass", "warn", "fail"]
Snapshot = st.Snapshot
AppliesTo = Literal["cluster", "node", "managed node", "pod"]
F = TypeVar("F", bound=Callable[..., list["Check"]])


@dataclass
class Check:
    """One item of the checklist; `fix` is what to run or change when it is not a pass."""

    subject: str
    name: str
    result: Result
    message: str
    fix: str | None = None


@dataclass(frozen=True)
class Target:
    """What to diagnose: the cluster, one node, or one pod."""

    kind: str = "cluster"
    name: str = ""
    namespace: str = ""

    @classmethod
    def parse(cls, kind: str | None, name: str | None) -> Target:
        """From the command line: nothing, `node NAME` or `pod [NAMESPACE/]NAME`."""
        if kind is None:
            return cls()
        if kind in ("node", "no", "nodes") and name:
            return cls("node", name)
        if kind in ("pod", "po", "pods") and name:
            namespace, _, pod = name.rpartition("/")
            return cls("pod", pod, namespace or "default")
        raise ValueError("expected no argument (the cluster), `node NAME` or "
                         "`pod NAMESPACE/NAME`")

    def __str__(self) -> str:
        if self.kind == "cluster":
            return "cluster"
        if self.kind == "node":
            return f"node/{self.name}"
        return f"pod/{self.namespace}/{self.name}"



@dataclass(frozen=True)
class Registered:
    """One kind of check. Its function takes the snapshot and, for a node, the node (and the
    policy, for a managed node), for a pod, the pod and its subject; it returns its checks."""

    name: str
    applies_to: AppliesTo
    run: Callable[..., list[Check]]


REGISTRY: list[Registered] = []


def registered(name: str, applies_to: AppliesTo) -> Callable[[F], F]:
    """Adds the decorated function to the registry."""
    def add(run: F) -> F:
        REGISTRY.append(Registered(name, applies_to, run))
        return run
    return add


def checks_for(applies_to: AppliesTo) -> list[Registered]:
    return [r for r in REGISTRY if r.applies_to == applies_to]
