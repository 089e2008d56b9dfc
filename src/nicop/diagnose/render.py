"""The report `-o json` prints and the checklist as the terminal shows it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict

from rich.console import Group, RenderableType
from rich.text import Text

from nicop.diagnose.check import Check, Snapshot, Target
from nicop.kube.resources import (
    Obj,
)


def failed(checks: Iterable[Check]) -> bool:
    return any(c.result == "fail" for c in checks)


def report(snap: Snapshot, target: Target, checks: list[Check]) -> Obj:
    """The report `-o json` prints."""
    counts = {r: sum(c.result == r for c in checks) for r in ("pass", "warn", "fail")}
    overall = "fail" if counts["fail"] else "warn" if counts["warn"] else "pass"
    return {
        "target": str(target),
        "namespace": snap["namespace"],
        "collectedAt": snap["collectedAt"],
        "result": overall,
        "summary": counts,
        "checks": [asdict(c) for c in checks],
    }



STYLE = {"pass": ("PASS", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "red")}


def render(result: Obj) -> RenderableType:
    """The checklist grouped by subject, each failure with its fix."""
    parts: list[RenderableType] = []
    subject = None
    for check in result["checks"]:
        if check["subject"] != subject:
            subject = check["subject"]
            parts.append(Text(f"\n{subject}", style="bold"))
        label, style = STYLE[check["result"]]
        line = Text("  ")
        line.append(label, style=f"bold {style}")
        line.append(f"  {check['name']}: ", style="bold")
        line.append(check["message"])
        parts.append(line)
        if check["fix"] and check["result"] != "pass":
            fix = Text("        fix: ", style="dim")
            fix.append(check["fix"])
            parts.append(fix)
    counts = result["summary"]
    style = STYLE[result["result"]][1]
    parts.append(Text(f"\n{counts['pass']} passed, {counts['warn']} warnings, "
                      f"{counts['fail']} failed", style=f"bold {style}"))
    return Group(*parts)


def as_lines(checks: Iterable[Check]) -> list[str]:
    """Plain one-line form, for logs and tests."""
    return [f"{c.result.upper()} {c.subject} {c.name}: {c.message}"
            + (f" | fix: {c.fix}" if c.fix else "") for c in checks]

