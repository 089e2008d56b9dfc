"""nicop's multus calling its default network as a runtime does, without an API server (so no
pod networks): a config list's plugins in order with `prevResult`, DEL in reverse from what ADD
recorded, CHECK, STATUS and GC passed on, runtime values only to the capabilities a plugin
declares, and a failed delegate undone. The delegates are the recording fake of
tests/fake_cni.py; MultusPlugin.run() is the in-process entry a node stand-in uses."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.fake_cni import calls, install_fake

from nicop.cni.multus import CACHE_DIR, MultusPlugin
from nicop.cni.spec import CniError
from nicop.node.host import Host

DEFAULT = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [
    {"type": "fakebridge", "address": "10.244.1.5/24", "capabilities": {"portMappings": True}},
    {"type": "faketuning", "addDns": True},
]}
PORTS = [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]


def multus_conf(default: dict[str, Any] | None = None, version: str = "1.0.0") -> dict[str, Any]:
    return {"cniVersion": version, "name": "multus-cni-network", "type": "multus",
            "capabilities": {"portMappings": True}, "runtimeConfig": {"portMappings": PORTS},
            "delegates": [default or DEFAULT]}


class Node:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "calls.jsonl"
        install_fake(root / "opt/cni/bin", sys.executable, "fakebridge", "faketuning")
        self.multus = MultusPlugin(None, Host(root), extra_env={"FAKE_CNI_LOG": str(self.log)})

    def call(self, command: str, config: dict[str, Any], container: str = "c1",
             ifname: str = "eth0") -> Any:
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container,
               "CNI_NETNS": "/var/run/netns/p1", "CNI_IFNAME": ifname, "CNI_PATH": "/opt/cni/bin",
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1;"
                           "K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u1"}
        return self.multus.run(env, config)

    def calls(self) -> list[dict[str, Any]]:
        out = calls(self.log)
        self.log.unlink(missing_ok=True)
        return out

    def cache(self, container: str = "c1") -> Path:
        return self.root / CACHE_DIR.lstrip("/") / container


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="multus-", dir="/tmp"))
    yield Node(root)
    shutil.rmtree(root)


def test_add_runs_the_list_in_order_and_answers_in_the_runtimes_version(node: Node) -> None:
    result = node.call("ADD", multus_conf(version="0.3.1"))
    assert result == {"cniVersion": "0.3.1",
                      "interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01",
                                      "sandbox": "/var/run/netns/p1"}],
                      "ips": [{"version": "4", "interface": 0, "address": "10.244.1.5/24"}],
                      "dns": {"nameservers": ["10.0.0.53"]}}
    bridge, tuning = node.calls()
    assert [bridge["plugin"], tuning["plugin"]] == ["fakebridge", "faketuning"]
    assert bridge["config"] == {"type": "fakebridge", "address": "10.244.1.5/24",
                                "capabilities": {"portMappings": True}, "name": "cbr0",
                                "cniVersion": "1.0.0", "runtimeConfig": {"portMappings": PORTS}}
    assert "runtimeConfig" not in tuning["config"]  # it declares no capability
    assert tuning["config"]["prevResult"]["ips"] == [{"address": "10.244.1.5/24",
                                                      "interface": 0}]
    assert bridge["args"] == ("IgnoreUnknown=true;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p1;"
                              "K8S_POD_INFRA_CONTAINER_ID=c1;K8S_POD_UID=u1")
    assert bridge["ifname"] == "eth0" and bridge["netns"] == "/var/run/netns/p1"
    assert bridge["path"] == str(node.root / "opt/cni/bin")
    assert json.loads(node.cache().read_text())["delegates"][0]["network"] == "cbr0"


def test_del_undoes_add_last_first_and_forgets_the_container(node: Node) -> None:
    node.call("ADD", multus_conf())
    node.calls()
    assert node.call("DEL", multus_conf()) is None
    tuning, bridge = node.calls()
    assert [tuning["plugin"], bridge["plugin"]] == ["faketuning", "fakebridge"]
    assert tuning["command"] == bridge["command"] == "DEL"
    assert bridge["config"]["prevResult"]["dns"] == {"nameservers": ["10.0.0.53"]}
    assert not node.cache().exists()
    # Again, with nothing recorded: the default network's DEL (which must succeed).
    node.call("DEL", multus_conf())
    assert [c["plugin"] for c in node.calls()] == ["faketuning", "fakebridge"]


def test_check_status_and_gc_reach_the_default_network(node: Node) -> None:
    with pytest.raises(CniError) as e:
        node.call("CHECK", multus_conf())
    assert e.value.code == 3 and "no networks recorded for container c1" in e.value.msg
    node.call("ADD", multus_conf())
    node.calls()
    node.call("CHECK", multus_conf())
    checks = node.calls()
    assert [(c["plugin"], c["command"]) for c in checks] == [
        ("fakebridge", "CHECK"), ("faketuning", "CHECK")]
    assert all(c["config"]["prevResult"]["ips"] for c in checks)
    # STATUS and GC exist from 1.1.0 on: a 1.0.0 default network is not asked.
    node.call("STATUS", multus_conf(version="1.1.0"))
    assert node.calls() == []
    newer = {**DEFAULT, "cniVersion": "1.1.0"}
    node.call("STATUS", multus_conf(newer, version="1.1.0"))
    assert [(c["plugin"], c["command"]) for c in node.calls()] == [
        ("fakebridge", "STATUS"), ("faketuning", "STATUS")]
    gc = {**multus_conf(newer, version="1.1.0"),
          "cni.dev/valid-attachments": [{"containerID": "c1", "ifname": "eth0"}]}
    node.call("GC", gc)
    assert [c["config"]["cni.dev/valid-attachments"] for c in node.calls()] == [
        [{"containerID": "c1", "ifname": "eth0"}]] * 2


def test_a_failing_delegate_is_undone_and_named(node: Node) -> None:
    failing = {**DEFAULT, "plugins": [DEFAULT["plugins"][0],
                                      {"type": "faketuning", "fail": {"ADD": "no such bridge"}}]}
    with pytest.raises(CniError) as e:
        node.call("ADD", multus_conf(failing))
    assert e.value.code == 7
    assert e.value.msg == ('[default/p1/u1:cbr0]: error adding container to network "cbr0": '
                           "no such bridge")
    assert e.value.details == "from the fake plugin"
    assert [(c["plugin"], c["command"]) for c in node.calls()] == [
        ("fakebridge", "ADD"), ("faketuning", "ADD"),
        ("faketuning", "DEL"), ("fakebridge", "DEL")]
    assert not node.cache().exists()


def test_a_delegate_that_is_not_installed(node: Node) -> None:
    with pytest.raises(CniError, match="failed to find plugin 'macvlan'"):
        node.call("ADD", multus_conf({"cniVersion": "1.0.0", "name": "n", "type": "macvlan"}))
    with pytest.raises(CniError, match=r"invalid plugin type '\.\./fakebridge'"):
        node.call("ADD", multus_conf({"cniVersion": "1.0.0", "name": "n",
                                      "type": "../fakebridge"}))


def test_a_config_without_delegates_is_refused(node: Node) -> None:
    with pytest.raises(CniError, match="at least one delegate"):
        node.call("ADD", {"cniVersion": "1.0.0", "name": "m", "type": "multus"})
    with pytest.raises(CniError, match="clusterNetwork: not supported"):
        node.call("ADD", {"cniVersion": "1.0.0", "name": "m", "type": "multus",
                          "clusterNetwork": "flannel"})
