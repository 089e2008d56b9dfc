"""Container Device Interface specs for the device plugins' `--use-cdi` mode.

With CDI the plugin does not list device nodes in its Allocate answer: it writes a spec file
naming each device's nodes into the runtime's CDI directory, and answers with the devices'
qualified names (`vendor/class=name`). Both upstream plugins pass those names in the container
annotation `cdi.k8s.io/<vendor>_<class>`, which every CDI-aware runtime reads; nicop also sets
the AllocateResponse's `cdi_devices` field (kubelets from 1.28), which runtimes merge with the
annotation without duplicates.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence

import yaml

from nicop.node.deviceplugin import api_pb2 as pb
from nicop.node.host import Host

CDI_DIR = "/var/run/cdi"  # the dynamic spec directory, where runtimes look last-written specs
CDI_VERSION = "0.5.0"  # the first spec version with a device node's hostPath
ANNOTATION_PREFIX = "cdi.k8s.io/"


def qualified(vendor: str, cls: str, name: str) -> str:
    return f"{vendor}/{cls}={name}"


def spec_text(kind: str, devices: Mapping[str, Sequence[str]]) -> str:
    """A spec of `kind` (`vendor/class`): one device per name, with its device nodes (host
    paths, the same in the container), read-write as upstream writes them."""
    return yaml.safe_dump({
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [
            {"name": name, "containerEdits": {"deviceNodes": [
                {"path": path, "hostPath": path, "permissions": "rw"} for path in paths]}}
            for name, paths in devices.items()
        ],
    })


class SpecFiles:
    """The spec files one plugin keeps in the CDI directory: written when their content changes,
    replaced atomically (runtimes may read at any time), removed when the plugin stops."""

    def __init__(self, host: Host, directory: str = CDI_DIR) -> None:
        self.host = host
        self.directory = directory
        self._written: dict[str, str] = {}

    def write(self, file_name: str, kind: str, devices: Mapping[str, Sequence[str]]) -> None:
        """Keep `<file_name>.yaml` describing `devices`; no file for no device (a spec without
        devices is invalid)."""
        if not devices:
            self.remove([file_name])
            return
        text = spec_text(kind, devices)
        if self._written.get(file_name) == text:
            return
        path = self.host.path(f"{self.directory}/{file_name}.yaml")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        self._written[file_name] = text

    def remove(self, file_names: Iterable[str]) -> None:
        for name in file_names:
            with contextlib.suppress(FileNotFoundError):
                self.host.path(f"{self.directory}/{name}.yaml").unlink()
            self._written.pop(name, None)

    def remove_matching(self, prefix: str) -> None:
        """Remove every spec file whose name starts with `prefix` (a previous run's)."""
        self.remove(n.removesuffix(".yaml") for n in self.host.listdir(self.directory)
                    if n.startswith(prefix) and n.endswith(".yaml"))

    def keep(self, file_names: Iterable[str]) -> None:
        """Remove the files this plugin wrote that are not in `file_names` (a pool gone)."""
        self.remove(set(self._written) - set(file_names))

    def clear(self) -> None:
        self.remove(list(self._written))


def response(vendor: str, cls: str, names: Sequence[str],
             envs: Mapping[str, str] | None = None) -> pb.ContainerAllocateResponse:
    """An Allocate answer that refers to CDI devices `names` of `vendor/class`."""
    refs = [qualified(vendor, cls, n) for n in names]
    return pb.ContainerAllocateResponse(
        envs=dict(envs or {}),
        annotations={f"{ANNOTATION_PREFIX}{vendor}_{cls}": ",".join(refs)} if refs else {},
        cdi_devices=[pb.CDIDevice(name=r) for r in refs],
    )
