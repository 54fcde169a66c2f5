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
from ._stubs import pb, pb_grpc
from .client import _MAX_NOTICES, ClientStats

log = logging.getLogger("gpumemd")
_END = object()


class AsyncLease(Lease):
    """A :class:`gpumemd.Lease` that can also be closed with ``await aclose()`` / ``async with``."""

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


class AsyncClient:
    """A connection to gpumemd with one session, for asyncio (see :func:`connect`)."""

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
        self.session_lost = False
        self._closing = False
        self._closed = False
        self._mappings = MappingCache(self._ack_unmapped)
        self._ids = itertools.count(1)
        self._pending = {}
        self._leases = self._pool_hits = self._releases = self._release_failures = 0
        self._queue = asyncio.Queue()
        self._call = None
        self._task = None
        self._tasks = set()

    async def _open(self, ttl_seconds, timeout):
        try:
            opened = await self._stub.OpenSession(pb.OpenSessionRequest(
                client_name=self.client_name, ttl_seconds=ttl_seconds, client_cache_bytes=0),
                timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            await self._channel.close()
            raise GpumemdError.from_rpc(e) from None
        self.session_id = opened.session_id
        self.ttl_seconds = opened.ttl_seconds
        self.keepalive_grace_ms = opened.keepalive_grace_ms
        self._shutdown_event = asyncio.Event()
        self._attached = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run_stream())
        try:
            await asyncio.wait_for(self._attached.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("gpumemd session of %s: KeepAlive stream not attached after %.0f s", self.client_name, timeout)

    @property
    def channel(self):
        return self._channel

    @property
    def metadata(self):
        return self._metadata

    def stats(self):
        return ClientStats(self._leases, self._pool_hits, self._releases, self._release_failures,
                           len(self._mappings), self._mappings.maps_opened)

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
        if self._stream_calls:
            if self._task is None or self._task.done():
                raise GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down")
            request_id = next(self._ids)
            reply = asyncio.get_running_loop().create_future()
            self._pending[request_id] = reply
            self._queue.put_nowait(pb.StreamLease(request_id=request_id, device=device, size_bytes=size,
                                                  zero=zero, tag=tag))
            try:
                response = await asyncio.wait_for(reply, timeout)
            except asyncio.TimeoutError:
                self._pending.pop(request_id, None)
                raise GpumemdError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   "no answer from gpumemd to a lease within %s s" % timeout) from None
        else:
            try:
                response = await self._stub.Lease(pb.LeaseRequest(session_id=self.session_id, device=device,
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
            self._release_later(response.lease_id, b"", None, None)
            raise
        return AsyncLease(self, response, mapping, tag, stream)

    def _close_lease(self, lease, event):
        self._releases += 1
        try:
            if self._closing or self.session_lost:
                return None
            if event is not None:
                return self._release_later(lease.id, event[0], lease.device, event[1])
            if self._stream_calls:
                self._queue.put_nowait(pb.StreamRelease(lease_id=lease.id))
                return None
            return self._release_later(lease.id, b"", None, None)
        finally:
            self._mappings.release(lease.segment_id)

    def _release_later(self, lease_id, event_handle, device, cu_event):
        async def release():
            try:
                await self._stub.Release(pb.ReleaseRequest(session_id=self.session_id, lease_id=lease_id,
                                                           cuda_ipc_event_handle=event_handle), metadata=self._metadata)
            except grpc.RpcError as e:
                error = GpumemdError.from_rpc(e)
                if not ((self._closing or self.session_lost) and error.code == grpc.StatusCode.NOT_FOUND):
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

    def _ack_unmapped(self, segment_id):
        if not self._closing:
            self._queue.put_nowait(("unmapped", segment_id))

    async def _requests(self, requests):
        yield pb.KeepAliveRequest(session_id=self.session_id)
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

    async def _run_stream(self):
        first_try = time.monotonic()
        while True:
            requests = self._queue
            call = self._stub.KeepAlive(self._requests(requests), metadata=self._metadata)
            self._call = call
            code, details = grpc.StatusCode.OK, ""
            try:
                async for event in call:
                    await self._on_event(event)
                    first_try = time.monotonic()
            except grpc.RpcError as e:
                code, details = e.code(), e.details()
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
            self._call = None
            self._fail_pending(GpumemdError(grpc.StatusCode.UNAVAILABLE,
                                            "the KeepAlive stream to gpumemd broke (%s); retry" % code.name))
            if self._closing:
                break
            if code in (grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND):
                self.session_lost = True
                log.warning("gpumemd session of %s ended by the daemon (%s)", self.client_name, details or "stream completed")
                break
            if (time.monotonic() - first_try) * 1000 > self.keepalive_grace_ms:
                self.session_lost = True
                log.warning("gpumemd session of %s: KeepAlive stream lost (%s); giving up", self.client_name, code.name)
                break
            # Within the grace period the daemon keeps the session: reattach with what is queued.
            await asyncio.sleep(max(0.02, min(0.2, self.keepalive_grace_ms / 10000)))
        self._attached.set()
        self._fail_pending(GpumemdError(grpc.StatusCode.UNAVAILABLE, "the KeepAlive stream to gpumemd is down"
                                        + (" and the session is lost" if self.session_lost else "")))

    def _fail_pending(self, error):
        for request_id in list(self._pending):
            reply = self._pending.pop(request_id, None)
            if reply is not None and not reply.done():
                reply.set_exception(error)

    async def _on_event(self, event):
        kind = event.WhichOneof("event")
        if kind == "lease_reply":
            reply = event.lease_reply
            waiting = self._pending.pop(reply.request_id, None)
            if waiting is None or waiting.done():
                if reply.HasField("lease"):
                    self._queue.put_nowait(pb.StreamRelease(lease_id=reply.lease.lease_id))
            elif reply.HasField("lease"):
                waiting.set_result(reply.lease)
            else:
                waiting.set_exception(GpumemdError.from_stream(reply.error))
        elif kind == "unmap":
            self._mappings.unmap_requested(event.unmap.segment_id)
        elif kind == "attached":
            self._attached.set()
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
        self._mappings.retry()

    async def close(self):
        """As :meth:`gpumemd.Client.close`."""
        if self._closed or self._closing:
            while not self._closed:
                await asyncio.sleep(0.01)
            return
        self._closing = True
        try:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            if not self.session_lost and self._call is not None:
                self._queue.put_nowait(_END)
                try:
                    await asyncio.wait_for(asyncio.shield(self._task), 2)
                except asyncio.TimeoutError:
                    pass
            if not self.session_lost:
                await self._stub.CloseSession(pb.CloseSessionRequest(session_id=self.session_id),
                                              timeout=5, metadata=self._metadata)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                log.warning("gpumemd CloseSession failed: %s", GpumemdError.from_rpc(e))
        finally:
            if self._call is not None:
                self._call.cancel()
            if self._task is not None:
                self._task.cancel()
                try:
                    await self._task
                except (asyncio.CancelledError, Exception):
                    pass
            self._mappings.close_all()
            await self._channel.close()
            self._closed = True

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
