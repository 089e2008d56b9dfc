"""`nicop multus-daemon`: the `multus` plugin behind a socket, and the 00-multus.conf that makes
the container runtime call it (what upstream's thick Multus daemon does).

It keeps <conf dir>/00-multus.conf, the lexically first config there, so the runtime calls
`multus` for every pod. With `--multus-conf-file auto` the file wraps the first other config of
the conf dir (`.conf`, `.conflist` or `.json`, in lexical order) as its one delegate, the
cluster's default network, and follows it when it changes; with a path, that file is written as
given. The daemon is ready once the file is written and the socket serves; until a default
network's config appears it waits, not ready. With `--cleanup-config-on-exit` the file goes
when the daemon stops, so the runtime falls back to the default network alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from nicop.api.agents import MULTUS_SOCKET
from nicop.cni.multus import CACHE_DIR, CONF_NAME, Devices, MultusPlugin
from nicop.cni.server import CniServer
from nicop.cni.spec import Obj
from nicop.cni.state import sweep_temp
from nicop.kube.client import ApiClient
from nicop.node.host import Host
from nicop.node.metrics import serve_metrics
from nicop.node.podresources.client import SOCKET as POD_RESOURCES_SOCKET
from nicop.node.podresources.client import PodResources
from nicop.node.readiness import Readiness

log = logging.getLogger(__name__)

CONF_FILE = "00-multus.conf"
DEFAULT_SOCKET = MULTUS_SOCKET
CONF_SUFFIXES = (".conf", ".conflist", ".json")
AUTO = "auto"


@dataclass
class MultusOptions:
    host_root: Path = Path("/")
    socket: str = DEFAULT_SOCKET
    """Path of the socket on the node (under the Host root)."""
    cni_conf_dir: str = "/etc/cni/net.d"
    cni_bin_dir: str = "/opt/cni/bin"
    multus_conf_file: str = AUTO
    """`auto`, or the file (a path in the container) to write as 00-multus.conf."""
    multus_kubeconfig: str = ""
    """`kubeconfig` written into a generated 00-multus.conf (where upstream's Multus finds
    one on the node); the daemon itself uses `kubeconfig`."""
    kubeconfig: Path | None = None
    """The daemon's API access; in-cluster when unset."""
    cleanup_config_on_exit: bool = False
    pod_resources_socket: str = POD_RESOURCES_SOCKET
    health_port: int = 0
    """Port of /metrics, /healthz and /readyz on the pod's IP; 0: off."""
    poll_interval: float = 1.0
    workers: int = 32


def capabilities_of(network: Obj) -> dict[str, bool]:
    """The capabilities a config (or any plugin of a list) declares."""
    plugins = network.get("plugins") if "plugins" in network else [network]
    out: dict[str, bool] = {}
    for plugin in plugins if isinstance(plugins, list) else []:
        caps = plugin.get("capabilities") if isinstance(plugin, dict) else None
        for name, on in (caps or {}).items() if isinstance(caps, dict) else ():
            if on is True:
                out[name] = True
    return out


def generated_conf(delegate: Obj, kubeconfig: str = "") -> Obj:
    """00-multus.conf around the default network `delegate`: its version, its capabilities
    (so the runtime passes their values, which reach the delegate)."""
    conf: Obj = {"cniVersion": delegate.get("cniVersion") or "1.0.0", "name": CONF_NAME,
                 "type": "multus"}
    if caps := capabilities_of(delegate):
        conf["capabilities"] = caps
    if kubeconfig:
        conf["kubeconfig"] = kubeconfig
    conf["delegates"] = [delegate]
    return conf


def find_default_network(conf_dir: Path) -> tuple[Path, Obj] | None:
    """The first config of `conf_dir` that is not Multus' own, with its JSON."""
    try:
        names = sorted(os.listdir(conf_dir))
    except OSError:
        return None
    for name in names:
        path = conf_dir / name
        if name == CONF_FILE or name.startswith(".") or not name.endswith(CONF_SUFFIXES) \
                or not path.is_file():
            continue
        try:
            network = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            log.warning("skipping %s: not a CNI config (%s)", path, e)
            continue
        if not isinstance(network, dict) or network.get("type") == "multus" or not (
                network.get("type") or network.get("plugins")):
            continue
        return path, network
    return None


class MultusDaemon:
    """The `multus` plugin of one node behind one socket, and its 00-multus.conf. A `client`
    and `devices` may be given (else: from `kubeconfig` or in-cluster, and the kubelet's
    PodResources socket)."""

    def __init__(self, options: MultusOptions, client: ApiClient | None = None,
                 devices: Devices | None = None, extra_env: dict[str, str] | None = None
                 ) -> None:
        self.options = options
        self.host = Host.in_container(options.host_root)
        self.conf_path = self.host.path(options.cni_conf_dir) / CONF_FILE
        self._client = client
        self._owns_client = client is None
        self.devices = devices or PodResources(self.host.path(options.pod_resources_socket))
        self.extra_env = extra_env
        self.plugin: MultusPlugin | None = None
        self.server: CniServer | None = None
        self.written: str | None = None
        self._problem: str | None = None

    def _report(self, problem: str | None) -> None:
        """Log why there is no 00-multus.conf to write, once per reason."""
        if problem and problem != self._problem:
            log.warning("%s", problem)
        self._problem = problem

    # ------------------------------------------------------------------ 00-multus.conf
    def desired_conf(self) -> tuple[str, Path] | None:
        """The text 00-multus.conf should hold now and the file it comes from; None while
        there is nothing to write."""
        given = self.options.multus_conf_file
        if given != AUTO:
            real = Host.in_container().path(given)
            try:
                text = real.read_text()
                if not isinstance(json.loads(text), dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                self._report(f"cannot use --multus-conf-file {given}: {e}")
                return None
            return text, real
        conf_dir = self.host.path(self.options.cni_conf_dir)
        found = find_default_network(conf_dir)
        if found is None:
            self._report(f"waiting for the default network's config in {conf_dir}")
            return None
        path, network = found
        conf = generated_conf(network, self.options.multus_kubeconfig)
        return json.dumps(conf, indent=2) + "\n", path

    def sync_conf(self) -> bool:
        """Write 00-multus.conf when it differs from what it should be; whether it is there."""
        desired = self.desired_conf()
        if desired is None:
            return self.written is not None and self.conf_path.exists()
        self._report(None)
        text, source = desired
        try:
            current = self.conf_path.read_text()
        except OSError:
            current = None
        if current != text:
            self.conf_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.conf_path.with_name(f".{CONF_FILE}.tmp")
            tmp.write_text(text)
            os.replace(tmp, self.conf_path)
            log.info("wrote %s from %s", self.conf_path, source)
        self.written = text
        return True

    # ------------------------------------------------------------------ running
    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; ready while serving with 00-multus.conf written."""
        client = self._client or ApiClient(self.options.kubeconfig)
        self.plugin = MultusPlugin(client, self.host, self.devices,
                                   cni_bin_dir=self.options.cni_bin_dir,
                                   extra_env=self.extra_env)
        sweep_temp(self.host, CACHE_DIR)
        self.server = CniServer({"multus": self.plugin}, self.host.path(self.options.socket),
                                name="nicop multus-daemon", workers=self.options.workers,
                                logger=log)
        readiness = Readiness()
        health = None
        try:
            await self.server.start()
            health = await serve_metrics(self.options.health_port)
            while not stop.is_set():
                ready = await asyncio.to_thread(self.sync_conf)
                readiness.set(ready, "" if ready else "no 00-multus.conf yet")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.options.poll_interval)
        finally:
            readiness.clear()
            if self.options.cleanup_config_on_exit and self.written is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.conf_path.unlink()
                    log.info("removed %s", self.conf_path)
            if health is not None:
                health.close()
            await self.server.close()
            if self._owns_client:
                await client.close()
