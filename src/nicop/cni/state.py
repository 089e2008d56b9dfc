"""Files the plugins keep under /var/lib/cni so that DEL can undo ADD, written atomically."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

from nicop.node.host import Host


def write_json(host: Host, path: str, data: Any) -> None:
    """Replace the file in one step (a crash leaves the old or the new content)."""
    real = host.path(path)
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = real.with_name(f".{real.name}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data if isinstance(data, bytes) else json.dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, real)


TEMP = re.compile(r"^\..+\.\d+\.\d+$")


def sweep_temp(host: Host, directory: str) -> int:
    """Remove temporary files a killed writer left under `directory` (only call this while no
    other writer runs: the daemon does at start, holding the store lock)."""
    removed = 0
    for dirpath, _, files in os.walk(host.path(directory)):
        for name in files:
            if TEMP.match(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
    return removed


def read_json(host: Host, path: str) -> Any:
    """The file's JSON, or None when it does not exist or is unreadable."""
    try:
        return json.loads(host.path(path).read_bytes())
    except (OSError, ValueError):
        return None


def remove(host: Host, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(host.path(path))


class KeyedLocks:
    """One lock per key (a PCI address, a device name), created on demand, dropped when free."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)
