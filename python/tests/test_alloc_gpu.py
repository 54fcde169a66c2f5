"""PyTorch and CuPy allocating through gpumemd on a real GPU (a daemon on the cuda backend with a
1 GiB device budget). Each test skips itself, with the reason, where libcuda.so.1 or a GPU is
missing, or PyTorch or CuPy. They ran on an NVIDIA H200 (PyTorch 2.11, CuPy 14.2); the
framework-independent core is tested everywhere by test_alloc.py."""
import gc
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest

import gpumemd
from conftest import HERE

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="no usable CUDA device (libcuda.so.1 missing or no GPU reported)")

MiB = 1 << 20


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        pytest.skip("this PyTorch (%s) has no torch.cuda.MemPool" % torch.__version__)
    import gpumemd.torch  # noqa: F401

    return torch


def _cupy():
    try:
        import cupy
    except ImportError:
        pytest.skip("CuPy is not installed")
    import gpumemd.cupy  # noqa: F401

    return cupy


@pytest.fixture(scope="module")
def cuda_daemon(tmp_path_factory):
    from conftest import Daemon

    d = Daemon(str(tmp_path_factory.mktemp("gpumemd-alloc")), "--backend", "cuda", "--device-limit-bytes", "1GiB")
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def released():
    """After each test: the pools it dropped give their segments back, so the next one starts
    from the daemon's baseline."""
    yield
    gc.collect()
    if "gpumemd.torch" in sys.modules:
        sys.modules["gpumemd.torch"].empty_cache()


def wait_until(predicate, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.0f s" % (what, timeout)
        time.sleep(0.01)


def tagged(daemon, gm_or_session, tag):
    session = gm_or_session if isinstance(gm_or_session, str) else gm_or_session.session_id
    return [e for e in daemon.leases(session_id=session) if e.tag == tag]


def test_torch_matmul_operands_and_result_live_in_leases(cuda_daemon):
    torch = _torch()
    with gpumemd.connect(cuda_daemon.target) as gm:
        pool = gpumemd.torch.mem_pool(gm, 0)
        generator = torch.Generator(device="cuda").manual_seed(3)
        with torch.cuda.use_mem_pool(pool):
            a = torch.randn(1024, 1024, device="cuda", generator=generator)
            b = torch.randn(1024, 1024, device="cuda", generator=generator)
            c = a @ b
        torch.cuda.synchronize()
        expected = (a.cpu().double() @ b.cpu().double()).float()
        assert torch.allclose(c.cpu(), expected, rtol=1e-3, atol=1e-2)
        listed = {e.lease_id for e in tagged(cuda_daemon, gm, "torch")}
        for t in (a, b, c):
            lease = gpumemd.torch.lease_of(t)
            assert lease.id in listed
            assert lease.device_ptr <= t.data_ptr() < lease.device_ptr + lease.size
        from gpumemd import _alloc

        assert _alloc._queue is not None, "the pool does not use the C shim (no compiler?)"
        stats = pool.gpumemd.stats()
        assert stats.allocations >= 1 and stats.live_leases == len(listed) and stats.failures == 0
        with pytest.raises(ValueError):
            gpumemd.torch.lease_of(torch.empty(16, device="cuda"))  # the default allocator's
        del a, b, c, pool


def test_torch_pool_tensor_shared_by_token_is_read_by_another_process(cuda_daemon):
    torch = _torch()
    count = 1 << 20
    with gpumemd.connect(cuda_daemon.target) as gm:
        pool = gpumemd.torch.mem_pool(gm, 0)
        with torch.cuda.use_mem_pool(pool):
            t = torch.arange(count, dtype=torch.float32, device="cuda")
        torch.cuda.synchronize()
        lease = gpumemd.torch.lease_of(t)
        offset = t.data_ptr() - lease.device_ptr
        share = lease.share(max_attaches=1)
        result = subprocess.run([sys.executable, os.path.join(HERE, "alloc_gpu_worker.py"), "read",
                                 cuda_daemon.target, share.token, str(offset), str(count)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        words = result.stdout.split()
        assert float(words[1]) == float(count) * (count - 1) / 2
        assert float(words[3]) == 0.0 and float(words[5]) == float(count - 1)
        del t, pool


def test_empty_cache_gives_the_segments_back_to_the_daemon(cuda_daemon):
    torch = _torch()
    with gpumemd.connect(cuda_daemon.target) as gm:
        baseline = cuda_daemon.stats(0).leased_bytes
        pool = gpumemd.torch.mem_pool(gm, 0)
        with torch.cuda.use_mem_pool(pool):
            x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
            y = torch.empty(96 * MiB, dtype=torch.uint8, device="cuda")
        assert cuda_daemon.stats(0).leased_bytes >= baseline + 160 * MiB
        assert len(tagged(cuda_daemon, gm, "torch")) >= 2
        allocator = pool.gpumemd
        del x, y, pool  # the tensors' blocks go back to PyTorch's cache, then the pool is dropped
        gc.collect()
        assert gpumemd.torch.empty_cache(10)
        wait_until(lambda: tagged(cuda_daemon, gm, "torch") == [], "the segments released to the daemon")
        wait_until(lambda: cuda_daemon.stats(0).leased_bytes <= baseline, "the daemon's leased bytes back")
        assert allocator.stats().live_leases == 0 and allocator.stats().frees >= 2


def test_a_killed_workers_pool_memory_comes_back(cuda_daemon):
    _torch()
    baseline = cuda_daemon.stats(0).leased_bytes
    worker = subprocess.Popen([sys.executable, os.path.join(HERE, "alloc_gpu_worker.py"), "hold",
                               cuda_daemon.target, str(256 * MiB)], stdout=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline().split()
        assert line and line[0] == "ready", line
        session = line[1]
        assert sum(e.size_bytes for e in tagged(cuda_daemon, session, "torch")) >= 256 * MiB
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    wait_until(lambda: cuda_daemon.leases(session_id=session) == [], "the killed worker's leases back")
    wait_until(lambda: cuda_daemon.stats(0).leased_bytes == baseline, "the daemon's leased bytes back")


def test_torch_out_of_memory_from_the_budget_carries_the_daemons_words(cuda_daemon):
    torch = _torch()
    with gpumemd.connect(cuda_daemon.target) as gm:
        pool = gpumemd.torch.mem_pool(gm, 0)
        with gpumemd.torch.use_mem_pool(pool):
            first = torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
        with pytest.raises(torch.cuda.OutOfMemoryError) as raised:
            with gpumemd.torch.use_mem_pool(pool):
                torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
        error = pool.gpumemd.last_error
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.message in str(raised.value) and raised.value.__cause__ is error
        ooms = cuda_daemon.stats(0).ooms
        with pytest.raises(torch.cuda.OutOfMemoryError):  # plain PyTorch: its own message, the same refusal
            with torch.cuda.use_mem_pool(pool):
                torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
        assert cuda_daemon.stats(0).ooms > ooms
        del first, pool


def test_cupy_arrays_live_in_leases_released_when_freed(cuda_daemon):
    cupy = _cupy()
    with gpumemd.connect(cuda_daemon.target) as gm:
        before = cupy.cuda.get_allocator() if hasattr(cupy.cuda, "get_allocator") else None
        with gpumemd.cupy.allocator(gm, 0) as allocator:
            a = cupy.ones(1 << 20, dtype=cupy.float32)
            b = a * 2
            assert float(b.sum()) == 2.0 * (1 << 20)
        if before is not None:
            assert cupy.cuda.get_allocator() is before  # restored
        leases = {gpumemd.cupy.lease_of(x).id for x in (a, b)}
        assert leases <= {e.lease_id for e in tagged(cuda_daemon, gm, "cupy")} and len(leases) == 2
        assert allocator.gpumemd.stats().live_leases == 2
        del a, b
        gc.collect()
        wait_until(lambda: tagged(cuda_daemon, gm, "cupy") == [], "the arrays' leases released")
        # CuPy allocates more than the two arrays (the sum's result, seen on an H200): every
        # allocation made through the allocator is freed, none is left
        stats = allocator.gpumemd.stats()
        assert stats.allocations >= 2 and stats.frees == stats.allocations and stats.live_leases == 0, stats


def test_cupy_out_of_memory_from_the_budget_carries_the_daemons_words(cuda_daemon):
    cupy = _cupy()
    with gpumemd.connect(cuda_daemon.target) as gm:
        with gpumemd.cupy.allocator(gm, 0) as allocator:
            first = cupy.empty(600 * MiB, dtype=cupy.uint8)
            with pytest.raises(cupy.cuda.memory.OutOfMemoryError) as raised:
                cupy.empty(600 * MiB, dtype=cupy.uint8)
        error = allocator.gpumemd.last_error
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.message in str(raised.value)
        assert raised.value.__cause__ is error
        del first


def test_cupy_pooled_allocator_gives_leases_back_on_free_all_blocks(cuda_daemon):
    cupy = _cupy()
    with gpumemd.connect(cuda_daemon.target) as gm:
        with gpumemd.cupy.allocator(gm, 0, pooled=True) as allocator:
            for _ in range(3):
                a = cupy.zeros(8 * MiB, dtype=cupy.uint8)
                del a
        assert allocator.gpumemd.stats().allocations == 1  # CuPy's pool reused the block
        assert len(tagged(cuda_daemon, gm, "cupy")) == 1
        allocator.pool.free_all_blocks()
        gc.collect()
        wait_until(lambda: tagged(cuda_daemon, gm, "cupy") == [], "the pool's leases released")


_SPIN = r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
'''


def test_cupy_release_waits_for_the_allocation_stream_not_the_current_one(cuda_daemon):
    """Issue 33 item 2, with CuPy on a GPU: an array allocated on a non-blocking stream, with a
    long kernel queued there, and dropped while another (idle) stream is current, is released
    only once that kernel has finished (test_cupy_stream.py has the same without CuPy)."""
    cupy = _cupy()
    with gpumemd.connect(cuda_daemon.target) as gm:
        with gpumemd.cupy.allocator(gm, 0):
            busy, idle = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
            with busy:
                a = cupy.empty(1 << 20, dtype=cupy.uint8)
                rate = cupy.cuda.runtime.deviceGetAttribute(cupy.cuda.runtime.cudaDevAttrClockRate, 0)  # kHz
                cupy.RawKernel(_SPIN, "spin")((1,), (1,), (cupy.int64(rate * 1000),))  # about a second
            with idle:
                del a
                gc.collect()
            assert len(gm._deferred) == 1, "the release waits for the kernel on the allocation's stream"
            busy.synchronize()
            wait_until(lambda: len(gm._deferred) == 0, "released once the kernel ended")
            wait_until(lambda: tagged(cuda_daemon, gm, "cupy") == [], "the lease released")
