"""The DRA half of a kubelet, for a simulated node: it registers the DRA plugins that appear in
the node's plugins_registry, and for each pod bound to the node whose claims are allocated, calls
NodePrepareResources on the drivers of those claims and records the CDI devices on the pod
(annotation `nicop.io/dra-devices`), since no container runtime exists to receive them; when the
pod goes, it calls NodeUnprepareResources. As the kubelet, it retries a pod whose driver has not
registered yet or answered with an error, and records the error on the pod meanwhile, and 30 s
after a plugin unregisters (and has not come back) it deletes that driver's ResourceSlices of
its node: a plugin removed with its RBAC cannot delete them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from grpc import aio

from nicop.kube.client import ApiClient, ApiError
from nicop.kube.informer import Informer
from nicop.kube.resources import POD, RESOURCE_CLAIM, RESOURCE_SLICE, Obj
from nicop.node.dra import dra_pb2 as pb
from nicop.node.dra import dra_pb2_grpc, registration_pb2_grpc
from nicop.node.dra import registration_pb2 as reg
from nicop.node.dra.plugin import REGISTRY_DIR
from nicop.node.host import Host

log = logging.getLogger(__name__)

ANNOTATION = "nicop.io/dra-devices"
VERSION = "v1.DRAPlugin"
WIPE_DELAY = 30.0  # the kubelet's delay before it deletes an unregistered driver's slices


@dataclass
class Prepared:
    """What a pod got: per pod claim name, the CDI IDs; the claims to unprepare by driver."""

    devices: dict[str, list[str]] = field(default_factory=dict)
    claims: dict[str, list[pb.Claim]] = field(default_factory=dict)


class DraKubelet:
    def __init__(self, client: ApiClient, node_name: str, host: Host,
                 pods: Informer | None = None, interval: float = 0.5,
                 wipe_delay: float = WIPE_DELAY) -> None:
        """`pods` is an informer of the node's pods that someone else runs (the pod runner's);
        without it this runs its own."""
        self.client = client
        self.node_name = node_name
        self.host = host
        self.interval = interval
        self.drivers: dict[str, str] = {}  # driver -> endpoint (a real path on this machine)
        self._sockets: dict[str, str] = {}  # registration socket -> driver
        self.wipe_delay = wipe_delay
        self._unregistered: dict[str, float] = {}  # driver -> when its plugin went
        self._own_informer = pods is None
        self.pods = pods or Informer(client, POD, field_selector=f"spec.nodeName={node_name}")
        self._prepared: dict[str, Prepared] = {}  # pod uid -> what it got
        self._releasing: dict[str, Prepared] = {}  # pod uid -> what is still to unprepare
        self._wake = asyncio.Event()
        self.pods.on_change(lambda event, obj, old: self._wake.set())

    async def run(self, stop: asyncio.Event) -> None:
        watcher = asyncio.create_task(self.pods.run()) if self._own_informer else None
        try:
            while not stop.is_set():
                await self._watch_registry()
                await self._wipe_slices()
                await self._sync_pods()
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    # ------------------------------------------------------------------ plugins
    async def _watch_registry(self) -> None:
        """Register new sockets of plugins_registry, forget those gone (as the plugin watcher)."""
        registry = self.host.path(REGISTRY_DIR)
        present = {str(p) for p in registry.glob("*.sock")} if registry.is_dir() else set()
        for gone in set(self._sockets) - present:
            driver = self._sockets.pop(gone)
            self.drivers.pop(driver, None)
            self._unregistered[driver] = asyncio.get_running_loop().time()
            log.info("dra kubelet: plugin %s unregistered on %s", driver, self.node_name)
        for path in present - set(self._sockets):
            try:
                async with aio.insecure_channel(f"unix://{path}") as channel:
                    stub = _registration(channel)
                    info = await stub.GetInfo(reg.InfoRequest(), timeout=5)
                    ok = info.type == "DRAPlugin" and VERSION in info.supported_versions
                    await stub.NotifyRegistrationStatus(reg.RegistrationStatus(
                        plugin_registered=ok,
                        error="" if ok else f"supported versions {list(info.supported_versions)}"
                                            f" do not include {VERSION}"), timeout=5)
            except aio.AioRpcError as e:
                log.debug("dra kubelet: %s not answering yet: %s", path, e.code())
                continue
            self._sockets[path] = info.name
            if ok:
                self.drivers[info.name] = str(self.host.path(info.endpoint))
                self._unregistered.pop(info.name, None)
                log.info("dra kubelet: registered %s on %s", info.name, self.node_name)

    async def _wipe_slices(self) -> None:
        """Delete the slices of drivers unregistered for `wipe_delay` seconds (kept on error)."""
        now = asyncio.get_running_loop().time()
        for driver, since in list(self._unregistered.items()):
            if now - since < self.wipe_delay:
                continue
            try:
                slices, _ = await self.client.list(
                    RESOURCE_SLICE, field_selector=f"spec.nodeName={self.node_name},"
                                                   f"spec.driver={driver}")
                for obj in slices:
                    await self.client.delete(RESOURCE_SLICE, obj["metadata"]["name"])
            except ApiError as e:
                log.warning("dra kubelet: cannot delete the slices of %s: %s", driver, e)
                continue
            del self._unregistered[driver]
            if slices:
                log.info("dra kubelet: deleted the %d slices of unregistered %s on %s",
                         len(slices), driver, self.node_name)

    # ------------------------------------------------------------------ pods
    async def _sync_pods(self) -> None:
        current = {}
        for pod in self.pods.store.items():
            meta = pod["metadata"]
            done = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if claim_entries(pod) and not meta.get("deletionTimestamp") and not done:
                current[meta["uid"]] = pod
        for uid in set(self._prepared) - set(current):
            self._releasing[uid] = self._prepared.pop(uid)
        for uid, prepared in list(self._releasing.items()):
            if await self._unprepare(prepared):
                del self._releasing[uid]
        for uid, pod in current.items():
            if uid not in self._prepared:
                await self._prepare(pod)

    async def _prepare(self, pod: Obj) -> None:
        meta = pod["metadata"]
        names = {s["name"]: s.get("resourceClaimName") for s in
                 (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        prepared = Prepared()
        problems = []
        for entry in claim_entries(pod):
            claim_name = entry.get("resourceClaimName") or names.get(entry["name"])
            if not claim_name:
                return  # the claim is not made yet: the pod waits
            try:
                claim = await self.client.get(RESOURCE_CLAIM, claim_name, meta["namespace"])
            except ApiError as e:
                problems.append(f"claim {claim_name}: {e.code} {e.reason}")
                continue
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                       or {}).get("results") or []
            ref = pb.Claim(namespace=meta["namespace"], uid=claim["metadata"]["uid"],
                           name=claim_name)
            ids: list[str] = []
            for driver in sorted({r["driver"] for r in results}):
                endpoint = self.drivers.get(driver)
                if endpoint is None:
                    problems.append(f"DRA driver {driver} is not registered on this node")
                    continue
                try:
                    async with aio.insecure_channel(f"unix://{endpoint}") as channel:
                        answer = await _dra(channel).NodePrepareResources(
                            pb.NodePrepareResourcesRequest(claims=[ref]), timeout=45)
                except aio.AioRpcError as e:
                    problems.append(f"{driver}: {e.code().name} {e.details()}")
                    continue
                result = answer.claims.get(ref.uid)
                if result is None or result.error:
                    problems.append(f"{driver}: {result.error if result else 'no answer'}")
                    continue
                prepared.claims.setdefault(driver, []).append(ref)
                ids += [i for d in result.devices for i in d.cdi_device_ids
                        if entry.get("requests") is None
                        or set(d.request_names) & set(entry["requests"])]
            prepared.devices[entry["name"]] = ids
        record: dict[str, Any] = {"devices": prepared.devices}
        if problems:  # the kubelet retries; what failed is on the pod meanwhile
            record["error"] = "; ".join(problems)
            await self._unprepare(prepared)
        else:
            self._prepared[meta["uid"]] = prepared
            log.info("dra kubelet: prepared %s/%s: %s", meta["namespace"], meta["name"],
                     prepared.devices)
        with contextlib.suppress(ApiError):  # gone meanwhile: nothing to record
            await self.client.patch(POD, meta["name"], {"metadata": {"annotations": {
                ANNOTATION: json.dumps(record, sort_keys=True)}}}, meta["namespace"])

    async def _unprepare(self, prepared: Prepared) -> bool:
        """Unprepare the claims; those a driver could not (not registered, not answering, an
        error) stay in `prepared` and False is returned: as the kubelet, the caller retries
        until the driver has released them."""
        for driver, claims in list(prepared.claims.items()):
            endpoint = self.drivers.get(driver)
            if endpoint is None:
                continue
            try:
                async with aio.insecure_channel(f"unix://{endpoint}") as channel:
                    answer = await _dra(channel).NodeUnprepareResources(
                        pb.NodeUnprepareResourcesRequest(claims=claims), timeout=45)
            except aio.AioRpcError as e:
                log.warning("dra kubelet: %s could not unprepare %s: %s", driver,
                            [c.name for c in claims], e.code().name)
                continue
            if errors := [r.error for r in answer.claims.values() if r.error]:
                log.warning("dra kubelet: %s could not unprepare %s: %s", driver,
                            [c.name for c in claims], "; ".join(errors))
                continue
            del prepared.claims[driver]
        return not prepared.claims


def claim_entries(pod: Obj) -> list[Obj]:
    """The pod's claims: those of its spec, and the one the scheduler made for its extended
    resources served by DRA (status.extendedResourceClaimStatus), an entry per resource name
    with the claim's requests that serve it, as the kubelet hands their devices to containers."""
    entries = list((pod.get("spec") or {}).get("resourceClaims") or [])
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if extended:
        requests: dict[str, list[str]] = {}
        for mapping in extended.get("requestMappings") or []:
            requests.setdefault(mapping["resourceName"], []).append(mapping["requestName"])
        entries += [{"name": resource, "resourceClaimName": extended["resourceClaimName"],
                     "requests": names} for resource, names in sorted(requests.items())]
    return entries


def _dra(channel: aio.Channel) -> Any:
    return dra_pb2_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]


def _registration(channel: aio.Channel) -> Any:
    return registration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
