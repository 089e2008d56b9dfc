"""The CRDs in the real API server: every example is accepted and read back with upstream's
defaults, invalid objects are rejected with a message naming the field, and a CR written for
the upstream operator, removed fields included, is accepted."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from tests.unit.test_ipam_upstream_api import CIDRPOOL_CASES, CIDRPOOL_TABLES, IPPOOL_CASES
from typer.testing import CliRunner

from nicop.api.common import KubeObject
from nicop.api.kinds import KINDS, kind_for, parse
from nicop.api.validate import json_fields, removed_field_warnings
from nicop.cli import app
from nicop.operator.crds import install_crds

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
UPSTREAM_CR = ROOT / "tests" / "data" / "upstream-nicclusterpolicy-with-removed-fields.yaml"

Create = Callable[[dict[str, Any]], dict[str, Any]]


def lightkube_resource(model: type[KubeObject]) -> Any:
    """The lightkube resource class of a kind, for the client's create and replace."""
    info = model.crd
    make = create_namespaced_resource if info.namespaced else create_global_resource
    return make(info.group, info.version, info.kind, info.plural)


@pytest.fixture
def create(client: Client, crds: list[str], namespace: str) -> Iterator[Create]:
    """Create an object (namespaced kinds go into the test's namespace) and return it as the
    API server stored it; cluster-scoped objects are deleted after the test."""
    created: list[tuple[Any, str]] = []

    def _create(obj: dict[str, Any]) -> dict[str, Any]:
        model = kind_for(obj["apiVersion"], obj["kind"])
        obj = copy.deepcopy(obj)
        if model.crd.namespaced:
            obj["metadata"]["namespace"] = namespace
        resource = lightkube_resource(model)
        result = client.create(resource(obj))
        if not model.crd.namespaced:
            created.append((resource, obj["metadata"]["name"]))
        return dict(result)

    yield _create
    for resource, name in created:
        client.delete(resource, name)


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return data


def get(obj: Any, path: str) -> Any:
    for key in path.split("."):
        obj = obj[key]
    return obj


def assert_contains(stored: Any, sent: Any, path: str = "") -> None:
    """Everything that was sent is stored: the schema pruned nothing."""
    if isinstance(sent, dict):
        for key, value in sent.items():
            assert key in stored, f"{path}.{key} was pruned"
            assert_contains(stored[key], value, f"{path}.{key}")
    elif isinstance(sent, list):
        assert len(stored) == len(sent), path
        for i, (a, b) in enumerate(zip(stored, sent, strict=True)):
            assert_contains(a, b, f"{path}[{i}]")
    else:
        assert stored == sent, path


def test_every_crd_is_established(client: Client, crds: list[str]) -> None:
    assert sorted(crds) == sorted(m.crd.name for m in KINDS)
    for name in crds:
        status = client.get(CustomResourceDefinition, name).status
        assert status is not None and status.conditions
        assert {c.type: c.status for c in status.conditions}["Established"] == "True"


def test_installing_again_changes_nothing(client: Client, kubeconfig: Path,
                                         crds: list[str]) -> None:
    before = {n: client.get(CustomResourceDefinition, n).metadata.generation for n in crds}
    install_crds(kubeconfig)
    after = {n: client.get(CustomResourceDefinition, n).metadata.generation for n in crds}
    assert after == before


def test_cli_install_reports_each_crd(kubeconfig: Path, crds: list[str]) -> None:
    result = CliRunner().invoke(app, ["crds", "install", "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 0, result.output
    for model in KINDS:
        if model.crd.install_only_if_absent:
            assert f"{model.crd.name}: already installed, left as it is" in result.output
        else:
            assert f"{model.crd.name}: established" in result.output
    assert f"{len(KINDS) - 1} CRDs installed and established." in result.output


def test_cli_install_names_an_unreachable_cluster(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "gone",
        "clusters": [{"name": "gone", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }))
    result = CliRunner().invoke(app, ["crds", "install", "--kubeconfig", str(config)])
    assert result.exit_code == 1
    assert "cannot reach the API server https://127.0.0.1:1" in result.output


# Defaults upstream's schema (and, for SR-IOV policies, its mutating webhook) fills in.
UPSTREAM_DEFAULTS: dict[str, dict[str, Any]] = {
    "nicclusterpolicy-infiniband.yaml": {
        "spec.ofedDriver.terminationGracePeriodSeconds": 300,
        "spec.ofedDriver.forcePrecompiled": False,
        "spec.ofedDriver.imagePullSecrets": [],
        "spec.ofedDriver.upgradePolicy.drain.force": False,
        "spec.ofedDriver.upgradePolicy.drain.timeoutSeconds": 300,
        "spec.ibKubernetes.periodicUpdateSeconds": 5,
        "spec.rdmaSharedDevicePlugin.imagePullSecrets": [],
        "spec.secondaryNetwork.multus.imagePullSecrets": [],
    },
    "nicclusterpolicy-roce-sriov.yaml": {
        "spec.sriovDevicePlugin.imagePullSecrets": [],
        "spec.nvIpam.imagePullSecrets": [],
        "spec.nicConfigurationOperator.logLevel": "info",
        "spec.nicConfigurationOperator.nicFirmwareStorage.create": True,
        "spec.nicConfigurationOperator.nicFirmwareStorage.pvcName": "nic-fw-storage-pvc",
        "spec.nicConfigurationOperator.nicFirmwareStorage.availableStorageSize": "1Gi",
    },
    "nicnodepolicy.yaml": {
        "spec.ofedDriver.terminationGracePeriodSeconds": 300,
        "spec.ofedDriver.upgradePolicy.safeLoad": False,
        "spec.ofedDriver.upgradePolicy.drain.enable": True,
        "spec.ofedDriver.upgradePolicy.drain.force": False,
        "spec.ofedDriver.upgradePolicy.drain.deleteEmptyDir": False,
    },
    "sriovnetworknodepolicy.yaml": {"spec.priority": 99, "spec.deviceType": "netdevice"},
    "sriovnetwork.yaml": {"spec.logLevel": "info"},
}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_example_is_accepted_with_upstream_defaults(create: Create, name: str) -> None:
    sent = example(name)
    stored = create(sent)
    assert_contains(stored["spec"], sent["spec"], "spec")
    for path, value in UPSTREAM_DEFAULTS.get(name, {}).items():
        assert get(stored, path) == value, path
    assert json_fields(parse(stored)) == []


def test_upstream_cr_with_removed_fields_is_accepted_and_flagged(create: Create) -> None:
    sent = yaml.safe_load(UPSTREAM_CR.read_text())
    stored = create(sent)
    assert_contains(stored["spec"], sent["spec"], "spec")
    warnings = removed_field_warnings(parse(stored))
    assert sorted(w.split(" ", 1)[0] for w in warnings) == [
        "spec.nvPeerDriver",
        "spec.psp",
        "spec.secondaryNetwork.ipamPlugin",
    ]


def test_json_the_schema_cannot_parse_is_reported_with_its_field(create: Create) -> None:
    sent = example("macvlannetwork.yaml")
    sent["spec"]["ipam"] = '{"type": nv-ipam}'
    stored = create(sent)
    [(field, error)] = json_fields(parse(stored))
    assert field == "spec.ipam"
    assert error.startswith("is not valid JSON")


def test_storage_class_of_firmware_storage_cannot_change(client: Client, create: Create) -> None:
    stored = create(example("nicclusterpolicy-roce-sriov.yaml"))
    stored["spec"]["nicConfigurationOperator"]["nicFirmwareStorage"]["storageClassName"] = "fast"
    resource = lightkube_resource(kind_for(stored["apiVersion"], stored["kind"]))
    with pytest.raises(ApiError) as e:
        client.replace(resource(stored))
    assert e.value.status.code == 422
    message = e.value.status.message
    assert "spec.nicConfigurationOperator.nicFirmwareStorage.storageClassName" in message
    assert "immutable" in message


DELETE = object()
"""Marks a field to remove from the example."""
IB = "nicclusterpolicy-infiniband.yaml"
ROCE = "nicclusterpolicy-roce-sriov.yaml"
SNNP = "sriovnetworknodepolicy.yaml"

# (example, field to change, new value, what the API server's message must contain)
INVALID: list[tuple[str, str, Any, list[str]]] = [
    # NicClusterPolicy
    (IB, "spec.ofedDriver.upgradePolicy.autoUpgrade", False,
     ["spec.ofedDriver.upgradePolicy.safeLoad", "safeLoad requires autoUpgrade"]),
    (IB, "spec.ofedDriver.upgradePolicy.maxParallelUpgrades", -1,
     ["spec.ofedDriver.upgradePolicy.maxParallelUpgrades", "greater than or equal to 0"]),
    (IB, "spec.ofedDriver.upgradePolicy.maxUnavailable", "150%",
     ["spec.ofedDriver.upgradePolicy.maxUnavailable", "percentage"]),
    (IB, "spec.ofedDriver.upgradePolicy.waitForCompletion.timeoutSeconds", -1,
     ["spec.ofedDriver.upgradePolicy.waitForCompletion.timeoutSeconds"]),
    (IB, "spec.ofedDriver.upgradePolicy.drain.timeoutSeconds", "5m",
     ["spec.ofedDriver.upgradePolicy.drain.timeoutSeconds", "must be of type integer"]),
    (IB, "spec.ofedDriver.version", "latest",
     ["spec.ofedDriver.version", "driver version"]),
    (IB, "spec.ofedDriver.image", DELETE,
     ["spec.ofedDriver.image", "Required value"]),
    (IB, "spec.ofedDriver.image", "!!!",
     ["spec.ofedDriver.image", "should match"]),
    (IB, "spec.ofedDriver.terminationGracePeriodSeconds", -30,
     ["spec.ofedDriver.terminationGracePeriodSeconds"]),
    (IB, "spec.rdmaSharedDevicePlugin.config", "rdma_shared_device_a",
     ["spec.rdmaSharedDevicePlugin.config", "must be a JSON object"]),
    (IB, "spec.ibKubernetes.pKeyGUIDPoolRangeStart", "02:00:00",
     ["spec.ibKubernetes.pKeyGUIDPoolRangeStart", "should match"]),
    (IB, "spec.ibKubernetes.pKeyGUIDPoolRangeEnd",
     "01:FF:FF:FF:FF:FF:FF:FF",
     ["spec.ibKubernetes.pKeyGUIDPoolRangeEnd", "greater than pKeyGUIDPoolRangeStart"]),
    (IB, "spec.ibKubernetes.ufmSecret", DELETE,
     ["spec.ibKubernetes.ufmSecret", "Required value"]),
    (IB, "spec.tolerations", [{"key": "a", "tolerationSeconds": "x"}],
     ["spec.tolerations[0].tolerationSeconds", "must be of type integer"]),
    (ROCE, "spec.sriovDevicePlugin.config", '["resourceList"]',
     ["spec.sriovDevicePlugin.config", "must be a JSON object"]),
    (ROCE, "spec.docaTelemetryService.containerResources",
     [{"name": "doca-telemetry-service", "limits": {"nvidia.com/gpu": 1}}],
     ["spec.docaTelemetryService.containerResources[0].limits", "only cpu and memory"]),
    (ROCE, "spec.nicConfigurationOperator.logLevel", "trace",
     ["spec.nicConfigurationOperator.logLevel", "Unsupported value"]),
    (ROCE,
     "spec.nicConfigurationOperator.nicFirmwareStorage.availableStorageSize", "1GB",
     ["spec.nicConfigurationOperator.nicFirmwareStorage.availableStorageSize", "should match"]),
    (ROCE, "spec.nicConfigurationOperator.configurationDaemon", DELETE,
     ["spec.nicConfigurationOperator.configurationDaemon", "Required value"]),
    (ROCE, "spec.docaTelemetryService.config",
     {"fromConfigMap": "Telemetry_Config"}, ["spec.docaTelemetryService.config.fromConfigMap"]),
    # NicNodePolicy
    ("nicnodepolicy.yaml", "metadata.name", "a-node-policy-name-longer-than-30",
     ["metadata.name", "Too long: may not be more than 30"]),
    ("nicnodepolicy.yaml", "spec.nodeSelector", {"pool": 200},
     ["spec.nodeSelector.pool", "must be of type string"]),
    ("nicnodepolicy.yaml", "spec.ofedDriver.upgradePolicy", {"safeLoad": True},
     ["spec.ofedDriver.upgradePolicy.safeLoad", "safeLoad requires autoUpgrade"]),
    # networks
    ("macvlannetwork.yaml", "spec.mode", "bridged", ["spec.mode", "Unsupported value"]),
    ("macvlannetwork.yaml", "spec.mtu", -1, ["spec.mtu"]),
    ("macvlannetwork.yaml", "spec.ipam", "dhcp", ["spec.ipam", "must be a JSON object"]),
    ("hostdevicenetwork.yaml", "spec.resourceName", "nvidia.com/hostdev",
     ["spec.resourceName", "should match"]),
    ("ipoibnetwork.yaml", "spec.ipam", "[]", ["spec.ipam", "must be a JSON object"]),
    # SriovNetworkNodePolicy
    (SNNP, "spec.numVfs", 0, ["spec.numVfs", "greater than 0"]),
    (SNNP, "spec.nicSelector.pfNames", ["ens1f0#0-8"],
     ["spec.nicSelector.pfNames", "less than numVfs"]),
    (SNNP, "spec.nicSelector.pfNames", ["ens1f0#5-2"],
     ["spec.nicSelector.pfNames[0]", "first <= last"]),
    (SNNP, "spec.nicSelector.pfNames", ["ens1f0#a-b"],
     ["spec.nicSelector.pfNames[0]", "name#first-last"]),
    (SNNP, "spec.priority", 100,
     ["spec.priority", "less than or equal to 99"]),
    (SNNP, "spec.resourceName", "-cx6dx",
     ["spec.resourceName", "should match"]),
    (SNNP, "spec.resourceName", "r" * 64,
     ["spec.resourceName", "Too long: may not be more than 63"]),
    (SNNP, "spec.linkType", "Ethernet", ["spec.linkType", "Unsupported value"]),
    (SNNP, "spec.deviceType", "vfio", ["spec.deviceType", "Unsupported value"]),
    (SNNP, "spec.mtu", 0, ["spec.mtu", "greater than or equal to 1"]),
    (SNNP, "spec.mtu", 70000, ["spec.mtu", "less than or equal to 65535"]),
    (SNNP, "spec.deviceType", "vfio-pci",
     ["spec.isRdma", "isRdma cannot be used with deviceType vfio-pci"]),
    (SNNP, "spec.nicSelector", {},
     ["spec.nicSelector", "set at least one of vendor"]),
    (SNNP, "spec.nodeSelector", DELETE,
     ["spec.nodeSelector", "Required value"]),
    (SNNP, "spec.numVfs", "8", ["spec.numVfs", "must be of type integer"]),
    # SriovNetwork and SriovIBNetwork
    ("sriovnetwork.yaml", "spec.vlan", 5000, ["spec.vlan", "less than or equal to 4094"]),
    ("sriovnetwork.yaml", "spec.vlanQoS", 8, ["spec.vlanQoS", "less than or equal to 7"]),
    ("sriovnetwork.yaml", "spec.spoofChk", "yes", ["spec.spoofChk", "Unsupported value"]),
    ("sriovnetwork.yaml", "spec.ipam", "dhcp", ["spec.ipam", "must be a JSON object"]),
    ("sriovnetwork.yaml", "spec.metaPlugins", "tuning",
     ["spec.metaPlugins", "JSON objects separated by commas"]),
    ("sriovnetwork.yaml", "spec.resourceName", DELETE, ["spec.resourceName", "Required value"]),
    ("sriovibnetwork.yaml", "spec.linkState", "up", ["spec.linkState", "Unsupported value"]),
    ("sriovibnetwork.yaml", "spec.capabilities", "infinibandGUID",
     ["spec.capabilities", "must be a JSON object"]),
    # OVSNetwork, limits of upstream's CRD
    ("ovsnetwork.yaml", "spec.vlan", 4096, ["spec.vlan", "less than or equal to 4095"]),
    ("ovsnetwork.yaml", "spec.trunk", [{"minID": 100, "maxID": 5000}],
     ["spec.trunk[0].maxID", "less than or equal to 4095"]),
    ("ovsnetwork.yaml", "spec.resourceName", DELETE, ["spec.resourceName", "Required value"]),
    ("ovsnetwork.yaml", "spec.ipam", "dhcp", ["spec.ipam", "must be a JSON object"]),
    # operator config, pools, node state
    ("sriovoperatorconfig.yaml", "spec.logLevel", 3, ["spec.logLevel", "less than or equal to 2"]),
    ("sriovoperatorconfig.yaml", "metadata.name", "custom",
     ["metadata.name", 'supported values: "default"']),
    ("sriovoperatorconfig.yaml", "spec.configurationMode", "cron",
     ["spec.configurationMode", "Unsupported value"]),
    # upstream's PluginNameValue enum (api/v1/sriovoperatorconfig_types.go)
    ("sriovoperatorconfig.yaml", "spec.disablePlugins", ["notaplugin"],
     ["spec.disablePlugins[0]", 'Unsupported value: "notaplugin"', 'supported values: "mellanox"']),
    ("sriovnetworkpoolconfig.yaml", "spec.maxUnavailable", "120%",
     ["spec.maxUnavailable", "percentage"]),
    ("sriovnetworkpoolconfig.yaml", "spec.rdmaMode", "private",
     ["spec.rdmaMode", "Unsupported value"]),
    ("sriovnetworknodestate.yaml", "spec.interfaces", [{"name": "ens1f0"}],
     ["spec.interfaces[0].pciAddress", "Required value"]),
    # nv-ipam pools
    ("ippool.yaml", "spec.subnet", "192.168.0.0/33", ["spec.subnet", "must be a CIDR"]),
    ("ippool.yaml", "spec.gateway", "192.168.0.256", ["spec.gateway", "must be an IP address"]),
    ("ippool.yaml", "spec.perNodeBlockSize", "254",
     ["spec.perNodeBlockSize", "must be of type integer"]),
    ("cidrpool.yaml", "spec.perNodeNetworkPrefix", DELETE,
     ["spec.perNodeNetworkPrefix", "Required value"]),
    ("cidrpool.yaml", "spec.routes", [{"dst": "10.200.0.0"}],
     ["spec.routes[0].dst", "must be a CIDR"]),
    # nvidia-k8s-ipam api/v1alpha1/validate_exclusions.go, on the range as upstream's webhook
    ("ippool.yaml", "spec.perNodeExclusions", [{"startIndex": 25, "endIndex": 24}],
     ["spec.perNodeExclusions[0]", "endIndex must be greater than or equal to startIndex"]),
    ("cidrpool.yaml", "spec.perNodeExclusions", [{"startIndex": 1, "endIndex": 0}],
     ["spec.perNodeExclusions[0]", "endIndex must be greater than or equal to startIndex"]),
]


def mutated(name: str, path: str, value: Any) -> dict[str, Any]:
    obj = example(name)
    *parents, last = path.split(".")
    target = obj
    for key in parents:
        target = target.setdefault(key, {})
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return obj


@pytest.mark.parametrize(
    ("name", "path", "value", "expected"),
    INVALID,
    ids=[f"{n.removesuffix('.yaml')}:{p}={'<deleted>' if v is DELETE else v}"[:90]
         for n, p, v, _ in INVALID],
)
def test_invalid_object_is_rejected_naming_the_field(
    create: Create, name: str, path: str, value: Any, expected: list[str]
) -> None:
    with pytest.raises(ApiError) as e:
        create(mutated(name, path, value))
    assert e.value.status.code == 422
    for fragment in expected:
        assert fragment in e.value.status.message


def test_upstream_values_at_the_edge_of_the_new_rules_are_accepted(create: Create) -> None:
    """The values upstream accepts next to the ones it refuses: disablePlugins [mellanox] (and
    the operator reads the object back), and nv-ipam's "Valid - PerNodeExclusions single
    index" case (nvidia-k8s-ipam api/v1alpha1/ippool_test.go)."""
    config = mutated("sriovoperatorconfig.yaml", "spec.disablePlugins", ["mellanox"])
    stored = create(config)
    assert stored["spec"]["disablePlugins"] == ["mellanox"]
    assert parse(stored).model_dump(by_alias=True)["spec"]["disablePlugins"] == ["mellanox"]
    pool = mutated("ippool.yaml", "spec.perNodeExclusions", [{"startIndex": 5, "endIndex": 5}])
    assert create(pool)["spec"]["perNodeExclusions"] == [{"startIndex": 5, "endIndex": 5}]


# Upstream's CRDs (sriov-network-operator config/crd/bases/*.yaml) list no `spec` in `required`.
SRIOV_KINDS = ("SriovNetworkNodePolicy", "SriovNetwork", "SriovIBNetwork", "OVSNetwork",
               "SriovNetworkNodeState", "SriovOperatorConfig", "SriovNetworkPoolConfig")


@pytest.mark.parametrize("kind", SRIOV_KINDS)
def test_sriov_kind_without_spec_is_accepted_and_read_back(create: Create, kind: str) -> None:
    name = "default" if kind == "SriovOperatorConfig" else "no-spec"
    stored = create({"apiVersion": "sriovnetwork.openshift.io/v1", "kind": kind,
                     "metadata": {"name": name}})
    assert stored["metadata"]["name"] == name
    assert parse(stored).crd.kind == kind  # the operator's model reads it


def run_kubectl(controlplane_bin: Path, kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run([str(controlplane_bin / "kubectl"), f"--kubeconfig={kubeconfig}",
                           *args], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_kubectl_shows_the_operator_configs_conditions(
    create: Create, controlplane_bin: Path, kubeconfig: Path, namespace: str
) -> None:
    """`kubectl get sriovoperatorconfigs` has upstream's Ready, Progressing and Degraded
    columns (sriov-network-operator api/v1/sriovoperatorconfig_types.go printcolumns)."""
    create(example("sriovoperatorconfig.yaml"))
    now = "2025-01-01T00:00:00Z"
    conditions = [{"type": t, "status": v, "reason": "Test", "message": "",
                   "lastTransitionTime": now}
                  for t, v in (("Ready", "True"), ("Progressing", "False"), ("Degraded", "False"))]
    run_kubectl(controlplane_bin, kubeconfig, "patch", "sriovoperatorconfig", "default", "-n",
                namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"conditions": conditions}}))
    header, row = run_kubectl(controlplane_bin, kubeconfig, "get", "sriovoperatorconfigs",
                              "-n", namespace).splitlines()
    assert header.split() == ["NAME", "READY", "PROGRESSING", "DEGRADED", "AGE"]
    assert row.split()[:4] == ["default", "True", "False", "False"]


def test_kubectl_finds_nads_by_their_short_name(
    create: Create, controlplane_bin: Path, kubeconfig: Path, namespace: str
) -> None:
    """`net-attach-def`, the one short name of the k8s.cni.cncf.io CRD upstream ships
    (k8snetworkplumbingwg/network-attachment-definition-client artifacts/networks-crd.yaml)."""
    create({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "short"}, "spec": {"config": "{}"}})
    out = run_kubectl(controlplane_bin, kubeconfig, "get", "net-attach-def", "-n", namespace,
                      "-o", "name")
    assert out.split() == ["networkattachmentdefinition.k8s.cni.cncf.io/short"]


# Every case of nvidia-k8s-ipam's api/v1alpha1/ippool_test.go and cidrpool_test.go:
# (kind, case, spec, field the API server names or None)
POOL_CASES = [("IPPool", case, spec, api) for case, spec, _, api in IPPOOL_CASES] + \
    [("CIDRPool", case, spec, api) for case, spec, _, api in CIDRPOOL_CASES] + \
    [("CIDRPool", f"{table}: {case}", spec, api)
     for table, case, spec, _, api in CIDRPOOL_TABLES]


@pytest.mark.parametrize(("kind", "case", "spec", "api"), POOL_CASES,
                         ids=[f"{k}:{c}"[:90] for k, c, _, _ in POOL_CASES])
def test_upstream_pool_cases_in_the_api_server(create: Create, kind: str, case: str,
                                               spec: dict[str, Any], api: str | None) -> None:
    """Mellanox/nvidia-k8s-ipam api/v1alpha1/ippool_test.go, Describe "Validate", and
    cidrpool_test.go, Describe "CIDRPool", the It or Entry named `case`: the specs nicop's CRD
    refuses are refused naming the field; every other one is stored as sent (the valid ones,
    and the invalid ones the controller refuses, see tests/unit/test_ipam_upstream_api.py)."""
    obj = {"apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": kind,
           "metadata": {"name": "test"}, "spec": spec}
    if api is None:
        assert_contains(create(obj)["spec"], spec)
        return
    with pytest.raises(ApiError) as e:
        create(obj)
    assert e.value.status.code == 422
    assert api in e.value.status.message, e.value.status.message
