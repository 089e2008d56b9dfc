"""The Helm chart in deploy/helm/nicop, rendered by the real helm (built from its Go module by
hack/build-helm.sh) and judged by the real API server: every object it renders is accepted, the
operator pod passes the restricted Pod Security Standard, and the chart's RBAC lets the operator
do what its code does, write what its states render, and nothing it has no use for."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_global_resource
from lightkube.models.authorization_v1 import (
    NonResourceAttributes,
    ResourceAttributes,
    SelfSubjectAccessReviewSpec,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Node
from lightkube.resources.rbac_authorization_v1 import ClusterRole
from tests.eventually import eventually
from tests.monitoring import exported_series, selected_metrics

from nicop.kube import request_record
from nicop.kube.client import FIELD_MANAGER
from nicop.operator import cni_daemon, sriov_daemons
from nicop.operator import nodes as node_rules
from nicop.operator.run import LEASE_NAME
from nicop.operator.states import STATES
from nicop.operator.states.base import Context
from nicop_sim.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nicop"
BUILD_HELM = ROOT / "hack" / "build-helm.sh"
BUILD_PROMTOOL = ROOT / "hack" / "build-promtool.sh"
COPY_CRDS = "cp deploy/crds/*.yaml deploy/helm/nicop/crds/"
Doc = dict[str, Any]
DeviceClass = create_global_resource("resource.k8s.io", "v1", "DeviceClass", "deviceclasses")
KWOK_IMAGE = "registry.example.com/operator"  # played by kwok, unlike an image named nicop
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

# The ClusterRoles (and their bindings, of the same names) the operator's states render: the
# only cluster-scoped RBAC objects the chart lets the operator write.
COMPONENT_RBAC = ("multus", "ofed-driver", "ib-kubernetes", "nv-ipam-controller", "nv-ipam-node",
                  "sriov-network-config-daemon", "nicop-cni-daemon", "rdma-shared-dp-ds",
                  "network-operator-sriov-device-plugin", "sriov-device-plugin",
                  "nic-configuration-operator", "spectrum-x-operator", "nicop-dra-driver")


# ------------------------------------------------------------------ helm


@pytest.fixture(scope="session")
def helm() -> Path:
    """helm, built once per machine; a failed build fails the test with the failing step."""
    if env := os.environ.get("NICOP_HELM"):
        return Path(env)
    proc = subprocess.run([str(BUILD_HELM)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        failed = [line for line in proc.stderr.splitlines() if "FAILED" in line]
        detail = "\n".join(failed) or proc.stderr[-3000:]
        pytest.fail(f"hack/build-helm.sh could not build helm:\n{detail}", pytrace=False)
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool, built once per machine (hack/build-promtool.sh); a failed build fails the
    test with the failing step."""
    proc = subprocess.run([str(BUILD_PROMTOOL)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        failed = [line for line in proc.stderr.splitlines() if "FAILED" in line]
        detail = "\n".join(failed) or proc.stderr[-3000:]
        pytest.fail(f"hack/build-promtool.sh could not build promtool:\n{detail}", pytrace=False)
    return Path(proc.stdout.strip().splitlines()[-1])


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "HELM_CACHE_HOME": "/tmp/nicop-helm-cache",
                               "HELM_CONFIG_HOME": "/tmp/nicop-helm-config"})


def render(helm: Path, release: str, namespace: str, *values: str,
           include_crds: bool = False) -> list[Doc]:
    """`helm template` of the chart, as parsed objects."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if include_crds:
        args.append("--include-crds")
    for value in values:
        args += ["--set", value]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


# ------------------------------------------------------------------ kubectl


@dataclass
class Kubectl:
    binary: Path
    kubeconfig: Path

    def __call__(self, *args: str, stdin: str | None = None,
                 as_user: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        if as_user:
            cmd.append(f"--as={as_user}")
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False,
                              timeout=60)

    def dry_run(self, docs: list[Doc], as_user: str | None = None) -> subprocess.CompletedProcess[
            str]:
        """Server-side apply with dryRun=All: validated and admitted, never stored."""
        return self("apply", "--server-side", "--dry-run=server", "--force-conflicts",
                    f"--field-manager={FIELD_MANAGER}", "-f", "-",
                    stdin=yaml.safe_dump_all(docs), as_user=as_user)


@pytest.fixture(scope="module")
def kubectl(controlplane_bin: Path, kubeconfig: Path) -> Kubectl:
    return Kubectl(controlplane_bin / "kubectl", kubeconfig)


# ------------------------------------------------------------------ the chart on its own


def test_chart_ships_the_crds_nicop_generates() -> None:
    generated = {p.name: p.read_text() for p in (ROOT / "deploy" / "crds").glob("*.yaml")}
    shipped = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    stale = sorted(name for name in generated.keys() | shipped.keys()
                   if generated.get(name) != shipped.get(name))
    assert not stale, (f"deploy/helm/nicop/crds differs from deploy/crds in {stale}; copy them: "
                       f"rm deploy/helm/nicop/crds/*.yaml && {COPY_CRDS}")


def test_chart_version_is_the_package_version() -> None:
    """The image tag defaults to appVersion, so it must name the version this tree builds."""
    project = (ROOT / "pyproject.toml").read_text()
    assert f'\nversion = "{APP_VERSION}"\n' in project


def test_chart_passes_helm_lint_strict(helm: Path) -> None:
    proc = run_helm(helm, "lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_mistyped_value_is_refused_by_name(helm: Path) -> None:
    proc = run_helm(helm, "template", "nicop", str(CHART), "--set", "logFormatt=json")
    assert proc.returncode != 0
    assert "logFormatt" in proc.stderr
    proc = run_helm(helm, "template", "nicop", str(CHART), "--set", "logFormat=xml")
    assert proc.returncode != 0
    assert "logFormat" in proc.stderr and "json" in proc.stderr


def test_operator_deployment_is_what_the_operator_expects(helm: Path) -> None:
    docs = render(helm, "nicop", "nvidia-network-operator")
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert len(pod["spec"]["containers"]) == 1
    container = pod["spec"]["containers"][0]
    # A drain during a driver upgrade never evicts the operator that runs it.
    assert pod["metadata"]["labels"]["nvidia.com/ofed-driver-upgrade-drain.skip"] == "true"
    # A new pod is ready as a standby, so an upgrade rolls.
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    assert deployment["spec"]["replicas"] == 1
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CNI_BIN_DIR"] == "/opt/cni/bin"
    assert env["CNI_NETWORK_DIR"] == "/etc/cni/net.d"
    assert env["NICOP_IMAGE"] == container["image"]  # the agents run from the chart's image
    assert container["args"][0] == "operator"
    assert "--leader-elect" in container["args"]
    assert "--log-format=json" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8081, "protocol": "TCP"}]
    assert pod["spec"]["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert container["image"] == f"nicop:{APP_VERSION}"


def test_driver_init_container_image_is_set_as_upstreams_chart_sets_it(helm: Path) -> None:
    """Upstream's chart (Mellanox/network-operator deployment/network-operator/values.yaml,
    `operator.ofedDriver.initContainer`) turns the driver init container on by default and
    hands its image to the operator as OFED_INIT_CONTAINER_IMAGE; `enable: false` drops it."""
    def env(*values: str) -> dict[str, str]:
        container = one(render(helm, "nicop", "nvidia-network-operator", *values),
                        "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value", "") for e in container["env"]}

    assert env()["OFED_INIT_CONTAINER_IMAGE"] == (
        "nvcr.io/nvidia/mellanox/network-operator-init-container:network-operator-v25.10.0")
    assert env("ofedDriver.initContainer.repository=reg.example.com/mirror",
               "ofedDriver.initContainer.version=v1")["OFED_INIT_CONTAINER_IMAGE"] == (
        "reg.example.com/mirror/network-operator-init-container:v1")
    assert "OFED_INIT_CONTAINER_IMAGE" not in env("ofedDriver.initContainer.enable=false")


# ------------------------------------------------------------------ the API server's verdict


def test_every_rendered_object_is_accepted_by_the_api_server(
    helm: Path, kubectl: Kubectl, namespace: str
) -> None:
    """CRDs included, every optional template turned on, non-default values set."""
    docs = render(
        helm, "nicop", namespace,
        "metrics.service.enabled=true",
        "imagePullSecrets[0].name=registry-credentials",
        "image.repository=registry.example.com/nicop",
        "image.digest=sha256:" + "a" * 64,
        "priorityClassName=system-cluster-critical",
        "extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy:3128",
        "nodeSelector.node-role\\.kubernetes\\.io/control-plane=",
        "podAnnotations.example\\.com/team=network",
        "leaderElection.leaseDuration=30",
        include_crds=True,
    )
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                     "Deployment", "Role", "RoleBinding", "Service", "ServiceAccount",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert len(crds) == len(list((ROOT / "deploy" / "crds").glob("*.yaml")))
    proc = kubectl.dry_run(docs)
    assert proc.returncode == 0, proc.stderr
    accepted = [line for line in proc.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(docs), proc.stdout


def test_without_rbac_and_service_account_only_the_deployment_is_rendered(
    helm: Path, kubectl: Kubectl, namespace: str
) -> None:
    docs = render(helm, "nicop", namespace, "rbac.create=false", "serviceAccount.create=false",
                  "serviceAccount.name=platform-operator")
    assert [d["kind"] for d in docs] == ["Deployment"]
    assert docs[0]["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"
    proc = kubectl.dry_run(docs)
    assert proc.returncode == 0, proc.stderr


def test_operator_pod_meets_the_restricted_pod_security_standard(
    helm: Path, kubectl: Kubectl, namespace: str
) -> None:
    proc = kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                   "pod-security.kubernetes.io/warn=restricted")
    assert proc.returncode == 0, proc.stderr
    docs = render(helm, "nicop", namespace)
    proc = kubectl("apply", "--server-side", "-f", "-",
                   stdin=yaml.safe_dump(one(docs, "ServiceAccount")))
    assert proc.returncode == 0, proc.stderr
    deployment = one(docs, "Deployment")
    template = deployment["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {**template["metadata"], "name": "operator", "namespace": namespace},
           "spec": template["spec"]}
    proc = kubectl("create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod))
    assert proc.returncode == 0, proc.stderr
    proc = kubectl.dry_run([deployment])
    assert proc.returncode == 0, proc.stderr
    assert "PodSecurity" not in proc.stderr, proc.stderr


def test_install_upgrade_and_uninstall(
    helm: Path, kubectl: Kubectl, kubeconfig: Path, namespace: str, crds: list[str]
) -> None:
    """The release lifecycle a user runs, with kwok standing in for the operator's pod (an image
    not named nicop, which the node stand-ins would run for real): the install waits for the
    Deployment, an upgrade replaces the pod, an uninstall removes every object of the release
    but keeps the CRDs (and so the users' CRs)."""
    release = f"r{uuid.uuid4().hex[:6]}"
    base = ["--kubeconfig", str(kubeconfig), "--namespace", namespace]
    proc = run_helm(helm, "install", release, str(CHART), *base, "--set",
                    f"image.repository={KWOK_IMAGE}", "--wait", "--timeout", "90s")
    assert proc.returncode == 0, proc.stderr
    deployment = f"{release}-nicop"

    def images() -> str:
        out = kubectl("-n", namespace, "get", "pods", "-l", f"app.kubernetes.io/instance={release}",
                      "-o", "jsonpath={.items[*].spec.containers[0].image}")
        return out.stdout.strip()

    assert images() == f"{KWOK_IMAGE}:{APP_VERSION}"
    proc = run_helm(helm, "upgrade", release, str(CHART), *base, "--reuse-values",
                    "--set", "image.tag=0.1.1", "--wait", "--timeout", "90s")
    assert proc.returncode == 0, proc.stderr
    assert images() == f"{KWOK_IMAGE}:0.1.1"
    proc = run_helm(helm, "uninstall", release, *base, "--wait")
    assert proc.returncode == 0, proc.stderr
    left = kubectl("get", f"deployment/{deployment}", f"serviceaccount/{deployment}",
                   f"role/{deployment}", f"rolebinding/{deployment}", "-n", namespace,
                   "--ignore-not-found", "-o", "name")
    assert left.stdout.strip() == ""
    left = kubectl("get", f"clusterrole/{deployment}", f"clusterrole/{deployment}-components",
                   f"clusterrolebinding/{deployment}", "--ignore-not-found", "-o", "name")
    assert left.stdout.strip() == ""
    kept = kubectl("get", "crd", "nicclusterpolicies.mellanox.com", "-o", "name")
    assert kept.returncode == 0, kept.stderr


# ------------------------------------------------------------------ RBAC


@dataclass
class Installed:
    namespace: str
    service_account: str
    docs: list[Doc]
    kubeconfig: Path  # authenticates as the ServiceAccount, with a token of it

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


def service_account_kubeconfig(kubectl: Kubectl, namespace: str, service_account: str,
                               path: Path) -> Path:
    """A kubeconfig that authenticates with a fresh token of the ServiceAccount."""
    proc = kubectl("create", "token", service_account, "-n", namespace, "--duration=1h")
    assert proc.returncode == 0, proc.stderr
    admin = yaml.safe_load(kubectl.kubeconfig.read_text())
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "operator", "user": {"token": proc.stdout.strip()}}],
        "contexts": [{"name": "operator", "context": {
            "cluster": admin["clusters"][0]["name"], "user": "operator"}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def installed(helm: Path, kubectl: Kubectl, client: Client, crds: list[str],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The chart's ServiceAccount and RBAC applied for real into a fresh namespace (CRDs are
    installed so that `kubectl auth can-i` knows their resources)."""
    namespace = f"t-helm-{uuid.uuid4().hex[:6]}"
    release = f"r{uuid.uuid4().hex[:6]}"
    client.create(Namespace(metadata=ObjectMeta(name=namespace)))
    docs = [d for d in render(helm, release, namespace) if d["kind"] != "Deployment"]
    try:
        proc = kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(docs))
        assert proc.returncode == 0, proc.stderr
        sa = one(docs, "ServiceAccount")["metadata"]["name"]
        kubeconfig = tmp_path_factory.mktemp("sa") / "kubeconfig"
        yield Installed(namespace, sa, docs,
                        service_account_kubeconfig(kubectl, namespace, sa, kubeconfig))
    finally:
        for d in docs:
            if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding"):
                kubectl("delete", "--ignore-not-found", d["kind"].lower(), d["metadata"]["name"])
        client.delete(Namespace, namespace)


# What the operator must never be allowed, as `kubectl auth can-i` arguments: {ns} is the
# operator's namespace. (What it must be allowed is what it did: recorded_requests.)
DENIED: tuple[tuple[str, str], ...] = (
    *(("secrets", f"{v} secrets -n {n}") for n in ("default", "kube-system", "{ns}")
      for v in ("get", "list", "watch")),
    *(("secrets", f"{v} secrets -A") for v in ("list", "watch")),
    ("drains evict, never delete", "delete pods -n default"),
    ("no pods of its own", "create pods -n default"),
    ("components only in its namespace", "create daemonsets.apps -n default"),
    ("components only in its namespace", "patch configmaps -n kube-system"),
    ("SR-IOV node policies only in its namespace",
     "list sriovnetworknodepolicies.sriovnetwork.openshift.io -A"),
    ("users own their CRs; nicop writes status", "patch nicclusterpolicies.mellanox.com"),
    ("users own their CRs; nicop writes status", "delete macvlannetworks.mellanox.com"),
    ("users own their CRs; nicop writes status",
     "patch sriovnetworknodepolicies.sriovnetwork.openshift.io -n {ns}"),
    ("users own their CRs; nicop writes status",
     "create sriovnetworks.sriovnetwork.openshift.io -n default"),
    ("only its components' RBAC", "patch clusterroles.rbac.authorization.k8s.io/cluster-admin"),
    ("only its components' RBAC", "delete clusterroles.rbac.authorization.k8s.io/admin"),
    ("only its components' RBAC",
     "patch clusterrolebindings.rbac.authorization.k8s.io/cluster-admin"),
    ("only its components' RBAC", "create roles.rbac.authorization.k8s.io -n {ns}"),
    ("grants only what it holds", "escalate clusterroles.rbac.authorization.k8s.io"),
    ("grants only what it holds", "bind clusterroles.rbac.authorization.k8s.io"),
    ("no identity changes", "impersonate serviceaccounts"),
    ("no node removal", "delete nodes"),
    ("no namespace removal", "delete namespaces"),
    ("the chart owns the CRDs", "create customresourcedefinitions.apiextensions.k8s.io"),
    ("the chart owns the CRDs", "delete customresourcedefinitions.apiextensions.k8s.io"),
)


def resource_attributes(args: str, namespace: str) -> ResourceAttributes:
    """`kubectl auth can-i` arguments (verb resource[.group][/name] [--subresource=s]
    [-n ns | -A]) as the attributes the API server authorizes."""
    verb, target, *flags = args.replace("{ns}", namespace).split()
    resource, _, name = target.partition("/")
    resource, _, group = resource.partition(".")
    attrs = ResourceAttributes(verb=verb, group=group, resource=resource, name=name or None)
    for i, flag in enumerate(flags):
        if flag.startswith("--subresource="):
            attrs.subresource = flag.split("=", 1)[1]
        elif flag == "-n":
            attrs.namespace = flags[i + 1]
    return attrs


def can_i(kubectl: Kubectl, who: Installed, rows: tuple[tuple[str, str], ...]) -> list[
        tuple[str, str, bool]]:
    """(why, arguments, allowed) for each row, asked by the ServiceAccount itself (its token)."""
    proc = kubectl("api-resources", "-o", "name")
    assert proc.returncode == 0, proc.stderr
    served = set(proc.stdout.split())
    client = Client(KubeConfig.from_file(who.kubeconfig))
    answers = []
    for why, args in rows:
        attrs = resource_attributes(args, who.namespace)
        kind = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
        assert kind in served, f"{args}: the API server serves no {kind}"
        review = client.create(SelfSubjectAccessReview(
            spec=SelfSubjectAccessReviewSpec(resourceAttributes=attrs)))
        assert review.status is not None
        answers.append((why, args.replace("{ns}", who.namespace), review.status.allowed))
    return answers


def recorded_requests(namespace: str) -> set[tuple[str, ...]]:
    """Each kind of request the operators of this session made (NICOP_RECORD_REQUESTS, set by
    tests/conftest.py), as (verb, group, resource, subresource, namespace, name) or, for a
    non-resource URL, (verb, path); an operator's own namespace becomes `namespace`."""
    path = Path(os.environ[request_record.ENV])
    seen = set()
    for line in path.read_text().splitlines() if path.exists() else ():
        r = json.loads(line)
        if "path" in r:
            seen.add((r["verb"], r["path"]))
            continue
        ns = namespace if r["namespace"] and r["namespace"] == r["ownNamespace"] else r["namespace"]
        seen.add((r["verb"], r["group"], r["resource"], r["subresource"], ns, r["name"]))
    return seen


@pytest.mark.after_all
def test_operator_may_do_everything_it_did_in_this_session(installed: Installed) -> None:
    """Every kind of request that any `nicop operator` of this test session made (each
    integration test, the demo and the real node run it; this test runs after them all) is
    allowed to the chart's ServiceAccount, asked by the ServiceAccount itself."""
    requests = recorded_requests(installed.namespace)
    if not requests:
        pytest.skip("no operator ran in this session: the requests to check are recorded by "
                    "the tests that run one; run the whole suite")
    client = Client(KubeConfig.from_file(installed.kubeconfig))

    def allowed(request: tuple[str, ...]) -> bool:
        if len(request) == 2:
            spec = SelfSubjectAccessReviewSpec(nonResourceAttributes=NonResourceAttributes(
                verb=request[0], path=request[1]))
        else:
            verb, group, resource, subresource, namespace, name = request
            spec = SelfSubjectAccessReviewSpec(resourceAttributes=ResourceAttributes(
                verb=verb, group=group, resource=resource, subresource=subresource or None,
                namespace=namespace or None, name=name or None))
        review = client.create(SelfSubjectAccessReview(spec=spec))
        assert review.status is not None
        return review.status.allowed

    with ThreadPoolExecutor(8) as pool:
        answers = dict(zip(requests, pool.map(allowed, requests), strict=True))
    refused = sorted(" ".join(r) for r, ok in answers.items() if not ok)
    assert not refused, (f"the chart's RBAC refuses {len(refused)} of the {len(requests)} kinds "
                         "of request the operator made (verb group resource subresource "
                         "namespace name):\n" + "\n".join(refused))


def test_operator_may_not_read_secrets_or_act_beyond_its_job(kubectl: Kubectl,
                                                             installed: Installed) -> None:
    allowed = [f"{why}: {args}" for why, args, ok in can_i(kubectl, installed, DENIED) if ok]
    assert not allowed, "the chart's RBAC allows more than needed:\n" + "\n".join(allowed)


def test_operator_writes_only_its_own_drivers_device_classes(
        client: Client, installed: Installed) -> None:
    """RBAC lets the operator write any DeviceClass (the SR-IOV resources' names are the
    users'); the chart's admission policy refuses, with its reason, a write as the operator to
    another driver's (the NVIDIA GPU driver's gpu.nvidia.com) and lets one under rdma.nicop.io
    through."""
    def device_class(name: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name}, "spec": {}}

    gpu = DeviceClass(**device_class("gpu.nvidia.com"))
    client.apply(gpu, field_manager="gpu-driver", force=True)
    operator = Client(KubeConfig.from_file(installed.kubeconfig), field_manager="nicop")
    try:
        def refused() -> str | None:
            try:
                operator.apply(DeviceClass(**{**device_class("gpu.nvidia.com"), "spec": {
                    "selectors": [{"cel": {"expression": "true"}}]}}), force=True)
            except ApiError as e:
                return e.status.message if e.status.code == 403 else None
            return None

        said = eventually(refused, 30, "the admission policy to refuse the operator")
        assert "nicop writes only the DeviceClasses of its DRA driver" in said, said
        with pytest.raises(ApiError) as deleting:
            operator.delete(DeviceClass, "gpu.nvidia.com")
        assert deleting.value.status.code == 403
        own = operator.apply(DeviceClass(**device_class("mlnx-vf.sriov.rdma.nicop.io")))
        operator.delete(DeviceClass, own.metadata.name)
    finally:
        client.delete(DeviceClass, "gpu.nvidia.com")


def test_kubectl_auth_can_i_agrees(kubectl: Kubectl, installed: Installed) -> None:
    """What docs/install.md tells users to run, impersonating the ServiceAccount."""
    for args, answer in (("create pods --subresource=eviction -n default", "yes"),
                         ("get secrets -n default", "no"),
                         ("patch clusterroles.rbac.authorization.k8s.io/multus", "yes")):
        proc = kubectl("auth", "can-i", *args.split(), as_user=installed.user)
        assert proc.stdout.strip() == answer, f"kubectl auth can-i {args}: {proc.stderr}"


# ------------------------------------------------------------------ what the states render


def full_policy() -> Doc:
    """One NicClusterPolicy with every section of the example policies."""
    spec: Doc = {}
    for path in sorted((ROOT / "examples").glob("nicclusterpolicy-*.yaml")):
        for key, value in (yaml.safe_load(path.read_text())["spec"] or {}).items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec.setdefault(key, value)
    return {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
            "metadata": {"name": "nic-cluster-policy", "uid": "0"}, "spec": spec}


# Sections whose upstream images need rights the chart gives the operator only when asked
# (values componentPermissions.*).
OPT_IN = {"nicConfigurationOperator": "componentPermissions.nicConfigurationOperator=true",
          "spectrumXOperator": "componentPermissions.spectrumXOperator=true"}


def rendered_by_states(namespace: str, nodes: list[Doc], opt_in: bool = True) -> list[Doc]:
    """Every object the operator renders for its components: the states of the full policy on
    these nodes, with upstream's images and with nicop's agents, the SR-IOV daemons and the CNI
    daemon. Without `opt_in`, the sections the chart's default values do not grant for are
    left out."""
    policy = full_policy()
    if not opt_in:
        policy["spec"] = {k: v for k, v in policy["spec"].items() if k not in OPT_IN}
    ctx = Context(policy, namespace, managed_nodes=[n for n in nodes if node_rules.is_managed(n)])
    missing = [s.name for s in STATES if s.section_of(policy) is None
               and (opt_in or s.section[0] not in OPT_IN)]
    assert not missing, (f"states {missing} have no section in examples/nicclusterpolicy-*.yaml, "
                         "so the chart's RBAC cannot be checked against what they render")
    objects = []
    for state in STATES:
        section = state.section_of(policy)
        if section is None:
            continue
        objects += state.render(ctx, section, state.path)
        objects += [o for o in state.render(ctx, {**section, "image": "nicop"}, state.path)
                    if o not in objects]
    config = sriov_daemons.default_config(namespace, single_node=False)
    objects += sriov_daemons.render_config_daemon(ctx, config)
    objects += sriov_daemons.render_device_plugin(ctx, config)
    objects += cni_daemon.render(ctx, ["sriov", "nv-ipam"])
    return objects


def rule_tuples(rules: list[Doc]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule.get("apiGroups", [])
            for r in rule.get("resources", []) for v in rule.get("verbs", [])}


def test_chart_grants_exactly_what_the_components_get(helm: Path) -> None:
    """The components ClusterRole is the union of the states' ClusterRoles (holding them is what
    lets the operator grant them), and the operator writes only their names."""
    docs = render(helm, "nicop", "nvidia-network-operator", *OPT_IN.values())
    objects = rendered_by_states("nvidia-network-operator", [])
    granted = rule_tuples([r for o in objects if o["kind"] == "ClusterRole" for r in o["rules"]])
    held = rule_tuples(one(docs, "ClusterRole", "nicop-components")["rules"])
    assert held == granted, (f"missing: {sorted(granted - held)}; not granted to any component: "
                             f"{sorted(held - granted)}")
    names = {o["metadata"]["name"] for o in objects
             if o["kind"] in ("ClusterRole", "ClusterRoleBinding")}
    assert names == set(COMPONENT_RBAC)
    writable = [set(r["resourceNames"]) for r in one(docs, "ClusterRole", "nicop")["rules"]
                if r.get("resourceNames") and "clusterroles" in r["resources"]]
    assert writable == [set(COMPONENT_RBAC)]


def test_by_default_the_chart_holds_no_right_only_upstream_operators_need(helm: Path) -> None:
    """The components ClusterRole of the default values holds exactly what the components other
    than the NIC configuration and Spectrum-X operators get."""
    docs = render(helm, "nicop", "nvidia-network-operator")
    objects = rendered_by_states("nvidia-network-operator", [], opt_in=False)
    granted = rule_tuples([r for o in objects if o["kind"] == "ClusterRole" for r in o["rules"]])
    assert rule_tuples(one(docs, "ClusterRole", "nicop-components")["rules"]) == granted


def test_operator_may_write_every_object_its_states_render(
    kubectl: Kubectl, installed: Installed, client: Client
) -> None:
    """As the ServiceAccount, with the API server's RBAC escalation checks: a ClusterRole can
    only be created by who holds its rules, a binding by who holds the role's rules."""
    nodes = [n.to_dict() for n in client.list(Node)]
    objects = rendered_by_states(installed.namespace, nodes, opt_in=False)
    assert {o["kind"] for o in objects} >= {"ServiceAccount", "ConfigMap", "DaemonSet",
                                            "Deployment", "ClusterRole", "ClusterRoleBinding"}
    bindings = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    others = [o for o in objects if o["kind"] != "ClusterRoleBinding"]
    proc = kubectl.dry_run(others, as_user=installed.user)
    assert proc.returncode == 0, proc.stderr
    # A binding is judged against its role as stored: create the roles the cluster lacks.
    created = []
    try:
        for role in (o for o in objects if o["kind"] == "ClusterRole"):
            try:
                client.get(ClusterRole, role["metadata"]["name"])
            except ApiError as e:
                if e.status.code != 404:
                    raise
                proc = kubectl("create", "-f", "-", stdin=yaml.safe_dump(role))
                assert proc.returncode == 0, proc.stderr
                created.append(role["metadata"]["name"])
        proc = kubectl.dry_run(bindings, as_user=installed.user)
        assert proc.returncode == 0, proc.stderr
    finally:
        for name in created:
            kubectl("delete", "--ignore-not-found", "clusterrole", name)


# ------------------------------------------------------------------ the operator itself


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


POD_NAME = "nicop-7d9f8-abcde"


@contextlib.contextmanager
def operator_as(helm: Path, installed: Installed, log: Path) -> Iterator[int]:
    """`nicop operator` run as the image runs it, with the Deployment's arguments and
    environment and the ServiceAccount's token, until it leads with its caches synced; yields
    its health port."""
    deployment = one(render(helm, "nicop", installed.namespace), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    args = [a if not a.startswith("--health-port=") else f"--health-port={port}"
            for a in container["args"]]
    downward = {"metadata.namespace": installed.namespace, "metadata.name": POD_NAME}
    env = {e["name"]: e["value"] if "value" in e else downward[e["valueFrom"]["fieldRef"][
        "fieldPath"]] for e in container["env"]}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nicop", *args, "--kubeconfig", str(installed.kubeconfig)],
            env={**{k: v for k, v in os.environ.items() if k != "KUBECONFIG"}, **env},
            stdout=out, stderr=subprocess.STDOUT,
        )

    def leads(url: str) -> bool:
        """The process holds the lease and its caches are synced (a standby is ready too)."""
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return "\nnicop_leader 1.0" in r.read().decode()
        except OSError:
            return False

    def alive() -> None:
        assert proc.poll() is None, f"operator exited:\n{refusals(log)}"

    try:
        try:
            eventually(lambda: http_status(f"http://127.0.0.1:{port}/readyz") == 200
                       and leads(f"http://127.0.0.1:{port}/metrics"), 30,
                       "the operator leading with its caches synced", alive=alive)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{refusals(log)}") from None
        yield port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def refusals(log: Path) -> str:
    """The API server's refusals in the log, once each, or the log's end."""
    lines = [json.loads(line).get("msg", "") for line in log.read_text().splitlines()
             if "403 Forbidden" in line]
    found = sorted({m.split("403 Forbidden: ", 1)[-1].split(";")[0] for m in lines})
    return "\n".join(found) if found else log.read_text()[-3000:]


def test_operator_leads_with_the_chart_arguments_and_only_its_permissions(
    helm: Path, installed: Installed, client: Client, tmp_path: Path
) -> None:
    """Run as the chart runs it, the operator takes the Lease and syncs every informer, so the
    API server refused none of its lists and watches."""
    log = tmp_path / "operator.log"
    with operator_as(helm, installed, log) as port:
        assert http_status(f"http://127.0.0.1:{port}/healthz") == 200
        lease = client.get(Lease, LEASE_NAME, namespace=installed.namespace)
        assert lease.spec is not None and lease.spec.holderIdentity == POD_NAME
        assert "403 Forbidden" not in log.read_text(), refusals(log)


def test_a_permission_the_operator_lacks_fails_only_the_component_that_needs_it(
    helm: Path, kubectl: Kubectl, installed: Installed, client: Client, tmp_path: Path
) -> None:
    """The chart's Role edited so ConfigMaps can be read but not written: the RDMA plugin's
    state, whose config is a ConfigMap, is `error` with the API server's 403; Multus, which
    needs none, is ready."""
    role = one(installed.docs, "Role")
    edited = copy.deepcopy(role)
    for rule in edited["rules"]:
        rule["resources"] = [r for r in rule.get("resources", []) if r != "configmaps"]
    edited["rules"] = [r for r in edited["rules"] if r["resources"]]
    edited["rules"].append({"apiGroups": [""], "resources": ["configmaps"],
                            "verbs": ["get", "list", "watch"]})
    proc = kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                   stdin=yaml.safe_dump(edited))
    assert proc.returncode == 0, proc.stderr
    ncp = create_global_resource("mellanox.com", "v1alpha1", "NicClusterPolicy",
                                 "nicclusterpolicies")
    config = ('{"configList": [{"resourceName": "rdma", "rdmaHcaMax": 63, '
              '"selectors": {"vendors": ["15b3"]}}]}')
    policy = {"apiVersion": "mellanox.com/v1alpha1", "kind": "NicClusterPolicy",
              "metadata": {"name": "nic-cluster-policy"}, "spec": {
                  "secondaryNetwork": {"multus": {
                      "image": "multus-cni", "repository": "ghcr.io/k8snetworkplumbingwg",
                      "version": "v4.1.0"}},
                  "rdmaSharedDevicePlugin": {
                      "image": "k8s-rdma-shared-dev-plugin", "repository": "ghcr.io/mellanox",
                      "version": "v1.5.3", "config": config}}}

    def states() -> dict[str, dict[str, str]]:
        status = client.get(ncp, "nic-cluster-policy").get("status") or {}
        return {s["name"]: s for s in status.get("appliedStates") or []}

    try:
        with operator_as(helm, installed, tmp_path / "operator.log"):
            client.apply(ncp(**policy), field_manager="test", force=True)
            deadline = time.monotonic() + 120
            while not (states().get("state-RDMA-device-plugin", {}).get("state") == "error"
                       and states().get("state-multus-cni", {}).get("state") == "ready"):
                assert time.monotonic() < deadline, states()
                time.sleep(0.5)
            message = states()["state-RDMA-device-plugin"]["message"]
            assert "403" in message and "configmaps" in message, message
            assert f"ConfigMap {installed.namespace}/rdma-devices" in message, message
    finally:
        client.delete(ncp, "nic-cluster-policy")
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=yaml.safe_dump(role))


# ------------------------------------------------------------------ monitoring

MONITORING = ("monitoring.dashboards.enabled=true", "monitoring.serviceMonitor.enabled=true",
              "monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true")
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
PROMETHEUS_OPERATOR_CRDS = ROOT / "tests" / "data" / "prometheus-operator-crds.yaml"
# What Prometheus expands in an annotation; anything else left in one is a template mistake.
PROMETHEUS_TEMPLATE = re.compile(r"\{\{ (\$labels\.\w+|\$value) \}\}")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


@pytest.fixture(scope="module")
def prometheus_operator_crds(kubectl: Kubectl) -> Iterator[None]:
    """ServiceMonitor, PodMonitor and PrometheusRule served by the API server, from minimal
    CRDs (tests/data/prometheus-operator-crds.yaml: upstream's kinds, names and the fields the
    chart sets with their types and Duration pattern, every other field preserved unvalidated;
    upstream's full CRDs are thousands of lines)."""
    docs = [d for d in yaml.safe_load_all(PROMETHEUS_OPERATOR_CRDS.read_text()) if d]
    names = [f"crd/{d['metadata']['name']}" for d in docs]
    proc = kubectl("apply", "--server-side", "-f", str(PROMETHEUS_OPERATOR_CRDS))
    assert proc.returncode == 0, proc.stderr
    try:
        proc = kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
        assert proc.returncode == 0, proc.stderr
        yield
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=false", *names)


def test_monitoring_is_off_by_default(helm: Path) -> None:
    kinds = {d["kind"] for d in render(helm, "nicop", "nvidia-network-operator")}
    assert not kinds & {*MONITORING_KINDS, "ConfigMap", "Service"}, kinds


def test_monitoring_objects_are_accepted_by_the_api_server(
    helm: Path, kubectl: Kubectl, namespace: str, prometheus_operator_crds: None
) -> None:
    values = (*MONITORING, "monitoring.serviceMonitor.labels.release=kube-prometheus-stack",
              "monitoring.podMonitor.scrapeTimeout=10s",
              "monitoring.prometheusRule.labels.team=net",
              "monitoring.dashboards.annotations.grafana_folder=Networking")
    proc = run_helm(helm, "lint", "--strict", str(CHART),
                    *(a for v in values for a in ("--set", v)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    docs = render(helm, "nicop", namespace, *values)
    monitoring = [d for d in docs if d["kind"] in (*MONITORING_KINDS, "ConfigMap", "Service")]
    assert sorted(d["kind"] for d in monitoring) == [
        "ConfigMap", "PodMonitor", "PrometheusRule", "Service", "ServiceMonitor"]
    proc = kubectl.dry_run(docs)
    assert proc.returncode == 0, proc.stderr
    accepted = [line for line in proc.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(docs), proc.stdout


def test_dashboard_config_map_is_what_grafanas_sidecar_loads(helm: Path) -> None:
    board = (CHART / "dashboards" / "nicop.json").read_text()
    cm = one(render(helm, "nicop", "nvidia-network-operator", *MONITORING), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "nvidia-network-operator"
    assert json.loads(cm["data"]["nicop.json"]) == json.loads(board)
    cm = one(render(helm, "nicop", "nvidia-network-operator", *MONITORING,
                    "monitoring.dashboards.namespace=monitoring",
                    "monitoring.dashboards.label=grafana_dashboard_nicop",
                    "monitoring.dashboards.labelValue=yes"), "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard_nicop"] == "yes"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]


def test_service_monitor_scrapes_the_operators_metrics_port(helm: Path) -> None:
    """Turning on the ServiceMonitor alone brings the Service it needs; the Service selects the
    operator's pod and the ServiceMonitor the Service, by the port named metrics."""
    docs = render(helm, "nicop", "nvidia-network-operator",
                  "monitoring.serviceMonitor.enabled=true",
                  "monitoring.serviceMonitor.labels.release=prom")
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    pod = one(docs, "Deployment")["spec"]["template"]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["nvidia-network-operator"]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    [port] = service["spec"]["ports"]
    assert endpoint["port"] == port["name"] == "metrics" and endpoint["path"] == "/metrics"
    assert port["targetPort"] in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]


def kept_by(monitor: Doc, labels: dict[str, str]) -> bool:
    """Whether the PodMonitor's keep relabelling keeps a pod with these labels, as Prometheus
    joins the source labels (a labelpresent label is "true" or absent)."""
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    for rule in endpoint["relabelings"]:
        if rule["action"] != "keep":
            continue
        values = []
        for source in rule["sourceLabels"]:
            if source.startswith("__meta_kubernetes_pod_labelpresent_"):
                present = any(re.sub(r"[^a-zA-Z0-9_]", "_", k) == source.removeprefix(
                    "__meta_kubernetes_pod_labelpresent_") for k in labels)
                values.append("true" if present else "")
            else:
                values.append(labels.get(source.removeprefix("__meta_kubernetes_pod_label_"), ""))
        if not re.fullmatch(rule["regex"], rule.get("separator", ";").join(values)):
            return False
    selector = monitor["spec"]["selector"]
    return all(e["key"] in labels for e in selector["matchExpressions"]
               if e["operator"] == "Exists")


def test_pod_monitor_scrapes_every_nicop_agent_and_labels_it_with_its_node(helm: Path) -> None:
    """The agents are found by the labels the operator's states put on their pods (rendered
    here by the states themselves, with a NicNodePolicy's RDMA plugin and a driver pool too),
    every pod the states give a `metrics` port among them; the operator's own pod is left to
    the ServiceMonitor."""
    docs = render(helm, "nicop", "nvidia-network-operator", *MONITORING)
    monitor = one(docs, "PodMonitor")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    assert {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node"} in endpoint["relabelings"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["nvidia-network-operator"]}

    node = {"metadata": {"name": "gpu-1", "labels": {
        "feature.node.kubernetes.io/pci-15b3.present": "true",
        "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-91-generic"}}}
    objects = rendered_by_states("nvidia-network-operator", [node])
    nnp = {**full_policy(), "kind": "NicNodePolicy", "metadata": {"name": "gpu-a", "uid": "1"}}
    rdma = next(s for s in STATES if s.name == "state-RDMA-device-plugin")
    objects += rdma.render(Context(nnp, "nvidia-network-operator", managed_nodes=[node],
                                   node_policy="gpu-a"),
                           {**(rdma.section_of(nnp) or {}), "image": "nicop"}, rdma.path)
    workloads = {(o["metadata"]["name"], o["spec"]["template"]["spec"]["containers"][0]["image"]):
                 o["spec"]["template"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")}
    agents = {name: t for (name, image), t in workloads.items() if image.startswith("nicop:")}
    wanted = {"rdma-shared-dp-ds", "network-operator-sriov-device-plugin", "sriov-device-plugin",
              "sriov-network-config-daemon", "nicop-cni-daemon"}
    assert wanted <= agents.keys(), sorted(agents)
    drivers = [t for t in agents.values() if "nvidia.com/ofed-driver" in t["metadata"]["labels"]]
    nnp_plugins = [t for n, t in agents.items() if n.startswith("rdma-shared-dp-ds-")]
    assert drivers and nnp_plugins, sorted(agents)
    for template in [*(agents[n] for n in wanted), *drivers, *nnp_plugins]:
        assert kept_by(monitor, template["metadata"]["labels"]), template["metadata"]["labels"]
    serving = [(name, t) for (name, _), t in workloads.items() if any(
        p.get("name") == "metrics" for c in t["spec"]["containers"] for p in c.get("ports") or [])]
    missed = [name for name, t in serving if not kept_by(monitor, t["metadata"]["labels"])]
    assert not missed, f"pods with a metrics port the PodMonitor does not scrape: {missed}"
    operator_pod = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not kept_by(monitor, operator_pod)


def alert_rules(docs: list[Doc]) -> list[Doc]:
    return [r for g in one(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]


def test_promtool_accepts_the_rules(helm: Path, promtool: Path, tmp_path: Path) -> None:
    """`promtool check rules` (Prometheus' own checker, built from its Go module) accepts the
    rule groups of the rendered PrometheusRule, with the default values and with others."""
    for values in ((), ("monitoring.prometheusRule.policyNotReadyFor=5m",
                        "monitoring.prometheusRule.ipPoolUsagePercent=80")):
        rule = one(render(helm, "nicop", "nvidia-network-operator", *MONITORING, *values),
                   "PrometheusRule")
        groups = tmp_path / "rules.yaml"
        groups.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        checked = subprocess.run([str(promtool), "check", "rules", str(groups)],
                                 capture_output=True, text=True, check=False, timeout=120)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"SUCCESS: {len(alert_rules([rule]))} rules found" in checked.stdout


def test_alerts_parse_name_only_exported_metrics_and_say_what_to_run(helm: Path) -> None:
    """Every expression is parsed by a PromQL parser and its metrics are read from the code;
    promtool checks the rules themselves (above)."""
    rules = alert_rules(render(helm, "nicop", "nvidia-network-operator", *MONITORING))
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    assert {"NicopPolicyNotReady", "NicopDriverUpgradeFailed", "NicopDriverUpgradeStuck",
            "NicopUnmanagedNicNode", "NicopIpPoolNearlyFull",
            "NicopDevicePluginNotRegistered"} <= set(names)
    exported = exported_series()
    for rule in rules:
        where = rule["alert"]
        unknown = selected_metrics(rule["expr"]) - exported
        assert not unknown, f"{where} names series no nicop process exports: {sorted(unknown)}"
        assert DURATION.match(rule.get("for", "0s")), where
        assert rule["labels"]["severity"] in ("critical", "warning"), where
        assert rule["annotations"].keys() == {"summary", "description"}, where
        assert "nicop diagnose" in rule["annotations"]["description"], where
        for text in rule["annotations"].values():
            left = PROMETHEUS_TEMPLATE.sub("", text)
            assert "{{" not in left and "}}" not in left, f"{where}: {text}"


def test_alert_thresholds_follow_the_values(helm: Path) -> None:
    rules = {r["alert"]: r for r in alert_rules(render(
        helm, "nicop", "nvidia-network-operator", *MONITORING,
        "monitoring.prometheusRule.policyNotReadyFor=5m",
        "monitoring.prometheusRule.ipPoolUsagePercent=80",
        "monitoring.prometheusRule.upgradeStuckFor=2h",
        "monitoring.prometheusRule.criticalSeverity=page"))}
    assert rules["NicopPolicyNotReady"]["for"] == "5m"
    assert rules["NicopPolicyNotReady"]["labels"]["severity"] == "page"
    assert rules["NicopIpPoolNearlyFull"]["expr"].rstrip().endswith("> 80")
    assert "80 %" in rules["NicopIpPoolNearlyFull"]["annotations"]["description"]
    assert "[2h]" in rules["NicopDriverUpgradeStuck"]["expr"]
    proc = run_helm(helm, "template", "nicop", str(CHART), "--set",
                    "monitoring.prometheusRule.enabled=true,"
                    "monitoring.prometheusRule.ipPoolUsagePercent=0.9")
    assert proc.returncode != 0 and "ipPoolUsagePercent" in proc.stderr
