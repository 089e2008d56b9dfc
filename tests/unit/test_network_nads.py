"""The CNI JSON of the NADs nicop generates for each network kind, compared as parsed JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nicop.operator.networks import KINDS, NetworkError, render_nad

ROOT = Path(__file__).resolve().parents[2]


def cr(kind: str, spec: dict[str, Any], name: str = "net") -> dict[str, Any]:
    return {"apiVersion": "mellanox.com/v1alpha1", "kind": kind,
            "metadata": {"name": name, "uid": "u-1"}, "spec": spec}


def config_of(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return json.loads(render_nad(KINDS[kind], cr(kind, spec))["spec"]["config"])  # type: ignore[no-any-return]


def test_macvlan_example() -> None:
    example = yaml.safe_load((ROOT / "examples" / "macvlannetwork.yaml").read_text())
    example["metadata"]["uid"] = "u-1"
    nad = render_nad(KINDS["MacvlanNetwork"], example)
    assert nad["metadata"]["namespace"] == "default"
    assert nad["metadata"]["name"] == "rdma-macvlan"
    assert json.loads(nad["spec"]["config"]) == {
        "cniVersion": "0.3.1", "name": "rdma-macvlan", "type": "macvlan", "master": "ens1f0",
        "mode": "bridge", "mtu": 9000, "ipam": {"type": "nv-ipam", "poolName": "rdma-pool"},
    }
    assert nad["metadata"]["ownerReferences"][0]["kind"] == "MacvlanNetwork"


def test_macvlan_omits_empty_keys_and_defaults_ipam() -> None:
    assert config_of("MacvlanNetwork", {"mtu": 0}) == {
        "cniVersion": "0.3.1", "name": "net", "type": "macvlan", "ipam": {}}


def test_host_device_gets_the_resource_annotation_with_prefix() -> None:
    nad = render_nad(KINDS["HostDeviceNetwork"], cr("HostDeviceNetwork", {
        "resourceName": "cx6dx_vf", "networkNamespace": "team-a",
        "ipam": '{"type": "whereabouts", "range": "192.168.3.0/24"}'}))
    assert nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"] == (
        "nvidia.com/cx6dx_vf")
    assert nad["metadata"]["namespace"] == "team-a"
    assert json.loads(nad["spec"]["config"]) == {
        "cniVersion": "0.3.1", "name": "net", "type": "host-device",
        "ipam": {"type": "whereabouts", "range": "192.168.3.0/24"}}


def test_a_value_the_schema_refuses_names_the_field() -> None:
    """The spec is read as its model: a prefixed resourceName (which the CRD's pattern
    refuses, as upstream's) stored before the schema held it renders no NAD."""
    with pytest.raises(NetworkError, match=r"^spec\.resourceName: String should match"):
        render_nad(KINDS["HostDeviceNetwork"], cr("HostDeviceNetwork", {
            "resourceName": "nvidia.com/cx6dx_vf"}))


def test_ipoib() -> None:
    assert config_of("IPoIBNetwork", {"master": "ibp12s0", "ipam": '{"type": "nv-ipam"}'}) == {
        "cniVersion": "0.3.1", "name": "net", "type": "ipoib", "master": "ibp12s0",
        "ipam": {"type": "nv-ipam"}}


def test_meta_plugins_make_a_conflist() -> None:
    spec = {"master": "ens1f0", "mode": "bridge",
            "metaPlugins": '{"type": "tuning", "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}},'
                           ' {"type": "sbr"}'}
    assert config_of("MacvlanNetwork", spec) == {
        "cniVersion": "0.3.1", "name": "net",
        "plugins": [
            {"type": "macvlan", "master": "ens1f0", "mode": "bridge", "ipam": {}},
            {"type": "tuning", "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}},
            {"type": "sbr"},
        ],
    }


@pytest.mark.parametrize("spec, field", [
    ({"ipam": "{not json"}, "spec.ipam"),
    ({"ipam": "[1, 2]"}, "spec.ipam"),
    ({"metaPlugins": "{\"type\": \"sbr\""}, "spec.metaPlugins"),
    ({"metaPlugins": "1, 2"}, "spec.metaPlugins"),
])
def test_bad_json_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(NetworkError, match=field.replace(".", r"\.")):
        render_nad(KINDS["MacvlanNetwork"], cr("MacvlanNetwork", spec))
