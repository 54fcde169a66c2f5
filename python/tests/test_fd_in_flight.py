"""Descriptors in flight on the fd channel are charged to the daemon's user: Linux counts every
descriptor sent over a Unix socket and not yet received against the sender's RLIMIT_NOFILE
(ETOOMANYREFS past it, for every send, unless it has CAP_SYS_RESOURCE). A peer that asks for
many descriptors, shuts its end down for writing and never reads keeps them in flight; the daemon
used to close such a connection at once, giving its place back, so that a loop of them filled the
daemon's share and no tenant could be sent a descriptor. Now such a connection stays open, and
counted under --fd-max-connections-per-tenant, until the peer reads or closes.

The daemon runs as it does in the shipped manifests: not root, no capabilities (uid 65534, under
prlimit with a small RLIMIT_NOFILE). The attacker is this process (root, a tenant of its own);
the victim another uid, in a process of its own."""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

import grpc
import pytest

from conftest import PYTHON_DIR, Daemon
from gpumemd._stubs import pb, pb_grpc

NOFILE = 2048  # the daemon's RLIMIT_NOFILE, soft and hard: what it may have in flight
PER_TENANT = 4  # --fd-max-connections-per-tenant
ATTACKS = 24  # connections of the attacker, each leaving a socket buffer of descriptors unread
REQUESTS = 400  # fetches each connection asks for (a socket buffer holds a few hundred replies)

VICTIM = """import sys
sys.path.insert(0, sys.argv[1])
import gpumemd
with gpumemd.connect(sys.argv[2], client_name="victim") as gm:
    with gm.lease(0, 4096) as lease:
        lease.buffer()[:2] = b"ok"
        print(bytes(lease.buffer()[:2]).decode())
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("prlimit"),
                                reason="a daemon of another uid with its own RLIMIT_NOFILE needs root, setpriv and prlimit")


def start_unprivileged(nofile):
    directory = tempfile.mkdtemp(prefix="gpumemd-inflight-", dir="/tmp")
    os.chmod(directory, 0o777)  # the daemon's uid writes its sockets here
    d = Daemon(directory, "--backend", "host", "--host-devices", "1", "--host-device-bytes", "64MiB",
               "--socket-mode", "0666", "--fd-max-connections-per-tenant", str(PER_TENANT),
               "--fd-stall-timeout-ms", "500",
               prefix=("prlimit", "--nofile=%d:%d" % (nofile, nofile), "setpriv", "--reuid", "65534", "--regid",
                       "65534", "--clear-groups"))
    return d, directory


def unprivileged(nofile):
    d, directory = start_unprivileged(nofile)
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def unprivileged_daemon():
    yield from unprivileged(NOFILE)


@pytest.fixture
def starved_daemon():
    """One whose RLIMIT_NOFILE is below what its connection bound lets peers leave in flight."""
    yield from unprivileged(512)


def attack(fd_socket, session_id, segment_id):
    """Asks for REQUESTS descriptors, shuts its end for writing, and keeps the socket unread.
    Returns the socket and whether the daemon served it (a refused connection reads end of file)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(fd_socket)
    s.settimeout(2)
    frames = b""
    for i in range(REQUESTS):
        request = pb.FdRequest(request_id=i + 1, session_id=session_id, segment_id=segment_id,
                               read_only=True).SerializeToString()
        frames += struct.pack(">I", len(request)) + request
    try:
        s.sendall(frames)
    except (socket.timeout, BrokenPipeError, ConnectionResetError):
        pass  # the daemon stopped reading (its replies queue unread), or closed a refused connection
    try:
        served = len(s.recv(4, socket.MSG_PEEK)) > 0
    except (socket.timeout, ConnectionResetError):
        served = False
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    return s, served


def attacker_lease(daemon):
    """This process's session and a lease in it, over a raw gRPC channel (the caller closes it)."""
    channel = grpc.insecure_channel(daemon.target)
    allocator = pb_grpc.AllocatorStub(channel)
    session = allocator.OpenSession(pb.OpenSessionRequest(client_name="attacker", client_cache_bytes=0))
    lease = allocator.Lease(pb.LeaseRequest(session_id=session.session_id, device=0, size_bytes=4096))
    return channel, session, lease


def run_victim(daemon):
    victim = subprocess.run(["setpriv", "--reuid", "12345", "--regid", "12345", "--clear-groups", sys.executable, "-c",
                             VICTIM, PYTHON_DIR, daemon.target], capture_output=True, text=True, timeout=60)
    return victim.returncode == 0 and victim.stdout.startswith("ok"), victim.stderr[-2000:]


def test_a_peer_that_leaves_descriptors_unread_keeps_its_connection_counted_and_other_tenants_are_served(
        unprivileged_daemon):
    d = unprivileged_daemon
    channel, session, lease = attacker_lease(d)
    held = []
    try:
        served = 0
        for _ in range(ATTACKS):
            s, ok = attack(d.socket + ".fd", session.session_id, lease.handle.segment_id)
            held.append(s)
            served += ok
            time.sleep(0.05)
        # Another tenant is sent its descriptor.
        ok, stderr = run_victim(d)
        assert ok, "the victim was not served (%d attacking connections served):\n%s\n%s" % (
            served, stderr, d._log_bytes().decode()[-3000:])
        # Its connections past its bound were refused as they came: the first PER_TENANT stay
        # open while their replies wait unread.
        assert served == PER_TENANT, "served %d of %d attacking connections:\n%s" % (
            served, ATTACKS, d._log_bytes().decode()[-3000:])
    finally:
        for s in held:
            s.close()
    # The attacker closed its sockets: its connections end, and its places come back.
    deadline = time.monotonic() + 10
    while True:
        s, ok = attack(d.socket + ".fd", session.session_id, lease.handle.segment_id)
        s.close()
        if ok:
            break
        assert time.monotonic() < deadline, "the attacker's places never came back"
        time.sleep(0.2)
    channel.close()


def test_a_daemon_whose_limit_is_below_its_connection_bounds_says_what_to_raise(starved_daemon):
    """Where RLIMIT_NOFILE is set below what the connection bounds let peers hold in flight, the
    kernel fails the daemon's sends (ETOOMANYREFS): one WARN line a minute names the limit."""
    d = starved_daemon
    channel, session, lease = attacker_lease(d)
    held = []
    try:
        for _ in range(PER_TENANT):
            held.append(attack(d.socket + ".fd", session.session_id, lease.handle.segment_id)[0])
        deadline = time.monotonic() + 10
        while b"descriptor send(s) since the last such line" not in d._log_bytes():
            assert time.monotonic() < deadline, "no WARN for the failed sends:\n" + d._log_bytes().decode()[-3000:]
            time.sleep(0.1)
        line = [l for l in d._log_bytes().decode().splitlines() if "descriptor send(s)" in l][0]
        assert "WARN" in line and "Too many references" in line and "RLIMIT_NOFILE" in line, line
    finally:
        for s in held:
            s.close()
        channel.close()
