"""CuPy allocates through gpumemd: an allocator for ``cupy.cuda.set_allocator`` whose memory is
leases.

    import cupy, gpumemd, gpumemd.cupy
    gm = gpumemd.connect("unix:///run/gpumemd/gpumemd.sock")
    with gpumemd.cupy.allocator(gm, device=0):       # restores the previous allocator at the end
        a = cupy.ones((4096, 4096), dtype=cupy.float32)  # in a lease of gm's session

Each allocation is one lease (tag ``cupy``), counted against the session's quotas and the device
budget and given back when the process dies; CuPy frees it when the last array on it is gone,
and the release waits for the work queued so far on the stream the allocation was made on
(``Lease.close(after=stream)``: an event, polled by a client thread; the freeing thread does not
wait). CuPy calls an allocator with just a size (``cupy.cuda.alloc``'s interface), on the
allocating thread, with that thread's current device and stream: the stream is taken then, as
CuPy's own memory pool ties a block to the stream current at its allocation, and held (so that it
outlives the memory). Not the stream current when the array is dropped: an array used on a
non-blocking stream, or freed from another thread or under another device, would otherwise come
back before its work. The event is recorded in the primary context of the lease's device (the
device of the allocation). If it cannot be recorded, the lease is kept, with a warning, and goes
back with the session's end, after the client's close has synchronized the device. A lease per
allocation costs a daemon round trip each time: for many small arrays put CuPy's own pool on top,
``allocator(gm, device, pooled=True)`` (a ``cupy.cuda.MemoryPool`` over this allocator, whose
``free_all_blocks()`` gives the leases back).

A refusal for lack of memory (``RESOURCE_EXHAUSTED``: budget or quota) raises
``cupy.cuda.memory.OutOfMemoryError`` whose message carries the daemon's words (its
``__cause__`` the :class:`gpumemd.GpumemdError`); other refusals raise the GpumemdError itself.
CuPy calls the allocator on the allocating thread, with no lock of its own: nothing here holds a
lock across the lease.
"""
import logging
import sys
import threading

import grpc

import cupy as _cupy  # the framework (this module is gpumemd.cupy; imports are absolute)

from . import _alloc
from ._errors import GpumemdError

__all__ = ["Allocator", "allocator", "lease_of"]

log = logging.getLogger("gpumemd")


class _Owner:
    """Keeps a lease while CuPy's memory object lives; when CuPy drops it, releases it after the
    work queued on the stream the allocation was made on (see the module notes)."""

    __slots__ = ("_allocator", "_pointer", "_stream", "_thread", "__weakref__")

    def __init__(self, lease_allocator, pointer, stream):
        self._allocator = lease_allocator
        self._pointer = pointer
        self._stream = stream  # a cupy Stream, held: it must outlive the memory
        self._thread = threading.get_ident()

    def __del__(self):
        try:
            _release(self._allocator, self._pointer, self._stream, self._thread)
        except Exception:  # noqa: BLE001 (nothing may escape __del__; the lease is kept, see _release)
            if not sys.is_finalizing():
                log.exception("gpumemd.cupy: releasing the allocation at 0x%x failed; the session's end gives it back",
                              self._pointer)


def _release(lease_allocator, pointer, stream, thread):
    """Releases the allocation at ``pointer`` after the work on ``stream`` (its allocation's),
    made on thread ``thread``."""
    after = stream.ptr
    if after == CU_STREAM_PER_THREAD and threading.get_ident() != thread:
        # The per-thread default stream is another stream on each thread: the allocating
        # thread's cannot be named from here, so wait for the device as cudaFree does.
        lease_allocator.free(pointer)
        return
    # after=0 is the legacy default stream of the lease's device's context: ordered after the
    # work of every blocking stream there, which is what an allocation on it was ordered with.
    lease_allocator.free(pointer, after=after, keep_on_error=True)


#: ``cudaStreamPerThread``: each thread's own default stream.
CU_STREAM_PER_THREAD = 2


class Allocator:
    """``allocator(size) -> cupy.cuda.MemoryPointer`` over a lease of client ``gm`` on the
    daemon's device ``device``; a context manager that installs it (``cupy.cuda.set_allocator``,
    process-wide) and restores the previous allocator at its end.

    ``gpumemd``: its :class:`gpumemd._alloc.LeaseAllocator` (``stats()``, ``last_error``,
    ``leases()``). ``pooled``: install a ``cupy.cuda.MemoryPool`` over this allocator instead
    (``pool``), so that CuPy caches blocks and asks for leases only to grow."""

    def __init__(self, gm, device=0, pooled=False):
        self.gpumemd = _alloc.LeaseAllocator(gm, device, tag="cupy")
        self.pool = _cupy.cuda.MemoryPool(self) if pooled else None
        self._previous = []

    def __call__(self, size):
        if size == 0:
            return _cupy.cuda.MemoryPointer(_cupy.cuda.memory.Memory(0), 0)
        # CuPy allocates on the calling thread, for its current device and stream (see the
        # module notes): both are taken now, not when the memory is freed.
        stream = _cupy.cuda.get_current_stream()
        try:
            pointer, lease = self.gpumemd.allocate(size, _cupy.cuda.runtime.getDevice())
        except GpumemdError as e:
            if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            oom = _cupy.cuda.memory.OutOfMemoryError(size, self.gpumemd.stats().live_bytes)
            oom.args = ("%s; gpumemd: %s" % (oom.args[0] if oom.args else "out of memory", e.message),)
            raise oom from e
        memory = _cupy.cuda.UnownedMemory(pointer, size, _Owner(self.gpumemd, pointer, stream), lease.cuda_device)
        return _cupy.cuda.MemoryPointer(memory, 0)

    def malloc(self):
        """What to install: the pool's ``malloc`` (pooled) or this allocator."""
        return self.pool.malloc if self.pool is not None else self

    def __enter__(self):
        getter = getattr(_cupy.cuda, "get_allocator", None)
        self._previous.append(getter() if getter is not None else _cupy.get_default_memory_pool().malloc)
        _cupy.cuda.set_allocator(self.malloc())
        return self

    def __exit__(self, *exc):
        _cupy.cuda.set_allocator(self._previous.pop())


def allocator(gm, device=0, pooled=False):
    """An :class:`Allocator` of client ``gm`` on the daemon's device ``device``; ``with
    gpumemd.cupy.allocator(gm, 0): ...`` allocates CuPy's arrays in leases inside the block."""
    return Allocator(gm, device, pooled)


def lease_of(array):
    """The gpumemd lease under a CuPy array allocated by an :class:`Allocator` (to share or
    publish it); ValueError for another array."""
    pointer = array.data.ptr
    lease = _alloc.find_lease(pointer)
    if lease is None:
        raise ValueError("array at 0x%x is not in gpumemd memory" % pointer)
    return lease
