"""Unit tests of gpumemd._session, the I/O-free session core (no daemon)."""
import grpc
import pytest

from gpumemd import GpumemdError
from gpumemd._session import (END, FLUSH, MAX_NOTICES, ClientCore, Reopening, SessionState, is_empty,
                              keepalive_message, reattach_delay)
from gpumemd._stubs import pb


class _Queue:
    def __init__(self):
        self.items = []

    def put_nowait(self, item):
        self.items.append(item)


class _Event:
    def __init__(self):
        self.is_set = False

    def set(self):
        self.is_set = True


class _Session(SessionState):
    def __init__(self, client, opened, generation):
        super().__init__(client, opened, generation, _Queue(), _Event())


class _Waiter:
    def __init__(self, done=False):
        self.done = done
        self.result = None

    def settle(self, result):
        if self.done:
            return False
        self.done, self.result = True, result
        return True


class _Client(ClientCore):
    _session_class = _Session

    def __init__(self):
        super().__init__("unix:///nowhere", "unit", True, None, ())
        self._shutdown_event = _Event()
        self._s = _Session(self, pb.OpenSessionResponse(session_id="s1", keepalive_grace_ms=1000), 1)


def _reply(request_id, lease_id=None):
    if lease_id is None:
        return pb.SessionEvent(lease_reply=pb.LeaseReply(
            request_id=request_id, error=pb.StreamError(code=8, message="full")))
    return pb.SessionEvent(lease_reply=pb.LeaseReply(request_id=request_id,
                                                           lease=pb.LeaseResponse(lease_id=lease_id)))


def test_reopening_backs_off_doubling_up_to_the_deadline():
    r = Reopening(100.0, 10.0)
    assert r.call_timeout(100.0) == 5.0 and r.call_timeout(109.95) == 0.1
    now, delays = 100.0, []
    while True:
        delay = r.next_delay(now)
        if delay is None:
            break
        delays.append(delay)
        now += delay
    assert delays[:6] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6] and set(delays[6:]) == {2.0}
    assert now <= 110.0
    assert r.error(closing=True).code == grpc.StatusCode.FAILED_PRECONDITION
    r.last = GpumemdError(grpc.StatusCode.UNAVAILABLE, "refused")
    error = r.error(closing=False)
    assert error.code == grpc.StatusCode.UNAVAILABLE and "session lost" in error.message and "refused" in error.message


def test_keepalive_message_merges_notices_until_end_or_empty():
    items = [pb.StreamLease(request_id=7), ("unmapped", 5), END, pb.StreamRelease(lease_id="9")]
    message, end, more = keepalive_message(pb.StreamRelease(lease_id="3"), lambda: items.pop(0))
    assert end and not more and [r.lease_id for r in message.releases] == ["3"]
    assert [r.request_id for r in message.leases] == [7] and list(message.unmapped_segment_ids) == [5]
    message, end, more = keepalive_message(("unmapped", 1), lambda: None)
    assert not end and list(message.unmapped_segment_ids) == [1]
    message, end, more = keepalive_message(("unmapped", 0), lambda: ("unmapped", 0))
    assert not end and len(message.unmapped_segment_ids) == MAX_NOTICES


def test_keepalive_message_carries_the_tiers_pending_notices_and_ends_after_them():
    client = _Client()
    s = client._s
    s.cache.release("r1")
    message, end, more = keepalive_message(END, lambda: None, s.cache)
    assert end and not more and [r.lease_id for r in message.releases] == ["r1"]
    message, end, more = keepalive_message(FLUSH, lambda: None, s.cache)
    assert is_empty(message) and not end  # nothing left: the client sends nothing


def test_lease_replies_settle_waiters_and_orphans_are_given_back():
    client = _Client()
    s = client._s
    granted, refused, gave_up = _Waiter(), _Waiter(), _Waiter(done=True)
    s.pending.update({1: granted, 2: refused, 3: gave_up})
    for event in (_reply(1, "a"), _reply(2), _reply(3, "c"), _reply(4, "d")):
        assert client._take_event(s, event) is False
    assert granted.result.lease_id == "a"
    assert isinstance(refused.result, GpumemdError) and refused.result.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    message = pb.KeepAliveRequest()
    s.cache.fill(message, 100)
    assert [r.lease_id for r in message.releases] == ["c", "d"] and s.pending == {}
    assert s.queue.items == [FLUSH]  # one wake for both


def test_shutdown_and_release_failed_events():
    client = _Client()
    s = client._s
    assert client._take_event(s, pb.SessionEvent(release_failed=pb.ReleaseFailed(lease_id="x"))) is False
    assert client.stats().release_failures == 1
    assert client._take_event(s, pb.SessionEvent(shutdown=pb.ShutdownNotice(drain_timeout_ms=300))) is True
    assert client.shutdown_notice == 300 and client._shutdown_event.is_set


def test_a_broken_stream_is_reattached_within_the_grace_period_then_lost():
    client = _Client()
    s = client._s
    waiter = _Waiter()
    s.pending[1] = waiter
    assert client._stream_broke(s, grpc.StatusCode.UNAVAILABLE, "", 0.5) is True
    assert waiter.result.code == grpc.StatusCode.UNAVAILABLE and not s.lost
    assert reattach_delay(s) == 0.1
    assert client._stream_broke(s, grpc.StatusCode.UNAVAILABLE, "", 1.5) is False
    assert s.lost and s.attached.is_set and s.queue.items == [END]
    assert client._stream_broke(s, grpc.StatusCode.UNAVAILABLE, "", 0.0) is False  # lost stays lost


@pytest.mark.parametrize("code", [grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND])
def test_a_stream_the_daemon_ended_loses_the_session(code):
    client = _Client()
    s = client._s
    assert client._stream_broke(s, code, "no such session", 0.0) is False
    assert s.lost
    with pytest.raises(GpumemdError) as error:
        client._granted(s, pb.LeaseResponse(lease_id="late"))
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    nxt = client._next_session(s, pb.OpenSessionResponse(session_id="s2"))
    client._adopt(s, nxt)
    assert (client.session_id, client.session_generation, client.session_lost) == ("s2", 2, False)
