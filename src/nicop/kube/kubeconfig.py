"""Where the API server is and how to prove who we are: the pod's service account, or a
kubeconfig file.

In a pod (KUBERNETES_SERVICE_HOST set and the service account mounted) the agents and the
operator use the service account: its token file is read again when the kubelet rotates it (and
after a 401). Elsewhere the kubeconfig given, else the first file of $KUBECONFIG, else
~/.kube/config; its current context unless another is named, as kubectl's --context. Of a
kubeconfig's fields, nicop reads: the cluster's `server`, `certificate-authority(-data)`,
`insecure-skip-tls-verify`; the user's `client-certificate(-data)` and
`client-key(-data)`, `token`, `tokenFile`, `username`/`password` and `exec` (a credential plugin
that prints an ExecCredential with a token, as cloud CLIs do); the context's `namespace`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nicop.kube.http import Credentials

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = "~/.kube/config"
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
TOKEN_REREAD = 60.0  # seconds: the kubelet rotates projected tokens well before they expire


class KubeconfigError(Exception):
    """The connection settings cannot be read; the message names the file and the field."""


@dataclass
class Connection:
    """What an HTTP client needs to talk to the API server."""

    server: str
    tls: ssl.SSLContext | None  # None for an http:// server
    auth: Credentials | None
    namespace: str = "default"


def load(kubeconfig: str | Path | None = None, context: str | None = None) -> Connection:
    """The connection for `kubeconfig` (or, without one, the environment's) and `context`."""
    if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ \
            and (SERVICE_ACCOUNT / "token").exists():
        return in_cluster()
    if kubeconfig is None:
        listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
        kubeconfig = listed[0] if listed else DEFAULT_KUBECONFIG
    path = Path(kubeconfig).expanduser()
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as e:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise KubeconfigError(f"kubeconfig {path} is not YAML: {e}") from None
    if not isinstance(document, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a kubeconfig (no mapping)")
    return from_document(document, path.parent, context, str(path))


def in_cluster() -> Connection:
    """The pod's service account: the `kubernetes` Service's address, its CA and token."""
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get(
        "KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:
        host = f"[{host}]"
    namespace_file = SERVICE_ACCOUNT / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.exists() else "default"
    return Connection(server=f"https://{host}:{port}",
                      tls=ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt")),
                      auth=TokenFileAuth(SERVICE_ACCOUNT / "token"), namespace=namespace)


def from_document(document: dict[str, Any], base: Path, context: str | None,
                  where: str) -> Connection:
    """One context of a parsed kubeconfig; relative file names are relative to `base`."""
    name = context or document.get("current-context")
    if not name:
        raise KubeconfigError(f"{where}: no current-context, and no context named")
    ctx = _named(document, "contexts", "context", name, where)
    cluster = _named(document, "clusters", "cluster", ctx.get("cluster"), where)
    user = _named(document, "users", "user", ctx.get("user"), where) if ctx.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"{where}: cluster {ctx.get('cluster')!r} has no server")

    def file_or_data(key: str, owner: dict[str, Any]) -> bytes | None:
        if owner.get(f"{key}-data"):
            try:
                return base64.b64decode(owner[f"{key}-data"])
            except ValueError:
                raise KubeconfigError(f"{where}: {key}-data is not base64") from None
        if owner.get(key):
            file = (base / Path(owner[key]).expanduser())
            try:
                return file.read_bytes()
            except OSError as e:
                raise KubeconfigError(f"{where}: {key} {file}: {e.strerror or e}") from None
        return None

    tls: ssl.SSLContext | None = None
    if not server.startswith("http://"):
        tls = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        elif (ca := file_or_data("certificate-authority", cluster)) is not None:
            tls = ssl.create_default_context(cadata=ca.decode())
        cert, key = file_or_data("client-certificate", user), file_or_data("client-key", user)
        if cert is not None and key is not None:
            _load_cert_chain(tls, cert, key, where)
        elif cert is not None or key is not None:
            raise KubeconfigError(f"{where}: user {ctx.get('user')!r} has a client certificate "
                                  "or key without the other")
    auth: Credentials | None = None
    if user.get("token"):
        auth = BearerAuth(lambda: str(user["token"]))
    elif user.get("tokenFile"):
        auth = TokenFileAuth(base / Path(user["tokenFile"]).expanduser())
    elif user.get("exec"):
        auth = ExecAuth(user["exec"], where)
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password') or ''}".encode()
        auth = BearerAuth(lambda: base64.b64encode(pair).decode(), scheme="Basic")
    return Connection(server=str(server).rstrip("/"), tls=tls, auth=auth,
                      namespace=str(ctx.get("namespace") or "default"))


def _named(document: dict[str, Any], section: str, key: str, name: Any,
           where: str) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return dict(entry.get(key) or {})
    raise KubeconfigError(f"{where}: no {key} named {name!r} in {section}")


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes, where: str) -> None:
    """ssl loads a client certificate from files only: written to a private temporary
    directory for the moment it takes."""
    with tempfile.TemporaryDirectory(prefix="nicop-cert-") as folder:
        cert_file, key_file = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        try:
            context.load_cert_chain(str(cert_file), str(key_file))
        except ssl.SSLError as e:
            raise KubeconfigError(f"{where}: the client certificate and key do not load: "
                                  f"{e}") from None


class BearerAuth:
    """`Authorization: Bearer <token>` (or another scheme), the token asked of `token()` for
    every request."""

    def __init__(self, token: Callable[[], str], scheme: str = "Bearer") -> None:
        self._token = token
        self.scheme = scheme

    async def authorization(self) -> str:
        return f"{self.scheme} {self._token()}"

    def forget(self) -> bool:
        return False


class TokenFileAuth(BearerAuth):
    """A token file, read again every TOKEN_REREAD seconds and after a 401 (rotation)."""

    def __init__(self, path: Path) -> None:
        super().__init__(self._read)
        self.path = path
        self._cached: tuple[float, str] | None = None

    def _read(self) -> str:
        if self._cached is None or time.monotonic() - self._cached[0] > TOKEN_REREAD:
            try:
                self._cached = (time.monotonic(), self.path.read_text().strip())
            except OSError as e:
                raise KubeconfigError(f"cannot read token file {self.path}: "
                                      f"{e.strerror or e}") from None
        return self._cached[1]

    def forget(self) -> bool:
        self._cached = None
        return True


class ExecAuth:
    """A kubeconfig `exec` credential plugin: its ExecCredential's token, kept until its
    expirationTimestamp or a 401."""

    def __init__(self, spec: dict[str, Any], where: str) -> None:
        if spec.get("apiVersion") not in EXEC_API_VERSIONS:
            raise KubeconfigError(f"{where}: exec apiVersion {spec.get('apiVersion')!r} is not "
                                  f"one of {', '.join(EXEC_API_VERSIONS)}")
        if not spec.get("command"):
            raise KubeconfigError(f"{where}: exec has no command")
        self.argv = [str(spec["command"]), *map(str, spec.get("args") or [])]
        self.env = {**os.environ, **{str(e["name"]): str(e["value"])
                                     for e in spec.get("env") or []}}
        self.env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {"apiVersion": spec["apiVersion"], "kind": "ExecCredential",
             "spec": {"interactive": False}})
        self.where = where
        self._token: tuple[float, str] | None = None  # (valid until, monotonic; token)
        self._running = asyncio.Lock()  # concurrent requests run the plugin once

    async def authorization(self) -> str:
        return f"Bearer {await self._get()}"

    def forget(self) -> bool:
        self._token = None
        return True

    async def _get(self) -> str:
        async with self._running:
            if self._token is None or time.monotonic() >= self._token[0]:
                self._token = await self._run()
            return self._token[1]

    async def _run(self) -> tuple[float, str]:
        proc = await asyncio.create_subprocess_exec(
            *self.argv, env=self.env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise KubeconfigError(f"{self.where}: exec {self.argv[0]} failed "
                                  f"({proc.returncode}): {err.decode(errors='replace')[-500:]}")
        try:
            status = json.loads(out)["status"]
            token = str(status["token"])
        except (ValueError, KeyError, TypeError):
            raise KubeconfigError(f"{self.where}: exec {self.argv[0]} printed no ExecCredential "
                                  "with status.token (client certificates from exec are not "
                                  "supported)") from None
        valid = time.monotonic() + 3600.0
        if expires := status.get("expirationTimestamp"):
            left = (datetime.datetime.fromisoformat(expires.replace("Z", "+00:00"))
                    - datetime.datetime.now(datetime.UTC)).total_seconds()
            valid = time.monotonic() + max(0.0, left - 10)
        return valid, token
