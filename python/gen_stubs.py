#!/usr/bin/env python3
"""Generates the gRPC stubs of gpumemd.v1 from proto/ into gpumemd/v1/ (never committed).

The proto's path, gpumemd/v1/gpumemd.proto, makes protoc write gpumemd/v1/gpumemd_pb2.py and
gpumemd_pb2_grpc.py, whose `from gpumemd.v1 import gpumemd_pb2` then resolves inside this very
package: no import rewriting. Needs protoc and grpc_python_plugin (Debian: protobuf-compiler,
protobuf-compiler-grpc) or grpc_tools when installed. Run by setup.py's build and by the tests;
`python3 gen_stubs.py` by hand after a proto change.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, os.pardir, "proto", "src", "main", "proto")
PROTO = "gpumemd/v1/gpumemd.proto"
OUT = os.path.join(HERE, "gpumemd", "v1")


def up_to_date():
    proto = os.path.join(PROTO_ROOT, PROTO)
    outs = [os.path.join(OUT, n) for n in ("gpumemd_pb2.py", "gpumemd_pb2_grpc.py", "__init__.py")]
    if not all(os.path.exists(p) for p in outs):
        return False
    return not os.path.exists(proto) or min(os.path.getmtime(p) for p in outs) >= os.path.getmtime(proto)


def generate():
    if up_to_date():
        return
    if not os.path.exists(os.path.join(PROTO_ROOT, PROTO)):
        raise SystemExit("gen_stubs: %s not found under %s" % (PROTO, os.path.normpath(PROTO_ROOT)))
    os.makedirs(OUT, exist_ok=True)
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc and plugin:
        command = [protoc, "--plugin=protoc-gen-grpc_python=" + plugin]
    else:
        try:
            import grpc_tools  # noqa: F401
        except ImportError:
            raise SystemExit("gen_stubs: needs protoc and grpc_python_plugin (Debian: apt-get install "
                             "protobuf-compiler protobuf-compiler-grpc) or the grpcio-tools package")
        command = [sys.executable, "-m", "grpc_tools.protoc"]
    command += ["-I", PROTO_ROOT, "--python_out=" + HERE, "--grpc_python_out=" + HERE, PROTO]
    subprocess.run(command, check=True)
    with open(os.path.join(OUT, "__init__.py"), "w") as init:
        init.write('"""Generated from proto/src/main/proto/gpumemd/v1/gpumemd.proto by gen_stubs.py."""\n')


if __name__ == "__main__":
    generate()
