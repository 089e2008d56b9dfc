"""Regenerate the Python modules of the kubelet device plugin API from api.proto.

Run `python -m nicop.node.deviceplugin.protogen` after changing api.proto (needs the `dev` extra:
grpcio-tools, pinned so that the output is byte-for-byte reproducible). A unit test regenerates
into a temporary directory and fails when the checked-in modules differ.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SRC = PACKAGE_DIR.parents[2]  # .../src
PROTO = PACKAGE_DIR.relative_to(SRC) / "api.proto"
OUTPUTS = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def generate(out_dir: Path) -> dict[str, str]:
    """Run protoc into `out_dir`; returns the generated modules by file name."""
    from grpc_tools import protoc  # the dev extra; the agents never import this module

    args = ["protoc", f"-I{SRC}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {SRC / PROTO}")
    generated = out_dir / PROTO.parent
    return {name: (generated / name).read_text() for name in OUTPUTS}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in generate(Path(tmp)).items():
            (PACKAGE_DIR / name).write_text(text)
            print(f"wrote {PACKAGE_DIR / name}")


if __name__ == "__main__":
    main()
