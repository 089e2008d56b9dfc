"""The node's filesystem as the agents see it.

Every path an agent reads or writes on the host (sysfs, /dev, /run, /var/lib) goes through a
`Host`, so the same code runs on a real node (root `/`, or the host mounted into a container) and
on a simulated node whose root is a fixture tree.

Paths an agent is given (its root, config files) are paths in its container. On a node they are
real paths. On a simulated node the node stand-in runs the container as a plain process and says
where each of the container's mounts really is: `$NICOP_MOUNTS`, a JSON object of container path
-> real directory, which `Mounts` applies (the longest matching prefix wins, as mounts stack).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

MOUNTS_ENV = "NICOP_MOUNTS"
IFF_UP = 0x1


class Mounts:
    """Container paths -> real paths; without entries every path is itself."""

    def __init__(self, table: Mapping[str, str] | None = None) -> None:
        entries = [("/" + k.strip("/"), str(v).rstrip("/")) for k, v in (table or {}).items()]
        # Longest first, so /dev/infiniband wins over /dev and / over nothing.
        self._entries = sorted(entries, key=lambda e: len(e[0]), reverse=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Mounts:
        raw = (os.environ if env is None else env).get(MOUNTS_ENV)
        return cls(json.loads(raw) if raw else None)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def real(self, path: str) -> str:
        """Where the container path `path` (absolute) really is."""
        for prefix, target in self._entries:
            if prefix == "/":
                return target + path
            if path == prefix or path.startswith(prefix + "/"):
                return target + path[len(prefix):]
        return path


class Host:
    """A root directory and the few file operations agents need, all relative to it."""

    def __init__(self, root: Path | str = "/", mounts: Mounts | None = None) -> None:
        self.root = Path(root)
        # Agents rescan sysfs every fraction of a second: plain strings, not pathlib, on that path.
        self._prefix = str(self.root).rstrip("/")
        self._mounts = mounts if mounts else None

    @classmethod
    def in_container(cls, root: Path | str = "/") -> Host:
        """The host as a container sees it through its mounts ($NICOP_MOUNTS, if set)."""
        return cls(root, Mounts.from_env())

    def __repr__(self) -> str:
        return f"Host({str(self.root)!r})"

    def path(self, path: str) -> Path:
        """The real location of the host path `path` (an absolute path on the node)."""
        return Path(self._real(path))

    def _real(self, path: str) -> str:
        full = self._prefix + "/" + path.lstrip("/")
        return self._mounts.real(full) if self._mounts is not None else full

    def exists(self, path: str) -> bool:
        return os.path.lexists(self._real(path))

    def read(self, path: str) -> str | None:
        """The stripped content of a file, or None when it cannot be read (as sysfs often can't)."""
        try:
            with open(self._real(path)) as f:
                return f.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def read_int(self, path: str, base: int = 10) -> int | None:
        text = self.read(path)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    def link_name(self, path: str) -> str | None:
        """The last component of a symlink's target (a driver, a PF address, an IOMMU group)."""
        try:
            return os.path.basename(os.readlink(self._real(path)))
        except OSError:
            return None

    def listdir(self, path: str) -> list[str]:
        """Sorted entries of a directory; empty when it does not exist."""
        try:
            return sorted(os.listdir(self._real(path)))
        except OSError:
            return []

    def write(self, path: str, text: str) -> None:
        """Write a sysfs attribute or a file the agent owns; errors are the kernel's (OSError)."""
        with open(self._real(path), "w") as f:
            f.write(text)

    def link_admin_up(self, ifname: str) -> bool | None:
        """Whether netdev `ifname` is administratively up (IFF_UP in its sysfs `flags`), or None
        when that cannot be read."""
        flags = self.read_int(f"/sys/class/net/{ifname}/flags", 16)
        return None if flags is None else bool(flags & IFF_UP)

    def set_link_up(self, ifname: str) -> None:
        """`ip link set <ifname> up`, in the agent's network namespace (the node's: the agents
        run with hostNetwork). Errors are OSError naming the link."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        try:
            with IPRoute() as ipr:
                index = ipr.link_lookup(ifname=ifname)
                if not index:
                    raise OSError(f"no link {ifname} in this network namespace")
                ipr.link("set", index=index[0], state="up")
        except NetlinkError as e:
            raise OSError(e.code, f"cannot set link {ifname} up: {e}") from None

