"""Config files agents follow while they run, as Kubernetes replaces a mounted ConfigMap's."""

from __future__ import annotations

import os
from pathlib import Path


class WatchedFile:
    """A config file read again whenever it changes (inode, size or modification time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None

    def changed(self) -> bool:
        """True when the file differs from the last look (also when it went or came)."""
        try:
            st = os.stat(self.path)
            now: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            now = None
        if now == self._seen:
            return False
        self._seen = now
        return True
