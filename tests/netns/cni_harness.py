"""Drive the CNI plugins the way a container runtime does: real network namespaces, veth pairs
standing in for VF netdevs, a simulated sysfs tree naming them, the installed plugin executables.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nicop.cni.daemon import CniDaemon, DaemonOptions
from nicop.cni.install import install
from nicop.cni.netlink import Netns, get_link
from nicop.platform import PLATFORM_ENV
from nicop_sim.hardware import Nic, Profile, SimulatedHost
from nicop_sim.pf import RecordingRdmaControl, RecordingVfControl
from nicop_sim.platform import PF_ENV

SOCKET = "/run/nicop/cni.sock"
POD_ARGS = "IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"

# ------------------------------------------------------------------ the CNI spec, as checks

INTERFACE_10 = {"name": str, "mac": str, "sandbox": str}
INTERFACE_11 = {**INTERFACE_10, "mtu": int, "socketPath": str, "pciID": str}
ROUTE_10 = {"dst": str, "gw": str}
ROUTE_11 = {**ROUTE_10, "mtu": int, "advmss": int, "priority": int, "table": int, "scope": int}
DNS = {"nameservers": list, "domain": str, "search": list, "options": list}


def _fields(where: str, obj: Any, allowed: dict[str, type], required: tuple[str, ...]) -> None:
    assert isinstance(obj, dict), f"{where} must be an object: {obj!r}"
    for key, value in obj.items():
        assert key in allowed, f"{where}: field {key!r} is not in this spec version"
        assert isinstance(value, allowed[key]), f"{where}.{key}: {value!r} is not {allowed[key]}"
    for key in required:
        assert key in obj, f"{where}: required field {key!r} missing"


def validate_result(result: Any, version: str, *, ipam_only: bool = False) -> None:
    """Assert that `result` is an ADD result as the CNI spec of `version` (1.0.0/1.1.0) defines,
    with the 1.1.0 fields allowed in 1.0.0 too: the Go library writes both from one type."""
    new = version in ("1.0.0", "1.1.0")
    _fields("result", result, {"cniVersion": str, "interfaces": list, "ips": list,
                               "routes": list, "dns": dict}, ("cniVersion",))
    assert result["cniVersion"] == version
    interfaces = result.get("interfaces", [])
    assert not (ipam_only and interfaces), "IPAM plugins return no interfaces"
    for i, iface in enumerate(interfaces):
        _fields(f"interfaces[{i}]", iface, INTERFACE_11 if new else INTERFACE_10, ("name",))
        if "mac" in iface:
            assert len(iface["mac"].split(":")) in (6, 20), iface["mac"]
    for i, ip in enumerate(result.get("ips", [])):
        _fields(f"ips[{i}]", ip, {"address": str, "gateway": str, "interface": int},
                ("address",))
        ipaddress.ip_interface(ip["address"])
        assert "/" in ip["address"], "address must be in CIDR notation"
        if "gateway" in ip:
            ipaddress.ip_address(ip["gateway"])
        if "interface" in ip:
            assert not ipam_only, "IPAM results carry no interface index"
            assert 0 <= ip["interface"] < len(interfaces), "interface index out of range"
    for i, route in enumerate(result.get("routes", [])):
        _fields(f"routes[{i}]", route, ROUTE_11 if new else ROUTE_10, ("dst",))
        ipaddress.ip_network(route["dst"])
        if "gw" in route:
            ipaddress.ip_address(route["gw"])
    _fields("dns", result.get("dns", {}), DNS, ())


def validate_error(out: Any, version: str) -> None:
    _fields("error", out, {"cniVersion": str, "code": int, "msg": str, "details": str},
            ("code", "msg"))
    assert out.get("cniVersion", version) == version


# ------------------------------------------------------------------ namespaces

def prefix() -> str:
    return "nt" + uuid.uuid4().hex[:6]


class Namespaces:
    """Named network namespaces, all deleted by close() (deleting one destroys its veths)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def add(self, name: str) -> str:
        subprocess.run(["ip", "netns", "add", name], check=True)
        self.names.append(name)
        return f"/run/netns/{name}"

    def close(self) -> None:
        for name in reversed(self.names):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        self.names.clear()


def links(netns: str) -> dict[str, dict[str, Any]]:
    """`ip -j link` of a namespace, by name."""
    out = subprocess.run(["ip", "-n", os.path.basename(netns), "-j", "link", "show"], check=True,
                         capture_output=True, text=True).stdout
    return {link["ifname"]: link for link in json.loads(out)}


def addresses(netns: str, ifname: str) -> list[str]:
    out = subprocess.run(["ip", "-n", os.path.basename(netns), "-j", "addr", "show", "dev",
                          ifname], check=True, capture_output=True, text=True).stdout
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(out)
            for a in link.get("addr_info", [])]


def routes(netns: str, family: str = "-4") -> list[dict[str, Any]]:
    out = subprocess.run(["ip", family, "-n", os.path.basename(netns), "-j", "route", "show"],
                         check=True,
                         capture_output=True, text=True).stdout
    return list(json.loads(out))


# ------------------------------------------------------------------ a node

@dataclass
class Vf:
    pci: str
    netdev: str
    index: int
    mac: str = ""


@dataclass
class CniCall:
    rc: int
    out: Any
    stdout: bytes
    seconds: float


@dataclass
class Node:
    """A simulated node: sysfs tree, its own namespace with one veth per VF, the plugins."""

    root: Path
    host: SimulatedHost
    name: str
    netns: str
    pf: str
    vfs: list[Vf]
    bin_dir: Path
    namespaces: Namespaces
    daemon: DaemonThread | DaemonProcess | None = None
    pools: dict[str, Any] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.host.path(SOCKET)

    @property
    def netns_name(self) -> str:
        return self.name

    def options(self) -> DaemonOptions:
        return DaemonOptions(
            host_root=self.root, socket=SOCKET, host_netns=self.netns,
            vfs=RecordingVfControl(self.pf_dir), rdma=RecordingRdmaControl(self.pf_dir),
            pools_file=self.root / "pools.json", workers=64,
        )

    @property
    def pf_dir(self) -> Path:
        """Where the node's simulated PFs keep their VF settings (nicop_sim.pf)."""
        return self.root / "pf"

    def write_pools(self, pools: dict[str, Any]) -> None:
        self.pools = pools
        tmp = self.root / "pools.json.tmp"
        tmp.write_text(json.dumps(pools))
        tmp.replace(self.root / "pools.json")

    def pod(self, name: str | None = None) -> str:
        """A new pod network namespace; returns its path."""
        return self.namespaces.add(name or f"{self.name}-p{uuid.uuid4().hex[:6]}")

    def cni(self, plugin: str, command: str, config: dict[str, Any], *, container_id: str = "c1",
            ifname: str = "net1", netns: str = "", pod: str = "pod1", args: str | None = None,
            env: dict[str, str] | None = None) -> CniCall:
        """Run an installed plugin as a runtime does: CNI_* in the environment, config on
        stdin; the JSON it prints is parsed."""
        call_env = {
            "CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
            "CNI_IFNAME": ifname, "CNI_PATH": str(self.bin_dir),
            "CNI_ARGS": POD_ARGS.format(pod=pod) if args is None else args,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        }
        call_env.update(env or {})
        start = time.perf_counter()
        proc = subprocess.run([str(self.bin_dir / plugin)], input=json.dumps(config).encode(),
                              env=call_env, capture_output=True, timeout=120, check=False)
        seconds = time.perf_counter() - start
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
        return CniCall(proc.returncode, out, proc.stdout, seconds)

    def store(self) -> dict[str, Any]:
        path = self.host.path("/var/lib/cni/nv-ipam/store")
        return json.loads(path.read_text()) if path.exists() else {"pools": {}}

    def allocations(self) -> dict[str, str]:
        """`<pool>/<container>_<ifname>` -> address, from the node-local store on disk."""
        return {f"{pool}/{key}": entry["ip_address"]
                for pool, p in self.store()["pools"].items()
                for key, entry in p["entries"].items()}

    def cache_files(self) -> list[str]:
        base = self.host.path("/var/lib/cni")
        return sorted(str(p.relative_to(base)) for p in base.rglob("*")
                      if p.is_file() and "nv-ipam" not in p.parts)

    def pf_calls(self) -> list[str]:
        path = self.root / "pf" / f"{self.pf}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def set_vf_state(self, vf: int, **state: Any) -> None:
        """What the simulated PF reports for VF `vf` before any plugin touches it (its
        `ip link show <pf>` line): VfState fields such as mac, vlan, spoofchk."""
        path = self.root / "pf" / f"{self.pf}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        states = json.loads(path.read_text()) if path.exists() else {}
        states[str(vf)] = {**states.get(str(vf), {}), **state}
        path.write_text(json.dumps(states))

    def vf_state(self, vf: int) -> dict[str, Any]:
        path = self.root / "pf" / f"{self.pf}.json"
        return dict(json.loads(path.read_text()).get(str(vf), {})) if path.exists() else {}

    def cache(self, plugin_dir: str, container_id: str = "c1", ifname: str = "net1") -> Any:
        """The netconf a plugin cached for DEL (/var/lib/cni/<plugin_dir>/<cid>-<ifname>)."""
        path = self.host.path(f"/var/lib/cni/{plugin_dir}/{container_id}-{ifname}")
        return json.loads(path.read_text()) if path.exists() else None

    def ipam_stand_in(self, name: str, result: dict[str, Any] | None = None) -> IpamStandIn:
        """An IPAM plugin in CNI_PATH that logs its calls and answers ADD with `result`."""
        return IpamStandIn(self.bin_dir, name, result or {})


IPAM_SCRIPT = """#!/bin/sh
d="$(dirname "$0")"
echo "$CNI_COMMAND $CNI_CONTAINERID $CNI_IFNAME" >> "$d/{name}.calls"
cat > /dev/null
if [ -p "$d/{name}.$CNI_COMMAND.gate" ]; then
  touch "$d/{name}.$CNI_COMMAND.waiting"
  cat "$d/{name}.$CNI_COMMAND.gate" > /dev/null
fi
if [ "$CNI_COMMAND" = ADD ]; then cat "$d/{name}.result"; fi
"""


class IpamStandIn:
    """A shell IPAM plugin: appends `COMMAND container ifname` to `<name>.calls`, prints a
    fixed ADD result, and can be held inside a command until the test lets it go."""

    def __init__(self, bin_dir: Path, name: str, result: dict[str, Any]) -> None:
        self.bin_dir, self.name = bin_dir, name
        script = bin_dir / name
        script.write_text(IPAM_SCRIPT.format(name=name))
        script.chmod(0o755)
        (bin_dir / f"{name}.result").write_text(json.dumps(result))

    def calls(self) -> list[str]:
        path = self.bin_dir / f"{self.name}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def hold(self, command: str) -> None:
        """The next `command` call waits (a FIFO it reads) until release()."""
        os.mkfifo(self.bin_dir / f"{self.name}.{command}.gate")

    def wait_held(self, command: str, timeout: float = 30) -> None:
        marker = self.bin_dir / f"{self.name}.{command}.waiting"
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert time.monotonic() < deadline, f"{self.name} {command} was never called"
            time.sleep(0.01)

    def release(self, command: str) -> None:
        gate = self.bin_dir / f"{self.name}.{command}.gate"
        fd = os.open(gate, os.O_WRONLY)  # the held call has it open for reading
        os.close(fd)
        gate.unlink()


def build_node(namespaces: Namespaces, vfs: int = 8, name: str | None = None) -> Node:
    """A node with one single-port ConnectX whose `vfs` VFs are veths in the node namespace."""
    name = name or prefix()
    root = Path(tempfile.mkdtemp(prefix="cni-", dir="/tmp"))
    nic = Nic(model="ConnectX-6 Dx", device_id="101d", ports=1, link_type="eth", bus=0x3B,
              total_vfs=max(vfs, 1))
    host = SimulatedHost.build(root, Profile("test", "netns test node", (nic,)))
    pf_pci = host.pfs()[0]
    host.set_numvfs(pf_pci, vfs)
    pf = host.netdev(pf_pci) or ""
    netns = namespaces.add(name)
    node_vfs = []
    with Netns(netns) as ns, ns.ipr() as ipr:
        for i, pci in enumerate(host.vfs(pf_pci)):
            netdev = host.netdev(pci) or ""
            ipr.link("add", ifname=netdev, kind="veth", peer=f"peer{i}")
            link = get_link(ipr, netdev)
            node_vfs.append(Vf(pci, netdev, i, link.mac if link else ""))
    bin_dir = root / "opt/cni/bin"
    install(bin_dir, str(host.path(SOCKET)), sys.executable)
    node = Node(root, host, name, netns, pf, node_vfs, bin_dir, namespaces)
    node.write_pools({"pool1": {"subnet": "10.10.0.0/16", "startIP": "10.10.1.1",
                                "endIP": "10.10.1.250", "gateway": "10.10.0.1",
                                "routes": [{"dst": "10.200.0.0/16"}]}})
    return node


def remove_node(node: Node) -> None:
    if node.daemon is not None:
        node.daemon.stop()
    shutil.rmtree(node.root, ignore_errors=True)


@contextlib.contextmanager
def node_with_daemon(vfs: int = 8) -> Iterator[Node]:
    namespaces = Namespaces()
    node = None
    try:
        node = build_node(namespaces, vfs)
        node.daemon = DaemonThread(node.options())
        node.daemon.start()
        yield node
    finally:
        if node is not None:
            remove_node(node)
        namespaces.close()


# ------------------------------------------------------------------ the daemon

class DaemonThread:
    """`nicop cni-daemon` in this process, on its own event loop thread."""

    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.daemon: CniDaemon | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.daemon = CniDaemon(self.options)
            task = asyncio.create_task(self.daemon.run(self._stop))
            while not self.daemon.server.serving and not task.done():
                await asyncio.sleep(0.01)
            self._ready.set()
            await task

        try:
            asyncio.run(main())
        except BaseException as e:
            self._error = e
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """Stop the daemon; if it crashed after starting, that fails the test that ran it."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        if self._error is not None:
            raise self._error


class DaemonProcess:
    """`nicop cni-daemon` as its own process, which a test can kill."""

    def __init__(self, node: Node, log: Path) -> None:
        self.node = node
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        o = self.node.options()
        with contextlib.suppress(FileNotFoundError):
            self.node.socket.unlink()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "nicop", "cni-daemon", "--host-root", str(o.host_root),
                 "--socket", o.socket, "--host-netns", str(o.host_netns), "--pools-file",
                 str(o.pools_file), "--no-api"],
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, PLATFORM_ENV: "sim", PF_ENV: str(self.node.pf_dir)},
            )
        deadline = time.monotonic() + 30
        while not self.node.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"cni-daemon did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
