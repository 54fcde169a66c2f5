"""A worker process for the cross-process tests. Usage:

    worker.py write TARGET DEVICE SIZE SEED   lease, write the pattern, print "segment offset", release
    worker.py read TARGET DEVICE SIZE SEED    lease, print "segment offset", check the pattern
    worker.py hold TARGET DEVICE SIZE         lease, print the lease id, wait to be killed
    worker.py cuda-write / cuda-read ...      the same on a CUDA device (driver copies)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy  # noqa: E402

import gpumemd  # noqa: E402
from gpumemd import _cuda  # noqa: E402


def pattern(size, seed):
    """Byte i = (7 i + seed) mod 251: the pattern JavaPeer writes and checks too."""
    return ((numpy.arange(size, dtype=numpy.int64) * 7 + seed) % 251).astype(numpy.uint8)


def main(mode, target, device, size, seed=0):
    device, size, seed = int(device), int(size), int(seed)
    with gpumemd.connect(target, client_name="pytest-worker-%s" % mode) as gm:
        lease = gm.lease(device, size)
        print(lease.segment_id, lease.offset, flush=True)
        if mode == "write":
            numpy.asarray(lease)[:] = pattern(size, seed)
        elif mode == "read":
            if not numpy.array_equal(numpy.asarray(lease), pattern(size, seed)):
                sys.exit("pattern mismatch in %r" % lease)
        elif mode == "cuda-write":  # lease.cuda_device: this process's ordinal of the daemon's device
            _cuda.copy_to_device(lease.cuda_device, lease.device_ptr, pattern(size, seed).tobytes())
            _cuda.synchronize(lease.cuda_device)
        elif mode == "cuda-read":
            if _cuda.copy_from_device(lease.cuda_device, lease.device_ptr, size) != pattern(size, seed).tobytes():
                sys.exit("pattern mismatch in %r" % lease)
        elif mode == "hold":
            print(lease.id, flush=True)
            time.sleep(3600)
        lease.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
