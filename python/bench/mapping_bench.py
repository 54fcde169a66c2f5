#!/usr/bin/env python3
"""The cost of mapping a host segment in a reserved address range (issue 35 item 1) against the
plain mapping it replaced, measured in one run.

    python3 bench/mapping_bench.py [--rounds 7] [--maps 200] [--sizes 2,64,1024]

A segment's mapping is made on the first lease on a new segment (later leases on it reuse it),
so this is what the reservation adds to that path. Per size (MiB) a file of that size in
/dev/shm is mapped and unmapped --maps times per round, each way, the two ways alternating
(and which goes first) round by round so that drift of the machine hits both alike:

  plain      open, fstat, mmap.mmap(MAP_SHARED), a memoryview of 4 KiB, close (the old HostMapping)
  reserved   gpumemd._mapping.HostMapping: open, fstat, mmap PROT_NONE reservation, mmap
             MAP_FIXED|MAP_SHARED over it, the ctypes array and its finalizer, a view of 4 KiB,
             try_close (munmap)

Pages are not touched (the first touch of each page costs the same both ways: the same shared
file pages). Prints the median microseconds of one map+unmap (over every round's), per way and
size, and the ratio.
"""
import argparse
import mmap
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gpumemd._mapping import HostMapping  # noqa: E402

MIB = 1 << 20


def plain(path, size):
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.fstat(fd)
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    view = memoryview(mapped)[0:4096]
    view.release()
    mapped.close()


def reserved(path, size):
    mapping = HostMapping(0, path, size)
    view = mapping.view(0, 4096)
    del view
    assert mapping.try_close()


def timed(way, path, size, maps):
    """Each map+unmap's microseconds: the median of single operations is what a preempted one
    (on a loaded machine) does not move."""
    took = []
    for _ in range(maps):
        start = time.perf_counter_ns()
        way(path, size)
        took.append((time.perf_counter_ns() - start) / 1000)
    return took


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--maps", type=int, default=200)
    parser.add_argument("--sizes", default="2,64,1024")
    args = parser.parse_args()
    print("%8s %12s %12s %7s" % ("MiB", "plain us", "reserved us", "ratio"))
    for mib in (int(s) for s in args.sizes.split(",")):
        path = "/dev/shm/gpumemd-mapping-bench-%d" % os.getpid()
        with open(path, "wb") as f:
            f.truncate(mib * MIB)
        try:
            ways = {"plain": plain, "reserved": reserved}
            times = {name: [] for name in ways}
            for name, way in ways.items():
                timed(way, path, mib * MIB, 20)  # warm-up
            for r in range(args.rounds):
                order = list(ways) if r % 2 == 0 else list(reversed(ways))
                for name in order:
                    times[name] += timed(ways[name], path, mib * MIB, args.maps)
            p, v = statistics.median(times["plain"]), statistics.median(times["reserved"])
            print("%8d %12.1f %12.1f %7.2f" % (mib, p, v, v / p))
        finally:
            os.unlink(path)


if __name__ == "__main__":
    main()
