"""The objects nicop renders for upstream's images carry upstream's names, selectors, labels,
init containers, arguments and mounts (Mellanox/network-operator manifests/state-*/ and the
facts in pkg/state), so a cluster keeps its running pods when nicop takes an install over."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nicop.operator.states import (
    cni_plugins,
    doca_telemetry,
    ib_kubernetes,
    ipoib,
    multus,
    nic_feature_discovery,
    nv_ipam,
    ofed,
    rdma_dp,
    sriov_dp,
)
from nicop.operator.states.base import Context, RenderError, name_hash

Obj = dict[str, Any]
NFD = "feature.node.kubernetes.io"
NAMESPACE = "nvidia-network-operator"
IMAGE = {"repository": "ghcr.io/mellanox", "version": "v1.0.0"}
DRIVER = {"image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox",
          "version": "25.04-0.6.1.0-2",
          "upgradePolicy": {"autoUpgrade": True, "safeLoad": True}}
INIT_IMAGE = "nvcr.io/nvidia/mellanox/network-operator-init-container:network-operator-v25.10.0"


def node(name: str, os_id: str, version: str, kernel: str, arch: str = "amd64") -> Obj:
    return {"metadata": {"name": name, "labels": {
        f"{NFD}/pci-15b3.present": "true", f"{NFD}/system-os_release.ID": os_id,
        f"{NFD}/system-os_release.VERSION_ID": version, f"{NFD}/kernel-version.full": kernel,
        "kubernetes.io/arch": arch}}}


NODES = [node("a", "ubuntu", "22.04", "5.15.0-91-generic"),
         node("b", "ubuntu", "22.04", "5.15.0-78-generic"),
         node("c", "rhel", "9.2", "5.14.0-284.43.1.el9_2.x86_64")]


def ctx(spec: Obj, init_image: str | None = INIT_IMAGE, **extra: Any) -> Context:
    return Context({"metadata": {"name": "nic-cluster-policy", "uid": "u"}, "spec": spec},
                   NAMESPACE, managed_nodes=NODES, agent_image="reg/nicop:1",
                   ofed_init_image=init_image, **extra)


def render_driver(section: Obj, init_image: str | None = INIT_IMAGE, **extra: Any) -> list[Obj]:
    return ofed.render(ctx({"ofedDriver": section}, init_image, **extra), section,
                       "spec.ofedDriver")


def by_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod(ds: Obj) -> Obj:
    return ds["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def volumes(ds: Obj) -> dict[str, Obj]:
    return {v["name"]: v for v in pod(ds)["volumes"]}


@pytest.mark.parametrize(("value", "expected"), [
    ("5.15.0-91-generic", "6d568d699f"),
    ("5.15.0-78-generic", "54669c9886"),
    ("5.14.0-284.43.1.el9_2.x86_64", "687cd9dc94"),
    ("pool-a", "779d97f8c7"),
])
def test_pool_hash_is_upstreams(value: str, expected: str) -> None:
    """Mellanox/network-operator pkg/state/state_ofed_test.go (the kernels' expected DaemonSet
    names): FNV-1a 32 in decimal, spelled by apimachinery's rand.SafeEncodeString."""
    assert name_hash(value) == expected


def test_driver_daemonsets_are_named_and_selected_as_upstreams() -> None:
    """One DaemonSet per OS and kernel, as manifests/state-ofed-driver/0050_ofed-driver-ds.yaml
    names, labels and selects it; the pods carry the kernel label and run only there."""
    dss = by_kind(render_driver(DRIVER), "DaemonSet")
    assert sorted(dss) == ["mofed-rhel9.2-687cd9dc94-ds", "mofed-ubuntu22.04-54669c9886-ds",
                           "mofed-ubuntu22.04-6d568d699f-ds"]
    ds = dss["mofed-ubuntu22.04-6d568d699f-ds"]
    app = "mofed-ubuntu22.04-6d568d699f"
    assert ds["spec"]["selector"] == {"matchLabels": {"app": app}}
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    labels = ds["metadata"]["labels"]
    assert (labels["app"], labels["nvidia.com/ofed-driver"],
            labels["mofed-ds-format-version"]) == (app, "", "1")
    assert ds["spec"]["template"]["metadata"]["labels"] == {
        "app": app, "kernel": "5.15.0-91-generic", "nvidia.com/ofed-driver": "",
        "ds-owner": "NicClusterPolicy"}
    assert pod(ds)["nodeSelector"] == {
        f"{NFD}/pci-15b3.present": "true", f"{NFD}/system-os_release.ID": "ubuntu",
        f"{NFD}/system-os_release.VERSION_ID": "22.04",
        f"{NFD}/kernel-version.full": "5.15.0-91-generic"}
    assert pod(ds)["serviceAccountName"] == "ofed-driver"
    driver = pod(ds)["containers"][0]
    assert driver["image"] == \
        "nvcr.io/nvidia/mellanox/doca-driver:25.04-0.6.1.0-2-ubuntu22.04-amd64"
    assert driver["securityContext"] == {"privileged": True, "seLinuxOptions": {"level": "s0"}}
    assert driver["startupProbe"]["exec"]["command"] == [
        "sh", "-c", "ls /run/mellanox/drivers/.driver-ready"]


def test_driver_mounts_are_upstreams_with_their_hostpath_types() -> None:
    """The mofed-container mounts of 0050_ofed-driver-ds.yaml: ib_core.conf as a file created
    if missing, the inventory and /dev/infiniband as directories created if missing, the rest
    untyped; /run/mellanox/drivers shared both ways and /run/udev read-only."""
    ds = next(iter(by_kind(render_driver(DRIVER), "DaemonSet").values()))
    mounts = {m["mountPath"]: m for m in pod(ds)["containers"][0]["volumeMounts"]}
    found = {path: volumes(ds)[m["name"]]["hostPath"] for path, m in mounts.items()}
    assert found == {
        "/run/mellanox/drivers": {"path": "/run/mellanox/drivers"},
        "/etc/network": {"path": "/etc/network"},
        "/host/etc": {"path": "/etc"},
        "/host/usr": {"path": "/usr"},
        "/host/lib/udev": {"path": "/lib/udev"},
        "/run/udev": {"path": "/run/udev"},
        "/host/lib/modules": {"path": "/lib/modules"},
        "/mnt/drivers-inventory": {"path": "/var/opt/mofed-container/inventory",
                                   "type": "DirectoryOrCreate"},
        "/etc/modprobe.d/ib_core.conf": {"path": "/etc/modprobe.d/ib_core.conf",
                                         "type": "FileOrCreate"},
        "/dev/infiniband": {"path": "/dev/infiniband", "type": "DirectoryOrCreate"},
    }
    assert mounts["/run/mellanox/drivers"]["mountPropagation"] == "Bidirectional"
    assert mounts["/run/udev"]["readOnly"] is True


def test_driver_init_container_and_its_config_are_upstreams() -> None:
    """With the operator's OFED_INIT_CONTAINER_IMAGE set (upstream's chart sets it by default),
    each driver pod starts with network-operator-init-container reading ConfigMap
    ofed-init-container-config (manifests/state-ofed-driver/0040_ofed_init_container_config-
    configmap.yaml): safe load on when the upgrade uses it, upstream's module list."""
    objects = render_driver({**DRIVER, "env": [{"name": "HTTP_PROXY", "value": "p:3128"}]})
    config = json.loads(by_kind(objects, "ConfigMap")["ofed-init-container-config"]["data"][
        "config.json"])
    assert config == {
        "safeDriverLoad": {
            "enable": True,
            "annotation": "nvidia.com/ofed-driver-upgrade.driver-wait-for-safe-load"},
        "moduleDependencyCheck": {
            "modules": ["mlx5_core", "mlx5_ib", "ib_umad", "ib_uverbs", "ib_ipoib", "rdma_cm",
                        "rdma_ucm", "ib_core", "ib_cm"],
            "hostProcPath": "/host/proc", "hostSysPath": "/host/sys"}}
    ds = next(iter(by_kind(objects, "DaemonSet").values()))
    (init,) = pod(ds)["initContainers"]
    assert init["name"] == "network-operator-init-container"
    assert init["image"] == INIT_IMAGE
    assert init["args"] == ["--node-name", "$(NODE_NAME)", "--configmap-name",
                            "ofed-init-container-config", "--configmap-namespace", NAMESPACE,
                            "--configmap-key", "config.json"]
    # Upstream appends its defaults to the section's env before rendering both containers
    # (pkg/state/state_ofed.go mergeWithDefaultEnvs; tests/data/upstream-install shows both).
    assert init["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "HTTP_PROXY", "value": "p:3128"},
        {"name": "CREATE_IFNAMES_UDEV", "value": "true"},
        {"name": "NVIDIA_NIC_DRIVERS_INVENTORY_PATH", "value": "/mnt/drivers-inventory"}]
    for mount in init["volumeMounts"]:
        assert mount["readOnly"] is True
        assert volumes(ds)[mount["name"]]["hostPath"]["type"] == "Directory"
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/host/proc", "/host/sys"}

    no_safe_load = {**DRIVER, "upgradePolicy": {"autoUpgrade": True}}
    config = json.loads(by_kind(render_driver(no_safe_load), "ConfigMap")[
        "ofed-init-container-config"]["data"]["config.json"])
    assert config["safeDriverLoad"]["enable"] is False


def test_without_the_init_image_or_with_nicops_driver_there_is_no_init_container() -> None:
    """Upstream renders it only when OFED_INIT_CONTAINER_IMAGE is set; nicop's driver agent
    checks and waits for safe load itself."""
    for objects in (render_driver(DRIVER, init_image=None),
                    render_driver({**DRIVER, "image": "nicop"})):
        assert "ofed-init-container-config" not in by_kind(objects, "ConfigMap")
        for ds in by_kind(objects, "DaemonSet").values():
            assert "initContainers" not in pod(ds)


def test_nicops_driver_differs_from_upstreams_only_in_image_command_probes_and_env() -> None:
    upstream = next(iter(by_kind(render_driver(DRIVER, init_image=None), "DaemonSet").values()))
    mine = next(iter(by_kind(render_driver({**DRIVER, "image": "nicop"}, init_image=None),
                             "DaemonSet").values()))
    assert mine["metadata"] == upstream["metadata"]
    assert mine["spec"]["selector"] == upstream["spec"]["selector"]
    assert mine["spec"]["template"]["metadata"] == upstream["spec"]["template"]["metadata"]
    same = {k: v for k, v in pod(upstream).items() if k != "containers"}
    assert {k: v for k, v in pod(mine).items() if k != "containers"} == same
    agent = pod(mine)["containers"][0]
    assert agent["image"] == "reg/nicop:1"
    assert agent["volumeMounts"] == pod(upstream)["containers"][0]["volumeMounts"]


def test_force_precompiled_uses_the_precompiled_tag_and_says_so() -> None:
    """Upstream's precompiled tag is `<version>-<kernel>-<ID><VERSION_ID>-<arch>`
    (pkg/state/state_ofed.go); nicop polls no registry, so forcePrecompiled picks it always."""
    dss = by_kind(render_driver({**DRIVER, "forcePrecompiled": True}), "DaemonSet")
    image = pod(dss["mofed-rhel9.2-687cd9dc94-ds"])["containers"][0]["image"]
    assert image == ("nvcr.io/nvidia/mellanox/doca-driver:25.04-0.6.1.0-2-"
                     "5.14.0-284.43.1.el9_2.x86_64-rhel9.2-amd64")
    nicops = by_kind(render_driver({**DRIVER, "image": "nicop", "version": "25.04-0.6.1.0",
                                    "forcePrecompiled": True}), "DaemonSet")
    agent = pod(nicops["mofed-rhel9.2-687cd9dc94-ds"])["containers"][0]
    assert "--force-precompiled" in agent["command"]  # it holds rather than compiles


@pytest.mark.parametrize("section", ["drain", "waitForCompletion"])
def test_a_pod_selector_kubernetes_would_refuse_is_the_policys_error(section: str) -> None:
    """`app in (train,infer` selects nothing in a parser that lets it through; nicop names the
    field, as the API server would refuse it in a LabelSelector."""
    upgrade = {"autoUpgrade": True, section: {"podSelector": "app in (train,infer"}}
    with pytest.raises(RenderError) as e:
        render_driver({**DRIVER, "upgradePolicy": upgrade})
    assert e.value.field == f"spec.ofedDriver.upgradePolicy.{section}.podSelector"


def test_a_value_the_model_refuses_is_the_policys_error_naming_the_field() -> None:
    """The section is read as its model; what the API server's schema would refuse (a
    negative grace period) renders nothing and names the field, nested ones included."""
    with pytest.raises(RenderError) as e:
        render_driver({**DRIVER, "terminationGracePeriodSeconds": -1})
    assert e.value.field == "spec.ofedDriver.terminationGracePeriodSeconds"
    with pytest.raises(RenderError) as e:
        render_driver({**DRIVER, "upgradePolicy": {"autoUpgrade": True,
                                                   "drain": {"timeoutSeconds": -5}}})
    assert e.value.field == "spec.ofedDriver.upgradePolicy.drain.timeoutSeconds"


def test_opted_in_nodes_keep_nicops_rule_in_the_driver_daemonsets() -> None:
    """A node opted in by nvidia.com/network-operator=true may lack the NIC label: the driver
    DaemonSets then select managed nodes (mofed.wait) instead of pci-15b3."""
    ds = next(iter(by_kind(render_driver(DRIVER, opt_in_used=True), "DaemonSet").values()))
    assert f"{NFD}/pci-15b3.present" not in pod(ds)["nodeSelector"]
    terms = pod(ds)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "network.nvidia.com/operator.mofed.wait", "operator": "Exists"}]}]


def test_multus_installs_its_binary_and_runs_the_thin_plugin_as_upstream() -> None:
    """manifests/state-multus-cni/0050-multus-ds.yml: init container install-multus-binary,
    then /thin_entrypoint with upstream's arguments; a `config` is mounted as 00-multus.conf."""
    section = {"image": "multus-cni", **IMAGE, "config": '{"cniVersion": "0.3.1"}'}
    objects = multus.render(ctx({}), section, "spec.secondaryNetwork.multus")
    ds = by_kind(objects, "DaemonSet")["kube-multus-ds"]
    (init,) = pod(ds)["initContainers"]
    assert init["name"] == "install-multus-binary"
    assert init["command"] == ["/install_multus"] and init["args"] == ["--type", "thin"]
    assert init["volumeMounts"] == [{"name": "cnibin", "mountPath": "/host/opt/cni/bin",
                                     "mountPropagation": "Bidirectional"}]
    main = pod(ds)["containers"][0]
    assert main["command"] == ["/thin_entrypoint"]
    assert main["args"] == [
        "--multus-conf-file=/tmp/multus-conf/00-multus.conf",
        "--multus-autoconfig-dir=/host/etc/cni/net.d", "--cni-conf-dir=/host/etc/cni/net.d",
        "--cleanup-config-on-exit", "--skip-config-watch", "--cni-bin-dir=/host/opt/cni/bin",
        "--multus-kubeconfig-file-host=/etc/cni/net.d/multus.d/multus.kubeconfig"]
    assert volumes(ds)["multus-cni-config"]["configMap"]["items"] == [
        {"key": "cni-conf.json", "path": "00-multus.conf"}]
    auto = multus.render(ctx({}), {**section, "config": None}, "spec.secondaryNetwork.multus")
    assert pod(by_kind(auto, "DaemonSet")["kube-multus-ds"])["containers"][0]["args"][0] == \
        "--multus-conf-file=auto"


def test_sriov_device_plugin_has_its_service_account_and_cdi_mounts() -> None:
    """manifests/state-sriov-device-plugin/0030-sriov-dp-daemonset.yaml: ServiceAccount
    network-operator-sriov-device-plugin; with useCdi /var/run/cdi and the host's /etc/pcidp."""
    section = {"image": "sriov-network-device-plugin", **IMAGE, "useCdi": True,
               "config": json.dumps({"resourceList": []})}
    objects = sriov_dp.render(ctx({}), section, "spec.sriovDevicePlugin")
    assert "network-operator-sriov-device-plugin" in by_kind(objects, "ServiceAccount")
    ds = by_kind(objects, "DaemonSet")["network-operator-sriov-device-plugin"]
    assert pod(ds)["serviceAccountName"] == "network-operator-sriov-device-plugin"
    mounts = {m["mountPath"]: m["name"] for m in pod(ds)["containers"][0]["volumeMounts"]}
    assert volumes(ds)[mounts["/host/etc/pcidp/"]]["hostPath"] == {
        "path": "/etc/pcidp", "type": "DirectoryOrCreate"}
    assert volumes(ds)[mounts["/var/run/cdi"]]["hostPath"] == {
        "path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    assert volumes(ds)[mounts["/var/run/k8s.cni.cncf.io/devinfo/dp"]]["hostPath"]["type"] == \
        "DirectoryOrCreate"
    plain = sriov_dp.render(ctx({}), {**section, "useCdi": False}, "spec.sriovDevicePlugin")
    mounts = {m["mountPath"] for m in pod(by_kind(plain, "DaemonSet")[
        "network-operator-sriov-device-plugin"])["containers"][0]["volumeMounts"]}
    assert not mounts & {"/host/etc/pcidp/", "/var/run/cdi"}


UFM = {"pKeyGUIDPoolRangeStart": "02:00:00:00:00:00:00:00",
       "pKeyGUIDPoolRangeEnd": "02:FF:FF:FF:FF:FF:FF:FF", "ufmSecret": "ufm"}


@pytest.mark.parametrize(("state", "section", "kind", "name", "selector", "pod_labels"), [
    (multus, {"image": "multus-cni"}, "DaemonSet", "kube-multus-ds", {"name": "multus"},
     {"tier": "node", "app": "multus"}),
    (cni_plugins, {"image": "plugins"}, "DaemonSet", "cni-plugins-ds", {"name": "cni-plugins"},
     {"tier": "node", "app": "cni-plugins"}),
    (ipoib, {"image": "ipoib-cni"}, "DaemonSet", "kube-ipoib-cni-ds", {"name": "ipoib-cni"},
     {"tier": "node", "app": "ipoib-cni"}),
    (sriov_dp, {"image": "sriov-network-device-plugin"}, "DaemonSet",
     "network-operator-sriov-device-plugin", {"name": "network-operator-sriov-device-plugin"},
     {"tier": "node", "app": "sriovdp", "ds-owner": "NicClusterPolicy"}),
    (rdma_dp, {"image": "k8s-rdma-shared-dev-plugin"}, "DaemonSet", "rdma-shared-dp-ds",
     {"app": "rdma-shared-dp"}, {"ds-owner": "NicClusterPolicy"}),
    (ib_kubernetes, {"image": "ib-kubernetes", **UFM}, "Deployment", "ib-kubernetes",
     {"name": "ib-kubernetes"},
     {"component": "network", "type": "infra", "kubernetes.io/os": "linux"}),
    (nv_ipam, {"image": "nvidia-k8s-ipam"}, "Deployment", "nv-ipam-controller",
     {"name": "nv-ipam-controller"}, {"component": "nv-ipam-controller", "app": "nv-ipam"}),
    (nv_ipam, {"image": "nvidia-k8s-ipam"}, "DaemonSet", "nv-ipam-node",
     {"name": "nv-ipam-node"}, {"component": "nv-ipam-node", "app": "nv-ipam"}),
    (nic_feature_discovery, {"image": "nic-feature-discovery"}, "DaemonSet",
     "nic-feature-discovery-ds", {"name": "nic-feature-discovery"}, {"tier": "node"}),
    (doca_telemetry, {"image": "doca_telemetry"}, "DaemonSet", "doca-telemetry-service",
     {"app.kubernetes.io/name": "doca-telemetry"}, {}),
])
def test_workloads_select_their_pods_as_upstream(
        state: Any, section: Obj, kind: str, name: str, selector: dict[str, str],
        pod_labels: dict[str, str]) -> None:
    """The selectors of manifests/state-*/ (a selector cannot change in place, so nicop must
    use upstream's to keep an upstream install's objects and pods)."""
    objects = state.render(ctx({}), {**IMAGE, **section}, "spec.x")
    workload = by_kind(objects, kind)[name]
    assert workload["spec"]["selector"] == {"matchLabels": selector}
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert labels.items() >= {**selector, **pod_labels}.items()


def test_hostpath_types_are_upstreams() -> None:
    """nv-ipam-node and nic-feature-discovery create their host directories if missing."""
    ipam = by_kind(nv_ipam.render(ctx({}), {"image": "nvidia-k8s-ipam", **IMAGE}, "spec.nvIpam"),
                   "DaemonSet")["nv-ipam-node"]
    assert {v["hostPath"].get("type") for v in pod(ipam)["volumes"]} == {"DirectoryOrCreate"}
    nfd = by_kind(nic_feature_discovery.render(ctx({}), {"image": "nfd", **IMAGE}, "spec.x"),
                  "DaemonSet")["nic-feature-discovery-ds"]
    assert pod(nfd)["volumes"][0]["hostPath"]["type"] == "DirectoryOrCreate"


def test_the_ipam_controller_runs_two_replicas_spread_over_nodes_as_upstream() -> None:
    """manifests/state-nv-ipam-cni/040-nv-ipam-controller.yaml: replicas 2, leader election, a
    preferred anti-affinity on kubernetes.io/hostname."""
    controller = by_kind(nv_ipam.render(ctx({}), {"image": "nvidia-k8s-ipam", **IMAGE},
                                        "spec.nvIpam"), "Deployment")["nv-ipam-controller"]
    assert controller["spec"]["replicas"] == 2
    assert "--leader-elect=true" in controller["spec"]["template"]["spec"]["containers"][0]["args"]
    [term] = controller["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"] == {"matchExpressions": [
        {"key": "name", "operator": "In", "values": ["nv-ipam-controller"]}]}
