"""IPAM for the plugins: nv-ipam in the daemon itself, any other type run from CNI_PATH.

nv-ipam's config (`ipam: {type: nv-ipam, poolName: "v4,v6", poolType: ippool|cidrpool}`, with
defaults from `nv-ipam.conf` in the IPAM conf dir, static addresses from `runtimeConfig.ips`,
`args.cni.ips` or CNI_ARGS `IP=`) allocates from this node's block of each pool, round-robin after
the last address handed out (a static address does not move that pointer), and keeps the
allocation in the node-local store before answering. As nv-ipam: a static address that fits none
of the requested pools fails the ADD, a second ADD for the same container and interface by
another pod is refused (the same pod retrying gets its address back), and the pool's own gateway
handed out as an address (allocateDefaultGateway) comes without gateway and routes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import Gauge

from nicop.cni.pools import Address, PoolConfig, PoolSource
from nicop.cni.spec import CniError, Code, Obj, Request, config_error, empty_result, parse_result
from nicop.cni.store import Reservation, Store, pool_key
from nicop.node.host import Host

log = logging.getLogger(__name__)

NV_IPAM = "nv-ipam"
CONF_DIR = "/etc/cni/net.d/nv-ipam.d"
CONF_FILE = "nv-ipam.conf"
ALLOCATED = Gauge("nicop_ipam_allocated", "Addresses allocated on this node", ["pool"])
POOL_SIZE = Gauge("nicop_ipam_pool_size", "Addresses this node can hand out", ["pool"])


DEFAULT_LOG_FILE = "/var/log/nv-ipam-cni.log"
DEFAULT_LOG_LEVEL = "info"
DEFAULT_DAEMON_SOCKET = "unix:///var/lib/cni/nv-ipam/daemon.sock"
DEFAULT_CALL_TIMEOUT = 5


@dataclass
class NvIpamConf:
    """nv-ipam's IPAM config as resolved for one call: the network configuration's `ipam`
    section, then `nv-ipam.conf`, then nv-ipam's defaults, each filling what the one before
    left empty."""

    pools: list[str]
    pool_type: str
    static_ips: list[Address] = field(default_factory=list)
    default_gateway_as_ip: bool = False
    ip_index: int | None = None
    conf_dir: str = CONF_DIR
    force_pool_name: bool = False
    log_level: str = DEFAULT_LOG_LEVEL
    """"debug" (or "verbose") makes the daemon log what each call of the network resolved."""
    log_file: str = DEFAULT_LOG_FILE
    """Read for compatibility; nicop logs nv-ipam's calls in the cni-daemon's log instead."""
    daemon_socket: str = DEFAULT_DAEMON_SOCKET
    """Read for compatibility; the nv-ipam executable nicop installs finds nicop's daemon."""
    daemon_call_timeout: int = DEFAULT_CALL_TIMEOUT
    """Read for compatibility; the executable's timeout is in nicop-cni.conf."""


def ipam_section(config: Obj) -> Obj | None:
    section = config.get("ipam")
    if section is None or section == {}:
        return None
    if not isinstance(section, dict):
        raise config_error("ipam", "must be an object with a `type`")
    if not section.get("type"):
        raise config_error("ipam.type", "missing (nv-ipam, host-local, static, ...)")
    return section


def _parse_ip(field_name: str, value: object) -> Address:
    try:
        return ipaddress.ip_address(str(value).split("/")[0])
    except ValueError:
        raise config_error(field_name, f"{value!r} is not an IP address") from None


def _address(pool: PoolConfig, value: int) -> Address:
    """The address `value` in the pool's family (a small IPv6 value is no IPv4 address)."""
    return ipaddress.IPv4Address(value) if pool.subnet.version == 4 \
        else ipaddress.IPv6Address(value)


def conf_file(host: Host | None, ipam: Obj) -> Obj:
    """`nv-ipam.conf` in the IPAM conf dir (ipam.confDir, default /etc/cni/net.d/nv-ipam.d):
    defaults for the fields the network configuration leaves out, as nv-ipam's ConfLoader."""
    if host is None:
        return {}
    path = host.path(os.path.join(str(ipam.get("confDir") or CONF_DIR), CONF_FILE))
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise config_error("ipam.confDir", f"{path} cannot be read as JSON ({e}); fix or "
                           "remove it") from None
    if not isinstance(data, dict):
        raise config_error("ipam.confDir", f"{path} must hold a JSON object")
    return data


def _overlay(stdin: Obj, file: Obj) -> Obj:
    """nv-ipam's overlayConf: a field the network configuration leaves empty ("", 0, missing)
    comes from nv-ipam.conf, then from the defaults."""
    defaults: Obj = {"forcePoolName": False, "poolType": "ippool", "confDir": CONF_DIR,
                     "logFile": DEFAULT_LOG_FILE, "logLevel": DEFAULT_LOG_LEVEL,
                     "daemonSocket": DEFAULT_DAEMON_SOCKET,
                     "daemonCallTimeoutSeconds": DEFAULT_CALL_TIMEOUT}
    out = dict(stdin)
    for layer in (file, defaults):
        for key, value in layer.items():
            if out.get(key) in (None, "", 0) and not isinstance(out.get(key), bool):
                out[key] = value
    return out


def _static_ips(req: Request, args_cni: Obj) -> list[Address]:
    """Requested addresses in nv-ipam's priority: runtimeConfig.ips, args.cni.ips, CNI_ARGS IP
    (each address may carry a prefix length, which is dropped)."""
    runtime_ips = (req.config.get("runtimeConfig") or {}).get("ips") or []
    if runtime_ips:
        return [_parse_ip("runtimeConfig.ips", v) for v in runtime_ips]
    if args_cni.get("ips"):
        return [_parse_ip("args.cni.ips", v) for v in args_cni["ips"]]
    if req.args.get("IP"):
        try:
            return [ipaddress.ip_address(req.args["IP"].split("/")[0])]
        except ValueError:
            raise config_error("CNI_ARGS IP", f"{req.args['IP']!r}: IP argument contains invalid "
                               "IP address") from None
    return []


def parse_nv_ipam(req: Request, host: Host | None = None) -> NvIpamConf:
    """nv-ipam's config rules (pkg/cni/types): pool names, pool type, static addresses and
    features; the network configuration wins over nv-ipam.conf, CNI args over both."""
    config = req.config
    if not isinstance(config.get("ipam"), dict):
        raise CniError(Code.INVALID_CONFIG, "IPAM config missing 'ipam' key",
                       f"network {req.name!r} needs an \"ipam\" section, e.g. "
                       "{\"type\": \"nv-ipam\", \"poolName\": \"pool1\"}")
    ipam = _overlay(config["ipam"], conf_file(host, config["ipam"]))
    args_cni = ((config.get("args") or {}).get("cni") or {}) if isinstance(
        config.get("args"), dict) else {}
    force = bool(ipam.get("forcePoolName"))
    names = args_cni.get("poolNames")
    if names:
        if not isinstance(names, list):
            raise config_error("args.cni.poolNames", "must be a list of pool names")
        pools = [str(n) for n in names]
        where = "args.cni.poolNames"
    else:
        name = ipam.get("poolName")
        if not name and not force:
            name = config.get("name")
        if not name:
            raise config_error("ipam.poolName", "no pool provided: forcePoolName is set (in the "
                               "network configuration or nv-ipam.conf), so the network name is "
                               "not taken; set poolName")
        if not isinstance(name, str):
            raise config_error("ipam.poolName", "must be a string such as \"pool1\" or "
                               "\"v4pool,v6pool\"")
        pools = name.split(",")
        where = "ipam.poolName"
    if len(pools) > 2:
        raise config_error(where, f"{len(pools)} pools given; at most two (one IPv4, one IPv6)")
    if any(not p.strip() for p in pools):
        raise config_error(where, f"{','.join(pools)!r} has an empty pool name")
    pool_type = str(args_cni.get("poolType") or ipam.get("poolType")).lower()
    if pool_type not in ("ippool", "cidrpool"):
        raise config_error("ipam.poolType", f"unsupported poolType {pool_type!r}, supported "
                           "values: ippool, cidrpool")
    try:
        timeout = int(ipam["daemonCallTimeoutSeconds"])
    except (TypeError, ValueError):
        raise config_error("ipam.daemonCallTimeoutSeconds", "must be a number of "
                           "seconds") from None
    conf = NvIpamConf(pools=[p.strip() for p in pools], pool_type=pool_type,
                      conf_dir=str(ipam["confDir"]), force_pool_name=force,
                      log_level=str(ipam["logLevel"]), log_file=str(ipam["logFile"]),
                      daemon_socket=str(ipam["daemonSocket"]), daemon_call_timeout=timeout)
    conf.static_ips = _static_ips(req, args_cni)
    if req.command in ("ADD", "DEL", "CHECK"):
        for key in ("K8S_POD_NAME", "K8S_POD_NAMESPACE"):
            if not req.args.get(key):
                raise CniError(Code.INVALID_ENV,
                               f"CNI_ARGS: {key} is not provided by container runtime")
    conf.default_gateway_as_ip = bool(args_cni.get("allocateDefaultGateway"))
    index = args_cni.get("allocateIPWithIndex")
    if index is not None:
        if not isinstance(index, int) or isinstance(index, bool):
            raise config_error("args.cni.allocateIPWithIndex", f"{index!r} must be an integer")
        if index < 0:
            raise config_error("args.cni.allocateIPWithIndex", f"allocateIPWithIndex can't be "
                               f"negative ({index})")
        conf.ip_index = index
    if conf.default_gateway_as_ip:
        if conf.static_ips:
            raise config_error("args.cni.allocateDefaultGateway", "allocateDefaultGateway "
                               "can't be used together with static IP request")
        if conf.ip_index is not None:
            raise config_error("args.cni.allocateDefaultGateway", "allocateDefaultGateway "
                               "can't be used together allocateIPWithIndex")
    if conf.ip_index is not None and conf.static_ips:
        raise config_error("args.cni.allocateIPWithIndex", "allocateIPWithIndex can't be used "
                           "together with static IP request")
    return conf


class Ipam:
    """Allocations of this node: the store, the pools, and delegation to other IPAM types."""

    def __init__(self, store: Store, pools: PoolSource) -> None:
        self.store = store
        self.pools = pools
        self.host: Host | None = getattr(store, "host", None)
        """Where nv-ipam.conf is read from: the node the store is on."""
        self.lock = threading.Lock()
        """Held while choosing and storing an address, so two ADDs never pick the same."""

    # ------------------------------------------------------------------ nv-ipam
    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """One change of the store under the lock; a store that cannot be written fails the
        call with nothing changed (error 5), so the runtime's retry finds the same state."""
        with self.lock:
            try:
                with self.store.transaction():
                    yield
            except OSError as e:
                raise CniError(Code.IO_FAILURE, f"cannot write the allocation store "
                               f"{self.store.path}: {e.strerror or e}",
                               "nothing was changed; free space or fix the mount of "
                               "/var/lib/cni/nv-ipam on the node, then retry") from None

    def _pool_configs(self, conf: NvIpamConf) -> list[PoolConfig]:
        return [self.pools.lookup(conf.pool_type, name) for name in conf.pools]

    def _pick(self, pool: PoolConfig, taken: set[str], conf: NvIpamConf,
              static: Address | None) -> Address:
        gw = int(pool.gateway) if pool.gateway is not None else None
        if static is not None:
            # as nv-ipam: a requested address may be outside the node's block and excluded
            if static not in pool.subnet:
                raise config_error("static IP", f"{static} is not in pool {pool.name} "
                                   f"({pool.subnet})")
            if str(static) in taken:
                raise CniError(Code.DEVICE_BUSY, f"{static} is already allocated in pool "
                               f"{pool.name}")
            return static
        if conf.default_gateway_as_ip:
            if pool.gateway is None:
                raise config_error("args.cni.allocateDefaultGateway", "pool without gateway "
                                   "can't be used with allocateDefaultGateway, pool "
                                   f"\"{pool.name}\", poolType \"{pool.kind}\"")
            if str(pool.gateway) in taken:
                raise CniError(Code.DEVICE_BUSY, f"the gateway {pool.gateway} of pool "
                               f"{pool.name} is already allocated")
            return pool.gateway
        start, end = int(pool.start), int(pool.end)
        if conf.ip_index is not None:
            return self._indexed(pool, taken, conf.ip_index)
        last = self.store.last_reserved(pool.key)
        first = start
        if last:
            try:
                value = int(ipaddress.ip_address(last))
                if start <= value < end:
                    first = value + 1
            except ValueError:
                pass
        span = end - start + 1
        for step in range(span):
            value = start + (first - start + step) % span
            if value == gw or pool.excluded(value):
                continue
            ip = _address(pool, value)
            if str(ip) not in taken:
                return ip
        raise CniError(Code.NO_FREE_ADDRESSES, f"no free addresses in pool {pool.name} on this "
                       f"node ({pool.start}-{pool.end}, {len(taken)} allocated)",
                       "enlarge perNodeBlockSize, or free addresses of pods that are gone")

    def _indexed(self, pool: PoolConfig, taken: set[str], index: int) -> Address:
        """allocateIPWithIndex: the index-th address of the node's block (nv-ipam's order of
        checks). Unlike nv-ipam, an excluded address is refused rather than handed out."""
        value = int(pool.start) + index
        ip = _address(pool, value) if value < 2 ** pool.subnet.max_prefixlen else None
        field_name = "args.cni.allocateIPWithIndex"
        if ip is not None and ip == pool.gateway:
            raise config_error(field_name, f"requested IP index \"{index}\" is the actual "
                               f"gateway {ip} of pool {pool.name}, use allocateDefaultGateway "
                               "instead")
        if ip is None or value > int(pool.end):
            raise config_error(field_name, f"requested IP index \"{index}\" is outside of the "
                               f"given chunk {pool.start}-{pool.end} of pool {pool.name}")
        if pool.excluded(value):
            raise config_error(field_name, f"requested IP index \"{index}\" is {ip}, which "
                               f"pool {pool.name} excludes (spec.exclusions or "
                               "spec.perNodeExclusions); choose another index")
        if str(ip) in taken:
            raise CniError(Code.DEVICE_BUSY, f"requested IP {ip} (index {index}) is already "
                           f"reserved in the pool \"{pool.name}\", poolType \"{pool.kind}\"")
        return ip

    def parse(self, req: Request) -> NvIpamConf:
        conf = parse_nv_ipam(req, self.host)
        if conf.log_level.lower() in ("debug", "verbose"):
            log.info("nv-ipam %s %s/%s of network %s: pools %s (%s), static IPs %s, "
                     "allocateDefaultGateway %s, allocateIPWithIndex %s, conf dir %s",
                     req.command, req.container_id, req.ifname, req.name, conf.pools,
                     conf.pool_type, [str(ip) for ip in conf.static_ips],
                     conf.default_gateway_as_ip, conf.ip_index, conf.conf_dir)
        return conf

    @staticmethod
    def _static_for(pool: PoolConfig, conf: NvIpamConf) -> Address | None:
        """The first requested static address inside the pool's subnet (nv-ipam's rule)."""
        return next((ip for ip in conf.static_ips if ip in pool.subnet), None)

    @classmethod
    def _check_statics(cls, pools: list[PoolConfig], conf: NvIpamConf) -> None:
        """Every requested address must be the one a pool takes: nv-ipam takes the first per
        pool, so a second address in the same pool fails the ADD as one in no pool does."""
        chosen = {cls._static_for(pool, conf) for pool in pools}
        for ip in conf.static_ips:
            if ip not in chosen:
                raise CniError(
                    Code.INVALID_CONFIG,
                    "not all requested static IPs can be allocated from the ranges available "
                    f"on the node, ip {ip} has no matching Pool",
                    "requested pools: " + ", ".join(f"{p.name} ({p.subnet})" for p in pools)
                    + "; request at most one address per pool, inside it, or add its pool to "
                    "poolName")

    def allocate(self, req: Request, device_id: str = "") -> Obj:
        """ADD for nv-ipam: one address per pool, stored before the answer. A second ADD for
        the same container and interface is refused as nv-ipam refuses it (the first allocation
        stays), unless it is the same pod's ADD again (a runtime retrying after the daemon
        died mid-ADD, as error 11 invites): that one gets the same address back."""
        conf = self.parse(req)
        pools = self._pool_configs(conf)
        self._check_statics(pools, conf)
        namespace, name, uid = req.pod
        result = empty_result()
        with self._changing():
            for pool in pools:
                res = self.store.get(pool.key, req.container_id, req.ifname)
                if res is not None and (res.pod_namespace, res.pod_name, res.pod_uuid,
                                        res.network) != (namespace, name, uid, req.name):
                    raise CniError(
                        Code.INTERNAL, f"allocation already exist in the pool \"{pool.name}\", "
                        f"poolType \"{pool.kind}\"",
                        f"container {req.container_id} interface {req.ifname} holds "
                        f"{res.ip_address} for pod {res.pod_namespace}/{res.pod_name}; DEL it "
                        "before adding it again")
                if res is None:
                    static = self._static_for(pool, conf)
                    ip = self._pick(pool, self.store.reserved(pool.key), conf, static)
                    res = Reservation(
                        container_id=req.container_id, interface_name=req.ifname,
                        ip_address=str(ip), pod_name=name, pod_namespace=namespace,
                        pod_uuid=uid, device_id=device_id or str(req.config.get("deviceID", "")),
                        pool_config_snapshot=pool.snapshot(), network=req.name,
                    )
                    chosen = static is not None or conf.default_gateway_as_ip \
                        or conf.ip_index is not None
                    self.store.reserve(pool.key, res, pool.snapshot(), move_pointer=not chosen)
                entry: Obj = {"address": f"{res.ip_address}/{pool.subnet.prefixlen}"}
                if pool.gateway is not None and not conf.default_gateway_as_ip:
                    # as nv-ipam: the gateway's own address gets no gateway and no routes
                    entry["gateway"] = str(pool.gateway)
                    result["routes"].extend(pool.result_routes())
                result["ips"].append(entry)
        self.update_metrics()
        return result

    def _keys(self, req: Request) -> list[str]:
        """The store keys of the pools a request names; every pool when its config no longer
        parses (DEL must still free what the container holds)."""
        try:
            conf = self.parse(req)
        except CniError:
            return list(self.store.snapshot())
        return [pool_key(conf.pool_type, name) for name in conf.pools]

    def release(self, req: Request) -> None:
        """DEL for nv-ipam: free this container's address in each pool; absent is fine."""
        keys = self._keys(req)
        with self._changing():
            for key in keys:
                self.store.release(key, req.container_id, req.ifname)
        self.update_metrics()

    def is_allocated(self, req: Request) -> None:
        conf = self.parse(req)
        for pool in conf.pools:
            if self.store.get(pool_key(conf.pool_type, pool), req.container_id,
                              req.ifname) is None:
                raise CniError(Code.INTERNAL, f"reservation for pool \"{pool}\", poolType "
                               f"\"{conf.pool_type}\" not found",
                               f"container {req.container_id} interface {req.ifname} holds no "
                               "address of it on this node")

    def ready(self, req: Request) -> None:
        """STATUS for nv-ipam: the node has a block of every pool the config names."""
        conf = self.parse(req)
        for name in conf.pools:
            try:
                self.pools.lookup(conf.pool_type, name)
            except CniError as e:
                raise CniError(Code.NOT_AVAILABLE, f"plugin not available: {e.msg}",
                               e.details) from None

    def collect(self, req: Request) -> int:
        """GC for nv-ipam: free what this network allocated for attachments that are gone."""
        valid = {(a.get("containerID"), a.get("ifname"))
                 for a in req.config.get("cni.dev/valid-attachments") or []}
        conf = self.parse(req)
        keys = {pool_key(conf.pool_type, name) for name in conf.pools}
        freed = 0
        with self._changing():
            for pool, entries in self.store.snapshot().items():
                if pool not in keys:
                    continue
                for res in entries:
                    if res.network == req.name and \
                            (res.container_id, res.interface_name) not in valid:
                        self.store.release(pool, res.container_id, res.interface_name)
                        freed += 1
        self.update_metrics()
        return freed

    def usage(self) -> dict[str, dict[str, int]]:
        """Allocated and allocatable addresses per pool on this node."""
        out: dict[str, dict[str, int]] = {}
        known = self.pools.known()
        for name, entries in self.store.snapshot().items():
            out[name] = {"allocated": len(entries), "size": 0}
        for pool in known.values():
            out.setdefault(pool.key, {"allocated": 0, "size": 0})["size"] = pool.size()
        return out

    def update_metrics(self, usage: dict[str, dict[str, int]] | None = None) -> None:
        """The nicop_ipam_* gauges from `usage` (computed when not given)."""
        for name, u in (self.usage() if usage is None else usage).items():
            ALLOCATED.labels(name).set(u["allocated"])
            POOL_SIZE.labels(name).set(u["size"])

    # ------------------------------------------------------------------ any type
    def validate(self, req: Request) -> None:
        """Config errors before anything moves: the ipam section, nv-ipam's pools."""
        section = ipam_section(req.config)
        if section is None:
            return
        if section["type"] != NV_IPAM:
            self._binary(req, section["type"])
            return
        conf = self.parse(req)
        self._check_statics(self._pool_configs(conf), conf)

    def add(self, req: Request) -> Obj:
        section = ipam_section(req.config)
        if section is None:
            return empty_result()
        if section["type"] == NV_IPAM:
            return self.allocate(req)
        return self._delegate(req, section["type"], "ADD")

    def delete(self, req: Request) -> None:
        section = ipam_section(req.config)
        if section is None:
            return
        if section["type"] == NV_IPAM:
            self.release(req)
        else:
            self._delegate(req, section["type"], "DEL")

    def check(self, req: Request) -> None:
        section = ipam_section(req.config)
        if section is None:
            return
        if section["type"] == NV_IPAM:
            self.is_allocated(req)
        else:
            self._delegate(req, section["type"], "CHECK")

    @staticmethod
    def _binary(req: Request, plugin: str) -> str:
        if "/" in plugin:
            raise config_error("ipam.type", f"{plugin!r} must be a plugin name, not a path")
        binary = next((os.path.join(d, plugin) for d in req.path
                       if os.access(os.path.join(d, plugin), os.X_OK)), None)
        if binary is None:
            raise config_error("ipam.type", f"IPAM plugin {plugin!r} not found in CNI_PATH "
                               f"{':'.join(req.path) or '(empty)'}")
        return binary

    def _delegate(self, req: Request, plugin: str, command: str) -> Obj:
        """Run IPAM plugin `plugin` from CNI_PATH with this request (the spec's delegation)."""
        binary = self._binary(req, plugin)
        env = {**os.environ, **req.env, "CNI_COMMAND": command}
        proc = subprocess.run([binary], input=req.stdin, env=env, capture_output=True,
                              timeout=120, check=False)
        if proc.returncode != 0:
            try:
                err = json.loads(proc.stdout)
                raise CniError(int(err.get("code", Code.INTERNAL)), str(err.get("msg", "")),
                               str(err.get("details", "")))
            except (ValueError, AttributeError):
                text = (proc.stdout or proc.stderr).decode(errors="replace").strip()
                raise CniError(Code.INTERNAL, f"IPAM plugin {plugin} failed: {text}") from None
        if command != "ADD":
            return {}
        try:
            return parse_result(json.loads(proc.stdout))
        except ValueError:
            raise CniError(Code.DECODING_FAILURE,
                           f"IPAM plugin {plugin} printed an invalid result") from None


class NvIpamPlugin:
    """`nv-ipam` as its own CNI plugin, for plugins that run it from CNI_PATH."""

    def __init__(self, ipam: Ipam) -> None:
        self.ipam = ipam

    def add(self, req: Request) -> Obj:
        return self.ipam.allocate(req)

    def delete(self, req: Request) -> None:
        self.ipam.release(req)

    def check(self, req: Request) -> None:
        self.ipam.is_allocated(req)

    def status(self, req: Request) -> None:
        self.ipam.ready(req)

    def gc(self, req: Request) -> None:
        self.ipam.collect(req)
