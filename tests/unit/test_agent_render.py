"""What the operator renders to run nicop's own agents: the same DaemonSets as for upstream's
images (names, selectors, mounts, config), with nicop's command, image and probes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nicop.api.agents import (
    AGENT_MEMORY,
    NICOP_POD_JQ,
    is_nicop_image,
    uses_nicop,
)
from nicop.operator import cni_daemon, sriov_daemons
from nicop.operator.states import ofed, rdma_dp, sriov_dp
from nicop.operator.states.base import Context, RenderError

ROOT = Path(__file__).resolve().parents[2]
READYZ = {"path": "/readyz", "port": "metrics"}  # the agents' readiness probe asks the agent
NODE = {"metadata": {"name": "n1", "labels": {
    ofed.OS_LABEL: "ubuntu", ofed.OS_VERSION_LABEL: "22.04",
    ofed.KERNEL_LABEL: "5.15.0-122-generic", ofed.ARCH_LABEL: "amd64"}}}
RDMA_CONFIG = json.dumps({"configList": [{"resourceName": "rdma", "rdmaHcaMax": 63,
                                          "selectors": {"vendors": ["15b3"]}}]})


def ctx(spec: dict[str, Any] | None = None) -> Context:
    return Context({"metadata": {"name": "p", "uid": "u"}, "spec": spec or {}},
                   "nvidia-network-operator", managed_nodes=[NODE], agent_image="reg/nicop:1.2")


def daemonsets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "DaemonSet"]


def pod_of(ds: dict[str, Any]) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("ref", "nicop"), [
    ("nicop", True), ("nicop:0.1.0", True), ("registry.example.com/team/nicop:dev", True),
    ("localhost:5000/nicop@sha256:" + "a" * 64, True), ("ghcr.io/mellanox/nicop-agent:1", False),
    ("nvcr.io/nvidia/mellanox/doca-driver:25.10", False), ("mynicop:1", False),
])
def test_an_image_is_nicop_by_its_name(ref: str, nicop: bool) -> None:
    assert is_nicop_image(ref) is nicop


def test_kwok_skips_exactly_the_pods_the_node_stand_in_runs() -> None:
    """kwok's stage selectors and nicop.api.agents use one rule for nicop's pods."""
    stages = list(yaml.safe_load_all((ROOT / "sim/nicop_sim/kwok-stages.yaml").read_text()))
    pod_stages = [s for s in stages if s["spec"]["resourceRef"]["kind"] == "Pod"]
    assert pod_stages
    for stage in pod_stages:
        keys = {e["key"]: e for e in stage["spec"]["selector"]["matchExpressions"]}
        assert keys[NICOP_POD_JQ]["operator"] == "NotIn"
        assert keys[NICOP_POD_JQ]["values"] == ["true"]


def test_a_section_picks_nicop_by_image_name() -> None:
    assert uses_nicop("nicop")
    assert not uses_nicop("doca-driver")
    assert not uses_nicop(None)


def test_nicop_driver_keeps_upstreams_daemonset_and_runs_the_agent() -> None:
    section = {"image": "nicop", "version": "25.10-1.2.8.0",
               "upgradePolicy": {"autoUpgrade": True, "safeLoad": True}}
    upstream = {**section, "image": "doca-driver", "repository": "nvcr.io/nvidia/mellanox"}
    mine = daemonsets(ofed.render(ctx({"ofedDriver": section}), section, "spec.ofedDriver"))[0]
    theirs = daemonsets(ofed.render(ctx({"ofedDriver": upstream}), upstream,
                                    "spec.ofedDriver"))[0]
    for key in ("name", "labels"):
        assert mine["metadata"][key] == theirs["metadata"][key]
    assert mine["spec"]["selector"] == theirs["spec"]["selector"]
    assert mine["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert pod_of(mine)["volumes"] == pod_of(theirs)["volumes"]
    agent = pod_of(mine)["containers"][0]
    assert agent["image"] == "reg/nicop:1.2"
    assert agent["command"] == ["nicop", "driver", "run", "--safe-load", "--metrics-port=9530"]
    assert agent["volumeMounts"] == pod_of(theirs)["containers"][0]["volumeMounts"]
    assert {"name": "NVIDIA_NIC_DRIVER_VER", "value": "25.10-1.2.8.0"} in agent["env"]
    assert agent["startupProbe"]["exec"]["command"] == ["nicop", "driver", "probe", "startup"]
    assert agent["readinessProbe"]["exec"]["command"][-1] == "readiness"
    assert agent["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_nicop_driver_needs_the_driver_version() -> None:
    section = {"image": "nicop"}
    with pytest.raises(RenderError) as e:
        ofed.render(ctx({"ofedDriver": section}), section, "spec.ofedDriver")
    assert e.value.field == "spec.ofedDriver.version"


@pytest.mark.parametrize(("state", "section", "command"), [
    (rdma_dp, "rdmaSharedDevicePlugin", ["nicop", "rdma-device-plugin", "--metrics-port=9531"]),
    (sriov_dp, "sriovDevicePlugin", ["nicop", "sriov-device-plugin", "--metrics-port=9532"]),
])
def test_nicop_device_plugins_read_upstreams_config_where_upstream_does(
        state: Any, section: str, command: list[str]) -> None:
    spec = {"image": "nicop", "config": RDMA_CONFIG}
    upstream = {"image": "plugin", "repository": "ghcr.io/x", "version": "v1",
                "config": RDMA_CONFIG}
    mine = state.render(ctx({section: spec}), spec, f"spec.{section}")
    theirs = state.render(ctx({section: upstream}), upstream, f"spec.{section}")
    assert [o for o in mine if o["kind"] == "ConfigMap"] == [
        o for o in theirs if o["kind"] == "ConfigMap"]
    ds, their_ds = daemonsets(mine)[0], daemonsets(theirs)[0]
    assert ds["metadata"]["name"] == their_ds["metadata"]["name"]
    assert pod_of(ds)["volumes"] == pod_of(their_ds)["volumes"]
    agent = pod_of(ds)["containers"][0]
    assert agent["command"] == command and agent["image"] == "reg/nicop:1.2"
    assert agent["volumeMounts"] == pod_of(their_ds)["containers"][0]["volumeMounts"]
    assert agent["readinessProbe"]["httpGet"] == READYZ  # no process every period
    assert [port["name"] for port in agent["ports"]] == ["metrics"]


def test_sriov_daemons_follow_the_operator_configs_node_selector() -> None:
    config = sriov_daemons.default_config("ns", single_node=False)
    assert config["spec"]["configDaemonNodeSelector"] == {}
    config["metadata"]["uid"] = "u"
    daemon = daemonsets(sriov_daemons.render_config_daemon(ctx(), config))[0]
    assert daemon["metadata"]["name"] == "sriov-network-config-daemon"
    assert pod_of(daemon)["nodeSelector"] == {"kubernetes.io/os": "linux",
                                              "node-role.kubernetes.io/worker": ""}
    assert pod_of(daemon)["containers"][0]["command"] == [
        "nicop", "sriov-config-daemon", "--host-root", "/host", "--metrics-port=9533"]
    assert pod_of(daemon)["volumes"] == [{"name": "host", "hostPath": {"path": "/"}}]
    config["spec"]["configDaemonNodeSelector"] = {"sriov": "yes"}
    plugin = daemonsets(sriov_daemons.render_device_plugin(ctx(), config))[0]
    assert pod_of(plugin)["nodeSelector"] == {
        "sriov": "yes", "sriovnetwork.openshift.io/device-plugin": "Enabled"}
    agent = pod_of(plugin)["containers"][0]
    assert "--config-file=/etc/pcidp/$(NODE_NAME)" in agent["command"]
    assert {"name": "config", "configMap": {"name": "device-plugin-config"}} in pod_of(
        plugin)["volumes"]


def test_the_cni_daemon_installs_the_plugins_networks_use() -> None:
    nads = [
        {"spec": {"config": json.dumps({"type": "sriov", "ipam": {"type": "nv-ipam"}})}},
        {"spec": {"config": json.dumps({"cniVersion": "1.0.0", "plugins": [
            {"type": "host-device"}, {"type": "tuning"}]})}},
        {"spec": {"config": json.dumps({"type": "macvlan", "ipam": {"type": "whereabouts"}})}},
        {"spec": {"config": "not json"}},
    ]
    assert cni_daemon.used_plugins(nads) == ["host-device", "nv-ipam", "sriov"]
    assert cni_daemon.used_plugins(nads[2:]) == []
    objects = cni_daemon.render(ctx(), ["host-device", "sriov"])
    pod = pod_of(daemonsets(objects)[0])
    install = pod["initContainers"][0]
    assert install["command"][:2] == ["nicop", "cni-install"]
    assert "--plugin=host-device" in install["command"] and "--plugin=sriov" in install[
        "command"]
    assert install["volumeMounts"][0] == {"name": "cni-bin", "mountPath": "/host/opt/cni/bin"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert len(terms) == 2  # managed nodes, or nodes with SR-IOV resources


def test_the_dra_driver_runs_nicops_plugin_beside_the_kubelet_with_its_device_classes() -> None:
    """`draDriver: {}` (examples/nicclusterpolicy-dra.yaml): one DaemonSet running `nicop
    dra-plugin` from the operator's image, not waiting for the driver (it taints the NICs while
    the driver is not ready, so it watches its Node), with the kubelet's plugin
    directories and the CDI directory of the node mounted at the same paths (the kubelet dials
    the socket path the plugin reports), RBAC for its slices and claims, and both
    DeviceClasses; in a NicNodePolicy the DaemonSet is named by the policy's hash."""
    from nicop.api import dra
    from nicop.api.labels import MOFED_WAIT_LABEL
    from nicop.operator.states import dra_driver
    from nicop.operator.states.base import name_hash

    spec = yaml.safe_load((ROOT / "examples/nicclusterpolicy-dra.yaml").read_text())["spec"]
    objects = dra_driver.render(ctx(spec), spec["draDriver"], "spec.draDriver")
    [ds] = daemonsets(objects)
    assert ds["metadata"]["name"] == "nicop-dra-driver-ds"
    pod = pod_of(ds)
    [plugin] = pod["containers"]
    assert plugin["image"] == "reg/nicop:1.2"
    assert plugin["command"][:2] == ["nicop", "dra-plugin"]
    assert plugin["readinessProbe"]["httpGet"] == READYZ
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} \
        in plugin["env"]
    assert MOFED_WAIT_LABEL not in (pod.get("nodeSelector") or {})
    assert pod["serviceAccountName"] == "nicop-dra-driver"
    mounts = {m["mountPath"] for m in plugin["volumeMounts"]}
    assert {dra.PLUGINS_DIR, dra.REGISTRY_DIR, dra.CDI_DIR} <= mounts
    hosts = {v["hostPath"]["path"] for v in pod["volumes"]}
    assert {dra.PLUGINS_DIR, dra.REGISTRY_DIR, dra.CDI_DIR} <= hosts
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("resourceslices", "create"), ("resourceslices", "delete"),
            ("resourceclaims", "get"), ("nodes", "get"), ("nodes", "watch")} <= granted
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}
    assert set(classes) == {dra.PF_CLASS, dra.VF_CLASS, dra.SHARED_CLASS}
    assert classes[dra.VF_CLASS]["spec"] == dra.device_class(dra.VF_CLASS, dra.KIND_VF)["spec"]

    node_ctx = ctx({"nodeSelector": {"node-role.kubernetes.io/gpu": ""}})
    node_ctx.node_policy = "dra-gpu-nodes"
    [ds] = daemonsets(dra_driver.render(node_ctx, {}, "spec.draDriver"))
    assert ds["metadata"]["name"] == f"nicop-dra-driver-ds-{name_hash('dra-gpu-nodes')}"
    assert pod_of(ds)["nodeSelector"]["node-role.kubernetes.io/gpu"] == ""


def test_multus_with_nicops_image_runs_nicops_meta_plugin_in_upstreams_daemonset() -> None:
    """`secondaryNetwork.multus: {image: nicop}`: kube-multus-ds keeps upstream's selector and
    labels (so it replaces upstream's pods in place), its init container installs the `multus`
    executable, and `nicop multus-daemon` runs on the host network with the CNI dirs, the
    socket dir, the pods' namespaces (HostToContainer), the CNI state and the kubelet's
    PodResources socket; its ServiceAccount may read pods and NADs, patch pods and record
    Events. A `config` is written as 00-multus.conf as given."""
    from nicop.api.agents import MULTUS_SOCKET
    from nicop.operator.states import multus

    objects = multus.render(ctx(), {"image": "nicop"}, "spec.secondaryNetwork.multus")
    [ds] = daemonsets(objects)
    assert ds["metadata"]["name"] == "kube-multus-ds"
    assert ds["spec"]["selector"] == {"matchLabels": {"name": "multus"}}
    pod = pod_of(ds)
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "multus"
    [install] = pod["initContainers"]
    assert install["image"] == "reg/nicop:1.2"
    assert install["command"] == ["nicop", "multus-install", "--host-root", "/host",
                                  "--cni-bin-dir", "/opt/cni/bin", "--socket", MULTUS_SOCKET]
    assert install["volumeMounts"] == [{"name": "cni-bin", "mountPath": "/host/opt/cni/bin"}]
    [daemon] = pod["containers"]
    assert daemon["command"][:2] == ["nicop", "multus-daemon"]
    assert "--multus-conf-file=auto" in daemon["command"]
    assert "--cleanup-config-on-exit" in daemon["command"]
    assert daemon["securityContext"] == {"privileged": True}
    assert daemon["readinessProbe"]["httpGet"] == READYZ
    mounts = {m["mountPath"]: m for m in daemon["volumeMounts"]}
    assert set(mounts) == {"/etc/cni/net.d", "/opt/cni/bin", "/run/nicop", "/var/run/netns",
                           "/var/lib/cni", "/var/lib/kubelet/pod-resources"}
    assert mounts["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    assert {v["hostPath"]["path"] for v in pod["volumes"]} == set(mounts)
    [role] = [o for o in objects if o["kind"] == "ClusterRole"]
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods", "get"), ("pods", "patch"), ("network-attachment-definitions", "get"),
            ("network-attachment-definitions", "list"), ("events", "create")} <= granted
    assert ("pods", "update") not in granted

    config = json.dumps({"cniVersion": "1.0.0", "name": "multus-cni-network",
                         "type": "multus", "delegates": [{"type": "bridge"}]})
    objects = multus.render(ctx(), {"image": "nicop", "config": config},
                            "spec.secondaryNetwork.multus")
    [cm] = [o for o in objects if o["kind"] == "ConfigMap"]
    assert cm["data"] == {"cni-conf.json": config}
    daemon = pod_of(daemonsets(objects)[0])["containers"][0]
    assert "--multus-conf-file=/tmp/multus-conf/00-multus.conf" in daemon["command"]
    assert {"name": "multus-cni-config", "mountPath": "/tmp/multus-conf"} in \
        daemon["volumeMounts"]


def test_nicops_agents_ask_for_their_budget_unless_the_section_sets_resources() -> None:
    """A node's agents declare what they use (so the scheduler counts them and a leak cannot
    take the node): memory request and limit, a CPU request and no CPU limit. Upstream's
    containerResources for the container replaces the budget, as it replaces upstream's
    defaults."""
    spec = {"image": "nicop", "config": RDMA_CONFIG}
    agent = pod_of(daemonsets(rdma_dp.STATE.render(
        ctx({"rdmaSharedDevicePlugin": spec}), spec, "spec.rdmaSharedDevicePlugin"))[0])
    request, limit = AGENT_MEMORY["rdma-device-plugin"]
    assert agent["containers"][0]["resources"] == {
        "requests": {"cpu": "10m", "memory": request}, "limits": {"memory": limit}}
    given = {**spec, "containerResources": [{"name": "rdma-shared-dp", "requests": {
        "memory": "200Mi"}, "limits": {"memory": "1Gi"}}]}
    agent = pod_of(daemonsets(rdma_dp.STATE.render(
        ctx({"rdmaSharedDevicePlugin": given}), given, "spec.rdmaSharedDevicePlugin"))[0])
    assert agent["containers"][0]["resources"] == {
        "requests": {"memory": "200Mi"}, "limits": {"memory": "1Gi"}}
