"""Sharing (issue 16) against the real daemon (host backend): share tokens, attach, published
names, read-only holds, holders that die, and bad input. Producers and consumers are separate
Python processes (sharing_worker.py) unless the test is about one client's own bookkeeping."""
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid

import grpc
import numpy
import pytest

import gpumemd
import gpumemd.aio
from conftest import HERE
from gpumemd._mapping import MappingCache
from gpumemd._stubs import pb
from worker import pattern

SIZE = (3 << 20) + 512  # a 4 MiB block of a segment of its own
WORKER = os.path.join(HERE, "sharing_worker.py")


def run_sharing(*args, timeout=60):
    result = subprocess.run([sys.executable, WORKER] + [str(a) for a in args], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, "sharing_worker %s failed (%d):\n%s%s" % (
        args, result.returncode, result.stdout, result.stderr)
    return result.stdout.split()


def start_sharing(*args):
    return subprocess.Popen([sys.executable, WORKER] + [str(a) for a in args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=30):
    """Lets a waiting worker close its hold and exit; asserts it exited 0."""
    out, err = process.communicate("\n", timeout=timeout)
    assert process.returncode == 0, "worker failed (%d):\n%s%s" % (process.returncode, out, err)


def leased(daemon, device):
    return daemon.stats(device).leased_bytes


def wait_until(predicate, timeout=5.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "%s not reached within %.1f s" % (what, timeout)
        time.sleep(0.02)


def objects(daemon):
    return {o.name: o for o in daemon.admin.ListObjects(pb.ListObjectsRequest()).objects}


def unique(prefix):
    return "pytest/%s/%s" % (prefix, uuid.uuid4().hex[:12])


def expect_error(code, call, *args, **kwargs):
    with pytest.raises(gpumemd.GpumemdError) as raised:
        call(*args, **kwargs)
    assert raised.value.code == code, raised.value
    return raised.value


# ---------------------------------------------------------------------------------- client only


def test_read_only_hold_gets_a_mapping_of_its_own(tmp_path):
    """No daemon: the mapping table gives a read-only hold a PROT_READ mapping of the segment
    file, never the writable one, and closes both before it acknowledges an unmap."""
    path = tmp_path / "segment"
    path.write_bytes(bytes(8192))
    handle = pb.MemoryHandle(segment_id=7, segment_bytes=8192, offset=4096, host_shm_path=str(path))
    acked = []
    cache = MappingCache(acked.append)
    writable = cache.acquire(0, handle)
    read_only = cache.acquire(0, handle, read_only=True)
    assert writable is not read_only and cache.acquire(0, handle, read_only=True) is read_only
    assert cache.maps_opened == 2 and len(cache) == 1  # one segment, two mappings
    ro_view, rw_view = read_only.view(4096, 4096), writable.view(4096, 4096)
    assert ro_view.readonly and not rw_view.readonly
    rw_view[:3] = b"abc"
    assert bytes(ro_view[:3]) == b"abc"  # the same shared memory
    with pytest.raises(TypeError):
        ro_view[0] = 1
    array = numpy.frombuffer(ro_view, dtype=numpy.uint8)
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 1
    del array
    ro_view.release()
    rw_view.release()
    for _ in range(3):
        cache.release(7)
    cache.unmap_requested(7)
    assert acked == [7] and len(cache) == 0


# ---------------------------------------------------------------------------------- processes


def test_producer_exits_then_consumer_attaches_and_reads(daemon):
    """A one-shot hand-off: the token holds the block after its producer is gone; the memory
    comes back only once the consumer releases its hold."""
    baseline = leased(daemon, 1)
    token, segment, offset, block_bytes = run_sharing("produce", daemon.target, 1, SIZE, 31, 1)
    assert len(token) == 32 and int(token, 16) >= 0
    block_bytes = int(block_bytes)
    assert leased(daemon, 1) == baseline + block_bytes  # the producer has exited; its token holds it

    consumer = start_sharing("attach", daemon.target, token, SIZE, 31)
    try:
        seg, off, hold_id, read_only = consumer.stdout.readline().split()
        assert consumer.stdout.readline().strip() == "ok", consumer.stderr.read()
        assert (seg, off, read_only) == (segment, offset, "0")  # the same block, writable
        [hold] = [l for l in daemon.leases() if l.lease_id == hold_id]
        assert hold.attached and not hold.read_only and hold.client_name == "pytest-consumer"
        assert hold.holds == 1  # the one-shot token passed its hold on
        assert leased(daemon, 1) == baseline + block_bytes  # counted once
        with gpumemd.connect(daemon.target) as gm:  # used up
            expect_error(grpc.StatusCode.NOT_FOUND, gm.attach, token)
        assert leased(daemon, 1) == baseline + block_bytes
    finally:
        finish(consumer)
    wait_until(lambda: leased(daemon, 1) == baseline, what="leased_bytes back to the baseline")
    assert not any(l.lease_id == hold_id for l in daemon.leases())


def test_publish_then_read_only_lookup_from_another_process(daemon):
    name = unique("weights")
    baseline = leased(daemon, 1)
    segment, offset, block_bytes = run_sharing("publish", daemon.target, 1, SIZE, 47, name, 1)
    assert leased(daemon, 1) == baseline + int(block_bytes)  # the publisher is gone; the name holds
    listed = objects(daemon)[name]
    assert listed.read_only and listed.size_bytes == SIZE and listed.holds == 1

    # another process looks it up: read-only, and writes through its buffer and array fail
    seg, off, hold_id, read_only = run_sharing("lookup", daemon.target, name, SIZE, 47, "exit")[:4]
    assert (seg, off, read_only) == (segment, offset, "1")

    with gpumemd.connect(daemon.target) as gm:
        with gm.lookup(name) as hold:
            assert hold.read_only and hold.attached and (str(hold.segment_id), str(hold.offset)) == (segment, offset)
            assert numpy.array_equal(numpy.asarray(hold), pattern(SIZE, 47))
            with pytest.raises(TypeError):
                hold.buffer()[0] = 0
            assert objects(daemon)[name].holds == 2
            assert gm.unpublish(name) is False  # this hold still has it
            assert name not in objects(daemon)
            assert leased(daemon, 1) == baseline + int(block_bytes)
            expect_error(grpc.StatusCode.NOT_FOUND, gm.lookup, name)
        wait_until(lambda: leased(daemon, 1) == baseline, what="leased_bytes back to the baseline")


def test_killed_consumer_drops_its_hold_and_the_owner_frees_the_block(daemon):
    baseline = leased(daemon, 1)
    with gpumemd.connect(daemon.target, client_name="pytest-owner") as gm:
        lease = gm.lease(1, SIZE)
        numpy.asarray(lease)[:] = pattern(SIZE, 5)
        share = lease.share(expires_after=60)
        assert 0 < share.expires_after_seconds <= 60 and share.max_attaches == 0
        consumer = start_sharing("attach", daemon.target, share.token, SIZE, 5, "hold")
        try:
            hold_id = consumer.stdout.readline().split()[2]
            assert consumer.stdout.readline().strip() == "ok", consumer.stderr.read()
            [hold] = [l for l in daemon.leases() if l.lease_id == hold_id]
            assert hold.attached and hold.holds == 3  # the lease, the token, the hold
            assert sorted(hold.holder_session_ids) == sorted([gm.session_id, hold.session_id])
        finally:
            consumer.send_signal(signal.SIGKILL)
            consumer.wait()
            consumer.stdout.close()
            consumer.stderr.close()
        killed = time.monotonic()
        wait_until(lambda: not any(l.lease_id == hold_id for l in daemon.leases()), timeout=5,
                   what="the killed consumer's hold dropped")
        assert time.monotonic() - killed < 3  # grace 500 ms
        [mine] = daemon.leases(session_id=gm.session_id)
        assert mine.lease_id == lease.id and mine.holds == 2  # the lease and the token
        assert bytes(lease.buffer()) == pattern(SIZE, 5).tobytes()  # intact
        assert leased(daemon, 1) == baseline + lease.block_bytes
        assert share.revoke() is False and share.revoke() is False  # the lease still holds it
        lease.close()
    wait_until(lambda: leased(daemon, 1) == baseline, what="leased_bytes back to the baseline")


def test_sixteen_consumers_released_and_killed_at_random(daemon):
    """16 processes look up one published object; they end in a random order, half released,
    half SIGKILLed, the name unpublished midway and new blocks leased meanwhile: every survivor
    still reads the pattern when it releases (the block was never freed or reused early), and
    at the end the pool is back to its baseline."""
    rng = random.Random(16)
    name = unique("sixteen")
    baseline, baseline_holds = leased(daemon, 1), daemon.stats(1).live_holds
    segment, offset, block_bytes = run_sharing("publish", daemon.target, 1, SIZE, 61, name, 1)
    consumers = [start_sharing("lookup", daemon.target, name, SIZE, 61, "wait") for _ in range(16)]
    try:
        for c in consumers:
            line = c.stdout.readline().split()
            assert line[:2] == [segment, offset] and line[3] == "1", line
            assert c.stdout.readline().strip() == "ok", c.stderr.read()
        listed = objects(daemon)[name]
        assert (listed.holds, listed.holders) == (17, 16)
        assert leased(daemon, 1) == baseline + int(block_bytes)
        order = list(range(16))
        rng.shuffle(order)
        kills = set(rng.sample(order, 8))
        with gpumemd.connect(daemon.target) as gm:
            for step, i in enumerate(order):
                if i in kills:
                    consumers[i].send_signal(signal.SIGKILL)
                    consumers[i].wait()
                else:
                    finish(consumers[i])
                if step == 7:
                    assert gm.unpublish(name) is False  # 8 holders left
                    # new leases of the same size while the name is gone: never the shared block
                    others = [gm.lease(1, SIZE, zero=True) for _ in range(2)]
                    assert all((l.segment_id, l.offset) != (int(segment), int(offset)) for l in others)
                    for l in others:
                        l.close()
    finally:
        for c in consumers:
            if c.poll() is None:
                c.kill()
                c.wait()
            c.stdout.close()
            c.stderr.close()
    wait_until(lambda: leased(daemon, 1) == baseline and daemon.stats(1).live_holds == baseline_holds, timeout=5,
               what="the pool back to its baseline after the last holder")


# ---------------------------------------------------------------------------------- one client


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_holds_in_one_process(daemon, stream):
    """Holds of the lease's own client: a read-only hold beside the writable lease on the same
    segment, two holds from one token, context managers revoking and unpublishing."""
    baseline = leased(daemon, 0)
    with gpumemd.connect(daemon.target, stream=stream) as gm, gpumemd.connect(daemon.target) as other:
        lease = gm.lease(0, 10_000, zero=True)
        with lease.share(read_only=True) as share:
            assert share.read_only and share.expires_after_seconds > 0 and share.token not in repr(share)
            ro = gm.attach(share.token, tag="ro")
            assert ro.read_only and ro.attached and not lease.attached and not lease.read_only
            assert (ro.segment_id, ro.offset, ro.size) == (lease.segment_id, lease.offset, lease.size)
            lease.buffer()[:2] = b"hi"  # the lease's buffer stays writable
            assert bytes(ro.buffer()[:2]) == b"hi" and ro.buffer().readonly
            with pytest.raises(ValueError, match="read-only"):
                numpy.asarray(ro)[0] = 0
            assert gm.stats().mapped_segments >= 1 and gm.stats().holds == 1
            # a read-only hold re-shared stays read-only
            with ro.share() as again:
                assert again.read_only
                assert other.attach(again.token).read_only
            first, second = other.attach(share.token), other.attach(share.token)  # two holds
            assert first.id != second.id and first.read_only and second.read_only
            holds = {l.lease_id: l for l in daemon.leases(session_id=other.session_id)}
            assert set(holds) >= {first.id, second.id} and all(l.attached for l in holds.values())
            first.close()
            first.close()  # harmless
            second.close()
            ro.close()
        expect_error(grpc.StatusCode.NOT_FOUND, other.attach, share.token)  # revoked by the with block
        assert share.revoked

        name = unique("inproc")
        with pytest.raises(ValueError, match="not a lease of this client"):
            other.publish(lease, name)  # its session id is gm's
        with gm.publish(lease, name) as published:
            assert published.name == name and not published.read_only
            with other.lookup(name) as rw:
                assert not rw.read_only and not rw.buffer().readonly
                rw.buffer()[0] = ord("H")
                assert bytes(lease.buffer()[:2]) == b"Hi"
        assert published.unpublished and name not in objects(daemon)
        expect_error(grpc.StatusCode.NOT_FOUND, other.lookup, name)
        lease.close()
        expect_error(grpc.StatusCode.FAILED_PRECONDITION, lease.share)  # closed: refused locally
        expect_error(grpc.StatusCode.FAILED_PRECONDITION, gm.publish, lease, unique("closed"))
    wait_until(lambda: leased(daemon, 0) == baseline, what="leased_bytes back to the baseline")


def test_segment_mapped_twice_is_unmapped_and_acknowledged_once_both_close(start_daemon):
    """A segment with a writable and a read-only mapping in this process: the daemon's unmap
    request (after a trim) is acknowledged once both mappings are closed, not before an array
    over the read-only one is gone."""
    d = start_daemon()
    with gpumemd.connect(d.target) as gm:
        lease = gm.lease(0, SIZE)
        with lease.share(read_only=True) as share:
            hold = gm.attach(share.token)
        assert gm.stats().maps_opened == 2 and gm.stats().mapped_segments == 1
        array = numpy.asarray(hold)  # exports the read-only mapping
        hold.close()
        lease.close()
        d.admin.Trim(pb.TrimRequest(device=0, keep_bytes=0))
        time.sleep(0.5)
        assert d.stats(0).segments_awaiting_unmap == 1  # the read-only mapping is still exported
        del array
        gm.lease(1, 4096).close()  # the client's next operation closes it and acknowledges
        wait_until(lambda: d.stats(0).segments_awaiting_unmap == 0 and d.stats(0).segments == 0,
                   what="the segment unmapped and freed")
        assert gm.stats().mapped_segments == 1  # device 1's only


def test_bad_input_gets_a_precise_status_and_changes_nothing(daemon):
    with gpumemd.connect(daemon.target) as gm:
        lease, spare = gm.lease(0, 4096), gm.lease(0, 4096)
        name = unique("dup")
        published = gm.publish(lease, name)

        def state():
            s = daemon.stats(0)
            listed = {l.lease_id: (l.holds, l.object_name) for l in daemon.leases(session_id=gm.session_id)}
            return (s.leased_bytes, s.live_holds, s.published_objects, s.published_bytes, listed,
                    sorted(objects(daemon)))

        before = state()
        assert before[4] == {lease.id: (2, name), spare.id: (1, "")}

        error = expect_error(grpc.StatusCode.ALREADY_EXISTS, gm.publish, spare, name)
        assert name in error.message
        assert state() == before
        expect_error(grpc.StatusCode.ALREADY_EXISTS, gm.publish, lease, name)  # its own name again
        assert state() == before

        expect_error(grpc.StatusCode.NOT_FOUND, gm.attach, uuid.uuid4().hex)  # unknown token
        assert state() == before
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, gm.attach, "not-a-token")  # malformed
        assert state() == before
        expect_error(grpc.StatusCode.NOT_FOUND, gm.lookup, unique("nobody"))  # unknown name
        assert state() == before
        expect_error(grpc.StatusCode.NOT_FOUND, gm.unpublish, unique("nobody"))
        assert state() == before
        share = spare.share()
        assert share.revoke() is False  # spare's lease still holds the block
        expect_error(grpc.StatusCode.NOT_FOUND, gm.attach, share.token)  # revoked token
        expect_error(grpc.StatusCode.NOT_FOUND, gm.revoke_share, share.token)  # and revoked twice
        assert state() == before

        for bad in ("", "bell\x07", "line\nbreak", "del\x7f", "n" * 257):
            error = expect_error(grpc.StatusCode.INVALID_ARGUMENT, gm.publish, spare, bad)
            assert state() == before, repr(bad)
        with pytest.raises(ValueError):
            spare.share(expires_after=0)
        with pytest.raises(ValueError):
            spare.share(max_attaches=-1)
        assert state() == before

        longest = "n" * 255 + uuid.uuid4().hex[:1]  # 256 characters: allowed
        with gm.publish(spare, longest):
            assert longest in objects(daemon)
        assert state() == before
        assert published.unpublish() is False and published.unpublish() is False  # lease still holds it
        lease.close()
        spare.close()


# ---------------------------------------------------------------------------------- asyncio


def test_asyncio_share_attach_publish_lookup(daemon):
    baseline = leased(daemon, 0)

    async def main():
        async with await gpumemd.aio.connect(daemon.target, client_name="pytest-aio-owner") as owner, \
                await gpumemd.aio.connect(daemon.target, client_name="pytest-aio-user", stream=False) as user:
            lease = await owner.lease(0, 8192)
            numpy.asarray(lease)[:] = pattern(8192, 3)
            share = await lease.share(max_attaches=1, read_only=True)
            assert isinstance(share, gpumemd.AsyncShare)
            await lease.aclose()  # the token holds the block
            async with await user.attach(share.token) as hold:
                assert isinstance(hold, gpumemd.aio.AsyncLease) and hold.read_only and hold.attached
                assert numpy.array_equal(numpy.asarray(hold), pattern(8192, 3))
                with pytest.raises(gpumemd.GpumemdError) as raised:
                    await user.attach(share.token)  # one-shot: used up
                assert raised.value.code == grpc.StatusCode.NOT_FOUND
                assert await share.revoke() is False  # gone already
                name = unique("aio")
                async with await user.publish(hold, name) as published:
                    assert published.read_only  # a read-only hold publishes read-only
                    async with await owner.lookup(name) as looked:
                        assert looked.read_only and looked.segment_id == hold.segment_id
                    with pytest.raises(gpumemd.GpumemdError) as raised:
                        await owner.publish(looked, name)
                    assert raised.value.code == grpc.StatusCode.FAILED_PRECONDITION  # closed
                assert published.unpublished
                with pytest.raises(gpumemd.GpumemdError) as raised:
                    await owner.lookup(name)
                assert raised.value.code == grpc.StatusCode.NOT_FOUND
                lease2 = await owner.lease(0, 4096)
                async with await lease2.share() as s2:
                    async with await user.attach(s2.token):
                        pass
                with pytest.raises(gpumemd.GpumemdError) as raised:
                    await user.attach(s2.token)
                assert raised.value.code == grpc.StatusCode.NOT_FOUND  # revoked by async with
                await lease2.aclose()
            assert user.stats().holds == 2

    asyncio.run(main())
    wait_until(lambda: leased(daemon, 0) == baseline, what="leased_bytes back to the baseline")
