"""A page rendered in a real browser: Debian's Chromium, headless (hack/install-browser.sh puts it
on the machine). What the page's script changed is in the DOM it returns, and every message the
page wrote to its console (an uncaught error, a blocked fetch) is in Chromium's log."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0")


@dataclass
class Rendered:
    dom: str
    console: list[str]


def render(page: Path, screenshot: Path | None = None) -> Rendered:
    chromium = shutil.which("chromium")
    assert chromium, "no chromium on PATH: make test installs it (hack/install-browser.sh)"
    done = subprocess.run([chromium, *FLAGS, "--dump-dom", page.as_uri()], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    if screenshot is not None:
        shot = subprocess.run([chromium, *FLAGS, f"--screenshot={screenshot}",
                               "--window-size=1400,2200", page.as_uri()],
                              capture_output=True, text=True, timeout=120)
        assert shot.returncode == 0 and screenshot.exists(), shot.stderr[-2000:]
    return Rendered(done.stdout, console)
