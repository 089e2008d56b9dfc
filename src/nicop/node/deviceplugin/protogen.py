"""Regenerate the Python modules of the kubelet's gRPC APIs nicop speaks: the device plugin API
(deviceplugin/api.proto), the DRA plugin and plugin registration APIs (dra/dra.proto,
dra/registration.proto), and the PodResources API (podresources/api.proto).

Run `python -m nicop.node.deviceplugin.protogen` after changing a .proto (needs the `dev` extra:
grpcio-tools, pinned so that the output is byte-for-byte reproducible). A unit test regenerates
into a temporary directory and fails when the checked-in modules differ.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SRC = PACKAGE_DIR.parents[2]  # .../src
NODE = PACKAGE_DIR.parent
PROTOS = (PACKAGE_DIR / "api.proto", NODE / "dra" / "dra.proto",
          NODE / "dra" / "registration.proto", NODE / "podresources" / "api.proto")


def outputs(proto: Path) -> list[Path]:
    stem = proto.with_suffix("")
    return [stem.with_name(stem.name + suffix)
            for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]


def generate(out_dir: Path) -> dict[Path, str]:
    """Run protoc into `out_dir`; returns the generated modules by their checked-in path."""
    from grpc_tools import protoc  # the dev extra; the agents never import this module

    result = {}
    for proto in PROTOS:
        relative = proto.relative_to(SRC)
        args = ["protoc", f"-I{SRC}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}", str(relative)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        for path in outputs(proto):
            result[path] = (out_dir / path.relative_to(SRC)).read_text()
    return result


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for path, text in generate(Path(tmp)).items():
            path.write_text(text)
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
