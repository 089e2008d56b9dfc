"""What must hold before the driver container takes the running driver down, checked on the node
itself: the reload must not cut the node's management path, and a driver must exist for the
running kernel when compiling is not allowed (the module holders are driver.unload_blockers).

A check that fails is a `Refusal`: the cause and the fix, which the driver agent logs, writes on
the node (PREFLIGHT_ANNOTATION and an Event) and checks again until the cause is gone, so fixing
it lets the reload go on with no restart of anything.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from nicop.api.upgrade import FIX_SEPARATOR, PREFLIGHT_ANNOTATION
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.events import EventRecorder
from nicop.kube.resources import NODE, Obj
from nicop.node import discovery
from nicop.node.host import Host

log = logging.getLogger("nicop.driver")

# The ofedDriver env switch that lets a reload take the management interface down.
ALLOW_MANAGEMENT_RELOAD_ENV = "ALLOW_MANAGEMENT_INTERFACE_RELOAD"


@dataclass(frozen=True)
class Refusal:
    """Why the driver is not reloaded now (`check`: management, modules or kernel), and the way
    out."""

    check: str
    cause: str
    fix: str

    def message(self) -> str:
        return f"{self.cause}{FIX_SEPARATOR}{self.fix}"


@dataclass(frozen=True)
class Route:
    iface: str
    network: ipaddress.IPv4Network


def routes(host: Host) -> list[Route]:
    """The IPv4 routes of /proc/net/route (little-endian hex destination and mask)."""
    found = []
    for line in (host.read("/proc/net/route") or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dest = ipaddress.IPv4Address(bytes.fromhex(fields[1])[::-1])
            mask = ipaddress.IPv4Address(bytes.fromhex(fields[7])[::-1])
            found.append(Route(fields[0], ipaddress.IPv4Network(f"{dest}/{mask}")))
        except ValueError:
            continue
    return found


def management_interfaces(host: Host, node_ip: str | None) -> dict[str, str]:
    """The interfaces the node is managed through, each with why: the default route's, and the
    one whose most specific route holds the node's InternalIP."""
    table = routes(host)
    found = {r.iface: "carries the default route" for r in table if r.network.prefixlen == 0}
    try:
        address = ipaddress.IPv4Address(node_ip) if node_ip else None
    except ValueError:
        address = None
    covering = [r for r in table if address is not None and r.network.prefixlen > 0
                and address in r.network]
    if covering:
        best = max(covering, key=lambda r: r.network.prefixlen)
        found.setdefault(best.iface, f"holds the node's InternalIP {address}")
    return found


def lower_devices(host: Host, iface: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """`iface` and what it sits on (a bond's ports, a VLAN's parent): /sys/class/net/*/lower_*."""
    found = {iface}
    for entry in host.listdir(f"/sys/class/net/{iface}"):
        lower = entry.removeprefix("lower_")
        if entry.startswith("lower_") and lower not in seen:
            found |= lower_devices(host, lower, seen | {iface})
    return found


def management(host: Host, node_ip: str | None, allowed: bool) -> list[Refusal]:
    """A refusal when an interface the node is managed through goes down with mlx5_core."""
    if allowed:
        return []
    mlx5 = {n.name: f.address for f in discovery.scan(host).functions.values()
            if f.driver == "mlx5_core" for n in f.netdevs}
    refusals = []
    for iface, why in sorted(management_interfaces(host, node_ip).items()):
        on = sorted(d for d in lower_devices(host, iface) if d in mlx5)
        if not on:
            continue
        shown = iface if on == [iface] else f"{iface} (over {', '.join(on)})"
        functions = ", ".join(sorted({mlx5[d] for d in on}))
        refusals.append(Refusal(
            "management",
            f"{shown} {why} and goes down with mlx5_core (ConnectX {functions}): reloading "
            "the driver would cut the node off from the cluster",
            "manage the node through another interface, or, with console access to the node, "
            f"set {ALLOW_MANAGEMENT_RELOAD_ENV}=true in spec.ofedDriver.env"))
    return refusals


def kernel(precompiled: bool, version: str, release: str) -> list[Refusal]:
    """forcePrecompiled: no build on the node, so no precompiled driver is a refusal."""
    if precompiled:
        return []
    return [Refusal(
        "kernel",
        f"no precompiled driver {version} for kernel {release} and forcePrecompiled is set, "
        "so it is not built on the node",
        f"boot a kernel that driver {version} has precompiled packages for, or unset "
        "spec.ofedDriver.forcePrecompiled to build it on the node")]


class Reporter:
    """Puts the refusals on the node (PREFLIGHT_ANNOTATION, a DriverReloadRefused Event) and
    takes them off once they are gone; without an API client (no NODE_NAME) only logs."""

    def __init__(self, client: ApiClient | None, node: str | None) -> None:
        self.client = client
        self.node = node
        self.events = EventRecorder(client, "nicop-driver") if client is not None else None
        self._shown: tuple[str, ...] = ()

    async def start(self) -> str | None:
        """The node's InternalIP, as the API server knows it. A refusal an earlier container
        left on the node goes: this one checks anew."""
        if self.client is None or not self.node:
            return None
        try:
            node = await self.client.get(NODE, self.node)
        except (ApiError, OSError) as e:
            log.warning("cannot read node %s for its InternalIP: %s", self.node, e)
            return None
        if PREFLIGHT_ANNOTATION in ((node.get("metadata") or {}).get("annotations") or {}):
            await self._annotate(None)
        return next((a.get("address") for a in (node.get("status") or {}).get("addresses") or []
                     if a.get("type") == "InternalIP"), None)

    async def show(self, refusals: Iterable[Refusal]) -> None:
        messages = tuple(r.message() for r in refusals)
        if messages == self._shown:
            return
        for message in messages:
            log.error("driver reload refused: %s", message, extra=self._extra)
        if not messages and self._shown:
            log.info("preflight checks pass: going on with the driver reload", extra=self._extra)
        self._shown = messages
        if self.client is None or not self.node:
            return
        text = "\n".join(messages) or None
        node = await self._annotate(text)
        if node is None or self.events is None:
            return
        if text:
            await self.events.emit(node, "Warning", "DriverReloadRefused", text)
        else:
            await self.events.emit(node, "Normal", "DriverPreflightPassed",
                                   "the causes that held the driver reload are gone")

    async def _annotate(self, text: str | None) -> Obj | None:
        assert self.client is not None and self.node
        try:
            return await self.client.patch(
                NODE, self.node, {"metadata": {"annotations": {PREFLIGHT_ANNOTATION: text}}})
        except (ApiError, OSError) as e:
            log.warning("cannot annotate node %s with the preflight result: %s", self.node, e)
            return None

    @property
    def _extra(self) -> dict[str, str]:
        return {"node": self.node} if self.node else {}
