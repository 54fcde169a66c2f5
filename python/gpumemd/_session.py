"""The session logic that the sync client (:mod:`gpumemd.client`) and the asyncio client
(:mod:`gpumemd.aio`) share, without their I/O.

This module owns what both clients decide alike: the state of one session (its pending stream
leases, its mappings and its client cache tier, :mod:`gpumemd._cache`), serving a lease from the
tier and closing one into it, the client's counters and session properties, interpreting the
daemon's SessionEvents, what a lost session means (its leases die, its waiting leases fail, its
notices and mappings are dropped), whether a broken KeepAlive stream is reattached or the
session given up, the backoff for opening a new session, and the errors that all of this
raises. What is sent on the KeepAlive stream is :mod:`gpumemd._keepalive`'s. Nothing here blocks, sleeps, awaits or calls
the daemon: each client makes its calls, waits and sleeps in its own way (threads and queues in
``client.py``, tasks and awaits in ``aio.py``) and asks this module what to do.

A session's ``queue`` (``queue.SimpleQueue`` or ``asyncio.Queue``) is only written with
``put_nowait``, and its ``attached`` event only set, which both kinds allow; its ``call`` only
cancelled. A pending stream lease is a waiter with ``settle(result)`` (a ``LeaseReply.lease``
or a :class:`GpumemdError`) that answers False when its caller has already given up.

Thread-safety: :class:`ClientCore` takes no lock except the one that makes a session's loss
happen once (the tier and the mappings guard themselves); its methods may be called as the
sync client calls them (any thread: the caller's and the KeepAlive thread), or from the asyncio
client's event loop only.
"""
import collections
import itertools
import logging
import threading

import grpc

from ._cache import ClientCache, SizeRules
from ._deferred import FAILED, DeferredReleases, QueuedWork
from ._errors import GpumemdError
from ._keepalive import END, FLUSH, FLUSH_NOW, MessageLog
from ._mapping import MappingCache
from ._replies import check_lease
from ._sharing import closed_client
from ._sleep import SleepAsks
from ._stubs import pb
from ._successor import Successors, socket_directory

log = logging.getLogger("gpumemd")

#: What a client did since it connected (see :meth:`Client.stats`). A lease is served by the
#: client cache tier (a local hit, no round trip) or by the daemon; a close keeps the lease in
#: the tier or releases it to the daemon.
ClientStats = collections.namedtuple("ClientStats", [
    "leases",            # leases the daemon granted to this client (daemon-served)
    "pool_hits",         # of those, served from the daemon's cached memory
    "releases",          # leases released to the daemon (closed, or given back from the tier)
    "release_failures",  # releases the daemon refused (ReleaseFailed events), logged as warnings
    "mapped_segments",   # segments mapped in this process now
    "maps_opened",       # mappings opened since connect (a lease on a mapped segment adds none)
    "holds",             # holds taken by attach() and lookup() (closing one counts as a release)
    "local_hits",        # leases served from the client cache tier, without a round trip
    "cached_bytes",      # bytes (block sizes) of closed leases kept in the tier now
    "cached_leases",     # closed leases kept in the tier now
    "cache_allowance",   # the tier's allowance now (0: no tier)
])

MIN_BACKOFF = 0.05  # seconds between attempts to open a new session after a loss, doubling ...
MAX_BACKOFF = 2.0   # ... up to this, for gpumemd.client._REOPEN_SECONDS


def open_request(client_name, ttl_seconds, client_cache_bytes=None, stream=True):
    """The OpenSessionRequest of a client. ``client_cache_bytes``: None asks for the daemon's
    default cache allowance, 0 for none, else at most that much; a client without stream calls
    asks for none (its notices would need the stream)."""
    if not stream:
        client_cache_bytes = 0
    elif client_cache_bytes is not None and client_cache_bytes < 0:
        raise ValueError("client_cache_bytes must be >= 0 (0: no client cache), not %d" % client_cache_bytes)
    return pb.OpenSessionRequest(client_name=client_name, ttl_seconds=ttl_seconds,
                                 client_cache_bytes=client_cache_bytes)


def no_answer(timeout):
    return GpumemdError(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer from gpumemd to a lease within %s s" % timeout)


def stream_down(s):
    return GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
                        + (" and the session is lost (the next lease opens a new one)" if s.lost else "; retry"))


class Reopening:
    """The attempts to open a new session after a loss: backoff from :data:`MIN_BACKOFF`
    doubling to :data:`MAX_BACKOFF`, for ``seconds`` from ``now`` (``time.monotonic()``)."""

    def __init__(self, now, seconds):
        self.deadline = now + seconds
        self.backoff = MIN_BACKOFF
        self.last = None  # the last attempt's GpumemdError

    def call_timeout(self, now):
        """The timeout of the next OpenSession call."""
        return max(0.1, min(5.0, self.deadline - now))

    def next_delay(self, now):
        """Seconds to wait before the next attempt, or None when that would pass the deadline."""
        if now + self.backoff > self.deadline:
            return None
        delay = self.backoff
        self.backoff = min(MAX_BACKOFF, self.backoff * 2)
        return delay

    def error(self, closing):
        """What the lease that wanted a new session raises when no attempt succeeded."""
        if closing:
            return closed_client()
        return GpumemdError(grpc.StatusCode.UNAVAILABLE,
                            "session lost: the daemon restarted or ended it, and no new session could be "
                            "opened yet%s; retry" % ("" if self.last is None else " (%s)" % self.last))


class SessionState:
    """One session of a client: its id, pending stream leases (request id -> waiter), the
    ``queue`` of notices for its KeepAlive stream, its ``attached`` event (set once the stream
    is bound, or never will be), its KeepAlive ``call`` and its mappings. Each client's session
    class adds what runs the stream. A lost session is never reused; the client opens a new one
    (the next generation)."""

    def __init__(self, client, opened, generation, notices, attached):
        self.id = opened.session_id
        self.ttl_seconds = opened.ttl_seconds
        self.keepalive_grace_ms = opened.keepalive_grace_ms
        self.generation = generation
        self.lost = False
        self.pending = {}
        self.queue = notices
        self.attached = attached
        #: The numbered messages of the session's streams (see MessageLog).
        self.log = MessageLog()
        #: The current stream's turn: set by the client before each KeepAlive call (see _take_event).
        self.turn = None
        #: The daemon's devices (its ordinal -> DeviceInfo), for their UUIDs.
        self.devices = {d.device: d for d in opened.devices}
        self.mappings = MappingCache(lambda segment_id: client._ack_unmapped(self, segment_id),
                                     lambda handle, read_only: client._fd_channels.fetch(self.id, handle, read_only),
                                     self.device_uuid)
        self.call = None
        #: The client cache tier and the pending notices of the stream (see gpumemd._cache).
        self.cache = ClientCache(opened.client_cache_bytes if client._stream_calls else 0,
                                 SizeRules.of(opened),
                                 lambda urgent: self.queue.put_nowait(FLUSH_NOW if urgent else FLUSH))

    def device_uuid(self, device):
        """The UUID of the daemon's ``device``; "" from a daemon that does not report it."""
        info = self.devices.get(device)
        return "" if info is None else info.uuid


class ClientCore(SleepAsks):
    """What :class:`gpumemd.Client` and :class:`gpumemd.aio.AsyncClient` share: their state,
    properties and counters, and the session decisions that need no I/O. A subclass sets
    ``_session_class``, ``_channel``, ``_stub``, ``_open_request``, ``_shutdown_event``,
    ``_fd_channels`` (a :class:`gpumemd._fdchannel.FdChannels`) and ``_s``, and provides
    ``_give_back(s, lease_id)`` (release a lease that cannot be used here, without raising),
    ``_release_call(s, lease)`` (the Release call for a closed lease, see :meth:`_close_lease`)
    and ``_wake_poller()`` (see that a poller of :attr:`_deferred` runs: a thread, a task)."""

    _session_class = None

    def __init__(self, target, client_name, stream, on_shutdown, metadata, credentials=None, aio=False):
        self.target = target
        #: The channel to a successor the daemon announces, and the one the stream runs on.
        self._successors = Successors(socket_directory(target, credentials), aio)
        self.client_name = client_name
        self._metadata = metadata
        self._stream_calls = stream
        self._on_shutdown = on_shutdown
        #: None, or the daemon's drain timeout in ms once it announced its shutdown.
        self.shutdown_notice = None
        self._closing = False
        self._closed = False
        self._lose_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._leases = 0
        self._pool_hits = 0
        self._releases = 0
        self._release_failures = 0
        self._holds = 0
        self._earlier_maps_opened = 0
        self._earlier_local_hits = 0
        self._deferred = DeferredReleases()  # leases closed with after=stream, waiting for their event

    # ------------------------------------------------------------------ properties

    @property
    def channel(self):
        """The gRPC channel, for other services of the daemon (Admin, health)."""
        return self._channel

    @property
    def metadata(self):
        """The call metadata (the bearer token) to pass to calls on :attr:`channel`."""
        return self._metadata

    @property
    def session_id(self):
        """The current session's id (a new one after a daemon restart; a bearer credential)."""
        return self._s.id

    @property
    def ttl_seconds(self):
        return self._s.ttl_seconds

    @property
    def keepalive_grace_ms(self):
        return self._s.keepalive_grace_ms

    @property
    def session_lost(self):
        """True once the current session is lost (the daemon restarted or ended it) and no new
        one is open yet; the next lease opens one."""
        return self._s.lost

    @property
    def session_generation(self):
        """1 for the session opened by connect, one more for each session opened after a loss."""
        return self._s.generation

    def stats(self):
        """What this client did since connect (a :data:`ClientStats`)."""
        s = self._s
        return ClientStats(self._leases, self._pool_hits, self._releases, self._release_failures,
                           len(s.mappings), self._earlier_maps_opened + s.mappings.maps_opened, self._holds,
                           self._earlier_local_hits + s.cache.local_hits, s.cache.cached_bytes, len(s.cache),
                           s.cache.allowance)

    # ------------------------------------------------------------------ leases

    def _check_lease(self, size):
        if size is None:
            raise TypeError("lease() needs size")
        if self._closing:
            raise closed_client()

    def _local_lease(self, device, size, zero, tag, stream):
        """A lease served by the client cache tier (no round trip), zeroed whole when asked, or
        None (a miss: the daemon serves it)."""
        s = self._s
        if s.lost or size <= 0:
            return None
        cached = s.cache.take(device, size)
        if cached is None:
            return None
        lease = cached._reused(size, tag, stream)
        if zero:
            try:
                lease._zero_block()
            except BaseException:
                lease.close()
                raise
        return lease

    def _check_reply(self, s, response, device=None, size=None):
        """Checks a lease's reply (``device`` and ``size`` asked) or a hold's (``size`` None)
        before anything is fetched or mapped for it (see :mod:`gpumemd._replies`); one that is
        inconsistent is given back at once, so that it is not held until the session ends, and
        raises ``INTERNAL``."""
        try:
            check_lease(response, device, size)
        except GpumemdError:
            self._give_back(s, response.lease_id)
            raise

    def _granted(self, s, response, tag, descriptor=None):
        """The mapping for a lease granted on session ``s`` with ``tag``, counted. Raises
        UNAVAILABLE when ``s`` was lost meanwhile; a lease that cannot be mapped here is given
        back. ``descriptor``: its segment's, fetched beforehand (the asyncio client)."""
        if s.lost:
            if descriptor is not None:
                descriptor.close()
            raise GpumemdError(grpc.StatusCode.UNAVAILABLE, "session lost while the lease was granted; retry")
        self._leases += 1
        if response.pool_hit:
            self._pool_hits += 1
        try:
            return s.mappings.acquire(response.device, response.handle, descriptor=descriptor, tag=tag)
        except BaseException:
            self._give_back(s, response.lease_id)  # unusable here: do not hold it until session end
            raise


    def _lease_error(self, s, rpc_error):
        """The error of a unary Lease call; NOT_FOUND for the session means it is lost."""
        error = GpumemdError.from_rpc(rpc_error)
        if error.code == grpc.StatusCode.NOT_FOUND and "session" in error.message.lower():
            self._lose(s, "the daemon does not know it: %s" % error.message)
        return error

    def _close_lease(self, lease, event):
        """A lease closed (see Lease.close). Without ``event``: its release now (a notice on the
        stream, or the subclass's Release call). With one (a :class:`gpumemd._cuda.Event`
        recorded on the caller's stream): the release waits in :attr:`_deferred` until the
        event has completed, and the caller does not wait. What the Release call returns is
        returned (None, or the asyncio client's task)."""
        s = lease._session
        if s.lost or self._closing:
            if event is not None:
                event.destroy()
            if not s.lost:
                self._releases += 1
                s.mappings.release(lease.segment_id)  # CloseSession takes it back
            return None  # a lost session's: dead with it, and its mappings are gone
        if event is not None:
            self._deferred.add(s, lease, event)
            self._wake_poller()
            return None
        if self._stream_calls and not (lease.attached or lease._shared):
            # Shared, published and attached blocks are others' too: never cached.
            evicted = s.cache.offer(lease)
            if evicted is not None:
                self._evicted(s, evicted)
                return None
        return self._send_release(s, lease)

    def _evicted(self, s, leases):
        """Leases the cache tier gave back (their release notices pending): their mappings."""
        for lease in leases:
            self._releases += 1
            s.mappings.release(lease.segment_id)

    def _send_release(self, s, lease):
        """Releases a closed lease: a notice on the stream, or the subclass's Release call
        (whose result is returned); then its segment has one lease fewer here."""
        self._releases += 1
        try:
            if self._stream_calls:
                s.cache.release(lease.id)  # in order with the tier's notices of the same lease
                return None
            return self._release_call(s, lease)
        finally:
            s.mappings.release(lease.segment_id)

    def _release_ready(self):
        """Sends the releases whose events have completed (one poll of :attr:`_deferred`); a
        refused unary release is logged. Called by the subclass's poller."""
        for item in self._deferred.poll():
            try:
                self._send_release(item.session, item.lease)
            except GpumemdError as e:
                log.warning("gpumemd release of lease %s failed: %s", item.lease.id, e)

    def _abandon_deferred(self):
        """The client closes: releases still waiting for their event are given up (their
        events destroyed); CloseSession takes the leases back."""
        leases = self._deferred.abandon()
        if leases:
            log.warning("gpumemd client %s closed while the GPU work of %d closed lease(s) was still running "
                        "(%s): their events are destroyed; the session's end gives them back once the device's "
                        "work is synchronized", self.client_name, len(leases),
                        ", ".join(lease.id for lease in leases[:8]) + (" ..." if len(leases) > 8 else ""))

    def _queued_work(self, s):
        """The client closes: starts synchronizing the CUDA devices that session ``s`` maps, whose
        work may still use its blocks (see :class:`gpumemd._deferred.QueuedWork`)."""
        return QueuedWork(s.mappings.cuda_devices())

    def _keep_session(self, s, work, outcome, waited):
        """Logs why session ``s`` is kept instead of closed (its GPU work did not end in time, or
        its synchronize failed); True when it is to be closed once the work ends."""
        if outcome == FAILED:
            log.warning("gpumemd client %s closing: synchronizing CUDA device(s) %s failed (%s); the GPU work on "
                        "session %s's blocks may not have ended, so they are not handed back: the session is kept "
                        "until this process exits", self.client_name, work.devices, work.failure, s.id)
            return False
        log.warning("gpumemd client %s closing: GPU work on CUDA device(s) %s still running after %.1f s; session %s "
                    "and its blocks are kept until it completes (or this process exits), then closed",
                    self.client_name, work.devices, waited, s.id)
        return True

    def _release_error(self, s, rpc_error):
        """The error of a Release call to raise, or None: NOT_FOUND is expected once the client
        is closing or the session is lost."""
        error = GpumemdError.from_rpc(rpc_error)
        if (self._closing or s.lost) and error.code == grpc.StatusCode.NOT_FOUND:
            return None
        return error

    def _ack_unmapped(self, s, segment_id):
        if not self._closing and not s.lost:
            s.queue.put_nowait(("unmapped", segment_id))

    # ------------------------------------------------------------------ sessions

    def _next_session(self, s, opened):
        """The session after the lost ``s``, from its OpenSessionResponse (not current yet)."""
        nxt = self._session_class(self, opened, s.generation + 1)
        log.info("gpumemd session %s of %s lost; opened new session %s (generation %d)",
                 s.id, self.client_name, nxt.id, nxt.generation)
        return nxt

    def _adopt(self, s, nxt):
        """Makes ``nxt`` (attached) the current session in place of the lost ``s``."""
        self._earlier_maps_opened += s.mappings.maps_opened
        self._earlier_local_hits += s.cache.local_hits
        self._s = nxt

    def _lose(self, s, why):
        """Marks a session lost (once): its leases are dead, its pending leases fail, its unsent
        notices are dropped and its mappings too (a restarted daemon reuses segment ids). Host
        mappings that a buffer or array still exports stay mapped until that object is gone."""
        with self._lose_lock:
            if s.lost:
                return
            s.lost = True
        if not self._closing:
            log.warning("gpumemd session %s of %s lost (%s); its leases are gone, the next lease opens a new session",
                        s.id, self.client_name, why)
        s.attached.set()
        call = s.call
        if call is not None:
            call.cancel()
        s.cache.drain(discard=True)  # the daemon took the cached leases back with the session
        s.queue.put_nowait(END)
        self._fail_pending(s, GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                           "session lost: the daemon restarted or ended it; retry"))
        s.mappings.close_all()

    @staticmethod
    def _fail_pending(s, error):
        for request_id in list(s.pending):
            waiter = s.pending.pop(request_id, None)
            if waiter is not None:
                waiter.settle(error)

    def _stream_broke(self, s, code, details, elapsed):
        """The KeepAlive call of ``s`` ended with ``code``, ``elapsed`` seconds after its last
        event (or its first attempt): loses the session when the daemon ended it or the grace
        period is over. True when the client should reattach after :func:`reattach_delay` (at
        once when the daemon said it is moving). The leases in flight stay pending: the next
        stream sends again what the daemon did not apply (:class:`MessageLog`)."""
        if self._closing or s.lost:
            return False
        if s.log.moving:
            return True  # the successor behind the same address has the session
        if code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND):
            self._lose(s, "ended by the daemon: %s" % ("stream completed" if code == grpc.StatusCode.OK else details))
            return False
        elapsed_ms = elapsed * 1000
        if elapsed_ms > s.keepalive_grace_ms:
            self._lose(s, "KeepAlive stream broken for %.0f ms, past the grace period (%s)" % (elapsed_ms, code.name))
            return False
        return True  # within the grace period the daemon keeps the session

    # ------------------------------------------------------------------ events

    def _close_channels(self, channels):
        """Closes channels no call runs on (the asyncio client schedules its closes instead)."""
        for channel in channels:
            channel.close()

    def _take_event(self, s, event):
        """Applies one SessionEvent of ``s``; True for a shutdown notice, which the subclass
        then passes to ``on_shutdown``. ReturnCache and a smaller CacheAllowance give cached
        leases back at once; a shutdown notice gives all of them back (the daemon drains)."""
        kind = event.WhichOneof("event")
        if kind == "lease_reply":
            reply = event.lease_reply
            s.log.answered(reply.request_id)
            waiter = s.pending.pop(reply.request_id, None)
            result = reply.lease if reply.HasField("lease") else GpumemdError.from_stream(reply.error)
            if (waiter is None or not waiter.settle(result)) and reply.HasField("lease"):
                s.cache.release(reply.lease.lease_id)  # its caller gave up
        elif kind == "unmap":
            s.mappings.unmap_requested(event.unmap.segment_id)
        elif kind == "return_cache":
            self._evicted(s, s.cache.give_back(event.return_cache.device, event.return_cache.bytes))
        elif kind == "cache_allowance":
            self._evicted(s, s.cache.set_allowance(event.cache_allowance.bytes))
        elif kind == "attached":
            # What the daemon did not apply of the broken stream's messages goes first, then
            # what waited meanwhile (the stream's request side waits for this turn).
            again = s.log.attached(event.attached.applied_messages)
            if s.turn is not None:
                s.turn.go(again)
            s.attached.set()
            s.cache.attached()  # a flush of what queued up while the stream was away
            self._sleep_handler_attached(s)
        elif kind == "sleep_asked":
            self._sleep_asked(s, event.sleep_asked)
        elif kind == "moving":
            # The daemon hands the session to its successor and ends the stream next: reattach at once.
            log.info("gpumemd is moving to its successor; session %s reattaches%s", s.id,
                     " over the connection made to it before the pause" if self._successors.ready() else "")
            s.log.moving = True
        elif kind == "successor":
            # The successor listens; connect to it now, while this daemon still serves.
            self._close_channels(self._successors.successor_at(event.successor.socket_name))
        elif kind == "release_failed":
            failed = event.release_failed
            s.log.refused(failed.lease_id)
            error = GpumemdError.from_stream(failed.error)
            self._release_failures += 1
            refused = (s.cache.refused(failed.lease_id)
                       if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED else None)
            if refused is not None:
                # A cache notice past the daemon's allowance: the daemon still counts the lease
                # as in use; releasing it makes both books agree (the tier keeps what fits).
                self._evicted(s, [refused])
                log.warning("gpumemd refused to count lease %s as client-cached, released it instead: %s",
                            failed.lease_id, error)
            else:
                log.warning("gpumemd refused a notice about lease %s: %s", failed.lease_id, error)
        elif kind == "shutdown":
            self.shutdown_notice = event.shutdown.drain_timeout_ms
            self._evicted(s, s.cache.set_allowance(0))
            self._shutdown_event.set()
            log.info("gpumemd is shutting down; drain timeout %d ms", self.shutdown_notice)
            return True
        return False
