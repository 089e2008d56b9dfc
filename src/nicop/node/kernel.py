"""What the running kernel says of the NIC driver (/proc/modules, mlx5_core's version) and the
driver DaemonSet's probes built on it.

Apart from the driver agent because the probes run as a new process every few seconds in every
driver container: `python -m nicop driver probe KIND` imports only this module and the host's,
so a probe answers well within its timeout on a busy node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from nicop.api.labels import DRIVER_READY_FILE
from nicop.node.host import Host

PROC_MODULES = "/proc/modules"
PROBE_KINDS = ("startup", "liveness", "readiness")


@dataclass(frozen=True)
class Module:
    """A line of /proc/modules."""

    name: str
    refcnt: int
    holders: tuple[str, ...]

    @property
    def users(self) -> int:
        """References that are not other modules: open devices, connections, mounts."""
        return max(0, self.refcnt - len(self.holders))


def loaded_modules(host: Host) -> dict[str, Module]:
    modules = {}
    for line in (host.read(PROC_MODULES) or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        try:
            refcnt = int(fields[2])
        except ValueError:
            refcnt = 0
        holders = tuple(h for h in fields[3].split(",") if h and h != "-")
        modules[fields[0]] = Module(fields[0], refcnt, holders)
    return modules


def loaded_version(host: Host) -> str | None:
    """The running mlx5_core's version; None for the inbox driver, which reports none."""
    return host.read("/sys/module/mlx5_core/version") or None


# An image tag's version: doca3.2.0-25.10-1.2.8.0-1 is driver 25.10-1.2.8.0, container build 1.
_TAG = re.compile(r"^(?:doca[\d.]+-)?(\d+\.\d+-\d+(?:\.\d+)*)(?:-\d+)?$")


def _version_key(version: str) -> list[str]:
    """Comparable parts of a version: DOCA prefix, container build, trailing zeros don't count."""
    version = version.strip()
    if match := _TAG.match(version):
        version = match.group(1)
    parts = re.split(r"[.-]", version)
    while len(parts) > 1 and parts[-1].strip("0") == "":
        parts.pop()
    return parts


def version_matches(loaded: str | None, wanted: str) -> bool:
    """mlx5_core reports `25.10-1.2.8` for the package `25.10-1.2.8.0` and the image tag
    `doca3.2.0-25.10-1.2.8.0-1`: those all match."""
    return loaded is not None and _version_key(loaded) == _version_key(wanted)


def probe(host: Host, kind: str, ready_file: str = DRIVER_READY_FILE,
          version: str | None = None) -> tuple[bool, str]:
    """(ok, one-line reason) for the DaemonSet's startup, liveness and readiness probes.

    startup: the readiness file exists (the driver was validated). liveness: mlx5_core is
    loaded (as upstream's `lsmod | grep mlx5_core`). readiness: both, and when `version` is
    given, mlx5_core reports it.
    """
    if kind not in PROBE_KINDS:
        raise ValueError(f"unknown probe {kind!r}: startup, liveness or readiness")
    ready = host.exists(ready_file)
    modules = loaded_modules(host)
    current = loaded_version(host)
    loaded = "mlx5_core" in modules
    what = f"mlx5_core {current or 'inbox'} loaded"
    if kind == "startup":
        if ready:
            return True, f"driver ready ({what})" if loaded else "driver ready"
        return False, (f"driver not ready yet: {ready_file} does not exist (installing, "
                       "building or validating; see the container log)")
    if not loaded:
        return False, "mlx5_core is not loaded"
    if kind == "liveness":
        return True, what
    if not ready:
        return False, (f"{what}, but {ready_file} does not exist (validation pending or "
                       "failed, or the container is stopping)")
    if version and not version_matches(current, version):
        return False, f"{what}, want {version}"
    return True, f"{what}, ready"



def probe_from_env(kind: str, host: Host, env: Mapping[str, str] = os.environ
                   ) -> tuple[bool, str]:
    """`probe` with what the driver container's environment says (as `nicop driver probe`
    reads its options: $DRIVER_READY_PATH, $NVIDIA_NIC_DRIVER_VER), on `host`."""
    return probe(host, kind, env.get("DRIVER_READY_PATH") or DRIVER_READY_FILE,
                 env.get("NVIDIA_NIC_DRIVER_VER") or None)
