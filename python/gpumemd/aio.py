"""The asyncio client: the same session, leases and events as :mod:`gpumemd`, over grpc.aio.

    async with await gpumemd.aio.connect("unix:///tmp/gpumemd.sock") as gm:
        async with await gm.lease(device=0, size=64 << 20) as lease:
            ...

The KeepAlive stream is a task on the event loop. Use a client from its loop only (it is not
thread-safe). A lease's ``close()`` works here too (a stream release is a notice; on the unary
path the Release call runs as a task); ``await lease.aclose()`` or ``async with`` also waits for
a unary Release and raises its error.
"""
import asyncio
import itertools
import logging
import os
import time

import grpc

from . import _cuda
from ._channel import open_channel, options
from ._errors import GpumemdError
from ._lease import Lease
from ._mapping import MappingCache
from ._sharing import (AsyncPublished, AsyncShare, closed_client, is_not_found, make_hold, publish_request,
                       share_request)
from ._stubs import pb, pb_grpc
from . import client as _sync
from .client import _MAX_NOTICES, ClientStats  # noqa: E402

log = logging.getLogger("gpumemd")
_END = object()


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
                  on_shutdown=None, timeout=10.0):
    """As :func:`gpumemd.connect`, for asyncio; ``on_shutdown`` may be a coroutine function."""
    client = AsyncClient(target, client_name, stream, token, root_certificates, private_key, certificate_chain,
                         on_shutdown)
    await client._open(ttl_seconds, timeout)
    return client


class _AsyncSession:
    """One session of an :class:`AsyncClient` (see :class:`gpumemd.client._Session`)."""

    def __init__(self, client, opened, generation):
        self.id = opened.session_id
        self.ttl_seconds = opened.ttl_seconds
        self.keepalive_grace_ms = opened.keepalive_grace_ms
        self.generation = generation
        self.lost = False
        self.queue = asyncio.Queue()
        self.pending = {}
        self.mappings = MappingCache(lambda segment_id: client._ack_unmapped(self, segment_id))
        self.attached = asyncio.Event()
        self.call = None
        self.task = None


class AsyncClient:
    """A connection to gpumemd with one session, for asyncio (see :func:`connect`). It survives
    a daemon restart as :class:`gpumemd.Client` does: the lost session's leases die, and the
    next lease opens a new session."""

    def __init__(self, target, client_name, stream, token, root_certificates, private_key, certificate_chain,
                 on_shutdown):
        credentials, self._metadata = options(root_certificates, private_key, certificate_chain, token)
        self.target = target
        self.client_name = client_name or "python-%d" % os.getpid()
        self._channel = open_channel(target, credentials, aio=True)
        self._stub = pb_grpc.AllocatorStub(self._channel)
        self._stream_calls = stream
        self._on_shutdown = on_shutdown
        self.shutdown_notice = None
        self._closing = False
        self._closed = False
        self._ids = itertools.count(1)
        self._leases = self._pool_hits = self._releases = self._release_failures = self._holds = 0
        self._earlier_maps_opened = 0
        self._tasks = set()
        self._s = None
        self._reopen_lock = None

    async def _open(self, ttl_seconds, timeout):
        self._open_request = pb.OpenSessionRequest(client_name=self.client_name, ttl_seconds=ttl_seconds,
                                                   client_cache_bytes=0)
        self._timeout = timeout
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

    @property
    def session_id(self):
        return self._s.id

    @property
    def ttl_seconds(self):
        return self._s.ttl_seconds

    @property
    def keepalive_grace_ms(self):
        return self._s.keepalive_grace_ms

    @property
    def session_lost(self):
        return self._s.lost

    @property
    def session_generation(self):
        return self._s.generation

    @property
    def channel(self):
        return self._channel

    @property
    def metadata(self):
        return self._metadata

    def stats(self):
        s = self._s
        return ClientStats(self._leases, self._pool_hits, self._releases, self._release_failures,
                           len(s.mappings), self._earlier_maps_opened + s.mappings.maps_opened, self._holds)

    async def wait_for_shutdown_notice(self, timeout=None):
        try:
            await asyncio.wait_for(self._shutdown_event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.shutdown_notice

    async def lease(self, device=0, size=None, *, zero=False, tag="", stream=None, timeout=None):
        """As :meth:`gpumemd.Client.lease`; an :class:`AsyncLease`."""
        if size is None:
            raise TypeError("lease() needs size")
        if self._closing:
            raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "the gpumemd client is closed")
        for attempt in (1, 2):
            s = await self._live_session()
            try:
                response = await self._lease_once(s, device, size, zero, tag, timeout)
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
            self._release_later(s, response.lease_id, b"", None, None)
            raise
        return AsyncLease(self, response, mapping, tag, stream, session=s)

    async def _lease_once(self, s, device, size, zero, tag, timeout):
        if self._stream_calls:
            if s.lost or s.task is None or s.task.done():
                raise GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
                                   + (" and the session is lost (the next lease opens a new one)" if s.lost else ""))
            request_id = next(self._ids)
            reply = asyncio.get_running_loop().create_future()
            s.pending[request_id] = reply
            s.queue.put_nowait(pb.StreamLease(request_id=request_id, device=device, size_bytes=size,
                                               zero=zero, tag=tag))
            try:
                return await asyncio.wait_for(reply, timeout)
            except asyncio.TimeoutError:
                s.pending.pop(request_id, None)
                raise GpumemdError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "no answer from gpumemd to a lease within %s s" % timeout) from None
        try:
            return await self._stub.Lease(pb.LeaseRequest(session_id=s.id, device=device, size_bytes=size,
                                                          zero=zero, tag=tag),
                                          timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            error = GpumemdError.from_rpc(e)
            if error.code == grpc.StatusCode.NOT_FOUND and "session" in error.message.lower():
                self._lose(s, "the daemon does not know it: %s" % error.message)
            raise error from None

    # ------------------------------------------------------------------ sharing

    async def attach(self, token, tag=""):
        """As :meth:`gpumemd.Client.attach`; an :class:`AsyncLease`."""
        s = await self._live_session()
        response = await self._call("Attach", pb.AttachRequest(session_id=s.id, token=token, tag=tag))
        return make_hold(self, s, response, tag, AsyncLease,
                         lambda lease_id: self._release_later(s, lease_id, b"", None, None))

    async def lookup(self, name, tag=""):
        """As :meth:`gpumemd.Client.lookup`; an :class:`AsyncLease`."""
        s = await self._live_session()
        response = await self._call("Lookup", pb.LookupRequest(session_id=s.id, name=name, tag=tag))
        return make_hold(self, s, response, tag, AsyncLease,
                         lambda lease_id: self._release_later(s, lease_id, b"", None, None))

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
        try:
            s = await self._live_session()
            return (await self._call("Unpublish", pb.UnpublishRequest(session_id=s.id, name=name))).block_returned
        except GpumemdError as e:
            if quiet and is_not_found(e):
                return False
            raise

    async def _revoke_share(self, token, quiet):
        try:
            s = await self._live_session()
            return (await self._call("RevokeShare", pb.RevokeShareRequest(session_id=s.id, token=token))).block_returned
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
            deadline = time.monotonic() + _sync._REOPEN_SECONDS
            backoff = _sync._MIN_BACKOFF
            last = None
            while not self._closing:
                try:
                    opened = await self._stub.OpenSession(self._open_request, metadata=self._metadata,
                                                          timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except grpc.RpcError as e:
                    last = GpumemdError.from_rpc(e)
                else:
                    nxt = _AsyncSession(self, opened, s.generation + 1)
                    log.info("gpumemd session %s of %s lost; opened new session %s (generation %d)",
                             s.id, self.client_name, nxt.id, nxt.generation)
                    await self._attach(nxt)
                    self._earlier_maps_opened += s.mappings.maps_opened
                    self._s = nxt
                    return nxt
                if time.monotonic() + backoff > deadline:
                    break
                await asyncio.sleep(backoff)
                backoff = min(_sync._MAX_BACKOFF, backoff * 2)
            if self._closing:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION, "the gpumemd client is closed")
            raise GpumemdError(grpc.StatusCode.UNAVAILABLE,
                               "session lost: the daemon restarted or ended it, and no new session could be "
                               "opened yet%s; retry" % ("" if last is None else " (%s)" % last))

    def _lose(self, s, why):
        """As :meth:`gpumemd.Client._lose`."""
        if s.lost:
            return
        s.lost = True
        if not self._closing:
            log.warning("gpumemd session %s of %s lost (%s); its leases are gone, the next lease opens a new session",
                        s.id, self.client_name, why)
        s.attached.set()
        if s.call is not None:
            s.call.cancel()
        s.queue.put_nowait(_END)
        self._fail_pending(s, GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                           "session lost: the daemon restarted or ended it; retry"))
        s.mappings.close_all()

    def _close_lease(self, lease, event):
        s = lease._session
        if s.lost:
            if event is not None:
                _cuda.destroy_event(lease.device, event[1])
            return None
        self._releases += 1
        try:
            if self._closing:
                return None
            if event is not None:
                return self._release_later(s, lease.id, event[0], lease.device, event[1])
            if self._stream_calls:
                s.queue.put_nowait(pb.StreamRelease(lease_id=lease.id))
                return None
            return self._release_later(s, lease.id, b"", None, None)
        finally:
            s.mappings.release(lease.segment_id)

    def _release_later(self, s, lease_id, event_handle, device, cu_event):
        async def release():
            try:
                await self._stub.Release(pb.ReleaseRequest(session_id=s.id, lease_id=lease_id,
                                                           cuda_ipc_event_handle=event_handle), metadata=self._metadata)
            except grpc.RpcError as e:
                error = GpumemdError.from_rpc(e)
                if not ((self._closing or s.lost) and error.code == grpc.StatusCode.NOT_FOUND):
                    raise error from None
            finally:
                if cu_event is not None:
                    _cuda.destroy_event(device, cu_event)

        task = asyncio.get_running_loop().create_task(release())
        self._tasks.add(task)
        task.add_done_callback(self._release_done)
        return task

    def _release_done(self, task):
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("gpumemd release failed: %s", task.exception())

    def _ack_unmapped(self, s, segment_id):
        if not self._closing and not s.lost:
            s.queue.put_nowait(("unmapped", segment_id))

    async def _requests(self, s, requests):
        yield pb.KeepAliveRequest(session_id=s.id)
        while True:
            item = await requests.get()
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
                if n >= _MAX_NOTICES or requests.empty():
                    break
                item = requests.get_nowait()
                if item is _END:
                    end = True
                    break
            yield message
            if end:
                return

    async def _run_stream(self, s):
        first_try = time.monotonic()
        while not s.lost:
            requests = s.queue
            call = self._stub.KeepAlive(self._requests(s, requests), metadata=self._metadata)
            s.call = call
            code, details = grpc.StatusCode.OK, ""
            try:
                async for event in call:
                    await self._on_event(s, event)
                    first_try = time.monotonic()
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
            s.call = None
            self._fail_pending(s, GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                               "the KeepAlive stream to gpumemd broke (%s); retry" % code.name))
            if self._closing or s.lost:
                break
            if code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND):
                self._lose(s, "ended by the daemon: %s" % (details or "stream completed"))
                break
            elapsed_ms = (time.monotonic() - first_try) * 1000
            if elapsed_ms > s.keepalive_grace_ms:
                self._lose(s, "KeepAlive stream broken for %.0f ms, past the grace period (%s)" % (elapsed_ms, code.name))
                break
            # Within the grace period the daemon keeps the session: reattach with what is queued.
            await asyncio.sleep(max(0.02, min(0.2, s.keepalive_grace_ms / 10000)))
        s.attached.set()
        self._fail_pending(s, GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
                                           + (" and the session is lost" if s.lost else "")))

    @staticmethod
    def _fail_pending(s, error):
        for request_id in list(s.pending):
            reply = s.pending.pop(request_id, None)
            if reply is not None and not reply.done():
                reply.set_exception(error)

    async def _on_event(self, s, event):
        kind = event.WhichOneof("event")
        if kind == "lease_reply":
            reply = event.lease_reply
            waiting = s.pending.pop(reply.request_id, None)
            if waiting is None or waiting.done():
                if reply.HasField("lease"):
                    s.queue.put_nowait(pb.StreamRelease(lease_id=reply.lease.lease_id))
            elif reply.HasField("lease"):
                waiting.set_result(reply.lease)
            else:
                waiting.set_exception(GpumemdError.from_stream(reply.error))
        elif kind == "unmap":
            s.mappings.unmap_requested(event.unmap.segment_id)
        elif kind == "attached":
            s.attached.set()
        elif kind == "release_failed":
            self._release_failures += 1
            log.warning("gpumemd refused the release of lease %s: %s", event.release_failed.lease_id,
                        GpumemdError.from_stream(event.release_failed.error))
        elif kind == "shutdown":
            self.shutdown_notice = event.shutdown.drain_timeout_ms
            self._shutdown_event.set()
            if self._on_shutdown is not None:
                try:
                    result = self._on_shutdown(self.shutdown_notice)
                    if asyncio.iscoroutine(result):
                        await result
                except Exception:
                    log.exception("gpumemd on_shutdown callback failed")
        s.mappings.retry()

    async def close(self):
        """As :meth:`gpumemd.Client.close`."""
        if self._closed or self._closing:
            while not self._closed:
                await asyncio.sleep(0.01)
            return
        self._closing = True
        async with self._reopen_lock:  # a lease opening a new session finishes (or gives up) first
            s = self._s
        try:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            if not s.lost and s.call is not None:
                s.queue.put_nowait(_END)
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
            await self._channel.close()
            self._closed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
