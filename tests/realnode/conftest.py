"""A local cluster with real nodes: a real kubelet, containerd and runc running nicop's image
(nicop_sim.realnode). They need root (namespaces, cgroups, mounts), which CI has; the runtime
and the image are built once per machine by the project's scripts, as the control plane is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client

from nicop_sim.cluster import LocalCluster, running_cluster

ROOT = Path(__file__).resolve().parent.parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="a real node needs root (namespaces, cgroups, mounts)")
        for item in items:
            if "tests/realnode/" in str(item.fspath):
                item.add_marker(skip)


def built(script: str) -> Path:
    """What a hack/build-*.sh script prints last: its cached output."""
    out = subprocess.run([str(ROOT / "hack" / script)], check=True, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHON": sys.executable})
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def image() -> Path:
    """nicop's OCI image archive (hack/build-image.sh; seconds when the sources are unchanged)."""
    return built("build-image.sh")


@pytest.fixture(scope="session")
def runtime_bin() -> Path:
    return built("build-runtime.sh")


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory, controlplane_bin: Path,
                 image: Path, runtime_bin: Path) -> Iterator[LocalCluster]:
    """One real node (real-1, ConnectX-6 Dx) beside two stand-in nodes."""
    state = tmp_path_factory.mktemp("real")
    with running_cluster(state, controlplane_bin, nodes=2, profiles=["cx6dx"],
                         real_nodes=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def real_client(real_cluster: LocalCluster) -> Client:
    return real_cluster.client()  # type: ignore[no-any-return]
