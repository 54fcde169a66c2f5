"""Sleep and wake of a Python client's session (issue 35) against the real daemon: host backend
and real shared memory (segments by path and by descriptor), the asyncio client, and CUDA VMM
on a GPU or the stand-in driver. Other sessions are other processes (tests/sleep_worker.py)."""
import asyncio
import ctypes
import os
import re
import signal
import subprocess
import sys
import urllib.request

import grpc
import numpy
import pytest

import gpumemd
import gpumemd.aio
from gpumemd import _cuda
from gpumemd._errors import GpumemdError
from gpumemd._stubs import pb
from test_client_cache import _free_port
from test_fd import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 4 << 20   # a large request: a segment of its own
BIG = 40 << 20   # on a 64 MiB device (budget 90%: 57.6 MiB) two of these do not fit at once


def _pattern(size, seed):
    return ((numpy.arange(size, dtype=numpy.int64) * 7 + seed) % 251).astype(numpy.uint8)


def _data_address(array):
    return array.__array_interface__["data"][0]


def _view_address(view):
    return ctypes.addressof((ctypes.c_char * len(view)).from_buffer(view))


def _sleep_levels(d, session_id):
    return {info.lease_id: info.sleep_level for info in d.leases(session_id=session_id)}


def _session(d, session_id):
    for info in d.admin.ListSessions(pb.ListSessionsRequest()).sessions:
        if info.session_id == session_id:
            return info
    return None


@pytest.mark.parametrize("segments", ["path", "fd"])
@pytest.mark.parametrize("level", [1, 2])
def test_leases_wake_at_their_addresses_with_their_bytes_or_zeros(start_daemon, segments, level):
    d = start_daemon("--host-segments", segments)
    with gpumemd.connect(d.target) as gm:
        big, small = gm.lease(0, SIZE, tag="weights"), gm.lease(0, 4096, tag="kv")
        array, view = numpy.asarray(big), small.buffer()
        array[:] = _pattern(SIZE, 3)
        view[:] = b"\x42" * 4096
        addresses = (_data_address(array), _view_address(view))
        old_big, old_small = big.segment_id, small.segment_id
        old_segments = {old_big, old_small}

        slept = gm.sleep(level)
        assert set(slept.lease_ids) == {big.id, small.id}
        assert set(slept.segment_ids) == old_segments
        assert big.asleep and small.asleep
        assert _sleep_levels(d, gm.session_id) == {big.id: level, small.id: level}
        assert slept.host_bytes >= (SIZE + 4096 if level == 1 else 0) and slept.freed_bytes >= SIZE
        info = _session(d, gm.session_id)
        assert (info.sleeping_leases, info.host_bytes) == (2, slept.host_bytes)

        woken = gm.wake()
        assert set(woken.lease_ids) == {big.id, small.id} and set(woken.segments) == old_segments
        assert (big.segment_id, small.segment_id) == (woken.segments[old_big], woken.segments[old_small])
        assert not big.asleep and not small.asleep
        assert (_data_address(array), _view_address(view)) == addresses
        assert (_data_address(numpy.asarray(big)), _view_address(small.buffer())) == addresses
        if level == 1:
            assert numpy.array_equal(array, _pattern(SIZE, 3)) and bytes(view) == b"\x42" * 4096
        else:
            assert not array.any() and bytes(view) == bytes(4096)
        assert _sleep_levels(d, gm.session_id) == {big.id: 0, small.id: 0}
        array[:3] = 9  # writable again, through the old array
        assert bytes(big.buffer()[:3]) == b"\x09\x09\x09"
        del array, view
        big.close()
        small.close()


def test_the_memory_a_sleep_frees_serves_another_session_until_the_wake(start_daemon):
    d = start_daemon("--backend", "host", "--host-devices", "1", "--host-device-bytes", "64MiB")
    with gpumemd.connect(d.target) as gm:
        lease = gm.lease(0, BIG)
        array = numpy.asarray(lease)
        array[:] = _pattern(BIG, 1)
        address = _data_address(array)
        assert _other_session(d, BIG) == "RESOURCE_EXHAUSTED"  # the budget holds one of them

        gm.sleep(1)
        other = _start_worker("lease", d.target, BIG)  # another process, another session: it fits now
        try:
            assert other.stdout.readline().split()[0] == "leased"
            with pytest.raises(GpumemdError) as refused:
                gm.wake()  # the other session holds the memory
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert lease.asleep
            other.stdin.write("done\n")
            other.stdin.flush()
            assert other.wait(30) == 0
        finally:
            other.kill()
            other.wait()

        # The other process mapped its segment by descriptor: the daemon frees it once its
        # descriptor pins see that process gone (DescriptorPins' sweep, on its housekeeping
        # thread), which may be just after the exit. Until then a wake is refused, changing
        # nothing, so it is asked again.
        wait_until(lambda: _woken(gm), what="a wake once the other process's memory is back")
        assert _data_address(array) == address and numpy.array_equal(array, _pattern(BIG, 1))
        del array
        lease.close()


def _woken(gm):
    """Wakes the session; False when the daemon refused for memory (a refused wake changes nothing)."""
    try:
        gm.wake()
        return True
    except GpumemdError as e:
        if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return False


def _start_worker(mode, target, size):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "sleep_worker.py"), mode, target, str(size)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _other_session(d, size):
    """What another process's lease of ``size`` gets: "leased" or the refusal's code."""
    worker = _start_worker("lease", d.target, size)
    out, _ = worker.communicate("done\n", timeout=60)
    assert worker.returncode == 0, out
    return out.split()[0]


def test_a_refused_sleep_leaves_every_lease_usable_with_its_bytes(start_daemon):
    d = start_daemon("--unmap-wait-ms", "100")
    with gpumemd.connect(d.target) as gm, gpumemd.connect(d.target) as holder:
        shared, other = gm.lease(0, SIZE), gm.lease(0, SIZE)
        shared.buffer()[:4] = b"abcd"
        array = numpy.asarray(other)
        array[:] = _pattern(SIZE, 5)
        address = _data_address(array)
        token = shared.share()
        hold = holder.attach(token.token)  # a block another session still maps cannot be freed
        with pytest.raises(GpumemdError) as refused:
            gm.sleep(1)
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert holder.session_id[:8] in refused.value.message and "100 ms" in refused.value.message
        assert not shared.asleep and not other.asleep
        assert bytes(shared.buffer()[:4]) == b"abcd"
        assert _data_address(array) == address and numpy.array_equal(array, _pattern(SIZE, 5))
        array[0] = 1  # mapped and writable
        assert set(_sleep_levels(d, gm.session_id).values()) == {0}
        with gm.lease(0, 4096) as more:  # the session is awake
            more.buffer()[0] = 1
        hold.close()
        token.revoke()
        del array
        shared.close()
        other.close()


def test_a_published_lease_sleeps_and_its_name_finds_the_woken_bytes(daemon):
    """Nobody else holds it: the published block sleeps with its lease; a lookup meanwhile is
    refused naming the sleep, and after the wake the name maps the new block."""
    with gpumemd.connect(daemon.target) as gm, gpumemd.connect(daemon.target) as reader:
        weights = gm.lease(0, SIZE, tag="weights")
        array = numpy.asarray(weights)
        array[:] = _pattern(SIZE, 9)
        gm.publish(weights, "model/sleepy", read_only=True)

        slept = gm.sleep(1)
        assert slept.lease_ids == [weights.id]
        with pytest.raises(GpumemdError) as refused:
            reader.lookup("model/sleepy")
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "object 'model/sleepy' sleeps with session " + gm.session_id[:8] in refused.value.message

        gm.wake()
        with reader.lookup("model/sleepy") as hold:
            assert hold.segment_id == weights.segment_id and hold.offset == weights.offset
            assert numpy.array_equal(numpy.frombuffer(hold.buffer(), dtype=numpy.uint8), _pattern(SIZE, 9))
        assert not gm.unpublish("model/sleepy")  # the lease still holds the block
        del array
        weights.close()


def test_a_sleep_past_the_host_bound_is_refused_and_changes_nothing(start_daemon):
    d = start_daemon("--offload-max-bytes", "1MiB")
    with gpumemd.connect(d.target) as gm:
        lease = gm.lease(0, SIZE)
        view = lease.buffer()
        view[:2] = b"ok"
        with pytest.raises(GpumemdError) as refused:
            gm.sleep(1)
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "offload-max-bytes" in refused.value.message
        assert not lease.asleep and bytes(view[:2]) == b"ok"
        slept = gm.sleep(2)  # nothing kept in host memory: within the bound
        assert slept.lease_ids == [lease.id] and slept.host_bytes == 0
        gm.wake()
        assert bytes(view[:2]) == b"\0\0"
        del view
        lease.close()


@pytest.mark.parametrize("stream", [True, False])
def test_a_sleep_with_tags_leaves_the_other_segments_awake(daemon, stream):
    with gpumemd.connect(daemon.target, stream=stream) as gm:
        weights, kv = gm.lease(0, SIZE, tag="weights"), gm.lease(0, SIZE, tag="kv")
        assert weights.segment_id != kv.segment_id
        weights.buffer()[:1] = b"w"
        kv.buffer()[:1] = b"k"
        slept = gm.sleep(2, tags=["kv"])
        assert slept.lease_ids == [kv.id] and kv.asleep and not weights.asleep
        assert bytes(weights.buffer()[:1]) == b"w"  # mapped: it did not sleep
        weights.buffer()[1:2] = b"!"
        gm.wake()
        assert bytes(kv.buffer()[:1]) == b"\0" and bytes(weights.buffer()[:2]) == b"w!"
        weights.close()
        kv.close()


def test_a_segment_the_daemon_does_not_put_to_sleep_is_mapped_again(daemon):
    """The client vacates every segment that ever held a lease with the tag (a superset of the
    daemon's choice); one the daemon leaves awake is refilled from itself."""
    with gpumemd.connect(daemon.target, client_cache_bytes=0) as gm:
        kv = gm.lease(0, 4096, tag="kv")
        kv.close()  # released: the segment holds no "kv" lease any more
        weights = gm.lease(0, 4096, tag="weights")
        assert weights.segment_id == kv.segment_id  # the same small segment
        view = weights.buffer()
        view[:2] = b"w!"
        slept = gm.sleep(2, tags="kv")
        assert slept.lease_ids == [] and slept.segment_ids == []
        assert not weights.asleep and bytes(view[:2]) == b"w!"  # mapped again, at the same address
        view[2:3] = b"?"
        with gm.lease(0, 4096) as more:  # nothing sleeps: the session leases
            more.buffer()[0] = 1
        del view
        weights.close()


def test_while_asleep_leases_are_refused_and_a_sleeping_lease_can_be_closed(daemon):
    with gpumemd.connect(daemon.target) as gm:
        gm.lease(0, 4096).close()  # kept in the client cache tier
        assert gm.stats().cached_leases == 1
        first, second = gm.lease(0, SIZE), gm.lease(0, SIZE)
        second.buffer()[:3] = b"two"
        gm.sleep(1)
        assert gm.stats().cached_leases == 0  # the tier gave its leases back
        with pytest.raises(GpumemdError) as refused:
            gm.lease(0, 4096)  # not served by the tier either
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
        first.close()  # a sleeping lease: released (a notice on the stream), its contents dropped
        assert gm.stats().cached_leases == 0
        wait_until(lambda: set(_sleep_levels(daemon, gm.session_id)) == {second.id}, 10,
                   "the daemon applying the sleeping lease's release")
        assert _session(daemon, gm.session_id).sleeping_leases == 1
        woken = gm.wake()
        assert woken.lease_ids == [second.id] and bytes(second.buffer()[:3]) == b"two"
        assert set(_sleep_levels(daemon, gm.session_id)) == {second.id}
        with gm.lease(0, 4096) as again:
            again.buffer()[0] = 1
        second.close()


def _held_in_host_memory(port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    match = re.search(r"^gpumemd_offload_held_bytes(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert match, "no gpumemd_offload_held_bytes on /metrics"
    return float(match.group(1))


def test_a_client_closed_while_asleep_ends_its_session_and_leases(daemon):
    gm = gpumemd.connect(daemon.target)
    lease = gm.lease(0, SIZE)
    view = lease.buffer()
    gm.sleep(1)
    session_id = gm.session_id
    gm.close()
    assert _session(daemon, session_id) is None and daemon.leases(session_id=session_id) == []
    del view  # its range, inaccessible, goes with it


def test_a_sleeping_client_killed_is_freed_after_the_grace_period(start_daemon):
    port = _free_port()
    d = start_daemon("--backend", "host", "--host-devices", "1", "--host-device-bytes", "64MiB",
                     "--metrics-port", str(port))
    worker = _start_worker("sleep", d.target, BIG)
    try:
        line = worker.stdout.readline().split()
        assert line[0] == "asleep", line
        session_id = line[1]
        info = _session(d, session_id)
        assert info.sleeping_leases == 1 and info.host_bytes >= BIG
        assert _held_in_host_memory(port) == info.host_bytes
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    wait_until(lambda: _session(d, session_id) is None, 30, "the session's end after its grace period (500 ms)")
    assert d.leases(session_id=session_id) == []
    assert _held_in_host_memory(port) == 0  # its contents dropped with it
    assert _other_session(d, BIG) == "leased"  # and its device memory is another's to lease


@pytest.mark.parametrize("segments", ["path", "fd"])
def test_asyncio_sleep_and_wake(start_daemon, segments):
    d = start_daemon("--host-segments", segments, "--unmap-wait-ms", "100")

    async def run():
        async with await gpumemd.aio.connect(d.target) as gm, await gpumemd.aio.connect(d.target) as holder:
            lease = await gm.lease(0, SIZE)
            array = numpy.asarray(lease)
            array[:] = _pattern(SIZE, 8)
            address = _data_address(array)
            slept = await gm.sleep(1)
            assert slept.lease_ids == [lease.id] and lease.asleep
            with pytest.raises(GpumemdError) as refused:
                await gm.lease(0, 4096)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            await gm.wake()
            assert _data_address(array) == address and numpy.array_equal(array, _pattern(SIZE, 8))
            shared = await gm.lease(0, SIZE)
            hold = await holder.attach((await shared.share()).token)  # another session holds it
            with pytest.raises(GpumemdError) as refused:
                await gm.sleep(2)
            assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert not lease.asleep and numpy.array_equal(array, _pattern(SIZE, 8))
            await hold.aclose()
            del array
            await lease.aclose()
            await shared.aclose()

    asyncio.run(run())


def test_a_bad_level_is_refused_before_anything_changes(daemon):
    with gpumemd.connect(daemon.target) as gm:
        with gm.lease(0, SIZE) as lease:
            for level in (0, 3, True):
                with pytest.raises(GpumemdError) as refused:
                    gm.sleep(level)
                assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert not lease.asleep
            lease.buffer()[0] = 1


@pytest.mark.skipif(not gpumemd.cuda_available(),
                    reason="no usable CUDA device (libcuda.so.1 missing or no GPU reported)")
@pytest.mark.parametrize("level", [1, 2])
def test_cuda_vmm_leases_wake_at_their_device_addresses(start_daemon, level):
    d = start_daemon("--backend", "cuda", "--cuda-handles", "vmm", "--device-limit-bytes", "1GiB")
    with gpumemd.connect(d.target) as gm:
        lease = gm.lease(0, SIZE)
        pointer, device = lease.device_ptr, lease.cuda_device
        data = _pattern(SIZE, 4).tobytes()
        _cuda.copy_to_device(device, pointer, data)
        _cuda.synchronize(device)
        gm.sleep(level)
        assert lease.asleep
        with pytest.raises(GpumemdError):
            _cuda.copy_from_device(device, pointer, 16)  # nothing mapped there now
        gm.wake()
        assert lease.device_ptr == pointer
        assert _cuda.copy_from_device(device, pointer, SIZE) == (data if level == 1 else bytes(SIZE))
        lease.close()
