"""`/healthz`, `/readyz` and `/metrics` on one small asyncio HTTP server.

The operator's probes and Prometheus need three GET endpoints; a web framework would be the
largest dependency of the process for that.
"""

from __future__ import annotations

import asyncio
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
