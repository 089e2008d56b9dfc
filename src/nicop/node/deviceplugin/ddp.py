"""DDP (Dynamic Device Personalization) profiles of Intel 700/800 Series NICs, for the SR-IOV
device plugin's `ddpProfiles` selector.

Which profile a port runs is known to the NIC's firmware only. Upstream's plugin asks Intel's
`ddptool` (`ddptool -l -a -j -s <PCI address>`, shipped in its image) and so does nicop, reading
the same JSON answer. A device ddptool cannot describe (another vendor's NIC, an error, no ddptool
on the node) runs no profile and matches no `ddpProfiles` selector. A profile changes only when an
administrator loads another one, so each device's answer is kept for a minute rather than asking
ddptool again at every rescan.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

DDPTOOL = "ddptool"
NO_PROFILE_EXIT = 8  # ddptool's exit code for a device that supports DDP but runs no profile
CACHE_SECONDS = 60.0
TIMEOUT_SECONDS = 10.0


class DdpError(Exception):
    """ddptool's answer names no profile."""


def profile_name(stdout: str) -> str:
    """The profile name in ddptool's JSON (`DDPInventory.DDPpackage.name`)."""
    try:
        data: Any = json.loads(stdout)
    except ValueError:
        raise DdpError("ddptool's output is not JSON") from None
    inventory = data.get("DDPInventory") if isinstance(data, dict) else None
    package = inventory.get("DDPpackage") if isinstance(inventory, dict) else None
    name = package.get("name") if isinstance(package, dict) else None
    if not isinstance(name, str) or not name:
        raise DdpError("ddptool's output names no DDP profile")
    return name


def ddptool_profile(address: str) -> str:
    """The profile device `address` runs according to ddptool; "" for none or no answer."""
    exe = shutil.which(DDPTOOL)
    if exe is None:
        return ""
    try:
        done = subprocess.run([exe, "-l", "-a", "-j", "-s", address], capture_output=True,
                              text=True, timeout=TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("ddptool for %s failed: %s", address, e)
        return ""
    if done.returncode != 0:  # NO_PROFILE_EXIT among others: no profile
        return ""
    try:
        return profile_name(done.stdout)
    except DdpError as e:
        log.info("%s: %s", address, e)
        return ""


class Profiles:
    """Each device's DDP profile, asked at most once per `ttl` seconds."""

    def __init__(self, query: Callable[[str], str] = ddptool_profile,
                 ttl: float = CACHE_SECONDS) -> None:
        self._query = query
        self._ttl = ttl
        self._known: dict[str, tuple[float, str]] = {}
        self._warned = False

    def get(self, address: str) -> str:
        now = time.monotonic()
        known = self._known.get(address)
        if known is not None and now - known[0] < self._ttl:
            return known[1]
        if not self._warned and self._query is ddptool_profile and shutil.which(DDPTOOL) is None:
            log.warning("ddpProfiles selectors need %s, which is not on this node's PATH; they "
                        "match no device", DDPTOOL)
            self._warned = True
        profile = self._query(address)
        self._known[address] = (now, profile)
        return profile
