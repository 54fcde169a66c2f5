"""CUDA leases: a daemon on the cuda backend and real GPU memory, with legacy IPC handles
(``cuda_daemon``) and with VMM segments passed as descriptors (``vmm_daemon``, issue 24). Each
test skips itself, with the reason, where libcuda.so.1 or a GPU is missing (or PyTorch and CuPy,
for the tensor test). None of them has run on a GPU yet (none was available where they were
written)."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy
import pytest

import gpumemd
from conftest import HERE, PYTHON_DIR, run_worker
from gpumemd import _cuda
from gpumemd._stubs import pb, pb_grpc

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="no usable CUDA device (libcuda.so.1 missing or no GPU reported)")

SIZE = (3 << 20) + 512


@pytest.fixture(scope="module")
def cuda_daemon(tmp_path_factory):
    from conftest import Daemon

    d = Daemon(str(tmp_path_factory.mktemp("gpumemd-cuda")), "--backend", "cuda", "--cuda-handles", "legacy",
               "--device-limit-bytes", "1GiB")
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
    with _cuda.context(0) as lib:
        stream = ctypes.c_void_p()
        _cuda.check(lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # non-blocking
    try:
        with gpumemd.connect(cuda_daemon.target) as gm:
            lease = gm.lease(0, 64 << 20, stream=stream.value)
            assert lease.__cuda_array_interface__["stream"] == stream.value
            with _cuda.context(lease.cuda_device) as lib:
                _cuda.check(lib.cuMemsetD8Async(lease.device_ptr, 0x11, 64 << 20, stream), "cuMemsetD8Async")
            lease.close(after=stream)  # a ctypes.c_void_p (as Numba's handle); returns at once
            assert lease.closed
            with _cuda.context(0) as lib:
                _cuda.check(lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
            wait_until(lambda: not listed(cuda_daemon, lease.id), "the release after the event")
            with gm.lease(0, 64 << 20) as again:  # the block is reused only after the memset
                if (again.segment_id, again.offset) == (lease.segment_id, lease.offset):
                    assert _cuda.copy_from_device(0, again.device_ptr + (63 << 20), 4) == b"\x11" * 4
            assert gm.stats().release_failures == 0
    finally:
        with _cuda.context(0) as lib:
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


# ---------------------------------------------------------------------------- VMM (issue 24)


def wait_until(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.0f s" % (what, timeout)
        time.sleep(0.01)


def listed(daemon, lease_id):
    return any(entry.lease_id == lease_id for entry in daemon.leases())


@pytest.fixture(scope="module")
def vmm_daemon():
    """A daemon with VMM segments, in a directory another uid may reach (the other-uid test)."""
    from conftest import Daemon

    directory = tempfile.mkdtemp(prefix="gpumemd-vmm-", dir="/tmp")
    os.chmod(directory, 0o711)
    d = Daemon(directory, "--backend", "cuda", "--cuda-handles", "vmm", "--device-limit-bytes", "1GiB",
               "--socket-mode", "0666")
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


def raw_lease(gm, size):
    """A LeaseResponse straight from the daemon (its handle as sent), released by the caller."""
    return pb_grpc.AllocatorStub(gm.channel).Lease(pb.LeaseRequest(session_id=gm.session_id, device=0,
                                                                    size_bytes=size), metadata=gm.metadata)


def test_vmm_segments_come_as_descriptors_and_devices_match_by_uuid(vmm_daemon):
    with gpumemd.connect(vmm_daemon.target) as gm:
        response = raw_lease(gm, 1 << 20)
        assert response.handle.WhichOneof("kind") == "cuda_vmm" and response.handle.cuda_vmm.fd_socket
        gm._give_back(gm._s, response.lease_id)
        with gm.lease(0, 1 << 20, zero=True) as lease:
            assert type(lease._mapping).__name__ == "VmmMapping" and not lease._mapping.read_only
            assert _cuda.visible_uuids()[lease.cuda_device] == gm._s.device_uuid(0)
            assert gm._s.device_uuid(0).startswith("GPU-")
            assert _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, 4096) == bytes(4096)
            _cuda.copy_to_device(lease.cuda_device, lease.device_ptr + 100, b"vmm!")
            assert _cuda.copy_from_device(lease.cuda_device, lease.device_ptr + 100, 4) == b"vmm!"
        assert gm._fd_channels.fetched == 1 and gm.stats().maps_opened == 1


def test_vmm_bytes_cross_two_processes_by_descriptor(vmm_daemon):
    vmm_daemon.admin.Trim(pb.TrimRequest(device=0, keep_bytes=0))
    written = run_worker("cuda-write", vmm_daemon.target, 0, SIZE, 5)
    read = run_worker("cuda-read", vmm_daemon.target, 0, SIZE, 5)
    assert read.split()[:2] == written.split()[:2]  # the same segment and offset, read back in another process


def test_a_write_through_a_read_only_vmm_hold_is_refused(vmm_daemon):
    from worker import pattern

    worker = [sys.executable, os.path.join(HERE, "sharing_worker.py")]
    with gpumemd.connect(vmm_daemon.target) as gm, gm.lease(0, SIZE) as lease:
        expected = pattern(SIZE, 4).tobytes()
        _cuda.copy_to_device(lease.cuda_device, lease.device_ptr, expected)
        _cuda.synchronize(lease.cuda_device)
        share = lease.share(read_only=True, max_attaches=1)
        consumed = subprocess.run(worker + ["cuda-attach", vmm_daemon.target, share.token, str(SIZE), "4",
                                            "write-refused"], capture_output=True, text=True, timeout=120)
        assert consumed.returncode == 0, consumed.stdout + consumed.stderr
        lines = consumed.stdout.split("\n")
        # the worker prints the hold, then its mapping, then the refusal, and exits before "ok"
        assert lines[0].split()[3] == "1", consumed.stdout
        assert lines[1] == "VmmMapping 1", consumed.stdout  # its own read-only mapping
        assert lines[2].startswith("refused "), consumed.stdout
        assert _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, SIZE) == expected  # unchanged


KERNEL_WRITE = """
import sys
sys.path.insert(0, sys.argv[1])
import gpumemd, torch
with gpumemd.connect(sys.argv[2]) as gm:
    hold = gm.attach(sys.argv[3])
    print(type(hold._mapping).__name__, int(hold._mapping.read_only), flush=True)
    try:
        torch.as_tensor(hold, device="cuda").fill_(1)
        torch.cuda.synchronize()
    except RuntimeError as e:
        print("faulted", str(e).splitlines()[0].replace(" ", "_"), flush=True)
        import os
        os._exit(0)  # the context is lost after the fault
    print("written", flush=True)
"""


def test_a_kernel_write_through_a_read_only_vmm_hold_faults(vmm_daemon):
    """What the stand-in cannot show: a kernel (not a driver copy) writing through a read-only
    VMM mapping faults on the GPU, and the owner's bytes stay as they were."""
    from conftest import on_standin

    if on_standin():
        pytest.skip("only a real GPU runs kernels: the stand-in driver has none")
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed (it launches the kernel)")
    with gpumemd.connect(vmm_daemon.target) as gm, gm.lease(0, 1 << 20) as lease:
        _cuda.copy_to_device(lease.cuda_device, lease.device_ptr, b"\x07" * 64)
        _cuda.synchronize(lease.cuda_device)
        share = lease.share(read_only=True, max_attaches=1)
        run = subprocess.run([sys.executable, "-c", KERNEL_WRITE, PYTHON_DIR, vmm_daemon.target, share.token],
                             capture_output=True, text=True, timeout=120)
        lines = run.stdout.split("\n")
        assert lines[0] == "VmmMapping 1", run.stdout + run.stderr
        assert lines[1].startswith("faulted "), run.stdout + run.stderr
        assert _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, 64) == b"\x07" * 64


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="another uid needs root and setpriv")
def test_another_uid_gets_only_its_own_tenants_vmm_descriptors(vmm_daemon):
    package = tempfile.mkdtemp(prefix="gpumemd-py-", dir="/tmp")  # readable by nobody
    try:
        shutil.copytree(os.path.join(PYTHON_DIR, "gpumemd"), os.path.join(package, "gpumemd"))
        shutil.copy(os.path.join(HERE, "cuda_other_user.py"), package)
        for directory, dirs, files in os.walk(package):
            os.chmod(directory, 0o755)
            for f in files:
                os.chmod(os.path.join(directory, f), 0o644)
        with gpumemd.connect(vmm_daemon.target, client_name="victim") as gm, gm.lease(0, 1 << 20) as lease:
            _cuda.copy_to_device(lease.cuda_device, lease.device_ptr, b"secret")
            response = raw_lease(gm, 1 << 20)
            fd_socket = response.handle.cuda_vmm.fd_socket
            gm._give_back(gm._s, response.lease_id)
            result = subprocess.run(
                ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                 os.path.join(package, "cuda_other_user.py"), vmm_daemon.target, fd_socket, gm.session_id,
                 str(lease.segment_id)],
                capture_output=True, text=True, timeout=120,
                env=dict(os.environ, GPUMEMD_PYTHON_DIR=package, HOME="/tmp"))
            assert result.returncode == 0, result.stdout + result.stderr
            seen = json.loads(result.stdout.strip().splitlines()[-1])
            assert _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, 6) == b"secret"
    finally:
        shutil.rmtree(package, ignore_errors=True)
    assert seen["uid"] == 65534
    assert seen["foreign_session"]["code"] == "NOT_FOUND" and gm.session_id in seen["foreign_session"]["message"]
    assert seen["own_session_foreign_segment"]["code"] == "NOT_FOUND"
    assert seen["own_lease"]["bytes"] == "mine!" and seen["own_lease"]["mapping"] == "VmmMapping"
    assert seen["own_lease"]["segment"] != lease.segment_id, "tenants never share a segment"


def test_release_waits_for_the_recorded_event(vmm_daemon):
    """The stream is held by a host function until the test opens the gate: the lease closed
    after it stays with the daemon (a new lease gets another block) until the gate opens."""
    gate = threading.Event()
    host_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: gate.wait(120) and None)
    with _cuda.context(0) as lib:
        lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        stream = ctypes.c_void_p()
        _cuda.check(lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # non-blocking
    try:
        with gpumemd.connect(vmm_daemon.target) as gm:
            lease = gm.lease(0, 8 << 20)
            with _cuda.context(lease.cuda_device) as lib:
                _cuda.check(lib.cuLaunchHostFunc(stream, ctypes.cast(host_fn, ctypes.c_void_p), None),
                            "cuLaunchHostFunc")
                _cuda.check(lib.cuMemsetD8Async(lease.device_ptr, 0x22, 8 << 20, stream), "cuMemsetD8Async")
            lease.close(after=stream.value)
            assert lease.closed and len(gm._deferred) == 1  # returned with the stream still held
            with gm.lease(0, 8 << 20) as other:
                assert (other.segment_id, other.offset) != (lease.segment_id, lease.offset)
            assert listed(vmm_daemon, lease.id) and len(gm._deferred) == 1  # the memset has not run
            gate.set()
            wait_until(lambda: not listed(vmm_daemon, lease.id), "the release after the event")
            assert len(gm._deferred) == 0 and gm.stats().release_failures == 0
            with gm.lease(0, 8 << 20) as again:
                if (again.segment_id, again.offset) == (lease.segment_id, lease.offset):
                    assert _cuda.copy_from_device(again.cuda_device, again.device_ptr, 4) == b"\x22" * 4
    finally:
        gate.set()
        with _cuda.context(0) as lib:
            lib.cuStreamSynchronize(stream)
            lib.cuStreamDestroy_v2(stream)


def test_a_lease_leaves_the_callers_current_context_as_it_was(vmm_daemon):
    """In a fresh thread no context is current; after a lease, its use and its close there still
    is none (the client pushes the primary context and pops it)."""
    seen = []

    def run():
        seen.append(_cuda.current_context())
        with gpumemd.connect(vmm_daemon.target) as gm, gm.lease(0, 1 << 20, zero=True) as lease:
            _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, 16)
            seen.append(_cuda.current_context())
        seen.append(_cuda.current_context())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    assert seen == [0, 0, 0]


@pytest.mark.parametrize("handles", ["legacy", "vmm"])
def test_the_client_cache_tier_zeroes_a_cuda_block_locally_and_never_keeps_a_stream_ordered_close(
        request, handles):
    d = request.getfixturevalue("cuda_daemon" if handles == "legacy" else "vmm_daemon")
    with gpumemd.connect(d.target, client_name="cuda-cache", client_cache_bytes=64 << 20) as gm:
        lease = gm.lease(0, 1 << 20)
        _cuda.memset(lease.cuda_device, lease.device_ptr, 0x77, lease.block_bytes)
        lease.close()
        again = gm.lease(0, 4096, zero=True)  # the cached block, zeroed whole on the device here
        assert again.local_hit and again.id == lease.id
        # The block's last bytes, past the 4096 asked for: the whole block is zeroed, as the daemon would.
        assert _cuda.copy_from_device(again.cuda_device, again.device_ptr + again.block_bytes - 8, 8) == bytes(8)
        with _cuda.context(0) as lib:
            stream = ctypes.c_void_p()
            _cuda.check(lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
        try:
            again.close(after=stream)
            assert gm.stats().cached_leases == 0  # released once the stream's work is done, not cached
            with _cuda.context(0) as lib:
                _cuda.check(lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
            wait_until(lambda: not listed(d, lease.id), "the stream-ordered release")
        finally:
            with _cuda.context(0) as lib:
                lib.cuStreamDestroy_v2(stream)
