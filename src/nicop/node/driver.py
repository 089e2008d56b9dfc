"""`nicop driver`: the NVIDIA NIC driver container's entrypoint, acting on the node through `Host`.

It puts the wanted driver version in place and keeps it there for the life of the pod:

1. read what runs (`/proc/modules`, `/sys/module/mlx5_core/version`, absent for the inbox
   driver) and stop there when the wanted version is already loaded;
2. preflight, before a long compile and before a drain (nicop.node.preflight): hold, showing the
   cause and the fix on the node, while the reload would cut the node's management interface,
   a module the switches do not allow to unload holds the driver (a storage protocol, another
   vendor's RDMA driver), or forcePrecompiled finds no driver for the running kernel; go on as
   soon as the cause is gone;
3. install the version for the running kernel: precompiled packages when there are some, else a
   build from sources (the node keeps working meanwhile);
4. with safe load, annotate the node and wait until the upgrade controller has drained it and
   removed the annotation;
5. unload the old modules in dependency order and load the new ones;
6. validate (modules loaded, the version reported, every netdev and RDMA device of the NICs
   back) and only then write the readiness file the startup probe looks for.

On SIGTERM the readiness file goes first; with RESTORE_DRIVER_ON_POD_TERMINATION the inbox
driver is loaded again. Every step is logged with the module or device it concerns, because
users watch this log while the driver compiles.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import Gauge, Histogram

from nicop.api.labels import DRIVER_READY_FILE, SAFE_LOAD_ANNOTATION
from nicop.kube.client import ApiClient
from nicop.kube.resources import NODE
from nicop.node import discovery, preflight
from nicop.node.driver_backends import BackendError, DriverBackend
from nicop.node.host import Host
from nicop.node.kernel import Module, loaded_modules, loaded_version, version_matches

log = logging.getLogger("nicop.driver")

_MODULE_SECONDS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
DRIVER_INFO = Gauge("nicop_driver_info", "1 for the driver version loaded on this node "
                    "(`inbox` for the kernel's own mlx5_core)", ["version"])
LOAD_SECONDS = Histogram("nicop_driver_load_seconds",
                         "Duration of loading the driver's modules", buckets=_MODULE_SECONDS)
UNLOAD_SECONDS = Histogram("nicop_driver_unload_seconds",
                           "Duration of unloading the driver's modules", buckets=_MODULE_SECONDS)

READY_FILE = DRIVER_READY_FILE
# Host /etc is mounted at /host/etc in the driver container.
UDEV_RULES_FILE = "/host/etc/udev/rules.d/77-mlnx-net-names.rules"
OSRELEASE = "/proc/sys/kernel/osrelease"

# The driver proper: the modules the upstream init container checks and blacklists.
DRIVER_MODULES = ("mlx5_core", "mlx5_ib", "ib_umad", "ib_uverbs", "ib_ipoib", "rdma_cm",
                  "rdma_ucm", "ib_core", "ib_cm")
# Modules of the same package that go with it: the old ones must go before the new ones load.
DRIVER_FAMILY = (*DRIVER_MODULES, "iw_cm", "mlxfw", "mlxdevm", "mlx_compat", "mlx5_vdpa",
                 "mlx5_fwctl", "mlx5_dpll", "mlx5_vfio_pci")
# Loaded after a reload (their dependencies follow), as the driver's own init script does.
LOAD_MODULES = ("mlx5_core", "mlx5_ib", "ib_uverbs", "ib_umad", "ib_ipoib", "rdma_ucm")
# Storage protocols over RDMA that hold ib_core/rdma_cm (upstream STORAGE_MODULES plus iSER/SRP
# initiators).
STORAGE_MODULES = ("ib_iser", "ib_isert", "ib_srp", "ib_srpt", "nvme_rdma", "nvmet_rdma",
                   "rpcrdma", "xprtrdma")
# The NFS and NVMe ones: the driver builds its own only with ENABLE_NFSRDMA.
NFSRDMA_MODULES = ("nvme_rdma", "nvmet_rdma", "rpcrdma", "xprtrdma")
# Other vendors' RDMA drivers (and software RDMA) that sit on ib_core, so an ib_core reload needs
# them gone. A small, common set rather than rdma-core's full list: Broadcom, Intel (irdma, and
# the Omni-Path/TrueScale hfi1/ib_qib with rdmavt), Marvell/QLogic, AWS, Alibaba, Microsoft,
# Chelsio, VMware, and the soft-RoCE/soft-iWARP drivers.
THIRD_PARTY_RDMA_MODULES = ("bnxt_re", "irdma", "hfi1", "ib_qib", "rdmavt", "qedr", "efa",
                            "erdma", "mana_ib", "iw_cxgb4", "vmw_pvrdma", "rdma_rxe", "siw")
# Why a module outside every list may hold the driver, for the error message.
KNOWN_HOLDERS = {
    "nvidia_peermem": "GPUDirect RDMA, loaded with the GPU driver",
    "nv_peer_mem": "GPUDirect RDMA, loaded with the GPU driver",
}
# When several modules can go at once: users before what they use.
UNLOAD_PRIORITY = ("ib_ipoib", "rdma_ucm", "ib_umad", "mlx5_vdpa", "mlx5_fwctl", "mlx5_dpll",
                   "mlx5_vfio_pci", "mlx5_ib", "ib_uverbs", "rdma_cm", "ib_cm", "iw_cm",
                   "ib_core", "mlx5_core", "mlxfw", "mlxdevm", "mlx_compat")

# Keeps the path-based names mlx5 netdevs had before systemd appended np0/np1
# (enp8s0f0np0 -> enp8s0f0, enp8s0f0np1v3 -> enp8s0f0v3), so configs naming them still match.
UDEV_RULES = """\
# Written by nicop driver (CREATE_IFNAMES_UDEV=true): mlx5 netdevs keep their names without
# the np0/np1 suffix, as before systemd added it.
ACTION!="add", GOTO="nicop_mlx5_names_end"
SUBSYSTEM!="net", GOTO="nicop_mlx5_names_end"
DRIVERS!="mlx5_core", GOTO="nicop_mlx5_names_end"
ENV{ID_NET_NAME_PATH}=="?*", PROGRAM="/bin/sh -c 'echo $env{ID_NET_NAME_PATH} | \
sed -E -e s/np[01]$// -e s/np[01]v/v/'", ENV{ID_NET_NAME_PATH}="$result"
ENV{ID_NET_NAME_SLOT}=="?*", PROGRAM="/bin/sh -c 'echo $env{ID_NET_NAME_SLOT} | \
sed -E -e s/np[01]$// -e s/np[01]v/v/'", ENV{ID_NET_NAME_SLOT}="$result"
LABEL="nicop_mlx5_names_end"
"""


class DriverError(Exception):
    """The driver could not be put in place; the message says what to do about it."""


class ValidationFailed(DriverError):
    """The new driver loaded, but the node did not get its devices back."""


class Stopped(Exception):
    """SIGTERM arrived before the driver was ready."""


def env_flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DriverConfig:
    """What the agent is asked to do: the upstream container's environment, plus nicop flags."""

    version: str
    node_name: str | None = None
    safe_load: bool = False
    safe_load_annotation: str = SAFE_LOAD_ANNOTATION
    unload_storage_modules: bool = False
    unload_third_party_modules: bool = False
    enable_nfsrdma: bool = False
    restore_on_termination: bool = False
    create_ifnames_udev: bool = False
    storage_modules: tuple[str, ...] = STORAGE_MODULES
    ready_file: str = READY_FILE
    udev_rules_file: str = UDEV_RULES_FILE
    validation_timeout: float = 120.0
    poll_interval: float = 1.0
    # Preflight (nicop.node.preflight): how often a refused reload is checked again.
    preflight_interval: float = 10.0
    allow_management_reload: bool = False
    force_precompiled: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str], **given: Any) -> DriverConfig:
        """The upstream variables; `given` (flags) wins over the environment."""
        values: dict[str, Any] = {
            "version": env.get("NVIDIA_NIC_DRIVER_VER", ""),
            "node_name": env.get("NODE_NAME") or None,
            "unload_storage_modules": env_flag(env, "UNLOAD_STORAGE_MODULES"),
            "unload_third_party_modules": env_flag(env, "UNLOAD_THIRD_PARTY_RDMA_MODULES"),
            "enable_nfsrdma": env_flag(env, "ENABLE_NFSRDMA"),
            "restore_on_termination": env_flag(env, "RESTORE_DRIVER_ON_POD_TERMINATION"),
            "create_ifnames_udev": env_flag(env, "CREATE_IFNAMES_UDEV"),
            "allow_management_reload": env_flag(env, preflight.ALLOW_MANAGEMENT_RELOAD_ENV),
        }
        if env.get("STORAGE_MODULES"):
            values["storage_modules"] = tuple(m for m in env["STORAGE_MODULES"].split(":") if m)
        if env.get("DRIVER_READY_PATH"):
            values["ready_file"] = env["DRIVER_READY_PATH"]
        if env.get("MLX_UDEV_RULES_FILE"):
            values["udev_rules_file"] = env["MLX_UDEV_RULES_FILE"]
        values.update({k: v for k, v in given.items() if v is not None})
        if not values["version"]:
            raise DriverError("no driver version given: set NVIDIA_NIC_DRIVER_VER or --version")
        return cls(**values)


def load_init_config(path: Path) -> tuple[bool, str]:
    """safeDriverLoad of the init container's config (ConfigMap ofed-init-container-config)."""
    try:
        doc = json.loads(path.read_text())
        safe = doc.get("safeDriverLoad") or {}
        return bool(safe.get("enable")), str(safe.get("annotation") or SAFE_LOAD_ANNOTATION)
    except (OSError, ValueError, AttributeError) as e:
        raise DriverError(f"cannot read the init container config {path}: {e}") from None


# ------------------------------------------------------------------------------ what runs


def running_kernel(host: Host) -> str:
    release = host.read(OSRELEASE)
    if not release:
        raise DriverError(f"cannot read the running kernel from {OSRELEASE}")
    return release


def os_id(host: Host) -> str:
    """ID= of /etc/os-release (the container's OS is the node's: one image per OS)."""
    for line in (host.read("/etc/os-release") or "").splitlines():
        key, _, value = line.partition("=")
        if key == "ID":
            return value.strip().strip('"')
    return ""


def describe(modules: Mapping[str, Module], version: str | None) -> str:
    if "mlx5_core" not in modules:
        return "no mlx5 driver loaded"
    return f"driver {version} loaded" if version else "inbox driver loaded"


# ------------------------------------------------------------------------------ unloading


@dataclass(frozen=True)
class Blocker:
    """A module that keeps the driver from being unloaded, and the way out."""

    module: str
    holds: str
    kind: str  # storage, nfsrdma, third-party, in-use, other
    users: int = 0

    def refusal(self) -> preflight.Refusal:
        m, held = self.module, self.holds
        if self.kind == "storage":
            return preflight.Refusal("modules", f"{m} (storage over RDMA) holds {held}",
                                     "set UNLOAD_STORAGE_MODULES=true to let the driver "
                                     "container unload it")
        if self.kind == "nfsrdma":
            return preflight.Refusal("modules", f"{m} (NFS/NVMe over RDMA) holds {held}",
                                     "set UNLOAD_STORAGE_MODULES=true to let the driver "
                                     "container unload it, or ENABLE_NFSRDMA=true to also load "
                                     f"the new driver's {m} afterwards")
        if self.kind == "third-party":
            return preflight.Refusal("modules", f"{m} (another RDMA driver) holds {held}",
                                     "set UNLOAD_THIRD_PARTY_RDMA_MODULES=true to let the driver "
                                     "container unload it")
        if self.kind == "in-use":
            return preflight.Refusal(
                "modules", f"{m} is in use ({self.users} reference(s) from processes: open "
                "/dev/infiniband devices or RDMA connections)",
                "stop the pods using RDMA on this node first (drain it, or enable safeLoad in "
                "the upgrade policy)")
        why = f" ({KNOWN_HOLDERS[m]})" if m in KNOWN_HOLDERS else ""
        return preflight.Refusal(
            "modules", f"{m}{why} holds {held} and no switch lets the driver container unload "
            "it", f"unload it on the node (rmmod {m})")


def _kind(module: str, cfg: DriverConfig) -> tuple[str, bool]:
    """(kind, whether the configuration allows unloading it) of a module outside the driver."""
    if module in cfg.storage_modules or module in NFSRDMA_MODULES:
        nfs = module in NFSRDMA_MODULES
        allowed = cfg.unload_storage_modules or (nfs and cfg.enable_nfsrdma)
        return ("nfsrdma" if nfs else "storage"), allowed
    if module in THIRD_PARTY_RDMA_MODULES:
        return "third-party", cfg.unload_third_party_modules
    return "other", False


def _unload_set(modules: Mapping[str, Module]) -> tuple[set[str], dict[str, str]]:
    """The driver's loaded modules and everything that holds them; of the holders outside the
    driver, one driver module each holds."""
    wanted = [m for m in DRIVER_FAMILY if m in modules]
    plan: set[str] = set(wanted)
    held_by: dict[str, str] = {}
    stack = list(wanted)
    while stack:
        name = stack.pop()
        for holder in modules[name].holders:
            if holder in plan or holder not in modules:
                continue
            plan.add(holder)
            stack.append(holder)
            if holder not in DRIVER_FAMILY:
                held_by.setdefault(holder, name)
    return plan, held_by


def unload_blockers(modules: Mapping[str, Module], cfg: DriverConfig, *,
                    check_users: bool = True) -> list[Blocker]:
    """The modules that keep the driver from being unloaded, given the switches; with
    `check_users` also the ones processes hold open (the node is not drained)."""
    plan, held_by = _unload_set(modules)
    blockers = []
    for module, held in sorted(held_by.items()):
        kind, allowed = _kind(module, cfg)
        if not allowed:
            blockers.append(Blocker(module, held, kind))
    if check_users:
        blockers += [Blocker(m, m, "in-use", modules[m].users)
                     for m in sorted(plan) if modules[m].users]
    return blockers


def plan_unload(modules: Mapping[str, Module], cfg: DriverConfig) -> list[str]:
    """The modules to rmmod, in an order the kernel accepts (holders before what they hold).

    Raises DriverError naming every module that blocks it (unload_blockers) and its way out.
    """
    blockers = unload_blockers(modules, cfg)
    if blockers:
        raise DriverError("cannot unload the running driver: "
                          + "; ".join(b.refusal().message() for b in blockers))
    plan, _ = _unload_set(modules)
    order: list[str] = []
    remaining = set(plan)
    while remaining:
        free = [m for m in remaining if not set(modules[m].holders) & remaining]
        if not free:  # a cycle: /proc/modules is inconsistent
            raise DriverError(f"cannot order the unload of {', '.join(sorted(remaining))}")
        pick = min(free, key=lambda m: (UNLOAD_PRIORITY.index(m) if m in UNLOAD_PRIORITY
                                        else -1, m))
        order.append(pick)
        remaining.remove(pick)
    return order


# ------------------------------------------------------------------------------ devices


@dataclass(frozen=True)
class NicFunction:
    """What one NIC function shows: its netdevs and RDMA devices."""

    address: str
    netdevs: tuple[str, ...]
    rdma: tuple[str, ...]

    def describe(self) -> str:
        return ", ".join([*self.netdevs, *self.rdma]) or "no devices"


def nic_functions(host: Host) -> dict[str, NicFunction]:
    """The physical functions mlx5_core drives. VFs are left out: unloading mlx5_core removes
    them by design, and the SR-IOV config daemon creates them again."""
    inventory = discovery.scan(host)
    return {
        f.address: NicFunction(f.address, tuple(n.name for n in f.netdevs),
                               tuple(r.name for r in f.rdma))
        for f in inventory.functions.values()
        if f.driver == "mlx5_core" and f.pf is None
    }


def vf_count(host: Host) -> int:
    return sum(1 for f in discovery.scan(host).functions.values()
               if f.driver and f.pf is not None)


def check_devices(
    before: Mapping[str, NicFunction], after: Mapping[str, NicFunction]
) -> list[str]:
    """What is missing now that was there before. Renames are fine (udev may rename)."""
    problems = []
    for address, old in sorted(before.items()):
        new = after.get(address)
        if new is None:
            problems.append(f"{address} (had {old.describe()}) is not bound to mlx5_core")
            continue
        if len(new.netdevs) < len(old.netdevs):
            problems.append(f"{address}: netdev {', '.join(old.netdevs)} did not come back")
        if len(new.rdma) < len(old.rdma):
            problems.append(f"{address}: RDMA device {', '.join(old.rdma)} did not come back")
    return problems


class ReadyFile:
    """The file the startup probe looks for: present only while the driver is validated."""

    def __init__(self, host: Host, path: str) -> None:
        self.host = host
        self.path = path

    def set(self, version: str) -> None:
        real = self.host.path(self.path)
        real.parent.mkdir(parents=True, exist_ok=True)
        real.write_text(version + "\n")
        log.info("driver ready: wrote %s", self.path)

    def unset(self, why: str) -> None:
        real = self.host.path(self.path)
        if real.exists():
            real.unlink()
            log.info("unsetting driver ready state (%s): removed %s", why, self.path)

    def exists(self) -> bool:
        return self.host.exists(self.path)


# ------------------------------------------------------------------------------ safe load


class SafeLoad:
    """The safe-load handshake with the upgrade controller, through the node's annotation.

    The agent sets the annotation and waits; the controller cordons and drains the node, then
    removes it. By hand: kubectl annotate node <node> <annotation>-
    """

    def __init__(self, client: ApiClient, node: str, annotation: str = SAFE_LOAD_ANNOTATION,
                 poll_interval: float = 2.0, report_every: float = 60.0) -> None:
        self.client = client
        self.node = node
        self.annotation = annotation
        self.poll_interval = poll_interval
        self.report_every = report_every
        self.polls = 0  # reads of the node while waiting

    async def _annotations(self) -> dict[str, str]:
        obj = await self.client.get(NODE, self.node)
        return dict(obj.get("metadata", {}).get("annotations") or {})

    async def wait(self, stop: asyncio.Event) -> None:
        try:
            present = self.annotation in await self._annotations()
            if not present:
                await self.client.patch(
                    NODE, self.node, {"metadata": {"annotations": {self.annotation: "true"}}})
        except Exception as e:  # ApiError, or the API server out of reach
            raise DriverError(f"safe load: cannot annotate node {self.node}: {e} (check "
                              "NODE_NAME and the service account's rights on nodes)") from None
        if present:
            log.info("safe load: annotation %s already on node %s (set by an earlier start)",
                     self.annotation, self.node, extra={"node": self.node})
        else:
            log.info("safe load: set annotation %s on node %s", self.annotation, self.node,
                     extra={"node": self.node})
        log.info("safe load: waiting for the upgrade controller to drain node %s and remove "
                 "the annotation before unloading the driver (by hand: kubectl annotate node "
                 "%s %s-)", self.node, self.node, self.annotation, extra={"node": self.node})
        started = last_report = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_interval)
            if stop.is_set():
                raise Stopped
            self.polls += 1
            try:
                annotations = await self._annotations()
            except Exception as e:  # the API server may be restarting: keep waiting
                log.warning("safe load: cannot read node %s: %s", self.node, e,
                            extra={"node": self.node})
                continue
            if self.annotation not in annotations:
                log.info("safe load: annotation removed after %.0fs; unloading the driver",
                         time.monotonic() - started, extra={"node": self.node})
                return
            if time.monotonic() - last_report >= self.report_every:
                last_report = time.monotonic()
                log.info("safe load: still waiting for node %s to be drained (%.0fs)",
                         self.node, last_report - started, extra={"node": self.node})


# ------------------------------------------------------------------------------ the agent


class DriverAgent:
    """Runs the steps of the module docstring against one host with one backend."""

    def __init__(
        self,
        config: DriverConfig,
        host: Host,
        backend: DriverBackend,
        safe_load: SafeLoad | None = None,
        reporter: preflight.Reporter | None = None,
    ) -> None:
        self.cfg = config
        self.host = host
        self.backend = backend
        self.safe_load = safe_load
        self.reporter = reporter or preflight.Reporter(None, config.node_name)
        self.ready = ReadyFile(host, config.ready_file)
        self._reloading = False  # unloading/loading modules: a stop waits for the end of it

    @property
    def _log_extra(self) -> dict[str, str]:
        return {"node": self.cfg.node_name} if self.cfg.node_name else {}

    def _info(self, msg: str, *args: object) -> None:
        log.info(msg, *args, extra=self._log_extra)

    def _warn(self, msg: str, *args: object) -> None:
        log.warning(msg, *args, extra=self._log_extra)

    def _report_version(self) -> None:
        """nicop_driver_info for what the kernel runs now."""
        DRIVER_INFO.clear()
        version = loaded_version(self.host)
        if version is not None:
            DRIVER_INFO.labels(version).set(1)
        elif "mlx5_core" in loaded_modules(self.host):
            DRIVER_INFO.labels("inbox").set(1)

    async def run(self, stop: asyncio.Event) -> None:
        """Converge, mark ready, hold until `stop`; then unmark and restore if asked.

        Raises DriverError when the driver cannot be put in place (the container exits and
        the kubelet restarts it, as with upstream).
        """
        self.ready.unset("starting")
        self._report_version()
        work = asyncio.create_task(self.converge(stop))
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                if self._reloading:
                    self._info("stop requested during the module reload; finishing it first")
                    await asyncio.wait({work})
                else:
                    self._info("stop requested before the driver was ready; stopping")
                    work.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Stopped):
                        await work
            with contextlib.suppress(Stopped):
                version = work.result() if not work.cancelled() else None
                if version is not None and not stop.is_set():
                    self._report_version()
                    self.ready.set(version)
                    await stop.wait()
        finally:
            stopper.cancel()
            self.ready.unset("stopping")
        if stop.is_set() and self.cfg.restore_on_termination:
            await self.restore()

    # ---------------------------------------------------------------- converge
    async def converge(self, stop: asyncio.Event) -> str:
        """Put the wanted version in place and validate it; returns the version."""
        cfg, host = self.cfg, self.host
        kernel = running_kernel(host)
        modules = loaded_modules(host)
        current = loaded_version(host)
        self._info("wanted driver %s on kernel %s; %s", cfg.version, kernel,
                   describe(modules, current))
        if "mlx5_core" in modules and version_matches(current, cfg.version):
            missing = [m for m in LOAD_MODULES if m not in modules]
            self._info("driver %s is already loaded: nothing to install or reload", current)
            before = await asyncio.to_thread(nic_functions, host)
            for module in missing:
                self._info("loading %s, which is not loaded", module)
                await asyncio.to_thread(self._load, module)
            await self.validate(before, stop)
            return cfg.version
        # Before a compile that may take many minutes, and before a drain: hold on what a
        # drain won't fix until it is fixed.
        await self.hold_while_refused(kernel, stop)
        await self.install(kernel)
        if self.safe_load is not None and any(m in loaded_modules(host) for m in DRIVER_FAMILY):
            await self.safe_load.wait(stop)
        before = await asyncio.to_thread(nic_functions, host)
        vfs = await asyncio.to_thread(vf_count, host)
        if vfs:
            self._warn("%d VFs will be removed with mlx5_core; the SR-IOV config daemon "
                       "creates them again", vfs)
        self._reloading = True
        try:
            await asyncio.to_thread(self._reload)
        finally:
            self._reloading = False
        if stop.is_set():
            raise Stopped
        await self.validate(before, stop)
        return cfg.version

    async def hold_while_refused(self, kernel: str, stop: asyncio.Event) -> None:
        """Wait until nothing refuses the reload (nicop.node.preflight), showing what does."""
        node_ip = await self.reporter.start()
        while True:
            refusals = await asyncio.to_thread(self._refusals, kernel, node_ip)
            await self.reporter.show(refusals)
            if not refusals:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.preflight_interval)
            if stop.is_set():
                raise Stopped

    def _refusals(self, kernel: str, node_ip: str | None) -> list[preflight.Refusal]:
        cfg, host = self.cfg, self.host
        modules = loaded_modules(host)
        refusals = []
        if "mlx5_core" in modules:
            refusals += preflight.management(host, node_ip, cfg.allow_management_reload)
        if any(m in modules for m in DRIVER_FAMILY):
            refusals += [b.refusal() for b in unload_blockers(modules, cfg, check_users=False)]
        if cfg.force_precompiled and not self._installed(kernel):
            refusals += preflight.kernel(
                self.backend.precompiled_available(cfg.version, kernel), cfg.version, kernel)
        return refusals

    def _installed(self, kernel: str) -> bool:
        installed = self.backend.installed_version(kernel)
        return installed is not None and version_matches(installed, self.cfg.version)

    async def install(self, kernel: str) -> None:
        cfg = self.cfg
        if await asyncio.to_thread(self._installed, kernel):
            self._info("driver %s is already installed for kernel %s", cfg.version, kernel)
            return
        started = time.monotonic()
        try:
            if await asyncio.to_thread(self.backend.precompiled_available, cfg.version, kernel):
                self._info("installing precompiled driver %s for kernel %s", cfg.version, kernel)
                await asyncio.to_thread(self.backend.install_precompiled, cfg.version, kernel)
            elif cfg.force_precompiled:
                raise DriverError(preflight.kernel(False, cfg.version, kernel)[0].message())
            else:
                self._info("no precompiled driver %s for kernel %s: building it from sources "
                           "(this takes several minutes; the startup probe waits for it)",
                           cfg.version, kernel)
                await asyncio.to_thread(self.backend.build_and_install, cfg.version, kernel)
        except BackendError as e:
            raise DriverError(f"cannot install driver {cfg.version} for kernel {kernel}: {e}"
                              ) from None
        self._info("driver %s installed for kernel %s in %.0fs", cfg.version, kernel,
                   time.monotonic() - started)

    def _load(self, module: str, inbox: bool = False) -> None:
        try:
            self.backend.load(module, inbox=inbox)
        except BackendError as e:
            raise DriverError(f"cannot load {module}: {e}") from None

    def _reload(self) -> None:
        """Unload the old modules and load the new ones (blocking: runs in a thread)."""
        cfg, host = self.cfg, self.host
        modules = loaded_modules(host)
        was_inbox = "mlx5_core" in modules and loaded_version(host) is None
        order = plan_unload(modules, cfg)
        if order:
            self._info("unloading %d modules: %s", len(order), " ".join(order))
        unloaded: list[str] = []
        started = time.monotonic()
        for module in order:
            self._info("unloading %s", module)
            try:
                self.backend.unload(module)
            except BackendError as e:
                self._rollback(unloaded, inbox=was_inbox)
                raise DriverError(f"cannot unload {module}: {e}") from None
            unloaded.append(module)
        if order:
            UNLOAD_SECONDS.observe(time.monotonic() - started)
        self._write_udev_rules()
        started = time.monotonic()
        for module in LOAD_MODULES:
            self._info("loading %s", module)
            self._load(module)
        self._reload_others(unloaded)
        LOAD_SECONDS.observe(time.monotonic() - started)

    def _reload_others(self, unloaded: list[str]) -> None:
        """Storage modules come back from the new driver; other vendors' drivers stay out."""
        cfg = self.cfg
        wanted = [m for m in unloaded if m in cfg.storage_modules or m in NFSRDMA_MODULES]
        if cfg.enable_nfsrdma:
            wanted += [m for m in ("nvme_rdma", "rpcrdma") if m not in wanted]
        for module in wanted:
            if module in NFSRDMA_MODULES and not cfg.enable_nfsrdma:
                self._warn("%s stays unloaded: the driver is built without NFS/NVMe over RDMA; "
                           "set ENABLE_NFSRDMA=true to load its own %s", module, module)
                continue
            self._info("loading %s (storage over RDMA) from the new driver", module)
            self._load(module)
        for module in unloaded:
            if module in THIRD_PARTY_RDMA_MODULES:
                self._warn("%s stays unloaded: it is built for the inbox ib_core", module)

    def _rollback(self, unloaded: list[str], inbox: bool) -> None:
        """Best effort after a failed unload: load back what was taken out."""
        for module in reversed(unloaded):
            try:
                self.backend.load(module, inbox=inbox)
                self._info("rollback: loaded %s again", module)
            except BackendError as e:
                self._warn("rollback: cannot load %s again: %s", module, e)

    def _write_udev_rules(self) -> None:
        path = self.host.path(self.cfg.udev_rules_file)
        if self.cfg.create_ifnames_udev:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(UDEV_RULES)
            self._info("wrote %s: mlx5 netdevs keep names without np0/np1",
                       self.cfg.udev_rules_file)
        elif path.exists():
            path.unlink()
            self._info("removed %s (CREATE_IFNAMES_UDEV is off)", self.cfg.udev_rules_file)

    async def validate(self, before: Mapping[str, NicFunction], stop: asyncio.Event) -> None:
        """Wait until the modules and every device from `before` are back, or fail."""
        deadline = time.monotonic() + self.cfg.validation_timeout
        while True:
            problems = await asyncio.to_thread(self._problems, before)
            if not problems:
                break
            if time.monotonic() >= deadline:
                raise ValidationFailed(
                    f"driver {self.cfg.version} failed validation after "
                    f"{self.cfg.validation_timeout:.0f}s: {'; '.join(problems)}; the readiness "
                    f"file stays absent (check dmesg for mlx5_core errors)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.poll_interval)
            if stop.is_set():
                raise Stopped
        after = await asyncio.to_thread(nic_functions, self.host)
        for address, old in sorted(before.items()):
            new = after[address]
            if new.netdevs != old.netdevs:
                self._info("%s: netdev %s is now %s", address, ", ".join(old.netdevs),
                           ", ".join(new.netdevs))
        self._info("validated driver %s: %d NIC functions with %d netdevs and %d RDMA devices",
                   loaded_version(self.host), len(after),
                   sum(len(f.netdevs) for f in after.values()),
                   sum(len(f.rdma) for f in after.values()))

    def _problems(self, before: Mapping[str, NicFunction]) -> list[str]:
        modules = loaded_modules(self.host)
        problems = [f"module {m} is not loaded" for m in LOAD_MODULES if m not in modules]
        version = loaded_version(self.host)
        if "mlx5_core" in modules and not version_matches(version, self.cfg.version):
            problems.append(f"mlx5_core reports version {version or 'none (inbox)'}, "
                            f"not {self.cfg.version}")
        return problems + check_devices(before, nic_functions(self.host))

    # ---------------------------------------------------------------- termination
    async def restore(self) -> None:
        """Put the inbox driver back (RESTORE_DRIVER_ON_POD_TERMINATION); never raises."""
        current = loaded_version(self.host)
        if not version_matches(current, self.cfg.version):
            self._info("restore: the loaded driver (%s) is not the one this container runs; "
                       "leaving it", current or "inbox")
            return
        refused = preflight.management(self.host, await self.reporter.start(),
                                       self.cfg.allow_management_reload)
        if refused:
            log.error("restore skipped, the driver stays loaded: %s", refused[0].message(),
                      extra=self._log_extra)
            return
        self._info("restoring the inbox driver (RESTORE_DRIVER_ON_POD_TERMINATION)")
        try:
            before = await asyncio.to_thread(nic_functions, self.host)
            await asyncio.to_thread(self._restore)
            problems = await asyncio.to_thread(check_devices, before, nic_functions(self.host))
        except DriverError as e:
            log.error("restore failed: %s", e, extra=self._log_extra)
            return
        self._report_version()
        for problem in problems:
            self._warn("restore: %s", problem)
        self._info("inbox driver restored%s", "" if not problems else " with missing devices")

    def _restore(self) -> None:
        cfg = self.cfg
        order = plan_unload(loaded_modules(self.host), cfg)
        for module in order:
            self._info("restore: unloading %s", module)
            try:
                self.backend.unload(module)
            except BackendError as e:
                raise DriverError(f"cannot unload {module}: {e}") from None
        path = self.host.path(cfg.udev_rules_file)
        if path.exists():
            path.unlink()
        for module in (*LOAD_MODULES, *(m for m in order if m in cfg.storage_modules)):
            self._info("restore: loading the inbox %s", module)
            self._load(module, inbox=True)


# ------------------------------------------------------------------------------ probes
