#!/usr/bin/env python3
"""How long a Python worker waits while its daemon is taken over (gpumemd --take-over), with and
without the connection to the successor made before the pause (gpumemd._successor), in one run.

    python3 bench/takeover_bench.py [--jar server/target/gpumemd.jar] [--take-overs 10] [--live-leases 64]

Starts a daemon on the host backend. A sync client without a cache tier (each lease a round trip
on the KeepAlive stream) holds --live-leases leases of 64 KiB and leases and closes 64 KiB blocks
in a loop on one thread, while the daemon is taken over --take-overs times in a row, each successor
a JVM of its own. Take-overs alternate between the client as shipped ("spare") and the same client
told to ignore the successor's socket name ("no spare": it reattaches over its own channel, as
clients before the notice did), so that drift of the machine hits both alike. Per take-over it
records the longest single lease call from the successor's launch until it is ready, and prints
each, then per side the p50 and max, and the leases made meanwhile (none may fail).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import gpumemd  # noqa: E402

KIB = 1 << 10


def start(jar, directory, index, take_over):
    socket = os.path.join(directory, "gpumemd.sock")
    log_path = os.path.join(directory, "gpumemd-%d.log" % index)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            ["java", "-jar", jar, "--socket", socket, "--shm-dir", os.path.join(directory, "shm"),
             "--metrics-port", "0", "--backend", "host", "--host-devices", "1", "--host-device-bytes", "512MiB",
             "--device-limit-fraction", "1", "--keepalive-grace-ms", "5000"] + (["--take-over"] if take_over else []),
            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while b"gpumemd ready" not in open(log_path, "rb").read():
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("gpumemd did not start:\n%s" % open(log_path).read())
        time.sleep(0.02)
    return process, "unix://" + socket


class Worker:
    """Leases and closes in a thread; records the longest call within the window being measured."""

    def __init__(self, client):
        self.client = client
        self.leases = 0
        self.failures = []
        self.longest = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                self.client.lease(0, 64 * KIB).close()
                self.leases += 1
            except Exception as e:  # noqa: BLE001 -- every failure is a finding here
                self.failures.append(repr(e))
            self.longest = max(self.longest, time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jar", default=os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                                      "server", "target", "gpumemd.jar"))
    parser.add_argument("--take-overs", type=int, default=10)
    parser.add_argument("--live-leases", type=int, default=64)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="gpumemd-takeover-bench-")
    try:
        process, target = start(args.jar, directory, 0, False)
        client = gpumemd.connect(target, client_name="takeover-bench", client_cache_bytes=0)
        held = [client.lease(0, 64 * KIB) for _ in range(args.live_leases)]
        worker = Worker(client)
        directory_of_target = client._successors._directory
        waits = {"spare": [], "no spare": []}
        for n in range(1, args.take_overs + 1):
            side = "spare" if n % 2 == 0 else "no spare"
            client._successors._directory = directory_of_target if side == "spare" else None
            time.sleep(0.5)
            worker.longest = 0.0
            successor, _ = start(args.jar, directory, n, True)
            process.wait(30)
            time.sleep(0.5)
            waits[side].append(worker.longest)
            print("take-over %2d (%-8s): longest lease wait %8.1f ms" % (n, side, worker.longest * 1e3), flush=True)
            process = successor
        worker.stop.set()
        worker.thread.join(5)
        for lease in held:
            lease.close()
        client.close()
        for side, values in waits.items():
            if values:
                print("%-8s: longest lease wait p50 %.1f ms, max %.1f ms over %d take-overs"
                      % (side, statistics.median(values) * 1e3, max(values) * 1e3, len(values)))
        print("%d leases, %d failed%s" % (worker.leases, len(worker.failures),
                                         "" if not worker.failures else ": %s" % worker.failures[:3]))
        process.terminate()
        process.wait(30)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
