"""The node stand-in's container runtime: pods of nicop's image bound to this node run here as
local processes, as a kubelet would run their containers.

kwok plays every other pod (its stages skip pods of nicop's image, see kwok-stages.yaml), so the
two never write one pod. What a kubelet does, this does too:

- init containers in order, each to completion, then every container;
- command and args of the spec with `$(VAR)` expanded, env with the downward API fields agents
  use and ConfigMap keys; `nicop` is this machine's `python -m nicop`;
- mounts: hostPath volumes are the node's simulated tree, configMap volumes files kept in step
  with their ConfigMap, emptyDir a directory of the pod; privileged containers see the node's
  /sys, /proc and /dev. The process learns where they are from $NICOP_MOUNTS (nicop.node.host);
- the pod's ServiceAccount: a token bound to the pod from the TokenRequest API, in a kubeconfig
  ($KUBECONFIG), so agents have exactly the rights the operator's RBAC grants;
- the node's links live in a network namespace of its own (nicop_sim.network); agents that use
  netlink are told which ($NICOP_HOST_NETNS), while every process keeps this machine's loopback,
  where the API server listens;
- exec and httpGet probes (startup, readiness, liveness) with the kubelet's timing rules;
- the node's address as the pods' hostIP and podIP: one of its own on loopback
  (nicop_sim.node.node_address), so hostNetwork agents of different nodes can use one port;
- exits and restarts per restartPolicy, with the kubelet's back-off (CrashLoopBackOff),
  `restartCount` and the last state's exit code and termination message;
- on deletion: SIGTERM, the grace period, SIGKILL, then the pod object goes.

The pod's status (phase, conditions, container states) comes from these facts only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nicop.api.agents import is_nicop_image
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.informer import Informer
from nicop.kube.resources import CONFIGMAP, POD, SECRET, Obj, Resource
from nicop.kube.times import stamp as now
from nicop.node.host import MOUNTS_ENV, Mounts
from nicop_sim.namespaces import dying_with_parent

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_TOKEN = Resource("", "v1", "ServiceAccount", "serviceaccounts")
TOKEN_SECONDS = 24 * 3600
BACKOFF_MAX = 300.0
BACKOFF_RESET = 600.0  # a container that ran this long starts its back-off afresh
LOG_TAIL_LINES, LOG_TAIL_BYTES = 80, 2048  # FallbackToLogsOnError, as the kubelet
DEFAULT_GRACE = 30
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def is_nicop_pod(pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    return any(is_nicop_image(c.get("image") or "")
               for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])])


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: known variables replaced, `$$` is `$`, others kept."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VAR.sub(one, text)


@dataclass
class Sandbox:
    """What the node gives every container of a pod."""

    node_root: Path
    pod_dir: Path
    kubeconfig: Path
    host_ip: str
    extra_env: dict[str, str]


@dataclass
class ContainerState:
    """One container as its status reports it."""

    name: str
    image: str
    restart_count: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    started: bool = False
    ready: bool = False
    container_id: str = ""

    def status(self) -> Obj:
        out: Obj = {"name": self.name, "image": self.image, "imageID": f"nicop-sim://{self.image}",
                    "restartCount": self.restart_count, "ready": self.ready,
                    "started": self.started, "state": self.state, "lastState": self.last_state}
        if self.container_id:
            out["containerID"] = self.container_id
        return out


class Container:
    """One container of a pod: its process, restarts and probes."""

    def __init__(self, worker: PodWorker, spec: Obj, init: bool) -> None:
        self.worker = worker
        self.spec = spec
        self.init = init
        self.name = str(spec["name"])
        self.status = ContainerState(self.name, str(spec.get("image", "")))
        self.process: asyncio.subprocess.Process | None = None
        self.backoff = 0.0
        self.env: dict[str, str] = {}
        self.mounts: dict[str, str] = {}
        self.stopping = False
        self._probe_kill = asyncio.Event()

    @property
    def dir(self) -> Path:
        return self.worker.sandbox.pod_dir / "containers" / self.name

    # ------------------------------------------------------------------ environment
    def prepare(self) -> None:
        """The process's environment and mount table (built again before each start)."""
        pod, sandbox = self.worker.pod, self.worker.sandbox
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "rootfs").mkdir(exist_ok=True)
        message = self.dir / "termination-log"
        message.write_text("")
        mounts = {"/": str(self.dir / "rootfs"),
                  "/sys": str(sandbox.node_root / "sys"), "/proc": str(sandbox.node_root / "proc")}
        if (self.spec.get("securityContext") or {}).get("privileged"):
            mounts["/dev"] = str(sandbox.node_root / "dev")
        for vm in self.spec.get("volumeMounts") or []:
            source = self.worker.volumes.get(vm["name"])
            if source is None:
                raise RuntimeError(f"volume {vm['name']!r} is not in the pod's volumes")
            if vm.get("subPath"):
                source = source / vm["subPath"]
            mounts[vm["mountPath"]] = str(source)
        mounts[self.spec.get("terminationMessagePath") or "/dev/termination-log"] = str(message)
        self.mounts = mounts
        env: dict[str, str] = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root",
            "HOSTNAME": self.worker.node_name if self.worker.host_network
            else pod["metadata"]["name"],
            "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
        }
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        for source in self.spec.get("envFrom") or []:
            ref = source.get("configMapRef") or source.get("secretRef")
            if ref:
                data = self.worker.runner.read_config(
                    CONFIGMAP if "configMapRef" in source else SECRET,
                    pod["metadata"]["namespace"], ref["name"]) or {}
                env.update({(source.get("prefix") or "") + k: v for k, v in data.items()})
        for var in self.spec.get("env") or []:
            if "value" in var:
                env[var["name"]] = expand(str(var["value"]), env)
            elif "valueFrom" in var:
                value = self.worker.value_from(var["valueFrom"])
                if value is not None:
                    env[var["name"]] = value
        env.update(sandbox.extra_env)
        env["KUBECONFIG"] = str(sandbox.kubeconfig)
        env[MOUNTS_ENV] = json.dumps(mounts)
        self.env = env

    def argv(self, command: list[str]) -> list[str]:
        """The spec's command as this machine runs it: `nicop` is `python -m nicop`."""
        argv = [expand(str(a), self.env) for a in command]
        if argv and argv[0] in ("nicop", "/usr/local/bin/nicop"):
            argv = [sys.executable, "-m", "nicop", *argv[1:]]
        return argv

    def command(self) -> list[str]:
        """command + args; without a command, the image's: nicop's is `nicop --help`."""
        command = list(self.spec.get("command") or [])
        args = list(self.spec.get("args") or [])
        if not command and is_nicop_image(self.status.image):
            command, args = ["nicop"], args or ["--help"]
        return self.argv([*command, *args])

    # ------------------------------------------------------------------ running
    async def run(self) -> int:
        """Run the process once; returns its exit code (probes may kill it)."""
        self.prepare()
        argv = self.command()
        cwd = Mounts(self.mounts).real(self.spec.get("workingDir") or "/")
        log_path = self.dir / f"{self.status.restart_count}.log"
        self.worker.runner.log_link(self.worker.pod, self.name, log_path)
        started_at = now()
        self.status.container_id = (f"nicop-sim://{self.worker.uid[:8]}-{self.name}-"
                                    f"{self.status.restart_count}")
        with open(log_path, "ab") as out:
            try:
                if not shutil.which(argv[0], path=self.env.get("PATH")):
                    raise FileNotFoundError(f"{argv[0]}: not found in $PATH")
                self.process = await asyncio.create_subprocess_exec(
                    *dying_with_parent(argv), stdin=asyncio.subprocess.DEVNULL, stdout=out,
                    stderr=out, cwd=cwd if os.path.isdir(cwd) else self.mounts["/"],
                    env=self.env, start_new_session=True)
            except OSError as e:
                out.write(f"cannot start {argv[0]}: {e}\n".encode())
                self._terminated(128, started_at, "StartError", str(e))
                return 128
        self.status.state = {"running": {"startedAt": started_at}}
        self.status.started = not self.spec.get("startupProbe")
        self.status.ready = False
        self.worker.changed()
        self.worker.runner.event(self.worker.pod, "Normal", "Started",
                                 f"Started container {self.name}")
        probes = [] if self.init else [asyncio.create_task(self._probes())]
        try:
            code = await self.process.wait()
        finally:
            for task in probes:
                task.cancel()
            for task in probes:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        reason = "Completed" if code == 0 else "Error"
        message = self._termination_message(code, log_path)
        self._terminated(code if code >= 0 else 128 - code, started_at, reason, message)
        return code

    def _terminated(self, code: int, started_at: str, reason: str, message: str) -> None:
        terminated: Obj = {"exitCode": code, "reason": reason, "startedAt": started_at,
                           "finishedAt": now(), "containerID": self.status.container_id}
        if message:
            terminated["message"] = message
        self.status.state = {"terminated": terminated}
        self.status.ready = False
        self.status.started = False
        self.process = None
        self.worker.changed()

    def _termination_message(self, code: int, log_path: Path) -> str:
        text = (self.dir / "termination-log").read_text(errors="replace").strip()
        policy = self.spec.get("terminationMessagePolicy") or "File"
        if not text and code != 0 and policy == "FallbackToLogsOnError":
            lines = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            text = "\n".join(lines)[-LOG_TAIL_BYTES:]
        return text

    async def stop(self, grace: float, *, restart: bool = False) -> None:
        """SIGTERM the process group, SIGKILL after `grace` seconds; it runs again only when
        `restart` (a failed probe) and the restart policy says so."""
        self.stopping = not restart
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
        except TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()

    # ------------------------------------------------------------------ probes
    async def _probes(self) -> None:
        startup = self.spec.get("startupProbe")
        if startup is not None:
            if not await self._until(startup, want=True, kind="Startup"):
                await self._kill("startup probe failed")
                return
            self.status.started = True
            self.worker.changed()
        tasks = [asyncio.create_task(self._readiness())]
        if self.spec.get("livenessProbe"):
            tasks.append(asyncio.create_task(self._liveness()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _readiness(self) -> None:
        probe = self.spec.get("readinessProbe")
        if probe is None:
            self.status.ready = True
            self.worker.changed()
            return
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        successes = failures = 0
        while True:
            ok, output = await self.probe(probe)
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            ready = self.status.ready
            if ok and successes >= probe.get("successThreshold", 1):
                ready = True
            elif not ok and failures >= probe.get("failureThreshold", 3):
                ready = False
            if not ok and (not ready or failures == 1):
                self.worker.runner.event(self.worker.pod, "Warning", "Unhealthy",
                                         f"Readiness probe failed: {output}")
            if ready != self.status.ready:
                self.status.ready = ready
                self.worker.changed()
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _liveness(self) -> None:
        if not await self._until(self.spec["livenessProbe"], want=False, kind="Liveness"):
            await self._kill("liveness probe failed")

    async def _until(self, probe: Obj, want: bool, kind: str) -> bool:
        """Probe until it succeeds (want=True) or fails failureThreshold times in a row (False);
        returns True for a success, False for too many failures."""
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        failures = 0
        while True:
            ok, output = await self.probe(probe)
            if ok and want:
                return True
            failures = 0 if ok else failures + 1
            if not ok:
                self.worker.runner.event(self.worker.pod, "Warning", "Unhealthy",
                                         f"{kind} probe failed: {output}")
            if failures >= probe.get("failureThreshold", 3):
                return False
            await asyncio.sleep(probe.get("periodSeconds", 10))

    async def _kill(self, why: str) -> None:
        self.worker.runner.event(self.worker.pod, "Normal", "Killing",
                                 f"Container {self.name} {why}, will be restarted")
        await self.stop(self.worker.grace(), restart=True)

    async def probe(self, probe: Obj) -> tuple[bool, str]:
        """One exec or httpGet probe, with its timeout; (success, what it printed)."""
        timeout = probe.get("timeoutSeconds", 1)
        if "exec" in probe:
            argv = self.argv(list(probe["exec"].get("command") or []))
            try:
                proc = await asyncio.create_subprocess_exec(
                    *dying_with_parent(argv), stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                    env=self.env, cwd=self.mounts["/"], start_new_session=True)
            except OSError as e:
                return False, str(e)
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), timeout)
            except TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
                return False, f"command timed out after {timeout}s"
            return proc.returncode == 0, out.decode(errors="replace").strip()[-500:]
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = get["port"]
            if isinstance(port, str) and not port.isdigit():  # a named port of the container
                port = next((p["containerPort"] for p in self.spec.get("ports") or []
                             if p.get("name") == port), port)
            host = get.get("host") or self.worker.pod_ip()  # the kubelet's default: the pod IP
            url = (f"{get.get('scheme', 'HTTP').lower()}://{host}:{port}{get.get('path', '/')}")
            return await asyncio.to_thread(_http_probe, url, timeout)
        return False, "only exec and httpGet probes are run on simulated nodes"


class PodWorker:
    """Runs one pod from its first sight to its deletion."""

    def __init__(self, runner: PodRunner, pod: Obj) -> None:
        self.runner = runner
        self.pod = pod
        self.uid = str(pod["metadata"]["uid"])
        self.node_name = runner.node_name
        spec = pod["spec"]
        self.host_network = bool(spec.get("hostNetwork"))
        self.sandbox: Sandbox  # set by run(), before any container starts
        self.set_up = False
        self.volumes: dict[str, Path] = {}
        self.init_containers = [Container(self, c, True) for c in spec.get("initContainers") or []]
        self.containers = [Container(self, c, False) for c in spec.get("containers") or []]
        self.initialized = not self.init_containers
        self.started_at = now()
        self._dirty = asyncio.Event()
        self._deleted = asyncio.Event()
        self._written: Obj | None = None
        self.node_gone = False
        self.task: asyncio.Task[None] | None = None
        previous = {c.get("name"): c for c in (pod.get("status") or {}).get(
            "containerStatuses") or []}
        for c in self.containers:  # a restarted stand-in counts on from the pod's status
            c.status.restart_count = int((previous.get(c.name) or {}).get("restartCount", 0))
            if (previous.get(c.name) or {}).get("state", {}).get("running"):
                c.status.restart_count += 1

    def changed(self) -> None:
        self._dirty.set()

    def update(self, pod: Obj) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self._deleted.set()

    def deleted(self) -> None:
        """The pod object is gone (deleted with no grace): stop at once."""
        self._deleted.set()

    def grace(self) -> float:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        value = meta.get("deletionGracePeriodSeconds")
        if value is None:
            value = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)
        return float(value)

    def value_from(self, source: Obj) -> str | None:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        if ref := source.get("fieldRef"):
            path = ref.get("fieldPath", "")
            fields = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get(
                "namespace"), "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get(
                "nodeName"), "spec.serviceAccountName": spec.get("serviceAccountName"),
                "status.hostIP": self.sandbox.host_ip, "status.podIP": self.pod_ip()}
            if path in fields:
                return str(fields[path] or "")
            if m := re.match(r"metadata\.(labels|annotations)\['(.+)'\]$", path):
                return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
            return None
        for key, res in (("configMapKeyRef", CONFIGMAP), ("secretKeyRef", SECRET)):
            if ref := source.get(key):
                data = self.runner.read_config(res, meta["namespace"], ref["name"]) or {}
                return data.get(ref["key"])
        return None

    def pod_ip(self) -> str:
        return self.sandbox.host_ip

    # ------------------------------------------------------------------ volumes
    def write_volumes(self) -> None:
        """Volume sources: hostPath in the node's tree, configMap/secret files, emptyDir."""
        if not self.set_up:
            return  # run() writes them first
        root = self.sandbox.node_root
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            if "hostPath" in volume:
                hp = volume["hostPath"]
                path = root / hp["path"].lstrip("/")
                if hp.get("type") == "FileOrCreate":
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.touch(exist_ok=True)
                elif not path.exists() and hp.get("type") not in ("File", "Socket",
                                                                  "CharDevice", "BlockDevice"):
                    path.mkdir(parents=True, exist_ok=True)
                self.volumes[name] = path
                continue
            target = self.sandbox.pod_dir / "volumes" / name
            target.mkdir(parents=True, exist_ok=True)
            self.volumes[name] = target
            for kind, res in (("configMap", CONFIGMAP), ("secret", SECRET)):
                if kind in volume:
                    ref = volume[kind]
                    ref_name = ref.get("name") or ref.get("secretName")
                    data = self.runner.read_config(res, self.pod["metadata"]["namespace"],
                                                   ref_name) or {}
                    _write_files(target, data, ref.get("items"))

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self.sandbox = await self.runner.sandbox(self.pod)
        self.set_up = True
        writer = asyncio.create_task(self._status_writer())
        tasks: list[asyncio.Task[Any]] = []
        try:
            self.write_volumes()
            self.changed()
            runner = asyncio.create_task(self._run_containers())
            deleted = asyncio.create_task(self._deleted.wait())
            tasks = [runner, deleted]
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if runner in done:
                runner.result()
                await deleted
            await self._terminate()
        finally:
            for task in tasks:
                task.cancel()
            await self._flush()
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        if self.pod["metadata"].get("deletionTimestamp") and not self.node_gone:
            await self.runner.remove(self.pod)

    async def _run_containers(self) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for container in self.init_containers:
            while await self._run_once(container, "Never" if policy == "Never" else "OnFailure"):
                pass
            if (container.status.state.get("terminated") or {}).get("exitCode") != 0:
                return  # restartPolicy Never: the pod has failed
        self.initialized = True
        self.changed()
        await asyncio.gather(*(self._keep_running(c, policy) for c in self.containers))

    async def _keep_running(self, container: Container, policy: str) -> None:
        while await self._run_once(container, policy):
            pass

    async def _run_once(self, container: Container, policy: str) -> bool:
        """Run the container once; True when it is to run again (after its back-off)."""
        started = time.monotonic()
        code = await container.run()
        if self._deleted.is_set() or container.stopping:
            return False
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            return False
        if time.monotonic() - started >= BACKOFF_RESET:
            container.backoff = 0.0
        delay = container.backoff
        container.backoff = min(BACKOFF_MAX, max(self.runner.crash_backoff,
                                                 container.backoff * 2))
        if delay:
            container.status.last_state = container.status.state
            container.status.state = {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={container.name} "
                           f"pod={self.pod['metadata']['name']}_"
                           f"{self.pod['metadata']['namespace']}({self.uid})"}}
            self.changed()
            self.runner.event(self.pod, "Warning", "BackOff",
                              f"Back-off restarting failed container {container.name}")
            waiter = asyncio.create_task(self._deleted.wait())
            try:
                await asyncio.wait_for(asyncio.shield(waiter), delay)
                return False
            except TimeoutError:
                pass
            finally:
                waiter.cancel()
        else:
            container.status.last_state = container.status.state
        container.status.restart_count += 1
        return True

    async def _terminate(self) -> None:
        grace = self.grace()
        everyone = [*self.init_containers, *self.containers]
        if any(c.process is not None for c in everyone):
            self.runner.event(self.pod, "Normal", "Killing",
                              "Stopping the pod's containers")
        await asyncio.gather(*(c.stop(grace) for c in everyone))

    async def kill(self) -> None:
        """The node goes away: stop every process now, write nothing more."""
        self.node_gone = True
        for c in [*self.init_containers, *self.containers]:
            await c.stop(1.0)

    # ------------------------------------------------------------------ status
    async def _status_writer(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self._flush()
            await asyncio.sleep(0.05)

    async def _flush(self) -> None:
        status = self.status()
        if status == self._written or self.node_gone:
            return
        try:
            updated = await self.runner.client.patch(
                POD, self.pod["metadata"]["name"], {"status": status},
                self.pod["metadata"]["namespace"], patch_type="strategic", subresource="status")
            self.pod = {**self.pod, "status": updated.get("status", status)}
            self._written = status
        except ApiError as e:
            if e.code != 404:
                log.warning("cannot write the status of pod %s: %s",
                            self.pod["metadata"]["name"], e)
                self._dirty.set()
        except OSError as e:  # the API server may be restarting: try again
            log.warning("cannot write the status of pod %s: %s", self.pod["metadata"]["name"], e)
            self._dirty.set()

    def status(self) -> Obj:
        containers = [c.status for c in self.containers]
        ready = self.initialized and all(c.ready for c in containers)
        policy = self.pod["spec"].get("restartPolicy", "Always")
        terminated = [c.state.get("terminated") for c in containers]
        if policy != "Always" and containers and all(terminated):
            phase = "Succeeded" if all(t and t["exitCode"] == 0 for t in terminated) else "Failed"
        elif self.initialized and any(c.restart_count or "running" in c.state
                                      or "terminated" in c.state for c in containers):
            phase = "Running"
        else:
            phase = "Pending"
        init_failed = policy == "Never" and any(
            (c.status.state.get("terminated") or {}).get("exitCode", 0) != 0
            for c in self.init_containers)
        if init_failed:
            phase = "Failed"
        conditions = [
            self._condition("PodReadyToStartContainers", True),
            self._condition("Initialized", self.initialized),
            self._condition("ContainersReady", ready),
            self._condition("Ready", ready),
        ]
        ips = [{"ip": self.sandbox.host_ip}]
        status: Obj = {
            "phase": phase, "conditions": conditions, "hostIP": self.sandbox.host_ip,
            "hostIPs": ips, "podIP": self.pod_ip(), "podIPs": ips, "startTime": self.started_at,
            "containerStatuses": [c.status() for c in containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status.status()
                                               for c in self.init_containers]
        return status

    def _condition(self, type_: str, ok: bool) -> Obj:
        value = "True" if ok else "False"
        old = next((c for c in (self.pod.get("status") or {}).get("conditions") or []
                    if c.get("type") == type_), None)
        since = old["lastTransitionTime"] if old and old.get("status") == value and old.get(
            "lastTransitionTime") else now()
        return {"type": type_, "status": value, "lastProbeTime": None,
                "lastTransitionTime": since}


class PodRunner:
    """Every nicop-image pod bound to one node, each run by a PodWorker."""

    def __init__(self, client: ApiClient, node_name: str, node_root: Path, pods_dir: Path,
                 server: str, ca_data: str, *, crash_backoff: float = 10.0,
                 extra_env: dict[str, str] | None = None, host_ip: str | None = None) -> None:
        """`host_ip` is the node's address its pods report (hostIP, podIP); without it, the
        Node's InternalIP."""
        self.client = client
        self.node_name = node_name
        self.node_root = node_root
        self.pods_dir = pods_dir
        self.server = server
        self.ca_data = ca_data
        self.crash_backoff = crash_backoff
        self.extra_env = extra_env or {}
        self.host_ip = host_ip or "127.0.0.1"
        self._own_ip = host_ip is not None
        self.recorder = EventRecorder(client, component="kubelet")
        self.pods = Informer(client, POD, field_selector=f"spec.nodeName={node_name}")
        self.pods.on_change(self._pod_changed)
        self.workers: dict[str, PodWorker] = {}
        self._configs: dict[tuple[Resource, str], Informer] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ pods
    def _pod_changed(self, event: str, pod: Obj, old: Obj | None) -> None:
        if not is_nicop_pod(pod):
            return
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if event == "DELETED":
            if worker is not None:
                worker.update(pod)
                worker.deleted()
            return
        if worker is not None:
            worker.update(pod)
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        worker.update(pod)
        self._spawn(self._run(worker))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("pod worker failed", exc_info=task.exception())

    async def _run(self, worker: PodWorker) -> None:
        meta = worker.pod["metadata"]
        log.info("running pod %s/%s", meta["namespace"], meta["name"])
        try:
            await worker.run()
        finally:
            self.workers.pop(worker.uid, None)
            if worker.set_up:
                shutil.rmtree(worker.sandbox.pod_dir / "volumes", ignore_errors=True)

    async def remove(self, pod: Obj) -> None:
        """The kubelet's last word on a deleted pod: delete it for good (no grace left)."""
        meta = pod["metadata"]
        try:
            await self.client.delete(POD, meta["name"], meta["namespace"], grace_seconds=0,
                                     uid=meta["uid"])
        except ApiError as e:
            if e.code != 409:  # 409: a new pod of the same name already took its place
                log.warning("cannot delete pod %s: %s", meta["name"], e)

    async def sandbox(self, pod: Obj) -> Sandbox:
        """The pod's directory, its ServiceAccount's kubeconfig, its namespace's ConfigMaps."""
        meta = pod["metadata"]
        pod_dir = self.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        await self.watch_configs(meta["namespace"])
        kubeconfig = await self._token(pod, pod_dir)
        return Sandbox(self.node_root, pod_dir, kubeconfig, self.host_ip, self.extra_env)

    def log_link(self, pod: Obj, container: str, log_path: Path) -> None:
        """pods/<ns>_<pod>_<uid>/<container>.log points at the current run's log."""
        link = log_path.parent.parent.parent / f"{container}.log"
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(log_path)

    async def _token(self, pod: Obj, pod_dir: Path) -> Path:
        """A kubeconfig with a token of the pod's ServiceAccount, bound to the pod."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        kubeconfig = pod_dir / "kubeconfig"
        token = ""
        for attempt in range(30):
            try:
                answer = await self.client.post(
                    SERVICE_ACCOUNT_TOKEN, account, "token", meta["namespace"], {
                        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": TOKEN_SECONDS, "boundObjectRef": {
                            "apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                            "uid": meta["uid"]}}})
                token = answer["status"]["token"]
                break
            except (ApiError, OSError) as e:  # the ServiceAccount may not exist yet
                if attempt == 29:
                    log.warning("no token for pod %s (ServiceAccount %s): %s", meta["name"],
                                account, e)
                await asyncio.sleep(1.0)
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "local", "cluster": {
                "server": self.server, "certificate-authority-data": self.ca_data}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": "local", "user": account,
                                                      "namespace": meta["namespace"]}}],
        }
        kubeconfig.write_text(yaml.safe_dump(config))
        kubeconfig.chmod(0o600)
        return kubeconfig

    # ------------------------------------------------------------------ ConfigMaps and Secrets
    def read_config(self, res: Resource, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's or Secret's data (Secrets decoded), from a watch of the namespace."""
        informer = self._configs.get((res, namespace))
        if informer is None:
            return None
        obj = informer.store.get(f"{namespace}/{name}")
        if obj is None:
            return None
        if res == SECRET:
            import base64

            return {k: base64.b64decode(v).decode(errors="replace")
                    for k, v in (obj.get("data") or {}).items()}
        return dict(obj.get("data") or {})

    async def watch_configs(self, namespace: str) -> None:
        """Follow the namespace's ConfigMaps and Secrets, so volumes stay current."""
        started = []
        for res in (CONFIGMAP, SECRET):
            if (res, namespace) in self._configs:
                continue
            informer = Informer(self.client, res, namespace)
            informer.on_change(lambda ev, obj, old: self._config_changed(obj))
            self._configs[res, namespace] = informer
            self._spawn(informer.run())
            started.append(informer)
        for informer in started:
            await informer.synced.wait()

    def _config_changed(self, obj: Obj) -> None:
        namespace = obj["metadata"].get("namespace")
        for worker in self.workers.values():
            if worker.pod["metadata"]["namespace"] == namespace:
                worker.write_volumes()

    # ------------------------------------------------------------------ events
    def event(self, pod: Obj, type_: str, reason: str, message: str) -> None:
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}
        self._spawn(self.recorder.emit(obj, type_, reason, message))

    # ------------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event, node: Obj) -> None:
        if not self._own_ip:
            self.host_ip = next((a["address"] for a in (node.get("status") or {}).get(
                "addresses") or [] if a.get("type") == "InternalIP"), self.host_ip)
        watcher = asyncio.create_task(self.pods.run())
        try:
            await stop.wait()
        finally:
            watcher.cancel()
            for worker in list(self.workers.values()):
                await worker.kill()
            for task in list(self._tasks):
                task.cancel()
            for task in [watcher, *self._tasks]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


def _write_files(target: Path, data: dict[str, str], items: list[Obj] | None) -> None:
    """A configMap/secret volume: the chosen keys as files, each replaced atomically."""
    wanted = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
    for key, rel in wanted.items():
        if key not in data:
            continue
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink():  # what the key's file was replaced with
            shutil.rmtree(path)
        elif path.is_file() and path.read_text(errors="replace") == data[key]:
            continue
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(data[key])
        os.replace(tmp, path)
    for old in target.rglob("*"):
        if old.is_file() and str(old.relative_to(target)) not in wanted.values():
            old.unlink()


def _http_probe(url: str, timeout: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 400, f"HTTP {resp.status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP probe failed with statuscode: {e.code}"
    except OSError as e:
        return False, str(e)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)

