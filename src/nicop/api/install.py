"""Install the CRDs into a cluster and wait until the API server serves them.

The manifests come from the models, so what is installed is what this version of nicop reads.
CRDs that another project owns (NetworkAttachmentDefinition) are only created when absent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from lightkube import ApiError, Client
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.types import PatchType

from nicop.api.common import KubeObject
from nicop.api.crdgen import crd_manifest
from nicop.api.kinds import KINDS

FIELD_MANAGER = "nicop"


class CrdInstallError(Exception):
    """A CRD could not be installed; the message names it."""


def _exists(client: Client, name: str) -> bool:
    try:
        client.get(CustomResourceDefinition, name)
    except ApiError as e:
        if e.status.code == 404:
            return False
        raise
    return True


def install_crds(
    client: Client,
    models: Iterable[type[KubeObject]] = KINDS,
    *,
    progress: Callable[[str], None] = lambda line: None,
    timeout: float = 60.0,
) -> list[str]:
    """Apply the CRDs of models (server-side, field manager nicop) and wait until each is
    Established; returns the names of the CRDs applied."""
    applied = []
    for model in models:
        name = model.crd.name
        if model.crd.install_only_if_absent and _exists(client, name):
            progress(f"{name}: already installed, left as it is")
            continue
        try:
            client.patch(
                CustomResourceDefinition, name, crd_manifest(model),
                patch_type=PatchType.APPLY, field_manager=FIELD_MANAGER, force=True,
            )
        except ApiError as e:
            raise CrdInstallError(
                f"{name}: the API server refused the CRD: {e.status.message}"
            ) from e
        progress(f"{name}: applied")
        applied.append(name)
    _wait_established(client, applied, progress, timeout)
    return applied


def _wait_established(
    client: Client, names: list[str], progress: Callable[[str], None], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        for name in list(pending):
            crd = client.get(CustomResourceDefinition, name)
            conditions = {c.type: c for c in (crd.status.conditions or [])} if crd.status else {}
            names_accepted = conditions.get("NamesAccepted")
            if names_accepted and names_accepted.status == "False":
                raise CrdInstallError(f"{name}: names not accepted: {names_accepted.message}")
            established = conditions.get("Established")
            if established and established.status == "True":
                progress(f"{name}: established")
                pending.remove(name)
        if pending and time.monotonic() > deadline:
            raise CrdInstallError(
                f"{', '.join(pending)}: not Established after {timeout:.0f}s; "
                "see `kubectl describe crd` for the conditions"
            )
        if pending:
            time.sleep(0.1)
