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
])

_END = object()
_MAX_NOTICES = 4096  # per KeepAlive message, far below gRPC's 4 MiB message limit


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
        try:
            opened = self._stub.OpenSession(pb.OpenSessionRequest(
                client_name=self.client_name, ttl_seconds=ttl_seconds, client_cache_bytes=0),
                timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            self._channel.close()
            raise GpumemdError.from_rpc(e) from None
        self.session_id = opened.session_id
        self.ttl_seconds = opened.ttl_seconds
        self.keepalive_grace_ms = opened.keepalive_grace_ms
        self._stream_calls = stream
        self._on_shutdown = on_shutdown
        #: None, or the daemon's drain timeout in ms once it announced its shutdown.
        self.shutdown_notice = None
        self._shutdown_event = threading.Event()
        self.session_lost = False
        self._closing = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._mappings = MappingCache(self._ack_unmapped)
        self._ids = itertools.count(1)
        self._pending = {}  # request id -> [lock held until the reply, reply or error]
        self._leases = 0
        self._pool_hits = 0
        self._releases = 0
        self._release_failures = 0
        self._queue = queue.SimpleQueue()
        self._attached = threading.Event()
        self._stream_done = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run_stream, name="gpumemd-keepalive-%s" % self.client_name,
                                        daemon=True)
        self._thread.start()
        if not self._attached.wait(timeout):
            log.warning("gpumemd session of %s: KeepAlive stream not attached after %.0f s", self.client_name, timeout)

    # ------------------------------------------------------------------ properties

    @property
    def channel(self):
        """The gRPC channel, for other services of the daemon (Admin, health)."""
        return self._channel

    @property
    def metadata(self):
        """The call metadata (the bearer token) to pass to calls on :attr:`channel`."""
        return self._metadata

    def stats(self):
        """What this client did since connect (a :data:`ClientStats`)."""
        return ClientStats(self._leases, self._pool_hits, self._releases, self._release_failures,
                           len(self._mappings), self._mappings.maps_opened)

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
        if self._stream_calls:
            response = self._lease_on_stream(device, size, zero, tag, timeout)
        else:
            try:
                response = self._stub.Lease(pb.LeaseRequest(session_id=self.session_id, device=device,
                                                            size_bytes=size, zero=zero, tag=tag),
                                            timeout=timeout, metadata=self._metadata)
            except grpc.RpcError as e:
                raise GpumemdError.from_rpc(e) from None
        self._leases += 1
        if response.pool_hit:
            self._pool_hits += 1
        try:
            mapping = self._mappings.acquire(response.device, response.handle)
        except BaseException:
            self._release_quietly(response.lease_id)  # unusable here: do not hold it until session end
            raise
        return Lease(self, response, mapping, tag, stream)

    def _lease_on_stream(self, device, size, zero, tag, timeout):
        request_id = next(self._ids)
        waiter = [threading.Lock(), None]
        waiter[0].acquire()
        self._pending[request_id] = waiter
        if self._stream_done.is_set() and self._call is None:
            self._pending.pop(request_id, None)
            raise self._stream_down()
        self._queue.put(pb.StreamLease(request_id=request_id, device=device, size_bytes=size, zero=zero, tag=tag))
        if not waiter[0].acquire(timeout=-1 if timeout is None else timeout):
            if self._pending.pop(request_id, None) is None:
                waiter[0].acquire()  # the reply is being delivered right now: take it
            else:
                raise GpumemdError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "no answer from gpumemd to a lease within %s s" % timeout)
        result = waiter[1]
        if isinstance(result, GpumemdError):
            raise result
        return result

    def _stream_down(self):
        return GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
                            + (" and the session is lost" if self.session_lost else "; retry"))

    def _close_lease(self, lease, event):
        """A lease closed: a release notice on the stream, or a Release call (see Lease.close)."""
        self._releases += 1
        try:
            if self._closing or self.session_lost:
                return  # CloseSession (or the session's end) took it back
            if event is not None:
                # With an IPC event: the unary call, so that the daemon has opened the event
                # before this process destroys it.
                handle, cu_event = event
                try:
                    self._release_unary(lease.id, handle)
                finally:
                    _cuda.destroy_event(lease.device, cu_event)
            elif self._stream_calls:
                self._queue.put(pb.StreamRelease(lease_id=lease.id))
            else:
                self._release_unary(lease.id, b"")
        finally:
            self._mappings.release(lease.segment_id)

    def _release_unary(self, lease_id, event_handle):
        try:
            self._stub.Release(pb.ReleaseRequest(session_id=self.session_id, lease_id=lease_id,
                                                 cuda_ipc_event_handle=event_handle), metadata=self._metadata)
        except grpc.RpcError as e:
            error = GpumemdError.from_rpc(e)
            if not ((self._closing or self.session_lost) and error.code == grpc.StatusCode.NOT_FOUND):
                raise error from None

    def _release_quietly(self, lease_id):
        try:
            self._stub.Release(pb.ReleaseRequest(session_id=self.session_id, lease_id=lease_id),
                               metadata=self._metadata, timeout=5)
        except grpc.RpcError:
            pass  # the session's end will take it back

    def _ack_unmapped(self, segment_id):
        if not self._closing:
            self._queue.put(("unmapped", segment_id))

    # ------------------------------------------------------------------ the KeepAlive stream

    def _requests(self, requests):
        """The stream's messages: the session id first, then whatever is queued, merged."""
        yield pb.KeepAliveRequest(session_id=self.session_id)
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

    def _run_stream(self):
        first_try = time.monotonic()
        while True:
            requests = self._queue
            call = self._stub.KeepAlive(self._requests(requests), metadata=self._metadata)
            self._call = call
            code = grpc.StatusCode.OK
            details = ""
            try:
                for event in call:
                    self._on_event(event)
                    first_try = time.monotonic()
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            except Exception:  # a bug in an event handler: do not lose the session silently
                log.exception("gpumemd KeepAlive stream handler failed")
                call.cancel()
                code = grpc.StatusCode.INTERNAL
            self._call = None
            # Leases in flight on the broken stream get no reply: fail them so callers may retry.
            self._fail_pending(GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                            "the KeepAlive stream to gpumemd broke (%s); retry" % code.name))
            if self._closing:
                break
            if code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND):
                self.session_lost = True
                log.warning("gpumemd session of %s ended by the daemon (%s)", self.client_name,
                            "stream completed" if code == grpc.StatusCode.OK else details)
                break
            elapsed_ms = (time.monotonic() - first_try) * 1000
            if elapsed_ms > self.keepalive_grace_ms:
                self.session_lost = True
                log.warning("gpumemd session of %s: KeepAlive stream lost for %.0f ms (%s); giving up",
                            self.client_name, elapsed_ms, code.name)
                break
            # Within the grace period the daemon keeps the session: reattach on a fresh queue,
            # carrying over what the old stream had not taken yet.
            self._queue = queue.SimpleQueue()
            requests.put(_END)
            time.sleep(max(0.02, min(0.2, self.keepalive_grace_ms / 10000)))
            while True:
                try:
                    item = requests.get_nowait()
                except queue.Empty:
                    break
                if item is not _END:
                    self._queue.put(item)
        self._attached.set()
        self._stream_done.set()
        self._fail_pending(self._stream_down())

    def _fail_pending(self, error):
        for request_id in list(self._pending):
            waiter = self._pending.pop(request_id, None)
            if waiter is not None:
                waiter[1] = error
                waiter[0].release()

    def _on_event(self, event):
        kind = event.WhichOneof("event")
        if kind == "lease_reply":
            reply = event.lease_reply
            waiter = self._pending.pop(reply.request_id, None)
            if waiter is None:
                if reply.HasField("lease"):  # its caller gave up: give it straight back
                    self._queue.put(pb.StreamRelease(lease_id=reply.lease.lease_id))
                return
            waiter[1] = reply.lease if reply.HasField("lease") else GpumemdError.from_stream(reply.error)
            waiter[0].release()
        elif kind == "unmap":
            self._mappings.unmap_requested(event.unmap.segment_id)
        elif kind == "attached":
            self._attached.set()
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
        self._mappings.retry()

    # ------------------------------------------------------------------ closing

    def close(self):
        """Closes the session (the daemon releases what it still holds), unmaps every segment
        and closes the channel. Idempotent, also from several threads at once."""
        with self._close_lock:
            if self._closed:
                return
            self._closing = True
            try:
                if not self.session_lost and self._call is not None:
                    # Pending releases go out, then the stream ends; once the daemon has ended
                    # its side it has applied them, before CloseSession (another HTTP/2 stream).
                    self._queue.put(_END)
                    self._stream_done.wait(2)
                if not self.session_lost:
                    self._stub.CloseSession(pb.CloseSessionRequest(session_id=self.session_id),
                                            timeout=5, metadata=self._metadata)
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    log.warning("gpumemd CloseSession failed: %s", GpumemdError.from_rpc(e))
            finally:
                call = self._call
                if call is not None:
                    call.cancel()
                self._queue.put(_END)
                self._thread.join(5)
                self._mappings.close_all()
                self._channel.close()
                self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "gpumemd.Client(%s, %s%s)" % (self.target, self.client_name, ", closed" if self._closed else "")
