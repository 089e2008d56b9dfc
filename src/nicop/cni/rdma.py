"""RDMA devices and network namespaces: what ib-sriov's `rdmaIsolation` needs.

With the RDMA subsystem in exclusive mode (`rdma system set netns exclusive`) an RDMA device
belongs to one network namespace, and only processes there see it. `RdmaControl` is the one
interface the plugins use: `NetlinkRdmaControl` asks the kernel (RDMA netlink, the calls behind
`rdma system show` and `rdma dev set <dev> netns <ns>`); a simulated node brings its own
(nicop_sim.pf).
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Protocol

from nicop.cni.netlink import Netns, open_netns
from nicop.cni.spec import CniError, Code

EXCLUSIVE = "exclusive"
SHARED = "shared"

# include/uapi/rdma/rdma_netlink.h
NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3


class RdmaControl(Protocol):
    def netns_mode(self) -> str: ...
    def move(self, device: str, src: str, dst: str) -> None:
        """Move RDMA `device` from the namespace at path `src` to the one at `dst` ("" is the
        node's own)."""


class NetlinkRdmaControl:
    """The kernel's RDMA netlink family, spoken directly (pyroute2 has no RDMA support)."""

    def __init__(self, host: Netns) -> None:
        self.host = host

    def _ns(self, path: str) -> Netns:
        """The namespace at `path`, or ("") another handle on the node's."""
        return open_netns(path, "RDMA namespace") if path else \
            Netns(f"/proc/self/fd/{self.host.fd}")

    def _request(self, ns: Netns, cmd: int, flags: int, attrs: bytes) -> list[dict[int, bytes]]:
        msg_type = (RDMA_NL_NLDEV << 10) + cmd
        body = struct.pack("=IHHII", 16 + len(attrs), msg_type, NLM_F_REQUEST | flags, 1, 0) \
            + attrs
        try:
            sock = ns.netlink_socket(socket.SOCK_RAW, NETLINK_RDMA)
        except OSError as e:
            raise CniError(Code.INTERNAL, "rdmaIsolation: the node has no RDMA netlink "
                           f"({e.strerror or e})", "is ib_core loaded?") from None
        replies: list[dict[int, bytes]] = []
        with sock:
            sock.sendto(body, (0, 0))
            while True:
                data = sock.recv(65536)
                offset = 0
                while offset + 16 <= len(data):
                    length, kind, _, _, _ = struct.unpack_from("=IHHII", data, offset)
                    payload = data[offset + 16:offset + length]
                    offset += (length + 3) & ~3
                    if kind == NLMSG_DONE:
                        return replies
                    if kind == NLMSG_ERROR:
                        err = -struct.unpack_from("=i", payload)[0]
                        if err:
                            raise OSError(err, os.strerror(err))
                        return replies
                    replies.append(_attrs(payload))
                if not flags & NLM_F_DUMP and replies:
                    return replies

    def netns_mode(self) -> str:
        reply = self._request(self.host, RDMA_NLDEV_CMD_SYS_GET, 0, b"")
        mode = reply[0].get(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, b"\x01") if reply else b"\x01"
        return SHARED if mode[0] else EXCLUSIVE

    def move(self, device: str, src: str, dst: str) -> None:
        with self._ns(src) as source, self._ns(dst) as target:
            index = None
            for dev in self._request(source, RDMA_NLDEV_CMD_GET, NLM_F_DUMP, b""):
                if dev.get(RDMA_NLDEV_ATTR_DEV_NAME, b"").rstrip(b"\0").decode() == device:
                    index = struct.unpack("=I", dev[RDMA_NLDEV_ATTR_DEV_INDEX][:4])[0]
            if index is None:
                raise CniError(Code.INTERNAL, f"RDMA device {device} not found in "
                               f"{src or 'the node namespace'}")
            try:
                self._request(source, RDMA_NLDEV_CMD_SET, NLM_F_ACK,
                              _attr(RDMA_NLDEV_ATTR_DEV_INDEX, struct.pack("=I", index))
                              + _attr(RDMA_NLDEV_NET_NS_FD, struct.pack("=I", target.fd)))
            except OSError as e:
                raise CniError(Code.INTERNAL, f"moving RDMA device {device} to "
                               f"{dst or 'the node namespace'}: {e.strerror or e}") from None


def _attr(kind: int, value: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(value), kind) + value
    return data + b"\0" * ((4 - len(data) % 4) % 4)


def _attrs(payload: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    offset = 0
    while offset + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = payload[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return out
