"""The local control plane works as a whole: API server, controller-manager, scheduler and kwok."""

from __future__ import annotations

from lightkube import Client
from lightkube.generic_resource import create_global_resource
from lightkube.models.apiextensions_v1 import (
    CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion,
    CustomResourceValidation,
    JSONSchemaProps,
)
from lightkube.models.apps_v1 import DaemonSetSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod
from tests.eventually import eventually

from nicop_sim.hardware import MELLANOX_PRESENT_LABEL


def test_nodes_look_like_gpu_nodes(client: Client) -> None:
    nodes = {n.metadata.name: n for n in client.list(Node)}
    assert len(nodes) == 4
    for node in nodes.values():
        labels = node.metadata.labels
        assert labels["kubernetes.io/os"] == "linux"
        assert labels["feature.node.kubernetes.io/system-os_release.ID"] == "ubuntu"
        assert labels["feature.node.kubernetes.io/kernel-version.full"]
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    labelled = sorted(
        n for n, node in nodes.items() if MELLANOX_PRESENT_LABEL in node.metadata.labels
    )
    # node-4 has a ConnectX-6 Dx that NFD has not labelled: the pitfall the demo shows.
    assert labelled == ["node-1", "node-2", "node-3"]


def test_daemonset_runs_one_pod_per_matching_node(client: Client, namespace: str) -> None:
    labels = {"app": "probe"}
    ds = DaemonSet(
        metadata=ObjectMeta(name="probe", namespace=namespace),
        spec=DaemonSetSpec(
            selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(
                metadata=ObjectMeta(labels=labels),
                spec=PodSpec(
                    nodeSelector={MELLANOX_PRESENT_LABEL: "true"},
                    containers=[Container(name="probe", image="registry.local/probe:1")],
                ),
            ),
        ),
    )
    client.create(ds)

    def available() -> DaemonSet | None:
        status = client.get(DaemonSet, "probe", namespace=namespace).status
        if status and status.desiredNumberScheduled == 3 and status.numberAvailable == 3:
            return status
        return None

    eventually(available, what="DaemonSet probe to be available on the 3 labelled nodes")
    pods = list(client.list(Pod, namespace=namespace, labels=labels))
    assert sorted(p.spec.nodeName for p in pods) == ["node-1", "node-2", "node-3"]
    assert all(p.status.phase == "Running" for p in pods)


def test_custom_resource_definition_round_trip(client: Client) -> None:
    crd = CustomResourceDefinition(
        metadata=ObjectMeta(name="widgets.probe.nicop.io"),
        spec=CustomResourceDefinitionSpec(
            group="probe.nicop.io",
            scope="Cluster",
            names=CustomResourceDefinitionNames(plural="widgets", singular="widget", kind="Widget"),
            versions=[
                CustomResourceDefinitionVersion(
                    name="v1",
                    served=True,
                    storage=True,
                    schema=CustomResourceValidation(
                        openAPIV3Schema=JSONSchemaProps(
                            type="object",
                            properties={
                                "spec": JSONSchemaProps(
                                    type="object",
                                    properties={"size": JSONSchemaProps(type="integer", minimum=1)},
                                )
                            },
                        )
                    ),
                )
            ],
        ),
    )
    client.create(crd)
    try:
        eventually(
            lambda: any(
                c.type == "Established" and c.status == "True"
                for c in (
                    client.get(CustomResourceDefinition, crd.metadata.name).status.conditions or []
                )
            ),
            what="CRD to become Established",
        )
        widget_cls = create_global_resource("probe.nicop.io", "v1", "Widget", "widgets")
        obj = widget_cls(metadata=ObjectMeta(name="w1"), spec={"size": 3})
        eventually(lambda: _try_create(client, obj), timeout=15,
                   what="custom object to be accepted")
        back = client.get(widget_cls, "w1")
        assert back.spec == {"size": 3}
    finally:
        client.delete(CustomResourceDefinition, crd.metadata.name)


def _try_create(client: Client, obj: object) -> bool:
    from lightkube.core.exceptions import ApiError

    try:
        client.create(obj)  # type: ignore[call-overload]
    except ApiError as e:
        if e.status.code == 404:  # the new resource is not served yet
            return False
        raise
    return True
