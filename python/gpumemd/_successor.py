"""The connection a client makes to its daemon's successor before a take-over's pause
(``gpumemd --take-over``), for the sync and the asyncio client alike.

Once a successor's Hello is accepted, the daemon names on every attached KeepAlive stream the Unix
socket that successor listens on until it serves (``SessionEvent.successor``). The client connects
a spare channel there at once, while the old daemon still serves, so that at the MovingNotice its
session reattaches over a connection already made instead of opening one inside the pause (the
Java client's ``MovingChannel`` does the same). Only the KeepAlive stream moves to the spare: in
stream mode it carries every lease and release; the few unary calls stay on the client's channel,
whose moving retry (:mod:`gpumemd._channel`) waits for the successor behind the same address.

A channel cannot be closed under a live call (gRPC Python cancels it), so the stream keeps the
spare until it ends; the next reattach then retires it (to the spare of the next take-over, or
back to the client's channel). Without a spare, or one that did not connect in time, the stream
reattaches over the client's channel, as before.

Thread-safety: a lock guards the spare and the stream's channel; the sync client calls in from its
KeepAlive threads, the asyncio client from its event loop (the lock is never held across I/O).
"""
import os
import threading

import grpc

from ._channel import OPTIONS
from ._stubs import pb_grpc

MAX_NAME_BYTES = 255


def is_socket_file_name(name):
    """Whether ``name`` is a plain file name, to be looked for beside the target's socket: one path
    element, not ``.`` or ``..``, of printable ASCII, at most 255 bytes (the daemon checks the same
    before it passes a successor's name on: ``UnixSockets.isSocketFileName``)."""
    return (0 < len(name) <= MAX_NAME_BYTES and name not in (".", "..")
            and all(0x20 < ord(c) < 0x7f and c != "/" for c in name))


def socket_directory(target, credentials):
    """The directory of a plaintext ``unix:`` target's socket, where a successor's socket is
    looked for; None for TCP or TLS (no spare then)."""
    if credentials is not None or not target.startswith("unix:"):
        return None
    own = target[len("unix://"):] if target.startswith("unix://") else target[len("unix:"):]
    return os.path.dirname(own) or "."


class _Spare:
    """One channel to a successor's socket, and how to tell whether it connected."""

    def __init__(self, path, aio):
        self.aio = aio
        if aio:
            self.channel = grpc.aio.insecure_channel("unix:" + path, options=OPTIONS)
            self.channel.get_state(try_to_connect=True)
            self._ready = None
        else:
            self.channel = grpc.insecure_channel("unix:" + path, options=OPTIONS)
            self._ready = grpc.channel_ready_future(self.channel)  # connects now, in the background
        self.stub = pb_grpc.AllocatorStub(self.channel)

    def connected(self):
        if self.aio:
            return self.channel.get_state() == grpc.ChannelConnectivity.READY
        return self._ready.done() and not self._ready.cancelled()


class Successors:
    """The spare channel a client connects to its daemon's announced successor, and the channel
    its KeepAlive stream runs on. The caller closes the channels this hands back (no stream runs
    on them) in its own way, ``close()`` or, for asyncio, ``await close()``."""

    def __init__(self, directory, aio):
        self._directory = directory
        self._aio = aio
        self._lock = threading.Lock()
        self._spare = None   # connected, or connecting, to the announced successor; not used yet
        self._stream = None  # the spare the stream moved to, until the stream leaves it
        self._closed = False

    def successor_at(self, name):
        """The daemon named its successor's socket: connect a spare to it, beside the target's own
        socket (mounts may name the directory differently). A name that is not a plain file name,
        or no socket there, is ignored. An empty name: the successor went away, and the spare is
        let go (its channel would retry a socket that is gone). Returns the channels to close now:
        an earlier spare, unused, or the one let go."""
        if self._directory is None or not (name == "" or is_socket_file_name(name)):
            return []
        path = os.path.join(self._directory, name) if name else None
        if path is not None and not os.path.exists(path):
            return []
        with self._lock:  # making a channel only starts its connect: nothing here waits
            if self._closed:
                return []
            old = self._spare
            self._spare = None if path is None else _Spare(path, self._aio)
        return [] if old is None else [old.channel]

    def ready(self):
        """Whether a spare is connected now (the stream would move to it at a MovingNotice)."""
        with self._lock:
            return self._spare is not None and self._spare.connected()

    def stream_stub(self, stub, moving):
        """The stub to open the next KeepAlive stream on, and the channels to close now (their
        streams have ended): the connected spare after the daemon said it is moving, else ``stub``,
        the client's own. Returns (stub, retired channels)."""
        retired = []
        with self._lock:
            spare, self._spare = self._spare, None
            use = moving and spare is not None and spare.connected()
            if spare is not None and not use:
                retired.append(spare.channel)  # not connected: the client's channel serves
            if self._stream is not None:
                retired.append(self._stream.channel)
            self._stream = spare if use else None
        return (spare.stub if use else stub), retired

    def close(self):
        """The client closes: returns every channel still held, to close."""
        with self._lock:
            self._closed = True
            held = [x.channel for x in (self._spare, self._stream) if x is not None]
            self._spare = self._stream = None
        return held
