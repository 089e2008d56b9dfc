"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from nicop.kube import request_record

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Every `nicop operator` this session starts (they inherit the environment) writes down the
    kinds of requests it makes, for the RBAC test that runs after all others."""
    if request_record.ENV not in os.environ:
        fd, path = tempfile.mkstemp(prefix="nicop-requests-", suffix=".jsonl")
        os.close(fd)
        os.environ[request_record.ENV] = path
        config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked after_all read what every other test left behind: they run last."""
    items.sort(key=lambda item: item.get_closest_marker("after_all") is not None)


@pytest.fixture(scope="session")
def controlplane_bin() -> Path:
    """The real control plane binaries, built (once per machine) by hack/build-controlplane.sh."""
    if env := os.environ.get("NICOP_CONTROLPLANE_BIN"):
        return Path(env)
    out = subprocess.run(
        [str(ROOT / "hack" / "build-controlplane.sh")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])
