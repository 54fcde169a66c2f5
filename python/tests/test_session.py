"""Unit tests of gpumemd._session, the I/O-free session core (no daemon)."""
import grpc
import pytest

from gpumemd import GpumemdError
from gpumemd._keepalive import END, FLUSH, LOGGED, MAX_NOTICES, MessageLog, is_empty, keepalive_message, reattach_delay
from gpumemd._session import ClientCore, Reopening, SessionState
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
    assert waiter.result is None and not s.lost  # still pending: the next stream sends its lease again
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
        client._granted(s, pb.LeaseResponse(lease_id="late"), "")
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    nxt = client._next_session(s, pb.OpenSessionResponse(session_id="s2"))
    client._adopt(s, nxt)
    assert (client.session_id, client.session_generation, client.session_lost) == ("s2", 2, False)


def _message(*releases, lease=None):
    m = pb.KeepAliveRequest(releases=[pb.StreamRelease(lease_id=r) for r in releases])
    if lease is not None:
        m.leases.add(request_id=lease, device=0, size_bytes=4096)
    return m


def test_message_log_sends_again_exactly_what_the_daemon_did_not_apply():
    log = MessageLog()
    log.hello()  # 1
    sent = [_message("a"), _message(lease=7), _message("b"), _message("c")]  # 2, 3, 4, 5
    for m in sent:
        log.sent(m)
    log.answered(7)  # its message (3) and all before were applied
    log.hello()  # a new stream after a break: the daemon applied 4 ("b" arrived, "c" was lost)
    assert log.attached(4) == [sent[3]]
    assert log.resent == 1 and log.replies_lost == 0
    log.sent(sent[3])  # "c" again: the daemon's message 6 (the hello was 5)
    log.hello()
    assert log.attached(6) == []  # applied this time: nothing twice


def test_message_log_renumbers_from_the_daemons_count():
    log = MessageLog()
    log.hello()  # 1
    log.sent(_message("a"))  # 2, lost with the connection
    log.hello()  # 3 in the client's count: a stream that failed before it got through
    log.hello()  # the stream that attaches: the daemon's message 2
    again = log.attached(1)
    assert [m.releases[0].lease_id for m in again] == ["a"]
    log.sent(again[0])  # the daemon's 3
    log.sent(_message("b"))  # 4
    log.hello()
    assert [m.releases[0].lease_id for m in log.attached(3)] == ["b"]


def test_message_log_asks_again_for_a_lease_whose_reply_was_lost():
    log = MessageLog()
    log.hello()
    log.sent(_message(lease=1))  # 2: applied, its reply lost with the connection
    log.sent(_message(lease=2))  # 3: lost
    log.hello()
    again = log.attached(2)
    assert [m.leases[0].request_id for m in again] == [2, 1] and log.replies_lost == 1


def test_message_log_prunes_on_a_refused_notice_and_stays_bounded():
    log = MessageLog()
    log.hello()
    log.sent(_message("a"))
    log.sent(_message("b"))
    log.refused("a")
    log.hello()
    assert [m.releases[0].lease_id for m in log.attached(1)] == ["b"]
    for i in range(LOGGED + 10):
        log.sent(_message(str(i)))
    log.hello()
    again = log.attached(0)
    assert len(again) == LOGGED and again[0].releases[0].lease_id == "10"  # the oldest dropped


def test_a_moving_notice_reattaches_at_once_even_when_the_stream_completes():
    client = _Client()
    s = client._s
    assert client._take_event(s, pb.SessionEvent(moving=pb.MovingNotice())) is False
    assert reattach_delay(s) == 0
    assert client._stream_broke(s, grpc.StatusCode.OK, "", 0.0) is True and not s.lost
    s.log.hello()  # the next stream
    assert reattach_delay(s) > 0
