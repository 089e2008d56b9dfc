"""The pod annotation that selects networks (`k8s.v1.cni.cncf.io/networks`), read as Multus reads
it: the Multus-compatible meta-plugin attaches a pod by it, and `nicop diagnose` explains it with
the same reading, so the two never disagree about what a pod asked for."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
MAC_LENGTHS = (6, 8, 20)
MAC_BYTES = re.compile(r"^[0-9a-fA-F]{2}(?:([:-])[0-9a-fA-F]{2})(?:\1[0-9a-fA-F]{2})*$")
MAC_DOTTED = re.compile(r"^[0-9a-fA-F]{4}(?:\.[0-9a-fA-F]{4})*$")
# A DNS-1123 label: what Multus accepts for the namespace and name of the comma-separated form.
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass
class Selection:
    """One element of the pod's networks annotation."""

    name: str
    namespace: str
    interface: str = ""
    mac: str = ""
    ips: list[str] = field(default_factory=list)
    infiniband_guid: str = ""
    cni_args: Obj | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class SelectionError(ValueError):
    """The annotation cannot be read; the message says which part and why."""


def _check_ifname(ifname: str) -> str:
    if len(ifname) > 15 or any(c.isspace() or c in "/:" for c in ifname) or ifname in (".", ".."):
        raise SelectionError(f"interface name {ifname!r} is invalid: at most 15 characters, "
                             "without '/', ':' or spaces")
    return ifname


def _parse_item(item: str, pod_namespace: str) -> Selection:
    parts = item.split("/")
    if len(parts) > 2:
        raise SelectionError(f"{item!r}: more than one '/' (the form is [namespace/]name"
                             "[@interface])")
    namespace, rest = (parts[0].strip(), parts[1]) if len(parts) == 2 else ("", parts[0])
    at = rest.split("@")
    if len(at) > 2:
        raise SelectionError(f"{item!r}: more than one '@' (the form is [namespace/]name"
                             "[@interface])")
    name = at[0].strip()
    ifname = at[1].strip() if len(at) == 2 else ""
    if not name:
        raise SelectionError(f"{item!r}: no network name")
    for part in (namespace, name):
        if part and not LABEL.match(part):
            raise SelectionError(f"{item!r}: {part!r} is not a valid name (lower case "
                                 "letters, digits and '-', starting and ending alphanumeric)")
    if ifname:
        _check_ifname(ifname)
    return Selection(name=name, namespace=namespace or pod_namespace, interface=ifname)


def _parse_element(element: object, pod_namespace: str) -> Selection:
    if not isinstance(element, dict) or not isinstance(element.get("name"), str) \
            or not element["name"]:
        raise SelectionError(f"{json.dumps(element)}: each element needs a \"name\"")
    sel = Selection(name=element["name"],
                    namespace=str(element.get("namespace") or "") or pod_namespace)
    ifname = element.get("interface") or element.get("interfaceRequest") or ""
    if ifname:
        sel.interface = _check_ifname(str(ifname))
    for key, attr in (("mac", "mac"), ("infiniband-guid", "infiniband_guid")):
        if value := element.get(key):
            normal = normalize_mac(value) if isinstance(value, str) else None
            if normal is None:
                raise SelectionError(f"network {sel.key}: {key} {value!r} is not a valid "
                                     "address")
            setattr(sel, attr, str(value))
    ips = element.get("ips") or []
    if not isinstance(ips, list) or not all(isinstance(i, str) for i in ips):
        raise SelectionError(f"network {sel.key}: ips must be a list of addresses")
    for ip in ips:
        try:
            if "/" in ip:
                ipaddress.ip_interface(ip)
            else:
                ipaddress.ip_address(ip)
        except ValueError:
            raise SelectionError(f"network {sel.key}: {ip!r} is not an IP address") from None
    sel.ips = list(ips)
    cni_args = element.get("cni-args")
    if cni_args is not None and not isinstance(cni_args, dict):
        raise SelectionError(f"network {sel.key}: cni-args must be an object")
    sel.cni_args = cni_args
    return sel


def parse_selections(annotation: str, pod_namespace: str) -> list[Selection]:
    """The networks a pod selects, in order; namespaces default to the pod's. The JSON form is
    recognised, as Multus does, by any of `[`, `{` or `"` in the value."""
    text = annotation.strip()
    if not text:
        return []
    if any(c in text for c in '[{"'):
        try:
            elements = json.loads(text)
        except ValueError as e:
            raise SelectionError(f"not valid JSON: {e}") from None
        if not isinstance(elements, list):
            raise SelectionError("the JSON form is a list of objects")
        return [_parse_element(e, pod_namespace) for e in elements]
    return [_parse_item(item.strip(), pod_namespace) for item in text.split(",")]


def normalize_mac(value: str) -> str | None:
    """`value` in netlink's form (lowercase, ':'-separated), or None if Go would refuse it."""
    if MAC_BYTES.match(value):
        digits = value.replace(":", "").replace("-", "")
    elif MAC_DOTTED.match(value):
        digits = value.replace(".", "")
    else:
        return None
    if len(digits) // 2 not in MAC_LENGTHS:
        return None
    return ":".join(digits[i:i + 2] for i in range(0, len(digits), 2)).lower()
