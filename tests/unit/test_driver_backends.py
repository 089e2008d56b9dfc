"""The host backend's commands: what the driver container runs on a real node."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from nicop.node.driver_backends import BackendError, HostBackend, package_install_command

KERNEL = "5.15.0-122-generic"


class Recorder:
    """Stands in for subprocess: records commands, answers modinfo, 'builds' packages."""

    def __init__(self, modinfo: str = "") -> None:
        self.commands: list[list[str]] = []
        self.modinfo = modinfo

    def __call__(self, cmd: Sequence[str]) -> str:
        self.commands.append(list(cmd))
        if cmd[0] == "modinfo":
            if not self.modinfo:
                raise BackendError("modinfo: ERROR: Module mlx5_core not found.")
            return self.modinfo + "\n"
        if cmd[0].endswith("install.pl"):
            out = Path(cmd[cmd.index("--tmpdir") + 1]) / "DEBS"
            out.mkdir(parents=True, exist_ok=True)
            for name in ("mlnx-ofed-kernel-modules_24.10.deb", "mlnx-ofed-kernel-utils_24.10.deb"):
                (out / name).write_text("")
        return ""


def test_package_commands_per_distro() -> None:
    pkgs = [Path("/inv/a.deb")]
    assert package_install_command("ubuntu", pkgs)[:2] == ["apt-get", "install"]
    assert package_install_command("rhel", [Path("/inv/a.rpm")])[:2] == ["dnf", "install"]
    assert package_install_command("sles", [Path("/inv/a.rpm")])[0] == "zypper"
    with pytest.raises(BackendError, match="no package manager known for OS 'gentoo'"):
        package_install_command("gentoo", pkgs)


def test_installed_version_asks_modinfo_for_the_running_kernel() -> None:
    assert HostBackend("ubuntu", None, None, runner=Recorder("24.10-1.1.4")).installed_version(
        KERNEL) == "24.10-1.1.4"
    recorder = Recorder()
    assert HostBackend("ubuntu", None, None, runner=recorder).installed_version(KERNEL) is None
    assert recorder.commands == [["modinfo", "-k", KERNEL, "-F", "version", "mlx5_core"]]


def test_build_keeps_packages_in_the_inventory_and_installs_them(tmp_path: Path) -> None:
    recorder = Recorder()
    backend = HostBackend("ubuntu", tmp_path / "src", tmp_path / "inv", runner=recorder)
    assert not backend.precompiled_available("24.10-1.1.4.0", KERNEL)
    backend.build_and_install("24.10-1.1.4.0", KERNEL)
    build, install, depmod = recorder.commands
    assert build[:2] == [str(tmp_path / "src/install.pl"), "--build-only"]
    assert build[build.index("--kernel") + 1] == KERNEL
    assert "--without-mlnx-nfsrdma-modules" in build  # ENABLE_NFSRDMA is off
    assert install[:2] == ["apt-get", "install"] and install[-1].endswith(".deb")
    assert depmod == ["depmod", "-a", KERNEL]
    # The next start of the container installs those instead of compiling.
    assert backend.precompiled_available("24.10-1.1.4.0", KERNEL)
    recorder.commands.clear()
    backend.install_precompiled("24.10-1.1.4.0", KERNEL)
    assert [c[0] for c in recorder.commands] == ["apt-get", "depmod"]
    assert str(tmp_path / "inv" / KERNEL / "24.10-1.1.4.0") in recorder.commands[0][-1]


def test_nfsrdma_build_and_module_commands(tmp_path: Path) -> None:
    recorder = Recorder()
    backend = HostBackend("sles", tmp_path, None, nfsrdma=True, runner=recorder)
    assert not any(a.startswith("--without-mlnx") for a in backend.build_command(KERNEL, tmp_path))
    assert "--without-mlnx-nvme" in HostBackend("sles", tmp_path, None).build_command(
        KERNEL, tmp_path)
    backend.load("mlx5_core")
    backend.load("mlx5_core", inbox=True)
    backend.unload("ib_core")
    assert recorder.commands == [["modprobe", "mlx5_core"],
                                 ["modprobe", "-d", "/host", "mlx5_core"],
                                 ["rmmod", "ib_core"]]
    with pytest.raises(BackendError, match="set NVIDIA_NIC_DRIVER_PATH"):
        HostBackend("ubuntu", None, None, runner=recorder).build_and_install("x", KERNEL)
