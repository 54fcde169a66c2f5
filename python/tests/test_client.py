"""The Python client against a real daemon (host backend): leases, errors, events, leaks."""
import gc
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy
import pytest

import gpumemd
from conftest import HERE, run_java_peer, run_worker
from gpumemd._stubs import pb

SIZE = (3 << 20) + 512  # a large request: a 4 MiB segment of its own


def trim(daemon, device):
    daemon.admin.Trim(pb.TrimRequest(device=device, keep_bytes=0))


def positions(output):
    return output.split()[:2]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_lease_write_read_in_process(daemon, stream):
    with gpumemd.connect(daemon.target, client_name="pytest", stream=stream, client_cache_bytes=0) as gm:  # no tier
        with gm.lease(device=0, size=1000, zero=True, tag="pytest") as lease:
            assert (lease.size, lease.device, len(lease.buffer())) == (1000, 0, 1000)
            assert bytes(lease.buffer()) == bytes(1000)  # zeroed
            array = numpy.asarray(lease)
            array[:3] = (1, 2, 3)
            assert bytes(lease.buffer()[:4]) == b"\x01\x02\x03\x00"
            listed = [l for l in daemon.leases(session_id=gm.session_id)]
            assert [(l.lease_id, l.tag, l.client_name) for l in listed] == [(lease.id, "pytest", "pytest")]
            del array
        stats = gm.stats()
        assert (stats.leases, stats.releases, stats.mapped_segments) == (1, 1, 1)
        deadline = time.monotonic() + 5
        while daemon.leases(session_id=gm.session_id) and time.monotonic() < deadline:
            time.sleep(0.01)  # a stream release is a notice nobody waits for
        assert daemon.leases(session_id=gm.session_id) == []


def test_two_python_processes_share_the_block(daemon):
    trim(daemon, 1)
    written = run_worker("write", daemon.target, 1, SIZE, 11)
    read = run_worker("read", daemon.target, 1, SIZE, 11)
    assert positions(read) == positions(written)  # the same block, and its bytes as written


def test_java_writes_python_reads(daemon):
    trim(daemon, 1)
    written = run_java_peer("write", daemon.target, 1, SIZE, 23)
    read = run_worker("read", daemon.target, 1, SIZE, 23)
    assert positions(read) == positions(written)


def test_python_writes_java_reads(daemon):
    trim(daemon, 1)
    written = run_worker("write", daemon.target, 1, SIZE, 42)
    read = run_java_peer("read", daemon.target, 1, SIZE, 42)
    assert positions(read) == positions(written)


def test_killed_worker_is_reclaimed_within_the_grace_period(daemon):
    worker = subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), "hold", daemon.target, "0", str(1 << 20)],
                              stdout=subprocess.PIPE, text=True)
    try:
        worker.stdout.readline()
        lease_id = worker.stdout.readline().strip()
        assert [l.client_name for l in daemon.leases() if l.lease_id == lease_id] == ["pytest-worker-hold"]
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        worker.stdout.close()
    killed = time.monotonic()
    while any(l.lease_id == lease_id for l in daemon.leases()):
        assert time.monotonic() - killed < 5, "lease %s still held 5 s after the worker died" % lease_id
        time.sleep(0.02)
    # the daemon's grace period is 500 ms; the session ends (and its leases return) just after
    assert time.monotonic() - killed < 3


def test_shutdown_notice_reaches_the_client(start_daemon):
    d = start_daemon("--drain-timeout-ms", "3000")
    heard = []
    gm = gpumemd.connect(d.target, on_shutdown=heard.append)
    lease = gm.lease(0, 4096)
    d.process.send_signal(signal.SIGTERM)
    assert gm.wait_for_shutdown_notice(10) == 3000
    assert heard == [3000]
    lease.close()  # releasing while the daemon drains is what the notice asks for
    gm.close()
    assert d.process.wait(15) == 0


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
@pytest.mark.parametrize("device, size, needle", [
    (0, 0, "size_bytes: 0"),
    (0, -1, "size_bytes: -1"),
    (7, 4096, "device: 7"),
    (0, 1 << 40, "size_bytes"),
])
def test_bad_arguments_raise_the_daemons_status(daemon, stream, device, size, needle):
    with gpumemd.connect(daemon.target, stream=stream) as gm:
        with pytest.raises(gpumemd.GpumemdError) as raised:
            gm.lease(device, size)
        assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in raised.value.message
        with gm.lease(0, 4096):  # the session (and its stream) carry on
            pass


def test_unreachable_daemon_raises_unavailable(tmp_path):
    with pytest.raises(gpumemd.GpumemdError) as raised:
        gpumemd.connect("unix://%s/none.sock" % tmp_path, timeout=2)
    assert raised.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def _resources():
    gc.collect()
    return len(os.listdir("/proc/self/fd")), threading.active_count()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_no_thread_or_fd_leak_after_10000_leases(daemon, stream):
    with gpumemd.connect(daemon.target, stream=stream) as warmup:
        warmup.lease(0, 4096).close()
    before = _resources()
    with gpumemd.connect(daemon.target, stream=stream) as gm:
        gm.lease(0, 4096).close()
        during = _resources()  # with the segment's mapping (an mmap holds a descriptor)
        for i in range(10_000):
            with gm.lease(0, 4096 if i % 2 else 100_000) as lease:
                lease.buffer()[0] = i & 0xFF
        assert _resources() == during
        assert gm.stats().maps_opened <= 2  # one mapping per segment, however many leases
    for _ in range(20):
        gpumemd.connect(daemon.target, stream=stream).close()
    deadline = time.monotonic() + 5
    while _resources() != before and time.monotonic() < deadline:
        time.sleep(0.05)  # grpc's threads end just after close
    assert _resources() == before


def test_closing_twice_is_harmless(daemon):
    gm = gpumemd.connect(daemon.target)
    lease = gm.lease(0, 4096)
    lease.close()
    lease.close()
    other = gm.lease(0, 4096)
    gm.close()
    gm.close()
    other.close()  # after the client: CloseSession already took it back
    assert other.closed
    with pytest.raises(gpumemd.GpumemdError) as raised:
        gm.lease(0, 4096)
    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_lease_used_after_close_raises_and_its_view_is_released(daemon):
    with gpumemd.connect(daemon.target) as gm:
        lease = gm.lease(0, 4096)
        view = lease.buffer()
        lease.close()
        with pytest.raises(gpumemd.GpumemdError) as raised:
            lease.buffer()
        assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION and "closed" in raised.value.message
        with pytest.raises(ValueError, match="released"):
            view[0]
        with pytest.raises(gpumemd.GpumemdError):
            numpy.asarray(lease)


def test_unmap_request_is_obeyed_once_no_array_uses_the_segment(start_daemon):
    d = start_daemon()
    with gpumemd.connect(d.target) as gm:
        lease = gm.lease(0, SIZE)
        array = numpy.asarray(lease)  # exports the mapping: it must not be unmapped under it
        lease.close()
        assert gm.stats().mapped_segments == 1
        # The release is a notice on the stream, the trim a call of its own: on a loaded machine
        # the trim could overtake it and find the block still leased, with nothing to evict.
        deadline = time.monotonic() + 5
        while d.stats(0).leased_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert d.stats(0).leased_bytes == 0
        trim(d, 0)  # the daemon wants the segment back: UnmapSegment on the stream
        time.sleep(0.5)
        assert d.stats(0).segments_awaiting_unmap == 1  # no acknowledgement while the array lives
        array[0] = 1  # still mapped: harmless, if pointless
        del array
        gm.lease(1, 4096).close()  # the client's next operation closes it and acknowledges
        deadline = time.monotonic() + 5
        while d.stats(0).segments_awaiting_unmap and time.monotonic() < deadline:
            time.sleep(0.02)
        assert d.stats(0).segments_awaiting_unmap == 0 and d.stats(0).segments == 0
        assert gm.stats().mapped_segments == 1  # device 1's only


def test_host_close_after_a_stream_is_refused(daemon):
    with gpumemd.connect(daemon.target) as gm:
        lease = gm.lease(0, 4096)
        with pytest.raises(gpumemd.GpumemdError) as raised:
            lease.close(after=0)
        assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert not lease.closed
        lease.close()
        assert not hasattr(lease, "__cuda_array_interface__")


@pytest.mark.parametrize("readme, after, socket", [
    ("python/README.md", "", "unix:///run/gpumemd/gpumemd.sock"),
    ("README.md", "## Use it from Python", "unix:///tmp/gpumemd.sock"),
], ids=["python-readme", "root-readme"])
def test_readme_example_runs_verbatim_with_numpy(daemon, readme, after, socket):
    text = open(os.path.join(os.path.dirname(os.path.dirname(HERE)), readme)).read()
    example = (text.split(after, 1)[1] if after else text).split("```python\n", 1)[1].split("```", 1)[0]
    assert "numpy.asarray(lease" in example and socket in example
    exec(compile(example.replace(socket, daemon.target), readme, "exec"), {})
