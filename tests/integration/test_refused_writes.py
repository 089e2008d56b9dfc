"""A write the API server refuses never hides: the other components are still reconciled, the
policy status says which one failed and why, and objects another operator created with a
selector nicop cannot keep are taken over without a gap."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.apps_v1 import DaemonSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Event, Pod
from lightkube.types import PatchType
from tests.eventually import eventually
from tests.integration.agent_loop import delete, ready
from tests.integration.operator_process import NAMESPACE, OperatorProcess
from tests.integration.test_operator_policy import (
    NicClusterPolicy,
    apply_policy,
    delete_policy,
    nicop_objects,
    policy_status,
    states,
)

RDMA_CONFIG = ('{"configList": [{"resourceName": "rdma", "resourcePrefix": "nvidia.com", '
               '"rdmaHcaMax": 63, "selectors": {"vendors": ["15b3"]}}]}')
POLICY: dict[str, Any] = {
    "apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
    "metadata": {"name": "nic-cluster-policy"},
    "spec": {
        "secondaryNetwork": {
            "multus": {"image": "multus-cni", "repository": "ghcr.io/k8snetworkplumbingwg",
                       "version": "v4.1.0"},
            "cniPlugins": {"image": "plugins", "repository": "ghcr.io/k8snetworkplumbingwg",
                           "version": "v1.5.0"},
        },
        "rdmaSharedDevicePlugin": {"image": "k8s-rdma-shared-dev-plugin",
                                   "repository": "ghcr.io/mellanox", "version": "v1.5.3",
                                   "config": RDMA_CONFIG},
    },
}


@pytest.fixture
def clean(client: Client) -> Iterator[None]:
    yield
    delete_policy(client)
    delete(client, ConfigMap, "rdma-devices", NAMESPACE)
    delete(client, DaemonSet, "kube-multus-ds", NAMESPACE)
    eventually(lambda: not nicop_objects(client), what="the policy's objects to be collected")


def multus_pods(client: Client) -> list[Pod]:
    return [p for p in client.list(Pod, namespace=NAMESPACE, labels={"app": "multus"})
            if not p.metadata.deletionTimestamp]


def test_a_daemonset_with_another_selector_is_taken_over_without_a_gap(
        client: Client, operator: OperatorProcess, clean: None) -> None:
    """A Multus DaemonSet selecting its pods by `app: multus` only (as nicop's releases before
    it took upstream's selectors did) is in the way: nicop now selects `name: multus`, as
    upstream's Mellanox/network-operator manifests/state-multus-cni/0050-multus-ds.yml, and a
    selector cannot change in place. nicop recreates it keeping its pods, the new DaemonSet
    adopts them and replaces each only once its replacement is Ready: no node is without a
    Multus pod at any moment."""
    labels = {"name": "multus", "tier": "node", "app": "multus"}
    old = client.create(DaemonSet(
        metadata=ObjectMeta(name="kube-multus-ds", namespace=NAMESPACE),
        spec=DaemonSetSpec(
            selector=LabelSelector(matchLabels={"app": "multus"}),
            template=PodTemplateSpec(metadata=ObjectMeta(labels=labels), spec=PodSpec(
                containers=[Container(name="kube-multus",
                                      image="ghcr.io/k8snetworkplumbingwg/multus-cni:v4.0.2")]))),
    ))
    nodes = eventually(lambda: (pods := multus_pods(client)) and all(ready(p) for p in pods)
                       and {p.spec.nodeName for p in pods}, what="upstream's Multus pods")
    gaps: list[str] = []
    stop = threading.Event()

    def sample() -> None:  # every node keeps a Ready Multus pod throughout
        while not stop.is_set():
            covered = {p.spec.nodeName for p in multus_pods(client) if ready(p)}
            gaps.extend(sorted(nodes - covered))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        apply_policy(client, POLICY)
        eventually(lambda: policy_status(client).get("state") == "ready", timeout=120,
                   what="the policy to be ready")

        def replaced() -> bool:
            pods = multus_pods(client)
            return bool(pods) and all(p.spec.containers[0].image.endswith("multus-cni:v4.1.0")
                                      and ready(p) for p in pods) and len(pods) == len(nodes)

        eventually(replaced, timeout=120, what="every Multus pod replaced by nicop's")
    finally:
        stop.set()
        sampler.join()
    assert not gaps, f"nodes without a Ready Multus pod during the takeover: {sorted(set(gaps))}"
    new = client.get(DaemonSet, "kube-multus-ds", namespace=NAMESPACE)
    assert new.metadata.uid != old.metadata.uid
    assert new.spec.selector.matchLabels == {"name": "multus"}
    events = [e for e in client.list(Event, namespace="default")
              if e.involvedObject.name == "nic-cluster-policy" and e.reason == "Recreated"]
    assert events and "kube-multus-ds" in events[0].message


def test_a_refused_write_fails_only_its_component_and_replaces_a_planted_status(
        client: Client, operator: OperatorProcess, clean: None) -> None:
    """An immutable ConfigMap in the way of the RDMA plugin's config: the API server refuses
    nicop's write (422 `field is immutable`). That state is `error` with the API's message and
    the object named, the others are reconciled and ready, the policy says `error` with a
    reason naming the component, and a status another writer plants is replaced."""
    client.create(ConfigMap(metadata=ObjectMeta(name="rdma-devices", namespace=NAMESPACE),
                            data={"config.json": "{}"}, immutable=True))
    apply_policy(client, POLICY)

    others = ("state-multus-cni", "state-container-networking-plugins")

    def failed() -> dict[str, Any] | None:
        status = policy_status(client)
        return status if status.get("state") == "error" and all(
            states(client).get(s) == "ready" for s in others) else None

    status = eventually(failed, timeout=120, what="the RDMA state to fail, the others ready")
    applied = {s["name"]: s for s in status["appliedStates"]}
    message = applied["state-RDMA-device-plugin"]["message"]
    assert applied["state-RDMA-device-plugin"]["state"] == "error"
    assert f"ConfigMap {NAMESPACE}/rdma-devices" in message and "immutable" in message, message
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == "RDMASharedDevicePluginError"
    generation = client.get(NicClusterPolicy, "nic-cluster-policy")["metadata"]["generation"]
    assert status.get("observedGeneration", 0) < generation  # the spec is not fully applied
    eventually(lambda: [e for e in client.list(Event, namespace="default")
                      if e.involvedObject.name == "nic-cluster-policy"
                      and e.reason == "ApplyFailed" and "rdma-devices" in e.message],
               what="an ApplyFailed Event on the policy")

    planted = {"state": "ready", "appliedStates": [{"name": "state-multus-cni",
                                                    "state": "ready"}],
               "conditions": [{"type": "Ready", "status": "True", "reason": "Planted",
                               "message": "written by someone else",
                               "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    client.patch(NicClusterPolicy.Status, "nic-cluster-policy", {"status": planted},
                 patch_type=PatchType.MERGE, field_manager="other")
    eventually(lambda: policy_status(client).get("state") == "error"
               and "state-RDMA-device-plugin" in states(client), timeout=15,
               what="nicop's own status back")
