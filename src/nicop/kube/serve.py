"""`/healthz`, `/readyz` and `/metrics` on one small asyncio HTTP server.

The operator's probes and Prometheus need three GET endpoints; a web framework would be the
largest dependency of the process for that. `/debug/memory` tells which modules hold the most
memory when the process runs with PYTHONTRACEMALLOC set (for benchmarks; tracing is costly).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


async def serve(
    host: str, port: int, ready: Callable[[], bool], healthy: Callable[[], bool] = lambda: True
) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode(errors="replace").split()
            path = parts[1].split("?")[0] if len(parts) > 1 else "/"
            content_type = "text/plain; charset=utf-8"
            if path == "/metrics":
                status, body, content_type = 200, generate_latest(), CONTENT_TYPE_LATEST
            elif path == "/healthz":
                status, body = (200, b"ok") if healthy() else (500, b"unhealthy")
            elif path == "/readyz":
                status, body = (200, b"ok") if ready() else (503, b"not ready")
            elif path == "/debug/memory" and tracemalloc.is_tracing():
                status, body = 200, memory_by_module().encode()
            else:
                status, body = 404, b"not found"
            reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error",
                      503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


def memory_by_module(top: int = 25) -> str:
    """Live allocations summed by the line of nicop's code that asked for them (the most recent
    nicop frame of each allocation's traceback), largest first."""
    held: dict[str, list[int]] = {}
    for stat in tracemalloc.take_snapshot().statistics("traceback"):
        frames = list(stat.traceback)  # oldest first
        frame = ([f for f in frames if "/nicop/" in f.filename] or frames)[-1]
        where = f"{frame.filename.rsplit('/nicop/', 1)[-1]}:{frame.lineno}"
        size_count = held.setdefault(where, [0, 0])
        size_count[0] += stat.size
        size_count[1] += stat.count
    total = sum(size for size, _ in held.values())
    lines = [f"{total / 2**20:9.1f} MiB  total traced"]
    lines += [f"{size / 2**20:9.1f} MiB  {count:9d} blocks  {where}" for where, (size, count)
              in sorted(held.items(), key=lambda kv: -kv[1][0])[:top]]
    return "\n".join(lines) + "\n"
