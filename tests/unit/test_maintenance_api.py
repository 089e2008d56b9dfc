"""The maintenance operator's kinds (maintenance.nvidia.com/v1alpha1): the generated CRDs carry
upstream's names, scope, columns, defaults and rules (Mellanox/maintenance-operator
api/v1alpha1/nodemaintenance_types.go and maintenanceoperatorconfig_types.go), and upstream's own
example NodeMaintenance reads into the model."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from nicop.api import maintenance as m
from nicop.api.crdgen import crd_manifest, openapi_schema
from nicop.api.kinds import KINDS, parse
from nicop.api.maintenance import MaintenanceOperatorConfig, NodeMaintenance
from nicop.kube.resources import MAINTENANCE_CONFIG, NODE_MAINTENANCE


def spec_schema(model: Any) -> dict[str, Any]:
    props: dict[str, Any] = openapi_schema(model)["properties"]["spec"]["properties"]
    return props


def test_crds_have_upstreams_names_scope_and_status_subresource() -> None:
    for model, resource in ((NodeMaintenance, NODE_MAINTENANCE),
                            (MaintenanceOperatorConfig, MAINTENANCE_CONFIG)):
        spec = crd_manifest(model)["spec"]
        assert spec["group"] == "maintenance.nvidia.com" == resource.group
        assert spec["names"]["plural"] == resource.plural
        assert spec["names"]["kind"] == resource.kind
        assert spec["scope"] == "Namespaced"
        [version] = spec["versions"]
        assert version["name"] == "v1alpha1" == resource.version
        assert version["subresources"] == {"status": {}}
    assert crd_manifest(NodeMaintenance)["metadata"]["name"] == \
        "nodemaintenances.maintenance.nvidia.com"
    assert crd_manifest(MaintenanceOperatorConfig)["metadata"]["name"] == \
        "maintenanceoperatorconfigs.maintenance.nvidia.com"


def test_kinds_are_installed_after_the_ipam_pools() -> None:
    names = [model.crd.kind for model in KINDS]
    assert names.index("NodeMaintenance") == names.index("CIDRPool") + 1
    assert names.index("MaintenanceOperatorConfig") == names.index("NodeMaintenance") + 1


def test_node_maintenance_columns_are_upstreams() -> None:
    [version] = crd_manifest(NodeMaintenance)["spec"]["versions"]
    columns = [(c["name"], c["type"], c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("Node", "string", ".spec.nodeName"),
        ("Requestor", "string", ".spec.requestorID"),
        ("Ready", "string", ".status.conditions[?(@.type=='Ready')].status"),
        ("Phase", "string", ".status.conditions[?(@.type=='Ready')].reason"),
    ]


def test_node_maintenance_schema_has_upstreams_defaults_and_rules() -> None:
    schema = openapi_schema(NodeMaintenance)
    spec = spec_schema(NodeMaintenance)
    assert schema["properties"]["spec"]["required"] == ["nodeName", "requestorID"]
    assert spec["cordon"]["default"] is True
    wait = spec["waitForPodCompletion"]["properties"]
    assert (wait["timeoutSeconds"]["default"], wait["timeoutSeconds"]["minimum"]) == (0, 0)
    assert wait["timeoutSeconds"]["format"] == "int32"
    drain = spec["drainSpec"]["properties"]
    assert drain["timeoutSeconds"]["default"] == 300
    assert drain["timeoutSeconds"]["minimum"] == 0
    assert drain["force"]["default"] is False
    assert drain["deleteEmptyDir"]["default"] is False
    [filter_field] = drain["podEvictionFilters"]["items"]["properties"].items()
    assert filter_field[0] == "byResourceNameRegex" and filter_field[1]["type"] == "string"

    requestor = spec["requestorID"]
    assert requestor["pattern"] == (
        r"^([a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?(\.[a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?)*)$"
    )
    assert (requestor["minLength"], requestor["maxLength"]) == (2, 63)
    immutable = [{"rule": "self == oldSelf", "message": "Value is immutable"}]
    assert requestor["x-kubernetes-validations"] == immutable
    assert spec["nodeName"]["x-kubernetes-validations"] == immutable
    assert spec["additionalRequestors"]["x-kubernetes-list-type"] == "set"


def test_node_maintenance_status_schema() -> None:
    status = openapi_schema(NodeMaintenance)["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert status["waitForCompletion"]["items"] == {"type": "string"}
    drain = status["drain"]
    assert drain["required"] == ["drainProgress", "evictionPods", "totalPods"]
    for field in ("totalPods", "evictionPods", "drainProgress"):
        assert drain["properties"][field]["minimum"] == 0
        assert drain["properties"][field]["format"] == "int32"
    assert drain["properties"]["waitForEviction"]["items"] == {"type": "string"}


def test_operator_config_schema_has_upstreams_defaults() -> None:
    spec = spec_schema(MaintenanceOperatorConfig)
    assert "required" not in openapi_schema(MaintenanceOperatorConfig)
    parallel = spec["maxParallelOperations"]
    assert parallel["default"] == 1
    assert parallel["x-kubernetes-int-or-string"] is True
    unavailable = spec["maxUnavailable"]
    assert "default" not in unavailable
    assert unavailable["x-kubernetes-int-or-string"] is True
    assert spec["logLevel"]["enum"] == ["debug", "info", "error"]
    assert spec["logLevel"]["default"] == "info"
    assert spec["maxNodeMaintenanceTimeSeconds"]["default"] == 3600
    assert spec["maxNodeMaintenanceTimeSeconds"]["minimum"] == 0
    assert openapi_schema(MaintenanceOperatorConfig)["properties"]["status"]["type"] == "object"
    [version] = crd_manifest(MaintenanceOperatorConfig)["spec"]["versions"]
    assert "additionalPrinterColumns" not in version


# Mellanox/maintenance-operator README.md, "NodeMaintenance" example, as written there.
README_NODE_MAINTENANCE: dict[str, Any] = {
    "apiVersion": "maintenance.nvidia.com/v1alpha1",
    "kind": "NodeMaintenance",
    "metadata": {"name": "my-maintenance-operation", "namespace": "default"},
    "spec": {
        "requestorID": "some.one.acme.com",
        "nodeName": "wokrer-01",
        "cordon": True,
        "waitForPodCompletion": {"podSelector": "app=important", "timeoutSeconds": 0},
        "drainSpec": {
            "force": True,
            "podSelector": "",
            "timeoutSeconds": 0,
            "deleteEmptyDir": True,
            "podEvictionFilters": [
                {"byResourceNameRegex": "nvidia.com/gpu-*"},
                {"byResourceNameRegex": "nvidia.com/rdma*"},
            ],
        },
    },
}


def test_readme_example_reads_into_the_model_unchanged() -> None:
    """The NodeMaintenance of Mellanox/maintenance-operator's README.md ("my-maintenance-operation":
    cordon, wait for `app=important` pods, force-drain only pods using nvidia.com/gpu-* or
    nvidia.com/rdma* resources) parses and dumps back as written."""
    nm = parse(README_NODE_MAINTENANCE)
    assert isinstance(nm, NodeMaintenance)
    assert nm.spec.requestor_id == "some.one.acme.com"
    assert nm.spec.node_name == "wokrer-01"
    assert nm.spec.wait_for_pod_completion is not None
    assert nm.spec.wait_for_pod_completion.timeout_seconds == 0
    assert nm.spec.drain_spec is not None
    assert nm.spec.drain_spec.force and nm.spec.drain_spec.delete_empty_dir
    assert [f.by_resource_name_regex for f in nm.spec.drain_spec.pod_eviction_filters or []] == [
        "nvidia.com/gpu-*", "nvidia.com/rdma*"
    ]
    assert nm.model_dump(mode="json", by_alias=True, exclude_unset=True) == README_NODE_MAINTENANCE
    assert re.fullmatch(m.REQUESTOR_ID, nm.spec.requestor_id)


def test_models_built_in_code_carry_upstreams_defaults() -> None:
    nm = NodeMaintenance.model_validate({
        "metadata": {"name": "nvidia-operator-worker-1"},
        "spec": {"requestorID": "nvidia.doca-driver-upgrade", "nodeName": "worker-1",
                 "waitForPodCompletion": {}, "drainSpec": {}},
    })
    assert nm.to_dict()["apiVersion"] == "maintenance.nvidia.com/v1alpha1"
    assert nm.to_dict()["spec"] == {
        "requestorID": "nvidia.doca-driver-upgrade",
        "nodeName": "worker-1",
        "cordon": True,
        "waitForPodCompletion": {"timeoutSeconds": 0},
        "drainSpec": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
    }
    config = MaintenanceOperatorConfig.model_validate({"metadata": {"name": m.CONFIG_NAME}})
    assert config.to_dict()["spec"] == {
        "maxParallelOperations": 1, "logLevel": "info", "maxNodeMaintenanceTimeSeconds": 3600,
    }
    assert parse({"apiVersion": "maintenance.nvidia.com/v1alpha1",
                  "kind": "MaintenanceOperatorConfig", "metadata": {"name": "default"},
                  "spec": {"maxUnavailable": "10%"}}).to_dict()["spec"]["maxUnavailable"] == "10%"


def test_status_as_the_operator_writes_it_reads_back() -> None:
    status = {
        "conditions": [{"type": "Ready", "status": "False", "reason": "Draining",
                        "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}],
        "waitForCompletion": ["default/rdma-job-0"],
        "drain": {"totalPods": 10, "evictionPods": 4, "drainProgress": 50,
                  "waitForEviction": ["default/a", "default/b"]},
    }
    nm = parse({**README_NODE_MAINTENANCE, "status": status})
    assert nm.to_dict()["status"] == status


@pytest.mark.parametrize("requestor", ["a", "-starts-with-dash", "ends.with.", "has space",
                                       "x" * 64])
def test_the_model_refuses_what_the_crd_refuses(requestor: str) -> None:
    with pytest.raises(ValidationError):
        NodeMaintenance.model_validate(
            {"spec": {"requestorID": requestor, "nodeName": "worker-1"}})


def test_constants_are_upstreams() -> None:
    assert (m.GROUP, m.VERSION) == ("maintenance.nvidia.com", "v1alpha1")
    assert m.FINALIZER == "maintenance.nvidia.com/finalizer"
    assert m.CONDITION_READY == "Ready"
    assert m.CONDITION_REQUESTOR_FAILED == "RequestorFailed"
    assert [m.PENDING, m.SCHEDULED, m.CORDON, m.WAIT_FOR_POD_COMPLETION, m.DRAINING, m.READY,
            m.REQUESTOR_FAILED] == ["Pending", "Scheduled", "Cordon", "WaitForPodCompletion",
                                    "Draining", "Ready", "RequestorFailed"]
    assert m.CONFIG_NAME == "default"
