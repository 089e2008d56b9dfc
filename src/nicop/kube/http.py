"""HTTP/1.1 to the API server on asyncio's own streams: keep-alive connections, streamed
(chunked) watch answers, and the Authorization header from the kubeconfig's credentials, asked
again once after a 401.

Why not a general HTTP library: on a big cluster the operator sends thousands of small requests,
and a general client's layers cost more CPU than the request itself (bench_policy_scale: about
2 ms of the operator's CPU a PATCH, against a fraction of that here), and its imports cost every
agent memory. The API server needs only this much of HTTP.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
import urllib.parse
from asyncio import sslproto
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Protocol

MAX_IDLE = 32  # keep-alive connections kept for reuse (a rollout steps 32 nodes at once)
LARGE_WRITE = 1 << 16  # bytes: a request body this large waits for the socket to drain
# asyncio gives every TLS connection a 256 KiB read buffer; with a watch per kind and the
# requests of a rollout in flight that was 30 MiB of the operator's memory (bench_upgrade).
# 64 KiB reads are as fast for the API server's answers.
TLS_READ_BUFFER = 1 << 16


@cache
def user_agent() -> str:
    """nicop/VERSION (COMMAND): how the API server's audit log names nicop's requests, the
    command as the CLI named it in $NICOP_COMMAND (a user's `nicop plan` is not the operator)."""
    command = os.environ.get("NICOP_COMMAND")
    return f"nicop/{metadata.version('nicop')}" + (f" ({command})" if command else "")


if getattr(sslproto.SSLProtocol, "max_size", 0) > TLS_READ_BUFFER:
    sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


class Credentials(Protocol):
    """How a request proves who sends it (nicop.kube.kubeconfig makes them)."""

    async def authorization(self) -> str:
        """The Authorization header's value."""
        ...

    def forget(self) -> bool:
        """After a 401: drop what is cached; True if asking again may give something new."""
        ...


class HttpError(OSError):
    """The connection broke or the answer is not HTTP/1.1 as expected: handled as the server
    being unreachable for this request."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class HttpClient:
    """Requests to one server; `server` may carry a path prefix (an API server behind a
    proxy), which every request path is put under."""

    def __init__(self, server: str, tls: ssl.SSLContext | None,
                 credentials: Credentials | None, timeout: float) -> None:
        url = urllib.parse.urlsplit(server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"server {server!r} is not an http(s) URL")
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.tls = tls if url.scheme == "https" else None
        self.prefix = url.path.rstrip("/")
        self.credentials = credentials
        self.timeout = timeout
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = host if url.port is None else f"{host}:{url.port}"
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    async def request(self, method: str, path: str, *, params: dict[str, object] | None = None,
                      body: bytes | None = None, headers: dict[str, str] | None = None,
                      timeout: float | None = None) -> Response:
        """One request and its whole answer; a 401 asks the credentials once more."""
        target = self._target(path, params)
        async with asyncio.timeout(self.timeout if timeout is None else timeout):
            response = await self._exchange(method, target, body, headers)
            if response.status == 401 and self.credentials and self.credentials.forget():
                response = await self._exchange(method, target, body, headers)
        return response

    @asynccontextmanager
    async def stream(self, method: str, path: str, *, params: dict[str, object] | None = None,
                     headers: dict[str, str] | None = None, connect_timeout: float = 10.0,
                     read_timeout: float = 330.0) -> AsyncIterator[StreamedResponse]:
        """A request whose answer is read as it comes (a watch). The connection is closed if
        nothing arrives for `read_timeout` seconds."""
        target = self._target(path, params)
        async with asyncio.timeout(connect_timeout):
            conn, status, answer_headers = await self._send(method, target, None, headers)
            if status == 401 and self.credentials and self.credentials.forget():
                await read_body(conn, method, status, answer_headers)
                self.release(conn, answer_headers)
                conn, status, answer_headers = await self._send(method, target, None, headers)
        streamed = StreamedResponse(self, conn, method, status, answer_headers, read_timeout)
        try:
            yield streamed
        finally:
            streamed.finish()

    # ------------------------------------------------------------------ internals
    def _target(self, path: str, params: dict[str, object] | None) -> str:
        target = self.prefix + path
        if params:
            target += "?" + urllib.parse.urlencode(
                {k: str(v) for k, v in params.items() if v is not None},
                quote_via=urllib.parse.quote)
        return target

    async def _exchange(self, method: str, target: str, body: bytes | None,
                        headers: dict[str, str] | None) -> Response:
        conn, status, answer_headers = await self._send(method, target, body, headers)
        try:
            content = await read_body(conn, method, status, answer_headers)
        except BaseException:
            self.discard(conn)
            raise
        self.release(conn, answer_headers)
        return Response(status, answer_headers, content)

    async def _send(self, method: str, target: str, body: bytes | None,
                    headers: dict[str, str] | None
                    ) -> tuple[_Connection, int, dict[str, str]]:
        """Write the request and read the answer's head. A kept-alive connection the server
        closed meanwhile fails before any answer: the request goes again on a new one."""
        head = await self._head(method, target, body, headers)
        while True:
            conn, reused = await self._connection()
            try:
                conn.writer.write(head)
                if body:
                    conn.writer.write(body)
                    if len(body) >= LARGE_WRITE:
                        await conn.writer.drain()
                status, answer_headers = await _read_head(conn.reader)
                return conn, status, answer_headers
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                self.discard(conn)
                if reused and not (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                    continue
                raise HttpError(f"the connection to {self.host}:{self.port} broke: "
                                f"{e or type(e).__name__}") from None
            except BaseException:
                self.discard(conn)
                raise

    async def _head(self, method: str, target: str, body: bytes | None,
                    headers: dict[str, str] | None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self._host_header}",
                 f"User-Agent: {user_agent()}"]
        if self.credentials is not None:
            lines.append(f"Authorization: {await self.credentials.authorization()}")
        lines.extend(f"{k}: {v}" for k, v in (headers or {}).items())
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _connection(self) -> tuple[_Connection, bool]:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn, True
            self.discard(conn)
        reader, writer = await asyncio.open_connection(
            self.host, self.port, ssl=self.tls,
            server_hostname=self.host if self.tls else None)
        conn = _Connection(reader, writer)
        self._open.add(conn)
        return conn, False

    def release(self, conn: _Connection, headers: dict[str, str]) -> None:
        """Give back a connection whose answer was read to its end: kept for reuse unless
        the answer or the pool says otherwise."""
        if headers.get("connection", "").lower() == "close" or len(self._idle) >= MAX_IDLE \
                or not conn.usable():
            self.discard(conn)
        else:
            self._idle.append(conn)

    def discard(self, conn: _Connection) -> None:
        """Close a connection whose answer was not read to its end."""
        conn.close()
        self._open.discard(conn)


class StreamedResponse:
    """An answer read as it arrives: `lines()` yields its non-empty lines as bytes."""

    def __init__(self, client: HttpClient, conn: _Connection, method: str, status: int,
                 headers: dict[str, str], read_timeout: float) -> None:
        self.client = client
        self.conn = conn
        self.method = method
        self.status = status
        self.headers = headers
        self.read_timeout = read_timeout
        self._done = False
        self._last_read = time.monotonic()
        self._watchdog: asyncio.TimerHandle | None = None

    async def read(self) -> bytes:
        """The whole rest of the answer (an error's Status)."""
        body = await read_body(self.conn, self.method, self.status, self.headers)
        self._done = True
        return body

    async def lines(self) -> AsyncIterator[bytes]:
        self._arm()
        rest = b""
        async for chunk in self._pieces():
            self._last_read = time.monotonic()
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                if line:
                    yield line
        if rest.strip():
            yield rest
        self._done = True

    async def _pieces(self) -> AsyncIterator[bytes]:
        reader = self.conn.reader
        if "chunked" in self.headers.get("transfer-encoding", ""):
            async for chunk in _chunks(reader):
                yield chunk
        elif "content-length" in self.headers:
            yield await read_body(self.conn, self.method, self.status, self.headers)
        else:
            while chunk := await reader.read(1 << 16):
                yield chunk

    def _arm(self) -> None:
        """One timer checks now and then that bytes still arrive; a silent connection is
        aborted, which ends the read with an error."""
        def check() -> None:
            idle = time.monotonic() - self._last_read
            if idle >= self.read_timeout:
                self.conn.writer.transport.abort()
            else:
                self._watchdog = loop.call_later(self.read_timeout - idle, check)

        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(self.read_timeout, check)

    def finish(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._done:
            self.client.release(self.conn, self.headers)
        else:
            self.client.discard(self.conn)


async def read_body(conn: _Connection, method: str, status: int,
                    headers: dict[str, str]) -> bytes:
    """The whole body of an answer whose head was read (chunked, by length, or to the end)."""
    if method == "HEAD" or status in (204, 304) or status < 200:
        return b""
    if "chunked" in headers.get("transfer-encoding", ""):
        return b"".join([chunk async for chunk in _chunks(conn.reader)])
    if (length := headers.get("content-length")) is not None:
        try:
            return await conn.reader.readexactly(int(length))
        except asyncio.IncompleteReadError:
            raise HttpError("the API server closed the connection mid-answer") from None
    headers["connection"] = "close"  # the body ends with the connection
    return await conn.reader.read()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise HttpError("the API server's answer has headers too large to read") from None
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The chunks of a chunked body, up to the last (empty) one and its trailers."""
    try:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers: none used
                return
            chunk = await reader.readexactly(size + 2)
            yield chunk[:-2]
    except asyncio.IncompleteReadError:
        raise HttpError("the API server closed the connection mid-answer") from None
    except (ValueError, asyncio.LimitOverrunError):
        raise HttpError("the API server's chunked answer is malformed") from None
