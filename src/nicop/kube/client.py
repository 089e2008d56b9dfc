"""A small async Kubernetes API client on plain dicts, counting every request by verb.

Authentication, TLS and the server address come from nicop.kube.kubeconfig (the in-cluster
service account, a kubeconfig file or $KUBECONFIG). On top of it: server-side apply with one
field manager, watches with bookmarks, metadata-only lists, and the Eviction API.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import orjson
from prometheus_client import Counter

from nicop.kube.http import HttpClient, Response
from nicop.kube.kubeconfig import Connection, load
from nicop.kube.request_record import RequestRecord
from nicop.kube.resources import POD, Obj, Resource, resource_of

log = logging.getLogger(__name__)
# A request slower than this is logged: what an operator that seems stuck is waiting for.
SLOW_REQUEST = 10.0

FIELD_MANAGER = "nicop"
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
METADATA_ONLY_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}
WRITE_VERBS = frozenset({"create", "apply", "patch", "update", "delete", "evict"})

API_REQUESTS = Counter(
    "nicop_api_requests_total", "Requests sent to the Kubernetes API", ["verb", "resource"]
)
WATCH_BYTES = Counter("nicop_api_watch_bytes_total", "Bytes of watch events received",
                      ["resource"])


class ApiError(Exception):
    """A non-2xx answer of the API server, with its Status reason and message."""

    def __init__(self, code: int, reason: str, message: str,
                 causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes  # details.causes[].message: e.g. which PodDisruptionBudget refused


class Unreachable(ApiError):
    """No answer at all: the API server is down, restarting or cut off. Handled as an API
    error (the request failed; retry later), so one `except ApiError` covers outages too."""

    def __init__(self, error: Exception, server: str = "") -> None:
        at = f" {server}" if server else ""
        super().__init__(503, "Unreachable",
                         f"cannot reach the API server{at}: {error or type(error).__name__}")

    def __str__(self) -> str:
        return self.message


class ApiClient:
    def __init__(self, kubeconfig: str | Path | None = None, timeout: float = 30.0,
                 context: str | None = None) -> None:
        self.connection: Connection = load(kubeconfig, context)
        self._http = HttpClient(self.connection.server, self.connection.tls,
                                self.connection.auth, timeout)
        # (verb, plural) -> count, so tests and benchmarks can count what a reconcile sent.
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        # Each kind of request, written down for deriving the RBAC needed (request_record).
        self.record: RequestRecord | None = None

    async def close(self) -> None:
        await self._http.close()

    def writes(self, exclude: tuple[str, ...] = ("leases", "events")) -> int:
        """Write requests sent so far, leaving out lease renewals and Events by default."""
        return sum(
            n for (verb, plural), n in self.requests.items()
            if verb in WRITE_VERBS and plural not in exclude
        )

    def _count(self, verb: str, res: Resource) -> None:
        self.requests[verb, res.plural] += 1
        API_REQUESTS.labels(verb, res.plural).inc()

    async def _send(
        self,
        verb: str,
        res: Resource,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Obj:
        self._count(verb, res)
        content = None if body is None else orjson.dumps(body)
        headers = {"Accept": accept}
        if content is not None:
            headers["Content-Type"] = content_type
        resp = await self._request(method, path, params=params, body=content, headers=headers)
        return orjson.loads(resp.body) if resp.body else {}

    async def _request(self, method: str, path: str, **kwargs: Any) -> Response:
        if self.record is not None:
            self.record.note(method, path, kwargs.get("params"))
        started = time.monotonic()
        try:
            resp = await self._http.request(method, path, **kwargs)
        except OSError as e:  # refused, reset, timed out, TLS failed
            raise Unreachable(e, self.connection.server) from None
        finally:
            if (took := time.monotonic() - started) >= SLOW_REQUEST:
                log.warning("%s %s took %.1fs: the API server is slow or overloaded",
                            method, path, took)
        if resp.status >= 400:
            raise _error(resp.status, resp.body)
        return resp

    # ------------------------------------------------------------------ reads
    async def get(self, res: Resource, name: str, namespace: str | None = None) -> Obj:
        return await self._send("get", res, "GET", res.path(namespace, name))

    async def get_or_none(
        self, res: Resource, name: str, namespace: str | None = None
    ) -> Obj | None:
        try:
            return await self.get(res, name, namespace)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
    ) -> tuple[list[Obj], str]:
        """All matching objects and the list's resourceVersion (pages through `continue`)."""
        items: list[Obj] = []
        params: dict[str, Any] = {"limit": 500}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        while True:
            page = await self._send("list", res, "GET", res.path(namespace), params=params,
                                    accept=METADATA_ONLY if metadata_only else "application/json")
            for item in page.get("items", []):
                item.setdefault("apiVersion", res.api_version)
                item.setdefault("kind", res.kind)
                items.append(item)
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, page.get("metadata", {}).get("resourceVersion", "")
            params["continue"] = token

    async def watch(
        self,
        res: Resource,
        resource_version: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
        timeout_seconds: int = 300,
        on_open: Callable[[], None] | None = None,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Yield (type, object) from one watch request; an ERROR event raises (410: relist).
        `on_open` is called once the server has accepted the watch."""
        params: dict[str, Any] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": timeout_seconds,
        }
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        self._count("watch", res)
        if self.record is not None:
            self.record.note("GET", res.path(namespace), params)
        headers = {"Accept": METADATA_ONLY_WATCH if metadata_only else "application/json"}
        try:
            async with self._http.stream("GET", res.path(namespace), params=params,
                                         headers=headers, read_timeout=timeout_seconds + 30
                                         ) as resp:
                if resp.status >= 400:
                    raise _error(resp.status, await resp.read())
                if on_open is not None:
                    on_open()
                received = WATCH_BYTES.labels(res.plural)
                async for line in resp.lines():
                    received.inc(len(line))
                    event = orjson.loads(line)
                    if event["type"] == "ERROR":
                        status = event["object"]
                        raise ApiError(status.get("code", 500), status.get("reason", ""),
                                       status.get("message", ""))
                    obj = event["object"]
                    obj.setdefault("apiVersion", res.api_version)
                    obj.setdefault("kind", res.kind)
                    yield event["type"], obj
        except OSError as e:
            raise Unreachable(e, self.connection.server) from None

    # ------------------------------------------------------------------ writes
    async def create(self, obj: Obj, *, res: Resource | None = None,
                     dry_run: bool = False) -> Obj:
        """Create; with `dry_run` the object as the API server would store it, unwritten."""
        res = res or resource_of(obj)
        ns = obj["metadata"].get("namespace")
        return await self._send("dry-run" if dry_run else "create", res, "POST", res.path(ns),
                                body=obj, params={"dryRun": "All"} if dry_run else None)

    async def apply(
        self, obj: Obj, *, subresource: str | None = None, force: bool = True,
        res: Resource | None = None, dry_run: bool = False, manager: str = FIELD_MANAGER,
    ) -> Obj:
        """Server-side apply of `obj` (which holds only the fields nicop owns); with `dry_run`
        the object as the API server would store it, defaults filled in, nothing written.
        Another `manager` keeps fields apart that two nicop agents set in one object."""
        res = res or resource_of(obj)
        m = obj["metadata"]
        path = res.path(m.get("namespace"), m["name"])
        if subresource:
            path += f"/{subresource}"
        params = {"fieldManager": manager, "force": "true" if force else "false"}
        if dry_run:
            params["dryRun"] = "All"
        return await self._send("dry-run" if dry_run else "apply", res, "PATCH", path,
                                params=params, body=obj, content_type=PATCH_TYPES["apply"])

    async def patch(
        self,
        res: Resource,
        name: str,
        body: Any,
        namespace: str | None = None,
        *,
        patch_type: Literal["merge", "json", "strategic"] = "merge",
        subresource: str | None = None,
    ) -> Obj:
        path = res.path(namespace, name) + (f"/{subresource}" if subresource else "")
        return await self._send("patch", res, "PATCH", path, body=body,
                                params={"fieldManager": FIELD_MANAGER},
                                content_type=PATCH_TYPES[patch_type])

    async def update(self, obj: Obj, *, subresource: str | None = None,
                     res: Resource | None = None, dry_run: bool = False) -> Obj:
        """Replace; with `dry_run` the object as the API server would store it, unwritten."""
        res = res or resource_of(obj)
        m = obj["metadata"]
        path = res.path(m.get("namespace"), m["name"]) + (f"/{subresource}" if subresource else "")
        params = {"fieldManager": FIELD_MANAGER, **({"dryRun": "All"} if dry_run else {})}
        return await self._send("dry-run" if dry_run else "update", res, "PUT", path, body=obj,
                                params=params)

    async def post(self, res: Resource, name: str, subresource: str,
                   namespace: str | None, body: Obj) -> Obj:
        """Create on a subresource (a ServiceAccount's token, a pod's binding)."""
        path = res.path(namespace, name) + f"/{subresource}"
        return await self._send("create", res, "POST", path, body=body)

    async def delete(
        self, res: Resource, name: str, namespace: str | None = None, *,
        propagation: str = "Background", missing_ok: bool = True,
        grace_seconds: int | None = None, uid: str | None = None,
    ) -> None:
        """Delete; `uid` makes sure it is still the same object (409 otherwise)."""
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions",
                     "propagationPolicy": propagation}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self._send("delete", res, "DELETE", res.path(namespace, name), body=body)
        except ApiError as e:
            if not (missing_ok and e.code == 404):
                raise

    async def read_text(self, res: Resource, path: str, params: dict[str, Any] | None = None,
                        timeout: float | None = None) -> str:
        """A GET whose answer is text, not an object: a pod's log, the server's /version."""
        self._count("get", res)
        resp = await self._request("GET", path, params=params, timeout=timeout)
        return resp.body.decode(errors="replace")

    async def evict(self, name: str, namespace: str) -> None:
        """Evict through the Eviction API, so PodDisruptionBudgets hold (429: not now)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        await self._send("evict", POD, "POST", POD.path(namespace, name) + "/eviction", body=body)


def _error(code: int, content: bytes) -> ApiError:
    try:
        status = orjson.loads(content)
        causes = tuple(str(c["message"]) for c in (status.get("details") or {}).get("causes")
                       or [] if c.get("message"))
        return ApiError(code, status.get("reason", ""), status.get("message", content.decode()),
                        causes)
    except (ValueError, AttributeError):
        return ApiError(code, "", content.decode(errors="replace"))
