"""Paths as a container sees them, mapped to where its mounts really are ($NICOP_MOUNTS)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nicop.api.networks_annotation import Selection
from nicop.node.host import MOUNTS_ENV, Host, Mounts
from nicop.node.readiness import Readiness, probe
from nicop_sim.network import selections
from nicop_sim.pods import expand


def test_the_longest_mount_wins_and_the_root_takes_the_rest() -> None:
    mounts = Mounts({"/": "/c/rootfs", "/sys": "/n/sys", "/dev": "/n/dev",
                     "/dev/termination-log": "/c/msg", "/host/": "/n"})
    assert mounts.real("/sys/bus/pci") == "/n/sys/bus/pci"
    assert mounts.real("/dev/termination-log") == "/c/msg"
    assert mounts.real("/dev/infiniband/uverbs0") == "/n/dev/infiniband/uverbs0"
    assert mounts.real("/host/etc/udev") == "/n/etc/udev"
    assert mounts.real("/hostname") == "/c/rootfs/hostname"  # a prefix of a name is no mount
    assert mounts.real("/etc/pcidp/config.json") == "/c/rootfs/etc/pcidp/config.json"
    assert Mounts().real("/sys") == "/sys"


def test_a_host_rooted_in_a_mount_reads_through_it(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "node/sys/class/net/eth0").mkdir(parents=True)
    (tmp_path / "node/sys/class/net/eth0/mtu").write_text("9000\n")
    monkeypatch.setenv(MOUNTS_ENV, json.dumps({"/": str(tmp_path / "rootfs"),
                                               "/host": str(tmp_path / "node")}))
    host = Host.in_container("/host")
    assert host.read("/sys/class/net/eth0/mtu") == "9000"
    assert host.listdir("/sys/class/net") == ["eth0"]
    assert host.path("/sys") == tmp_path / "node/sys"


def test_readiness_file_follows_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NICOP_READY_FILE", raising=False)
    assert probe()[0] is False  # no file named: the probe cannot say ready
    monkeypatch.setenv(MOUNTS_ENV, json.dumps({"/": str(tmp_path)}))
    monkeypatch.setenv("NICOP_READY_FILE", "/run/nicop-agent/ready")
    ready = Readiness()
    ready.set(True)
    assert (tmp_path / "run/nicop-agent/ready").exists() and probe() == (True, "ready")
    ready.set(False, "kubelet gone")
    assert probe()[0] is False


def test_kubelet_variable_expansion() -> None:
    env = {"NODE_NAME": "node-2"}
    assert expand("--config-file=/etc/pcidp/$(NODE_NAME)", env) == "--config-file=/etc/pcidp/node-2"
    assert expand("$(MISSING) and $$(NODE_NAME)", env) == "$(MISSING) and $(NODE_NAME)"


def test_network_selections_in_both_annotation_forms() -> None:
    def pod(value: str) -> dict[str, object]:
        return {"metadata": {"namespace": "team", "annotations": {
            "k8s.v1.cni.cncf.io/networks": value}}}

    assert selections(pod("roce, other/ib@ib0")) == [
        Selection("roce", "team"), Selection("ib", "other", interface="ib0")]
    assert selections(pod('[{"name": "roce", "interface": "net5"}]')) == [
        Selection("roce", "team", interface="net5")]
