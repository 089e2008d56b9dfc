"""SriovNetwork, SriovIBNetwork and OVSNetwork become NetworkAttachmentDefinitions for the
sriov, ib-sriov and ovs CNI plugins, with exactly the CNI JSON upstream renders.

The NAD has the network's name and lives in `spec.networkNamespace` (allowed only for networks
in the operator namespace) or the network's own namespace. It carries the annotation
`k8s.v1.cni.cncf.io/resourceName: <prefix>/<resourceName>`, which Multus uses to ask the device
plugin for a VF. `ipam` is used with all whitespace removed, as upstream does; `metaPlugins` turn
the config into a conflist with the sriov plugin first.

As upstream, a network carries the finalizer `netattdef.finalizers.sriovnetwork.openshift.io`
so that deleting it deletes its NAD in whatever namespace that is, the annotation
`operator.sriovnetwork.openshift.io/last-network-namespace` remembers where the NAD went, and a
NAD is owned by its network only when both share a namespace. The `Ready` condition says whether
the NAD exists and, if not, why: the target namespace does not exist (the NAD follows as soon as
it does) or a field is invalid or missing (the message names it; upstream's schema lets a
network have no spec at all, and a NAD without a device plugin resource would only fail pods).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from nicop import logs
from nicop.api.labels import MANAGED_BY_LABEL, MANAGED_BY_VALUE, REVISION_ANNOTATION
from nicop.api.sriovnetwork import OVSNetworkSpec, SriovIBNetworkSpec, SriovNetworkSpec
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.conditions import with_condition
from nicop.kube.events import EventRecorder
from nicop.kube.manager import Controller, Manager, Result
from nicop.kube.resources import (
    NAMESPACE,
    OVS_NETWORK,
    SRIOV_IB_NETWORK,
    SRIOV_NETWORK,
    Obj,
    Resource,
)
from nicop.kube.resources import NETWORK_ATTACHMENT_DEFINITION as NAD
from nicop.kube.resources import SRIOV_GROUP as GROUP
from nicop.operator import writes
from nicop.operator.networks import (
    MANAGED_LABEL,
    RESOURCE_NAME_ANNOTATION,
    NetworkError,
    parse_json_object,
    parse_meta_plugins,
    read_spec,
)
from nicop.operator.sriov_drain import DEFAULT_RESOURCE_PREFIX, resource_prefix
from nicop.operator.states.base import content_hash
from nicop.operator.writes import WriteFailed

log = logging.getLogger(__name__)

FINALIZER = "netattdef.finalizers.sriovnetwork.openshift.io"
LAST_NAMESPACE_ANNOTATION = "operator.sriovnetwork.openshift.io/last-network-namespace"
OWNER_ANNOTATION = "sriovnetwork.openshift.io/owner-ref"
CNI_VERSION = "1.0.0"
READY = "Ready"
OWNER_INDEX = "sriov-network-owner"


SriovSpec = SriovNetworkSpec | SriovIBNetworkSpec | OVSNetworkSpec


@dataclass(frozen=True)
class SriovKind:
    resource: Resource
    model: type[SriovSpec]
    """The spec's model, which also picks the CNI plugin (sriov, ib-sriov, ovs)."""


KINDS = {
    k.resource.kind: k
    for k in (SriovKind(SRIOV_NETWORK, SriovNetworkSpec),
              SriovKind(SRIOV_IB_NETWORK, SriovIBNetworkSpec),
              SriovKind(OVS_NETWORK, OVSNetworkSpec))
}


def owner_value(kind: SriovKind, cr: Obj) -> str:
    """`SriovNetwork.sriovnetwork.openshift.io/<namespace>/<name>`: the NAD's owner-ref."""
    m = cr["metadata"]
    return f"{kind.resource.kind}.{GROUP}/{m.get('namespace')}/{m['name']}"


def target_namespace(cr: Obj, spec: SriovSpec, operator_namespace: str) -> str:
    """Where the NAD goes; NetworkError when networkNamespace is not allowed here."""
    own = str(cr["metadata"].get("namespace") or "")
    wanted = spec.network_namespace or ""
    if not wanted:
        return own
    if own != operator_namespace and wanted != own:
        raise NetworkError(
            f"spec.networkNamespace: only networks in the operator namespace "
            f"{operator_namespace} may put their NetworkAttachmentDefinition into another "
            f"namespace; remove networkNamespace (the NAD then goes into {own}) or create the "
            f"network in {operator_namespace}")
    return wanted


def ipam_of(spec: SriovSpec) -> Obj:
    """`ipam` parsed, after removing every whitespace as upstream does."""
    return parse_json_object("".join((spec.ipam or "").split()), "spec.ipam")


def ovs_plugin(spec: OVSNetworkSpec) -> Obj:
    """The ovs plugin object, keys in upstream's template order; empty and zero fields are
    left out, and each trunk entry keeps only the IDs it sets (in minID, maxID, id order)."""
    plugin: Obj = {"type": "ovs"}
    if spec.capabilities:
        plugin["capabilities"] = parse_json_object(spec.capabilities, "spec.capabilities")
    if spec.bridge:
        plugin["bridge"] = spec.bridge
    if spec.vlan:
        plugin["vlan"] = spec.vlan
    if spec.mtu:
        plugin["mtu"] = spec.mtu
    if spec.trunk:
        plugin["trunk"] = [{key: value for key, value in (
            ("minID", entry.min_id), ("maxID", entry.max_id), ("id", entry.id))
            if value is not None} for entry in spec.trunk]
    if spec.interface_type:
        plugin["interface_type"] = spec.interface_type
    plugin["ipam"] = ipam_of(spec)
    return plugin


def sriov_plugin(spec: SriovNetworkSpec) -> Obj:
    """The sriov plugin object, keys in upstream's template order."""
    plugin: Obj = {"type": "sriov", "vlan": spec.vlan or 0}
    if spec.spoof_chk:
        plugin["spoofchk"] = spec.spoof_chk
    if spec.trust:
        plugin["trust"] = spec.trust
    plugin["vlanQoS"] = spec.vlan_qos or 0
    if spec.vlan_proto:
        plugin["vlanProto"] = spec.vlan_proto
    if spec.min_tx_rate is not None:
        plugin["min_tx_rate"] = spec.min_tx_rate
    if spec.max_tx_rate is not None:
        plugin["max_tx_rate"] = spec.max_tx_rate
    if spec.capabilities:
        plugin["capabilities"] = parse_json_object(spec.capabilities, "spec.capabilities")
    if spec.link_state:
        plugin["link_state"] = spec.link_state
    if spec.log_level:
        plugin["logLevel"] = spec.log_level
    if spec.log_file:
        plugin["logFile"] = spec.log_file
    plugin["ipam"] = ipam_of(spec)
    return plugin


def ib_plugin(spec: SriovIBNetworkSpec) -> Obj:
    """The ib-sriov plugin object, keys in upstream's template order."""
    plugin: Obj = {"type": "ib-sriov"}
    if spec.capabilities:
        plugin["capabilities"] = parse_json_object(spec.capabilities, "spec.capabilities")
    if spec.link_state:
        plugin["link_state"] = spec.link_state
    plugin["ipam"] = ipam_of(spec)
    return plugin


def cni_plugin(spec: SriovSpec) -> Obj:
    if isinstance(spec, OVSNetworkSpec):
        return ovs_plugin(spec)
    if isinstance(spec, SriovNetworkSpec):
        return sriov_plugin(spec)
    return ib_plugin(spec)


def cni_config(name: str, spec: SriovSpec) -> Obj:
    plugin = cni_plugin(spec)
    meta = parse_meta_plugins(spec.meta_plugins)
    if meta:
        return {"cniVersion": CNI_VERSION, "name": name, "plugins": [plugin, *meta]}
    return {"cniVersion": CNI_VERSION, "name": name, **plugin}


def render_nad(kind: SriovKind, cr: Obj, operator_namespace: str,
               prefix: str = DEFAULT_RESOURCE_PREFIX) -> Obj:
    """The NetworkAttachmentDefinition of a network (raises NetworkError naming the field)."""
    if not (cr.get("spec") or {}).get("resourceName"):
        raise NetworkError(
            "spec.resourceName is missing: set it to the resourceName of the "
            "SriovNetworkNodePolicy whose VFs this network uses")
    spec = read_spec(kind.model, cr)
    m = cr["metadata"]
    namespace = target_namespace(cr, spec, operator_namespace)
    metadata: Obj = {
        "name": m["name"],
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
        "annotations": {
            RESOURCE_NAME_ANNOTATION: f"{prefix}/{spec.resource_name}",
            OWNER_ANNOTATION: owner_value(kind, cr),
        },
    }
    if namespace == m.get("namespace") and m.get("uid"):
        metadata["ownerReferences"] = [{
            "apiVersion": kind.resource.api_version, "kind": kind.resource.kind,
            "name": m["name"], "uid": m["uid"], "controller": True, "blockOwnerDeletion": True,
        }]
    nad: Obj = {"apiVersion": NAD.api_version, "kind": NAD.kind, "metadata": metadata,
                "spec": {"config": json.dumps(cni_config(m["name"], spec), indent=4)}}
    metadata["annotations"][REVISION_ANNOTATION] = content_hash(nad)
    return nad


class SriovNetworkController:
    """SriovNetwork/SriovIBNetwork/OVSNetwork -> NAD; keys are `<Kind>/<namespace>/<name>`."""

    def __init__(self, manager: Manager, namespace: str, recorder: EventRecorder, *,
                 prefix: str | None = None) -> None:
        self.client: ApiClient = manager.client
        self.namespace = namespace
        self.recorder = recorder
        self.prefix = resource_prefix(prefix)
        self.nads = manager.informer(NAD, label_selector=MANAGED_LABEL)
        self.nads.store.add_index(OWNER_INDEX, lambda o: [
            v for v in [(o["metadata"].get("annotations") or {}).get(OWNER_ANNOTATION)] if v])
        self.namespaces = manager.informer(NAMESPACE, metadata_only=True)
        self.controller = manager.add(Controller("sriov-networks", self.reconcile))
        self.informers = {name: manager.informer(kind.resource) for name, kind in KINDS.items()}
        for informer in self.informers.values():
            informer.on_change(self._network_changed)
        self.nads.on_change(self._nad_changed)
        self.namespaces.on_change(self._namespace_changed)

    def _key(self, kind: str, namespace: str, name: str) -> str:
        return f"{kind}/{namespace}/{name}"

    def _network_changed(self, event: str, cr: Obj, old: Obj | None) -> None:
        m = cr["metadata"]
        self.controller.queue.add(self._key(cr["kind"], m.get("namespace", ""), m["name"]))

    def _nad_changed(self, event: str, nad: Obj, old: Obj | None) -> None:
        owner = (nad["metadata"].get("annotations") or {}).get(OWNER_ANNOTATION, "")
        kind, _, rest = owner.partition(".")
        if kind in KINDS and "/" in rest:
            _, namespace, name = rest.split("/", 2)
            self.controller.queue.add(self._key(kind, namespace, name))

    def _namespace_changed(self, event: str, ns: Obj, old: Obj | None) -> None:
        """A network waiting for its target namespace goes on once the namespace exists."""
        if event != "ADDED":
            return
        for kind, informer in self.informers.items():
            for cr in informer.store.items():
                conditions = (cr.get("status") or {}).get("conditions") or []
                if any(c.get("reason") == "NamespaceNotFound" for c in conditions):
                    m = cr["metadata"]
                    self.controller.queue.add(self._key(kind, m["namespace"], m["name"]))

    # ------------------------------------------------------------------ reconcile
    async def reconcile(self, key: str) -> Result | None:
        kind_name, namespace, name = key.split("/", 2)
        kind = KINDS[kind_name]
        cr = self.informers[kind_name].store.get(f"{namespace}/{name}")
        owner = f"{kind_name}.{GROUP}/{namespace}/{name}"
        if cr is None:
            await self._delete_nads(owner, keep=None)  # gone without its finalizer
            return None
        about = logs.about(kind_name, name, namespace)
        if cr["metadata"].get("deletionTimestamp"):
            await self._delete_nads(owner, keep=None)
            await self._set_finalizer(kind, cr, present=False)
            log.info("deleted its NetworkAttachmentDefinition", extra=about)
            return None
        if FINALIZER not in (cr["metadata"].get("finalizers") or []):
            cr = await self._set_finalizer(kind, cr, present=True)
        try:
            nad = render_nad(kind, cr, self.namespace, self.prefix)
        except NetworkError as e:
            await self._delete_nads(owner, keep=None)
            await self._condition(kind, cr, "False", "NetworkAttachmentDefinitionInvalid", str(e))
            return None
        target = nad["metadata"]["namespace"]
        await self._delete_nads(owner, keep=f"{target}/{name}")
        if self.namespaces.store.get(target) is None:
            await self._condition(kind, cr, "False", "NamespaceNotFound",
                                  f"namespace {target} does not exist; the "
                                  "NetworkAttachmentDefinition is created as soon as it does")
            return None
        current = self.nads.store.get(f"{target}/{name}")
        revision = nad["metadata"]["annotations"][REVISION_ANNOTATION]
        if current is None or (current["metadata"].get("annotations") or {}).get(
                REVISION_ANNOTATION) != revision:
            try:
                self.nads.assume((await writes.apply(self.client, nad))[0])
            except WriteFailed as e:  # said in the condition, and tried again later
                await self._condition(kind, cr, "False", "NetworkAttachmentDefinitionFailed",
                                      str(e))
                raise
            log.info("applied NetworkAttachmentDefinition %s/%s", target, name, extra=about)
        annotations = cr["metadata"].get("annotations") or {}
        if annotations.get(LAST_NAMESPACE_ANNOTATION) != target:
            cr = await self._patch(kind, cr, {"metadata": {"annotations": {
                LAST_NAMESPACE_ANNOTATION: target}}})
        await self._condition(kind, cr, "True", "NetworkReady",
                              f"NetworkAttachmentDefinition {target}/{name} is up to date")
        return None

    async def _delete_nads(self, owner: str, keep: str | None) -> None:
        """Delete the NADs rendered for `owner` (but `keep`, namespace/name)."""
        for nad in self.nads.store.by_index(OWNER_INDEX, owner):
            m = nad["metadata"]
            if f"{m['namespace']}/{m['name']}" == keep:
                continue
            await self.client.delete(NAD, m["name"], m["namespace"])
            self.nads.store.remove(f"{m['namespace']}/{m['name']}")
            log.info("deleted NetworkAttachmentDefinition %s/%s", m["namespace"], m["name"],
                     extra={"kind": owner.split(".", 1)[0]})

    async def _set_finalizer(self, kind: SriovKind, cr: Obj, present: bool) -> Obj:
        finalizers = [f for f in cr["metadata"].get("finalizers") or [] if f != FINALIZER]
        if present:
            finalizers.append(FINALIZER)
        return await self._patch(kind, cr, {"metadata": {
            "finalizers": finalizers or None,
            "resourceVersion": cr["metadata"]["resourceVersion"]}})

    async def _patch(self, kind: SriovKind, cr: Obj, body: Obj,
                     subresource: str | None = None) -> Obj:
        m = cr["metadata"]
        try:
            updated = await self.client.patch(kind.resource, m["name"], body, m["namespace"],
                                              subresource=subresource)
        except ApiError as e:
            if e.code == 404:
                return cr
            raise
        self.informers[kind.resource.kind].assume(updated)
        return updated

    async def _condition(self, kind: SriovKind, cr: Obj, status: str, reason: str,
                         message: str) -> None:
        conditions = with_condition((cr.get("status") or {}).get("conditions") or [], READY,
                                    status == "True", reason, message,
                                    cr["metadata"].get("generation"))
        if conditions is None:
            return
        await self._patch(kind, cr, {"status": {"conditions": conditions}},
                          subresource="status")
        if status == "False":
            m = cr["metadata"]
            log.warning("%s: %s", reason, message,
                        extra=logs.about(kind.resource.kind, m["name"], m["namespace"]))
            await self.recorder.emit(cr, "Warning", reason, message)
