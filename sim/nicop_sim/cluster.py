"""The local control plane: real etcd, kube-apiserver, controller-manager, scheduler and kwok.

Every process runs on loopback ports chosen at start, with its state (certificates, etcd data,
logs, the kubeconfig, the PIDs) in one directory, so `down` can stop what `up` started from
another shell, and a second `up` reuses the cluster's data. The pytest fixture uses the same
class with `die_with_parent`, so the processes end with the test run however it ends.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from nicop_sim import hardware, namespaces, realnode
from nicop_sim.pki import CertificateAuthority, KeyPair, service_account_keys

# The audit log holds who wrote what (a user agent names the nicop command: a test asks whether
# `nicop plan` wrote anything); the nodes' own heartbeats and kwok's pod status are left out.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
omitManagedFields: true
rules:
- level: None
  resources:
  - {group: coordination.k8s.io, resources: [leases]}
  - {group: "", resources: [events, nodes/status, pods/status]}
  - {group: events.k8s.io, resources: [events]}
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
"""
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
HOST = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
MAX_NODES_DIR = 40  # longer, and socket paths under a node's tree may pass 107 bytes
BUILD_HINT = "build it with `make controlplane` (hack/build-controlplane.sh) or pass --bin-dir"

Progress = Callable[[str], None]


class ClusterError(Exception):
    """A problem the user can fix; the message says what and how."""


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(os.environ.get("NICOP_CLUSTER_DIR", Path(base) / "nicop" / "cluster"))


def default_bin_dir() -> Path:
    """Where hack/build-controlplane.sh left the binaries (it keeps a `current` link)."""
    if env := os.environ.get("NICOP_CONTROLPLANE_BIN"):
        return Path(env)
    return cache_dir() / "controlplane" / "current" / "bin"


def cache_dir() -> Path:
    """Where the hack/build-*.sh scripts keep what they build, once per machine."""
    return Path(os.environ.get("NICOP_CACHE", Path.home() / ".cache" / "nicop"))


def default_runtime_dir() -> Path:
    """Where hack/build-runtime.sh left containerd, runc, crictl and the CNI plugins."""
    return cache_dir() / "runtime" / "current" / "bin"


def default_image() -> Path:
    """The OCI archive hack/build-image.sh made of this version of nicop."""
    from importlib.metadata import version

    return cache_dir() / "image" / "current" / f"nicop-{version('nicop')}.oci.tar"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def _process_alive(pid: int, binary: str) -> bool:
    """True when `pid` is running `binary` (a recycled PID running something else is not ours)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return bool(cmdline) and cmdline[0].decode(errors="replace") == binary


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


@dataclass
class Process:
    name: str
    pid: int
    binary: str
    log: str
    die_with_parent: bool = False

    def alive(self) -> bool:
        return _process_alive(self.pid, self.binary)


@dataclass
class State:
    """What `up` recorded: ports (reused by the next `up`) and processes."""

    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, Process] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> State:
        if not path.exists():
            return cls()
        raw = json.loads(path.read_text())
        return cls(
            ports=raw.get("ports", {}),
            processes={k: Process(**v) for k, v in raw.get("processes", {}).items()},
        )

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "ports": self.ports,
                    "processes": {k: vars(v) for k, v in self.processes.items()},
                },
                indent=2,
            )
        )
        tmp.replace(path)


@dataclass(frozen=True)
class Agent:
    """A process a node stand-in runs for a pod: `nicop <command>` (e.g. `driver run`)."""

    pid: int
    ppid: int
    node: str
    pod: str
    command: str


@dataclass
class UpResult:
    already_running: bool
    seconds: float
    nodes: list[str]


class LocalCluster:
    """One local control plane rooted at `state_dir`."""

    def __init__(
        self, state_dir: str | Path | None = None, bin_dir: str | Path | None = None
    ) -> None:
        self.state_dir = Path(state_dir or default_state_dir()).resolve()
        self.bin_dir = Path(bin_dir or default_bin_dir()).resolve()
        self.pki_dir = self.state_dir / "pki"
        self.log_dir = self.state_dir / "logs"
        self.state_file = self.state_dir / "state.json"
        self.audit_log = self.log_dir / "audit.log"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._admin_tls: ssl.SSLContext | None = None

    # ----------------------------------------------------------------- inspection
    def state(self) -> State:
        return State.load(self.state_file)

    def running(self) -> dict[str, bool]:
        """Each component: True when its recorded process is alive."""
        procs = self.state().processes
        return {name: name in procs and procs[name].alive() for name in COMPONENTS}

    @property
    def server(self) -> str:
        return f"https://{HOST}:{self.state().ports['kube-apiserver']}"

    # ----------------------------------------------------------------- up
    def up(
        self,
        nodes: int = 4,
        profiles: list[str] | None = None,
        apiserver_port: int = 0,
        die_with_parent: bool = False,
        progress: Progress = lambda _: None,
        node_agents: bool = True,
        real_nodes: int = 0,
        real_profile: str = "cx6dx",
    ) -> UpResult:
        """Start the control plane and the nodes; with `node_agents`, a node stand-in per node
        (`nicop sim-node`) runs the pods of nicop's image there. `real_nodes` more nodes of
        `real_profile` run a real kubelet, containerd and runc (root only; see
        nicop_sim.realnode), named real-1, real-2, ..."""
        start = time.monotonic()
        alive = self.running()
        if all(alive.values()):
            if node_agents:
                from lightkube.resources.core_v1 import Node

                real = {name.split("/")[0] for name in self.state().processes
                        if name.endswith("/real-node")}  # their own kubelet runs their pods
                names = sorted(n.metadata.name for n in self.client().list(Node)
                               if n.metadata.name not in real)
                self.start_node_agents(names, die_with_parent, progress)
            return UpResult(True, 0.0, [])
        if any(alive.values()):
            partial = ", ".join(n for n, up in alive.items() if up)
            raise ClusterError(
                f"the cluster in {self.state_dir} is partly running ({partial}); "
                "run `nicop cluster down` first, then `nicop cluster up`"
            )
        node_profiles = hardware.layout(nodes, profiles)
        self._check_binaries()
        for d in (self.state_dir, self.pki_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        state = self.state()
        state.processes = {}
        state.ports = self._choose_ports(state.ports, apiserver_port)
        state.save(self.state_file)
        pki = self._pki()
        try:
            self._start_all(state, pki, die_with_parent, progress)
            names = self._create_nodes(node_profiles, progress) if nodes else []
            if node_agents:
                self.start_node_agents(names, die_with_parent, progress)
            names += self.start_real_nodes(real_nodes, real_profile, die_with_parent, progress)
        except BaseException:
            self.down()
            raise
        return UpResult(False, time.monotonic() - start, names)

    def _check_binaries(self) -> None:
        missing = [b for b in COMPONENTS if not os.access(self.bin_dir / b, os.X_OK)]
        if missing:
            raise ClusterError(
                f"control plane binary {', '.join(missing)} not found in {self.bin_dir}; "
                + BUILD_HINT
            )

    def _choose_ports(self, previous: dict[str, int], apiserver_port: int) -> dict[str, int]:
        """Reuse the last ports when free (etcd remembers its peer URL), else pick new ones."""
        wanted = (
            "etcd-client",
            "etcd-peer",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        )
        if apiserver_port and port_in_use(apiserver_port):
            raise ClusterError(
                f"port {apiserver_port} on {HOST} (kube-apiserver, --apiserver-port) is already "
                f"in use; stop what listens there (`ss -ltnp 'sport = :{apiserver_port}'`) "
                "or choose another port (0 picks a free one)"
            )
        ports: dict[str, int] = {}
        for name in wanted:
            if name == "kube-apiserver" and apiserver_port:
                ports[name] = apiserver_port
                continue
            old = previous.get(name)
            taken = set(ports.values())
            if old and old not in taken and not port_in_use(old):
                ports[name] = old
            else:
                port = free_port()
                while port in taken:
                    port = free_port()
                ports[name] = port
        return ports

    def _pki(self) -> dict[str, KeyPair]:
        ca = CertificateAuthority(self.pki_dir)
        return {
            "ca": ca.pair,
            "apiserver": ca.issue(
                "apiserver",
                "kube-apiserver",
                server_hosts=[
                    HOST,
                    "localhost",
                    "10.96.0.1",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
            ),
            "admin": ca.issue("admin", "nicop-admin", "system:masters"),
            # One identity runs every controller (no per-controller service accounts, which
            # would add a token round trip to start-up), so it needs the widest rights.
            "kube-controller-manager": ca.issue(
                "kube-controller-manager", "system:kube-controller-manager", "system:masters"
            ),
            "kube-scheduler": ca.issue("kube-scheduler", "system:kube-scheduler"),
            "sa": service_account_keys(self.pki_dir),
        }

    def write_kubeconfig(self, path: Path, user: str, pair: KeyPair, ca: KeyPair) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "nicop",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(ca.cert)},
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(pair.cert),
                        "client-key-data": b64(pair.key),
                    },
                }
            ],
            "contexts": [{"name": "nicop", "context": {"cluster": "nicop", "user": user}}],
            "current-context": "nicop",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _spawn(self, state: State, name: str, args: list[str], die_with_parent: bool) -> Process:
        return self._spawn_argv(state, name, [str(self.bin_dir / name), *args], die_with_parent)

    def start_process(self, name: str, argv: list[str], die_with_parent: bool = False) -> Process:
        """Start another process that belongs to this cluster (the operator, node stand-ins);
        `down` stops it before the control plane. Its log is logs/<name>.log."""
        state = self.state()
        old = state.processes.get(name)
        if old is not None and old.alive():
            return old
        return self._spawn_argv(state, name, argv, die_with_parent=die_with_parent)

    def node_root(self, node: str) -> Path:
        """A simulated node's filesystem, <state>/n/<node>. Unix sockets under it (the kubelet's,
        the device plugins') take at most 107 bytes, so a long state directory is reached
        through a short link in the temporary directory, made by `up`."""
        nodes = self.state_dir / "n"
        if len(str(nodes)) <= MAX_NODES_DIR:
            return nodes / node
        return Path(tempfile.gettempdir()) / f"nicop-{self._digest}" / node

    def hardware_root(self, node: str) -> Path:
        """Where a node's simulated hardware is: a real node's tree (what its /sys shows), or a
        stand-in node's filesystem."""
        real = self.real_node(node) if node.startswith("real-") else None
        return real.tree if real is not None and real.tree.exists() else self.node_root(node)

    @property
    def _digest(self) -> str:
        return hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:6]

    def _link_nodes_dir(self) -> None:
        nodes = self.state_dir / "n"
        nodes.mkdir(parents=True, exist_ok=True)
        link = self.node_root("x").parent
        if link != nodes and not link.exists():
            with contextlib.suppress(FileExistsError):
                link.symlink_to(nodes)

    def agents(self) -> list[Agent]:
        """The processes the node stand-ins run for pods: their kubeconfig is in the pod's
        directory, <state>/p/<node>/<namespace>_<pod>_<uid>/."""
        found = []
        pods = str(self.state_dir / "p") + "/"
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")[:-1]
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kubeconfig = next((v[11:].decode() for v in env if v.startswith(b"KUBECONFIG=")),
                              "")
            if not kubeconfig.startswith(pods) or "nicop" not in argv or stat[0] == "Z":
                continue
            node, pod_dir = kubeconfig[len(pods):].split("/")[:2]
            command = " ".join(a for a in argv[argv.index("nicop") + 1:][:2]
                               if not a.startswith("-"))
            found.append(Agent(int(entry), int(stat[1]), node, pod_dir.split("_")[1], command))
        return found

    def netns_of(self, node: str) -> str:
        """The network namespace of a simulated node: named after the cluster, so two local
        clusters on one machine do not share one."""
        return f"nicop-{self._digest}-{node}"

    def start_node_agents(self, nodes: list[str], die_with_parent: bool = False,
                          progress: Progress = lambda _: None) -> list[Process]:
        """A node stand-in per node (those already running are kept)."""
        self._link_nodes_dir()
        started = []
        for node in nodes:
            # As root, each node gets its network namespace (pods on networks get interfaces).
            netns = ["--netns", self.netns_of(node)] if os.geteuid() == 0 else []
            started.append(self.start_process(f"{node}/sim-node", [
                sys.executable, "-m", "nicop", "sim-node", "--node-name", node,
                "--kubeconfig", str(self.kubeconfig), "--root", str(self.node_root(node)),
                "--pods-dir", str(self.state_dir / "p" / node), "--log-format", "json", *netns,
            ], die_with_parent))
        progress(f"node stand-ins running on {len(nodes)} nodes")
        return started

    def _spawn_argv(
        self, state: State, name: str, argv: list[str], die_with_parent: bool
    ) -> Process:
        binary = argv[0]
        log_path = self.log_dir / f"{name.replace('/', '-')}.log"
        with open(log_path, "ab") as log:
            log.write(f"\n--- nicop: starting {name} at {time.ctime()}\n".encode())
            log.flush()
            child = subprocess.Popen(
                namespaces.dying_with_parent(argv) if die_with_parent else argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[child.pid] = child
        proc = Process(name, child.pid, binary, str(log_path), die_with_parent)
        state.processes[name] = proc
        state.save(self.state_file)
        return proc

    def _wait(
        self, proc: Process, what: str, check: Callable[[], bool], timeout: float = 60.0
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._children[proc.pid].poll() is not None:
                raise ClusterError(
                    f"{proc.name} exited while starting; last lines of {proc.log}:\n"
                    + _tail(Path(proc.log))
                )
            with contextlib.suppress(OSError, ssl.SSLError, urllib.error.URLError):
                if check():
                    return
            time.sleep(0.1)
        raise ClusterError(
            f"{proc.name} did not become {what} within {timeout:.0f}s; last lines of {proc.log}:\n"
            + _tail(Path(proc.log))
        )

    def _start_all(
        self, state: State, pki: dict[str, KeyPair], die_with_parent: bool, progress: Progress
    ) -> None:
        p = state.ports
        etcd_url = f"http://{HOST}:{p['etcd-client']}"
        peer_url = f"http://{HOST}:{p['etcd-peer']}"
        t = time.monotonic()
        etcd = self._spawn(
            state,
            "etcd",
            [
                "--name=nicop",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=nicop={peer_url}",
                "--unsafe-no-fsync=true",
                "--auto-compaction-retention=1",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
            die_with_parent,
        )
        self._wait(etcd, "healthy", lambda: _http_ok(f"{etcd_url}/health"))
        progress(f"etcd ready on {etcd_url} ({time.monotonic() - t:.1f}s)")

        t = time.monotonic()
        admin = pki["admin"]
        audit_policy = self.state_dir / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY)
        apiserver = self._spawn(
            state,
            "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                f"--secure-port={p['kube-apiserver']}",
                f"--tls-cert-file={pki['apiserver'].cert}",
                f"--tls-private-key-file={pki['apiserver'].key}",
                f"--client-ca-file={pki['ca'].cert}",
                f"--service-account-key-file={pki['sa'].cert}",
                f"--service-account-signing-key-file={pki['sa'].key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                f"--cert-dir={self.pki_dir}",
                # A real node's kubelet is reached at its address (its name resolves nowhere).
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-maxsize=200",
                "--audit-log-maxbackup=1",
            ],
            die_with_parent,
        )
        ctx = _tls_context(pki["ca"], admin)
        self._wait(
            apiserver,
            "ready",
            lambda: _http_ok(f"https://{HOST}:{p['kube-apiserver']}/readyz", ctx),
        )
        progress(
            f"kube-apiserver ready on https://{HOST}:{p['kube-apiserver']} "
            f"({time.monotonic() - t:.1f}s)"
        )
        self.write_kubeconfig(self.kubeconfig, "admin", admin, pki["ca"])

        t = time.monotonic()
        waits: list[tuple[Process, Callable[[], bool]]] = []
        for name in ("kube-controller-manager", "kube-scheduler"):
            kubeconfig = self.state_dir / f"{name}.kubeconfig"
            self.write_kubeconfig(kubeconfig, name, pki[name], pki["ca"])
            args = [
                f"--kubeconfig={kubeconfig}",
                "--leader-elect=false",
                f"--secure-port={p[name]}",
                f"--bind-address={HOST}",
                f"--cert-dir={self.state_dir / name}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--kube-api-qps=1000",
                "--kube-api-burst=2000",
            ]
            if name == "kube-controller-manager":
                args += [
                    f"--service-account-private-key-file={pki['sa'].key}",
                    f"--root-ca-file={pki['ca'].cert}",
                    "--use-service-account-credentials=false",
                    "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle",
                    "--concurrent-daemonset-syncs=10",
                    # kwok renews the leases of a thousand nodes from one process; on a busy
                    # machine a renewal can come late, and the node lifecycle controller would
                    # then mark the node's pods not ready although no simulated node failed.
                    "--node-monitor-grace-period=5m",
                ]
            proc = self._spawn(state, name, args, die_with_parent)
            url = f"https://{HOST}:{p[name]}/healthz"
            waits.append((proc, functools.partial(_http_ok, url, _insecure())))
        stages = resources.files("nicop_sim").joinpath("kwok-stages.yaml")
        stages_path = self.state_dir / "kwok-stages.yaml"
        stages_path.write_text(stages.read_text())
        kwok = self._spawn(
            state,
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages_path}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.244.0.1",
                f"--server-address={HOST}:{p['kwok']}",
            ],
            die_with_parent,
        )
        waits.append((kwok, lambda: _http_ok(f"http://{HOST}:{p['kwok']}/healthz")))
        for proc, check in waits:
            self._wait(proc, "healthy", check)
        progress(
            f"kube-controller-manager, kube-scheduler and kwok healthy "
            f"({time.monotonic() - t:.1f}s)"
        )

    # ----------------------------------------------------------------- nodes
    def client(self) -> Any:
        """A lightkube client for this cluster (imported late: `nicop cluster down` needs none)."""
        from lightkube import Client, KubeConfig

        return Client(config=KubeConfig.from_file(self.kubeconfig), field_manager="nicop")

    def _create_nodes(self, profiles: list[hardware.Profile], progress: Progress) -> list[str]:
        nodes = [standin_node(f"node-{i}", profile) for i, profile in enumerate(profiles, 1)]
        names = self.add_nodes(nodes, progress)
        if any(p.gpus for p in profiles):
            self._install_gpu_device_class(self.client())
        return names

    def add_nodes(self, nodes: list[dict[str, Any]], progress: Progress) -> list[str]:
        """Create these Nodes (metadata and spec; kwok keeps them Ready) and wait until they
        are Ready. A node stand-in builds each one's hardware from its profile annotation."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Node

        t = time.monotonic()
        client = self.client()
        names = []
        for node in nodes:
            meta = node["metadata"]
            names.append(meta["name"])
            body = {"metadata": {**meta, "annotations": {**(meta.get("annotations") or {}),
                                                          KWOK_ANNOTATION: "fake"}},
                    "spec": node.get("spec") or {}}
            try:
                client.create(Node.from_dict(body))
            except ApiError as e:
                if e.status.code != 409:
                    raise
        deadline = time.monotonic() + 60 + 0.1 * len(names)
        while True:
            ready = {n.metadata.name for n in client.list(Node) if _node_ready(n)}
            if ready.issuperset(names):
                break
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"nodes {sorted(set(names) - ready)[:10]} did not become Ready in time; "
                    f"see {self.log_dir / 'kwok.log'}"
                )
            time.sleep(0.2)
        progress(f"{len(names)} nodes Ready ({time.monotonic() - t:.1f}s)")
        return names

    def join_node(self, name: str, profile: hardware.Profile, die_with_parent: bool = False,
                  progress: Progress = lambda _: None) -> None:
        """A new node joins the running cluster: its Node object and its stand-in, which
        builds fresh hardware from the profile (as a newly installed machine)."""
        self.add_nodes([standin_node(name, profile)], progress)
        self.start_node_agents([name], die_with_parent, progress)

    def remove_node(self, name: str) -> None:
        """A node leaves for good: its stand-in stops (its pods' processes and network
        namespace with it), its Node object is deleted, its filesystem and pods' directory
        removed. Drain it first, as an administrator would."""
        from lightkube.core.exceptions import ApiError
        from lightkube.resources.core_v1 import Node

        state = self.state()
        proc = state.processes.pop(f"{name}/sim-node", None)
        if proc is not None:
            self._stop(proc)
            state.save(self.state_file)
        # Its pods' processes die with it, but not at once (a driver agent restores the inbox
        # driver first): its tree is removed once none is left to write there.
        deadline = time.monotonic() + 30
        while left := [a.pid for a in self.agents() if a.node == name]:
            if time.monotonic() > deadline:
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        try:
            self.client().delete(Node, name)
        except ApiError as e:
            if e.status.code != 404:
                raise
        for folder in (self.state_dir / "n" / name, self.state_dir / "p" / name):
            shutil.rmtree(folder, ignore_errors=True)

    def _install_gpu_device_class(self, client: Any) -> None:
        """What the NVIDIA GPU DRA driver's chart installs beside the driver that the plugin
        pods play on nodes with simulated GPUs: its DeviceClass `gpu.nvidia.com`, so claims that
        pair a GPU with a NIC (examples/dra/gpu-and-nic.yaml) can be allocated."""
        from lightkube.core.exceptions import ApiError
        from lightkube.generic_resource import create_global_resource

        from nicop_sim.gpu_dra import gpu_device_class

        device_class = create_global_resource("resource.k8s.io", "v1", "DeviceClass",
                                              "deviceclasses")
        try:
            client.create(device_class(**gpu_device_class()))
        except ApiError as e:
            if e.status.code != 409:
                raise

    # ----------------------------------------------------------------- real nodes
    def real_node(self, name: str) -> realnode.RealNode:
        """A real node of this cluster (real-<i>): its state under <state>/r/<name>."""
        index = int(name.rsplit("-", 1)[1])
        state = self.state_dir / "r" / name
        return realnode.RealNode(name, state, state / "tree", self._digest, index)

    def real_node_blocker(self) -> str | None:
        """Why this machine cannot run a real node now (None: it can)."""
        if os.geteuid() != 0:
            return "a real node needs root (network and mount namespaces, cgroups)"
        for path, hint in ((default_runtime_dir() / "containerd",
                            "make runtime (hack/build-runtime.sh)"),
                           (self.bin_dir / "kubelet",
                            "make controlplane (hack/build-controlplane.sh)"),
                           (default_image(), "make image (hack/build-image.sh)")):
            if not path.exists():
                return f"a real node needs {path}: build it with {hint}"
        return None

    def start_real_nodes(self, count: int, profile: str, die_with_parent: bool = False,
                         progress: Progress = lambda _: None) -> list[str]:
        """`count` real nodes, each Ready from its own kubelet; their Node objects carry the
        profile's NFD labels, as Node Feature Discovery would put them."""
        if count <= 0:
            return []
        if profile not in hardware.PROFILES:
            raise ClusterError(f"unknown hardware profile {profile!r}; known: "
                               f"{', '.join(hardware.PROFILES)}")
        blocker = self.real_node_blocker()
        if blocker is not None:
            raise ClusterError(blocker)
        runtime = default_runtime_dir()
        kubelet = self.bin_dir / "kubelet"
        image = default_image()
        t = time.monotonic()
        port = self.state().ports["kube-apiserver"]
        names = [f"real-{i}" for i in range(1, count + 1)]
        for name in names:
            labels = hardware.PROFILES[profile].node_labels()
            try:
                argv = realnode.prepare(self.real_node(name), server_port=port,
                                        pki_dir=self.pki_dir, profile=profile, labels=labels,
                                        runtime_bin=runtime, kubelet=kubelet, image=image)
            except ValueError as e:
                raise ClusterError(str(e)) from None
            self.start_process(f"{name}/real-node", argv, die_with_parent)
        self._await_real_nodes(names, profile)
        progress(f"{len(names)} real nodes Ready (kubelet, containerd, runc; "
                 f"{time.monotonic() - t:.1f}s)")
        return names

    def _await_real_nodes(self, names: list[str], profile: str) -> None:
        from lightkube.resources.core_v1 import Node

        client = self.client()
        deadline = time.monotonic() + 120
        waiting = set(names)
        while waiting:
            for name in sorted(waiting):
                proc = self.state().processes[f"{name}/real-node"]
                if not proc.alive():
                    raise ClusterError(f"real node {name} exited while starting; last lines of "
                                       f"{proc.log}:\n{_tail(Path(proc.log))}")
                with contextlib.suppress(Exception):
                    if _node_ready(client.get(Node, name)):
                        client.patch(Node, name, {"metadata": {
                            "annotations": {hardware.PROFILE_ANNOTATION: profile},
                            "labels": {"node-role.kubernetes.io/worker": ""}}})
                        waiting.discard(name)
            if time.monotonic() > deadline:
                logs = self.real_node(sorted(waiting)[0]).state / "logs" / "kubelet.log"
                raise ClusterError(f"real nodes {sorted(waiting)} did not become Ready in "
                                   f"120 s; last lines of {logs}:\n{_tail(logs)}")
            time.sleep(0.2)

    # ----------------------------------------------------------------- down
    def down(self) -> list[str]:
        """Stop every process of the cluster, clients before servers; one report line each.

        Each gets SIGTERM and a grace period, then SIGKILL. etcd's graceful stop spends seconds
        closing listeners nobody uses any more once the API server is gone, so it gets one second.
        """
        state = self.state()
        # Newest first: agents and the operator, then kwok ... etcd.
        report = [f"{name}: {self._stop(state.processes[name])}"
                  for name in reversed(list(state.processes))]
        # A real node's processes are its node process's children; should that one have died
        # first, its cgroup still holds them: end them, remove its cgroups and network.
        for folder in sorted((self.state_dir / "r").glob("real-*")):
            if folder.is_dir():
                realnode.stop(self.real_node(folder.name))
        state.processes = {}
        if self.state_file.exists():
            state.save(self.state_file)
        return report

    def _stop(self, proc: Process) -> str:
        """SIGTERM, a grace period, then SIGKILL; says how it went."""
        if not self._alive(proc):
            self._reap(proc.pid)
            return f"was not running (pid {proc.pid} had exited)"
        # A real node stops its kubelet, containerd and every container first.
        grace = 1.0 if proc.name == "etcd" else 30.0 if proc.name.endswith("/real-node") else 10.0
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._alive(proc) and time.monotonic() < deadline:
            self._reap(proc.pid)
            time.sleep(0.02)
        how = "stopped"
        if self._alive(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            while self._alive(proc):
                self._reap(proc.pid)
                time.sleep(0.02)
            how = "stopped (SIGKILL)" if proc.name == "etcd" else f"killed after {grace:.0f}s"
        self._reap(proc.pid)
        return f"{how} (pid {proc.pid})"

    def restart(self, name: str) -> Process:
        """Stop one process of the cluster as `down` would and start it again with the same
        command line (a control plane restart, as in an upgrade); the API server is waited for
        until it is ready again."""
        state = self.state()
        old = state.processes[name]
        argv = Path(f"/proc/{old.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        self._stop(old)
        new = self._spawn_argv(state, name, argv, old.die_with_parent)
        if name == "kube-apiserver":
            self._wait(new, "ready", self.api_ready)
        return new

    def api_ready(self) -> bool:
        """Whether the API server answers its /readyz with 200 (as the admin)."""
        if self._admin_tls is None:
            pki = self._pki()
            self._admin_tls = _tls_context(pki["ca"], pki["admin"])
        with contextlib.suppress(OSError, ssl.SSLError, urllib.error.URLError):
            return _http_ok(f"{self.server}/readyz", self._admin_tls)
        return False

    def _alive(self, proc: Process) -> bool:
        """Our own children are asked directly: between fork and exec a child does not yet show
        the binary's command line."""
        child = self._children.get(proc.pid)
        if child is not None:
            return child.poll() is None
        return proc.alive()

    def _reap(self, pid: int) -> None:
        child = self._children.get(pid)
        if child is not None and child.poll() is not None:
            del self._children[pid]


@contextlib.contextmanager
def running_cluster(
    state_dir: Path,
    bin_dir: Path | None = None,
    nodes: int = 4,
    profiles: list[str] | None = None,
    progress: Progress = print,
    node_agents: bool = True,
    real_nodes: int = 0,
) -> Iterator[LocalCluster]:
    """A cluster that lives as long as the `with` block, and no longer even if the caller dies."""
    cluster = LocalCluster(state_dir, bin_dir)
    try:
        cluster.up(nodes=nodes, profiles=profiles, die_with_parent=True, progress=progress,
                   node_agents=node_agents, real_nodes=real_nodes)
        yield cluster
    finally:
        cluster.down()


def standin_node(name: str, profile: hardware.Profile) -> dict[str, Any]:
    """The Node of a stand-in: kwok's, labelled as NFD would label its hardware, the profile
    named for the stand-in to build it."""
    return {"metadata": {
        "name": name,
        "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                   "node-role.kubernetes.io/worker": "", **profile.node_labels()},
        "annotations": {hardware.PROFILE_ANNOTATION: profile.name}}}


def _node_ready(node: Any) -> bool:
    conditions = (node.status and node.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _tls_context(ca: KeyPair, client: KeyPair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    return ctx


def _insecure() -> ssl.SSLContext:
    """For the self-signed health endpoints of controller-manager and scheduler."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError:
        return False
