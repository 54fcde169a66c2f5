"""CUDA leases: a daemon on the cuda backend and real GPU memory. Each test skips itself, with
the reason, where libcuda.so.1 or a GPU is missing (or PyTorch and CuPy, for the tensor test)."""
import ctypes
import os
import subprocess
import sys
import time

import numpy
import pytest

import gpumemd
from conftest import HERE, run_worker
from gpumemd import _cuda

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="no usable CUDA device (libcuda.so.1 missing or no GPU reported)")

SIZE = (3 << 20) + 512


@pytest.fixture(scope="module")
def cuda_daemon(tmp_path_factory):
    from conftest import Daemon

    d = Daemon(str(tmp_path_factory.mktemp("gpumemd-cuda")), "--backend", "cuda", "--device-limit-bytes", "1GiB")
    yield d
    d.stop()


def test_lease_exposes_a_device_pointer_and_the_cuda_array_interface(cuda_daemon):
    with gpumemd.connect(cuda_daemon.target) as gm:
        with gm.lease(0, 1 << 20, zero=True) as lease:
            assert not lease.is_host
            interface = lease.__cuda_array_interface__
            assert interface["version"] == 3 and interface["shape"] == (1 << 20,) and interface["typestr"] == "|u1"
            assert interface["data"] == (lease.device_ptr, False) and interface["stream"] is None
            assert _cuda.copy_from_device(0, lease.device_ptr, 4096) == bytes(4096)  # zeroed
            _cuda.memset(0, lease.device_ptr, 0x5A, 1 << 20)
            assert _cuda.copy_from_device(0, lease.device_ptr + 1000, 8) == b"\x5a" * 8
            with pytest.raises(gpumemd.GpumemdError):
                lease.buffer()
            with pytest.raises(TypeError):
                numpy.asarray(lease)


def test_torch_or_cupy_tensor_on_a_lease(cuda_daemon):
    torch = cupy = None
    try:
        import torch
    except ImportError:
        try:
            import cupy
        except ImportError:
            pytest.skip("neither PyTorch nor CuPy is installed")
    with gpumemd.connect(cuda_daemon.target) as gm:
        with gm.lease(0, 4 << 20) as lease:
            if torch is not None:
                t = torch.as_tensor(lease, device="cuda")
                assert t.data_ptr() == lease.device_ptr and t.numel() == 4 << 20
                halves = t.view(torch.float16)[: 512 * 512].view(512, 512)
                halves.copy_(torch.eye(512, dtype=torch.float16, device="cuda"))
                product = halves @ halves
                torch.cuda.synchronize()
                assert torch.equal(product, halves)
                del t, halves, product
            else:
                a = cupy.asarray(lease)
                assert a.data.ptr == lease.device_ptr
                a[:] = 7
                cupy.cuda.runtime.deviceSynchronize()
                assert _cuda.copy_from_device(0, lease.device_ptr, 16) == b"\x07" * 16
                del a


def test_cross_process_bytes_are_equal(cuda_daemon):
    cuda_daemon.admin.Trim(gpumemd._stubs.pb.TrimRequest(device=0, keep_bytes=0))
    written = run_worker("cuda-write", cuda_daemon.target, 0, SIZE, 5)
    read = run_worker("cuda-read", cuda_daemon.target, 0, SIZE, 5)
    assert read.split()[:2] == written.split()[:2]


def test_stream_ordered_release(cuda_daemon):
    lib = _cuda.make_current(0)
    stream = ctypes.c_void_p()
    _cuda.check(lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # non-blocking
    try:
        with gpumemd.connect(cuda_daemon.target) as gm:
            lease = gm.lease(0, 64 << 20, stream=stream.value)
            assert lease.__cuda_array_interface__["stream"] == stream.value
            _cuda.check(lib.cuMemsetD8Async(lease.device_ptr, 0x11, 64 << 20, stream), "cuMemsetD8Async")
            lease.close(after=stream.value)  # returns at once; the daemon waits for the event
            assert lease.closed
            _cuda.check(lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
            with gm.lease(0, 64 << 20) as again:  # the block is reused only after the memset
                if (again.segment_id, again.offset) == (lease.segment_id, lease.offset):
                    assert _cuda.copy_from_device(0, again.device_ptr + (63 << 20), 4) == b"\x11" * 4
            assert gm.stats().release_failures == 0
    finally:
        lib.cuStreamDestroy_v2(stream)


def test_producer_and_consumer_see_the_same_device_bytes_through_attach(cuda_daemon):
    """Sharing on CUDA: the producer writes through the driver, shares one-shot and exits; the
    consumer attaches (the same IPC handle, segment and offset) and reads the bytes; the
    block is back once it releases."""
    worker = [sys.executable, os.path.join(HERE, "sharing_worker.py")]
    baseline = cuda_daemon.stats(0).leased_bytes
    produced = subprocess.run(worker + ["cuda-produce", cuda_daemon.target, "0", str(SIZE), "9", "1", "1"],
                              capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stdout + produced.stderr
    token, segment, offset, block_bytes = produced.stdout.split()
    assert cuda_daemon.stats(0).leased_bytes == baseline + int(block_bytes)
    consumed = subprocess.run(worker + ["cuda-attach", cuda_daemon.target, token, str(SIZE), "9", "exit"],
                              capture_output=True, text=True, timeout=120)
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    seg, off, _, read_only, ok = consumed.stdout.split()
    assert (seg, off, ok) == (segment, offset, "ok")
    assert read_only == "1"  # reported; advisory on CUDA (a legacy IPC handle cannot be opened read-only)
    deadline = time.monotonic() + 5
    while cuda_daemon.stats(0).leased_bytes != baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    assert cuda_daemon.stats(0).leased_bytes == baseline
