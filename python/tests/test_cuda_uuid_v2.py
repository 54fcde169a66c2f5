"""Device UUIDs under MIG (issue 33 item 6): the client reads ``cuDeviceGetUuid_v2``, as the
daemon does, never the first version, which names every MIG instance by its parent GPU.

No GPU needed: a driver made here (a C ``libcuda.so.1`` with two devices whose first-version
UUID is one parent's and whose ``_v2`` UUIDs are the instances' own, as a MIG-partitioned GPU
answers) is loaded by a child process. Skipped without a C compiler.
"""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from gpumemd import _cuda

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = r"""
#include <string.h>
typedef struct { unsigned char bytes[16]; } CUuuid;
int cuInit(unsigned f) { return 0; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *d, int ordinal) { if (ordinal < 0 || ordinal > 1) return 101; *d = ordinal; return 0; }
/* The first version: the parent GPU's UUID for every MIG instance. */
int cuDeviceGetUuid(CUuuid *u, int d) { memset(u->bytes, 0xaa, 16); return 0; }
int cuDeviceGetUuid_v2(CUuuid *u, int d) { memset(u->bytes, 0x10 + d, 16); return 0; }
int cuGetErrorString(int e, const char **s) { *s = "stub"; return 0; }
"""

V2_ONLY_MISSING = "#define cuDeviceGetUuid_v2 not_exported_v2\n"


def _build(tmp_path, source, stubs):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the MIG-like driver")
    # Every other call the client binds exists and says CUDA_ERROR_NOT_SUPPORTED.
    src = source + "".join("int %s() { return 801; }\n" % name for name in stubs)
    (tmp_path / "drv.c").write_text(src)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "drv.c")],
                   check=True)


def _bound_names():
    """The symbols _cuda._load binds besides the ones the fake driver defines."""
    import re
    text = open(_cuda.__file__).read()
    names = set(re.findall(r'"(cu[A-Za-z0-9_]+)":\s*\[', text))
    return sorted(names - {"cuInit", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetUuid", "cuDeviceGetUuid_v2",
                           "cuGetErrorString"})


def _visible(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), PYTHONPATH=PYTHON_DIR)
    code = textwrap.dedent("""
        from gpumemd import _cuda
        print(",".join(_cuda.visible_uuids()))
    """)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(",")


def test_visible_uuids_are_v2_the_mig_instances_own(tmp_path):
    _build(tmp_path, DRIVER, _bound_names())
    assert _visible(tmp_path) == [
        "GPU-10101010-1010-1010-1010-101010101010",
        "GPU-11111111-1111-1111-1111-111111111111",
    ]


def test_a_driver_without_v2_is_asked_the_first_version(tmp_path):
    _build(tmp_path, V2_ONLY_MISSING + DRIVER, _bound_names())
    assert _visible(tmp_path) == ["GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"] * 2
