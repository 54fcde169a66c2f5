"""The KeepAlive stream's request side, shared by the sync client (:mod:`gpumemd.client`) and the
asyncio client (:mod:`gpumemd.aio`) without their I/O.

This module owns what is sent on a session's KeepAlive streams and when: the notices queued for
the stream merged into messages (:func:`keepalive_message`), the numbering of every message sent
and the log of those not yet known to be applied, sent again on the next stream after a break
(:class:`MessageLog`), the turn that holds a new stream's request side until the daemon confirms
the stream (:class:`Turn`), how soon a broken stream is reattached (:func:`reattach_delay`) and
what its error says (:func:`stream_error`). Each client only waits in its own way: a thread and
``queue.SimpleQueue`` in ``client.py``, a task and ``asyncio.Queue`` in ``aio.py``.

Thread-safety: :class:`MessageLog` has its own lock; a :class:`Turn` is set by the stream's
reader and read by its request side, through its event.
"""
import collections
import logging
import threading

from ._cache import MAX_ENTRIES
from ._channel import is_moving
from ._stubs import pb

log = logging.getLogger("gpumemd")

END = object()  # queued last: the KeepAlive request stream ends after what was queued before it
FLUSH = object()      # queued by the cache tier: send its pending notices within FLUSH_DELAY
FLUSH_NOW = object()  # ... at once (the daemon asked for memory back)
MAX_NOTICES = 4096  # per KeepAlive message, far below gRPC's 4 MiB message limit
LOGGED = 8192       # sent KeepAlive messages kept until known to be applied (the oldest dropped beyond)


def keepalive_message(first, take, pending=None):
    """One KeepAliveRequest merging the queued notice ``first`` and those that ``take()`` gives
    (None once nothing more is queued), at most :data:`MAX_NOTICES`, then what the cache tier
    has pending (``pending``: a :class:`gpumemd._cache.ClientCache`); ``(message, end, more)``,
    where ``end`` says that :data:`END` was taken (the request stream ends after this message)
    and ``more`` that the tier has more to send at once. A notice is a StreamRelease, a
    StreamLease, ``("unmapped", segment_id)``, ``("sleep_handler", bool)``, :data:`FLUSH` or :data:`FLUSH_NOW`. The message
    may be empty (a flush with nothing left to send): don't send it."""
    message = pb.KeepAliveRequest()
    item = first
    n = 0
    end = False
    while True:
        if item is END:
            end = True
            break
        if isinstance(item, pb.StreamRelease):
            message.releases.append(item)
        elif isinstance(item, pb.StreamLease):
            message.leases.append(item)
        elif isinstance(item, tuple) and item[0] == "sleep_handler":
            message.sleep_handler = item[1]
        elif isinstance(item, tuple):
            message.unmapped_segment_ids.append(item[1])
        n += 1
        if n >= MAX_NOTICES:
            break
        item = take()
        if item is None:
            break
    more = pending is not None and pending.fill(message, MAX_ENTRIES - n)
    return message, end, more


def is_empty(message):
    """True for a KeepAliveRequest that carries nothing (not worth sending)."""
    return not (message.leases or message.releases or message.unmapped_segment_ids or message.cache_notices
                or message.client_counters or message.session_id or message.HasField("sleep_handler"))


def reattach_delay(s):
    """Seconds to wait before reattaching a KeepAlive stream that broke within the grace period;
    none after the daemon's MovingNotice (its successor serves the same address), 10 ms after it
    refused a message as moving (until its successor serves, it refuses a new stream too)."""
    if s.log.moving:
        return 0.01 if s.log.moving_refused else 0.0
    return max(0.02, min(0.2, s.keepalive_grace_ms / 10000))



class MessageLog:
    """The KeepAlive messages of one session, numbered, for sending again what a broken stream
    lost (the Java client's ``SessionStream``, without its I/O).

    Every message the client hands to gRPC is numbered (1, 2, ... over all the session's
    streams, the attaching message too) and kept until known to be applied, at most
    :data:`LOGGED` (the oldest dropped beyond, with a DEBUG line): a lease's reply, or a refused
    notice, tells that its message and all before it were applied. When a stream attaches, the
    daemon says how many messages of the session it applied before it
    (``StreamAttached.applied_messages``); :meth:`attached` answers the logged messages after
    that count, to send again as new messages before anything else. A lease whose message was
    applied but whose reply was lost with the connection (only when a connection breaks: a
    moving daemon sends every reply first) is asked for again, with the same request id; the
    daemon then keeps the first grant until the session ends (:attr:`replies_lost`).

    Thread-safe (its own lock): the sync client numbers messages on gRPC's request thread and
    learns of replies on its stream thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._numbered = 0
        self._unconfirmed = collections.deque()  # (number, message), oldest first
        self._unanswered = {}  # request id -> (StreamLease, number of its message)
        #: The daemon said, on the stream that ended last, that it is moving: reattach at once
        #: after its MovingNotice, and soon after it refused a message as moving.
        self.moving = False
        self.moving_refused = False
        #: Messages sent again on a new stream, and leases asked for again (their reply lost).
        self.resent = 0
        self.replies_lost = 0

    def hello(self):
        """The attaching message of a new stream is sent (counted by the daemon, never sent again)."""
        with self._lock:
            self._numbered += 1
            self.moving = False
            self.moving_refused = False

    def sent(self, message):
        """``message`` (not the hello) is handed to gRPC: numbered and kept until known applied."""
        with self._lock:
            self._numbered += 1
            number = self._numbered
            self._unconfirmed.append((number, message))
            for lease in message.leases:
                self._unanswered[lease.request_id] = (lease, number)
            if len(self._unconfirmed) > LOGGED:
                dropped, _ = self._unconfirmed.popleft()
                log.debug("gpumemd: dropping sent KeepAlive message %d from the resend log (more than %d "
                          "unconfirmed)", dropped, LOGGED)

    def _prune(self, upto):
        while self._unconfirmed and self._unconfirmed[0][0] <= upto:
            self._unconfirmed.popleft()

    def answered(self, request_id):
        """The lease ``request_id`` was answered: its message and all before it were applied."""
        with self._lock:
            entry = self._unanswered.pop(request_id, None)
            if entry is not None:
                self._prune(entry[1])

    def refused(self, lease_id):
        """A notice about ``lease_id`` was refused: the first message naming it was applied."""
        with self._lock:
            for number, message in self._unconfirmed:
                if (any(r.lease_id == lease_id for r in message.releases)
                        or any(n.lease_id == lease_id for n in message.cache_notices)):
                    self._prune(number)
                    return

    def attached(self, applied):
        """A stream attached, the daemon having applied ``applied`` messages of the session: the
        messages to send again on it, in order, before anything else (see the class notes)."""
        with self._lock:
            self._prune(applied)
            again = [message for _, message in self._unconfirmed]
            self.resent += len(again)
            self._unconfirmed.clear()
            leases_again = {lease.request_id for message in again for lease in message.leases}
            lost = 0
            for request_id, (lease, number) in self._unanswered.items():
                if request_id not in leases_again:  # applied, its reply lost; or dropped from the log
                    again.append(pb.KeepAliveRequest(leases=[lease]))
                    if number <= applied:
                        lost += 1
            self.replies_lost += lost
            # The daemon's count is the truth: messages lost in a connection took numbers it did
            # not count. This stream's hello was its message applied + 1.
            self._numbered = applied + 1
        if lost:
            log.warning("gpumemd: the replies to %d lease request(s) were lost with the broken KeepAlive stream; "
                        "asked again (the daemon holds the first grants until the session ends)", lost)
        if again:
            log.debug("gpumemd: the daemon applied %d messages of the session; sending %d again", applied, len(again))
        return again

class Turn:
    """When one KeepAlive stream's request side may send what is queued: once the daemon
    confirmed the stream (``go``, with the messages to send again first), or never (``end``:
    the stream is over; what is queued waits for the next). ``event`` is the client's wait
    primitive, a ``threading.Event`` or an ``asyncio.Event``: the request side waits on it in its
    own way, then asks :meth:`compose` what to send."""

    def __init__(self, event):
        self.event = event
        self.again = None
        self.ended = False

    def go(self, again):
        self.again = again
        self.event.set()

    def end(self):
        self.ended = True
        self.event.set()

    @staticmethod
    def opening(s):
        """The first message of a stream of session ``s``: its id (numbered, never sent again)."""
        s.log.hello()
        return pb.KeepAliveRequest(session_id=s.id)

    def resent(self, s):
        """Once the turn came: what the daemon did not apply of the broken streams' messages, in
        order, each numbered again, to send before anything composed since."""
        for message in self.again:
            s.log.sent(message)
            yield message

    def compose(self, s, item, take, requeue, cache):
        """What the request side sends for the notice ``item`` it took from the queue (the rest
        as :func:`keepalive_message`): ``(message, stop, more)``, ``message`` None when there is
        nothing to send, ``stop`` when the request stream ends after it, ``more`` when the tier
        has more to send at once (queue a :data:`FLUSH`). A message is numbered here."""
        if self.ended:
            # gRPC asks an ended call's requests for one more: what this stream would take now
            # belongs to the next one (``requeue`` it; numbering it here would shift the count).
            if item is not END:
                requeue(item)
            return None, True, False
        message, end, more = keepalive_message(item, take, cache)
        if is_empty(message):
            return None, end, more
        s.log.sent(message)
        return message, end, more


def stream_error(s, rpc_error):
    """``(code, details)`` of the error that ended a KeepAlive call of ``s``; a refusal by a
    moving daemon (it did not apply the message) has ``s`` reattach soon, to its successor."""
    code = rpc_error.code()
    if is_moving(code, rpc_error.trailing_metadata()):
        s.log.moving = s.log.moving_refused = True
    return code, rpc_error.details()
