#!/usr/bin/env python3
"""nicop's CNI plugin executable: forwards one CNI call to the nicop daemon serving it.

`nicop cni-install` copies this file into the CNI bin dir under each plugin's name (sriov,
ib-sriov, host-device, nv-ipam), `nicop multus-install` as `multus`. The runtime starts it for
every pod, so it imports only interpreter built-ins (no `json`, no `socket`: each costs
milliseconds to import) and does no work itself: it sends the plugin name, the CNI_* environment
and stdin to the daemon and prints what the daemon answers. VERSION is answered here, so
runtimes can probe the plugin even while the daemon is down; any other call then gets a CNI
error saying the daemon is not running.

The daemon's socket: $NICOP_CNI_SOCKET, else `socket=` in nicop-<plugin>.conf next to this file
(the multus daemon's), else in nicop-cni.conf, else /run/nicop/cni.sock; `daemon=` in the same
file names the daemon in errors.
"""

import _json
import _socket
import os
import sys

SUPPORTED = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
DEFAULT_SOCKET = "/run/nicop/cni.sock"  # nicop.api.agents.CNI_SOCKET, not imported: see above
DEFAULT_DAEMON = "nicop cni-daemon"
CONF_NAME = "nicop-cni.conf"
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50


def conf_name(plugin: str) -> str:
    """The config file of the daemon serving `plugin` alone (read before nicop-cni.conf)."""
    return "nicop-" + plugin + ".conf"


def _settings(plugin: str) -> "tuple[str, float, str]":  # a string: old node Pythons run this
    path, timeout, daemon = DEFAULT_SOCKET, 120.0, DEFAULT_DAEMON
    here = os.path.dirname(os.path.abspath(__file__))
    for name in (conf_name(plugin), CONF_NAME):
        try:
            with open(os.path.join(here, name)) as f:
                for line in f:
                    key, _, value = line.strip().partition("=")
                    if key == "socket" and value:
                        path = value
                    elif key == "timeout" and value:
                        timeout = float(value)
                    elif key == "daemon" and value:
                        daemon = value
            break
        except (OSError, ValueError):
            continue
    return os.environ.get("NICOP_CNI_SOCKET") or path, timeout, daemon


def _cni_version(stdin: bytes) -> str:
    """The config's cniVersion, found without a JSON parser (enough for an error reply)."""
    at = stdin.find(b'"cniVersion"')
    if at >= 0:
        start = stdin.find(b'"', stdin.find(b":", at) + 1)
        end = stdin.find(b'"', start + 1)
        if 0 <= start < end:
            version = stdin[start + 1:end].decode("ascii", "replace")
            if version in SUPPORTED:
                return version
    return SUPPORTED[-1]


def _fail(stdin: bytes, code: int, msg: str, details: str) -> int:
    sys.stdout.write(
        '{"cniVersion":' + _json.encode_basestring_ascii(_cni_version(stdin))
        + ',"code":' + str(code) + ',"msg":' + _json.encode_basestring_ascii(msg)
        + ',"details":' + _json.encode_basestring_ascii(details) + "}\n"
    )
    return 1


def main() -> int:
    plugin = os.path.basename(sys.argv[0])
    command = os.environ.get("CNI_COMMAND", "")
    stdin = sys.stdin.buffer.read() if sys.stdin is not None else b""
    if command == "VERSION":
        versions = ",".join('"' + v + '"' for v in SUPPORTED)
        sys.stdout.write('{"cniVersion":"' + _cni_version(stdin) + '","supportedVersions":['
                         + versions + "]}\n")
        return 0
    path, timeout, daemon = _settings(plugin)
    code = NOT_AVAILABLE if command == "STATUS" else TRY_AGAIN_LATER
    header = [b"CNI1", plugin.encode()]
    header += [f"{k}={v}".encode() for k, v in os.environ.items() if k.startswith("CNI_")]
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as e:
        return _fail(stdin, code, f"{daemon} is not running on this node ({plugin} needs it)",
                     f"cannot connect to {path}: {e.strerror or e}; check the {daemon} pod "
                     "of this node")
    try:
        sock.sendall(b"\0".join(header) + b"\0\0" + stdin)
        sock.shutdown(_socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except OSError as e:
        return _fail(stdin, code, f"lost the connection to {daemon}",
                     f"{path}: {e.strerror or e}; the daemon restarted or timed out, retry")
    finally:
        sock.close()
    reply = b"".join(chunks)
    status, sep, out = reply.partition(b"\n")
    if not sep or not status.isdigit():
        return _fail(stdin, code, f"{daemon} closed the connection without an answer",
                     f"{path}; the daemon restarted, retry")
    sys.stdout.buffer.write(out)
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
