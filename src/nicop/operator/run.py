"""`nicop operator`: the cluster-scope process, one leader at a time."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

from nicop.api.labels import LEASE_NAME
from nicop.kube.client import ApiClient
from nicop.kube.events import EventRecorder
from nicop.kube.leader import LeaderElector
from nicop.kube.manager import Manager
from nicop.kube.request_record import from_env as request_record_from_env
from nicop.operator import upgrade
from nicop.operator.caches import TRANSFORMS
from nicop.operator.cni_daemon import CniDaemonController
from nicop.operator.ipam import IpamController
from nicop.operator.maintenance import MaintenanceController
from nicop.operator.maintenance_requestor import RequestorOptions
from nicop.operator.networks import NetworkController
from nicop.operator.node_policy import NodePolicyController
from nicop.operator.policy import PolicyController
from nicop.operator.sriov import SriovPolicyController
from nicop.operator.sriov_daemons import SriovDaemonsController
from nicop.operator.sriov_drain import SriovDrainController
from nicop.operator.sriov_networks import SriovNetworkController
from nicop.operator.upgrade import UpgradeController


async def run(
    namespace: str,
    kubeconfig: Path | None = None,
    *,
    leader_elect: bool = True,
    health_address: tuple[str, int] | None = ("0.0.0.0", 8081),
    identity: str | None = None,
    lease_duration: float = 15.0,
) -> None:
    client = ApiClient(kubeconfig)
    client.record = request_record_from_env(namespace)
    identity = identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"
    elector = None
    if leader_elect:
        elector = LeaderElector(
            client,
            namespace,
            LEASE_NAME,
            identity,
            lease_duration=lease_duration,
            renew_deadline=lease_duration * 2 / 3,
            retry_period=max(lease_duration / 7.5, 0.2),
        )
    manager = Manager(client, elector=elector, health_address=health_address,
                      transforms=TRANSFORMS)
    recorder = EventRecorder(client)
    cni_bin_dir = os.environ.get("CNI_BIN_DIR", "/opt/cni/bin")
    cni_dirs = {"cni_bin_dir": cni_bin_dir,
                "cni_network_dir": os.environ.get("CNI_NETWORK_DIR", "/etc/cni/net.d")}
    PolicyController(manager, namespace, recorder, **cni_dirs)
    NodePolicyController(manager, namespace, recorder, **cni_dirs)
    NetworkController(manager)
    UpgradeController(manager, namespace, recorder,
                      retries=int(os.environ.get("NICOP_UPGRADE_RETRIES", upgrade.RETRIES)),
                      retry_backoff=float(os.environ.get("NICOP_UPGRADE_RETRY_BACKOFF",
                                                         upgrade.RETRY_BACKOFF)),
                      ready_timeout=float(os.environ.get("NICOP_UPGRADE_READY_TIMEOUT",
                                                         upgrade.READY_TIMEOUT)),
                      requestor=RequestorOptions.from_env(os.environ))
    if os.environ.get("NICOP_MAINTENANCE_CONTROLLER") == "true":
        MaintenanceController(manager, namespace, recorder)
    IpamController(manager, namespace)
    SriovPolicyController(manager, namespace, recorder)
    SriovDrainController(manager, namespace, recorder,
                         requestor=RequestorOptions.sriov_from_env(os.environ))
    SriovNetworkController(manager, namespace, recorder)
    SriovDaemonsController(manager, namespace)
    CniDaemonController(manager, namespace, cni_bin_dir)
    # SIGTERM (a pod being stopped) ends the run cleanly, so the lease is handed over at once.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await manager.run()
    except asyncio.CancelledError:
        pass
    finally:
        await client.close()


def main(
    namespace: str,
    kubeconfig: Path | None,
    leader_elect: bool,
    health_port: int,
    lease_duration: float,
) -> None:
    address = ("0.0.0.0", health_port) if health_port else None
    asyncio.run(
        run(
            namespace,
            kubeconfig,
            leader_elect=leader_elect,
            health_address=address,
            lease_duration=lease_duration,
        )
    )
