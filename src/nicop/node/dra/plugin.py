"""The kubelet side of the DRA driver: registration, and NodePrepareResources /
NodeUnprepareResources for the claims of pods on this node.

Prepare reads the claim's allocation from the API, takes the results of this driver on this
node's pool, and writes one CDI spec file per claim into the runtime's CDI directory: per device,
its `/dev/infiniband` nodes and rdma_cm, the environment the SR-IOV device plugin gives
(`PCIDEVICE_<DRIVER>_<REQUEST>` = the request's PCI addresses; for a pod's extended resource,
`PCIDEVICE_<RESOURCE>` as for the device plugin's) and, for a VF, its netdev (moved
into the pod's network namespace by CDI-aware runtimes) unless the claim's VfConfig names a
network (nicop.api.dra_config) or the claim is the scheduler's for an extended resource: nicop's
Multus attaches those VFs, with the network's IPAM. The kubelet passes the returned CDI IDs to
the runtime.

Once prepared, each device's status goes into the claim's `status.devices` (KEP-4817): a Ready
condition, and for a VF the runtime moves the `networkData` of the interface the pod gets (its
name and MAC; a VF on a network gets its networkData, addresses too, from Multus). Writing it
needs `resourceclaims/status` and the node-bound `associated-node:patch` of
`resourceclaims/driver` for this driver; a cluster that refuses it keeps the claim prepared,
with a warning.

What was prepared is kept in a checkpoint file beside the sockets, so a repeated call answers
the same without reading the API, and a restarted plugin still knows what to undo.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from nicop.api import dra
from nicop.api.dra_config import ConfigError, VfConfig, vf_configs
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import DEVICE_CLASS, RESOURCE_CLAIM
from nicop.kube.times import stamp
from nicop.node import discovery
from nicop.node.dra import dra_pb2 as pb
from nicop.node.dra import registration_pb2 as reg
from nicop.node.dra.binding import apply_device_status
from nicop.node.dra.devices import device_name
from nicop.node.host import Host

log = logging.getLogger(__name__)

PLUGINS_DIR, REGISTRY_DIR, CDI_DIR = dra.PLUGINS_DIR, dra.REGISTRY_DIR, dra.CDI_DIR
CDI_VERSION = "1.1.0"  # the first with netDevices
CDI_KIND = f"{dra.DRIVER}/device"
SUPPORTED_VERSIONS = ["v1.DRAPlugin"]
DRA_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"


def env_name(request: str) -> str:
    """PCIDEVICE_RDMA_NICOP_IO_<REQUEST>, as the SR-IOV device plugin names its variable."""
    return dra.device_plugin_env(f"{dra.DRIVER}/{request}")


class DraPlugin:
    """Serves the kubelet for driver rdma.nicop.io on `node_name`."""

    def __init__(self, client: ApiClient, node_name: str, host: Host, *,
                 plugins_dir: str = PLUGINS_DIR, registry_dir: str = REGISTRY_DIR,
                 cdi_dir: str = CDI_DIR) -> None:
        self.client = client
        self.node_name = node_name
        self.host = host
        self.plugin_dir = f"{plugins_dir}/{dra.DRIVER}"
        self.endpoint = f"{self.plugin_dir}/dra.sock"
        self.registration = f"{registry_dir}/{dra.DRIVER}-reg.sock"
        self.cdi_dir = cdi_dir
        self.registered: bool | None = None
        self._servers: list[aio.Server] = []
        self._prepared: dict[str, Any] = self._load()
        self._extended: dict[str, str | None] = {}  # DeviceClass -> its extendedResourceName

    # ------------------------------------------------------------------ serving
    async def start(self) -> None:
        for path in (self.endpoint, self.registration):
            real = self.host.path(path)
            real.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                real.unlink()
        self._servers = [
            await self._serve(self.endpoint, DRA_SERVICE, {
                "NodePrepareResources": (self.prepare, pb.NodePrepareResourcesRequest,
                                         pb.NodePrepareResourcesResponse),
                "NodeUnprepareResources": (self.unprepare, pb.NodeUnprepareResourcesRequest,
                                           pb.NodeUnprepareResourcesResponse)}),
            await self._serve(self.registration, "pluginregistration.Registration", {
                "GetInfo": (self._info, reg.InfoRequest, reg.PluginInfo),
                "NotifyRegistrationStatus": (self._status, reg.RegistrationStatus,
                                             reg.RegistrationStatusResponse)}),
        ]
        log.info("%s: serving the kubelet on %s (registration %s)", dra.DRIVER, self.endpoint,
                 self.registration)

    async def _serve(self, path: str, service: str,
                     methods: dict[str, tuple[Callable[..., Any], Any, Any]]) -> aio.Server:
        server = aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
            name: grpc.unary_unary_rpc_method_handler(
                handler, request_deserializer=request.FromString,
                response_serializer=response.SerializeToString)
            for name, (handler, request, response) in methods.items()}),))
        server.add_insecure_port(f"unix://{self.host.path(path)}")
        await server.start()
        return server

    async def stop(self) -> None:
        """Stop serving; the registration socket goes, so the kubelet forgets the plugin."""
        for server in self._servers:
            await server.stop(grace=None)
        self._servers = []
        with contextlib.suppress(FileNotFoundError):
            self.host.path(self.registration).unlink()

    async def _info(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        # The node's path: the kubelet dials it from the host, where it is the same.
        return reg.PluginInfo(type="DRAPlugin", name=dra.DRIVER, endpoint=self.endpoint,
                              supported_versions=SUPPORTED_VERSIONS)

    async def _status(self, request: reg.RegistrationStatus,
                      context: Any) -> reg.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("%s: registered with the kubelet", dra.DRIVER)
        else:
            log.error("%s: the kubelet refused the registration: %s", dra.DRIVER, request.error)
        return reg.RegistrationStatusResponse()

    # ------------------------------------------------------------------ prepare
    async def prepare(self, request: pb.NodePrepareResourcesRequest,
                      context: Any) -> pb.NodePrepareResourcesResponse:
        answer = pb.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                devices = self._prepared.get(claim.uid, {}).get("devices")
                if devices is None:
                    devices = await self._prepare(claim)
                answer.claims[claim.uid].devices.extend(pb.Device(**d) for d in devices)
            except (ApiError, PrepareError) as e:
                log.warning("%s: cannot prepare claim %s/%s: %s", dra.DRIVER, claim.namespace,
                            claim.name, e)
                answer.claims[claim.uid].error = str(e)
        return answer

    async def _prepare(self, claim: pb.Claim) -> list[dict[str, Any]]:
        obj = await self.client.get(RESOURCE_CLAIM, claim.name, claim.namespace)
        if obj["metadata"].get("uid") != claim.uid:
            raise PrepareError(f"claim {claim.namespace}/{claim.name} is not {claim.uid} any "
                               "more (deleted and created again)")
        results = [r for r in (((obj.get("status") or {}).get("allocation") or {}).get(
            "devices") or {}).get("results") or []
            if r.get("driver") == dra.DRIVER and r.get("pool") == self.node_name]
        inventory = discovery.scan(self.host)
        by_name = {name: fn for fn in inventory.functions.values() for name in _names(fn)}
        pci: dict[str, list[str]] = {}
        for result in results:
            fn = by_name.get(result["device"])
            if fn is None:
                raise PrepareError(f"device {result['device']} of claim {claim.namespace}/"
                                   f"{claim.name} is not on node {self.node_name} any more")
            pci.setdefault(result["request"], []).append(fn.address)
        names = await self._env_names(obj)
        # A VF of an extended resource is given as the device plugin gives it: the netdev stays
        # on the node, for the network the pod's annotation names (Multus finds the claim).
        extended = (obj["metadata"].get("annotations") or {}).get(
            dra.EXTENDED_CLAIM_ANNOTATION) == "true"
        try:
            configs = vf_configs(obj)
        except ConfigError as e:
            raise PrepareError(str(e)) from None
        spec_devices, answer = [], []
        attached_by_cni: set[str] = set()
        for result in results:
            fn = by_name[result["device"]]
            request = result["request"]
            variable = names.get(request) or env_name(request.split("/")[0])
            edits: dict[str, Any] = {
                "env": [f"{variable}={','.join(pci[request])}"],
                "deviceNodes": [{"path": p, "hostPath": p, "permissions": "rw"}
                                for p in _char_devices(fn, inventory)],
            }
            if fn.pf is not None and (extended or configs.get(request, VfConfig()).network):
                attached_by_cni.add(result["device"])  # left where the CNI finds it
            elif fn.pf is not None and fn.netdev is not None:
                edits["netDevices"] = [{"hostInterfaceName": fn.netdev.name,
                                        "name": fn.netdev.name}]
            name = f"{claim.uid}-{result['device']}"
            spec_devices.append({"name": name, "containerEdits": edits})
            answer.append({"request_names": [request], "pool_name": self.node_name,
                           "device_name": result["device"],
                           "cdi_device_ids": [f"{CDI_KIND}={name}"]})
        if spec_devices:
            self._write_spec(claim.uid, {"cdiVersion": CDI_VERSION, "kind": CDI_KIND,
                                         "devices": spec_devices})
            await self._report(obj, [(r, by_name[r["device"]]) for r in results],
                               attached_by_cni)
        self._prepared[claim.uid] = {"namespace": claim.namespace, "name": claim.name,
                                     "devices": answer}
        self._save()
        log.info("%s: prepared claim %s/%s: %s", dra.DRIVER, claim.namespace, claim.name,
                 ", ".join(d["device_name"] for d in answer) or "no device of this driver")
        return answer

    async def _env_names(self, claim: dict[str, Any]) -> dict[str, str]:
        """For the claim the scheduler made for a pod's extended resources, the variable of
        each request as the device plugin names it (PCIDEVICE_NVIDIA_COM_<NAME>), from its
        DeviceClass's extendedResourceName: the pod's program finds its VFs where it did."""
        if (claim["metadata"].get("annotations") or {}).get(
                dra.EXTENDED_CLAIM_ANNOTATION) != "true":
            return {}
        names = {}
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            class_name = (request.get("exactly") or {}).get("deviceClassName")
            if not class_name:
                continue
            if class_name not in self._extended:
                try:
                    device_class = await self.client.get(DEVICE_CLASS, class_name)
                except ApiError as e:
                    if e.code != 404:
                        raise
                    device_class = {}  # gone since: the request's own name then
                self._extended[class_name] = (device_class.get("spec") or {}).get(
                    "extendedResourceName")
            if resource := self._extended[class_name]:
                names[request["name"]] = dra.device_plugin_env(resource)
        return names

    async def _report(self, claim: dict[str, Any],
                      prepared: list[tuple[dict[str, Any], discovery.PciFunction]],
                      attached_by_cni: set[str]) -> None:
        """The prepared devices' status in the claim (server-side apply of this driver's
        entries only: other drivers' stay theirs). The networkData of a VF that joins a
        network is the CNI's to write, once the pod has it."""
        now = stamp()
        devices = []
        for result, fn in prepared:
            # The binding conditions the binder set are true by now; written again so that
            # this apply, under the same field manager, keeps them.
            conditions = [{"type": kind, "status": "True", "reason": kind.rsplit("/")[-1],
                           "message": f"the VF is made and bound on node {self.node_name}",
                           "lastTransitionTime": now}
                          for kind in result.get("bindingConditions") or []]
            entry: dict[str, Any] = {
                "driver": dra.DRIVER, "pool": self.node_name, "device": result["device"],
                "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                                "message": f"prepared on node {self.node_name}",
                                "lastTransitionTime": now}, *conditions]}
            if result.get("shareID"):
                entry["shareID"] = result["shareID"]
            if fn.pf is not None and fn.netdev is not None \
                    and result["device"] not in attached_by_cni:
                network = {"interfaceName": fn.netdev.name}
                mac = self.host.read(f"/sys/class/net/{fn.netdev.name}/address")
                if mac:
                    network["hardwareAddress"] = mac
                entry["networkData"] = network
            devices.append(entry)
        meta = claim["metadata"]
        try:
            await apply_device_status(self.client, meta, devices)
        except ApiError as e:
            log.warning("%s: claim %s/%s prepared, but its device status not written: %s",
                        dra.DRIVER, meta["namespace"], meta["name"], e)

    async def unprepare(self, request: pb.NodeUnprepareResourcesRequest,
                        context: Any) -> pb.NodeUnprepareResourcesResponse:
        answer = pb.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            with contextlib.suppress(FileNotFoundError):
                self.host.path(self._spec_path(claim.uid)).unlink()
            if self._prepared.pop(claim.uid, None) is not None:
                self._save()
                log.info("%s: unprepared claim %s/%s", dra.DRIVER, claim.namespace, claim.name)
            answer.claims[claim.uid].error = ""
        return answer

    # ------------------------------------------------------------------ files
    def _spec_path(self, uid: str) -> str:
        return f"{self.cdi_dir}/{dra.DRIVER}-{uid}.json"

    def _write_spec(self, uid: str, spec: dict[str, Any]) -> None:
        _write_atomic(self.host.path(self._spec_path(uid)), json.dumps(spec, indent=1))

    @property
    def _checkpoint(self) -> Path:
        return self.host.path(f"{self.plugin_dir}/checkpoint.json")

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self._checkpoint.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as e:  # a torn write cannot happen (atomic); a hand edit can
            log.error("%s: checkpoint %s unreadable, starting empty: %s", dra.DRIVER,
                      self._checkpoint, e)
            return {}
        return dict(data.get("claims") or {})

    def _save(self) -> None:
        _write_atomic(self._checkpoint, json.dumps({"claims": self._prepared}, indent=1))


class PrepareError(Exception):
    """A claim this node cannot prepare; the kubelet retries and reports it on the pod."""


def _names(fn: discovery.PciFunction) -> list[str]:
    """The device names a function is published under: a VF's; a PF's, or its shared port's."""
    if fn.pf is not None:
        return [device_name(dra.KIND_VF, fn.address)]
    return [device_name(dra.KIND_PF, fn.address), device_name(dra.KIND_SHARED, fn.address)]


def _char_devices(fn: discovery.PciFunction, inventory: discovery.Inventory) -> list[str]:
    paths = [p for rdma in fn.rdma for p in rdma.char_devices]
    if paths and inventory.rdma_cm:
        paths.append(inventory.rdma_cm)
    return paths


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
