"""The client against a daemon whose replies are wrong: a real gRPC server in this process that
answers leases, attaches and lookups with crafted replies, and a real fd channel that sends a
real memfd of a chosen size (``CraftedDaemon``). Every inconsistency fails ``INTERNAL`` with "the
daemon's reply is inconsistent" and the field, before anything is mapped (no segment mapped, no
file touched), and the refused lease or hold is released; consistent replies still work."""
import asyncio
import os
import socket
import struct
import threading
from concurrent import futures

import grpc
import pytest

import gpumemd
import gpumemd.aio
from gpumemd._stubs import pb, pb_grpc

SESSION = "0123456789abcdef0123456789abcdef"
MIB2 = 2 << 20
TOKEN = "0123456789abcdef0123456789abcdef"


class CraftedDaemon(pb_grpc.AllocatorServicer):
    """The Allocator service and an fd channel that say what the test sets: ``reply(device,
    size)`` makes every LeaseResponse (device None and size 0 for attach and lookup); the fd
    channel grants ``grant_bytes`` and sends a memfd of ``file_bytes``. ``released`` records the
    lease ids given back (Release calls and stream release notices)."""

    def __init__(self, directory):
        self.reply = None
        self.grant_bytes = 0
        self.file_bytes = 0
        self.released = []
        self.sent_files = []
        self.socket = os.path.join(directory, "crafted.sock")
        self.fd_socket = self.socket + ".fd"
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_AllocatorServicer_to_server(self, self.server)
        self.server.add_insecure_port("unix://" + self.socket)
        self.server.start()
        self._fd_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._fd_listener.bind(self.fd_socket)
        self._fd_listener.listen(4)
        threading.Thread(target=self._serve_fds, daemon=True).start()

    @property
    def target(self):
        return "unix://" + self.socket

    def reply_with(self, base, **edits):
        """Replies with ``base`` (a LeaseResponse) changed by ``edits``: LeaseResponse fields,
        or ``offset``, ``segment_bytes``, ``host_shm_path`` of its handle."""
        response = pb.LeaseResponse()
        response.CopyFrom(base)
        for name, value in edits.items():
            setattr(response.handle if name in ("offset", "segment_bytes", "host_shm_path") else response, name, value)
        self.reply = lambda device, size: response

    # ------------------------------------------------------------------ gRPC

    def OpenSession(self, request, context):
        # client_cache_bytes 0: no cache tier, so a close is a release this daemon sees
        return pb.OpenSessionResponse(session_id=SESSION, ttl_seconds=60, keepalive_grace_ms=60000,
                                      client_cache_bytes=0)

    def KeepAlive(self, request_iterator, context):
        attached = False
        for message in request_iterator:
            if not attached:
                attached = True
                yield pb.SessionEvent(attached=pb.StreamAttached(session_id=SESSION, applied_messages=0))
            self.released.extend(r.lease_id for r in message.releases)
            for lease in message.leases:
                yield pb.SessionEvent(lease_reply=pb.LeaseReply(
                    request_id=lease.request_id, lease=self.reply(lease.device, lease.size_bytes)))

    def Lease(self, request, context):
        return self.reply(request.device, request.size_bytes)

    def Release(self, request, context):
        self.released.append(request.lease_id)
        return pb.ReleaseResponse()

    def Attach(self, request, context):
        return pb.AttachResponse(lease=self.reply(None, 0), holds=2)

    def Lookup(self, request, context):
        return pb.AttachResponse(lease=self.reply(None, 0), holds=2)

    def CloseSession(self, request, context):
        return pb.CloseSessionResponse()

    # ------------------------------------------------------------------ fd channel

    def _serve_fds(self):
        while True:
            try:
                connection, _ = self._fd_listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._answer_fds, args=(connection,), daemon=True).start()

    def _answer_fds(self, connection):
        with connection:
            while True:
                header = connection.recv(4, socket.MSG_WAITALL)
                if len(header) < 4:
                    return
                request = pb.FdRequest.FromString(connection.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL))
                if request.bind:  # refused, as a daemon from before pushed descriptors refuses it
                    body = pb.FdReply(request_id=request.request_id, refused=pb.FdRefusal(
                        code=5, message="segment 0: the session holds no lease or hold in it")).SerializeToString()
                    connection.sendall(struct.pack(">I", len(body)) + body)
                    continue
                fd = os.memfd_create("crafted-segment")  # a real descriptor of a real file
                try:
                    os.ftruncate(fd, self.file_bytes)
                    self.sent_files.append(self.file_bytes)
                    body = pb.FdReply(request_id=request.request_id, granted=pb.FdGrant(
                        segment_id=request.segment_id, segment_bytes=self.grant_bytes,
                        read_only=request.read_only)).SerializeToString()
                    connection.sendall(struct.pack(">I", len(body)) + body)
                    socket.send_fds(connection, [b"\0"], [fd])
                finally:
                    os.close(fd)  # the peer has a descriptor of its own once it is sent

    def stop(self):
        self.server.stop(None).wait()
        self._fd_listener.close()


@pytest.fixture
def crafted(tmp_path):
    daemon = CraftedDaemon(str(tmp_path))
    yield daemon
    daemon.stop()


@pytest.fixture
def segment_file(tmp_path):
    path = tmp_path / "segment-7"
    path.write_bytes(b"\0" * MIB2)
    return str(path)


def path_lease(lease_id, segment_file):
    """A consistent reply: 4096 bytes asked, a 4096-byte block at 8192 of the 2 MiB path segment."""
    return pb.LeaseResponse(lease_id=lease_id, device=0, size_bytes=4096, block_bytes=4096, handle=pb.MemoryHandle(
        segment_id=7, segment_bytes=MIB2, offset=8192, host_shm_path=segment_file))


def fd_lease(lease_id, crafted):
    """The same on a segment passed by descriptor through the crafted fd channel."""
    return pb.LeaseResponse(lease_id=lease_id, device=0, size_bytes=4096, block_bytes=4096, handle=pb.MemoryHandle(
        segment_id=9, segment_bytes=MIB2, offset=8192, fd_segment=pb.FdSegment(fd_socket=crafted.fd_socket)))


def assert_refused(error, crafted, client, lease_id, field):
    assert error.code == grpc.StatusCode.INTERNAL, error
    assert error.message.startswith("the daemon's reply is inconsistent: "), error.message
    assert field in error.message, error.message
    assert client.stats().mapped_segments == 0, "nothing mapped"
    assert lease_id in crafted.released, "the refused lease is given back: %s" % crafted.released


INCONSISTENT_LEASES = [
    ("offset + block_bytes = 2093056 + 8192 runs past segment_bytes 2097152",
     dict(block_bytes=8192, offset=MIB2 - 4096)),
    ("runs past segment_bytes", dict(offset=(1 << 63) - 100, segment_bytes=(1 << 63) - 1)),
    ("block_bytes 2048 is smaller than size_bytes 4096", dict(block_bytes=2048)),
    ("size_bytes 8192 (expected: 4096, the size asked)", dict(size_bytes=8192, block_bytes=8192)),
    ("device 1 (expected: 0, the device asked)", dict(device=1)),
    ("offset -4096 (expected: >= 0)", dict(offset=-4096)),
    ("segment_bytes 0 (expected: > 0)", dict(segment_bytes=0, offset=0)),
]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
@pytest.mark.parametrize("field, edits", INCONSISTENT_LEASES, ids=[f for f, _ in INCONSISTENT_LEASES])
def test_inconsistent_lease_is_internal_and_released_unmapped(crafted, segment_file, stream, field, edits):
    crafted.reply_with(path_lease("bad", segment_file), **edits)
    with gpumemd.connect(crafted.target, stream=stream) as client:
        with pytest.raises(gpumemd.GpumemdError) as raised:
            client.lease(0, 4096)
        assert_refused(raised.value, crafted, client, "bad", field)
        assert client.stats().maps_opened == 0, "no mapping was ever opened"


def test_inconsistent_hold_is_internal_and_released(crafted, segment_file):
    crafted.reply_with(path_lease("hold", segment_file), offset=MIB2 - 1024)
    with gpumemd.connect(crafted.target) as client:
        with pytest.raises(gpumemd.GpumemdError) as raised:
            client.attach(TOKEN)
        assert_refused(raised.value, crafted, client, "hold", "hold hold (segment 7): offset + block_bytes")
        crafted.released.clear()
        with pytest.raises(gpumemd.GpumemdError) as raised:
            client.lookup("weights")
        assert_refused(raised.value, crafted, client, "hold", "offset + block_bytes")


def test_segment_file_smaller_than_the_reply_says_is_internal(crafted, tmp_path):
    small = tmp_path / "small"
    small.write_bytes(b"\0" * 4096)
    crafted.reply_with(path_lease("bad", str(small)))
    with gpumemd.connect(crafted.target) as client:
        with pytest.raises(gpumemd.GpumemdError) as raised:
            client.lease(0, 4096)
        assert_refused(raised.value, crafted, client, "bad", "host segment file %s is 4096 bytes, the lease's reply "
                       "says segment_bytes 2097152" % small)
    assert small.stat().st_size == 4096


@pytest.mark.parametrize("file_bytes", [4096, 2 * MIB2], ids=["smaller", "larger"])
def test_descriptor_of_another_size_than_its_grant_is_internal_before_mapping(crafted, file_bytes):
    crafted.grant_bytes = MIB2
    crafted.file_bytes = file_bytes  # smaller: the block at 8192 would be past the file's end (SIGBUS)
    crafted.reply_with(fd_lease("bad", crafted))
    with gpumemd.connect(crafted.target) as client:
        with pytest.raises(gpumemd.GpumemdError) as raised:
            client.lease(0, 4096)
        assert_refused(raised.value, crafted, client, "bad", "the descriptor of segment 9 (fstat) is %d bytes, the fd "
                       "channel's grant says segment_bytes 2097152" % file_bytes)
    assert crafted.sent_files == [file_bytes], "a real descriptor came, and was refused"


def test_grant_other_than_the_lease_reply_is_internal(crafted):
    crafted.grant_bytes = crafted.file_bytes = 4 * MIB2
    crafted.reply_with(fd_lease("bad", crafted))
    with gpumemd.connect(crafted.target) as client:
        with pytest.raises(gpumemd.GpumemdError) as raised:
            client.lease(0, 4096)
        assert_refused(raised.value, crafted, client, "bad", "segment 9: the fd channel's grant says segment_bytes "
                       "8388608, the lease's reply 2097152")


def test_a_mapped_segment_claimed_larger_is_internal(crafted, segment_file):
    crafted.reply_with(path_lease("good", segment_file))
    with gpumemd.connect(crafted.target) as client:
        with client.lease(0, 4096) as good:
            # the next reply says the same segment is 4 MiB, and places the block past the 2 MiB mapped
            crafted.reply_with(path_lease("bad", segment_file), segment_bytes=2 * MIB2, offset=MIB2 + 4096)
            with pytest.raises(gpumemd.GpumemdError) as raised:
                client.lease(0, 4096)
            assert raised.value.code == grpc.StatusCode.INTERNAL
            assert ("segment 7 is mapped here with segment_bytes 2097152, this reply says 4194304"
                    in raised.value.message), raised.value.message
            assert "bad" in crafted.released
            assert client.stats().mapped_segments == 1, "the good lease's mapping stays"
            good.buffer()[:4] = b"good"
            assert bytes(good.buffer()[:4]) == b"good"


def test_consistent_replies_still_work_by_path_and_by_descriptor(crafted, segment_file):
    with gpumemd.connect(crafted.target) as client:
        crafted.reply_with(path_lease("path", segment_file))
        with client.lease(0, 4096) as lease:
            assert len(lease.buffer()) == 4096
            lease.buffer()[4092:] = b"last"
        with open(segment_file, "rb") as f:
            f.seek(8192 + 4092)
            assert f.read(4) == b"last", "the block is at its offset in the segment file"
        crafted.grant_bytes = crafted.file_bytes = MIB2
        crafted.reply_with(fd_lease("fd", crafted))
        with client.lease(0, 4096) as lease:
            lease.buffer()[:2] = b"fd"
            assert bytes(lease.buffer()[:2]) == b"fd"
        # a hold names the size of the lease it holds, which no one asked here
        crafted.reply_with(path_lease("hold", segment_file), size_bytes=3000)
        with client.attach(TOKEN) as hold:
            assert len(hold.buffer()) == 3000


def test_asyncio_client_checks_before_fetching_a_descriptor(crafted, segment_file):
    async def run():
        client = await gpumemd.aio.connect(crafted.target)
        try:
            crafted.grant_bytes = crafted.file_bytes = MIB2
            crafted.reply_with(fd_lease("bad", crafted), offset=MIB2)
            with pytest.raises(gpumemd.GpumemdError) as raised:
                await client.lease(0, 4096)
            assert "offset + block_bytes = 2097152 + 4096 runs past segment_bytes 2097152" in raised.value.message
            assert crafted.sent_files == [], "no descriptor fetched for a reply refused before"
            crafted.reply_with(fd_lease("hold", crafted), block_bytes=MIB2)
            with pytest.raises(gpumemd.GpumemdError) as raised:
                await client.attach(TOKEN)
            assert raised.value.code == grpc.StatusCode.INTERNAL
            assert "hold hold (segment 9): offset + block_bytes = 8192 + 2097152" in raised.value.message
            crafted.file_bytes = 4096
            crafted.reply_with(fd_lease("small", crafted))
            with pytest.raises(gpumemd.GpumemdError) as raised:
                await client.lease(0, 4096)
            assert "(fstat) is 4096 bytes" in raised.value.message
            assert client.stats().mapped_segments == 0
        finally:
            await client.close()  # waits for the releases it sent as tasks
        assert {"bad", "hold", "small"} <= set(crafted.released), crafted.released

    asyncio.run(run())
