"""The asyncio client: the same session, leases and events as :mod:`gpumemd`, over grpc.aio.

    async with await gpumemd.aio.connect("unix:///tmp/gpumemd.sock") as gm:
        async with await gm.lease(device=0, size=64 << 20) as lease:
            ...

The KeepAlive stream is a task on the event loop. Use a client from its loop only (it is not
thread-safe). A lease's ``close()`` works here too (a stream release is a notice; on the unary
path the Release call runs as a task); ``await lease.aclose()`` or ``async with`` also waits for
a unary Release and raises its error.

This module owns the asyncio client's I/O: awaited gRPC calls, the KeepAlive stream's task and
its queue, lease replies as futures, Release calls as tasks. What a session's events, loss and
reopening mean is decided in :mod:`gpumemd._session`, and what is sent on the stream in
:mod:`gpumemd._keepalive`, both shared with the sync client.
"""
import asyncio
import inspect
import logging
import os
import time

import grpc

from ._channel import open_channel, options
from ._deferred import DONE, FAILED
from ._errors import GpumemdError
from ._fdchannel import FdChannels
from ._lease import Lease
from ._cache import FLUSH_DELAY
from ._keepalive import END, FLUSH, FLUSH_NOW, Turn, reattach_delay, stream_error
from ._session import ClientCore, Reopening, SessionState, no_answer, open_request, stream_down
from ._sharing import (AsyncPublished, AsyncShare, closed_client, is_not_found, make_hold, publish_request,
                       share_request)
from ._sleep import (BARRIER_SIZE, FLUSH as SLEEP_FLUSH, Call, Hook, check_barrier, run_async, sleep_steps,
                     wake_steps)
from ._stubs import pb, pb_grpc
from . import client as _sync

log = logging.getLogger("gpumemd")


class AsyncLease(Lease):
    """A :class:`gpumemd.Lease` that can also be closed with ``await aclose()`` / ``async with``.
    ``await lease.share(...)`` gives an :class:`gpumemd.AsyncShare`."""

    async def aclose(self, after=None):
        self.close(after)
        release, self._release = self._release, None
        if release is not None:
            await release

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


async def connect(target="unix:///tmp/gpumemd.sock", client_name=None, *, stream=True, ttl_seconds=0,
                  token=None, root_certificates=None, private_key=None, certificate_chain=None,
                  on_shutdown=None, timeout=10.0, client_cache_bytes=None):
    """As :func:`gpumemd.connect`, for asyncio; ``on_shutdown`` may be a coroutine function.
    The client cache tier works as the sync client's; a local hit completes without awaiting."""
    client = AsyncClient(target, client_name, stream, token, root_certificates, private_key, certificate_chain,
                         on_shutdown)
    await client._open(ttl_seconds, timeout, client_cache_bytes)
    return client


class _AsyncSession(SessionState):
    """A session of an :class:`AsyncClient`: its notices queue for the KeepAlive task, and a
    pending stream lease is a :class:`_Reply`."""

    def __init__(self, client, opened, generation):
        super().__init__(client, opened, generation, asyncio.Queue(), asyncio.Event())
        self.task = None


class _Reply:
    """The reply to a stream lease, as a future its caller awaits."""

    def __init__(self):
        self.future = asyncio.get_running_loop().create_future()

    def settle(self, result):
        if self.future.done():
            return False  # its caller gave up
        if isinstance(result, GpumemdError):
            self.future.set_exception(result)
        else:
            self.future.set_result(result)
        return True


class AsyncClient(ClientCore):
    """A connection to gpumemd with one session, for asyncio (see :func:`connect`). It survives
    a daemon restart as :class:`gpumemd.Client` does: the lost session's leases die, and the
    next lease opens a new session."""

    _session_class = _AsyncSession

    def __init__(self, target, client_name, stream, token, root_certificates, private_key, certificate_chain,
                 on_shutdown):
        credentials, metadata = options(root_certificates, private_key, certificate_chain, token)
        super().__init__(target, client_name or "python-%d" % os.getpid(), stream, on_shutdown, metadata,
                         credentials, aio=True)
        self._channel = open_channel(target, credentials, aio=True)
        self._stub = pb_grpc.AllocatorStub(self._channel)
        self._tasks = set()
        self._asked_tasks = set()  # answers to an admin's sleep or wake, running
        self._channel_closes = set()  # closes of channels to a successor that went away, running
        self._poll_task = None  # polls the deferred releases while any is pending
        self._s = None
        self._reopen_lock = None

    async def _open(self, ttl_seconds, timeout, client_cache_bytes=None):
        self._open_request = open_request(self.client_name, ttl_seconds, client_cache_bytes, self._stream_calls)
        self._timeout = timeout
        self._fd_channels = FdChannels(self.target, timeout)
        try:
            opened = await self._stub.OpenSession(self._open_request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            await self._channel.close()
            raise GpumemdError.from_rpc(e) from None
        self._shutdown_event = asyncio.Event()
        self._reopen_lock = asyncio.Lock()
        self._s = _AsyncSession(self, opened, 1)
        await self._attach(self._s)

    async def _attach(self, s):
        s.task = asyncio.get_running_loop().create_task(self._run_stream(s))
        try:
            await asyncio.wait_for(s.attached.wait(), self._timeout)
        except asyncio.TimeoutError:
            log.warning("gpumemd session of %s: KeepAlive stream not attached after %.0f s", self.client_name,
                        self._timeout)

    async def wait_for_shutdown_notice(self, timeout=None):
        try:
            await asyncio.wait_for(self._shutdown_event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.shutdown_notice

    async def lease(self, device=0, size=None, *, zero=False, tag="", stream=None, timeout=None):
        """As :meth:`gpumemd.Client.lease`; an :class:`AsyncLease`."""
        self._check_lease(size)
        local = self._local_lease(device, size, zero, tag, stream)
        if local is not None:
            return local
        for attempt in (1, 2):
            s = await self._live_session()
            try:
                response = await self._lease_once(s, device, size, zero, tag, timeout)
                break
            except GpumemdError:
                if not (s.lost and attempt == 1):
                    raise  # else lost while this lease waited: once more, on a new session
        self._check_reply(s, response, device, size)  # before a descriptor is fetched for it
        descriptor = await self._descriptor(s, response.handle, False, response.lease_id)
        return AsyncLease(self, response, self._granted(s, response, tag, descriptor), tag, stream, session=s)

    async def _descriptor(self, s, handle, read_only, lease_id):
        """The descriptor of a segment passed by descriptor and not mapped here yet, fetched on
        an executor thread (the fd channel's socket blocks); None for any other handle. A lease
        whose descriptor cannot be had is given back."""
        if not s.mappings.needs_descriptor(handle, read_only):
            return None
        try:
            return await asyncio.get_running_loop().run_in_executor(None, self._fd_channels.fetch, s.id, handle,
                                                                    read_only)
        except BaseException:
            self._give_back(s, lease_id)
            raise

    async def _lease_once(self, s, device, size, zero, tag, timeout):
        if self._stream_calls:
            if s.lost or s.task is None or s.task.done():
                raise stream_down(s)
            request_id = next(self._ids)
            reply = _Reply()
            s.pending[request_id] = reply
            s.queue.put_nowait(pb.StreamLease(request_id=request_id, device=device, size_bytes=size,
                                               zero=zero, tag=tag))
            try:
                return await asyncio.wait_for(reply.future, timeout)
            except asyncio.TimeoutError:
                s.pending.pop(request_id, None)
                raise no_answer(timeout) from None
        try:
            return await self._stub.Lease(pb.LeaseRequest(session_id=s.id, device=device, size_bytes=size,
                                                          zero=zero, tag=tag),
                                          timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise self._lease_error(s, e) from None

    # ------------------------------------------------------------------ sleep and wake

    async def sleep(self, level=1, tags=None):
        """As :meth:`gpumemd.Client.sleep` (pause your work on the session's memory first);
        the mapping work runs on the loop's executor."""
        s = await self._live_session()
        return await run_async(sleep_steps(self, s, level, tags), lambda effect: self._perform(s, effect))

    async def wake(self):
        """As :meth:`gpumemd.Client.wake`."""
        s = await self._live_session()
        return await run_async(wake_steps(self, s), lambda effect: self._perform(s, effect))

    def _answer_asked(self, s, steps):
        """Answers an admin's sleep or wake (see gpumemd._sleep.SleepAsks) in a task on this loop,
        off the stream's reader; the task is kept until it ends."""
        task = asyncio.get_running_loop().create_task(run_async(steps, lambda effect: self._perform(s, effect)))
        self._asked_tasks.add(task)
        task.add_done_callback(self._asked_tasks.discard)

    async def _perform(self, s, effect):
        """One effect of a sleep's or wake's steps (see gpumemd._sleep): calls awaited, the
        blocking work (mmap, CUDA, the fd channel) on an executor thread."""
        if effect is SLEEP_FLUSH:
            return await self._flush(s)
        if isinstance(effect, Call):
            return await self._call(effect.method, effect.request)
        if isinstance(effect, Hook):  # the application's callback, on the loop; a coroutine is awaited
            result = effect.fn(*effect.args)
            return (await result) if inspect.isawaitable(result) else result
        return await asyncio.get_running_loop().run_in_executor(None, effect.fn, *effect.args)

    async def _flush(self, s):
        """As :meth:`gpumemd.Client._flush`; on the unary path the Release tasks are awaited."""
        if not self._stream_calls:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            return
        try:
            granted = await self._lease_once(s, 0, BARRIER_SIZE, False, "", self._timeout)
        except GpumemdError as e:
            check_barrier(e)
        else:
            self._give_back(s, granted.lease_id)

    # ------------------------------------------------------------------ sharing

    async def attach(self, token, tag=""):
        """As :meth:`gpumemd.Client.attach`; an :class:`AsyncLease`."""
        return await self._hold("Attach", lambda session_id: pb.AttachRequest(session_id=session_id, token=token,
                                                                               tag=tag), tag)

    async def lookup(self, name, tag=""):
        """As :meth:`gpumemd.Client.lookup`; an :class:`AsyncLease`."""
        return await self._hold("Lookup", lambda session_id: pb.LookupRequest(session_id=session_id, name=name,
                                                                               tag=tag), tag)

    async def _hold(self, method, request, tag):
        """Attach or Lookup (``request(session_id)``): the hold, checked, its descriptor fetched, mapped."""
        s = await self._live_session()
        response = await self._call(method, request(s.id))
        self._check_reply(s, response.lease)  # before a descriptor is fetched for it
        descriptor = await self._descriptor(s, response.lease.handle, response.read_only, response.lease.lease_id)
        return make_hold(self, s, response, tag, AsyncLease, lambda lease_id: self._give_back(s, lease_id), descriptor)

    async def publish(self, lease, name, read_only=False):
        """As :meth:`gpumemd.Client.publish`; an :class:`gpumemd.AsyncPublished`."""
        request = publish_request(self, lease, name, read_only)
        await self._call("Publish", request)
        return AsyncPublished(self, name, lease.id, request.read_only)

    async def unpublish(self, name):
        """As :meth:`gpumemd.Client.unpublish`."""
        return await self._unpublish(name, quiet=False)

    async def revoke_share(self, token):
        """As :meth:`gpumemd.Client.revoke_share`."""
        return await self._revoke_share(token, quiet=False)

    async def _share(self, lease, expires_after, read_only, max_attaches):
        request = share_request(lease._session.id, lease, expires_after, read_only, max_attaches)
        return AsyncShare(self, await self._call("Share", request), lease.id, request.read_only, max_attaches)

    async def _unpublish(self, name, quiet):
        return await self._drop("Unpublish", lambda session_id: pb.UnpublishRequest(session_id=session_id, name=name),
                                quiet)

    async def _revoke_share(self, token, quiet):
        return await self._drop("RevokeShare",
                                lambda session_id: pb.RevokeShareRequest(session_id=session_id, token=token), quiet)

    async def _drop(self, method, request, quiet):
        """As :meth:`gpumemd.Client._drop`."""
        try:
            s = await self._live_session()
            return (await self._call(method, request(s.id))).block_returned
        except GpumemdError as e:
            if quiet and is_not_found(e):
                return False
            raise

    async def _call(self, method, request):
        if self._closing:
            raise closed_client()
        try:
            return await getattr(self._stub, method)(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise GpumemdError.from_rpc(e) from None

    async def _live_session(self):
        """As :meth:`gpumemd.Client._live_session`."""
        s = self._s
        if not s.lost:
            return s
        async with self._reopen_lock:
            s = self._s
            if not s.lost:
                return s
            reopening = Reopening(time.monotonic(), _sync._REOPEN_SECONDS)
            while not self._closing:
                try:
                    # wait_for_ready: see the sync client.
                    opened = await self._stub.OpenSession(self._open_request, metadata=self._metadata,
                                                          timeout=reopening.call_timeout(time.monotonic()),
                                                          wait_for_ready=True)
                except grpc.RpcError as e:
                    reopening.last = GpumemdError.from_rpc(e)
                else:
                    nxt = self._next_session(s, opened)
                    await self._attach(nxt)
                    self._adopt(s, nxt)
                    return nxt
                delay = reopening.next_delay(time.monotonic())
                if delay is None:
                    break
                await asyncio.sleep(delay)
            raise reopening.error(self._closing)

    def _release_call(self, s, lease):
        """The Release call for a closed lease (see ClientCore._send_release), as a task."""
        return self._release_later(s, lease.id)

    def _give_back(self, s, lease_id):
        self._release_later(s, lease_id)

    def _release_later(self, s, lease_id):
        async def release():
            try:
                await self._stub.Release(pb.ReleaseRequest(session_id=s.id, lease_id=lease_id),
                                         metadata=self._metadata)
            except grpc.RpcError as e:
                error = self._release_error(s, e)
                if error is not None:
                    raise error from None

        task = asyncio.get_running_loop().create_task(release())
        self._tasks.add(task)
        task.add_done_callback(self._release_done)
        return task

    def _release_done(self, task):
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("gpumemd release failed: %s", task.exception())

    def _wake_poller(self):
        """A release waits for its event: a task polls the deferred releases while any is pending."""
        if self._poll_task is None or self._poll_task.done():
            self._poll_task = asyncio.get_running_loop().create_task(self._poll_releases())

    async def _poll_releases(self):
        """Sends each deferred release once its event has completed (cuEventQuery does not
        block the loop), sleeping DeferredReleases.delay() between polls; ends when none is left."""
        while len(self._deferred):
            self._release_ready()
            if len(self._deferred):
                await asyncio.sleep(self._deferred.delay())

    async def _drain_deferred(self, seconds):
        """At close: as the sync client's (bounded wait, then the rest given up)."""
        task = self._poll_task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), seconds)
            except asyncio.TimeoutError:
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
        self._abandon_deferred()

    async def _requests(self, s, requests, turn):
        def take():
            return None if requests.empty() else requests.get_nowait()

        yield turn.opening(s)
        await turn.event.wait()  # nothing more until the daemon confirms the stream
        if turn.again is None:
            return
        for message in turn.resent(s):
            yield message
        while True:
            item = await requests.get()
            if item is FLUSH:
                # A message within the delay carries the tier's notices; else the timer's flush.
                # (A timer, not wait_for: that would make a task for every flush.)
                asyncio.get_running_loop().call_later(FLUSH_DELAY, requests.put_nowait, FLUSH_NOW)
                continue
            message, stop, more = turn.compose(s, item, take, requests.put_nowait, s.cache)
            if message is not None:
                yield message
            if stop:
                return
            if more:
                requests.put_nowait(FLUSH)

    async def _run_stream(self, s):
        first_try = time.monotonic()
        while not s.lost:
            requests = s.queue
            turn = s.turn = Turn(asyncio.Event())
            stub, retired = self._successors.stream_stub(self._stub, s.log.moving)
            for channel in retired:
                await channel.close()
            call = stub.KeepAlive(self._requests(s, requests, turn), metadata=self._metadata)
            s.call = call
            code, details = grpc.StatusCode.OK, ""
            try:
                async for event in call:
                    await self._on_event(s, event)
                    first_try = time.monotonic()
            except grpc.RpcError as e:
                code, details = stream_error(s, e)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
            s.call = None
            turn.end()  # a request side still waiting for the attach ends
            if not self._stream_broke(s, code, details, time.monotonic() - first_try):
                break
            # Reattach with what is queued.
            await asyncio.sleep(reattach_delay(s))
        s.attached.set()
        self._fail_pending(s, stream_down(s))

    def _close_channels(self, channels):
        """As :meth:`ClientCore._close_channels`: an asyncio channel's close is a coroutine, run as
        a task (kept until done) on this loop, where the events are taken."""
        for channel in channels:
            task = asyncio.get_running_loop().create_task(channel.close())
            self._channel_closes.add(task)
            task.add_done_callback(self._channel_closes.discard)

    async def _on_event(self, s, event):
        if self._take_event(s, event) and self._on_shutdown is not None:
            try:
                result = self._on_shutdown(self.shutdown_notice)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("gpumemd on_shutdown callback failed")
        s.mappings.retry()

    async def close(self):
        """As :meth:`gpumemd.Client.close`. A session kept past the bound is closed by a task on
        this loop once its GPU work ends; should the loop end first, the task is cancelled, the
        stream with it, and the daemon takes the session back after its grace period."""
        if self._closed or self._closing:
            while not self._closed:
                await asyncio.sleep(0.01)
            return
        self._closing = True
        async with self._reopen_lock:  # a lease opening a new session finishes (or gives up) first
            s = self._s
        deadline = time.monotonic() + self._timeout
        try:
            # Releases waiting for GPU work go out first (bounded), before the stream ends.
            await self._drain_deferred(self._timeout)
            if not s.lost:
                work = self._queued_work(s)
                loop = asyncio.get_running_loop()
                left = max(deadline - time.monotonic(), _sync.Client.MIN_SYNC_WAIT)
                outcome = await loop.run_in_executor(None, work.wait, left)
                if outcome != DONE:
                    if self._keep_session(s, work, outcome, self._timeout):
                        self._linger_task = loop.create_task(self._close_when_idle(s, work))
                    self._closed = True
                    return
        except BaseException:
            await self._end_session(s)
            raise
        await self._end_session(s)

    async def _close_when_idle(self, s, work):
        """A kept session: closed once its GPU work has ended (kept for good if it failed)."""
        outcome = await asyncio.get_running_loop().run_in_executor(None, work.wait)
        if outcome == DONE:
            await self._end_session(s)
            log.info("gpumemd: the GPU work on session %s's blocks completed; the session is closed", s.id)
        else:
            self._keep_session(s, work, FAILED, 0)

    async def _end_session(self, s):
        """CloseSession (after the stream's pending releases), then unmaps, closes the channel."""
        try:
            s.cache.drain(discard=False)  # no more local leases; CloseSession takes the cached ones
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            if not s.lost and s.call is not None:
                s.queue.put_nowait(END)
                try:
                    await asyncio.wait_for(asyncio.shield(s.task), 2)
                except asyncio.TimeoutError:
                    pass
            if not s.lost:
                await self._stub.CloseSession(pb.CloseSessionRequest(session_id=s.id),
                                              timeout=5, metadata=self._metadata)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                log.warning("gpumemd CloseSession failed: %s", GpumemdError.from_rpc(e))
        finally:
            if s.call is not None:
                s.call.cancel()
            if s.task is not None:
                s.task.cancel()
                try:
                    await s.task
                except (asyncio.CancelledError, Exception):
                    pass
            s.mappings.close_all()
            self._fd_channels.close()
            await self._channel.close()
            for channel in self._successors.close():
                await channel.close()
            self._closed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
