"""How the driver agent installs, loads and unloads kernel modules: one interface, two backends.

The agent decides *what* to do (which version, which modules, in which order); a backend does it.
`HostBackend` runs the distro's package manager, the driver's build script, `modprobe` and
`rmmod` as subprocesses, as the upstream driver container does. The simulated backend in
`nicop_sim.kernel` does the same to a fixture tree, so every decision of the agent is tested
without root or a ConnectX card.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger("nicop.driver")

PACKAGE_SUFFIXES = (".deb", ".rpm")
# Where the host's own /lib/modules is mounted in the driver container (`modprobe -d /host`).
HOST_MODULES_ROOT = "/host"


class BackendError(Exception):
    """A step on the host failed; the message says which command and why."""


class DriverBackend(Protocol):
    """What the agent needs from the host to put a driver version in place."""

    def installed_version(self, kernel: str) -> str | None:
        """Version of the driver installed for `kernel` (what modprobe would load), if any."""
        ...

    def precompiled_available(self, version: str, kernel: str) -> bool:
        """Whether packages of `version` built for `kernel` exist, so no build is needed."""
        ...

    def install_precompiled(self, version: str, kernel: str) -> None:
        """Install the precompiled packages of `version` for `kernel`."""
        ...

    def build_and_install(self, version: str, kernel: str) -> None:
        """Build `version` from sources against `kernel`'s headers, then install it."""
        ...

    def load(self, module: str, inbox: bool = False) -> None:
        """modprobe `module` (with its dependencies); `inbox` loads the host's own build."""
        ...

    def unload(self, module: str) -> None:
        """rmmod `module`; raises BackendError when the kernel refuses (in use)."""
        ...


Runner = Callable[[Sequence[str]], str]


def run_logged(cmd: Sequence[str]) -> str:
    """Run `cmd`, logging each output line as it comes (a build prints for minutes).

    Returns the output; raises BackendError with the last lines when the command fails.
    """
    log.info("running %s", " ".join(cmd))
    try:
        proc = subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError as e:
        raise BackendError(f"cannot run {cmd[0]}: {e}") from None
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        lines.append(line)
        log.info("  %s", line)
    if proc.wait() != 0:
        tail = "; ".join(lines[-5:]) or "no output"
        raise BackendError(f"{' '.join(cmd)} exited with {proc.returncode}: {tail}")
    return "\n".join(lines)


def package_install_command(os_id: str, packages: Sequence[Path]) -> list[str]:
    """The package manager command that installs local package files on this distro."""
    files = [str(p) for p in packages]
    if os_id in ("ubuntu", "debian"):
        return ["apt-get", "install", "-y", "--allow-downgrades", "--no-install-recommends",
                *files]
    if os_id in ("rhel", "rhcos", "centos", "rocky", "almalinux", "ol", "fedora"):
        return ["dnf", "install", "-y", "--allowerasing", *files]
    if os_id in ("sles", "sle", "opensuse-leap"):
        return ["zypper", "--non-interactive", "install", "--allow-unsigned-rpm", "--oldpackage",
                *files]
    raise BackendError(f"no package manager known for OS {os_id!r} (supported: ubuntu, debian, "
                       "rhel, rhcos, centos, rocky, almalinux, ol, fedora, sles)")


class HostBackend:
    """The real node: driver sources in the image, a package cache per kernel, kmod tools.

    `inventory` (NVIDIA_NIC_DRIVERS_INVENTORY_PATH) keeps the packages built for each
    kernel and version, `<inventory>/<kernel>/<version>/`, so a restarted container installs
    them instead of compiling again. `sources` (NVIDIA_NIC_DRIVER_PATH) holds the driver
    sources with their `install.pl`.
    """

    def __init__(
        self,
        os_id: str,
        sources: Path | None,
        inventory: Path | None,
        *,
        nfsrdma: bool = False,
        runner: Runner = run_logged,
    ) -> None:
        self.os_id = os_id
        self.sources = sources
        self.inventory = inventory
        self.nfsrdma = nfsrdma
        self.run = runner

    def _packages_dir(self, version: str, kernel: str) -> Path | None:
        return self.inventory / kernel / version if self.inventory else None

    def _packages(self, directory: Path) -> list[Path]:
        if not directory.is_dir():
            return []
        return sorted(p for p in directory.iterdir() if p.suffix in PACKAGE_SUFFIXES)

    def installed_version(self, kernel: str) -> str | None:
        try:
            out = self.run(["modinfo", "-k", kernel, "-F", "version", "mlx5_core"]).strip()
        except BackendError:
            return None
        return out or None  # the inbox module has no version field

    def precompiled_available(self, version: str, kernel: str) -> bool:
        directory = self._packages_dir(version, kernel)
        return directory is not None and bool(self._packages(directory))

    def install_precompiled(self, version: str, kernel: str) -> None:
        directory = self._packages_dir(version, kernel)
        packages = self._packages(directory) if directory else []
        if not packages:
            raise BackendError(f"no packages of driver {version} for kernel {kernel} in "
                               f"{directory}")
        self.run(package_install_command(self.os_id, packages))
        self.run(["depmod", "-a", kernel])

    def build_command(self, kernel: str, out_dir: Path) -> list[str]:
        """install.pl in build-only mode against the running kernel's headers."""
        if self.sources is None:
            raise BackendError("no driver sources to build from: set NVIDIA_NIC_DRIVER_PATH")
        cmd = [str(self.sources / "install.pl"), "--build-only", "--without-depcheck",
               "--kernel", kernel, "--kernel-sources", f"/lib/modules/{kernel}/build",
               "--tmpdir", str(out_dir)]
        if not self.nfsrdma:
            if self.os_id in ("sles", "sle", "opensuse-leap"):
                cmd += ["--without-mlnx-nfsrdma", "--without-mlnx-nvme"]
            else:
                cmd += ["--without-mlnx-nfsrdma-modules", "--without-mlnx-nvme-modules"]
        return cmd

    def build_and_install(self, version: str, kernel: str) -> None:
        out_dir = Path("/tmp") / f"nic-driver-build-{kernel}-{version}"
        out_dir.mkdir(parents=True, exist_ok=True)
        self.run(self.build_command(kernel, out_dir))
        built = sorted(p for p in out_dir.rglob("*") if p.suffix in PACKAGE_SUFFIXES)
        if not built:
            raise BackendError(f"the build of driver {version} produced no packages in {out_dir}")
        target = self._packages_dir(version, kernel)
        if target is not None:
            # Kept for the next start of the container on this node: no second compile.
            target.mkdir(parents=True, exist_ok=True)
            for p in built:
                shutil.copy2(p, target / p.name)
            log.info("kept %d packages in %s for the next start", len(built), target)
        self.run(package_install_command(self.os_id, built))
        self.run(["depmod", "-a", kernel])

    def load(self, module: str, inbox: bool = False) -> None:
        self.run(["modprobe", *(["-d", HOST_MODULES_ROOT] if inbox else []), module])

    def unload(self, module: str) -> None:
        self.run(["rmmod", module])
