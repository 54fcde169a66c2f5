"""Host segments passed as file descriptors (``--host-segments fd``, issue 24) against real
daemons and real processes: leases mapped from descriptors the fd channel hands out (nothing on a
path), bytes shared between processes, another uid refused with a reason, killed clients and a
killed daemon, read-only holds enforced by the descriptor, the asyncio client, a daemon restart,
and no descriptor leak over 10,000 leases with trims between."""
import asyncio
import fcntl
import gc
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc
import numpy
import pytest

import gpumemd
import gpumemd.aio
from conftest import HERE, PYTHON_DIR, Daemon, run_worker
from gpumemd import _fdchannel
from gpumemd._stubs import pb
from worker import pattern

SIZE = (3 << 20) + 512  # a large request: a 4 MiB segment of its own
FD_FLAGS = ("--host-segments", "fd")


@pytest.fixture(scope="module")
def fd_daemon():
    """A daemon with fd segments in a directory other users may reach (the other-uid test)."""
    directory = tempfile.mkdtemp(prefix="gpumemd-fd-", dir="/tmp")
    os.chmod(directory, 0o711)
    d = Daemon(directory, *FD_FLAGS, "--socket-mode", "0666")
    yield d
    d.stop()
    shutil.rmtree(directory, ignore_errors=True)


def trim(daemon, device=0, client=None):
    """Frees the device's cached segments (once ``client``'s stream releases have arrived)."""
    if client is not None:
        wait_until(lambda: not daemon.leases(session_id=client.session_id), 5, "the releases")
    daemon.admin.Trim(pb.TrimRequest(device=device, keep_bytes=0))


def shm_files(daemon):
    """Regular files under the daemon's shm dir but its lock: segment files on a path."""
    root = os.path.join(os.path.dirname(daemon.socket), "shm")
    found = []
    for directory, _, files in os.walk(root):
        found += [os.path.join(directory, f) for f in files if f != ".gpumemd.lock"]
    return found


def descriptors(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.1f s" % (what, timeout)
        time.sleep(0.02)


def deleted_mappings():
    """This process's mappings of files that have no path (segments by descriptor: the daemon's
    sealed memfds)."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if "/memfd:gpumemd-seg-" in line and line.rstrip().endswith("(deleted)")]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_leases_map_descriptors_fetched_once_per_segment_and_nothing_is_on_a_path(fd_daemon, stream):
    with gpumemd.connect(fd_daemon.target, client_name="fd-test", stream=stream) as gm:
        with gm.lease(0, 1000, zero=True) as first, gm.lease(0, 1000) as second:
            assert first.segment_id == second.segment_id
            assert bytes(first.buffer()) == bytes(1000)
            numpy.asarray(first)[:3] = (7, 8, 9)
            assert bytes(first.buffer()[:4]) == b"\x07\x08\x09\x00"
            assert gm.stats().maps_opened == 1
            assert gm._fd_channels.fetched == 1, "one descriptor per segment and process"
            assert deleted_mappings(), "the mapping is of a file that has no path"
            assert shm_files(fd_daemon) == []


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_new_segments_after_the_first_come_pushed_before_their_replies(fd_daemon, stream):
    with gpumemd.connect(fd_daemon.target, client_name="fd-push", stream=stream) as gm:
        leases = [gm.lease(0, SIZE) for _ in range(4)]
        assert len({lease.segment_id for lease in leases}) == 4, "each lease a segment of its own"
        for i, lease in enumerate(leases):
            numpy.asarray(lease)[:2] = (i, 200)
        assert gm._fd_channels.fetched == 4, "one descriptor per segment"
        assert gm._fd_channels.pushed == 3, "the first asked for (the session bound with it), the rest pushed"
        # the same bytes through descriptors asked for by another connection
        other = _fdchannel.FdChannel(gm._fd_channels._channel.path, 10)
        try:
            for i, lease in enumerate(leases):
                descriptor = other.fetch(gm.session_id, lease.segment_id, True)
                try:
                    seen = mmap.mmap(descriptor.fd, descriptor.grant.segment_bytes, prot=mmap.PROT_READ)
                finally:
                    descriptor.close()
                assert seen[lease.offset:lease.offset + 2] == bytes((i, 200))
                seen.close()
        finally:
            other.close()
        for lease in leases:
            lease.close()


def test_a_client_with_pushes_off_asks_for_every_segment(fd_daemon, monkeypatch):
    monkeypatch.setenv("GPUMEMD_FD_PUSH", "0")
    with gpumemd.connect(fd_daemon.target, client_name="fd-no-push") as gm:
        leases = [gm.lease(0, SIZE) for _ in range(3)]
        assert gm._fd_channels.fetched == 3 and gm._fd_channels.pushed == 0
        for lease in leases:
            lease.close()


def test_two_processes_share_the_bytes(fd_daemon):
    trim(fd_daemon, 1)
    written = run_worker("write", fd_daemon.target, 1, SIZE, 11)
    read = run_worker("read", fd_daemon.target, 1, SIZE, 11)  # checks the pattern, or exits 1
    assert read.split()[:2] == written.split()[:2], "the same block"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="another uid needs root and setpriv")
def test_another_uid_presenting_our_session_and_segment_gets_no_descriptor(fd_daemon, tmp_path):
    package = tempfile.mkdtemp(prefix="gpumemd-py-", dir="/tmp")  # readable by nobody
    try:
        shutil.copytree(os.path.join(PYTHON_DIR, "gpumemd"), os.path.join(package, "gpumemd"))
        shutil.copy(os.path.join(HERE, "fd_other_user.py"), package)
        for directory, dirs, files in os.walk(package):
            os.chmod(directory, 0o755)
            for f in files:
                os.chmod(os.path.join(directory, f), 0o644)
        with gpumemd.connect(fd_daemon.target, client_name="victim") as gm, gm.lease(0, 4096) as lease:
            lease.buffer()[:6] = b"secret"
            fd_socket = fd_daemon.socket + ".fd"
            result = subprocess.run(
                ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable,
                 os.path.join(package, "fd_other_user.py"), fd_daemon.target, fd_socket, gm.session_id,
                 str(lease.segment_id)],
                capture_output=True, text=True, timeout=60,
                env=dict(os.environ, GPUMEMD_PYTHON_DIR=package, HOME="/tmp"))
            assert result.returncode == 0, result.stdout + result.stderr
            seen = json.loads(result.stdout.strip().splitlines()[-1])
            assert bytes(lease.buffer()[:6]) == b"secret"
            assert not lease.asleep, "another tenant cannot put this session to sleep"
            gm.lease(0, 4096).close()  # still awake: it leases
    finally:
        shutil.rmtree(package, ignore_errors=True)
    assert seen["uid"] == 65534
    assert seen["foreign_session"] == {
        "code": "NOT_FOUND", "message": "session %s not found (never opened, closed, or expired)" % gm.session_id}
    not_found = {"code": "NOT_FOUND", "message": "session %s not found (never opened, closed, or expired)" % gm.session_id}
    assert seen["foreign_sleep"] == {"sleep": not_found, "wake": not_found}
    assert seen["own_session_foreign_segment"]["code"] == "NOT_FOUND"
    assert seen["own_session_foreign_segment"]["message"].endswith("holds no lease or hold in it")
    # its own lease maps through the descriptor it was given: the file is the daemon's, mode 0600
    assert seen["own_lease"]["bytes"] == "mine!"
    assert seen["own_lease"]["segment"] != lease.segment_id, "tenants never share a segment"
    assert seen["own_lease"]["maps_opened"] == 1
    # the file is the daemon's: a read-only descriptor cannot be reopened read-write
    assert seen["own_lease"]["reopen_read_only_descriptor"] == "refused"


def test_killed_client_holding_descriptors_is_reclaimed(fd_daemon):
    trim(fd_daemon)
    baseline = descriptors(fd_daemon.process.pid)
    worker = subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), "hold", fd_daemon.target, "0",
                               str(SIZE)], stdout=subprocess.PIPE, text=True)
    try:
        worker.stdout.readline()
        lease_id = worker.stdout.readline().strip()
        assert any(l.lease_id == lease_id for l in fd_daemon.leases())
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker.stdout.close()
    killed = time.monotonic()
    wait_until(lambda: not any(l.lease_id == lease_id for l in fd_daemon.leases()), 5, "the lease back")
    assert time.monotonic() - killed < 3
    trim(fd_daemon)
    wait_until(lambda: descriptors(fd_daemon.process.pid) <= baseline, 5, "the daemon's descriptors back")


def test_killed_daemon_leaves_no_file_and_its_clients_keep_their_bytes(start_daemon):
    d = start_daemon(*FD_FLAGS)
    gm = gpumemd.connect(d.target, client_name="survivor")
    try:
        lease = gm.lease(0, SIZE)
        numpy.asarray(lease)[:] = pattern(SIZE, 5)
        kept = numpy.asarray(lease)  # the mapping outlives the daemon
        d.kill(signal.SIGKILL)
        assert shm_files(d) == [], "no segment file left behind"
        assert numpy.array_equal(kept, pattern(SIZE, 5))
        kept[:4] = (1, 2, 3, 4)  # still ordinary memory of this process
        assert bytes(kept[:4]) == b"\x01\x02\x03\x04"
    finally:
        gm.close()


def test_read_only_hold_gets_a_read_only_descriptor(fd_daemon):
    name = "fd-test/weights-%d" % os.getpid()
    with gpumemd.connect(fd_daemon.target) as owner, gpumemd.connect(fd_daemon.target) as reader:
        with owner.lease(0, 4096) as lease:
            lease.buffer()[:3] = b"abc"
            owner.publish(lease, name, read_only=True)
            with reader.lookup(name) as hold:
                assert hold.read_only
                assert bytes(hold.buffer()[:3]) == b"abc"
                with pytest.raises(TypeError):
                    hold.buffer()[0] = 1
                # asked writable, the daemon still grants read-only: it is the session's only hold there
                channel = _fdchannel.FdChannel(fd_daemon.socket + ".fd", 10)
                descriptor = channel.fetch(reader.session_id, hold.segment_id, False)
                try:
                    assert descriptor.grant.read_only
                    assert fcntl.fcntl(descriptor.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
                    with pytest.raises(PermissionError):
                        mmap.mmap(descriptor.fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                finally:
                    descriptor.close()
                    channel.close()
            owner.unpublish(name)


def test_asyncio_client_maps_descriptors_too(fd_daemon):
    async def run():
        async with await gpumemd.aio.connect(fd_daemon.target, client_name="fd-aio") as gm:
            leases = await asyncio.gather(*[gm.lease(0, 4096) for _ in range(8)])
            for i, lease in enumerate(leases):
                lease.buffer()[0] = i
            assert [lease.buffer()[0] for lease in leases] == list(range(8))
            share = await leases[0].share()
            async with await gm.attach(share.token) as hold:
                assert hold.buffer()[0] == 0
            await share.revoke()  # else the token would hold the block for 300 s
            assert gm.stats().maps_opened == len({lease.segment_id for lease in leases})
            for lease in leases:
                await lease.aclose()

    asyncio.run(run())
    assert shm_files(fd_daemon) == []


def test_the_fd_channel_is_reconnected_after_a_daemon_restart(start_daemon):
    d = start_daemon(*FD_FLAGS)
    directory = os.path.dirname(d.socket)
    with gpumemd.connect(d.target, client_name="restart") as gm:
        with gm.lease(0, 4096) as lease:
            lease.buffer()[0] = 1
        d.kill(signal.SIGTERM)
        d = start_daemon(*FD_FLAGS, directory=directory)
        with gm.lease(0, 4096) as lease:  # a new session, a new connection to the new fd channel
            lease.buffer()[0] = 2
            assert gm.session_generation == 2


def test_no_descriptor_leak_in_the_daemon_or_the_client_over_10000_leases_with_trims(fd_daemon):
    pid = fd_daemon.process.pid
    with gpumemd.connect(fd_daemon.target, client_name="leak-check", client_cache_bytes=0) as gm:  # every close a release
        gm.lease(0, 4096).close()
        trim(fd_daemon, client=gm)
        wait_until(lambda: gm.stats().mapped_segments == 0, 5, "the client's unmap")
        gc.collect()  # descriptors of earlier tests' objects in this process go now, not midway
        daemon_before, client_before = descriptors(pid), len(os.listdir("/proc/self/fd"))
        for i in range(10_000):
            with gm.lease(0, 4096 if i % 2 else 100_000) as lease:
                lease.buffer()[0] = i & 0xFF
            if i % 100 == 99:
                trim(fd_daemon, client=gm)  # frees the segment once this client has unmapped it: a new one next
        opened = gm.stats().maps_opened
        trim(fd_daemon, client=gm)
        wait_until(lambda: gm.stats().mapped_segments == 0, 5, "the client's unmap")
        wait_until(lambda: descriptors(pid) <= daemon_before, 5, "the daemon's descriptors back")
        gc.collect()
        # a leak would be one descriptor per segment (~100); nothing of this test's may stay
        assert len(os.listdir("/proc/self/fd")) <= client_before
    assert opened >= 50, "trims made new segments: %d mappings" % opened
    assert shm_files(fd_daemon) == []


def test_a_refusal_reaches_the_caller_with_the_daemons_reason(fd_daemon):
    with gpumemd.connect(fd_daemon.target) as gm:
        channel = _fdchannel.FdChannel(fd_daemon.socket + ".fd", 10)
        try:
            with pytest.raises(gpumemd.GpumemdError) as raised:
                channel.fetch(gm.session_id, 1, False)
            assert raised.value.code == grpc.StatusCode.NOT_FOUND
            assert raised.value.message.endswith("holds no lease or hold in it")
            with pytest.raises(gpumemd.GpumemdError) as raised:
                channel.fetch("not-a-session", 1, False)
            assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "session_id" in raised.value.message
        finally:
            channel.close()


def test_frames_replies_and_the_socket_path_without_a_daemon(tmp_path):
    frame = _fdchannel.request_frame(7, "ab" * 16, 281474976710657, True)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert pb.FdRequest.FromString(frame[4:]) == pb.FdRequest(request_id=7, session_id="ab" * 16,
                                                               segment_id=281474976710657, read_only=True)
    refused = pb.FdReply(request_id=7, refused=pb.FdRefusal(code=5, message="segment 1: session x holds no lease"))
    read_end, write_end = os.pipe()
    with pytest.raises(gpumemd.GpumemdError) as raised:
        _fdchannel.granted(refused, 7, 1, [read_end, write_end])
    assert (raised.value.code, raised.value.message) == (grpc.StatusCode.NOT_FOUND, "segment 1: session x holds no lease")
    for fd in (read_end, write_end):
        with pytest.raises(OSError):
            os.fstat(fd)  # closed: a refusal leaves no descriptor behind
    granted = pb.FdReply(request_id=8, granted=pb.FdGrant(segment_id=1, segment_bytes=4096))
    with pytest.raises(gpumemd.GpumemdError, match="reply to request 8 came for request 9"):
        _fdchannel.granted(granted, 9, 1, [])
    # a container that mounts the socket directory elsewhere: the same name next to its own socket
    assert _fdchannel.socket_path("unix://%s/g.sock" % tmp_path, "/run/gpumemd/g.sock.fd") == str(tmp_path / "g.sock.fd")
    (tmp_path / "here.fd").touch()
    assert _fdchannel.socket_path("unix:///elsewhere/g.sock", str(tmp_path / "here.fd")) == str(tmp_path / "here.fd")
