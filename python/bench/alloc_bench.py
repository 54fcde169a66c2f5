#!/usr/bin/env python3
"""PyTorch allocating through gpumemd against its default allocator, on a GPU (issue 27).

    PYTHONPATH=python python3 python/bench/alloc_bench.py [TARGET] [--jar server/target/gpumemd.jar]
        [--handles auto|legacy|vmm] [--iterations N] [--rounds N]

Without TARGET it starts the daemon jar itself (cuda backend, Unix socket, a temporary directory)
and stops it at the end; TARGET must be a daemon on the cuda backend. Needs PyTorch with CUDA and
a C compiler (the allocator shim). It measures, p50 and p99:

1. ``torch.empty`` + free in a gpumemd pool against PyTorch's default allocator, at 4 KiB,
   1 MiB and 64 MiB, with the segment already cached by PyTorch in both (so no gpumemd call:
   this shows that the pool costs nothing once warm; the issue quotes 4.3-4.7 us for the
   default allocator from Python on an H100);
2. a first-time segment: ``torch.empty`` in a new gpumemd pool (one lease: a daemon round trip
   and the mapping) when the daemon serves a block it has cached (segment mapped here already)
   and after an Admin ``Trim`` (a new segment: the daemon allocates and this process maps it),
   against ``torch.empty`` after ``torch.cuda.empty_cache()`` (PyTorch's cudaMalloc) and a bare
   ``cuMemAlloc`` + ``cuMemFree``, at 2 MiB, 64 MiB and 1 GiB.
"""
import argparse
import ctypes
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import gpumemd  # noqa: E402
import gpumemd.torch  # noqa: E402
from gpumemd import _cuda  # noqa: E402
from gpumemd._stubs import pb, pb_grpc  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def start_daemon(jar, directory, handles):
    socket = os.path.join(directory, "gpumemd.sock")
    log = open(os.path.join(directory, "gpumemd.log"), "wb")
    process = subprocess.Popen(
        ["java", "-jar", jar, "--socket", socket, "--shm-dir", os.path.join(directory, "shm"),
         "--metrics-port", "0", "--backend", "cuda", "--cuda-handles", handles, "--device-limit-bytes", "16GiB"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(log.name, "rb") as f:
            if b"gpumemd ready" in f.read():
                return process, "unix://" + socket
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    with open(log.name, "rb") as f:
        sys.exit("gpumemd did not start:\n" + f.read().decode(errors="replace")[-4000:])


def percentiles(times):
    times = sorted(times)
    return statistics.median(times) * 1e6, times[min(len(times) - 1, int(len(times) * 0.99))] * 1e6


def empty_and_free(size, iterations, pool=None):
    """torch.empty(size) + del, timed one by one (the segment cached first)."""
    clock = time.perf_counter
    out = []
    context = gpumemd.torch.use_mem_pool(pool) if pool is not None else _nothing()
    with context:
        torch.empty(size, dtype=torch.uint8, device="cuda")  # the segment, cached by PyTorch
        for _ in range(200):
            torch.empty(size, dtype=torch.uint8, device="cuda")
        for _ in range(iterations):
            start = clock()
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            del t
            out.append(clock() - start)
    return percentiles(out)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def first_segment_gpumemd(gm, admin, size, rounds, trim):
    """(p50, p99) of a new pool's first torch.empty; with ``trim`` the daemon trims its cache to 0
    before each round (a segment still mapped by this process may need its unmap first: the
    bytes trimmed are reported, to tell whether the rounds really made new segments)."""
    out = []
    trimmed = []
    for _ in range(rounds):
        if trim:
            trimmed.append(admin.Trim(pb.TrimRequest(device=0, keep_bytes=0)).freed_bytes)
        pool = gpumemd.torch.mem_pool(gm, 0)
        torch.cuda.synchronize()
        with gpumemd.torch.use_mem_pool(pool):
            start = time.perf_counter()
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            out.append(time.perf_counter() - start)
        del t, pool
        gc.collect()
        gpumemd.torch.empty_cache()
    if trim:
        print("    (Trim freed %.1f MiB per round on average at %d MiB)" % (
            statistics.mean(trimmed) / MiB, size // MiB))
    return percentiles(out)


def first_segment_default(size, rounds):
    out = []
    for _ in range(rounds):
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        start = time.perf_counter()
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        out.append(time.perf_counter() - start)
        del t
    torch.cuda.empty_cache()
    return percentiles(out)


def first_segment_driver(size, rounds):
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    out = []
    with _cuda.context(torch.cuda.current_device()):
        for _ in range(rounds):
            pointer = ctypes.c_uint64()
            start = time.perf_counter()
            _cuda.check(lib.cuMemAlloc_v2(ctypes.byref(pointer), size), "cuMemAlloc")
            out.append(time.perf_counter() - start)
            _cuda.check(lib.cuMemFree_v2(pointer.value), "cuMemFree")
    return percentiles(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?")
    parser.add_argument("--jar", default=os.path.join(REPO, "server", "target", "gpumemd.jar"))
    parser.add_argument("--handles", default="auto", choices=["auto", "legacy", "vmm"])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("alloc_bench needs PyTorch with a CUDA device")
    directory = process = None
    target = args.target
    if target is None:
        directory = tempfile.mkdtemp(prefix="gpumemd-alloc-bench-")
        process, target = start_daemon(args.jar, directory, args.handles)
    try:
        torch.cuda.init()
        with gpumemd.connect(target, client_name="alloc-bench") as gm:
            admin = pb_grpc.AdminStub(gm.channel)
            print("device: %s; torch %s; daemon %s (%s handles)" % (
                torch.cuda.get_device_name(), torch.__version__, target, args.handles))
            print()
            print("torch.empty + free, segment cached by PyTorch   p50 us   p99 us")
            for size in (4 * KiB, MiB, 64 * MiB):
                pool = gpumemd.torch.mem_pool(gm, 0)
                rows = [("default allocator", empty_and_free(size, args.iterations)),
                        ("gpumemd pool", empty_and_free(size, args.iterations, pool))]
                for name, (p50, p99) in rows:
                    print("  %-8s %-35s %8.2f %8.2f" % (_size(size), name, p50, p99))
                del pool
                gc.collect()
                gpumemd.torch.empty_cache()
            print()
            print("first-time segment                              p50 us   p99 us")
            for size in (2 * MiB, 64 * MiB, GiB):
                rows = [("gpumemd, daemon-cached block", first_segment_gpumemd(gm, admin, size, args.rounds, False)),
                        ("gpumemd, new segment (after Trim)", first_segment_gpumemd(gm, admin, size, args.rounds, True)),
                        ("torch default after empty_cache", first_segment_default(size, args.rounds)),
                        ("cuMemAlloc (driver, bare)", first_segment_driver(size, args.rounds))]
                for name, (p50, p99) in rows:
                    print("  %-8s %-35s %8.1f %8.1f" % (_size(size), name, p50, p99))
            stats = gpumemd.torch.allocator(gm, 0)[0].stats()
            print()
            print("gpumemd pool allocator: %d leases, %d released, %d refused" % (
                stats.allocations, stats.frees, stats.failures))
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
            shutil.rmtree(directory, ignore_errors=True)


def _size(size):
    return "%d GiB" % (size // GiB) if size >= GiB else "%d MiB" % (size // MiB) if size >= MiB else "%d KiB" % (size // KiB)


if __name__ == "__main__":
    main()
