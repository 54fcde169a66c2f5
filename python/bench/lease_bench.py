#!/usr/bin/env python3
"""Python lease+release p50 over the health-check p50, measured in the same run.

    python3 bench/lease_bench.py [TARGET] [--size BYTES] [--iterations N] [--device N]

The health check (grpc.health.v1.Health/Check, a unary call that does nothing) is the floor of
a Python gRPC round trip on this machine; a lease+release pair should stay within 2x of it.
Rounds alternate between the modes, so that drift of the machine hits all of them alike.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpumemd  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", nargs="?", default="unix:///tmp/gpumemd.sock")
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=5000, help="per mode, in 5 rounds")
    parser.add_argument("--warmup", type=int, default=2000)
    args = parser.parse_args()

    stream = gpumemd.connect(args.target, client_name="bench-stream")
    unary = gpumemd.connect(args.target, client_name="bench-unary", stream=False)
    health = stream.channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
    modes = {
        "health check": lambda: health(b""),  # an empty HealthCheckRequest: the server's status
        "lease+release (stream)": lambda: stream.lease(args.device, args.size).close(),
        "lease+release (unary)": lambda: unary.lease(args.device, args.size).close(),
    }
    samples = {name: [] for name in modes}
    for name, call in modes.items():
        for _ in range(args.warmup):
            call()  # the daemon's JIT, the segment's mapping
    rounds = 5
    for _ in range(rounds):
        for name, call in modes.items():
            times = samples[name]
            for _ in range(args.iterations // rounds):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
    stream.close()
    unary.close()

    floor = statistics.median(samples["health check"])
    print("%-24s %10s %10s %8s" % ("", "p50 us", "p99 us", "x health"))
    for name, times in samples.items():
        times.sort()
        p50 = statistics.median(times)
        p99 = times[int(len(times) * 0.99)]
        print("%-24s %10.1f %10.1f %8.2f" % (name, p50 * 1e6, p99 * 1e6, p50 / floor))


if __name__ == "__main__":
    main()
