"""`nicop bundle`: one archive with what a support engineer asks for first.

The items follow the upstream operator's sosreport (scripts/sosreport in Mellanox/network-operator):
every nicop CR with its status, the operator namespace's rendered workloads, pods, ConfigMaps and
events, Secrets by name only, nodes with labels and allocatable, events of NIC nodes, the
operator's and agents' logs (the last lines, the previous container's too), and on top what
only nicop has: `nicop status -o json` and `nicop diagnose` of the same moment, and the version of
every component.

Every read stands alone: what the user may not read (or the cluster does not serve) is listed in
the manifest with the reason, and the rest is still collected. Nothing secret leaves: Secrets are
listed without data, values under secret-sounding keys and environment variables are replaced,
token-looking strings are scrubbed from every file (logs included), and the values of the
operator namespace's Secrets, where readable, are scrubbed wherever they turn up.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from rich.console import Console

import nicop
from nicop import diagnose as dg
from nicop import report
from nicop import status as st
from nicop.api import nodes as node_rules
from nicop.api.kinds import KINDS
from nicop.kube.client import ApiClient, ApiError, Unreachable
from nicop.kube.resources import (
    CONFIGMAP,
    DAEMONSET,
    DEPLOYMENT,
    EVENT,
    LEASE,
    NODE,
    POD,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    Obj,
    Resource,
)

DEFAULT_LOG_LINES = 5000  # upstream's sosreport default (--log-lines)
LOG_TIMEOUT = 15.0  # seconds for one log; a kubelet that does not answer is not waited on long
REDACTED = "<redacted>"
REPORT = "report.html"
VERSION = Resource("", "v1", "Version", "version", namespaced=False)
# Keys whose string values are secrets wherever they appear (env names, config fields).
SECRET_KEY = re.compile(r"token|passw|secret|credential|api[-_]?key|private[-_]?key|auth",
                        re.IGNORECASE)
# Keys that name a Secret (or hold a reference to one) rather than its value: kept.
# (camelCase fields of CRs and pod specs: ufmSecret, secretName, secretKeyRef, imagePullSecrets).
SECRET_REFERENCE = re.compile(r"(?:[a-z]Secret|[sS]ecretName|[sS]ecretRef|KeyRef|Secrets)$")
SECRET_TEXT = (
    re.compile(r"eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"),  # JWTs (ServiceAccount tokens)
    re.compile(r"(?i)(bearer\s+)[^\s\"']+"),
    # On the key's own line; `xSecret:` names a Secret (ufmSecret), as SECRET_REFERENCE says.
    re.compile(r"(?i)((?:token|password|passwd|(?<![a-z])secret|api[-_]?key)\"?[ \t]*[:=]"
               r"[ \t]*\"?)[^\s\"',}]+"),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
               re.DOTALL),
)
MIN_SECRET_LENGTH = 6  # shorter Secret values ("true", "1") are not hunted in the text
NAMESPACE_KINDS = (DAEMONSET, DEPLOYMENT, POD, CONFIGMAP, SERVICE, SERVICE_ACCOUNT, LEASE)
VOLATILE_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)

Progress = Callable[[str], None]


@dataclass
class Bundle:
    """The archive's files by path, and what could not be collected, with why."""

    files: dict[str, bytes] = field(default_factory=dict)
    missing: list[Obj] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    secret_values: set[str] = field(default_factory=set)

    def add(self, path: str, data: Any) -> None:
        """A file: YAML for objects, text as it is."""
        if isinstance(data, str):
            self.files[path] = data.encode()
        elif path.endswith(".json"):
            self.files[path] = json.dumps(redact(data), indent=2).encode()
        else:
            self.files[path] = yaml.safe_dump(redact(data), sort_keys=False).encode()

    def cannot(self, item: str, error: Exception | str) -> None:
        self.missing.append({"item": item, "reason": str(error)})


# ------------------------------------------------------------------ redaction

def redact(obj: Any) -> Any:
    """A copy without secret values: env values and fields under secret-sounding names,
    managedFields and last-applied annotations (which can hold anything)."""
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out: Obj = {}
    env_name = obj.get("name") if "value" in obj and isinstance(obj.get("name"), str) else None
    for key, value in obj.items():
        if key == "managedFields":
            continue
        if key == "annotations" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in VOLATILE_ANNOTATIONS}
        if isinstance(value, str) and (
                (key == "value" and env_name and _secret_key(env_name)) or _secret_key(key)):
            out[key] = REDACTED
        else:
            out[key] = redact(value)
    return out


def _secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(key)) and not SECRET_REFERENCE.search(key)


def scrub(text: str, secret_values: set[str]) -> str:
    """Text without token-looking strings and without any known Secret value."""
    for value in sorted(secret_values, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    for pattern in SECRET_TEXT:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + REDACTED, text)
    return text


def _secret_values(secret: Obj) -> set[str]:
    values = set()
    for raw in (secret.get("data") or {}).values():
        try:
            values.add(base64.b64decode(raw).decode())
        except (ValueError, UnicodeDecodeError):
            continue
    values.update(str(v) for v in (secret.get("stringData") or {}).values())
    found = set()
    for value in values:
        found.add(value)
        found.update(line.strip() for line in value.splitlines())
    return {v for v in found if len(v) >= MIN_SECRET_LENGTH}


# ------------------------------------------------------------------ collection

def _where(res: Resource, namespace: str | None) -> str:
    return f"{res.plural}" + (f" in namespace {namespace}" if namespace and res.namespaced else "")


async def _list(client: ApiClient, bundle: Bundle, res: Resource, namespace: str | None = None,
                field_selector: str | None = None) -> list[Obj] | None:
    """Objects of a kind; None when it could not be read (listed in the manifest)."""
    try:
        items, _ = await client.list(res, namespace, field_selector=field_selector)
    except Unreachable:
        raise
    except ApiError as e:
        if e.code == 404:
            bundle.absent.append(f"{res.plural}.{res.group or 'core'}")
        else:
            bundle.cannot(f"list {_where(res, namespace)}", f"{e.code} {e.reason}: {e.message}")
        return None
    for item in items:  # lists leave kind and apiVersion out of their items
        item.setdefault("apiVersion", res.api_version)
        item.setdefault("kind", res.kind)
    return items


def _custom_resources() -> list[Resource]:
    return [Resource(m.crd.group, m.crd.version, m.crd.kind, m.crd.plural, m.crd.namespaced)
            for m in KINDS]


async def collect(client: ApiClient, namespace: str, *, log_lines: int = DEFAULT_LOG_LINES,
                  progress: Progress = lambda _: None) -> Bundle:
    """Read everything into a Bundle; only an API server that does not answer at all stops it."""
    bundle = Bundle()
    steps = 7

    progress(f"[1/{steps}] server version")
    try:
        bundle.add("cluster/version.json", json.loads(await client.read_text(VERSION, "/version")))
    except ApiError as e:
        if isinstance(e, Unreachable):
            raise
        bundle.cannot("server version (/version)", e)

    progress(f"[2/{steps}] Secrets of namespace {namespace} (names only)")
    secrets = await _list(client, bundle, SECRET, namespace)
    if secrets is not None:
        for secret in secrets:
            bundle.secret_values |= _secret_values(secret)
        bundle.add(f"namespaces/{namespace}/secrets.yaml", [
            {"name": st.name_of(s), "type": s.get("type"),
             "keys": sorted({*(s.get("data") or {}), *(s.get("stringData") or {})})}
            for s in secrets])

    progress(f"[3/{steps}] custom resources with status")
    crs = await asyncio.gather(*(_list(client, bundle, res) for res in _custom_resources()))
    for res, items in zip(_custom_resources(), crs, strict=True):
        if items is not None:
            bundle.add(f"resources/{res.plural}.{res.group}.yaml", items)

    progress(f"[4/{steps}] workloads, pods, ConfigMaps and events of namespace {namespace}")
    workloads: dict[Resource, list[Obj]] = {}
    for res, items in zip(NAMESPACE_KINDS, await asyncio.gather(
            *(_list(client, bundle, res, namespace) for res in NAMESPACE_KINDS)), strict=True):
        if items is not None:
            workloads[res] = items
            bundle.add(f"namespaces/{namespace}/{res.plural}.yaml", items)
    events = await _list(client, bundle, EVENT, namespace)
    if events is not None:
        bundle.add(f"namespaces/{namespace}/events.yaml", _by_time(events))

    progress(f"[5/{steps}] nodes, nicop status and nicop diagnose")
    snap = await dg.collect(client, namespace, dg.Target())
    for error in snap.get("errors") or []:
        if not any(m["item"] in error for m in bundle.missing):
            bundle.cannot(f"for status and diagnose: {error.split(':')[0]}", error)
    summary = st.summarize(snap)
    checks = dg.diagnose(snap, dg.Target())
    result = dg.report(snap, dg.Target(), checks)
    bundle.add("status.json", summary)
    bundle.add("diagnose.json", result)
    bundle.add("diagnose.txt", _plain(dg.render(result)))
    nodes = await _list(client, bundle, NODE)
    if nodes is not None:
        bundle.add("nodes/nodes.yaml", [_without_images(n) for n in nodes])
        bundle.add("nodes/summary.yaml", [_node_summary(snap, n) for n in nodes])
    nic_nodes = sorted(st.name_of(n) for n in snap.get("nodes") or []
                       if node_rules.is_managed(n) or st.nic_signs(snap, n))
    node_events = await _list(client, bundle, EVENT, None,
                              field_selector="involvedObject.kind=Node")
    if node_events is not None:
        bundle.add("nodes/events.yaml", _by_time(
            [e for e in node_events if (e.get("involvedObject") or {}).get("name") in nic_nodes]))

    progress(f"[6/{steps}] versions")
    bundle.add("versions.yaml", _versions(bundle, summary, workloads))

    pods = workloads.get(POD)
    if pods is None:
        bundle.cannot("logs", f"the pods of namespace {namespace} could not be listed")
    else:
        progress(f"[7/{steps}] logs of {len(pods)} pods (last {log_lines} lines)")
        await _logs(client, bundle, namespace, pods, log_lines, progress)
        if not st.operator_pods({**snap, "pods": pods}):
            leader = (summary["operator"]["leader"] or {}).get("identity")
            bundle.cannot("operator log", f"no operator pod in namespace {namespace}"
                          + (f"; the leader {leader} runs outside the cluster: collect its log "
                             "where it runs" if leader else ""))
    return bundle


def _by_time(events: list[Obj]) -> list[Obj]:
    def when(e: Obj) -> str:
        return str(e.get("lastTimestamp") or e.get("eventTime") or e.get("firstTimestamp") or "")
    return sorted(events, key=when)


def _plain(renderable: Any) -> str:
    console = Console(file=io.StringIO(), width=160, color_system=None, soft_wrap=True)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def _without_images(node: Obj) -> Obj:
    return {**node, "status": {k: v for k, v in (node.get("status") or {}).items()
                               if k != "images"}}


def _node_summary(snap: st.Snapshot, node: Obj) -> Obj:
    status = node.get("status") or {}
    return {
        "name": st.name_of(node),
        "ready": st.node_ready(node),
        "managed": node_rules.is_managed(node),
        "nicSigns": st.nic_signs(snap, node),
        "labels": st.labels_of(node),
        "capacity": status.get("capacity") or {},
        "allocatable": status.get("allocatable") or {},
        "taints": (node.get("spec") or {}).get("taints") or [],
        "kernel": (status.get("nodeInfo") or {}).get("kernelVersion"),
        "kubelet": (status.get("nodeInfo") or {}).get("kubeletVersion"),
    }


def _versions(bundle: Bundle, summary: Obj, workloads: dict[Resource, list[Obj]]) -> Obj:
    """nicop's, the API server's, every rendered workload's images, each node's driver."""
    server = bundle.files.get("cluster/version.json")
    images: dict[str, dict[str, str]] = {}
    for res in (DAEMONSET, DEPLOYMENT):
        for obj in workloads.get(res) or []:
            spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            images[f"{res.kind}/{st.name_of(obj)}"] = {
                c.get("name", ""): c.get("image", "")
                for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]}
    return {
        "nicop": nicop.__version__,
        "kubernetes": json.loads(server).get("gitVersion") if server else None,
        "workloads": images,
        "drivers": {n["name"]: n["driver"]["version"] for n in summary["nodes"] if n["driver"]},
    }


async def _logs(client: ApiClient, bundle: Bundle, namespace: str, pods: list[Obj],
                lines: int, progress: Progress) -> None:
    """The last lines of every container, and of its previous instance when it restarted.
    A node whose kubelet does not answer is asked once: its other pods are listed as missing
    for the same reason."""
    unreachable: dict[str, str] = {}
    gate = asyncio.Semaphore(4)

    async def one(pod: Obj, container: str, previous: bool) -> None:
        name = st.name_of(pod)
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        item = f"log of {namespace}/{name} container {container}" + (
            " (previous)" if previous else "")
        async with gate:
            if node in unreachable:
                bundle.cannot(item, unreachable[node])
                return
            params: dict[str, Any] = {"container": container, "tailLines": lines}
            if previous:
                params["previous"] = "true"
            try:
                text = await client.read_text(POD, POD.path(namespace, name) + "/log", params,
                                              timeout=LOG_TIMEOUT)
            except ApiError as e:
                reason = (f"no answer within {LOG_TIMEOUT:g}s ({e.message})"
                          if isinstance(e, Unreachable) else f"{e.code} {e.reason}: {e.message}")
                bundle.cannot(item, reason)
                if node and (isinstance(e, Unreachable) or e.code in (500, 502, 503, 504)):
                    unreachable[node] = (f"the kubelet of node {node} did not serve the {item} "
                                         f"({reason}); not asked again")
                return
        suffix = ".previous.log" if previous else ".log"
        bundle.files[f"logs/{name}/{container}{suffix}"] = text.encode()

    jobs = []
    for pod in pods:
        if not (pod.get("spec") or {}).get("nodeName"):
            continue
        statuses = {c.get("name"): c for c in [
            *((pod.get("status") or {}).get("initContainerStatuses") or []),
            *((pod.get("status") or {}).get("containerStatuses") or [])]}
        spec = pod.get("spec") or {}
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            jobs.append(one(pod, c["name"], False))
            if int((statuses.get(c["name"]) or {}).get("restartCount") or 0) > 0:
                jobs.append(one(pod, c["name"], True))
    for done, job in enumerate(asyncio.as_completed(jobs), start=1):
        await job
        if done % 10 == 0 or done == len(jobs):
            progress(f"      {done}/{len(jobs)} logs")


# ------------------------------------------------------------------ the archive

def write(bundle: Bundle, path: str, *, namespace: str, log_lines: int) -> Obj:
    """Write the archive (every file scrubbed) with its manifest, and the same as one HTML page
    beside it (report_path) and inside it; returns the manifest."""
    created = datetime.datetime.now(datetime.UTC)
    top = "nicop-bundle-" + created.strftime("%Y%m%d-%H%M%S")
    manifest = {
        "createdAt": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nicopVersion": nicop.__version__,
        "namespace": namespace,
        "logLines": log_lines,
        "files": sorted([*bundle.files, "manifest.json", REPORT]),
        "notCollected": bundle.missing,
        "notServed": sorted(set(bundle.absent)),
        "redaction": "Secrets are listed by name, type and keys only; values under "
                     "secret-sounding keys and env names, token-looking strings and the values "
                     f"of namespace {namespace}'s Secrets are replaced by {REDACTED}",
    }
    files = {name: scrub(data.decode(errors="replace"), bundle.secret_values)
             for name, data in {**bundle.files,
                                "manifest.json": json.dumps(manifest, indent=2).encode()}.items()}
    files[REPORT] = report.render(files, manifest)  # from the scrubbed files only
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            clean = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(clean)
            info.mtime = int(created.timestamp())
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(clean))
    with open(report_path(path), "w", encoding="utf-8") as page:
        page.write(files[REPORT])
    return manifest


def report_path(path: str) -> str:
    """Where the HTML page goes: beside the archive, `x.tar.gz` -> `x.html`."""
    for suffix in (".tar.gz", ".tgz"):
        if path.endswith(suffix):
            return path.removesuffix(suffix) + ".html"
    return path + ".html"


def default_name() -> str:
    return "nicop-bundle-" + datetime.datetime.now(datetime.UTC).strftime(
        "%Y%m%d-%H%M%S") + ".tar.gz"
