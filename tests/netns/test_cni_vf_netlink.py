"""The real PF-side implementation reaches the kernel; on a netdev without VFs it says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.netns.cni_harness import Namespaces, prefix

from nicop.cni.netlink import Netns
from nicop.cni.spec import CniError
from nicop.cni.vf import NetlinkVfControl

pytestmark = pytest.mark.netns


@pytest.fixture
def vf_control() -> Iterator[NetlinkVfControl]:
    namespaces = Namespaces()
    try:
        path = namespaces.add(prefix())
        with Netns(path) as ns:
            with ns.ipr() as ipr:
                ipr.link("add", ifname="notapf", kind="veth", peer="peer")
            yield NetlinkVfControl(ns)
    finally:
        namespaces.close()


def test_a_netdev_without_vfs_is_reported_by_name(vf_control: NetlinkVfControl) -> None:
    with pytest.raises(CniError) as e:
        vf_control.get("notapf", 3)
    assert e.value.msg == "notapf reports no VF 3"
    assert "sriov_numvfs" in e.value.details
    with pytest.raises(CniError) as e:
        vf_control.get("missing", 0)
    assert e.value.msg == "PF missing not found on the node"


@pytest.mark.parametrize(("call", "what"), [
    (lambda c: c.set_vlan("notapf", 0, 10, 0, 0x8100), "the VLAN"),
    (lambda c: c.set_mac("notapf", 0, "02:00:00:00:00:01"), "the MAC"),
    (lambda c: c.set_rate("notapf", 0, 0, 100), "the rates"),
    (lambda c: c.set_spoofchk("notapf", 0, False), "spoof checking"),
    (lambda c: c.set_trust("notapf", 0, True), "trust"),
    (lambda c: c.set_link_state("notapf", 0, 2), "the link state"),
    (lambda c: c.set_guid("notapf", 0, "02:00:00:00:00:00:00:01"), "the node GUID"),
])
def test_the_kernels_refusal_names_the_setting(
    vf_control: NetlinkVfControl, call: object, what: str
) -> None:
    with pytest.raises(CniError) as e:
        call(vf_control)  # type: ignore[operator]
    assert e.value.msg == f"setting {what} of VF 0 on notapf: Operation not supported"
