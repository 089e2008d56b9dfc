"""The API models: they read every example and upstream CR unchanged, generate structural CRDs,
and find the JSON and removed-field problems the API server cannot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from nicop.api.crdgen import crd_manifest, openapi_schema, render
from nicop.api.kinds import KINDS, NicClusterPolicy, SriovNetwork, parse
from nicop.api.mellanox import MacvlanNetwork, NicNodePolicy
from nicop.api.validate import json_fields, removed_field_warnings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
UPSTREAM_CR = ROOT / "tests" / "data" / "upstream-nicclusterpolicy-with-removed-fields.yaml"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_reads_back_unchanged(path: Path) -> None:
    raw = load(path)
    obj = parse(raw)
    assert obj.model_dump(mode="json", by_alias=True, exclude_unset=True) == raw


def test_every_kind_has_an_example() -> None:
    kinds = {load(path)["kind"] for path in EXAMPLES}
    missing = {m.crd.kind for m in KINDS if not m.crd.install_only_if_absent} - kinds
    assert not missing


def test_upstream_cr_with_removed_fields_reads_back_unchanged() -> None:
    raw = load(UPSTREAM_CR)
    assert parse(raw).model_dump(mode="json", by_alias=True, exclude_unset=True) == raw


def test_removed_fields_are_named_in_warnings() -> None:
    warnings = removed_field_warnings(parse(load(UPSTREAM_CR)))
    fields = sorted(w.split(" ", 1)[0] for w in warnings)
    assert fields == ["spec.nvPeerDriver", "spec.psp", "spec.secondaryNetwork.ipamPlugin"]
    assert all("delete it from the NicClusterPolicy" in w for w in warnings)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_have_no_removed_fields_or_bad_json(path: Path) -> None:
    obj = parse(load(path))
    assert removed_field_warnings(obj) == []
    assert json_fields(obj) == []


def test_json_fields_name_the_field_and_the_problem() -> None:
    policy = NicClusterPolicy.model_validate(
        {
            "spec": {
                "rdmaSharedDevicePlugin": {"image": "rdma", "config": '{"configList": [}'},
                "sriovDevicePlugin": {"image": "sriov", "config": '["resourceList"]'},
                "secondaryNetwork": {"multus": {"image": "multus", "config": ""}},
            }
        }
    )
    assert json_fields(policy) == [
        (
            "spec.rdmaSharedDevicePlugin.config",
            "is not valid JSON: Expecting value (line 1, column 17)",
        ),
        ("spec.sriovDevicePlugin.config", "must be a JSON object ({...}), not list"),
    ]


def test_json_fields_check_chained_meta_plugins() -> None:
    good = MacvlanNetwork.model_validate(
        {"spec": {"metaPlugins": '{"type": "tuning"}, {"type": "sbr"}'}}
    )
    assert json_fields(good) == []
    missing_comma = MacvlanNetwork.model_validate(
        {"spec": {"metaPlugins": '{"type": "tuning"} {"type": "sbr"}'}}
    )
    assert json_fields(missing_comma) == [
        ("spec.metaPlugins", "is not valid JSON: Expecting ',' delimiter (line 1, column 20)")
    ]
    not_objects = SriovNetwork.model_validate(
        {"spec": {"resourceName": "vf", "metaPlugins": '"tuning"', "ipam": "{}"}}
    )
    assert json_fields(not_objects) == [
        ("spec.metaPlugins", "must be JSON objects separated by commas, like {...}, {...}")
    ]


def test_models_built_in_code_carry_upstream_defaults() -> None:
    policy = NicNodePolicy.model_validate(
        {
            "metadata": {"name": "pool-a"},
            "spec": {"ofedDriver": {"image": "doca-driver", "upgradePolicy": {"drain": {}}}},
        }
    )
    ofed = policy.to_dict()["spec"]["ofedDriver"]
    assert policy.to_dict()["apiVersion"] == "mellanox.com/v1alpha1"
    assert ofed["terminationGracePeriodSeconds"] == 300
    assert ofed["imagePullSecrets"] == []
    assert ofed["upgradePolicy"] == {
        "autoUpgrade": False,
        "maxParallelUpgrades": 1,
        "safeLoad": False,
        "drain": {"enable": True, "force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
    }


def _walk(node: Any, path: str = "") -> Any:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


@pytest.mark.parametrize("model", KINDS, ids=lambda m: m.crd.kind)
def test_generated_schema_is_structural(model: Any) -> None:
    schema = openapi_schema(model)
    for path, node in _walk(schema):
        if path.endswith(("/properties", "/default")) or "x-kubernetes-validations" in path:
            continue
        assert "$ref" not in node and "title" not in node, path
        assert "anyOf" not in node or node.get("x-kubernetes-int-or-string"), path
        assert node.get("type") or node.get("x-kubernetes-int-or-string"), path
        if node.get("type") == "object" and "properties" not in node:
            assert "additionalProperties" in node or node.get(
                "x-kubernetes-preserve-unknown-fields"
            ) or path.endswith("/metadata") or path.endswith("/status"), path


def test_generation_is_deterministic() -> None:
    assert [render(m) for m in KINDS] == [render(m) for m in KINDS]


def test_policy_crds_have_short_names_and_status_columns() -> None:
    for model, short in ((NicClusterPolicy, ["ncp"]), (NicNodePolicy, ["nicnode", "nnp"])):
        spec = crd_manifest(model)["spec"]
        assert spec["scope"] == "Cluster"
        assert spec["names"]["shortNames"] == short
        version = spec["versions"][0]
        assert version["subresources"] == {"status": {}}
        columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
        assert columns == {"Status": ".status.state", "Age": ".metadata.creationTimestamp"}


def test_removed_fields_keep_whatever_old_crs_hold() -> None:
    spec = openapi_schema(NicClusterPolicy)["properties"]["spec"]["properties"]
    ipam_plugin = spec["secondaryNetwork"]["properties"]["ipamPlugin"]
    for field in (spec["psp"], spec["nvPeerDriver"], ipam_plugin):
        assert field["x-kubernetes-preserve-unknown-fields"] is True
        assert field["description"].startswith("Deprecated: removed upstream")


def test_node_state_status_keeps_upstreams_odd_key_names() -> None:
    status = {
        "syncStatus": "Succeeded",
        "interfaces": [
            {
                "name": "ens1f0", "pciAddress": "0000:3b:00.0", "vendor": "15b3",
                "deviceID": "101d", "totalvfs": 8, "numVfs": 1, "linkType": "ETH",
                "Vfs": [{"pciAddress": "0000:3b:00.2", "vfID": 0, "Vlan": 100}],
            }
        ],
    }
    state = parse({
        "apiVersion": "sriovnetwork.openshift.io/v1", "kind": "SriovNetworkNodeState",
        "metadata": {"name": "worker-1"}, "status": status,
    })
    assert state.to_dict()["status"] == status
