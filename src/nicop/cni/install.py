"""`nicop cni-install` and `nicop multus-install`: the shim into the CNI bin dir under each
plugin's name, plus the config that points it at its daemon's socket (nicop-cni.conf for the CNI
daemon's plugins, nicop-multus.conf for `multus`).

Each file is written next to its final name and renamed over it, so a runtime starting a plugin
at that moment runs either the old or the new one, never a partial file.
"""

from __future__ import annotations

import os
from pathlib import Path

from nicop.api.agents import CNI_PLUGINS as PLUGINS
from nicop.cni import shim


def _atomic_write(path: Path, text: str, mode: int) -> None:
    if path.exists() and not path.is_file():
        raise IsADirectoryError(f"{path} exists and is not a regular file; remove it so the "
                                "plugin can be installed there")
    tmp = path.with_name(f".{path.name}.nicop-tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def shim_script(python: str) -> str:
    """The shim with an interpreter line for this host (-I -S: no site, no user paths)."""
    text = Path(shim.__file__).read_text()
    if text.startswith("#!"):
        text = text.split("\n", 1)[1]
    return f"#!{python} -IS\n{text}"


MULTUS = "multus"


def install(
    bin_dir: Path, socket: str, python: str, plugins: tuple[str, ...] = PLUGINS,
    timeout: float | None = None, conf_name: str = shim.CONF_NAME, daemon: str | None = None,
) -> list[Path]:
    """Write the plugins and their config `conf_name` into `bin_dir`; returns the files
    written. `daemon` is how errors name the daemon (nicop cni-daemon when not given)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = shim_script(python)
    written = []
    for name in plugins:
        path = bin_dir / name
        _atomic_write(path, script, 0o755)
        written.append(path)
    conf = (f"socket={socket}\n" + (f"timeout={timeout:g}\n" if timeout else "")
            + (f"daemon={daemon}\n" if daemon else ""))
    conf_path = bin_dir / conf_name
    _atomic_write(conf_path, conf, 0o644)
    written.append(conf_path)
    return written


def install_multus(bin_dir: Path, socket: str, python: str) -> list[Path]:
    """The `multus` plugin, forwarding to `nicop multus-daemon` (its own nicop-multus.conf);
    it waits longer than the other plugins, as one call runs every network of a pod."""
    return install(bin_dir, socket, python, (MULTUS,), timeout=300,
                   conf_name=shim.conf_name(MULTUS), daemon="nicop multus-daemon")
