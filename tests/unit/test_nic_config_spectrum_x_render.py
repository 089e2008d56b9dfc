"""The nicConfigurationOperator and spectrumXOperator states render what upstream renders.

Fields compared are those of Mellanox/network-operator manifests/state-nic-configuration-operator
(060-operator.yaml, 070-config-daemon.yaml, 020-cluster-role.yaml, 050-nic-storage-pvc.yaml, the
five configuration.net.nvidia.com CRDs) and manifests/state-spectrum-x-operator
(0050-flowcontroller-ds.yaml, 0020-role.yaml, 0030-rolebinding.yaml,
0001-spectrumx.nvidia.com_spectrumxrailpoolconfigs.yaml), as collected in
reference/upstream-render.md §2, §5 and §6. The inputs are the sections of upstream's own
examples (example/crs/mellanox.com_v1alpha1_nicclusterpolicy_cr-full.yaml, and the
spectrumXOperator section of upstream's docs), as examples/nicclusterpolicy-nic-configuration-
spectrum-x.yaml carries them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from nicop.operator.states import nic_configuration_operator, spectrum_x_operator
from nicop.operator.states.base import Context

ROOT = Path(__file__).resolve().parents[2]
POLICY = yaml.safe_load(
    (ROOT / "examples" / "nicclusterpolicy-nic-configuration-spectrum-x.yaml").read_text())
NS = "nvidia-network-operator"
Obj = dict[str, Any]


def rendered(module: Any, section: str) -> dict[tuple[str, str], Obj]:
    ctx = Context(POLICY, NS)
    objs = module.render(ctx, POLICY["spec"][section], f"spec.{section}")
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_nic_configuration_objects_are_upstreams() -> None:
    objs = rendered(nic_configuration_operator, "nicConfigurationOperator")
    crds = sorted(name for kind, name in objs if kind == "CustomResourceDefinition")
    assert crds == [f"{p}.configuration.net.nvidia.com" for p in (
        "nicconfigurationtemplates", "nicdevices", "nicfirmwaresources", "nicfirmwaretemplates",
        "nicinterfacenametemplates")]
    for name in crds:
        spec = objs["CustomResourceDefinition", name]["spec"]
        assert spec["scope"] == "Namespaced"
        assert [v["name"] for v in spec["versions"]] == ["v1alpha1"]
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert (kind, "nic-configuration-operator") in objs
    assert ("ConfigMap", "nic-configuration-operator-supported-nic-firmware") in objs
    rules = objs["ClusterRole", "nic-configuration-operator"]["rules"]
    assert any(r["apiGroups"] == ["maintenance.nvidia.com"]
               and r["resources"] == ["nodemaintenances"] for r in rules)

    pvc = objs["PersistentVolumeClaim", "nic-fw-storage-pvc"]["spec"]
    assert pvc == {"accessModes": ["ReadWriteMany"], "storageClassName": "nic-fw-storage-class",
                   "resources": {"requests": {"storage": "1Gi"}}}

    deploy = objs["Deployment", "nic-configuration-operator"]["spec"]
    assert deploy["selector"]["matchLabels"] == {
        "app.kubernetes.io/component": "nic-configuration-operator"}
    pod = deploy["template"]["spec"]
    assert pod["serviceAccountName"] == "nic-configuration-operator"
    manager = pod["containers"][0]
    assert manager["name"] == "manager" and manager["command"] == ["/manager"]
    assert manager["image"] == "nvcr.io/nvidia/mellanox/nic-configuration-operator:v1.1.1"
    assert {"name": "LOG_LEVEL", "value": "info"} in manager["env"]
    assert pod["volumes"] == [{"name": "firmware-cache",
                               "persistentVolumeClaim": {"claimName": "nic-fw-storage-pvc"}}]

    ds = objs["DaemonSet", "nic-configuration-daemon"]["spec"]
    assert ds["selector"]["matchLabels"] == {"app.kubernetes.io/name": "nic-configuration-daemon"}
    assert ds["template"]["metadata"]["labels"] == {
        "app.kubernetes.io/name": "nic-configuration-daemon",
        "nvidia.com/nic-configuration-daemon": ""}
    pod = ds["template"]["spec"]
    assert pod["nodeSelector"] == {"network.nvidia.com/operator.mofed.wait": "false"}
    assert pod["hostNetwork"] and pod["hostPID"]
    assert pod["serviceAccountName"] == "nic-configuration-operator"
    daemon = pod["containers"][0]
    assert daemon["securityContext"] == {"privileged": True}
    assert {m["mountPath"] for m in daemon["volumeMounts"]} == {
        "/sys", "/proc", "/host", "/dev", "/nic-firmware"}
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v} == {
        "sys": "/sys", "proc": "/proc", "host": "/", "dev": "/dev"}


def test_without_firmware_storage_there_is_no_pvc_or_volume() -> None:
    section = {k: v for k, v in POLICY["spec"]["nicConfigurationOperator"].items()
               if k != "nicFirmwareStorage"}
    objs = nic_configuration_operator.render(Context(POLICY, NS), section, "spec.x")
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    deploy = next(o for o in objs if o["kind"] == "Deployment")
    assert "volumes" not in deploy["spec"]["template"]["spec"]


def test_spectrum_x_objects_are_upstreams() -> None:
    objs = rendered(spectrum_x_operator, "spectrumXOperator")
    crd = objs["CustomResourceDefinition", "spectrumxrailpoolconfigs.spectrumx.nvidia.com"]
    assert crd["spec"]["scope"] == "Namespaced"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1alpha2"]
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert (kind, "spectrum-x-operator") in objs
    groups = {g for r in objs["ClusterRole", "spectrum-x-operator"]["rules"]
              for g in r["apiGroups"]}
    assert {"sriovnetwork.openshift.io", "nv-ipam.nvidia.com", "spectrumx.nvidia.com"} <= groups
    ds = objs["DaemonSet", "spectrum-x-flowcontroller"]["spec"]
    assert ds["selector"]["matchLabels"] == {"control-plane": "spectrum-x-flowcontroller"}
    assert ds["template"]["metadata"]["labels"] == {"control-plane": "spectrum-x-flowcontroller"}
    pod = ds["template"]["spec"]
    assert pod["nodeSelector"] == {"feature.node.kubernetes.io/pci-15b3.present": "true"}
    assert pod["serviceAccountName"] == "spectrum-x-operator"
    flow = pod["containers"][0]
    assert flow["command"] == ["/flowcontroller"]
    assert flow["args"] == ["--metrics-bind-address=0", "--health-probe-bind-address=0"]
    env = {e["name"]: e.get("value") for e in flow["env"]}
    assert env["XPLANE_IMAGE"] == "xplane" and "POD_NAMESPACE" in env and "NODE_NAME" in env
    types = sorted(v["hostPath"].get("type", "") for v in pod["volumes"])
    # upstream-render.md §5: DirectoryOrCreate for three paths, FileOrCreate for one.
    assert types.count("DirectoryOrCreate") == 3 and types.count("FileOrCreate") == 1
