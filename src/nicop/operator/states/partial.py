"""A state nicop renders only in part: `unsupported(section)` names, per spec field, what it
does not do yet, and the policy's status carries those words next to the state's readiness."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from nicop.kube.resources import Obj
from nicop.operator.states.base import State


def _nothing(section: Obj, path: str) -> list[str]:
    return []


@dataclass(frozen=True)
class PartialState(State):
    unsupported: Callable[[Obj, str], list[str]] = field(default=_nothing)
