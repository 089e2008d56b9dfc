"""A real node of the local cluster: a real kubelet with containerd and runc, running nicop's
image, on simulated NIC hardware.

The node is a network namespace and a mount namespace of its own, made by one process (`run`,
`python -m nicop_sim.realnode`), which then starts containerd and the kubelet in them:

- Network: a veth pair, `eth0` of the node with the node's address (the Node's InternalIP, where
  the API server reaches the kubelet), and this machine's end. The API server listens on this
  machine's loopback; listeners in the node (127.0.0.1:<port> for the kubelet, the `kubernetes`
  Service's 10.96.0.1:443 for pods) carry connections to it (`nicop_sim.forward`). Pods get a
  bridge (containernetworking's bridge and host-local plugins) as their primary network.
- Files: /etc, /opt, /var and /usr/lib are this machine's with the node's writes kept in its
  state directory (overlays), /run and /tmp its own, containerd's store its own directory. /sys
  is the node's simulated hardware tree (`nicop_sim.hardware`: PCI functions, net, infiniband
  classes, modules) with this machine's cgroups, CPUs and kernel entries bound into it;
  /dev/infiniband and /lib/modules are the tree's, with real character device nodes.
- Containers see what the node sees: containerd's base runtime spec gives every container the
  node's /sys instead of a fresh sysfs, and, as a GPU node's container toolkit injects its
  driver, the simulated hardware's interface: its tree (/run/nicop-sim/root), nicop-sim's
  platform (/run/nicop-sim/site, $NICOP_PLATFORM=sim). Nothing in nicop's image or DaemonSets
  knows the node is simulated.
- Processes: a cgroup of their own, the kubelet's cgroupRoot, so the node's pods live under it
  and `stop` finds every process of the node there.
- Kernel settings: the kubelet sets vm.overcommit_memory, kernel.panic_on_oops and others at
  start; the node's /proc/sys shows it files with the values it wants, so this machine's stay.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import hashlib
import io
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from nicop_sim import forward, namespaces
from nicop_sim.namespaces import CLONE_NEWNET, CLONE_NEWNS

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
SERVICE_IP = "10.96.0.1"
# The kubelet's kernel tunables (pkg/kubelet/cm/container_manager_linux.go setupKernelTunables),
# with the values it wants: shown to it in place of this machine's.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
OVERLAID = ("/etc", "/opt", "/var", "/usr/lib")
# What of this machine's sysfs the node's /sys carries besides the simulated tree.
REAL_SYS = ("devices/system", "devices/virtual", "kernel", "firmware", "block", "dev",
            "class/block", "bus/cpu", "bus/node")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
SIM_IN_CONTAINERS = "/run/nicop-sim"
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


@dataclass(frozen=True)
class RealNode:
    """Where a real node keeps everything, and the names it goes by on this machine."""

    name: str
    state: Path  # <cluster state>/r/<node>
    tree: Path  # the simulated hardware (and kernel) tree
    cluster_digest: str
    index: int

    @property
    def netns(self) -> str:
        return f"nicop-{self.cluster_digest}-{self.name}"

    @property
    def host_veth(self) -> str:
        return f"nr{self.cluster_digest[:4]}{self.index}"[:15]

    @property
    def subnet(self) -> int:
        """The third octet of the node's addresses (10.250.x.0/30, pods 10.245.x.0/24)."""
        return (int(self.cluster_digest, 16) + self.index) % 250 + 1

    @property
    def address(self) -> str:
        return f"10.250.{self.subnet}.2"

    @property
    def gateway(self) -> str:
        return f"10.250.{self.subnet}.1"

    @property
    def cgroup(self) -> str:
        return f"nicop-{self.cluster_digest}-{self.name}"

    def cgroup_dirs(self) -> list[Path]:
        """The node's cgroup in every hierarchy this machine mounts."""
        if not CGROUP_ROOT.exists():
            return []
        return [CGROUP_ROOT / h / self.cgroup for h in sorted(os.listdir(CGROUP_ROOT))
                if (CGROUP_ROOT / h / "cgroup.procs").exists()]


# ---------------------------------------------------------------------------------- prepare

def prepare(node: RealNode, *, server_port: int, pki_dir: Path, profile: str,
            labels: dict[str, str], runtime_bin: Path, kubelet: Path, image: Path) -> list[str]:
    """Write the node's configuration (kubelet, containerd, CNI, the kubelet's kernel tunables)
    and its identity; returns the argv that runs it."""
    from nicop_sim import hardware
    from nicop_sim.node import build_tree, seed_of
    from nicop_sim.pki import CertificateAuthority

    s = node.state
    if any(s.resolve().is_relative_to(d) for d in (*OVERLAID, "/run", "/dev", "/sys")):
        raise ValueError(f"a real node's state cannot be under {', '.join(OVERLAID)} or /run "
                         f"(the node mounts its own there): {s}")
    for d in ("etc", "sysctl", "containerd", "mnt", "logs"):
        (s / d).mkdir(parents=True, exist_ok=True)
    build_tree(node.tree, hardware.PROFILES[profile], seed_of(node.name))
    ca = CertificateAuthority(pki_dir)
    pair = ca.issue(f"kubelet-{node.name}", f"system:node:{node.name}", "system:masters")
    (s / "etc/kubelet.kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "nicop", "cluster": {
            "server": f"https://127.0.0.1:{server_port}",
            "certificate-authority-data": _b64(ca.pair.cert)}}],
        "users": [{"name": node.name, "user": {"client-certificate-data": _b64(pair.cert),
                                               "client-key-data": _b64(pair.key)}}],
        "contexts": [{"name": "nicop", "context": {"cluster": "nicop", "user": node.name}}],
        "current-context": "nicop"}))
    shutil.copy(ca.pair.cert, s / "etc/ca.crt")
    (s / "etc/kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(node, s / "etc/ca.crt")))
    (s / "etc/containerd.toml").write_text(containerd_config(runtime_bin))
    (s / "etc/10-nicop-pods.conflist").write_text(json.dumps(pod_network(node), indent=2))
    for key, value in KUBELET_SYSCTLS.items():
        (s / "sysctl" / key.replace("/", ".")).write_text(value + "\n")
    _sim_site(s / "site")
    return [sys.executable, "-m", "nicop_sim.realnode", "--state", str(s), "--tree",
            str(node.tree), "--name", node.name, "--digest", node.cluster_digest,
            "--index", str(node.index), "--server-port", str(server_port),
            "--runtime-bin", str(runtime_bin), "--kubelet", str(kubelet), "--image", str(image),
            "--labels", json.dumps(labels)]


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubelet_config(node: RealNode, ca: Path) -> dict[str, Any]:
    """A kubelet for this machine: cgroupfs under the node's own cgroup (cgroup v1 allowed),
    anonymous and always-allow on its API (only the API server reaches it), no eviction for
    this machine's disk, no iptables."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{node.cgroup}", "failCgroupV1": False,
        "failSwapOn": False, "protectKernelDefaults": False,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": node.address, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "0%",
                         "imagefs.available": "0%", "nodefs.inodesFree": "0%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "makeIPTablesUtilChains": False,
        "nodeStatusReportFrequency": "10s", "nodeStatusUpdateFrequency": "10s",
        "syncFrequency": "10s", "fileCheckFrequency": "10s",
    }


def containerd_config(runtime_bin: Path) -> str:
    """containerd 2 with runc (cgroupfs), CDI, the overlayfs snapshotter and the node's base
    runtime spec; its oom_score_adj limited (this machine grants no CAP_SYS_RESOURCE)."""
    cri = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[{cri}]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  restrict_oom_score_adj = true
  disable_apparmor = true

[{cri}.containerd]
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "/etc/nicop-node/base-spec.json"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{runtime_bin / 'runc'}"
  SystemdCgroup = false

[{cri}.cni]
  bin_dirs = ["/opt/cni/bin"]
  conf_dir = "/etc/cni/net.d"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"
"""


def pod_network(node: RealNode) -> dict[str, Any]:
    """The primary network: a bridge, addresses from the node's /24, default route through it
    (so pods reach the `kubernetes` Service address, which the node holds)."""
    return {"cniVersion": "1.0.0", "name": "nicop-pods", "plugins": [{
        "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": f"10.245.{node.subnet}.0/24"}]],
                 "routes": [{"dst": "0.0.0.0/0"}]}}]}


def _sim_site(site: Path) -> None:
    """nicop-sim's platform as containers import it: the package and its entry points."""
    if site.exists():
        shutil.rmtree(site)
    package = Path(__file__).parent
    shutil.copytree(package, site / "nicop_sim", ignore=shutil.ignore_patterns("__pycache__"))
    dist = metadata.distribution("nicop-sim")
    info = site / f"nicop_sim-{dist.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nicop-sim\n"
                                   f"Version: {dist.version}\n")
    (info / "entry_points.txt").write_text(dist.read_text("entry_points.txt") or "")


# ---------------------------------------------------------------------------------- images

def pause_archive(binary: Path, out: Path, ref: str) -> Path:
    """An OCI archive of the pause image: the static pause binary as /pause."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        data = binary.read_bytes()
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    raw = layer.getvalue()
    packed = gzip.compress(raw, mtime=0)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(raw).hexdigest()}"]},
    }).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _descriptor("application/vnd.oci.image.config.v1+json", config),
        "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar+gzip", packed)],
    }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        **_descriptor("application/vnd.oci.image.manifest.v1+json", manifest),
        "annotations": {"org.opencontainers.image.ref.name": ref}}]}).encode()
    with tarfile.open(out, "w") as tar:
        for name, blob in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
                           ("index.json", index),
                           *((f"blobs/sha256/{hashlib.sha256(b).hexdigest()}", b)
                             for b in (config, packed, manifest))):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return out


def _descriptor(media_type: str, blob: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
            "size": len(blob)}


# ---------------------------------------------------------------------------------- run

class NodeProcess:
    """The process that is the node: namespaces, mounts, forwarding, containerd, kubelet."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.node = RealNode(args.name, Path(args.state), Path(args.tree), args.digest,
                             args.index)
        self.server_port = args.server_port
        self.runtime_bin = Path(args.runtime_bin)
        self.kubelet = Path(args.kubelet)
        self.image = Path(args.image)
        self.labels: dict[str, str] = json.loads(args.labels)
        self.netns_path = Path("/run/netns") / self.node.netns
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self._netns_fd = -1
        self._host_mounts: str | None = None
        self._imported = False

    # ------------------------------------------------------------ set up
    def join_cgroup(self) -> None:
        for d in self.node.cgroup_dirs():
            d.mkdir(exist_ok=True)
            if d.parent.name == "cpuset" or (d.parent / "cpuset.cpus").exists():
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (d / f).exists() and not (d / f).read_text().strip():
                        (d / f).write_text((d.parent / f).read_text())
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def make_network(self) -> None:
        n, ns = self.node, self.node.netns
        cleanup_network(n)
        ip("netns", "add", ns)
        ip("link", "add", n.host_veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("addr", "add", f"{n.gateway}/30", "dev", n.host_veth)
        ip("link", "set", n.host_veth, "up")
        ip("-n", ns, "addr", "add", f"{n.address}/30", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
        ip("-n", ns, "route", "add", "default", "via", n.gateway)
        self._netns_fd = os.open(self.netns_path, os.O_RDONLY)
        # The node mounts its own /run: its namespace is reached through this descriptor.
        self.netns_path = Path(f"/proc/{os.getpid()}/fd/{self._netns_fd}")

    def make_mounts(self) -> None:
        s, tree = self.node.state, self.node.tree
        fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
        self._host_mounts = f"/proc/{os.getpid()}/fd/{fd}"
        namespaces.unshare(CLONE_NEWNS)
        namespaces.mount("--make-rprivate", "/")
        # This machine's cgroups and a sysfs of the node's network namespace, before /sys is
        # replaced by the tree.
        namespaces.bind("/sys/fs/cgroup", s / "mnt/cgroup", recursive=True)
        (s / "mnt/sys").mkdir(exist_ok=True)
        with namespaces.in_netns(self.netns_path):
            namespaces.mount("-t", "sysfs", "sysfs", str(s / "mnt/sys"))
        for path in OVERLAID:
            namespaces.overlay(path, s / "fs" / path.strip("/").replace("/", "-"))
        namespaces.mount("-t", "tmpfs", "tmpfs", "/run")
        Path("/var/lib/containerd").mkdir(parents=True, exist_ok=True)
        namespaces.bind(s / "containerd", "/var/lib/containerd")
        namespaces.overlay("/dev", s / "fs/dev")
        for sub in ("pts", "shm", "mqueue"):
            with contextlib.suppress(OSError):
                namespaces.mount("-t", {"pts": "devpts", "shm": "tmpfs",
                                        "mqueue": "mqueue"}[sub], sub, f"/dev/{sub}",
                                 *(["-o", "newinstance,ptmxmode=0666"] if sub == "pts" else []))
        namespaces.bind(tree / "dev/infiniband", "/dev/infiniband")
        (tree / "lib/modules").mkdir(parents=True, exist_ok=True)
        namespaces.bind(tree / "lib/modules", "/usr/lib/modules")
        for sub in REAL_SYS:
            if (s / "mnt/sys" / sub).exists():
                (tree / "sys" / sub).mkdir(parents=True, exist_ok=True)
        (tree / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)
        namespaces.bind(tree / "sys", "/sys")
        namespaces.bind(s / "mnt/cgroup", "/sys/fs/cgroup", recursive=True)
        for sub in REAL_SYS:
            if (s / "mnt/sys" / sub).exists():
                namespaces.bind(s / "mnt/sys" / sub, f"/sys/{sub}")
        for key in KUBELET_SYSCTLS:
            namespaces.bind(s / "sysctl" / key.replace("/", "."), f"/proc/sys/{key}")
        # Shared within the node (as systemd makes a node's mounts), for the Bidirectional
        # propagation of pods' mounts; private from this machine since the unshare above.
        namespaces.mount("--make-rshared", "/")
        self._install_files()

    def _install_files(self) -> None:
        s = self.node.state
        Path("/etc/cni/net.d").mkdir(parents=True, exist_ok=True)
        shutil.copy(s / "etc/10-nicop-pods.conflist", "/etc/cni/net.d/10-nicop-pods.conflist")
        Path("/opt/cni/bin").mkdir(parents=True, exist_ok=True)
        for plugin in CNI_PLUGINS:
            shutil.copy(self.runtime_bin / plugin, f"/opt/cni/bin/{plugin}")
        Path("/etc/nicop-node").mkdir(parents=True, exist_ok=True)
        Path("/etc/nicop-node/base-spec.json").write_text(json.dumps(self._base_spec()))
        # What a node's OS has that this machine may lack (kmod's /etc/modprobe.d: the driver
        # DaemonSet mounts a file there).
        for d in ("/var/run/cdi", "/etc/cdi", "/var/lib/kubelet", "/var/log/pods",
                  "/etc/modprobe.d", SIM_IN_CONTAINERS):
            Path(d).mkdir(parents=True, exist_ok=True)

    def _base_spec(self) -> dict[str, Any]:
        """containerd's default spec, with the node's /sys in place of a fresh sysfs and the
        simulated hardware's interface added (see the module's docstring)."""
        spec = json.loads(subprocess.run([str(self.runtime_bin / "ctr"), "oci", "spec"],
                                         capture_output=True, check=True).stdout)
        mounts = [m for m in spec["mounts"] if m["destination"] != "/sys"]
        # rslave: what a container mounts under them (runc's own /sys/fs/cgroup, a pod with
        # Bidirectional propagation makes its root rshared) never reaches the node.
        mounts.insert(0 if not mounts else 1, {
            "destination": "/sys", "type": "bind", "source": "/sys",
            "options": ["rbind", "rslave", "rw", "nosuid", "nodev"]})
        site = self.node.state / "site"
        mounts += [
            {"destination": f"{SIM_IN_CONTAINERS}/root", "type": "bind",
             "source": str(self.node.tree), "options": ["rbind", "rslave", "rw"]},
            {"destination": f"{SIM_IN_CONTAINERS}/site", "type": "bind",
             "source": str(site), "options": ["rbind", "rslave", "ro"]},
        ]
        spec["mounts"] = mounts
        env = spec["process"].get("env") or []
        spec["process"]["env"] = [*env, "NICOP_PLATFORM=sim",
                                  f"NICOP_SIM_ROOT={SIM_IN_CONTAINERS}/root",
                                  "NICOP_SIM_SCOPE=hardware",
                                  f"NICOP_PF_RECORDER={SIM_IN_CONTAINERS}/root/.sim/pf",
                                  f"PYTHONPATH={SIM_IN_CONTAINERS}/site"]
        return spec  # type: ignore[no-any-return]

    # ------------------------------------------------------------ processes
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        fd = self._netns_fd

        def in_node() -> None:
            namespaces.setns(fd, CLONE_NEWNET)
            namespaces.die_with_parent()

        log_file = open(self.node.state / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        self.children[name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            preexec_fn=in_node, env={**os.environ, **(env or {})})

    def start_containerd(self) -> None:
        path = f"{self.runtime_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        self._spawn("containerd", [str(self.runtime_bin / "containerd"), "--config",
                                   str(self.node.state / "etc/containerd.toml")],
                    env={"PATH": path})
        socket_path = Path("/run/containerd/containerd.sock")
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            self._check_alive("containerd")
            if time.monotonic() > deadline:
                raise RuntimeError("containerd did not open its socket in 60 s")
            time.sleep(0.1)
        if self._imported:
            return
        self._imported = True
        ctr = [str(self.runtime_bin / "ctr"), "--address", str(socket_path), "-n", "k8s.io"]
        pause = pause_archive(self.runtime_bin / "pause", self.node.state / "pause.oci.tar",
                              PAUSE_IMAGE.rsplit(":", 1)[1])
        for archive, base in ((pause, PAUSE_IMAGE.rsplit(":", 1)[0]),
                              (self.image, "docker.io/library/nicop")):
            subprocess.run([*ctr, "images", "import", "--base-name", base, str(archive)],
                           check=True, capture_output=True)

    def start_kubelet(self) -> None:
        labels = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        s = self.node.state
        self._spawn("kubelet", [
            str(self.kubelet), f"--config={s}/etc/kubelet.yaml",
            f"--kubeconfig={s}/etc/kubelet.kubeconfig", f"--hostname-override={self.node.name}",
            f"--node-ip={self.node.address}", f"--node-labels={labels}", "--v=2",
            f"--cert-dir={s}/kubelet-pki"])

    def _restart_exited(self) -> None:
        """As a node's init restarts a service that exited: kubelet or containerd, each time
        logged (a test stops the kubelet to see the device plugins register again)."""
        for name, start in (("containerd", self.start_containerd),
                            ("kubelet", self.start_kubelet)):
            proc = self.children[name]
            if proc.poll() is not None:
                log.warning("%s exited (%s); starting it again", name, proc.returncode)
                start()

    def _check_alive(self, name: str) -> None:
        proc = self.children[name]
        if proc.poll() is not None:
            tail = (self.node.state / "logs" / f"{name}.log").read_text(errors="replace")
            raise RuntimeError(f"{name} exited ({proc.returncode}):\n{tail[-3000:]}")

    # ------------------------------------------------------------ the node's kernel
    def sync_devices(self) -> None:
        """The tree's /dev/infiniband entries as character devices (the simulated kernel
        writes plain files; containers are given device nodes only)."""
        folder = self.node.tree / "dev/infiniband"
        for entry in os.listdir(folder) if folder.exists() else []:
            path = folder / entry
            if path.is_file() and not stat.S_ISCHR(path.stat().st_mode):
                number = int("".join(c for c in entry if c.isdigit()) or 0)
                minor = {"uverbs": 192, "umad": 0, "issm": 64}.get(entry.rstrip("0123456789"),
                                                                   254) + number
                path.unlink()
                os.mknod(path, stat.S_IFCHR, os.makedev(231, minor))
                path.chmod(0o666)

    async def run(self) -> None:
        self.join_cgroup()
        self.make_network()
        self.make_mounts()
        servers = await forward.serve(self.netns_path, [
            forward.Route(("127.0.0.1", self.server_port), ("127.0.0.1", self.server_port)),
            forward.Route((SERVICE_IP, 443), ("127.0.0.1", self.server_port))])
        self.start_containerd()
        self.start_kubelet()
        links = NodeLinks(self.node, self.netns_path)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("real node %s up in %s", self.node.name, self.node.netns)
        try:
            while not stop.is_set():
                self._restart_exited()
                self.sync_devices()
                links.sync()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            for server in servers:
                server.close()
            self.stop_children()

    def stop_children(self) -> None:
        for name in ("kubelet", "containerd"):
            proc = self.children.get(name)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
        stop(self.node, host_mounts=self._host_mounts)


class NodeLinks:
    """A link in the node's namespace for every Ethernet netdev of the tree, as the kernel
    makes them when a driver binds (veth ends named like the netdev, with its MAC). A link
    that left the namespace (a VF moved into a pod) is not made again while the tree has it."""

    def __init__(self, node: RealNode, netns_path: Path) -> None:
        self.node = node
        self.netns_path = netns_path  # /run/netns is the host's, not in the node's mounts
        self.made: dict[str, str] = {}

    def ip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", f"--net={self.netns_path}", "ip", *args],
                              capture_output=True, text=True, check=False)

    def sync(self) -> None:
        net = self.node.tree / "sys/class/net"
        present = {}
        for entry in os.listdir(net) if net.exists() else []:
            address = net / entry / "address"
            mac = address.read_text().strip() if address.exists() else ""
            if len(mac.split(":")) == 6:
                present[entry] = mac
        for name in sorted(set(self.made) - set(present)):
            self.ip("link", "del", name)
            del self.made[name]
        for name, mac in sorted(present.items()):
            if name in self.made:
                continue
            peer = f"sim{zlib.crc32(name.encode()):08x}"
            made = self.ip("link", "add", name, "address", mac, "type", "veth", "peer", "name",
                           peer)
            if made.returncode == 0:
                self.ip("link", "set", peer, "up")
                self.ip("link", "set", name, "up")
            else:
                log.warning("cannot make link %s: %s", name, made.stderr.strip())
            self.made[name] = mac


# ---------------------------------------------------------------------------------- stop

def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def cleanup_network(node: RealNode, host_mounts: str | None = None) -> None:
    """Remove the node's veth and namespace; `host_mounts`: this machine's mount namespace, for
    the node process (whose own /run hides /run/netns)."""
    enter = ["nsenter", f"--mount={host_mounts}"] if host_mounts else []
    for argv in (["ip", "link", "del", node.host_veth], ["ip", "netns", "del", node.netns]):
        subprocess.run([*enter, *argv], capture_output=True, check=False)


def stop(node: RealNode, host_mounts: str | None = None) -> None:
    """End every process of the node (its cgroup holds them all: kubelet, containerd, shims,
    containers), then remove its cgroups and network. Safe to repeat; the node process itself
    calls it last (it leaves its cgroup first)."""
    me = os.getpid()
    dirs = node.cgroup_dirs()
    for d in dirs:  # the caller, if inside, moves to the top so the cgroup can go
        if str(me) in _read(d / "cgroup.procs").split():
            (d.parent / "cgroup.procs").write_text(str(me))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = {int(p) for d in dirs for f in d.rglob("cgroup.procs") if d.exists()
                for p in _read(f).split()}
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    for d in dirs:
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()),
                          key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                sub.rmdir()
        with contextlib.suppress(OSError):
            d.rmdir()
    cleanup_network(node, host_mounts)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description="A real node of nicop's local cluster.")
    for flag in ("--state", "--tree", "--name", "--digest", "--runtime-bin", "--kubelet",
                 "--image", "--labels"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--server-port", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(NodeProcess(args).run())


if __name__ == "__main__":
    main()
