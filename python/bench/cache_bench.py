#!/usr/bin/env python3
"""The Python client cache tier against its targets, in one run, the daemon a separate process.

    python3 bench/cache_bench.py [TARGET] [--jar server/target/gpumemd.jar] [--profile]

Without TARGET it starts the daemon jar itself (host backend, Unix socket, a temporary
directory) and stops it at the end. It measures:

1. local lease+close (a client cache hit, no round trip) p50 and p99 at 4 KiB, 2 MiB, 64 MiB;
   target p50 <= 3 us, p99 <= 20 us;
2. a daemon-served lease+close on the KeepAlive stream (no tier) against a health-check round
   trip on the same channel; target <= 1.2x;
3. 8 processes leasing and closing at once (local hits): aggregate leases/s;
4. with --profile, where the time of a local lease+close goes (cProfile, top functions).
"""
import argparse
import cProfile
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gpumemd  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KiB, MiB = 1 << 10, 1 << 20


def start_daemon(jar, directory, options=("--host-device-bytes", "2GiB", "--client-cache-bytes", "256MiB")):
    """The daemon on the host backend, one device, with ``options`` (bench/sleep_bench.py's too)."""
    socket = os.path.join(directory, "gpumemd.sock")
    log = open(os.path.join(directory, "gpumemd.log"), "wb")
    process = subprocess.Popen(
        ["java", "-jar", jar, "--socket", socket, "--shm-dir", os.path.join(directory, "shm"),
         "--metrics-port", "0", "--backend", "host", "--host-devices", "1"] + list(options),
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(log.name, "rb") as f:
            if b"gpumemd ready" in f.read():
                return process, "unix://" + socket
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    sys.exit("gpumemd did not start; see %s" % log.name)


def percentiles(times):
    times = sorted(times)
    return statistics.median(times), times[int(len(times) * 0.99)]


def timed(call, n):
    clock = time.perf_counter
    out = []
    for _ in range(n):
        start = clock()
        call()
        out.append(clock() - start)
    return out


def local(target, iterations):
    rows = []
    with gpumemd.connect(target, client_name="bench-local") as gm:
        for size in (4 * KiB, 2 * MiB, 64 * MiB):
            gm.lease(0, size).close()  # the miss that fills the tier
            timed(lambda: gm.lease(0, size).close(), 1000)  # warm-up
            before = gm.stats().local_hits
            times = timed(lambda: gm.lease(0, size).close(), iterations)
            assert gm.stats().local_hits - before == iterations, "not all served locally: %s" % (gm.stats(),)
            rows.append((size, *percentiles(times)))
    return rows


def daemon_served(target, iterations):
    with gpumemd.connect(target, client_name="bench-stream", client_cache_bytes=0) as gm:
        health = gm.channel.unary_unary("/grpc.health.v1.Health/Check",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
        modes = {"health check": lambda: health(b""), "lease+close (stream)": lambda: gm.lease(0, 4 * KiB).close()}
        samples = {name: [] for name in modes}
        for call in modes.values():
            timed(call, 1000)
        for _ in range(5):  # alternating rounds: drift of the machine hits both alike
            for name, call in modes.items():
                samples[name] += timed(call, iterations // 5)
        return {name: percentiles(times) for name, times in samples.items()}


def daemon_served_aio(target, iterations):
    """As daemon_served, with gpumemd.aio: one event loop, no hand-off between threads."""
    import asyncio

    import gpumemd.aio

    async def run():
        async with await gpumemd.aio.connect(target, client_name="bench-aio", client_cache_bytes=0) as gm:
            health = gm.channel.unary_unary("/grpc.health.v1.Health/Check",
                                            request_serializer=lambda b: b, response_deserializer=lambda b: b)

            async def lease():
                (await gm.lease(0, 4 * KiB)).close()

            modes = {"health check (aio)": lambda: health(b""), "lease+close (aio stream)": lease}
            samples = {name: [] for name in modes}
            clock = time.perf_counter
            for _ in range(1000):
                for call in modes.values():
                    await call()
            for _ in range(5):
                for name, call in modes.items():
                    for _ in range(iterations // 5):
                        start = clock()
                        await call()
                        samples[name].append(clock() - start)
            return {name: percentiles(times) for name, times in samples.items()}

    return asyncio.run(run())


def threads(target, count, iterations):
    """``count`` threads of one process leasing and closing locally at once: leases/s in all."""
    import threading

    with gpumemd.connect(target, client_name="bench-threads") as gm:
        for _ in range(count):
            gm.lease(0, 4 * KiB)  # one cached block per thread, so each thread hits
        for lease in [gm.lease(0, 4 * KiB) for _ in range(count)]:
            lease.close()

        def run():
            for _ in range(iterations):
                gm.lease(0, 4 * KiB).close()

        workers = [threading.Thread(target=run) for _ in range(count)]
        start = time.perf_counter()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        return count * iterations / (time.perf_counter() - start)


def child(target, iterations):
    """One of the processes of the aggregate run: local lease+close of 4 KiB, timed as a whole."""
    with gpumemd.connect(target, client_name="bench-proc-%d" % os.getpid()) as gm:
        gm.lease(0, 4 * KiB).close()
        for _ in range(1000):
            gm.lease(0, 4 * KiB).close()
        start = time.perf_counter()
        for _ in range(iterations):
            gm.lease(0, 4 * KiB).close()
        print(time.perf_counter() - start, gm.stats().local_hits, flush=True)


def aggregate(target, processes, iterations):
    started = time.perf_counter()
    children = [subprocess.Popen([sys.executable, os.path.abspath(__file__), target, "--child",
                                  "--iterations", str(iterations)], stdout=subprocess.PIPE, text=True)
                for _ in range(processes)]
    outputs = [c.communicate(timeout=600)[0].split() for c in children]
    wall = time.perf_counter() - started
    busiest = max(float(o[0]) for o in outputs)
    return processes * iterations / busiest, wall


def profile(target, iterations):
    with gpumemd.connect(target, client_name="bench-profile") as gm:
        gm.lease(0, 4 * KiB).close()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(iterations):
            gm.lease(0, 4 * KiB).close()
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", nargs="?")
    parser.add_argument("--jar", default=os.path.join(REPO, "server", "target", "gpumemd.jar"))
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.target, args.iterations)

    directory = process = None
    target = args.target
    if target is None:
        directory = tempfile.mkdtemp(prefix="gpumemd-bench-")
        process, target = start_daemon(args.jar, directory)
    try:
        print("local lease+close (client cache hit), %d each    p50 us   p99 us   target 3 / 20" % args.iterations)
        for size, p50, p99 in local(target, args.iterations):
            print("  %-8s %41.2f %8.2f   %s" % ("%d KiB" % (size // KiB) if size < MiB else "%d MiB" % (size // MiB),
                                                p50 * 1e6, p99 * 1e6, "met" if p50 <= 3e-6 and p99 <= 20e-6 else "MISSED"))
        served = daemon_served(target, args.iterations // 4)
        floor = served["health check"][0]
        print("daemon-served, same channel, %d each                 p50 us   p99 us   x health (target 1.2)"
              % (args.iterations // 4))
        for name, (p50, p99) in served.items():
            print("  %-24s %25.1f %8.1f   %.2f" % (name, p50 * 1e6, p99 * 1e6, p50 / floor))
        served = daemon_served_aio(target, args.iterations // 4)
        floor = served["health check (aio)"][0]
        for name, (p50, p99) in served.items():
            print("  %-24s %25.1f %8.1f   %.2f" % (name, p50 * 1e6, p99 * 1e6, p50 / floor))
        one, eight = threads(target, 1, args.iterations * 2), threads(target, 8, args.iterations // 4)
        print("threads of one process, local 4 KiB: 1 thread %.0f leases/s, 8 threads %.0f leases/s in all"
              % (one, eight))
        rate, wall = aggregate(target, args.processes, args.iterations * 5)
        print("%d processes, local lease+close of 4 KiB: %.0f leases/s in all (%.1f s wall, %d CPUs)"
              % (args.processes, rate, wall, os.cpu_count()))
        if args.profile:
            profile(target, args.iterations)
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
