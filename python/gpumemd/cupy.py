"""CuPy allocates through gpumemd: an allocator for ``cupy.cuda.set_allocator`` whose memory is
leases.

    import cupy, gpumemd, gpumemd.cupy
    gm = gpumemd.connect("unix:///run/gpumemd/gpumemd.sock")
    with gpumemd.cupy.allocator(gm, device=0):       # restores the previous allocator at the end
        a = cupy.ones((4096, 4096), dtype=cupy.float32)  # in a lease of gm's session

Each allocation is one lease (tag ``cupy``), counted against the session's quotas and the device
budget and given back when the process dies; CuPy frees it when the last array on it is gone,
and the release waits for the work queued so far on CuPy's current stream (``Lease.close(after=
stream)``: an event, polled by a client thread; the freeing thread does not wait). A lease per
allocation costs a daemon round trip each time: for many small arrays put CuPy's own pool on top,
``allocator(gm, device, pooled=True)`` (a ``cupy.cuda.MemoryPool`` over this allocator, whose
``free_all_blocks()`` gives the leases back).

A refusal for lack of memory (``RESOURCE_EXHAUSTED``: budget or quota) raises
``cupy.cuda.memory.OutOfMemoryError`` whose message carries the daemon's words (its
``__cause__`` the :class:`gpumemd.GpumemdError`); other refusals raise the GpumemdError itself.
CuPy calls the allocator on the allocating thread, with no lock of its own: nothing here holds a
lock across the lease.
"""
import grpc

import cupy as _cupy  # the framework (this module is gpumemd.cupy; imports are absolute)

from . import _alloc
from ._errors import GpumemdError

__all__ = ["Allocator", "allocator", "lease_of"]


class _Owner:
    """Keeps a lease while CuPy's memory object lives; releases it after CuPy's current stream
    when CuPy drops it."""

    __slots__ = ("_allocator", "_pointer", "__weakref__")

    def __init__(self, lease_allocator, pointer):
        self._allocator = lease_allocator
        self._pointer = pointer

    def __del__(self):
        try:
            stream = _cupy.cuda.get_current_stream().ptr
            self._allocator.free(self._pointer, after=stream)
        except Exception:  # interpreter shutdown: the session's end gives it back
            pass


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
        try:
            pointer, lease = self.gpumemd.allocate(size, _cupy.cuda.runtime.getDevice())
        except GpumemdError as e:
            if e.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            oom = _cupy.cuda.memory.OutOfMemoryError(size, self.gpumemd.stats().live_bytes)
            oom.args = ("%s; gpumemd: %s" % (oom.args[0] if oom.args else "out of memory", e.message),)
            raise oom from e
        memory = _cupy.cuda.UnownedMemory(pointer, size, _Owner(self.gpumemd, pointer), lease.cuda_device)
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
