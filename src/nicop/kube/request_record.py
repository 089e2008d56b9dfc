"""Each kind of API request a process makes, as the API server authorizes it, written once.

`NICOP_RECORD_REQUESTS=FILE` makes the operator append one JSON line per distinct (verb, group,
resource, subresource, namespace, name) it asks for, so the RBAC it needs can be read from what
it really did instead of from its code. Lines are short single writes to a file opened for
appending, so several processes can share one file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

ENV = "NICOP_RECORD_REQUESTS"
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def attributes(method: str, path: str, params: dict[str, Any] | None) -> dict[str, str]:
    """The request's authorization attributes, as in a SubjectAccessReview (a path outside
    /api and /apis is a non-resource URL)."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return {"verb": method.lower(), "path": path}
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    resource, name, subresource = [*rest, "", ""][:3]
    if method == "GET":
        verb = "watch" if (params or {}).get("watch") else "get" if name else "list"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = VERBS[method]
    return {"verb": verb, "group": group, "resource": resource, "subresource": subresource,
            "namespace": namespace, "name": name}


class RequestRecord:
    """Appends each request kind not seen before by this process to `file`; `namespace` (the
    process's own) is written with it, to tell its own namespace from any other."""

    def __init__(self, file: Path, namespace: str) -> None:
        self.file = file
        self.namespace = namespace
        self._seen: set[tuple[str, ...]] = set()

    def note(self, method: str, path: str, params: dict[str, Any] | None) -> None:
        attrs = attributes(method, path, params)
        key = tuple(attrs.values())
        if key in self._seen:
            return
        self._seen.add(key)
        line = orjson.dumps({**attrs, "ownNamespace": self.namespace}) + b"\n"
        fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def from_env(namespace: str) -> RequestRecord | None:
    file = os.environ.get(ENV)
    return RequestRecord(Path(file), namespace) if file else None
