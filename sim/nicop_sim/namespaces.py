"""Linux namespaces and mounts for a real node's processes (Python 3.11 has no os.setns).

setns(2) moves the calling thread only: a thread that enters a network namespace to open a
socket there and comes back leaves the socket in that namespace, which is how one process
serves both sides of a node (nicop_sim.forward).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def setns(fd: int, kind: int) -> None:
    _check(_libc.setns(fd, kind), "setns")


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the calling process gets SIGKILL when its parent ends."""
    _libc.prctl(1, 9)


def dying_with_parent(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGKILL when its parent ends, set by util-linux's setpriv
    rather than a preexec_fn: a preexec_fn forces fork(), whose gRPC fork handlers can leave a
    poller thread in the child that aborts it (SIGABRT) once the fds are closed before exec."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


@contextlib.contextmanager
def in_netns(path: str | Path) -> Iterator[None]:
    """The calling thread in the network namespace at `path` for the block, then back."""
    with open("/proc/thread-self/ns/net") as home, open(path) as there:
        setns(there.fileno(), CLONE_NEWNET)
        try:
            yield
        finally:
            setns(home.fileno(), CLONE_NEWNET)


def mount(*args: str) -> None:
    """`mount ARGS`; the error names the mount that failed."""
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def overlay(target: str, upper: Path) -> None:
    """`target` as an overlay of itself with writes going to `upper` (its work dir beside)."""
    (upper / "upper").mkdir(parents=True, exist_ok=True)
    (upper / "work").mkdir(parents=True, exist_ok=True)
    mount("-t", "overlay", "overlay", "-o",
          f"lowerdir={target},upperdir={upper / 'upper'},workdir={upper / 'work'}", target)


def bind(source: str | Path, target: str | Path, recursive: bool = False) -> None:
    Path(target).mkdir(parents=True, exist_ok=True) if Path(source).is_dir() else None
    mount("--rbind" if recursive else "--bind", str(source), str(target))
