"""Install the CRDs into a cluster and wait until the API server serves them (`nicop crds
install`, the demo, the tests).

The manifests come from the models, so what is installed is what this version of nicop reads.
CRDs that another project owns (NetworkAttachmentDefinition) are only created when absent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from nicop.api.common import KubeObject
from nicop.api.crdgen import crd_manifest
from nicop.api.kinds import KINDS
from nicop.kube.client import ApiClient, ApiError
from nicop.kube.resources import CRD

Progress = Callable[[str], None]


class CrdInstallError(Exception):
    """A CRD could not be installed; the message names it."""


def install_crds(
    kubeconfig: str | Path | None = None,
    models: Iterable[type[KubeObject]] = KINDS,
    *,
    progress: Progress = lambda line: None,
    timeout: float = 60.0,
) -> list[str]:
    """apply_crds from synchronous code, with a client of `kubeconfig` (None: the
    environment's) for the time it takes."""

    async def run() -> list[str]:
        client = ApiClient(kubeconfig)
        try:
            return await apply_crds(client, models, progress=progress, timeout=timeout)
        finally:
            await client.close()

    return asyncio.run(run())


async def apply_crds(
    client: ApiClient,
    models: Iterable[type[KubeObject]] = KINDS,
    *,
    progress: Progress = lambda line: None,
    timeout: float = 60.0,
) -> list[str]:
    """Apply the CRDs of models (server-side, field manager nicop) and wait until each is
    Established; returns the names of the CRDs applied."""
    applied = []
    for model in models:
        name = model.crd.name
        if model.crd.install_only_if_absent and await client.get_or_none(CRD, name):
            progress(f"{name}: already installed, left as it is")
            continue
        try:
            await client.apply(crd_manifest(model), res=CRD)
        except ApiError as e:
            raise CrdInstallError(f"{name}: the API server refused the CRD: {e.message}") \
                from e
        progress(f"{name}: applied")
        applied.append(name)
    await _wait_established(client, applied, progress, timeout)
    return applied


async def _wait_established(client: ApiClient, names: list[str], progress: Progress,
                            timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        for name in list(pending):
            crd = await client.get(CRD, name)
            conditions = {c.get("type"): c for c in (crd.get("status") or {}).get("conditions")
                          or []}
            names_accepted = conditions.get("NamesAccepted") or {}
            if names_accepted.get("status") == "False":
                raise CrdInstallError(f"{name}: names not accepted: "
                                      f"{names_accepted.get('message')}")
            if (conditions.get("Established") or {}).get("status") == "True":
                progress(f"{name}: established")
                pending.remove(name)
        if pending and time.monotonic() > deadline:
            raise CrdInstallError(
                f"{', '.join(pending)}: not Established after {timeout:.0f}s; "
                "see `kubectl describe crd` for the conditions"
            )
        if pending:
            await asyncio.sleep(0.1)
