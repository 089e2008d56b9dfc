"""nv-ipam's node store on upstream's own cases: the file /var/lib/cni/nv-ipam/store, what it
holds, what loads and what is refused, and that the reservations of concurrent calls never clash.

Every case names the upstream test it comes from in Mellanox/nvidia-k8s-ipam. nicop's store has
no sessions a caller opens and closes (a change is a `with store.transaction()` block), so
pkg/ipam-node/store/store_test.go "Closed session should panic" has no counterpart.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from nicop.cni.ipam import Ipam
from nicop.cni.pools import FilePools
from nicop.cni.spec import parse_request
from nicop.cni.store import Reservation, ReservationError, Store, StoreError
from nicop.node.host import Host

UUID = "a9516e9d-6f45-4693-b299-cc3d2f83e26a"

# The file nv-ipam writes for createTestReservation() of store_test.go (its create_time fixed),
# made by nv-ipam's own types with Go's encoding/json and hash/fnv.
NV_IPAM_FILE = (
    '{"version":1,"checksum":1367415889,"pools":{"pool1":{"name":"pool1","entries":{"id1_net0":'
    '{"container_id":"id1","interface_name":"net0","ip_address":"192.168.1.100","metadata":'
    '{"create_time":"2024-05-01T10:00:00.123456789Z","pod_uuid":"' + UUID + '",'
    '"pod_name":"testPod","pod_namespace":"testNamespace","device_id":"0000:d8:00.1",'
    '"pool_config_snapshot":"something"}}},"last_pool_config":"something",'
    '"last_reserved_ip":"192.168.1.100"}}}')


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(Host(tmp_path))
    yield s
    s.close()


def reservation(cid: str = "id1", ip: str = "192.168.1.100") -> Reservation:
    """createTestReservation() of store_test.go."""
    return Reservation(cid, "net0", ip, pod_name="testPod", pod_namespace="testNamespace",
                       pod_uuid=UUID, device_id="0000:d8:00.1", pool_config_snapshot="something")


def test_basic(store: Store) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It "Basic
    testing": a reservation is found by container and interface, listed in its pool, moves the
    pool's last reserved address, and is gone once released."""
    store.reserve("pool1", reservation(), "something")
    res = store.get("pool1", "id1", "net0")
    assert res is not None and res.container_id == "id1"
    assert [r.container_id for r in store.snapshot()["pool1"]] == ["id1"]
    assert list(store.snapshot()) == ["pool1"]
    assert store.last_reserved("pool1") == "192.168.1.100"
    assert store.release("pool1", "id1", "net0") is not None
    assert store.get("pool1", "id1", "net0") is None
    assert store.last_reserved("pool1") == "192.168.1.100", "releasing keeps the pointer"


def test_a_change_is_on_disk_when_it_returns(store: Store, tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", Its "Commit
    should persist data" and "Reload data from the disk": another daemon on the node (after
    this one stopped) finds the reservation."""
    store.reserve("pool1", reservation())
    store.close()
    again = Store(Host(tmp_path))
    try:
        res = again.get("pool1", "id1", "net0")
        assert res is not None and (res.ip_address, res.pod_uuid) == ("192.168.1.100", UUID)
    finally:
        again.close()


def test_a_failed_change_is_rolled_back_whole(store: Store, tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It "Cancel
    should rollback changes", and pkg/ipam-node/types/types_test.go, Describe "Types", It
    "Deepcopy" (a session works on a deep copy): nothing of a change that fails stays, neither
    the reservation nor the pool's last reserved address and config, in memory or on disk."""
    store.reserve("pool1", reservation(), "old-config")
    with pytest.raises(RuntimeError), store.transaction():
        store.reserve("pool1", reservation("id2", "192.168.1.200"), "new-config")
        store.release("pool1", "id1", "net0")
        raise RuntimeError("the second pool of the ADD had no address")
    assert {r.container_id for r in store.snapshot()["pool1"]} == {"id1"}
    assert store.last_reserved("pool1") == "192.168.1.100"
    assert store.pools["pool1"].last_pool_config == "old-config"
    store.close()
    again = Store(Host(tmp_path))
    assert again.get("pool1", "id2", "net0") is None and again.get("pool1", "id1", "net0")
    again.close()


def test_invalid_data_on_the_disk(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It "Invalid
    data on the disk": the daemon does not start on it and says how to start afresh."""
    path = tmp_path / "var/lib/cni/nv-ipam/store"
    path.parent.mkdir(parents=True)
    path.write_text("something")
    with pytest.raises(StoreError, match=r"is not valid JSON .*; move it away to start with no "
                                         r"allocations"):
        Store(Host(tmp_path))


def test_an_empty_file_is_an_empty_store(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store.go loadFromDisk: a file without data
    is a store without reservations, not a damaged one."""
    path = tmp_path / "var/lib/cni/nv-ipam/store"
    path.parent.mkdir(parents=True)
    path.write_text("")
    store = Store(Host(tmp_path))
    try:
        assert store.snapshot() == {}
        store.reserve("pool1", reservation())
        assert json.loads(path.read_text())["pools"]["pool1"]["entries"]["id1_net0"]
    finally:
        store.close()


@pytest.mark.parametrize(("case", "checksum"), [
    ("Checksum mismatch", 123455),
    ("checksum not set in store file", 0),
])
def test_a_file_whose_checksum_does_not_match_is_refused(tmp_path: Path, case: str,
                                                          checksum: int) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It
    "Checksum mismatch" (and store.go's "checksum not set in store file")."""
    path = tmp_path / "var/lib/cni/nv-ipam/store"
    path.parent.mkdir(parents=True)
    data = json.loads(NV_IPAM_FILE)
    data["checksum"] = checksum
    path.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="checksum mismatch"):
        Store(Host(tmp_path))


def test_nv_ipams_file_is_read_and_its_addresses_stay_held(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/types/checksum_test.go, Describe "Checksum", It
    "Equal", on a file nv-ipam wrote (store_test.go's reservation): it loads, CHECK finds the
    pod's address, and a new pod of the pool does not get it."""
    path = tmp_path / "var/lib/cni/nv-ipam/store"
    path.parent.mkdir(parents=True)
    path.write_text(NV_IPAM_FILE)
    (tmp_path / "pools.json").write_text(json.dumps({"pool1": {
        "subnet": "192.168.1.0/24", "startIP": "192.168.1.100", "endIP": "192.168.1.101"}}))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    try:
        env = {"CNI_COMMAND": "CHECK", "CNI_CONTAINERID": "id1", "CNI_NETNS": "/x",
               "CNI_IFNAME": "net0", "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": "K8S_POD_NAME=testPod;K8S_POD_NAMESPACE=testNamespace"}
        config = json.dumps({"cniVersion": "1.0.0", "name": "n",
                             "ipam": {"type": "nv-ipam", "poolName": "pool1"}}).encode()
        ipam.is_allocated(parse_request("nv-ipam", env, config))
        env = {**env, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "id2"}
        got = ipam.allocate(parse_request("nv-ipam", env, config))
        assert got["ips"] == [{"address": "192.168.1.101/24"}]
    finally:
        ipam.store.close()


@pytest.mark.parametrize(("pools", "checksum", "loads"), [
    ({}, 1512731210, True),
    ({"foo": {"name": "foo", "entries": {}, "last_pool_config": "", "last_reserved_ip": ""}},
     1512731210, False),
    ({"foo": {"name": "foo", "entries": {}, "last_pool_config": "", "last_reserved_ip": ""}},
     2363555652, True),
])
def test_the_checksum_covers_every_pool(tmp_path: Path, pools: dict[str, object], checksum: int,
                                        loads: bool) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/types/checksum_test.go, Describe "Checksum", Its
    "Equal" and "Diff": an empty store with the checksum nv-ipam computes for it loads; that
    checksum on a store that also holds an empty pool foo is refused, the one nv-ipam computes
    for that store is taken (both figures from Go's encoding/json and hash/fnv)."""
    path = tmp_path / "var/lib/cni/nv-ipam/store"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "checksum": checksum, "pools": pools}))
    if loads:
        store = Store(Host(tmp_path))
        assert store.snapshot() == {name: [] for name in pools}
        store.close()
    else:
        with pytest.raises(StoreError, match="checksum mismatch"):
            Store(Host(tmp_path))


def test_a_second_reservation_for_the_same_interface_is_refused(store: Store) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It "Already
    has allocation": the first one stays."""
    store.reserve("pool1", reservation())
    with pytest.raises(ReservationError, match=r"id1 net0 already holds 192\.168\.1\.100 in "
                                               r"pool pool1"):
        store.reserve("pool1", reservation(ip="192.168.1.200"))
    assert store.reserved("pool1") == {"192.168.1.100"}


def test_an_address_is_reserved_once(store: Store) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It
    "Duplicate IP allocation"."""
    store.reserve("pool1", reservation())
    with pytest.raises(ReservationError, match=r"192\.168\.1\.100 is already reserved in pool "
                                               r"pool1 by id1 net0"):
        store.reserve("pool1", reservation("other"))
    assert [r.container_id for r in store.snapshot()["pool1"]] == ["id1"]


def test_remove_pool(store: Store) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It "Remove
    pool data"."""
    store.reserve("pool1", reservation())
    store.remove_pool("pool1")
    assert store.snapshot() == {} and store.reserved("pool1") == set()
    assert json.loads(store.path.read_text())["pools"] == {}


def test_concurrent_adds_never_share_an_address(tmp_path: Path) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/store/store_test.go, Describe "Store", It
    "Concurrent access" (a session waits for the one before it and sees its reservation):
    8 threads of 25 ADDs each on one pool get 200 different addresses, all in the file."""
    (tmp_path / "pools.json").write_text(json.dumps({"p": {"subnet": "10.9.0.0/24"}}))
    ipam = Ipam(Store(Host(tmp_path)), FilePools(tmp_path / "pools.json"))
    got: dict[str, str] = {}
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        for i in range(25):
            cid = f"w{n}-{i}"
            env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": "/x",
                   "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
                   "CNI_ARGS": f"K8S_POD_NAME={cid};K8S_POD_NAMESPACE=default"}
            config = json.dumps({"cniVersion": "1.0.0", "name": "n",
                                 "ipam": {"type": "nv-ipam", "poolName": "p"}}).encode()
            got[cid] = ipam.allocate(parse_request("nv-ipam", env, config))["ips"][0]["address"]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(got) == 200 and len(set(got.values())) == 200
        entries = json.loads(ipam.store.path.read_text())["pools"]["p"]["entries"]
        assert {k.removesuffix("_net1"): f"{e['ip_address']}/24" for k, e in entries.items()} \
            == got
    finally:
        ipam.store.close()


def test_pre_v010_host_local_state_is_named(tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Mellanox/nvidia-k8s-ipam pkg/ipam-node/migrator/migrator_test.go (removed upstream in
    commit 50daacb, nv-ipam v0.3.6), Describe "Migrator", It "Migrate" input: host-local files
    of nv-ipam v0.0.x under /var/lib/cni/nv-ipam/state/host-local/<pool>/<ip>. Like nv-ipam
    since v0.3.6, nicop does not move them into the store; the daemon's log names them and
    the way out. Its Its "No host-local path" and "Empty host-local store" start silently."""
    legacy = tmp_path / "var/lib/cni/nv-ipam/state/host-local"
    with caplog.at_level(logging.WARNING, logger="nicop.cni.store"):
        Store(Host(tmp_path)).close()
        legacy.mkdir(parents=True)
        Store(Host(tmp_path)).close()
    assert caplog.text == ""
    for pool, ip, owner in (("pool1", "192.168.0.2", "id1\r\nnet1"),
                            ("pool1", "192.168.0.3", "id2\r\nnet1"),
                            ("pool2", "172.16.0.2", "id1\r\nnet2")):
        (legacy / pool).mkdir(exist_ok=True)
        (legacy / pool / ip).write_text(owner)
        (legacy / pool / "lock").write_text("")
        (legacy / pool / "last_reserved_ip.0").write_text(ip)
    with caplog.at_level(logging.WARNING, logger="nicop.cni.store"):
        Store(Host(tmp_path)).close()
    assert (f"{legacy} holds 3 allocations of nv-ipam before v0.1.0 (pool1/192.168.0.2, "
            "pool1/192.168.0.3, pool2/172.16.0.2); nicop does not read them") in caplog.text
    assert "upgrade the node through nv-ipam v0.3.5" in caplog.text
