"""A local HTTP/1.1 server on asyncio for the client's unit tests: each request's head goes to
`answer`, which gives the status and body (sent with Content-Length, kept alive) or, as a
callable, writes its own answer to the stream (chunked, closing, silent)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serve(answer: Callable[[dict[str, str]], Any],
                connections: list[int] | None = None,
                tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """Serve until the block ends; yields the URL (https with `tls`, the server's context).
    `connections` gets one entry per accepted connection (so a test can count them)."""
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        if connections is not None:
            connections.append(1)
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                lines = raw.decode("latin-1").split("\r\n")
                head = {"request-line": lines[0]}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name:
                        head[name.strip().lower()] = value.strip()
                if length := int(head.get("content-length", 0)):
                    head["body"] = (await reader.readexactly(length)).decode()
                result = answer(head)
                if callable(result):
                    await result(writer)
                    if writer.is_closing():
                        return
                    continue
                status, body = result
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n"
                             .encode() + body)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
