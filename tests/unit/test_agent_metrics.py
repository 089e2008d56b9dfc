"""The node agents' metrics: the ports their DaemonSets declare, and the values a scrape shows
after what a user does (devices advertised and handed out, a node state applied, a driver
loaded)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from tests.eventually import until

from nicop.api.agents import METRICS_PORT_NAME, METRICS_PORTS
from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.deviceplugin.server import Device, DevicePluginServer, ServerSet
from nicop.node.driver import DriverAgent, DriverConfig
from nicop.node.metrics import serve_metrics
from nicop.node.sriov_daemon import FAILED, SUCCEEDED, report_metrics
from nicop.operator import cni_daemon, sriov_daemons
from nicop.operator.states import dra_driver, multus, ofed, rdma_dp, sriov_dp
from nicop.operator.states.base import Context
from nicop_sim.hardware import PROFILES, SimulatedHost
from nicop_sim.kernel import SimulatedBackend, SimulatedKernel
from nicop_sim.kubelet import Kubelet
from nicop_sim.node import node_address

RDMA = json.dumps({"configList": [{"resourceName": "a", "resourcePrefix": "rdma",
                                   "rdmaHcaMax": 8, "selectors": {"vendors": ["15b3"]}}]})


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


# ------------------------------------------------------------------ what the operator renders


def agent_containers() -> list[dict[str, Any]]:
    ctx = Context({"spec": {}}, "ns", agent_image="reg/nicop:1")
    node = {"metadata": {"name": "n", "labels": {
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-1"}}}
    ctx.managed_nodes = [node]
    config = sriov_daemons.default_config("ns", single_node=False)
    objects = [
        *ofed.render(ctx, {"image": "nicop", "version": "25.10-1.2.8.0"}, "spec.ofedDriver"),
        *rdma_dp.render(ctx, {"image": "nicop", "config": RDMA}, "spec.rdmaSharedDevicePlugin"),
        *sriov_dp.render(ctx, {"image": "nicop", "config": json.dumps({"resourceList": []})},
                         "spec.sriovDevicePlugin"),
        *sriov_daemons.render_config_daemon(ctx, config),
        *sriov_daemons.render_device_plugin(ctx, config),
        *cni_daemon.render(ctx, ["sriov"]),
        *dra_driver.render(ctx, {}, "spec.draDriver"),
        *multus.render(ctx, {"image": "nicop"}, "spec.secondaryNetwork.multus"),
    ]
    return [c for o in objects if o["kind"] == "DaemonSet"
            for c in o["spec"]["template"]["spec"]["containers"]]


def test_every_agent_declares_its_own_metrics_port_and_gets_it_with_its_pod_ip() -> None:
    containers = agent_containers()
    assert len(containers) == len(METRICS_PORTS)
    ports = []
    for c in containers:
        [port] = [p for p in c["ports"] if p["name"] == METRICS_PORT_NAME]
        ports.append(port["containerPort"])
        assert f"--metrics-port={port['containerPort']}" in c["command"]
        assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} \
            in c["env"]
    assert sorted(ports) == sorted(METRICS_PORTS.values())  # one distinct port per component


def test_upstream_images_get_no_metrics_port() -> None:
    ctx = Context({"spec": {}}, "ns")
    spec = {"image": "k8s-rdma-shared-dev-plugin", "repository": "ghcr.io/x", "version": "v1",
            "config": RDMA}
    [ds] = [o for o in rdma_dp.render(ctx, spec, "spec.x") if o["kind"] == "DaemonSet"]
    assert "ports" not in ds["spec"]["template"]["spec"]["containers"][0]


# ------------------------------------------------------------------ serving


def test_metrics_are_served_on_the_pod_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two simulated nodes' agents on the same port, each on its node's loopback address (and
    node-1 of two clusters on one machine gets two)."""
    first, second = node_address("node-1"), node_address("node-2")
    assert first != second and first.startswith("127.") and not first.startswith("127.0.")
    assert node_address("node-1", "/tmp/nicop-a1b2c3") != node_address("node-1", "/tmp/x/n")

    async def main() -> list[str]:
        servers = []
        for address in (first, second):
            monkeypatch.setenv("POD_IP", address)
            server = await serve_metrics(METRICS_PORTS["cni-daemon"] + 1000)
            assert server is not None
            servers.append(server)
        try:
            return [await asyncio.to_thread(_get, f"http://{a}:{METRICS_PORTS['cni-daemon'] + 1000}"
                                            "/metrics") for a in (first, second)]
        finally:
            for server in servers:
                server.close()

    for body in asyncio.run(main()):
        assert "python_info" in body or "process_" in body or "# HELP" in body


def test_a_port_in_use_leaves_the_agent_running_without_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_IP", node_address("node-9"))

    async def main() -> asyncio.Server | None:
        first = await serve_metrics(METRICS_PORTS["driver"] + 1000)
        try:
            return await serve_metrics(METRICS_PORTS["driver"] + 1000)
        finally:
            assert first is not None
            first.close()

    assert asyncio.run(main()) is None


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


# ------------------------------------------------------------------ device plugins


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpm-", dir="/tmp"))
    yield path / "device-plugins"
    shutil.rmtree(path)


def test_device_plugin_metrics_follow_devices_registrations_and_allocations(
        sockdir: Path) -> None:
    resource = "nvidia.com/metrics_vf"

    def allocate(ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        return pb.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})

    async def main() -> None:
        kubelet = Kubelet(sockdir)
        await kubelet.start()
        servers = ServerSet()
        server = DevicePluginServer(resource, sockdir, "m.sock", allocate, poll_interval=0.05)
        server.update([Device("a"), Device("b"), Device("c", healthy=False)])
        servers.start(server)
        try:
            await kubelet.wait_for(lambda: kubelet.allocatable() == {resource: 2})
            assert value("nicop_device_plugin_devices", resource=resource) == 3
            assert value("nicop_device_plugin_devices_healthy", resource=resource) == 2
            assert value("nicop_device_plugin_registered", resource=resource) == 1
            assert value("nicop_device_plugin_registrations_total", resource=resource) == 1
            assert value("nicop_device_plugin_devices_allocated", resource=resource) == 0

            await kubelet.allocate(resource, ids=["a"])
            await kubelet.allocate(resource, ids=["a", "b"])  # "a" again: counted once
            assert value("nicop_device_plugin_devices_allocated", resource=resource) == 2
            assert value("nicop_device_plugin_allocate_seconds_count", resource=resource) == 2

            await kubelet.restart()  # sockets removed: the plugin registers again
            # The plugin counts a registration once the kubelet has answered it, after the
            # kubelet's own change notice: poll the plugin's figures.
            await until(lambda: value(
                "nicop_device_plugin_registrations_total", resource=resource) == 2)
            await until(lambda: value(
                "nicop_device_plugin_registered", resource=resource) == 1)

            server.update([Device("a")])  # "b" went away: no longer counted as handed out
            assert value("nicop_device_plugin_devices_allocated", resource=resource) == 1
        finally:
            await servers.stop(resource)
            await kubelet.close()
        assert value("nicop_device_plugin_devices", resource=resource) is None  # forgotten

    asyncio.run(main())


# ------------------------------------------------------------------ SR-IOV config daemon


def test_sriov_metrics_show_the_sync_status_and_vfs_per_pf() -> None:
    report_metrics([{"name": "ens1f0", "numVfs": 4}, {"name": "ens1f1", "numVfs": 0}], SUCCEEDED)
    assert value("nicop_sriov_sync_status", status="Succeeded") == 1
    assert value("nicop_sriov_sync_status", status="InProgress") == 0
    assert value("nicop_sriov_vfs", pf="ens1f0") == 4
    report_metrics([{"name": "ens1f1", "numVfs": 2}], FAILED)
    assert value("nicop_sriov_sync_status", status="Failed") == 1
    assert value("nicop_sriov_sync_status", status="Succeeded") == 0
    assert value("nicop_sriov_vfs", pf="ens1f0") is None  # gone from the host
    assert value("nicop_sriov_vfs", pf="ens1f1") == 2


# ------------------------------------------------------------------ driver


def test_driver_metrics_name_the_loaded_version_and_time_the_reload(tmp_path: Path) -> None:
    profile = PROFILES["cx6dx"]
    host = SimulatedHost.build(tmp_path / "node", profile)
    kernel = SimulatedKernel.boot(tmp_path / "node", profile.kernel, os_id=profile.os_id,
                                  os_version=profile.os_version)
    version = "25.10-1.2.8.0"
    agent = DriverAgent(DriverConfig(version=version, validation_timeout=1.0,
                                     poll_interval=0.05),
                        host, SimulatedBackend(kernel, precompiled=[version]))
    loads = value("nicop_driver_load_seconds_count") or 0
    unloads = value("nicop_driver_unload_seconds_count") or 0

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while value("nicop_driver_info", version=version) != 1:
            assert not task.done(), task.result()
            await asyncio.sleep(0.02)
        stop.set()
        await task

    asyncio.run(main())
    assert value("nicop_driver_info", version="inbox") is None
    assert value("nicop_driver_load_seconds_count") == loads + 1
    assert value("nicop_driver_unload_seconds_count") == unloads + 1


def test_exposition_parses() -> None:
    """What Prometheus reads: every nicop metric family parses from the text format."""
    from prometheus_client import generate_latest

    names = {f.name for f in text_string_to_metric_families(generate_latest().decode())}
    assert {"nicop_device_plugin_devices", "nicop_device_plugin_registrations",
            "nicop_sriov_sync_status", "nicop_sriov_last_apply_seconds", "nicop_driver_info",
            "nicop_driver_load_seconds"} <= names
