"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
