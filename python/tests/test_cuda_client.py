"""The Python client's CUDA logic that needs no GPU (issue 24), against a real daemon where a
daemon has a part: device UUIDs formatted as the daemon prints them and matched to this
process's devices; streams from every library the client names; the stream-ordered release
machinery (the real poller thread / task, the real queue and the real Release protocol on the
host backend) driven by a stand-in event whose completion the test controls, since no real
event exists without a GPU; and mappings whose close fails, which must not keep the others
open or the acknowledgement unsent."""
import asyncio
import ctypes
import os
import threading
import time

import grpc
import pytest

import gpumemd
import gpumemd.aio
from gpumemd import _cuda
from gpumemd._errors import GpumemdError
from gpumemd._mapping import HostMapping, MappingCache
from gpumemd._stubs import pb

# ---------------------------------------------------------------------------- UUIDs


def test_uuid_is_formatted_as_the_daemon_and_nvidia_smi_print_it():
    raw = bytes.fromhex("8c3a1f0e27d64b5e9a01fe7c3b2d1a09")
    assert _cuda.format_uuid(raw) == "GPU-8c3a1f0e-27d6-4b5e-9a01-fe7c3b2d1a09"
    assert _cuda.format_uuid((ctypes.c_ubyte * 16)(*range(16))) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    with pytest.raises(ValueError):
        _cuda.format_uuid(b"\x00" * 15)


LOCAL = ["GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b"]


def test_daemon_device_is_found_by_uuid_not_by_ordinal():
    # the daemon's device 3 is this container's device 1
    assert _cuda.match_device(3, "GPU-00000000-0000-0000-0000-00000000000b", LOCAL) == 1
    assert _cuda.match_device(0, "gpu-00000000-0000-0000-0000-00000000000A", LOCAL) == 0  # case, as typed
    # a daemon that reports no uuid numbers devices as this process does (older daemons)
    assert _cuda.match_device(1, "", LOCAL) == 1


def test_lease_on_a_gpu_this_process_cannot_see_names_its_uuid():
    with pytest.raises(GpumemdError) as e:
        _cuda.match_device(3, "GPU-ffffffff-0000-0000-0000-000000000003", LOCAL)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "GPU-ffffffff-0000-0000-0000-000000000003" in e.value.message
    assert "device 3" in e.value.message and LOCAL[0] in e.value.message


def test_mapping_cache_refuses_a_legacy_handle_on_an_unseen_gpu_and_counts_nothing(monkeypatch):
    """The cache asks the session for the daemon device's uuid and this process for its own
    (here the driver's answer is a stand-in: there is no driver)."""
    monkeypatch.setattr(_cuda, "visible_uuids", lambda: list(LOCAL))
    acks = []
    cache = MappingCache(acks.append, None, {2: "GPU-ffffffff-0000-0000-0000-000000000002"}.get)
    handle = pb.MemoryHandle(segment_id=7, segment_bytes=2 << 20, cuda_ipc_handle=b"\x01" * 64)
    with pytest.raises(GpumemdError) as e:
        cache.acquire(2, handle)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "GPU-ffffffff" in e.value.message
    assert len(cache) == 0 and cache.maps_opened == 0 and acks == []


def test_session_knows_the_daemons_device_uuids(daemon):
    """OpenSessionResponse.devices, from a real daemon (host devices have HOST- uuids)."""
    with gpumemd.connect(daemon.target) as gm:
        listed = {d.device: d.uuid for d in daemon.admin.ListDevices(pb.ListDevicesRequest()).devices}
        assert listed and {d: gm._s.device_uuid(d) for d in listed} == listed
        assert gm._s.device_uuid(99) == ""


# ---------------------------------------------------------------------------- streams


class _NumbaStream:
    def __init__(self, pointer):
        self.handle = ctypes.c_void_p(pointer)  # numba.cuda.cudadrv.driver.Stream.handle


class _ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x5000)


class _TorchStream:
    cuda_stream = 0x6000


@pytest.mark.parametrize("stream,expected", [
    (None, 0), (0, 0), (0x1234, 0x1234), (ctypes.c_void_p(0x2000), 0x2000), (ctypes.c_void_p(None), 0),
    (_NumbaStream(0x3000), 0x3000), (_ProtocolStream(), 0x5000), (_TorchStream(), 0x6000),
], ids=["none", "zero", "int", "c_void_p", "null-c_void_p", "numba", "cuda-stream-protocol", "torch"])
def test_streams_of_every_library_are_taken(stream, expected):
    assert _cuda.stream_handle(stream) == expected


@pytest.mark.parametrize("stream", [True, "0x10", object(), 1.5])
def test_what_is_not_a_stream_is_refused(stream):
    with pytest.raises(TypeError):
        _cuda.stream_handle(stream)


# ---------------------------------------------------------------------------- stream-ordered release


class GateEvent:
    """A stand-in for a CUDA event: incomplete until the test opens the gate; counts queries and
    destroys. ``fail``: its query raises, as a failed context's would."""

    def __init__(self, fail=False):
        self.gate = threading.Event()
        self.queries = 0
        self.destroyed = 0
        self.fail = fail

    def query(self):
        self.queries += 1
        if self.fail:
            raise GpumemdError(grpc.StatusCode.INTERNAL, "cuEventQuery failed: CUDA error 700 (illegal address)")
        return self.gate.is_set()

    def destroy(self):
        self.destroyed += 1


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.1f s" % (what, timeout)
        time.sleep(0.005)


def close_after(lease, event):
    """What Lease.close(after=stream) does once it has recorded its event (a host lease refuses
    ``after``, so the stand-in event goes in here)."""
    with lease._lock:
        lease._closed = True
    lease._release = lease._client._close_lease(lease, event)


def listed(daemon, lease_id):
    return any(entry.lease_id == lease_id for entry in daemon.leases())


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_release_waits_for_the_event_and_the_caller_does_not(daemon, stream):
    with gpumemd.connect(daemon.target, client_name="deferred", stream=stream) as gm:
        lease = gm.lease(0, 4096)
        event = GateEvent()
        close_after(lease, event)  # returns at once, the event incomplete
        assert lease.closed and lease._release is None
        wait_until(lambda: event.queries >= 3, what="three polls")
        # polled three times and still incomplete: the daemon still has the lease
        assert listed(daemon, lease.id) and event.destroyed == 0 and gm.stats().releases == 0
        event.gate.set()
        wait_until(lambda: not listed(daemon, lease.id), what="the release")
        assert event.destroyed == 1 and gm.stats().releases == 1 and len(gm._deferred) == 0
        # the poller goes on serving later releases
        later, event2 = gm.lease(0, 4096), GateEvent()
        event2.gate.set()
        close_after(later, event2)
        wait_until(lambda: not listed(daemon, later.id), what="the second release")
        assert event2.destroyed == 1


def test_a_failed_event_keeps_the_lease_until_the_session_ends(daemon):
    gm = gpumemd.connect(daemon.target, client_name="deferred-failed")
    lease = gm.lease(0, 4096)
    event = GateEvent(fail=True)
    close_after(lease, event)
    wait_until(lambda: event.destroyed == 1, what="the failed event dropped")
    # the GPU may still touch the block, for all the client knows: not released
    assert listed(daemon, lease.id) and gm.stats().releases == 0 and len(gm._deferred) == 0
    gm.close()
    assert not listed(daemon, lease.id)  # CloseSession took it back


def test_close_waits_for_pending_events_then_sends_their_release(daemon):
    gm = gpumemd.connect(daemon.target, client_name="deferred-close")
    lease = gm.lease(0, 4096)
    event = GateEvent()
    close_after(lease, event)
    wait_until(lambda: event.queries >= 1, what="a poll")
    opener = threading.Timer(0.2, event.gate.set)  # the GPU work ends while close waits
    opener.start()
    gm.close()
    opener.join()
    assert event.gate.is_set() and event.destroyed == 1
    assert gm.stats().releases == 1  # sent by the poller before the session closed


def test_close_gives_up_an_event_that_never_completes_without_leaking_it(daemon):
    gm = gpumemd.connect(daemon.target, client_name="deferred-stuck", timeout=0.3)
    leases = [gm.lease(0, 4096) for _ in range(3)]
    events = [GateEvent() for _ in leases]
    for lease, event in zip(leases, events):
        close_after(lease, event)
    gm.close()  # waits 0.3 s (its timeout), then gives them up with the session
    assert [e.destroyed for e in events] == [1, 1, 1] and len(gm._deferred) == 0
    assert gm.stats().releases == 0
    assert not any(listed(daemon, lease.id) for lease in leases)
    assert not gm._poller.is_alive()


def test_a_lost_sessions_pending_release_is_dropped_with_its_event(daemon):
    with gpumemd.connect(daemon.target, client_name="deferred-lost") as gm:
        lease = gm.lease(0, 4096)
        event = GateEvent()
        close_after(lease, event)
        wait_until(lambda: event.queries >= 1, what="a poll")
        gm._lose(gm._s, "test")  # as a daemon restart would
        event.gate.set()
        wait_until(lambda: event.destroyed == 1, what="the event dropped")
        assert gm.stats().releases == 0 and len(gm._deferred) == 0


def test_a_lease_closed_after_while_the_client_closes_leaks_no_event(daemon):
    gm = gpumemd.connect(daemon.target, client_name="deferred-closing")
    lease = gm.lease(0, 4096)
    gm._closing = True  # as close() sets it before it takes the session down
    event = GateEvent()
    close_after(lease, event)
    assert event.destroyed == 1 and len(gm._deferred) == 0
    gm._closing = False
    gm.close()


def test_asyncio_release_waits_for_the_event_and_close_resolves_the_rest(daemon):
    async def main():
        gm = await gpumemd.aio.connect(daemon.target, client_name="deferred-aio", timeout=0.3)
        first, second = await gm.lease(0, 4096), await gm.lease(0, 4096)
        done, stuck = GateEvent(), GateEvent()
        close_after(first, done)
        close_after(second, stuck)
        assert first._release is None  # nothing to await: the caller does not wait
        for _ in range(1000):
            if done.queries >= 3:
                break
            await asyncio.sleep(0.005)
        assert done.queries >= 3 and listed(daemon, first.id)
        done.gate.set()
        for _ in range(2000):
            if not listed(daemon, first.id):
                break
            await asyncio.sleep(0.005)
        assert not listed(daemon, first.id) and done.destroyed == 1
        assert listed(daemon, second.id)
        await gm.close()  # the stuck one is given up after 0.3 s, with its event
        assert stuck.destroyed == 1 and not listed(daemon, second.id) and len(gm._deferred) == 0
        return gm.stats().releases

    assert asyncio.run(main()) == 1


# ---------------------------------------------------------------------------- failed unmaps


class FailingMapping:
    """A CUDA-like mapping whose close fails, as a failed cuIpcCloseMemHandle would."""

    kind = "cuda"
    read_only = False
    segment_id = 5

    def __init__(self):
        self.tries = 0

    def try_close(self):
        self.tries += 1
        raise GpumemdError(grpc.StatusCode.INTERNAL, "cuIpcCloseMemHandle failed: CUDA error 1")


def _host_mapping(size=4096):
    fd = os.memfd_create("gpumemd-test")
    os.ftruncate(fd, size)
    return HostMapping.from_descriptor(0, 5, fd, size, False)


def test_a_failed_close_does_not_keep_other_mappings_open_nor_the_ack_unsent():
    acks = []
    cache = MappingCache(acks.append)
    failing, host = FailingMapping(), _host_mapping()
    cache._close(5, [failing, host], True)
    assert failing.tries == 1 and host.closed and acks == [5]
    assert not cache._waiting


def test_close_all_closes_every_mapping_past_a_failure():
    cache = MappingCache(lambda segment_id: None)
    failing, host = FailingMapping(), _host_mapping()
    from gpumemd._mapping import _Entry

    cache._entries[5] = _Entry({False: failing})
    cache._entries[6] = _Entry({False: host})
    cache.close_all()
    assert failing.tries == 1 and host.closed and len(cache) == 0


def test_cuda_vmm_handles_are_fetched_from_the_fd_channel():
    cache = MappingCache(lambda segment_id: None)
    vmm = pb.MemoryHandle(segment_id=1, segment_bytes=2 << 20, cuda_vmm=pb.FdSegment(fd_socket="/x"))
    assert cache.needs_descriptor(vmm) and cache.needs_descriptor(vmm, True)
    assert not cache.needs_descriptor(pb.MemoryHandle(segment_id=1, cuda_ipc_handle=b"\x00" * 64))
