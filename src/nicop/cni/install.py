"""`nicop cni-install`: the shim into the CNI bin dir under each plugin's name, plus its config.

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


def install(
    bin_dir: Path, socket: str, python: str, plugins: tuple[str, ...] = PLUGINS,
    timeout: float | None = None,
) -> list[Path]:
    """Write the plugins and `nicop-cni.conf` into `bin_dir`; returns the files written."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = shim_script(python)
    written = []
    for name in plugins:
        path = bin_dir / name
        _atomic_write(path, script, 0o755)
        written.append(path)
    conf = f"socket={socket}\n" + (f"timeout={timeout:g}\n" if timeout else "")
    conf_path = bin_dir / shim.CONF_NAME
    _atomic_write(conf_path, conf, 0o644)
    written.append(conf_path)
    return written
