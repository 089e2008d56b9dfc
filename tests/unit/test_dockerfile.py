"""The Dockerfile builds the one nicop image from this tree. No container engine runs here, so
this checks what can be checked without one: the build context Docker would send (the tree minus
.dockerignore) holds what the Dockerfile copies and nothing else, and pip turns exactly that
context into the `nicop` command the image's entrypoint runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
Rule = tuple[bool, re.Pattern[str], str]  # (re-include?, pattern, pattern text)


def _translate(pattern: str) -> str:
    """A .dockerignore pattern as a regex: `**` spans directories, `*` and `?` do not."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return f"^{out}$"


def _rules() -> list[Rule]:
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        rules.append((negate, re.compile(_translate(pattern)), pattern))
    return rules


def _excluded(path: str, rules: list[Rule]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex, _ in rules:
        if any(regex.match(p) for p in prefixes):
            excluded = not negate
    return excluded


def build_context() -> list[str]:
    """The files `docker build .` would send, relative to the root of the tree."""
    rules = _rules()
    reincluded = [text for negate, _, text in rules if negate]
    files = []
    for top, dirs, names in os.walk(ROOT):
        rel_top = os.path.relpath(top, ROOT)
        rel_top = "" if rel_top == "." else rel_top + "/"
        # Skip directories nothing under them can be re-included from (.git, .venv, ...).
        dirs[:] = [d for d in dirs if not _excluded(rel_top + d, rules)
                   or any(r.startswith(rel_top + d + "/") for r in reincluded)]
        files += [rel_top + n for n in names if not _excluded(rel_top + n, rules)]
    return sorted(files)


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    steps = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, args = line.partition(" ")
            steps.append((instruction.upper(), args.strip()))
    return steps


def test_one_image_on_python_slim_whose_entrypoint_is_nicop() -> None:
    steps = dockerfile()
    assert [a for i, a in steps if i == "FROM"] == ["python:3.11-slim"]
    entrypoints = [a for i, a in steps if i == "ENTRYPOINT"]
    assert [json.loads(a) for a in entrypoints] == [["nicop"]]  # exec form: signals reach nicop
    # Node agents run privileged and need root; the chart runs the operator as non-root itself.
    assert not [a for i, a in steps if i == "USER"]


def test_build_context_holds_what_the_dockerfile_copies_and_no_more() -> None:
    context = build_context()
    copied = []
    for instruction, args in dockerfile():
        if instruction == "COPY":
            sources = [a for a in args.split() if not a.startswith("--")][:-1]
            copied += [s.rstrip("/") for s in sources]
    for source in copied:
        assert any(f == source or f.startswith(source + "/") for f in context), (
            f"the Dockerfile copies {source}, which .dockerignore keeps out of the context")
    tracked = subprocess.run(["git", "ls-files", "src"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    missing = sorted(set(tracked) - set(context))
    assert not missing, f"package files kept out of the image: {missing[:10]}"
    strays = [f for f in context if not (f in ("pyproject.toml", "README.md")
                                         or f.startswith("src/"))]
    assert not strays, f"sent to the build but not needed: {strays[:10]}"
    assert not [f for f in context if "__pycache__" in f or ".egg-info" in f]


def test_pip_builds_the_nicop_command_from_the_build_context_alone(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for f in build_context():
        (context / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, context / f)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    [wheel] = (tmp_path / "wheels").glob("nicop-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert re.search(r"^nicop = nicop\.__main__:main$", entry_points, re.M)
    package_files = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "nicop").rglob("*")
                     if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".typed")
                     and "__pycache__" not in p.parts}
    assert package_files <= names, sorted(package_files - names)[:10]
