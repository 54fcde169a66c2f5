#!/usr/bin/env python3
"""Host segments by path vs by file descriptor (--host-segments path|fd), measured in one run.

    python3 bench/fd_bench.py [--jar server/target/gpumemd.jar] [--rounds 5] [--segments 20]

Starts two daemons on the host backend, one per mode, and alternates rounds between them (and
which goes first in a round) so that drift of the machine hits both alike. By descriptor, two
kinds of client: fd-fetch asks for each segment (GPUMEMD_FD_PUSH=0, as clients before pushed
descriptors did), fd has its new segments pushed before their Lease replies. Per round and mode:

  first lease, miss      a new session leases --segments blocks of 2 MiB: each is a new segment
                         (the daemon allocates and backs it) that this process maps first
  first lease, hit       a second new session leases as many: each a cached segment of the
                         first session, new to this session (by path: open + mmap; by
                         descriptor: a round trip on the fd channel + mmap)
  lease+release p50      a pool hit on a segment already mapped (1 MiB, stream), the common case

The first-lease figures are per lease call (the caller's view); pages are not touched.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import gpumemd  # noqa: E402
from gpumemd._stubs import pb, pb_grpc  # noqa: E402

MIB = 1 << 20
PUSHED = {"0": 0, "1": 0}  # first leases that came pushed, by GPUMEMD_FD_PUSH


def start(jar, directory, mode):
    socket = os.path.join(directory, "gpumemd.sock")
    log = open(os.path.join(directory, "gpumemd.log"), "wb")
    process = subprocess.Popen(
        ["java", "-jar", jar, "--socket", socket, "--shm-dir", os.path.join(directory, "shm"), "--metrics-port", "0",
         "--backend", "host", "--host-devices", "1", "--host-device-bytes", "512MiB", "--device-limit-fraction", "1",
         "--host-segments", mode], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while b"gpumemd ready" not in open(log.name, "rb").read():
        if process.poll() is not None or time.monotonic() > deadline:
            sys.exit("gpumemd (%s) did not start:\n%s" % (mode, open(log.name).read()))
        time.sleep(0.05)
    return process, "unix://" + socket


def first_leases(target, segments):
    """Per-lease seconds: (misses of a first session, hits of a second one on its segments)."""
    misses, hits = [], []
    with gpumemd.connect(target, client_name="bench-first") as first:
        held = []
        for _ in range(segments):
            started = time.perf_counter()
            held.append(first.lease(0, 2 * MIB))
            misses.append(time.perf_counter() - started)
    with gpumemd.connect(target, client_name="bench-second") as second:
        held = []
        for _ in range(segments):
            started = time.perf_counter()
            held.append(second.lease(0, 2 * MIB))
            hits.append(time.perf_counter() - started)
        assert all(lease.pool_hit for lease in held), "the second session should hit the first one's segments"
        assert second.stats().maps_opened == segments
        PUSHED[os.environ.get("GPUMEMD_FD_PUSH", "1")] += first._fd_channels.pushed + second._fd_channels.pushed
        for lease in held:
            lease.close()
        pb_grpc.AdminStub(second.channel).Trim(pb.TrimRequest(device=0, keep_bytes=0))
    return misses, hits


def lease_pairs(client, iterations):
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        client.lease(0, MIB).close()
        times.append(time.perf_counter() - started)
    return times


def p(times, q):
    times = sorted(times)
    return times[min(len(times) - 1, int(len(times) * q))] * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jar", default=os.path.join(HERE, os.pardir, os.pardir, "server", "target", "gpumemd.jar"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--segments", type=int, default=20, help="first leases per round and mode")
    parser.add_argument("--pairs", type=int, default=2000, help="lease+release pairs per round and mode")
    args = parser.parse_args()

    directories = {mode: tempfile.mkdtemp(prefix="gpumemd-bench-%s-" % mode, dir="/tmp") for mode in ("path", "fd")}
    daemons = {mode: start(args.jar, directories[mode], mode) for mode in directories}
    daemons["fd-fetch"] = daemons["fd"]  # the same daemon, clients that never bind

    def pushes(mode):  # read by each client's fd channel when it first connects
        os.environ["GPUMEMD_FD_PUSH"] = "0" if mode == "fd-fetch" else "1"

    samples = {mode: {"miss": [], "hit": [], "pair": []} for mode in daemons}
    try:
        clients = {}
        for mode, (_, target) in daemons.items():
            pushes(mode)
            clients[mode] = gpumemd.connect(target, client_name="bench-pairs")
            lease_pairs(clients[mode], args.pairs)  # the daemon's JIT, the segment's mapping
            first_leases(daemons[mode][1], args.segments)
        for round_ in range(args.rounds):
            # which mode goes first alternates too: the second of a round ran measurably slower
            order = list(daemons) if round_ % 2 == 0 else list(reversed(daemons))
            for mode in order:
                pushes(mode)
                target = daemons[mode][1]
                misses, hits = first_leases(target, args.segments)
                samples[mode]["miss"] += misses
                samples[mode]["hit"] += hits
                samples[mode]["pair"] += lease_pairs(clients[mode], args.pairs)
        for client in clients.values():
            client.close()
    finally:
        for mode in ("path", "fd"):
            process = daemons[mode][0]
            process.terminate()
            process.wait(20)
        for directory in directories.values():
            shutil.rmtree(directory, ignore_errors=True)

    print("%-34s %10s %10s %10s %8s %8s %10s %10s" % ("us", "path p50", "fetch p50", "fd p50", "fetch/p", "fd/p",
                                                      "path p99", "fd p99"))
    for key, what in (("miss", "first lease, miss (new segment)"), ("hit", "first lease, hit (segment new here)"),
                      ("pair", "lease+release, mapped segment")):
        path, fetch, fd = (p(samples[mode][key], 0.5) for mode in ("path", "fd-fetch", "fd"))
        print("%-34s %10.1f %10.1f %10.1f %8.2f %8.2f %10.1f %10.1f" % (
            what, path, fetch, fd, fetch / path, fd / path, p(samples["path"][key], 0.99), p(samples["fd"][key], 0.99)))
    print("(fd-fetch: by descriptor, each asked for; fd: pushed before the Lease reply. First leases that came "
          "pushed, warm-up included: fd %d of at most %d, fd-fetch %d)"
          % (PUSHED["1"], 2 * (args.rounds + 1) * (args.segments - 1), PUSHED["0"]))
    print("(%d rounds; %d first leases and %d pairs per mode)" % (args.rounds, len(samples["fd"]["miss"]),
                                                                    len(samples["fd"]["pair"])))


if __name__ == "__main__":
    main()
