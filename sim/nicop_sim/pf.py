"""The PF side of a simulated NIC: the VF settings (VLAN, admin MAC, rates, spoof check, trust,
link state, GUIDs) and the RDMA namespace state a kernel keeps on the PF, kept in files instead,
with each call logged the way sriov-cni's integration harness logs them
(`LinkSetVfVlanQosProto enp175s0f1 0 1234 0 33024`). A veth standing in for a PF has none."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nicop.cni.rdma import SHARED
from nicop.cni.spec import CniError, Code
from nicop.cni.vf import VfState


class RecordingVfControl:
    """VF settings kept in `<dir>/<pf>.json`, every call appended to `<dir>/<pf>.calls`."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _load(self, pf: str) -> dict[str, Any]:
        path = self.dir / f"{pf}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def get(self, pf: str, vf: int) -> VfState:
        with self._lock:
            return VfState(**self._load(pf).get(str(vf), {}))

    def calls(self, pf: str) -> list[str]:
        path = self.dir / f"{pf}.calls"
        return path.read_text().splitlines() if path.exists() else []

    def _record(self, pf: str, vf: int, call: str, *args: object, **changes: Any) -> None:
        with self._lock:
            states = self._load(pf)
            state = {**asdict(VfState()), **states.get(str(vf), {}), **changes}
            states[str(vf)] = state
            tmp = self.dir / f"{pf}.json.tmp"
            tmp.write_text(json.dumps(states))
            tmp.replace(self.dir / f"{pf}.json")
            with open(self.dir / f"{pf}.calls", "a") as f:
                f.write(" ".join([call, pf, str(vf), *map(str, args)]) + "\n")

    def set_vlan(self, pf: str, vf: int, vlan: int, qos: int, proto: int) -> None:
        self._record(pf, vf, "LinkSetVfVlanQosProto", vlan, qos, proto,
                     vlan=vlan, qos=qos, proto=proto)

    def set_mac(self, pf: str, vf: int, mac: str) -> None:
        self._record(pf, vf, "LinkSetVfHardwareAddr", mac, mac=mac)

    def set_rate(self, pf: str, vf: int, min_rate: int, max_rate: int) -> None:
        self._record(pf, vf, "LinkSetVfRate", min_rate, max_rate,
                     min_tx_rate=min_rate, max_tx_rate=max_rate)

    def set_spoofchk(self, pf: str, vf: int, on: bool) -> None:
        self._record(pf, vf, "LinkSetVfSpoofchk", str(on).lower(), spoofchk=on)

    def set_trust(self, pf: str, vf: int, on: bool) -> None:
        self._record(pf, vf, "LinkSetVfTrust", str(on).lower(), trust=on)

    def set_link_state(self, pf: str, vf: int, state: int) -> None:
        self._record(pf, vf, "LinkSetVfState", state, link_state=state)

    def set_guid(self, pf: str, vf: int, guid: str) -> None:
        self._record(pf, vf, "LinkSetVfNodeGUID", guid, node_guid=guid)
        self._record(pf, vf, "LinkSetVfPortGUID", guid, port_guid=guid)


class RecordingRdmaControl:
    """RDMA state kept in `<dir>/rdma.json`, every call appended to `<dir>/rdma.calls` (named
    after the netlink library calls upstream makes: RdmaSystemGetNetnsMode, RdmaLinkSetNsFd)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def _load(self) -> dict[str, Any]:
        path = self.dir / "rdma.json"
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def _save(self, state: dict[str, Any], call: str) -> None:
        tmp = self.dir / "rdma.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.dir / "rdma.json")
        with open(self.dir / "rdma.calls", "a") as f:
            f.write(call + "\n")

    def set_netns_mode(self, mode: str) -> None:
        """What `rdma system set netns <mode>` does on a real node."""
        with self._lock:
            self._save({**self._load(), "netns_mode": mode}, f"RdmaSystemSetNetnsMode {mode}")

    def netns_mode(self) -> str:
        with self._lock:
            return str(self._load().get("netns_mode", SHARED))  # the kernel's default

    def namespaces(self) -> dict[str, str]:
        """RDMA device -> the namespace path it was moved into ("" for the node's)."""
        with self._lock:
            return {str(k): str(v) for k, v in (self._load().get("netns") or {}).items()}

    def calls(self) -> list[str]:
        path = self.dir / "rdma.calls"
        return path.read_text().splitlines() if path.exists() else []

    def move(self, device: str, src: str, dst: str) -> None:
        with self._lock:
            state = self._load()
            where = dict(state.get("netns") or {})
            if where.get(device, "") != src:
                raise CniError(Code.INTERNAL, f"RDMA device {device} not found in "
                               f"{src or 'the node namespace'}")
            where[device] = dst
            state["netns"] = where
            self._save(state, f"RdmaLinkSetNsFd {device} {dst or 'host'}")
