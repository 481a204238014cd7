"""Builds the package with its gRPC stubs, generated from the repository's protos.

The protos are `proto/proto/berth/v1/*.proto` of the repository this directory is in
(`BERTH_PROTO_DIR` points elsewhere): generated into the build, as the `berth.v1` modules.
"""

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def proto_dir() -> Path:
    found = Path(os.environ.get("BERTH_PROTO_DIR", HERE.parent / "proto"))
    if not (found / "berth" / "v1").is_dir():
        raise SystemExit(f"berth: no protos in {found}/berth/v1 (set BERTH_PROTO_DIR to the repository's proto/proto)")
    return found


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        from grpc_tools import protoc

        root = proto_dir()
        out = Path(self.build_lib)
        protos = sorted(str(p.relative_to(root)) for p in (root / "berth" / "v1").glob("*.proto"))
        include = Path(protoc.__file__).parent / "_proto"
        args = ["protoc", f"-I{root}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}"]
        if protoc.main(args + protos) != 0:
            raise SystemExit("berth: generating the gRPC stubs failed")


setup(cmdclass={"build_py": BuildWithStubs})
