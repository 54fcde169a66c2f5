"""The synchronous client: one session, held by a background KeepAlive stream."""
import collections
import itertools
import logging
import os
import queue
import threading
import time

import grpc

from . import _cuda
from ._channel import open_channel, options
from ._errors import GpumemdError
from ._lease import Lease
from ._mapping import MappingCache
from ._sharing import Published, Share, closed_client, is_not_found, make_hold, publish_request, share_request
from ._stubs import pb, pb_grpc

log = logging.getLogger("gpumemd")

#: What a client did since it connected (see :meth:`Client.stats`). This client keeps no cache
#: tier of its own, so every lease is served by the daemon and every close is a release.
ClientStats = collections.namedtuple("ClientStats", [
    "leases",            # leases the daemon granted to this client
    "pool_hits",         # of those, served from the daemon's cached memory
    "releases",          # leases closed (released to the daemon)
    "release_failures",  # releases the daemon refused (ReleaseFailed events), logged as warnings
    "mapped_segments",   # segments mapped in this process now
    "maps_opened",       # mappings opened since connect (a lease on a mapped segment adds none)
    "holds",             # holds taken by attach() and lookup() (closing one counts as a release)
])

_END = object()
_MAX_NOTICES = 4096  # per KeepAlive message, far below gRPC's 4 MiB message limit
_MIN_BACKOFF = 0.05  # seconds between attempts to open a new session after a loss, doubling ...
_MAX_BACKOFF = 2.0   # ... up to this
_REOPEN_SECONDS = 10.0  # per lease call


class _Session:
    """One session of a client: its id, KeepAlive stream, pending leases, unsent notices and
    mappings. A lost session is never reused; the client opens a new one (the next generation)."""

    def __init__(self, client, opened, generation):
        self.id = opened.session_id
        self.ttl_seconds = opened.ttl_seconds
        self.keepalive_grace_ms = opened.keepalive_grace_ms
        self.generation = generation
        self.lost = False
        self.queue = queue.SimpleQueue()
        self.pending = {}  # request id -> [lock held until the reply, reply or error]
        self.mappings = MappingCache(lambda segment_id: client._ack_unmapped(self, segment_id))
        self.attached = threading.Event()
        self.done = threading.Event()
        self.call = None
        self.thread = None


def connect(target="unix:///tmp/gpumemd.sock", client_name=None, *, stream=True, ttl_seconds=0,
            token=None, root_certificates=None, private_key=None, certificate_chain=None,
            on_shutdown=None, timeout=10.0):
    """Connects to gpumemd and opens a session; use it as a context manager, or close() it.

    ``target``: ``unix:///path/to.sock`` (the daemon identifies the peer by its uid) or
    ``host:port``. ``client_name`` is shown in the daemon's listings and selects per-client
    quotas (default ``python-<pid>``). ``stream=True`` leases over the session's KeepAlive
    stream (one round trip a lease, releases not waited for); ``stream=False`` uses the unary
    Lease and Release calls. ``token``: a bearer token, sent on every call.
    ``root_certificates`` (PEM bytes or a path): TLS to a ``host:port`` target, with
    ``private_key`` and ``certificate_chain`` for mutual TLS. ``on_shutdown(drain_timeout_ms)``
    is called from the stream's thread when the daemon announces its shutdown.

    Raises :class:`GpumemdError` when the daemon cannot be reached or refuses the session.
    """
    return Client(target, client_name, stream=stream, ttl_seconds=ttl_seconds, token=token,
                  root_certificates=root_certificates, private_key=private_key,
                  certificate_chain=certificate_chain, on_shutdown=on_shutdown, timeout=timeout)


class Client:
    """A connection to gpumemd with one session (see :func:`connect`).

    The session is held by a KeepAlive stream on a background thread: if this process dies,
    the daemon takes back its leases after the grace period; if the stream breaks, the client
    reattaches within it. The thread obeys the daemon's events: it unmaps the segments the
    daemon wants to free (once no live lease uses them) and acknowledges them, answers leases,
    logs refused releases, and records a shutdown notice (:attr:`shutdown_notice`, and the
    ``on_shutdown`` callback). The session asks for no client cache allowance
    (``client_cache_bytes: 0``): this client keeps no cache tier, so the daemon sends it no
    ReturnCache or CacheAllowance events (they are ignored if it does).

    If the daemon restarts (or ends the session), the session is lost: when the daemon ends the
    stream, when the stream stays broken past the grace period, or when a unary Lease gets
    NOT_FOUND for it. One warning is logged and everything of that session is dropped: its
    leases are dead (:attr:`Lease.lost`; ``close()`` does nothing, accessors raise), its
    mappings (a restarted daemon reuses segment ids), unsent notices and waiting leases. The next
    :meth:`lease` opens a new session, retrying with backoff (50 ms doubling to 2 s) for up to
    10 s; an INFO line names both session ids.

    Thread-safe: any thread may lease and close leases.
    """

    def __init__(self, target, client_name=None, *, stream=True, ttl_seconds=0, token=None,
                 root_certificates=None, private_key=None, certificate_chain=None, on_shutdown=None,
                 timeout=10.0):
        credentials, self._metadata = options(root_certificates, private_key, certificate_chain, token)
        self.target = target
        self.client_name = client_name or "python-%d" % os.getpid()
        self._channel = open_channel(target, credentials)
        self._stub = pb_grpc.AllocatorStub(self._channel)
        self._open_request = pb.OpenSessionRequest(client_name=self.client_name, ttl_seconds=ttl_seconds,
                                                   client_cache_bytes=0)
        self._timeout = timeout
        try:
            opened = self._stub.OpenSession(self._open_request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            self._channel.close()
            raise GpumemdError.from_rpc(e) from None
        self._stream_calls = stream
        self._on_shutdown = on_shutdown
        #: None, or the daemon's drain timeout in ms once it announced its shutdown.
        self.shutdown_notice = None
        self._shutdown_event = threading.Event()
        self._closing = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._reopen_lock = threading.Lock()
        self._lose_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._leases = 0
        self._pool_hits = 0
        self._releases = 0
        self._release_failures = 0
        self._holds = 0
        self._earlier_maps_opened = 0
        self._s = _Session(self, opened, 1)
        self._attach(self._s)

    def _attach(self, s):
        s.thread = threading.Thread(target=self._run_stream, args=(s,), daemon=True,
                                    name="gpumemd-keepalive-%s-%d" % (self.client_name, s.generation))
        s.thread.start()
        if not s.attached.wait(self._timeout):
            log.warning("gpumemd session of %s: KeepAlive stream not attached after %.0f s", self.client_name,
                        self._timeout)

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
        one is open yet; the next :meth:`lease` opens one."""
        return self._s.lost

    @property
    def session_generation(self):
        """1 for the session opened by connect, one more for each session opened after a loss."""
        return self._s.generation

    def stats(self):
        """What this client did since connect (a :data:`ClientStats`)."""
        s = self._s
        return ClientStats(self._leases, self._pool_hits, self._releases, self._release_failures,
                           len(s.mappings), self._earlier_maps_opened + s.mappings.maps_opened, self._holds)

    def wait_for_shutdown_notice(self, timeout=None):
        """Blocks until the daemon announces its shutdown; the drain timeout in ms, or None."""
        self._shutdown_event.wait(timeout)
        return self.shutdown_notice

    # ------------------------------------------------------------------ leasing

    def lease(self, device=0, size=None, *, zero=False, tag="", stream=None, timeout=None):
        """Leases at least ``size`` bytes on ``device``; a :class:`Lease` of exactly ``size``.

        ``zero``: the daemon zeroes the block first (otherwise its contents are unspecified).
        ``tag``: a label in the daemon's listings. ``stream``: the stream a CUDA lease's
        ``__cuda_array_interface__`` reports (see :attr:`Lease.stream`). ``timeout``: seconds to
        wait for the daemon (default: until it answers or the stream breaks).

        Raises :class:`GpumemdError` with the daemon's status: ``INVALID_ARGUMENT`` (size 0,
        over the budget, unknown device), ``RESOURCE_EXHAUSTED`` (pool or quota full), ...
        """
        if size is None:
            raise TypeError("lease() needs size")
        if self._closing:
            raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "the gpumemd client is closed")
        for attempt in (1, 2):
            s = self._live_session()
            try:
                if self._stream_calls:
                    response = self._lease_on_stream(s, device, size, zero, tag, timeout)
                else:
                    try:
                        response = self._stub.Lease(pb.LeaseRequest(session_id=s.id, device=device,
                                                                    size_bytes=size, zero=zero, tag=tag),
                                                    timeout=timeout, metadata=self._metadata)
                    except grpc.RpcError as e:
                        error = GpumemdError.from_rpc(e)
                        if error.code == grpc.StatusCode.NOT_FOUND and "session" in error.message.lower():
                            self._lose(s, "the daemon does not know it: %s" % error.message)
                        raise error from None
            except GpumemdError:
                if s.lost and attempt == 1:
                    continue  # lost while this lease waited: once more, on a new session
                raise
            break
        if s.lost:
            raise GpumemdError(grpc.StatusCode.UNAVAILABLE, "session lost while the lease was granted; retry")
        self._leases += 1
        if response.pool_hit:
            self._pool_hits += 1
        try:
            mapping = s.mappings.acquire(response.device, response.handle)
        except BaseException:
            self._release_quietly(s, response.lease_id)  # unusable here: do not hold it until session end
            raise
        return Lease(self, response, mapping, tag, stream, session=s)

    # ------------------------------------------------------------------ sharing

    def attach(self, token, tag=""):
        """A hold on the block shared by ``token`` (from ``lease.share()`` in any process of
        this tenant): a :class:`Lease` with ``attached`` True and ``read_only`` as the share
        says, mapped like a lease. ``close()`` drops the hold (the block returns to the pool once
        its last hold is gone); so does this session's end. Attaching twice gives two holds.

        Raises :class:`GpumemdError` ``NOT_FOUND`` for an unknown, expired, revoked or used-up
        token (or another tenant's), ``INVALID_ARGUMENT`` for a malformed one (not 32 lowercase
        hex characters).
        """
        s = self._live_session()
        response = self._call("Attach", pb.AttachRequest(session_id=s.id, token=token, tag=tag))
        return make_hold(self, s, response, tag, Lease, lambda lease_id: self._release_quietly(s, lease_id))

    def lookup(self, name, tag=""):
        """A hold on the object published under ``name`` by this tenant (as :meth:`attach`).
        ``NOT_FOUND`` for an unknown name."""
        s = self._live_session()
        response = self._call("Lookup", pb.LookupRequest(session_id=s.id, name=name, tag=tag))
        return make_hold(self, s, response, tag, Lease, lambda lease_id: self._release_quietly(s, lease_id))

    def publish(self, lease, name, read_only=False):
        """Publishes ``lease`` (a lease or hold of this client) under ``name``, unique within
        the tenant (1 to 256 characters, no control characters); a :class:`gpumemd.Published`
        (a context manager that unpublishes at its end). The name holds the block until it is
        unpublished, even after this process exits. ``read_only``: lookups give read-only
        holds (always, when ``lease`` is itself a read-only hold).

        Raises :class:`GpumemdError`: ``ALREADY_EXISTS`` (the tenant has that name),
        ``INVALID_ARGUMENT`` (empty, too long, control characters).
        """
        request = publish_request(self, lease, name, read_only)
        self._call("Publish", request)
        return Published(self, name, lease.id, request.read_only)

    def unpublish(self, name):
        """Removes a published name of this tenant; True when it was the block's last hold.
        Holds taken by lookup stay. ``NOT_FOUND`` for an unknown name."""
        return self._unpublish(name, quiet=False)

    def revoke_share(self, token):
        """Revokes a share token of this tenant (as :meth:`gpumemd.Share.revoke`, but
        ``NOT_FOUND`` for a token that is gone)."""
        return self._revoke_share(token, quiet=False)

    def _share(self, lease, expires_after, read_only, max_attaches):
        request = share_request(lease._session.id, lease, expires_after, read_only, max_attaches)
        return Share(self, self._call("Share", request), lease.id, request.read_only, max_attaches)

    def _unpublish(self, name, quiet):
        try:
            return self._call("Unpublish", pb.UnpublishRequest(session_id=self._live_session().id,
                                                               name=name)).block_returned
        except GpumemdError as e:
            if quiet and is_not_found(e):
                return False
            raise

    def _revoke_share(self, token, quiet):
        try:
            return self._call("RevokeShare", pb.RevokeShareRequest(session_id=self._live_session().id,
                                                                   token=token)).block_returned
        except GpumemdError as e:
            if quiet and is_not_found(e):
                return False
            raise

    def _call(self, method, request):
        """A unary Allocator call; its error as a GpumemdError."""
        if self._closing:
            raise closed_client()
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise GpumemdError.from_rpc(e) from None

    def _live_session(self):
        """The current session; when it is lost, a new one, opened with backoff (50 ms doubling
        to 2 s) for up to 10 s before it fails UNAVAILABLE."""
        s = self._s
        if not s.lost:
            return s
        with self._reopen_lock:
            s = self._s
            if not s.lost:
                return s
            deadline = time.monotonic() + _REOPEN_SECONDS
            backoff = _MIN_BACKOFF
            last = None
            while not self._closing:
                try:
                    opened = self._stub.OpenSession(self._open_request, metadata=self._metadata,
                                                    timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except grpc.RpcError as e:
                    last = GpumemdError.from_rpc(e)
                else:
                    nxt = _Session(self, opened, s.generation + 1)
                    log.info("gpumemd session %s of %s lost; opened new session %s (generation %d)",
                             s.id, self.client_name, nxt.id, nxt.generation)
                    self._attach(nxt)  # before others see it, so that their leases find it attached
                    self._earlier_maps_opened += s.mappings.maps_opened
                    self._s = nxt
                    return nxt
                if time.monotonic() + backoff > deadline:
                    break
                time.sleep(backoff)
                backoff = min(_MAX_BACKOFF, backoff * 2)
            if self._closing:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "the gpumemd client is closed")
            raise GpumemdError(grpc.StatusCode.UNAVAILABLE,
                               "session lost: the daemon restarted or ended it, and no new session could be "
                               "opened yet%s; retry" % ("" if last is None else " (%s)" % last))

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
        s.queue.put(_END)
        self._fail_pending(s, GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                           "session lost: the daemon restarted or ended it; retry"))
        s.mappings.close_all()

    def _lease_on_stream(self, s, device, size, zero, tag, timeout):
        request_id = next(self._ids)
        waiter = [threading.Lock(), None]
        waiter[0].acquire()
        s.pending[request_id] = waiter
        if s.lost or (s.done.is_set() and s.call is None):
            s.pending.pop(request_id, None)
            raise self._stream_down(s)
        s.queue.put(pb.StreamLease(request_id=request_id, device=device, size_bytes=size, zero=zero, tag=tag))
        if not waiter[0].acquire(timeout=-1 if timeout is None else timeout):
            if s.pending.pop(request_id, None) is None:
                waiter[0].acquire()  # the reply is being delivered right now: take it
            else:
                raise GpumemdError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "no answer from gpumemd to a lease within %s s" % timeout)
        result = waiter[1]
        if isinstance(result, GpumemdError):
            raise result
        return result

    @staticmethod
    def _stream_down(s):
        return GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
                            + (" and the session is lost (the next lease opens a new one)" if s.lost else "; retry"))

    def _close_lease(self, lease, event):
        """A lease closed: a release notice on the stream, or a Release call (see Lease.close)."""
        s = lease._session
        if s.lost:
            if event is not None:
                _cuda.destroy_event(lease.device, event[1])
            return  # dead with its session: nothing to give back, and its mappings are gone
        self._releases += 1
        try:
            if self._closing:
                return  # CloseSession took it back
            if event is not None:
                # With an IPC event: the unary call, so that the daemon has opened the event
                # before this process destroys it.
                handle, cu_event = event
                try:
                    self._release_unary(s, lease.id, handle)
                finally:
                    _cuda.destroy_event(lease.device, cu_event)
            elif self._stream_calls:
                s.queue.put(pb.StreamRelease(lease_id=lease.id))
            else:
                self._release_unary(s, lease.id, b"")
        finally:
            s.mappings.release(lease.segment_id)

    def _release_unary(self, s, lease_id, event_handle):
        try:
            self._stub.Release(pb.ReleaseRequest(session_id=s.id, lease_id=lease_id,
                                                 cuda_ipc_event_handle=event_handle), metadata=self._metadata)
        except grpc.RpcError as e:
            error = GpumemdError.from_rpc(e)
            if not ((self._closing or s.lost) and error.code == grpc.StatusCode.NOT_FOUND):
                raise error from None

    def _release_quietly(self, s, lease_id):
        try:
            self._stub.Release(pb.ReleaseRequest(session_id=s.id, lease_id=lease_id),
                               metadata=self._metadata, timeout=5)
        except grpc.RpcError:
            pass  # the session's end will take it back

    def _ack_unmapped(self, s, segment_id):
        if not self._closing and not s.lost:
            s.queue.put(("unmapped", segment_id))

    # ------------------------------------------------------------------ the KeepAlive stream

    def _requests(self, s, requests):
        """The stream's messages: the session id first, then whatever is queued, merged."""
        yield pb.KeepAliveRequest(session_id=s.id)
        while True:
            item = requests.get()
            if item is _END:
                return
            message = pb.KeepAliveRequest()
            end = False
            n = 0
            while True:
                if isinstance(item, pb.StreamRelease):
                    message.releases.append(item)
                elif isinstance(item, pb.StreamLease):
                    message.leases.append(item)
                else:
                    message.unmapped_segment_ids.append(item[1])
                n += 1
                if n >= _MAX_NOTICES:
                    break
                try:
                    item = requests.get_nowait()
                except queue.Empty:
                    break
                if item is _END:
                    end = True
                    break
            yield message
            if end:
                return

    def _run_stream(self, s):
        first_try = time.monotonic()
        while not s.lost:
            requests = s.queue
            call = self._stub.KeepAlive(self._requests(s, requests), metadata=self._metadata)
            s.call = call
            if s.lost:  # lost (unary NOT_FOUND) while the call started: _lose may have missed it
                call.cancel()
            code = grpc.StatusCode.OK
            details = ""
            try:
                for event in call:
                    self._on_event(s, event)
                    first_try = time.monotonic()
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            except Exception:  # a bug in an event handler: do not lose the session silently
                log.exception("gpumemd KeepAlive stream handler failed")
                call.cancel()
                code = grpc.StatusCode.INTERNAL
            s.call = None
            # Leases in flight on the broken stream get no reply: fail them so callers may retry.
            self._fail_pending(s, GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                               "the KeepAlive stream to gpumemd broke (%s); retry" % code.name))
            if self._closing or s.lost:
                break
            if code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND):
                self._lose(s, "ended by the daemon: %s" % ("stream completed" if code == grpc.StatusCode.OK else details))
                break
            elapsed_ms = (time.monotonic() - first_try) * 1000
            if elapsed_ms > s.keepalive_grace_ms:
                self._lose(s, "KeepAlive stream broken for %.0f ms, past the grace period (%s)" % (elapsed_ms, code.name))
                break
            # Within the grace period the daemon keeps the session: reattach on a fresh queue,
            # carrying over what the old stream had not taken yet.
            s.queue = queue.SimpleQueue()
            requests.put(_END)
            time.sleep(max(0.02, min(0.2, s.keepalive_grace_ms / 10000)))
            while True:
                try:
                    item = requests.get_nowait()
                except queue.Empty:
                    break
                if item is not _END:
                    s.queue.put(item)
        s.attached.set()
        s.done.set()
        self._fail_pending(s, self._stream_down(s))

    @staticmethod
    def _fail_pending(s, error):
        for request_id in list(s.pending):
            waiter = s.pending.pop(request_id, None)
            if waiter is not None:
                waiter[1] = error
                waiter[0].release()

    def _on_event(self, s, event):
        kind = event.WhichOneof("event")
        if kind == "lease_reply":
            reply = event.lease_reply
            waiter = s.pending.pop(reply.request_id, None)
            if waiter is None:
                if reply.HasField("lease"):  # its caller gave up: give it straight back
                    s.queue.put(pb.StreamRelease(lease_id=reply.lease.lease_id))
                return
            waiter[1] = reply.lease if reply.HasField("lease") else GpumemdError.from_stream(reply.error)
            waiter[0].release()
        elif kind == "unmap":
            s.mappings.unmap_requested(event.unmap.segment_id)
        elif kind == "attached":
            s.attached.set()
        elif kind == "release_failed":
            self._release_failures += 1
            failed = event.release_failed
            log.warning("gpumemd refused the release of lease %s: %s", failed.lease_id,
                        GpumemdError.from_stream(failed.error))
        elif kind == "shutdown":
            self.shutdown_notice = event.shutdown.drain_timeout_ms
            self._shutdown_event.set()
            log.info("gpumemd is shutting down; drain timeout %d ms", self.shutdown_notice)
            if self._on_shutdown is not None:
                try:
                    self._on_shutdown(self.shutdown_notice)
                except Exception:
                    log.exception("gpumemd on_shutdown callback failed")
        # return_cache, cache_allowance: this client keeps no cache tier (it asked for none)
        s.mappings.retry()

    # ------------------------------------------------------------------ closing

    def close(self):
        """Closes the session (the daemon releases what it still holds), unmaps every segment
        and closes the channel. Idempotent, also from several threads at once."""
        with self._close_lock:
            if self._closed:
                return
            self._closing = True
            with self._reopen_lock:  # a lease opening a new session finishes (or gives up) first
                s = self._s
            try:
                if not s.lost and s.call is not None:
                    # Pending releases go out, then the stream ends; once the daemon has ended
                    # its side it has applied them, before CloseSession (another HTTP/2 stream).
                    s.queue.put(_END)
                    s.done.wait(2)
                if not s.lost:
                    self._stub.CloseSession(pb.CloseSessionRequest(session_id=s.id),
                                            timeout=5, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    log.warning("gpumemd CloseSession failed: %s", GpumemdError.from_rpc(e))
            finally:
                call = s.call
                if call is not None:
                    call.cancel()
                s.queue.put(_END)
                s.thread.join(5)
                s.mappings.close_all()
                self._channel.close()
                self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "gpumemd.Client(%s, %s%s)" % (self.target, self.client_name, ", closed" if self._closed else "")
