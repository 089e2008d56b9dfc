"""MacvlanNetwork, HostDeviceNetwork and IPoIBNetwork become NetworkAttachmentDefinitions.

The NAD carries exactly the CNI JSON upstream generates, so Multus and the CNI plugins see no
difference. A NAD is owned by its network CR (deleted with it), and one left in another
namespace after `networkNamespace` changed is found by its owner reference and removed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nicop import logs
from nicop.api.labels import MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION
from nicop.api.mellanox import HostDeviceNetworkSpec, IPoIBNetworkSpec, MacvlanNetworkSpec
from nicop.kube.client import ApiClient
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import NETWORK_ATTACHMENT_DEFINITION as NAD
from nicop.kube.resources import Obj, Resource, key_of
from nicop.operator import writes
from nicop.operator.states.base import M, RenderError, content_hash, typed
from nicop.operator.writes import WriteFailed

log = logging.getLogger(__name__)

MANAGED_LABEL = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"
RESOURCE_NAME_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
CNI_VERSION = "0.3.1"


class NetworkError(Exception):
    """The network CR cannot become a NAD; the message names the field."""


def parse_json_object(raw: str | None, field: str) -> Obj:
    """A JSON-object string field (`ipam`), `{}` when empty."""
    if not raw or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise NetworkError(f"{field} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise NetworkError(f"{field} must be a JSON object")
    return value


def parse_meta_plugins(raw: str | None) -> list[Obj]:
    """`metaPlugins`: CNI plugin objects separated by commas, without the enclosing []."""
    if not raw or not raw.strip():
        return []
    try:
        value = json.loads(f"[{raw}]")
    except ValueError as e:
        raise NetworkError(f"spec.metaPlugins is not a comma-separated list of JSON objects: {e}"
                           ) from None
    if not all(isinstance(p, dict) for p in value):
        raise NetworkError("spec.metaPlugins must hold JSON objects only")
    return value  # type: ignore[no-any-return]


def read_spec(model: type[M], cr: Obj) -> M:
    """The CR's spec as its model (raises NetworkError naming a field the model refuses)."""
    try:
        return typed(model, cr.get("spec") or {}, "spec")
    except RenderError as e:
        raise NetworkError(str(e)) from None


def cni_config(name: str, plugin: Obj, meta_plugins: list[Obj]) -> Obj:
    """The NAD's config: one plugin, or a conflist when meta plugins are chained after it."""
    if meta_plugins:
        return {"cniVersion": CNI_VERSION, "name": name, "plugins": [plugin, *meta_plugins]}
    return {"cniVersion": CNI_VERSION, "name": name, **plugin}


def macvlan_plugin(spec: MacvlanNetworkSpec) -> Obj:
    plugin: Obj = {"type": "macvlan"}
    if spec.master:
        plugin["master"] = spec.master
    if spec.mode:
        plugin["mode"] = spec.mode
    if spec.mtu:
        plugin["mtu"] = spec.mtu
    plugin["ipam"] = parse_json_object(spec.ipam, "spec.ipam")
    return plugin


def host_device_plugin(spec: HostDeviceNetworkSpec) -> Obj:
    return {"type": "host-device", "ipam": parse_json_object(spec.ipam, "spec.ipam")}


def ipoib_plugin(spec: IPoIBNetworkSpec) -> Obj:
    plugin: Obj = {"type": "ipoib"}
    if spec.master:
        plugin["master"] = spec.master
    plugin["ipam"] = parse_json_object(spec.ipam, "spec.ipam")
    return plugin


def host_device_resource(spec: HostDeviceNetworkSpec) -> str | None:
    """`nvidia.com/<resourceName>` (the schema refuses a name that has a prefix already)."""
    return f"nvidia.com/{spec.resource_name}" if spec.resource_name else None


NetworkSpec = MacvlanNetworkSpec | HostDeviceNetworkSpec | IPoIBNetworkSpec


@dataclass(frozen=True)
class NetworkKind:
    resource: Resource
    status_link_field: str
    model: type[NetworkSpec]
    plugin: Callable[[Any], Obj]
    resource_name: Callable[[Any], str | None] = lambda spec: None


def _network(kind: str, plural: str) -> Resource:
    return Resource("mellanox.com", "v1alpha1", kind, plural, namespaced=False)


KINDS = {
    k.resource.kind: k
    for k in (
        NetworkKind(_network("MacvlanNetwork", "macvlannetworks"),
                    "macvlanNetworkAttachmentDef", MacvlanNetworkSpec, macvlan_plugin),
        NetworkKind(_network("HostDeviceNetwork", "hostdevicenetworks"),
                    "hostDeviceNetworkAttachmentDef", HostDeviceNetworkSpec, host_device_plugin,
                    host_device_resource),
        NetworkKind(_network("IPoIBNetwork", "ipoibnetworks"),
                    "ipoibNetworkAttachmentDef", IPoIBNetworkSpec, ipoib_plugin),
    )
}


def render_nad(kind: NetworkKind, cr: Obj) -> Obj:
    """The NetworkAttachmentDefinition of a network CR (raises NetworkError naming the field)."""
    spec = read_spec(kind.model, cr)
    name = cr["metadata"]["name"]
    meta = parse_meta_plugins(getattr(spec, "meta_plugins", None))  # IPoIB has none
    config = cni_config(name, kind.plugin(spec), meta)
    metadata: Obj = {
        "name": name,
        "namespace": spec.network_namespace or "default",
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "annotations": {},
        "ownerReferences": [{
            "apiVersion": kind.resource.api_version, "kind": kind.resource.kind, "name": name,
            "uid": cr["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
        }],
    }
    if resource := kind.resource_name(spec):
        metadata["annotations"][RESOURCE_NAME_ANNOTATION] = resource
    nad: Obj = {"apiVersion": NAD.api_version, "kind": NAD.kind, "metadata": metadata,
                "spec": {"config": json.dumps(config, separators=(",", ":"))}}
    metadata["annotations"][REVISION_ANNOTATION] = content_hash(nad)
    return nad


def nad_link(nad: Obj) -> str:
    m = nad["metadata"]
    return f"{NAD.api_version}/namespaces/{m['namespace']}/{NAD.kind}/{m['name']}"


class NetworkController:
    """One controller for the three network kinds; keys are `<Kind>/<name>`."""

    def __init__(self, manager: Manager) -> None:
        self.client: ApiClient = manager.client
        self.nads = manager.informer(NAD, label_selector=MANAGED_LABEL)
        self.nads.store.add_index("owner", lambda o: [
            r["uid"] for r in o["metadata"].get("ownerReferences") or []])
        self.controller = manager.add(Controller("networks", self.reconcile))
        queue = self.controller.queue
        self.informers = {name: manager.informer(kind.resource) for name, kind in KINDS.items()}
        for informer in self.informers.values():
            informer.on_change(lambda ev, obj, old: queue.add(
                f"{obj['kind']}/{obj['metadata']['name']}"))

        def nad_changed(event: str, nad: Obj, old: Obj | None) -> None:
            for ref in nad["metadata"].get("ownerReferences") or []:
                if ref.get("kind") in KINDS:
                    queue.add(f"{ref['kind']}/{ref['name']}")

        self.nads.on_change(nad_changed)

    async def reconcile(self, key: str) -> Result | None:
        kind_name, name = key.split("/", 1)
        kind = KINDS[kind_name]
        cr = self.informers[kind_name].store.get(name)
        if cr is None:
            return None  # its NAD goes with it (owner reference)
        owned = self.nads.store.by_index("owner", cr["metadata"]["uid"])
        try:
            nad = render_nad(kind, cr)
        except NetworkError as e:
            await self._status(kind, cr, {"state": "error", "reason": str(e)})
            return None
        try:
            for old in owned:
                if key_of(old) != key_of(nad):  # networkNamespace changed
                    await writes.delete(self.client, NAD, old)
            current = self.nads.store.get(key_of(nad))
            revision = nad["metadata"]["annotations"][REVISION_ANNOTATION]
            if current is None or (current["metadata"].get("annotations") or {}).get(
                REVISION_ANNOTATION
            ) != revision:
                self.nads.assume((await writes.apply(self.client, nad))[0])
                log.info("applied %s", nad_link(nad), extra=logs.about(kind_name, name))
        except WriteFailed as e:  # said in the status, and tried again later
            await self._status(kind, cr, {"state": "error", "reason": str(e)})
            raise
        await self._status(kind, cr, {"state": "ready", kind.status_link_field: nad_link(nad)})
        return None

    async def _status(self, kind: NetworkKind, cr: Obj, status: dict[str, Any]) -> None:
        old = cr.get("status") or {}
        if old == status:
            return
        patch = {**{k: None for k in old if k not in status}, **status}
        await self.client.patch(kind.resource, cr["metadata"]["name"], {"status": patch},
                                subresource="status")
