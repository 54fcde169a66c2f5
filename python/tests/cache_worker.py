"""A worker process for the client cache tier's pressure tests. Usage:

    cache_worker.py cache TARGET DEVICE SIZE   lease SIZE bytes, close it into the cache, print
                                               "cached BYTES"; then on each "stats" line of stdin
                                               print "CACHED_BYTES RELEASES ALLOWANCE"; exit at end
                                               of input
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpumemd  # noqa: E402


def main(mode, target, device, size):
    assert mode == "cache"
    with gpumemd.connect(target, client_name="pytest-cache-worker") as gm:
        gm.lease(int(device), int(size)).close()
        print("cached", gm.stats().cached_bytes, flush=True)
        for line in sys.stdin:
            if line.strip() == "stats":
                stats = gm.stats()
                print(stats.cached_bytes, stats.releases, stats.cache_allowance, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
