"""The connection to a daemon's successor made before a take-over's pause (gpumemd._successor),
sync and asyncio, against two real gRPC servers on Unix sockets in this process: the "old daemon"
at the target's socket sends the successor's socket name, then its MovingNotice, and ends the
stream; the "successor" listens on the named socket beside it. The target's socket is never
renamed here, so a stream the successor sees can only have come over the spare connection; one
that reattaches over the client's own channel reaches the old daemon again."""
import asyncio
import collections
import logging
import os
import queue
import threading
import time
from concurrent import futures

import grpc
import pytest

import gpumemd
from gpumemd import aio
from gpumemd._stubs import pb, pb_grpc
from gpumemd._successor import is_socket_file_name, socket_directory

SESSION = "5e55" * 8
BREAK = object()


class _Daemon(pb_grpc.AllocatorServicer):
    """Opens one session; each KeepAlive attaches it, then sends what the test puts in ``events``
    until None (the stream ends with OK), BREAK (it fails UNAVAILABLE, as when a daemon dies) or
    the client goes. Counts the streams it saw."""

    def __init__(self):
        self.streams = 0
        self.events = queue.Queue()

    def OpenSession(self, request, context):
        return pb.OpenSessionResponse(session_id=SESSION, keepalive_grace_ms=5000)

    def CloseSession(self, request, context):
        return pb.CloseSessionResponse()

    def KeepAlive(self, request_iterator, context):
        next(request_iterator)
        self.streams += 1
        half_closed = threading.Event()  # the client's close ends its side: end ours then

        def drain():
            try:
                collections.deque(request_iterator, 0)
            except grpc.RpcError:
                pass  # cancelled by the client
            half_closed.set()

        threading.Thread(target=drain, daemon=True).start()
        yield pb.SessionEvent(attached=pb.StreamAttached())
        while context.is_active() and not half_closed.is_set():
            try:
                event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if event is None:
                return
            if event is BREAK:
                context.abort(grpc.StatusCode.UNAVAILABLE, "gone")
            yield event


def _serve(path):
    daemon = _Daemon()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_AllocatorServicer_to_server(daemon, server)
    server.add_insecure_port("unix://" + path)
    server.start()
    return daemon, server


@pytest.fixture
def daemons(tmp_path):
    old, old_server = _serve(str(tmp_path / "gpumemd.sock"))
    new, new_server = _serve(str(tmp_path / "gpumemd.sock.new-4242"))
    yield "unix://" + str(tmp_path / "gpumemd.sock"), old, new
    old_server.stop(None)
    new_server.stop(None)


def _await(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _move(old, name, client=None):
    """The old daemon names its successor (or, with an empty name, says it went away), waits for
    the client's spare to connect when given the client, then moves."""
    old.events.put(pb.SessionEvent(successor=pb.SuccessorNotice(socket_name=name)))
    if client is not None:
        _await(client._successors.ready, "the spare did not connect")
    old.events.put(pb.SessionEvent(moving=pb.MovingNotice()))
    old.events.put(None)


def test_names_a_successor_may_have():
    assert is_socket_file_name("gpumemd.sock.new-4242")
    for bad in ("", ".", "..", "a/b", "/abs", "sp ace", "tab\t", "é", "x" * 256):
        assert not is_socket_file_name(bad), bad
    assert is_socket_file_name("x" * 255)
    assert socket_directory("unix:///run/gpumemd/gpumemd.sock", None) == "/run/gpumemd"
    assert socket_directory("unix:/run/g.sock", None) == "/run"
    assert socket_directory("unix:g.sock", None) == "."
    assert socket_directory("localhost:7070", None) is None
    assert socket_directory("unix:///run/g.sock", object()) is None  # TLS: no spare


def test_the_stream_moves_over_the_connection_made_before_the_pause(daemons, caplog):
    target, old, new = daemons
    caplog.set_level(logging.INFO, logger="gpumemd")
    with gpumemd.connect(target, client_cache_bytes=0) as client:
        _await(lambda: old.streams == 1, "the stream attached to the old daemon")
        _move(old, "gpumemd.sock.new-4242", client)
        _await(lambda: new.streams == 1, "the stream did not reattach to the successor")
        assert old.streams == 1, "the stream went back to the old daemon"
        assert "reattaches over the connection made to it before the pause" in caplog.text

        # The successor's stream breaks without a move (as when it dies): the client's own channel
        # serves the next stream, and the spare is let go.
        new.events.put(BREAK)
        _await(lambda: old.streams == 2, "the stream did not return to the client's channel")
        assert new.streams == 1
        assert client._successors._stream is None


def test_a_successor_that_went_away_is_let_go_and_the_move_uses_the_clients_channel(daemons):
    target, old, new = daemons
    with gpumemd.connect(target, client_cache_bytes=0) as client:
        _await(lambda: old.streams == 1, "the stream attached to the old daemon")
        old.events.put(pb.SessionEvent(successor=pb.SuccessorNotice(socket_name="gpumemd.sock.new-4242")))
        _await(client._successors.ready, "the spare did not connect")
        # An empty name: that successor went away without taking over (its hand-over was given up).
        _move(old, "")
        _await(lambda: old.streams == 2, "the stream did not reattach over the client's channel")
        assert new.streams == 0, "the stream went to the successor that went away"


@pytest.mark.parametrize("name", ["../gpumemd.sock.new-4242", "gpumemd.sock.new-9999"])
def test_a_name_with_a_slash_or_no_socket_leaves_the_move_to_the_clients_channel(daemons, caplog, name):
    target, old, new = daemons
    caplog.set_level(logging.INFO, logger="gpumemd")
    with gpumemd.connect(target, client_cache_bytes=0) as client:
        _await(lambda: old.streams == 1, "the stream attached to the old daemon")
        _move(old, name)
        _await(lambda: old.streams == 2, "the stream did not reattach over the client's channel")
        assert new.streams == 0
        assert "reattaches over the connection" not in caplog.text


def test_the_asyncio_client_moves_over_the_spare_too(daemons, caplog):
    target, old, new = daemons
    caplog.set_level(logging.INFO, logger="gpumemd")

    async def main():
        client = await aio.connect(target, client_cache_bytes=0)
        try:
            await _async_await(lambda: old.streams == 1, "the stream attached to the old daemon")
            old.events.put(pb.SessionEvent(successor=pb.SuccessorNotice(socket_name="gpumemd.sock.new-4242")))
            await _async_await(client._successors.ready, "the spare did not connect")
            old.events.put(pb.SessionEvent(moving=pb.MovingNotice()))
            old.events.put(None)
            await _async_await(lambda: new.streams == 1, "the stream did not reattach to the successor")
            assert old.streams == 1
        finally:
            await client.close()
        assert client._successors._stream is None and client._successors._spare is None

    asyncio.run(main())
    assert "reattaches over the connection made to it before the pause" in caplog.text


async def _async_await(condition, what, timeout=10):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)
