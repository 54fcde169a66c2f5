"""The unary moving retry (gpumemd._channel.MovingRetry, AsyncMovingRetry): which answers are
called again, and a call refused as a moving daemon refuses it (UNAVAILABLE + gpumemd-moving: 1)
sent again to a real gRPC server until it is served."""
import asyncio
import os
from concurrent import futures

import grpc
import pytest

from gpumemd._channel import backoff, is_moving, open_channel, retries, wait_before
from gpumemd._stubs import pb, pb_grpc


def test_only_unavailable_with_the_moving_trailer_is_retried():
    assert is_moving(grpc.StatusCode.UNAVAILABLE, (("gpumemd-moving", "1"),))
    assert not is_moving(grpc.StatusCode.UNAVAILABLE, ())  # a draining daemon
    assert not is_moving(grpc.StatusCode.UNAVAILABLE, None)
    assert not is_moving(grpc.StatusCode.UNAVAILABLE, (("gpumemd-moving", "0"),))
    assert not is_moving(grpc.StatusCode.NOT_FOUND, (("gpumemd-moving", "1"),))


def test_backoff_doubles_from_10_ms_to_100_ms_for_30_s():
    assert [backoff(n) for n in (1, 2, 4, 5, 50)] == [0.01, 0.02, 0.08, 0.1, 0.1]
    moving = (("gpumemd-moving", "1"),)
    assert retries(grpc.StatusCode.UNAVAILABLE, moving, 10, 29.0)
    assert not retries(grpc.StatusCode.UNAVAILABLE, moving, 10, 29.95)


def test_the_first_retry_goes_at_once_when_the_successor_serves_already():
    moved = (("gpumemd-moving", "1"), ("gpumemd-moved", "1"))
    assert wait_before(moved, 1) == 0  # the daemon answered after its successor served
    assert wait_before(moved, 2) == 0.02  # refused again: back to the schedule, no spinning
    assert wait_before((("gpumemd-moving", "1"),), 1) == 0.01  # still handing over: wait
    assert wait_before(None, 1) == 0.01
    assert wait_before((("gpumemd-moving", "1"), ("gpumemd-moved", "0")), 1) == 0.01


class _Allocator(pb_grpc.AllocatorServicer):
    """Refuses the first three CloseSession calls as a moving daemon does, the first two of session
    "moved" as one whose successor serves already; "draining" always."""

    def __init__(self):
        self.calls = 0

    def CloseSession(self, request, context):
        self.calls += 1
        if request.session_id == "draining":
            context.abort(grpc.StatusCode.UNAVAILABLE, "draining")
        if request.session_id == "moved" and self.calls <= 2:  # as the old daemon once its successor serves
            context.set_trailing_metadata((("gpumemd-moving", "1"), ("gpumemd-moved", "1")))
            context.abort(grpc.StatusCode.UNAVAILABLE, "moved")
        if request.session_id != "moved" and self.calls <= 3:
            context.set_trailing_metadata((("gpumemd-moving", "1"),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "moving")
        return pb.CloseSessionResponse(released_leases=self.calls)


@pytest.fixture
def server(tmp_path):
    servicer = _Allocator()
    srv = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_AllocatorServicer_to_server(servicer, srv)
    target = "unix://" + os.path.join(str(tmp_path), "moving.sock")
    srv.add_insecure_port(target)
    srv.start()
    yield target, servicer
    srv.stop(None)


def test_a_call_refused_while_moving_is_served_by_the_next_attempt(server):
    target, servicer = server
    channel = open_channel(target, None)
    try:
        stub = pb_grpc.AllocatorStub(channel)
        assert stub.CloseSession(pb.CloseSessionRequest(session_id="s"), timeout=10).released_leases == 4
        servicer.calls = 0  # refused as moved twice: served by the third attempt
        assert stub.CloseSession(pb.CloseSessionRequest(session_id="moved"), timeout=10).released_leases == 3
        servicer.calls = 100
        with pytest.raises(grpc.RpcError) as e:
            stub.CloseSession(pb.CloseSessionRequest(session_id="draining"), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and servicer.calls == 101  # not retried
    finally:
        channel.close()


def test_the_asyncio_channel_retries_too(server):
    target, servicer = server

    async def main():
        channel = open_channel(target, None, aio=True)
        try:
            stub = pb_grpc.AllocatorStub(channel)
            response = await stub.CloseSession(pb.CloseSessionRequest(session_id="s"), timeout=10)
            assert response.released_leases == 4
            servicer.calls = 0
            response = await stub.CloseSession(pb.CloseSessionRequest(session_id="moved"), timeout=10)
            assert response.released_leases == 3
        finally:
            await channel.close()

    asyncio.run(main())
