"""The counter attack of issue 22, for .ci/deploy-checks.sh: run it before the scrape that promtool checks.

    python3 .ci/counter_overflow.py 127.0.0.1:PORT

Opens two sessions with raw gRPC stubs (not the client library) and reports client cache
counters of 2^63-1 (hits and returns, devices 0 and 1) on each one's KeepAlive stream. A stream
lease sent in the next message is answered only after the daemon took the report (it reads a
stream's messages in order). Then GetStats must show no negative figure, and the sessions are
closed. Exits 1, saying why, when the daemon does not hold; it used to show -2 and break /metrics.
"""
import os
import queue
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))

import grpc  # noqa: E402

from gpumemd._stubs import pb, pb_grpc  # noqa: E402

MAX = 2**63 - 1


def attack(channel, allocator, name):
    """One session reporting MAX on its stream; returns its id once the daemon took the report."""
    session_id = allocator.OpenSession(pb.OpenSessionRequest(client_name=name), timeout=10).session_id
    outgoing = queue.Queue()
    report = pb.KeepAliveRequest(session_id=session_id)
    for device in (0, 1):
        report.client_counters.add(device=device, hits=MAX, returns=MAX)
    outgoing.put(report)
    outgoing.put(pb.KeepAliveRequest(leases=[pb.StreamLease(request_id=1, device=0, size_bytes=4096)]))
    call = allocator.KeepAlive(iter(outgoing.get, None), timeout=20)
    for event in call:
        if event.HasField("lease_reply"):
            break
    outgoing.put(None)
    call.cancel()
    return session_id


def main(target):
    with grpc.insecure_channel(target) as channel:
        allocator = pb_grpc.AllocatorStub(channel)
        sessions = [attack(channel, allocator, "counters-%d" % i) for i in range(2)]
        stats = pb_grpc.AdminStub(channel).GetStats(pb.GetStatsRequest(), timeout=10)
        for session_id in sessions:
            allocator.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=10)
    negative = [(d.device, f.name, v) for d in stats.devices for f, v in d.ListFields()
                if isinstance(v, int) and v < 0]
    if negative:
        print("GetStats shows negative figures after the counter attack: %s" % negative)
        return 1
    print("counter attack: 2 sessions reported 2^63-1; GetStats client_cache_hits %s, no negative figure"
          % [d.client_cache_hits for d in stats.devices])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
