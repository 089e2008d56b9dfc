"""What every plugin of the daemon gets, and the helpers they share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nicop.api.networks_annotation import normalize_mac
from nicop.cni.ipam import Ipam
from nicop.cni.netlink import Netns
from nicop.cni.rdma import RdmaControl
from nicop.cni.spec import Obj, Request, config_error
from nicop.cni.state import KeyedLocks
from nicop.cni.vf import VfControl
from nicop.node.host import Host

# The forms Go's net.ParseMAC (which the upstream plugins use) accepts: 6-byte MAC, 8-byte
# EUI-64 or 20-byte IPoIB address, bytes separated by ':' or '-', or 4-digit groups by '.'.


@dataclass
class NodeContext:
    """The node as the plugins see it: its files, its namespace, its PFs, its RDMA devices and
    its IPAM."""

    host: Host
    host_ns: Netns
    vfs: VfControl
    ipam: Ipam
    locks: KeyedLocks
    rdma: RdmaControl


class Plugin(Protocol):
    def add(self, req: Request) -> Obj: ...
    def delete(self, req: Request) -> None: ...
    def check(self, req: Request) -> None: ...
    def status(self, req: Request) -> None: ...
    def gc(self, req: Request) -> None: ...


def conf_get(config: Obj, key: str) -> Any:
    """config[key], matched like Go's encoding/json: exactly, else ignoring case."""
    if key in config:
        return config[key]
    lower = key.lower()
    for k, v in config.items():
        if k.lower() == lower:
            return v
    return None


def valid_attachments(req: Request) -> set[tuple[str, str]]:
    """GC's `cni.dev/valid-attachments` as (containerID, ifname) pairs."""
    return {(str(a.get("containerID")), str(a.get("ifname")))
            for a in req.config.get("cni.dev/valid-attachments") or [] if isinstance(a, dict)}


def parse_mac(field_name: str, value: object) -> str | None:
    if value in (None, ""):
        return None
    mac = normalize_mac(value) if isinstance(value, str) else None
    if mac is None:
        raise config_error(field_name, f"{value!r} is not a MAC address such as "
                           "02:00:00:00:00:01")
    return mac


def optional_int(config: Obj, key: str, lo: int, hi: int | None = None) -> int | None:
    value = conf_get(config, key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise config_error(key, f"{value!r} must be an integer")
    if value < lo or (hi is not None and value > hi):
        bound = f"{lo}-{hi}" if hi is not None else f">= {lo}"
        raise config_error(key, f"{value} invalid: value must be in the range {bound}")
    return value
