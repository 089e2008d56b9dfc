"""Run `nicop operator` as a real process against the test cluster, and read its metrics; run
`nicop plan` as a user does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from nicop.kube.client import WRITE_VERBS
from nicop_sim.cluster import free_port

METRIC = re.compile(r'^nicop_api_requests_total\{resource="([^"]+)",verb="([^"]+)"\} ([0-9.e+]+)$')
RECONCILE_METRIC = re.compile(
    r'^nicop_reconcile_total\{controller="([^"]+)",result="[^"]+"\} ([0-9.e+]+)$', re.MULTILINE)


NAMESPACE = "nvidia-network-operator"


def nicop_plan(kubeconfig: Path, policy_file: Path, namespace: str, *args: str
               ) -> subprocess.CompletedProcess[str]:
    """`nicop plan -f FILE` as a user runs it."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "nicop"), "plan", "-f", str(policy_file),
         "--kubeconfig", str(kubeconfig), "-n", namespace, *args],
        capture_output=True, text=True, timeout=120)


def audited_writes(audit_log: Path, command: str) -> tuple[list[str], list[str]]:
    """What the API server's audit log holds of `nicop COMMAND`'s writes (its User-Agent names
    the command): the writes, and the dry runs, each as "VERB URI"."""
    writes: list[str] = []
    dry_runs: list[str] = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("userAgent", "").endswith(f" ({command})"):
            uri = event["requestURI"]
            (dry_runs if "dryRun=All" in uri else writes).append(f"{event['verb']} {uri}")
    return writes, dry_runs


class OperatorProcess:
    def __init__(self, kubeconfig: Path, namespace: str, log: Path,
                 lease_duration: float = 4, env: dict[str, str] | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.lease_duration = lease_duration
        self.port = free_port()
        self.log = log
        self.env = env
        env = {**os.environ, "POD_NAMESPACE": namespace, **(env or {})}
        self._log_file = open(log, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nicop", "operator", "--kubeconfig", str(kubeconfig),
             "--health-port", str(self.port), "--lease-duration", str(lease_duration),
             "--log-format", "json"],
            env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, ""
        except OSError:
            return 0, ""

    def leading(self) -> bool:
        return "\nnicop_leader 1.0" in self.get("/metrics")[1]

    def wait_ready(self, timeout: float = 30) -> None:
        """Until this process leads with its caches synced."""
        deadline = time.monotonic() + timeout
        while not (self.get("/readyz")[0] == 200 and self.leading()):
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-3000:]
                raise AssertionError(f"operator exited; see {self.log}:\n{tail}")
            if time.monotonic() > deadline:
                raise AssertionError(f"operator not ready in {timeout}s; see {self.log}")
            time.sleep(0.1)

    def writes(self) -> dict[tuple[str, str], float]:
        """Write requests sent so far by (verb, resource), lease renewals and Events left out."""
        _, text = self.get("/metrics")
        counts = {}
        for line in text.splitlines():
            m = METRIC.match(line)
            if m and m.group(2) in WRITE_VERBS and m.group(1) not in ("leases", "events"):
                counts[m.group(2), m.group(1)] = float(m.group(3))
        return counts

    def requests(self, verb: str, resource: str) -> float:
        """Requests of one verb on one resource sent so far."""
        _, text = self.get("/metrics")
        return sum(float(m.group(3)) for line in text.splitlines()
                   if (m := METRIC.match(line)) and m.group(1) == resource
                   and m.group(2) == verb)

    def reconciles(self, controller: str) -> float:
        """Reconciles the controller has finished (either result): evidence it had its chance."""
        _, text = self.get("/metrics")
        return sum(float(m.group(2)) for m in RECONCILE_METRIC.finditer(text)
                   if m.group(1) == controller)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_file.close()

    def restart(self) -> None:
        """Stop (if running) and start again with the same settings."""
        self.stop()
        self.__init__(self.kubeconfig, self.namespace, self.log,  # type: ignore[misc]
                      self.lease_duration, self.env)
        self.wait_ready()
