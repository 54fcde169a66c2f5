"""The synchronous client: one session, held by a background KeepAlive stream.

This module owns the client's I/O: blocking gRPC calls, the KeepAlive stream's thread and its
queue of notices, waiting for stream leases and sleeping between attempts. What a session's
events, loss and reopening mean is decided in :mod:`gpumemd._session`, shared with the asyncio
client. Thread-safe (see :class:`Client`).
"""
import logging
import os
import queue
import threading
import time

import grpc

from ._channel import open_channel, options
from ._deferred import DONE, FAILED, PollerThread
from ._errors import GpumemdError
from ._fdchannel import FdChannels
from ._lease import Lease
from ._session import ClientStats  # noqa: F401 (gpumemd.client.ClientStats, as before)
from ._cache import FLUSH_DELAY
from ._keepalive import END, FLUSH, Turn, reattach_delay, stream_error
from ._session import ClientCore, Reopening, SessionState, no_answer, open_request, stream_down
from ._sharing import Published, Share, closed_client, is_not_found, make_hold, publish_request, share_request
from ._sleep import BARRIER_SIZE, FLUSH as SLEEP_FLUSH, Call, check_barrier, run, sleep_steps, wake_steps
from ._stubs import pb, pb_grpc

log = logging.getLogger("gpumemd")

_REOPEN_SECONDS = 10.0  # per lease call, to open a new session after a loss (read at each, by gpumemd.aio too)


class _Session(SessionState):
    """A session of a :class:`Client`: its notices queue for the KeepAlive thread, and a
    pending stream lease is a :class:`_Waiter`."""

    def __init__(self, client, opened, generation):
        super().__init__(client, opened, generation, queue.SimpleQueue(), threading.Event())
        self.done = threading.Event()
        self.thread = None


class _Waiter:
    """A caller of a stream lease, blocked until its reply or error is settled (once: by
    whoever popped it from the session's pending leases)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self.result = None

    def settle(self, result):
        self.result = result
        self._lock.release()
        return True

    def wait(self, timeout):
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)


def connect(target="unix:///tmp/gpumemd.sock", client_name=None, *, stream=True, ttl_seconds=0,
            token=None, root_certificates=None, private_key=None, certificate_chain=None,
            on_shutdown=None, timeout=10.0, client_cache_bytes=None):
    """Connects to gpumemd and opens a session; use it as a context manager, or close() it.

    ``target``: ``unix:///path/to.sock`` (the daemon identifies the peer by its uid) or
    ``host:port``. ``client_name`` is shown in the daemon's listings and selects per-client
    quotas (default ``python-<pid>``). ``stream=True`` leases over the session's KeepAlive
    stream (one round trip a lease, releases not waited for); ``stream=False`` uses the unary
    Lease and Release calls. ``token``: a bearer token, sent on every call.
    ``root_certificates`` (PEM bytes or a path): TLS to a ``host:port`` target, with
    ``private_key`` and ``certificate_chain`` for mutual TLS. ``on_shutdown(drain_timeout_ms)``
    is called from the stream's thread when the daemon announces its shutdown.
    ``client_cache_bytes``: the most bytes of closed leases to keep in this process's cache tier
    (None: the daemon's default allowance, ``--client-cache-bytes``; 0: no tier; the daemon may
    grant less). The tier needs ``stream=True``.

    Raises :class:`GpumemdError` when the daemon cannot be reached or refuses the session.
    """
    return Client(target, client_name, stream=stream, ttl_seconds=ttl_seconds, token=token,
                  root_certificates=root_certificates, private_key=private_key,
                  certificate_chain=certificate_chain, on_shutdown=on_shutdown, timeout=timeout,
                  client_cache_bytes=client_cache_bytes)


class Client(ClientCore):
    """A connection to gpumemd with one session (see :func:`connect`).

    The session is held by a KeepAlive stream on a background thread: if this process dies,
    the daemon takes back its leases after the grace period; if the stream breaks, the client
    reattaches within it. The thread obeys the daemon's events: it unmaps the segments the
    daemon wants to free (once no live lease uses them) and acknowledges them, answers leases,
    logs refused releases, and records a shutdown notice (:attr:`shutdown_notice`, and the
    ``on_shutdown`` callback).

    The client cache tier (see :mod:`gpumemd._cache`): a closed lease is kept mapped in this
    process, within the allowance the daemon grants, and serves a later lease of its device
    without a round trip (best fit, by the daemon's size classes; ``zero=True`` zeroes the whole
    block here). The daemon hears of it in notices batched on the stream, and can ask for the
    memory back (ReturnCache, a smaller allowance, a shutdown): the stream's thread gives it back
    at once. A lease closed with ``after=``, and a shared, published or attached one, is never
    kept. The session's end gives everything back.

    If the daemon restarts (or ends the session), the session is lost: when the daemon ends the
    stream, when the stream stays broken past the grace period, or when a unary Lease gets
    NOT_FOUND for it. One warning is logged and everything of that session is dropped: its
    leases are dead (:attr:`Lease.lost`; ``close()`` does nothing, accessors raise), its
    mappings (a restarted daemon reuses segment ids), unsent notices and waiting leases. The next
    :meth:`lease` opens a new session, retrying with backoff (50 ms doubling to 2 s) for up to
    10 s; an INFO line names both session ids.

    Thread-safe: any thread may lease and close leases.
    """

    _session_class = _Session

    def __init__(self, target, client_name=None, *, stream=True, ttl_seconds=0, token=None,
                 root_certificates=None, private_key=None, certificate_chain=None, on_shutdown=None,
                 timeout=10.0, client_cache_bytes=None):
        credentials, metadata = options(root_certificates, private_key, certificate_chain, token)
        super().__init__(target, client_name or "python-%d" % os.getpid(), stream, on_shutdown, metadata,
                         credentials, aio=False)
        self._open_request = open_request(self.client_name, ttl_seconds, client_cache_bytes, stream)
        self._channel = open_channel(target, credentials)
        self._stub = pb_grpc.AllocatorStub(self._channel)
        self._timeout = timeout
        self._fd_channels = FdChannels(target, timeout)
        try:
            opened = self._stub.OpenSession(self._open_request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            self._channel.close()
            raise GpumemdError.from_rpc(e) from None
        self._shutdown_event = threading.Event()
        self._poller = PollerThread(self._deferred, self._release_ready, "gpumemd-releases-%s" % self.client_name)
        self._close_lock = threading.Lock()
        self._reopen_lock = threading.Lock()
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
    # channel, metadata, session_id, ttl_seconds, keepalive_grace_ms, session_lost,
    # session_generation and stats() are ClientCore's.

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
        self._check_lease(size)
        local = self._local_lease(device, size, zero, tag, stream)
        if local is not None:
            return local
        for attempt in (1, 2):
            s = self._live_session()
            try:
                response = self._lease_once(s, device, size, zero, tag, timeout)
                break
            except GpumemdError:
                if not (s.lost and attempt == 1):
                    raise  # else lost while this lease waited: once more, on a new session
        self._check_reply(s, response, device, size)
        return Lease(self, response, self._granted(s, response, tag), tag, stream, session=s)

    def _lease_once(self, s, device, size, zero, tag, timeout):
        if self._stream_calls:
            return self._lease_on_stream(s, device, size, zero, tag, timeout)
        try:
            return self._stub.Lease(pb.LeaseRequest(session_id=s.id, device=device, size_bytes=size,
                                                    zero=zero, tag=tag),
                                    timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._lease_error(s, e) from None

    # ------------------------------------------------------------------ sleep and wake

    def sleep(self, level=1, tags=None):
        """Puts this session's leases to sleep: their device memory is freed for others while
        the session keeps them, with their ids, addresses and views. Pause your own work on
        them first: touching a sleeping lease's memory faults (SIGSEGV on the host backend, a
        CUDA error on a GPU) until :meth:`wake`.

        ``level`` 1: the daemon keeps the contents in its host memory; 2: they are dropped (the
        wake gives zeroed memory). ``tags`` (a string or strings): only the segments holding a
        lease with one of these tags sleep, with every lease in them (segments are mapped
        whole); None: every lease. Cached closed leases are given back first, and closes are
        not cached until the wake. While anything sleeps, :meth:`lease` raises the daemon's
        ``FAILED_PRECONDITION``; closing a sleeping lease releases it.

        Returns a :data:`gpumemd.Slept` (lease ids, segment ids, host bytes, freed bytes).
        Raises :class:`GpumemdError` with the daemon's refusal, which changes nothing: every
        lease stays usable with its bytes (``FAILED_PRECONDITION`` for an attached lease, for a
        shared or published one that other sessions still hold after the daemon's
        ``--unmap-wait-ms``, or legacy CUDA IPC handles; ``RESOURCE_EXHAUSTED`` past the daemon's
        ``--offload-max-bytes``; ``INVALID_ARGUMENT`` for a level other than 1 or 2)."""
        s = self._live_session()
        return run(sleep_steps(self, s, level, tags), lambda effect: self._perform(s, effect))

    def wake(self):
        """Brings every sleeping lease back: each at its old address with its old bytes (level
        1) or zeros (level 2), so every memoryview, array and tensor made before the sleep is
        valid again. Returns a :data:`gpumemd.Woken` (lease ids; each slept segment id -> the
        segment it is in now). Raises :class:`GpumemdError` ``RESOURCE_EXHAUSTED`` when the
        daemon cannot get the memory back: the session stays asleep, try again later."""
        s = self._live_session()
        return run(wake_steps(self, s), lambda effect: self._perform(s, effect))

    def _answer_asked(self, s, steps):
        """Answers an admin's sleep or wake (see gpumemd._sleep.SleepAsks) on a thread of its own:
        the application's pause may block, and the stream's reader must not."""
        threading.Thread(target=run, args=(steps, lambda effect: self._perform(s, effect)),
                         name="gpumemd-sleep-asked", daemon=True).start()

    def _perform(self, s, effect):
        """One effect of a sleep's or wake's steps (see gpumemd._sleep), blocking."""
        if effect is SLEEP_FLUSH:
            return self._flush(s)
        if isinstance(effect, Call):
            return self._call(effect.method, effect.request)
        return effect.fn(*effect.args)

    def _flush(self, s):
        """Returns once the daemon has applied every release and notice sent so far: on the
        stream, the reply to a lease it refuses (see gpumemd._sleep.BARRIER_SIZE) comes after
        them; a unary release was answered before its close returned."""
        if not self._stream_calls:
            return
        try:
            granted = self._lease_on_stream(s, 0, BARRIER_SIZE, False, "", self._timeout)
        except GpumemdError as e:
            check_barrier(e)
        else:
            self._give_back(s, granted.lease_id)

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
        return make_hold(self, s, response, tag, Lease, lambda lease_id: self._give_back(s, lease_id))

    def lookup(self, name, tag=""):
        """A hold on the object published under ``name`` by this tenant (as :meth:`attach`).
        ``NOT_FOUND`` for an unknown name."""
        s = self._live_session()
        response = self._call("Lookup", pb.LookupRequest(session_id=s.id, name=name, tag=tag))
        return make_hold(self, s, response, tag, Lease, lambda lease_id: self._give_back(s, lease_id))

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
        return self._drop("Unpublish", lambda session_id: pb.UnpublishRequest(session_id=session_id, name=name), quiet)

    def _revoke_share(self, token, quiet):
        return self._drop("RevokeShare", lambda session_id: pb.RevokeShareRequest(session_id=session_id, token=token),
                          quiet)

    def _drop(self, method, request, quiet):
        """Unpublish or RevokeShare (``request(session_id)``): True when the block's last hold
        went with it; with ``quiet``, False for a name or token that is gone (NOT_FOUND)."""
        try:
            return self._call(method, request(self._live_session().id)).block_returned
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
            reopening = Reopening(time.monotonic(), _REOPEN_SECONDS)
            while not self._closing:
                try:
                    # wait_for_ready: wait for the channel to reconnect (within a second of the
                    # daemon coming back, see _channel) instead of failing at once with the
                    # error of the last connection attempt while it is between attempts.
                    opened = self._stub.OpenSession(self._open_request, metadata=self._metadata,
                                                    timeout=reopening.call_timeout(time.monotonic()),
                                                    wait_for_ready=True)
                except grpc.RpcError as e:
                    reopening.last = GpumemdError.from_rpc(e)
                else:
                    nxt = self._next_session(s, opened)
                    self._attach(nxt)  # before others see it, so that their leases find it attached
                    self._adopt(s, nxt)
                    return nxt
                delay = reopening.next_delay(time.monotonic())
                if delay is None:
                    break
                time.sleep(delay)
            raise reopening.error(self._closing)

    def _lease_on_stream(self, s, device, size, zero, tag, timeout):
        request_id = next(self._ids)
        waiter = _Waiter()
        s.pending[request_id] = waiter
        if s.lost or (s.done.is_set() and s.call is None):
            s.pending.pop(request_id, None)
            raise stream_down(s)
        s.queue.put(pb.StreamLease(request_id=request_id, device=device, size_bytes=size, zero=zero, tag=tag))
        if not waiter.wait(timeout):
            if s.pending.pop(request_id, None) is None:
                waiter.wait(None)  # the reply is being delivered right now: take it
            else:
                raise no_answer(timeout)
        if isinstance(waiter.result, GpumemdError):
            raise waiter.result
        return waiter.result

    def _release_call(self, s, lease):
        """The Release call for a closed lease (see ClientCore._send_release), blocking."""
        try:
            self._stub.Release(pb.ReleaseRequest(session_id=s.id, lease_id=lease.id), metadata=self._metadata)
        except grpc.RpcError as e:
            error = self._release_error(s, e)
            if error is not None:
                raise error from None

    def _give_back(self, s, lease_id):
        try:
            self._stub.Release(pb.ReleaseRequest(session_id=s.id, lease_id=lease_id),
                               metadata=self._metadata, timeout=5)
        except grpc.RpcError:
            pass  # the session's end will take it back

    # ------------------------------------------------------------------ stream-ordered releases

    def _wake_poller(self):
        """A release waits for its event: the poller thread (started on the first) polls it."""
        self._poller.wake()

    def _drain_deferred(self, seconds):
        """At close: waits up to ``seconds`` for the deferred releases to go out (their events
        to complete), then stops the poller and gives up the rest (ClientCore._abandon_deferred)."""
        self._poller.stop(seconds)
        self._abandon_deferred()

    # ------------------------------------------------------------------ the KeepAlive stream

    def _requests(self, s, requests, turn):
        """The stream's messages: the session id first, then (once ``turn`` comes) what to send
        again, then whatever is queued, merged (see :class:`gpumemd._keepalive.Turn`)."""
        def take():
            try:
                return requests.get_nowait()
            except queue.Empty:
                return None

        yield turn.opening(s)
        turn.event.wait()  # nothing more until the daemon confirms the stream
        if turn.again is None:
            return
        yield from turn.resent(s)
        while True:
            item = requests.get()
            if item is FLUSH:
                try:  # a message within the delay carries the tier's notices
                    item = requests.get(timeout=FLUSH_DELAY)
                except queue.Empty:
                    pass
            # Once the queue was swapped this stream is broken: the tier's notices wait for the next.
            message, stop, more = turn.compose(s, item, take, s.queue.put, s.cache if requests is s.queue else None)
            if message is not None:
                yield message
            if stop:
                return
            if more:
                requests.put(FLUSH)

    def _run_stream(self, s):
        first_try = time.monotonic()
        while not s.lost:
            requests = s.queue
            turn = s.turn = Turn(threading.Event())
            stub, retired = self._successors.stream_stub(self._stub, s.log.moving)
            self._close_channels(retired)
            call = stub.KeepAlive(self._requests(s, requests, turn), metadata=self._metadata)
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
                code, details = stream_error(s, e)
            except Exception:  # a bug in an event handler: do not lose the session silently
                log.exception("gpumemd KeepAlive stream handler failed")
                call.cancel()
                code = grpc.StatusCode.INTERNAL
            s.call = None
            turn.end()  # a request side still waiting for the attach ends
            if not self._stream_broke(s, code, details, time.monotonic() - first_try):
                break
            # Reattach on a fresh queue, carrying over what the old stream had not taken yet.
            s.queue = queue.SimpleQueue()
            requests.put(END)
            time.sleep(reattach_delay(s))
            while True:
                try:
                    item = requests.get_nowait()
                except queue.Empty:
                    break
                if item is not END:
                    s.queue.put(item)
        s.attached.set()
        s.done.set()  # before the pending leases fail: a lease that finds it unset gets failed
        self._fail_pending(s, stream_down(s))

    def _on_event(self, s, event):
        if self._take_event(s, event) and self._on_shutdown is not None:
            try:
                self._on_shutdown(self.shutdown_notice)
            except Exception:
                log.exception("gpumemd on_shutdown callback failed")
        s.mappings.retry()

    # ------------------------------------------------------------------ closing

    #: The GPU work on the session's memory is given this long at least, even when the
    #: deferred releases took the whole close bound.
    MIN_SYNC_WAIT = 0.1

    def close(self):
        """Closes the session (the daemon releases what it still holds), unmaps every segment
        and closes the channel. Nothing goes back to the daemon while this process's GPU work
        may still use it: the releases waiting for their events are waited for, then every CUDA
        device the session maps is synchronized, both within ``timeout`` (the client's); past
        it, or when the synchronize fails, the session is kept instead (see
        :mod:`gpumemd._deferred`). Idempotent, also from several threads at once."""
        with self._close_lock:
            if self._closed:
                return
            self._closing = True
            with self._reopen_lock:  # a lease opening a new session finishes (or gives up) first
                s = self._s
            deadline = time.monotonic() + self._timeout
            try:
                # Releases waiting for GPU work go out first (bounded), on the stream before it ends.
                self._drain_deferred(self._timeout)
                if not s.lost:
                    work = self._queued_work(s)
                    outcome = work.wait(max(deadline - time.monotonic(), self.MIN_SYNC_WAIT))
                    if outcome != DONE:
                        if self._keep_session(s, work, outcome, self._timeout):
                            threading.Thread(target=self._close_when_idle, args=(s, work), daemon=True,
                                             name="gpumemd-linger-%s" % self.client_name).start()
                        self._closed = True
                        return
            except BaseException:
                self._end_session(s)
                raise
            self._end_session(s)

    def _close_when_idle(self, s, work):
        """A kept session: closed once its GPU work has ended (kept for good if it failed)."""
        if work.wait() == DONE:
            self._end_session(s)
            log.info("gpumemd: the GPU work on session %s's blocks completed; the session is closed", s.id)
        else:
            self._keep_session(s, work, FAILED, 0)

    def _end_session(self, s):
        """CloseSession (after the stream's pending releases), then unmaps, closes the channel."""
        try:
            s.cache.drain(discard=False)  # no more local leases; CloseSession takes the cached ones
            if not s.lost and s.call is not None:
                # Pending releases go out, then the stream ends; once the daemon has ended
                # its side it has applied them, before CloseSession (another HTTP/2 stream).
                s.queue.put(END)
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
            s.queue.put(END)
            s.thread.join(5)
            s.mappings.close_all()
            self._fd_channels.close()
            self._channel.close()
            self._close_channels(self._successors.close())
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "gpumemd.Client(%s, %s%s)" % (self.target, self.client_name, ", closed" if self._closed else "")
