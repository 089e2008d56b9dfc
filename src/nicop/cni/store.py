"""The node-local allocation store: nv-ipam's file, same path and layout, written atomically.

`/var/lib/cni/nv-ipam/store` holds `{version, checksum, pools: {key: {name, entries, ...}}}`
with entries keyed `<container_id>_<interface_name>` and pools keyed as nv-ipam keys them (an
IPPool by its name, a CIDRPool as `cidrpool/<name>`). The checksum is FNV-32a over the Go
encoding of the same data, so a node can move between nv-ipam and nicop without losing what
its pods hold. Every change is written to a temporary file, fsynced and renamed over the old
one before the caller hears of it: a crash leaves either the old or the new file, never half
of one, and an allocation a pod was told about is always on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nicop.node.host import Host

log = logging.getLogger(__name__)

STORE_PATH = "/var/lib/cni/nv-ipam/store"
VERSION = 1


def pool_key(pool_type: str, name: str) -> str:
    """The store's key of a pool, as nv-ipam's GetPoolKey: an IPPool's plain name (the layout
    before CIDRPools existed), `cidrpool/<name>` for a CIDRPool."""
    return name if pool_type in ("", "ippool") else f"{pool_type}/{name}"


LEGACY_DIR = "/var/lib/cni/nv-ipam/state/host-local"
"""Where nv-ipam before v0.1.0 kept allocations (host-local's layout)."""


class StoreError(Exception):
    """The store file cannot be used (corrupt, another daemon holds it)."""


class ReservationError(ValueError):
    """A reservation the store refuses: the container's interface already holds one in the
    pool, or the address is held by another (nv-ipam's ErrReservationAlreadyExist and
    ErrIPAlreadyReserved)."""


@dataclass
class Reservation:
    container_id: str
    interface_name: str
    ip_address: str
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uuid: str = ""
    device_id: str = ""
    create_time: str = ""
    pool_config_snapshot: str = ""
    network: str = ""
    """The CNI network that made it (nicop's addition, for GC; nv-ipam ignores it)."""

    @property
    def key(self) -> str:
        return f"{self.container_id}_{self.interface_name}"

    def to_go(self) -> dict[str, Any]:
        """The fields nv-ipam knows, in its struct order (what the checksum covers)."""
        return {
            "container_id": self.container_id,
            "interface_name": self.interface_name,
            "ip_address": self.ip_address,
            "metadata": {
                "create_time": self.create_time,
                "pod_uuid": self.pod_uuid,
                "pod_name": self.pod_name,
                "pod_namespace": self.pod_namespace,
                "device_id": self.device_id,
                "pool_config_snapshot": self.pool_config_snapshot,
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reservation:
        meta = data.get("metadata") or {}
        return cls(
            container_id=data.get("container_id", ""),
            interface_name=data.get("interface_name", ""),
            ip_address=data.get("ip_address") or "",
            pod_name=meta.get("pod_name", ""),
            pod_namespace=meta.get("pod_namespace", ""),
            pod_uuid=meta.get("pod_uuid", ""),
            device_id=meta.get("device_id", ""),
            create_time=meta.get("create_time", ""),
            pool_config_snapshot=meta.get("pool_config_snapshot", ""),
            network=data.get("network", ""),
        )


@dataclass
class PoolEntries:
    name: str
    entries: dict[str, Reservation] = field(default_factory=dict)
    last_pool_config: str = ""
    last_reserved_ip: str = ""

    def to_go(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "entries": {k: self.entries[k].to_go() for k in sorted(self.entries)},
            "last_pool_config": self.last_pool_config,
            "last_reserved_ip": self.last_reserved_ip,
        }


def go_json(value: Any) -> bytes:
    """encoding/json's bytes for `value` (dict keys already in Go's order): compact, UTF-8,
    with <, >, & and the JS line separators escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                          ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escaped)
    return text.encode()


def fnv32a(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


class Store:
    """All pools' reservations of this node, in memory and on disk; thread-safe.

    Mutations happen inside `with store.transaction():`, which writes the file once when the
    block ends without an exception (and leaves memory as it was on one).
    """

    def __init__(self, host: Host, path: str = STORE_PATH) -> None:
        self.host = host
        self.path = host.path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._lock_file = open(self.path.with_name(self.path.name + ".lock"), "a")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StoreError(f"{self.path} is in use by another process (a second cni-daemon "
                             "or nv-ipam's ipam-node on this node?)") from None
        self.pools: dict[str, PoolEntries] = self._load()
        self._warn_legacy()
        self._depth = 0
        self._snapshot: dict[str, PoolEntries] | None = None

    def close(self) -> None:
        self._lock_file.close()

    def _warn_legacy(self) -> None:
        """nv-ipam v0.1.0 to v0.3.5 moved the host-local files of v0.0.x into this store on
        start; later versions and nicop do not, so say that those addresses are not known."""
        legacy = self.host.path(LEGACY_DIR)
        try:
            held = sorted(str(p.relative_to(legacy)) for p in legacy.glob("*/*")
                          if p.is_file() and p.name != "lock"
                          and not p.name.startswith("last_reserved_ip"))
        except OSError:
            return
        if held:
            log.warning("%s holds %d allocations of nv-ipam before v0.1.0 (%s); nicop does not "
                        "read them, so those addresses may be handed out again: upgrade the "
                        "node through nv-ipam v0.3.5 (which moves them into %s) or remove the "
                        "directory once their pods are gone", legacy, len(held),
                        ", ".join(held[:5]) + (" ..." if len(held) > 5 else ""), self.path)

    def _load(self) -> dict[str, PoolEntries]:
        try:
            data = json.loads(self.path.read_bytes() or b"null")
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise StoreError(f"{self.path} is not valid JSON ({e}); move it away to start "
                             "with no allocations") from None
        if data is None:  # an empty file, as nv-ipam takes it: no allocations yet
            return {}
        if not isinstance(data, dict):
            raise StoreError(f"{self.path} holds no store object; move it away to start with "
                             "no allocations")
        if data.get("version") != VERSION:
            raise StoreError(f"{self.path} has layout version {data.get('version')}, "
                             f"nicop reads version {VERSION}")
        pools = {
            name: PoolEntries(
                name=p.get("name", name),
                entries={k: Reservation.from_json(v) for k, v in (p.get("entries") or {}).items()},
                last_pool_config=p.get("last_pool_config", ""),
                last_reserved_ip=p.get("last_reserved_ip") or "",
            )
            for name, p in (data.get("pools") or {}).items()
        }
        if data.get("checksum") != self._checksum(pools):
            raise StoreError(f"{self.path}: checksum mismatch (the file was edited or damaged); "
                             "move it away to start with no allocations")
        return pools

    @staticmethod
    def _checksum(pools: dict[str, PoolEntries]) -> int:
        root = {"version": VERSION, "checksum": 0,
                "pools": {k: pools[k].to_go() for k in sorted(pools)}}
        return fnv32a(go_json(root))

    def _write(self) -> None:
        pools = {}
        for name in sorted(self.pools):
            p = self.pools[name].to_go()
            for key, res in self.pools[name].entries.items():
                if res.network:
                    p["entries"][key]["network"] = res.network
            pools[name] = p
        root = {"version": VERSION, "checksum": self._checksum(self.pools), "pools": pools}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(root, indent=1).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Store]:
        with self._lock:
            outer = self._depth == 0
            if outer:
                self._snapshot = {
                    k: PoolEntries(v.name, dict(v.entries), v.last_pool_config,
                                   v.last_reserved_ip)
                    for k, v in self.pools.items()
                }
            self._depth += 1
            try:
                yield self
                if outer:
                    self._write()
            except BaseException:
                if outer and self._snapshot is not None:
                    self.pools = self._snapshot
                raise
            finally:
                self._depth -= 1
                if outer:
                    self._snapshot = None

    # ------------------------------------------------------------------ queries
    def get(self, pool: str, container_id: str, ifname: str) -> Reservation | None:
        with self._lock:
            p = self.pools.get(pool)
            return p.entries.get(f"{container_id}_{ifname}") if p else None

    def reserved(self, pool: str) -> set[str]:
        with self._lock:
            p = self.pools.get(pool)
            return {r.ip_address for r in p.entries.values()} if p else set()

    def snapshot(self) -> dict[str, list[Reservation]]:
        """Every pool's reservations (copies of the lists), for the cleaner and for status."""
        with self._lock:
            return {name: list(p.entries.values()) for name, p in self.pools.items()}

    def last_reserved(self, pool: str) -> str:
        with self._lock:
            p = self.pools.get(pool)
            return p.last_reserved_ip if p else ""

    # ------------------------------------------------------------------ changes
    def reserve(self, pool: str, res: Reservation, pool_config: str = "",
                move_pointer: bool = True) -> None:
        """Stores `res`; a static address (move_pointer False) leaves the round-robin pointer
        where it was, as nv-ipam does. Never a second reservation for the container's
        interface in a pool, never an address twice (ReservationError)."""
        with self.transaction():
            p = self.pools.setdefault(pool, PoolEntries(pool))
            held = p.entries.get(res.key)
            if held is not None:
                raise ReservationError(f"{res.container_id} {res.interface_name} already holds "
                                       f"{held.ip_address} in pool {pool}")
            owner = next((r for r in p.entries.values() if r.ip_address == res.ip_address), None)
            if owner is not None:
                raise ReservationError(f"{res.ip_address} is already reserved in pool {pool} by "
                                       f"{owner.container_id} {owner.interface_name}")
            res.create_time = res.create_time or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            p.entries[res.key] = res
            if move_pointer:
                p.last_reserved_ip = res.ip_address
            if pool_config:
                p.last_pool_config = pool_config

    def release(self, pool: str, container_id: str, ifname: str) -> Reservation | None:
        with self.transaction():
            p = self.pools.get(pool)
            if p is None:
                return None
            return p.entries.pop(f"{container_id}_{ifname}", None)

    def remove_pool(self, pool: str) -> None:
        with self.transaction():
            self.pools.pop(pool, None)
