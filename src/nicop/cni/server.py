"""The socket nicop's CNI daemons serve the shim on, and how one call is run.

The shim sends `CNI1\\0<plugin>\\0CNI_X=..\\0...\\0\\0<stdin>` over a root-only unix socket and
reads back `<exit code>\\n<stdout>`. Each call runs on a worker thread (netlink, file and
delegate work block), so calls for different pods proceed in parallel; the plugins serialize what
must not interleave. Every call is counted and timed by plugin, command and outcome, and logged
on the owning daemon's logger.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client import Counter, Histogram

from nicop.cni.plugin import Plugin
from nicop.cni.spec import (
    LATEST,
    SUPPORTED_VERSIONS,
    CniError,
    Code,
    parse_request,
    render_result,
    version_reply,
)

MAGIC = b"CNI1"

REQUESTS = Counter("nicop_cni_requests_total", "CNI calls by plugin, command and result",
                   ["plugin", "command", "result"])
SECONDS = Histogram("nicop_cni_request_seconds", "CNI call duration in the daemon, by plugin, "
                    "command and result (ok or error)", ["plugin", "command", "result"],
                    buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))


def version_of(stdin: bytes) -> str:
    """The config's cniVersion when it is one we speak (for an error reply), else the latest."""
    try:
        version = json.loads(stdin).get("cniVersion")
    except (ValueError, AttributeError):
        return LATEST
    return version if version in SUPPORTED_VERSIONS else LATEST


class CniServer:
    """`plugins` behind one socket; `name` is the daemon as errors name it to the user."""

    def __init__(self, plugins: dict[str, Plugin], socket_path: Path, *,
                 name: str = "nicop cni-daemon", workers: int = 32,
                 logger: logging.Logger | None = None) -> None:
        self.plugins = plugins
        self.socket_path = socket_path
        self.name = name
        self.log = logger or logging.getLogger(__name__)
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="cni")
        self.server: asyncio.Server | None = None

    @property
    def serving(self) -> bool:
        return self.server is not None

    # ------------------------------------------------------------------ one call
    def handle(self, plugin: str, env: dict[str, str], stdin: bytes) -> tuple[int, bytes]:
        """Run one CNI call; returns the plugin's exit code and stdout."""
        start = time.perf_counter()
        command = env.get("CNI_COMMAND", "")
        version = version_of(stdin)
        out: object = None
        try:
            req = parse_request(plugin, env, stdin)
            if req.command == "VERSION":
                out = version_reply(req.config)
            else:
                impl = self.plugins.get(plugin)
                if impl is None:
                    raise CniError(Code.INTERNAL, f"{self.name} has no plugin {plugin!r}",
                                   f"it serves {', '.join(sorted(self.plugins))}")
                if req.command == "ADD":
                    out = render_result(impl.add(req), req.version)
                elif req.command == "DEL":
                    impl.delete(req)
                elif req.command == "CHECK":
                    impl.check(req)
                elif req.command == "STATUS":
                    impl.status(req)
                elif req.command == "GC":
                    impl.gc(req)
            rc, result = 0, "ok"
        except CniError as e:
            out, rc, result = e.to_json(version), 1, f"error {e.code}"
        except Exception as e:
            self.log.exception("%s %s failed", plugin, command)
            err = CniError(Code.INTERNAL, f"{plugin} {command}: {type(e).__name__}: {e}")
            out, rc, result = err.to_json(version), 1, "error 999"
        elapsed = time.perf_counter() - start
        outcome = "ok" if rc == 0 else "error"
        REQUESTS.labels(plugin, command, outcome).inc()
        SECONDS.labels(plugin, command, outcome).observe(elapsed)
        self.log.info("%s %s %s/%s netns %s: %s in %.1f ms", plugin, command,
                      env.get("CNI_CONTAINERID", "-"), env.get("CNI_IFNAME", "-"),
                      env.get("CNI_NETNS") or "-", result if rc == 0 else json.dumps(out),
                      elapsed * 1000)
        body = json.dumps(out).encode() + b"\n" if out is not None else b""
        return rc, body

    # ------------------------------------------------------------------ socket
    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            sock = writer.get_extra_info("socket")
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid not in (0, os.getuid()):
                self.log.warning("refused a CNI call from uid %d", uid)
                return
            data = await reader.read()
            header, sep, stdin = data.partition(b"\0\0")
            fields = header.split(b"\0")
            if not sep or len(fields) < 2 or fields[0] != MAGIC:
                writer.write(b"1\n" + json.dumps(CniError(
                    Code.INTERNAL, f"{self.name} got a request it cannot read",
                    f"the plugin executables and {self.name} are from different versions; "
                    "rerun its installer (nicop cni-install, nicop multus-install)").to_json(
                        LATEST)).encode() + b"\n")
                return
            plugin = fields[1].decode()
            env = dict(f.decode().partition("=")[::2] for f in fields[2:])
            loop = asyncio.get_running_loop()
            rc, out = await loop.run_in_executor(self.executor, self.handle, plugin, env, stdin)
            writer.write(f"{rc}\n".encode() + out)
            await writer.drain()
        except (ConnectionError, OSError) as e:
            self.log.warning("CNI connection broke: %s", e)
        finally:
            writer.close()

    async def start(self) -> None:
        """Listen on the socket, which only root (and this daemon's user) may use."""
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        old_umask = os.umask(0o177)
        try:
            self.server = await asyncio.start_unix_server(self._connection, path=str(path),
                                                          backlog=512)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        self.log.info("serving CNI calls on %s", path)

    async def close(self) -> None:
        """Stop listening (the socket file goes) and let the calls under way finish."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self.executor.shutdown(wait=True)
