"""nicop's HTTP/1.1 client against a local server: what the API server's answers need (kept-alive
connections, chunked watch streams split anywhere, a connection the server dropped while idle,
a silent stream) and what a request must carry (path prefix, quoted parameters, body length).
Every API test of the suite also goes through it, against the real API server."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
from tests.unit.http_server import serve

from nicop.kube.http import TLS_READ_BUFFER, HttpClient, HttpError
from nicop_sim.pki import CertificateAuthority


def run(test: Any) -> Any:
    return asyncio.run(asyncio.wait_for(test(), 30))


def test_requests_in_a_row_share_one_connection_and_carry_prefix_parameters_and_body() -> None:
    seen: list[dict[str, str]] = []
    connections: list[int] = []

    def answer(head: dict[str, str]) -> tuple[int, bytes]:
        seen.append(head)
        return 200, b'{"ok": true}'

    async def test() -> None:
        async with serve(answer, connections) as url:
            client = HttpClient(url + "/k8s/clusters/c-1/", None, None, timeout=10)
            for _ in range(3):
                response = await client.request(
                    "PATCH", "/api/v1/nodes/a", params={"labelSelector": "a=b,c in (d)"},
                    body=b'{"x": 1}', headers={"Content-Type": "application/merge-patch+json"})
                assert (response.status, response.body) == (200, b'{"ok": true}')
            await client.close()

    run(test)
    assert len(connections) == 1
    assert seen[0]["request-line"] == (
        "PATCH /k8s/clusters/c-1/api/v1/nodes/a?labelSelector=a%3Db%2Cc%20in%20%28d%29 HTTP/1.1")
    assert seen[0]["body"] == '{"x": 1}' and seen[0]["content-type"].startswith("application/")
    assert seen[0]["host"].startswith("127.0.0.1:")


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error() -> None:
    """API servers close idle keep-alive connections; the next request must not fail for it."""
    connections: list[int] = []

    def answer(head: dict[str, str]) -> Any:
        async def reply_and_close(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
            writer.close()  # without Connection: close, as an idle timeout does
        return reply_and_close

    async def test() -> None:
        async with serve(answer, connections) as url:
            client = HttpClient(url, None, None, timeout=10)
            for _ in range(3):
                assert (await client.request("GET", "/version")).body == b"{}"
            await client.close()

    run(test)
    assert len(connections) == 3


def test_a_chunked_stream_gives_whole_lines_however_the_chunks_cut_them() -> None:
    events = b'{"type":"ADDED","n":1}\n{"type":"MODIFIED","n":2}\n{"type":"DELETED","n":3}\n'
    cuts = [events[:5], events[5:30], events[30:31], events[31:]]

    def answer(head: dict[str, str]) -> Any:
        async def chunked(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in cuts:
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        return chunked

    async def test() -> list[bytes]:
        async with serve(answer) as url:
            client = HttpClient(url, None, None, timeout=10)
            async with client.stream("GET", "/api/v1/pods", params={"watch": "true"}) as streamed:
                lines = [line async for line in streamed.lines()]
            assert (await client.request("GET", "/again")).status == 200  # connection reused
            await client.close()
            return lines

    assert run(test) == events.strip().split(b"\n")


def test_a_stream_that_falls_silent_is_cut_after_its_read_timeout() -> None:
    def answer(head: dict[str, str]) -> Any:
        async def silent(writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nhello\n\r\n")
            await writer.drain()
            await asyncio.sleep(3600)
        return silent

    async def test() -> list[bytes]:
        got: list[bytes] = []
        async with serve(answer) as url:
            client = HttpClient(url, None, None, timeout=10)
            with pytest.raises(HttpError, match="closed the connection mid-answer"):
                async with client.stream("GET", "/w", read_timeout=0.5) as streamed:
                    async for line in streamed.lines():
                        got.append(line)
            await client.close()
        return got

    assert run(test) == [b"hello"]


def test_an_unreachable_server_is_an_os_error() -> None:
    async def test() -> None:
        async with serve(lambda head: (200, b"")) as url:
            pass  # closed: nothing listens on the port any more
        client = HttpClient(url, None, None, timeout=5)
        with pytest.raises(OSError):
            await client.request("GET", "/version")
        await client.close()

    run(test)


def test_tls_connections_read_64_kib_at_a_time(tmp_path: Path) -> None:
    """asyncio gives each TLS connection a 256 KiB read buffer unless nicop.kube.http lowers
    SSLProtocol.max_size (30 MiB of the operator's memory in a 1000-node rollout). That
    attribute is asyncio's own: were a Python release to drop it, this fails instead of the
    memory quietly growing back."""
    ca = CertificateAuthority(tmp_path)
    server_pair = ca.issue("server", "server", server_hosts=["127.0.0.1"])
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(server_pair.cert, server_pair.key)
    client_tls = ssl.create_default_context(cafile=str(ca.pair.cert))

    async def test() -> None:
        async with serve(lambda head: (200, b"{}"), tls=server_tls) as url:
            client = HttpClient(url, client_tls, None, 10)
            try:
                assert (await client.request("GET", "/api")).status == 200
                (conn,) = client._idle
                protocol = conn.writer.transport._ssl_protocol  # type: ignore[attr-defined]
                assert len(protocol._ssl_buffer) == TLS_READ_BUFFER == 64 * 1024
            finally:
                await client.close()

    run(test)
