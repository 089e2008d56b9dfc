"""A watch that runs in a thread beside a test, for observers that must see every change (a
moment of three nodes cordoned lasts a few milliseconds). Its failure fails the test: `stop()`
raises what ended the watch before it was told to stop; after that, the end of the control plane
at the module's teardown is no failure."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any


class Watch:
    def __init__(self, events: Callable[[], Iterable[tuple[str, Any]]],
                 handle: Callable[[Any], None]) -> None:
        self._events = events
        self._handle = handle
        self._stopped = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for _, obj in self._events():
                if self._stopped.is_set():
                    return
                self._handle(obj)
        except BaseException as e:  # reported by stop()
            if not self._stopped.is_set():
                self.error = e

    def stop(self) -> None:
        self._stopped.set()
        assert self.error is None, f"the watch failed while the test ran: {self.error!r}"
