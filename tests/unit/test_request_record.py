"""What the operator writes down for each request is what the API server authorizes: the
attributes of a SubjectAccessReview (verb, group, resource, subresource, namespace, name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nicop.kube.request_record import RequestRecord, attributes


@pytest.mark.parametrize(("method", "path", "params", "expected"), [
    ("GET", "/api/v1/nodes", {"limit": 500}, ("list", "", "nodes", "", "", "")),
    ("GET", "/api/v1/nodes", {"watch": "true"}, ("watch", "", "nodes", "", "", "")),
    ("PATCH", "/api/v1/nodes/n1", None, ("patch", "", "nodes", "", "", "n1")),
    ("GET", "/api/v1/namespaces", None, ("list", "", "namespaces", "", "", "")),
    ("GET", "/api/v1/namespaces/kube-system", None,
     ("get", "", "namespaces", "", "", "kube-system")),
    ("GET", "/api/v1/namespaces/ns/pods", None, ("list", "", "pods", "", "ns", "")),
    ("POST", "/api/v1/namespaces/ns/pods/p/eviction", None,
     ("create", "", "pods", "eviction", "ns", "p")),
    ("DELETE", "/api/v1/namespaces/ns/pods/p", None, ("delete", "", "pods", "", "ns", "p")),
    ("DELETE", "/api/v1/namespaces/ns/pods", None, ("deletecollection", "", "pods", "", "ns", "")),
    ("PUT", "/apis/mellanox.com/v1alpha1/nicclusterpolicies/p/status", None,
     ("update", "mellanox.com", "nicclusterpolicies", "status", "", "p")),
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/op/leases", {"dryRun": "All"},
     ("create", "coordination.k8s.io", "leases", "", "op", "")),
])
def test_attributes_are_those_the_api_server_authorizes(
        method: str, path: str, params: dict[str, str] | None, expected: tuple[str, ...]) -> None:
    attrs = attributes(method, path, params)
    assert tuple(attrs[k] for k in ("verb", "group", "resource", "subresource", "namespace",
                                    "name")) == expected


def test_a_url_outside_the_api_is_a_non_resource_url() -> None:
    assert attributes("GET", "/version", None) == {"verb": "get", "path": "/version"}


def test_each_kind_of_request_is_written_once_with_the_own_namespace(tmp_path: Path) -> None:
    record = RequestRecord(tmp_path / "requests.jsonl", "op")
    for _ in range(3):
        record.note("GET", "/api/v1/namespaces/op/configmaps/c", None)
    record.note("GET", "/api/v1/namespaces/other/configmaps/c", None)
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [(r["namespace"], r["ownNamespace"]) for r in lines] == [("op", "op"), ("other", "op")]
