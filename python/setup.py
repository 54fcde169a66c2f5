"""Generates the gRPC stubs into gpumemd/v1/ (gen_stubs.py) before setuptools looks at the package."""
import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_stubs  # noqa: E402

gen_stubs.generate()
setup()
