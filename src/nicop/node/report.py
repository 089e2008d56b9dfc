"""What an agent cannot fix itself, told where its users look: the log, and in a pod an Event
on the agent's own pod (`kubectl describe pod`, `nicop diagnose node`).

The DaemonSets nicop renders give their agents `POD_NAME`, `POD_NAMESPACE` and `POD_UID` (the
downward API) and the right to write Events; elsewhere (a test, a process started by hand) the
log is all there is.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from nicop.kube.client import ApiClient
from nicop.kube.events import EventRecorder
from nicop.kube.resources import Obj

log = logging.getLogger(__name__)


class Reporter:
    def __init__(self, client: ApiClient | None = None, pod: Obj | None = None) -> None:
        self.client = client
        self.pod = pod
        self.recorder = EventRecorder(client, component="nicop-agent") if client else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Reporter:
        """Events on the agent's pod when it runs in one with API access; the log otherwise."""
        env = os.environ if env is None else env
        name, namespace = env.get("POD_NAME"), env.get("POD_NAMESPACE")
        if not (name and namespace and (env.get("KUBECONFIG")
                                        or env.get("KUBERNETES_SERVICE_HOST"))):
            return cls()
        try:
            client = ApiClient(env.get("KUBECONFIG") or None)
        except Exception as e:  # no usable credentials: the log still tells
            log.warning("cannot report to the API server, only to this log: %s", e)
            return cls()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": namespace, "uid": env.get("POD_UID", "")}}
        return cls(client, pod)

    async def warn(self, reason: str, message: str) -> None:
        log.error("%s", message)
        await self._event("Warning", reason, message)

    async def info(self, reason: str, message: str) -> None:
        log.info("%s", message)
        await self._event("Normal", reason, message)

    async def _event(self, type_: str, reason: str, message: str) -> None:
        if self.recorder is None or self.pod is None:
            return
        try:
            await self.recorder.emit(self.pod, type_, reason, message)
        except Exception as e:  # reporting must never stop the agent serving
            log.warning("could not record event %s: %s", reason, e)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
