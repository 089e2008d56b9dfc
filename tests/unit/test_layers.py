"""The layers of docs/architecture.md hold: each part of the package imports only what is below
it, so the node agents never load the operator and the readers (`status`, `diagnose`) never load
either side's internals. Every import counts, also those inside functions. The allowed imports
are read from the page's layer table, so the page and this test cannot disagree."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "nicop"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = {"nicop", "nicop_sim"}
SHARED = {"logs", "backoff"}  # leaves every layer may use


def layer_table() -> dict[str, set[str]]:
    """layer -> the layers it may import (besides itself and SHARED), from the page's table."""
    table = {}
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            table[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1]))
    return table


ALLOWED = layer_table()


def test_the_page_names_every_layer_of_the_package() -> None:
    """A new top-level module or package gets a row (cli and __main__ sit on top)."""
    tops = {p.stem for p in PACKAGE.iterdir()
            if (p.suffix == ".py" or (p / "__init__.py").exists()) and p.stem != "__init__"}
    assert tops - {"cli", "__main__", *SHARED} == set(ALLOWED), sorted(tops)


def layer_of(module: str) -> str:
    """nicop.cni.daemon -> cni; nicop.status -> status; nicop -> nicop."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out.append((name, path))
    return out


NAMES = {name for name, _ in modules()}


def imports_of(path: Path) -> set[str]:
    """The nicop modules `path` imports, anywhere in it (`from a import b` is module a.b when
    there is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[
                0] in PACKAGES:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in NAMES else node.module)
    return found


@pytest.mark.parametrize(("name", "path"), [
    (name, path) for name, path in modules() if layer_of(name) in {*ALLOWED, *SHARED}
], ids=lambda v: str(v))  # cli and __main__ sit on top: they may import anything
def test_imports_point_down(name: str, path: Path) -> None:
    layer = layer_of(name)
    below = set() if layer in SHARED else {*ALLOWED[layer], *SHARED}  # a leaf imports nothing
    wrong = sorted(m for m in imports_of(path) if layer_of(m) not in {layer, *below})
    assert not wrong, f"{name} ({layer}) may import only {sorted(below)}: {wrong}"


@pytest.mark.parametrize(("name", "path"), modules(), ids=lambda v: str(v))
def test_the_product_never_imports_the_simulation(name: str, path: Path) -> None:
    """nicop-sim plugs in through entry points (nicop.cli, nicop.platforms); what a user
    installs works without it and cannot be told to use it by name."""
    assert not {m for m in imports_of(path) if m.split(".")[0] == "nicop_sim"}


def test_loading_the_cni_daemon_loads_no_operator() -> None:
    code = ("import sys, nicop.cni.daemon; "
            "print(sorted(m for m in sys.modules if m.startswith('nicop.operator')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_operator_does_not_import_itself_in_a_circle() -> None:
    """policy <-> upgrade used to import each other; no operator module may again."""
    graph = {name: {m for m in imports_of(path) if m.startswith("nicop.operator")}
             for name, path in modules() if name.startswith("nicop.operator")}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    circles = sorted(n for n in graph if reaches(n, n, {n}))
    assert not circles, f"import circles through {circles}"
