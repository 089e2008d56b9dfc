"""The real control plane for integration tests: started once per session, stopped always.

The processes are started with PR_SET_PDEATHSIG, so even a killed pytest leaves none behind.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, ServiceAccount
from tests.integration.operator_process import NAMESPACE, OperatorProcess

from nicop_sim.cluster import LocalCluster, running_cluster

NODES = 4


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, controlplane_bin: Path
) -> Iterator[LocalCluster]:
    state_dir = tmp_path_factory.mktemp("cluster")
    with running_cluster(state_dir, controlplane_bin, nodes=NODES) as c:
        yield c


@pytest.fixture(scope="session")
def kubeconfig(cluster: LocalCluster) -> Path:
    return cluster.kubeconfig


@pytest.fixture(scope="session")
def client(cluster: LocalCluster) -> Client:
    return cluster.client()  # type: ignore[no-any-return]


@pytest.fixture
def namespace(client: Client) -> Iterator[str]:
    """A fresh namespace per test, with its default ServiceAccount (pods need it), deleted after."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    client.create(Namespace(metadata=ObjectMeta(name=name)))
    deadline = time.monotonic() + 30
    while True:
        try:
            client.get(ServiceAccount, "default", namespace=name)
            break
        except ApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield name
    client.delete(Namespace, name)


@pytest.fixture(scope="session")
def crds(kubeconfig: Path) -> list[str]:
    """Every CRD nicop serves, installed the way `nicop crds install` does it."""
    from nicop.operator.crds import install_crds

    return install_crds(kubeconfig)


@pytest.fixture(scope="module")
def operator(
    client: Client, kubeconfig: Path, crds: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """`nicop operator` running as a process against the test cluster, per test module."""
    try:
        client.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    except ApiError as e:
        if e.status.code != 409:
            raise
    proc = OperatorProcess(kubeconfig, NAMESPACE, tmp_path_factory.mktemp("op") / "operator.log")
    proc.wait_ready()
    yield proc
    proc.stop()
