"""The plugin executables: installed under each plugin's name, tiny, and exact about errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.netns.cni_harness import DaemonThread, validate_error, validate_result

from nicop.cni import shim, spec
from nicop.cni.daemon import DaemonOptions
from nicop.cni.install import PLUGINS, install, install_multus


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="shim-", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def run(binary: Path, command: str, config: dict[str, Any], **env: str) -> tuple[int, Any]:
    call_env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x",
                "CNI_IFNAME": "net1", "CNI_PATH": str(binary.parent),
                "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1;K8S_POD_UID=u1", **env}
    proc = subprocess.run([str(binary)], input=json.dumps(config).encode(), env=call_env,
                          capture_output=True, timeout=30, check=False)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None


def test_install_writes_one_executable_per_plugin_and_the_socket(root: Path) -> None:
    written = install(root / "bin", "/run/nicop/cni.sock", "/usr/bin/python3")
    assert sorted(p.name for p in written) == sorted([*PLUGINS, "nicop-cni.conf"])
    for name in PLUGINS:
        path = root / "bin" / name
        assert os.access(path, os.X_OK)
        assert path.read_text().splitlines()[0] == "#!/usr/bin/python3 -IS"
    assert (root / "bin/nicop-cni.conf").read_text() == "socket=/run/nicop/cni.sock\n"
    assert not list((root / "bin").glob(".*")), "no temporary file left"


def test_the_shim_imports_nothing_heavy(root: Path) -> None:
    install(root / "bin", str(root / "none.sock"), sys.executable)
    proc = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(root / "bin/sriov")],
                          input=b"{}", env={"CNI_COMMAND": "VERSION"}, capture_output=True,
                          check=True)
    imported = {line.split("|")[-1].strip() for line in proc.stderr.decode().splitlines()
                if line.startswith("import time:")}
    assert {"json", "socket", "re", "enum"}.isdisjoint(imported), sorted(imported)


def test_versions_match_the_daemon() -> None:
    assert shim.SUPPORTED == spec.SUPPORTED_VERSIONS


def test_without_the_daemon(root: Path) -> None:
    install(root / "bin", str(root / "none.sock"), sys.executable)
    sriov = root / "bin/sriov"
    rc, out = run(sriov, "VERSION", {"cniVersion": "1.0.0"})
    assert (rc, out) == (0, {"cniVersion": "1.0.0", "supportedVersions": list(
        spec.SUPPORTED_VERSIONS)})
    rc, out = run(sriov, "ADD", {"cniVersion": "1.0.0", "name": "n", "type": "sriov"})
    assert rc == 1
    validate_error(out, "1.0.0")
    assert out["code"] == 11
    assert out["msg"] == "nicop cni-daemon is not running on this node (sriov needs it)"
    assert str(root / "none.sock") in out["details"]
    rc, out = run(sriov, "STATUS", {"cniVersion": "1.1.0", "name": "n", "type": "sriov"})
    assert rc == 1 and out["code"] == 50 and out["cniVersion"] == "1.1.0"


def test_the_socket_from_the_environment_wins(root: Path) -> None:
    install(root / "bin", "/nonexistent.sock", sys.executable)
    rc, out = run(root / "bin/nv-ipam", "ADD", {"cniVersion": "1.0.0"},
                  NICOP_CNI_SOCKET=str(root / "other.sock"))
    assert rc == 1 and str(root / "other.sock") in out["details"]


def test_the_multus_shim_finds_the_multus_daemon(root: Path) -> None:
    """`multus` reads nicop-multus.conf before nicop-cni.conf; the other plugins are not
    affected, and the errors name the daemon each one needs."""
    install(root / "bin", str(root / "cni.sock"), sys.executable)
    written = install_multus(root / "bin", str(root / "multus.sock"), sys.executable)
    assert [p.name for p in written] == ["multus", "nicop-multus.conf"]
    assert (root / "bin/nicop-multus.conf").read_text() == (
        f"socket={root / 'multus.sock'}\ntimeout=300\ndaemon=nicop multus-daemon\n")
    config = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus"}
    rc, out = run(root / "bin/multus", "ADD", config)
    assert rc == 1 and out["code"] == 11
    assert out["msg"] == "nicop multus-daemon is not running on this node (multus needs it)"
    assert str(root / "multus.sock") in out["details"]
    rc, out = run(root / "bin/sriov", "ADD", {**config, "type": "sriov"})
    assert out["msg"] == "nicop cni-daemon is not running on this node (sriov needs it)"
    assert str(root / "cni.sock") in out["details"]
    assert run(root / "bin/multus", "VERSION", config)[0] == 0


def test_nv_ipam_through_the_socket(root: Path) -> None:
    """An IPAM-only plugin needs no namespace: the whole path from shim to store, unprivileged."""
    (root / "pools.json").write_text(json.dumps({
        "v4": {"subnet": "192.168.5.0/24", "startIP": "192.168.5.10", "endIP": "192.168.5.20",
               "gateway": "192.168.5.1", "defaultGateway": True},
        "v6": {"subnet": "fd00:5::/64", "startIP": "fd00:5::10", "endIP": "fd00:5::20"},
    }))
    daemon = DaemonThread(DaemonOptions(host_root=root, socket="/run/cni.sock",
                                        pools_file=root / "pools.json"))
    daemon.start()
    try:
        install(root / "bin", str(root / "run/cni.sock"), sys.executable)
        config = {"cniVersion": "1.1.0", "name": "net", "type": "sriov",
                  "ipam": {"type": "nv-ipam", "poolName": "v4,v6"}}
        rc, out = run(root / "bin/nv-ipam", "ADD", config)
        assert rc == 0, out
        validate_result(out, "1.1.0", ipam_only=True)
        assert out == {"cniVersion": "1.1.0",
                       "ips": [{"address": "192.168.5.10/24", "gateway": "192.168.5.1"},
                               {"address": "fd00:5::10/64"}],
                       "routes": [{"dst": "0.0.0.0/0", "gw": "192.168.5.1"}]}
        assert run(root / "bin/nv-ipam", "CHECK", config) == (0, None)
        assert run(root / "bin/nv-ipam", "STATUS", config) == (0, None)
        assert run(root / "bin/nv-ipam", "DEL", config) == (0, None)
        assert run(root / "bin/nv-ipam", "DEL", config) == (0, None)
        rc, out = run(root / "bin/nv-ipam", "CHECK", config)
        assert rc == 1 and out["msg"] == 'reservation for pool "v4", poolType "ippool" not found'
        rc, out = run(root / "bin/nv-ipam", "STATUS", {**config, "ipam": {
            "type": "nv-ipam", "poolName": "gone"}})
        assert rc == 1 and out["code"] == 50
        assert out["msg"].startswith("plugin not available: ipam.poolName: unknown ippool 'gone'")
    finally:
        daemon.stop()
    assert not (root / "run/cni.sock").exists(), "the socket goes with the daemon"


@pytest.mark.parametrize(("version", "expected"), [
    # containernetworking/cni v1.3.0 pkg/types/040 (which 0.3.0-0.4.0 results use): interfaces
    # without mtu or pciID, ips with "version", routes of the shared types.Route (mtu kept),
    # struct field order, `dns` always written.
    ("0.4.0", {"cniVersion": "0.4.0", "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01",
                                                      "sandbox": "/run/netns/p"}],
               "ips": [{"version": "4", "interface": 0, "address": "10.0.0.2/24",
                        "gateway": "10.0.0.1"}],
               "routes": [{"dst": "10.1.0.0/16", "mtu": 1400}], "dns": {}}),
    # pkg/types/100 (1.0.0 and 1.1.0, one Go type): written through a map, so keys are sorted
    # at every level and an empty dns is left out; mtu, pciID and route mtu are kept.
    ("1.0.0", {"cniVersion": "1.0.0", "interfaces": [{"mac": "02:00:00:00:00:01", "mtu": 9000,
                                                      "name": "net1", "pciID": "0000:3b:00.2",
                                                      "sandbox": "/run/netns/p"}],
               "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
               "routes": [{"dst": "10.1.0.0/16", "mtu": 1400}]}),
    ("1.1.0", {"cniVersion": "1.1.0", "interfaces": [{"mac": "02:00:00:00:00:01", "mtu": 9000,
                                                      "name": "net1", "pciID": "0000:3b:00.2",
                                                      "sandbox": "/run/netns/p"}],
               "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
               "routes": [{"dst": "10.1.0.0/16", "mtu": 1400}]}),
])
def test_results_are_written_for_the_version_asked(version: str, expected: dict[str, Any]) -> None:
    result = {"interfaces": [{"name": "net1", "sandbox": "/run/netns/p", "mac": "02:00:00:00:00:01",
                              "mtu": 9000, "pciID": "0000:3b:00.2"}],
              "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
              "routes": [{"dst": "10.1.0.0/16", "mtu": 1400}], "dns": {}}
    rendered = spec.render_result(result, version)
    assert json.dumps(rendered) == json.dumps(expected), "same keys in the same order"
    if version != "0.4.0":
        validate_result(rendered, version)


def test_the_shim_looks_for_the_daemon_where_the_daemon_listens_by_default() -> None:
    """The shim keeps its own copy of the socket path (it imports nothing of nicop, to start
    fast for every pod); it must be the daemon's and the operator's."""
    from nicop.api.agents import CNI_SOCKET
    from nicop.cni.daemon import DEFAULT_SOCKET

    assert shim.DEFAULT_SOCKET == DEFAULT_SOCKET == CNI_SOCKET
