"""The node's filesystem as the agents see it.

Every path an agent reads or writes on the host (sysfs, /dev, /run, /var/lib) goes through a
`Host`, so the same code runs on a real node (root `/`, or the host mounted into a container) and
on a simulated node whose root is a fixture tree.
"""

from __future__ import annotations

import os
from pathlib import Path


class Host:
    """A root directory and the few file operations agents need, all relative to it."""

    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root)
        # Agents rescan sysfs every fraction of a second: plain strings, not pathlib, on that path.
        self._prefix = str(self.root).rstrip("/")

    def __repr__(self) -> str:
        return f"Host({str(self.root)!r})"

    def path(self, path: str) -> Path:
        """The real location of the host path `path` (an absolute path on the node)."""
        return Path(self._real(path))

    def _real(self, path: str) -> str:
        return self._prefix + "/" + path.lstrip("/")

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
