"""Calling CNI plugin executables as a container runtime does (libcni's part of a meta-plugin).

A network is a single config or a config list. A list's plugins run in order on ADD, each given
the list's `name` and `cniVersion` and the previous plugin's result as `prevResult`, and in
reverse on DEL; CHECK (from 0.4.0) and DEL pass the result ADD returned, STATUS and GC run only
for 1.1.0 configs. Runtime values (a MAC, addresses, a device ID, port mappings) reach a plugin as
`runtimeConfig`, and only for the capabilities its config declares. Results are read in any
version and kept in nicop.cni.spec's internal shape.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nicop.cni.spec import (
    UNVERSIONED,
    CniError,
    Code,
    Obj,
    parse_result,
    render_result,
    version_tuple,
)


@dataclass
class RuntimeConf:
    """What a runtime passes besides the config: the CNI_* variables and capability values."""

    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: str = ""
    """CNI_ARGS, `K=V;K2=V2`."""
    capability_args: Obj = field(default_factory=dict)
    """Values by capability name (`mac`, `ips`, `deviceID`, `portMappings`, ...)."""


def is_list(network: Obj) -> bool:
    return "plugins" in network and not network.get("type")


def version_of(network: Obj) -> str:
    return str(network.get("cniVersion") or UNVERSIONED)


def plugin_configs(network: Obj) -> list[Obj]:
    """The configs the plugins of `network` get, in list order (a single config is its own)."""
    if not is_list(network):
        return [dict(network)]
    plugins = network.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        raise CniError(Code.INVALID_CONFIG, f"network {network.get('name')!r}: `plugins` must "
                       "be a non-empty list of plugin configs")
    out = []
    for index, plugin in enumerate(plugins):
        if not isinstance(plugin, dict) or not plugin.get("type"):
            raise CniError(Code.INVALID_CONFIG, f"network {network.get('name')!r}: plugin "
                           f"#{index} has no `type`")
        out.append({**plugin, "name": network.get("name"), "cniVersion": version_of(network)})
    return out


def with_runtime_config(config: Obj, capability_args: Obj) -> Obj:
    """`config` with `runtimeConfig` holding the values of the capabilities it declares."""
    declared = config.get("capabilities")
    if not isinstance(declared, dict):
        return config
    runtime = {cap: capability_args[cap] for cap, on in declared.items()
               if on is True and capability_args.get(cap) not in (None, "", [], {})}
    return {**config, "runtimeConfig": runtime} if runtime else config


class Invoker:
    """Runs the plugins of a node's CNI bin dir; `extra_env` is added to their environment."""

    def __init__(self, bin_dir: Path, extra_env: Mapping[str, str] | None = None,
                 timeout: float = 120.0) -> None:
        self.bin_dir = bin_dir
        self.extra_env = dict(extra_env or {})
        self.timeout = timeout

    # ------------------------------------------------------------------ networks
    def add(self, network: Obj, rt: RuntimeConf) -> Obj:
        """ADD every plugin of `network`; the last result, in the internal shape."""
        version = version_of(network)
        result: Obj | None = None
        for config in plugin_configs(network):
            if result is not None:
                config["prevResult"] = render_result(result, version)
            out = self.exec("ADD", with_runtime_config(config, rt.capability_args), rt)
            if out is None:
                raise CniError(Code.INTERNAL, f"plugin {config['type']!r} returned no result "
                               "on ADD")
            result = parse_result(out)
        assert result is not None
        return result

    def delete(self, network: Obj, rt: RuntimeConf, prev: Obj | None = None) -> None:
        """DEL every plugin of `network`, last first; `prev` is what ADD returned."""
        version = version_of(network)
        for config in reversed(plugin_configs(network)):
            if prev is not None and version_tuple(version) >= (0, 4, 0):
                config["prevResult"] = render_result(prev, version)
            self.exec("DEL", with_runtime_config(config, rt.capability_args), rt)

    def check(self, network: Obj, rt: RuntimeConf, prev: Obj | None) -> None:
        version = version_of(network)
        if version_tuple(version) < (0, 4, 0) or network.get("disableCheck") is True:
            return
        for config in plugin_configs(network):
            if prev is not None:
                config["prevResult"] = render_result(prev, version)
            self.exec("CHECK", with_runtime_config(config, rt.capability_args), rt)

    def status(self, network: Obj) -> None:
        if version_tuple(version_of(network)) < (1, 1, 0):
            return
        for config in plugin_configs(network):
            self.exec("STATUS", config, RuntimeConf())

    def gc(self, network: Obj, valid_attachments: list[Any]) -> None:
        if version_tuple(version_of(network)) < (1, 1, 0) or network.get("disableGC") is True:
            return
        for config in plugin_configs(network):
            config["cni.dev/valid-attachments"] = valid_attachments
            self.exec("GC", config, RuntimeConf())

    # ------------------------------------------------------------------ one plugin
    def plugin_path(self, plugin_type: object) -> Path:
        if (not isinstance(plugin_type, str) or not plugin_type or "/" in plugin_type
                or plugin_type.startswith(".")):
            raise CniError(Code.INVALID_CONFIG, f"invalid plugin type {plugin_type!r}",
                           "`type` names an executable in the CNI bin dir")
        path = self.bin_dir / plugin_type
        if not os.access(path, os.X_OK):
            raise CniError(Code.INTERNAL, f"failed to find plugin {plugin_type!r} in "
                           f"{self.bin_dir}", "install the plugin on this node, or check the "
                           "network's `type`")
        return path

    def exec(self, command: str, config: Obj, rt: RuntimeConf) -> Obj | None:
        """Run the plugin `config["type"]` with `config` on stdin; its printed JSON (None when
        it prints nothing). A failed plugin raises its own error (code, msg, details)."""
        path = self.plugin_path(config.get("type"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        env.update(self.extra_env)
        env.update({"CNI_COMMAND": command, "CNI_PATH": str(self.bin_dir)})
        for key, value in (("CNI_CONTAINERID", rt.container_id), ("CNI_NETNS", rt.netns),
                           ("CNI_IFNAME", rt.ifname), ("CNI_ARGS", rt.args)):
            if value:
                env[key] = value
        try:
            done = subprocess.run([str(path)], input=json.dumps(config).encode(), env=env,
                                  capture_output=True, timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise CniError(Code.INTERNAL, f"plugin {path.name} {command} timed out after "
                           f"{self.timeout:g}s") from None
        except OSError as e:
            raise CniError(Code.INTERNAL, f"cannot run plugin {path}: {e}") from None
        text = done.stdout.strip()
        try:
            out = json.loads(text) if text else None
        except ValueError:
            out = None
            if done.returncode == 0:
                raise CniError(Code.DECODING_FAILURE, f"plugin {path.name} {command} printed "
                               f"no JSON: {text[:200].decode(errors='replace')!r}") from None
        if done.returncode != 0:
            if isinstance(out, dict) and out.get("msg"):
                code = out.get("code")
                raise CniError(code if isinstance(code, int) and code > 0 else Code.INTERNAL,
                               str(out["msg"]), str(out.get("details") or ""))
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[-500:]
            raise CniError(Code.INTERNAL, f"plugin {path.name} {command} failed with exit "
                           f"code {done.returncode}", said)
        if out is not None and not isinstance(out, dict):
            raise CniError(Code.DECODING_FAILURE, f"plugin {path.name} {command} printed "
                           "JSON that is not an object")
        return out
