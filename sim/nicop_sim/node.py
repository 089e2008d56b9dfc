"""`nicop sim-node`: what a simulated node has besides what kwok plays.

kwok keeps the Node object Ready and plays the pods of other images. This process is the rest of
the node, for nicop: its hardware (the sysfs tree of its profile, built on first start, with a
booted simulated kernel), the kubelet's device manager (plugin registration, the node's
capacity, devices handed to pods, `nicop_sim.kubelet`) and the kubelet's container runtime for
pods of nicop's image (`nicop_sim.pods`). SIGHUP restarts the device manager as a kubelet
restart does (sockets removed, every plugin has to register again) while the pods run on.
Agents it starts are told that their machine is the simulated one through the environment
(`NICOP_PLATFORM=sim` with `nicop_sim.platform`'s variables, and `NICOP_HOST_NETNS`), never
through their pod spec, which stays the one a real node would run.

Every simulated node shares this machine's network, yet a real node's hostNetwork agents each
have their node's address: a scrape of `<pod IP>:<port>` reaches that node's agent, and every
node's agents use the same ports. So each node stand-in gives its node an address of its own on
loopback (all of 127.0.0.0/8 reaches `lo` on Linux, nothing to configure), `node_address`, and
reports it as the hostIP and podIP of the pods it runs, which is also what their downward API
says; agents listen on their pod's IP (nicop.node.metrics). The Node object keeps the InternalIP
kwok gives every node (kwok serves the kubelet API of all of them on one address).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import zlib
from dataclasses import dataclass
from pathlib import Path

from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import NODE, Obj
from nicop.node.host import Host
from nicop.platform import PLATFORM_ENV
from nicop_sim import hardware
from nicop_sim.dra_kubelet import DraKubelet
from nicop_sim.kernel import SimulatedKernel
from nicop_sim.kubelet import Kubelet
from nicop_sim.network import NodeNetwork, write_primary_network
from nicop_sim.platform import PF_ENV, ROOT_ENV, SimulatedPlatform
from nicop_sim.pods import PodRunner

log = logging.getLogger(__name__)

DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


@dataclass
class NodeOptions:
    node_name: str
    kubeconfig: Path
    root: Path
    """The node's filesystem: its simulated sysfs, /dev, /proc, /var/lib/kubelet, /etc ..."""
    pods_dir: Path
    """Where the node keeps its pods: volumes, container root directories, logs."""
    netns: str | None = None
    crash_backoff: float = 10.0


def seed_of(node_name: str) -> int:
    """Varies MACs and GUIDs between nodes: node-3 gets 3."""
    tail = node_name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else zlib.crc32(node_name.encode()) & 0xFF


def node_address(node_name: str, cluster: str = "") -> str:
    """The simulated node's own loopback address, the same at every start: 127.a.b.c from a
    hash of its cluster (its nodes' directory) and name, outside 127.0.0.0/16, where the control
    plane listens; node-1 of two local clusters on one machine get different ones. Two that
    hash alike would share an address; their agents would then report the port in use."""
    h = zlib.crc32(f"{cluster}/{node_name}".encode() if cluster else node_name.encode())
    return f"127.{1 + h % 254}.{(h >> 8) & 0xFF}.{1 + (h >> 16) % 254}"


def build_tree(root: Path, profile: hardware.Profile, seed: int) -> None:
    """The node's hardware and a kernel booted with the inbox driver, unless already there."""
    if (root / "sys").exists():
        return
    hardware.SimulatedHost.build(root, profile, seed)
    SimulatedKernel.boot(root, release=profile.kernel, os_id=profile.os_id,
                         os_version=profile.os_version)


def sim_env(options: NodeOptions) -> dict[str, str]:
    """What agents on this node learn of its simulated kernel (never from their pod spec)."""
    env = {PLATFORM_ENV: SimulatedPlatform.name, ROOT_ENV: str(options.root),
           PF_ENV: str(options.root / ".sim" / "pf")}
    if options.netns:
        env["NICOP_HOST_NETNS"] = f"/run/netns/{options.netns}"
    return env


async def wait_for_node(client: ApiClient, name: str, stop: asyncio.Event) -> Obj | None:
    """The Node, once the API server answers (a kubelet keeps trying); None after `stop`."""
    while not stop.is_set():
        try:
            return await client.get(NODE, name)
        except (ApiError, OSError) as e:
            log.warning("cannot read node %s: %s; trying again", name, e)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return None


async def run(options: NodeOptions, stop: asyncio.Event) -> None:
    client = ApiClient(options.kubeconfig)
    kubelet = None
    try:
        node = await wait_for_node(client, options.node_name, stop)
        if node is None:
            return
        name = (node["metadata"].get("annotations") or {}).get(hardware.PROFILE_ANNOTATION, "cpu")
        profile = hardware.profile_named(name)
        if profile is None:
            raise ValueError(f"node {options.node_name} has unknown hardware profile {name!r} "
                             f"(annotation {hardware.PROFILE_ANNOTATION}); known: "
                             f"{', '.join(hardware.PROFILES)}")
        build_tree(options.root, profile, seed_of(options.node_name))
        write_primary_network(options.root)
        kubelet = Kubelet(Host(options.root).path(DEVICE_PLUGIN_DIR), options.node_name,
                          options.kubeconfig)
        await kubelet.start()
        restarts: set[asyncio.Task[None]] = set()

        def restart_kubelet(manager: Kubelet = kubelet) -> None:
            log.info("SIGHUP: the kubelet's device manager restarts")
            task = asyncio.create_task(manager.restart())
            restarts.add(task)
            task.add_done_callback(restarts.discard)

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, restart_kubelet)
        server, ca_data = _cluster_of(options.kubeconfig)
        runner = PodRunner(
            client, options.node_name, options.root, options.pods_dir,
            server=server, ca_data=ca_data,
            crash_backoff=options.crash_backoff, extra_env=sim_env(options),
            host_ip=node_address(options.node_name, str(options.root.parent)),
        )
        log.info("node %s (%s) stands in on %s", options.node_name, profile.name, options.root)
        parts = [runner.run(stop, node),
                 DraKubelet(client, options.node_name, Host(options.root), runner.pods).run(stop)]
        if options.netns:
            network = NodeNetwork(client, options.node_name, options.root, options.pods_dir,
                                  options.netns)
            parts.append(network.run(stop))
        await asyncio.gather(*parts)
    finally:
        if kubelet is not None:
            await kubelet.close()
        await client.close()


def _cluster_of(kubeconfig: Path | str | None) -> tuple[str, str]:
    """The server and CA (as kubeconfig data) of the stand-in's kubeconfig, for the pods it
    runs."""
    import base64

    import yaml

    document = yaml.safe_load(Path(kubeconfig or os.environ["KUBECONFIG"]).read_text())
    context = next(c["context"] for c in document["contexts"]
                   if c["name"] == document["current-context"])
    cluster = next(c["cluster"] for c in document["clusters"] if c["name"] == context["cluster"])
    ca = cluster.get("certificate-authority-data") or base64.b64encode(
        Path(cluster["certificate-authority"]).read_bytes()).decode()
    return str(cluster["server"]), str(ca)
