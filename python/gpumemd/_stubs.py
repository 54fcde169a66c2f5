"""The generated gRPC stubs (gpumemd/v1/, made by gen_stubs.py from proto/, never committed).

In a source checkout they are generated on first import when missing or older than the proto
(protoc and grpc_python_plugin must then be on PATH); an installed package carries them.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _generate_from_checkout():
    script = os.path.join(_HERE, os.pardir, "gen_stubs.py")
    if not os.path.exists(script):
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("_gpumemd_gen_stubs", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate()


_generate_from_checkout()

from gpumemd.v1 import gpumemd_pb2 as pb  # noqa: E402
from gpumemd.v1 import gpumemd_pb2_grpc as pb_grpc  # noqa: E402

__all__ = ["pb", "pb_grpc"]
