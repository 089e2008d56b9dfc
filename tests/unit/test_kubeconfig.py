"""How nicop finds and authenticates to the API server: kubeconfig files as kubectl writes them
(client certificates as files or data, tokens, token files, exec credential plugins), the pod's
service account, and errors that name the file and the field. The requests go through nicop's
HTTP client to a local server: what is checked is the header and the TLS settings each request
carries."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.unit.http_server import serve

from nicop.kube import kubeconfig
from nicop.kube.http import Credentials, HttpClient
from nicop.kube.kubeconfig import KubeconfigError, TokenFileAuth, load
from nicop_sim.pki import CertificateAuthority


def write(path: Path, users: dict[str, Any], *, current: str = "main",
          cluster: dict[str, Any] | None = None) -> Path:
    """A kubeconfig with one cluster and a context per user (named after it)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "c", "cluster": cluster or {"server": "https://10.0.0.1:6443",
                                                           "insecure-skip-tls-verify": True}}],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": {"cluster": "c", "user": n, "namespace": f"ns-{n}"}}
                     for n in users]}))
    return path


def headers(auth: Credentials | None,
            accepts: Callable[[str], bool] = lambda header: True) -> list[str]:
    """The Authorization header of each request nicop's client with `auth` sends for one GET;
    the server answers 401 to a header it does not accept."""
    seen: list[str] = []

    def answer(head: dict[str, str]) -> tuple[int, bytes]:
        seen.append(head.get("authorization", ""))
        return (200 if accepts(seen[-1]) else 401), b"{}"

    async def one() -> None:
        async with serve(answer) as url:
            client = HttpClient(url, None, auth, timeout=10)
            await client.request("GET", "/version")
            await client.close()

    asyncio.run(one())
    return seen


def test_a_token_users_context_gives_server_namespace_and_bearer(tmp_path: Path) -> None:
    path = write(tmp_path / "config", {"main": {"token": "abc"}, "other": {"token": "xyz"}})
    conn = load(path)
    assert (conn.server, conn.namespace) == ("https://10.0.0.1:6443", "ns-main")
    assert isinstance(conn.tls, ssl.SSLContext) and conn.tls.verify_mode == ssl.CERT_NONE
    assert headers(conn.auth) == ["Bearer abc"]
    assert headers(load(path, context="other").auth) == ["Bearer xyz"]


def test_client_certificates_load_from_files_relative_to_the_kubeconfig_or_from_data(
        tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "pki")
    pair = ca.issue("admin", "admin", "system:masters")
    cluster = {"server": "https://10.0.0.1:6443", "certificate-authority": "pki/ca.crt"}
    by_file = write(tmp_path / "files", {"main": {"client-certificate": "pki/admin.crt",
                                                  "client-key": "pki/admin.key"}},
                    cluster=cluster)
    conn = load(by_file)
    assert isinstance(conn.tls, ssl.SSLContext)
    assert conn.tls.verify_mode == ssl.CERT_REQUIRED and conn.auth is None
    data = {k: base64.b64encode(p.read_bytes()).decode() for k, p in
            (("client-certificate-data", pair.cert), ("client-key-data", pair.key))}
    by_data = write(tmp_path / "data", {"main": data}, cluster={
        "server": "https://10.0.0.1:6443",
        "certificate-authority-data": base64.b64encode(ca.pair.cert.read_bytes()).decode()})
    assert load(by_data).tls.get_ca_certs()  # type: ignore[union-attr]


@pytest.mark.parametrize(("users", "current", "named"), [
    ({"main": {"token": "t"}}, "gone", "no context named 'gone'"),
    ({"main": {"client-certificate": "missing.crt", "client-key": "missing.key"}}, "main",
     "client-certificate"),
    ({"main": {"client-key-data": base64.b64encode(b"k").decode()}}, "main",
     "client certificate or key without the other"),
    ({"main": {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1",
                        "command": "x"}}}, "main", "exec apiVersion"),
])
def test_what_cannot_be_used_is_refused_naming_the_file_and_field(
        tmp_path: Path, users: dict[str, Any], current: str, named: str) -> None:
    path = write(tmp_path / "config", users, current=current,
                 cluster={"server": "https://10.0.0.1:6443"})
    with pytest.raises(KubeconfigError) as err:
        load(path)
    assert str(path) in str(err.value) and named in str(err.value)
    with pytest.raises(KubeconfigError, match="cannot read kubeconfig"):
        load(tmp_path / "nothing-here")


def test_the_first_file_of_kubeconfig_is_used_without_an_explicit_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "config", {"main": {"token": "from-env"}})
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{path}{os.pathsep}{tmp_path / 'second'}")
    assert headers(load().auth) == ["Bearer from-env"]


def test_in_a_pod_the_service_account_is_used_and_its_rotated_token_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet rotates the projected token: after a 401 the file is read again and the
    request sent once more with the new token."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("old\n")
    (account / "namespace").write_text("nvidia-network-operator")
    (account / "ca.crt").write_bytes(CertificateAuthority(tmp_path / "pki").pair.cert
                                     .read_bytes())
    monkeypatch.setattr(kubeconfig, "SERVICE_ACCOUNT", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = load()
    assert (conn.server, conn.namespace) == ("https://10.96.0.1:443", "nvidia-network-operator")
    assert isinstance(conn.auth, TokenFileAuth)
    assert headers(conn.auth) == ["Bearer old"]
    (account / "token").write_text("new\n")
    assert headers(conn.auth, lambda header: header == "Bearer new") == [
        "Bearer old", "Bearer new"]


def test_an_exec_plugins_token_is_used_until_it_expires(tmp_path: Path) -> None:
    """A credential plugin as cloud CLIs ship them: run once, its token kept for the requests
    that follow; a 401 runs it again."""
    calls = tmp_path / "calls"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, os, pathlib\n"
        f"calls = pathlib.Path({str(calls)!r})\n"
        "n = len(calls.read_text()) if calls.exists() else 0\n"
        "calls.write_text('x' * (n + 1))\n"
        "assert json.loads(os.environ['KUBERNETES_EXEC_INFO'])['kind'] == 'ExecCredential'\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': "
        "'ExecCredential', 'status': {'token': os.environ['PREFIX'] + str(n), "
        "'expirationTimestamp': '2999-01-01T00:00:00Z'}}))\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    path = write(tmp_path / "config", {"main": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
        "args": [str(plugin)], "env": [{"name": "PREFIX", "value": "tok-"}]}}})
    auth = load(path).auth
    assert headers(auth) == ["Bearer tok-0"]
    assert headers(auth) == ["Bearer tok-0"]  # kept: not expired
    assert calls.read_text() == "x"
    assert headers(auth, lambda header: header != "Bearer tok-0") == [
        "Bearer tok-0", "Bearer tok-1"]
    assert calls.read_text() == "xx"
