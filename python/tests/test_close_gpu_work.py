"""Issue 33 item 1 (Python): a closing client hands no block back while its GPU work may still
write it. A client process queues a memset on a non-blocking stream over the daemon's only block
(the budget holds one), closes the lease after that stream (``close(after=stream)``) or leaves
it open, and closes the client with a short ``timeout`` while the memset is still queued: a host
function queued before it on the stream sleeps for ``DELAY_MS`` (``cuLaunchHostFunc``), so the
memset lands that late on a GPU and on the stand-in driver alike. This process then
leases the block the moment the daemon has it, writes its own bytes, and checks, after the
other's work would have landed, that they are still there. Sync and asyncio clients, VMM and
legacy handles. Runs on the stand-in (``LD_LIBRARY_PATH`` and ``CUDA_STANDIN_DEVICES=1``) or a
GPU; skips, with its reason, where no CUDA driver or device is present."""
import os
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

import gpumemd
from gpumemd import _cuda
from conftest import Daemon

SIZE = 2 << 20
THEIRS, OURS = 171, 0x11
DELAY_MS = 1000
BOUND = 0.3

pytestmark = pytest.mark.skipif(not gpumemd.cuda_available(),
                                reason="CUDA tests skipped: no CUDA driver or device")

CHILD = textwrap.dedent("""
    import asyncio, ctypes, sys, time, logging
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    import gpumemd, gpumemd.aio
    from gpumemd import _cuda
    target, flavour, how = sys.argv[1], sys.argv[2], sys.argv[3]
    size, value, bound, linger = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
    delay = float(sys.argv[8])

    # the stream's work is held back by a host function that sleeps (kept referenced: the driver
    # calls it from its own thread)
    hold = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: time.sleep(delay))

    def queue(lease):
        stream = ctypes.c_void_p()
        with _cuda.context(lease.cuda_device) as lib:
            _cuda.check(lib.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")  # non-blocking
            _cuda.check(lib.cuLaunchHostFunc(stream, hold, None), "cuLaunchHostFunc")
            _cuda.check(lib.cuMemsetD8Async(lease.device_ptr, value, size, stream), "cuMemsetD8Async")
        return stream.value

    if flavour == "sync":
        gm = gpumemd.connect(target)
        lease = gm.lease(0, size)
        gm._timeout = bound  # close's bound is the client's timeout: short for the close only (a loaded
                             # machine may take longer than it to open a session)
        print("leased %d %d" % (lease.segment_id, lease.offset), flush=True)
        stream = queue(lease)
        if how == "after":
            lease.close(after=stream)
        start = time.monotonic()
        gm.close()
        print("closed %d" % ((time.monotonic() - start) * 1000), flush=True)
        time.sleep(linger)
    else:
        async def main():
            gm = await gpumemd.aio.connect(target)
            lease = await gm.lease(0, size)
            gm._timeout = bound  # as above
            print("leased %d %d" % (lease.segment_id, lease.offset), flush=True)
            stream = queue(lease)
            if how == "after":
                lease.close(after=stream)
            start = time.monotonic()
            await gm.close()
            print("closed %d" % ((time.monotonic() - start) * 1000), flush=True)
            await asyncio.sleep(linger)  # the loop lives on: the kept session's task closes it
        asyncio.run(main())
    print("exit", flush=True)
""")


@pytest.mark.parametrize("handles", ["vmm", "legacy"])
@pytest.mark.parametrize("flavour,how", [("sync", "after"), ("sync", "open"), ("aio", "after")])
def test_a_block_with_queued_work_comes_back_only_once_the_work_landed(tmp_path, handles, flavour, how):
    daemon = Daemon(str(tmp_path / "d"), "--backend", "cuda", "--cuda-handles", handles,
                    "--device-limit-bytes", str(SIZE))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(gpumemd.__file__))))
    other = subprocess.Popen([sys.executable, "-c", CHILD, daemon.target, flavour, how, str(SIZE), str(THEIRS),
                              str(BOUND), str(DELAY_MS / 1000 + 1.5), str(DELAY_MS / 1000)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        with gpumemd.connect(daemon.target) as gm:
            leased = other.stdout.readline().strip()
            assert leased.startswith("leased "), leased + other.stdout.read()
            lease = _lease_when_free(gm, 30)
            assert leased == "leased %d %d" % (lease.segment_id, lease.offset), "the budget holds one block"
            _cuda.memset(lease.cuda_device, lease.device_ptr, OURS, SIZE)
            time.sleep(DELAY_MS / 1000 + 0.5)  # past the moment the other's memset would land
            data = _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, SIZE)
            foreign = SIZE - bytes(data).count(bytes([OURS]))
            lease.close()
        output = other.communicate(timeout=DELAY_MS / 1000 + 15)[0]
        assert foreign == 0, ("%d bytes of the block overwritten after this process leased it: the other's GPU "
                              "work landed in it\n%s" % (foreign, output))
        closed = [line for line in output.splitlines() if line.startswith("closed ")]
        assert closed and int(closed[0].split()[1]) < DELAY_MS, "close returned after its bound:\n" + output
        assert "still running after" in output and "kept" in output, output
    finally:
        if other.poll() is None:
            other.kill()
            other.wait()
        daemon.stop()


def _lease_when_free(gm, seconds):
    deadline = time.monotonic() + seconds
    while True:
        try:
            return gm.lease(0, SIZE)
        except gpumemd.GpumemdError as e:
            if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
