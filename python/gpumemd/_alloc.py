"""Framework allocators over gpumemd leases: the part PyTorch's and CuPy's share, and that runs
without either.

A :class:`LeaseAllocator` serves one client's allocations on one daemon device: each allocation
is an ordinary lease (counted against the session's quotas and the device budget, listed by the
daemon under its tag, given back when the session ends), found again by its pointer when the
framework frees it. The pointer is the lease's device pointer on a CUDA device; on a host device
(the host backend, used by the tests) it is the block's address in this process's mapping.

Leases of an allocator are never kept in the client cache tier: the framework caches above
(PyTorch's caching allocator, CuPy's memory pool), and what it gives back (``empty_cache``) should
reach the daemon.

:class:`FreeQueue` takes the frees that the C shim queued (PyTorch's free entry point never calls
Python, see ``_alloc_shim.c``) and releases their leases: on a background thread, and first thing
in every allocation, so that PyTorch's retry after an out-of-memory (it frees its cached segments
and allocates again) finds the memory back with the daemon.

Thread-safe: the pointer table is guarded by the allocator's lock; no lock of this module is held
while calling the daemon or the driver.
"""
import bisect
import collections
import contextlib
import gc
import logging
import threading
import weakref

import grpc

from . import _cuda
from ._errors import GpumemdError

log = logging.getLogger("gpumemd")

AllocatorStats = collections.namedtuple(
    "AllocatorStats", "allocations frees failures unknown_frees live_leases live_bytes peak_bytes")
AllocatorStats.__doc__ = """What a :class:`LeaseAllocator` did: ``allocations`` served (each a lease),
``frees`` (leases released), ``failures`` (allocations refused, see ``last_error``),
``unknown_frees`` (pointers that were not an allocation of it), and the leases it holds now, their
bytes and the most bytes it ever held."""


def pointer_of(lease):
    """The address a framework gets for ``lease``: its device pointer (CUDA) or its block's address
    in this process's mapping (host)."""
    if not lease.is_host:
        return lease.device_ptr
    lease._require_open()
    return lease._mapping.address + lease.offset


class LeaseAllocator:
    """Allocations of client ``client`` on its daemon's device ``device``, each a lease tagged
    ``tag``; a table from pointer to lease (see the module notes). Thread-safe."""

    def __init__(self, client, device=0, tag="gpumemd.alloc"):
        self.client = client
        self.device = device
        self.tag = tag
        #: The last refusal (a GpumemdError with the daemon's code and words), or None.
        self.last_error = None
        self._lock = threading.Lock()
        self._by_pointer = {}
        self._kept = []  # freed, but kept open: their release could not be ordered after their stream
        self._pointers = []  # sorted, for lease_of
        self._allocations = self._frees = self._failures = self._unknown_frees = 0
        self._live_bytes = self._peak_bytes = 0
        self._warned = False
        _live.add(self)

    # ------------------------------------------------------------------ allocating

    def allocate(self, size, local_device=None):
        """Leases ``size`` bytes; ``(pointer, lease)``. ``local_device``: the framework's CUDA
        ordinal, checked against the lease's (a pool of another GPU must not serve it). Raises
        GpumemdError (the daemon's, e.g. RESOURCE_EXHAUSTED); the refusal is also kept in
        :attr:`last_error` and counted."""
        try:
            lease = self.client.lease(self.device, size, tag=self.tag)
        except GpumemdError as e:
            self._refused(size, e)
            raise
        # Never kept in the client cache tier (see the module notes): released on close, as a
        # shared lease is.
        lease._shared = True
        try:
            if local_device is not None and not lease.is_host and lease.cuda_device != local_device:
                raise GpumemdError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "the gpumemd allocator of the daemon's device %d (cuda:%d in this process) was "
                                   "asked for memory on cuda:%d: make a pool per device"
                                   % (self.device, lease.cuda_device, local_device))
            pointer = pointer_of(lease)
        except GpumemdError as e:
            lease.close()
            self._refused(size, e)
            raise
        with self._lock:
            self._by_pointer[pointer] = lease
            bisect.insort(self._pointers, pointer)
            self._allocations += 1
            self._live_bytes += lease.size
            self._peak_bytes = max(self._peak_bytes, self._live_bytes)
        return pointer, lease

    def allocate_or_null(self, size, local_device=None):
        """:meth:`allocate` for a C caller: the pointer, or 0 when refused (never raises: an
        exception must not cross the C frames of PyTorch's allocator)."""
        try:
            return self.allocate(size, local_device)[0]
        except GpumemdError:
            return 0
        except BaseException as e:  # a bug here: log it, and let PyTorch report out-of-memory
            error = GpumemdError(grpc.StatusCode.INTERNAL, "gpumemd allocator failed: %r" % (e,))
            log.exception("gpumemd allocator: allocating %d bytes failed", size)
            self._refused(size, error, logged=True)
            return 0

    def _refused(self, size, error, logged=False):
        with self._lock:
            self.last_error = error
            self._failures += 1
        if not logged:
            # Once as a warning (PyTorch's own out-of-memory message does not carry the daemon's
            # words), then at debug level: an OOM retry loop should not flood the log.
            level = logging.DEBUG if self._warned else logging.WARNING
            self._warned = True
            log.log(level, "gpumemd allocator (daemon device %d, %s) refused %d bytes: %s",
                    self.device, self.tag, size, error)

    # ------------------------------------------------------------------ freeing

    def free(self, pointer, after=None, synchronize=True, keep_on_error=False):
        """Releases the lease at ``pointer``; False (counted, logged) when ``pointer`` is not an
        allocation of this allocator. ``after`` (CUDA): a stream; the release waits for the work
        queued on it (``Lease.close(after=...)``, the call does not wait). With
        ``keep_on_error``, an event that cannot be recorded on ``after`` (a stream of another
        device, a broken context) does not raise: the lease is kept, open, until the session ends
        (it is in :meth:`kept`), with a warning, since its work may still be queued; returns
        "kept". Without ``after``, and with
        ``synchronize``, the device's context is synchronized first, as ``cudaFree`` does, so no
        queued kernel touches the block once the daemon hands it on. Returns "synchronized" when
        it synchronized the device (a batch of frees needs that once per device)."""
        with self._lock:
            lease = self._by_pointer.pop(pointer, None)
            if lease is not None:
                del self._pointers[bisect.bisect_left(self._pointers, pointer)]
                self._frees += 1
                self._live_bytes -= lease.size
            else:
                self._unknown_frees += 1
        if lease is None:
            log.warning("gpumemd allocator (daemon device %d, %s): free of 0x%x, which it did not allocate; ignored",
                        self.device, self.tag, pointer)
            return False
        if lease.is_host or lease.closed or lease.lost:
            lease.close()
            return True
        if after is not None:
            try:
                lease.close(after=after)
            except GpumemdError as e:
                if not keep_on_error:
                    raise
                with self._lock:
                    self._kept.append(lease)
                log.warning("gpumemd allocator (daemon device %d, %s): the release of %s cannot be ordered after "
                            "stream 0x%x (%s); the lease is kept, and the session's end gives it back",
                            self.device, self.tag, lease.id, _cuda.stream_handle(after), e)
                return "kept"
            return True
        if synchronize:
            try:
                _cuda.synchronize(lease.cuda_device)
            except GpumemdError as e:  # a broken context runs nothing more: release all the same
                log.warning("gpumemd allocator: synchronize before releasing %s failed: %s", lease.id, e)
            lease.close()
            return "synchronized"
        lease.close()
        return True

    # ------------------------------------------------------------------ looking up

    def lease_of(self, pointer):
        """The live lease whose bytes contain ``pointer``, or None."""
        with self._lock:
            i = bisect.bisect_right(self._pointers, pointer) - 1
            if i < 0:
                return None
            start = self._pointers[i]
            lease = self._by_pointer[start]
            return lease if pointer < start + lease.size else None

    def leases(self):
        """The live leases, by pointer."""
        with self._lock:
            return [self._by_pointer[p] for p in self._pointers]

    def kept(self):
        """Leases freed by the framework but kept open, since their release could not be ordered
        after their stream (see :meth:`free`); the session's end gives them back."""
        with self._lock:
            return list(self._kept)

    def stats(self):
        with self._lock:
            return AllocatorStats(self._allocations, self._frees, self._failures, self._unknown_frees,
                                  len(self._by_pointer), self._live_bytes, self._peak_bytes)

    def __repr__(self):
        s = self.stats()
        return "LeaseAllocator(daemon device %d, %s, %d leases, %d bytes)" % (self.device, self.tag,
                                                                              s.live_leases, s.live_bytes)


_live = weakref.WeakSet()  # every LeaseAllocator of the process, for find_lease


def find_lease(pointer):
    """The live lease of any allocator of this process whose bytes contain ``pointer``, or None."""
    for allocator in list(_live):
        lease = allocator.lease_of(pointer)
        if lease is not None:
            return lease
    return None


class FreeQueue:
    """The frees the shim queued, handed to the allocators of their slots (see the module notes).

    ``background``: a daemon thread takes them as they come (the default); without it they wait
    for the next allocation or :meth:`drain` (tests use that to see the order of things).
    Thread-safe."""

    def __init__(self, shim, background=True):
        self.shim = shim
        self._allocators = {}  # slot -> LeaseAllocator
        self._cond = threading.Condition()
        self._handled = 0  # frees handled (compared with the shim's enqueued_total)
        self._thread = None
        self._background = background
        self._paused = False
        self._thread_idle = False

    def register(self, slot, allocator):
        with self._cond:
            self._allocators[slot] = allocator
        if self._background:
            self.start_background()

    def start_background(self):
        """Starts the background thread (once)."""
        with self._cond:
            self._background = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="gpumemd-allocator-frees")
                self._thread.start()

    def pause_background(self, timeout=5.0):
        """Stops the background thread from taking frees until :meth:`resume_background` (for
        tests that watch frees wait in the queue); returns once it is idle."""
        with self._cond:
            self._paused = True
            if self._thread is not None:
                self._cond.wait_for(lambda: self._thread_idle, timeout)

    def resume_background(self):
        with self._cond:
            self._paused = False
            self._cond.notify_all()
        self.start_background()

    def _run(self):
        while True:
            with self._cond:
                while self._paused:
                    self._thread_idle = True
                    self._cond.notify_all()
                    self._cond.wait()
                self._thread_idle = False
            items = self.shim.take_freed(64, 200)  # waits without the GIL
            if items:
                self._handle(items)

    def take_pending(self):
        """Handles every free queued now, on this thread; their number."""
        n = 0
        while self.shim.pending_frees():
            items = self.shim.take_freed(64, 0)
            if not items:
                break
            self._handle(items)
            n += len(items)
        return n

    def _handle(self, items):
        try:
            synchronized = set()
            for slot, pointer, size, device, stream in items:
                allocator = self._allocators.get(slot)
                if allocator is None:
                    log.warning("gpumemd allocator: free of 0x%x in slot %d, which has no allocator", pointer, slot)
                    continue
                try:
                    # One synchronize per device for the batch (PyTorch releases segments in bursts).
                    if allocator.free(pointer, synchronize=device not in synchronized) == "synchronized":
                        synchronized.add(device)  # only a real synchronize covers the rest of the batch
                except Exception:
                    log.exception("gpumemd allocator: releasing 0x%x failed", pointer)
        finally:
            with self._cond:
                self._handled += len(items)
                self._cond.notify_all()

    def drain(self, timeout=10.0):
        """Waits until every free queued before the call is handled (those on this thread, the
        rest by the background thread); True when they are, False after ``timeout`` seconds."""
        target = self.shim.enqueued_total()
        self.take_pending()
        with self._cond:
            return self._cond.wait_for(lambda: self._handled >= target, timeout)


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused():
    """No cyclic garbage collection while a framework's allocation leases under its allocator
    lock: a collection in another Python thread (the KeepAlive thread that must deliver the
    lease's reply, say) could drop a CUDA tensor and wait for that lock while holding the GIL,
    and the allocation, holding the lock, waits for that thread: a deadlock. Nested and
    concurrent pauses count; the collector comes back as the last one ends."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


_queue = None
_queue_lock = threading.Lock()


def free_queue(background=True):
    """The process's FreeQueue over the shim (built on first use: ShimUnavailable, a
    GpumemdError FAILED_PRECONDITION, without a C compiler)."""
    global _queue
    from . import _shim

    with _queue_lock:
        if _queue is None:
            _queue = FreeQueue(_shim.load(), background)
        return _queue


def bind(allocator, queue=None):
    """Gives ``allocator`` a slot of the shim: ``(path, alloc_name, free_name)``, what
    ``CUDAPluggableAllocator`` takes. The slot's alloc entry point handles the frees queued so far,
    then leases (or returns NULL); its free entry point queues (see ``_alloc_shim.c``)."""
    queue = queue or free_queue()

    def alloc(size, device, stream):
        with gc_paused():
            try:
                if queue.shim.pending_frees():
                    queue.take_pending()
            except Exception:
                log.exception("gpumemd allocator: releasing queued frees failed")
            return allocator.allocate_or_null(size, device)

    slot, alloc_name, free_name = queue.shim.take_slot(alloc)
    queue.register(slot, allocator)
    return queue.shim.path, alloc_name, free_name
