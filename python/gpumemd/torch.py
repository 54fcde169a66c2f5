"""PyTorch allocates through gpumemd: a ``torch.cuda.MemPool`` whose segments are leases.

    import gpumemd, gpumemd.torch, torch
    gm = gpumemd.connect("unix:///run/gpumemd/gpumemd.sock")
    pool = gpumemd.torch.mem_pool(gm, device=0)
    with torch.cuda.use_mem_pool(pool):          # or gpumemd.torch.use_mem_pool(pool)
        x = torch.randn(4096, 4096, device="cuda")   # in a lease of gm's session

PyTorch's caching allocator stays on top: it asks the pool's allocator for segments (2 MiB for
small tensors, the rounded request for large ones) and caches them; each segment is one lease,
counted against the session's quotas and the device budget, listed by the daemon (tag
``torch``), and given back when the process dies. A segment PyTorch releases (``empty_cache``,
its retry after an out-of-memory, a deleted pool) is released to the daemon after a
synchronize of the device, as ``cudaFree`` would.

The allocator is ``torch.cuda.memory.CUDAPluggableAllocator`` over the C shim (``_alloc_shim.c``,
built with the system C compiler on first use; see :mod:`gpumemd._shim`). Its free entry point
never calls Python, so a segment release under PyTorch's allocator lock never waits for the GIL;
its alloc entry point calls Python (the lease) under that lock, as vLLM's ``CuMemAllocator`` does.
Cyclic garbage collection is paused while an allocation leases (a collection in the KeepAlive
thread could drop a CUDA tensor and wait for the allocator lock while holding the GIL). That
leaves one lock-order hazard, shared with every Python-backed pluggable allocator: a thread
that holds the GIL while it waits for the same device's allocator lock (dropping the last
reference to a CUDA tensor of that device does) while another thread's pool allocation is
leasing. Allocate in the pool from one thread at a time, or from threads that do not free CUDA
tensors meanwhile. Without a C compiler the allocator is made from ctypes callbacks handed to
PyTorch's private ``torch._C._cuda_customAllocator`` (as PyTorch's own ``_use_uvm`` does), and
then frees call Python under the allocator lock too (a warning says so once).

A refusal of the daemon (``RESOURCE_EXHAUSTED``: budget or quota; or any other error) makes the
allocation return NULL, and PyTorch raises ``torch.cuda.OutOfMemoryError`` with its own message;
the daemon's words are logged (a warning, once per pool) and kept in ``pool.gpumemd.last_error``,
and :func:`use_mem_pool` re-raises the error with them.
"""
import contextlib
import ctypes
import logging
import threading
import weakref

import torch as _torch  # the framework (this module is gpumemd.torch; imports are absolute)

from . import _alloc
from ._shim import ShimUnavailable

log = logging.getLogger("gpumemd")

__all__ = ["mem_pool", "use_mem_pool", "lease_of", "empty_cache", "GpumemdMemPool"]

_lock = threading.Lock()
_allocators = weakref.WeakKeyDictionary()  # client -> {device: (LeaseAllocator, torch allocator)}
_all = []  # every LeaseAllocator made here (their slots live as long as the process)
_fallback_callbacks = []  # ctypes callbacks of the no-compiler route, kept alive
_keep = []  # the CUDAPluggableAllocator objects, kept alive
_warned_fallback = False


class GpumemdMemPool(_torch.cuda.MemPool):
    """A ``torch.cuda.MemPool`` whose segments are leases of a gpumemd client.

    ``gpumemd``: its :class:`gpumemd._alloc.LeaseAllocator` (``stats()``, ``last_error``,
    ``leases()``). Pools of the same client and device share one allocator."""

    def __init__(self, allocator, lease_allocator, use_on_oom=False):
        if use_on_oom:
            super().__init__(allocator, use_on_oom=True)
        else:
            super().__init__(allocator)  # also where MemPool has no use_on_oom (PyTorch < 2.8)
        self.gpumemd = lease_allocator


def _torch_allocator(lease_allocator):
    """The ``_cuda_CUDAAllocator`` for ``lease_allocator``: the shim's slot through the public
    ``CUDAPluggableAllocator``, or, without a C compiler, ctypes callbacks."""
    global _warned_fallback
    try:
        path, alloc_name, free_name = _alloc.bind(lease_allocator)
    except ShimUnavailable as e:
        if not _warned_fallback:
            _warned_fallback = True
            log.warning("gpumemd.torch: %s; using ctypes callbacks with PyTorch's private "
                        "torch._C._cuda_customAllocator instead (frees then take the GIL under PyTorch's "
                        "allocator lock)", e.message)
        return _callback_allocator(lease_allocator)
    pluggable = _torch.cuda.memory.CUDAPluggableAllocator(path, alloc_name, free_name)
    # Kept for the process's life, like the slot: a MemPool's teardown (even at interpreter exit)
    # calls its allocator, which must not be gone first (vLLM met that order at shutdown).
    _keep.append(pluggable)
    return pluggable.allocator()


def _callback_allocator(lease_allocator):
    alloc_type = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
    free_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)

    def alloc(size, device, stream):
        with _alloc.gc_paused():
            return lease_allocator.allocate_or_null(size, device)

    def free(pointer, size, device, stream):
        try:
            with _alloc.gc_paused():
                lease_allocator.free(pointer or 0)
        except Exception:  # nothing may cross PyTorch's C++ frames
            log.exception("gpumemd.torch: releasing 0x%x failed", pointer or 0)

    c_alloc, c_free = alloc_type(alloc), free_type(free)
    _fallback_callbacks.append((c_alloc, c_free))  # PyTorch may call them until the process ends
    return _torch._C._cuda_customAllocator(ctypes.cast(c_alloc, ctypes.c_void_p).value,
                                           ctypes.cast(c_free, ctypes.c_void_p).value)


def allocator(gm, device=0):
    """The (LeaseAllocator, torch allocator) pair of client ``gm`` on its daemon's device
    ``device``, made once per client and device."""
    with _lock:
        per_client = _allocators.setdefault(gm, {})
        pair = per_client.get(device)
        if pair is None:
            lease_allocator = _alloc.LeaseAllocator(gm, device, tag="torch")
            pair = (lease_allocator, _torch_allocator(lease_allocator))
            per_client[device] = pair
            _all.append(lease_allocator)
        return pair


def mem_pool(gm, device=0, use_on_oom=False):
    """A new :class:`GpumemdMemPool` (a ``torch.cuda.MemPool``) allocating leases of client
    ``gm`` on the daemon's device ``device``. Use it with ``torch.cuda.use_mem_pool(pool)`` on
    the matching CUDA device (the same ordinal unless a container renumbers GPUs: an allocation
    on another GPU is refused)."""
    lease_allocator, torch_allocator = allocator(gm, device)
    return GpumemdMemPool(torch_allocator, lease_allocator, use_on_oom=use_on_oom)


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    """``torch.cuda.use_mem_pool(pool, device)``, and an out-of-memory inside it that the daemon
    caused is re-raised as ``torch.cuda.OutOfMemoryError`` naming the daemon's words (its
    ``__cause__`` the :class:`gpumemd.GpumemdError`)."""
    lease_allocator = pool.gpumemd
    failures = lease_allocator.stats().failures
    try:
        with _torch.cuda.use_mem_pool(pool, device=device):
            yield pool
    except RuntimeError as e:  # OutOfMemoryError, or a plain RuntimeError from a PyTorch that
        # does not map a pluggable allocator's NULL to it
        error = lease_allocator.last_error
        if error is None or lease_allocator.stats().failures == failures or not (
                isinstance(e, _torch.cuda.OutOfMemoryError) or "memory" in str(e).lower()):
            raise
        raise _torch.cuda.OutOfMemoryError("gpumemd refused the allocation (%s: %s); PyTorch: %s"
                                           % (error.code.name, error.message, e)) from error


def lease_of(tensor):
    """The gpumemd lease under ``tensor`` (a tensor allocated in a gpumemd pool), to share or
    publish like any lease (``lease.share()``, ``gm.publish(lease, name)``). The lease is the
    whole segment PyTorch carved the tensor from: the tensor starts ``tensor.data_ptr() -
    lease.device_ptr`` bytes into it, and other tensors may share the segment. The lease stays
    PyTorch's: do not close it; a share token or name holds the block after PyTorch releases it.
    Raises ValueError for a tensor outside every gpumemd pool."""
    pointer = tensor.data_ptr()
    lease = _alloc.find_lease(pointer)
    if lease is not None:
        return lease
    raise ValueError("tensor at 0x%x (%s) is not in a gpumemd pool" % (pointer, tensor.device))


def empty_cache(timeout=10.0):
    """``torch.cuda.empty_cache()``, then waits (up to ``timeout`` seconds) until the segments it
    released are released to the daemon (the releases go as notices on the session's stream, so
    the daemon's books follow within a round trip). True when nothing is left to release.

    Which segments PyTorch releases is its choice: the cached, unused segments of its pools; a
    MemPool's once the pool is deleted (or no longer in use), and, depending on the version,
    those of a pool still in use."""
    _torch.cuda.empty_cache()
    if _alloc._queue is None:
        return True
    return _alloc._queue.drain(timeout)
