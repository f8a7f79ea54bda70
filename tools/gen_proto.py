"""Regenerate (or check) the gRPC/protobuf code in dstl_client/core/_pb from proto/.

Usage: python tools/gen_proto.py [--check]

protoc writes absolute imports (``from dstl.v1 import dstl_pb2``) that only
work with ``proto/`` on sys.path; the generated files are rewritten to import
their sibling relatively so the package is self-contained.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "dstl_client" / "core" / "_pb"
PROTOS = ["dstl/v1/dstl.proto"]


def generate(out_dir: Path) -> dict[str, bytes]:
    from grpc_tools import protoc  # dev dependency

    # protoc finds the mypy plugins on PATH; they sit next to this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *[str(PROTO_ROOT / p) for p in PROTOS],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    files: dict[str, bytes] = {}
    for path in sorted((out_dir / "dstl" / "v1").iterdir()):
        text = path.read_text()
        text = text.replace("from dstl.v1 import dstl_pb2", "from . import dstl_pb2")
        text = text.replace("import dstl.v1.dstl_pb2", "from . import dstl_pb2")
        text = text.replace("dstl.v1.dstl_pb2.", "dstl_pb2.")
        files[path.name] = text.encode()
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the checked-in code is stale")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
    if ns.check:
        stale = [
            n for n, b in files.items() if not (OUT / n).exists() or (OUT / n).read_bytes() != b
        ]
        if stale:
            print(f"generated code is stale: {', '.join(stale)}; run `make proto`", file=sys.stderr)
            return 1
        print("generated code is up to date")
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "__init__.py").write_text(
        '"""Generated gRPC/protobuf code (make proto). Do not edit."""\n'
    )
    for name, data in files.items():
        (OUT / name).write_bytes(data)
    print(f"wrote {len(files)} files to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
