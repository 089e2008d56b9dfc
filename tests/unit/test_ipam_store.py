"""The node-local allocation store: nv-ipam's file, never half-written, never shared."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nicop.cni.store import PoolEntries, Reservation, Store, StoreError, go_json
from nicop.node.host import Host


def test_checksum_is_the_one_nv_ipam_computes(tmp_path: Path) -> None:
    """FNV-32a over Go's encoding; the figure was computed by Go's encoding/json and hash/fnv
    on the same data (nv-ipam's store types)."""
    store = Store(Host(tmp_path))
    entries = [
        Reservation("cid2", "net1", "192.168.0.5", pod_name="b<&>", pod_namespace="default",
                    pod_uuid="u2", device_id="0000:3b:00.2", create_time="2024-01-01T00:00:00Z",
                    pool_config_snapshot="{}", network="net-a"),
        Reservation("cid1", "net1", "192.168.0.4", pod_name="a", pod_namespace="default",
                    pod_uuid="u1", create_time="2024-01-01T00:00:00Z"),
    ]
    with store.transaction():
        store.pools = {
            "pool1": PoolEntries("pool1", {r.key: r for r in entries},
                                 '{"name":"pool1","subnet":"192.168.0.0/16"}', "192.168.0.5"),
            "v6": PoolEntries("v6", {"cid1_net2": Reservation("cid1", "net2", "fd00::2")}),
            "empty": PoolEntries("empty"),
        }
    data = json.loads(store.path.read_text())
    assert data["checksum"] == 4074532078
    assert b'"pod_name":"b\\u003c\\u0026\\u003e"' in go_json(
        store.pools["pool1"].entries["cid2_net1"].to_go())
    store.close()
    assert Store(Host(tmp_path)).pools["pool1"].entries["cid1_net1"].ip_address == "192.168.0.4"


def test_a_damaged_file_is_refused_with_the_fix(tmp_path: Path) -> None:
    store = Store(Host(tmp_path))
    store.reserve("p", Reservation("c", "net1", "10.0.0.2"))
    store.close()
    data = json.loads(store.path.read_text())
    data["pools"]["p"]["entries"]["c_net1"]["ip_address"] = "10.0.0.3"
    store.path.write_text(json.dumps(data))
    with pytest.raises(StoreError, match=r"checksum mismatch .* move it away"):
        Store(Host(tmp_path))


def test_one_daemon_per_store(tmp_path: Path) -> None:
    first = Store(Host(tmp_path))
    with pytest.raises(StoreError, match="in use by another process"):
        Store(Host(tmp_path))
    first.close()
    Store(Host(tmp_path)).close()


def test_a_failed_transaction_changes_nothing(tmp_path: Path) -> None:
    store = Store(Host(tmp_path))
    store.reserve("p", Reservation("a", "net1", "10.0.0.2"))
    with pytest.raises(RuntimeError), store.transaction():
        store.reserve("p", Reservation("b", "net1", "10.0.0.3"))
        raise RuntimeError("interrupted")
    assert store.reserved("p") == {"10.0.0.2"}
    store.close()
    assert Store(Host(tmp_path)).reserved("p") == {"10.0.0.2"}


CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from nicop.cni.ipam import Ipam
    from nicop.cni.pools import FilePools
    from nicop.cni.spec import parse_request
    from nicop.cni.store import Store
    from nicop.node.host import Host
    root = Path(sys.argv[1])
    ipam = Ipam(Store(Host(root)), FilePools(root / "pools.json"))
    config = json.dumps({"cniVersion": "1.0.0", "name": "n",
                         "ipam": {"type": "nv-ipam", "poolName": "p"}}).encode()
    i = 0
    while True:
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"c{i}", "CNI_NETNS": "/x",
               "CNI_PATH": "/x", "CNI_IFNAME": "net1",
               "CNI_ARGS": "K8S_POD_NAME=p;K8S_POD_NAMESPACE=n"}
        ip = ipam.allocate(parse_request("nv-ipam", env, config))["ips"][0]["address"]
        print(f"c{i} {ip}", flush=True)
        i += 1
        if i % 7 == 0:  # some DELs too, so the file also shrinks; said before they start
            print(f"del c{i - 3}", flush=True)
            env = {**env, "CNI_COMMAND": "DEL", "CNI_CONTAINERID": f"c{i - 3}"}
            ipam.release(parse_request("nv-ipam", env, config))
""")


def test_a_crash_loses_no_allocation(tmp_path: Path) -> None:
    """SIGKILL while allocating: every address the child reported is in the store it left,
    unless the child had begun to release it. The child runs on until the signal lands, so
    what it did is read from everything it printed, up to its death."""
    (tmp_path / "pools.json").write_text(json.dumps({"p": {"subnet": "10.8.0.0/16"}}))
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    reported: dict[str, str] = {}
    released: set[str] = set()
    for line in proc.stdout:
        first, second = line.split()
        if first == "del":
            released.add(second)
        else:
            reported[first] = second.split("/")[0]
        if len(reported) == 300 and proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()  # then read what it printed before the signal landed
    store = Store(Host(tmp_path))
    stored = {r.container_id: r.ip_address for r in store.snapshot()["p"]}
    assert len(released) >= 300 // 7
    for cid, ip in reported.items():
        if cid in released:
            assert stored.get(cid) in (None, ip), cid
        else:
            assert stored.get(cid) == ip, cid
    assert len(set(stored.values())) == len(stored), "no address twice"
