"""What a user installs: the `nicop` wheel holds the operator, the agents and the CLI, and
nothing of the simulation; the `nicop-sim` wheel adds the local cluster and the demo, which find
their example manifests in the installed package, not in a source tree. Both wheels are built
from this checkout and installed into a fresh virtual environment (dependencies from the
package index, as a user's `pip install` gets them), run from a directory outside the
repository."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, check=False, env=env)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Built from a copy of what the wheels are made of (a build writes build/ beside its
    sources)."""
    source = tmp_path_factory.mktemp("source")
    for part in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / part, source / part)
    for part in ("src", "sim", "examples"):
        shutil.copytree(ROOT / part, source / part, symlinks=True, ignore=shutil.ignore_patterns(
            "__pycache__", "*.egg-info", "build"))
    out = tmp_path_factory.mktemp("wheels")
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
        "--wheel-dir", out, source, source / "sim", cwd=out)
    return {w.name.split("-")[0]: w for w in out.glob("*.whl")}


@pytest.fixture(scope="module")
def installed(wheels: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A fresh environment with the nicop wheel alone; its python, and a directory outside the
    repository to run in."""
    home = tmp_path_factory.mktemp("user")
    env_dir = home / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
        "--disable-pip-version-check", wheels["nicop"], cwd=home)
    yield python, home


def names_in(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_the_nicop_wheel_holds_no_simulation(wheels: dict[str, Path]) -> None:
    names = names_in(wheels["nicop"])
    assert {n.split("/")[0] for n in names} == {"nicop", "nicop-0.1.0.dist-info"}, names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheels["nicop"]) as z:
        assert "nicop_sim" not in z.read(entry_points).decode()


def test_the_sim_wheel_carries_the_examples_the_demo_applies(wheels: dict[str, Path]) -> None:
    names = set(names_in(wheels["nicop_sim"]))
    assert {"nicop_sim/examples/nicclusterpolicy-demo.yaml",
            "nicop_sim/examples/demo/sriov.yaml"} <= names


def test_installed_alone_nicop_runs_its_agents_and_cannot_select_the_simulation(
        installed: tuple[Path, Path]) -> None:
    python, home = installed
    shown = run(python, "-m", "nicop", "--help", cwd=home, env={
        **os.environ, "COLUMNS": "200"}).stdout
    for command in ("operator", "driver", "rdma-device-plugin", "dra-plugin", "status"):
        assert command in shown, shown
    for command in (" cluster ", " demo "):
        assert command not in shown, shown
    for command in ("plan", "discover", "bundle"):
        assert f" {command} " in shown, shown
    bundle = run(python, "-m", "nicop", "bundle", "--help", cwd=home, env={
        **os.environ, "COLUMNS": "200"}).stdout
    assert "--log-lines" in bundle and "replay" not in bundle, bundle  # replay is nicop-sim's
    no_sim = run(python, "-c",
                 "import importlib.util; print(importlib.util.find_spec('nicop_sim'))",
                 cwd=home).stdout
    assert no_sim.strip() == "None"
    picked = run(python, "-c", "from nicop import platform; platform.current()", cwd=home,
                 env={**os.environ, "NICOP_PLATFORM": "sim"}, check=False)
    assert "$NICOP_PLATFORM is 'sim', which is not installed (installed: host)" in picked.stderr


def test_with_the_sim_wheel_the_demo_reads_its_examples_from_the_installed_package(
        installed: tuple[Path, Path], wheels: dict[str, Path]) -> None:
    python, home = installed
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
        "--disable-pip-version-check", wheels["nicop_sim"], cwd=home)
    where = run(python, "-c", "from nicop_sim import demo; "
                "print('kind: NicClusterPolicy' in demo.POLICY_FILE.read_text()); "
                "print(demo.SRIOV_FILE.resolve())",
                cwd=home).stdout
    assert where.startswith("True") and str(home / "venv") in where, where
    shown = run(python, "-m", "nicop", "--help", cwd=home, env={
        **os.environ, "COLUMNS": "200"}).stdout
    assert " demo " in shown and " cluster " in shown, shown
    bundle = run(python, "-m", "nicop", "bundle", "--help", cwd=home, env={
        **os.environ, "COLUMNS": "200"}).stdout
    assert " replay " in bundle, bundle


DEV_TOOLS = {"protogen.py"}  # `make proto`: the dev extra's grpcio-tools, never an agent's


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_module_nicop_imports_is_the_standard_library_or_a_declared_dependency() -> None:
    """An import that only works because some other dependency pulled it in breaks the day that
    one stops: each third-party module of src/nicop belongs to a distribution pyproject.toml
    names (the lookup is the installed distributions' own record of their modules)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {_canonical(re.match(r"[A-Za-z0-9._-]+", r).group())  # type: ignore[union-attr]
                for r in requirements}

    runtime, dev = names(project["dependencies"]), names(project["optional-dependencies"]["dev"])
    owners = importlib.metadata.packages_distributions()
    undeclared = set()
    for path in (ROOT / "src/nicop").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names}:
                if top in sys.stdlib_module_names or top == "nicop":
                    continue
                declared = runtime | dev if path.name in DEV_TOOLS else runtime
                if not {_canonical(d) for d in owners.get(top, [])} & declared:
                    undeclared.add(f"{path.relative_to(ROOT)}: {top}")
    assert not undeclared, sorted(undeclared)
