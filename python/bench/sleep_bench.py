#!/usr/bin/env python3
"""A Python client's sleep and wake against plain memory copies, measured in one run.

    python3 bench/sleep_bench.py [--jar server/target/gpumemd.jar] [--mib 1024] [--rounds 5]

Starts a daemon on the host backend (a device twice --mib, --offload-max-bytes the same) and
alternates, per round: one lease of --mib MiB (its pages touched) put to sleep at level 1 and
woken (the contents go to the daemon's host memory and come back, the lease at its old address,
its bytes checked); and the physical limit on this machine, numpy copies of as many bytes from
the lease to a buffer and back. Prints the p50 of each over the rounds and their ratio (issue
35's target: within 1.5x of the copies).
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy  # noqa: E402

import gpumemd  # noqa: E402
from cache_bench import start_daemon  # noqa: E402

MIB = 1 << 20


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jar", default=os.path.join(os.path.dirname(os.path.dirname(HERE)), "server", "target",
                                                      "gpumemd.jar"))
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="gpumemd-sleep-bench-")
    process, target = start_daemon(args.jar, directory, ("--host-device-bytes", "%dMiB" % (2 * args.mib),
                                                         "--offload-max-bytes", "%dMiB" % (2 * args.mib)))
    size = args.mib * MIB
    try:
        with gpumemd.connect(target, client_name="sleep-bench", client_cache_bytes=0) as gm:
            lease = gm.lease(0, size)
            array = numpy.asarray(lease)
            array[:] = numpy.arange(size, dtype=numpy.uint64).astype(numpy.uint8)
            expected = array[::4096].copy()
            address = array.__array_interface__["data"][0]
            other = numpy.empty(size, dtype=numpy.uint8)
            other[:] = 1  # its pages touched, as the daemon's host store's are when it parks
            sleeps, wakes, copies = [], [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                gm.sleep(1)
                t1 = time.perf_counter()
                gm.wake()
                t2 = time.perf_counter()
                sleeps.append(t1 - t0)
                wakes.append(t2 - t1)
                assert array.__array_interface__["data"][0] == address and numpy.array_equal(array[::4096], expected)
                t0 = time.perf_counter()
                numpy.copyto(other, array)
                numpy.copyto(array, other)
                copies.append(time.perf_counter() - t0)
            del array
            lease.close()
    finally:
        process.terminate()
        process.wait()
        shutil.rmtree(directory, ignore_errors=True)
    p50 = statistics.median
    both = [s + w for s, w in zip(sleeps, wakes)]
    print("%d MiB, %d rounds, p50: sleep %.0f ms + wake %.0f ms = %.0f ms; memcpy both ways %.0f ms; ratio %.2fx"
          % (args.mib, args.rounds, p50(sleeps) * 1e3, p50(wakes) * 1e3, p50(both) * 1e3, p50(copies) * 1e3,
             p50(both) / p50(copies)))


if __name__ == "__main__":
    main()
