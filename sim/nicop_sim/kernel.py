"""A simulated kernel module loader acting on a node's fixture tree, and a driver backend on it.

`SimulatedKernel` keeps what `lsmod` and friends read in the tree: `/proc/modules`, and for each
loaded module `/sys/module/<m>/` with `initstate`, `refcnt`, `holders/`, `srcversion`, `taint`
and, for modules of the NVIDIA driver package only, `version` (inbox mlx5 has none). Module
files live in `/lib/modules/<release>/kernel/` (the distro's inbox build) and `.../updates/`
(what the driver package installs; depmod ranks it first). Each `.ko` is a small JSON document
(name, dependencies, version) standing in for the ELF file.

The loader keeps the kernel's rules: modprobe loads dependencies first and prefers `updates/`;
rmmod refuses a module that another module or a process holds (EBUSY, naming the holders); a
module refuses to load against a dependency from another build ("disagrees about version of
symbol"), which is what happens when an old ib_core stays loaded under a new mlx5_ib. Loading
and unloading change the hardware tree of `nicop_sim.hardware` as the drivers would: mlx5_core
binds the ConnectX functions (netdevs appear; VFs go away when it unloads), mlx5_ib adds the RDMA
devices with their uverbs/umad character devices, rdma_ucm adds `/dev/infiniband/rdma_cm`.
Simplifications: the IPoIB netdev of an InfiniBand port comes and goes with mlx5_core (on a real
node ib_ipoib creates it), and only the RDMA-side dependencies of the modules are modelled.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nicop.node.driver_backends import BackendError
from nicop_sim.hardware import PCI_DEVICES, SimulatedHost

DRIVER_TAINT = "OE"  # out-of-tree, unsigned: what the driver package's modules show

# The kernel's modules.dep for the modules on the RDMA path (hardware.md §6), inbox build.
INBOX_MODULES: dict[str, tuple[str, ...]] = {
    "mlxfw": (),
    "psample": (),
    "tls": (),
    "mlx5_core": ("mlxfw", "psample", "tls"),
    "ib_core": (),
    "ib_cm": ("ib_core",),
    "iw_cm": ("ib_core",),
    "rdma_cm": ("ib_cm", "iw_cm", "ib_core"),
    "ib_uverbs": ("ib_core",),
    "ib_umad": ("ib_core",),
    "rdma_ucm": ("rdma_cm", "ib_uverbs", "ib_core"),
    "ib_ipoib": ("ib_cm", "ib_core"),
    "mlx5_ib": ("mlx5_core", "ib_core", "ib_uverbs"),
    # storage protocols over RDMA
    "ib_iser": ("rdma_cm", "ib_core"),
    "ib_isert": ("rdma_cm", "ib_core"),
    "ib_srp": ("rdma_cm", "ib_cm", "ib_core"),
    "ib_srpt": ("rdma_cm", "ib_cm", "ib_core"),
    "nvme_rdma": ("rdma_cm", "ib_core"),
    "nvmet_rdma": ("rdma_cm", "ib_core"),
    "rpcrdma": ("rdma_cm", "ib_core"),
    # other vendors' RDMA drivers, and software RDMA
    "irdma": ("ib_core", "ib_uverbs"),
    "bnxt_re": ("ib_core", "ib_uverbs"),
    "siw": ("ib_core",),
    "rdma_rxe": ("ib_core", "ib_uverbs"),
}
# Out-of-tree modules a GPU node may have that use ib_core (GPUDirect RDMA).
OTHER_MODULES: dict[str, tuple[str, ...]] = {"nvidia_peermem": ("ib_core",)}
# What the NVIDIA driver package installs: the RDMA stack again, on its compat layer.
DRIVER_MODULES: dict[str, tuple[str, ...]] = {
    "mlx_compat": (),
    "mlxdevm": ("mlx_compat",),
    "mlxfw": ("mlx_compat",),
    "mlx5_core": ("mlxfw", "mlxdevm", "mlx_compat", "psample", "tls"),
    **{
        name: (*deps, "mlx_compat")
        for name, deps in INBOX_MODULES.items()
        if name not in ("mlxfw", "psample", "tls", "mlx5_core", "irdma", "bnxt_re", "siw",
                        "rdma_rxe")
    },
}
# What a node boots with when the NIC is present: udev loads these (rdma-core's rules).
BOOT_MODULES = ("mlx5_core", "mlx5_ib", "ib_uverbs", "ib_umad", "ib_ipoib", "rdma_ucm")
SIZES = {"mlx5_core": 2355200, "mlx5_ib": 466944, "ib_core": 430080, "ib_uverbs": 163840,
         "mlx_compat": 20480, "rdma_cm": 135168, "ib_ipoib": 143360}
MELLANOX_VENDOR = "0x15b3"


def _srcversion(name: str, build: str) -> str:
    return hashlib.md5(f"{name}/{build}".encode()).hexdigest()[:23].upper()


class SimulatedKernel:
    """The module loader of a simulated node, whose state is all in the tree under `root`."""

    def __init__(self, root: Path | str) -> None:
        self.host = SimulatedHost(root)
        self.fail_probe: set[str] = set()  # PCI functions mlx5_core fails to probe
        self.fail_load: dict[str, str] = {}  # module -> the error modprobe reports

    # -------------------------------------------------------------------- setup
    @classmethod
    def boot(
        cls,
        root: Path | str,
        release: str = "5.15.0-122-generic",
        *,
        driver_version: str | None = None,
        loaded: Iterable[str] = BOOT_MODULES,
        os_id: str = "ubuntu",
        os_version: str = "22.04",
    ) -> SimulatedKernel:
        """Give the node at `root` (built by SimulatedHost) a running kernel.

        The inbox modules are installed; with `driver_version` the driver package is installed
        too and its modules are the ones loaded. `loaded` lists what runs at boot (dependencies
        follow); an empty list leaves the NICs without a driver.
        """
        kernel = cls(root)
        host = kernel.host
        host.path("/proc/sys/kernel").mkdir(parents=True, exist_ok=True)
        host.path("/proc/sys/kernel/osrelease").write_text(release + "\n")
        os_release = host.path("/etc/os-release")
        if not os_release.exists():
            os_release.parent.mkdir(parents=True, exist_ok=True)
            os_release.write_text(f'ID={os_id}\nVERSION_ID="{os_version}"\n')
        for name, deps in {**INBOX_MODULES, **OTHER_MODULES}.items():
            build = "inbox" if name in INBOX_MODULES else "out-of-tree"
            kernel._write_ko("kernel", name, deps, None, build)
        if driver_version:
            kernel.install_driver(driver_version)
        kernel._write_proc_modules()
        # Start from bare hardware, so the devices are exactly what the loaded modules make.
        kernel._mlx5_core_gone()
        for name in loaded:
            kernel.modprobe(name)
        return kernel

    @property
    def release(self) -> str:
        return (self.host.read("/proc/sys/kernel/osrelease") or "").strip()

    # The driver packages' view of this node: a kernel they have no precompiled driver for (a
    # custom or just-updated kernel), which a test sets and clears.
    NO_PRECOMPILED = "/etc/nicop-sim/no-precompiled-driver"

    def withhold_precompiled(self, withheld: bool = True) -> None:
        marker = self.host.path(self.NO_PRECOMPILED)
        if withheld:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(self.release + "\n")
        else:
            marker.unlink(missing_ok=True)

    def has_precompiled(self) -> bool:
        return (self.host.read(self.NO_PRECOMPILED) or "").strip() != self.release

    def _modules_dir(self, tree: str) -> str:
        return f"/lib/modules/{self.release}/{tree}"

    def _write_ko(
        self, tree: str, name: str, deps: tuple[str, ...], version: str | None, build: str
    ) -> None:
        path = self.host.path(f"{self._modules_dir(tree)}/{name}.ko")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"name": name, "depends": list(deps), "version": version,
                                    "build": build, "srcversion": _srcversion(name, build)}))

    def install_driver(self, version: str) -> None:
        """What installing the driver packages does: modules in updates/, replacing older ones."""
        shutil.rmtree(self.host.path(self._modules_dir("updates")), ignore_errors=True)
        for name, deps in DRIVER_MODULES.items():
            self._write_ko("updates", name, deps, version, f"driver-{version}")

    def installed_version(self) -> str | None:
        info = self._modinfo("updates", "mlx5_core")
        return str(info["version"]) if info and info.get("version") else None

    def _modinfo(self, tree: str, name: str) -> dict[str, Any] | None:
        text = self.host.read(f"{self._modules_dir(tree)}/{name}.ko")
        return dict(json.loads(text)) if text else None

    # -------------------------------------------------------------------- queries
    def loaded(self) -> list[str]:
        """Loaded modules, the most recently loaded first (as /proc/modules lists them)."""
        entries = [(self.host.read_int(f"/sys/module/{name}/.sim/seq") or 0, name)
                   for name in self.host.listdir("/sys/module") if self.is_loaded(name)]
        return [name for _, name in sorted(entries, reverse=True)]

    def is_loaded(self, name: str) -> bool:
        """A module is loaded once its `initstate` is there: written last when it loads and
        removed first when it unloads, so a process killed halfway (an agent's container
        killed mid-unload) leaves it wholly loaded or not, as the kernel's own rmmod does."""
        return self.host.exists(f"/sys/module/{name}/initstate")

    def holders(self, name: str) -> list[str]:
        """The loaded modules that use `name` (a link left by one killed mid-unload is none)."""
        return [h for h in self.host.listdir(f"/sys/module/{name}/holders") if self.is_loaded(h)]

    def version(self, name: str) -> str | None:
        return self.host.read(f"/sys/module/{name}/version")

    def _users(self, name: str) -> int:
        return self.host.read_int(f"/sys/module/{name}/.sim/users") or 0

    def _build(self, name: str) -> str:
        return self.host.read(f"/sys/module/{name}/.sim/build") or ""

    # -------------------------------------------------------------------- processes
    def hold(self, name: str, count: int = 1) -> None:
        """A process opens a device of `name` (a pod using /dev/infiniband/uverbs0): refcnt up."""
        self._set_users(name, self._users(name) + count)

    def _set_users(self, name: str, users: int) -> None:
        if not self.is_loaded(name):
            raise FileNotFoundError(errno.ENOENT, f"module {name} is not loaded")
        self.host.path(f"/sys/module/{name}/.sim/users").write_text(f"{users}\n")
        self._update_refcnt(name)
        self._write_proc_modules()

    # -------------------------------------------------------------------- modprobe / rmmod
    def modprobe(self, name: str, inbox: bool = False) -> None:
        """Load `name` and what it needs; a loaded module is left alone (as modprobe does).

        `inbox` ignores the driver package (`modprobe -d /host`, the host's own modules).
        """
        self._write_proc_modules()  # what a process killed before writing it left behind
        self._load(name, inbox)

    def _load(self, name: str, inbox: bool) -> None:
        if self.is_loaded(name):
            return
        tree = "updates"
        info = None if inbox else self._modinfo("updates", name)
        if info is None:
            tree, info = "kernel", self._modinfo("kernel", name)
        if info is None:
            raise FileNotFoundError(
                errno.ENOENT, f"modprobe: FATAL: Module {name} not found in directory "
                f"/lib/modules/{self.release}")
        deps = [str(d) for d in info["depends"]]
        for dep in deps:
            self._load(dep, inbox)
        build = str(info["build"])
        for dep in deps:
            # A dependency the driver package also ships must come from the same build.
            ships = self._modinfo("updates", dep) is not None
            if (ships and tree == "updates" and self._build(dep) != build) or (
                    tree == "kernel" and self._build(dep).startswith("driver-")):
                raise OSError(errno.EINVAL, f"modprobe: ERROR: could not insert '{name}': "
                              f"Invalid argument ({name}: disagrees about version of symbols "
                              f"of {dep})")
        if name in self.fail_load:
            raise OSError(errno.EINVAL, f"modprobe: ERROR: could not insert '{name}': "
                          f"{self.fail_load[name]}")
        self._register(name, deps, info, build, tree)
        self._after_load(name)
        self._write_proc_modules()

    def rmmod(self, name: str) -> None:
        """Unload `name` alone, refusing as the kernel does while anything holds it."""
        self._write_proc_modules()  # what a process killed before writing it left behind
        if not self.is_loaded(name):
            raise FileNotFoundError(errno.ENOENT, f"rmmod: ERROR: Module {name} is not "
                                    "currently loaded")
        holders = self.holders(name)
        if holders:
            raise OSError(errno.EBUSY, f"rmmod: ERROR: Module {name} is in use by: "
                          f"{' '.join(holders)}")
        if self._users(name):
            raise OSError(errno.EBUSY, f"rmmod: ERROR: Module {name} is in use")
        self._before_unload(name)
        module = f"/sys/module/{name}"
        os.unlink(self.host.path(f"{module}/initstate"))  # unloaded from here on
        deps = (self.host.read(f"{module}/.sim/depends") or "").split()
        for dep in deps:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.host.path(f"/sys/module/{dep}/holders/{name}"))
            self._update_refcnt(dep)
        shutil.rmtree(self.host.path(module))
        self._write_proc_modules()

    def _register(
        self, name: str, deps: list[str], info: dict[str, Any], build: str, tree: str
    ) -> None:
        module = f"/sys/module/{name}"
        seq = max((self.host.read_int(f"/sys/module/{m}/.sim/seq") or 0
                   for m in self.loaded()), default=0) + 1
        files = {
            "refcnt": "0", "srcversion": str(info["srcversion"]),
            "coresize": str(SIZES.get(name, 65536)),
            "taint": DRIVER_TAINT if tree == "updates" or build == "out-of-tree" else "",
            ".sim/seq": str(seq), ".sim/users": "0", ".sim/build": build,
            ".sim/depends": " ".join(deps),
        }
        if info.get("version"):
            files["version"] = str(info["version"])
        for attr, value in files.items():
            path = self.host.path(f"{module}/{attr}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value}\n")
        self.host.path(f"{module}/holders").mkdir(exist_ok=True)
        for dep in deps:
            link = self.host.path(f"/sys/module/{dep}/holders/{name}")
            if not os.path.lexists(link):
                os.symlink(f"../../{name}", link)
        self.host.path(f"{module}/initstate").write_text("live\n")  # loaded from here on
        for dep in deps:
            self._update_refcnt(dep)

    def _update_refcnt(self, name: str) -> None:
        refcnt = len(self.holders(name)) + self._users(name)
        self.host.path(f"/sys/module/{name}/refcnt").write_text(f"{refcnt}\n")

    def _write_proc_modules(self) -> None:
        """/proc/modules: name size refcnt holders, state address (taint), newest first."""
        lines = []
        for name in self.loaded():
            module = f"/sys/module/{name}"
            holders = self.holders(name)
            taint = self.host.read(f"{module}/taint") or ""
            lines.append(
                f"{name} {self.host.read(f'{module}/coresize')} "
                f"{self.host.read(f'{module}/refcnt')} "
                f"{''.join(h + ',' for h in holders) or '-'} Live 0x0000000000000000"
                + (f" ({taint})" if taint else "")
            )
        path = self.host.path("/proc/modules")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))

    # -------------------------------------------------------------------- devices
    def _mellanox_pfs(self) -> list[str]:
        return [a for a in self.host.functions()
                if self.host.read(f"{PCI_DEVICES}/{a}/vendor") == MELLANOX_VENDOR
                and not self.host.exists(f"{PCI_DEVICES}/{a}/physfn")]

    def _bound(self) -> list[str]:
        """Functions (PFs and VFs) that mlx5_core drives."""
        return [a for a in self.host.functions()
                if self.host.link_name(f"{PCI_DEVICES}/{a}/driver") == "mlx5_core"]

    def _after_load(self, name: str) -> None:
        if name == "mlx5_core":
            for address in self._mellanox_pfs():
                if address in self.fail_probe or address in self._bound():
                    continue
                self.host.bind_driver(address, "mlx5_core")
                if not self.is_loaded("mlx5_ib"):
                    self.host.remove_rdma(address)
        elif name == "mlx5_ib":
            for address in self._bound():
                if self.host.rdma_device(address) is None:
                    self.host.add_rdma(address)
        elif name == "rdma_ucm":
            for path, content in (("/dev/infiniband/rdma_cm", ""),
                                  ("/sys/class/misc/rdma_cm/abi_version", "4\n")):
                self.host.path(path).parent.mkdir(parents=True, exist_ok=True)
                self.host.path(path).write_text(content)

    def _before_unload(self, name: str) -> None:
        if name == "mlx5_core":
            self._mlx5_core_gone()
        elif name == "mlx5_ib":
            for address in self._bound():
                self.host.remove_rdma(address)
        elif name == "rdma_ucm":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.host.path("/dev/infiniband/rdma_cm"))
            shutil.rmtree(self.host.path("/sys/class/misc/rdma_cm"), ignore_errors=True)

    def _mlx5_core_gone(self) -> None:
        """mlx5_core's remove: SR-IOV disabled (VFs vanish), then each PF unbound."""
        for address in self._mellanox_pfs():
            if (self.host.read_int(f"{PCI_DEVICES}/{address}/sriov_numvfs") or 0) > 0:
                self.host.set_numvfs(address, 0)
            if address in self._bound():
                self.host.bind_driver(address, None)


class SimulatedBackend:
    """The driver backend of a simulated node: packages and builds are instant (or take
    `build_seconds`), and the kernel is a `SimulatedKernel`.

    `precompiled` lists the versions with packages for the running kernel; any other version
    is built from sources. `fail_build` makes a build fail with that compiler message.
    """

    def __init__(
        self,
        kernel: SimulatedKernel,
        precompiled: Iterable[str] = (),
        *,
        build_seconds: float = 0.0,
        fail_build: str | None = None,
    ) -> None:
        self.kernel = kernel
        self.precompiled = set(precompiled)
        self.build_seconds = build_seconds
        self.fail_build = fail_build
        self.builds: list[tuple[str, str]] = []  # (version, kernel) of every build
        self.commands: list[str] = []  # modprobe/rmmod in the order they ran

    def installed_version(self, kernel: str) -> str | None:
        return self.kernel.installed_version() if kernel == self.kernel.release else None

    def precompiled_available(self, version: str, kernel: str) -> bool:
        return (version in self.precompiled and kernel == self.kernel.release
                and self.kernel.has_precompiled())

    def install_precompiled(self, version: str, kernel: str) -> None:
        if not self.precompiled_available(version, kernel):
            raise BackendError(f"no precompiled packages of {version} for kernel {kernel}")
        self.kernel.install_driver(version)

    def build_and_install(self, version: str, kernel: str) -> None:
        self.builds.append((version, kernel))
        time.sleep(self.build_seconds)
        if self.fail_build:
            raise BackendError(f"build of driver {version} for kernel {kernel} failed: "
                               f"{self.fail_build}")
        self.kernel.install_driver(version)

    def load(self, module: str, inbox: bool = False) -> None:
        self.commands.append(f"modprobe {'-d /host ' if inbox else ''}{module}")
        try:
            self.kernel.modprobe(module, inbox=inbox)
        except OSError as e:
            raise BackendError(e.strerror or str(e)) from None

    def unload(self, module: str) -> None:
        self.commands.append(f"rmmod {module}")
        try:
            self.kernel.rmmod(module)
        except OSError as e:
            raise BackendError(e.strerror or str(e)) from None
