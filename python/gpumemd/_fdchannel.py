"""The fd channel: segments fetched from the daemon as file descriptors (``--host-segments fd``,
and CUDA VMM segments, ``--cuda-handles vmm``).

A lease on such a segment carries ``MemoryHandle.fd_segment`` (host) or ``cuda_vmm`` (a CUDA VMM
allocation, imported by :mod:`gpumemd._cuda`) instead of a path or IPC handle: the client asks
the daemon's fd channel, a Unix socket of its own next to the gRPC socket, for the segment's
descriptor once per segment and process, maps it and closes it (the mapping stays valid, also
after the daemon is gone). The protocol is documented with its messages in ``gpumemd.proto``
(FdRequest): frames of a 4-byte big-endian length and a message; after a reply that grants a
descriptor, one byte carries it (``SCM_RIGHTS``). Every read is a ``recvmsg`` with room for one
descriptor (a plain read of that byte would make the kernel close it), and the kernel ends a
receive with the byte that carried descriptors: most often one call brings a reply, its byte
and its descriptor, and what came after a reply waits in the connection's buffer.

The framing and the meaning of replies are functions without I/O (:func:`request_frame`,
:func:`granted`), shared by the sync and asyncio clients; :class:`FdChannel` is the blocking
connection both use (the asyncio client calls it from an executor thread), and
:class:`FdChannels` the client's one connection to whichever fd channel its handles name.

Pushed descriptors (see "Pushed descriptors" in ``gpumemd.proto``): a session's first fetch on a
connection binds the session there, in the same send; from then on the daemon pushes each segment
new to the session before the Lease reply that names it. A fetch therefore first reads what
already waits on the connection (without waiting) and takes the pushed descriptor, asking only
when none is there. A daemon that refuses the bind (one from before pushes) is asked for every
segment. ``GPUMEMD_FD_PUSH=0`` in the environment turns binding off (to compare both).

Thread-safe: one request at a time per :class:`FdChannel` (a lock); the daemon answers in order.
"""
import collections
import itertools
import os
import select
import socket
import struct
import threading

import grpc
from google.protobuf.message import DecodeError

from ._errors import GpumemdError, _CODES
from ._stubs import pb

_LENGTH = struct.Struct(">I")
MAX_REPLY_BYTES = 1 << 16  # an FdReply is under 300 bytes; anything longer is not the daemon


def socket_path(target, fd_socket):
    """Where to reach the fd channel the daemon names (``FdSegment.fd_socket``), seen from a
    client of ``target``: that path where it exists; else, for a ``unix:`` target (a container
    that mounts the socket directory elsewhere), the same file name next to the gRPC socket."""
    if os.path.exists(fd_socket) or not target.startswith("unix:"):
        return fd_socket
    own = target[len("unix://"):] if target.startswith("unix://") else target[len("unix:"):]
    return os.path.join(os.path.dirname(own), os.path.basename(fd_socket))


_ONE_FD = socket.CMSG_SPACE(4)  # room for one descriptor in a receive
MAX_PUSHED_KEPT = 16  # pushed descriptors not taken (a segment mapped already): the oldest is closed


def request_frame(request_id, session_id, segment_id, read_only, bind=False):
    """The bytes of one FdRequest frame (with ``bind``, the bind of ``session_id``)."""
    body = pb.FdRequest(request_id=request_id, session_id=session_id, segment_id=segment_id,
                        read_only=bool(read_only), bind=bool(bind)).SerializeToString()
    return _LENGTH.pack(len(body)) + body


def granted(reply, request_id, segment_id, fds):
    """The FdGrant of a reply that came with ``fds`` (the descriptors received after it);
    raises :class:`GpumemdError` for a refusal (the daemon's code and message) or a reply
    that does not answer the request. Closes ``fds`` whenever it raises."""
    try:
        if reply.request_id != request_id:
            raise GpumemdError(grpc.StatusCode.INTERNAL, "fd channel: a reply to request %d came for request %d"
                               % (reply.request_id, request_id))
        if reply.WhichOneof("result") == "refused":
            raise GpumemdError(_CODES.get(reply.refused.code, grpc.StatusCode.UNKNOWN), reply.refused.message)
        if reply.WhichOneof("result") != "granted" or len(fds) != 1 or reply.granted.segment_id != segment_id:
            raise GpumemdError(grpc.StatusCode.INTERNAL, "fd channel: the daemon's reply for segment %d carried %d "
                               "descriptor(s) and %s" % (segment_id, len(fds), reply.WhichOneof("result")))
        return reply.granted
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


class Descriptor:
    """A descriptor fetched from the fd channel and its FdGrant; closed by :meth:`close` unless
    taken (:meth:`take`) by whoever maps it."""

    __slots__ = ("fd", "grant")

    def __init__(self, fd, grant):
        self.fd = fd
        self.grant = grant

    def take(self):
        fd, self.fd = self.fd, None
        return fd

    def close(self):
        fd = self.take()
        if fd is not None:
            os.close(fd)


class FdChannel:
    """A connection to the daemon's fd channel at ``path``, opened on first use and again after
    it broke (a daemon restart, or the daemon closing it)."""

    def __init__(self, path, timeout):
        self.path = path
        self._timeout = timeout
        self._lock = threading.Lock()
        self._sock = None
        self._ids = itertools.count(1)
        self.fetched = 0  # descriptors handed out (asked for or pushed)
        self.pushed = 0  # of them, those pushed
        self._bind = os.environ.get("GPUMEMD_FD_PUSH", "1") != "0"
        self._bound = {}  # this connection's bound sessions: bind request id -> session id
        self._bind_refused = False  # this connection's daemon pushes nothing
        self._kept = collections.OrderedDict()  # (session id, segment id) -> pushed Descriptor
        self._received = b""  # bytes received and not read yet
        self._fd = None  # the descriptor that came with the last byte of _received, not handed out

    def fetch(self, session_id, segment_id, read_only):
        """A :class:`Descriptor` of the segment, the caller's to close. Raises
        :class:`GpumemdError`: the daemon's refusal, or UNAVAILABLE when the channel cannot be
        reached."""
        with self._lock:
            return self._fetch(session_id, segment_id, read_only)

    def take_pushed(self, session_id, segment_id, read_only):
        """The descriptor pushed for the segment and session if it is here or waits on the
        connection (without waiting for more), else None."""
        with self._lock:
            try:
                descriptor = self._take_pushed(session_id, segment_id, read_only)
            except OSError:
                self._drop()  # the fetch that follows connects again
                return None
            if descriptor is not None:
                self.fetched += 1
                self.pushed += 1
            return descriptor

    def _fetch(self, session_id, segment_id, read_only):
        for attempt in (1, 2):
            try:
                descriptor = self._take_pushed(session_id, segment_id, read_only)
                if descriptor is not None:
                    self.fetched += 1
                    self.pushed += 1
                    return descriptor
                if self._sock is None:
                    self._sock = self._connect()
                frames = b""
                bind_id = 0
                if self._bind and not self._bind_refused and session_id not in self._bound.values():
                    bind_id = next(self._ids)  # bound in the same send as the request
                    frames = request_frame(bind_id, session_id, 0, False, bind=True)
                request_id = next(self._ids)
                self._sock.sendall(frames + request_frame(request_id, session_id, segment_id, read_only))
                if bind_id:
                    self._receive_bound(bind_id, session_id)
                reply, fds = self._receive_reply()
            except OSError as e:
                self._drop()
                if attempt == 2:
                    raise GpumemdError(grpc.StatusCode.UNAVAILABLE, "cannot fetch segment %d from the fd channel "
                                       "%s: %s" % (segment_id, self.path, e)) from None
                continue  # a connection the daemon closed (restart, idle): once more on a new one
            grant = granted(reply, request_id, segment_id, fds)
            self.fetched += 1
            return Descriptor(fds[0], grant)

    def _connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(self._timeout)
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    def _receive_reply(self):
        """The next reply that answers a request, keeping the pushed ones before it."""
        while True:
            reply, fds = self._receive()
            if not reply.pushed:
                return reply, fds
            self._keep(reply, fds)

    def _receive_bound(self, bind_id, session_id):
        """The answer to a bind: bound, or refused by a daemon that pushes nothing (one from before
        pushes reads a bind as a request for segment 0), which this connection asks no more."""
        reply, fds = self._receive_reply()
        for fd in fds:  # an answer of a daemon that does not know binds
            os.close(fd)
        if reply.request_id != bind_id:
            raise ConnectionResetError("the answer to bind request %d came for request %d"
                                       % (bind_id, reply.request_id))
        if reply.WhichOneof("result") == "bound":
            self._bound[bind_id] = session_id
        else:
            self._bind_refused = True

    def _take_pushed(self, session_id, segment_id, read_only):
        """Reads the pushed replies waiting on the connection, without waiting for more, and takes
        the one for the segment and session (a read-only one serves any mapping, a writable one a
        writable mapping), or None."""
        key = (session_id, segment_id)
        while key not in self._kept and self._sock is not None and self._bound and (
                self._received or select.select([self._sock], [], [], 0)[0]):
            reply, fds = self._receive()
            if not reply.pushed:
                for fd in fds:
                    os.close(fd)
                raise ConnectionResetError("a reply to request %d, which was not asked" % reply.request_id)
            self._keep(reply, fds)  # pushes after the one for this segment wait for the next fetch
        descriptor = self._kept.get(key)
        if descriptor is None or (read_only and not descriptor.grant.read_only):
            return None
        del self._kept[key]
        return descriptor

    def _keep(self, reply, fds):
        """Keeps a pushed descriptor under the session whose bind its reply names; closes any other."""
        session_id = self._bound.get(reply.request_id)
        if session_id is None or len(fds) != 1 or reply.WhichOneof("result") != "granted":
            for fd in fds:
                os.close(fd)
            return
        key = (session_id, reply.granted.segment_id)
        before = self._kept.pop(key, None)
        if before is not None:
            before.close()
        self._kept[key] = Descriptor(fds[0], reply.granted)
        while len(self._kept) > MAX_PUSHED_KEPT:
            self._kept.popitem(last=False)[1].close()

    def _receive(self):
        """One reply, and the descriptors that came with it: its frame, then for a grant the
        byte that carries its descriptor."""
        self._fill(4)
        (length,) = _LENGTH.unpack_from(self._received)
        if length > MAX_REPLY_BYTES:
            raise OSError("a reply frame of %d bytes" % length)
        self._fill(4 + length)
        try:
            reply = pb.FdReply.FromString(self._received[4:4 + length])
        except DecodeError as e:
            raise OSError("a reply that is not an FdReply: %s" % e) from None
        self._received = self._received[4 + length:]
        if reply.WhichOneof("result") != "granted":
            if self._fd is not None and not self._received:
                raise ConnectionResetError("a descriptor came where the protocol has none")
            return reply, []
        self._fill(1)
        if self._fd is None or len(self._received) != 1:
            raise ConnectionResetError("the daemon's granted reply came without its descriptor")
        fd, self._fd, self._received = self._fd, None, b""
        return reply, [fd]

    def _fill(self, n):
        """Receives until ``n`` bytes wait in ``_received``. A descriptor always came with the
        last byte received (the kernel ends a receive there): one that would have to be read past
        is out of the protocol, as is any beyond the first."""
        while len(self._received) < n:
            if self._fd is not None:
                raise ConnectionResetError("a descriptor came where the protocol has none")
            data, ancillary, flags, _ = self._sock.recvmsg(4096, _ONE_FD)
            fds = []
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.extend(struct.unpack("%di" % (len(payload) // 4), payload[:len(payload) // 4 * 4]))
            if fds:
                self._fd = fds[0]
            for fd in fds[1:]:
                os.close(fd)
            if len(fds) > 1 or flags & socket.MSG_CTRUNC:
                raise ConnectionResetError("a descriptor came where the protocol has none")
            if not data:
                raise ConnectionResetError("the daemon closed the fd channel in the middle of a reply")
            self._received += data

    def _drop(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._received = b""
        self._bound.clear()  # a new connection binds again, and asks its daemon again
        self._bind_refused = False

    def close(self):
        with self._lock:
            self._drop()
            for descriptor in self._kept.values():
                descriptor.close()
            self._kept.clear()


class FdChannels:
    """A client's connection to the fd channel its handles name (``FdSegment.fd_socket``, seen
    from ``target``: :func:`socket_path`): one at a time, made on the first segment passed by
    descriptor, replaced when a handle names another socket, closed with the client."""

    def __init__(self, target, timeout):
        self._target = target
        self._timeout = timeout
        self._lock = threading.Lock()
        self._channel = None

    def fetch(self, session_id, handle, read_only):
        """A :class:`Descriptor` of the handle's segment for ``session_id`` (blocking)."""
        channel = self._channel
        if channel is not None:
            # A descriptor pushed before the Lease reply is taken before the socket's path is
            # looked at (a stat): it is of the segment and session, whichever socket is named.
            descriptor = channel.take_pushed(session_id, handle.segment_id, read_only)
            if descriptor is not None:
                return descriptor
        segment = getattr(handle, handle.WhichOneof("kind"))  # fd_segment or cuda_vmm: an FdSegment
        path = socket_path(self._target, segment.fd_socket)
        with self._lock:
            channel = self._channel
            if channel is None or channel.path != path:
                if channel is not None:
                    channel.close()
                channel = self._channel = FdChannel(path, self._timeout)
        return channel.fetch(session_id, handle.segment_id, read_only)

    @property
    def fetched(self):
        """Descriptors handed out on the current connection's channel (for tests)."""
        return 0 if self._channel is None else self._channel.fetched

    @property
    def pushed(self):
        """Of :attr:`fetched`, those pushed before their Lease replies (for tests)."""
        return 0 if self._channel is None else self._channel.pushed

    def close(self):
        with self._lock:
            if self._channel is not None:
                self._channel.close()
