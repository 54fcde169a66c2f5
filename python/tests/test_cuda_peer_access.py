"""Which devices a VMM lease's mapping lets in (issue 33 item 6): the lease's own device and
every device of the process that ``cuDeviceCanAccessPeer`` says can reach it, with the lease's
access, as a legacy handle opened with ``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`` lets peers in.
Read with ``cuMemGetAccess`` for each device in a client process, on the stand-in driver (no
peers) and on a variant of it built here whose devices are all peers (the stand-in's objects
with ``cuDeviceCanAccessPeer`` replaced). Needs two devices (``CUDA_STANDIN_DEVICES=2``), the
stand-in's build (``obj/`` beside its ``libcuda.so.1`` on ``LD_LIBRARY_PATH``), ``cc`` and
``objcopy``; a kernel on the peer reaching the memory is for a machine with two GPUs."""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import gpumemd
from conftest import PYTHON_DIR
from gpumemd import _cuda

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="no usable CUDA device (libcuda.so.1 missing or no GPU reported)")

PEERS = """
__attribute__((visibility("default"))) int cuDeviceCanAccessPeer(int *can, int device, int peer) {
    if (!can) return 1;
    *can = device != peer;
    return 0;
}
"""


def _standin_objects():
    for entry in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if entry and os.path.isfile(os.path.join(entry, "obj", "core.o")) \
                and os.path.isfile(os.path.join(entry, "libcuda.so.1")):
            return sorted(glob.glob(os.path.join(entry, "obj", "*.o")))
    return None


def _build_peers(directory):
    objects = _standin_objects()
    if objects is None or not shutil.which("cc") or not shutil.which("objcopy"):
        pytest.skip("needs the stand-in's build on LD_LIBRARY_PATH, cc and objcopy")
    linked = []
    for o in objects:
        copy = os.path.join(directory, os.path.basename(o))
        shutil.copy(o, copy)
        subprocess.run(["objcopy", "--redefine-sym", "cuDeviceCanAccessPeer=standin_replaced_cuDeviceCanAccessPeer",
                        copy], check=True)
        linked.append(copy)
    with open(os.path.join(directory, "peers.c"), "w") as f:
        f.write(PEERS)
    subprocess.run(["cc", "-fPIC", "-c", os.path.join(directory, "peers.c"), "-o",
                    os.path.join(directory, "peers.o")], check=True)
    subprocess.run(["cc", "-shared", "-pthread", "-Wl,-soname,libcuda.so.1", "-o",
                    os.path.join(directory, "libcuda.so.1")] + linked + [os.path.join(directory, "peers.o")],
                   check=True)


@pytest.fixture(scope="module")
def vmm_daemon():
    from conftest import Daemon

    if len(_cuda.visible_uuids()) < 2:
        pytest.skip("needs two devices (CUDA_STANDIN_DEVICES=2)")
    directory = tempfile.mkdtemp(prefix="gpumemd-peers-", dir="/tmp")
    d = Daemon(directory, "--backend", "cuda", "--cuda-handles", "vmm", "--device-limit-bytes", "64MiB")
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


CLIENT = textwrap.dedent("""
    import ctypes, sys
    import gpumemd
    from gpumemd import _cuda
    with gpumemd.connect(sys.argv[1]) as gm, gm.lease(int(sys.argv[2]), 1 << 20) as lease:
        lib = _cuda._load()
        lib.cuMemGetAccess.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(_cuda.MemLocation),
                                       ctypes.c_uint64]
        access = []
        for d in range(len(_cuda.visible_uuids())):
            flags = ctypes.c_ulonglong(99)
            rc = lib.cuMemGetAccess(ctypes.byref(flags), ctypes.byref(_cuda.MemLocation(1, d)), lease.device_ptr)
            access.append(str(flags.value) if rc == 0 else "error%d" % rc)
        print(lease.cuda_device, " ".join(access))
""")


def _access(daemon, device, driver=None):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    if driver is not None:
        env["LD_LIBRARY_PATH"] = driver
    out = subprocess.run([sys.executable, "-c", CLIENT, daemon.target, str(device)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    local, access = out.stdout.strip().split(" ", 1)
    return int(local), access.split()


def test_a_vmm_mapping_lets_in_the_leases_device_and_its_peers(vmm_daemon, tmp_path):
    # The stand-in: no device is another's peer, so only the lease's own device gets in.
    assert _access(vmm_daemon, 1) == (1, ["0", "3"])
    _build_peers(str(tmp_path))
    # Every device a peer of every other: the other device gets the same read-write access.
    assert _access(vmm_daemon, 1, str(tmp_path)) == (1, ["3", "3"])
    assert _access(vmm_daemon, 0, str(tmp_path)) == (0, ["3", "3"])
