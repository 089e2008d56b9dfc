"""What `nicop bundle` keeps out of the archive: no Secret value, token or password, whatever
object or log carries it; names and references stay, since support needs them."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

from nicop import bundle

TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXZhbHVl"


def test_env_values_and_fields_under_secret_names_are_replaced_references_kept() -> None:
    pod = {"metadata": {"name": "p", "managedFields": [{"manager": "x"}], "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": '{"password": "hunter22"}',
        "keep": "me"}},
        "spec": {"imagePullSecrets": [{"name": "regcred"}], "containers": [{"env": [
            {"name": "UFM_PASSWORD", "value": "hunter22"},
            {"name": "API_TOKEN", "value": "t0k3n-value"},
            {"name": "LOG_LEVEL", "value": "debug"},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}}
    out = bundle.redact(pod)
    text = json.dumps(out)
    assert "hunter22" not in text and "t0k3n-value" not in text
    assert "managedFields" not in text and "last-applied" not in text
    env = {e["name"]: e for e in out["spec"]["containers"][0]["env"]}
    assert env["LOG_LEVEL"]["value"] == "debug"
    assert env["UFM_PASSWORD"]["value"] == bundle.REDACTED
    assert env["FROM_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "s", "key": "k"}
    assert out["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert out["metadata"]["annotations"] == {"keep": "me"}
    # A CR's reference to a Secret by name (ib-kubernetes' ufmSecret) is no secret.
    assert bundle.redact({"ufmSecret": "ufm-secret"}) == {"ufmSecret": "ufm-secret"}


def test_tokens_in_text_and_known_secret_values_are_scrubbed() -> None:
    kubeconfig = f"users:\n- name: u\n  user:\n    token: {TOKEN}\n"
    log = f'GET /api Authorization: Bearer abc.def-123\n{{"password":"p4ss-word"}}\n{TOKEN}\n'
    text = bundle.scrub(kubeconfig + log + "ufm said: my-planted-value-1\n",
                        {"my-planted-value-1"})
    for secret in (TOKEN, "abc.def-123", "p4ss-word", "my-planted-value-1"):
        assert secret not in text
    assert "token: <redacted>" in text and "Bearer <redacted>" in text


def test_secret_values_read_for_scrubbing_include_each_line() -> None:
    secret = {"data": {"k": base64.b64encode(b"user=admin\npassword=longvalue9\n").decode(),
                       "short": base64.b64encode(b"yes").decode()}}
    values = bundle._secret_values(secret)
    assert "password=longvalue9" in values and "yes" not in values


def test_the_archive_has_a_manifest_of_files_and_of_what_was_not_collected(
        tmp_path: Path) -> None:
    b = bundle.Bundle()
    b.add("status.json", {"token": "abc"})
    b.add("logs/p/c.log", "line with s3cr3t-value\n")
    b.secret_values.add("s3cr3t-value")
    b.cannot("log of ns/p container c (previous)", "403 Forbidden: no pods/log")
    path = tmp_path / "b.tar.gz"
    manifest = bundle.write(b, str(path), namespace="ns", log_lines=10)
    with tarfile.open(path) as tar:
        names = tar.getnames()
        files = {n.split("/", 1)[1]: (tar.extractfile(n) or io.BytesIO()).read().decode()
                 for n in names}
    assert all(n.startswith("nicop-bundle-") for n in names)
    assert json.loads(files["manifest.json"]) == manifest
    assert manifest["notCollected"] == [{"item": "log of ns/p container c (previous)",
                                         "reason": "403 Forbidden: no pods/log"}]
    assert "s3cr3t-value" not in files["logs/p/c.log"]
    assert json.loads(files["status.json"]) == {"token": "<redacted>"}


def test_scrubbing_keeps_yaml_readable() -> None:
    """A key that sounds secret whose value is on the next lines (a pod's projected
    serviceAccountToken) is left as it is: the YAML stays valid."""
    import yaml

    text = ("volumes:\n- projected:\n    sources:\n    - serviceAccountToken:\n"
            "        expirationSeconds: 3607\n        path: token\n")
    assert bundle.scrub(text, set()) == text
    assert yaml.safe_load(bundle.scrub(text, set()))


def test_a_field_that_names_a_secret_keeps_its_value_in_text_too() -> None:
    """`ufmSecret: ufm-secret` names the Secret (upstream's ibKubernetes field), as redact()
    keeps it in objects: a replay of the bundle needs it. A bare `secret:` or `UFM_SECRET=` is
    a value and goes."""
    text = bundle.scrub("ibKubernetes:\n  ufmSecret: ufm-secret\nsecret: s3cr3t-v4lue\n"
                        "UFM_SECRET=an0ther-v4lue\n", set())
    assert "ufmSecret: ufm-secret" in text
    assert "s3cr3t-v4lue" not in text and "an0ther-v4lue" not in text
