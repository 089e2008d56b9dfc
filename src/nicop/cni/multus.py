"""The Multus meta-plugin, thick: a pod's default network plus every network it selects.

Its config is what Multus reads (docs/configuration.md of k8snetworkplumbingwg/multus-cni):
`{"cniVersion", "name", "type": "multus", "kubeconfig"?, "delegates": [<default network>]}`, the
first delegate being the cluster's default network (a config or a config list). On ADD the
default network gets the runtime's interface (eth0) and its result is the pod's; then each
network of the pod's `k8s.v1.cni.cncf.io/networks` annotation (`[ns/]name[@ifname]`, comma
separated, or Multus' JSON list with `name`, `namespace`, `interface`, `mac`, `ips`,
`infiniband-guid`, `cni-args`) is attached from its NetworkAttachmentDefinition as net1, net2...
unless named. A definition annotated `k8s.v1.cni.cncf.io/resourceName` gets the next device the
kubelet allocated to the pod of that resource as `deviceID` (and `pciBusID`), and as
`runtimeConfig.deviceID` where the plugin declares that capability. The pod then carries
`k8s.v1.cni.cncf.io/network-status` and an `AddedInterface` Event per interface.

Devices can also come from nicop's DRA driver: the VF of the scheduler's claim for an extended
resource (a node where DRA serves `nvidia.com/<name>`), and the VFs of the pod's claims whose
VfConfig names a network (nicop.api.dra_config), attached after the annotation's networks,
with what each became written into its claim's status.devices[].networkData.

What DEL needs (each delegate's config, interface and result) is kept per container in
/var/lib/cni/multus/<containerID>, so the pod can be gone by then. A failed ADD deletes what it
had added, last first, and names the network and the delegate's error.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nicop.api.dra import DRIVER, KIND_VF
from nicop.api.dra_config import ConfigError, vf_configs
from nicop.api.labels import (
    NETWORK_STATUS_ANNOTATION,
    NETWORKS_ANNOTATION,
    RESOURCE_NAME_ANNOTATION,
)
from nicop.api.networks_annotation import Selection, SelectionError, parse_selections
from nicop.cni.invoke import Invoker, RuntimeConf, is_list
from nicop.cni.plugin import valid_attachments
from nicop.cni.spec import CniError, Code, Obj, Request, parse_request, render_result
from nicop.cni.state import read_json, remove, write_json
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import NETWORK_ATTACHMENT_DEFINITION as NAD
from nicop.kube.resources import POD, RESOURCE_CLAIM
from nicop.kube.times import stamp
from nicop.node.dra.binding import apply_device_status
from nicop.node.dra.devices import device_address
from nicop.node.host import Host

log = logging.getLogger(__name__)

T = TypeVar("T")
Devices = Callable[[str, str], dict[str, list[str]]]
"""(pod namespace, pod name) -> device IDs by resource name, as the kubelet allocated them."""

CACHE_DIR = "/var/lib/cni/multus"
CONF_NAME = "multus-cni-network"
CACHE_FORMAT = "nicop-multus/1"
CLAIM_STATUS_MANAGER = "nicop-multus"
# ------------------------------------------------------------------ network status

def network_status(network: str, ifname: str, result: Obj, *, default: bool = False,
                   device_id: str = "") -> Obj:
    """One entry of the network-status annotation, with the field order and omissions of the
    NetworkStatus type of network-attachment-definition-client."""
    iface, addresses = _in_pod(result, ifname)
    status: Obj = {"name": network, "interface": iface.get("name") or ifname}
    if ips := [address.split("/")[0] for address in addresses]:
        status["ips"] = ips
    if iface.get("mac"):
        status["mac"] = iface["mac"]
    if iface.get("mtu"):
        status["mtu"] = iface["mtu"]
    if default:
        status["default"] = True
    status["dns"] = {k: v for k, v in (result.get("dns") or {}).items() if v}
    if device_id:
        status["device-info"] = {"type": "pci", "version": "1.1.0",
                                 "pci": {"pci-address": device_id}}
    return status


def network_data(ifname: str, result: Obj) -> Obj:
    """A device's networkData in a claim's status (KEP-4817): the interface in the pod, its
    addresses in CIDR form, its MAC."""
    iface, addresses = _in_pod(result, ifname)
    data: Obj = {"interfaceName": ifname}
    if addresses:
        data["ips"] = addresses
    if iface.get("mac"):
        data["hardwareAddress"] = iface["mac"]
    return data


def _in_pod(result: Obj, ifname: str) -> tuple[Obj, list[str]]:
    """A CNI result's interface in the pod named `ifname` (else its first in the pod), and the
    addresses (CIDR form) that are its own or belong to no interface."""
    interfaces = result.get("interfaces") or []
    in_pod = [i for i, it in enumerate(interfaces) if it.get("sandbox")]
    index = next((i for i in in_pod if interfaces[i].get("name") == ifname),
                 in_pod[0] if in_pod else None)
    addresses = [ip["address"] for ip in result.get("ips") or []
                 if ip.get("interface") is None or ip.get("interface") == index]
    return (interfaces[index] if index is not None else {}), addresses


# ------------------------------------------------------------------ the plugin

@dataclass
class Attachment:
    """One delegate of a pod: the network, the interface it makes, and what DEL needs."""

    network: str
    ifname: str
    config: Obj
    capability_args: Obj = field(default_factory=dict)
    default: bool = False
    device_id: str = ""
    result: Obj | None = None
    claim: Obj | None = None  # a DRA claim's VF: where its networkData goes (not cached)

    def to_cache(self) -> Obj:
        return {"network": self.network, "ifname": self.ifname, "config": self.config,
                "capabilityArgs": self.capability_args, "default": self.default,
                "deviceID": self.device_id, "result": self.result}

    @classmethod
    def from_cache(cls, entry: Obj) -> Attachment:
        return cls(network=str(entry["network"]), ifname=str(entry["ifname"]),
                   config=dict(entry["config"]),
                   capability_args=dict(entry.get("capabilityArgs") or {}),
                   default=bool(entry.get("default")), device_id=str(entry.get("deviceID") or ""),
                   result=entry.get("result"))


def default_delegate(config: Obj) -> Obj:
    """The cluster's default network: the first of `delegates`."""
    delegates = config.get("delegates")
    if not isinstance(delegates, list) or not delegates or not isinstance(delegates[0], dict):
        if config.get("clusterNetwork"):
            raise CniError(Code.INVALID_CONFIG, "clusterNetwork: not supported by nicop's "
                           "multus", "give the default network's config in `delegates` (nicop "
                           "multus-daemon writes it so in auto mode)")
        raise CniError(Code.INVALID_CONFIG, "delegates: at least one delegate (the default "
                       "network's config) must be given")
    delegate = dict(delegates[0])
    if not delegate.get("type") and not is_list(delegate):
        raise CniError(Code.INVALID_CONFIG, "delegates[0]: a delegate must have `type` or "
                       "`plugins`")
    return delegate


class MultusPlugin:
    """Multus' work for one node. `client` reads pods and NetworkAttachmentDefinitions (None:
    only the default network is attached), `devices` tells the pod's allocated devices; the
    delegates are the executables in `cni_bin_dir` on `host`, run with `extra_env` added.

    Its calls block (they run delegates), so they run on worker threads; the API client is used
    on `loop` (by default the loop running when the plugin is made). `run()` takes a CNI call
    as a runtime makes it, for callers without the socket."""

    def __init__(self, client: ApiClient | None, host: Host, devices: Devices | None = None, *,
                 cni_bin_dir: str = "/opt/cni/bin", loop: asyncio.AbstractEventLoop | None = None,
                 extra_env: Mapping[str, str] | None = None, timeout: float = 120.0,
                 api_timeout: float = 30.0) -> None:
        self.client = client
        self.host = host
        self.devices = devices
        self.invoker = Invoker(host.path(cni_bin_dir), extra_env, timeout)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.loop = loop
        self.api_timeout = api_timeout

    # ------------------------------------------------------------------ in process
    def run(self, env: Mapping[str, str], config: Obj | bytes) -> Obj | None:
        """One call (CNI_COMMAND and the rest in `env`, the multus config): the ADD result in
        the config's version, else None. Raises CniError. Not on the event loop's thread."""
        stdin = config if isinstance(config, bytes) else json.dumps(config).encode()
        req = parse_request("multus", dict(env), stdin)
        if req.command == "ADD":
            return render_result(self.add(req), req.version)
        handler = {"DEL": self.delete, "CHECK": self.check, "STATUS": self.status,
                   "GC": self.gc}.get(req.command)
        if handler is not None:
            handler(req)
        return None

    # ------------------------------------------------------------------ API
    def _api(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        loop = self.loop
        if self.client is None or loop is None:
            raise CniError(Code.INTERNAL, "multus has no API client")
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("MultusPlugin blocks: call it off its event loop's thread")
        future = asyncio.run_coroutine_threadsafe(call(), loop)
        try:
            return future.result(self.api_timeout)
        except TimeoutError:
            future.cancel()
            raise CniError(Code.TRY_AGAIN_LATER, f"the API server did not answer within "
                           f"{self.api_timeout:g}s") from None

    def _pod(self, namespace: str, name: str, uid: str) -> Obj:
        client = self.client
        assert client is not None
        try:
            pod = self._api(lambda: client.get_or_none(POD, name, namespace))
        except ApiError as e:
            raise CniError(Code.TRY_AGAIN_LATER, f"cannot get pod {namespace}/{name}: {e}") \
                from None
        if pod is None:
            raise CniError(Code.INTERNAL, f"pod {namespace}/{name} not found",
                           "the pod was deleted before its network was set up")
        actual = pod["metadata"].get("uid", "")
        if uid and actual != uid:
            raise CniError(Code.INTERNAL, f"pod {namespace}/{name}: expected UID {uid} but the "
                           f"API server has {actual}", "the pod was deleted and created again")
        return pod

    def _nad(self, sel: Selection) -> Obj:
        client = self.client
        assert client is not None
        try:
            nad = self._api(lambda: client.get_or_none(NAD, sel.name, sel.namespace))
        except ApiError as e:
            raise CniError(Code.TRY_AGAIN_LATER, f"network {sel.key}: cannot get its "
                           f"NetworkAttachmentDefinition: {e}") from None
        if nad is None:
            raise CniError(Code.INVALID_CONFIG, f"network {sel.key}: cannot find a "
                           f"NetworkAttachmentDefinition {sel.name} in namespace "
                           f"{sel.namespace}", f"create it, or fix the pod's {NETWORKS_ANNOTATION}"
                           " annotation")
        return nad

    def _event(self, pod: Obj, message: str) -> None:
        """An AddedInterface Event on the pod, sent without waiting (best effort)."""
        client, loop = self.client, self.loop
        if client is None or loop is None:
            return
        meta = pod["metadata"]
        now = stamp()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid"),
                               "resourceVersion": meta.get("resourceVersion")},
            "type": "Normal", "reason": "AddedInterface", "message": message, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": "multus"}, "reportingComponent": "multus",
        }

        async def send() -> None:
            try:
                await client.create(event)
            except ApiError as e:
                log.debug("could not record AddedInterface on %s/%s: %s", meta["namespace"],
                          meta["name"], e)

        asyncio.run_coroutine_threadsafe(send(), loop)

    # ------------------------------------------------------------------ planning ADD
    def _attachments(self, req: Request, pod: Obj | None) -> list[Attachment]:
        default = default_delegate(req.config)
        plan = [Attachment(network=str(default.get("name") or ""), ifname=req.ifname,
                           config=default, default=True,
                           capability_args=dict(req.config.get("runtimeConfig") or {}))]
        if pod is None:
            return plan
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        annotation = (meta.get("annotations") or {}).get(NETWORKS_ANNOTATION) or ""
        try:
            selections = parse_selections(annotation, namespace)
        except SelectionError as e:
            raise CniError(Code.INVALID_CONFIG, f"pod {namespace}/{name}: annotation "
                           f"{NETWORKS_ANNOTATION}: {e}") from None
        allocated: dict[str, list[str]] | None = None
        claimed: dict[str, Obj] = {}  # a VF DRA served -> its claim's entry
        used: dict[str, int] = {}
        ifnames = {req.ifname: plan[0].network}
        for position, sel in enumerate(selections, start=1):
            nad = self._nad(sel)
            resource = (nad["metadata"].get("annotations") or {}).get(RESOURCE_NAME_ANNOTATION)
            device_id = ""
            if resource:
                if allocated is None:
                    allocated = dict(self._devices(namespace, name))
                if resource not in allocated:
                    extended = self._extended_vfs(pod, resource)
                    allocated[resource] = list(extended)
                    claimed.update(extended)
                ids = allocated[resource]
                taken = used.get(resource, 0)
                if taken >= len(ids):
                    have = f"only {len(ids)}" if ids else "none"
                    raise CniError(Code.INVALID_CONFIG, f"network {sel.key} needs a device of "
                                   f"{resource} (its {RESOURCE_NAME_ANNOTATION}) but pod "
                                   f"{namespace}/{name} was given {have} for {taken + 1} "
                                   "network(s)", "request the resource in the pod's "
                                   "containers, one per network that uses it")
                device_id = ids[taken]
                used[resource] = taken + 1
            ifname = sel.interface or f"net{position}"
            if ifname in ifnames:
                raise CniError(Code.INVALID_CONFIG, f"pod {namespace}/{name}: networks "
                               f"{ifnames[ifname]} and {sel.key} both use interface {ifname}",
                               f"name the interfaces apart in {NETWORKS_ANNOTATION}")
            ifnames[ifname] = sel.key
            capability = {k: v for k, v in (("mac", sel.mac), ("ips", sel.ips),
                                            ("infinibandGUID", sel.infiniband_guid),
                                            ("deviceID", device_id)) if v}
            plan.append(Attachment(network=sel.key, ifname=ifname,
                                   config=delegate_config(nad, sel, device_id),
                                   capability_args=capability, device_id=device_id,
                                   claim=claimed.get(device_id)))
        return plan + self._claimed_networks(pod, ifnames, len(selections))

    def _extended_vfs(self, pod: Obj, resource: str) -> dict[str, Obj]:
        """The VFs nicop's DRA driver serves the pod's extended resource `resource` with, on a
        node where no device plugin does (KEP-5004: the scheduler's claim, named in
        pod.status.extendedResourceClaimStatus with the request of each resource): by PCI
        address, in the claim's order, the claim entry each VF's networkData goes to."""
        status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        requests = {m.get("requestName") for m in status.get("requestMappings") or []
                    if m.get("resourceName") == resource}
        if not requests or not status.get("resourceClaimName"):
            return {}
        namespace, name = pod["metadata"]["namespace"], status["resourceClaimName"]
        claim = self._claim(namespace, name)
        return {address: _claim_entry(namespace, name, result)
                for result, address in self._vf_results(claim, pod)
                if result.get("request") in requests}

    def _vf_results(self, claim: Obj, pod: Obj) -> list[tuple[Obj, str]]:
        """The claim's results that are VFs of nicop's driver on the pod's node, with their
        PCI addresses."""
        node = (pod.get("spec") or {}).get("nodeName")
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                   or {}).get("results") or []
        found = []
        for result in results:
            kind_address = device_address(str(result.get("device")))
            if result.get("driver") == DRIVER and result.get("pool") == node \
                    and kind_address is not None and kind_address[0] == KIND_VF:
                found.append((result, kind_address[1]))
        return found

    def _claimed_networks(self, pod: Obj, ifnames: dict[str, str],
                          position: int) -> list[Attachment]:
        """The VFs nicop's DRA driver allocated to the pod's claims on its node whose VfConfig
        names a network (nicop.api.dra_config), each attached as that network with the VF as
        its device, after the annotation's networks."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        namespace, name = meta["namespace"], meta["name"]
        made = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        claim_names = [c.get("resourceClaimName") or made.get(c.get("name"))
                       for c in spec.get("resourceClaims") or []]
        plan = []
        for claim_name in filter(None, claim_names):
            claim = self._claim(namespace, claim_name)
            try:
                configs = vf_configs(claim)
            except ConfigError as e:
                raise CniError(Code.INVALID_CONFIG, f"pod {namespace}/{name}: {e}",
                               "fix the config of the claim or of its template") from None
            for result, address in self._vf_results(claim, pod):
                config = configs.get(result.get("request", ""))
                if config is None or not config.network:
                    continue
                sel = Selection(name=config.network,
                                namespace=config.network_namespace or namespace)
                position += 1
                ifname = config.if_name or f"net{position}"
                if ifname in ifnames:
                    raise CniError(Code.INVALID_CONFIG, f"pod {namespace}/{name}: networks "
                                   f"{ifnames[ifname]} and {sel.key} (claim {claim_name}) both "
                                   f"use interface {ifname}", "give the claim's VfConfig "
                                   "another ifName")
                ifnames[ifname] = sel.key
                plan.append(Attachment(
                    network=sel.key, ifname=ifname,
                    config=delegate_config(self._nad(sel), sel, address),
                    capability_args={"deviceID": address}, device_id=address,
                    claim=_claim_entry(namespace, claim_name, result)))
        return plan

    def _claim(self, namespace: str, name: str) -> Obj:
        client = self.client
        assert client is not None
        try:
            claim = self._api(lambda: client.get_or_none(RESOURCE_CLAIM, name, namespace))
        except ApiError as e:
            raise CniError(Code.TRY_AGAIN_LATER, f"cannot get resource claim {namespace}/"
                           f"{name}: {e}") from None
        if claim is None:
            raise CniError(Code.INTERNAL, f"resource claim {namespace}/{name} not found",
                           "the claim was deleted before the pod's network was set up")
        return claim

    def _claim_status(self, plan: list[Attachment]) -> None:
        """What each DRA claim's VF became in the pod, as the claim's status.devices[]
        networkData (its own field manager: the kubelet plugin's conditions stay)."""
        client = self.client
        assert client is not None
        by_claim: dict[tuple[str, str], list[Obj]] = {}
        for att in plan:
            if att.claim is not None:
                by_claim.setdefault((att.claim["namespace"], att.claim["name"]), []).append({
                    "driver": DRIVER, "pool": att.claim["pool"], "device": att.claim["device"],
                    "networkData": network_data(att.ifname, att.result or {})})
        for (namespace, name), entries in by_claim.items():
            try:
                self._api(functools.partial(
                    apply_device_status, client, {"name": name, "namespace": namespace},
                    entries, manager=CLAIM_STATUS_MANAGER))
            except (ApiError, CniError) as e:
                log.warning("claim %s/%s: its VFs are attached but their networkData is not "
                            "written: %s", namespace, name, e)

    def _devices(self, namespace: str, name: str) -> dict[str, list[str]]:
        if self.devices is None:
            raise CniError(Code.INTERNAL, "multus cannot learn the pod's devices (no kubelet "
                           "PodResources client)")
        try:
            return self.devices(namespace, name)
        except Exception as e:
            raise CniError(Code.TRY_AGAIN_LATER, f"cannot learn the devices of pod "
                           f"{namespace}/{name} from the kubelet: {e}") from None

    # ------------------------------------------------------------------ the commands
    def add(self, req: Request) -> Obj:
        namespace, name, uid = req.pod
        pod = self._pod(namespace, name, uid) if namespace and name and self.client else None
        plan = self._attachments(req, pod)
        record: Obj = {"format": CACHE_FORMAT, "containerID": req.container_id,
                       "netns": req.netns, "pod": {"namespace": namespace, "name": name,
                                                   "uid": uid}, "delegates": []}
        added: list[Attachment] = []
        try:
            for att in plan:
                added.append(att)
                record["delegates"] = [a.to_cache() for a in added]
                self._save(req, record)  # before the call: a crash mid-way leaves DEL its list
                try:
                    att.result = self.invoker.add(att.config, self._rt(req, att))
                except CniError as e:
                    raise CniError(e.code, f"[{namespace}/{name}/{uid}:{att.network}]: error "
                                   f"adding container to network \"{att.network}\": {e.msg}",
                                   e.details) from None
            record["delegates"] = [a.to_cache() for a in added]
            self._save(req, record)
            statuses = [network_status(a.network, a.ifname, a.result or {}, default=a.default,
                                       device_id=a.device_id) for a in plan]
            if pod is not None:
                self._set_status(pod, statuses)
                self._claim_status(plan)
        except BaseException:
            self._rollback(req, added)
            raise
        if pod is not None:
            for att, status in zip(plan, statuses, strict=True):
                addresses = ",".join(ip["address"] for ip in (att.result or {}).get("ips") or [])
                self._event(pod, f"Add {status['interface']} [{addresses}] from {att.network}")
        result = plan[0].result
        assert result is not None
        return result

    def _set_status(self, pod: Obj, statuses: list[Obj]) -> None:
        client = self.client
        assert client is not None
        meta = pod["metadata"]
        patch = {"metadata": {"annotations": {
            NETWORK_STATUS_ANNOTATION: json.dumps(statuses, indent=4)}}}
        try:
            self._api(lambda: client.patch(POD, meta["name"], patch, meta["namespace"]))
        except ApiError as e:
            raise CniError(Code.TRY_AGAIN_LATER, f"pod {meta['namespace']}/{meta['name']}: "
                           f"cannot set {NETWORK_STATUS_ANNOTATION}: {e}") from None

    def _rollback(self, req: Request, added: list[Attachment]) -> None:
        """DEL what a failed ADD attached, last first; the record goes once all are gone."""
        left: list[Attachment] = []
        for att in reversed(added):
            try:
                self.invoker.delete(att.config, self._rt(req, att), att.result)
            except CniError as e:
                log.warning("container %s: undoing network %s failed: %s", req.container_id,
                            att.network, e.msg)
                left.insert(0, att)
        if left:
            self._save(req, {**self._load(req), "delegates": [a.to_cache() for a in left]})
        else:
            remove(self.host, self._cache_path(req))

    def delete(self, req: Request) -> None:
        """DEL the additional networks then the default one, from the record of ADD; without a
        record, the default network only."""
        record = self._load(req)
        atts = [Attachment.from_cache(e) for e in record.get("delegates") or []]
        if not atts:
            default = default_delegate(req.config)
            atts = [Attachment(network=str(default.get("name") or ""), ifname=req.ifname,
                               config=default, default=True,
                               capability_args=dict(req.config.get("runtimeConfig") or {}))]
        failed: list[tuple[Attachment, CniError]] = []
        for att in reversed(atts):
            try:
                self.invoker.delete(att.config, self._rt(req, att), att.result)
            except CniError as e:
                failed.insert(0, (att, e))
        if failed:
            if record:  # keep what is left for the runtime's next DEL
                self._save(req, {**record, "delegates": [a.to_cache() for a, _ in failed]})
            att, err = failed[0]
            raise CniError(err.code, f"error deleting container {req.container_id} from "
                           f"network \"{att.network}\": {err.msg}", err.details)
        remove(self.host, self._cache_path(req))

    def check(self, req: Request) -> None:
        record = self._load(req)
        if not record.get("delegates"):
            raise CniError(Code.UNKNOWN_CONTAINER, f"no networks recorded for container "
                           f"{req.container_id}", f"{self._cache_path(req)} is missing")
        for att in (Attachment.from_cache(e) for e in record["delegates"]):
            try:
                self.invoker.check(att.config, self._rt(req, att), att.result)
            except CniError as e:
                raise CniError(e.code, f"network \"{att.network}\" ({att.ifname}): {e.msg}",
                               e.details) from None

    def status(self, req: Request) -> None:
        self.invoker.status(default_delegate(req.config))

    def gc(self, req: Request) -> None:
        attachments = [{"containerID": c, "ifname": i} for c, i in
                       sorted(valid_attachments(req))]
        self.invoker.gc(default_delegate(req.config), attachments)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _rt(req: Request, att: Attachment) -> RuntimeConf:
        return RuntimeConf(container_id=req.container_id, netns=req.netns, ifname=att.ifname,
                           args=delegate_args(req), capability_args=att.capability_args)

    @staticmethod
    def _cache_path(req: Request) -> str:
        return f"{CACHE_DIR}/{req.container_id}"

    def _load(self, req: Request) -> Obj:
        data = read_json(self.host, self._cache_path(req))
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            return {}  # none, or another Multus' own record
        return data

    def _save(self, req: Request, record: Obj) -> None:
        write_json(self.host, self._cache_path(req), record)


def _claim_entry(namespace: str, name: str, result: Obj) -> Obj:
    """Where a claimed VF's networkData goes: its claim and its status.devices[] key."""
    return {"namespace": namespace, "name": name, "pool": result["pool"],
            "device": result["device"]}


def delegate_args(req: Request) -> str:
    """CNI_ARGS for a delegate: the pod's, IgnoreUnknown first, then what else the runtime
    passed."""
    namespace, name, uid = req.pod
    args = {"IgnoreUnknown": "true", "K8S_POD_NAMESPACE": namespace, "K8S_POD_NAME": name,
            "K8S_POD_INFRA_CONTAINER_ID": req.args.get("K8S_POD_INFRA_CONTAINER_ID", ""),
            "K8S_POD_UID": uid}
    for key, value in req.args.items():
        if key not in args:
            args[key] = value
    return ";".join(f"{k}={v}" for k, v in args.items())


def delegate_config(nad: Obj, sel: Selection, device_id: str) -> Obj:
    """The config of a NetworkAttachmentDefinition as its delegate gets it: named after the
    definition when it has no name, with the device and the selection's `cni-args` put in each
    of its plugins (as `deviceID`, `pciBusID` and `args.cni`)."""
    raw = (nad.get("spec") or {}).get("config") or ""
    if not raw.strip():
        raise CniError(Code.INVALID_CONFIG, f"network {sel.key}: the "
                       "NetworkAttachmentDefinition has no spec.config",
                       "nicop's multus reads the CNI config from the definition only")
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise CniError(Code.DECODING_FAILURE, f"network {sel.key}: spec.config is not valid "
                       f"JSON: {e}") from None
    if not isinstance(config, dict) or not (config.get("type") or is_list(config)):
        raise CniError(Code.INVALID_CONFIG, f"network {sel.key}: spec.config must be a CNI "
                       "config (with `type`) or a config list (with `plugins`)")
    if not config.get("name"):
        config["name"] = sel.name
    targets = [p for p in config.get("plugins") or [] if isinstance(p, dict)] \
        if is_list(config) else [config]
    for target in targets:
        if device_id:
            target["deviceID"] = device_id
            target["pciBusID"] = device_id
        if sel.cni_args:
            args = target.get("args")
            if not isinstance(args, dict):
                args = target["args"] = {}
            if not isinstance(args.get("cni"), dict):
                args["cni"] = {}
            args["cni"].update(sel.cni_args)
    return config
