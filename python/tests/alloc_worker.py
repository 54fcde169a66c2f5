"""A process that allocates through the gpumemd allocator shim and then waits to be killed
(test_alloc.py): `alloc_worker.py TARGET DEVICE SIZE COUNT` prints `ready SESSION_ID POINTER...`
once its COUNT allocations are made, then sleeps."""
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpumemd  # noqa: E402
from gpumemd import _alloc  # noqa: E402


def main(target, device, size, count):
    gm = gpumemd.connect(target, client_name="alloc-worker")
    allocator = _alloc.LeaseAllocator(gm, int(device), tag="alloc-worker")
    path, alloc_name, _ = _alloc.bind(allocator)
    alloc = getattr(ctypes.CDLL(path), alloc_name)
    alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    alloc.restype = ctypes.c_void_p
    pointers = []
    for _ in range(int(count)):
        pointer = alloc(int(size), int(device), None)
        if not pointer:
            print("refused %s" % allocator.last_error, flush=True)
            return 1
        pointers.append(pointer)
    print("ready %s %s" % (gm.session_id, " ".join("%x" % p for p in pointers)), flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
