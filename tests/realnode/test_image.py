"""nicop's image, built from Debian packages and PyPI wheels without a registry, runs its agents
under runc: the CLI and an agent answer inside it, and it holds nothing of the simulation."""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bundle(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image unpacked as a runtime bundle (umoci), its root filesystem and config."""
    work = tmp_path_factory.mktemp("image")
    with tarfile.open(image) as tar:
        tar.extractall(work / "layout", filter="tar")
    tag = json.loads((work / "layout/index.json").read_text())["manifests"][0]["annotations"][
        "org.opencontainers.image.ref.name"]
    subprocess.run(["umoci", "unpack", "--image", f"{work / 'layout'}:{tag}",
                    str(work / "bundle")], check=True, capture_output=True)
    return work / "bundle"


def run(runtime_bin: Path, bundle: Path, argv: list[str], name: str) -> tuple[int, str, float]:
    config = json.loads((bundle / "config.json").read_text())
    config["process"]["args"] = argv
    config["process"]["terminal"] = False
    (bundle / "config.json").write_text(json.dumps(config))
    start = time.monotonic()
    done = subprocess.run([str(runtime_bin / "runc"), "run", "--bundle", str(bundle), name],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def test_the_cli_and_an_agent_run_in_the_image_under_runc(
        image: Path, runtime_bin: Path, bundle: Path) -> None:
    code, out, took = run(runtime_bin, bundle, ["nicop", "--help"], "nicop-image-help")
    assert code == 0 and "nicop: RDMA and SR-IOV networking" in out, out
    code, out, _ = run(runtime_bin, bundle, ["nicop", "rdma-device-plugin", "--help"],
                       "nicop-image-rdma")
    assert code == 0 and "--config-file" in out, out
    print(f"\nimage {image.name}: {image.stat().st_size / 2**20:.1f} MiB compressed; "
          f"`nicop --help` in runc: {took:.2f} s")


def test_the_image_holds_the_product_and_what_its_agents_run_only(bundle: Path) -> None:
    root = bundle / "rootfs"
    site = next(root.glob("opt/nicop/lib/python3*/site-packages"))
    assert (site / "nicop").is_dir()
    assert not list(site.glob("nicop_sim*")), "the simulation is not part of the product"
    assert not list(site.glob("cryptography*")), "only the simulation's certificates need it"
    assert not list(site.glob("pytest*")), "no test tools"
    for tool in ("usr/bin/kmod", "usr/bin/mstconfig"):  # driver agent; SR-IOV link type
        assert (root / tool).exists() or (root / tool).is_symlink(), tool
    assert shutil.which("umoci")
