"""The VfConfig a claim gives nicop's DRA driver: which network a VF joins in the pod.

Inputs are the SR-IOV DRA driver's own (k8snetworkplumbingwg/dra-driver-sriov): the claim
template of demo/single-vf-claim/single-vf.yaml (`ifName: net1`, `netAttachDefName: vf-test1`)
and the fields of pkg/api/virtualfunction/v1alpha1/api.go (`driver`, `addVhostMount`, `ifName`,
`netAttachDefName`, `netAttachDefNamespace`), with the driver's name changed to nicop's."""

from __future__ import annotations

from typing import Any

import pytest

from nicop.api.dra import DRIVER
from nicop.api.dra_config import ConfigError, VfConfig, vf_configs
from nicop.cni.multus import network_data
from nicop.node.dra.devices import device_address, device_name

UPSTREAM_PARAMETERS = {"apiVersion": "sriovnetwork.k8snetworkplumbingwg.io/v1alpha1",
                       "kind": "VfConfig", "ifName": "net1", "netAttachDefName": "vf-test1"}


def allocated(config: list[dict[str, Any]], requests: tuple[str, ...] = ("vf",)) -> dict[str, Any]:
    """A claim as the scheduler leaves it: results per request, the configs copied in."""
    return {"metadata": {"namespace": "vf-test1", "name": "pod0-vf-x7k2p"},
            "status": {"allocation": {"devices": {
                "results": [{"request": r, "driver": DRIVER, "pool": "node-1",
                             "device": f"vf-0000-18-00-{i + 2}"}
                            for i, r in enumerate(requests)],
                "config": config}}}}


def test_upstreams_single_vf_claim_names_the_network_and_interface() -> None:
    claim = allocated([{"source": "FromClaim", "requests": ["vf"],
                        "opaque": {"driver": DRIVER, "parameters": UPSTREAM_PARAMETERS}}])
    [(request, config)] = vf_configs(claim).items()
    assert request == "vf"
    assert config == VfConfig(if_name="net1", network="vf-test1")
    assert config.network_key("vf-test1") == "vf-test1/vf-test1"


def test_the_claims_config_overrides_the_class_field_by_field_and_reaches_sub_requests() -> None:
    """Class config first, claim config after (the allocation's order); a config for `vf`
    applies to the result of sub-request `vf/ib`, and one without requests to every request."""
    claim = allocated([
        {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "VfConfig",
            "netAttachDefName": "default-net", "netAttachDefNamespace": "infra"}}},
        {"source": "FromClaim", "requests": ["vf"], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "VfConfig", "ifName": "rdma0",
            "netAttachDefName": "fast"}}},
        {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {}}},
    ], requests=("vf/ib", "other"))
    assert vf_configs(claim) == {
        "vf/ib": VfConfig(if_name="rdma0", network="fast", network_namespace="infra"),
        "other": VfConfig(network="default-net", network_namespace="infra")}


@pytest.mark.parametrize(("parameters", "named"), [
    ({"apiVersion": "v1", "kind": "VfConfig"}, "apiVersion 'v1'"),
    ({**UPSTREAM_PARAMETERS, "driver": "vfio-pci"}, "driver: nicop keeps VFs"),
    ({**UPSTREAM_PARAMETERS, "addVhostMount": True}, "addVhostMount"),
    ({**UPSTREAM_PARAMETERS, "netAttachDef": "x"}, "unknown field 'netAttachDef'"),
    ({**UPSTREAM_PARAMETERS, "ifName": "a-name-longer-than-15"}, "ifName 'a-name-longer"),
    ("net1", "parameters must be an object"),
])
def test_a_config_nicop_cannot_honour_is_refused_naming_claim_entry_and_field(
        parameters: Any, named: str) -> None:
    """Unknown fields are refused as upstream's strict decoder refuses them; what upstream does
    and nicop does not (rebinding to vfio-pci, vhost-net) is refused rather than ignored."""
    claim = allocated([{"source": "FromClaim",
                        "opaque": {"driver": DRIVER, "parameters": parameters}}])
    with pytest.raises(ConfigError) as err:
        vf_configs(claim)
    assert "claim vf-test1/pod0-vf-x7k2p: config[0] (FromClaim)" in str(err.value)
    assert named in str(err.value)


def test_upstreams_empty_vhost_and_driver_fields_are_accepted() -> None:
    """DefaultVfConfig() writes `driver: ""`: a config serialized from it still reads."""
    claim = allocated([{"opaque": {"driver": DRIVER, "parameters": {
        **UPSTREAM_PARAMETERS, "driver": "", "addVhostMount": False}}}])
    assert vf_configs(claim)["vf"].network == "vf-test1"


def test_device_names_map_back_to_their_pci_address() -> None:
    assert device_address(device_name("vf", "0000:3b:00.2")) == ("vf", "0000:3b:00.2")
    assert device_address("gpu-0") is None


def test_network_data_is_the_pod_interfaces_addresses_in_cidr_form_and_mac() -> None:
    """A CNI result (sriov-cni's shape: host side first, the sandbox interface after)."""
    result = {"interfaces": [{"name": "enp24s0f0v1"},
                             {"name": "net1", "mac": "5e:81:2a:10:00:01", "sandbox": "/run/x"}],
              "ips": [{"address": "10.0.1.2/24", "interface": 1},
                      {"address": "fd00::2/64", "interface": 1},
                      {"address": "10.9.9.9/24", "interface": 0}]}
    assert network_data("net1", result) == {
        "interfaceName": "net1", "ips": ["10.0.1.2/24", "fd00::2/64"],
        "hardwareAddress": "5e:81:2a:10:00:01"}
