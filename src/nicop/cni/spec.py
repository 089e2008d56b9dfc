"""The CNI protocol (spec 1.0.0 and 1.1.0, with 0.1.0 to 0.4.0 results for older configs).

One place knows the environment variables each command needs, the well-known error codes, how
CNI_ARGS are parsed, and how a result is written for the version the runtime asked for; the
plugins work on one internal result shape (1.1.0's) and never on version differences.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

# The Go library's version.All: every plugin built on it accepts all of these.
SUPPORTED_VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"
UNVERSIONED = "0.1.0"
"""What a config without cniVersion is taken for (the Go library's ConfigDecoder)."""
COMMANDS = ("ADD", "DEL", "CHECK", "VERSION", "STATUS", "GC")

Obj = dict[str, Any]


class Code(IntEnum):
    """Well-known error codes (CNI spec "Error"); 100 and above are nicop's own."""

    INCOMPATIBLE_VERSION = 1
    UNSUPPORTED_FIELD = 2
    UNKNOWN_CONTAINER = 3
    INVALID_ENV = 4
    IO_FAILURE = 5
    DECODING_FAILURE = 6
    INVALID_CONFIG = 7
    TRY_AGAIN_LATER = 11
    NOT_AVAILABLE = 50
    LIMITED_CONNECTIVITY = 51
    DEVICE_BUSY = 100
    """The VF or device is attached to another pod."""
    NO_FREE_ADDRESSES = 101
    """The node's block of the pool is used up."""
    INTERNAL = 999


class CniError(Exception):
    """An error the plugin reports to the runtime: code, message and details."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code = int(code)
        self.msg = msg
        self.details = details

    def to_json(self, version: str) -> Obj:
        out: Obj = {"cniVersion": version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


def config_error(field_name: str, problem: str) -> CniError:
    """An invalid network configuration, naming the field the user must fix."""
    return CniError(Code.INVALID_CONFIG, f"{field_name}: {problem}")


# Variables each command needs, as the Go library's skel checks them (stricter than the spec's
# "Parameters" table: CNI_PATH too), so a runtime that works with upstream works here.
REQUIRED_ENV = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": ("CNI_PATH",),
    "VERSION": (),
}
CONTAINER_ID = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
NETWORK_NAME = CONTAINER_ID  # the Go library's ValidateNetworkName uses the same pattern
KNOWN_ARGS = frozenset({
    "IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID",
    "K8S_POD_UID", "MAC", "IP", "GATEWAY",
})
# Commands a config version allows: CHECK came with 0.4.0, STATUS and GC with 1.1.0.
MIN_VERSION = {"CHECK": (0, 4, 0), "STATUS": (1, 1, 0), "GC": (1, 1, 0)}


def version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split("."))
    except ValueError:
        return (0,)


@dataclass
class Request:
    """One plugin invocation: which plugin ran, the CNI_* environment and the parsed config."""

    plugin: str
    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: dict[str, str] = field(default_factory=dict)
    path: list[str] = field(default_factory=list)
    config: Obj = field(default_factory=dict)
    stdin: bytes = b""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def version(self) -> str:
        return str(self.config.get("cniVersion") or UNVERSIONED)

    @property
    def name(self) -> str:
        return str(self.config.get("name") or "")

    @property
    def pod(self) -> tuple[str, str, str]:
        """(namespace, name, uid) of the pod, from the Kubernetes CNI_ARGS."""
        a = self.args
        return a.get("K8S_POD_NAMESPACE", ""), a.get("K8S_POD_NAME", ""), a.get("K8S_POD_UID", "")


def parse_args(text: str) -> dict[str, str]:
    """CNI_ARGS `K=V;K2=V2`; unknown keys are refused unless IgnoreUnknown is true or 1.

    As the Go library's LoadArgs, with one leniency: an empty pair (`A=1;;B=2`, a trailing
    `;`) is skipped rather than refused.
    """
    args: dict[str, str] = {}
    if not text:
        return args
    for pair in text.split(";"):
        if not pair:
            continue
        kv = pair.split("=")
        if len(kv) != 2:
            raise CniError(Code.INVALID_ENV, f"CNI_ARGS: invalid pair {pair!r}",
                           "each pair must be KEY=VALUE, pairs separated by ';'")
        args[kv[0]] = kv[1]
    ignore = args.get("IgnoreUnknown", "false")
    if ignore.lower() not in ("true", "1", "false", "0"):
        raise CniError(Code.INVALID_ENV, f"CNI_ARGS: error parsing value of pair "
                       f"'IgnoreUnknown={ignore}': boolean unmarshal error: invalid input "
                       f"{ignore.lower()}", "IgnoreUnknown takes true, false, 1 or 0")
    unknown = sorted(set(args) - KNOWN_ARGS)
    if unknown and ignore.lower() not in ("true", "1"):
        raise CniError(Code.INVALID_ENV, f"CNI_ARGS: unknown args {unknown}",
                       "add IgnoreUnknown=true to pass arguments this plugin does not use")
    return args


def validate_ifname(name: str) -> None:
    """The kernel's rules for an interface name (net/core/dev.c dev_valid_name)."""
    if not name:
        raise CniError(Code.INVALID_ENV, "CNI_IFNAME: interface name is empty")
    if len(name) > 15:
        raise CniError(Code.INVALID_ENV, f"CNI_IFNAME: interface name {name!r} is too long",
                       "interface name should be less than 16 characters")
    if name in (".", ".."):
        raise CniError(Code.INVALID_ENV, "CNI_IFNAME: interface name is . or ..")
    if any(c in "/:" or c.isspace() for c in name):
        raise CniError(Code.INVALID_ENV,
                       f"CNI_IFNAME: interface name {name!r} contains / or : or whitespace")


def validate_name(name: object) -> None:
    """The network name every command but VERSION needs (skel's validateConfig)."""
    if not name:
        raise CniError(Code.INVALID_CONFIG, "missing network name",
                       "set \"name\" in the network configuration (Multus and libcni copy it "
                       "from the NetworkAttachmentDefinition or the conflist)")
    if not isinstance(name, str) or not NETWORK_NAME.match(name):
        raise CniError(Code.INVALID_CONFIG, "invalid characters found in network name",
                       str(name))


def parse_request(plugin: str, env: dict[str, str], stdin: bytes) -> Request:
    """Validate the environment and the config as the spec orders it; raise CniError."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CniError(Code.INVALID_ENV, "required env variables [CNI_COMMAND] missing")
    if command not in COMMANDS:
        raise CniError(Code.INVALID_ENV, f"CNI_COMMAND: unknown command {command!r}",
                       "one of " + ", ".join(COMMANDS))
    missing = [v for v in REQUIRED_ENV[command] if not env.get(v)]
    if missing:
        raise CniError(Code.INVALID_ENV, f"required env variables [{','.join(missing)}] missing")
    req = Request(
        plugin=plugin,
        command=command,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=env.get("CNI_NETNS", ""),
        ifname=env.get("CNI_IFNAME", ""),
        path=[p for p in env.get("CNI_PATH", "").split(":") if p],
        stdin=stdin,
        env=env,
    )
    if command in ("ADD", "DEL", "CHECK"):
        if not CONTAINER_ID.match(req.container_id):
            raise CniError(Code.INVALID_ENV, "CNI_CONTAINERID: invalid characters in containerID",
                           req.container_id)
        validate_ifname(req.ifname)
        req.args = parse_args(env.get("CNI_ARGS", ""))
    try:
        config = json.loads(stdin) if stdin.strip() else {}
    except ValueError as e:
        raise CniError(Code.DECODING_FAILURE, f"decoding the network configuration: {e}") from None
    if not isinstance(config, dict):
        raise CniError(Code.DECODING_FAILURE, "the network configuration must be a JSON object")
    req.config = config
    if command == "VERSION":
        return req
    validate_name(config.get("name"))
    version = config.get("cniVersion") or UNVERSIONED
    if not isinstance(version, str) or version not in SUPPORTED_VERSIONS:
        raise CniError(Code.INCOMPATIBLE_VERSION, "incompatible CNI versions",
                       f"config is {version!r}, plugin supports {list(SUPPORTED_VERSIONS)}")
    need = MIN_VERSION.get(command)
    if need and version_tuple(version) < need:
        raise CniError(Code.INCOMPATIBLE_VERSION,
                       f"config version {version} does not allow {command}")
    return req


def version_reply(config: Obj) -> Obj:
    """VERSION: the versions this plugin accepts, answered in the version asked for."""
    requested = config.get("cniVersion")
    version = requested if requested in SUPPORTED_VERSIONS else LATEST
    return {"cniVersion": version, "supportedVersions": list(SUPPORTED_VERSIONS)}


# ------------------------------------------------------------------ results

INTERFACE_KEYS = ("name", "mac", "mtu", "sandbox", "socketPath", "pciID")
INTERFACE_11 = ("mtu", "socketPath", "pciID")


def _interface(item: Obj, legacy: bool) -> Obj:
    return {k: item[k] for k in INTERFACE_KEYS
            if item.get(k) not in (None, "", 0) and not (legacy and k in INTERFACE_11)}


def _route(route: Obj) -> Obj:
    """types.Route as Go writes it: dst, then gw, mtu, advmss, priority when set (omitempty),
    table and scope whenever given (pointers, so 0 is written)."""
    out = {"dst": route["dst"]}
    for key in ("gw", "mtu", "advmss", "priority"):
        if route.get(key):
            out[key] = route[key]
    for key in ("table", "scope"):
        if route.get(key) is not None:
            out[key] = route[key]
    return out


def _sorted(value: Any) -> Any:
    """Keys in lexical order at every level, as Go's encoding/json writes a map."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def render_result(result: Obj, version: str) -> Obj:
    """The result as the Go library (containernetworking/cni v1.3) prints it for `version`.

    1.0.0 and 1.1.0 share one Go type (pkg/types/100), written through a map: its keys come out
    sorted at every level, an empty `dns` is left out, and the interface `mtu`, `pciID` and
    `socketPath` are kept. 0.3.x/0.4.0 (pkg/types/040) drop those interface fields, add
    ips[].version and always write `dns`; their routes are the same Go type, extras included.
    0.1.0/0.2.0 have their own shape (see _render_02x).
    """
    if version_tuple(version) < (0, 3, 0):
        return _render_02x(result, version)
    legacy = version_tuple(version) < (1, 0, 0)
    out: Obj = {"cniVersion": version}
    interfaces = [_interface(i, legacy) for i in result.get("interfaces") or []]
    if interfaces:
        out["interfaces"] = interfaces
    ips = []
    for ip in result.get("ips") or []:
        item: Obj = {"version": "6" if ":" in ip["address"] else "4"} if legacy else {}
        if ip.get("interface") is not None:
            item["interface"] = ip["interface"]
        item["address"] = ip["address"]
        if ip.get("gateway"):
            item["gateway"] = ip["gateway"]
        ips.append(item)
    if ips:
        out["ips"] = ips
    routes = [_route(r) for r in result.get("routes") or []]
    if routes:
        out["routes"] = routes
    dns = {k: v for k, v in (result.get("dns") or {}).items() if v}
    if legacy:
        out["dns"] = dns
        return out
    if dns:
        out["dns"] = dns
    return dict(_sorted(out))


def _render_02x(result: Obj, version: str) -> Obj:
    """A 0.1.0/0.2.0 result: the first IPv4 and IPv6 address as `ip4`/`ip6`, each with the
    routes of its family; no interfaces. As in the Go library, a result without any address
    cannot be written in this shape."""
    out: Obj = {"cniVersion": version}
    for ip in result.get("ips") or []:
        key = "ip6" if ":" in ip["address"] else "ip4"
        if key not in out:
            out[key] = {"ip": ip["address"], **({"gateway": ip["gateway"]}
                                                if ip.get("gateway") else {})}
    if "ip4" not in out and "ip6" not in out:
        raise CniError(Code.INTERNAL, "cannot convert: no valid IP addresses",
                       f"a cniVersion {version} result carries only IP addresses; give the "
                       "network an ipam section, or use cniVersion 0.3.0 or later")
    for route in result.get("routes") or []:
        key = "ip6" if ":" in route["dst"] else "ip4"
        if key in out:
            out[key].setdefault("routes", []).append(
                {k: route[k] for k in ("dst", "gw") if route.get(k)})
    out = {k: out[k] for k in ("cniVersion", "ip4", "ip6") if k in out}
    out["dns"] = {k: v for k, v in (result.get("dns") or {}).items() if v}
    return out


def parse_result(data: Obj) -> Obj:
    """A result of any supported version (a prevResult, a delegate's answer) in 1.1.0 shape;
    0.1.0/0.2.0 `ip4`/`ip6` become `ips` and `routes`, as the Go library converts them."""
    if not isinstance(data, dict):
        raise CniError(Code.DECODING_FAILURE, "a CNI result must be a JSON object")
    out: Obj = {"interfaces": [], "ips": [], "routes": [], "dns": dict(data.get("dns") or {})}
    for key in ("ip4", "ip6"):  # a 0.1.0/0.2.0 result (an IPAM plugin run for such a config)
        legacy = data.get(key)
        if isinstance(legacy, dict) and legacy.get("ip"):
            data = {**data, "ips": [*(data.get("ips") or []), {
                k: v for k, v in (("address", legacy["ip"]),
                                  ("gateway", legacy.get("gateway"))) if v}]}
            data["routes"] = [*(data.get("routes") or []), *(legacy.get("routes") or [])]
    for iface in data.get("interfaces") or []:
        out["interfaces"].append(dict(iface))
    for ip in data.get("ips") or []:
        try:
            if not isinstance(ip["address"], str) or "/" not in ip["address"]:
                raise ValueError(ip["address"])
            ipaddress.ip_interface(ip["address"])
        except (KeyError, ValueError, TypeError):
            raise CniError(Code.DECODING_FAILURE,
                           f"result has an invalid address: {ip!r}") from None
        item = {k: v for k, v in ip.items() if k != "version"}
        out["ips"].append(item)
    for route in data.get("routes") or []:
        out["routes"].append(dict(route))
    return out


def empty_result() -> Obj:
    return {"interfaces": [], "ips": [], "routes": [], "dns": {}}
