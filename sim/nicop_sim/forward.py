"""TCP forwarding between a real node's network namespace and this machine's.

The control plane listens on this machine's loopback, which a node namespace cannot reach: the
node's kubelet (its kubeconfig says https://127.0.0.1:<port>) and its pods (the `kubernetes`
Service address, 10.96.0.1:443, which a kube-proxy would map to the API server) connect to
listeners in the node's namespace, and each connection is carried to the API server here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from nicop_sim.namespaces import in_netns

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """Listen on `listen` inside the namespace, connect to `target` outside."""

    listen: tuple[str, int]
    target: tuple[str, int]


def listener(netns: Path, address: tuple[str, int]) -> socket.socket:
    """A listening socket in the namespace at `netns`."""
    with in_netns(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(netns: Path, routes: list[Route]) -> list[asyncio.Server]:
    """Start every route; the servers run until closed."""
    servers = []
    for route in routes:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         target: tuple[str, int] = route.target) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(*target)
            except OSError as e:
                log.warning("cannot reach %s:%d: %s", *target, e)
                writer.close()
                return
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

        servers.append(await asyncio.start_server(handle, sock=listener(netns, route.listen)))
    return servers
